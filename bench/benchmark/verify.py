"""python -m bench.verify: tree-verify attention against the roofline floor and the serial baseline.

On a GPU: every backend is checked against the float64 reference once (a wrong
kernel is reported as wrong, never timed), then timed with cold L2 (rotating
input sets larger than 2x L2) on a real serving-pool layout (shuffled slots or
pages, NaN in unused ones); median with p20/p80. Without a GPU: the counted
bytes/FLOPs and the floors of the reference devices for every requested shape,
plus the float64 reference timed on the CPU at a capped context (labelled).

Context lengths: k means 1,000 tokens (185k = 185,000 committed prefix tokens
per request; the tree's own nodes come on top).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from bench.core import roofline as rl
from bench.core.inputs import ALLOC_MODES, TREE_SHAPES, make_trees
from bench.core.measure import Row, Timer, run_combo, run_cpu_reference
from bench.core.memory import available_bytes, fit_error, point_bytes, sweep_bytes  # noqa: F401
from bench.core.timing import Timing, time_cuda
from verify_attn import device as vdevice
from verify_attn.backends.cuda import split_pdl
from verify_attn.fp8 import kv_row_bytes
from verify_attn.shapes import PRESETS, HeadShape, custom_shape, get_shape
from verify_attn.tree import MAX_CHECKED_NODES, check_tree_sizes
from verify_attn.utils import dash_values, flag_value, parse_ctx, parse_int_list, parse_tokens, usage_error

REPO = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO / "bench" / "results"
NOT_TIMED_ON_GPU = ("reference", "cuda-emu")   # the float64 reference and the CPU emulation
BASELINE = "triton-serial"
CPU_CTX_CAP = 4000  # the float64 reference on CPU beyond this takes seconds per call: cap, and say so
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
KV_DTYPE_CHOICES = ("bf16", "fp16", "fp32", "fp8_e4m3", "fp8_mla656")
MAX_TREE_NODES = MAX_CHECKED_NODES  # 256: the largest tree the kernels are checked at (autotune's limit too)
MAX_BATCH = 65_535     # the CUDA kernels launch one grid z per request (CUDA's grid z limit)
MAX_KV_LEN = 2**31 - 1  # the kernels read int32 KV indices and lengths


def resolve_kv_dtype(a: argparse.Namespace, shape: HeadShape) -> str:
    """The cache's storage format: --kv-dtype, or --dtype when not given; fp8 needs a 16-bit q, a 16/32-bit
    cache has q's dtype, fp8_mla656 needs the MLA 576/512 head (ValueError naming the flag)."""
    kv = getattr(a, "kv_dtype", None) or a.dtype
    if kv in ("fp8_e4m3", "fp8_mla656"):
        if a.dtype not in ("bf16", "fp16"):
            raise ValueError(f"--kv-dtype {kv} needs --dtype bf16 or fp16 (q), got {a.dtype}")
        if kv == "fp8_mla656" and not (shape.mla and shape.head_dim_qk == 576 and shape.head_dim_v == 512
                                       and shape.num_kv_heads == 1):
            raise ValueError(f"--kv-dtype fp8_mla656 is the MLA 576/512 row with one KV head; shape {shape.name} is "
                             f"{shape.num_q_heads}x{shape.num_kv_heads} {shape.head_dim_qk}/{shape.head_dim_v}")
    elif kv != a.dtype:
        raise ValueError(f"--kv-dtype {kv} differs from --dtype {a.dtype}: a 16/32-bit cache has q's dtype")
    return kv


