"""The ceiling probes (csrc/ceilings/mma_peak.cu) read by the model: predicted rates of measured kernels.

`bench.ceilings` measures these kernels on a GPU (mma.sync and wgmma rates, the wgmma + wait round, wgmma with A
from registers and from shared memory); this module reads the same kernels' SASS and predicts what those
measurements should give, so the first GPU run checks the model's tensor-pipe constants (hmma interval, hgmma
interval and latency) and its shared-memory charge for wgmma operands against the hardware, kernel by kernel.
Each probe's loop carries a `// sass-model: tile-loop` marker; one loop iteration is simulated like a KV tile
(`sim.simulate`) with the warps the probe's launch puts on one scheduler.

    python -m bench.model --probes        # predicted probe readings per device
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from verify_attn import build as vb
from verify_attn import device as vdevice

from . import analysis, sass, sim
from .devices import DeviceModel
from .kernels import _marked_loop, _resource_usage

PROBE_SRC = vb.CSRC / "ceilings" / "mma_peak.cu"
PROBE_HDR = vb.CSRC / "ceilings" / "mma_peak.h"


def probe_constants(src: Path = PROBE_SRC) -> dict[str, int]:
    """The probe file's `constexpr int kName = value;` constants (its launch geometry)."""
    out = {}
    for m in re.finditer(r"constexpr int (k\w+) = ([^;]+);", src.read_text()):
        expr = m.group(2).split("//")[0].strip()
        try:
            out[m.group(1)] = int(eval(expr, {"__builtins__": {}}, dict(out)))  # noqa: S307 (our own source)
        except Exception:
            continue
    return out


