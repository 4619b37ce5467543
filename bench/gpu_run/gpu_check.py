"""python -m bench.gpu_check: one prepared command for a short GPU window.

A lent GPU machine (one H200, or one H100 SXM5: the device tool's first call that names no
kind gets an H100, so name kind nvidia-h200 to test the H200's predictions; an H100 run is
compared with the H100's model, `bench.model --arch h100`) comes with 15 minutes of device
time in all, of which its start takes minutes; so this is one command, with a time cap per
stage and a global budget (default 460 s; the caps of the default plan add up to <= 480 s,
a test checks it). A stage that fails is recorded and the next one runs; a stage that no longer fits
the budget is skipped and said so. Stages, in order of value:

  build      one parallel JIT build of the kernel instantiations the later stages run
             (VERIFY_ATTN_JIT_SET; the rest stay JIT-on-demand), beside the ceiling probes
             and, when the tests run, the GPU tests' own libraries; each part timed
  smoke      bench/gpu_run/smoke.py: each kernel no GPU has run before (both v3 kernels' tiles, bf16 and e4m3)
             once, each in its own process under a timeout, at 1.5k; one that hangs or crashes is quarantined:
             dropped from every later stage, its GPU tests skipped (VERIFY_ATTN_QUARANTINE), so it cannot take
             the session's other measurements with it
  tests      pytest -m gpu on the cuda backend (tests/test_cuda_gpu.py: matrix, trees, odd lengths, splits,
             graphs, versions), then the device API's PTX semantics (tests/test_arch_emu.py); a test still
             running after 20 s dumps its stack into tests.log (faulthandler), where a hang would sit
  ceilings   bench/core/ceilings.py: copy bandwidth, bf16 mma.sync / wgmma / cuBLAS rates, HMMA and
             wgmma latency, L2 and DRAM read bandwidth (the model's calibration inputs)
  kvstream   the KV stream probe: the loader alone (scattered 1152-byte rows through a cp.async ring),
             bandwidth against bytes in flight, lane layout and row-id source (the model's memory term)
  headline   bench.verify at 185k, 16 nodes, page1: cuda v2, v1, v0 side by side, v1's bulk-loader tiles
             (cuda@m32n32w8s5, cuda@m32n16w8s8) and its cp.async 16-token tile (s4), the sm_120 v3 tiles as
             the H200 proxy (cuda@v3-sm120: the math-roles tile; m32n16w9s4, m32n16w12s4), Hopper's v3 (cuda@v3),
             triton, triton-serial
  sweep      bench.verify 185k..4k x trees 16, 64, 1 x page1 / paged: cuda v2, v1, v1 bulk (m32n32w8s5),
             v3-sm120, Hopper's v3
  splits     the split heuristic's A/B at 4k (1 and 16 nodes): v1, Hopper's v3 and v3-sm120 (roles tile), each at
             the old rule's 15 splits (cuda@v3:15) beside the heuristic's
  nopdl      programmatic dependent launch's A/B: v1, Hopper's v3 and its cluster at 4k / 16 nodes with the split
             kernel launched plainly (VERIFY_ATTN_NO_PDL=1), beside the splits stage's rows
  ncu        Nsight Compute on v1's bulk-loader and cp.async split kernels and both v3 kernels at 185k / 16 nodes
             (speed of light, shared-memory wavefronts and bank conflicts, warp stalls), if ncu is there
  peers      the serving engines' kernels beside ours at 185k / 16 nodes (issue 42): FA3 along SGLang's
             Hopper tree-verify path (fa3-mla), FlashMLA's dense decode over the prefix + a torch tree
             part (flashmla, its prefix pass timed apart), FlashInfer's MLA wrapper (chains only),
             SGLang's Triton extend_attention; from their packages or the carried bundle .carry/peers
             (bench/gpu_session.sh sets it up; bench/benchmark/peers.py)
  peers_sweep  the same at 4k / 16k / 64k / 185k x 16, 64 nodes (+ peers_sweep.png)
  fp8 / fp8_656   e4m3 and 656-byte caches: the CUDA kernels and Triton's, against the fp8 floors
  gqa        one GQA preset (llama3-70b-tp8) at 16k and 185k; gqa_fp8 the same with an e4m3 cache
  tune       python -m autotune at 16k and 185k (the measured configs, autotune's format)
  tests_rest the other gpu-marked tests (Triton, fp8, serving adapter, autotune, device, probes)
  model      python -m bench.model --calibrate: the model's prediction of every timed cuda row
             (also runs on a CPU from the returned files: nothing of it needs the GPU)
  e2e        (--e2e) integration.measure.bench_e2e, kimi-k2-tp8 --simulate-rank
  sanitize   (--sanitize) compute-sanitizer memcheck on one small cuda call

Everything lands under $OUT when set, else bench/results/gpu_check-<date>/: one .log per
stage, JSON/CSV/PNG from the benchmarks, build.json, and gpu_check.json with every stage's
status; under $OUT (the device tool returns at most 8 files) it is packed into
gpu_check_results.tar.gz. The short table prints last. Without a GPU (or with --dry-run)
it prints the plan with every stage's cap and exits 0.

Back on the CPU machine, `python -m bench.gpu_check --collect DIR` unpacks a returned run
into bench/results/<device>/ (h200/, h100-80gb-hbm3/; committable), the tuned configs into
autotune/configs/, and prints the table again with the model's predictions.
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

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
# kernel v3 (issue 39, the sm_120 kernel: math warps and a producer), on the H200 as the proxy of the same source:
# cuda@v3-sm120 is the tile the model reads fastest that the arch runs (verify_attn/backends/cuda.py, v3_sm120_tile):
# the math-roles tile (8 S warps, 8 PV warps, a producer warpgroup) for every format, on the RTX PRO 6000 and the H200
# alike; in headline, sweep, splits, ncu, the knockouts (its producer honours the no-load and no-index bits) and the
# e4m3 and 656-byte stages. The one-producer-warp tile (168 registers, one tile at a time) and
# the producer-warpgroup tile (setmaxnreg, v1's two-tile loop) in headline beside it.
V3 = "cuda@v3-sm120"
V3_WARP = "cuda@m32n16w9s4"
V3_WG = "cuda@m32n16w12s4"
# kernel v3 for Hopper (issue 40, sm90/: a producer warpgroup, FlashMLA's seesaw on two consumer warpgroups, per-half
# FULL / EMPTY barriers), in headline, sweep, ncu and the knockouts beside the sm_120 proxy
V3H = "cuda@v3"
# ... as a 2-CTA cluster (the two 64-row CTAs of a split share each block's gather through distributed shared memory;
# 16-bit caches), beside it in smoke, headline, sweep, splits, ncu and the knockouts
V3C = "cuda@v3-cluster"
# the smoke stage (bench/gpu_run/smoke.py): every kernel no GPU has run yet, once, each in its own process under a
# timeout, before anything else touches the GPU; a hang or crash is quarantined from the later stages
SMOKE_BACKENDS = (V3, V3_WARP, V3_WG, V3H, V3C, f"{V3}/fp8_e4m3", f"{V3H}/fp8_e4m3", f"{V3}/fp8_mla656")
SMOKE_STEMS = ("mla576_bf16_page1", "mla576_bf16_paged", "mla576e4m3_bf16_page1", "mla576e4m3_bf16_paged",
               "mla576x656_bf16_page1")
# the ncu stage: one warm call, then one profiled call, of each of these versions
NCU_VERSIONS = ("m32n32w8s5", "v1", V3.split("@")[1], V3H.split("@")[1], V3C.split("@")[1])
PLAN_CAP_S = 480.0          # the default plan's caps add up to at most this (tests/test_bench.py checks)
DEVICE_CORES = 16           # the lent GPU machine's CPU cores (the build estimate scales to them)
BUILD_TIMES = REPO / "bench" / "results" / "build_times.json"  # --time-build's measurement on this machine


@dataclass
class Stage:
    name: str
    argv: list[str]
    cap_s: float                 # the most this stage may take
    min_s: float = 15.0          # skip it when less than this is left
    needs: Optional[str] = None  # a python module or an executable the stage requires
    kernels: tuple = ()          # instantiation stems it runs ("*": every one); the build stage builds the union
    status: str = "pending"      # ok | failed (rc) | timeout | skipped: why
    wall_s: float = 0.0
    rc: Optional[int] = None
    log: str = ""
    extra: dict = field(default_factory=dict)


def out_dir() -> Path:
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"])
    return REPO / "bench" / "results" / f"gpu_check-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"


# ------------------------------------------------------------------ the kernels a stage runs

def verify_stems(argv: list[str]) -> tuple[str, ...]:
    """The instantiation stems a `bench.verify` argv runs on the cuda backend (its shape, dtype, kv dtype and
    layouts), or () when it names no cuda backend."""
    from verify_attn import build as vb
    from verify_attn.shapes import get_shape

    def arg(flag: str, default: str) -> str:
        return argv[argv.index(flag) + 1] if flag in argv else default

    if "cuda" not in {b.partition("@")[0] for b in arg("--backend", "cuda").split(",")}:
        return ()
    shape = get_shape(arg("--shape", "kimi-k2-tp8"))
    kv = arg("--kv-dtype", "")
    head = vb.head_key(shape.head_dim_qk, shape.head_dim_v, shape.mla, kv if kv.startswith("fp8") else False)
    layouts = [x.strip() for x in arg("--layout", "page1").split(",") if x.strip()]
    return tuple(vb.instantiation_file(arg("--dtype", "bf16"), head, lay).stem for lay in layouts) if head else ()


def model_device_line(gpu_name: str) -> str:
    """Which device model this run's rows are compared with (bench.model.devices.device_for_gpu): the H200's
    predictions hold for an H200 only; an H100 (the device tool's nvidia-h100-x1) has its own."""
    from bench.model.devices import device_for_gpu
    d = device_for_gpu(gpu_name)
    if d is None:
        return f"no device model describes {gpu_name}: its rows are not compared with predictions"
    return (f"compared with the {d.name} model (python -m bench.model --arch {d.key}; NOTES.md holds its predictions, "
            "written before this run)")


def jit_set_of(stages: list[Stage]) -> list[str]:
    """The union of the stages' instantiation stems (every one if a stage runs '*')."""
    from verify_attn import build as vb
    allstems = [f.stem for f in vb.instantiation_files()]
    want: set[str] = set()
    for s in stages:
        ks = s.kernels or (verify_stems(s.argv) if "bench.verify" in s.argv else ())
        want |= set(allstems) if "*" in ks else set(ks)
    return sorted(want)


# ------------------------------------------------------------------ the build stage

_LOAD_KERNELS = ("from verify_attn.backends.cuda import load_ops; load_ops(*sys.argv[1:4]); "
                 "print(f'built kernels {sys.argv[1:4]} (+ the JIT set) in {time.time() - t:.1f} s')")
_BUILD_KERNELS = ("import sys, time; t = time.time(); from verify_attn.backends import get_backend; "
                  "ok, why = get_backend('cuda').available(); ok or sys.exit(f'cuda backend unavailable: {why}'); "
                  + _LOAD_KERNELS)
_BUILD_PROBES = ("import time; t = time.time(); from bench.core.ceilings import _probe_module; _probe_module(); "
                 "print(f'built the ceiling probes in {time.time() - t:.1f} s')")
_BUILD_TEST_LIBS = ("import sys, time; t = time.time(); sys.path.insert(0, 'tests'); import test_arch_emu as T; "
                    "from verify_attn.backends import cuda_emu; T.build_gpu_library(); "
                    "cuda_emu.build_shared_library('va_api_tests', [T.SRC, T.C_API]); "
                    "print(f'built the wgmma/mma test libraries (GPU and emulator) in {time.time() - t:.1f} s')")


def build_parts(test_libs: bool) -> list[tuple[str, list[str]]]:
    """(name, argv) of the builds the build stage runs side by side."""
    from verify_attn.backends.cuda import jit_set
    stems = jit_set() or []
    parts = []
    if stems:
        head, dt, layout = _split_stem(stems[0])
        parts.append(("kernels", [PY, "-c", _BUILD_KERNELS, dt, head, layout]))
    parts.append(("probes", [PY, "-c", _BUILD_PROBES]))
    if test_libs:
        parts.append(("test_libs", [PY, "-c", _BUILD_TEST_LIBS]))
    return parts


def _split_stem(stem: str) -> tuple[str, str, str]:
    """'mla576e4m3_bf16_page1' -> ('mla576e4m3', 'bf16', 'page1')."""
    head, dtype, layout = stem.rsplit("_", 2)
    return head, dtype, layout


def build_stage(test_libs: bool, timeout: float = 600) -> int:
    """Run the build parts in parallel subprocesses (each part's ninja uses every core); 0 if all built.
    Writes $OUT/build.json (each part's wall time) when OUT is set."""
    t0 = time.perf_counter()
    procs = [(n, argv, subprocess.Popen(argv, cwd=REPO), time.perf_counter()) for n, argv in build_parts(test_libs)]
    rc, record = 0, {"jit_set": os.environ.get("VERIFY_ATTN_JIT_SET", ""), "cores": os.cpu_count(), "parts": {}}
    for n, _argv, p, ts in procs:
        try:
            r = p.wait(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            r = 124
        record["parts"][n] = {"rc": r, "wall_s": round(time.perf_counter() - ts, 1)}
        print(f"[build] {n}: {'ok' if r == 0 else f'failed (rc {r})'}", flush=True)
        rc = rc or r
    record["wall_s"] = round(time.perf_counter() - t0, 1)
    print(f"[build] {len(procs)} parts in {record['wall_s']:.1f} s wall on {os.cpu_count()} cores", flush=True)
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "build.json").write_text(json.dumps(record, indent=1))
    return rc


def time_build(stems: list[str], arch: str = "sm_90a", cores: int = DEVICE_CORES) -> dict:
    """Build the kernel set here (fresh JIT folder, `arch`), read ninja's per-target times and scale them to
    `cores`: max(the longest target, all targets' seconds / cores). On a 2-core machine ninja runs several
    jobs at once, so each target's time is contended: the estimate is an upper bound."""
    import tempfile

    env = {**os.environ, "VERIFY_ATTN_JIT_SET": ",".join(stems), "VERIFY_ATTN_CUDA_ARCHS": arch}
    env.pop("VERIFY_ATTN_JIT_ALL", None)
    with tempfile.TemporaryDirectory() as d:
        env["TORCH_EXTENSIONS_DIR"] = d
        head, dt, layout = _split_stem(stems[0])
        t0 = time.perf_counter()
        r = subprocess.run([PY, "-c", "import sys, time; t = time.time(); " + _LOAD_KERNELS, dt, head, layout],
                           cwd=REPO, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"the kernel build failed:\n{(r.stdout + r.stderr)[-4000:]}")
        wall = time.perf_counter() - t0
        targets = {}
        for log in Path(d).rglob(".ninja_log"):
            for line in log.read_text().splitlines()[1:]:
                start, end, _mt, name, _h = line.split("\t")
                targets[name] = (int(end) - int(start)) / 1000
    total = sum(targets.values())
    est = max(max(targets.values(), default=0.0), total / cores)
    return {"arch": arch, "stems": stems, "here_cores": os.cpu_count(), "here_wall_s": round(wall, 1),
            "targets_s": {k: round(v, 1) for k, v in sorted(targets.items(), key=lambda kv: -kv[1])},
            "sum_target_s": round(total, 1), "device_cores": cores, "device_estimate_s": round(est, 1),
            "date": _dt.datetime.now().isoformat(timespec="seconds")}


# the ncu stage's default: speed of light, memory tables (bank conflicts), pipes, scheduler and warp stalls
NCU_RAW = ("--section SpeedOfLight --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis "
           "--section SchedulerStats --section WarpStateStats --section LaunchStats --page raw").split()
MODEL_STEMS = ("mla576_bf16_page1", "mla576_bf16_paged", "mla576e4m3_bf16_page1", "mla576x656_bf16_page1")
CARRY = REPO / ".carry"
# our default kernel and every peer (bench/benchmark/verify.py OUTSIDE_BASELINES): FA3 along SGLang's Hopper path, FlashMLA
# (prefix) + torch tree part, FlashInfer's MLA wrapper (chains only: 'unsupported' on these trees, with the reason),
# SGLang's Triton extend_attention
PEERS_BACKENDS = "cuda,fa3-mla,flashmla,flashinfer-mla,sglang-extend"


def prepare_carry(arch: str = "sm_90a") -> int:
    """The cubins the model stage reads (the cuda rows of headline, sweep, peers, fp8, fp8_656), built here into
    .carry/cache/cubins: the same cache key (sources, flags, nvcc version) hits on the device when its nvcc is
    this one's version."""
    from verify_attn import build as vb
    os.environ["VERIFY_ATTN_CACHE"] = str(CARRY / "cache")
    for stem in MODEL_STEMS:
        head, dtype, layout = _split_stem(stem)
        print(vb.compile_cubin(vb.instantiation_file(dtype, head, layout), arch))
    print(f"carry {CARRY.relative_to(REPO)} with the run (bench/gpu_session.sh sets VERIFY_ATTN_CACHE to it)")
    return 0


# ------------------------------------------------------------------ the plan

def plan(out: Path, a: argparse.Namespace) -> list[Stage]:
    v = [PY, "-m", "bench.verify", "--results-dir", str(out), "--quiet", "--reps", str(a.reps), "--max-seconds", "2",
         "--no-model"]   # the model's predictions are a CPU job: `model` below, or --collect back home
    # (a test still running after 20 s dumps every thread's stack into the stage's log: where a hang sits, before the
    # stage's cap kills it)
    pytest = [PY, "-m", "pytest", "-m", "gpu", "-v", "-rfE", "-p", "no:cacheprovider", "-o", "faulthandler_timeout=20"]
    stages = [
        Stage("build", [PY, "-m", "bench.gpu_check", "--build-stage"], cap_s=60, min_s=30),
        Stage("smoke", [PY, "-m", "bench.gpu_run.smoke", "--backend", ",".join(SMOKE_BACKENDS), "--json",
                        str(out / "smoke.json"), "--out", str(out / "smoke"), "--timeout-s", "30"], cap_s=40, min_s=15,
              kernels=SMOKE_STEMS),   # healthy jobs ~10 s side by side; a generous timeout: a false 'hang' costs v3's rows
        # (the kernels' tests first: smoke has already run each never-run kernel alone and quarantined any that hung,
        # while the arch tests' never-run cluster and mbarrier kernels have no such guard, and a hang there would
        # take every test after it)
        Stage("tests", pytest + ["tests/test_cuda_gpu.py", "tests/test_arch_emu.py"], cap_s=60, needs="pytest",
              kernels=("*",)),
        Stage("ceilings", [PY, "-m", "bench.ceilings", "--refresh", "--json", str(out / "ceilings.json")], cap_s=11,
              min_s=8),
        Stage("kvstream", [PY, "-m", "bench.ceilings", "--kv-stream", str(out / "kv_stream.json")], cap_s=11,
              min_s=8),
        Stage("headline", v + ["--ctx", "185k", "--tree", "16", "--layout", "page1",
                               "--backend", "cuda@v2,cuda@v1,cuda@v0,cuda@m32n32w8s5,cuda@m32n16w8s8,cuda@m32n16w8s4,"
                               f"{V3},{V3_WARP},{V3_WG},{V3H},{V3C},triton,triton-serial", "--json",
                               str(out / "headline.json"), "--csv", str(out / "headline.csv")], cap_s=30, min_s=20),
        Stage("sweep", v + ["--ctx", "185k,64k,16k,4k", "--tree", "16,64,1", "--layout", "page1,paged",
                            "--backend", f"cuda@v2,cuda@v1,cuda@m32n32w8s5,{V3},{V3H},{V3C}", "--json",
                            str(out / "sweep.json"),
                            "--csv", str(out / "sweep.csv"), "--plot", str(out / "sweep.png")], cap_s=45, min_s=25),
        # the split heuristic's A/B at 4k: each kernel at the old rule's 15 splits (256 tokens a split) beside the
        # heuristic's (NOTES.md, "Short contexts: the split heuristic", holds the predictions)
        Stage("splits", v + ["--ctx", "4k", "--tree", "1,16", "--layout", "page1", "--backend",
                             f"cuda@v1:15,cuda@v1,{V3H}:15,{V3H},{V3C},{V3}:15,{V3}",
                             "--json", str(out / "splits.json")], cap_s=10, min_s=8),
        # programmatic dependent launch's A/B: the same 4k rows with the split kernel launched plainly, beside the
        # splits stage's (NOTES.md, "The split kernel on programmatic dependent launch", holds the prediction)
        Stage("nopdl", ["env", "VERIFY_ATTN_NO_PDL=1", *v, "--ctx", "4k", "--tree", "16", "--layout", "page1",
                        "--backend", f"cuda@v1,{V3H},{V3C}", "--json", str(out / "nopdl.json")], cap_s=8, min_s=6),
        Stage("ncu", ["ncu", "--clock-control", "none", "--target-processes", "all", "-k",
                      "regex:tree_verify_split", "--launch-skip", str(len(NCU_VERSIONS)), "-c", str(len(NCU_VERSIONS)),
                      *(a.ncu_args.split() if a.ncu_args else NCU_RAW), "--csv", "--log-file",
                      str(out / ("ncu_source.csv" if a.ncu_args and "source" in a.ncu_args else "ncu_raw.csv")),
                      PY, "-m", "bench.ncu_probe", "--warm", "--versions", ",".join(NCU_VERSIONS)],
              cap_s=25, min_s=20, needs="ncu", kernels=("mla576_bf16_page1",)),
        # e4m3 caches (issue 17): the e4m3 kernels and Triton's dequantizing one, against the fp8 floors; the arch's
        # default (the H200's: kernel v2 on wgmma .e4m3) next to the f16 tile it replaced there (m32 n32 w8 s3), and
        # Hopper's v3 on wgmma .e4m3 (issue 40), page 1 and paged. Before the peers: issue 40's e4m3 goal (>= 1.6x
        # over bf16 v3) needs these rows beside headline's, and after the peers a 440 s budget with --knockout left
        # this stage no time
        Stage("fp8", v + ["--ctx", "16k,185k", "--tree", "16", "--layout", "page1,paged", "--kv-dtype", "fp8_e4m3",
                          "--backend", f"cuda,cuda@m32n32w8s3,{V3},{V3H},triton", "--json", str(out / "fp8.json")],
              cap_s=25, min_s=12),
        # the serving engines' kernels beside ours, same process, inputs and timing (issue 42; bench/benchmark/peers.py):
        # the headline point first, then the grid; peers absent on the device give 'unsupported' rows saying why
        Stage("peers", v + ["--ctx", "185k", "--tree", "16", "--layout", "page1", "--backend", PEERS_BACKENDS,
                            "--reps", "10", "--json", str(out / "peers.json")], cap_s=20, min_s=15),
        Stage("peers_sweep", v + ["--ctx", "4k,16k,64k,185k", "--tree", "16,64", "--layout", "page1",
                                  "--backend", PEERS_BACKENDS, "--reps", "10", "--longest-first",
                                  "--json", str(out / "peers_sweep.json"), "--csv", str(out / "peers_sweep.csv"),
                                  "--plot", str(out / "peers_sweep.png")], cap_s=30, min_s=20),
        # (656-byte rows: the arch's default, the f16 tile, and the sm_120 v3's proxy: the RTX's math-roles tile)
        Stage("fp8_656", v + ["--ctx", "185k", "--tree", "16", "--layout", "page1", "--kv-dtype", "fp8_mla656",
                              "--backend", f"cuda,{V3},triton", "--json", str(out / "fp8_656.json")], cap_s=15),
        Stage("gqa", v + ["--shape", "llama3-70b-tp8", "--ctx", "16k,185k", "--tree", "16", "--layout", "page1",
                          "--backend", "cuda,triton", "--json", str(out / "gqa.json")], cap_s=15),
        Stage("gqa_fp8", v + ["--shape", "llama3-70b-tp8", "--ctx", "16k,185k", "--tree", "16", "--layout", "page1",
                              "--kv-dtype", "fp8_e4m3", "--backend", "cuda,triton", "--json", str(out / "gqa_fp8.json")],
              cap_s=15),
        # export into the results folder: the repo's autotune/configs/ does not come back from a GPU machine
        Stage("tune", [PY, "-m", "autotune", *a.tune_args.split(), "--export", str(out / "tuned"),
                       "--cache", str(out / "autotune_cache.json"), "--json", str(out / "autotune.json")],
              cap_s=20, min_s=15, needs="autotune", kernels=("mla576_bf16_page1",)),
        Stage("tests_rest", pytest + ["--deselect", "tests/test_autotune.py::test_gpu_tune_export_and_lookup_through"
                                      "_tree_verify", "tests", "--ignore", "tests/test_arch_emu.py",
                                      "--ignore", "tests/test_cuda_gpu.py"],
              cap_s=20, needs="pytest", kernels=("*",)),   # 75 before the peers stages took 25 s, the splits A/B 10,
        #                                                        the smoke stage 20 (it timed out at 25 and 80 s before)
        # predicted vs measured for every timed cuda row (the SASS model; a CPU job that --collect repeats)
        Stage("model", [PY, "-m", "bench.model", "--calibrate", *(str(out / f) for f in
                        ("headline.json", "sweep.json", "splits.json", "fp8.json", "fp8_656.json", "peers.json")),
                        "--calibrate-json", str(out / "calibration.json")], cap_s=20, min_s=15),
    ]
    if a.knockout:   # where the tile's time goes: variants without the copies / index loads / v2's exchange
        stages.insert(2, Stage("knockout", [PY, "-m", "bench.knockout", "--ctx", "185k", "--tree", "16,64",
                                            "--variants", a.knockout, "--versions",
                                            f"v2,v1,m32n32w8s5,{V3.split('@')[1]},{V3H.split('@')[1]},"
                                            f"{V3C.split('@')[1]}",
                                            "--json", str(out / "knockout.json")], cap_s=100, min_s=40))
    if a.e2e:
        stages.append(Stage("e2e", [PY, "-m", "integration.measure.bench_e2e", "--model", "kimi-k2-tp8", "--simulate-rank",
                                    "--ctx", a.e2e_ctx, "--steps", "4", "--warmup", "1", "--simulate-accept-len", "4",
                                    "--attn-backend", "cuda,triton-serial", "--json", str(out / "e2e.json"),
                                    "--plot", str(out / "e2e.png")], cap_s=120, min_s=60,
                            kernels=("mla576_bf16_page1",)))
    if a.sanitize:
        stages.append(Stage("sanitize", ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "9",
                                         PY, "-m", "bench.verify", "--ctx", "1000", "--tree", "4", "--backend", "cuda",
                                         "--reps", "1", "--warmup", "0", "--no-ceilings", "--no-graph", "--no-save",
                                         "--no-model", "--quiet"], cap_s=60, needs="compute-sanitizer"))
    return stages


