"""Pieces shared by the two Triton backends (`triton-serial`, `triton`).

Host side: availability under the interpreter, the support checks, how a head
dim is cut into power-of-two blocks, the device's arch string and SM count,
and `ptxas_report` (compile a kernel for sm_90/sm_120 on a machine without a
GPU and read registers, spills and shared memory).
Device side (`@triton.jit`): `attend_tile`, one KV tile of the mainloop (row
addresses for page_size 1 or paged, K/V loads with the MLA V taken from the K
tile, scores, the packed tree mask, the online softmax), `finish_rows` and
`split_span`.

Only long-stable `tl` APIs are used (tl.load/store/dot/trans/where/exp2/log2,
tl.cdiv, tl.arange, tl.maximum), so the kernels run on triton 3.6 through 3.8.

Conventions inside the kernels: scores are kept in the log2 domain
(`qk_scale = sm_scale * log2(e)`, `exp2`), LSE is converted back to the natural
log only when written to the caller's `lse`.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from .. import device as vdevice
from . import Problem

LOG2E = math.log2(math.e)

# Shared memory per block (opt-in maximum) by arch: what Triton may allocate.
SMEM_LIMIT = {
    "sm_80": 166912, "sm_86": 101376, "sm_87": 166912, "sm_89": 101376,
    "sm_90": 232448, "sm_100": 232448, "sm_103": 232448, "sm_120": 101376, "sm_121": 101376,
}
REGS_PER_SM = 65536
MAX_HEAD_DIM = 1024  # one program holds a [BLOCK_M, Dv] fp32 accumulator: keep it bounded


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def available() -> tuple[bool, str]:
    """Triton runs on a CUDA device, or on the CPU under TRITON_INTERPRET=1."""
    if torch.cuda.is_available():
        return True, ""
    if interpreting():
        return True, ""
    return False, "no CUDA device, and TRITON_INTERPRET=1 is not set (the CPU needs Triton's interpreter)"


def supports(p: Problem) -> Optional[str]:
    """None if both Triton kernels can run this problem, else why not."""
    if p.device.type == "cpu" and not interpreting():
        return "tensors are on the CPU and TRITON_INTERPRET=1 is not set"
    if p.device.type not in ("cpu", "cuda"):
        return f"device {p.device} is neither cuda nor cpu"
    if interpreting() and p.dtype == torch.bfloat16:
        # FACTS.md: the interpreter's bf16 tl.dot returns garbage (errors ~1e10)
        return "bfloat16 under TRITON_INTERPRET=1 (the interpreter's bf16 tl.dot is broken); use fp16/fp32"
    if p.head_dim_qk > MAX_HEAD_DIM or p.head_dim_v > MAX_HEAD_DIM:
        return f"head dims Dqk={p.head_dim_qk}, Dv={p.head_dim_v} exceed {MAX_HEAD_DIM}"
    if p.page_size > 1 and p.k_cache.stride(1) == 0:
        return "paged k_cache with a zero page-position stride"
    return None


@dataclass(frozen=True)
class HeadBlocks:
    """Power-of-two blocks covering a head (tl.arange/tl.dot need power-of-two sizes >= 16).

    Dqk = D1 + rest: D1 is the largest power of two <= Dqk (the "nope/latent"
    part, 512 for MLA 576), rest (64 for MLA) is loaded as a second block of
    BLOCK_DPE >= rest; both are masked where they run past Dqk. V_FROM_K: the
    MLA case where V is exactly the first D1 values of the K row, so the K
    tile already loaded is reused as the V tile (each KV row read once).
    """

    block_d1: int
    block_dpe: int   # 0 when Dqk is a power of two
    block_dv: int
    v_from_k: bool

    @property
    def padded_qk(self) -> int:
        return self.block_d1 + self.block_dpe


def head_blocks(dqk: int, dv: int, mla_shared_kv: bool) -> HeadBlocks:
    d1 = max(16, 1 << (dqk.bit_length() - 1))
    rest = max(0, dqk - d1)
    dpe = max(16, triton.next_power_of_2(rest)) if rest else 0
    bdv = max(16, triton.next_power_of_2(dv))
    return HeadBlocks(d1, dpe, bdv, bool(mla_shared_kv and dv == d1 and dqk >= d1))


def dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs: exact fp32 products (the default would be tf32 on the GPU);
    # 16-bit inputs ignore this.
    return "ieee" if dtype == torch.float32 else "tf32"


def arch_of(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def num_sms(device: torch.device) -> int:
    # the GPU's own count (cuda-python, cached); on a CPU the H200's, for heuristics only
    return vdevice.sm_count(device)


def smem_limit(arch: str) -> int:
    if arch in SMEM_LIMIT:
        return SMEM_LIMIT[arch]
    return 101376  # unknown arch: assume the smallest budget the project targets (sm_120)


FMT_NATIVE, FMT_E4M3, FMT_MLA656 = 0, 1, 2
FMT_CODE = {"fp32": FMT_NATIVE, "bf16": FMT_NATIVE, "fp16": FMT_NATIVE, "fp8_e4m3": FMT_E4M3,
            "fp8_mla656": FMT_MLA656}


def fp8_bits() -> bool:
    """Decode e4m3 codes with integer ops (uint8 loads) instead of native fp8 loads: under the
    interpreter, whose native conversion reads the NaN codes 0x7F/0xFF as +-480."""
    return interpreting() or os.environ.get("VERIFY_ATTN_TRITON_FP8_BITS", "0") == "1"


@dataclass(frozen=True)
class KvArgs:
    """What the kernels take for the KV storage format of a problem (host side)."""

    k: torch.Tensor          # K pointer: the cache (fp8: as uint8 under FP8_BITS, else float8_e4m3fn)
    v: torch.Tensor
    ks: torch.Tensor         # fp8_mla656: the cache viewed as float32 (scales); else never read
    kr: torch.Tensor         # fp8_mla656: the cache viewed as bfloat16 (RoPE); else never read
    k_scale_ptr: torch.Tensor
    v_scale_ptr: torch.Tensor
    k_scale: float           # used when the scale is a float (K_SCALE_MEM False)
    v_scale: float
    k_scale_mem: bool
    v_scale_mem: bool
    fmt: int
    bits: bool


def kv_args(p: Problem, dummy: torch.Tensor) -> KvArgs:
    """Cache views and scale arguments for p.kv_dtype; `dummy` stands in for pointers never read."""
    fmt = FMT_CODE[p.kv_dtype]
    bits = fp8_bits()
    k, v, ks, kr = p.k_cache, p.v_cache, dummy, dummy
    if fmt == FMT_E4M3 and bits:
        k, v = k.view(torch.uint8), v.view(torch.uint8)
    elif fmt == FMT_MLA656:
        k = v = p.k_cache if bits else p.k_cache.view(torch.float8_e4m3fn)
        ks, kr = p.k_cache.view(torch.float32), p.k_cache.view(torch.bfloat16)
    km, vm = isinstance(p.k_scale, torch.Tensor), isinstance(p.v_scale, torch.Tensor)
    return KvArgs(k, v, ks, kr, p.k_scale if km else dummy, p.v_scale if vm else dummy,
                  1.0 if km else float(p.k_scale), 1.0 if vm else float(p.v_scale), km, vm, fmt, bits)


def cache_strides(cache: torch.Tensor, page_size: int) -> tuple[int, int, int]:
    """(page or slot stride, position-in-page stride, head stride) in elements."""
    if page_size == 1:
        return cache.stride(0), 0, cache.stride(1)
    return cache.stride(0), cache.stride(1), cache.stride(2)


# ----------------------------------------------------------------------------------------
# device helpers
# ----------------------------------------------------------------------------------------

@triton.jit
def attend_tile(acc, m_i, l_i, q1, q2, start, end, prefix,
                k_base, v_base, kv_indices_ptr, kv_start, mask_ptr, token, row_ok,
                offs_n, offs_d1, offs_dpe, offs_dv,
                stride_kp, stride_kpos, stride_vp, stride_vpos, qk_scale, MASK_WORDS,
                DQK: tl.constexpr, DV: tl.constexpr, BLOCK_D1: tl.constexpr, BLOCK_DPE: tl.constexpr,
                BLOCK_DV: tl.constexpr, V_FROM_K: tl.constexpr, PAGE_SIZE: tl.constexpr, TREE: tl.constexpr,
                DOT_PREC: tl.constexpr, ks_base, kr_base, KV_FMT: tl.constexpr, FP8_BITS: tl.constexpr):
    """One KV tile, tokens [start, start + BLOCK_N) clipped to `end`, folded into (acc, m_i, l_i).

    One device function per tile (not one per step): the interpreter re-patches
    triton.language on every device-function call, ~4 ms each.

    Row address: page_size 1 -> slot kv_indices[t]; paged -> page
    kv_indices[t // P], row t % P, each scaled by the cache's own strides (K and
    V may differ). Tokens past `end` read index 0 and are masked at the load, so
    the NaN-poisoned slot they would name is never read. TREE: the tile lies in
    the tree block, token t is tree node t - prefix, visible iff bit
    (t - prefix) % 32 of word (t - prefix) // 32 of the row's packed mask is set
    (bit 31 is the sign bit: arithmetic shift, then & 1).
    Scores are in the log2 domain; rows that have seen nothing keep m = -inf and
    subtract 0 instead, so exp2 gives 0, never NaN.

    KV_FMT (see FMT_*): FMT_E4M3 loads 1-byte codes and converts them to q's dtype (exact:
    every e4m3 value is a bf16/fp16 value); the per-tensor k_scale is already in qk_scale and
    v_scale is applied to O by the caller, so no per-element multiply. FMT_MLA656 loads the
    512 codes, the row's 4 fp32 scales (ks_base: the cache viewed as fp32) and 64 bf16 RoPE
    values (kr_base: viewed as bf16); K = codes x scale[j // 128] rounded to q's dtype,
    V = its first 512 values. Strides of fp8 caches are in bytes. FP8_BITS: codes come as
    uint8 and are decoded with integer ops (`e4m3_to_f32`), for the interpreter.
    """
    t = start + offs_n                                                   # [BLOCK_N] logical tokens
    t_ok = t < end
    if PAGE_SIZE == 1:
        blk = tl.load(kv_indices_ptr + kv_start + t, mask=t_ok, other=0).to(tl.int64)
        krow = blk * stride_kp
        vrow = blk * stride_vp
    else:
        blk = tl.load(kv_indices_ptr + kv_start + t // PAGE_SIZE, mask=t_ok, other=0).to(tl.int64)
        pos = (t % PAGE_SIZE).to(tl.int64)
        krow = blk * stride_kp + pos * stride_kpos
        vrow = blk * stride_vp + pos * stride_vpos
    # K tile [BLOCK_N, BLOCK_D1] (+ rope part [BLOCK_N, BLOCK_DPE]); V tile [BLOCK_N, BLOCK_DV]
    if KV_FMT == 2:   # FMT_MLA656: codes x per-128 scale, bf16 rope (Dqk 576 = 512 + 64, one KV head)
        codes = tl.load(k_base + krow[:, None] + offs_d1[None, :], mask=t_ok[:, None], other=0.0)
        # the row's 4 scales as 4 [BLOCK_N] vectors, spread over the 512 columns by selects (a gathered
        # [BLOCK_N, 512] scale load would hold 64-bit pointers and pipeline 64 KB of scales per stage)
        srow = ks_base + krow // 4 + 128
        sc0 = tl.load(srow, mask=t_ok, other=0.0)
        sc1 = tl.load(srow + 1, mask=t_ok, other=0.0)
        sc2 = tl.load(srow + 2, mask=t_ok, other=0.0)
        sc3 = tl.load(srow + 3, mask=t_ok, other=0.0)
        blk = (offs_d1 // 128)[None, :]
        sc = tl.where(blk == 0, sc0[:, None], tl.where(blk == 1, sc1[:, None],
                                                      tl.where(blk == 2, sc2[:, None], sc3[:, None])))
        k1 = (codes_to(codes, tl.float32, FP8_BITS) * sc).to(q1.dtype)
        k2 = tl.load(kr_base + (krow // 2)[:, None] + 264 + offs_dpe[None, :],
                     mask=t_ok[:, None] & (BLOCK_D1 + offs_dpe[None, :] < DQK), other=0.0).to(q2.dtype)
        s = tl.dot(q1, tl.trans(k1), input_precision=DOT_PREC)
        s += tl.dot(q2, tl.trans(k2), input_precision=DOT_PREC)
    else:
        if DQK >= BLOCK_D1:
            k1 = tl.load(k_base + krow[:, None] + offs_d1[None, :], mask=t_ok[:, None], other=0.0)
        else:
            k1 = tl.load(k_base + krow[:, None] + offs_d1[None, :],
                         mask=t_ok[:, None] & (offs_d1[None, :] < DQK), other=0.0)
        if KV_FMT == 1:
            k1 = codes_to(k1, q1.dtype, FP8_BITS)
        s = tl.dot(q1, tl.trans(k1), input_precision=DOT_PREC)              # [BLOCK_M, BLOCK_N]
        if BLOCK_DPE > 0:
            k2 = tl.load(k_base + krow[:, None] + BLOCK_D1 + offs_dpe[None, :],
                         mask=t_ok[:, None] & (BLOCK_D1 + offs_dpe[None, :] < DQK), other=0.0)
            if KV_FMT == 1:
                k2 = codes_to(k2, q2.dtype, FP8_BITS)
            s += tl.dot(q2, tl.trans(k2), input_precision=DOT_PREC)
    if V_FROM_K:
        v = k1                                                           # MLA: V = K[:, :Dv], read once
    else:
        if DV == BLOCK_DV:
            v = tl.load(v_base + vrow[:, None] + offs_dv[None, :], mask=t_ok[:, None], other=0.0)
        else:
            v = tl.load(v_base + vrow[:, None] + offs_dv[None, :],
                        mask=t_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
        if KV_FMT == 1:
            v = codes_to(v, q1.dtype, FP8_BITS)
    s = s * qk_scale
    if TREE:
        j = t - prefix
        # words past the row's MASK_WORDS (a tree larger than the mask, unchecked in shapes mode)
        # are not read: the kernels poison such requests instead (see `too_many_nodes`)
        words = tl.load(mask_ptr + token[:, None].to(tl.int64) * MASK_WORDS + (j // 32)[None, :],
                        mask=row_ok[:, None] & t_ok[None, :] & ((j // 32) < MASK_WORDS)[None, :], other=0)
        vis = ((words >> (j % 32)[None, :]) & 1) != 0
        s = tl.where(vis & t_ok[None, :], s, float("-inf"))
    else:
        s = tl.where(t_ok[None, :], s, float("-inf"))
    # online softmax
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
    return acc, m_new, l_i


@triton.jit
def e4m3_to_f32(c):
    """e4m3fn codes (any integer type holding 0..255) -> float32, from the bit fields: sign, 4
    exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal (m x 2^-9); 0x7F/0xFF NaN.
    Integer ops only: the interpreter's native fp8 conversion reads 0x7F as 480, not NaN."""
    c = c.to(tl.int32) & 0xFF
    e = (c >> 3) & 0xF
    m = c & 7
    normal = ((e + 120) << 23) | (m << 20)                               # fp32 bits of 2^(e-7) x 1.m
    mag = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal.to(tl.float32, bitcast=True))
    v = tl.where(c >= 128, -mag, mag)
    return tl.where((c & 0x7F) == 0x7F, float("nan"), v)


