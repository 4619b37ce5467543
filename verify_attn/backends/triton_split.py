"""`backend="triton"`: split-KV tree verify, the portable fast path (DESIGN.md section 4).

Kernel 1 (`_split_fwd`), grid (M tile, KV split, request x KV head):
  - the rows of a program are (tree node, query head) pairs of ONE KV head,
    node-major: row r = node * GROUP + head-in-group, folded into the M
    dimension of tl.dot; so one KV tile load serves every head and node of the
    group. Rows beyond BLOCK_M go to further M tiles (axis 0, adjacent in
    launch order, so the M tiles of one split re-read the same KV from L2).
  - the request's KV sequence is cut into NUM_SPLITS spans of
    ceil(ceil(n / S) / BLOCK_N) * BLOCK_N tokens, computed on the device from
    kv_lens: the grid comes from static shapes only (CUDA-graph safe); a
    program whose span or M tile is empty returns at once.
  - the span's prefix part runs unmasked except for the ragged tail; only the
    part in the tree block (the last T_b entries) reads the packed mask.
  - with one split it writes out/lse directly; else it writes a partial
    O (fp32 [S, total_q * Hq, Dv], already normalised) and LSE (log2 domain).
Kernel 2 (`_combine`), grid (row block, request): LSE-merges the non-empty
splits of each row (it recomputes how many there are from kv_lens, so empty
splits are never read) into out and lse.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from . import ALL_KV_FORMATS, Backend, Problem, register
from . import triton_common as tc
from ..config import KernelConfig, heuristic_num_splits
from ..shapes import HeadShape


@triton.jit
def _split_fwd(
    Q, K, V, QO_INDPTR, KV_INDPTR, KV_INDICES, KV_LENS, MASK, OUT, LSE, PART_O, PART_LSE,
    KS, KR, K_SCALE, V_SCALE, qk_scale, k_scale_f, v_scale_f,
    stride_qt, stride_qh,
    stride_kp, stride_kpos, stride_kh,
    stride_vp, stride_vpos, stride_vh,
    stride_ot, stride_oh, stride_lt,
    total_rows, MASK_WORDS, NUM_SPLITS, NUM_KV_HEADS,
    GROUP: tl.constexpr, DQK: tl.constexpr, DV: tl.constexpr,
    BLOCK_D1: tl.constexpr, BLOCK_DPE: tl.constexpr, BLOCK_DV: tl.constexpr, V_FROM_K: tl.constexpr,
    PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DIRECT: tl.constexpr, HAS_LSE: tl.constexpr, DOT_PREC: tl.constexpr, TREE_BLOCK: tl.constexpr,
    KV_FMT: tl.constexpr, FP8_BITS: tl.constexpr, K_SCALE_MEM: tl.constexpr, V_SCALE_MEM: tl.constexpr,
):
    mt = tl.program_id(0)
    split = tl.program_id(1)
    bh = tl.program_id(2)
    b = bh // NUM_KV_HEADS
    kvh = bh % NUM_KV_HEADS

    qo_start = tl.load(QO_INDPTR + b)
    n_tree = tl.load(QO_INDPTR + b + 1) - qo_start
    n_rows = n_tree * GROUP
    n_kv = tl.load(KV_LENS + b)
    span = tc.split_span(n_kv, NUM_SPLITS, BLOCK_N)
    lo = split * span
    # an empty request (prefix-only call, n_kv = 0) still has split 0 write out = 0, lse = -inf
    if (mt * BLOCK_M >= n_rows) | ((lo >= n_kv) & ((split > 0) | (n_kv > 0))):
        return
    hi = tl.minimum(lo + span, n_kv)
    if TREE_BLOCK:
        prefix = n_kv - n_tree
        too_many_nodes = n_tree > 32 * MASK_WORDS       # only possible with value checks off
    else:                                               # prefix-only call: every entry is prefix
        prefix = n_kv
        too_many_nodes = n_tree < 0
    kv_start = tl.load(KV_INDPTR + b)

    r = mt * BLOCK_M + tl.arange(0, BLOCK_M)                 # [BLOCK_M] rows: node-major, head-minor
    row_ok = r < n_rows
    token = qo_start + r // GROUP                            # q / out / tree_mask row of each M row
    head = kvh * GROUP + r % GROUP                           # query head of each M row
    # this split's span: its prefix part (every row sees every token), then its tree part (only the last split(s)
    # reach it) under the packed ancestor mask
    q_rows = Q + token[:, None] * stride_qt + head[:, None] * stride_qh
    o, lse2 = tc.attend_rows(
        q_rows, K, V, KV_INDICES, MASK, KS, KR, K_SCALE, V_SCALE, qk_scale, k_scale_f, v_scale_f, kvh, token, row_ok,
        lo, hi, prefix, kv_start, too_many_nodes,
        stride_kp, stride_kpos, stride_kh, stride_vp, stride_vpos, stride_vh, MASK_WORDS, DQK, DV, BLOCK_D1, BLOCK_DPE,
        BLOCK_DV, V_FROM_K, PAGE_SIZE, BLOCK_M, BLOCK_N, DOT_PREC, KV_FMT, FP8_BITS, K_SCALE_MEM, V_SCALE_MEM,
        True)
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv[None, :] < DV
    if DIRECT:
        o_ptrs = OUT + token[:, None] * stride_ot + head[:, None] * stride_oh + offs_dv[None, :]
        tl.store(o_ptrs, o.to(OUT.dtype.element_ty), mask=row_ok[:, None] & dv_ok)
        if HAS_LSE:
            tl.store(LSE + token * stride_lt + head, lse2 * 0.6931471805599453, mask=row_ok)
    else:
        # workspace row of (token, head): token * Hq + head, the same order as out
        prow = split.to(tl.int64) * total_rows + token.to(tl.int64) * (NUM_KV_HEADS * GROUP) + head
        tl.store(PART_O + prow[:, None] * BLOCK_DV + offs_dv[None, :], o, mask=row_ok[:, None] & dv_ok)
        tl.store(PART_LSE + prow, lse2, mask=row_ok)


@triton.jit
def _combine(
    PART_O, PART_LSE, QO_INDPTR, KV_LENS, OUT, LSE,
    total_rows, NUM_SPLITS,
    HQ: tl.constexpr, DV: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr, HAS_LSE: tl.constexpr,
):
    rb = tl.program_id(0)
    b = tl.program_id(1)
    row_lo = tl.load(QO_INDPTR + b) * HQ
    row_hi = tl.load(QO_INDPTR + b + 1) * HQ
    if row_lo + rb * BLOCK_R >= row_hi:
        return
    n_kv = tl.load(KV_LENS + b)
    span = tc.split_span(n_kv, NUM_SPLITS, BLOCK_N)
    n_used = tl.cdiv(n_kv, tl.maximum(span, 1))               # splits with at least one token (0 if n_kv = 0)

    rows = row_lo + rb * BLOCK_R + tl.arange(0, BLOCK_R)      # [BLOCK_R] rows token * Hq + head
    row_ok = rows < row_hi
    offs_dv = tl.arange(0, BLOCK_DV)
    ok2 = row_ok[:, None] & (offs_dv[None, :] < DV)
    m = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_DV], dtype=tl.float32)
    lse_ptrs = PART_LSE + rows                                # advanced split by split (64-bit pointers)
    o_ptrs = PART_O + rows[:, None].to(tl.int64) * BLOCK_DV + offs_dv[None, :]
    for _s in range(0, n_used):
        ls = tl.load(lse_ptrs, mask=row_ok, other=float("-inf"))
        o = tl.load(o_ptrs, mask=ok2, other=0.0)
        lse_ptrs += total_rows
        o_ptrs += total_rows * BLOCK_DV
        m_new = tl.maximum(m, ls)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_use)
        w = tl.exp2(ls - m_use)                               # 0 for a split where the row saw nothing
        acc = acc * alpha[:, None] + o * w[:, None]
        l = l * alpha + w
        m = m_new
    l_safe = tl.where(l != 0, l, 1.0)                         # a NaN l stays NaN: propagates to lse
    out = acc / l_safe[:, None]
    tl.store(OUT + rows[:, None] * DV + offs_dv[None, :], out.to(OUT.dtype.element_ty), mask=ok2)
    if HAS_LSE:
        tl.store(LSE + rows, (m + tl.log2(l_safe)) * 0.6931471805599453, mask=row_ok)


# ----------------------------------------------------------------------------------------
# host side: configs, resource model, launch
# ----------------------------------------------------------------------------------------

def _elt_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _blocks_for(shape: HeadShape) -> tc.HeadBlocks:
    return tc.head_blocks(shape.head_dim_qk, shape.head_dim_v, shape.mla)


def resources(config: KernelConfig, shape: HeadShape, arch: str, *, dtype: torch.dtype = torch.bfloat16,
              kv_dtype: str = "", **_kw) -> dict:
    """Shared-memory and register estimate of one `_split_fwd` program (an estimate, not the compiler's figure).

    Shared memory, the larger of two phases Triton allocates:
      mainloop = num_stages x (K tile BLOCK_N x padded Dqk, plus a V tile
                 BLOCK_N x BLOCK_DV unless V is the K tile (MLA))
                 + P (BLOCK_M x BLOCK_N, the A operand of the PV dot)
                 + on sm_90/sm_100 (wgmma) the Q tile BLOCK_M x padded Dqk
                 staged as an smem operand; with mma.sync (sm_80, sm_120) Q
                 stays in registers;
      epilogue = the fp32 accumulator BLOCK_M x BLOCK_DV converted to the store
                 layout through smem, plus, with num_stages=1, the one KV
                 buffer still allocated (MLA 32x32: 100 KB at 1 stage, 78 KB
                 at 2 stages, per ptxas).
    Registers per thread: fp32 accumulator + Q operand (16-bit pairs) + 2 x
    the score tile + ~32 for addresses and softmax state. `fits` asks for
    smem <= the arch's per-block limit and est. registers <= 160: calibrated
    with `compile_report` (ptxas, sm_90 and sm_120) where configs above that
    spilled (MLA 64x32 at 8 warps, 32x32 at 4 warps; GQA-128 64x64 at 4 warps
    on sm_120) and those below did not. The compiler's own numbers can differ
    by tens of percent either way: `compile_report` gives them exactly.

    FP8 caches (kv_dtype "fp8_e4m3" / "fp8_mla656"): the codes go through registers to be
    converted (no cp.async straight into the dot's smem), which costs ~BLOCK_N x Dqk / 2 /
    threads more registers per thread; fp8_mla656 at 2 stages spills (ptxas, sm_90 and
    sm_120, MLA 32x16 and 32x32), so it must run 1 stage. Calibrated with `compile_report`:
    MLA 32x16, 8 warps: fp8_e4m3 2 stages 170 registers / 56 KB, fp8_mla656 1 stage 179-182 / 72 KB;
    32x32 fp8_e4m3 250+ registers (no spill), fp8_mla656 at 1 stage 106 KB (over sm_120's limit).
    """
    hb = _blocks_for(shape)
    e = _elt_bytes(dtype)
    stages = max(1, config.num_stages)
    q_tile = config.block_m * hb.padded_qk * e
    kv_tile = config.block_n * hb.padded_qk * e + (0 if hb.v_from_k else config.block_n * hb.block_dv * e)
    p_tile = config.block_m * config.block_n * e
    wgmma = arch in ("sm_90", "sm_100", "sm_103")
    mainloop = (q_tile if wgmma else 0) + stages * kv_tile + p_tile
    epilogue = config.block_m * hb.block_dv * 4 + (kv_tile if stages == 1 else 0)
    smem = max(mainloop, epilogue)
    threads = 32 * config.num_warps
    acc_regs = config.block_m * hb.block_dv // threads
    q_regs = q_tile // 4 // threads
    s_regs = config.block_m * config.block_n // threads
    regs_est = acc_regs + q_regs + 2 * s_regs + 32
    fp8_ok = True
    if kv_dtype in ("fp8_e4m3", "fp8_mla656"):
        regs_est += config.block_n * hb.padded_qk // 2 // threads
        fp8_ok = kv_dtype != "fp8_mla656" or stages == 1
    limit = tc.smem_limit(arch)
    return {
        "smem_bytes": smem, "smem_limit": limit, "acc_regs_per_thread": acc_regs,
        "regs_per_thread_est": regs_est,
        "fits": (smem <= limit and regs_est <= 160 and config.block_m >= 16 and config.block_n >= 16
                 and fp8_ok),
    }


def config_space(shape: HeadShape, arch: str, *, dtype: torch.dtype = torch.bfloat16,
                 splits: tuple[int, ...] = (0,), kv_dtype: str = "", **_kw) -> list[KernelConfig]:
    """Configs worth trying for this head shape on this arch (filtered by `resources`).

    num_splits defaults to 0 (the heuristic); the autotuner passes the split
    counts it sweeps per context bucket as `splits`.
    """
    out = []
    for bn in (16, 32, 64):
        for bm in (16, 32, 64, 128):
            for warps in (4, 8):
                for stages in (1, 2, 3):
                    for s in splits:
                        c = KernelConfig(num_splits=s, block_n=bn, block_m=bm, num_warps=warps, num_stages=stages)
                        if resources(c, shape, arch, dtype=dtype, kv_dtype=kv_dtype)["fits"]:
                            out.append(c)
    return out


def default_blocks(shape: HeadShape, arch: str, dtype: torch.dtype, max_rows: int,
                   kv_dtype: str = "") -> tuple[int, int, int, int]:
    """(block_m, block_n, num_warps, num_stages) before the split count; the autotuner refines them.

    Checked with `compile_report` (bf16, ptxas, no spills) on sm_90 and sm_120:
    MLA 576/512 at 32x32, 8 warps, 2 stages: 182-184 registers, 78 KB smem;
    GQA-128 at 64x32, 4 warps, 2 stages: 168-177 registers, 44-56 KB.
    FP8 MLA (see `resources`): 32x16, 8 warps, 2 stages (fp8_e4m3) or 1 stage (fp8_mla656).
    """
    hb = _blocks_for(shape)
    if hb.block_dv >= 256:   # a [32, 512] fp32 accumulator is 64 registers/thread at 8 warps
        bm, bn, warps, stages = 32, 32, 8, 2
    else:
        bm, bn, warps, stages = 64, 32, 4, 2
    if kv_dtype == "fp8_mla656":
        stages = 1
    bm = min(bm, max(16, triton.next_power_of_2(max_rows)))
    if arch != "cpu":
        while bn > 16 and not resources(KernelConfig(1, bn, bm, warps, stages), shape, arch, dtype=dtype,
                                        kv_dtype=kv_dtype)["fits"]:
            bn //= 2
    return bm, bn, warps, stages


def default_config(p: Problem) -> KernelConfig:
    bm, bn, warps, stages = default_blocks(p.head_shape(), tc.arch_of(p.device), p.dtype,
                                           p.max_tree_nodes * p.group, p.kv_dtype)
    m_tiles = triton.cdiv(p.max_tree_nodes * p.group, bm)
    splits = heuristic_num_splits(batch=p.batch, num_kv_heads=p.num_kv_heads, m_tiles=m_tiles,
                                  avg_kv_len=p.avg_kv_len, num_sms=tc.num_sms(p.device), block_n=bn)
    return KernelConfig(num_splits=splits, block_n=bn, block_m=bm, num_warps=warps, num_stages=stages)


def _resolve(p: Problem, config: Optional[KernelConfig]) -> KernelConfig:
    cfg = config if config is not None else default_config(p)
    if cfg.block_m < 16 or cfg.block_n < 16:
        raise ValueError(f"triton needs block_m and block_n >= 16 (tl.dot), got {cfg.block_m}, {cfg.block_n}")
    if cfg.num_splits == 0:
        m_tiles = triton.cdiv(p.max_tree_nodes * p.group, cfg.block_m)
        cfg = cfg.replace(num_splits=heuristic_num_splits(
            batch=p.batch, num_kv_heads=p.num_kv_heads, m_tiles=m_tiles, avg_kv_len=p.avg_kv_len,
            num_sms=tc.num_sms(p.device), block_n=cfg.block_n))
    return cfg


def combine_rows(block_dv: int) -> int:
    """Rows per combine program: ~4K fp32 values per [BLOCK_R, BLOCK_DV] tile (32 registers/thread at 4 warps)."""
    return max(1, min(64, 4096 // block_dv))


def _workspace(splits: int, rows: int, block_dv: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Split partials: O fp32 [splits, rows, BLOCK_DV] (normalised) and LSE fp32 [splits, rows] (log2).

    Allocated per call: torch's caching allocator makes this cheap, and under
    CUDA-graph capture it comes from the graph's private pool. Uninitialised
    on purpose: empty splits are never written and the combine never reads them.
    """
    return (torch.empty(splits, rows, block_dv, dtype=torch.float32, device=device),
            torch.empty(splits, rows, dtype=torch.float32, device=device))


def _run(p: Problem, config: Optional[KernelConfig], out: torch.Tensor, lse: Optional[torch.Tensor]) -> None:
    cfg = _resolve(p, config)
    hb = tc.head_blocks(p.head_dim_qk, p.head_dim_v, p.mla_shared_kv)
    kv = tc.kv_args(p, out)
    skp, skpos, skh = tc.cache_strides(p.k_cache, p.page_size)
    svp, svpos, svh = tc.cache_strides(p.v_cache, p.page_size)
    splits = cfg.num_splits
    direct = splits == 1
    total_rows = p.total_q * p.num_q_heads
    if direct:
        part_o = part_lse = out  # never touched with DIRECT
    else:
        part_o, part_lse = _workspace(splits, total_rows, hb.block_dv, p.device)
    lse_arg = lse if lse is not None else out
    mask_arg = p.tree_mask if p.tree_mask is not None else p.kv_lens  # prefix-only: never read
    m_tiles = triton.cdiv(p.max_tree_nodes * p.group, cfg.block_m)
    grid = (m_tiles, splits, p.batch * p.num_kv_heads)
    _split_fwd[grid](
        p.q, kv.k, kv.v, p.qo_indptr, p.kv_indptr, p.kv_indices, p.kv_lens, mask_arg,
        out, lse_arg, part_o, part_lse,
        kv.ks, kv.kr, kv.k_scale_ptr, kv.v_scale_ptr, p.sm_scale * tc.LOG2E, kv.k_scale, kv.v_scale,
        p.q.stride(0), p.q.stride(1),
        skp, skpos, skh, svp, svpos, svh,
        out.stride(0), out.stride(1), p.num_q_heads,
        total_rows, p.mask_words, splits, p.num_kv_heads,
        GROUP=p.group, DQK=p.head_dim_qk, DV=p.head_dim_v,
        BLOCK_D1=hb.block_d1, BLOCK_DPE=hb.block_dpe, BLOCK_DV=hb.block_dv, V_FROM_K=hb.v_from_k,
        PAGE_SIZE=p.page_size, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        DIRECT=direct, HAS_LSE=lse is not None, DOT_PREC=tc.dot_precision(p.dtype),
        TREE_BLOCK=not p.prefix_only,
        KV_FMT=kv.fmt, FP8_BITS=kv.bits, K_SCALE_MEM=kv.k_scale_mem, V_SCALE_MEM=kv.v_scale_mem,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if direct:
        return
    block_r = combine_rows(hb.block_dv)
    cgrid = (triton.cdiv(p.max_tree_nodes * p.num_q_heads, block_r), p.batch)
    _combine[cgrid](
        part_o, part_lse, p.qo_indptr, p.kv_lens, out, lse_arg,
        total_rows, splits,
        HQ=p.num_q_heads, DV=p.head_dim_v, BLOCK_DV=hb.block_dv, BLOCK_N=cfg.block_n,
        BLOCK_R=block_r, HAS_LSE=lse is not None,
        num_warps=4,
    )


def compile_report(shape: HeadShape, config: KernelConfig, arch: str, *, dtype: torch.dtype = torch.bfloat16,
                   page_size: int = 1, direct: bool = False, return_lse: bool = True, kv_dtype: str = "") -> dict:
    """Compile `_split_fwd` for this shape/config on `arch` without a GPU (see tc.ptxas_report).

    Lets the resource model and the config space be checked against the real
    compiler (registers, spills, shared memory) on the CPU build machine. kv_dtype
    "fp8_e4m3" / "fp8_mla656" compiles the fp8 path (native e4m3 loads).
    """
    hb = _blocks_for(shape)
    consts = dict(GROUP=shape.group, DQK=shape.head_dim_qk, DV=shape.head_dim_v, BLOCK_D1=hb.block_d1,
                  BLOCK_DPE=hb.block_dpe, BLOCK_DV=hb.block_dv, V_FROM_K=hb.v_from_k, PAGE_SIZE=page_size,
                  BLOCK_M=config.block_m, BLOCK_N=config.block_n, DIRECT=direct, HAS_LSE=return_lse,
                  DOT_PREC=tc.dot_precision(dtype), TREE_BLOCK=True, KV_FMT=tc.FMT_CODE.get(kv_dtype, tc.FMT_NATIVE),
                  FP8_BITS=False, K_SCALE_MEM=False, V_SCALE_MEM=False)
    t = tc.TRITON_DTYPE[dtype]
    ptrs = {n: "*i32" for n in ("QO_INDPTR", "KV_INDPTR", "KV_INDICES", "KV_LENS", "MASK")}
    ptrs.update({n: f"*{t}" for n in ("Q", "OUT")})
    kv_t = "fp8e4nv" if kv_dtype in ("fp8_e4m3", "fp8_mla656") else t   # fp8 caches: native e4m3 loads
    ptrs.update({"K": f"*{kv_t}", "V": f"*{kv_t}", "KS": "*fp32", "KR": "*bf16", "K_SCALE": "*fp32",
                 "V_SCALE": "*fp32"})
    ptrs.update({n: "*fp32" for n in ("LSE", "PART_O", "PART_LSE")})
    # cache/q/out strides are multiples of 16 elements for every preset head; stride_lt is Hq (8 for Kimi K2)
    aligned = tuple(n for n in _split_fwd.arg_names if n.startswith("stride_") and n != "stride_lt")
    return tc.ptxas_report(_split_fwd, arch=arch, constexprs=consts, pointers=ptrs, floats=("qk_scale", "k_scale_f", "v_scale_f"),
                           aligned=aligned, num_warps=config.num_warps, num_stages=config.num_stages)


register(Backend(
    "triton", _run, available=tc.available, supports=tc.supports, config_space=config_space,
    resources=resources, default_config=default_config, tunable=True, prefix_only=True, kv_formats=ALL_KV_FORMATS,
    meta={"kind": "split-kv", "grid": "(M tile, KV split, request x KV head) + combine"},
))
