"""What a run would allocate, and what the device it allocates on has free: every command that makes inputs
(bench.verify, the studies, autotune, integration's tools) estimates its peak bytes and refuses, before it allocates,
a run that cannot fit, with the figure (issue 43, item 2)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from verify_attn.shapes import HeadShape

from . import roofline as rl
from .inputs import make_trees
from .timing import rotation_sets


def point_bytes(shape: HeadShape, ctx: int, nodes: int, batch: int, page_size: int, elem: int, n_sets: int) -> int:
    """An upper estimate of the peak bytes one (ctx, tree, layout) point allocates on its device: `n_sets` input
    sets (each KV pool 1.5x its rows for spare slots, plus the logical rows it is laid out from, page rounding,
    q), the float64 reference's working set of one request (8,192-token chunks of scores, K and V) and the
    outputs. fp8 caches are made from a 16-bit one of `elem` bytes per value, so they count as that."""
    from verify_attn.reference import CHUNK
    hkv, d_kv = shape.num_kv_heads, shape.head_dim_qk + (0 if shape.mla else shape.head_dim_v)
    rows = batch * (ctx + nodes + page_size)
    kv_set = int(2.5 * rows * hkv * d_kv * elem)
    q = batch * nodes * shape.num_q_heads * shape.head_dim_qk * elem
    r, c = shape.num_q_heads // hkv * nodes, min(ctx + nodes, CHUNK)
    ref = 8 * (4 * hkv * r * c + 2 * c * hkv * (shape.head_dim_qk + shape.head_dim_v) + 3 * hkv * r * shape.head_dim_v
               + batch * nodes * shape.num_q_heads * (shape.head_dim_qk + 2 * shape.head_dim_v))
    outs = n_sets * batch * nodes * shape.num_q_heads * shape.head_dim_v * elem
    return n_sets * (kv_set + q) + ref + outs


def sweep_bytes(shape: HeadShape, ctxs: list[int], nodes_list: list[int], layouts: list[tuple[str, int]], batch: int,
                tree_shape: str, elem: int, device: Optional[str], l2: Optional[int] = None) -> tuple[int, str]:
    """(the largest point_bytes over the sweep, its flags): on a GPU each point keeps the input sets that make L2
    cold resident (timing.rotation_sets; `l2` bytes, 50 MB when unknown), on the CPU one set."""
    need, where = 0, ""
    for ctx in ctxs:
        for n in nodes_list:
            for lay, ps in layouts:
                sets = 1
                if device:
                    set_b = rl.count_shape(shape, [ctx] * batch, make_trees(n, tree_shape, batch),
                                           elem_bytes=elem, page_size=ps).total_bytes
                    sets = rotation_sets(set_b, l2 or int(50e6))
                b = point_bytes(shape, ctx, n, batch, ps, elem, sets)
                if b > need:
                    need, where = b, f"--ctx {ctx:,} --tree {n} --batch {batch} ({lay})"
    return need, where


def available_bytes(device: Optional[str]) -> Optional[int]:
    """Free memory on the device a run allocates on: the GPU's free memory, or the host's MemAvailable."""
    if device == "cuda":
        return torch.cuda.mem_get_info()[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def fit_error(what: str, need: int, have: Optional[int], device: Optional[str], parts: str, hint: str) -> Optional[str]:
    """None when `need` bytes fit in 90% of the `have` free on `device` (or `have` is unknown); else the one-line
    refusal: '<what> would allocate ~N GB on the <device> (<parts>), more than the M GB available: <hint>'."""
    if have is None or need <= 0.9 * have:
        return None
    return (f"{what} would allocate ~{need / 1e9:,.1f} GB on the {device or 'cpu'} ({parts}), more than the "
            f"{have / 1e9:,.1f} GB available: {hint}")
