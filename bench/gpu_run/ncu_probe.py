"""python -m bench.ncu_probe: exactly one call of each pinned CUDA kernel version, for a profiler.

`bench.gpu_check`'s ncu stage runs this under Nsight Compute with a kernel filter
(`-k regex:tree_verify_split -c N`), so the first N split-kernel launches it sees are
one per version, in the order given, on the headline shape (Kimi K2 TP8 rank, MLA
576/512, bf16, page_size 1, shuffled slots). The module is loaded and each version's
workspace reserved by a call on a 1k-token case first, which the filter skips by
count (`--warm` launches of each version; ncu's `--launch-skip` equals their number).

    ncu --clock-control none -k regex:tree_verify_split --launch-skip 2 -c 2 --section SpeedOfLight \
        python -m bench.ncu_probe --ctx 185k --versions v2,v1
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional

import torch


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ncu_probe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ctx", default="185k", help="prefix tokens (default 185k)")
    ap.add_argument("--tree", type=int, default=16, help="tree nodes (default 16)")
    ap.add_argument("--versions", default="v2,v1", help="kernel versions, one call each, in this order")
    ap.add_argument("--shape", default="kimi-k2-tp8")
    ap.add_argument("--warm", action="store_true", help="one call of each version on a 1k case first (JIT load, "
                    "workspace): pass ncu --launch-skip <number of versions>")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.ncu_probe: no CUDA device", file=sys.stderr)
        return 2
    from bench.core.inputs import make_inputs, make_trees
    from bench.core.measure import problem_of
    from verify_attn.backends import get_backend
    from verify_attn.backends.cuda import version_config
    from verify_attn.shapes import get_shape
    from verify_attn.utils import parse_tokens

    shape = get_shape(a.shape)
    versions = [v.strip() for v in a.versions.split(",") if v.strip()]
    b = get_backend("cuda")
    trees = make_trees(a.tree, "ddtree", 1)

    def calls(ctx: int) -> list:
        kw = make_inputs(shape, ctx, trees, 1, torch.bfloat16, "cuda", seed=0)
        p = problem_of(kw)
        out = torch.empty(kw["q"].shape[0], shape.num_q_heads, shape.head_dim_v, dtype=torch.bfloat16, device="cuda")
        return [(v, version_config(p, v), p, out) for v in versions]

    if a.warm:
        for v, cfg, p, out in calls(1000):
            b.run(p, cfg, out, None)
        torch.cuda.synchronize()
    for v, cfg, p, out in calls(parse_tokens(a.ctx)):
        b.run(p, cfg, out, None)
        torch.cuda.synchronize()
        print(f"{v}: {cfg}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
