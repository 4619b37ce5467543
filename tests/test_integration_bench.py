"""The e2e sweep on the tiny model: per-step parts add up to the step time; the forced commit length;
Kimi K2's per-rank attention shapes (8 heads, 576/512) reach tree_verify under --simulate-rank."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

import verify_attn.api

from integration.measure.bench_e2e import PARTS, analyse, main as bench_main, slope_per_1k, sweep_rank
from integration.loop.config import get_model_config
from integration.loop.drafter import DFlashDrafter
from integration.loop.model import MLATarget
from integration.loop.spec import Engine, speculative_decode
from integration.loop.tp import TPGroup
from verify_attn.backends import Backend
from cases import temporary_backend
from verify_attn.reference import _run as reference_run



SETTINGS = dict(model="tiny", device="cpu", dtype="float32", page_size=1, tree="ddtree", budget=8, seed=0,
                simulate=False)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_parts_add_up_to_step_time() -> None:
    rows = sweep_rank(TPGroup(), SETTINGS, ["reference"], [64, 300], steps=3, warmup=1, accept_len=None)
    assert [r["ctx"] for r in rows] == [64, 300]
    for r in rows:
        assert set(r["parts_ms"]) == set(PARTS)
        assert r["parts_ms"]["verify_attn"] > 0 and r["parts_ms"]["draft"] > 0
        gap = r["step_ms"] - r["parts_sum_ms"]
        # the only untimed work is the Python between parts and the metric bookkeeping
        assert 0 <= gap <= 0.1 * r["step_ms"] + 1.0, r
    growth = analyse(rows)
    assert set(growth["reference"]) == set(PARTS) | {"step"}


def test_simulate_accept_len_forces_commit_length() -> None:
    rows = sweep_rank(TPGroup(), SETTINGS, ["reference"], [80], steps=3, warmup=0, accept_len=3)
    assert rows[0]["tokens_per_step"] == 3


def test_slope() -> None:
    assert slope_per_1k([1000, 2000, 3000], [1.0, 3.0, 5.0]) == pytest.approx(2.0)
    assert slope_per_1k([1000], [1.0]) is None


def test_cli_writes_json_and_plot(tmp_path, capsys) -> None:
    out = tmp_path / "e2e.json"
    mode = verify_attn.api._VALIDATION
    rc = bench_main(["--ctx", "64,128", "--steps", "2", "--warmup", "0", "--simulate-accept-len", "2",
                     "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["simulate_accept_len"] == 2 and len(doc["rows"]) == 2
    assert (tmp_path / "e2e.png").stat().st_size > 0
    assert "FORCED to 2" in capsys.readouterr().out
    assert verify_attn.api._VALIDATION == mode   # the hot-path setting does not leak into later tests


def test_kimi_rank_shapes_reach_tree_verify() -> None:
    """kimi-k2-tp8 attention dims (8 query heads per rank, 576-wide latent rows, V = first 512) with
    the non-attention dims shrunk so the CPU can run it: --simulate-rank's shard of a TP-8 split."""
    seen = []

    def capture(p, config, out, lse):
        seen.append((p.num_q_heads, p.num_kv_heads, p.head_dim_qk, p.head_dim_v, p.mla_shared_kv, p.sm_scale))
        reference_run(p, config, out, lse)

    base = get_model_config("kimi-k2-tp8")
    cfg = replace(base, num_layers=2, hidden=512, vocab=1024, q_lora=128, ffn=8 * 64,
                  drafter=replace(base.drafter, num_layers=2, ffn=128, window=16, full_layers=(1,), target_layers=(0, 1),
                                  calib_tokens=256))
    t = MLATarget(cfg, TPGroup(0, 8, simulate=True), dtype=torch.float32, device="cpu")
    e = Engine(t, backend="test-capture", page_size=1, capacity=400)
    drafter = DFlashDrafter(t, capacity=400, backend="test-capture")
    with temporary_backend(Backend("test-capture", capture)):
        toks, metrics = speculative_decode(e, drafter, torch.randint(0, 1023, (90,)), 2, tree_kind="chain",
                                           simulate_accept_len=3)
    assert [m.commit_len for m in metrics] == [3, 3]
    target_calls = [x for x in seen if x[3] == 512]
    drafter_calls = [x for x in seen if x[3] != 512]
    assert target_calls and all(x[:5] == (8, 1, 576, 512, True) for x in target_calls)
    assert target_calls[0][5] == pytest.approx(base.sm_scale())
    # the drafter's attention: Kimi-K2.5-DFlash's GQA (64 query heads, 8 KV heads of 128, separate K and V)
    # read natively through tree_verify, never expanded per query head
    assert drafter_calls and all(x[:5] == (64, 8, 128, 128, False) for x in drafter_calls)   # the published shape
