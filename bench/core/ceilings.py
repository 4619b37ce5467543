"""Measured ceilings of the GPU at hand: device-to-device copy bandwidth and a bf16 matrix rate.

Measured once per GPU (and torch version) and cached as JSON in
verify_attn.utils.cache_dir()/ceilings.json ($VERIFY_ATTN_CACHE, else $XDG_CACHE_HOME/verify_attn, else ~/.cache/verify_attn).
`python -m bench.ceilings [--refresh] [--json PATH]` measures and prints them.

- copy_gbs: `dst.copy_(src)` of a buffer much larger than L2, counted as
  read + write bytes per second (the convention behind "~4.3 TB/s on an H200").
- mma_tflops: the tensor rate the floor is measured against: the mma.sync-class
  rate (`mma_sync_tflops`: csrc/ceilings/mma_peak.cu, register-resident bf16
  m16n8k16 MMAs over the whole GPU, JIT-built here) when the CUDA toolkit is at
  hand, since our kernels are built on mma.sync; else the cuBLAS rate.
- cublas_tflops: a bf16 8192^3 torch.matmul (cuBLAS). On Hopper that uses wgmma,
  so it is above what mma.sync code reaches there; reported beside it.
- hmma_latency_cycles, l2_read_gbs, dram_read_gbs: the SASS model's calibration
  inputs (bench/model/devices.py): one dependent MMA chain timed with clock64, and a
  read sweep of an L2-resident buffer and of a 1 GiB one (csrc/ceilings/mma_peak.cu).
- wgmma_tflops, wgmma_latency_cycles (compute capability 9.0 only; None with a
  `*_skipped` reason elsewhere): the warpgroup MMA rate (wgmma_peak_kernel: m64n256k16
  bf16, A in registers, B in shared memory, 8 per commit group, 2 warpgroups per SM)
  and the cycles of one (wgmma + wait_group 0) round at N = 64 and N = 256: what the
  SASS model predicts for the same kernels (`python -m bench.model --probes`). Not the
  floor's rate: our kernels are mma.sync.
- wgmma_operand_tflops (compute capability 9.0 only): {"RS N=16": TFLOP/s, "SS N=16": ...}
  for m64nNk16 bf16 at N = 16, 32, 64, 256 with A from registers (RS) and from shared
  memory (SS), one block of 2 warpgroups an SM (wgmma_operand_kernel). The model charges
  SS operands at 128 B/clk per SM and reads SS below N = 64 as shared-memory bound: the
  bound it names for Hopper v3's pair (NOTES.md, "The wgmma operand probe").
- smem_share (compute capability 9.0 only): the same kernel at N = 64 while a third
  warpgroup lands cp.async copies from L2 into shared memory (a quarter of the operand
  bytes): wgmmas alone, copies alone, both; whether copies landing and operand reads
  share one budget, as the model adds them.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Callable, Optional

import torch

_FILE = "ceilings.json"


def cache_dir() -> Path:
    from verify_attn.utils import cache_dir as root
    return root()


def _key(name: str) -> str:
    return f"{name}|torch {torch.__version__}"


def _event_median_ms(fn: Callable[[], None], reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def measure_copy_gbs(nbytes: int = 1 << 30, reps: int = 20) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = _event_median_ms(lambda: dst.copy_(src), reps)
    return 2 * src.numel() * 2 / (ms * 1e-3) / 1e9


def measure_mma_tflops(n: int = 8192, reps: int = 20) -> float:
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    c = torch.empty(n, n, dtype=torch.bfloat16, device="cuda")
    ms = _event_median_ms(lambda: torch.matmul(a, b, out=c), reps)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def _probe_module():
    """The JIT-built probes of csrc/ceilings (mma peak and latency, read bandwidth)."""
    from torch.utils.cpp_extension import load

    from verify_attn import build as vb
    from verify_attn.backends.cuda import jit_archs

    vb.ensure_cuda_home()
    archs = jit_archs()
    src = vb.CSRC / "ceilings"
    files = ("mma_peak.cu", "kv_stream.cu", "clusters.cu", "mma_peak.h", "mma_peak_binding.cpp")
    tag = vb.source_hash([str(src / "mma_peak.cu"), *((src / f).read_text() for f in files)])[:8]
    return load(name="va_mma_peak_" + "_".join(a.replace("sm_", "") for a in archs) + "_" + tag,
                sources=[str(src / "mma_peak_binding.cpp"), str(src / "mma_peak.cu"), str(src / "kv_stream.cu"),
                         str(src / "clusters.cu")],
                extra_include_paths=[str(vb.CSRC)], extra_cuda_cflags=vb.nvcc_extension_flags(archs))


def measure_mma_latency_cycles(iters: int = 4096) -> float:
    """SM cycles per dependent bf16 m16n8k16 MMA (one warp, one chain): the model's hmma_latency."""
    mod = _probe_module()
    out = torch.zeros(2, dtype=torch.float32, device="cuda")
    vals = []
    for _ in range(5):
        mod.mma_latency(out, iters)
        torch.cuda.synchronize()
        vals.append(float(out[0]))
    return statistics.median(vals)


