"""Per-part step timing and NVTX ranges.

Parts: draft, draft_swa, tree, verify_attn, target_rest, accept_commit, allreduce. On CUDA each
part records a pair of events and nothing syncs until `finish()` at the step's
end; on CPU parts use perf_counter. Parts may nest (verify_attn inside the target
forward); each part is reported exclusive of the parts nested in it.
"""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import Optional

import torch

try:
    import nvtx as _nvtx
except ImportError:  # the GPU machine may lack the package
    _nvtx = None


def nvtx_range(name: str, device: torch.device):
    """An NVTX range in the "verify_attn" domain (the `nvtx` package: a few hundred ns and a
    no-op unless a profiler such as nsys is attached); torch.cuda.nvtx when the package is
    missing, nothing on a CPU without it."""
    if _nvtx is not None:
        return _nvtx.annotate(name, domain="verify_attn")
    if device.type == "cuda":
        return _cuda_nvtx(name)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _cuda_nvtx(name: str):
    torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        torch.cuda.nvtx.range_pop()


class StepTimer:
    """Parts nest; each part's time is reported exclusive of the parts opened inside it, so the
    parts of a step add up to the step (up to the untimed gaps between them)."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._recs: list[list] = []      # [name, parent index, start, end]
        self._stack: list[int] = []
        self._begin = None

    def _now(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def _dt(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a

    def start(self) -> None:
        self._recs.clear()
        self._stack.clear()
        self._begin = self._now()

    @contextlib.contextmanager
    def part(self, name: str):
        with nvtx_range(name, self.device):
            rec = [name, self._stack[-1] if self._stack else -1, self._now(), None]
            self._recs.append(rec)
            self._stack.append(len(self._recs) - 1)
            try:
                yield
            finally:
                self._stack.pop()
                rec[3] = self._now()

    def current_part(self) -> Optional[str]:
        """The innermost part open now (None between parts or outside a step)."""
        return self._recs[self._stack[-1]][0] if self._stack else None

    def finish(self) -> tuple[float, dict[str, float]]:
        """(step seconds, {part: exclusive seconds}); syncs once on CUDA."""
        end = self._now()
        if self.cuda:
            torch.cuda.synchronize(self.device)
        total = self._dt(self._begin, end)
        dur = [self._dt(r[2], r[3]) for r in self._recs]
        excl = list(dur)
        for i, r in enumerate(self._recs):
            if r[1] >= 0:
                excl[r[1]] -= dur[i]
        parts: dict[str, float] = defaultdict(float)
        for r, e in zip(self._recs, excl):
            parts[r[0]] += e
        return total, dict(parts)
