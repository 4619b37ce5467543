"""Tolerances against the float64 reference, one table for tests, bench and autotune.

TOL: (atol, rtol) of `out` per input dtype. The inputs are rounded to the dtype
first, so the reference is exact for those inputs; what remains is the backend's
own arithmetic: fp32 accumulation (~1e-6), P rounded to the input dtype before
the PV product (bf16: 8 mantissa bits -> ~4e-3 relative; fp16 ~5e-4), and the
output rounded to the dtype.

LSE_ATOL: absolute bound (natural log) on the float32 `lse` per input dtype. Every
backend computes scores and the softmax sums in fp32 whatever the input dtype, so
the measured error is the same for all of them (max |lse - ref| on the CPU, inputs
rounded to the dtype): reference 2.4e-7, triton 6.2e-7, triton-serial 7.7e-7 (fp32
and fp16, cases of up to 316 tokens), CUDA kernels in the emulator 5.6e-7 (bf16,
fp16: the MATRIX of tests/test_cuda_emu.py), i.e. the fp32 rounding of an LSE of
order 5. The bound allows for what the same
computation in the input precision could add: a kernel that sums the P values it
rounded for the PV product (bf16: 2^-9 relative -> ~2e-3 nat, fp16: 2^-12 -> 2.4e-4;
fp32 accumulation over 185k tokens ~1e-5), with a 2x margin. It must stay well
below the error of dropping one of 60 equally weighted tokens, log(60/59) = 0.017
nat (tests/test_hardening.py checks that such an LSE fails).
"""
from __future__ import annotations

import torch

TOL: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (2e-3, 2e-2),
    torch.bfloat16: (1.6e-2, 2e-2),
}

LSE_ATOL: dict[torch.dtype, float] = {
    torch.float32: 1e-4,
    torch.float16: 5e-4,
    torch.bfloat16: 4e-3,
}

# FP8 caches: (kv_dtype, q dtype) -> (atol, rtol) of `out` and the LSE bound, against the float64
# reference ON THE DEQUANTIZED CACHE (reference.kv_rows), so the quantization error itself is not
# in them (tests/test_fp8.py prints that separately). What remains is the 16-bit path's own error
# (TOL above) plus, for fp8_mla656, K/V rounded to q's dtype after code x scale (exact for the
# power-of-two scales of fp8.quantize_mla656 and FlashMLA; up to 2^-9 (bf16) / 2^-12 (fp16)
# relative per value for arbitrary float scales). fp8_e4m3 folds the per-tensor scales into the
# scores and into O, and every e4m3 code is exact in bf16/fp16, so it is the 16-bit case.
FP8_TOL: dict[tuple[str, torch.dtype], tuple[float, float]] = {
    ("fp8_e4m3", torch.float16): TOL[torch.float16],
    ("fp8_e4m3", torch.bfloat16): TOL[torch.bfloat16],
    ("fp8_mla656", torch.float16): TOL[torch.float16],
    ("fp8_mla656", torch.bfloat16): TOL[torch.bfloat16],
}
FP8_LSE_ATOL: dict[tuple[str, torch.dtype], float] = {
    ("fp8_e4m3", torch.float16): LSE_ATOL[torch.float16],
    ("fp8_e4m3", torch.bfloat16): LSE_ATOL[torch.bfloat16],
    ("fp8_mla656", torch.float16): LSE_ATOL[torch.float16],
    ("fp8_mla656", torch.bfloat16): LSE_ATOL[torch.bfloat16],
}


