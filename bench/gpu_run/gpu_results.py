"""A returned GPU run made committable: `python -m bench.gpu_check --collect DIR`.

The device tool hands back `gpu_check_results.tar.gz` (everything `bench.gpu_check` wrote
under $OUT). `collect` unpacks it into bench/results/<device>/ (JSON, CSV, PNG, the ncu
CSV, and the stage logs under logs/), copies the tuned configs the `tune` stage exported
into autotune/configs/ (measured: they outrank the model's and the heuristic), runs the
model's calibration on the CPU (`bench.model --calibrate`, same cubins as CI) into
calibration.json, and prints the short table with the model's reading beside each row.
"""
from __future__ import annotations

import gzip
import json
import re
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
BIG = 1 << 20  # files larger than this are stored gzipped

def device_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200'."""
    n = re.sub(r"^nvidia\s+", "", (name or "unknown").strip(), flags=re.I).lower()
    return re.sub(r"[^a-z0-9]+", "-", n).strip("-") or "unknown"


def predictions_of(cal: dict) -> dict:
    """{(file stem, backend, ctx, tree, layout, page size): (central us,) or (central, low, high)} of a
    calibration.json (bench.model --calibrate-json)."""
    out = {}
    for r in cal.get("rows", []):
        key = (Path(r["file"]).stem, r.get("backend", "cuda"), r["ctx"], r["tree_nodes"], r["layout"],
               r.get("page_size", 1))
        band = r.get("band_us")
        out[key] = (r["predicted_us"], *band) if band else (r["predicted_us"],)
    return out


def _archive(src: Path) -> Path:
    if src.is_file():
        return src
    hits = sorted(src.rglob("gpu_check_results.tar.gz"))
    if not hits:
        raise FileNotFoundError(f"no gpu_check_results.tar.gz under {src}")
    return hits[-1]


def _load(out: Path, name: str) -> Optional[dict]:
    p = out / f"{name}.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def summary_rows(out: Path, predictions: Optional[dict] = None) -> list[str]:
    """One short line per timed 16-node row of the headline, sweep, peers, fp8 and GQA JSONs; with
    `predictions` ({(file stem, backend, ctx, tree, layout, page size): (central, low, high) us}) the model's
    reading beside each measured cuda row."""
    lines = []
    for name in ("headline", "sweep", "peers", "fp8", "fp8_656", "gqa"):
        d = _load(out, name)
        if d is None:
            continue
        fd = d.get("floor_device")
        for r in d["results"]:
            if name == "sweep" and (r["tree_nodes"] != 16 or r["ctx"] != 185_000):
                continue  # keep the last screen short: the sweep's 185k / 16-node rows
            floor = r["floor_us"].get(fd) if fd else None
            med = r["median_us"]
            key = (name, r["backend"], r["ctx"], r["tree_nodes"], r["layout"], r.get("page_size", 1))
            pred = (predictions or {}).get(key)
            model = "" if pred is None else (f"  model {pred[0]:.1f} [{pred[1]:.0f}-{pred[2]:.0f}]"
                                             if len(pred) == 3 else f"  model {pred[0]:.1f}")
            lines.append(f"{name:8s} {r['backend']:14s} ctx {r['ctx']:>7,} T{r['tree_nodes']:<3d} {r['layout']:6s} "
                         f"{'-' if med is None else f'{med:10.1f} us'}  floor {'-' if floor is None else f'{floor:.1f}'} "
                         f"frac {'-' if r['frac_of_floor'] is None else format(r['frac_of_floor'], '.2f')} "
                         f"x{'-' if not r['speedup_vs_serial'] else format(r['speedup_vs_serial'], '.1f')} "
                         f"err {'-' if r['max_rel_err'] is None else format(r['max_rel_err'], '.1e')} {r['status']}"
                         + _vs_q(r) + model)
    return lines


def _vs_q(r: dict) -> str:
    """An e4m3-MMA row's errors against the q-rounded reference (P's rounding and the tensor cores' FP8 sums)."""
    v = r.get("vs_q_rounded")
    if not v:
        return ""
    lse = v.get("lse_max_abs_err")
    return f" (vs q-rounded {v['max_rel_err']:.1e}" + ("" if lse is None else f", lse {lse:.1e}") + ")"


