"""python -m bench.fp8_accuracy: what each fp8 KV format costs in accuracy, against the float64
reference on the ORIGINAL bf16 cache (the quantization error itself; the kernels' tolerance
against the dequantized cache is tolerances.FP8_TOL).

One MLA call (Kimi K2 TP8 heads: 8 x 576/512, sm_scale 1/sqrt(192)), a DDTree-shaped tree,
a bf16 latent cache in two distributions:
  gaussian  iid N(0, 1) values (kind to one scale per tensor);
  outliers  per-token magnitudes log-normal (sigma 1) and 4 latent channels x 20, the
            shape real latent caches have (a few large channels, token-to-token range);
  wide      per-token magnitudes log-normal (sigma 2.5): a cache whose small tokens fall
            into e4m3's subnormal range under one scale per tensor.
q is scaled so that the scores q.k * sm_scale have std 1.5 over the cache (a sane softmax
whatever the cache's magnitude). For each format: the cache's own error rms(deq - x) /
rms(x) over all 576 values (cache rms) and over the 10% smallest-norm tokens (small rms),
then max |out - ref| / rms(ref) and rms(out - ref) / rms(ref) over out, and max |lse - ref|
(nat), each averaged over --seeds caches. e4m3 is a floating-point format: one scale per tensor loses only where values fall
below its normal range (2^-6 x scale) or saturate, so the per-row scales pay off with range. The formats: fp8_e4m3 with one amax/448 scale per tensor (SGLang's),
fp8_e4m3@1 with scale 1.0 (an uncalibrated cache: SGLang's default k_scale), fp8_mla656
with one power-of-two scale per 128 values of each row (FlashMLA's quantizer).
Runs on the CPU with the float64 reference only (no kernel involved).
"""
from __future__ import annotations

import argparse
import sys

import torch

from bench.core.inputs import make_trees
from verify_attn import fp8
from verify_attn.api import build_problem
from verify_attn.layouts import lay_out
from verify_attn.reference import reference_verify
from verify_attn.shapes import get_shape
from verify_attn import tree as vtree
from verify_attn.utils import parse_tokens


