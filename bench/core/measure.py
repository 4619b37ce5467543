"""Checking and timing one (context, tree, layout) point: the correctness gate, then cold-L2 timing.

A backend's output on the first input set is compared with the float64
reference; a wrong one is reported as wrong and never timed. Everything a call
needs (problem, config) is resolved on the host once, so the timed closure only
launches.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from bench.core import roofline as rl
from bench.core.inputs import make_inputs
from bench.core.timing import Timing, rotation_sets, time_cpu
from verify_attn.shapes import HeadShape
from verify_attn.tolerances import TOL


@dataclass
class Row:
    """One table/JSON row: a backend at one (ctx, tree size, layout), counted and maybe timed."""

    backend: str
    ctx: int
    tree_nodes: int
    layout: str
    page_size: int
    counts: rl.Counts
    floors: dict[str, rl.Floor]
    timed_on: Optional[str] = None         # "cuda" | "cpu" | None
    timing: Optional[Timing] = None
    status: str = "counted"                # counted | ok | wrong | error | skipped | unsupported
    note: str = ""
    config: Optional[dict] = None
    max_rel_err: Optional[float] = None    # max |out - ref| / max |ref| (normwise: elementwise ratios at
                                           # near-zero outputs read 0.3 for a correct bf16 kernel)
    max_abs_err: Optional[float] = None
    primary: Optional[str] = None          # device whose floor frac_of_floor refers to
    speedup_vs_serial: Optional[float] = None
    extra: dict = field(default_factory=dict)

    @property
    def median_us(self) -> Optional[float]:
        return self.timing.median_us if self.timing else None

    @property
    def frac_of_floor(self) -> Optional[float]:
        if self.timing is None or self.primary is None or self.timed_on != "cuda":
            return None
        return self.floors[self.primary].us / self.timing.median_us

    def to_dict(self) -> dict:
        t = self.timing
        return {
            "backend": self.backend, "ctx": self.ctx, "tree_nodes": self.tree_nodes, "layout": self.layout,
            "page_size": self.page_size, "bytes": self.counts.total_bytes, "flops": self.counts.flops,
            "floor_us": {k: f.us for k, f in self.floors.items()},
            "floor_bound": {k: f.bound for k, f in self.floors.items()},
            "median_us": self.median_us, "p20_us": t.p20_us if t else None, "p80_us": t.p80_us if t else None,
            "frac_of_floor": self.frac_of_floor, "floor_device": self.primary,
            "gbs": self.counts.total_bytes / (t.median_us * 1e3) if t else None,
            "tflops": self.counts.flops / (t.median_us * 1e6) if t else None,
            "speedup_vs_serial": self.speedup_vs_serial, "config": self.config,
            "max_rel_err": self.max_rel_err, "max_abs_err": self.max_abs_err,
            "status": self.status, "timed_on": self.timed_on, "note": self.note,
            "counts": self.counts.to_dict(), "timing": t.to_dict() if t else None, **self.extra,
        }


# ---------------------------------------------------------------- correctness

def compare(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> tuple[bool, float, float, str]:
    """(ok, max_rel_err, max_abs_err, why) of `out` against the float64 reference."""
    o = out.double()
    if not bool(torch.isfinite(o).all()):
        return False, float("inf"), float("inf"), f"{int((~torch.isfinite(o)).sum())} non-finite outputs"
    err = (o - ref).abs()
    atol, rtol = TOL[dtype]
    rel = float(err.max() / ref.abs().max().clamp_min(1e-30))
    bad = err > atol + rtol * ref.abs()
    why = f"{int(bad.sum())} values outside atol {atol} + rtol {rtol}" if bool(bad.any()) else ""
    return not bool(bad.any()), rel, float(err.max()), why


# ---------------------------------------------------------------- one combo on the GPU

def _runner(name: str, kw: dict, outside: dict, cfg_holder: dict) -> Callable[[torch.Tensor], None]:
    """Resolve everything host-side once; return run(out) that only launches."""
    if name in outside:
        return outside[name](kw)
    from verify_attn.api import resolve_config
    from verify_attn.backends import get_backend, kv_format_refusal
    base, _, version = name.partition("@")  # cuda@v0 / cuda@v1: the cuda backend with that kernel version
    b = get_backend(base)
    ok, why = b.available()
    if not ok:
        raise LookupError(f"unavailable: {why}")
    p = problem_of(kw)
    why = kv_format_refusal(b, p) or b.supports(p)
    if why is not None:
        raise NotImplementedError(why)
    if version:
        from verify_attn.backends.cuda import version_config
        cfg = version_config(p, version)
    else:
        cfg = resolve_config(p, base) if b.tunable else None
    cfg_holder["config"] = cfg.to_dict() if cfg is not None else None
    if base in ("cuda", "cuda-emu"):   # Q and P rounded to e4m3: judged by tolerances.check_e4m3_mma, with the LSE
        from verify_attn.backends.cuda import runs_e4m3_mma
        if runs_e4m3_mma(p, cfg):   # the checked call: on the first input set (the reference's), not a later one
            cfg_holder.setdefault("e4m3_mma", lambda out, lse: b.run(p, cfg, out, lse))
    return lambda out: b.run(p, cfg, out, None)


FP8_KEYS = ("k_scale", "v_scale", "kv_format")


def problem_of(kw: dict):
    """build_problem over a make_inputs dict (with the fp8 keywords when it has them)."""
    from verify_attn.api import build_problem
    return build_problem(kw["q"], kw["k_cache"], kw["v_cache"], kw["qo_indptr"], kw["kv_indptr"], kw["kv_indices"],
                         kw["kv_lens"], kw["tree_mask"], kw["sm_scale"], kw["page_size"],
                         **{k: kw[k] for k in FP8_KEYS if k in kw})


Timer = Callable[[list, bool], Timing]  # (one closure per rotating set, l2_cold) -> Timing


def run_combo(shape: HeadShape, ctx: int, trees: list[list[int]], layout: tuple[str, int], dtype: torch.dtype,
              backends: list[str], outside: dict, base: Callable[[str], Row], *, device: str, l2: int,
              timer: Timer, skip: Callable[[str, int], Optional[str]], tick: Callable[[], None],
              alloc: str = "shuffled", kv_dtype: str = "") -> list[Row]:
    """Check, then time, every backend on one (ctx, tree, layout). `device` is "cuda" in the
    benchmark; tests pass "cpu" with a CPU timer to exercise the same path."""
    from verify_attn.reference import reference_e4m3_mma, reference_verify
    from verify_attn.tolerances import check_e4m3_mma, e4m3_mma_errors
    rows: list[Row] = []
    todo = []
    for name in backends:
        r = base(name)
        why = skip(name, ctx)
        if why:
            r.status, r.note = "skipped", why
            rows.append(r)
            tick()
        else:
            todo.append(r)
    if not todo:
        return rows
    counts = todo[0].counts
    n_sets = rotation_sets(counts.total_bytes, l2)
    cold = n_sets * counts.total_bytes >= 2 * l2
    try:
        sets = [make_inputs(shape, ctx, trees, layout[1], dtype, device, seed=s, alloc=alloc, kv_dtype=kv_dtype)
                for s in range(n_sets)]
        kw0 = sets[0]
        ref = reference_verify(problem_of(kw0))[0]   # fp8: on the dequantized cache
    except Exception as e:  # e.g. out of memory for the rotating sets: record it, go on with the next combo
        for r in todo:
            r.status, r.note = "error", f"inputs/reference: {type(e).__name__}: {e}"[:300]
            rows.append(r)
            tick()
        return rows
    out_shape = (kw0["q"].shape[0], shape.num_q_heads, shape.head_dim_v)
    ref_q = None   # the reference with q rounded as the e4m3-MMA kernels round it: made once, when one runs
    for r in todo:
        try:
            holder: dict = {}
            runs = [_runner(r.backend, kw, outside, holder) for kw in sets]
            r.config = holder.get("config")
            if getattr(runs[0], "departure", None):   # a peer's run that departs from the contract says how
                r.extra["departure"] = runs[0].departure
            outs = [torch.full(out_shape, float("nan"), dtype=dtype, device=device) for _ in sets]  # poisoned
            lse = torch.full(out_shape[:2], float("nan"), dtype=torch.float32, device=device)
            e4m3_run = holder.get("e4m3_mma")
            e4m3_run(outs[0], lse) if e4m3_run else runs[0](outs[0])
            if device == "cuda":
                torch.cuda.synchronize()
            ok, r.max_rel_err, r.max_abs_err, why = compare(outs[0], ref, dtype)   # errors: the exact reference's
            if e4m3_run:
                if ref_q is None:
                    ref_q = reference_e4m3_mma(problem_of(kw0))
                why = check_e4m3_mma(outs[0], ref_q[0], dtype, lse, ref_q[1], emulated=device == "cpu") or ""
                ok = not why
                r.extra["judged"] = ("e4m3 MMAs: out and LSE against the reference with q rounded as the kernel "
                                     "rounds it (tolerances.check_e4m3_mma)")
                if bool(torch.isfinite(outs[0]).all()):   # the errors left once q's rounding is out: P's, the MMAs' sums
                    rel_q, lse_q = e4m3_mma_errors(outs[0], ref_q[0], lse, ref_q[1])
                    r.extra["vs_q_rounded"] = {"max_rel_err": rel_q, "lse_max_abs_err": lse_q}
            if not ok:
                r.status, r.note = "wrong", f"not timed: {why}"
            else:
                fns = [lambda run=run, out=out: run(out) for run, out in zip(runs, outs)]
                r.timing = timer(fns, cold)
                r.status = "ok"
                _time_parts(r, runs, timer, cold)
        except (LookupError, NotImplementedError) as e:
            r.status, r.note = "unsupported", str(e)
        except Exception as e:  # recorded; the next backend still runs
            r.status, r.note = "error", f"{type(e).__name__}: {e}"[:300]
        r.timed_on = device if r.timing else None
        rows.append(r)
        tick()
    del sets
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def _time_parts(r: Row, runs: list, timer: Timer, cold: bool) -> None:
    """A peer made of passes (bench/benchmark/peers.py: run.parts = {"prefix": fn, "tree": fn}) has each pass timed
    apart, the same way as the whole call: the row's parts_us."""
    parts = getattr(runs[0], "parts", None)
    if not parts:
        return
    r.extra["parts_us"] = {}
    for name in parts:
        fns = [lambda run=run, name=name: run.parts[name]() for run in runs]
        r.extra["parts_us"][name] = timer(fns, cold).median_us


def run_cpu_reference(shape: HeadShape, ctx: int, trees: list[list[int]], layout: tuple[str, int],
                      dtype: torch.dtype, r: Row, reps: int, warmup: int, alloc: str = "shuffled",
                      kv_dtype: str = "") -> Row:
    from verify_attn import tree_verify
    kw = make_inputs(shape, ctx, trees, layout[1], dtype, "cpu", seed=0, alloc=alloc, kv_dtype=kv_dtype)
    # a few samples only: the CPU reference is a label of scale, and 2 cores are shared
    r.timing = time_cpu(lambda: tree_verify(**kw, backend="reference"), reps=min(reps, 3), warmup=min(warmup, 1))
    r.timed_on, r.status = "cpu", "ok"
    r.note = "CPU float64 reference (not a kernel)"
    return r