def peer_ratios(out: Path) -> list[str]:
    """Each peer's time over our best kernel's (cuda*, triton) on the same row (the peers stages)."""
    lines = []
    for name in ("peers", "peers_sweep"):
        d = _load(out, name)
        if d is None:
            continue
        by: dict = {}
        for r in d["results"]:
            if r.get("median_us"):
                by.setdefault((r["ctx"], r["tree_nodes"], r["layout"]), {})[r["backend"]] = r["median_us"]
        for (ctx, t, lay), m in sorted(by.items()):
            ours = {b: us for b, us in m.items() if b.partition("@")[0] in ("cuda", "triton")}
            if not ours:
                continue
            best = min(ours, key=ours.get)
            peers = ", ".join(f"{b} {us / ours[best]:.1f}x slower" if us >= ours[best]
                              else f"{b} {ours[best] / us:.1f}x faster"
                              for b, us in sorted(m.items()) if b not in ours)
            lines.append(f"{name:8s} ctx {ctx:>7,} T{t:<3d} {lay:6s} {best} {ours[best]:.1f} us; "
                         f"{peers or 'no peer timed'}")
    return lines


def ceilings_line(out: Path) -> Optional[str]:
    from bench.core.ceilings import smem_share_line, wgmma_operand_line
    c = _load(out, "ceilings")
    if not c:
        return None

    def f(k, fmt):
        v = c.get(k)
        return "n/a" if v is None else fmt(v)

    return (f"ceilings copy {f('copy_gbs', lambda v: f'{v:.0f} GB/s')}, DRAM read "
            f"{f('dram_read_gbs', lambda v: f'{v:.0f} GB/s')}, L2 read {f('l2_read_gbs', lambda v: f'{v:.0f} GB/s')}, "
            f"mma.sync {f('mma_sync_tflops', lambda v: f'{v:.0f} TFLOP/s')}, wgmma "
            f"{f('wgmma_tflops', lambda v: f'{v:.0f} TFLOP/s')}, cuBLAS {f('cublas_tflops', lambda v: f'{v:.0f}')}, "
            f"HMMA latency {f('hmma_latency_cycles', lambda v: f'{v:.1f} cyc')}, wgmma round "
            f"{f('wgmma_latency_cycles', lambda v: f'{v[0]:.0f}/{v[1]:.0f} cyc (N 64/256)')}"
            + (f"; {wgmma_operand_line(c['wgmma_operand_tflops'])}" if c.get("wgmma_operand_tflops") else "")
            + (f"; {smem_share_line(c['smem_share'])}" if c.get("smem_share") else ""))


def smoke_line(out: Path) -> Optional[str]:
    """The smoke stage's verdict a job (bench/gpu_run/smoke.py): 'smoke ok: v3/bf16, ...; hang: v3-sm120/bf16'."""
    d = _load(out, "smoke")
    if not d:
        return None
    from bench.gpu_run.smoke import quarantine_key, version_of
    by: dict = {}
    for j in d.get("jobs", []):
        tile = j.get("tile")
        by.setdefault(j["status"], []).append(quarantine_key(j["backend"], j.get("kv_dtype"))
                                              + (f" ({tile})" if tile not in (None, version_of(j["backend"])) else ""))
    verdicts = "; ".join(f"{st}: {', '.join(v)}" for st, v in sorted(by.items(), key=lambda kv: kv[0] != "ok"))
    q = d.get("quarantine") or []
    return f"smoke {verdicts}" + (f"; quarantined for the rest of the run: {', '.join(q)}" if q else "")


def pdl_line(out: Path) -> Optional[str]:
    """Programmatic dependent launch's A/B: each row of the nopdl stage (split kernel launched plainly) beside the same
    backend's row of the splits stage (the default launch)."""
    plain, default = _load(out, "nopdl"), _load(out, "splits")
    if not plain or not default:
        return None

    def key(r: dict) -> tuple:
        return r["backend"], r["ctx"], r["tree_nodes"], r["layout"]

    base = {key(r): r["median_us"] for r in default.get("results", []) if r.get("median_us")}
    parts = [f"{r['backend']} {base[key(r)]:.1f} vs {r['median_us']:.1f} us ({base[key(r)] - r['median_us']:+.1f})"
             for r in plain.get("results", []) if r.get("median_us") and key(r) in base]
    return ("split kernel with / without programmatic dependent launch, 4k / 16 nodes: " + ", ".join(parts)) \
        if parts else None


