"""python -m integration.measure.serving_glue: what SGLang's serving path adds to the kernel, per layer.

Three ways to run the same target-verify layers (Kimi K2 TP8 shapes by default: 8 query heads, one
576-wide latent KV row, a 16-node tree, one request at --ctx), each captured in one CUDA graph and
replayed:
  kernel    tree_verify on prebuilt indices: the kernel alone, the floor of any serving path;
  one       the step plan (integration/serving/verify_step.plan_step into fixed buffers, as the
            backend class runs it once per forward) + one launch per layer (verify_layer);
  compat    SGLang's positional extend_attention_fwd drop-in (sglang_compat): two calls and an
            LSE merge per layer.
Each layer has its own pool (--layers of them, so no layer reads another's KV from L2). Reported:
microseconds per layer (the median replay over --reps / --layers), the glue = one - kernel and
compat - kernel per layer, and its share of the kernel's time; the outputs are checked against
the kernel path's (one: identical launches, so equal; compat: within bf16 rounding).

On a CPU (--device cpu, small --ctx) it runs eagerly on a CPU backend as a smoke test: no graph,
and its times are not GPU figures (labelled so). Without a GPU the glue is estimated instead by
tests/test_sglang_one_launch.py (op counts x the model's launch gap).

    python -m integration.measure.serving_glue --ctx 185k --layers 8 --json glue.json   # on a GPU
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Optional

import torch

import verify_attn
from verify_attn import tree as vtree
from verify_attn.api import tree_verify
from verify_attn.shapes import get_shape
from verify_attn.utils import parse_ctx, usage_error

from ..serving.sglang_compat import extend_attention_fwd
from ..serving.verify_step import StepBuffers, from_req_to_token, verify_layer

PATHS = ("kernel", "one", "compat")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m integration.measure.serving_glue",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--ctx", default="185k", help="prefix tokens of the one request (k = 1,000; default 185k)")
    p.add_argument("--tree", type=int, default=16, help="draft tree nodes (default 16)")
    p.add_argument("--shape", default="kimi-k2-tp8", help="head-shape preset (default kimi-k2-tp8)")
    p.add_argument("--layers", type=int, default=8, help="layers per replay, each with its own pool (default 8)")
    p.add_argument("--reps", type=int, default=20, help="timed replays (default 20)")
    p.add_argument("--paths", default="kernel,one,compat", help=f"which of {','.join(PATHS)} to run")
    p.add_argument("--backend", default=None, help="verify_attn backend (default: cuda on a GPU, reference on a CPU)")
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu (a smoke run)")
    p.add_argument("--json", default=None, help="write the results here")
    return p


def make_inputs(ctx: int, tree: int, shape, layers: int, dev: torch.device, dtype: torch.dtype, seed: int = 0):
    """SGLang's state for one request: per-layer pools, req_to_token, out_cache_loc, the custom mask;
    and the same problem as prebuilt tree_verify arguments (prefix slots then draft slots)."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)                            # the pools are drawn on the device (GBs at 185k x layers)
    slots = ctx + tree + 64
    perm = torch.randperm(slots, generator=g)
    prefix, draft = perm[:ctx], perm[ctx: ctx + tree]
    dqk, dv, hq, hkv = shape.head_dim_qk, shape.head_dim_v, shape.num_q_heads, shape.num_kv_heads
    mla = shape.mla
    pools = []
    for _ in range(layers):
        k = torch.randn(slots, hkv, dqk, device=dev, dtype=dtype)
        v = k[..., :dv] if mla else torch.randn(slots, hkv, dv, device=dev, dtype=dtype)
        pools.append((k, v))
    req_to_token = torch.zeros(2, ctx + tree + 8, dtype=torch.int32)
    req_to_token[1, :ctx] = prefix.to(torch.int32)
    parents = vtree.random_parents(tree, "bushy", g)
    qo_indptr, tree_mask = vtree.pack_batch([parents])
    custom_mask, mask_indptr = vtree.to_sglang_custom_mask(tree_mask, qo_indptr, [ctx])
    q = torch.randn(tree, hq, dqk, generator=g).to(dtype)
    sgl = dict(req_to_token=req_to_token.to(dev), req_pool_indices=torch.tensor([1], device=dev),
               seq_lens=torch.tensor([ctx], device=dev), out_cache_loc=draft.to(dev), qo_indptr=qo_indptr.to(dev),
               custom_mask=custom_mask.to(dev), mask_indptr=mask_indptr.to(dev), max_tree=tree)
    kernel = dict(qo_indptr=qo_indptr.to(dev), kv_indptr=torch.tensor([0, ctx + tree], dtype=torch.int32, device=dev),
                  kv_indices=torch.cat([prefix, draft]).to(torch.int32).to(dev),
                  kv_lens=torch.tensor([ctx + tree], dtype=torch.int32, device=dev), tree_mask=tree_mask.to(dev))
    compat = dict(kv_indptr=torch.tensor([0, ctx], dtype=torch.int32, device=dev),
                  kv_indices=prefix.to(torch.int64).to(dev))
    return q.to(dev), pools, sgl, kernel, compat, draft.to(dev)