def measure_read_gbs(nbytes: int, repeats: int, reps: int = 10) -> float:
    """Read bandwidth (GB/s) of a grid sweeping an nbytes buffer `repeats` times (csrc/ceilings)."""
    from verify_attn import device as vdevice

    mod = _probe_module()
    buf = torch.zeros(nbytes // 4, dtype=torch.float32, device="cuda")
    blocks = vdevice.query(torch.cuda.current_device()).sm_count * 8
    out = torch.zeros(blocks, dtype=torch.float32, device="cuda")
    ms = _event_median_ms(lambda: mod.read_bw(buf, out, blocks, repeats), reps)
    return nbytes * repeats / (ms * 1e-3) / 1e9


def measure_l2_gbs() -> float:
    """L2 -> SM read bandwidth: a buffer of a quarter of L2 swept 50 times."""
    from verify_attn import device as vdevice

    l2 = vdevice.query(torch.cuda.current_device()).l2_bytes
    return measure_read_gbs(max(1 << 20, (l2 // 4) // 16 * 16), repeats=50)


def measure_mma_sync_tflops(reps: int = 10, iters: int = 512) -> float:
    """bf16 mma.sync m16n8k16 rate of the whole GPU (csrc/ceilings/mma_peak.cu)."""
    from verify_attn import device as vdevice

    mod = _probe_module()
    blocks = vdevice.query(torch.cuda.current_device()).sm_count * 8
    out = torch.empty(blocks * mod.threads(), dtype=torch.float32, device="cuda")
    ms = _event_median_ms(lambda: mod.mma_peak(out, blocks, iters, True), reps)
    if not torch.isfinite(out).all():
        raise RuntimeError("mma_peak produced non-finite sums")
    return mod.flops(blocks, iters) / (ms * 1e-3) / 1e12


KV_STREAM_TILES = ((16, 2), (16, 4), (16, 8), (32, 2), (32, 3), (32, 4), (32, 6), (64, 2), (64, 3))  # (bn, stages)


def measure_kv_stream(ctx: int = 185_000, row_bytes: int = 1152, tiles=KV_STREAM_TILES, delays=(0, 3000),
                      reps: int = 5) -> list[dict]:
    """The KV stream probe (csrc/ceilings/kv_stream.cu) over tile shapes, prefetch depths, lane layouts, row-id
    sources and stand-in math per tile: one CTA per SM streaming `ctx` shuffled rows of `row_bytes` (the MLA
    row), cold (the pool is 4x L2 or more at 185k). Rows: {bn, stages, across, idx, delay, inflight_bytes (the
    prefetch distance in bytes per SM), us, gbs, us_per_tile}. What the model's memory term is judged
    against."""
    from verify_attn import device as vdevice

    mod = _probe_module()
    sms = vdevice.query(torch.cuda.current_device()).sm_count
    g = torch.Generator(device="cuda").manual_seed(0)
    pool = torch.randint(0, 255, (ctx * row_bytes,), dtype=torch.uint8, device="cuda", generator=g)
    shuffled = torch.randperm(ctx, device="cuda", generator=g).to(torch.int32)
    out = torch.zeros(sms, dtype=torch.float32, device="cuda")
    per_cta = -(-ctx // sms)
    rows = []
    for bn, stages in tiles:
        for across in (0, 1):
            for idx in (0, 1, 2):
                for delay in delays:
                    ms = _event_median_ms(lambda: mod.kv_stream(pool, shuffled, out, row_bytes, bn, stages, across, idx,
                                                                delay, sms), reps, warmup=1)
                    tiles_per_cta = -(-per_cta // bn)
                    rows.append({"bn": bn, "stages": stages, "across": across, "idx": idx, "delay": delay,
                                 "inflight_bytes": (stages - 1) * bn * row_bytes, "us": ms * 1e3,
                                 "gbs": ctx * row_bytes / (ms * 1e-3) / 1e9,
                                 "us_per_tile": ms * 1e3 / tiles_per_cta})
    return rows


def _has_wgmma() -> bool:
    """wgmma is sm_90a code: compute capability 9.0 only."""
    return tuple(torch.cuda.get_device_capability()) == (9, 0)


def _require_wgmma() -> None:
    if not _has_wgmma():
        raise RuntimeError(f"wgmma needs compute capability 9.0, this GPU is {torch.cuda.get_device_capability()}")


def measure_wgmma_tflops(reps: int = 10, iters: int = 1024) -> float:
    """bf16 wgmma m64n256k16 rate of the whole GPU (csrc/ceilings/mma_peak.cu wgmma_peak_kernel),
    one block (2 warpgroups) per SM. Compute capability 9.0 only."""
    from verify_attn import device as vdevice

    _require_wgmma()
    mod = _probe_module()
    blocks = vdevice.query(torch.cuda.current_device()).sm_count
    out = torch.full((blocks * mod.wgmma_threads(),), float("nan"), dtype=torch.float32, device="cuda")
    ms = _event_median_ms(lambda: mod.wgmma_peak(out, blocks, iters), reps)
    if not torch.isfinite(out).all():  # a build without sm_90a code leaves out unwritten
        raise RuntimeError("wgmma_peak wrote no finite sums (was the probe built for sm_90a?)")
    return mod.wgmma_flops(blocks, iters) / (ms * 1e-3) / 1e12


def measure_wgmma_latency_cycles(iters: int = 1024) -> tuple[float, float]:
    """SM cycles of one (wgmma + wait_group 0) round, one warpgroup: (N = 64, N = 256). The model's
    HGMMA pipe time is N / 2 cycles; the rest is its hgmma_latency plus the round's issue."""
    _require_wgmma()
    mod = _probe_module()
    out = torch.full((4,), float("nan"), dtype=torch.float32, device="cuda")
    vals = []
    for _ in range(5):
        mod.wgmma_latency(out, iters)
        torch.cuda.synchronize()
        vals.append((float(out[0]), float(out[2])))
    if not all(v == v for pair in vals for v in pair):
        raise RuntimeError("wgmma_latency wrote no cycles (was the probe built for sm_90a?)")
    return statistics.median(v[0] for v in vals), statistics.median(v[1] for v in vals)


WGMMA_OPERAND_NS = (16, 32, 64, 256)  # csrc/ceilings/mma_peak.cu launch_wgmma_operands


def measure_wgmma_operand_tflops(reps: int = 10, iters: int = 1024) -> dict[str, float]:
    """Whole-GPU bf16 rate of wgmma m64nNk16 with A from registers and from shared memory ({"RS N=16": TFLOP/s,
    "SS N=16": ..., for N in WGMMA_OPERAND_NS}; csrc/ceilings/mma_peak.cu wgmma_operand_kernel, one block of 2
    warpgroups an SM). Compute capability 9.0 only."""
    mod, blocks, src, out = _operand_probe()
    rates = {}
    for n in WGMMA_OPERAND_NS:
        for ss in (False, True):
            ms = _operand_ms(mod, src, out, blocks, iters, 0, n, ss, reps)
            rates[f"{'SS' if ss else 'RS'} N={n}"] = mod.wgmma_operand_flops(blocks, iters, n) / (ms * 1e-3) / 1e12
    return rates


def _operand_probe():
    """(the probe module, one block an SM, the copier's source: each block its own L2-resident slice, the sums)."""
    from verify_attn import device as vdevice

    _require_wgmma()
    mod = _probe_module()
    blocks = vdevice.query(torch.cuda.current_device()).sm_count
    src = torch.zeros(blocks * mod.wgmma_operand_src_bytes(), dtype=torch.uint8, device="cuda")
    return mod, blocks, src, torch.empty((blocks * mod.wgmma_threads(),), dtype=torch.float32, device="cuda")


def _operand_ms(mod, src, out, blocks: int, iters: int, copy_rounds: int, n: int, ss: bool, reps: int) -> float:
    out.fill_(float("nan"))
    ms = _event_median_ms(lambda: mod.wgmma_operands(src, out, blocks, iters, copy_rounds, n, ss), reps)
    if not torch.isfinite(out).all():  # a build without sm_90a code leaves out unwritten
        raise RuntimeError("wgmma_operands wrote no finite sums (was the probe built for sm_90a?)")
    return ms


SMEM_SHARE_COPY_FRACTION = 0.25  # copy bytes a block lands, as a fraction of the operand bytes its wgmmas read


def operand_bytes_per_wgmma(n: int, ss: bool) -> int:
    """Shared-memory bytes one warpgroup's wgmma m64nNk16 bf16 reads: B's N x 32, and A's 64 x 32 in the SS form."""
    return n * 32 + (2048 if ss else 0)


def measure_smem_share(reps: int = 10, iters: int = 1024, n: int = 64) -> dict[str, dict]:
    """Whether copies landing in shared memory take the bandwidth wgmma operands read: the operand probe at N (RS and
    SS) while its copier lands SMEM_SHARE_COPY_FRACTION of the wgmmas' operand bytes from L2, timed as wgmmas alone,
    copies alone and both at once: {"SS N=64": {"wgmma_us", "copy_us", "both_us", "operand_bytes", "copy_bytes" (a
    block's), "both_over_wgmma"}, "RS N=64": ...}. bench.model adds copies and operands on one 128 B/clk budget: SS at
    N = 64 already fills it, so both at once take (1 + fraction) x the wgmmas' time (1.25); RS uses half of it, so the
    copies fit beside (1.00). Copies on a path of their own: 1.00 for both."""
    mod, blocks, src, out = _operand_probe()
    wgmmas = round(mod.wgmma_operand_flops(1, iters, n) / (2 * 64 * n * 16))  # a block's, both warpgroups
    res = {}
    for ss in (False, True):
        op_bytes = wgmmas * operand_bytes_per_wgmma(n, ss)
        rounds = max(1, round(SMEM_SHARE_COPY_FRACTION * op_bytes / mod.wgmma_operand_copy_bytes()))
        t = {k: _operand_ms(mod, src, out, blocks, i, r, n, ss, reps) * 1e3
             for k, i, r in (("wgmma_us", iters, 0), ("copy_us", 0, rounds), ("both_us", iters, rounds))}
        res[f"{'SS' if ss else 'RS'} N={n}"] = {**t, "operand_bytes": op_bytes,
                                                "copy_bytes": rounds * mod.wgmma_operand_copy_bytes(),
                                                "both_over_wgmma": t["both_us"] / t["wgmma_us"]}
    return res


def smem_share_line(share: dict[str, dict]) -> str:
    """One line of the sharing probe: each form's wgmmas alone, copies alone, both, and both / wgmmas alone."""
    parts = [f"{k} {v['wgmma_us']:.0f} / {v['copy_us']:.0f} / {v['both_us']:.0f} us ({v['both_over_wgmma']:.2f})"
             for k, v in share.items()]
    return ("copies beside wgmma operands, wgmmas / copies / both (both over wgmmas; the model: RS 1.00, SS 1.25): "
            + ", ".join(parts))


def operand_bytes_per_clk(n: int, ss_over_rs: float) -> float:
    """Shared-memory bytes per clock per SM that SS wgmma m64nNk16 moved, taking RS at the same N as the tensor pipe's
    4,096 FLOP/clk per SM: an SS wgmma reads (64 + N) x 32 bytes for 2 x 64 x N x 16 FLOPs. Where SS is slower than RS
    this is the operand path's bandwidth (bench.model charges 128); where the two run even, a lower bound on it."""
    return 4096 * (64 + n) / (64 * n) * ss_over_rs


def wgmma_operand_line(rates: dict[str, float]) -> str:
    """One line of the operand probe's rates: RS / SS TFLOP/s, their ratio and the operand bytes per clock it implies,
    at each N."""
    parts = []
    for n in WGMMA_OPERAND_NS:
        rs, ss = rates.get(f"RS N={n}"), rates.get(f"SS N={n}")
        if not rs or ss is None:
            continue
        parts.append(f"N={n} {rs:.0f}/{ss:.0f} ({ss / rs:.2f}, {operand_bytes_per_clk(n, ss / rs):.0f} B/clk)")
    return "wgmma operands, RS/SS TFLOP/s (SS/RS, SS operand bytes per clock per SM): " + ", ".join(parts)


def _load() -> dict:
    try:
        return json.loads((cache_dir() / _FILE).read_text())
    except (OSError, ValueError):
        return {}


def _store(all_entries: dict) -> None:
    d = cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(all_entries, indent=2))
    os.replace(tmp, d / _FILE)  # atomic: a reader never sees half a file


def measure_v3_cluster_residency() -> dict:
    """Hopper v3's 2-CTA cluster tile (cuda@v3-cluster) at its launch resources: how many of its clusters the GPU holds
    at once (cudaOccupancyMaxActiveClusters) against the clusters bench.model puts in one wave (one a pair of SMs)."""
    from verify_attn import build as vb
    t = vb.V3_SM90_CLUSTER_TILE
    smem = vb.tile_smem("mla576", t)
    n = _probe_module().max_active_clusters(32 * t.num_warps, smem, t.cluster)
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return {"max_active_clusters": n, "clusters_one_wave": sms // t.cluster, "threads": 32 * t.num_warps,
            "smem_bytes": smem, "cluster": t.cluster}


def get_ceilings(refresh: bool = False) -> Optional[dict]:
    """{'device', 'copy_gbs', 'mma_tflops', 'date', 'torch'} for the current GPU, or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    entries = _load()
    if not refresh and _key(name) in entries:
        return entries[_key(name)]
    cublas = measure_mma_tflops()
    try:
        mma_sync, source = measure_mma_sync_tflops(), "mma.sync (csrc/ceilings/mma_peak.cu)"
    except Exception as e:  # no toolkit to build it: the cuBLAS rate, and say so
        mma_sync, source = None, f"cuBLAS (mma.sync probe unavailable: {type(e).__name__}: {e})"
    probes: dict = {}
    for key, fn in (("hmma_latency_cycles", measure_mma_latency_cycles), ("l2_read_gbs", measure_l2_gbs),
                    ("dram_read_gbs", lambda: measure_read_gbs(1 << 30, repeats=2))):
        try:  # the model's calibration inputs (bench/model/devices.py); a failed probe is said, not fatal
            probes[key] = fn()
        except Exception as e:
            probes[key] = None
            probes[key + "_error"] = f"{type(e).__name__}: {e}"
    # the sm_90a probes: wgmma's measured rate and latency (the model predicts both), and how many of Hopper v3's 2-CTA
    # clusters the GPU holds at once (NOTES.md, "Hopper's v3 as a 2-CTA cluster")
    if _has_wgmma():
        for key, fn in (("wgmma_tflops", measure_wgmma_tflops),
                        ("wgmma_latency_cycles", measure_wgmma_latency_cycles),
                        ("wgmma_operand_tflops", measure_wgmma_operand_tflops),
                        ("smem_share", measure_smem_share),
                        ("v3_cluster_residency", measure_v3_cluster_residency)):
            try:
                probes[key] = fn()
            except Exception as e:
                probes[key] = None
                probes[key + "_error"] = f"{type(e).__name__}: {e}"
    else:
        for key in ("wgmma_tflops", "wgmma_latency_cycles", "wgmma_operand_tflops", "smem_share"):
            probes[key] = None
            probes[key + "_skipped"] = ("wgmma is sm_90a only; compute capability "
                                        f"{torch.cuda.get_device_capability()}")
    entry = {
        "device": name,
        **probes,
        "copy_gbs": measure_copy_gbs(),
        "mma_tflops": mma_sync if mma_sync is not None else cublas,
        "mma_source": source,
        "mma_sync_tflops": mma_sync,
        "cublas_tflops": cublas,
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "method": "copy_: 1 GiB bf16, read+write bytes; matmul: bf16 8192^3 cuBLAS; mma.sync: bf16 m16n8k16 "
                  "register-resident, 8 chains/warp, 8 CTAs/SM; wgmma (9.0 only): bf16 m64n256k16, A in "
                  "registers, 8 per commit group, wait_group 1, 1 CTA of 2 warpgroups per SM; wgmma operands (9.0 "
                  "only): bf16 m64nNk16, N 16/32/64/256, A in registers (RS) or shared memory (SS), 64 / N "
                  "accumulators below N = 64, 1 CTA of 2 warpgroups per SM; smem share (9.0 only): the same at N = "
                  "64 with a third warpgroup landing cp.async copies of 0.25 x the operand bytes from L2, alone and "
                  "together; CUDA events, median",
    }
    entries = _load()  # re-read: another process may have written meanwhile
    entries[_key(name)] = entry
    _store(entries)
    return entry


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ceilings", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--refresh", action="store_true", help="measure again even if cached")
    ap.add_argument("--json", metavar="PATH", help="also write the entry to PATH")
    ap.add_argument("--kv-stream", metavar="PATH", help="run the KV stream probe sweep (the loader alone: bandwidth "
                    "against bytes in flight, lane layout, row-id source) and write its rows to PATH")
    a = ap.parse_args(argv)
    if a.kv_stream:
        if not torch.cuda.is_available():
            print("no CUDA device: the KV stream probe needs one")
            return 0
        rows = measure_kv_stream()
        Path(a.kv_stream).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
        print(f"{'bn':>3} {'st':>2} {'across':>6} {'idx':>3} {'delay':>5} {'in flight':>9} {'us':>8} {'GB/s':>7}")
        for r in rows:
            print(f"{r['bn']:3d} {r['stages']:2d} {r['across']:6d} {r['idx']:3d} {r['delay']:5d} "
                  f"{r['inflight_bytes'] / 1024:8.0f}K {r['us']:8.1f} {r['gbs']:7.0f}")
        return 0
    c = get_ceilings(refresh=a.refresh)
    if c is None:
        print("no CUDA device: nothing to measure (the benchmark then uses datasheet ceilings)")
        return 0
    sync = c.get("mma_sync_tflops")
    print(f"{c['device']}: copy {c['copy_gbs']:.0f} GB/s, bf16 mma.sync "
          f"{'n/a' if sync is None else f'{sync:.0f}'} TFLOP/s, cuBLAS {c.get('cublas_tflops', 0):.0f} TFLOP/s; "
          f"floor uses {c['mma_tflops']:.0f} ({c.get('mma_source', 'cuBLAS')}) "
          f"(measured {c['date']}, cache {cache_dir() / _FILE})")
    lat, l2, rd = c.get("hmma_latency_cycles"), c.get("l2_read_gbs"), c.get("dram_read_gbs")
    print(f"  model calibration inputs: HMMA latency {'n/a' if lat is None else f'{lat:.1f} cycles'}, "
          f"L2 read {'n/a' if l2 is None else f'{l2:.0f} GB/s'}, DRAM read {'n/a' if rd is None else f'{rd:.0f} GB/s'}")
    res = c.get("v3_cluster_residency")
    if res:
        print(f"  cuda@v3-cluster: {res['max_active_clusters']} clusters of {res['cluster']} CTAs "
              f"({res['threads']} threads, {res['smem_bytes']} B) held at once; bench.model assumes "
              f"{res['clusters_one_wave']}" + ("" if res["max_active_clusters"] >= res["clusters_one_wave"] else
                                              ": FEWER, a 185k grid runs a second wave"))
    wg, wl = c.get("wgmma_tflops"), c.get("wgmma_latency_cycles")
    if wg is not None or wl is not None:
        print(f"  wgmma (sm_90a): bf16 m64n256k16 {'n/a' if wg is None else f'{wg:.0f} TFLOP/s'}, "
              f"wgmma + wait round {'n/a' if not wl else f'{wl[0]:.1f} cycles at N = 64, {wl[1]:.1f} at N = 256'}")
        if c.get("wgmma_operand_tflops"):
            print("  " + wgmma_operand_line(c["wgmma_operand_tflops"]) + " -- bench.model: python -m bench.model "
                  "--probes --arch sm_90a")
        if c.get("smem_share"):
            print("  " + smem_share_line(c["smem_share"]))
    else:
        why = c.get("wgmma_tflops_skipped") or c.get("wgmma_tflops_error") or "not measured (cached entry; --refresh)"
        print(f"  wgmma: {why}")
    if a.json:
        Path(a.json).write_text(json.dumps(c, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
