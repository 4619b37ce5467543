"""python -m bench.model: predict each CUDA kernel's time from its SASS, without a GPU.

For every compiled tile config of the head shape's kernels (cubins of the real
build, nvcc -lineinfo, one per arch), the model reads the per-KV-tile loop from
the SASS, counts its instruction classes, the MMA accumulator chains, shared and
global bytes, simulates one warp scheduler over it, and predicts the call time on
the device each arch stands for (sm_120a: RTX PRO 6000 Blackwell, sm_90a: H200),
naming the bound. Every device constant carries its source (--constants).

    python -m bench.model --arch sm_120a,sm_90a --ctx 185k --tree 16 --json model.json
    python -m bench.model --ctx 4k..185k --tree 16,64 --layout page1,paged
    python -m bench.model --calibrate          # predicted vs measured (bench/results/**.json)
    python -m bench.model --probes             # the ceiling probes as the model reads them (bench.ceilings
                                               # measures the same kernels)

Predictions are labelled "model"; they are not measurements.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path
from typing import Optional

from verify_attn import build as vb
from verify_attn.shapes import PRESETS, get_shape
from verify_attn.tree import check_tree_sizes
from verify_attn.utils import dash_values, flag_value, parse_ctx, parse_int_list, usage_error

from . import bands as model_bands
from . import call as predict, devices, kernels, sim

SCHEMA_VERSION = 1


KV_DTYPES = ("bf16", "fp16", "fp8_e4m3", "fp8_mla656")


def _kv_dtypes(spec: str) -> list[str]:
    """--kv-dtype: one cache format or several, comma-separated (each gets its own table)."""
    out = [x.strip() for x in spec.split(",") if x.strip()]
    bad = [x for x in out if x not in KV_DTYPES]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"{spec!r}: comma-separated of {', '.join(KV_DTYPES)}")
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.model", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="sm_120a,sm_90a",
                    help="cubin archs to read: sm_120a (-> RTX PRO 6000), sm_90a (-> H200); default both. A device "
                         "key reads its arch's cubins on that device: h100 (sm_90a on the H100 SXM5, the device "
                         "tool's nvidia-h100-x1), h200, rtx-pro-6000")
    ap.add_argument("--ctx", default="185k", help="prefix lengths: 185k | 4k,16k,185k | 1k..256k; k = 1,000 tokens")
    ap.add_argument("--tree", default="16", help="tree node counts, comma-separated (default 16)")
    ap.add_argument("--shape", default="kimi-k2-tp8", help=f"head-shape preset: {', '.join(PRESETS)}")
    ap.add_argument("--layout", default="page1", help="page1 and/or paged, comma-separated")
    ap.add_argument("--page-size", type=int, default=64, help="page size of the paged layout (default 64)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"], help="q and out dtype")
    ap.add_argument("--kv-dtype", default=None, type=_kv_dtypes,
                    help="KV cache storage (default: --dtype); fp8_e4m3 / fp8_mla656 read the fp8-cache kernels")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--kernel", default="all", help="all | default | a substring of the kernel name "
                    "(e.g. 'm32 n16' or 'v1')")
    ap.add_argument("--splits", default="auto", help="auto (the backend's heuristic) | N | best (the model's "
                    "best over the autotuner's split counts)")
    ap.add_argument("--knockout", type=int, default=0, metavar="BITS",
                    help="read the timing-experiment variant bench.knockout measures (-DVA_TV_KNOCKOUT=BITS: 1 no KV "
                         "copies, 2 no index loads, 4 no v2 exchange, 8 no v2 L2 prefetch, 16 v3 half the rows (a "
                         "2-CTA cluster's gather); default 0, the kernel)")
    ap.add_argument("--json", metavar="PATH", help="write every prediction as JSON (schema in bench/model/README.md)")
    ap.add_argument("--per-tile", action="store_true", help="also print the per-tile SASS reading of each kernel")
    ap.add_argument("--trace", action="store_true",
                    help="also print where each kernel's simulated tile loses tensor-pipe time: the pipe's idle "
                         "stretches (>= 30 cycles) and warp 0's long stalls, with their source lines (warp-role "
                         "tiles: the other roles' simulated warps' stalls of 100 cycles or more too)")
    ap.add_argument("--timeline", action="store_true",
                    help="also print each kernel's simulated tile, warp by warp (one warp of each role on warp-role "
                         "tiles), as phases by kernel source line: when each part of the loop runs, its cycles, its "
                         "instruction mix and its waits (a barrier's wait is the barrier's), with the line's text")
    ap.add_argument("--constants", action="store_true", help="print the device constants with their sources and exit")
    ap.add_argument("--no-bands", action="store_true", help="central values only (no band: each band re-predicts the "
                    "call once per end of every ranged constant, ~3-5 s a row)")
    ap.add_argument("--probes", action="store_true",
                    help="print the model's readings of the ceiling probes bench.ceilings measures (mma.sync rate; "
                         "on sm_90a the wgmma rate and wgmma + wait round) for the --arch devices, and exit")
    ap.add_argument("--calibrate", nargs="*", metavar="RESULTS.json",
                    help="compare predictions with measured rows (default: every JSON under bench/results/)")
    ap.add_argument("--calibrate-json", metavar="PATH", help="with --calibrate: also write the rows as JSON")
    ap.add_argument("--validate", action="store_true", help="predict the published measurements of "
                    "shared/CALIBRATION.md and this project's H200 runs, predicted vs observed in one table "
                    "(fit / held out / not reached), and exit")
    ap.add_argument("--validate-json", metavar="PATH", help="with --validate: also write the items as JSON")
    fg = ap.add_argument_group("a kernel this project did not write (bench/model/foreign.py): its cubin, no markers")
    fg.add_argument("--foreign", metavar="CUBIN", help="read this cubin's function (--function) and predict one call")
    fg.add_argument("--function", metavar="REGEX", help="regex on the mangled name; must match exactly one function")
    fg.add_argument("--threads", type=int, help="threads per CTA of the launch")
    fg.add_argument("--grid", type=int, help="CTAs of the launch")
    fg.add_argument("--trips", type=int, help="iterations of the hot loop per CTA")
    fg.add_argument("--smem", type=int, default=0, help="dynamic shared memory per CTA, bytes (default 0)")
    fg.add_argument("--flops", type=float, default=None, help="the call's FLOPs, to print TFLOP/s")
    fg.add_argument("--device", default="h200", help="device model: h200, h100-sxm, h800-sxm, rtx-pro-6000 "
                    "(default h200)")
    fg.add_argument("--tma-box-bytes", type=int, default=None,
                    help="bytes of one tensor-map TMA box (UTMALDG: the size is in the tensor map, not the SASS)")
    fg.add_argument("--bulk-lanes", type=int, default=1,
                    help="lanes of a warp that run a bulk copy's per-lane loop (default 1, one elected thread; a "
                         "producer warp copying a row per lane: its rows per tile)")
    fg.add_argument("--empty-distance", type=int, default=1,
                    help="warp-specialized kernels: loop iterations between a buffer's fill and its refill, i.e. how "
                         "far back a producer's wait on an 'empty' barrier looks (default 1)")
    return dash_values(ap)   # `--ctx -5k` reaches the range check, as in bench.verify


def run_foreign(a: argparse.Namespace) -> int:
    from . import foreign
    missing = [f"--{n}" for n in ("function", "threads", "grid", "trips") if getattr(a, n) is None]
    if missing:
        raise ValueError(f"--foreign needs {', '.join(missing)}")
    if not Path(a.foreign).is_file():
        raise ValueError(f"--foreign: {a.foreign} does not exist")
    if a.tma_box_bytes is not None and a.tma_box_bytes < 16:
        raise ValueError(f"--tma-box-bytes must be >= 16, got {a.tma_box_bytes}")
    if a.empty_distance < 1:
        raise ValueError(f"--empty-distance must be >= 1, got {a.empty_distance}")
    if not 1 <= a.bulk_lanes <= 32:
        raise ValueError(f"--bulk-lanes must be in 1..32, got {a.bulk_lanes}")
    r, found = foreign.read_roles(a.foreign, a.function, a.threads, a.bulk_lanes)
    if found:
        return _print_roles(a, r, found)
    out = foreign.predict(r, foreign.device_any(a.device), threads=a.threads, grid=a.grid, trips=a.trips, smem=a.smem,
                          flops=a.flops, band=not a.no_bands)
    print(f"{r.name[:140]}{'...' if len(r.name) > 140 else ''}")
    print(f"  hot loop {out['loop'][0]}-{out['loop'][1]}: {out['instructions_per_iter']} instructions, "
          f"{out['mma_per_iter']} MMA per warp per iteration; {out['registers']} registers, {out['ctas_per_sm']} "
          f"CTAs/SM, {out['waves']} waves on {out['device']}")
    _print_call(a, out, "")
    return 0


def _print_call(a: argparse.Namespace, out: dict, where: str) -> None:
    """A foreign reading's last lines: cycles per iteration, the call with its band, TFLOP/s; --json."""
    band = f" [{out['low_us']:.1f}-{out['high_us']:.1f}], most sensitive {out['sensitive']}" if "low_us" in out else ""
    print(f"  {out['cycles_per_iter']:.0f} cycles per iteration{where}; call {out['us']:.1f} us{band} (model)")
    if "tflops" in out:
        tb = f" [{out['tflops_low']:.0f}-{out['tflops_high']:.0f}]" if "tflops_low" in out else ""
        print(f"  {out['tflops']:.1f} TFLOP/s{tb} (model)")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


