"""python -m autotune: tune kernel configs per context length (and tree size) and export them.

    python -m autotune --dry-run --backend cuda --arch sm_120a --ctx 4k,185k --json plan.json
    python -m autotune --backend cuda --resume            # on a GPU: tune, cache, export
    python -m autotune --cost model --arch sm_120a --tree 1,16,64   # no GPU: the model's choice, 'source: model'
    python -m autotune show --device "NVIDIA H200" --ctx 185k --tree 16   # which source serves a call
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Optional

from verify_attn.shapes import PRESETS, HeadShape, custom_shape, get_shape
from verify_attn.tree import check_tree_sizes
from verify_attn.utils import dash_values, parse_ctx, parse_int_list

from .plan import Plan, make_plan

DTYPES = ("bf16", "fp16")
PROG = "python -m autotune"


def error(msg: object) -> None:
    """A user error: one line on stderr, `python -m autotune: error: ...` (bench.verify's form)."""
    print(f"{PROG}: error: {msg}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="cuda", choices=("cuda", "triton"), help="backend to tune (default cuda)")
    ap.add_argument("--shape", default="kimi-k2-tp8", help=f"head-shape preset: {', '.join(PRESETS)}")
    for f in ("hq", "hkv", "dqk", "dv"):
        ap.add_argument(f"--{f}", type=int, help="explicit head shape (all four), instead of --shape")
    ap.add_argument("--ctx", default="1k,4k,16k,64k,128k,185k,256k",
                    help="context buckets (prefix tokens; k = 1,000): 185k | 4k,16k | 1k..256k (log-spaced)")
    ap.add_argument("--tree", default="1,8,16,32,64", help="tree-size buckets (nodes per request)")
    ap.add_argument("--tree-shape", default="ddtree", choices=("ddtree", "chain", "star"),
                    help="tree used while tuning (ddtree = bushy, like a DDTree budget)")
    ap.add_argument("--batch", type=int, default=1, help="requests per call while tuning (default 1)")
    ap.add_argument("--layout", default="page1", choices=("page1", "paged"))
    ap.add_argument("--page-size", type=int, default=None, help="page size for --layout paged (default 64)")
    ap.add_argument("--dtype", default="bf16", choices=DTYPES)
    ap.add_argument("--kv-dtype", default="", choices=("", "fp8_e4m3", "fp8_mla656"),
                    help="tune for an fp8 KV cache (its own tuned-config files and cache keys); default: q's dtype")
    ap.add_argument("--arch", default=None, help="plan for this arch (sm_90a, sm_120a); default: the GPU at hand")
    ap.add_argument("--build-report", default=None, metavar="PATH|auto",
                    help="JSON from `python -m verify_attn.build --report --json PATH`: ptxas registers/smem/"
                         "spills used in pruning; 'auto' runs that build for the target arch (needs nvcc; "
                         "minutes the first time, cached by source hash); default: none")
    ap.add_argument("--dry-run", action="store_true", help="list pruned candidates per bucket; no GPU needed")
    ap.add_argument("--json", default=None, metavar="PATH", help="write the plan (dry run) or the results as JSON")
    ap.add_argument("--export", default=None, metavar="DIR",
                    help="folder for the tuned-config files (default autotune/configs/)")
    ap.add_argument("--no-export", action="store_true", help="tune into the cache only")
    ap.add_argument("--resume", action="store_true", help="skip buckets already in the cache")
    ap.add_argument("--cache", default=None, metavar="PATH", help="tuning cache (default ~/.cache/verify_attn/"
                    "autotune_cache.json or $VERIFY_ATTN_AUTOTUNE_CACHE)")
    ap.add_argument("--reps", type=int, default=50, help="timed samples per config (median)")
    ap.add_argument("--max-seconds", type=float, default=2.0, help="timing cap per config")
    ap.add_argument("--cost", default="measure", choices=("measure", "model"),
                    help="measure: time every candidate on the GPU at hand (default); model: choose by bench.model's "
                         "predictions, no GPU needed (needs --arch), exported as a 'source: model' table that a "
                         "measured table of the same key outranks")
    ap.add_argument("--versions", default=None, metavar="v0,v1,...",
                    help="tune over these CUDA kernel versions only (default: every compiled tile); e.g. v0,v1,v2 "
                         "keeps out kernel v3, which has not run on a GPU yet. The exported file records them")
    ap.add_argument("--top-tiles", type=int, default=2, help="tiles that get the split sweep")
    ap.add_argument("--refine-rounds", type=int, default=2, help="coarse-to-fine rounds over num_splits")
    return dash_values(ap)


def parse_versions(text: Optional[str], backend: str) -> Optional[frozenset[int]]:
    """--versions "v0,v1,v2" (or "0,1,2") -> frozenset({0, 1, 2}); None when not given."""
    if text is None:
        return None
    if backend != "cuda":
        raise ValueError(f"--versions picks the CUDA backend's kernel versions, not backend {backend!r}'s tiles")
    out = set()
    for part in filter(None, (x.strip() for x in text.split(","))):
        v = part[1:] if part[:1] in "vV" else part
        if not v.isdigit():
            raise ValueError(f"--versions: {part!r} is not a kernel version (v0, v1, v2, v3, ...)")
        out.add(int(v))
    if not out:
        raise ValueError("--versions: give at least one kernel version, e.g. v1 or v0,v1,v2")
    from verify_attn.build import TILES
    known = sorted({t.kernel_version for tiles in TILES.values() for t in tiles})
    unknown = sorted(out - set(known))
    if unknown:  # (a typo would otherwise prune every tile and fail later, bucket by bucket)
        raise ValueError(f"--versions: no CUDA kernel {', '.join(f'v{v}' for v in unknown)} is built; the kernels are "
                         + ", ".join(f"v{v}" for v in known))
    return frozenset(out)


def resolve_shape(args: argparse.Namespace) -> HeadShape:
    explicit = [getattr(args, f) for f in ("hq", "hkv", "dqk", "dv")]
    if any(v is not None for v in explicit):
        if any(v is None for v in explicit):
            raise ValueError("--hq, --hkv, --dqk and --dv go together")
        return custom_shape(*explicit)
    return get_shape(args.shape)


def resolve_page_size(args: argparse.Namespace) -> int:
    if args.layout == "page1":
        if args.page_size not in (None, 1):
            raise ValueError(f"--page-size {args.page_size} needs --layout paged")
        return 1
    ps = 64 if args.page_size is None else args.page_size
    if not 2 <= ps <= 128:
        raise ValueError(f"--page-size must be in 2..128 for --layout paged, got {ps}")
    return ps


def load_report(path: Optional[str], arch: Optional[str]) -> Optional[list[dict]]:
    if path is None:
        return None
    if path == "auto":
        from dataclasses import asdict

        from verify_attn import build as vb
        if arch is None:
            raise ValueError("--build-report auto needs --arch (or a GPU to take it from)")
        return [asdict(r) for r in vb.build_report([arch], log=lambda *a, **k: None)]
    try:
        rows = json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"--build-report {path}: {e.strerror}") from None
    except ValueError as e:
        raise ValueError(f"--build-report {path}: not JSON ({e})") from None
    if isinstance(rows, dict):  # tolerate {"kernels": [...]}
        rows = rows.get("kernels", [])
    if not isinstance(rows, list):
        raise ValueError(f"build report {path} must be a JSON list of kernel rows")
    return rows


def print_plan(plan: Plan) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    a = plan.arch
    con.print(f"[bold]{plan.backend}[/] on [bold]{a.name}[/] ({a.device_name}: {a.num_sms} SMs, "
              f"{a.smem_per_block} B smem/block, {a.max_regs_per_thread} regs/thread); shape {plan.shape.name} "
              f"{plan.shape.key()}; space: {plan.origin}; build report: {plan.report_path or 'none'}")
    if plan.rejected:
        con.print(f"pruned before timing ({len(plan.rejected)} tiles):")
        for cfg, why in plan.rejected:
            con.print(f"  bn={cfg.block_n} bm={cfg.block_m} w={cfg.num_warps} st={cfg.num_stages}: {why}")
    sources = sorted({str(t.candidate.resources.get("source")) for b in plan.buckets for t in b.tiles})
    con.print(f"resources from: {', '.join(sources) or '-'}")
    for b in plan.buckets:
        t = Table(title=f"ctx {b.ctx:,} tokens, tree {b.tree_nodes} nodes ({b.rows} rows): "
                        f"{b.num_candidates} candidates", title_justify="left")
        for col in ("block_n", "block_m", "warps", "stages", "smem B", "regs"):
            t.add_column(col, justify="right")
        t.add_column("num_splits (h = heuristic)")
        for tile in b.tiles:
            r = tile.candidate.resources
            regs = r.get("registers") or r.get("regs_estimate")
            splits = ", ".join(f"{s}h" if s == tile.heuristic else str(s) for s in tile.splits)
            c = tile.candidate.config
            t.add_row(str(c.block_n), str(c.block_m), str(c.num_warps), str(c.num_stages), f"{r.get('smem_bytes'):,}",
                      "?" if regs is None else str(regs), splits)
        con.print(t)
        if b.row_rejected:
            con.print(f"  also pruned for this tree size: {len(b.row_rejected)} tiles wider than the rows need")


def tuning_fit_error(plan: Plan, tree_shape: str, device: Optional[str] = None) -> Optional[str]:
    """The refusal, with the figure, of a tuning run whose largest bucket cannot fit the free memory of the GPU it
    runs on (bench.core.memory: bench.verify's estimate, the cold-L2 input sets and the float64 reference); None
    when it fits, or when there is no GPU here (the run says so itself)."""
    import torch
    from bench.core.memory import available_bytes, fit_error, sweep_bytes
    if device is None:
        if not torch.cuda.is_available():
            return None
        device = "cuda"
    ctxs, trees = sorted({b.ctx for b in plan.buckets}), sorted({b.tree_nodes for b in plan.buckets})
    need, where = sweep_bytes(plan.shape, ctxs, trees, [(f"page {plan.page_size}", plan.page_size)], plan.batch,
                              tree_shape, 2, device, plan.arch.l2_bytes)
    return fit_error(where, need, available_bytes(device), device, "inputs and the float64 reference",
                     "lower --ctx, --tree or --batch")


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["show"]:
        from .model_cost import show
        return show(argv[1:])
    args = build_parser().parse_args(argv)
    if args.cost == "model" and args.arch is None and not args.dry_run:
        error("--cost model needs --arch sm_90a or sm_120a (the device model to predict on)")
        return 2
    try:
        shape = resolve_shape(args)
        page_size = resolve_page_size(args)
        try:
            ctxs = parse_ctx(args.ctx)
        except ValueError as e:
            raise ValueError(f"--ctx: {e}") from None
        trees = parse_int_list(args.tree, "--tree")
        check_tree_sizes(trees)
        for flag, v, lo in (("--batch", args.batch, 1), ("--reps", args.reps, 1), ("--top-tiles", args.top_tiles, 1),
                            ("--refine-rounds", args.refine_rounds, 0)):
            if v < lo:
                raise ValueError(f"{flag} must be >= {lo}, got {v}")
        if not args.max_seconds > 0:
            raise ValueError(f"--max-seconds must be > 0, got {args.max_seconds}")
        for flag, path in (("--json", args.json), ("--cache", args.cache)):   # before minutes of tuning
            if path and not Path(path).resolve().parent.is_dir():
                raise ValueError(f"{flag} {path}: the folder {Path(path).resolve().parent} does not exist")
        arch_name = args.arch
        if arch_name is None and args.build_report == "auto":
            import torch
            if torch.cuda.is_available():
                from .space import arch_of_device
                arch_name = arch_of_device(torch.cuda.current_device()).name
        report = load_report(args.build_report, arch_name)
    except (ValueError, OSError, RuntimeError) as e:
        error(e)
        return 2

    try:
        plan = make_plan(args.backend, shape, arch_name=args.arch, ctxs=ctxs, trees=trees, dtype=args.dtype,
                         page_size=page_size, batch=args.batch, report=report, report_path=args.build_report,
                         kv_dtype=args.kv_dtype, versions=parse_versions(args.versions, args.backend))
    except (ValueError, RuntimeError) as e:
        error(e)
        return 2

    if args.dry_run:
        print_plan(plan)
        if args.json:
            Path(args.json).write_text(json.dumps(plan.to_json(), indent=1) + "\n")
            print(f"plan written to {args.json}")
        empty = [b for b in plan.buckets if not b.tiles]
        if empty:
            error(f"no candidate fits {plan.arch.name} for {len(empty)} buckets")
            return 1
        return 0

    if args.cost != "model":   # the model allocates nothing; a measured run makes inputs as bench.verify does
        why = tuning_fit_error(plan, args.tree_shape)
        if why:
            error(why)
            return 2

    t0 = time.perf_counter()
    if args.cost == "model":
        from .model_cost import run_model_tuning
        rc = run_model_tuning(plan, args)
    else:
        from .run import run_tuning
        rc = run_tuning(plan, args)
    print(f"done in {time.perf_counter() - t0:.0f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