def print_table(out: Path, predictions: Optional[dict] = None) -> None:
    rows = summary_rows(out, predictions)
    extra = [x for x in (smoke_line(out), ceilings_line(out), pdl_line(out)) if x] + peer_ratios(out)
    if rows or extra:
        print("\n".join(["", "short table (16-node rows; us = median per call, cold L2, CUDA graph):", *rows, *extra]))



def collect(src: Path, dest_root: Optional[Path] = None, configs: Optional[Path] = None,
            calibrate: bool = True, name: Optional[str] = None) -> int:
    """Unpack the run at `src` into <dest_root>/<name> (default bench/results/<device slug>)."""
    archive = _archive(src)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        rec = {}
        if (tmp / "gpu_check.json").exists():
            rec = json.loads((tmp / "gpu_check.json").read_text())
        dest = (dest_root or REPO / "bench" / "results") / (name or device_slug(rec.get("device", "")))
        (dest / "logs").mkdir(parents=True, exist_ok=True)
        moved = []
        for p in sorted(tmp.rglob("*")):
            if not p.is_file():
                continue
            rel = p.relative_to(tmp)
            if rel.parts[0] == "tuned":
                target = (configs or REPO / "autotune" / "configs") / p.name
            elif p.suffix == ".log":
                target = dest / "logs" / p.name
            elif p.suffix in (".json", ".csv", ".png", ".jsonl"):
                target = dest / "verify_runs.jsonl" if p.name == "verify_runs.jsonl" else dest / p.name
            else:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if p.stat().st_size > BIG:   # e.g. ncu's per-instruction page: committed gzipped
                target = target.with_name(target.name + ".gz")
                with open(p, "rb") as fin, gzip.open(target, "wb") as fout:
                    shutil.copyfileobj(fin, fout)
            else:
                shutil.copyfile(p, target)
            moved.append(target)
    for name in ("gpu_check_stdout.log", "smi.csv"):   # bench/gpu_session.sh writes these beside the archive
        p = archive.parent / name
        if p.exists():
            target = dest / ("logs" if p.suffix == ".log" else "") / name
            shutil.copyfile(p, target)
            moved.append(target)
    print(f"collected {len(moved)} files from {archive} into {dest}"
          + (f" (and {sum(1 for m in moved if m.parent.name == 'configs')} tuned configs)" if moved else ""))
    preds = None
    if calibrate:
        from bench.model.calibrate import calibrate as run_calibration
        runs = [dest / f"{n}.json" for n in ("headline", "sweep", "peers", "fp8", "fp8_656", "gqa")
                if (dest / f"{n}.json").exists()]
        if runs:
            run_calibration(runs, json_path=str(dest / "calibration.json"))
            preds = predictions_of(json.loads((dest / "calibration.json").read_text()))
    print_table(dest, preds)
    if calibrate:
        for line in probe_lines(dest):
            print(line)
    return 0


def probe_lines(out: Path) -> list[str]:
    """The ceiling probes that test a model constant (the wgmma operand probes) measured beside bench.model's readings
    of the same kernels; a line saying why where the model cannot read them here (no nvcc or SASS tools)."""
    c = _load(out, "ceilings")
    if not c or not (c.get("wgmma_operand_tflops") or c.get("smem_share")):
        return []
    try:
        from bench.model import devices, probes
        dev = devices.device_for_gpu(c.get("device", "H200"))
        if dev is None:
            return [f"wgmma operand probes: no device model describes {c['device']}; the model's readings not shown"]
        return probes.measured_vs_model(c, dev)
    except Exception as e:  # the measured line is in the table already; the model's side needs the toolkit
        return [f"wgmma operand probes: the model's readings unavailable here ({type(e).__name__}: {e})"]