# ---------------------------------------------------------------- arguments

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.verify", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ctx", default="185k", help="prefix lengths: 185k | 1.4k | 4k,16k,64k,185k | 1k..256k "
                    "(log-spaced); k = 1,000 tokens (default 185k)")
    ap.add_argument("--shape", default="kimi-k2-tp8", help=f"head-shape preset: {', '.join(PRESETS)}")
    for n in ("hq", "hkv", "dqk", "dv"):
        ap.add_argument(f"--{n}", type=int, help="explicit head shape (all four together override --shape)")
    ap.add_argument("--tree", default="16", help="tree node counts, comma-separated (default 16)")
    ap.add_argument("--tree-shape", default="ddtree", choices=sorted(TREE_SHAPES),
                    help="chain | ddtree (bushy, DDTree-like, fixed seed) | star")
    ap.add_argument("--batch", type=int, default=1, help="requests per call (each with the same ctx)")
    ap.add_argument("--layout", default="page1", help="page1 and/or paged, comma-separated")
    ap.add_argument("--page-size", type=int, default=64, help="page size of the paged layout (default 64)")
    ap.add_argument("--alloc", default="shuffled", choices=ALLOC_MODES,
                    help="slot/page placement: shuffled (churned pool, default) | contiguous (a sorted free list) | "
                         "fragmented (shuffled runs); recorded in every row")
    ap.add_argument("--backend", default=None, help="comma-separated backends; cuda@v0 / cuda@v1 / cuda@v2 pin the CUDA "
                    "kernel version, cuda@m32n16w8s8 one compiled tile (block_m, block_n, warps, stages; "
                    "`python -m verify_attn.build` lists them), either with ':N' a fixed split count (cuda@v3:15 beside "
                    "cuda@v3: the split heuristic's A/B) (default: all available; "
                    "on GPU the reference and cuda-emu are not timed; sglang-extend joins when SGLang is installed, "
                    "flashinfer-mla when FlashInfer is (chains only: its MLA wrapper takes no tree mask), fa3-mla (FA3 along "
                    "SGLang's Hopper tree-verify path) and flashmla (its dense decode over the prefix + a torch tree "
                    "part) from their packages or the carried bundle (bench/benchmark/peers.py, bench/benchmark/peer_bundle.py))")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="q (and 16-bit cache) dtype")
    ap.add_argument("--kv-dtype", default=None, choices=KV_DTYPE_CHOICES,
                    help="KV cache storage: fp8_e4m3 (1 B/value, per-tensor scales), fp8_mla656 (FlashMLA's 656-B "
                         "MLA row), or the q dtype (default); sets the bytes per row and the floors")
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON")
    ap.add_argument("--csv", metavar="PATH", help="write the results as CSV")
    ap.add_argument("--plot", metavar="PATH.png", help="GB/s and fraction of floor vs context length")
    ap.add_argument("--reps", type=int, default=50, help="timing samples per row (default 50)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--max-seconds", type=float, default=10.0, help="time cap per row's sampling (>= 5 samples)")
    ap.add_argument("--budget-s", type=float, default=None, help="total time budget: later rows are skipped")
    ap.add_argument("--longest-first", action="store_true", help="run the longest context first (default: "
                    "shortest first), so that a budget spent late skips the short rows")
    ap.add_argument("--serial-max-ctx", default=None, help=f"do not time {BASELINE} above this ctx (it is slow)")
    ap.add_argument("--cpu-ctx-cap", default=str(CPU_CTX_CAP), help="without a GPU, time the CPU reference only "
                    f"up to this ctx (default {CPU_CTX_CAP})")
    ap.add_argument("--no-ceilings", action="store_true", help="on GPU, skip measuring copy/MMA ceilings")
    ap.add_argument("--no-graph", action="store_true", help="time eager launches, not a CUDA graph")
    ap.add_argument("--results-dir", default=str(RESULTS_DIR), help="where the run is appended (verify_runs.jsonl)")
    ap.add_argument("--no-save", action="store_true", help="do not append to the results folder")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    ap.add_argument("--no-model", action="store_true", help="skip the SASS-model predictions (python -m bench.model) "
                    "of the cuda backend for the reference devices")
    return dash_values(ap)


# names bench.benchmark.baselines.outside_baselines() gives where the package is installed
OUTSIDE_BASELINES = ("sglang-extend", "flashinfer-mla", "fa3-mla", "flashmla")
OURS = ("cuda", "triton")   # our kernels (any cuda@ pin): a peer's row gives its time over the best of these


