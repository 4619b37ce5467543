"""Predicted against measured: every timed `cuda` row of bench.verify results on a modelled device.

`python -m bench.model --calibrate [RESULTS.json ...]` reads bench.verify payloads
(the JSON files under bench/results/, or `verify_runs.jsonl` lines), predicts each
measured row with the same kernel tile and split count, and prints the ratio.
Nothing here changes a constant: a calibration is a commit that changes one
constant in devices.py from "assumed" to "measured", citing the run, and a line in
NOTES.md.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Iterable, Optional

from verify_attn import build as vb
from verify_attn.shapes import HeadShape

from . import call as predict, devices, kernels

RESULTS = vb.REPO / "bench" / "results"


def _payloads(paths: Optional[Iterable[Path]]) -> list[tuple[Path, dict]]:
    files = list(paths) if paths else sorted(p for p in RESULTS.rglob("*.json*") if p.is_file())
    out = []
    for f in files:
        text = f.read_text()
        docs = [json.loads(x) for x in text.splitlines() if x.strip()] if f.suffix == ".jsonl" else [json.loads(text)]
        out += [(f, d) for d in docs if isinstance(d, dict) and "results" in d]
    return out


def device_of(gpu_name: Optional[str]) -> Optional[devices.DeviceModel]:
    """The device model a run's rows are predicted on (devices.device_for_gpu); None: the rows are not compared."""
    return devices.device_for_gpu(gpu_name)


def rows(paths: Optional[Iterable[Path]] = None, skipped: Optional[list] = None) -> list[dict]:
    """Measured cuda rows joined with their prediction: [{file, device, ctx, tree, layout, config, measured_us,
    predicted_us, ratio, kernel}]; rows whose kernel the model cannot read go to `skipped` (why, one line each)."""
    skipped = [] if skipped is None else skipped
    out = []
    for f, pl in _payloads(paths):
        dev = device_of(pl.get("device"))
        if dev is None:
            continue
        sh = pl["shape"]
        shape = HeadShape(sh["name"], sh["hq"], sh["hkv"], sh["dqk"], sh["dv"], sh["sm_scale"], sh["mla"])
        kv_dtype = pl.get("kv_dtype") or pl.get("dtype", "bf16")
        head = vb.head_key(shape.head_dim_qk, shape.head_dim_v, shape.mla,
                           kv_dtype if kv_dtype.startswith("fp8") else False)
        if head is None:
            continue
        for r in pl["results"]:
            cfg = r.get("config") or {}
            if r.get("backend", "").partition("@")[0] != "cuda" or r.get("status") != "ok" or not r.get("median_us") \
                    or not cfg:
                continue
            tile = next((t for t in vb.TILES[head] if (t.block_m, t.block_n, t.num_warps, t.num_stages) ==
                         (cfg["block_m"], cfg["block_n"], cfg["num_warps"], cfg["num_stages"])), None)
            if tile is None:
                continue
            try:
                km = kernels.find(dev.arch, head, pl.get("dtype", "bf16"), r["layout"], tile)
            except LookupError as e:  # a kernel the model cannot read (e.g. a loop without a readable trip count)
                skipped.append(f"{f.name}: {r['backend']} {head} {r['layout']} ctx {r['ctx']}: {e}")
                continue
            if not pl.get("split_pdl", False):  # measured with the split kernel launched plainly (VERIFY_ATTN_NO_PDL,
                km = replace(km, split_pdl=False)  # or before 2026-12-07, when it was the only launch)
            case = predict.Case(shape, r["ctx"], r["tree_nodes"], pl.get("batch", 1), r["layout"], r["page_size"],
                                pl.get("tree_shape", "ddtree"), kv_dtype=kv_dtype)
            p = predict.predict(km, dev, case, cfg.get("num_splits") or None)
            out.append({"file": str(f), "device": dev.key, "backend": r["backend"], "ctx": r["ctx"], "tree_nodes": r["tree_nodes"],
                        "layout": r["layout"], "page_size": r["page_size"], "kernel": km.name,
                        "num_splits": p.num_splits, "measured_us": r["median_us"], "predicted_us": p.total_us,
                        "ratio": r["median_us"] / p.total_us, "bound": p.bound})
    return out


def calibrate(paths: Optional[list[Path]] = None, json_path: Optional[str] = None) -> int:
    skipped: list[str] = []
    rs = rows(paths, skipped)
    for why in skipped:
        print(f"not predicted: {why}")
    if json_path:
        Path(json_path).write_text(json.dumps({"rows": rs, "within_25pct": sum(0.75 <= r["ratio"] <= 1.25 for r in rs)},
                                              indent=1))
    if not rs:
        where = ", ".join(map(str, paths)) if paths else f"{RESULTS} (recursively)"
        print(f"bench.model --calibrate: no measured cuda rows on a modelled device in {where}; "
              "run `python -m bench.gpu_check` on a GPU first")
        return 0
    print(f"{'device':13} {'kernel':44} {'ctx':>7} {'T':>4} {'layout':7} {'S':>4} {'measured':>9} {'model':>9} "
          f"{'meas/model':>10}  bound")
    for r in rs:
        lay = r["layout"] if r["layout"] == "page1" else f"p{r['page_size']}"
        print(f"{r['device']:13} {r['kernel']:44} {r['ctx']:>7} {r['tree_nodes']:>4} {lay:7} {r['num_splits']:>4} "
              f"{r['measured_us']:>9.1f} {r['predicted_us']:>9.1f} {r['ratio']:>10.2f}  {r['bound']}")
    within = sum(1 for r in rs if 0.75 <= r["ratio"] <= 1.25)
    print(f"{within}/{len(rs)} rows within +-25%")
    return 0
