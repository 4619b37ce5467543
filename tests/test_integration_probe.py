"""The commit probe (issue 15 item 3): oracle mode passes correct backends and fails ones that drop
prefix rows even when commit_len stays full; real-drafter mode says "context OK" on the correct loop,
"context bug" for each planted drafter bug and "metrics bug" for a planted metrics bug.

Default runs use 256 vs 2500 tokens and 4 steps (seconds); the issue's exact commands (256 vs 4k,
6 steps) run with --runslow."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import verify_attn
from cases import temporary_backend
from integration.loop.drafter import DrafterBugs
from integration.measure.probe import main as probe_main
from integration.measure.probe import probe
from verify_attn.backends import Backend, Problem
from verify_attn.reference import _run as reference_run

BLOCK = 8  # the tiny preset's DFlash block
SHORT, LONG, STEPS = 256, 2500, 4


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _dropping(where: str, n: int):
    """TEST-ONLY broken backend: the reference, but at long context (prefix > 1000 tokens, page_size 1)
    n prefix tokens are silently left out: the last n ('tail': a ragged-tail bug) or n from the middle
    ('middle': a lost split). The kinds of bug the probe exists to catch."""
    def run(p: Problem, config, out, lse) -> None:
        total = int(p.kv_lens[0])
        prefix = total - p.total_q
        if p.batch == 1 and p.page_size == 1 and prefix > 1000:
            lo = prefix - n if where == "tail" else prefix // 2
            idx = p.kv_indices[:total]
            keep = torch.cat([idx[:lo], idx[lo + n:]])
            p = dataclasses.replace(p, kv_indices=keep, kv_lens=torch.tensor([keep.numel()], dtype=torch.int32),
                                    kv_indptr=torch.tensor([0, keep.numel()], dtype=torch.int32))
        reference_run(p, config, out, lse)
    return run


@pytest.fixture
def broken_backends():
    with temporary_backend(Backend("test-broken-tail64", _dropping("tail", 64))), \
            temporary_backend(Backend("test-broken-mid16", _dropping("middle", 16))):
        yield


def test_oracle_passes_with_reference() -> None:
    res = probe("tiny", short=SHORT, long=LONG, backends=["reference"], steps=3)
    assert res["failed"] == {}
    for k in ("short", "long"):
        r = res[k]["reference"]
        assert r["divergence"] is None and r["commit_lens"] == [BLOCK] * 3 and r["max_logit_err"] == 0.0


def test_oracle_fails_backends_that_drop_rows(broken_backends) -> None:
    """Dropping 16 rows in the middle (or 64 at the tail) of the long prefix leaves every commit_len at
    the block size (the relative rule used to pass them); the per-verify logit criterion fails them."""
    names = ["test-broken-mid16", "test-broken-tail64"]
    res = probe("tiny", short=SHORT, long=LONG, backends=names, steps=3)
    for name in names:
        s, l = res["short"][name], res["long"][name]
        assert s["max_logit_err"] == 0.0 and "short" not in res["failed"][name]     # fine at short context
        assert l["max_logit_err"] > res["logit_tol"]                                # caught at long context
        assert "logits differ" in res["failed"][name]["long"]
    assert res["long"]["test-broken-mid16"]["commit_lens"] == [BLOCK] * 3           # acceptance alone misses it


def test_oracle_cli_exits_nonzero_on_broken_backend(capsys, broken_backends) -> None:
    rc = probe_main(["--short", str(SHORT), "--long", str(LONG), "--steps", "2", "--attn-backend",
                     "test-broken-mid16"])
    assert rc == 1
    assert "PROBE FAILED" in capsys.readouterr().out


@pytest.mark.skipif("triton" not in verify_attn.available_backends(), reason="triton backend not available")
def test_oracle_passes_with_triton_interpreted() -> None:
    res = probe("tiny", short=100, long=1200, backends=["triton"], steps=2)
    assert res["failed"] == {}, res["failed"]
    assert max(res["long"]["triton"]["logit_errs"]) < 1e-4         # fp32 interpreted kernel vs float64 reference


def test_real_drafter_context_ok() -> None:
    res = probe("tiny", short=SHORT, long=LONG, steps=STEPS, drafter="real")
    assert res["verdict"] == "context OK", res["why"]
    for k in ("short", "long"):
        assert res[k]["copyable"] == res[k]["horizon"] and res[k]["acceptance"] > 0.9


@pytest.mark.parametrize("bugs", [DrafterBugs(window=1024), DrafterBugs(untrimmed=True),
                                  DrafterBugs(stale_prefill_hidden=True)], ids=["window", "untrimmed", "stale-hidden"])
def test_real_drafter_catches_planted_drafter_bugs(bugs: DrafterBugs) -> None:
    """Each planted drafter bug collapses the long-context commit length while the short one holds."""
    res = probe("tiny", short=SHORT, long=LONG, steps=STEPS, drafter="real", bugs=bugs)
    assert res["verdict"] == "context bug", res["why"]
    assert res["short"]["acceptance"] > 0.9 and res["long"]["acceptance"] < 0.6
    assert sum(res["long"]["commit_lens"]) < sum(res["short"]["commit_lens"])


def test_real_drafter_catches_planted_metrics_bug(capsys) -> None:
    rc = probe_main(["--short", str(SHORT), "--long", str(LONG), "--steps", "2", "--drafter", "real",
                     "--plant", "metrics"])
    out = capsys.readouterr().out
    assert rc == 1 and "verdict: metrics bug" in out and "counters disagree" in out


@pytest.mark.slow
@pytest.mark.parametrize("plant", [None, "window:1024", "untrimmed", "stale-hidden"])
def test_issue_command_4k(plant, capsys) -> None:
    """The issue's command: python -m integration.probe --model tiny --short 256 --long 4k --drafter real."""
    argv = ["--model", "tiny", "--short", "256", "--long", "4k", "--drafter", "real"]
    rc = probe_main(argv + (["--plant", plant] if plant else []))
    out = capsys.readouterr().out
    if plant is None:
        assert rc == 0 and "verdict: context OK" in out
    else:
        assert rc == 1 and "verdict: context bug" in out


@pytest.mark.parametrize("plant,what", [("accept-early", "committed 6 drafts"),
                                        ("accept-sibling", "is not the target's choice")])
def test_real_drafter_catches_planted_accept_walk_bugs(plant, what, capsys) -> None:
    """An accept walk that stops one node early (the output stays greedy's: neither --check's token comparison
    nor the counters notice) and one that accepts a sibling of the matching child are both caught by the
    independent count of the longest greedy-accepted root-to-leaf path."""
    rc = probe_main(["--short", str(SHORT), "--long", str(LONG), "--steps", "2", "--drafter", "real",
                     "--plant", plant])
    out = capsys.readouterr().out
    assert rc == 1 and "verdict: loop bug" in out and "accept walk fails its independent count" in out
    assert what in out
