"""Run-time lookup of autotuned kernel configs (`tree_verify(config=None)`).

Tuned configs are data: one JSON file per (device, backend, head shape, dtype,
KV storage format (fp8 caches only: `kv_dtype=` in the name), layout, page size), written by `python -m autotune` (see autotune/configs/README.md
for how they are made). Each file maps (context bucket, tree-size bucket) to a
KernelConfig.

Lookup order (FlashInfer's): tables registered in memory (`register`), then the
user's file or folder (`set_config_file`, or env VERIFY_ATTN_CONFIG_FILE), then
the bundled folder `autotune/configs/`, then None, and the api falls back to the
backend's default heuristic. Within a folder, a table's source decides: measured
(tuned on the GPU itself; files without a "source" field are measured) before model
(`python -m autotune --cost model`: chosen by bench.model's prediction, file name
ending `,source=model.json`). So: measured > model > heuristic; `explain()` (and
`python -m autotune show`) says which one serves a key.

Bucket rule, the same for context and tree size: the largest bucket not above
the call's value, else the smallest bucket. The call's context is
`problem.avg_kv_len` (KV tokens per request: prefix + tree, from tensor sizes)
and its tree size is ceil(total_q / batch) (nodes per request); both come from
static shapes, so the lookup reads no device memory and is CUDA-graph safe.
When the call's batch differs from the batch the table was tuned at, num_splits
is scaled by tuned_batch / batch so the grid keeps the CTA count that won.

A malformed file, or one whose contents contradict its name, gives one warning
and is skipped, never an exception. Malformed includes a value of the wrong JSON
type (the strings "16", the float 16.9 and true are not ints: nothing is coerced)
and a value past its cap (config.CONFIG_CAPS, e.g. num_splits <= 1024; batch <=
MAX_BATCH; ctx <= MAX_CTX; tree_nodes <= MAX_TREE_NODES), since a file is data a
user may have edited or another tool written; so does a bucket naming a tile config the
backend's `config_space` does not offer on this GPU's arch (a stale file). The
table chosen for a shape key is cached, so a call costs a dict lookup and two
bisections (~2 us on the CPU).
"""
from __future__ import annotations

import bisect
import json
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from .config import MAX_SPLITS, KernelConfig

FORMAT = "verify_attn.tuned_configs"
FORMAT_VERSION = 1
ENV_FILE = "VERIFY_ATTN_CONFIG_FILE"
BUNDLED_DIR = Path(__file__).resolve().parent.parent / "autotune" / "configs"

_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}

# Caps on a file's values (beyond them a file is malformed): batch scales num_splits by
# tuned_batch / batch, so 10**6 would ask for a million splits; contexts fit kv_lens (int32).
MAX_BATCH = 4096
MAX_CTX = 2**31 - 1
MAX_TREE_NODES = 65536


def _int_field(where: str, name: str, v: Any, lo: int, hi: int) -> int:
    """v itself if it is an int (not a bool) in [lo, hi], else TableError naming the field."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TableError(f"{where}: {name} must be an int, got {type(v).__name__} {v!r}")
    if not lo <= v <= hi:
        raise TableError(f"{where}: {name} must be in [{lo}, {hi}], got {v}")
    return v


class TableError(ValueError):
    """A tuned-config file that cannot be used (malformed, or mismatched with its name)."""


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise ValueError(f"no tuned-config name for dtype {dtype}") from None


def device_token(name: str) -> str:
    """'NVIDIA H200' -> 'NVIDIA_H200' (what file names and key comparisons use)."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", name.strip()).strip("_")


