"""The commit probe passes with correct backends and FAILS on a deliberately broken one."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import verify_attn
from integration.probe import main as probe_main
from integration.probe import probe
from verify_attn.backends import Backend, Problem
from cases import temporary_backend
from verify_attn.reference import _run as reference_run

BLOCK = 8  # the tiny preset's DFlash block


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
            temporary_backend(Backend("test-broken-mid256", _dropping("middle", 256))):
        yield


def test_probe_passes_with_reference() -> None:
    res = probe("tiny", short=256, long=2500, backends=["reference"], steps=4)
    assert res["failed"] == []
    for k in ("short", "long"):
        r = res[k]["reference"]
        assert r["divergence"] is None and r["commit_lens"] == [BLOCK] * 4


@pytest.mark.parametrize("name", ["test-broken-tail64", "test-broken-mid256"])
def test_probe_catches_broken_backend(name: str, broken_backends) -> None:
    res = probe("tiny", short=256, long=2500, backends=[name], steps=4)
    assert res["failed"] == [name]
    s, l = res["short"][name], res["long"][name]
    assert s["commit_lens"] == [BLOCK] * 4 and s["divergence"] is None          # fine at short context
    assert l["divergence"] is not None and not l["near_tie"]                     # caught at long context
    assert l["mean_commit_len"] <= s["mean_commit_len"]


def test_probe_cli_exits_nonzero_on_broken_backend(capsys, broken_backends) -> None:
    rc = probe_main(["--short", "256", "--long", "2500", "--steps", "4", "--attn-backend", "test-broken-tail64"])
    assert rc == 1
    assert "PROBE FAILED" in capsys.readouterr().out


@pytest.mark.skipif("triton" not in verify_attn.available_backends(), reason="triton backend not available")
def test_probe_passes_with_triton_interpreted() -> None:
    res = probe("tiny", short=100, long=1200, backends=["triton"], steps=2)
    assert res["failed"] == [], res
