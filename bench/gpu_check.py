"""python -m bench.gpu_check: one prepared command for a short GPU window.

Stages, in order, each a subprocess with its own time cap inside a global budget
(default 420 s); a stage that fails is recorded and the next one runs; a stage
that no longer fits the budget is skipped and said so:

  build      JIT-build the cuda backend once with every kernel instantiation
             (VERIFY_ATTN_JIT_ALL=1, ninja in parallel), timed; later stages reuse it
  tests      pytest -m gpu -q (all failures listed; a collection error does not stop the rest)
  ceilings   bench/ceilings.py: copy bandwidth, bf16 mma.sync and cuBLAS rates, cached per GPU
  headline   bench.verify at 185k, 16 nodes, page1: cuda v1 and v0 side by side, triton, triton-serial
  sweep      bench.verify ctx 4k..185k x trees 1,16,64 x page1/paged: cuda v1 and v0, triton;
             triton-serial only up to 64k (the slow baseline), time-capped
  model      python -m bench.model --calibrate: the SASS model's prediction of every timed cuda row
             against its measurement (and the ceilings' HMMA latency, L2 and DRAM read bandwidth)
  gqa        bench.verify on one GQA preset (llama3-70b-tp8) at 16k and 185k
  tune       (--tune) python -m autotune, if the package is there
  e2e        (--e2e) integration.bench_e2e, kimi-k2-tp8 --simulate-rank: decode step time vs context
  sanitize   (--sanitize) compute-sanitizer memcheck on one small cuda call, if the tool exists

Everything lands under $OUT when set, else bench/results/gpu_check-<date>/:
one .log per stage, JSON/CSV/PNG from the benchmark, and gpu_check.json with the
status of every stage. Under $OUT (the device tool, which returns at most 8 files)
everything is then packed into gpu_check_results.tar.gz. The short table prints last. Without a GPU (or with
--dry-run) it prints the plan and exits 0.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable

# The cuda backend JIT-builds one extension per (dtype, head, layout) on first use. The
# build stage builds the ones the later stages run, in parallel processes (each its own
# ninja build), so that no benchmark row pays for a compile.
BUILD_VARIANTS = (("bf16", "mla576", "page1"), ("bf16", "mla576", "paged"), ("bf16", "gqa128", "page1"),
                  ("bf16", "mla576e4m3", "page1"), ("bf16", "mla576x656", "page1"))
_BUILD_ONE = ("import sys, time; t = time.time(); from verify_attn.backends import get_backend; "
              "ok, why = get_backend('cuda').available(); ok or sys.exit(f'cuda backend unavailable: {why}'); "
              "from verify_attn.backends.cuda import load_ops; load_ops(*sys.argv[1:4]); "
              "print(f'built {sys.argv[1:4]} in {time.time() - t:.1f} s')")


def build_variants(variants=BUILD_VARIANTS, timeout: float = 600) -> int:
    """Build the cuda extension variants in parallel subprocesses; 0 if all built.
    With VERIFY_ATTN_JIT_ALL=1 (run_stage sets it) one build holds every instantiation
    (ninja compiles them in parallel), so one variant builds it for every stage."""
    if os.environ.get("VERIFY_ATTN_JIT_ALL") == "1":
        variants = variants[:1]
    t0 = time.perf_counter()
    procs = [(v, subprocess.Popen([PY, "-c", _BUILD_ONE, *v], cwd=REPO)) for v in variants]
    rc = 0
    for v, p in procs:
        try:
            r = p.wait(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            r = 124
        print(f"[build] {'/'.join(v)}: {'ok' if r == 0 else f'failed (rc {r})'}", flush=True)
        rc = rc or r
    print(f"[build] {len(variants)} variants in {time.perf_counter() - t0:.1f} s wall", flush=True)
    return rc


@dataclass
class Stage:
    name: str
    argv: list[str]
    cap_s: float                 # the most this stage may take
    min_s: float = 15.0          # skip it when less than this is left
    needs: Optional[str] = None  # a python module or an executable the stage requires
    status: str = "pending"      # ok | failed (rc) | timeout | skipped: why
    wall_s: float = 0.0
    rc: Optional[int] = None
    log: str = ""
    extra: dict = field(default_factory=dict)


def out_dir() -> Path:
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"])
    return REPO / "bench" / "results" / f"gpu_check-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"


def plan(out: Path, a: argparse.Namespace) -> list[Stage]:
    v = [PY, "-m", "bench.verify", "--results-dir", str(out), "--quiet", "--reps", str(a.reps), "--max-seconds", "3"]
    stages = [
        Stage("build", [PY, "-m", "bench.gpu_check", "--build-variants"], cap_s=300, min_s=30),
        Stage("tests", [PY, "-m", "pytest", "-m", "gpu", "-q", "-rf", "--continue-on-collection-errors", "tests"], cap_s=120, needs="pytest"),
        Stage("ceilings", [PY, "-m", "bench.ceilings", "--refresh", "--json", str(out / "ceilings.json")], cap_s=150),
        Stage("headline", v + ["--ctx", "185k", "--tree", "16", "--layout", "page1",
                               "--backend", "cuda@v2,cuda@v1,cuda@v0,triton,triton-serial", "--json", str(out / "headline.json"),
                               "--csv", str(out / "headline.csv")], cap_s=90, min_s=30),
        Stage("sweep", v + ["--ctx", "4k,16k,64k,128k,185k", "--tree", "1,16,64", "--layout", "page1,paged",
                            "--backend", "cuda@v2,cuda@v1,cuda@v0,triton,triton-serial", "--serial-max-ctx", "64k",
                            "--json", str(out / "sweep.json"), "--csv", str(out / "sweep.csv"),
                            "--plot", str(out / "sweep.png")], cap_s=200, min_s=40),
        Stage("gqa", v + ["--shape", "llama3-70b-tp8", "--ctx", "16k,185k", "--tree", "16", "--layout", "page1",
                          "--backend", "cuda,triton,triton-serial", "--json", str(out / "gqa.json")], cap_s=60),
        # e4m3 caches (issue 17): the e4m3-MMA kernel and Triton's dequantizing one, against the fp8 floors
        Stage("fp8", v + ["--ctx", "16k,185k", "--tree", "16", "--layout", "page1", "--kv-dtype", "fp8_e4m3",
                          "--backend", "cuda,triton", "--json", str(out / "fp8.json")], cap_s=60),
        Stage("fp8_656", v + ["--ctx", "185k", "--tree", "16", "--layout", "page1", "--kv-dtype", "fp8_mla656",
                              "--backend", "cuda,triton", "--json", str(out / "fp8_656.json")], cap_s=45),
    ]
    # predicted vs measured for every timed cuda row (the SASS model's calibration record)
    stages.append(Stage("model", [PY, "-m", "bench.model", "--calibrate", str(out / "headline.json"),
                                  str(out / "sweep.json"), str(out / "fp8.json"), str(out / "fp8_656.json"),
                                  "--calibrate-json", str(out / "calibration.json")],
                        cap_s=60, min_s=10))
    if a.tune:
        # export into the results folder: the repo's autotune/configs/ does not come back from a GPU machine
        stages.append(Stage("tune", [PY, "-m", "autotune", *a.tune_args.split(), "--export", str(out / "tuned"),
                                     "--cache", str(out / "autotune_cache.json"), "--json", str(out / "autotune.json")],
                            cap_s=120, needs="autotune"))
    if a.e2e:
        # issue 9 item 6: the field report's table shape (decode step time against context), per backend
        stages.append(Stage("e2e", [PY, "-m", "integration.bench_e2e", "--model", "kimi-k2-tp8", "--simulate-rank",
                                    "--ctx", a.e2e_ctx, "--steps", "4", "--warmup", "1", "--simulate-accept-len", "4",
                                    "--attn-backend", "cuda,triton-serial", "--json", str(out / "e2e.json"),
                                    "--plot", str(out / "e2e.png")], cap_s=240, min_s=60))
    if a.sanitize:
        stages.append(Stage("sanitize", ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "9",
                                         PY, "-m", "bench.verify", "--ctx", "1000", "--tree", "4", "--backend", "cuda",
                                         "--reps", "1", "--warmup", "0", "--no-ceilings", "--no-graph", "--no-save",
                                         "--quiet"], cap_s=120, needs="compute-sanitizer"))
    return stages


def _missing(need: Optional[str]) -> Optional[str]:
    if need is None:
        return None
    if need == "__cuda_build__":
        return "the cuda backend did not build"
    if need == "autotune":
        return None if (REPO / "autotune" / "__main__.py").exists() else "autotune/__main__.py not present"
    if "-" in need or need == "ncu":
        return None if shutil.which(need) else f"{need} not on PATH"
    return None if importlib.util.find_spec(need) else f"python module {need} not installed"


def _budget_arg(st: Stage, timeout: float) -> None:
    """Give bench.verify stages an inner budget so they stop between rows before the hard kill."""
    if "bench.verify" in st.argv and "--budget-s" not in st.argv and st.name != "sanitize":
        st.argv += ["--budget-s", f"{max(5.0, timeout - 25):.0f}"]


def _drop_cuda(st: Stage) -> None:
    """Remove the cuda backend from a bench.verify stage's --backend list (skip the stage if nothing is left)."""
    if "--backend" not in st.argv:
        return
    i = st.argv.index("--backend") + 1
    rest = [b for b in st.argv[i].split(",") if b.partition("@")[0] != "cuda"]
    if rest:
        st.argv[i] = ",".join(rest)
        st.extra["note"] = "cuda dropped: the build stage failed"
    else:
        st.needs = "__cuda_build__"


