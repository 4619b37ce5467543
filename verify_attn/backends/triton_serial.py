"""`backend="triton-serial"`: the prefill-style verify kernel serving engines ship (the baseline).

This is the approach of SGLang's Triton `extend_attention_fwd` used for tree
verify, and the one behind the 185k-context slowdown of DESIGN.md section 1:
one program per (request, query head, block of BLOCK_M tree rows), walking the
request's whole prefix serially through the slot/page indices, then the tree
block under the tree mask. Nothing is split across programs, and each query
head re-reads its KV head's rows (no folding of the group into M), so at long
context a handful of programs stream the whole cache at low bandwidth.

It is a faithful baseline, not a strawman: block sizes follow SGLang's
per-arch table for the head size (`_sglang_blocks`), the 576 = 512 + 64 MLA
head is loaded as two power-of-two blocks, the MLA V is the K tile already in
registers, and BLOCK_M is capped at the tree size so small trees do not pay for
empty rows. An explicit `config` overrides block_m/block_n/num_warps/num_stages
(tests use small blocks under the interpreter).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from . import ALL_KV_FORMATS, Backend, Problem, register
from . import triton_common as tc
from ..config import KernelConfig
from ..shapes import HeadShape


@triton.jit
def _serial_fwd(
    Q, K, V, QO_INDPTR, KV_INDPTR, KV_INDICES, KV_LENS, MASK, OUT, LSE,
    KS, KR, K_SCALE, V_SCALE, qk_scale, k_scale_f, v_scale_f,
    stride_qt, stride_qh,
    stride_kp, stride_kpos, stride_kh,
    stride_vp, stride_vpos, stride_vh,
    stride_ot, stride_oh, stride_lt,
    MASK_WORDS,
    GROUP: tl.constexpr, DQK: tl.constexpr, DV: tl.constexpr,
    BLOCK_D1: tl.constexpr, BLOCK_DPE: tl.constexpr, BLOCK_DV: tl.constexpr, V_FROM_K: tl.constexpr,
    PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LSE: tl.constexpr, DOT_PREC: tl.constexpr, TREE_BLOCK: tl.constexpr,
    KV_FMT: tl.constexpr, FP8_BITS: tl.constexpr, K_SCALE_MEM: tl.constexpr, V_SCALE_MEM: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    mt = tl.program_id(2)
    kvh = h // GROUP

    qo_start = tl.load(QO_INDPTR + b)
    n_tree = tl.load(QO_INDPTR + b + 1) - qo_start
    if mt * BLOCK_M >= n_tree:
        return
    n_kv = tl.load(KV_LENS + b)
    if TREE_BLOCK:
        prefix = n_kv - n_tree
        too_many_nodes = n_tree > 32 * MASK_WORDS       # only possible with value checks off
    else:                                               # prefix-only call: every entry is prefix
        prefix = n_kv
        too_many_nodes = n_tree < 0
    kv_start = tl.load(KV_INDPTR + b)

    node = mt * BLOCK_M + tl.arange(0, BLOCK_M)             # [BLOCK_M] tree nodes of this block
    row_ok = node < n_tree
    token = qo_start + node                                  # rows of q / out / tree_mask
    # the committed prefix walked serially, then the tree block under the packed tree mask
    q_rows = Q + token[:, None] * stride_qt + h * stride_qh
    o, lse2 = tc.attend_rows(
        q_rows, K, V, KV_INDICES, MASK, KS, KR, K_SCALE, V_SCALE, qk_scale, k_scale_f, v_scale_f, kvh, token, row_ok,
        0, n_kv, prefix, kv_start, too_many_nodes,
        stride_kp, stride_kpos, stride_kh, stride_vp, stride_vpos, stride_vh, MASK_WORDS, DQK, DV, BLOCK_D1, BLOCK_DPE,
        BLOCK_DV, V_FROM_K, PAGE_SIZE, BLOCK_M, BLOCK_N, DOT_PREC, KV_FMT, FP8_BITS, K_SCALE_MEM, V_SCALE_MEM,
        False)
    offs_dv = tl.arange(0, BLOCK_DV)
    o_ptrs = OUT + token[:, None] * stride_ot + h * stride_oh + offs_dv[None, :]
    tl.store(o_ptrs, o.to(OUT.dtype.element_ty), mask=row_ok[:, None] & (offs_dv[None, :] < DV))
    if HAS_LSE:
        # natural log, as the contract asks; lse is [total_q, Hq] contiguous
        tl.store(LSE + token * stride_lt + h, lse2 * 0.6931471805599453, mask=row_ok)


def _sglang_blocks(dqk: int, arch: str) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) from SGLang's extend-attention table for this arch."""
    major = int(arch[3:-1]) if arch.startswith("sm_") else 0
    minor = int(arch[-1]) if arch.startswith("sm_") else 0
    small_smem = major == 12 or (major == 8 and minor in (6, 9))  # ~100 KB of shared memory
    if small_smem:
        bm, bn = (64, 128) if dqk <= 128 else (64, 64) if dqk <= 256 else (32, 32)
    elif major == 10:
        bm, bn = (64, 64) if dqk <= 256 else (16, 64)
    elif major == 9:
        bm, bn = (128, 64) if dqk <= 256 else (32, 64)
    elif major == 8:
        bm, bn = (128, 128) if dqk <= 128 else (64, 64) if dqk <= 256 else (32, 64)
    else:  # CPU interpreter and older GPUs
        bm, bn = (64, 64) if dqk <= 128 else (32, 32)
    return bm, bn, (4 if dqk <= 64 else 8)


