"""`python -m autotune --cost model`: tune with bench.model's predictions instead of GPU timings.

For each bucket of the plan, every candidate (tile x split count of the coarse grid) is predicted by
the SASS-level model (bench.model.call.predict: the kernel's own SASS for that tile, simulated on the
arch's device model: sm_90a -> the H200, sm_120a -> the RTX PRO 6000). The fastest central prediction
gets its band (bench.model.bands: every ranged constant at each end of its range). A candidate with
fewer splits ties with the fastest when the band of their difference reaches zero: the constants move
both predictions together, so the difference's band is narrower than either band (`choose`). Of the
ties the fewest splits is kept, and the file says so. Nothing is run, so no config is checked against the reference here: every tile is one the
kernels' tests check on the emulator at these split counts' code paths, and `tree_verify` validates
the config at run time.

The exported table is labelled `"source": "model"` with the model's version (a hash of
bench/model/*.py and the commit) and goes to `...,source=model.json`: verify_attn.tuned ranks it
below a measured table of the same key, above the backend's heuristic.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Optional

from verify_attn.tuned import TableError, TableKey

from .export import DEFAULT_EXPORT_DIR, export_table, git_commit, kernel_versions_meta, now_iso, software_versions
from .plan import Plan
from .search import BucketResult, Trial

DEVICES = {"sm_90a": "h200", "sm_120a": "rtx-pro-6000"}   # the device model each arch is predicted on
REPO = Path(__file__).resolve().parent.parent


def model_sources() -> str:
    """bench.model@<hash of its sources>: the model that reads the kernels here (model_version without the commit)."""
    h = hashlib.sha1()
    for f in sorted((REPO / "bench" / "model").glob("*.py")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return f"bench.model@{h.hexdigest()[:10]}"


def model_version() -> str:
    """bench.model@<hash of its sources>+<commit>: what a model-sourced file was chosen by."""
    return f"{model_sources()}+{git_commit()}"


def stale_note(row: dict, now: str) -> Optional[str]:
    """For a model-sourced row of `show` (tuned.explain's dict with the table's model_version and arch): a line
    saying the table was chosen by other model sources than this checkout's `now` (model_sources()), and how to
    re-derive it; None when the sources match or the row is not model-sourced. The commit after '+' does not
    count: a commit that leaves bench/model alone leaves the model's readings alone (the kernels' SASS may still
    have moved, which the hash does not see)."""
    ver = row.get("model_version")
    if row.get("source") != "model" or not ver or ver.partition("+")[0] == now:
        return None
    arch = row.get("arch") or "<arch>"
    return (f"chosen by {ver.partition('+')[0]}, not this checkout's {now}: the model has changed since, and "
            f"its pick may differ now (re-derive: python -m autotune --cost model --arch {arch} ...)")


def _kernels(plan: Plan, dev):
    """The model's kernels of the plan's head / dtype / layout on the device's arch."""
    from bench.model import kernels
    from verify_attn import build as vb
    sh, kv = plan.shape, plan.kv_dtype
    head = vb.head_key(sh.head_dim_qk, sh.head_dim_v, sh.mla, kv if kv else False)
    if head is None:
        raise ValueError(f"no CUDA kernel for shape {sh.name} with kv_dtype {kv or plan.dtype}")
    layout = "page1" if plan.page_size == 1 else "paged"
    return head, kernels.load(dev.arch, head, plan.dtype if not kv else "bf16", layout)


def difference_band(fast, cand) -> tuple[float, float]:
    """(central, low end) of cand - fast over the ranged constants: each constant at each end of its range
    alone moves both predictions together (the same device), the moves of the difference taken as
    independent across constants and summed in quadrature, as bands.band does for one prediction."""
    d0 = cand.central - fast.central
    moves = [min(cand.swings[n][0] - fast.swings[n][0], cand.swings[n][1] - fast.swings[n][1])
             for n in fast.swings if n in cand.swings]
    return d0, d0 - math.sqrt(sum(max(0.0, d0 - m) ** 2 for m in moves))


def choose(trials: list, fastest, fast_band, band_of) -> tuple:
    """(the kept candidate, the ties found, the kept candidate's band). A candidate with fewer splits than the
    fastest ties with it when the band of their difference reaches zero (some setting of the model's constants
    within their ranges makes it as fast); of the ties the fewest splits wins. Only candidates within half the
    fastest's band of it (bands.compare's window) are examined, fewest splits first, each costing one band.
    trials: tuples (config, central us, ...); band_of(trial) -> bands.Band."""
    half = (fast_band.high - fast_band.low) / 2
    window = sorted((x for x in trials if x[0].num_splits < fastest[0].num_splits and x[1] - fastest[1] < half),
                    key=lambda x: (x[0].num_splits, x[1]))
    for x in window:
        b = band_of(x)
        if difference_band(fast_band, b)[1] <= 0:
            return x, [fastest, x], b
    return fastest, [fastest], fast_band


