"""python -m integration.bench_e2e: end-to-end decode step timing against context length, per backend.

For each --ctx and each --attn-backend: prefill a synthetic prompt, decode
--warmup + --steps speculative steps, and report per step (means over the timed
steps) the time split into draft (draft_swa: the drafter's sliding-window
layers, which should stay flat; draft: the rest of it), tree build, verify attention, the rest of the
target, acceptance/commit and all-reduce (when TP is real), tokens per step,
tok/s, the verify-attention share, the speedup over triton-serial, and how each
part grows with context (least-squares ms per extra 1k tokens). Writes a table,
JSON (bench/results/e2e-<date>.json) and a plot of step time and tok/s.

--simulate-accept-len N forces every step to commit N tokens (the root plus the
first N-1 nodes of the deepest path, like serving engines' benchmark knobs), so
timing does not depend on the synthetic weights' acceptance; the output says so.
Timing: CUDA events on GPU (the acceptance walk reads the argmax on the host,
the one sync a real loop also has), perf_counter on CPU.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
from typing import Optional

import torch

import verify_attn
from verify_attn.utils import parse_ctx

from .decode import (add_common_args, budget_of, build, capacity_for, check_backends, check_fits, cli_value,
                     model_config, prompt_for, resolve)
from ..loop.spec import speculative_decode
from ..loop.timing import StepTimer
from ..loop.tp import TPGroup, launch

PARTS = ("draft", "draft_swa", "tree", "verify_attn", "target_rest", "accept_commit", "allreduce")
GPU_CTX = "1.4k,8k,32k,64k,128k,185k"
CPU_CTX = "256,1k,2k"


def sweep_rank(tp: TPGroup, s: dict, backends: list[str], ctxs: list[int], steps: int, warmup: int,
               accept_len: Optional[int]) -> list[dict]:
    """All (ctx, backend) runs on one rank; rank 0's rows are the result. The model is built once."""
    cfg = model_config(s)
    cap = capacity_for(max(ctxs), warmup + steps, budget_of(s), cfg.drafter.block, s["page_size"])
    target, drafter, engine = build(tp, s, backends[0], cap)
    rows = []
    for ctx in ctxs:
        prompt = prompt_for(s, target, ctx)
        for name in backends:
            engine.backend = name
            timer = StepTimer(target.device)
            budget: object = s["budget"]
            if budget == "auto":
                from ..planning.budget import auto_budget_for
                budget = auto_budget_for(cfg, s, name)
            _, metrics = speculative_decode(engine, drafter, prompt, warmup + steps, tree_kind=s["tree"],
                                            budget=budget, simulate_accept_len=accept_len, timer=timer,
                                            temperature=s.get("temperature", 0.0), seed=s["seed"])
            timed = metrics[warmup:]
            n = len(timed)
            parts = {p: sum(m.parts.get(p, 0.0) for m in timed) / n * 1e3 for p in PARTS}
            step_ms = sum(m.step_s for m in timed) / n * 1e3
            tokens = sum(m.commit_len for m in timed)
            rows.append({
                "ctx": ctx, "backend": name, "step_ms": step_ms,
                "step_ms_median": sorted(m.step_s for m in timed)[n // 2] * 1e3,
                "parts_ms": parts, "parts_sum_ms": sum(parts.values()),
                "tokens_per_step": tokens / n, "tok_s": tokens / (sum(m.step_s for m in timed) or 1e-12),
                "attn_share": parts["verify_attn"] / step_ms if step_ms else 0.0,
                "tree_size": sum(m.tree_size for m in timed) / n, "alloc": s.get("alloc", "shuffled"),
                "text": s.get("text", "random"),
            })
    return rows


def slope_per_1k(xs: list[int], ys: list[float]) -> Optional[float]:
    """Least-squares slope of ys (ms) against xs (tokens), in ms per 1,000 tokens."""
    if len(xs) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return None if den == 0 else 1e3 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den


def analyse(rows: list[dict]) -> dict:
    by = {}
    for r in rows:
        by.setdefault(r["backend"], []).append(r)
    growth = {}
    for name, rs in by.items():
        xs = [r["ctx"] for r in rs]
        growth[name] = {p: slope_per_1k(xs, [r["parts_ms"][p] for r in rs]) for p in PARTS}
        growth[name]["step"] = slope_per_1k(xs, [r["step_ms"] for r in rs])
    base = {r["ctx"]: r["step_ms"] for r in by.get("triton-serial", [])}
    for r in rows:
        r["speedup_vs_triton_serial"] = (base[r["ctx"]] / r["step_ms"]) if r["ctx"] in base and r["step_ms"] else None
    return growth


def print_table(rows: list[dict], growth: dict, header: str) -> None:
    print(header)
    cols = ["ctx", "backend", "step ms"] + [p for p in PARTS] + ["untimed", "tok/step", "tok/s", "attn %", "vs serial"]
    print("  ".join(f"{c:>12s}" for c in cols))
    for r in rows:
        sp = r["speedup_vs_triton_serial"]
        vals = [str(r["ctx"]), r["backend"], f"{r['step_ms']:.2f}"] + [f"{r['parts_ms'][p]:.2f}" for p in PARTS] + \
               [f"{r['step_ms'] - r['parts_sum_ms']:.2f}", f"{r['tokens_per_step']:.2f}", f"{r['tok_s']:.1f}",
                f"{100 * r['attn_share']:.0f}", "-" if sp is None else f"{sp:.2f}x"]
        print("  ".join(f"{v:>12s}" for v in vals))
    print("growth with context (ms per extra 1k tokens, least squares; * = the fit grows the part by more "
          "than 25% of its mean over the swept range):")
    for name, g in growth.items():
        rs = [r for r in rows if r["backend"] == name]
        span = (max(r["ctx"] for r in rs) - min(r["ctx"] for r in rs)) / 1e3

        def mark(part: str, v: Optional[float]) -> str:
            if v is None:
                return "-"
            vals = [r["step_ms"] if part == "step" else r["parts_ms"][part] for r in rs]
            mean = sum(vals) / len(vals)
            return f"{v:+.3f}" + ("*" if mean > 0 and v * span > 0.25 * mean else "")
        print(f"  {name:14s} " + "  ".join(f"{k}={mark(k, v)}" for k, v in g.items()))


def plot(rows: list[dict], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name in sorted({r["backend"] for r in rows}):
        rs = sorted((r for r in rows if r["backend"] == name), key=lambda r: r["ctx"])
        xs = [r["ctx"] / 1e3 for r in rs]
        a.plot(xs, [r["step_ms"] for r in rs], "o-", label=name)
        b.plot(xs, [r["tok_s"] for r in rs], "o-", label=name)
    a.set_xlabel("context (k tokens)"), a.set_ylabel("step time (ms)"), a.legend(), a.grid(alpha=0.3)
    b.set_xlabel("context (k tokens)"), b.set_ylabel("tok/s"), b.legend(), b.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _commit() -> Optional[str]:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=5).stdout.strip() or None
    except Exception:
        return None


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m integration.bench_e2e", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap)
    ap.add_argument("--ctx", default=None, help=f"contexts (default {GPU_CTX} on GPU, {CPU_CTX} on CPU)")
    ap.add_argument("--attn-backend", default=None,
                    help="comma-separated backends (default: every available one but cuda-emu; reference only on CPU)")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per (ctx, backend)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--simulate-accept-len", type=int, default=None)
    ap.add_argument("--json", default=None, help="output JSON (default bench/results/e2e-<date>.json)")
    ap.add_argument("--plot", default=None, help="output PNG (default next to the JSON)")
    from verify_attn.utils import dash_values
    args = dash_values(ap).parse_args(argv)
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    s = resolve(args)
    gpu = s["device"].startswith("cuda")
    ctxs = cli_value(parse_ctx, args.ctx or (GPU_CTX if gpu else CPU_CTX), "--ctx")
    if args.attn_backend:
        backends = check_backends([b.strip() for b in args.attn_backend.split(",") if b.strip()])
    elif gpu:
        backends = [b for b in verify_attn.available_backends() if b not in ("cuda-emu", "reference")]
    else:
        backends = ["reference"]
    if args.simulate_accept_len is not None and args.simulate_accept_len < 1:
        raise SystemExit("--simulate-accept-len must be >= 1")
    check_fits(s, args.tp, max(ctxs), args.warmup + args.steps, False, f"--model {s['model']} --ctx {max(ctxs):,}")
    if s["device"] == "cpu":
        torch.set_num_threads(1)
    tp_desc = "simulated rank 0 of TP 8 (all-reduce skipped)" if s["simulate"] else f"TP {args.tp}"
    accept = (f"commit length FORCED to {args.simulate_accept_len} (--simulate-accept-len)"
              if args.simulate_accept_len else "natural acceptance (synthetic weights)")
    header = (f"bench_e2e: model {s['model']}, {tp_desc}, layout {args.layout}"
              f"{'' if s['page_size'] == 1 else ' page ' + str(s['page_size'])}, alloc {s['alloc']}, "
              f"text {s['text']}, tree {s['tree']} "
              f"budget {s['budget']}, {s['device']} {s['dtype']}, {args.steps} steps after {args.warmup} warmup; {accept}")
    # hot path: shape checks only (the value checks read index tensors on the host every call);
    # restored afterwards, since main() may run inside a larger process (tests)
    prev, prev_env = verify_attn.api._VALIDATION, os.environ.get("VERIFY_ATTN_VALIDATE")
    verify_attn.set_validation("shapes")
    os.environ["VERIFY_ATTN_VALIDATE"] = "shapes"          # spawned ranks read it at import
    try:
        rows = launch(args.tp, sweep_rank, s, backends, ctxs, args.steps, args.warmup, args.simulate_accept_len)
    finally:
        verify_attn.set_validation(prev)
        if prev_env is None:
            os.environ.pop("VERIFY_ATTN_VALIDATE", None)
        else:
            os.environ["VERIFY_ATTN_VALIDATE"] = prev_env
    growth = analyse(rows)
    print_table(rows, growth, header)
    n = args.simulate_accept_len
    if n is not None and any(r["tokens_per_step"] < n for r in rows):
        print(f"note: some trees were shallower than the forced commit length {n} (fewer tokens per step); "
              f"use --tree chain or a larger --tree-budget")
    if not gpu and any(b.startswith("triton") for b in backends):
        print("note: on CPU the Triton backends run under Triton's interpreter; their times say nothing about GPU speed")
    date = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = args.json or os.path.join("bench", "results", f"e2e-{date}.json")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    device_name = torch.cuda.get_device_name() if gpu else "cpu"
    doc = {"date": date, "commit": _commit(), "device": device_name, "settings": s, "alloc": s["alloc"],
           "tp": args.tp,
           "simulate_accept_len": args.simulate_accept_len, "steps": args.steps, "warmup": args.warmup,
           "header": header, "rows": rows, "growth_ms_per_1k": growth}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    png = args.plot or os.path.splitext(path)[0] + ".png"
    plot(rows, png, header)
    print(f"wrote {path} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
