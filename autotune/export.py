"""Export tuned buckets as the JSON files `verify_attn.tuned` reads.

One file per (device name, backend, head shape, dtype, layout, page size), named
like serving engines name theirs (`TableKey.filename()`), holding per
(context bucket, tree-size bucket): the config, its measured time, the floor,
the default heuristic's time and the gain over it; plus the software versions,
the commit and the date. Exporting into a file that already exists merges
bucket by bucket (new results win), under the same lock + atomic rename as the
cache.
"""
from __future__ import annotations

import datetime as _dt
import json
import platform
import subprocess
from pathlib import Path
from typing import Iterable, Optional

from verify_attn.tuned import ConfigTable, TableError, TableKey, load_table, table_to_json

from .cache import file_lock, write_json_atomic
from .search import BucketResult

DEFAULT_EXPORT_DIR = Path(__file__).resolve().parent / "configs"


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5)
        return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def software_versions() -> dict[str, Optional[str]]:
    import torch

    import verify_attn
    try:
        import triton
        triton_v: Optional[str] = triton.__version__
    except ImportError:
        triton_v = None
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "triton": triton_v, "verify_attn": verify_attn.__version__, "commit": git_commit()}


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def bucket_extra(r: BucketResult) -> dict:
    """What a file records per bucket beside the config (no trial log: that stays in the cache)."""
    d = r.to_dict()
    return {k: d[k] for k in ("time_us", "floor_us", "frac_of_floor", "default_config", "default_us",
                              "gain_over_default")}


def build_table(key: TableKey, results: Iterable[BucketResult], *, batch: int = 1,
                meta: Optional[dict] = None, extra: Optional[dict] = None) -> tuple[ConfigTable, dict]:
    """(table, per-bucket extras) from results that found a correct config; `extra`: more per-bucket
    facts by (ctx, tree_nodes) (a model-sourced table's band and tie notes)."""
    entries, extras = {}, {}
    for r in results:
        if r.best is None:
            continue
        entries[(r.ctx, r.tree_nodes)] = r.best
        extras[(r.ctx, r.tree_nodes)] = {**bucket_extra(r), **(extra or {}).get((r.ctx, r.tree_nodes), {})}
    if not entries:
        raise TableError("no bucket has a correct, timed config: nothing to export")
    return ConfigTable(key, entries, batch, "export", dict(meta or {})), extras


def kernel_versions_meta(plan) -> dict:
    """{"kernel_versions": [...]} for a plan tuned over some kernel versions only (--versions), else {}: a table
    that never saw a version must say so, or a reader takes its pick for the fastest of every kernel."""
    return {} if plan.versions is None else {"kernel_versions": sorted(plan.versions)}


def export_table(out_dir: str | Path, key: TableKey, results: Iterable[BucketResult], *, batch: int = 1,
                 meta: Optional[dict] = None, source: str = "measured", extra: Optional[dict] = None) -> Path:
    """Write (or merge into) `out_dir/<key.filename(source)>`; returns the path. source: "measured" (timed
    on the GPU) or "model" (bench.model's choice, verify_attn.tuned ranks it below a measured table)."""
    table, extras = build_table(key, results, batch=batch, meta={**(meta or {}), "source": source}, extra=extra)
    path = Path(out_dir) / key.filename(source)
    with file_lock(path):
        old_rows: list[dict] = []
        if path.exists():
            try:
                old = load_table(path)
                if old.key.matches(key) and old.batch == batch:
                    old_doc = json.loads(path.read_text())
                    old_rows = [r for r in old_doc["buckets"] if (r["ctx"], r["tree_nodes"]) not in table.entries]
            except TableError:
                old_rows = []  # an unreadable file is replaced, not merged
        doc = table_to_json(table, extras)
        doc["buckets"] = sorted(old_rows + doc["buckets"], key=lambda r: (r["ctx"], r["tree_nodes"]))
        write_json_atomic(path, doc)
    return path
