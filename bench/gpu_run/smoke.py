"""python -m bench.gpu_run.smoke: each kernel that no GPU has run yet, once, alone, before a GPU session times anything.

Kernel v3 (both the sm_120 tiles and Hopper's) has passed the emulator's strict mbarrier, named-barrier and
proxy-fence checks, but no GPU has run it. On hardware a protocol slip the emulator does not model shows up as a
hang (a barrier phase that never completes) or a crash (an illegal address, which also poisons the CUDA context of
the process, so every later call in it fails). Inside `bench.gpu_check` either would take a whole stage with it:
pytest stops at the hung test and the tests after it never run; a benchmark stage loses its other backends' rows
and its full time cap. With 15 minutes of device time a session, that is the run.

So the session's first GPU stage runs each (backend, KV dtype) here, each in its own process, side by side, under a
timeout: `bench.verify` at a short context (page 1 and paged 64, 16 and 64 nodes, the split heuristic's count and
97 splits, some of them empty; the float64 reference check, then a few CUDA-graph replays). A job that hangs is
killed (its process group), one that crashes or reports an error row is recorded with its log's tail, and each of
them is **quarantined**: "version/kv" and "tile/kv" entries ("v3-sm120/bf16", "m32n16w20s4/bf16") that
`bench.gpu_check` removes from every later stage (the benchmark backends, the knockout and ncu versions) and passes
on in VERIFY_ATTN_QUARANTINE, where the GPU tests of that version or tile skip and say why and the autotuner does
not offer the tile (verify_attn/backends/cuda.py, `quarantined`). A wrong result is recorded but not quarantined:
bench.verify reports it and never times it, and the process goes on.

    python -m bench.gpu_run.smoke --backend cuda@v3-sm120,cuda@v3 --kv-dtype bf16,fp8_e4m3 --json smoke.json
    python -m bench.gpu_run.smoke --backend cuda@v3,cuda@m32n16w9s4/bf16 --kv-dtype fp8_e4m3 --json smoke.json
                                                         (a backend written name/kv runs on that kv dtype alone)

Without a GPU each job's bench.verify only counts and times the CPU reference, so every job reads 'no-gpu'.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
QUARANTINED = ("hang", "crash", "error")  # statuses that keep a job's version out of the later stages
DEFAULT_TIMEOUT_S = 20.0                # a healthy job takes ~8-10 s on the H200 machine (one bench.verify stage)
KV_DTYPES = ("bf16", "fp16", "fp8_e4m3", "fp8_mla656")
MANY_SPLITS = 97   # each job also runs the kernel at this many splits: more than a 1.5k context has tiles (empty ones)


@dataclass
class Job:
    backend: str          # a bench.verify backend name, e.g. cuda@v3-sm120
    kv_dtype: str         # bf16 | fp8_e4m3 | fp8_mla656
    tile: Optional[str]   # the compiled tile it pins on this device's arch (m32n16w20s4), when it names one
    argv: list[str]
    json_path: str
    log_path: str
    status: str = "pending"   # ok | wrong | error | crash | hang | unsupported | no-gpu | failed to start
    wall_s: float = 0.0
    rc: Optional[int] = None
    note: str = ""
    rows: list = field(default_factory=list)   # (backend, tree nodes, layout, status, max_rel_err) of each row

    @property
    def key(self) -> str:
        return quarantine_key(self.backend, self.kv_dtype)

    @property
    def backends(self) -> tuple[str, ...]:
        """The backend names its bench.verify rows carry: the kernel at the split heuristic's count and at
        MANY_SPLITS (unless the name pins a count already)."""
        return (self.backend,) if ":" in self.backend else (self.backend, f"{self.backend}:{MANY_SPLITS}")

    def quarantine_keys(self) -> list[str]:
        return [self.key] + ([quarantine_key(f"cuda@{self.tile}", self.kv_dtype)]
                             if self.tile and self.tile != version_of(self.backend) else [])


def version_of(backend: str) -> str:
    """'cuda@v3-sm120:15' -> 'v3-sm120'; 'cuda' -> 'cuda' (the arch's default has no version to name)."""
    name = backend.partition(":")[0]
    return name.partition("@")[2] or name


def quarantine_key(backend: str, kv_dtype: str) -> str:
    """'cuda@v3-sm120:15', 'fp16' -> 'v3-sm120/bf16' (verify_attn.backends.cuda.quarantine_key)."""
    from verify_attn.backends.cuda import quarantine_key as key
    return key(version_of(backend), kv_dtype)


def tile_of(backend: str, kv_dtype: str, arch: str, shape: str = "kimi-k2-tp8") -> Optional[str]:
    """The name of the compiled tile `backend` pins for the shape on `arch` (None for a peer or the arch's default)."""
    from verify_attn.backends import cuda
    from verify_attn.shapes import get_shape

    if backend.partition("@")[0] != "cuda" or "@" not in backend:
        return None
    head = cuda._shape_head(get_shape(shape), kv_dtype)
    t = cuda.pinned_tile(head, arch, version_of(backend)) if head else None
    return cuda.tile_name(t) if t else None


def verify_argv(backends: Sequence[str], kv_dtype: str, json_path: str, ctx: str = "1.5k") -> list[str]:
    """bench.verify at a short context: page 1 and paged 64, 16 and 64 nodes, a few reps under a CUDA graph (the
    reference check comes first in bench.verify; a wrong kernel is never timed)."""
    return [PY, "-m", "bench.verify", "--ctx", ctx, "--tree", "16,64", "--layout", "page1,paged", "--page-size", "64",
            "--backend", ",".join(backends), "--kv-dtype", kv_dtype, "--reps", "3", "--warmup", "1", "--max-seconds", "1",
            "--no-ceilings", "--no-model", "--no-save", "--quiet", "--json", json_path]


def make_jobs(backends: Sequence[str], kv_dtypes: Sequence[str], out: Path, ctx: str = "1.5k",
              arch: str = "sm_90a") -> list[Job]:
    """One job a (backend, kv dtype); a backend written 'name/kv' runs on that kv dtype alone."""
    jobs = []
    pairs = [(b.partition("/")[0], b.partition("/")[2]) if "/" in b else None for b in backends]
    todo = [(b, kv) for kv in kv_dtypes for b, p in zip(backends, pairs) if p is None]
    todo += [p for p in pairs if p is not None]
    for b, kv in todo:
        stem = f"smoke_{version_of(b)}_{kv}"
        jp, lp = out / f"{stem}.json", out / f"{stem}.log"
        j = Job(b, kv, tile_of(b, kv, arch), [], str(jp), str(lp))
        j.argv = verify_argv(j.backends, kv, str(jp), ctx)
        jobs.append(j)
    return jobs


def _tail(path: str, n: int = 4) -> str:
    try:
        return " | ".join(Path(path).read_text(errors="replace").strip().splitlines()[-n:])[-600:]
    except OSError:
        return ""


def classify(job: Job) -> None:
    """A finished job's status from its bench.verify JSON (rows) and exit code."""
    try:
        data = json.loads(Path(job.json_path).read_text())
    except (OSError, ValueError):
        data = None
    if data is None:
        job.status = "crash"
        job.note = f"exit {job.rc}, no results written: {_tail(job.log_path)}"
        return
    if not data.get("device"):   # bench.verify without a CUDA device: the reference alone, --backend ignored
        job.status, job.note = "no-gpu", "bench.verify found no CUDA device and ran no backend"
        return
    rows = [r for r in data.get("results", []) if r.get("backend") in job.backends]
    job.rows = [(r.get("backend"), r.get("tree_nodes"), r.get("layout"), r.get("status"), r.get("max_rel_err"))
                for r in rows]
    st = [r.get("status") for r in rows]
    if not st:
        job.status, job.note = "crash", f"exit {job.rc}, no row of {job.backend}: {_tail(job.log_path)}"
    elif "error" in st:
        job.status = "error"
        job.note = "; ".join(r.get("note", "") for r in rows if r.get("status") == "error")[:600]
    elif job.rc not in (0, None):
        job.status, job.note = "crash", f"exit {job.rc} after its rows: {_tail(job.log_path)}"
    elif "wrong" in st:
        job.status = "wrong"
        job.note = "; ".join(r.get("note", "") for r in rows if r.get("status") == "wrong")[:600]
    elif all(s == "ok" for s in st):
        job.status = "ok"
    elif all(s in ("unsupported", "skipped") for s in st):
        job.status, job.note = "unsupported", "; ".join(sorted({r.get("note", "") for r in rows}))[:600]
    else:
        job.status, job.note = "error", f"row statuses {sorted(set(st))}"


def _kill(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)   # the job and anything it started (the CUDA context goes with it)
    except (ProcessLookupError, PermissionError):
        p.kill()
    p.wait()


def run_jobs(jobs: Sequence[Job], timeout_s: float = DEFAULT_TIMEOUT_S, parallel: int = 8,
             env: Optional[Mapping[str, str]] = None, progress=print) -> list[Job]:
    """Run the jobs, at most `parallel` at a time, each in its own process group under `timeout_s`; classify each."""
    pending = list(jobs)
    running: list[tuple[Job, subprocess.Popen, float]] = []
    run_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    while pending or running:
        while pending and len(running) < max(1, parallel):
            j = pending.pop(0)
            Path(j.log_path).parent.mkdir(parents=True, exist_ok=True)
            Path(j.json_path).unlink(missing_ok=True)
            try:
                with open(j.log_path, "w") as f:
                    f.write("$ " + " ".join(j.argv) + "\n")
                    f.flush()
                    p = subprocess.Popen(j.argv, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=run_env,
                                         start_new_session=True)
            except OSError as e:
                j.status, j.note = "failed to start", str(e)
                continue
            running.append((j, p, time.perf_counter()))
        time.sleep(0.05)
        still = []
        for j, p, t0 in running:
            rc = p.poll()
            age = time.perf_counter() - t0
            if rc is None and age < timeout_s:
                still.append((j, p, t0))
                continue
            if rc is None:
                _kill(p)
                j.status, j.rc = "hang", None
                j.note = f"no exit after {timeout_s:.0f} s: killed; last output: {_tail(j.log_path)}"
            else:
                j.rc = rc
                classify(j)
            j.wall_s = round(age, 1)
            progress(f"[smoke] {j.key:24s} {j.status:11s} {j.wall_s:5.1f} s {j.note[:160]}")
        running = still
    return list(jobs)


def quarantine_of(jobs: Sequence[Job]) -> list[str]:
    """The VERIFY_ATTN_QUARANTINE entries of the jobs that hung, crashed or reported an error: the version's name
    and the tile it pins on this arch ("v3-sm120/bf16", "m32n16w20s4/bf16")."""
    return sorted({k for j in jobs if j.status in QUARANTINED for k in j.quarantine_keys()})


def write_json(jobs: Sequence[Job], path: Path, timeout_s: float) -> dict:
    rec = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "timeout_s": timeout_s, "quarantine": quarantine_of(jobs),
           "jobs": [{k: v for k, v in asdict(j).items() if k != "argv"} | {"argv": " ".join(j.argv)} for j in jobs]}
    path.write_text(json.dumps(rec, indent=1))
    return rec


