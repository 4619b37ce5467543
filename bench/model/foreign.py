"""Reading a kernel this project did not write: no `// sass-model` markers, only its cubin.

`python -m bench.model --foreign CUBIN --function REGEX --threads N --grid N --trips N --smem BYTES` picks the
one function whose (mangled) name matches REGEX, finds its hot loop as the innermost loop with the most MMA
instructions (HMMA / HGMMA / QMMA; inner loops with constant trip counts expanded, as for our kernels), and
simulates one iteration with the warps the occupancy rules put on a scheduler (bench.model.sim: the same
scheduler model, constants and bank-conflict-free shared memory as ours; the loop's copies stream from L2).
The call is then waves x trips x cycles per iteration at the device's clock, where
waves = ceil(grid / (resident CTAs per SM x SMs)): the caller gives what the launch sets (threads, grid,
dynamic shared memory) and how many times a CTA runs the loop. Prologue and epilogue are left out (a few
iterations' worth for a long loop), so the reading is an iteration-bound estimate, with the band of the
device's ranged constants.

Validation (`--validate`, P-12): FlashAttention-2's forward kernel (hdim 128, bf16, kBlockM 128, kBlockN 64,
4 warps, non-causal, even M/N and K), compiled for sm_90a from its public source (`bash
bench/model/build_fa2.sh FA2_DIR CUTLASS_DIR`), at P-12's shape (b 2, h 16, s 8192): 2,048 CTAs, 128 KV tiles
each, 64 KB of dynamic shared memory. P-12 measured it on an H100 SXM5; the model reads it on `h100-sxm`,
the H200's model (the same GH100 die: 132 SMs, 50 MB L2, the same clocks) with the H100's 3.35 TB/s HBM3.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from . import analysis, sass, sim
from .devices import Const, DeviceModel, H200, get_device

MMA_OPS = ("HMMA", "QMMA") + sass.GMMA_OPS

H100_SXM = replace(
    H200, key="h100-sxm", name="H100 SXM5",
    dram_gbs=Const(3350, "published", "NVIDIA H100 SXM5 datasheet: 3.35 TB/s HBM3"),
    notes=("the H200's model (same GH100 die: 132 SMs, 50 MB L2, the same clocks and tensor rates; measured on "
           "this project's H200) with the H100 SXM5's DRAM bandwidth",),
)


def device(key: str) -> DeviceModel:
    return H100_SXM if key.strip().lower() in ("h100", "h100-sxm", "h100-sxm5") else get_device(key)


@dataclass
class Reading:
    name: str
    function: sass.Function
    loop: sass.Loop
    path: analysis.TilePath
    registers: int

    @property
    def mma_per_iter(self) -> int:
        return sum(i.op in MMA_OPS for i in self.path.instrs)


def hot_loop(f: sass.Function) -> Optional[sass.Loop]:
    """The loop with the most MMA instructions per iteration, its inner loops expanded by their trip counts;
    loops with an inner loop whose trip count is not a constant are not candidates (their per-iteration work
    is unknown: e.g. an outer loop around the tile loop). On a tie the innermost. None if no loop has an MMA.
    What finds the tile loop of a kernel nobody annotated (FA2's n_block loop; our v0's tile loop around its
    k loop)."""
    best = None
    for lp in f.loops():
        try:
            path = analysis.tile_path(f, lp, (), "")
        except LookupError:
            continue
        key = (sum(i.op in MMA_OPS for i in path.instrs), -(lp.end - lp.start))
        if key[0] and (best is None or key > best[0]):
            best = (key, lp)
    return None if best is None else best[1]


def read(cubin: str | os.PathLike, pattern: str) -> Reading:
    """The hot loop of the one function matching `pattern` (a regex on the mangled name)."""
    from .kernels import _resource_usage

    text = sass.disassemble(Path(cubin))
    funcs = sass.parse(text)
    hits = sorted(n for n in funcs if re.search(pattern, n))
    if not hits:
        raise LookupError(f"no function of {cubin} matches {pattern!r} ({len(funcs)} functions)")
    if len(hits) > 1:
        raise LookupError(f"{len(hits)} functions match {pattern!r}; narrow it (first two: {hits[0][:120]}..., "
                          f"{hits[1][:120]}...)")
    f = funcs[hits[0]]
    loop = hot_loop(f)
    if loop is None:
        raise LookupError(f"{hits[0][:120]}...: no loop with MMA instructions")
    path = analysis.tile_path(f, loop, (), "")
    regs = _resource_usage(Path(cubin)).get(hits[0], 0)
    return Reading(hits[0], f, loop, path, regs)


def predict(r: Reading, dev: DeviceModel, *, threads: int, grid: int, trips: int, smem: int,
            flops: Optional[float] = None, band: bool = True) -> dict:
    """The call's time (and TFLOP/s with `flops`) from one simulated iteration; with the constants' band."""
    from verify_attn import device as vdevice

    for name, v in (("threads", threads), ("grid", grid), ("trips", trips)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if threads % 32:
        raise ValueError(f"threads must be a multiple of 32, got {threads}")
    props = vdevice.spec(dev.arch)
    ctas = vdevice.ctas_per_sm(props, threads=threads, regs_per_thread=r.registers or 255, smem_bytes=smem)
    if ctas < 1:
        raise ValueError(f"{threads} threads x {r.registers} registers with {smem} B of shared memory do not fit an "
                         f"SM of {dev.name}")
    warps = threads // 32
    # bulk copies (UBLKCP): one elected lane per warp copies (tile_path's default), sizes off the SASS, every
    # try_wait waits for the previous iteration's copies (sim.Bulk's default); a size set at run time is refused
    bulk = {}
    if r.path.bulk_sizes:
        unknown = [a for a, b in r.path.bulk_sizes.items() if b is None]
        if unknown:
            raise ValueError(f"bulk copies at {', '.join(hex(a) for a in unknown)} take their size at run time: "
                             "a foreign kernel's bulk copies need sizes the SASS sets")
        bulk = {"bulk": sim.Bulk(sizes=tuple(sorted(r.path.bulk_sizes.items())),
                                 lane_of=tuple(r.path.bulk_lane))}

    def one(d: DeviceModel) -> tuple[float, sim.SimResult, int]:
        sms = int(d.sms.value)
        per_sched = max(1, ctas * warps // d.schedulers)
        s = sim.simulate(r.path.instrs, d, warps=per_sched, warps_per_barrier_group=max(1, warps // d.schedulers),
                         cp_bytes_per_clk=d.l2_bytes_per_clk / sms / ctas / d.schedulers, **bulk)
        waves = math.ceil(grid / (ctas * sms))
        return waves * trips * s.cycles_per_iter / d.clock_hz * 1e6 + d.launch_us.value, s, waves

    us, s, waves = one(dev)
    out = {"function": r.name, "device": dev.key, "registers": r.registers, "ctas_per_sm": ctas,
           "waves": waves, "loop": [hex(r.function.instrs[r.loop.start].addr), hex(r.function.instrs[r.loop.end].addr)],
           "instructions_per_iter": len(r.path.instrs), "mma_per_iter": r.mma_per_iter,
           "cycles_per_iter": s.cycles_per_iter, "pipe_busy": dict(s.pipe_busy), "us": us}
    if flops:
        out["tflops"] = flops / us / 1e6
    if band:
        from .bands import ranged_constants
        swings = {}
        for name, c in ranged_constants(dev).items():
            swings[name] = tuple(one(replace(dev, **{name: c.at(v)}))[0] for v in c.range)
        down = math.sqrt(sum(max(0.0, us - min(a, b)) ** 2 for a, b in swings.values()))
        up = math.sqrt(sum(max(0.0, max(a, b) - us) ** 2 for a, b in swings.values()))
        out.update(low_us=us - down, high_us=us + up,
                   sensitive=max(swings, key=lambda k: abs(swings[k][1] - swings[k][0])) if swings else "-")
        if flops:
            out.update(tflops_low=flops / out["high_us"] / 1e6, tflops_high=flops / out["low_us"] / 1e6)
    return out


# --- P-12: FlashAttention-2's forward kernel on an H100 --------------------------------------------------

FA2_PATTERN = (r"flash_fwd_kernelI23Flash_fwd_kernel_traitsILi128ELi128ELi64ELi4ELb0ELb0EN7cutlass10bfloat16_t"
               r".*EELb0ELb0ELb0ELb0ELb1ELb1ELb0ELb0EE")   # no dropout, non-causal, not local, no alibi, even MN + K
FA2_P12 = dict(threads=128, grid=2 * 16 * (8192 // 128), trips=8192 // 64, smem=(128 + 2 * 64) * 128 * 2,
               flops=4.0 * 2 * 16 * 8192 * 8192 * 128)


def fa2_cubin() -> Optional[Path]:
    """Where bench/model/build_fa2.sh puts FA2's cubin ($VA_FA2_CUBIN overrides); None if absent."""
    env = os.environ.get("VA_FA2_CUBIN")
    if env:
        return Path(env) if Path(env).is_file() else None
    from verify_attn.utils import cache_dir
    p = cache_dir() / "foreign" / "fa2_fwd_hdim128_bf16_sm90a.cubin"
    return p if p.is_file() else None
