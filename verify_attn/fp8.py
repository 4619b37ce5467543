"""FP8 KV cache formats: names, bytes per row, exact dequantization, quantizers for tests and benchmarks.

Two formats (`Problem.kv_dtype`):

- "fp8_e4m3": SGLang's. k_cache / v_cache are torch.float8_e4m3fn tensors of the usual
  shapes; one scale per tensor (`k_scale`, `v_scale`): the value of code c is
  e4m3(c) * scale. The MLA aliasing rule holds (v_cache = k_cache[..., :512]).
- "fp8_mla656": FlashMLA's FP8 MLA row (deepseek-ai/FlashMLA README, "FP8 KV Cache";
  tests/quant.py `FP8KVCacheLayout.V32_FP8Sparse`), 656 bytes per token, one KV head:

      bytes   0..511   512 e4m3 codes, the "nope" (latent) values 0..511
      bytes 512..527   4 float32 scales, little-endian: scale i serves values 128*i .. 128*i+127
      bytes 528..655   64 bfloat16 RoPE values (values 512..575), little-endian, not quantized

  value j < 512 = e4m3(byte j) * scale[j // 128]; value 512 + r = bf16 r. K is all
  576 values, V the first 512 (the MLA aliasing rule: one read of a row serves both).
  tree_verify takes it as a uint8 tensor [num_slots, 1, 656] (page_size 1) or
  [num_pages, P, 1, 656] with kv_format="fp8_mla656" and v_cache=None (or the same
  tensor); FlashMLA's float8_e4m3fn byte buffers pass as `.view(torch.uint8)`.

e4m3 ("fn": no infinities): sign bit, 4 exponent bits (bias 7), 3 mantissa bits;
exponent 0 is subnormal (m * 2^-9); 0x7F and 0xFF are NaN; the largest finite value
is 448. Every e4m3 value is exact in fp16, bf16 and fp32.
"""
from __future__ import annotations

from typing import Optional

import torch

NATIVE_KV_DTYPES = ("fp32", "bf16", "fp16")
FP8_KV_DTYPES = ("fp8_e4m3", "fp8_mla656")
KV_DTYPES = NATIVE_KV_DTYPES + FP8_KV_DTYPES
KV_DTYPE_OF = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
               torch.float8_e4m3fn: "fp8_e4m3"}

E4M3_MAX = 448.0

# the 656-byte MLA row
MLA656_ROW_BYTES = 656
MLA656_NOPE = 512          # e4m3 values (also Dv)
MLA656_BLOCK = 128         # values per scale
MLA656_NUM_SCALES = 4
MLA656_ROPE = 64           # bf16 values
MLA656_SCALE_OFFSET = 512  # byte offset of the 4 fp32 scales
MLA656_ROPE_OFFSET = 528   # byte offset of the 64 bf16 values
MLA656_DQK = MLA656_NOPE + MLA656_ROPE   # 576


def kv_row_bytes(kv_dtype: str, head_dim_qk: int, head_dim_v: int, mla: bool) -> int:
    """Bytes of one token's KV for one KV head: an MLA row (K, V aliased) or a K row plus a V row."""
    if kv_dtype == "fp8_mla656":
        if not mla or head_dim_qk != MLA656_DQK or head_dim_v != MLA656_NOPE:
            raise ValueError(f"fp8_mla656 is the MLA 576/512 row only, got Dqk={head_dim_qk}, Dv={head_dim_v}, "
                             f"mla={mla}")
        return MLA656_ROW_BYTES
    elt = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8_e4m3": 1}.get(kv_dtype)
    if elt is None:
        raise ValueError(f"unknown kv dtype {kv_dtype!r}; known: {', '.join(KV_DTYPES)}")
    return elt * (head_dim_qk if mla else head_dim_qk + head_dim_v)


# ---------------------------------------------------------------------------- e4m3 codes

def e4m3_decode_reference(codes: torch.Tensor) -> torch.Tensor:
    """float64 value of each uint8 e4m3 code, from the bit fields (what the kernels' integer decoder does)."""
    c = codes.to(torch.int64)
    s = (c >> 7) & 1
    e = (c >> 3) & 0xF
    m = c & 7
    mag = torch.where(e == 0, m.double() * 2.0 ** -9, (1.0 + m.double() / 8) * torch.pow(2.0, (e - 7).double()))
    val = torch.where(s == 1, -mag, mag)
    return torch.where((c & 0x7F) == 0x7F, torch.full_like(val, float("nan")), val)


