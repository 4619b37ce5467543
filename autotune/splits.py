"""Split counts worth timing per tile and bucket, coarse to fine.

num_splits is the knob that depends on context length (DESIGN.md section 4): too
few splits leave SMs idle, too many pay for fp32 partials and the combine. The
coarse grid brackets the one-wave heuristic; the refine phase bisects
geometrically around the best point and walks outward from the grid's edge.
"""
from __future__ import annotations

import math
from typing import Iterable

from verify_attn.config import MIN_TOKENS_PER_SPLIT, KernelConfig, heuristic_num_splits
from verify_attn.shapes import HeadShape

from .space import ArchSpec


def m_tiles(rows: int, block_m: int) -> int:
    return max(1, -(-rows // block_m))


def heuristic_splits(tile: KernelConfig, *, rows: int, kv_len: int, shape: HeadShape, arch: ArchSpec,
                     batch: int = 1) -> int:
    return heuristic_num_splits(batch=batch, num_kv_heads=shape.num_kv_heads, m_tiles=m_tiles(rows, tile.block_m),
                                avg_kv_len=kv_len, num_sms=arch.num_sms, block_n=tile.block_n)


def split_cap(tile: KernelConfig, *, kv_len: int, max_splits: int = 1024) -> int:
    """Most splits worth trying: each split owns at least two KV tiles (and >= 64 tokens when the context allows)."""
    return max(1, min(max_splits, kv_len // max(2 * tile.block_n, min(MIN_TOKENS_PER_SPLIT // 4, kv_len))))


def split_grid(tile: KernelConfig, *, rows: int, kv_len: int, shape: HeadShape, arch: ArchSpec, batch: int = 1,
               max_splits: int = 1024, span: int = 8) -> list[int]:
    """Coarse split counts for one tile: the heuristic h times powers of two within [h/span, h*span],
    and 1/2, 1, 2, 4 waves of the GPU; capped by `split_cap`.

    The optimum sits near the one-wave heuristic (fewer splits idle SMs, more
    splits pay for partials and the combine); the refine phase walks further out
    from the grid's edge when the best point is there (`refine_points`).
    """
    cap = split_cap(tile, kv_len=kv_len, max_splits=max_splits)
    h = min(cap, heuristic_splits(tile, rows=rows, kv_len=kv_len, shape=shape, arch=arch, batch=batch))
    ctas_per_split = batch * shape.num_kv_heads * m_tiles(rows, tile.block_m)
    # by priority: the heuristic, whole waves, then powers of two around the heuristic
    order = [h] + [max(1, round(w * arch.num_sms / ctas_per_split)) for w in (1, 0.5, 2, 4)]
    k = 2
    while k <= span:
        order += [max(1, h // k), h * k]
        k *= 2
    kept: list[int] = []
    for v in order:   # drop points within 12% of one already kept: they time the same
        if 1 <= v <= cap and all(max(v, q) / min(v, q) > 1.12 for q in kept):
            kept.append(v)
    return sorted(kept)


def refine_points(grid: Iterable[int], best: int, tried: set[int], *, lo: int = 1, hi: int = 1 << 30) -> list[int]:
    """Next split counts to try around `best` (coarse to fine).

    Geometric midpoints between `best` and its tried neighbours; when `best` is
    the smallest or largest point tried, a step of 2x outward (within [lo, hi]).
    """
    g = sorted(set(grid) | tried | {best})
    i = g.index(best)
    out = []
    for nb in (g[i - 1] if i > 0 else None, g[i + 1] if i + 1 < len(g) else None):
        if nb is None:
            continue
        mid = round(math.sqrt(nb * best))
        if mid not in tried and mid != best and mid != nb:
            out.append(mid)
    if i == 0 and best > lo:
        out.append(max(lo, best // 2))
    if i == len(g) - 1 and best < hi:
        out.append(min(hi, best * 2))
    return [v for v in dict.fromkeys(out) if v not in tried and lo <= v <= hi]