def default_blocks(dqk: int, arch: str, max_tree_nodes: int) -> KernelConfig:
    bm, bn, warps = _sglang_blocks(dqk, arch)
    # a tree of 16 nodes in a 128-row block would spend 7/8 of its MMAs on empty rows
    bm = min(bm, max(16, triton.next_power_of_2(max_tree_nodes)))
    return KernelConfig(num_splits=1, block_n=bn, block_m=bm, num_warps=warps, num_stages=1)


def default_config(p: Problem) -> KernelConfig:
    return default_blocks(p.head_dim_qk, tc.arch_of(p.device), p.max_tree_nodes)


def _run(p: Problem, config: Optional[KernelConfig], out: torch.Tensor, lse: Optional[torch.Tensor]) -> None:
    cfg = config if config is not None else default_config(p)
    if cfg.block_m < 16 or cfg.block_n < 16:
        raise ValueError(f"triton-serial needs block_m and block_n >= 16 (tl.dot), got {cfg.block_m}, {cfg.block_n}")
    hb = tc.head_blocks(p.head_dim_qk, p.head_dim_v, p.mla_shared_kv)
    kv = tc.kv_args(p, out)
    skp, skpos, skh = tc.cache_strides(p.k_cache, p.page_size)
    svp, svpos, svh = tc.cache_strides(p.v_cache, p.page_size)
    grid = (p.batch, p.num_q_heads, triton.cdiv(p.max_tree_nodes, cfg.block_m))
    lse_arg = lse if lse is not None else out  # never written when HAS_LSE is False
    mask_arg = p.tree_mask if p.tree_mask is not None else p.kv_lens  # prefix-only: never read
    _serial_fwd[grid](
        p.q, kv.k, kv.v, p.qo_indptr, p.kv_indptr, p.kv_indices, p.kv_lens, mask_arg, out, lse_arg,
        kv.ks, kv.kr, kv.k_scale_ptr, kv.v_scale_ptr, p.sm_scale * tc.LOG2E, kv.k_scale, kv.v_scale,
        p.q.stride(0), p.q.stride(1),
        skp, skpos, skh, svp, svpos, svh,
        out.stride(0), out.stride(1), p.num_q_heads,
        p.mask_words,
        GROUP=p.group, DQK=p.head_dim_qk, DV=p.head_dim_v,
        BLOCK_D1=hb.block_d1, BLOCK_DPE=hb.block_dpe, BLOCK_DV=hb.block_dv, V_FROM_K=hb.v_from_k,
        PAGE_SIZE=p.page_size, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        HAS_LSE=lse is not None, DOT_PREC=tc.dot_precision(p.dtype), TREE_BLOCK=not p.prefix_only,
        KV_FMT=kv.fmt, FP8_BITS=kv.bits, K_SCALE_MEM=kv.k_scale_mem, V_SCALE_MEM=kv.v_scale_mem,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def compile_report(shape: HeadShape, config: KernelConfig, arch: str, *, dtype: torch.dtype = torch.bfloat16,
                   page_size: int = 1, return_lse: bool = True, kv_dtype: str = "") -> dict:
    """Compile `_serial_fwd` for this shape/config on `arch` without a GPU (see tc.ptxas_report);
    kv_dtype "fp8_e4m3" / "fp8_mla656" compiles the fp8 path (native e4m3 loads)."""
    hb = tc.head_blocks(shape.head_dim_qk, shape.head_dim_v, shape.mla)
    consts = dict(GROUP=shape.group, DQK=shape.head_dim_qk, DV=shape.head_dim_v, BLOCK_D1=hb.block_d1,
                  BLOCK_DPE=hb.block_dpe, BLOCK_DV=hb.block_dv, V_FROM_K=hb.v_from_k, PAGE_SIZE=page_size,
                  BLOCK_M=config.block_m, BLOCK_N=config.block_n, HAS_LSE=return_lse,
                  DOT_PREC=tc.dot_precision(dtype), TREE_BLOCK=True, KV_FMT=tc.FMT_CODE.get(kv_dtype, tc.FMT_NATIVE),
                  FP8_BITS=False, K_SCALE_MEM=False, V_SCALE_MEM=False)
    t = tc.TRITON_DTYPE[dtype]
    ptrs = {n: "*i32" for n in ("QO_INDPTR", "KV_INDPTR", "KV_INDICES", "KV_LENS", "MASK")}
    ptrs.update({n: f"*{t}" for n in ("Q", "OUT")})
    kv_t = "fp8e4nv" if kv_dtype in ("fp8_e4m3", "fp8_mla656") else t   # fp8 caches: native e4m3 loads
    ptrs.update({"K": f"*{kv_t}", "V": f"*{kv_t}", "KS": "*fp32", "KR": "*bf16", "K_SCALE": "*fp32",
                 "V_SCALE": "*fp32"})
    ptrs["LSE"] = "*fp32"
    aligned = tuple(n for n in _serial_fwd.arg_names if n.startswith("stride_") and n != "stride_lt")
    return tc.ptxas_report(_serial_fwd, arch=arch, constexprs=consts, pointers=ptrs, floats=("qk_scale", "k_scale_f", "v_scale_f"),
                           aligned=aligned, num_warps=config.num_warps, num_stages=config.num_stages)


register(Backend(
    "triton-serial", _run, available=tc.available, supports=tc.supports, default_config=default_config,
    tunable=False, prefix_only=True, kv_formats=ALL_KV_FORMATS, meta={"kind": "baseline", "grid": "(request, query head, tree-row block)"},
))