def _known_backends_only(names: list[str], outside: dict) -> list[str]:
    """`names` if every one is a verify_attn backend or an outside baseline, else ValueError naming --backend
    (checked with or without a GPU: a typo must not be silently ignored)."""
    from verify_attn import known_backends
    from verify_attn.backends.cuda import PINNED_NAMES, PINNED_TILE_RE, split_pin
    known = known_backends() + sorted(set(outside) | set(OUTSIDE_BASELINES))

    def pinned(b: str) -> bool:  # cuda@v1 (a kernel version), cuda@m32n16w8s8 (one tile), either + ":N" (N splits)
        if not b.startswith("cuda@"):
            return False
        try:
            name, _ = split_pin(b[5:])
        except ValueError as e:   # a malformed split count
            raise ValueError(f"--backend: {e}") from None
        return name in PINNED_NAMES or PINNED_TILE_RE.fullmatch(name) is not None
    unknown = [b for b in names if b not in known and not pinned(b)]
    if unknown:
        raise ValueError(f"--backend: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    return names


def resolve_shape(a: argparse.Namespace) -> HeadShape:
    explicit = [a.hq, a.hkv, a.dqk, a.dv]
    if any(v is not None for v in explicit):
        if any(v is None for v in explicit):
            raise ValueError("--hq, --hkv, --dqk and --dv must be given together")
        return custom_shape(a.hq, a.hkv, a.dqk, a.dv)
    return get_shape(a.shape)


def parse_layouts(spec: str, page_size: int) -> list[tuple[str, int]]:
    out = []
    for name in [s.strip() for s in spec.split(",") if s.strip()]:
        if name == "page1":
            out.append(("page1", 1))
        elif name == "paged":
            if not 2 <= page_size <= 128:
                raise ValueError(f"--page-size must be in 2..128 for the paged layout, got {page_size}")
            out.append(("paged", page_size))
        else:
            raise ValueError(f"unknown layout {name!r}: use page1 and/or paged")
    if not out:
        raise ValueError("--layout names no layout")
    return out


# ---------------------------------------------------------------- environment

def git_commit() -> str:
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else "unknown"
    except Exception:
        return "unknown"


def versions() -> dict:
    v = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import triton
        v["triton"] = triton.__version__
    except Exception:
        v["triton"] = None
    return v


def gpu_devices(measure: bool) -> tuple[list[rl.Device], Optional[str], list[str]]:
    """Devices whose floors are reported, the one `frac_of_floor` refers to, and notes."""
    devs = list(rl.REFERENCE_DEVICES)
    notes: list[str] = []
    if not torch.cuda.is_available():
        return devs, None, notes
    props = vdevice.query(torch.cuda.current_device())   # cuda-python: SMs, L2
    name = props.name
    l2_mb = props.l2_bytes / 1e6
    known = rl.match_reference(name)
    primary = known.name if known else None
    if known is not None and known not in devs:   # a known part that is not a reference device (an H100)
        devs.append(known)
    if measure:
        try:
            from bench.core.ceilings import get_ceilings
            c = get_ceilings()
            dev = rl.device_from_ceilings(name, c, props.sm_count, l2_mb)
            devs.append(dev)
            primary = dev.name
        except Exception as e:  # a failed measurement falls back to the datasheet floor
            notes.append(f"ceilings not measured ({type(e).__name__}: {e}); floors use datasheet values")
    if primary is None:
        notes.append(f"{name} is not a reference device and no ceilings were measured: no fraction of floor")
    return devs, primary, notes


def l2_bytes() -> int:
    return vdevice.query(torch.cuda.current_device()).l2_bytes


# ---------------------------------------------------------------- what a run allocates

def check_limits(a: argparse.Namespace, shape: HeadShape, ctxs: list[int], nodes_list: list[int],
                 layouts: list[tuple[str, int]], dtype: torch.dtype, alloc_ctxs: list[int],
                 device: Optional[str], l2: Optional[int] = None) -> None:
    """Refuse, before anything is allocated, sizes the kernels do not take and runs that cannot fit the memory
    of the device they allocate on (ValueError naming the flag and the figure). `alloc_ctxs`: the contexts
    whose inputs are really made (on the CPU only those timed by the reference)."""
    check_tree_sizes(nodes_list)
    if a.batch > MAX_BATCH:
        raise ValueError(f"--batch {a.batch}: at most {MAX_BATCH:,} requests per call (the CUDA kernels' grid)")
    if max(ctxs) + max(nodes_list) > MAX_KV_LEN:
        raise ValueError(f"--ctx {max(ctxs):,}: a request's KV length must stay below 2^31 tokens (int32 indices)")
    if not alloc_ctxs:
        return
    need, where = sweep_bytes(shape, alloc_ctxs, nodes_list, layouts, a.batch, a.tree_shape, rl.dtype_bytes(dtype),
                              device, l2)
    why = fit_error(where, need, available_bytes(device), device, "inputs and the float64 reference",
                    f"lower --ctx, --tree or --batch{'' if device else ' (or --cpu-ctx-cap)'}")
    if why:
        raise ValueError(why)


# ---------------------------------------------------------------- the sweep

def sweep(a: argparse.Namespace, *, kernel_device: Optional[str] = None, timer: Optional[Timer] = None,
          l2: Optional[int] = None) -> dict:
    """Run the whole sweep; returns the JSON payload.

    Backends are checked and timed on `kernel_device` ("cuda" when a GPU is there);
    without one only the counts, the floors and the CPU reference are produced.
    Tests pass kernel_device="cpu", a CPU timer and a small `l2` to run the GPU path's logic here.
    """
    shape = resolve_shape(a)
    ctxs = sorted(_flag(parse_ctx, a.ctx, "--ctx"), reverse=getattr(a, "longest_first", False))
    nodes_list = parse_int_list(a.tree, "--tree")
    layouts = parse_layouts(a.layout, a.page_size)
    alloc = getattr(a, "alloc", "shuffled")
    dtype = DTYPES[a.dtype]
    kv_dtype = resolve_kv_dtype(a, shape)
    fp8_kv = kv_dtype if kv_dtype.startswith("fp8") else ""
    if a.batch < 1:
        raise ValueError(f"--batch must be >= 1, got {a.batch}")
    if a.reps < 1:
        raise ValueError(f"--reps must be >= 1 (timing samples per row), got {a.reps}")
    if a.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {a.warmup}")
    if not a.max_seconds > 0:
        raise ValueError(f"--max-seconds must be > 0, got {a.max_seconds}")
    if a.budget_s is not None and not a.budget_s > 0:
        raise ValueError(f"--budget-s must be > 0, got {a.budget_s}")
    serial_cap = _flag(parse_tokens, a.serial_max_ctx, "--serial-max-ctx") if a.serial_max_ctx else None
    cpu_cap = _flag(parse_tokens, a.cpu_ctx_cap, "--cpu-ctx-cap")
    kdev = kernel_device or ("cuda" if torch.cuda.is_available() else None)
    check_limits(a, shape, ctxs, nodes_list, layouts, dtype,
                 ctxs if kdev else sorted({min(c, cpu_cap) for c in ctxs}), kdev,
                 l2 or (l2_bytes() if kdev == "cuda" else None))
    asked = [s.strip() for s in a.backend.split(",") if s.strip()] if a.backend else []
    if a.backend is not None and not asked:
        raise ValueError(f"--backend names no backend: {a.backend!r}")
    gpu = torch.cuda.is_available()
    devices, primary, notes = gpu_devices(measure=gpu and not a.no_ceilings)
    outside: dict = {}
    if kdev:
        from bench.benchmark.baselines import outside_baselines
        from verify_attn import available_backends
        outside, bnotes = outside_baselines(asked or None)   # only what was asked is looked for
        notes += bnotes
        if asked:  # only what was asked: importing "cuda" builds it, which takes minutes the first time
            backends = _known_backends_only(asked, outside)
        else:
            backends = [b for b in available_backends() if b not in NOT_TIMED_ON_GPU] + sorted(
                n for n, f in outside.items() if not getattr(f, "unavailable", None))
        # the baseline first, so that a time budget spent later still leaves speedups to compute
        backends.sort(key=lambda n: n != BASELINE)
    else:
        backends = ["reference"]
        if asked and _known_backends_only(asked, {}) != ["reference"]:
            notes.append(f"no GPU: only the float64 reference is timed (on CPU); --backend {a.backend} ignored")
            peers = [n for n in asked if n in OUTSIDE_BASELINES]
            if peers:
                from bench.benchmark.baselines import outside_baselines
                _, bnotes = outside_baselines(peers)
                for n in peers:
                    why = next((x.split(": ", 1)[1] for x in bnotes if x.startswith(n + ": ")), "")
                    notes.append(f"{n}: unavailable here: needs a CUDA GPU" + (f"; {why}" if why else ""))
        notes.append(f"no GPU: the CPU reference is timed up to ctx {a.cpu_ctx_cap}; longer rows show the counts "
                     "and floors only")
    t_start = time.perf_counter()

    def skip(name: str, ctx: int) -> Optional[str]:
        if a.budget_s is not None and time.perf_counter() - t_start > a.budget_s:
            return f"time budget of {a.budget_s:.0f} s spent"
        if name == BASELINE and serial_cap is not None and ctx > serial_cap:
            return f"{BASELINE} not timed above ctx {serial_cap} (--serial-max-ctx)"
        return None

    def cuda_timer(fns: list, cold: bool) -> Timing:
        return time_cuda(fns, l2_cold=cold, reps=a.reps, warmup=a.warmup, max_seconds=a.max_seconds,
                         use_graph=not a.no_graph)

    combos = [(c, n, lay) for c in ctxs for n in nodes_list for lay in layouts]
    if not kdev:  # one labelled CPU timing at the cap when every requested ctx is above it
        extra = sorted({(cpu_cap, n, lay) for _, n, lay in combos if all(c > cpu_cap for c in ctxs)})
        combos += extra
    rows: list[Row] = []
    with _progress(a.quiet, total=len(combos) * len(backends)) as tick:
        for ctx, nodes, layout in combos:
            trees = make_trees(nodes, a.tree_shape, a.batch)
            counts = rl.count_shape(shape, [ctx] * a.batch, trees, elem_bytes=rl.dtype_bytes(dtype),
                                    page_size=layout[1], kv_dtype=fp8_kv or None)
            floors = {d.name: rl.floor(counts, d) for d in devices}

            def base(name: str) -> Row:
                return Row(name, ctx, nodes, layout[0], layout[1], counts, floors, primary=primary,
                           extra={"alloc": alloc, "kv_dtype": kv_dtype})

            if kdev:
                rows += run_combo(shape, ctx, trees, layout, dtype, backends, outside, base, device=kdev,
                                  l2=l2 or (l2_bytes() if kdev == "cuda" else int(50e6)), timer=timer or cuda_timer,
                                  skip=skip, tick=tick, alloc=alloc, kv_dtype=fp8_kv)
            else:
                r = base("reference")
                if ctx <= cpu_cap and skip("reference", ctx) is None:
                    r = run_cpu_reference(shape, ctx, trees, layout, dtype, r, a.reps, a.warmup, alloc=alloc,
                                          kv_dtype=fp8_kv)
                else:
                    r.note = f"counted only: CPU timing capped at ctx {cpu_cap}"
                rows.append(r)
                tick()
    _speedups(rows)
    _peer_ratios(rows, outside)
    model = [] if a.no_model else model_rows(shape, combos, dtype, a.batch, notes, kv_dtype, a.tree_shape)
    return {
        "device": torch.cuda.get_device_name() if gpu else None,
        "commit": git_commit(), "date": _dt.datetime.now().isoformat(timespec="seconds"), "versions": versions(),
        "shape": shape.to_dict(), "dtype": a.dtype, "kv_dtype": kv_dtype,
        "kv_row_bytes": kv_row_bytes(kv_dtype, shape.head_dim_qk, shape.head_dim_v, shape.mla), "tree_shape": a.tree_shape, "alloc": alloc, "batch": a.batch,
        "devices": [d.to_dict() for d in devices], "floor_device": primary, "notes": notes,
        "argv": sys.argv[1:], "split_pdl": split_pdl(), "results": [r.to_dict() for r in rows], "model": model,
        "peers": {n: getattr(f, "peer", None) or {"why": getattr(f, "unavailable", None)} for n, f in outside.items()},
    }


_flag = flag_value   # parse(value), its ValueError naming the flag (verify_attn.utils; bench.model's too)


def model_rows(shape: HeadShape, combos: list, dtype: torch.dtype, batch: int, notes: list[str],
               kv_dtype: Optional[str] = None, tree_shape: str = "ddtree") -> list[dict]:
    """The SASS model's prediction of the cuda backend's default config for every (ctx, tree, layout), on
    each modelled device: labelled "model", never a measurement."""
    if dtype not in (torch.bfloat16, torch.float16):
        return []
    try:
        from bench.benchmark import measured as bm
        from bench.model import predict
        from bench.model.devices import DEVICES, device_for_gpu
    except ImportError as e:
        notes.append(f"model predictions skipped ({e})")
        return []
    # the reference devices, the GPU at hand where a model describes it (an H100), and any modelled device with
    # committed results (so that its measurements have a reading beside them)
    here = device_for_gpu(torch.cuda.get_device_name()) if torch.cuda.is_available() else None
    have = bm.measured_devices()
    dks = list(dict.fromkeys([*DEVICES, *([here.key] if here else []), *have]))
    out, can_read = [], True
    for ctx, nodes, (lay, ps) in sorted(set(combos)):
        preds = {}
        for dk in dks if can_read else ():
            try:
                p = predict(dk, ctx=ctx, tree_nodes=nodes, shape=shape, layout=lay, page_size=ps, batch=batch,
                            kv_dtype=kv_dtype or ("bf16" if dtype == torch.bfloat16 else "fp16"))
            except RuntimeError as e:  # no toolkit or SASS tools: say so once (the measurements still show)
                notes.append(f"model predictions skipped ({e})")
                can_read, p = False, None
            if p is not None:
                preds[dk] = {**p, "frac_of_floor": p["floor_us"] / p["us"]}
        out.append({"ctx": ctx, "tree_nodes": nodes, "layout": lay, "page_size": ps, "source": "model",
                    "predictions": preds})
    _beside_measurements(out, shape, dtype, batch, kv_dtype, tree_shape, notes, have)
    return [m for m in out if m["predictions"] or any(m["measured"].values())]


def _beside_measurements(model: list[dict], shape: HeadShape, dtype: torch.dtype, batch: int,
                         kv_dtype: Optional[str], tree_shape: str, notes: list[str], have: dict[str, str]) -> None:
    """Each model row gets the last committed measurement of its shape per device (bench/results/, every kernel
    measured there: bench.benchmark.measured) and each prediction its kernel and --validate's verdict on that kernel.
    `have`: bm.measured_devices(), which the caller read once."""
    from bench.benchmark import measured as bm
    if not model:
        return
    dt = "bf16" if dtype == torch.bfloat16 else "fp16"
    kv = kv_dtype or dt
    verdicts = bm.verdicts() if any(m["predictions"] for m in model) else {}
    if not verdicts and any(m["predictions"] for m in model):
        notes.append("the model's kernels could not be checked against bench/results/ here (bench.model --validate "
                     "needs the CUDA toolkit and SASS tools): every model reading is not validated")
    for m in model:
        m["measured"] = bm.last_measured(shape.to_dict(), dt, kv, m["ctx"], m["tree_nodes"], m["layout"],
                                         m["page_size"], batch, tree_shape)
        for dk, p in m["predictions"].items():
            p["kernel_label"] = bm.model_kernel_label(p.get("kernel", ""))
            p["validation"] = bm.verdict_text(verdicts, dk, p["kernel_label"], kv, dk in have)
            p["validated"] = p["validation"].startswith("validated")
        m["measured_devices"] = sorted(have)


def _speedups(rows: list[Row]) -> None:
    serial = {(r.ctx, r.tree_nodes, r.layout, r.page_size, r.timed_on): r.median_us
              for r in rows if r.backend == BASELINE and r.timed_on and r.median_us}
    for r in rows:
        s = serial.get((r.ctx, r.tree_nodes, r.layout, r.page_size, r.timed_on))
        if s and r.median_us:
            r.speedup_vs_serial = s / r.median_us


def _peer_ratios(rows: list[Row], outside: dict) -> None:
    """Every outside baseline's row: where the peer came from (`peer`: source, version, commit) and its time over
    our best kernel's on the same (ctx, tree, layout) (`x_best_ours`, `best_ours`)."""
    best: dict[tuple, Row] = {}
    for r in rows:
        if r.backend.partition("@")[0] in OURS and r.median_us and r.timed_on:
            k = (r.ctx, r.tree_nodes, r.layout, r.page_size, r.timed_on)
            if k not in best or r.median_us < best[k].median_us:
                best[k] = r
    for r in rows:
        if r.backend not in outside:
            continue
        info = getattr(outside[r.backend], "peer", None)
        if info:
            r.extra["peer"] = info
        b = best.get((r.ctx, r.tree_nodes, r.layout, r.page_size, r.timed_on))
        if b is not None and r.median_us:
            r.extra["best_ours"], r.extra["x_best_ours"] = b.backend, r.median_us / b.median_us


class _progress:
    """A rich progress bar (or nothing with --quiet); the context value is a tick() function."""

    def __init__(self, quiet: bool, total: int):
        self.quiet, self.total, self.p = quiet, total, None

    def __enter__(self) -> Callable[[], None]:
        try:
            from rich.progress import Progress
        except ImportError:  # rich is optional
            return lambda: None
        if self.quiet:
            return lambda: None
        self.p = Progress(transient=True)
        self.p.__enter__()
        task = self.p.add_task("bench.verify", total=self.total)
        return lambda: self.p.advance(task)

    def __exit__(self, *exc) -> None:
        if self.p is not None:
            self.p.__exit__(*exc)


# ---------------------------------------------------------------- output

def main(argv: Optional[list[str]] = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    for flag, path in (("--json", a.json), ("--csv", a.csv), ("--plot", a.plot)):
        # before any work: a run of minutes must not end in a FileNotFoundError
        if path and not Path(path).resolve().parent.is_dir():
            raise usage_error(f"{ap.prog}: error: {flag} {path}: the folder {Path(path).resolve().parent} does not exist")
    try:
        payload = sweep(a)
    except ValueError as e:   # one line naming the flag, argparse's status 2 (no usage block)
        raise usage_error(f"{ap.prog}: error: {e}") from None
    from bench.benchmark.report import print_report, write_csv
    print_report(payload)
    if a.json:
        Path(a.json).write_text(json.dumps(payload, indent=2))
    if a.csv:
        write_csv(payload, a.csv)
    if a.plot:
        try:
            from bench.benchmark.plot import plot_results
        except ImportError as e:  # matplotlib is optional on the GPU machine
            print(f"note: --plot skipped ({e})")
        else:
            plot_results(payload, a.plot)
    if not a.no_save:
        d = Path(a.results_dir)
        d.mkdir(parents=True, exist_ok=True)
        with open(d / "verify_runs.jsonl", "a") as f:  # one line per run, appended
            f.write(json.dumps(payload) + "\n")
        print(f"appended this run to {d / 'verify_runs.jsonl'} (--no-save: do not)")
    if payload.get("device") is None:
        print("next: on a GPU machine, `python -m bench.gpu_check` measures what the model table only predicts "
              "(`python -m bench.gpu_check --dry-run` prints its plan)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