@dataclass(frozen=True)
class TableKey:
    """What a tuned-config file is for. Two calls with equal keys share a table."""

    device_name: str
    backend: str
    hq: int
    hkv: int
    dqk: int
    dv: int
    dtype: str        # 'bf16' | 'fp16' | 'fp32'
    page_size: int
    mla: bool = False
    kv_dtype: str = ""  # "" = the cache has q's dtype; "fp8_e4m3" | "fp8_mla656": the fp8 storage format

    @property
    def layout(self) -> str:
        return f"page{self.page_size}"

    def filename(self, source: str = "measured") -> str:
        """Serving-engine style: device_name=NVIDIA_H200,backend=cuda,dqk=576,...,layout=page1.json
        (a model-sourced table: ...,layout=page1,source=model.json)."""
        kv = f",kv_dtype={self.kv_dtype}" if self.kv_dtype else ""   # 16-bit caches keep their old names
        src = "" if source == "measured" else f",source={source}"
        return (f"device_name={device_token(self.device_name)},backend={self.backend},dqk={self.dqk},dv={self.dv},"
                f"hq={self.hq},hkv={self.hkv},dtype={self.dtype}{kv},layout={self.layout}{src}.json")

    def to_dict(self) -> dict[str, Any]:
        d = {"device_name": self.device_name, "backend": self.backend, "hq": self.hq, "hkv": self.hkv,
             "dqk": self.dqk, "dv": self.dv, "mla": self.mla, "dtype": self.dtype, "layout": self.layout,
             "page_size": self.page_size}
        if self.kv_dtype:
            d["kv_dtype"] = self.kv_dtype
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TableKey":
        try:
            strs = [d[k] for k in ("device_name", "backend", "dtype")]
            if not all(isinstance(x, str) for x in strs):
                raise TypeError("device_name, backend and dtype must be strings")
            ints = [_int_field("key", k, d[k], 1, 1 << 20) for k in ("hq", "hkv", "dqk", "dv", "page_size")]
            mla = d.get("mla", False)
            if not isinstance(mla, bool):
                raise TypeError(f"mla must be true or false, got {mla!r}")
            kv = d.get("kv_dtype", "")
            if kv not in ("", "fp8_e4m3", "fp8_mla656"):
                raise TypeError(f"kv_dtype must be absent, 'fp8_e4m3' or 'fp8_mla656', got {kv!r}")
            key = cls(strs[0], strs[1], *ints[:4], strs[2], ints[4], mla, kv)
        except (KeyError, TypeError, ValueError) as e:
            raise TableError(f"bad key {dict(d) if isinstance(d, Mapping) else d!r}: {e}") from None
        if "layout" in d and d["layout"] != key.layout:
            raise TableError(f"key layout {d['layout']!r} does not match page_size {key.page_size}")
        return key

    def matches(self, other: "TableKey") -> bool:
        return (self.backend, self.hq, self.hkv, self.dqk, self.dv, self.dtype, self.page_size, self.mla,
                self.kv_dtype) == (
            other.backend, other.hq, other.hkv, other.dqk, other.dv, other.dtype, other.page_size, other.mla,
            other.kv_dtype
        ) and device_token(self.device_name) == device_token(other.device_name)


def pick_bucket(buckets: list[int], value: int) -> int:
    """The largest bucket <= value, else the smallest. `buckets` sorted ascending, non-empty."""
    i = bisect.bisect_right(buckets, value)
    return buckets[i - 1] if i > 0 else buckets[0]


@dataclass
class ConfigTable:
    key: TableKey
    entries: dict[tuple[int, int], KernelConfig]   # (ctx, tree_nodes) -> config
    batch: int = 1
    source: str = "memory"
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.entries:
            raise TableError(f"{self.source}: table has no buckets")
        if self.batch < 1:
            raise TableError(f"{self.source}: batch must be >= 1, got {self.batch}")
        self._ctx = sorted({c for c, _ in self.entries})
        self._trees = {c: sorted(t for cc, t in self.entries if cc == c) for c in self._ctx}

    def pick(self, ctx: int, tree_nodes: int, batch: int = 1) -> KernelConfig:
        c = pick_bucket(self._ctx, ctx)
        cfg = self.entries[(c, pick_bucket(self._trees[c], tree_nodes))]
        if batch != self.batch and cfg.num_splits > 0:
            cfg = cfg.replace(num_splits=min(MAX_SPLITS, max(1, round(cfg.num_splits * self.batch / batch))))
        return cfg