def _print_roles(a: argparse.Namespace, r, found) -> int:
    """A warp-specialized kernel: its roles (warps, registers, loop, bound) and the call."""
    from . import foreign
    out = foreign.predict_roles(r, found, foreign.device_any(a.device), threads=a.threads, grid=a.grid, trips=a.trips,
                                smem=a.smem, flops=a.flops, tma_bytes=a.tma_box_bytes, empty_distance=a.empty_distance,
                                band=not a.no_bands)
    print(f"{r.name[:140]}{'...' if len(r.name) > 140 else ''}")
    print(f"  warp-specialized: {len(found)} roles; {out['registers']} registers at launch, {out['ctas_per_sm']} CTAs/SM, "
          f"{out['waves']} waves on {out['device']}; scheduler 0 simulated with CTA warps {out['simulated_warps']}")
    print(f"  {'role':9} {'warps':>9} {'regs':>5} {'loop':>17} {'instr':>6} {'MMA':>4} {'copies':>6} {'cycles':>7} "
          f"{'stalled':>8}  bound")
    for ro in out["roles"]:
        ws = ro["warps"]
        wtxt = f"{ws[0]}-{ws[-1]}" if ws == list(range(ws[0], ws[-1] + 1)) else ",".join(map(str, ws))
        print(f"  {ro['role']:9} {wtxt:>9} {ro['maxnreg'] or '-':>5} {ro['loop'][0] + '-' + ro['loop'][1]:>17} "
              f"{ro['instructions_per_iter']:>6} {ro['mma_per_iter']:>4} {ro['copies_per_iter']:>6} "
              f"{ro['cycles_per_iter']:>7.0f} {ro['stall_cycles_per_iter']:>8.0f}  {ro['bound']}")
    busy = ", ".join(f"{p} {v / out['cycles_per_iter']:.0%}" for p, v in sorted(out["pipe_busy"].items(),
                     key=lambda kv: -kv[1]) if p in ("tensor", "lsu", "mio", "smem_async", "tma"))
    _print_call(a, out, f" (scheduler 0: {busy})")
    return 0


