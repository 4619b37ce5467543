"""What was measured, beside what the model predicts: the committed bench.verify results under bench/results/.

`last_measured(...)`: for one shape (head shape, dtypes, ctx, tree, layout, batch), the latest timed `cuda` row
per (device, kernel) across every committed run, with its date and file. `verdicts()`: per (device, kernel
version, cache format) whether `python -m bench.model --validate` finds the model within +-25% of that
kernel's measured rows (cached on disk, keyed by the model's sources, the kernels' sources and the results).
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"


def kernel_label(family: str, block_m: int, block_n: int, warps: int, stages: int) -> str:
    """'v3-sm120 m32n16w20s4': a compiled tile by its kernel family (build.Tile.family) and shape."""
    return f"{family} m{block_m}n{block_n}w{warps}s{stages}"


def model_kernel_label(name: str) -> str:
    """'split bf16 576x512 page1 v2 m64 n32 w8 s3 wg2 wgmma' -> 'v2 m64n32w8s3' (the name itself if unparsed): the
    tile's family (build.label_family) and shape, as _row_kernel labels a measured row."""
    from verify_attn import build as vb
    m = vb.LABEL_RE.search(name or "")
    return kernel_label(vb.label_family(name), *map(int, m.groups()[1:])) if m else (name or "?")


def kv_format(kv_dtype: str) -> str:
    """The cache-format names bench.model --validate groups kernels by."""
    return {"fp8_e4m3": "e4m3", "fp8_mla656": "656"}.get(kv_dtype, "bf16")


def _payloads() -> list[tuple[Path, dict]]:
    out = []
    for f in sorted(RESULTS.rglob("*.json*")):
        if not f.is_file() or f.suffix not in (".json", ".jsonl"):
            continue
        try:
            text = f.read_text()
            docs = [json.loads(x) for x in text.splitlines() if x.strip()] if f.suffix == ".jsonl" else [json.loads(text)]
        except (OSError, ValueError):
            continue
        out += [(f, d) for d in docs if isinstance(d, dict) and isinstance(d.get("results"), list) and d.get("device")]
    return out


def _row_kernel(row: dict, head: Optional[str]) -> Optional[str]:
    """The kernel a measured cuda row ran: its config's compiled tile (version and tile)."""
    from verify_attn import build as vb
    cfg = row.get("config") or {}
    if head is None or not cfg:
        return None
    key = (cfg.get("block_m"), cfg.get("block_n"), cfg.get("num_warps"), cfg.get("num_stages"))
    t = next((t for t in vb.TILES.get(head, ()) if (t.block_m, t.block_n, t.num_warps, t.num_stages) == key), None)
    return None if t is None else kernel_label(t.family, *key)


def measured_devices() -> dict[str, str]:
    """{model device key: GPU name} of every device with committed results."""
    from bench.model.calibrate import device_of
    out = {}
    for _f, pl in _payloads():
        d = device_of(pl["device"])
        if d is not None:
            out.setdefault(d.key, pl["device"])
    return out


