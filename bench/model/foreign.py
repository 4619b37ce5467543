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
from .devices import H100, Const, DeviceModel, get_device

MMA_OPS = ("HMMA", "QMMA") + sass.GMMA_OPS

# P-12's part under the name its source gives (devices.H100: the H200's model with the H100 SXM5's HBM3)
H100_SXM = replace(H100, key="h100-sxm", name="H100 SXM5")


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


def _resident_ctas(r: Reading, dev: DeviceModel, *, threads: int, grid: int, trips: int, smem: int) -> int:
    """The launch's CTAs per SM (the occupancy rules), after checking what the caller gave."""
    from verify_attn import device as vdevice

    for name, v in (("threads", threads), ("grid", grid), ("trips", trips)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if threads % 32:
        raise ValueError(f"threads must be a multiple of 32, got {threads}")
    ctas = vdevice.ctas_per_sm(vdevice.spec(dev.arch), threads=threads, regs_per_thread=r.registers or 255,
                               smem_bytes=smem)
    if ctas < 1:
        raise ValueError(f"{threads} threads x {r.registers} registers with {smem} B of shared memory do not fit an "
                         f"SM of {dev.name}")
    return ctas


def predict(r: Reading, dev: DeviceModel, *, threads: int, grid: int, trips: int, smem: int,
            flops: Optional[float] = None, band: bool = True) -> dict:
    """The call's time (and TFLOP/s with `flops`) from one simulated iteration; with the constants' band."""
    ctas = _resident_ctas(r, dev, threads=threads, grid=grid, trips=trips, smem=smem)
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
    _add_band(out, dev, lambda d: one(d)[0], flops, band)
    return out


def _add_band(out: dict, dev: DeviceModel, us_on, flops: Optional[float], band: bool) -> None:
    """out["us"]'s TFLOP/s, and with `band` its band: `us_on(device)` at each end of every ranged constant,
    root-sum-square of the moves (bench/model/bands.py's rule), and the constant that moves it most."""
    us = out["us"]
    if flops:
        out["tflops"] = flops / us / 1e6
    if not band:
        return
    from .bands import ranged_constants
    swings = {name: tuple(us_on(replace(dev, **{name: c.at(v)})) for v in c.range)
              for name, c in ranged_constants(dev).items()}
    down = math.sqrt(sum(max(0.0, us - min(a, b)) ** 2 for a, b in swings.values()))
    up = math.sqrt(sum(max(0.0, max(a, b) - us) ** 2 for a, b in swings.values()))
    out.update(low_us=us - down, high_us=us + up,
               sensitive=max(swings, key=lambda k: abs(swings[k][1] - swings[k][0])) if swings else "-")
    if flops:
        out.update(tflops_low=flops / out["high_us"] / 1e6, tflops_high=flops / out["low_us"] / 1e6)


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


# --- warp-specialized kernels: each role's loop on its share of the schedulers ---------------------------------

H800_SXM = replace(
    H100_SXM, key="h800-sxm", name="H800 SXM5",
    clock_ghz=Const(1.6, "published", "FlashMLA docs/20250422-new-kernel-deep-dive.md line 13: the H800 SXM5 "
                    "'throttling (reducing to ~1600 MHz in our case)' under its MLA kernels (CALIBRATION P-05)",
                    1.5, 1.83, "'~1600 MHz' is approximate; 1.83 GHz the clock FA3's authors fixed on an H100"),
    notes=("the H100 SXM5's model (GH100, 3.35 TB/s) at the ~1.6 GHz FlashMLA's authors saw their H800 run at",),
)


def device_any(key: str) -> DeviceModel:
    return H800_SXM if key.strip().lower() in ("h800", "h800-sxm", "h800-sxm5") else device(key)


def read_roles(cubin: str | os.PathLike, pattern: str, threads: int, bulk_lanes: int = 1) -> tuple[Reading, list]:
    """The function matching `pattern` and its warp roles (bench.model.roles; [] when every warp runs one loop)."""
    from . import roles as roles_mod
    r = read(cubin, pattern)
    found = roles_mod.find_roles(r.function, threads, bulk_lanes)
    return r, (found if len(found) > 1 else [])


def predict_roles(r: Reading, found: list, dev: DeviceModel, *, threads: int, grid: int, trips: int, smem: int,
                  flops: Optional[float] = None, tma_bytes: Optional[int] = None, empty_distance: int = 1,
                  band: bool = True) -> dict:
    """A warp-specialized call: scheduler 0 holds CTA warps 0, 4, 8, ... of each resident CTA, each running its own
    role's loop (sim.RoleSpec); the call is waves x trips x the cycles per iteration of the slowest role. Tensor-map
    TMA boxes (UTMALDG: their size is in the tensor map, not the SASS) take `tma_bytes` each, and are taken as
    issued by one thread of the CTA (the copies stream at the SM's share)."""
    ctas = _resident_ctas(r, dev, threads=threads, grid=grid, trips=trips, smem=smem)
    body, spans, lane_of, sizes = [], [], [], {}
    for ro in found:
        lo = len(body)
        body += ro.path.instrs
        lane_of += ro.path.bulk_lane or [-1] * len(ro.path.instrs)
        spans.append((lo, len(body)))
        for a, b in ro.path.bulk_sizes.items():
            if b is None and tma_bytes is None:
                raise ValueError(f"the copy at {hex(a)} ({ro.name}) takes its size from a tensor map: give tma_bytes "
                                 "(--tma-box-bytes), the bytes of one box")
            sizes[a] = b if b is not None else tma_bytes
    role_of_warp = {w: k for k, ro in enumerate(found) for w in ro.warps}
    sim_warps = [(c, w) for c in range(ctas) for w in range(0, threads // 32, dev.schedulers) if w in role_of_warp]
    spec = sim.RoleSpec(tuple(spans), tuple(ro.kind == "producer" for ro in found),
                        tuple(role_of_warp[w] for _, w in sim_warps), empty_distance)
    tma = any(i.op == "UTMALDG" for i in body)
    bulk = (sim.Bulk(sizes=tuple(sorted(sizes.items())), lane_of=tuple(lane_of), wait_distance=1,
                     issuing_schedulers=1 if tma else None) if sizes else None)

    def one(d: DeviceModel) -> tuple[float, sim.SimResult]:
        sms = int(d.sms.value)
        s = sim.simulate(body, d, warps=len(sim_warps), warps_per_barrier_group=len(sim_warps),
                         cp_bytes_per_clk=d.l2_bytes_per_clk / sms / ctas / d.schedulers, bulk=bulk, roles=spec,
                         iters=8)
        waves = math.ceil(grid / (ctas * sms))
        return waves * trips * s.cycles_per_iter / d.clock_hz * 1e6 + d.launch_us.value, s

    us, s = one(dev)
    k0 = max(1, s.iters // 2)
    per_role = []
    for k, ro in enumerate(found):
        ws = [x for x, (_, w) in enumerate(sim_warps) if role_of_warp[w] == k]
        cyc = max((s.per_warp_finish[x][-1] - s.per_warp_finish[x][k0 - 1]) / (s.iters - k0) for x in ws)
        lo, hi = spans[k]
        demand: dict[str, float] = {}
        for i in body[lo:hi]:
            t = sim.instr_timing(i, dev, dev.dram_latency_cycles)
            if spec.producer[k]:
                t = sim.producer_timing(t, i)
            demand[t.pipe] = demand.get(t.pipe, 0.0) + t.interval * len(ws)
        stall = max(s.sync_stall[x] for x in ws)
        top = max((p for p in demand if p not in ("branch", "uniform")), key=lambda p: demand[p], default="-")
        if stall >= 0.3 * s.cycles_per_iter:
            bound = "waits on the other roles"
        elif top != "-" and demand[top] >= 0.6 * s.cycles_per_iter:
            bound = top
        else:
            bound = "latency"
        per_role.append({"role": ro.name, "kind": ro.kind, "warps": list(ro.warps), "maxnreg": ro.maxnreg,
                         "loop": [hex(r.function.instrs[ro.loop.start].addr), hex(r.function.instrs[ro.loop.end].addr)],
                         "instructions_per_iter": hi - lo, "mma_per_iter": ro.mma_per_iter,
                         "copies_per_iter": ro.copies_per_iter, "cycles_per_iter": cyc,
                         "stall_cycles_per_iter": stall, "bound": bound,
                         "pipe_demand": {p: round(v, 1) for p, v in sorted(demand.items())}})
    out = {"function": r.name, "device": dev.key, "registers": r.registers, "ctas_per_sm": ctas,
           "waves": math.ceil(grid / (ctas * int(dev.sms.value))), "roles": per_role,
           "simulated_warps": [w for _, w in sim_warps], "cycles_per_iter": s.cycles_per_iter,
           "pipe_busy": dict(s.pipe_busy), "us": us}
    _add_band(out, dev, lambda d: one(d)[0], flops, band)
    return out


# FlashMLA (deepseek-ai/FlashMLA @ 9241ae3), built for sm_90a by bench/model/build_flashmla.sh; the published figures
# are on an H800 SXM5 (FlashMLA's README; CALIBRATION.md P-15)
FLASHMLA_SPARSE_PATTERN = r"sparse_attn_fwd_kernel.*KernelTemplateILi576ELb0E"
# V3.2's prefill case of FlashMLA's tests/test_flash_mla_sparse_prefill.py (d_qk 576, h_q 128, topk 2048, s_q 4096):
# a CTA per 64 heads of a query token, 16 iterations of two 64-token blocks; 384 threads, one CTA an SM
FLASHMLA_SPARSE = dict(threads=384, grid=2 * 4096, trips=2048 // 128, smem=(64 * 576 + 2 * 64 * 576) * 2 + 1024,
                       flops=2.0 * 4096 * 2048 * 128 * (576 + 512))
FLASHMLA_DENSE_PATTERN = r"flash_fwd_splitkv_mla_kernel"
# a compute-bound decode (h_q x s_q = 128 rows, the deep dive's threshold): b 128, s_q 1, h_q 128, s_k 8192, page 64;
# 2 M blocks x 66 SM parts = 132 CTAs of 256 threads, each 16384 x 2 / 132 blocks of 64 tokens, two an iteration;
# each K block arrives as 9 tensor-map boxes of 64 x 64 bf16
FLASHMLA_DENSE = dict(threads=256, grid=132, trips=round(128 * (8192 // 64) * 2 / 132 / 2),
                      smem=(64 * 576 + 2 * 64 * 576) * 2 + 1024, flops=2.0 * 128 * 128 * 8192 * (576 + 512),
                      tma_bytes=64 * 64 * 2)


def flashmla_cubin(kind: str) -> Optional[Path]:
    """Where bench/model/build_flashmla.sh puts FlashMLA's `sparse` / `dense` cubin ($VA_FLASHMLA_DIR overrides the
    folder); None if absent."""
    from verify_attn.utils import cache_dir
    folder = Path(os.environ["VA_FLASHMLA_DIR"]) if os.environ.get("VA_FLASHMLA_DIR") else cache_dir() / "foreign"
    p = folder / {"sparse": "flashmla_sparse_prefill_k576_sm90a.cubin", "dense": "flashmla_dense_bf16_sm90a.cubin"}[kind]
    return p if p.is_file() else None