def run_paths(a: argparse.Namespace) -> dict:
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gpu = dev.type == "cuda"
    backend = a.backend or ("cuda" if gpu else "reference")
    ctxs = parse_ctx(a.ctx)
    if len(ctxs) != 1:
        raise usage_error(f"--ctx: one context length, got {a.ctx!r}")
    ctx = ctxs[0]
    shape = get_shape(a.shape)
    dtype = torch.bfloat16 if gpu else torch.float32
    paths = [p for p in a.paths.split(",") if p]
    bad = [p for p in paths if p not in PATHS]
    if bad:
        raise usage_error(f"--paths: unknown {', '.join(bad)}; choose from {', '.join(PATHS)}")
    q, pools, sgl, kern, compat, draft = make_inputs(ctx, a.tree, shape, a.layers, dev, dtype)
    sm = shape.sm_scale or shape.head_dim_qk ** -0.5
    hint = ctx + a.tree
    outs = {p: torch.empty(a.layers, a.tree, shape.num_q_heads, shape.head_dim_v, dtype=dtype, device=dev)
            for p in paths}
    bufs = StepBuffers.allocate(max_bs=1, max_tokens=a.tree, max_kv_len=ctx, max_tree=a.tree, device=dev)

    def kernel_path():
        for i, (k, v) in enumerate(pools):
            tree_verify(q, k, v, kern["qo_indptr"], kern["kv_indptr"], kern["kv_indices"], kern["kv_lens"],
                        kern["tree_mask"], sm_scale=sm, backend=backend, out=outs["kernel"][i], max_kv_len=hint)

    def one_path():
        step = from_req_to_token(**sgl, max_kv_len=ctx, buffers=bufs)
        for i, (k, v) in enumerate(pools):
            verify_layer(q, k, v, step, sm_scale=sm, out=outs["one"][i], backend=backend)

    # SGLang hands the extend rows over made (the layer's k, v; for MLA v is a view of k)
    extend_rows = []
    for k, v in pools:
        ke = k[draft]
        extend_rows.append((ke, ke[..., : shape.head_dim_v] if shape.mla else v[draft]))

    def compat_path():
        for i, (k, v) in enumerate(pools):
            extend_attention_fwd(q, *extend_rows[i], outs["compat"][i], k, v, sgl["qo_indptr"],
                                 compat["kv_indptr"], compat["kv_indices"], sgl["custom_mask"], True,
                                 sgl["mask_indptr"], a.tree, 1.0, 1.0, sm_scale=sm, backend=backend, max_kv_len=ctx)
    fns = {"kernel": kernel_path, "one": one_path, "compat": compat_path}

    verify_attn.set_validation("shapes")
    res: dict = {"device": torch.cuda.get_device_name(dev) if gpu else "cpu", "backend": backend, "ctx": ctx,
                 "tree": a.tree, "shape": a.shape, "layers": a.layers, "reps": a.reps,
                 "timing": "CUDA graph replays, CUDA events" if gpu else "CPU eager smoke run: not a GPU figure",
                 "us_per_layer": {}}
    try:
        for p in paths:
            fns[p]()                                   # warm: builds, workspace, tuned config
            if gpu:
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    fns[p]()
                for _ in range(3):
                    g.replay()
                times = []
                for _ in range(a.reps):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    g.replay()
                    e.record()
                    e.synchronize()
                    times.append(s.elapsed_time(e) * 1e3)
            else:
                times = []
                for _ in range(max(1, min(a.reps, 3))):
                    t0 = time.perf_counter()
                    fns[p]()
                    times.append((time.perf_counter() - t0) * 1e6)
            res["us_per_layer"][p] = statistics.median(times) / a.layers
    finally:
        verify_attn.set_validation("full")
    if "kernel" in paths:
        base = res["us_per_layer"]["kernel"]
        res["glue_us_per_layer"] = {p: res["us_per_layer"][p] - base for p in paths if p != "kernel"}
        res["glue_share"] = {p: (res["us_per_layer"][p] - base) / base for p in paths if p != "kernel"}
        ref = outs["kernel"].double()
        res["max_abs_diff_vs_kernel"] = {p: float((outs[p].double() - ref).abs().max()) for p in paths if p != "kernel"}
    return res


def print_table(res: dict) -> None:
    print(f"serving glue per layer: {res['shape']}, ctx {res['ctx']}, tree {res['tree']}, {res['layers']} layers, "
          f"{res['device']} ({res['timing']})")
    print(f"  {'path':<8} {'us/layer':>10} {'glue us':>9} {'share':>7} {'max |diff|':>11}")
    for p, us in res["us_per_layer"].items():
        glue = res.get("glue_us_per_layer", {}).get(p)
        share = res.get("glue_share", {}).get(p)
        diff = res.get("max_abs_diff_vs_kernel", {}).get(p)
        print(f"  {p:<8} {us:>10.1f} {'' if glue is None else f'{glue:9.1f}':>9} "
              f"{'' if share is None else f'{100 * share:6.1f}%':>7} {'' if diff is None else f'{diff:11.2e}':>11}")


def main(argv: Optional[list[str]] = None) -> int:
    from verify_attn.utils import dash_values
    a = dash_values(build_parser()).parse_args(argv)
    for name in ("layers", "reps", "tree"):
        if getattr(a, name) < 1:
            raise usage_error(f"--{name} must be >= 1, got {getattr(a, name)}")
    if a.device == "cuda" and not torch.cuda.is_available():
        raise usage_error("--device cuda: no CUDA GPU here (run with --device cpu for a smoke run)")
    res = run_paths(a)
    print_table(res)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