def probe_cubin(arch: str, use_cache: bool = True) -> Path:
    """The probes' cubin for `arch`, built with the kernel build's flags (-lineinfo), cached by the
    probe sources and the device API they include."""
    nvcc = vb.nvcc_path()
    vb.gencode_flags([arch])  # validates the name
    key = vb.source_hash(["probe-cubin-v1", *vb.NVCC_FLAGS, arch, nvcc, PROBE_SRC.read_text(), PROBE_HDR.read_text()])
    from verify_attn.utils import cache_dir
    cache = cache_dir() / "cubins"
    out = cache / f"ceiling_probes-{arch}-{key}.cubin"
    if use_cache and out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    cmd = [nvcc, *vb.NVCC_FLAGS, "-cubin", f"-arch={arch}", f"-I{vb.CSRC}", str(PROBE_SRC), "-o", str(tmp)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nvcc -cubin failed for {PROBE_SRC.name} ({arch}):\n{' '.join(cmd)}\n{r.stderr[-6000:]}")
    tmp.replace(out)
    return out


@dataclass
class ProbeLoop:
    kernel: str                   # mangled name
    path: analysis.TilePath       # one iteration of the marked loop
    reading: analysis.TileReading
    registers: int


def read(arch: str) -> dict[str, ProbeLoop]:
    """The marked loop of every probe kernel in the `arch` cubin, by mangled name."""
    cubin = probe_cubin(arch)
    funcs = sass.parse(sass.disassemble(cubin))
    regs = _resource_usage(cubin)
    out = {}
    for name, f in funcs.items():
        try:
            kfile, mk, lp = _marked_loop(f, "tile_loops")
        except LookupError:
            continue  # no marked loop (or, off sm_90a, a wgmma kernel compiled to nothing)
        path = analysis.tile_path(f, lp, mk.cold, kfile)
        out[name] = ProbeLoop(name, path, analysis.read_tile(path), regs.get(name, 0))
    return out


def find(loops: dict[str, ProbeLoop], part: str) -> ProbeLoop:
    hits = [v for k, v in loops.items() if part in k]
    if len(hits) != 1:
        raise LookupError(f"probe kernel {part!r}: {len(hits)} marked loops among {sorted(loops)}")
    return hits[0]


@dataclass
class ProbePrediction:
    name: str                 # what bench.ceilings reports: wgmma_tflops, wgmma_latency_cycles[N=64], ...
    value: float
    unit: str
    cycles_per_iter: float    # simulated, one scheduler
    warps_per_scheduler: int
    bound: str                # the pipe within 10% of the simulated cycles, else latency
    detail: str


_RATE_ITERS = 32  # simulated iterations of a rate probe: the first one's ramp is < 1% of the run


def _bound(res: sim.SimResult, per_iter: float) -> str:
    lim = {"tensor": res.pipe_busy.get("tensor", 0.0),
           "smem": res.pipe_busy.get("mio", 0.0) + res.pipe_busy.get("smem_async", 0.0),
           "issue": res.issued_per_iter * res.warps}
    name, val = max(lim.items(), key=lambda kv: kv[1])
    return name if val >= 0.9 * per_iter else "latency"


def rate(loop: ProbeLoop, dev: DeviceModel, *, threads: int, smem_bytes: int, blocks_per_sm: Optional[int] = None,
         name: str = "") -> ProbePrediction:
    """Whole-GPU TFLOP/s of a register-resident MMA probe: every SM full of resident blocks, each warp
    running the marked loop; FLOPs per iteration from its SASS (HMMA.16816 and HGMMA shapes)."""
    occ = vdevice.ctas_per_sm(vdevice.spec(dev.arch), threads=threads, regs_per_thread=loop.registers,
                              smem_bytes=smem_bytes)
    if occ < 1:
        raise ValueError(f"{loop.kernel[:60]}: cannot launch on {dev.name} (registers {loop.registers})")
    occ = min(occ, blocks_per_sm) if blocks_per_sm else occ
    warps = occ * threads // 32
    per_sched = max(1, warps // dev.schedulers)
    res = sim.simulate(loop.path.instrs, dev, warps=per_sched, warps_per_barrier_group=max(1, threads // 32 // 4),
                       iters=_RATE_ITERS)
    # whole run: the probe's warps have no barrier, so the greedy scheduler may run one warp ahead of the
    # others, and the steady-state window of sim.simulate (the last iterations of every warp) undercounts
    per_iter = res.trace_end / res.iters
    flops = loop.reading.hmma_flops + loop.reading.hgmma_flops  # per warp per iteration
    tflops = flops * per_sched * dev.schedulers * dev.sms.value * dev.clock_hz / per_iter / 1e12
    return ProbePrediction(name, tflops, "TFLOP/s", per_iter, per_sched, _bound(res, per_iter),
                           f"{occ} block(s)/SM x {threads // 32} warps, {flops} FLOP per warp per iteration, "
                           f"tensor pipe busy {res.pipe_busy.get('tensor', 0.0) / per_iter:.0%}")


def cycles(loop: ProbeLoop, dev: DeviceModel, *, name: str = "") -> ProbePrediction:
    """Cycles per iteration of a one-warp-per-scheduler timing loop (a latency probe)."""
    res = sim.simulate(loop.path.instrs, dev, warps=1, warps_per_barrier_group=1, iters=8)
    return ProbePrediction(name, res.cycles_per_iter, "cycles", res.cycles_per_iter, 1,
                           _bound(res, res.cycles_per_iter),
                           f"{loop.reading.instructions} instructions per iteration")


def predict(dev: DeviceModel) -> list[ProbePrediction]:
    """The model's readings of the probes bench.ceilings measures on `dev`."""
    k = probe_constants()
    loops = read(dev.arch)
    out = [rate(find(loops, "mma_peak_kernelI13__nv_bfloat16"), dev, threads=k["kThreads"], smem_bytes=0,
                blocks_per_sm=8, name="mma_sync_tflops")]
    if dev.hgmma_latency is not None:
        out.append(rate(find(loops, "wgmma_peak_kernel"), dev, threads=k["kWgThreads"],
                        smem_bytes=k["kWgSmemBytes"], blocks_per_sm=1, name="wgmma_tflops"))
        for n in (64, 256):
            out.append(cycles(find(loops, f"wgmma_latency_kernelILi{n}E"), dev,
                              name=f"wgmma_latency_cycles[N={n}]"))
        out.extend(operand_rates(loops, dev, k))
    return out


OPERAND_NS = (16, 32, 64, 256)  # wgmma_operand_kernel's instantiations (bench.core.ceilings.WGMMA_OPERAND_NS)


def operand_rates(loops: dict[str, ProbeLoop], dev: DeviceModel, k: dict[str, int]) -> list[ProbePrediction]:
    """wgmma_operand_kernel<N, SS>: the rate of m64nNk16 with A from registers (RS) and from shared memory (SS), named
    as bench.ceilings reports them (wgmma_operand_tflops[SS N=16], ...)."""
    return [rate(find(loops, f"wgmma_operand_kernelILi{n}ELb{int(ss)}E"), dev, threads=k["kWgThreads"],
                 smem_bytes=k["kOpSmemBytes"], blocks_per_sm=1,
                 name=f"wgmma_operand_tflops[{'SS' if ss else 'RS'} N={n}]")
            for n in OPERAND_NS for ss in (False, True)]


def share_ratio(n: int, ss: bool, copy_fraction: float, dev: DeviceModel) -> float:
    """The model's (wgmmas and copies together) / (wgmmas alone) for the operand probe at N whose copier lands
    copy_fraction of the operand bytes (bench.core.ceilings.measure_smem_share): one 128 B/clk budget for operand reads
    and copies landing, against the tensor pipe's N / 2 cycles a wgmma."""
    tensor = 2 * 64 * n * 16 / dev.datasheet_mma_flop_per_clk_sm.value
    operand_bytes = n * analysis.WGMMA_K_BYTES + (analysis.WGMMA_A_SMEM_BYTES if ss else 0)
    operands = operand_bytes / dev.smem_bytes_per_clk_sm.value
    return max(tensor, operands * (1 + copy_fraction)) / max(tensor, operands)


def measured_vs_model(ceilings: dict, dev: DeviceModel) -> list[str]:
    """The operand probes bench.ceilings measured (ceilings.json: wgmma_operand_tflops, smem_share) beside the model's
    readings of the same kernels: SS / RS at each N, and (copies and wgmmas together) / (wgmmas alone). Lines to print;
    none where the entry has neither."""
    lines = []
    rates = ceilings.get("wgmma_operand_tflops") or {}
    if rates:
        preds = {p.name: p.value for p in operand_rates(read(dev.arch), dev, probe_constants())}
        parts = []
        for n in OPERAND_NS:
            rs, ss = rates.get(f"RS N={n}"), rates.get(f"SS N={n}")
            if rs and ss is not None:
                model = preds[f"wgmma_operand_tflops[SS N={n}]"] / preds[f"wgmma_operand_tflops[RS N={n}]"]
                parts.append(f"N={n} {ss / rs:.2f} (model {model:.2f})")
        lines.append("wgmma operands, SS / RS measured (bench.model): " + ", ".join(parts))
    share = ceilings.get("smem_share") or {}
    if share:
        parts = []
        for key, v in share.items():
            form, n = key.split(" N=")
            frac = v["copy_bytes"] / v["operand_bytes"]
            parts.append(f"{key} {v['both_over_wgmma']:.2f} (model {share_ratio(int(n), form == 'SS', frac, dev):.2f})")
        lines.append("copies beside wgmma operands, both / wgmmas alone measured (bench.model): " + ", ".join(parts))
    return lines