# --- file format --------------------------------------------------------------

SOURCES = ("measured", "model")   # lookup rank: a measured table wins over a model-sourced one


def table_source(table: ConfigTable) -> str:
    """'measured' (timed on the GPU; tables written before the field existed are) or 'model'."""
    return str(table.meta.get("source", "measured"))


def table_to_json(table: ConfigTable, buckets_extra: Optional[Mapping[tuple[int, int], dict]] = None) -> dict:
    """The exported document. `buckets_extra` adds per-bucket facts (time_us, floor_us, gain...)."""
    rows = []
    for (c, t), cfg in sorted(table.entries.items()):
        row = {"ctx": c, "tree_nodes": t, "config": cfg.to_dict()}
        row.update((buckets_extra or {}).get((c, t), {}))
        rows.append(row)
    return {"format": FORMAT, "version": FORMAT_VERSION, "key": table.key.to_dict(), "batch": table.batch,
            **table.meta, "buckets": rows}


def table_from_json(doc: Any, source: str = "<json>") -> ConfigTable:
    if not isinstance(doc, dict):
        raise TableError(f"{source}: top level must be an object, got {type(doc).__name__}")
    if doc.get("format") != FORMAT:
        raise TableError(f"{source}: format is {doc.get('format')!r}, want {FORMAT!r}")
    if doc.get("version") != FORMAT_VERSION:
        raise TableError(f"{source}: version {doc.get('version')!r} is not {FORMAT_VERSION}")
    key = TableKey.from_dict(doc.get("key") if isinstance(doc.get("key"), Mapping) else {})
    rows = doc.get("buckets")
    if not isinstance(rows, list) or not rows:
        raise TableError(f"{source}: 'buckets' must be a non-empty list")
    entries: dict[tuple[int, int], KernelConfig] = {}
    for i, r in enumerate(rows):
        try:
            if not isinstance(r, Mapping):
                raise TypeError(f"a bucket must be an object, got {type(r).__name__}")
            c = _int_field("", "ctx", r["ctx"], 1, MAX_CTX)
            t = _int_field("", "tree_nodes", r["tree_nodes"], 1, MAX_TREE_NODES)
            entries[(c, t)] = KernelConfig.from_dict(r["config"])
        except (KeyError, TypeError, ValueError) as e:   # TableError is a ValueError
            raise TableError(f"{source}: bucket {i} is malformed: {str(e).removeprefix(': ')}") from None
    meta = {k: v for k, v in doc.items() if k not in ("format", "version", "key", "batch", "buckets")}
    batch = _int_field(source, "batch", doc.get("batch", 1), 1, MAX_BATCH)
    return ConfigTable(key, entries, batch, source, meta)