def tune_with_model(plan: Plan, *, on_bucket=None) -> tuple[list[BucketResult], dict, list[str]]:
    """(results, per-bucket extras (band, tie note) by (ctx, tree_nodes), notes)."""
    from bench.model import bands, call, devices
    from verify_attn import build as vb

    if plan.backend != "cuda":
        raise ValueError(f"--cost model predicts the CUDA kernels only, not backend {plan.backend!r}")
    if plan.arch.name not in DEVICES:
        raise ValueError(f"--cost model has device models for {', '.join(DEVICES)}, not {plan.arch.name}")
    dev = devices.get_device(DEVICES[plan.arch.name])
    head, ks = _kernels(plan, dev)
    by_tile = {(k.tile.block_m, k.tile.block_n, k.tile.num_warps, k.tile.num_stages): k
               for k in ks if k.tile.targets(dev.arch)}
    default_tile = vb.default_tile(head, dev.arch)
    layout = "page1" if plan.page_size == 1 else "paged"
    kv = plan.kv_dtype or plan.dtype
    results, extra, notes = [], {}, []
    for b in plan.buckets:
        case = call.Case(plan.shape, b.ctx, b.tree_nodes, plan.batch, layout, plan.page_size, kv_dtype=kv)
        trials: list[tuple] = []   # (config, central us, kernel model)
        default = None
        for t in b.tiles:
            c = t.candidate.config
            km = by_tile.get((c.block_m, c.block_n, c.num_warps, c.num_stages))
            if km is None:
                notes.append(f"ctx {b.ctx} tree {b.tree_nodes}: no model of tile {c.to_dict()} on {dev.arch}")
                continue
            for s in t.splits:
                p = call.predict(km, dev, case, s)
                trials.append((c.replace(num_splits=s), p.total_us, km, p.floor_us))
            if km.tile == default_tile:
                p = call.predict(km, dev, case, t.heuristic)
                default = (c.replace(num_splits=t.heuristic), p.total_us)
        r = BucketResult(b.ctx, b.tree_nodes)
        if not trials:
            results.append(r)
            continue
        fastest = min(trials, key=lambda x: x[1])
        fb = bands.band(fastest[2], dev, case, fastest[0].num_splits)
        chosen, ties, cb = choose(trials, fastest, fb, lambda x: bands.band(x[2], dev, case, x[0].num_splits))
        r.best, r.best_us, r.floor_us = chosen[0], chosen[1], chosen[3]
        if default is not None:
            r.default_config, r.default_us = default
        r.trials = [Trial(cfg, "model", us) for cfg, us, _, _ in trials]
        note = {"band_us": [round(cb.low, 2), round(cb.high, 2)], "sensitive": cb.sensitive,
                "kernel": chosen[2].name, "candidates": len(trials)}
        if chosen is not fastest:
            note["tie"] = (f"ties with the fastest ({fastest[1]:.1f} us [{fb.low:.0f}-{fb.high:.0f}], "
                           f"{fastest[0].to_dict()}): the band of their difference reaches zero; kept the fewer "
                           "splits")
        extra[(b.ctx, b.tree_nodes)] = note
        results.append(r)
        if on_bucket is not None:
            on_bucket(b, r, note)
    return results, extra, notes


def run_model_tuning(plan: Plan, args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    con = Console()
    key = TableKey(plan.arch.device_name, plan.backend, plan.shape.num_q_heads, plan.shape.num_kv_heads,
                   plan.shape.head_dim_qk, plan.shape.head_dim_v, plan.dtype, plan.page_size, plan.shape.mla,
                   plan.kv_dtype)
    version = model_version()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=con) as prog:
        task = prog.add_task("model: reading the kernels' SASS", total=len(plan.buckets))

        def on_bucket(b, r, note):
            prog.update(task, advance=1, description=f"model: ctx {b.ctx:,} tree {b.tree_nodes}: "
                        f"{r.best_us:.1f} us [{note['band_us'][0]:.0f}-{note['band_us'][1]:.0f}]")
        try:
            results, extra, notes = tune_with_model(plan, on_bucket=on_bucket)
        except (ValueError, RuntimeError, LookupError, FileNotFoundError) as e:
            print(f"python -m autotune: error: {e}", file=sys.stderr)
            return 2
    for n in notes:
        con.print(f"[yellow]{n}[/]")
    _summary(con, results, extra)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"key": key.to_dict(), "arch": plan.arch.name, "source": "model", "model_version": version,
             "results": [{**r.to_dict(), **extra.get((r.ctx, r.tree_nodes), {})} for r in results]},
            indent=1) + "\n")
    if any(r.best is None for r in results):
        print("python -m autotune: error: some buckets have no candidate the model can read", file=sys.stderr)
        return 1
    if not args.no_export:
        try:
            path = export_table(args.export or DEFAULT_EXPORT_DIR, key, results, batch=plan.batch, source="model",
                                extra=extra,
                                meta={"model_version": version, "device_model": DEVICES[plan.arch.name],
                                      **kernel_versions_meta(plan),
                                      "date": now_iso(), "arch": plan.arch.name, "tree_kind": args.tree_shape,
                                      "versions": software_versions(),
                                      "method": "bench.model central prediction per candidate (tile x coarse split "
                                                "grid); ties within half the fastest's band keep the fewest splits; "
                                                "not measured: a measured table of this key wins at lookup"})
        except TableError as e:
            print(f"python -m autotune: error: {e}", file=sys.stderr)
            return 1
        con.print(f"exported {path}")
    return 0


