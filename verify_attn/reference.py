"""The float64 reference: the contract of DESIGN.md section 3, computed plainly.

Per request b, node i, query head h (KV head h // group):
    s_j = sm_scale * q[i, h] . k[j]  for the L_b prefix tokens j, and for the tree
          entries j whose mask bit is set in row i
    out[i, h] = sum_j softmax(s)_j v[j],  lse[i, h] = log sum_j exp(s_j)
The KV is processed in chunks with an online softmax, so 185k tokens fit in a
few hundred MB; nothing [T, H, ctx] is materialised for the whole batch.

FP8 caches are dequantized exactly in float64 (`kv_rows`), so the reference is the
exact answer for the values the fp8 cache holds, not for the cache it was made from.

A prefix-only call (tree_mask None) has no tree block: every row sees all n
entries, and n = 0 gives out 0, lse -inf.

The reference reads every index on the host anyway, so it checks what it reads
even when the api's value checks are off (`set_validation("shapes")`): an id
outside [0, k_cache.shape[0]) or a request with fewer ids than its kv_lens raises
ValueError instead of wrapping around (torch indexing takes -1 as the last slot).
"""
from __future__ import annotations

from typing import Optional

import torch

from . import fp8
from .backends import ALL_KV_FORMATS, Backend, Problem, register
from .config import KernelConfig
from .layouts import gather_rows
from .tree import unpack_mask

CHUNK = 8192  # KV tokens per chunk: [rows, CHUNK] float64 scores stay small