@triton.jit
def codes_to(x, dtype: tl.constexpr, FP8_BITS: tl.constexpr):
    """A tile of e4m3 codes as `dtype` (exact for fp32/bf16/fp16): uint8 bytes decoded by
    `e4m3_to_f32` (FP8_BITS), else a float8e4nv tile converted natively (cvt from e4m3 on
    sm_89+, straight to the 16-bit dtype: no fp32 tile in registers)."""
    if FP8_BITS:
        return e4m3_to_f32(x).to(dtype)
    else:
        return x.to(dtype)


@triton.jit
def scale_value(ptr, val, IN_MEM: tl.constexpr):
    """A per-tensor fp8 scale: read from a 0-d float32 tensor on the device (IN_MEM) or the float argument."""
    if IN_MEM:
        return tl.load(ptr)
    else:
        return val


@triton.jit
def load_q(q_rows, row_ok, offs_d1, offs_dpe, DQK: tl.constexpr, BLOCK_D1: tl.constexpr,
           BLOCK_DPE: tl.constexpr):
    """The M rows' queries as (q1 [BLOCK_M, BLOCK_D1], q2 [BLOCK_M, BLOCK_DPE]): the head split
    into power-of-two blocks (576 = 512 + 64); q2 is q1 again when there is no second block."""
    q1 = tl.load(q_rows + offs_d1[None, :], mask=row_ok[:, None] & (offs_d1[None, :] < DQK), other=0.0)
    if BLOCK_DPE > 0:
        q2 = tl.load(q_rows + BLOCK_D1 + offs_dpe[None, :],
                     mask=row_ok[:, None] & (BLOCK_D1 + offs_dpe[None, :] < DQK), other=0.0)
    else:
        q2 = q1
    return q1, q2


