"""Bytes per part (issue 15 Must show): the drafter's context read grows like its native GQA K/V (8 KV
heads x 128 x K and V x 2 B per token), a few percent of verify attention's growth at Kimi K2's depth;
its sliding layers, commits and the target's bookkeeping do not grow; and the count does catch a drafter
that does O(context) work per step."""
from __future__ import annotations

import pytest
import torch

from integration.loop.drafter import DFlashDrafter
from integration.measure.traffic import main as traffic_main
from integration.measure.traffic import measure

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class ConcatDrafter(DFlashDrafter):
    """TEST-ONLY: the old drafter's habit, a copy of the whole context cache on every commit."""

    def commit(self, hid, start_pos, last_chunk=True):
        super().commit(hid, start_pos, last_chunk)
        self.copied = torch.cat([self.k[-1][:self.n_ctx - hid.shape[0]], self.k[-1][self.n_ctx - hid.shape[0]:self.n_ctx]])


def test_drafter_growth_is_its_native_kv_read() -> None:
    res = measure("kimi-k2-tp8", [300, 600], steps=1, layers=1, window=64)
    g = res["growth_bytes_per_1k"]
    assert g["draft_swa"] == pytest.approx(0.0, abs=1.0)                      # sliding layers: O(window)
    per_token = 8 * 128 * 2 * 2                                                # Hkv x hd x (K, V) x bf16
    assert per_token * 1000 <= g["draft"] <= (per_token + 16) * 1000          # + the int32 row id
    assert 1152 * 1000 <= g["verify_attn"] <= (1152 + 16) * 1000               # one 576-wide row per layer
    assert g["accept_commit"] == pytest.approx(0.0, abs=1.0)                  # commits are O(accepted tokens)
    assert g["target_rest"] == pytest.approx(0.0, abs=1.0)                    # slot ids: a view, no per-step copy
    assert res["drafter_share_of_verify_growth"] < 0.05


def test_count_catches_a_per_step_context_copy() -> None:
    res = measure("kimi-k2-tp8", [300, 600], steps=1, layers=1, window=64, drafter_cls=ConcatDrafter)
    assert res["growth_bytes_per_1k"]["accept_commit"] > 1e6                  # ~4 KB per context token


@pytest.mark.slow
def test_issue_command(capsys) -> None:
    assert traffic_main(["--model", "kimi-k2-tp8", "--simulate-rank"]) == 0
    out = capsys.readouterr().out
    share = float(out.split("per 1k = ")[1].split("%")[0])
    assert share <= 5.0


def test_traffic_and_costmodel_count_the_drafter_alike() -> None:
    """One sharding convention: the drafter's context read per rank grows by the same bytes per 1k tokens in
    the loop's measured traffic (its whole drafter, divided as a TP8 deployment shards it) and in the cost
    model's per-rank count."""
    from integration.planning.costmodel import KIMI_K2, DEVICES, StepCost
    res = measure("kimi-k2-tp8", [300, 600], steps=1, layers=1, window=64)
    s = KIMI_K2
    kv_rank = max(1.0, s.drafter_kv_heads / s.drafter_tp)
    row = kv_rank * s.drafter_head_dim * 2 * s.kv_bytes + 4              # costmodel.drafter_us's context row
    model_growth = 1000 * s.drafter_full_layers * row                     # its full layer reads the whole context
    assert res["drafter_tp"] == s.drafter_tp == 8
    assert res["drafter_growth"] == pytest.approx(model_growth, rel=0.02)
    assert res["drafter_growth_whole"] == pytest.approx(8 * res["drafter_growth"])
    # and the cost model's drafter time grows by exactly those bytes at the device's bandwidth (memory-bound)
    cost = StepCost(KIMI_K2, "h200", None)
    d_us = cost.drafter_us(200_000) - cost.drafter_us(199_000)
    assert d_us == pytest.approx(model_growth / (DEVICES["h200"].roof.mem_bw_gbs * 1e9) * 1e6, rel=0.02)
