"""Benchmark inputs: draft trees of a named shape and a KV pool laid out like a serving pool."""
from __future__ import annotations

from typing import Optional

import torch

from verify_attn import tree as vtree
from verify_attn.fp8 import FP8_KV_DTYPES, KV_DTYPE_OF, quantize_kwargs
from verify_attn.layouts import ALLOC_MODES, free_order, lay_out
from verify_attn.shapes import HeadShape

# --alloc: the slot/page allocator the pool models: verify_attn.layouts.ALLOC_MODES (the decode loop's cache uses
# the same policies)

# --tree-shape names -> verify_attn.tree kinds. "ddtree" is the bushy kind (each node
# picks a recent earlier parent), the shape a DDTree node budget produces.
TREE_SHAPES = {"chain": "chain", "ddtree": "bushy", "star": "star"}
TREE_SEED = 1234  # fixed: the same trees (and so the same FLOPs) on every run


def make_trees(nodes: int, shape: str, batch: int, seed: int = TREE_SEED) -> list[list[int]]:
    """`batch` parent lists of `nodes` nodes each."""
    if shape not in TREE_SHAPES:
        raise ValueError(f"unknown tree shape {shape!r}; known: {', '.join(TREE_SHAPES)}")
    g = torch.Generator().manual_seed(seed)
    return [vtree.random_parents(nodes, TREE_SHAPES[shape], g) for _ in range(batch)]


def make_inputs(shape: HeadShape, ctx: int, trees: list[list[int]], page_size: int, dtype: torch.dtype,
                device: torch.device | str, seed: int, alloc: str = "shuffled", kv_dtype: str = "") -> dict:
    """tree_verify keyword arguments for `len(trees)` requests, each with `ctx` prefix tokens.

    Fresh seeded random q/K/V (never zeros); NaN in every unused slot/page
    (verify_attn.layouts.lay_out). `alloc` places the slots/pages: shuffled (a serving
    pool that has seen churn), contiguous (consecutive ids in request order) or
    fragmented (runs of consecutive ids, the runs shuffled). MLA pools keep V as the
    view k_cache[..., :Dv]. kv_dtype "fp8_e4m3" / "fp8_mla656" stores the cache in that fp8
    format (verify_attn.fp8.quantize_kwargs: per-tensor amax scales, or the 656-byte rows) and
    adds k_scale / v_scale / kv_format; "" or q's own dtype name keeps the 16/32-bit cache.
    """
    if alloc not in ALLOC_MODES:
        raise ValueError(f"unknown --alloc {alloc!r}; known: {', '.join(ALLOC_MODES)}")
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)
    g_cpu = torch.Generator().manual_seed(seed)   # slot/page shuffling happens on the host
    qo_indptr, tree_mask = vtree.pack_batch(trees, device=dev)
    total_q = int(qo_indptr[-1])
    seqs_k: list[torch.Tensor] = []                 # each [ctx + T_b, Hkv, Dqk]
    seqs_v: Optional[list[torch.Tensor]] = None if shape.mla else []
    for t in trees:
        n = ctx + len(t)
        seqs_k.append(torch.randn(n, shape.num_kv_heads, shape.head_dim_qk, generator=g, device=dev, dtype=dtype))
        if seqs_v is not None:
            seqs_v.append(torch.randn(n, shape.num_kv_heads, shape.head_dim_v, generator=g, device=dev, dtype=dtype))
    lay = lay_out(seqs_k, seqs_v, page_size, mla_dv=shape.head_dim_v if shape.mla else None,
                  generator=g_cpu if alloc == "shuffled" else None, shuffle=alloc == "shuffled", dtype=dtype,
                  device=dev)
    del seqs_k, seqs_v
    if alloc == "fragmented":
        lay = _fragment(lay, shape, g_cpu)
    q = torch.randn(total_q, shape.num_q_heads, shape.head_dim_qk, generator=g, device=dev, dtype=dtype)
    kw = dict(q=q, k_cache=lay["k_cache"], v_cache=lay["v_cache"], qo_indptr=qo_indptr,
              kv_indptr=lay["kv_indptr"], kv_indices=lay["kv_indices"], kv_lens=lay["kv_lens"],
              tree_mask=tree_mask, sm_scale=shape.sm_scale, page_size=page_size)
    if kv_dtype in FP8_KV_DTYPES:
        kw = quantize_kwargs(kw, kv_dtype, mla_dv=shape.head_dim_v if shape.mla else None)
    elif kv_dtype and KV_DTYPE_OF.get(dtype) != kv_dtype:
        raise ValueError(f"--kv-dtype {kv_dtype} with q {dtype}: a 16/32-bit cache has q's dtype")
    return kw


def _fragment(lay: dict, shape: HeadShape, g: torch.Generator) -> dict:
    """Renumber a contiguous layout's slots/pages so each request's ids come in runs of 8..256
    consecutive ids with the runs shuffled (verify_attn.layouts.free_order's "fragmented")."""
    pool = lay["k_cache"]
    n = pool.shape[0]
    order = torch.tensor(free_order(n, "fragmented", g), dtype=torch.long, device=pool.device)  # old id i -> order[i]
    new = torch.empty_like(pool)
    new[order] = pool
    idx = order[lay["kv_indices"].long()].to(lay["kv_indices"].dtype)
    if shape.mla:
        v = new[..., : shape.head_dim_v]
    else:
        v = torch.empty_like(lay["v_cache"])
        v[order] = lay["v_cache"]
    return dict(lay, k_cache=new, v_cache=v, kv_indices=idx)
