"""The resumable tuning cache: one JSON object {entry key: bucket result}, merged atomically.

Every write holds an exclusive fcntl lock on `.<name>.lock` (same folder) around
read-merge-write, writes a temporary file in the same folder, fsyncs it and
renames it over the cache (os.replace is atomic on POSIX), so concurrent
tuners (several processes, or a crash mid-write) never leave a torn file and
never drop each other's entries. Readers need no lock: they see the old or the
new file, whole. A cache that cannot be parsed is moved aside to
`<path>.corrupt` with a warning and tuning starts over from nothing.
"""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Optional

CACHE_FORMAT = "verify_attn.autotune_cache"
ENV_CACHE = "VERIFY_ATTN_AUTOTUNE_CACHE"


def default_cache_path() -> Path:
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env)
    from verify_attn.utils import cache_dir
    return cache_dir() / "autotune_cache.json"


def entry_key(*, device_name: str, backend: str, shape_key: str, mla: bool, dtype: str, page_size: int,
              batch: int, tree_kind: str, ctx: int, tree_nodes: int, kv_dtype: str = "") -> str:
    """One bucket of one tuning problem: everything that changes the measured winner (kv_dtype: an fp8
    storage format, "" for a cache in q's dtype, which keeps the keys of earlier caches)."""
    kv = f"|kv={kv_dtype}" if kv_dtype else ""
    return (f"device={device_name}|backend={backend}|{shape_key},mla={int(mla)}|dtype={dtype}{kv}|page{page_size}"
            f"|batch={batch}|tree_kind={tree_kind}|ctx={ctx}|tree={tree_nodes}")


def write_json_atomic(path: Path, doc: object) -> None:
    """Write JSON to a temp file next to `path`, fsync, rename over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock on the hidden file `.<name>.lock` next to `path` (blocks until free)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "a+") as lf:
        fcntl.flock(lf.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lf.fileno(), fcntl.LOCK_UN)


class TuneCache:
    def __init__(self, path: Optional[str | os.PathLike] = None) -> None:
        self.path = Path(path) if path is not None else default_cache_path()

    def _read(self, quarantine: bool = False) -> dict[str, dict]:
        if not self.path.exists():
            return {}
        try:
            doc = json.loads(self.path.read_text())
            if (not isinstance(doc, dict) or doc.get("format") != CACHE_FORMAT
                    or not isinstance(doc.get("entries"), dict)):
                raise ValueError("not an autotune cache")
            return doc["entries"]
        except (OSError, ValueError) as e:
            bad = Path(str(self.path) + ".corrupt")
            what = f"moved to {bad}, starting empty" if quarantine else "ignored"
            warnings.warn(f"autotune cache {self.path} is unreadable ({e}); {what}", RuntimeWarning, stacklevel=3)
            if quarantine:  # only under the lock, so no writer is racing us
                try:
                    os.replace(self.path, bad)
                except OSError:
                    pass
            return {}

    def load(self) -> dict[str, dict]:
        """Every entry (no lock: the file is always whole)."""
        return self._read()

    def get(self, key: str) -> Optional[dict]:
        return self._read().get(key)

    def merge(self, entries: Mapping[str, dict]) -> dict[str, dict]:
        """Add/replace `entries` under the lock; returns the merged contents."""
        with file_lock(self.path):
            cur = self._read(quarantine=True)
            cur.update(entries)
            write_json_atomic(self.path, {"format": CACHE_FORMAT, "version": 1, "entries": cur})
            return cur