def make_cache(dist: str, n: int, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(n, 1, 576, generator=g)
    if dist == "outliers":
        x = x * torch.exp(torch.randn(n, 1, 1, generator=g))
        x[..., [7, 100, 300, 450]] *= 20
    elif dist == "wide":
        x = x * torch.exp(2.5 * torch.randn(n, 1, 1, generator=g))
    elif dist != "gaussian":
        raise ValueError(f"unknown distribution {dist!r}")
    return x.to(torch.bfloat16)


FORMATS = ("fp8_e4m3", "fp8_e4m3@1", "fp8_mla656")


def _quantize(kw: dict, fmt: str) -> dict:
    """fp8_e4m3@1: one scale of 1.0 (an uncalibrated SGLang cache: k_scale defaults to 1.0)."""
    if fmt == "fp8_e4m3@1":
        kq, _ = fp8.quantize_e4m3(kw["k_cache"], scale=1.0)
        return dict(kw, k_cache=kq, v_cache=kq[..., :512], k_scale=1.0, v_scale=1.0)
    return fp8.quantize_kwargs(kw, fmt, mla_dv=512)


def measure(ctx: int, nodes: int, dist: str, seed: int = 0) -> dict:
    shape = get_shape("kimi-k2-tp8")
    g = torch.Generator().manual_seed(seed)
    trees = make_trees(nodes, "ddtree", 1)
    qo_indptr, tree_mask = vtree.pack_batch(trees)
    k = make_cache(dist, ctx + nodes, g)
    lay = lay_out([k], None, 1, mla_dv=512, generator=g, dtype=torch.bfloat16)
    q = torch.randn(nodes, shape.num_q_heads, 576, generator=g)
    q = (q * 1.5 / float((q.reshape(-1, 576) @ k.float().reshape(-1, 576).T * shape.sm_scale).std())).to(torch.bfloat16)
    kw = dict(q=q, k_cache=lay["k_cache"], v_cache=lay["v_cache"], qo_indptr=qo_indptr, kv_indptr=lay["kv_indptr"],
              kv_indices=lay["kv_indices"], kv_lens=lay["kv_lens"], tree_mask=tree_mask, sm_scale=shape.sm_scale,
              page_size=1)

    def ref(args: dict):
        a = dict(args)
        pos = [a.pop(n) for n in ("q", "k_cache", "v_cache", "qo_indptr", "kv_indptr", "kv_indices", "kv_lens",
                                  "tree_mask", "sm_scale", "page_size")]
        return reference_verify(build_problem(*pos, **a))

    r_out, r_lse = ref(kw)
    rms = float(r_out.pow(2).mean().sqrt())
    row = {"ctx": ctx, "nodes": nodes, "dist": dist}
    xs = k.double()
    small = xs.norm(dim=-1).squeeze(-1) <= xs.norm(dim=-1).squeeze(-1).quantile(0.1)
    for fmt in FORMATS:
        qkw = _quantize(dict(kw, k_cache=k, v_cache=k[..., :512]), fmt)
        deq = fp8.dequantized_kwargs(qkw)["k_cache"]
        ce = deq - xs
        o, l = ref(_quantize(kw, fmt))
        e = (o - r_out).abs()
        row[fmt] = {"cache_rms_rel": float(ce.pow(2).mean().sqrt() / xs.pow(2).mean().sqrt()),
                    "small_rms_rel": float(ce[small].pow(2).mean().sqrt() / xs[small].pow(2).mean().sqrt()),
                    "out_max_rel": float(e.max()) / rms, "out_rms_rel": float(e.pow(2).mean().sqrt()) / rms,
                    "lse_max_abs": float((l - r_lse).abs().max())}
    return row


def _fits(ctx: int, tree: int) -> None:
    """ValueError with the figure when the float64 reference and the caches at `ctx` cannot fit this machine."""
    from bench.core.memory import available_bytes, fit_error, point_bytes
    from verify_attn.shapes import get_shape
    # x3: the bf16 cache, its two fp8 copies, their references
    need = 3 * point_bytes(get_shape("kimi-k2-tp8"), ctx, tree, 1, 1, 2, 1)
    why = fit_error(f"--ctx {ctx:,}", need, available_bytes(None), None, "caches and the float64 reference",
                    "lower --ctx")
    if why:
        raise ValueError(why)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fp8_accuracy", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ctx", default="4k", help="prefix tokens (default 4k; the float64 reference runs on the CPU)")
    ap.add_argument("--tree", type=int, default=16, help="tree nodes (default 16)")
    ap.add_argument("--seeds", type=int, default=3, help="random caches per distribution; errors are averaged "
                    "(one cache is noisy: the error is dominated by the few highest-scoring tokens)")
    from verify_attn.utils import dash_values, usage_error
    a = dash_values(ap).parse_args(argv)
    try:
        ctx = parse_tokens(a.ctx)
        if not 1 <= a.tree <= 256:
            raise ValueError(f"--tree must be in 1..256 (the largest tree the kernels are checked at), got {a.tree}")
        if a.seeds < 1:
            raise ValueError(f"--seeds must be >= 1, got {a.seeds}")
        _fits(ctx, a.tree)
    except ValueError as e:
        msg = str(e) if str(e).startswith("--") else f"--ctx: {e}"
        raise usage_error(f"{ap.prog}: error: {msg}") from None
    print(f"MLA 8 x 576/512, ctx {ctx}, {a.tree}-node DDTree-shaped tree; error vs the float64 reference on the "
          "original bf16 cache (out errors relative to rms(out))")
    print(f"{'cache':10s} {'format':11s} {'cache rms':>9s} {'small rms':>9s} {'out max':>9s} {'out rms':>9s} "
          f"{'lse max':>9s}")
    for dist in ("gaussian", "outliers", "wide"):
        rows = [measure(ctx, a.tree, dist, seed) for seed in range(a.seeds)]
        for fmt in FORMATS:
            r = {k: sum(row[fmt][k] for row in rows) / len(rows) for k in rows[0][fmt]}
            print(f"{dist:10s} {fmt:11s} {r['cache_rms_rel']:9.2e} {r['small_rms_rel']:9.2e} {r['out_max_rel']:9.2e} "
                  f"{r['out_rms_rel']:9.2e} {r['lse_max_abs']:9.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