def last_measured(shape: dict, dtype: str, kv_dtype: str, ctx: int, tree_nodes: int, layout: str, page_size: int,
                  batch: int = 1, tree_shape: str = "ddtree") -> dict[str, list[dict]]:
    """{device key: [{kernel, backend, us, date, file}, ...]}: the latest timed cuda row per kernel at exactly this
    shape, fastest first; a tie in date prefers the named JSON over verify_runs.jsonl (the same run)."""
    from bench.model.calibrate import device_of
    from verify_attn import build as vb
    best: dict[tuple[str, str], dict] = {}
    dims = ("hq", "hkv", "dqk", "dv", "mla")
    for f, pl in _payloads():
        dev = device_of(pl["device"])
        sh = pl.get("shape") or {}
        if dev is None or any(sh.get(k) != shape.get(k) for k in dims) or pl.get("dtype") != dtype \
                or (pl.get("kv_dtype") or pl.get("dtype")) != kv_dtype or pl.get("batch", 1) != batch \
                or pl.get("tree_shape", "ddtree") != tree_shape:
            continue
        head = vb.head_key(sh["dqk"], sh["dv"], sh["mla"], kv_dtype if kv_dtype.startswith("fp8") else False)
        for r in pl["results"]:
            if r.get("backend", "").partition("@")[0] != "cuda" or r.get("status") != "ok" or not r.get("median_us") \
                    or (r.get("ctx"), r.get("tree_nodes"), r.get("layout"), r.get("page_size")) != \
                    (ctx, tree_nodes, layout, page_size):
                continue
            k = _row_kernel(r, head)
            if k is None:
                continue
            rec = {"kernel": k, "backend": r["backend"], "us": r["median_us"], "date": str(pl.get("date", ""))[:10],
                   "file": str(f.relative_to(REPO)), "_order": (str(pl.get("date", "")), f.suffix == ".json")}
            old = best.get((dev.key, k))
            if old is None or rec["_order"] > old["_order"]:
                best[(dev.key, k)] = rec
    out: dict[str, list[dict]] = {}
    for (d, _k), rec in best.items():
        rec.pop("_order")
        out.setdefault(d, []).append(rec)
    for recs in out.values():
        recs.sort(key=lambda r: r["us"])
    return out


# ---------------------------------------------------------------- the model's verdicts per kernel

def _cache_key() -> str:
    h = hashlib.sha256()
    for root, pats in ((REPO / "bench" / "model", ("*.py",)), (REPO / "csrc", ("*.cuh", "*.h", "*.cu")),
                       (REPO / "verify_attn", ("build.py",))):
        for pat in pats:
            for p in sorted(root.rglob(pat)):
                h.update(str(p.relative_to(REPO)).encode() + p.read_bytes())
    for p in sorted(RESULTS.rglob("*.json*")):
        st = p.stat()
        h.update(f"{p.relative_to(REPO)} {st.st_size} {int(st.st_mtime)}".encode())
    return h.hexdigest()[:20]


def verdicts(use_cache: bool = True) -> dict[str, dict]:
    """{'h200 v2 bf16': {'within': False, 'rows': '0/28', 'range': '1.53-2.23', 'id': 'H200 v2 bf16'}, ...}: the
    kernel items of `python -m bench.model --validate` (bench.model.validate), cached. {} when the model cannot
    read the kernels here (no CUDA toolkit or SASS tools)."""
    from verify_attn.utils import cache_dir
    path = cache_dir() / "validate_verdicts.json"
    key = _cache_key()
    if use_cache:
        try:
            doc = json.loads(path.read_text())
            if doc.get("key") == key:
                return doc["verdicts"]
        except (OSError, ValueError, KeyError):
            pass
    from bench.model import validate
    out = {}
    try:
        items = validate._kernel_items()
    except (RuntimeError, LookupError, FileNotFoundError):
        return {}
    for it in items:
        m = re.search(r"(\d+/\d+) within \+-25%, range ([\d.]+-[\d.]+)", it.what)
        if it.within is None or not m:
            continue
        dev, ver, fmt = it.id.split()   # 'H200 v2 bf16'
        out[f"{dev.lower()} {ver} {fmt}"] = {"within": bool(it.within), "rows": m.group(1), "range": m.group(2),
                                             "id": it.id}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": key, "verdicts": out}, indent=1))
    except OSError:
        pass
    return out


def verdict_text(verdicts_: dict, device: str, kernel: str, kv_dtype: str, measured_here: bool) -> str:
    """One short cell: whether --validate backs the model's reading of `kernel` on `device`."""
    ver, fmt = kernel.split()[0], kv_format(kv_dtype)
    v = verdicts_.get(f"{device} {ver} {fmt}")
    if v is None:
        return f"not validated: no {ver} {fmt} rows" if measured_here else "not validated: never measured"
    return (f"validated: {v['rows']} {ver} rows" if v["within"]
            else f"NOT VALIDATED: {v['rows']} {ver} rows (meas/model {v['range']})")
