"""Rotary embeddings: YaRN (DeepSeek-V3 / Kimi K2) for the target, plain RoPE for the drafter.

Rotate-half (NeoX) pairing: dims i and i + d/2 form a pair. The position of a
tree node is prefix_len + depth (DESIGN.md section 3); callers pass it.
"""
from __future__ import annotations

import math

import torch

from .config import YarnRope, yarn_get_mscale


def _correction_dim(num_rot: float, dim: int, base: float, max_pos: int) -> float:
    return (dim * math.log(max_pos / (num_rot * 2 * math.pi))) / (2 * math.log(base))


def yarn_inv_freq(dim: int, cfg: YarnRope) -> tuple[torch.Tensor, float]:
    """(inv_freq [dim/2] float64, cos/sin multiplier) for YaRN with DeepSeek-V3's ramp."""
    exps = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    extra = 1.0 / cfg.theta ** exps                      # unscaled (high-frequency) dims
    inter = 1.0 / (cfg.factor * cfg.theta ** exps)       # interpolated (low-frequency) dims
    low = max(math.floor(_correction_dim(cfg.beta_fast, dim, cfg.theta, cfg.original_max_pos)), 0)
    high = min(math.ceil(_correction_dim(cfg.beta_slow, dim, cfg.theta, cfg.original_max_pos)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep_extra = 1.0 - ramp
    inv_freq = inter * (1 - keep_extra) + extra * keep_extra
    m = yarn_get_mscale(cfg.factor, cfg.mscale) / yarn_get_mscale(cfg.factor, cfg.mscale_all_dim)
    return inv_freq, m


def plain_inv_freq(dim: int, theta: float) -> tuple[torch.Tensor, float]:
    return 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim), 1.0


class Rotary:
    """cos/sin tables computed on demand for the positions asked (no max length)."""

    def __init__(self, inv_freq: torch.Tensor, mult: float, device) -> None:
        self.inv_freq = inv_freq.to(device)
        self.mult = mult

    def __call__(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x [n, ..., d] rotated at positions pos [n] (int)."""
        ang = pos.to(self.inv_freq.device, torch.float64).unsqueeze(-1) * self.inv_freq   # [n, d/2]
        cos = (torch.cos(ang) * self.mult).to(x.dtype)
        sin = (torch.sin(ang) * self.mult).to(x.dtype)
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1] // 2,)
        cos, sin = cos.view(shape), sin.view(shape)
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
