"""Kernel configuration schema shared by every tunable backend (CUDA, Triton).

A config is *data*: the autotuner searches over it, exports it as JSON and the
run-time lookup hands it back to the backend. Backends read the fields they
understand and ignore the rest; each backend publishes its own search space
(`config_space`) and resource model (`resources`) through the registry in
`verify_attn.backends`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping


# Upper bounds on every config field. A split count sizes the fp32 workspace
# (splits x rows x Dv x 4 bytes) and the grid; 1024 is 4x the most a 185k call on
# a 188-SM GPU wants (256 tokens a split -> ~720) and keeps a bad tuned file
# (num_splits 10**9) from asking for terabytes. Tiles: the largest any backend
# compiles is 256 tokens x 512 rows; CUDA allows 32 warps per block.
MAX_SPLITS = 1024
CONFIG_CAPS: dict[str, int] = {"num_splits": MAX_SPLITS, "block_n": 256, "block_m": 512, "num_warps": 32,
                               "num_stages": 8}


@dataclass(frozen=True)
class KernelConfig:
    num_splits: int = 0   # KV splits per (request, kv head, M tile); 0 = heuristic
    block_n: int = 32     # KV tokens per mainloop tile
    block_m: int = 64     # MMA rows per CTA/program: tree nodes x query heads of one KV head
    num_warps: int = 4    # warps per CTA/program (a power of two; + 1 for a producer warp: CUDA kernel v3's 8 + 1)
    num_stages: int = 2   # KV pipeline depth (cp.async stages / Triton num_stages)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"KernelConfig.{f.name} must be int, got {type(v).__name__}")
        if self.num_splits < 0:
            raise ValueError(f"KernelConfig.num_splits must be >= 0 (0 = heuristic), got {self.num_splits}")
        for name in ("block_n", "block_m", "num_warps", "num_stages"):
            v = getattr(self, name)
            if v < 1:
                raise ValueError(f"KernelConfig.{name} must be >= 1, got {v}")
        for name in ("block_n", "block_m"):
            v = getattr(self, name)
            if v & (v - 1):
                raise ValueError(f"KernelConfig.{name} must be a power of two, got {v}")
        w = self.num_warps
        if not any(m >= 1 and not m & (m - 1) for m in (w, w - 1, w - 4)):
            raise ValueError(f"KernelConfig.num_warps must be a power of two, or one or four more (math warps + a "
                             f"producer warp or warpgroup), got {self.num_warps}")
        for name, cap in CONFIG_CAPS.items():
            v = getattr(self, name)
            if v > cap:
                raise ValueError(f"KernelConfig.{name} must be <= {cap}, got {v}")

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "KernelConfig":
        if not isinstance(d, Mapping):
            raise TypeError(f"config must be a mapping, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown KernelConfig fields {sorted(unknown)}; known: {sorted(known)}")
        # exact ints only: "16", 16.9 and True are data errors, not values to coerce
        return cls(**dict(d))

    def replace(self, **kw: int) -> "KernelConfig":
        return dataclasses.replace(self, **kw)


def as_config(config: "KernelConfig | Mapping[str, Any] | None") -> KernelConfig | None:
    """Accept a KernelConfig, a dict of its fields, or None."""
    if config is None or isinstance(config, KernelConfig):
        return config
    if isinstance(config, Mapping):
        return KernelConfig.from_dict(config)
    raise TypeError(f"config must be a KernelConfig, a dict or None, got {type(config).__name__}")


def heuristic_kv_len(*, index_capacity: int, page_size: int, batch: int, max_kv_len: int | None = None) -> int:
    """KV tokens per request that the split heuristic and the tuned-config lookup plan for.

    The caller's `max_kv_len` hint when given (an engine that captures CUDA graphs
    knows its longest context; kv_lens live on the device and are never read
    for planning). Without it, an estimate from static sizes: the index capacity
    per request (`kv_indices.numel() * page_size / batch`), which is exact for a
    packed index array and overshoots on an engine's preallocated buffer (SGLang's
    graph buffer holds max_tokens x max_context entries), hence the hint.
    """
    if max_kv_len is not None:
        return max(1, int(max_kv_len))
    return max(1, index_capacity * page_size // max(1, batch))


# Minimum KV tiles a split should own: a one-tile split pays the prologue (index -> row round trips, the Q tile)
# and the partial write for one tile of KV. The heuristic's cost (below) weighs the rest. Until the sixteenth
# session the floor was 256 tokens, which capped a 4k call at 15 splits: 30-60 CTAs on 132-188 SMs, each running
# 5-16 tiles in a row (the SASS model read 24.4 us for v1 at 4k / 16 nodes on the H200, measured 23.6; 15.8 us at
# 33 splits; NOTES.md, "Short contexts: the split heuristic").
MIN_TILES_PER_SPLIT = 2
# kept for the autotuner's grid floor (autotune/splits.py: >= 64 tokens a split when the context allows)
MIN_TOKENS_PER_SPLIT = 256


# The split heuristic's view of a wave's fixed cost, in KV tiles of one CTA: the prologue (index ->
# row round trips, the Q tile), the masked tree tiles and the partial write (the SASS model reads
# ~7 tiles of prologue and ~1 of masked-tile excess on the RTX PRO 6000 at 185k; NOTES.md, v1).
WAVE_OVERHEAD_TILES = 8
# full-wave split counts the heuristic compares (1 .. MAX_WAVES waves), and the part waves below one
MAX_WAVES = 4
PART_WAVES = (0.25, 0.5)
# The combine's cost per split, in KV tokens of one CTA's tile loop: the v1 combine streams a row's splits 8 at a
# time (kUnroll, tree_verify_combine.cuh), one L2 round trip plus 8 weighted sums a group (an estimate, ~600-800
# cycles: not measured), about what a CTA spends on 8 KV tokens (the model's tiles: ~1,500 cycles per 16 tokens on
# the RTX PRO 6000's v3 tile, ~3,000 per 64 on the H200's). A call with few rows (one node: 8 of them) and many
# splits is bound by it; one split runs no combine. (Since the eighteenth session the v1 combine shares a row's
# splits over a CTA's 4 warps, 32 a group; charging 32 here moved 10 of split_study's 126 rows, all one-node calls,
# by -13% to +9% and left its geometric mean flat, so the term stays at 8: NOTES.md, "The combine's splits over
# four warps".)
COMBINE_SPLITS_PER_GROUP = 8
COMBINE_TOKENS_PER_GROUP = 8


def heuristic_num_splits(
    *,
    batch: int,
    num_kv_heads: int,
    m_tiles: int,
    avg_kv_len: int,
    num_sms: int,
    block_n: int = 32,
    waves: float = 1.0,
    min_tiles_per_split: int = MIN_TILES_PER_SPLIT,
    max_splits: int = MAX_SPLITS,
    max_waves: int = MAX_WAVES,
    part_waves: tuple[float, ...] = PART_WAVES,
    combine_tokens_per_group: int = COMBINE_TOKENS_PER_GROUP,
    cap_ceil: bool = True,
) -> int:
    """Split count that fills whole waves (or a part of one) of the GPU from static shapes only.

    The grid is (splits, m_tiles * num_kv_heads, batch). CTAs that share a KV
    split across M tiles read the same KV (L2 hits), so they count as CTAs but
    not as extra DRAM traffic. Fewer, longer splits keep the fp32 partials and the
    combine's split loop short (DESIGN.md section 4). The candidates are the split
    counts that fill k x `waves` waves (rounded down: a grid one CTA over a wave
    runs a second, nearly empty wave as long as the first) for k = 1/4, 1/2, 1 ..
    max_waves, each split owning at least `min_tiles_per_split` KV tiles; the one
    with the least time wins, counted in KV tiles of one CTA as waves x (tiles per
    CTA + WAVE_OVERHEAD_TILES) plus the combine's groups of
    COMBINE_SPLITS_PER_GROUP splits at COMBINE_TOKENS_PER_GROUP tokens each.
    One wave wins unless it leaves many SMs idle: a 64-node MLA tree (16 M tiles)
    on 188 SMs is 11 splits x 16 = 176 CTAs (12 SMs idle) in one wave, but 35 x
    16 = 560 CTAs in three (4 idle slots), 6% less by the SASS model. A one-node
    call at 16k on 188 SMs (one M tile) takes 94 splits, half a wave: a whole one
    (188) halves each CTA's tiles but doubles the combine's split loop. The
    autotuner refines it. No device data is read: CUDA-graph safe. (`part_waves=()`,
    `combine_tokens_per_group=0`, `min_tiles_per_split=256 // block_n` and `cap_ceil=False` give
    the rule before the sixteenth session: bench/model/split_study.py reads the two side by side.)
    """
    if min(batch, num_kv_heads, m_tiles, num_sms, block_n, max_waves, min_tiles_per_split) < 1:
        raise ValueError("heuristic_num_splits: batch, num_kv_heads, m_tiles, num_sms, block_n, max_waves, "
                         "min_tiles_per_split must be >= 1")
    ctas_per_split = batch * num_kv_heads * m_tiles
    # at most ceil(len / (min tiles)) splits: each split but the last still owns min_tiles_per_split tiles once its
    # share is rounded up to whole tiles (a floor left Hopper's v3 at 4k with 31 splits of 3 blocks, two pairs, where
    # 32 splits own one pair each)
    per_split = min_tiles_per_split * block_n
    by_len = max(1, -(-avg_kv_len // per_split) if cap_ceil else avg_kv_len // per_split)
    cap = max(1, min(by_len, max_splits))
    best, best_cost = 1, None
    for k in (*part_waves, *range(1, max_waves + 1)):
        s = min(cap, max(1, int(k * waves * num_sms) // ctas_per_split))
        n_waves = -(-s * ctas_per_split // num_sms)
        tiles = -(-max(1, avg_kv_len) // (s * block_n))
        combine = -(-s // COMBINE_SPLITS_PER_GROUP) * combine_tokens_per_group / block_n if s > 1 else 0.0
        cost = n_waves * (tiles + WAVE_OVERHEAD_TILES) + combine
        if best_cost is None or cost < best_cost:
            best, best_cost = s, cost
    return int(best)


def tile_split_args(block_n: int, blocks_per_iter: int = 1) -> dict:
    """heuristic_num_splits' tile arguments for a kernel whose loop runs `blocks_per_iter` tiles of `block_n` tokens
    an iteration (Hopper's v3: a pair): its tile is the iteration (an odd block count costs a whole one), at least
    MIN_TILES_PER_SPLIT tiles' tokens a split as for every kernel."""
    if min(block_n, blocks_per_iter) < 1:
        raise ValueError("tile_split_args: block_n and blocks_per_iter must be >= 1")
    per_iter = block_n * blocks_per_iter
    return {"block_n": per_iter, "min_tiles_per_split": max(1, -(-MIN_TILES_PER_SPLIT * block_n // per_iter))}