def load_table(path: str | os.PathLike) -> ConfigTable:
    """Read one exported file; TableError if unusable (including a name that contradicts the contents)."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TableError(f"{p}: cannot read JSON: {e}") from None
    table = table_from_json(doc, str(p))
    src = table_source(table)
    if src not in SOURCES:
        raise TableError(f"{p}: source {src!r} is not one of {', '.join(SOURCES)}")
    if p.name.startswith("device_name=") and p.name != table.key.filename(src):
        raise TableError(f"{p}: contents are for {table.key.filename(src)}, not what the file name says")
    return table


# --- the lookup -----------------------------------------------------------------

_memory: list[ConfigTable] = []
_user_path: Optional[str] = None          # set_config_file(); else env var at first use
_user_path_set = False
_resolved: dict[tuple, Optional[ConfigTable]] = {}
_dir_tables: dict[str, list[ConfigTable]] = {}
_warned: set[str] = set()
_device_names: dict[int, str] = {}
_arch_names: dict[int, str] = {}
_fast: dict[tuple, Optional[ConfigTable]] = {}   # plain-tuple shape key -> table (the per-call path)


def _warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(f"verify_attn.tuned: {msg}; using the fallback", RuntimeWarning, stacklevel=3)


def register(table: ConfigTable) -> None:
    """Put a table in memory; it wins over files (e.g. configs tuned in this process)."""
    _memory.insert(0, table)
    _resolved.clear()
    _fast.clear()


def set_config_file(path: Optional[str | os.PathLike]) -> None:
    """User tuned-config file or folder of files; None: back to env VERIFY_ATTN_CONFIG_FILE, then bundled."""
    global _user_path, _user_path_set
    _user_path = None if path is None else str(path)
    _user_path_set = path is not None
    _resolved.clear()
    _fast.clear()
    _dir_tables.clear()


def clear() -> None:
    """Forget memory tables and every cached resolution (tests; after writing new files)."""
    global _user_path, _user_path_set
    _memory.clear()
    _resolved.clear()
    _fast.clear()
    _dir_tables.clear()
    _warned.clear()
    _user_path, _user_path_set = None, False


def _tables_in(path: str, explicit: bool) -> list[ConfigTable]:
    """Tables of a file or folder, read once. Bad files warn once and are skipped."""
    if path in _dir_tables:
        return _dir_tables[path]
    p = Path(path)
    files = sorted(p.glob("*.json")) if p.is_dir() else [p]
    out = []
    if explicit and not p.exists():
        _warn_once(f"config file {p} does not exist")
    for f in files:
        if not f.exists():
            continue
        try:
            out.append(load_table(f))
        except TableError as e:
            _warn_once(str(e))
    _dir_tables[path] = out
    return out


def arch_name(index: int) -> str:
    """'sm_90a' / 'sm_120a' (the names the backends' config_space hooks take), cached per device index."""
    name = _arch_names.get(index)
    if name is None:
        major, minor = torch.cuda.get_device_capability(index)
        name = _arch_names[index] = {9: "sm_90a", 12: "sm_120a"}.get(major, f"sm_{major}{minor}")
    return name


def _usable(table: ConfigTable, backend_name: str, p) -> Optional[ConfigTable]:
    """The table without buckets whose tile the backend does not have (a stale file must not crash a call).

    Checked once per shape key against the backend's config_space for this
    device's arch; when that cannot be asked, the table is used as it is.
    """
    try:
        from .backends import get_backend
        b = get_backend(backend_name)
        if b.config_space is None:
            return table
        idx = p.device.index if p.device.index is not None else torch.cuda.current_device()
        kw = {"kv_dtype": _fp8_kv(p)} if _fp8_kv(p) else {}   # tiles that fit with fp8 conversion in registers
        have = {c.replace(num_splits=0) for c in b.config_space(p.head_shape(), arch_name(idx), dtype=p.dtype,
                                                                 page_size=p.page_size, **kw)}
    except Exception:
        return table
    bad = {k: c for k, c in table.entries.items() if c.replace(num_splits=0) not in have}
    if not bad:
        return table
    (c, t), cfg = next(iter(sorted(bad.items())))
    _warn_once(f"{table.source}: {len(bad)} bucket(s) name tile configs backend {backend_name!r} does not have "
               f"(e.g. ctx {c} tree {t}: {cfg}); those buckets are skipped")
    keep = {k: v for k, v in table.entries.items() if k not in bad}
    return ConfigTable(table.key, keep, table.batch, table.source, table.meta) if keep else None


def device_name(index: int) -> str:
    """torch.cuda.get_device_name, cached per device index (a host query, no device sync)."""
    name = _device_names.get(index)
    if name is None:
        name = _device_names[index] = torch.cuda.get_device_name(index)
    return name


def _fp8_kv(p) -> str:
    """The problem's fp8 storage format, "" for a cache in q's dtype (problem-like objects without the
    field count as 16-bit)."""
    kv = getattr(p, "kv_dtype", "")
    return kv if kv in ("fp8_e4m3", "fp8_mla656") else ""


def problem_key(p, backend_name: str) -> Optional[TableKey]:
    """The table key of a validated Problem, or None when nothing can be tuned for it (CPU tensors)."""
    if p.device.type != "cuda" or p.dtype not in _DTYPE_NAMES:
        return None
    idx = p.device.index if p.device.index is not None else torch.cuda.current_device()
    return TableKey(device_name(idx), backend_name, p.num_q_heads, p.num_kv_heads, p.head_dim_qk, p.head_dim_v,
                    _DTYPE_NAMES[p.dtype], p.page_size, bool(p.mla_shared_kv), _fp8_kv(p))


def _best_of(tables: list[ConfigTable], key: TableKey) -> Optional[ConfigTable]:
    """The matching table of a folder: measured before model."""
    hits = [t for t in tables if t.key.matches(key)]
    return min(hits, key=lambda t: SOURCES.index(table_source(t))) if hits else None


def find_table(key: TableKey) -> Optional[ConfigTable]:
    """Memory, then the user's file/folder, then the bundled folder (in a folder: measured, then model);
    cached per key."""
    if key in _resolved:
        return _resolved[key]
    found = next((t for t in _memory if t.key.matches(key)), None)
    if found is None:
        user = _user_path if _user_path_set else os.environ.get(ENV_FILE) or None
        if user:
            tables = _tables_in(user, explicit=True)
            found = _best_of(tables, key)
            if found is None and not Path(user).is_dir() and tables:
                _warn_once(f"config file {user} is for {tables[0].key.filename()}, not {key.filename()}")
    if found is None:
        found = _best_of(_tables_in(str(BUNDLED_DIR), explicit=False), key)
    _resolved[key] = found
    return found


def explain(key: TableKey, ctx: int, tree_nodes: int, batch: int = 1) -> dict:
    """Which source serves calls of `key` at (ctx, tree_nodes): {"source": measured | model | heuristic,
    "file", "config", "bucket"} (no device needed; the tile check against this GPU's arch is not made)."""
    t = find_table(key)
    if t is None:
        return {"source": "heuristic", "file": None, "config": None, "bucket": None,
                "why": "no tuned table for this key: the backend's default heuristic serves it"}
    c = pick_bucket(t._ctx, ctx)
    tn = pick_bucket(t._trees[c], tree_nodes)
    out = {"source": table_source(t), "file": t.source, "config": t.pick(ctx, tree_nodes, batch).to_dict(),
           "bucket": {"ctx": c, "tree_nodes": tn}}
    if table_source(t) == "model":
        out["model_version"] = t.meta.get("model_version")
        out["arch"] = t.meta.get("arch")
    if t.meta.get("kernel_versions") is not None:   # chosen over these kernel versions only (autotune --versions)
        out["kernel_versions"] = t.meta["kernel_versions"]
    return out


def lookup(problem, backend_name: str) -> Optional[KernelConfig]:
    """Tuned config for this call, or None (then the backend's default heuristic applies)."""
    try:
        dev = problem.q.device
        if dev.type != "cuda":
            return None
        fk = (backend_name, dev.index, problem.num_q_heads, problem.num_kv_heads, problem.head_dim_qk,
              problem.head_dim_v, problem.q.dtype, problem.page_size, problem.mla_shared_kv, _fp8_kv(problem))
        try:
            table = _fast[fk]
        except KeyError:
            key = problem_key(problem, backend_name)
            table = None if key is None else find_table(key)
            table = _fast[fk] = None if table is None else _usable(table, backend_name, problem)
        if table is None:
            return None
        tree = -(-problem.total_q // problem.batch)
        return table.pick(problem.avg_kv_len, tree, problem.batch)
    except Exception as e:  # a lookup must never take down a forward pass
        _warn_once(f"lookup failed ({type(e).__name__}: {e})")
        return None