def _scale_value(scale, dtype: torch.dtype, device) -> torch.Tensor:
    if isinstance(scale, torch.Tensor):
        return scale.to(device=device, dtype=dtype)
    return torch.tensor(float(scale), dtype=dtype, device=device)


def dequantize_e4m3(x: torch.Tensor, scale=1.0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """x (float8_e4m3fn) * scale in `dtype` (float64: exact)."""
    if x.dtype != torch.float8_e4m3fn:
        raise TypeError(f"dequantize_e4m3 needs a float8_e4m3fn tensor, got {x.dtype}")
    return x.to(dtype) * _scale_value(scale, dtype, x.device)


def per_tensor_scale(x: torch.Tensor) -> float:
    """amax / 448 over the finite values of x (1.0 when there are none or all are 0): the
    scale that maps the largest magnitude onto e4m3's largest finite value."""
    fin = x[torch.isfinite(x)]
    amax = float(fin.abs().max()) if fin.numel() else 0.0
    return amax / E4M3_MAX if amax > 0 else 1.0


def quantize_e4m3(x: torch.Tensor, scale: Optional[float] = None) -> tuple[torch.Tensor, float]:
    """(x / scale rounded to float8_e4m3fn, scale); scale defaults to `per_tensor_scale(x)`.

    Round to nearest even (torch's conversion), saturating at +-448; NaN stays NaN, so a
    NaN-poisoned slot stays poisoned."""
    if scale is None:
        scale = per_tensor_scale(x)
    if not (scale > 0 and scale < float("inf")):
        raise ValueError(f"scale must be a finite positive float, got {scale}")
    y = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX)
    return y.to(torch.float8_e4m3fn), float(scale)


# ---------------------------------------------------------------------------- the 656-byte row