# The CUDA kernels' e4m3 path (csrc/tree_verify, Problem.kv_dtype "fp8_e4m3") runs both products on
# e4m3 MMAs: Q is quantized per row (amax / 448) and P per element (times 2^8), so unlike the Triton
# backends its error includes 3-mantissa-bit rounding of Q and P (2^-4 relative per value). Against the
# float64 reference on the dequantized cache, over random MLA trees (q, K, V ~ N(0, 1); cuda-emu,
# tests/test_cuda_emu.py) the measured max |out - ref| / max |ref| is 1.9-3.3% and max |lse - ref|
# 0.007-0.061 nat (largest for a request that sees one token: its LSE is that score, with its error);
# `python -m pytest -s -q tests/test_cuda_emu.py -k fp8_e4m3_matches` prints them per case.
# Bounds: 2x those. A K or V scale off by 10% exceeds them (tested). Against the exact reference this bound is the
# test cases', not every call's: `python -m bench.emu_sweep --tiles mla-e4m3-v3h --cases 1500 --seed 2913` (random
# prefixes of 0-600 tokens) reads p99 5.1% and max 6.95%, the max a 9-key call on which v1's e4m3-MMA tile, v3's
# math-roles tile and Hopper's v3 err identically (the format's rounding, no kernel's). check_e4m3_mma below judges
# the kernels against the q-rounded reference instead.
FP8_MMA_REL_TOL = 0.06   # max |out - ref| <= FP8_MMA_REL_TOL * max |ref|, per call
FP8_MMA_LSE_ATOL = 0.12


def check_e4m3_mma(out: torch.Tensor, ref_q: torch.Tensor, dtype: torch.dtype, lse: torch.Tensor | None = None,
                   ref_q_lse: torch.Tensor | None = None, *, emulated: bool) -> str | None:
    """Why an e4m3-MMA kernel's call is wrong, or None. Judged against the float64 reference with q rounded as the
    kernel rounds it (reference.reference_e4m3_mma), so that the Q rounding, which grows with the logits' spread
    (5.5% rms of the output at a logit std of 3, the Kimi K2 shapes bench.verify draws; 2.6% at 1: `python -m
    bench.fp8_mma_error`), is the format's documented cost and not judged here. What is left: P rounded to e4m3 (~1%
    of max |ref|), and how the MMAs sum their products. Out must lie within FP8_MMA_REL_TOL of max |ref_q| (normwise).
    The LSE, where given: `emulated` (the CPU emulator sums the products in fp32, so its scores are ref_q's to fp32
    rounding: measured ~2e-6 nat) within the 16-bit LSE_ATOL[dtype]; on a GPU within FP8_MMA_LSE_ATOL, because the
    FP8 tensor cores accumulate with fewer bits than fp32 (DeepSeek-V3's report, sec. 3.3.2: ~14 bits on Hopper,
    up to ~2% relative error at K = 4096) and that error is the hardware's, not the kernel's.
    Used alike by the tests, bench.verify, the autotuner and bench.emu_sweep."""
    if not bool(torch.isfinite(out).all()):
        return f"{int((~torch.isfinite(out)).sum())} non-finite outputs"
    rel, lerr = e4m3_mma_errors(out, ref_q, lse, ref_q_lse)
    if rel > FP8_MMA_REL_TOL:
        return (f"max |out - ref_q| / max |ref_q| = {rel:.3g} > {FP8_MMA_REL_TOL} (ref_q: q rounded to e4m3 as the "
                "kernel rounds it)")
    if lerr is not None:
        atol = LSE_ATOL[dtype] if emulated else FP8_MMA_LSE_ATOL
        if not lerr <= atol:   # (NaN, and an LSE where the reference has none, fail)
            return f"lse max abs err {lerr:.3g} > {atol} against ref_q ({'emulated' if emulated else 'on a GPU'})"
    return None


def e4m3_mma_errors(out: torch.Tensor, ref_q: torch.Tensor, lse: torch.Tensor | None = None,
                    ref_q_lse: torch.Tensor | None = None) -> tuple[float, float | None]:
    """(max |out - ref_q| / max |ref_q|, max |lse - ref_q_lse| or None without an LSE) against the q-rounded
    reference; the LSE error is NaN where a row the reference sees nothing for (-inf) has another value."""
    o = out.double().to(ref_q.device)
    rel = float((o - ref_q).abs().max() / ref_q.abs().max().clamp_min(1e-30))
    if lse is None or ref_q_lse is None:
        return rel, None
    l = lse.double().to(ref_q_lse.device)
    seen = torch.isfinite(ref_q_lse)   # a row that sees no token: -inf in both
    if not bool((l[~seen] == ref_q_lse[~seen]).all()):
        return rel, float("nan")
    return rel, float((l[seen] - ref_q_lse[seen]).abs().max()) if bool(seen.any()) else 0.0
