"""python -m bench.overhead: host cost of one `tree_verify` call, kernel excluded.

Registers a no-op backend and times the dispatch path (argument checks, problem
build, config lookup) per call, for both validation modes. What a decode loop
pays per attention layer in eager mode; CUDA-graph replay pays none of it.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Optional

import torch

import verify_attn
from verify_attn import tree as vtree
from verify_attn.backends import _REGISTRY, Backend, register
from verify_attn.layouts import lay_out


def measure(mode: str, calls: int, ctx: int, nodes: int) -> float:
    """Mean microseconds per call over `calls` (host-only work: steady from call to call)."""
    qo, mask = vtree.pack_batch([vtree.random_parents(nodes, "bushy")])
    kv = lay_out([torch.randn(ctx + nodes, 1, 576, dtype=torch.bfloat16)], None, 1, mla_dv=512, poison=False)
    args = (torch.randn(nodes, 8, 576, dtype=torch.bfloat16), kv["k_cache"], kv["v_cache"], qo, kv["kv_indptr"],
            kv["kv_indices"], kv["kv_lens"], mask)
    verify_attn.set_validation(mode)
    try:
        for _ in range(min(100, calls)):
            verify_attn.tree_verify(*args, sm_scale=0.1, backend="noop")
        t = time.perf_counter()
        for _ in range(calls):
            verify_attn.tree_verify(*args, sm_scale=0.1, backend="noop")
        return (time.perf_counter() - t) / calls * 1e6
    finally:
        verify_attn.set_validation("full")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--ctx", type=int, default=4000, help="prefix tokens (the full checks read every index)")
    ap.add_argument("--nodes", type=int, default=16)
    from verify_attn.utils import dash_values, usage_error
    a = dash_values(ap).parse_args(argv)
    for flag, v, lo, hi in (("--calls", a.calls, 1, 10**7), ("--ctx", a.ctx, 0, 10**7), ("--nodes", a.nodes, 1, 256)):
        if not lo <= v <= hi:   # (10^7 tokens: the full checks read every index on each call)
            raise usage_error(f"{ap.prog}: error: {flag} must be in {lo:,}..{hi:,}, got {v:,}")
    register(Backend("noop", lambda p, cfg, out, lse: None))
    try:
        for mode in ("shapes", "full"):
            us = measure(mode, a.calls, a.ctx, a.nodes)
            print(f"validation={mode:6s} {us:8.1f} us per tree_verify call (CPU tensors, ctx {a.ctx}, "
                  f"{a.nodes} nodes; kernel excluded)")
    finally:
        _REGISTRY.pop("noop", None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