def quantize_mla656(x: torch.Tensor, pow2_scales: bool = True) -> torch.Tensor:
    """A [..., 576] latent cache (any float dtype) -> uint8 [..., 656] rows.

    Per row and 128-value block: scale = amax / 448, rounded up to a power of two when
    `pow2_scales` (FlashMLA's quantizer does this, tests/quant.py `_cast_scale_inv_to_ue8m0`,
    which makes e4m3 x scale exact in bf16/fp16); an all-zero block gets scale 1. The RoPE
    part is rounded to bf16. A NaN row (a poisoned slot) gives NaN codes, scales and RoPE.
    """
    if x.shape[-1] != MLA656_DQK:
        raise ValueError(f"quantize_mla656 needs rows of {MLA656_DQK} values, got {x.shape[-1]}")
    lead = x.shape[:-1]
    nope = x[..., :MLA656_NOPE].float().reshape(*lead, MLA656_NUM_SCALES, MLA656_BLOCK)
    amax = nope.abs().amax(-1)                                                 # [..., 4] (NaN for a NaN row)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    scale = torch.where(torch.isnan(amax), amax, scale)
    if pow2_scales:
        scale = torch.where(torch.isnan(scale), scale, torch.exp2(torch.ceil(torch.log2(scale))))
    codes = (nope / scale.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    out = torch.empty(*lead, MLA656_ROW_BYTES, dtype=torch.uint8, device=x.device)
    out[..., :MLA656_NOPE] = codes.reshape(*lead, MLA656_NOPE).view(torch.uint8)
    out[..., MLA656_SCALE_OFFSET:MLA656_ROPE_OFFSET] = scale.contiguous().view(torch.uint8)
    out[..., MLA656_ROPE_OFFSET:] = x[..., MLA656_NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return out


def e4m3_mma_q(q: torch.Tensor, kv_dtype: str) -> torch.Tensor:
    """q as the CUDA kernels' e4m3 MMAs see it, in float64: each row (one token's query head, its Dqk values) scaled
    by amax / 448 (csrc/host/fp8.h e4m3_row_scale: 1 for an all-zero row, NaN for a row with a NaN), x / scale
    rounded to e4m3 (nearest even, saturating, as cvt.rn.satfinite) and scaled back. With 656-byte rows the kernel
    keeps the 64 RoPE values in q's dtype (exact) and the scale still comes from the whole row's amax. The float64
    reference on this q and the same cache is the e4m3-MMA kernels' scores to fp32 rounding; what is left of their
    error is P rounded to e4m3 (tolerances.check_e4m3_mma)."""
    x = q.float()
    amax = x.abs().amax(dim=-1, keepdim=True)   # (NaN where the row has one)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.where(amax == 0, torch.ones_like(amax), amax))
    inv = 1.0 / scale   # fp32, as the kernels multiply by it
    out = (x * inv).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float64) * scale.double()
    if kv_dtype == "fp8_mla656":
        out[..., MLA656_NOPE:] = q[..., MLA656_NOPE:].double()
    return out


def split_mla656(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """uint8 [..., 656] -> (codes float8_e4m3fn [..., 512], scales float32 [..., 4], rope bfloat16 [..., 64])."""
    if rows.dtype != torch.uint8 or rows.shape[-1] != MLA656_ROW_BYTES:
        raise ValueError(f"need uint8 rows of {MLA656_ROW_BYTES} bytes, got {rows.dtype} [..., {rows.shape[-1]}]")
    r = rows.contiguous()
    codes = r[..., :MLA656_NOPE].view(torch.float8_e4m3fn)
    scales = r[..., MLA656_SCALE_OFFSET:MLA656_ROPE_OFFSET].contiguous().view(torch.float32)
    rope = r[..., MLA656_ROPE_OFFSET:].contiguous().view(torch.bfloat16)
    return codes, scales, rope


def dequantize_mla656(rows: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """uint8 [..., 656] -> [..., 576] in `dtype`: code x its block's scale, then the bf16 RoPE values
    (float64: exact)."""
    codes, scales, rope = split_mla656(rows)
    lead = rows.shape[:-1]
    nope = codes.to(dtype).reshape(*lead, MLA656_NUM_SCALES, MLA656_BLOCK) * scales.to(dtype).unsqueeze(-1)
    return torch.cat([nope.reshape(*lead, MLA656_NOPE), rope.to(dtype)], dim=-1)


# ---------------------------------------------------------------------------- whole calls

def quantize_kwargs(kw: dict, kv_dtype: str, *, mla_dv: Optional[int] = None) -> dict:
    """tree_verify keyword arguments with the cache converted to `kv_dtype` (tests, benchmarks).

    kw: arguments with a 16/32-bit cache (e.g. from layouts.lay_out / bench.core.inputs), NaN in
    unused slots. mla_dv: Dv when v_cache aliases k_cache[..., :Dv] (MLA), else None.
    fp8_e4m3: one scale per tensor, amax / 448 over the cache's finite values (K and V
    share K's when aliased); fp8_mla656: the 656-byte rows, v_cache None. Returns a new dict
    (q and the indices unchanged) with k_cache, v_cache, k_scale, v_scale, kv_format.
    """
    out = dict(kw)
    k = kw["k_cache"]
    if kv_dtype == "fp8_e4m3":
        kq, ks = quantize_e4m3(k)
        if mla_dv is not None:
            vq, vs = kq[..., :mla_dv], ks
        else:
            vq, vs = quantize_e4m3(kw["v_cache"])
        out.update(k_cache=kq, v_cache=vq, k_scale=ks, v_scale=vs, kv_format="fp8_e4m3")
    elif kv_dtype == "fp8_mla656":
        if mla_dv != MLA656_NOPE or k.shape[-1] != MLA656_DQK or k.shape[-2] != 1:
            raise ValueError(f"fp8_mla656 needs an MLA 576/512 cache with one KV head, got k_cache "
                             f"{tuple(k.shape)}, mla_dv={mla_dv}")
        out.update(k_cache=quantize_mla656(k), v_cache=None, k_scale=None, v_scale=None, kv_format="fp8_mla656")
    elif kv_dtype in NATIVE_KV_DTYPES:
        out.setdefault("kv_format", None)
    else:
        raise ValueError(f"unknown kv dtype {kv_dtype!r}; known: {', '.join(KV_DTYPES)}")
    return out


def dequantized_kwargs(kw: dict, dtype: torch.dtype = torch.float64) -> dict:
    """The same call over the dequantized cache in `dtype` (the reference's view of an fp8 call)."""
    fmt = kw.get("kv_format")
    out = {k: v for k, v in kw.items() if k not in ("k_scale", "v_scale", "kv_format")}
    if fmt == "fp8_mla656":
        k = dequantize_mla656(kw["k_cache"], dtype)
        out.update(k_cache=k, v_cache=k[..., :MLA656_NOPE])
    elif fmt == "fp8_e4m3" or kw["k_cache"].dtype == torch.float8_e4m3fn:
        k = dequantize_e4m3(kw["k_cache"], kw.get("k_scale") or 1.0, dtype)
        v = dequantize_e4m3(kw["v_cache"], kw.get("v_scale") or kw.get("k_scale") or 1.0, dtype)
        out.update(k_cache=k, v_cache=v)
    return out
