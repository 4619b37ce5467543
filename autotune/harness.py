"""GPU side of a tuning run: inputs, the reference check and the cold-L2 timer for one bucket.

Inputs, timing and the floor come from the benchmark's own helpers (bench.core.inputs,
bench.core.timing, bench.core.roofline), so a tuned time and a benchmark time mean the same
thing: the KV pool laid out as a serving pool (shuffled slots/pages, NaN in unused
ones), input sets rotated so consecutive uses of one set are 2x L2 apart (cold L2),
CUDA events, median of many samples.
"""
from __future__ import annotations

from typing import Optional

import torch

from verify_attn.backends import Backend, Problem
from verify_attn.config import KernelConfig
from verify_attn.reference import reference_e4m3_mma, reference_verify
from verify_attn.shapes import HeadShape
from verify_attn.tolerances import LSE_ATOL, TOL, check_e4m3_mma   # the bounds (and reasons) the tests use


class BucketHarness:
    """Everything needed to check and time configs of one backend at one (ctx, tree) bucket."""

    def __init__(self, backend: Backend, shape: HeadShape, *, ctx: int, tree_nodes: int, tree_kind: str,
                 batch: int, page_size: int, dtype: torch.dtype, l2_bytes: int, reps: int = 50,
                 max_seconds: float = 3.0, seed: int = 0, device: str = "cuda", kv_dtype: str = "") -> None:
        from bench.core.inputs import make_inputs, make_trees
        from bench.core.timing import rotation_sets

        self.backend, self.reps, self.max_seconds = backend, reps, max_seconds
        self.floor_us: Optional[float] = None   # set by the caller (bench.core.roofline for this GPU)
        self.trees = make_trees(tree_nodes, tree_kind, batch)
        dev = self.device = torch.device(device)
        first = make_inputs(shape, ctx, self.trees, page_size, dtype, dev, seed, kv_dtype=kv_dtype)
        self.problem = self._problem(first)
        # bytes one call must read (its KV rows), not the pool with its spare pages
        from verify_attn.fp8 import KV_DTYPE_OF, kv_row_bytes
        row_bytes = shape.num_kv_heads * kv_row_bytes(kv_dtype or KV_DTYPE_OF[dtype], shape.head_dim_qk,
                                                      shape.head_dim_v, shape.mla)
        set_bytes = int(first["kv_lens"].sum()) * row_bytes
        # CPU (tests of this harness): one set, wall-clock timing
        n_sets = rotation_sets(set_bytes, l2_bytes) if dev.type == "cuda" else 1
        # more sets of the same shapes (different data): the rotation that makes L2 cold
        self.problems = [self.problem] + [self._problem(make_inputs(shape, ctx, self.trees, page_size, dtype, dev,
                                                                    seed + i, kv_dtype=kv_dtype))
                                          for i in range(1, n_sets)]
        self.l2_cold = set_bytes * n_sets >= 2 * l2_bytes
        ref_out, ref_lse = reference_verify(self.problem)   # float64 [total_q, Hq, Dv], [total_q, Hq]
        self.ref_out, self.ref_lse = ref_out.to(dev), ref_lse.to(dev)
        self.atol, self.rtol = TOL[dtype]
        self.lse_atol = LSE_ATOL[dtype]
        self.dtype = dtype
        self.ref_q: Optional[tuple[torch.Tensor, torch.Tensor]] = None   # q rounded as e4m3 MMAs do: made when needed
        p = self.problem
        self.out = torch.empty(p.total_q, p.num_q_heads, p.head_dim_v, dtype=dtype, device=dev)
        self.lse = torch.empty(p.total_q, p.num_q_heads, dtype=torch.float32, device=dev)
        self.outs = [torch.empty_like(self.out) for _ in self.problems]

    @staticmethod
    def _problem(kw: dict) -> Problem:
        from bench.core.measure import problem_of   # with the fp8 keywords (k_scale, v_scale, kv_format) when present
        return problem_of(kw)

    def default_config(self) -> Optional[KernelConfig]:
        b = self.backend
        return b.default_config(self.problem) if b.default_config is not None else None

    def check(self, cfg: KernelConfig) -> Optional[str]:
        """None if out and lse match the float64 reference for this config, else the worst error."""
        self.out.fill_(float("nan"))
        self.lse.fill_(float("nan"))
        self.backend.run(self.problem, cfg, self.out, self.lse)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        if self.backend.name in ("cuda", "cuda-emu"):
            from verify_attn.backends.cuda import runs_e4m3_mma
            if runs_e4m3_mma(self.problem, cfg):   # Q and P rounded to e4m3: the contract of those tiles
                if self.ref_q is None:
                    self.ref_q = tuple(t.to(self.device) for t in reference_e4m3_mma(self.problem))
                return check_e4m3_mma(self.out, self.ref_q[0], self.dtype, self.lse, self.ref_q[1],
                                      emulated=self.device.type == "cpu")
        o = self.out.double()
        if not torch.isfinite(o).all():
            return f"{int((~torch.isfinite(o)).sum())} non-finite outputs"
        err = (o - self.ref_out).abs()
        bad = err > self.atol + self.rtol * self.ref_out.abs()
        if bad.any():
            return f"{int(bad.sum())} outputs off, max abs err {float(err.max()):.3g}"
        lerr = (self.lse.double() - self.ref_lse).abs().max()
        if not torch.isfinite(lerr) or float(lerr) > self.lse_atol:
            return f"lse max abs err {float(lerr):.3g}"
        return None

    def time(self, cfg: KernelConfig) -> float:
        """Median microseconds per call, cold L2 (bench.core.timing.time_cuda; wall clock on a CPU)."""
        from bench.core.timing import time_cpu, time_cuda

        run = self.backend.run
        if self.device.type != "cuda":
            return time_cpu(lambda: run(self.problem, cfg, self.out, None), reps=self.reps,
                            max_seconds=self.max_seconds).median_us
        fns = [lambda p=p, o=o: run(p, cfg, o, None) for p, o in zip(self.problems, self.outs)]
        return time_cuda(fns, l2_cold=self.l2_cold, reps=self.reps, max_seconds=self.max_seconds).median_us


def floor_us(shape: HeadShape, ctx: int, trees: list[list[int]], page_size: int, elem_bytes: int,
             gpu_name: str, kv_dtype: str = "") -> Optional[float]:
    """Roofline floor of the bucket on this GPU: measured ceilings if cached, else its datasheet device."""
    try:
        from bench.core import roofline
        counts = roofline.count_shape(shape, [ctx] * len(trees), trees, elem_bytes=elem_bytes, page_size=page_size,
                                      kv_dtype=kv_dtype or None)
        dev = None
        try:
            from bench.core.ceilings import get_ceilings
            ceil = get_ceilings()
            if ceil:
                prop = torch.cuda.get_device_properties(0)
                dev = roofline.device_from_ceilings(gpu_name, ceil, prop.multi_processor_count,
                                                    getattr(prop, "L2_cache_size", 0) / 1e6)
        except Exception:  # ceilings not measurable: fall back to the datasheet numbers
            dev = None
        dev = dev or roofline.match_reference(gpu_name)
        return None if dev is None else roofline.floor(counts, dev).us
    except Exception:
        return None