def _request_rows(p: Problem, b: int, qo: list[int], kvp: list[int], lens: list[int]):
    """(T_b, kv_len, the request's ids actually addressed), checked: never a silent wrap-around."""
    t = qo[b + 1] - qo[b]
    n = lens[b]
    if t < 1 or n < 0 or (not p.prefix_only and n < t):
        raise ValueError(f"reference: request {b} has T_b={t} q rows and kv_lens={n} "
                         f"(need T_b >= 1 and kv_lens >= {0 if p.prefix_only else 'T_b'})")
    need = -(-n // p.page_size)
    lo, hi = kvp[b], kvp[b + 1]
    if lo < 0 or hi - lo < need or lo + need > p.kv_indices.numel():
        raise ValueError(f"reference: kv_indices of request {b} ([{lo}, {hi}) of {p.kv_indices.numel()}) "
                         f"hold fewer than the {need} ids kv_lens={n} needs")
    idx = p.kv_indices[lo: lo + need]
    if need:
        nb = p.k_cache.shape[0]
        lo_id, hi_id = int(idx.min()), int(idx.max())
        if lo_id < 0 or hi_id >= nb:
            what = "slot" if p.page_size == 1 else "page"
            raise ValueError(f"reference: kv_indices of request {b} hold {what} ids out of range [0, {nb}): "
                             f"min {lo_id}, max {hi_id}")
    return t, n, idx


def kv_rows(p: Problem, idx: torch.Tensor, start: int, cnt: int,
            dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """K [cnt, Hkv, Dqk] and V [cnt, Hkv, Dv] of logical tokens [start, start + cnt) of one request, as
    values in `dtype`: the cache's own values, or for an fp8 cache the dequantized ones (code x scale,
    exact in float64; fp8_mla656: code x its 128-block's scale, then the bf16 RoPE values)."""
    if p.kv_dtype == "fp8_mla656":
        k = fp8.dequantize_mla656(gather_rows(p.k_cache, idx, p.page_size, start, cnt), dtype)
        return k, k[..., : p.head_dim_v]
    k = gather_rows(p.k_cache, idx, p.page_size, start, cnt)
    v = gather_rows(p.v_cache, idx, p.page_size, start, cnt)
    if p.kv_dtype == "fp8_e4m3":
        return fp8.dequantize_e4m3(k, p.k_scale, dtype), fp8.dequantize_e4m3(v, p.v_scale, dtype)
    return k.to(dtype), v.to(dtype)


def reference_verify(p: Problem, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (out [total_q, Hq, Dv], lse [total_q, Hq]) in `dtype` (float64 by default)."""
    qo = p.qo_indptr.tolist()
    kvp = p.kv_indptr.tolist()
    lens = p.kv_lens.tolist()
    hq, hkv, g, dv = p.num_q_heads, p.num_kv_heads, p.group, p.head_dim_v
    dev = p.q.device
    out = torch.empty(p.total_q, hq, dv, dtype=dtype, device=dev)
    lse = torch.empty(p.total_q, hq, dtype=dtype, device=dev)
    for b in range(p.batch):
        t, n, idx = _request_rows(p, b, qo, kvp, lens)
        prefix = n if p.prefix_only else n - t
        # [Hkv, g*T, Dqk]: rows of one KV head are its g query heads x T nodes (head-major)
        q = p.q[qo[b]: qo[b + 1]].to(dtype).view(t, hkv, g, -1).permute(1, 2, 0, 3).reshape(hkv, g * t, -1)
        m = torch.full((hkv, g * t), float("-inf"), dtype=dtype, device=dev)
        s_sum = torch.zeros(hkv, g * t, dtype=dtype, device=dev)
        acc = torch.zeros(hkv, g * t, dv, dtype=dtype, device=dev)
        visible_tree = None if p.prefix_only else unpack_mask(p.tree_mask[qo[b]: qo[b + 1]].cpu(), t).to(dev)  # [T, T]
        for start in range(0, n, CHUNK):
            cnt = min(CHUNK, n - start)
            k, v = kv_rows(p, idx, start, cnt, dtype)
            k, v = k.transpose(0, 1), v.transpose(0, 1)                                       # [Hkv, cnt, D]
            s = torch.matmul(q, k.transpose(1, 2)) * p.sm_scale                              # [Hkv, g*T, cnt]
            lo = max(start, prefix)
            if lo < start + cnt:  # this chunk reaches into the tree block: mask it
                cols = torch.arange(lo, start + cnt, device=dev) - prefix                   # tree node ids
                vis = visible_tree[:, cols].repeat(g, 1)                                     # [g*T, ncols]
                s[:, :, lo - start:] = s[:, :, lo - start:].masked_fill(~vis, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            alpha = torch.exp(m - m_new)
            e = torch.exp(s - m_new.unsqueeze(-1))
            s_sum = s_sum * alpha + e.sum(-1)
            acc = acc * alpha.unsqueeze(-1) + torch.matmul(e, v)
            m = m_new
        if n == 0:   # prefix-only call of an empty request: nothing to see
            o, l = acc, m                                                                   # 0 and -inf
        else:
            o = acc / s_sum.unsqueeze(-1)                                                   # [Hkv, g*T, Dv]
            l = m + torch.log(s_sum)
        out[qo[b]: qo[b + 1]] = o.view(hkv, g, t, dv).permute(2, 0, 1, 3).reshape(t, hq, dv)
        lse[qo[b]: qo[b + 1]] = l.view(hkv, g, t).permute(2, 0, 1).reshape(t, hq)
    return out, lse


def reference_e4m3_mma(p: Problem) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 reference of an fp8 cache's call with q rounded as the CUDA kernels' e4m3 MMAs round it
    (fp8.e4m3_mma_q): their scores and LSE to fp32 rounding; their output up to P's e4m3 rounding."""
    import dataclasses

    from .fp8 import e4m3_mma_q
    return reference_verify(dataclasses.replace(p, q=e4m3_mma_q(p.q, p.kv_dtype)))


def _run(p: Problem, config: Optional[KernelConfig], out: torch.Tensor, lse: Optional[torch.Tensor]) -> None:
    o, l = reference_verify(p)
    out.copy_(o.to(out.dtype))
    if lse is not None:
        lse.copy_(l.to(torch.float32))


register(Backend("reference", _run, prefix_only=True, kv_formats=ALL_KV_FORMATS, meta={"precision": "float64"}))
