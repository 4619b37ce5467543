"""Tolerances against the float64 reference, one table for tests, bench and autotune.

(atol, rtol) per input dtype. The inputs are rounded to the dtype first, so the
reference is exact for those inputs; what remains is the backend's own
arithmetic: fp32 accumulation (~1e-6), P rounded to the input dtype before the
PV product (bf16: 8 mantissa bits -> ~4e-3 relative; fp16 ~5e-4), and the
output rounded to the dtype.
"""
import torch

TOL: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (2e-3, 2e-2),
    torch.bfloat16: (1.6e-2, 2e-2),
}