def run_stage(st: Stage, out: Path, remaining: float) -> None:
    why = _missing(st.needs)
    if why:
        st.status = f"skipped: {why}"
        return
    if remaining < st.min_s:
        st.status = f"skipped: budget spent ({remaining:.0f} s left, needs >= {st.min_s:.0f} s)"
        return
    timeout = min(st.cap_s, remaining)
    _budget_arg(st, timeout)
    log = out / f"{st.name}.log"
    st.log = str(log)
    t0 = time.perf_counter()
    # JIT_ALL: one module with every kernel instantiation, built once by the build stage
    # and reused by the tests and benchmarks, instead of one serial build per
    # (dtype, head, layout) inside the time-capped stages
    env = {"VERIFY_ATTN_JIT_ALL": "1", **os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        with open(log, "w") as f:
            f.write("$ " + " ".join(st.argv) + "\n")
            f.flush()
            r = subprocess.run(st.argv, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, env=env)
        st.rc = r.returncode
        st.status = "ok" if r.returncode == 0 else f"failed (rc {r.returncode})"
    except subprocess.TimeoutExpired:
        st.status = f"timeout after {timeout:.0f} s"
    except OSError as e:
        st.status = f"failed to start: {e}"
    st.wall_s = time.perf_counter() - t0


def _tail(path: str, n: int = 6) -> str:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
        return "\n".join("      " + ln for ln in lines[-n:])
    except OSError:
        return ""


def summary_rows(out: Path) -> list[str]:
    """One short line per timed row of the headline and sweep JSONs."""
    lines = []
    for name in ("headline", "sweep", "gqa"):
        p = out / f"{name}.json"
        if not p.exists():
            continue
        d = json.loads(p.read_text())
        fd = d.get("floor_device")
        for r in d["results"]:
            if name == "sweep" and r["tree_nodes"] != 16:
                continue  # keep the last screen short: the 16-node rows
            floor = r["floor_us"].get(fd) if fd else None
            med = r["median_us"]
            lines.append(f"{name:8s} {r['backend']:14s} ctx {r['ctx']:>7,} T{r['tree_nodes']:<3d} {r['layout']:6s} "
                         f"{'-' if med is None else f'{med:10.1f} us'}  floor {'-' if floor is None else f'{floor:.1f}'} "
                         f"frac {'-' if r['frac_of_floor'] is None else format(r['frac_of_floor'], '.2f')} "
                         f"x{'-' if not r['speedup_vs_serial'] else format(r['speedup_vs_serial'], '.1f')} "
                         f"err {'-' if r['max_rel_err'] is None else format(r['max_rel_err'], '.1e')} {r['status']}")
    return lines


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-s", type=float, default=420.0, help="global time budget (default 420)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    ap.add_argument("--tune", action="store_true", help="also run a quick `python -m autotune`")
    ap.add_argument("--tune-args", default="--backend cuda --ctx 16k,185k --tree 16",
                    help="arguments for the tune stage")
    ap.add_argument("--e2e", action="store_true", help="also run the e2e decode sweep (kimi-k2-tp8, simulated rank)")
    ap.add_argument("--e2e-ctx", default="1.4k,32k,185k", help="contexts for the e2e stage")
    ap.add_argument("--sanitize", action="store_true", help="compute-sanitizer memcheck on one small case")
    ap.add_argument("--only", default=None, help="comma-separated stage names to run (default: all)")
    ap.add_argument("--reps", type=int, default=30, help="timing samples per benchmark row")
    ap.add_argument("--build-variants", action="store_true", help="(the build stage) build the cuda extension "
                    "variants the benchmark uses, in parallel, and exit")
    a = ap.parse_args(argv)
    if a.build_variants:
        return build_variants()

    import torch  # after argument parsing: --help stays instant
    gpu = torch.cuda.is_available()
    out = out_dir()
    stages = plan(out, a)
    if a.only:
        keep = {s.strip() for s in a.only.split(",")}
        stages = [s for s in stages if s.name in keep]
    if a.dry_run or not gpu:
        print("bench.gpu_check " + ("dry run" if a.dry_run else "found no CUDA GPU: nothing run") +
              f"; with a GPU it would run, within {a.budget_s:.0f} s, writing under {out}:")
        for s in stages:
            need = f" (needs {s.needs})" if s.needs else ""
            print(f"  {s.name:9s} cap {s.cap_s:4.0f} s{need}: {' '.join(s.argv)}")
        return 0

    out.mkdir(parents=True, exist_ok=True)
    t_end = time.perf_counter() + a.budget_s
    for st in stages:
        if st.name != "build" and any(s.name == "build" and s.status != "ok" for s in stages):
            _drop_cuda(st)  # a failed build would be retried (minutes) inside every later stage
        run_stage(st, out, t_end - time.perf_counter())
        print(f"[gpu_check] {st.name:9s} {st.status} ({st.wall_s:.0f} s)", flush=True)
        if st.status not in ("ok",) and not st.status.startswith("skipped") and st.log:
            print(_tail(st.log), flush=True)
    record = {"device": torch.cuda.get_device_name(), "date": _dt.datetime.now().isoformat(timespec="seconds"),
              "torch": torch.__version__, "budget_s": a.budget_s, "out": str(out),
              "stages": [asdict(s) for s in stages]}
    (out / "gpu_check.json").write_text(json.dumps(record, indent=2))
    print(f"\n[gpu_check] {torch.cuda.get_device_name()}: results under {out}")
    for s in stages:
        print(f"  {s.name:9s} {s.status:40s} {s.wall_s:6.0f} s")
    rows = summary_rows(out)
    if rows:
        print("\n".join(["", "short table (16-node rows; us = median per call):", *rows]))
    if os.environ.get("OUT"):
        _pack(out)
    return 0


def _pack(out: Path) -> None:
    """The device tool brings back at most 8 files from $OUT: pack everything into one archive
    (plus gpu_check.json beside it for a quick look)."""
    import tarfile
    archive = out / "gpu_check_results.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for p in sorted(out.rglob("*")):
            if p.is_file() and p != archive:
                tar.add(p, arcname=str(p.relative_to(out)))
    for p in sorted(out.rglob("*"), reverse=True):
        if p.is_file() and p.name not in (archive.name, "gpu_check.json"):
            p.unlink()
        elif p.is_dir():
            p.rmdir()
    print(f"[gpu_check] packed results into {archive}")


if __name__ == "__main__":
    sys.exit(main())