def _summary(con, results: list[BucketResult], extra: dict) -> None:
    from rich.table import Table

    t = Table(title="configs chosen by the model (predictions, not measurements)")
    for col in ("ctx", "tree", "model us", "band", "floor us", "default us", "config", "note"):
        t.add_column(col, justify="left" if col in ("config", "note") else "right")
    for r in results:
        e = extra.get((r.ctx, r.tree_nodes), {})
        cfg = "-" if r.best is None else (f"splits={r.best.num_splits} bn={r.best.block_n} bm={r.best.block_m} "
                                          f"w={r.best.num_warps} st={r.best.num_stages}")
        band = "-" if "band_us" not in e else f"{e['band_us'][0]:.0f}-{e['band_us'][1]:.0f}"
        t.add_row(f"{r.ctx:,}", str(r.tree_nodes), "-" if r.best_us is None else f"{r.best_us:.1f}", band,
                  "-" if r.floor_us is None else f"{r.floor_us:.1f}",
                  "-" if r.default_us is None else f"{r.default_us:.1f}", cfg, "tie: fewest splits" if "tie" in e
                  else "")
    con.print(t)


def show(argv: Optional[list[str]] = None) -> int:
    """`python -m autotune show`: which table (measured, model) or the heuristic serves a call."""
    from verify_attn.shapes import PRESETS, get_shape
    from verify_attn.tuned import explain
    from verify_attn.tree import MAX_CHECKED_NODES
    from verify_attn.utils import dash_values, parse_ctx

    ap = argparse.ArgumentParser(prog="python -m autotune show",
                                 description="Which tuned config serves a call, and where it comes from "
                                             "(lookup order: measured > model > heuristic).")
    ap.add_argument("--device", default="NVIDIA H200", help="GPU name as torch reports it (default NVIDIA H200)")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--shape", default="kimi-k2-tp8", help=f"head-shape preset: {', '.join(PRESETS)}")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--kv-dtype", default="", choices=("", "fp8_e4m3", "fp8_mla656"))
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--ctx", default="185k", help="KV tokens per request (prefix + tree), k = 1,000")
    ap.add_argument("--tree", type=int, default=16, help="tree nodes per request")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print JSON")
    a = dash_values(ap).parse_args(argv)
    try:
        sh = get_shape(a.shape)
        try:
            ctxs = parse_ctx(a.ctx)
        except ValueError as e:
            raise ValueError(f"--ctx: {e}") from None
        for flag, v, lo, hi in (("--tree", a.tree, 1, MAX_CHECKED_NODES), ("--batch", a.batch, 1, 65_535),
                                ("--page-size", a.page_size, 1, 128)):
            if not lo <= v <= hi:
                raise ValueError(f"{flag} must be in {lo}..{hi}, got {v}")
    except (ValueError, KeyError) as e:
        print(f"{ap.prog}: error: {e}", file=sys.stderr)
        return 2
    key = TableKey(a.device, a.backend, sh.num_q_heads, sh.num_kv_heads, sh.head_dim_qk, sh.head_dim_v, a.dtype,
                   a.page_size, sh.mla, a.kv_dtype)
    rows = [{"ctx": c, "tree_nodes": a.tree, **explain(key, c, a.tree, a.batch)} for c in ctxs]
    now = model_sources() if any(r["source"] == "model" for r in rows) else None
    for r in rows:
        note = stale_note(r, now) if now else None
        if note:
            r["stale"] = note
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        where = r["file"] or r.get("why", "")
        cfg = "" if r["config"] is None else " " + ", ".join(f"{k}={v}" for k, v in sorted(r["config"].items()))
        ver = "; ".join(x for x in (r.get("model_version"), r.get("kernel_versions") and "over kernels " + ", ".join(
            f"v{v}" for v in r["kernel_versions"])) if x)
        ver = f" ({ver})" if ver else ""
        print(f"{key.filename()}: ctx {r['ctx']:,} tree {r['tree_nodes']}: {r['source']}{ver}{cfg}\n    {where}")
        if r.get("stale"):
            print(f"    {r['stale']}")
    return 0