def load_quarantine(path: Path) -> list[str]:
    """The quarantine list of a smoke.json, or [] when it is missing or unreadable (a smoke stage that did not
    finish quarantines nothing: the later stages run as planned)."""
    try:
        return list(json.loads(Path(path).read_text()).get("quarantine", []))
    except (OSError, ValueError, AttributeError):
        return []


def _device_arch() -> str:
    import torch

    from verify_attn import device as vdevice
    return vdevice.props_for(torch.device("cuda")).arch if torch.cuda.is_available() else "sm_90a"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_run.smoke", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", required=True, help="comma-separated bench.verify backends (cuda@v3-sm120,cuda@v3)")
    ap.add_argument("--kv-dtype", default="bf16", help="comma-separated KV dtypes, each job runs one (default bf16)")
    ap.add_argument("--ctx", default="1.5k", help="the short context each job runs (default 1.5k)")
    ap.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S,
                    help=f"a job still running after this is killed and reads 'hang' (default {DEFAULT_TIMEOUT_S:.0f})")
    ap.add_argument("--parallel", type=int, default=8, help="jobs at once (default 8; each is one process)")
    ap.add_argument("--out", default=None, help="folder for each job's log and JSON (default: beside --json)")
    ap.add_argument("--arch", default=None, help="the arch whose tiles the versions name (default: the GPU's, else "
                    "sm_90a)")
    ap.add_argument("--json", required=True, help="write the jobs, their statuses and the quarantine list here")
    a = ap.parse_args(argv)
    from verify_attn.utils import usage_error
    backends = [b.strip() for b in a.backend.split(",") if b.strip()]
    kvs = [k.strip() for k in a.kv_dtype.split(",") if k.strip()]
    bad = [k for k in kvs + [b.partition("/")[2] for b in backends if "/" in b] if k not in KV_DTYPES]
    if not backends or not kvs or bad:
        raise usage_error(f"python -m bench.gpu_run.smoke: error: --backend and --kv-dtype each need at least one "
                          f"name; kv dtypes are {', '.join(KV_DTYPES)}{f' (got {bad})' if bad else ''}")
    if a.timeout_s <= 0 or a.parallel < 1:
        raise usage_error("python -m bench.gpu_run.smoke: error: --timeout-s must be > 0 and --parallel >= 1")
    path = Path(a.json)
    out = Path(a.out) if a.out else path.parent / "smoke"
    jobs = run_jobs(make_jobs(backends, kvs, out, a.ctx, a.arch or _device_arch()), a.timeout_s, a.parallel)
    rec = write_json(jobs, path, a.timeout_s)
    print(f"[smoke] quarantined: {', '.join(rec['quarantine']) or 'none'} (written to {path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
