"""Walk a plan: per bucket build the inputs, search, cache the result; then export.

On a GPU the harness is `autotune.harness.BucketHarness`; tests inject a fake
one (`make_harness`) so the orchestration (resume, cache, export, exit codes)
runs on a CPU.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Optional

from verify_attn.tuned import TableError, TableKey

from .cache import TuneCache, entry_key
from .export import DEFAULT_EXPORT_DIR, export_table, kernel_versions_meta, now_iso, software_versions
from .plan import BucketPlan, Plan
from .search import BucketResult, Trial, estimate_trials, tune_bucket

# make_harness(bucket) -> object with .check(cfg), .time(cfg), .default_config(), .trees, .floor_us
HarnessFactory = Callable[[BucketPlan], object]


def _gpu_factory(plan: Plan, args: argparse.Namespace) -> tuple[Optional[HarnessFactory], str, str]:
    """(factory, device name, error); factory None with an error when there is no usable GPU/backend."""
    import torch

    if not torch.cuda.is_available():
        return None, "", "tuning needs a CUDA GPU; use --dry-run to see the plan here"
    from verify_attn.backends import get_backend

    from .harness import BucketHarness, floor_us
    from .space import arch_of_device
    here = arch_of_device(torch.cuda.current_device())
    if here.name != plan.arch.name:
        return None, "", (f"--arch {plan.arch.name} is not the GPU here ({here.name}, {here.device_name}): "
                          "--arch plans with --dry-run; tuning measures the GPU at hand")
    backend = get_backend(plan.backend)
    ok, why = backend.available()
    if not ok:
        return None, "", f"backend {plan.backend!r} is not available: {why}"
    dev_name = torch.cuda.get_device_name()
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[plan.dtype]

    def make(b: BucketPlan):
        h = BucketHarness(backend, plan.shape, ctx=b.ctx, tree_nodes=b.tree_nodes, tree_kind=args.tree_shape,
                          batch=plan.batch, page_size=plan.page_size, dtype=torch_dtype,
                          l2_bytes=plan.arch.l2_bytes, reps=args.reps, max_seconds=args.max_seconds,
                          kv_dtype=plan.kv_dtype)
        h.floor_us = floor_us(plan.shape, b.ctx, h.trees, plan.page_size, torch_dtype.itemsize, dev_name,
                              kv_dtype=plan.kv_dtype)
        return h
    return make, dev_name, ""


def _planned(b: BucketPlan, args: argparse.Namespace) -> int:
    return estimate_trials(len(b.tiles), max((len(t.splits) for t in b.tiles), default=0), args.top_tiles,
                           args.refine_rounds)


def run_tuning(plan: Plan, args: argparse.Namespace, *, make_harness: Optional[HarnessFactory] = None,
               device_name: Optional[str] = None) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    con = Console()
    gpu = make_harness is None
    if gpu:
        make_harness, device_name, err = _gpu_factory(plan, args)
        if make_harness is None:
            print(f"error: {err}", file=sys.stderr)
            return 2
    assert device_name
    key = TableKey(device_name, plan.backend, plan.shape.num_q_heads, plan.shape.num_kv_heads,
                   plan.shape.head_dim_qk, plan.shape.head_dim_v, plan.dtype, plan.page_size, plan.shape.mla,
                   plan.kv_dtype)
    cache = TuneCache(args.cache)
    cached = cache.load() if args.resume else {}
    versions = software_versions()
    results: list[BucketResult] = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=con) as prog:
        task = prog.add_task("tuning", total=sum(_planned(b, args) for b in plan.buckets))
        for b in plan.buckets:
            ek = entry_key(device_name=device_name, backend=plan.backend, shape_key=plan.shape.key(),
                           mla=plan.shape.mla, dtype=plan.dtype, page_size=plan.page_size, batch=plan.batch,
                           tree_kind=args.tree_shape, ctx=b.ctx, tree_nodes=b.tree_nodes, kv_dtype=plan.kv_dtype)
            planned = _planned(b, args)
            old = cached.get(ek, {}).get("result")
            if old is not None and old.get("config") is not None:   # resume: a bucket with a winner is done
                results.append(BucketResult.from_dict(old))
                prog.advance(task, planned)
                continue
            if not b.tiles:
                con.print(f"ctx {b.ctx} tree {b.tree_nodes}: no candidate survived pruning")
                results.append(BucketResult(b.ctx, b.tree_nodes))
                prog.advance(task, planned)
                continue
            label = f"ctx {b.ctx:>7,} tree {b.tree_nodes:>3}"
            prog.update(task, description=f"{label}: building inputs + reference")
            try:
                h = make_harness(b)
            except Exception as e:  # e.g. out of memory at the longest context: record it, tune the rest
                prog.console.print(f"[red]{label}: could not build inputs/reference: {type(e).__name__}: {e}[/]")
                results.append(BucketResult(b.ctx, b.tree_nodes))
                prog.advance(task, planned)
                continue
            splits = {t.candidate.config: t.splits for t in b.tiles}
            heur = {t.candidate.config: t.heuristic for t in b.tiles}
            caps = {t.candidate.config: t.cap for t in b.tiles}
            done = [0]

            def on_trial(t: Trial, r: BucketResult, label: str = label) -> None:
                done[0] += 1
                best = "no correct config yet" if r.best is None else (
                    f"best {r.best_us:.1f} us (splits {r.best.num_splits}, bn {r.best.block_n}, bm {r.best.block_m},"
                    f" w {r.best.num_warps}, st {r.best.num_stages})")
                prog.update(task, advance=1, description=f"{label}: {best}")
                if t.wrong:
                    prog.console.print(f"[red]{label}: WRONG {t.config.to_dict()}: {t.error}[/]")

            res = tune_bucket(list(splits), ctx=b.ctx, tree_nodes=b.tree_nodes, splits_for=splits.__getitem__,
                              heuristic_for=heur.__getitem__, cap_for=caps.__getitem__, timer=h.time,
                              checker=h.check, default_config=h.default_config(), floor_us=h.floor_us,
                              top_tiles=args.top_tiles, refine_rounds=args.refine_rounds, on_trial=on_trial)
            prog.advance(task, max(0, planned - done[0]))
            del h
            if gpu:
                import torch
                torch.cuda.empty_cache()
            # cached at once: an interrupted run resumes from the next bucket
            cache.merge({ek: {"result": res.to_dict(), "key": key.to_dict(), "batch": plan.batch,
                              "tree_kind": args.tree_shape, "arch": plan.arch.name, "date": now_iso(),
                              "versions": versions}})
            results.append(res)

    _summary(con, results)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"key": key.to_dict(), "arch": plan.arch.name, "versions": versions, "date": now_iso(),
             "results": [r.to_dict() for r in results]}, indent=1) + "\n")
    rc = 0
    if any(r.best is None for r in results):
        print("error: some buckets have no correct config (see above)", file=sys.stderr)
        rc = 1
    if not args.no_export:
        try:
            path = export_table(args.export or DEFAULT_EXPORT_DIR, key, results, batch=plan.batch,
                                meta={"versions": versions, "date": now_iso(), "arch": plan.arch.name,
                                      **kernel_versions_meta(plan),
                                      "tree_kind": args.tree_shape,
                                      "method": f"cold L2, CUDA events, median of up to {args.reps} samples; "
                                                "every config checked against the float64 reference first"})
            con.print(f"exported {path}")
        except TableError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    return rc


def _summary(con, results: list[BucketResult]) -> None:
    from rich.table import Table

    t = Table(title="tuned configs")
    for col in ("ctx", "tree", "best us", "floor us", "default us", "gain", "config", "wrong"):
        t.add_column(col, justify="left" if col == "config" else "right")

    def f(x: Optional[float], fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    for r in results:
        cfg = "-" if r.best is None else (f"splits={r.best.num_splits} bn={r.best.block_n} bm={r.best.block_m} "
                                          f"w={r.best.num_warps} st={r.best.num_stages}")
        t.add_row(f"{r.ctx:,}", str(r.tree_nodes), f(r.best_us, ".1f"), f(r.floor_us, ".1f"),
                  f(r.default_us, ".1f"), f(r.gain, ".2f"), cfg, str(len(r.wrong)))
    con.print(t)
    for r in results:
        for w in r.wrong:
            con.print(f"[red]ctx {r.ctx} tree {r.tree_nodes}: rejected wrong config {w.config.to_dict()}: "
                      f"{w.error}[/]")
