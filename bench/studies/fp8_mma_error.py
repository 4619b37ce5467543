"""python -m bench.fp8_mma_error: what the CUDA kernels' e4m3 MMAs cost in accuracy, by part.

The e4m3-cache kernel (csrc/tree_verify, Tr::kFp8) runs S = Q K^T and O = P V on
mma.m16n8k32 .e4m3: Q is rounded to e4m3 per row (scale amax / 448) and P to e4m3 after
multiplying by 2^8 (the running max is exact, so P <= 1 before). This tool simulates that
rounding in float64 on one MLA call (Kimi K2 TP8: 8 heads x 576/512 per node, 16 nodes) and
reports, for growing logit scales, the error of out (max |err| / max |ref| and rms relative)
and of the LSE (nat) against exact attention on the same e4m3 cache, for: Q rounded, P rounded,
both (the kernel). For scale, it also reports what quantizing the bf16 cache to e4m3 (one scale
per tensor) costs against the bf16 cache: the error every fp8 backend starts from.

Runs on the CPU in float64 (no kernel involved); NOTES.md records its table and the decision.
"""
from __future__ import annotations

import argparse
import sys

import torch

from verify_attn.fp8 import e4m3_mma_q


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """x rounded to e4m3 (nearest even, saturating at +-448, as cvt.rn.satfinite), back in float64."""
    return x.clamp(-448, 448).to(torch.float8_e4m3fn).to(torch.float64)


def _attn(q: torch.Tensor, k: torch.Tensor, dv: int, scale: float, p_e4m3: bool = False):
    s = q @ k.T * scale
    m = s.max(dim=1, keepdim=True).values
    p = torch.exp(s - m)
    l = p.sum(1, keepdim=True)
    if p_e4m3:  # the kernel: P x 2^8 to e4m3 for the P.V MMA; l sums the unrounded P
        p = e4m3(p * 256) / 256
    return (p @ k[:, :dv]) / l, (m + torch.log(l)).squeeze(1)


def study(logit_std: float, tokens: int, seed: int, nodes: int = 16, heads: int = 8, dqk: int = 576,
          dv: int = 512) -> list[tuple[str, float, float, float]]:
    """[(what, max|err|/max|ref|, rms relative, max |lse err|)] for one cache and one q."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(nodes * heads, dqk, generator=g, dtype=torch.float64) * logit_std
    k = torch.randn(tokens, dqk, generator=g, dtype=torch.float64)
    scale = dqk ** -0.5
    qb, kb = q.to(torch.bfloat16).double(), k.to(torch.bfloat16).double()
    ks = float(kb.abs().max()) / 448
    kq = e4m3(kb / ks) * ks                                    # the e4m3 cache, dequantized
    q8 = e4m3_mma_q(qb, "fp8_e4m3")                            # the kernel's per-row Q rounding, exactly
    exact_bf16 = _attn(qb, kb, dv, scale)
    exact = _attn(qb, kq, dv, scale)                           # the contract: exact on the e4m3 cache
    rows = [("cache e4m3 vs the bf16 cache", exact, exact_bf16),
            ("Q rounded to e4m3 per row", _attn(q8, kq, dv, scale), exact),
            ("P rounded to e4m3 (x 2^8)", _attn(qb, kq, dv, scale, p_e4m3=True), exact),
            ("Q and P rounded (the kernel)", _attn(q8, kq, dv, scale, p_e4m3=True), exact)]
    out = []
    for name, (o, l), (ro, rl) in rows:
        err = o - ro
        out.append((name, float(err.abs().max() / ro.abs().max()),
                    float(err.pow(2).mean().sqrt() / ro.pow(2).mean().sqrt()), float((l - rl).abs().max())))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fp8_mma_error", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--logit-std", default="1,3,6", help="scales of q (the logits' std), comma-separated")
    ap.add_argument("--tokens", type=int, default=4096, help="KV tokens every row sees (default 4096)")
    ap.add_argument("--seed", type=int, default=0)
    from verify_attn.utils import dash_values, usage_error
    a = dash_values(ap).parse_args(argv)
    err = lambda msg: usage_error(f"{ap.prog}: error: {msg}")   # one line, no usage block
    try:
        stds = [float(x) for x in a.logit_std.split(",") if x.strip()]
    except ValueError:
        raise err(f"--logit-std: comma-separated numbers, got {a.logit_std!r}") from None
    if not stds or min(stds) <= 0:
        raise err(f"--logit-std: positive numbers, got {a.logit_std!r}")
    if a.tokens < 1:
        raise err(f"--tokens must be >= 1, got {a.tokens}")
    from bench.studies.fp8_accuracy import _fits
    try:
        _fits(a.tokens, 16)
    except ValueError as e:
        raise err(str(e).replace("--ctx", "--tokens")) from None
    for std in stds:
        print(f"logit std ~{std:g} (q ~ N(0, {std:g}^2), k ~ N(0, 1), Dqk 576, {a.tokens} tokens, 16 nodes x 8 heads)")
        for name, mx, rms, lse in study(std, a.tokens, a.seed + int(std * 100)):
            print(f"  {name:32s} max|err|/max|ref| {mx:.4f}  rms rel {rms:.4f}  max|lse err| {lse:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