@triton.jit
def poison_rows(o, lse2, bad):
    """NaN in every output of the program when `bad` (a request the launch cannot serve
    correctly, e.g. more tree nodes than its mask words hold): loud, never silently partial."""
    nan = float("nan")
    return tl.where(bad, nan, o), tl.where(bad, nan, lse2)


@triton.jit
def finish_rows(acc, m_i, l_i):
    """(O [BLOCK_M, BLOCK_DV] fp32, LSE log2 [BLOCK_M]); rows that saw nothing give O = 0, LSE = -inf.

    `l_i != 0`, not `l_i > 0`: a NaN sum (a NaN or inf in q or a KV row) must come out as
    NaN in both O and LSE, not as an empty row (api.py: non-finite inputs propagate)."""
    seen = l_i != 0
    o = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse2 = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    return o, lse2


@triton.jit
def attend_rows(q_rows, K, V, KV_INDICES, MASK, KS, KR, K_SCALE, V_SCALE, qk_scale, k_scale_f, v_scale_f,
                kvh, token, row_ok, lo, hi, prefix, kv_start, bad,
                stride_kp, stride_kpos, stride_kh, stride_vp, stride_vpos, stride_vh, MASK_WORDS,
                DQK: tl.constexpr, DV: tl.constexpr, BLOCK_D1: tl.constexpr, BLOCK_DPE: tl.constexpr,
                BLOCK_DV: tl.constexpr, V_FROM_K: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr, KV_FMT: tl.constexpr, FP8_BITS: tl.constexpr,
                K_SCALE_MEM: tl.constexpr, V_SCALE_MEM: tl.constexpr, CLIP: tl.constexpr):
    """(O [BLOCK_M, BLOCK_DV] fp32, LSE log2 [BLOCK_M]) of the M rows (queries at `q_rows`, tree rows `token`) over
    KV head `kvh`'s tokens [lo, hi): the prefix part first (every row sees every token; only the ragged end is
    masked), then the tree part under the packed ancestor mask; NaN in every output when `bad` (poison_rows).
    CLIP: [lo, hi) is a split's span, which may end before the prefix or start past it (the split kernel); without
    it the span is the whole request (the serial kernel: lo 0, hi n_kv), and the loops compile as that kernel's own
    did (their bounds, unclipped, are the prefix)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d1 = tl.arange(0, BLOCK_D1)
    offs_dpe = tl.arange(0, BLOCK_DPE) if BLOCK_DPE > 0 else offs_d1
    offs_dv = tl.arange(0, BLOCK_DV)
    q1, q2 = load_q(q_rows, row_ok, offs_d1, offs_dpe, DQK, BLOCK_D1, BLOCK_DPE)

    k_base = K + kvh * stride_kh
    v_base = V + kvh * stride_vh
    qk = qk_scale
    if KV_FMT == 1:   # fp8_e4m3: K = code x k_scale, folded into the score scale (exact codes in the dot)
        qk = qk_scale * scale_value(K_SCALE, k_scale_f, K_SCALE_MEM)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    if CLIP:
        p_hi = tl.minimum(hi, prefix)
    else:
        p_hi = prefix
    for start in range(lo, p_hi, BLOCK_N):
        acc, m_i, l_i = attend_tile(
            acc, m_i, l_i, q1, q2, start, p_hi, prefix, k_base, v_base, KV_INDICES, kv_start, MASK, token, row_ok,
            offs_n, offs_d1, offs_dpe, offs_dv, stride_kp, stride_kpos, stride_vp, stride_vpos, qk, MASK_WORDS,
            DQK, DV, BLOCK_D1, BLOCK_DPE, BLOCK_DV, V_FROM_K, PAGE_SIZE, False, DOT_PREC, KS, KR, KV_FMT, FP8_BITS)
    if CLIP:
        t_lo = tl.maximum(lo, prefix)
    else:
        t_lo = prefix
    for start in range(t_lo, hi, BLOCK_N):
        acc, m_i, l_i = attend_tile(
            acc, m_i, l_i, q1, q2, start, hi, prefix, k_base, v_base, KV_INDICES, kv_start, MASK, token, row_ok,
            offs_n, offs_d1, offs_dpe, offs_dv, stride_kp, stride_kpos, stride_vp, stride_vpos, qk, MASK_WORDS,
            DQK, DV, BLOCK_D1, BLOCK_DPE, BLOCK_DV, V_FROM_K, PAGE_SIZE, True, DOT_PREC, KS, KR, KV_FMT, FP8_BITS)

    o, lse2 = finish_rows(acc, m_i, l_i)
    if KV_FMT == 1:   # fp8_e4m3: V = code x v_scale, applied once to the normalised O
        o = o * scale_value(V_SCALE, v_scale_f, V_SCALE_MEM)
    return poison_rows(o, lse2, bad)


@triton.jit
def split_span(n, NUM_SPLITS, BLOCK_N: tl.constexpr):
    """KV tokens per split for a request of n tokens: ceil(n / splits) rounded up to BLOCK_N.

    The main kernel and the combine compute it alike on the device, so the
    host never reads a length (CUDA-graph safe) and trailing splits may be empty.
    """
    per = tl.cdiv(n, NUM_SPLITS)
    return tl.cdiv(per, BLOCK_N) * BLOCK_N


# ----------------------------------------------------------------------------------------
# compile without a GPU: registers, spills, shared memory
# ----------------------------------------------------------------------------------------

TRITON_DTYPE = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def ptxas_report(fn, *, arch: str, constexprs: dict, pointers: dict, floats: tuple[str, ...] = (),
                 aligned: tuple[str, ...] = (), num_warps: int = 4, num_stages: int = 2) -> dict:
    """Compile `fn` for `arch` ("sm_90", "sm_120") here, GPU or not, and run ptxas -v on its PTX.

    pointers: arg name -> Triton pointer type ("*bf16"); floats: fp32 scalar args;
    every other non-constexpr arg is an i32. `aligned` names the int args a real
    call passes as multiples of 16 (strides): Triton specialises those (and
    16-byte aligned pointers) and vectorises loads on them, so leaving them out
    would report a different kernel. Needs TRITON_INTERPRET unset.
    Returns {"regs", "spill_stores", "spill_loads", "smem_bytes", "ptxas"}.
    """
    import re
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in pointers:
            sig[name] = pointers[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32" if name in floats else "i32"
            if name in aligned:
                attrs[(i,)] = [["tt.divisibility", 16]]
    cap = int(arch.removeprefix("sm_"))
    kernel = triton.compile(ASTSource(fn, sig, constexprs, attrs), target=GPUTarget("cuda", cap, 32),
                            options=dict(num_warps=num_warps, num_stages=num_stages))
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    ptxas = os.path.join(bindir, "ptxas")
    if cap >= 100 and os.path.exists(os.path.join(bindir, "ptxas-blackwell")):
        ptxas = os.path.join(bindir, "ptxas-blackwell")  # what Triton itself uses for sm_100+
    gpu = f"sm_{cap}a" if cap >= 90 else f"sm_{cap}"
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(kernel.asm["ptx"])
        r = subprocess.run([ptxas, "-v", f"--gpu-name={gpu}", src, "-o", os.path.join(d, "k.cubin")],
                           capture_output=True, text=True, check=True)
    text = r.stderr

    def grab(pattern: str) -> int:
        m = re.search(pattern, text)
        return int(m.group(1)) if m else 0

    return {"regs": grab(r"Used (\d+) registers"), "spill_stores": grab(r"(\d+) bytes spill stores"),
            "spill_loads": grab(r"(\d+) bytes spill loads"), "smem_bytes": int(kernel.metadata.shared),
            "ptxas": text.strip()}