def quarantine_stage(st: Stage, q: set) -> None:
    """Remove from a later stage what the smoke stage quarantined (bench/gpu_run/smoke.py): the backends of a
    bench.verify stage (on its --kv-dtype), the versions of the knockout and ncu stages (ncu's launch counts with
    them); a stage left with nothing to run is skipped. The pytest stages read VERIFY_ATTN_QUARANTINE instead."""
    from bench.gpu_run.smoke import quarantine_key
    if not q or st.name in ("build", "smoke"):
        return
    kv = st.argv[st.argv.index("--kv-dtype") + 1] if "--kv-dtype" in st.argv else "bf16"
    for flag, prefix in (("--backend", ""), ("--versions", "cuda@")):
        if flag not in st.argv:
            continue
        i = st.argv.index(flag) + 1
        items = st.argv[i].split(",")
        kept = [b for b in items if quarantine_key(prefix + b, kv) not in q]
        if len(kept) == len(items):
            continue
        st.extra["quarantined"] = [b for b in items if b not in kept]
        if not kept:
            st.needs = "__quarantined__"
            return
        st.argv[i] = ",".join(kept)
        if st.argv[0] == "ncu":   # one profiled launch per version, after one warm launch each
            for f in ("--launch-skip", "-c"):
                st.argv[st.argv.index(f) + 1] = str(len(kept))


