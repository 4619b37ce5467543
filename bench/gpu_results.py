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

REPO = Path(__file__).resolve().parent.parent
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


def collect(src: Path, dest_root: Optional[Path] = None, configs: Optional[Path] = None,
            calibrate: bool = True, name: Optional[str] = None) -> int:
    """Unpack the run at `src` into <dest_root>/<name> (default bench/results/<device slug>)."""
    from bench.gpu_check import print_table

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
    return 0