def _head_of(shape, kv_dtype: str = "bf16") -> str:
    fp8 = kv_dtype if kv_dtype.startswith("fp8") else False
    h = vb.head_key(shape.head_dim_qk, shape.head_dim_v, shape.mla, fp8)
    if h is None:
        raise ValueError(f"no CUDA kernel family for head shape {shape.name}"
                         f"{f' with an {kv_dtype} cache (MLA 576/512 only)' if fp8 else ''}")
    return h


def _layouts(spec: str, page_size: int) -> list[tuple[str, int]]:
    out = []
    for s in [x.strip() for x in spec.split(",") if x.strip()]:
        if s not in ("page1", "paged"):
            raise ValueError(f"--layout: unknown layout {s!r} (page1, paged)")
        out.append((s, 1 if s == "page1" else page_size))
    if not out:
        raise ValueError("--layout names no layout")
    if any(p < 2 for l, p in out if l == "paged"):
        raise ValueError(f"--page-size must be >= 2 for the paged layout, got {page_size}")
    return out


def _archs(spec: str) -> list[tuple[str, devices.DeviceModel]]:
    out = []
    for a in [x.strip() for x in spec.split(",") if x.strip()]:
        devs = [d for d in devices.DEVICES.values() if d.arch == a] or \
            [d for d in devices.MODELLED.values() if d.key == a.lower()]
        if not devs:
            raise ValueError(f"--arch: no device model for {a!r}; known: "
                             f"{', '.join(sorted({d.arch for d in devices.DEVICES.values()}))} or a device: "
                             f"{', '.join(devices.MODELLED)}")
        out += [(d.arch, d) for d in devs]
    if not out:
        raise ValueError("--arch names no arch")
    return out