def _missing(need: Optional[str]) -> Optional[str]:
    if need is None:
        return None
    if need == "__quarantined__":
        return "everything it runs was quarantined by the smoke stage (smoke.json)"
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
        st.argv += ["--budget-s", f"{max(5.0, timeout - 12):.0f}"]


def _drop_cuda(st: Stage) -> None:
    """Remove the cuda backend from a bench.verify stage's --backend list (skip the stage if nothing is left)."""
    if "--backend" not in st.argv:
        if st.kernels:
            st.needs = "__cuda_build__"
        return
    i = st.argv.index("--backend") + 1
    rest = [b for b in st.argv[i].split(",") if b.partition("@")[0] != "cuda"]
    if rest:
        st.argv[i] = ",".join(rest)
        st.extra["note"] = "cuda dropped: the build stage failed"
    else:
        st.needs = "__cuda_build__"


def stage_env(jit_set: list[str]) -> dict:
    """Every stage sees the same JIT set (so the build stage's module is the one later stages load)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if jit_set:
        env["VERIFY_ATTN_JIT_SET"] = ",".join(jit_set)
    return env


def run_stage(st: Stage, out: Path, remaining: float, env: Optional[dict] = None) -> None:
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
    try:
        with open(log, "w") as f:
            f.write("$ " + " ".join(st.argv) + "\n")
            f.flush()
            r = subprocess.run(st.argv, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                               env=env or {**os.environ, "PYTHONUNBUFFERED": "1"})
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


# the short table: bench/gpu_run/gpu_results.py (reading results, shared with --collect)
from bench.gpu_run.gpu_results import _load, predictions_of, print_table  # noqa: E402


# ------------------------------------------------------------------ main

def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-s", type=float, default=460.0, help="global time budget (default 460)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan with every stage's cap, run nothing")
    ap.add_argument("--tune-args", default="--backend cuda --ctx 16k,185k --tree 16 --reps 5 --max-seconds 0.3 "
                    "--refine-rounds 1", help="arguments for the tune stage")
    ap.add_argument("--e2e", action="store_true", help="also run the e2e decode sweep (kimi-k2-tp8, simulated rank)")
    ap.add_argument("--e2e-ctx", default="1.4k,32k,185k", help="contexts for the e2e stage")
    ap.add_argument("--sanitize", action="store_true", help="compute-sanitizer memcheck on one small case")
    ap.add_argument("--ncu-args", default=None, help="the ncu stage's sections and page instead of the default "
                    "(e.g. '--section SourceCounters --page source --print-source sass': per-instruction stalls)")
    ap.add_argument("--knockout", metavar="BITS", default=None, const="0,1,2,4,7,8,16", nargs="?",
                    help="also time knockout variants of v2 / v1 / v1's bulk loader / v3-sm120 / Hopper's v3 "
                         "(bench.knockout; default bits 0,1,2,4,7,8,16: 16 bounds Hopper v3's 2-CTA cluster)")
    ap.add_argument("--tune", action="store_true", help=argparse.SUPPRESS)   # the tune stage is in the plan now
    ap.add_argument("--only", default=None, help="comma-separated stage names to run (default: all)")
    ap.add_argument("--skip", default=None, help="comma-separated stage names to leave out")
    ap.add_argument("--reps", type=int, default=30, help="timing samples per benchmark row")
    ap.add_argument("--build-stage", action="store_true", help="(the build stage) build the JIT set, the ceiling "
                    "probes and the GPU tests' libraries in parallel, and exit")
    ap.add_argument("--time-build", action="store_true", help="build the plan's kernel set here for sm_90a (no GPU "
                    f"needed), time it and scale it to {DEVICE_CORES} cores; writes {BUILD_TIMES.relative_to(REPO)}")
    ap.add_argument("--prepare-carry", action="store_true", help="build here the sm_90a cubins the model stage "
                    "reads into .carry/cache (bench/gpu_session.sh points VERIFY_ATTN_CACHE there; carry .carry)")
    ap.add_argument("--collect-as", metavar="NAME", default=None, help="with --collect: the folder under "
                    "bench/results/ (default: the device, e.g. h200)")
    ap.add_argument("--collect", metavar="DIR", help="unpack a returned run (DIR holds gpu_check_results.tar.gz) "
                    "into bench/results/h200/ and autotune/configs/, and print the table with the model's readings")
    return ap


def select(stages: list[Stage], a: argparse.Namespace) -> list[Stage]:
    if a.only:
        keep = {s.strip() for s in a.only.split(",")}
        unknown = keep - {s.name for s in stages}
        if unknown:
            from verify_attn.utils import usage_error   # one line with the program's name, status 2
            raise usage_error(f"python -m bench.gpu_check: error: --only: unknown stage(s) {', '.join(sorted(unknown))}; "
                              f"known: {', '.join(s.name for s in stages)}")
        stages = [s for s in stages if s.name in keep]
    if a.skip:
        drop = {s.strip() for s in a.skip.split(",")}
        stages = [s for s in stages if s.name not in drop]
    return stages


def print_plan(stages: list[Stage], out: Path, a: argparse.Namespace, header: str) -> None:
    jit = jit_set_of(stages)
    print(f"{header}; with a GPU it would run, within {a.budget_s:.0f} s, writing under {out}:")
    left = a.budget_s   # each stage runs under min(its cap, what the budget leaves): the caps shown are those
    for s in stages:
        need = f" (needs {s.needs})" if s.needs else ""
        cap = min(s.cap_s, max(0.0, left))
        left -= cap
        cut = "" if cap >= s.cap_s else (f" (of its {s.cap_s:.0f} s: what the budget leaves after the earlier caps)"
                                         if cap >= s.min_s else f" (its cap {s.cap_s:.0f} s: runs only if earlier "
                                         "stages finish early)")
        print(f"  {s.name:10s} cap {cap:4.0f} s{need}{cut}: {' '.join(s.argv)}")
    print(f"  caps add up to {a.budget_s - left:.0f} s within the budget of {a.budget_s:.0f} s (stages that finish "
          "early leave their time to the later ones)")
    from verify_attn import build as vb
    n_all = len(vb.instantiation_files())
    est = ""
    try:
        bt = json.loads(BUILD_TIMES.read_text())
        est = (f"; measured here {bt['date'][:10]} ({bt['here_cores']} cores, {len(bt['stems'])} files, "
               f"{bt['here_wall_s']:.0f} s wall, {bt['sum_target_s']:.0f} s of targets): ~{bt['device_estimate_s']:.0f} "
               f"s on {bt['device_cores']} cores (upper bound)")
    except (OSError, ValueError, KeyError):
        est = "; not timed here yet (python -m bench.gpu_check --time-build)"
    print(f"  build: {len(jit)} of {n_all} kernel instantiations (VERIFY_ATTN_JIT_SET; the others JIT on demand)"
          f"{est}")


def main(argv: Optional[list[str]] = None) -> int:
    a = _parser().parse_args(argv)
    if a.build_stage:
        return build_stage(test_libs=os.environ.get("VA_GPU_CHECK_TEST_LIBS", "1") == "1")
    if a.collect:
        import tarfile

        from bench.gpu_run.gpu_results import collect
        try:
            return collect(Path(a.collect), name=a.collect_as)
        except (OSError, tarfile.TarError) as e:   # a wrong path or archive: one line, no traceback
            from verify_attn.utils import usage_error
            why = (f"not a gzip'd tar archive ({type(e).__name__})" if isinstance(e, tarfile.TarError)
                   else e.strerror if e.strerror else str(e))
            raise usage_error(f"python -m bench.gpu_check: error: --collect {a.collect}: {why}") from None
    if a.prepare_carry:
        return prepare_carry()

    import torch  # after argument parsing: --help stays instant
    out = out_dir()
    stages = select(plan(out, a), a)
    if a.time_build:
        rec = time_build(jit_set_of(stages))
        BUILD_TIMES.parent.mkdir(parents=True, exist_ok=True)
        BUILD_TIMES.write_text(json.dumps(rec, indent=1))
        print(f"built {len(rec['stems'])} instantiation files for {rec['arch']} here in {rec['here_wall_s']:.0f} s "
              f"({rec['here_cores']} cores; {rec['sum_target_s']:.0f} s of ninja targets, longest "
              f"{next(iter(rec['targets_s'].values()))} s): ~{rec['device_estimate_s']:.0f} s on "
              f"{rec['device_cores']} cores; written to {BUILD_TIMES}")
        return 0
    gpu = torch.cuda.is_available()
    if a.dry_run or not gpu:
        print_plan(stages, out, a, "bench.gpu_check " + ("dry run" if a.dry_run else "found no CUDA GPU: nothing run"))
        return 0

    out.mkdir(parents=True, exist_ok=True)
    jit = jit_set_of(stages)
    env = stage_env(jit)
    env["VA_GPU_CHECK_TEST_LIBS"] = "1" if any(s.name.startswith("tests") for s in stages) else "0"
    print(f"[gpu_check] {torch.cuda.get_device_name()}, torch {torch.__version__}; JIT set: {len(jit)} files; "
          f"{model_device_line(torch.cuda.get_device_name())}", flush=True)
    t_end = time.perf_counter() + a.budget_s
    quarantine: set = set()
    for st in stages:
        if st.name != "build" and any(s.name == "build" and s.status != "ok" for s in stages):
            _drop_cuda(st)  # a failed build would be retried (minutes) inside every later stage
        quarantine_stage(st, quarantine)
        if "bench.verify" in st.argv and not any(s.name == "ceilings" and s.status == "ok" for s in stages):
            st.argv.append("--no-ceilings")  # else every benchmark stage would measure (or fail to) on its own
        run_stage(st, out, t_end - time.perf_counter(), env)
        print(f"[gpu_check] {st.name:10s} {st.status} ({st.wall_s:.0f} s)", flush=True)
        if st.status not in ("ok",) and not st.status.startswith("skipped") and st.log:
            print(_tail(st.log), flush=True)
        if st.name == "smoke":
            from bench.gpu_run.smoke import load_quarantine
            from verify_attn.backends.cuda import QUARANTINE_ENV
            quarantine = set(load_quarantine(out / "smoke.json"))
            if quarantine:
                env[QUARANTINE_ENV] = ",".join(sorted(quarantine))
                print(f"[gpu_check] quarantined for the rest of the run: {env[QUARANTINE_ENV]}", flush=True)
    record = {"device": torch.cuda.get_device_name(), "date": _dt.datetime.now().isoformat(timespec="seconds"),
              "torch": torch.__version__, "budget_s": a.budget_s, "out": str(out), "jit_set": jit,
              "stages": [asdict(s) for s in stages]}
    (out / "gpu_check.json").write_text(json.dumps(record, indent=2))
    print(f"\n[gpu_check] {torch.cuda.get_device_name()}: results under {out}")
    for s in stages:
        print(f"  {s.name:10s} {s.status:40s} {s.wall_s:6.0f} s")
    cal = _load(out, "calibration")
    print_table(out, predictions_of(cal) if cal else None)
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
