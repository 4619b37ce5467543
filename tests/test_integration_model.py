"""The target's pieces: YaRN rope, the Kimi K2 softmax scale, and absorbed MLA == the plain formulation."""
from __future__ import annotations

import math

import pytest
import torch

from integration.loop.config import YarnRope, get_model_config
from integration.loop.kv import LatentKVCache
from integration.loop.model import MLATarget, prefill_attention
from integration.loop.rope import Rotary, plain_inv_freq, yarn_inv_freq
from integration.loop.tp import TPGroup
from verify_attn.shapes import KIMI_K2_SM_SCALE


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_kimi_sm_scale_matches_shapes_preset() -> None:
    assert get_model_config("kimi-k2-tp8").sm_scale() == pytest.approx(KIMI_K2_SM_SCALE)


def test_yarn_factor_one_is_plain_rope() -> None:
    inv, m = yarn_inv_freq(64, YarnRope(theta=50000.0, factor=1.0))
    ref, _ = plain_inv_freq(64, 50000.0)
    torch.testing.assert_close(inv, ref)
    assert m == 1.0


def test_yarn_interpolates_low_frequencies_only() -> None:
    cfg = YarnRope()   # Kimi K2: factor 32, beta 1/1, original 4096
    inv, _ = yarn_inv_freq(64, cfg)
    ref, _ = plain_inv_freq(64, cfg.theta)
    assert inv[0] == pytest.approx(float(ref[0]))                 # highest frequency untouched
    assert inv[-1] == pytest.approx(float(ref[-1]) / cfg.factor)  # lowest frequency divided by the factor
    assert bool((inv <= ref + 1e-18).all())


def test_rotary_scores_depend_on_distance_only() -> None:
    rot = Rotary(*yarn_inv_freq(32, YarnRope(theta=10000.0, factor=4.0, original_max_pos=1024, beta_fast=32.0)),
                 "cpu")
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 32, generator=g, dtype=torch.float64), torch.randn(1, 32, generator=g, dtype=torch.float64)
    s1 = (rot(q, torch.tensor([100])) * rot(k, torch.tensor([90]))).sum()
    s2 = (rot(q, torch.tensor([5000])) * rot(k, torch.tensor([4990]))).sum()
    assert float(s1) == pytest.approx(float(s2), rel=1e-9)


def test_absorbed_mla_equals_plain_attention() -> None:
    """The plain prefill form (per-head K = [W_UK c, k_pe], V = W_UV c, fused SDPA) equals the absorbed
    form the verify kernels compute (q_lat = q_nope W_UK scores the 576-wide latent rows, V = the
    first 512 of the same rows, output times W_UV), computed here in float64."""
    cfg = get_model_config("tiny")
    t = MLATarget(cfg, TPGroup(), dtype=torch.float32, device="cpu")
    lw = t.layers[1]
    n, start = 23, 0
    x = torch.randn(n, cfg.hidden, generator=torch.Generator().manual_seed(1))
    pos = torch.arange(n)
    cache = LatentKVCache(2, 64, cfg.cache_dim, cfg.kv_lora, page_size=1)
    q_nope, q_pe, rows = t.qkv(lw, x, pos)
    plain = prefill_attention(t, cache, cache.extend(n), start)(1, q_nope, q_pe, rows)   # [n, H, v_head]

    q = t.absorb(lw, q_nope, q_pe).double()                                            # [n, H, 576]
    kv = rows.double()                                                                 # [n, 576]
    s = torch.einsum("thc,kc->htk", q, kv) * t.sm_scale
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    o_lat = torch.einsum("htk,kc->thc", torch.softmax(s, -1), kv[:, : cfg.kv_lora])     # V = first kv_lora
    absorbed = torch.einsum("thc,hcv->thv", o_lat, lw.w_uv.double())
    torch.testing.assert_close(plain.double(), absorbed, atol=2e-5, rtol=2e-5)
    assert math.isclose(t.sm_scale, cfg.rope.attn_mscale() ** 2 / math.sqrt(cfg.qk_nope + cfg.qk_rope))