def _pick_kernels(ks, spec: str):
    if spec == "all":
        return list(ks)
    if spec == "default":
        from verify_attn import build as vb
        d = [k for k in ks if k.tile == vb.default_tile(k.head, k.arch)]
        return d or [ks[0]]
    sel = [k for k in ks if spec in k.name]
    if not sel:
        raise ValueError(f"--kernel {spec!r} matches none of: {', '.join(k.name for k in ks)}")
    return sel


def split_candidates(km, dev, case) -> list[int]:
    """Split counts that fill 1/2 .. 4 waves of the device with each split >= 2 tiles (at most `cap` splits), `cap`
    itself, and always the backend heuristic's own count, so that `--splits best` is never slower than `auto` (at 4k
    the wave counts all pass the cap, and the list once fell back to a single split)."""
    per_split = case.batch * case.shape.num_kv_heads * predict.m_tiles(case, km)
    cap = max(1, case.kv_len // (2 * km.tile.block_n))
    sms = int(dev.sms.value)
    occ = max(1, predict.ctas_per_sm(km, dev))
    waves = (0.5, 1, 1.5, 2, 3, 4)
    c = {max(1, round(w * sms * occ / per_split)) for w in waves} | {max(1, round(w * sms / per_split)) for w in waves}
    return sorted({v for v in c if v <= cap} | {cap, predict.default_splits(case, km, dev)})


def best_splits(km, dev, case) -> predict.Prediction:
    preds = [predict.predict(km, dev, case, s) for s in split_candidates(km, dev, case)]
    return min(preds, key=lambda p: p.total_us)


def run(a: argparse.Namespace) -> dict:
    shape = get_shape(a.shape)
    kv_dtype = a.kv_dtype[0] if isinstance(a.kv_dtype, list) else (a.kv_dtype or a.dtype)
    head = _head_of(shape, kv_dtype)
    ctxs = flag_value(parse_ctx, a.ctx, "--ctx")
    trees = parse_int_list(a.tree, "--tree")
    check_tree_sizes(trees)   # the backends' limit, as bench.verify and autotune refuse it
    layouts = _layouts(a.layout, a.page_size)
    if a.batch < 1:
        raise ValueError(f"--batch must be >= 1, got {a.batch}")
    if not 0 <= getattr(a, "knockout", 0) < vb.KNOCKOUT_LIMIT:
        raise ValueError(f"--knockout: bits 0..{vb.KNOCKOUT_LIMIT - 1}, got {a.knockout}")
    entries, traces = [], []
    for arch, dev in _archs(a.arch):
        for lay, ps in layouts:
            ko = (a.knockout,) if getattr(a, "knockout", 0) else ()   # (the kernel itself: load's default)
            ks = _pick_kernels([k for k in kernels.load(arch, head, a.dtype, lay, *ko) if k.tile.targets(arch)],
                               a.kernel)
            for km in ks:
                for ctx in ctxs:
                    for n in trees:
                        case = predict.Case(shape, ctx, n, a.batch, lay, ps, kv_dtype=kv_dtype)
                        p, e = _read_row(a, km, dev, case)
                        entries.append(e)
                        if getattr(a, "trace", False) and ctx == ctxs[0] and n == trees[0]:
                            traces += trace_lines(km, dev, p)
                        if getattr(a, "timeline", False) and ctx == ctxs[0] and n == trees[0]:
                            traces += timeline_lines(km, dev, p)
    return {"schema": SCHEMA_VERSION, "kind": "model", "date": _dt.datetime.now().isoformat(timespec="seconds"),
            "commit": _commit(), "shape": shape.to_dict(), "dtype": a.dtype, "kv_dtype": kv_dtype,
            "knockout": getattr(a, "knockout", 0),
            "splits": a.splits,
            "devices": {d.key: {"name": d.name, "arch": d.arch, "constants": d.constants()}
                        for _, d in _archs(a.arch)},
            "kernels": entries, "traces": traces}


def _read_row(a: argparse.Namespace, km, dev, case) -> tuple[predict.Prediction, dict]:
    """One table row: the prediction with the run's split rule (--splits auto | best | N) and, unless --no-bands,
    its band."""
    if a.splits == "best":
        p = best_splits(km, dev, case)
    else:
        p = predict.predict(km, dev, case, None if a.splits == "auto" else int(a.splits))
    e = _entry(km, dev, case, p)
    if not getattr(a, "no_bands", False):
        e["band"] = {dev.key: model_bands.band(km, dev, case, p.num_splits, central=p).to_dict()}
    return p, e


def goal_paged_payload(a: argparse.Namespace, payloads: list[dict]) -> Optional[dict]:
    """Issue 27's paged goal compares page sizes 16 and 64 with page1 (bf16, 16 nodes, 185k). A run that read
    page1 only gets them here: the kernel fastest at page1 on each arch, read again at both page sizes (the same
    kernel, its splits chosen as the run chose them), so the goals command prints every goal. None when the run
    read paged rows itself or no bf16 page1 row at 16 nodes."""
    if "paged" in a.layout or 16 not in parse_int_list(a.tree, "--tree"):
        return None
    from .goals import best_rows
    rows = best_rows([pl for pl in payloads if pl["kv_dtype"] == "bf16"])
    shape = get_shape(a.shape)
    head = _head_of(shape, "bf16")
    entries = []
    for arch, dev in _archs(a.arch):
        b = rows.get((arch, "bf16", 185_000, 16, "page1"))
        if b is None or dev.key not in devices.DEVICES:   # (the goals are the reference devices')
            continue
        tile = next(k.tile for k in kernels.load(arch, head, a.dtype, "page1") if k.name == b.kernel)
        km = kernels.find(arch, head, a.dtype, "paged", tile)
        for ps in (16, 64):
            case = predict.Case(shape, 185_000, 16, a.batch, "paged", ps, kv_dtype="bf16")
            entries.append(_read_row(a, km, dev, case)[1])
    if not entries:
        return None
    return {"schema": SCHEMA_VERSION, "kind": "model", "shape": shape.to_dict(), "dtype": a.dtype, "kv_dtype": "bf16",
            "splits": a.splits, "kernels": entries, "traces": []}


def trace_lines(km, dev, p: predict.Prediction) -> list[str]:
    """The simulated hot tile of `km` on `dev`, as the prediction `p` simulated it (its warps per scheduler and
    copy bandwidth): where the tensor pipe sits idle and what warp 0 waited on. How NOTES.md's per-tile
    explanations are read."""
    # (warp roles: the simulated body is every role's loop, one after the other: kernels._with_producer)
    body = km.roles_hot[0] if km.roles_hot is not None else km.hot.instrs
    res = p.tile.sim
    busy = res.pipe_busy.get("tensor", 0.0)
    others: list[str] = []
    if km.roles_hot is not None:  # the other roles' warps (one of each on the simulated scheduler)
        names = {x: f"warp {w:2d}" for x, w in enumerate(predict.simulated_warps(km.tile, dev.schedulers)) if x > 0}
        others = ["  the other simulated warps' stalls of 100 cycles or more:"] + sim.explain_warps(body, res, names)
    return ([f"{dev.key} {km.name} ({km.layout}): {res.cycles_per_iter:.0f} cycles/tile simulated, tensor pipe "
             f"busy {busy:.0f} ({100 * busy / res.cycles_per_iter:.0f}%)", smem_line(res)]
            + role_lines(km, res, dev.schedulers) + sim.pipe_gaps(body, res, "tensor", dev, 30) + sim.explain(body, res, 25)
            + others)


def _role_names(km) -> list[str]:
    """The roles of a warp-specialized tile, in the order of its simulated body's spans."""
    spans = km.roles_hot[1]
    return (["math", "producer"] if len(spans) == 2 else
            ["consumer warpgroup 0", "consumer warpgroup 1", "producer"] if km.tile.version == 3 else
            ["S warps", "PV warps", "producer"])


_REPO = Path(__file__).resolve().parents[2]
_SOURCES: dict[Path, list[str]] = {}


def source_text(file: Optional[str], line: Optional[int], width: int = 64) -> str:
    """A kernel source line as the SASS line table names it (the build's path), read from this checkout's csrc/ (the
    cubins are cached by source hash, so the lines match); '' when it cannot be read."""
    f = file or ""
    k = f.rfind("csrc/")
    if k < 0 or not line:
        return ""
    path = _REPO / f[k:]
    if path not in _SOURCES:
        try:
            _SOURCES[path] = path.read_text().splitlines()
        except OSError:
            _SOURCES[path] = []
    text = _SOURCES[path][line - 1].strip() if line <= len(_SOURCES[path]) else ""
    return text if len(text) <= width else text[:width - 3] + "..."


def timeline_lines(km, dev, p: predict.Prediction) -> list[str]:
    """--timeline: the simulated hot tile's last iteration, warp by warp (one warp of each role on a warp-role tile,
    warp 0 otherwise), as phases by kernel source line (sim.timeline): how long each part of the loop took, its
    instruction mix and what it waited on."""
    res = p.tile.sim
    if km.roles_hot is not None:
        body, names = km.roles_hot[0], _role_names(km)
        labels = {x: f"warp {w} ({names[predict._role_of(km.tile, w, len(km.roles_hot[1]))]})"
                  for x, w in enumerate(predict.simulated_warps(km.tile, dev.schedulers)) if x < res.warps}
    else:
        body, labels = km.hot.instrs, {0: "warp 0"}
    return ([f"{dev.key} {km.name} ({km.layout}): {res.cycles_per_iter:.0f} cycles/tile simulated; each phase: where "
             "it starts in the warp's iteration, its cycles (the waits in them), the source line"]
            + sim.timeline(body, res, labels, source=source_text))


def smem_line(res) -> str:
    """The simulated iteration's shared-memory cycles (the scheduler's share of the SM's bandwidth) by kind: what
    the tile's "smem" bound adds up. A tile near it is bound by shared memory whatever its latencies."""
    kinds = {k: sum(d[k] for d in res.smem_by_warp) for k in ("issued", "copies", "operands")}
    total = sum(kinds.values())
    return (f"  shared memory busy {total:.0f} cycles an iteration ({100 * total / res.cycles_per_iter:.0f}%): loads, "
            f"stores and ldmatrix {kinds['issued']:.0f}, copies landing {kinds['copies']:.0f}, wgmma operands "
            f"{kinds['operands']:.0f}")


def role_lines(km, res, schedulers: int) -> list[str]:
    """A warp-specialized tile's roles as simulated: each role's warps and how long one simulated warp of it waited at
    mbarriers and named barriers an iteration (the later half of the simulated iterations); [] without roles."""
    if km.roles_hot is None:
        return []
    spans = km.roles_hot[1]
    names = _role_names(km)
    m = km.tile.warps_m * km.tile.warps_n
    warps_of = [(0, m)] if len(spans) == 2 else [(0, m // 2), (m // 2, m)]
    warps_of.append((m, m + kernels.producer_warps(km.tile)))
    sim_warps = predict.simulated_warps(km.tile, schedulers)   # the first resident CTA's
    out = []
    for k, name in enumerate(names):
        xs = [x for x, w in enumerate(sim_warps) if predict._role_of(km.tile, w, len(spans)) == k and x < len(res.sync_stall)]
        if not xs:
            continue
        stall = max(res.sync_stall[x] for x in xs)
        smem = sum(sum(res.smem_by_warp[x].values()) for x in xs)   # the role's warps on this scheduler
        lo, hi = warps_of[k]
        out.append(f"  role {name} (warps {lo}-{hi - 1}, {spans[k][1] - spans[k][0]} instructions an iteration): waits "
                   f"{stall:.0f} cycles an iteration at barriers ({100 * stall / res.cycles_per_iter:.0f}%); its "
                   f"warps' shared memory {smem:.0f} cycles")
    return out


def _entry(km, dev, case, p: predict.Prediction) -> dict:
    r = km.hot_reading
    cnt = predict.counts(case)  # the call's compulsory bytes and FLOPs (bench/model/goals.py's floors)
    return {
        "arch": km.arch, "kernel": km.name, "ctx": case.ctx, "tree_nodes": case.tree_nodes, "layout": case.layout,
        "page_size": case.page_size, "registers": km.registers, "smem_bytes": km.smem_bytes,
        "ctas_per_sm": p.ctas_per_sm, "warps_per_scheduler": p.warps_per_scheduler, "num_splits": p.num_splits,
        "tile": {"block_m": km.tile.block_m, "block_n": km.tile.block_n, "num_warps": km.tile.num_warps,
                 "num_stages": km.tile.num_stages},
        "per_tile": {"hmma": r.hmma, "hmma_chain_depth": r.hmma_chain_depth, "ldsm": r.ldsm,
                     "smem_read_bytes": r.smem_read_bytes * km.tile.num_warps,
                     "global_bytes": r.global_bytes * km.tile.num_warps, "barriers": r.barriers,
                     "instructions": r.instructions, "detail": r.to_dict(km.tile.num_warps),
                     "masked_tile_instructions": km.cold_reading.instructions,
                     # the hot tile's conflicted shared-memory accesses (bench.model.banks): degree per instruction
                     "bank_conflicts": {f"0x{i.addr:x} {i.opcode}": km.bank_degree[i.addr] for i in km.hot.instrs
                                        if i.addr in km.bank_degree},
                     "bank_unresolved": km.bank_unresolved},
        "call_bytes": cnt.total_bytes, "call_flops": cnt.flops,
        "predicted_us": {dev.key: round(p.total_us, 2)}, "floor_us": {dev.key: round(p.floor_us, 2)},
        "frac_of_floor": {dev.key: round(p.frac_of_floor, 4)}, "bound": {dev.key: p.bound},
        "detail": {dev.key: p.to_dict()},
    }


def _commit() -> str:
    import subprocess
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=vb.REPO, capture_output=True, text=True, timeout=10)
        return r.stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def print_table(payload: dict, per_tile: bool) -> None:
    print(f"bench.model (predictions from SASS, not measurements): {payload['shape']['name']}, {payload['dtype']} q, {payload['kv_dtype']} KV, "
          f"splits {payload['splits']}")
    hdr = (f"{'device':13} {'kernel':44} {'ctx':>7} {'T':>4} {'layout':7} {'S':>4} {'cta/SM':>6} {'w/sch':>5} "
           f"{'cyc/tile':>8} {'model us':>9} {'band us':>11} {'floor us':>8} {'%floor':>6}  bound; most sensitive to")
    print(hdr)
    print("-" * len(hdr))
    for e in payload["kernels"]:
        for dk, d in e["detail"].items():
            lay = e["layout"] if e["layout"] == "page1" else f"p{e['page_size']}"
            b = e.get("band", {}).get(dk)
            band = f"{b['low_us']:.0f}-{b['high_us']:.0f}" if b else "-"
            print(f"{dk:13} {e['kernel']:44} {e['ctx']:>7} {e['tree_nodes']:>4} {lay:7} {d['num_splits']:>4} "
                  f"{d['ctas_per_sm']:>6} {d['warps_per_scheduler']:>5} {d['cycles_per_tile']:>8.0f} "
                  f"{d['predicted_us']:>9.1f} {band:>11} {d['floor_us']:>8.1f} {100 * d['frac_of_floor']:>5.0f}%  "
                  f"{d['bound']}{'; ' + b['sensitive'] if b else ''}")
    if per_tile:
        seen = set()
        print("\nper KV tile, per warp (hot path: an unmasked prefix tile); bytes per CTA")
        for e in payload["kernels"]:
            key = (e["arch"], e["kernel"])
            if key in seen:
                continue
            seen.add(key)
            t = e["per_tile"]
            det = t["detail"]
            wg = (f"HGMMA {det['hgmma']} (N: {det['hgmma_n']}, {det['hgmma_groups']} commit groups, "
                  f"{det['wgmma_waits']} waits, smem {det['hgmma_smem_read_bytes']} B), ") if det.get("hgmma") else ""
            print(f"  {e['arch']:8} {e['kernel']}: {t['instructions']} instr, {wg}HMMA {t['hmma']} "
                  f"(chain depth {t['hmma_chain_depth']}, {det['hmma_accumulators']} accumulators), "
                  f"LDSM {t['ldsm']} {det['ldsm_kinds']}, LDGSTS {det['ldgsts']}, BAR {t['barriers']}, "
                  f"FMUL {det['fmul']}, smem read {t['smem_read_bytes']} B, global {t['global_bytes']} B, "
                  f"regs {e['registers']}, smem {e['smem_bytes']} B; classes {det['classes']}")
            if det.get("bulk_copies"):
                notes = next((n for d in e["detail"].values() for n in d.get("notes", [])
                              if n.startswith("bulk copies")), "")
                print(f"      bulk copies: {det['bulk_copies']} UBLKCP on the loader warp's path (its waterfall loop "
                      f"expanded by {det['bulk_lanes']} lanes), {det['mbar_waits']} try_wait, {det['mbar_arrives']} "
                      f"arrive; sizes read off the SASS {det['bulk_copy_bytes']} (None: set at run time)"
                      + (f"; simulated: {notes.split(': ', 1)[1]}" if notes else ""))
            bc = t.get("bank_conflicts") or {}
            degrees = sorted(set(bc.values()))
            print(f"      bank conflicts: {len(bc)} shared-memory accesses of the tile conflicted"
                  + (f" ({', '.join(f'{d:g}-way' for d in degrees)})" if bc else "")
                  + f", {t.get('bank_unresolved', 0)} unresolved (taken as conflict-free)")


def print_constants() -> None:
    for d in devices.MODELLED.values():
        print(f"{d.name} ({d.key}, {d.arch}):")
        for k, c in d.constants().items():
            lo = c["value"] if c["lo"] is None else c["lo"]
            hi = c["value"] if c["hi"] is None else c["hi"]
            rng = f"[{lo:.4g}, {hi:.4g}]" if lo != hi else "exact"
            print(f"  {k:30} {c['value']:>12.4g} {rng:>22}  [{c['kind']}] {c['source']}"
                  + (f" Range: {c['why_range']}." if c.get("why_range") else ""))
        print(f"  {'-> HMMA.16816 interval':30} {d.hmma_interval:>12.4g}  cycles per sub-partition")
        print(f"  {'-> mma.sync-class rate':30} {d.mma_tflops:>12.4g}  TFLOP/s")
        if d.hgmma_latency is not None:
            print(f"  {'-> HGMMA.64xNx16 interval':30} {d.hgmma_interval(8) / 8:>12.4g}  cycles per N per "
                  f"sub-partition (N = 32: {d.hgmma_interval(32):g}, N = 256: {d.hgmma_interval(256):g})")
        for n in d.notes:
            print(f"  note: {n}")


def print_probes(arch_spec: str) -> None:
    from . import probes
    print("bench.model: the ceiling probes (csrc/ceilings/mma_peak.cu) as the model reads them -- predictions; "
          "`python -m bench.ceilings` measures the same kernels")
    for _, dev in _archs(arch_spec):
        for p in probes.predict(dev):
            print(f"  {dev.key:13} {p.name:28} {p.value:9.1f} {p.unit:8} ({p.cycles_per_iter:.1f} cycles per loop "
                  f"iteration, {p.warps_per_scheduler} warp(s)/scheduler, {p.bound}-bound; {p.detail})")


def main(argv: Optional[list[str]] = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.constants:
        print_constants()
        return 0
    if a.probes:
        try:
            print_probes(a.arch)
        except ValueError as e:
            ap.error(str(e))
        except (RuntimeError, LookupError) as e:  # no toolkit / tools, or a probe loop not found
            print(f"bench.model: {e}", file=sys.stderr)
            return 2
        return 0
    if a.validate:
        from .validate import validate
        return validate(a.validate_json)
    if a.foreign is not None:
        try:
            return run_foreign(a)
        except (ValueError, LookupError) as e:
            ap.error(str(e))
        except RuntimeError as e:   # no SASS tools
            print(f"bench.model: {e}", file=sys.stderr)
            return 2
    if a.calibrate is not None:
        from .calibrate import calibrate
        paths = [Path(p) for p in a.calibrate if Path(p).exists()]
        missing = [p for p in a.calibrate if not Path(p).exists()]
        if a.calibrate and not paths:
            print(f"bench.model --calibrate: error: none of {', '.join(a.calibrate)} exists: nothing to compare",
                  file=sys.stderr)
            return 2
        for m in missing:   # e.g. a gpu_check stage that did not run: said, the others compared
            print(f"bench.model --calibrate: {m} does not exist: skipped", file=sys.stderr)
        return calibrate(paths or None, json_path=a.calibrate_json)
    if a.splits not in ("auto", "best"):
        try:
            if int(a.splits) < 1:
                raise ValueError
        except ValueError:
            ap.error(f"--splits must be auto, best or an int >= 1, got {a.splits!r}")
    kvs = a.kv_dtype or [a.dtype]
    payloads = []
    for kv in kvs:   # one table per cache format
        a1 = argparse.Namespace(**{**vars(a), "kv_dtype": [kv]})
        try:
            payload = run(a1)
        except (ValueError, LookupError) as e:   # one line naming the flag, status 2 (bench.verify's form)
            raise usage_error(f"{ap.prog}: error: {e}") from None
        except RuntimeError as e:  # no toolkit / tools: say so in one line
            print(f"bench.model: {e}", file=sys.stderr)
            return 2
        payloads.append(payload)
        print_table(payload, a.per_tile)
        if payload["traces"]:
            print("\nsimulated tile traces (hot path; bench/model/sim.py)")
            print("\n".join(payload["traces"]))
        if len(kvs) > 1:
            print()
    if a.knockout:
        print(f"\nknockout variant {a.knockout} (VA_TV_KNOCKOUT): a timing experiment whose results are wrong by design; "
              "compare with bench.knockout's measured rows, not with the goals")
    elif a.shape == "kimi-k2-tp8" and a.batch == 1 and 185_000 in parse_ctx(a.ctx) \
            and any(d.key in devices.DEVICES for _, d in _archs(a.arch)):
        from .goals import print_goals
        paged = goal_paged_payload(a, payloads) if "bf16" in kvs else None
        if paged is not None:
            print("\nthe paged rows of the goals (the kernel fastest at page1, read at page sizes 16 and 64)")
            print_table(paged, False)
        print_goals(payloads + ([paged] if paged is not None else []))
    if a.json:
        Path(a.json).write_text(json.dumps(payloads[0] if len(payloads) == 1 else payloads, indent=1))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
