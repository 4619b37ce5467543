"""Timing with cold L2: rotate input sets whose total size exceeds the L2, median of many samples.

A sample is one pass over every rotating input set (one call per set); the per-call
time of a sample is its elapsed time divided by the number of sets. On CUDA the
pass is captured once as a CUDA graph and replayed (no Python launch overhead in
the measurement, which matters for short calls); if capture fails (a backend that
syncs or allocates in a way capture forbids) it falls back to launching eagerly
between two CUDA events and says so in `mode`.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import torch


@dataclass(frozen=True)
class Timing:
    median_us: float
    p20_us: float
    p80_us: float
    samples: int
    sets: int          # rotating input sets per sample
    mode: str          # "cuda-graph" | "cuda-events" | "cpu"
    l2: str            # "cold" (sets exceed 2x L2) | "partly warm" | "n/a"

    def to_dict(self) -> dict:
        return asdict(self)


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile, q in [0, 1]."""
    s = sorted(xs)
    if not s:
        raise ValueError("quantile of an empty list")
    pos = q * (len(s) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def rotation_sets(set_bytes: int, l2_bytes: int, *, max_sets: int = 128, min_sets: int = 2) -> int:
    """Input sets to rotate so that consecutive uses of one set are 2x L2 bytes apart."""
    if set_bytes < 1:
        raise ValueError(f"set_bytes must be >= 1, got {set_bytes}")
    return int(min(max_sets, max(min_sets, math.ceil(2 * l2_bytes / set_bytes))))


def _summary(per_call_us: list[float], sets: int, mode: str, l2: str) -> Timing:
    return Timing(median_us=statistics.median(per_call_us), p20_us=quantile(per_call_us, 0.2),
                  p80_us=quantile(per_call_us, 0.8), samples=len(per_call_us), sets=sets, mode=mode, l2=l2)


def time_cuda(fns: Sequence[Callable[[], None]], *, l2_cold: bool, reps: int = 50, warmup: int = 2,
              max_seconds: float = 10.0, use_graph: bool = True) -> Timing:
    """Per-call time of `fns` (one closure per rotating input set), CUDA events, median of `reps` samples."""
    if not fns:
        raise ValueError("time_cuda needs at least one function")
    for _ in range(warmup):
        for f in fns:
            f()
    torch.cuda.synchronize()

    def one_pass() -> None:
        for f in fns:
            f()

    run, mode = one_pass, "cuda-events"
    if use_graph:
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                one_pass()
            g.replay()
            torch.cuda.synchronize()
            run, mode = g.replay, "cuda-graph"
        except Exception:  # capture unsupported by this backend: measure eagerly instead
            torch.cuda.synchronize()
    per_call: list[float] = []
    t_end = time.perf_counter() + max_seconds
    for i in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        run()
        e.record()
        e.synchronize()
        per_call.append(s.elapsed_time(e) * 1e3 / len(fns))
        if i >= 4 and time.perf_counter() > t_end:  # slow baseline: fewer samples, still >= 5
            break
    return _summary(per_call, len(fns), mode, "cold" if l2_cold else "partly warm")


def time_cpu(fn: Callable[[], None], *, reps: int = 5, warmup: int = 1, max_seconds: float = 5.0) -> Timing:
    """Wall-clock per call on the CPU (perf_counter), median of up to `reps` samples."""
    for _ in range(warmup):
        fn()
    per_call: list[float] = []
    t_end = time.perf_counter() + max_seconds
    for i in range(reps):
        t0 = time.perf_counter()
        fn()
        per_call.append((time.perf_counter() - t0) * 1e6)
        if i >= 2 and time.perf_counter() > t_end:
            break
    return _summary(per_call, 1, "cpu", "n/a")
