"""Whole-call prediction: waves x tiles per CTA x cycles per tile + prologue + combine + launch.

Cycles per tile (one CTA, with its co-resident CTAs progressing alongside) is the
largest of
  - the scheduler simulation of the tile loop (`sim.simulate`): latency, issue,
    tensor-pipe, MUFU and shared-memory limits of the warps sharing a scheduler;
  - the SM's share of DRAM bandwidth for the tile's compulsory bytes (KV rows read
    once per group of co-resident M tiles; more if they run in different waves and
    the KV does not fit in L2);
  - the SM's share of L2 bandwidth for every byte the tile's loads request;
  - Little's law: a tile's load latency over the cp.async prefetch distance (a coarse floor; the
    simulation itself now lands each tile's copies after their LSU time, stream and the loaded
    latency, and waits for them where the kernel's wait_group does).
The largest names the bound. The combine kernel is its split loop simulated with
L2-latency loads, times the split count, or its bytes over L2 bandwidth.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from bench.core import roofline as rl
from bench.core.inputs import make_trees
from verify_attn import device as vdevice
from verify_attn.config import heuristic_num_splits, tile_split_args
from verify_attn.shapes import HeadShape

from . import kernels as kernels_mod, sass, sim
from .analysis import classify, smem_bytes
from .devices import DeviceModel
from .kernels import KernelModel

# how close (fraction) the simulated cycles must come to a throughput bound to be named by it
_NAME_WITHIN = 0.90


@dataclass(frozen=True)
class Case:
    shape: HeadShape
    ctx: int                 # committed prefix tokens per request
    tree_nodes: int
    batch: int = 1
    layout: str = "page1"
    page_size: int = 1
    tree_shape: str = "ddtree"
    kv_dtype: str = "bf16"   # the cache's storage format (verify_attn.fp8): "bf16" | "fp16" | "fp8_e4m3"

    @property
    def kv_len(self) -> int:
        return self.ctx + self.tree_nodes


@dataclass
class TileCost:
    cycles: float
    bound: str
    terms: dict[str, float]          # cycles per tile of every limit
    sim: sim.SimResult


@dataclass
class Prediction:
    device: str
    kernel: str
    num_splits: int
    grid_ctas: int
    ctas_per_sm: int
    warps_per_scheduler: int
    waves: int
    tiles_per_cta: int
    tile: TileCost
    masked_tile_cycles: float
    main_us: float
    prologue_us: float
    combine_us: float
    launch_us: float
    total_us: float
    floor_us: float
    floor_bound: str
    frac_of_floor: float
    bound: str
    dram_bytes: float
    l2_bytes: float
    notes: list[str] = field(default_factory=list)
    # a tile of an iteration with a phantom tile (Hopper's v3: the pair's cycles / 2); None: no phantom path
    phantom_tile_cycles: Optional[float] = None

    def to_dict(self) -> dict:
        return {
            "device": self.device, "kernel": self.kernel, "num_splits": self.num_splits,
            "grid_ctas": self.grid_ctas, "ctas_per_sm": self.ctas_per_sm,
            "warps_per_scheduler": self.warps_per_scheduler, "waves": self.waves,
            "tiles_per_cta": self.tiles_per_cta, "cycles_per_tile": round(self.tile.cycles, 1),
            "masked_tile_cycles": round(self.masked_tile_cycles, 1),
            **({"phantom_tile_cycles": round(self.phantom_tile_cycles, 1)} if self.phantom_tile_cycles else {}),
            "tile_bound": self.tile.bound,
            "tile_terms": {k: round(v, 1) for k, v in self.tile.terms.items()},
            "tensor_util_in_tile": round(self.tile.sim.utilization("tensor"), 3),
            "main_us": round(self.main_us, 2), "prologue_us": round(self.prologue_us, 2),
            "combine_us": round(self.combine_us, 2), "launch_us": round(self.launch_us, 2),
            "predicted_us": round(self.total_us, 2), "floor_us": round(self.floor_us, 2),
            "floor_bound": self.floor_bound, "frac_of_floor": round(self.frac_of_floor, 3), "bound": self.bound,
            "dram_bytes": int(self.dram_bytes), "l2_bytes": int(self.l2_bytes), "notes": self.notes,
        }


def counts(case: Case, elem_bytes: int = 2) -> rl.Counts:
    trees = make_trees(case.tree_nodes, case.tree_shape, case.batch)
    fp8 = case.kv_dtype.startswith("fp8")
    return rl.count_shape(case.shape, [case.ctx] * case.batch, trees, elem_bytes=elem_bytes,
                          page_size=case.page_size, kv_dtype=case.kv_dtype if fp8 else None)


# wgmma .e4m3 (QGMMA) over the 16-bit wgmma rate: the H100 / H200 datasheets' dense fp8 1,979 over bf16 989 TFLOP/s
QGMMA_SPEEDUP = 2.0


def tensor_rate_tflops(dev: DeviceModel, *, wgmma: bool = False, qmma: bool = False, qgmma: bool = False) -> float:
    """The tensor rate a kernel's floor uses: the datasheet's for a wgmma tile (e4m3 wgmma, QGMMA: the datasheet's
    fp8 rate) and on sm_120 (where mma.sync is the native path; e4m3 MMAs at the device's fp8 rate), the device's
    mma.sync-class rate for mma.sync on sm_90 (the H200's is measured: bench.ceilings mma_peak)."""
    ds = dev.datasheet_tflops.value if dev.datasheet_tflops is not None else dev.mma_tflops
    if wgmma:
        return ds * (QGMMA_SPEEDUP if qgmma else 1.0)
    if dev.mma_flop_per_clk_sm.value >= dev.datasheet_mma_flop_per_clk_sm.value:  # mma.sync is the datasheet path
        return ds * (dev.qmma_speedup.value if qmma else 1.0)
    return dev.mma_tflops


def floor(c: rl.Counts, dev: DeviceModel, tensor_tflops: Optional[float] = None) -> rl.Floor:
    """The roofline floor the model's predictions are judged against: datasheet bandwidth and `tensor_tflops`
    (default: the device's mma.sync-class rate, `tensor_rate_tflops`)."""
    d = rl.Device(name=dev.name, sms=int(dev.sms.value), mem_bw_gbs=dev.dram_gbs.value,
                  mma_tflops=tensor_tflops or tensor_rate_tflops(dev), l2_mb=0.0, source="bench.model device model")
    return rl.floor(c, d)


def _props(dev: DeviceModel) -> vdevice.DeviceProps:
    return vdevice.spec(dev.arch)


def ctas_per_sm(km: KernelModel, dev: DeviceModel) -> int:
    return vdevice.ctas_per_sm(_props(dev), threads=km.threads, regs_per_thread=km.registers,
                               smem_bytes=km.smem_bytes)


def _cluster(km) -> int:
    """CTAs of a thread-block cluster sharing each block's gather (Hopper's v3 cluster tile: 2), else 1 (also for a
    tile that does not say: foreign kernels, test doubles)."""
    return getattr(km.tile, "cluster", 1)


def m_tiles(case: Case, km: KernelModel) -> int:
    """The grid's M tiles: CTAs along its y (a cluster tile's CTAs, whole clusters)."""
    return -(-(case.tree_nodes * case.shape.group) // km.tile.block_m) * _cluster(km)


def default_splits(case: Case, km: KernelModel, dev: DeviceModel) -> int:
    """The split count the backend's heuristic picks for this call on this device."""
    return heuristic_num_splits(batch=case.batch, num_kv_heads=case.shape.num_kv_heads, m_tiles=m_tiles(case, km),
                                avg_kv_len=case.kv_len, num_sms=int(dev.sms.value),
                                **tile_split_args(km.tile.block_n, km.tile.blocks_per_iter))


def _row_bytes(case: Case, elem: int = 2) -> int:
    s = case.shape
    if case.kv_dtype.startswith("fp8"):
        from verify_attn.fp8 import kv_row_bytes
        return kv_row_bytes(case.kv_dtype, s.head_dim_qk, s.head_dim_v, s.mla)
    return (s.head_dim_qk if s.mla else s.head_dim_qk + s.head_dim_v) * elem


def copy_share(km: KernelModel, instrs, case: Case) -> float:
    """The fraction of the SASS path's cp.async bytes a CTA really copies per tile: its KV rows and their indices
    (the tile geometry) over what every lane of every warp would copy if all ran the loader (the SASS path
    does not say which threads load; the 656-byte-row tile loads with one thread per row). With a bulk loader
    (UBLKCP) the rows are the bulk copies': the cp.asyncs move the indices only."""
    sass_bytes = km.tile.num_warps * sum(smem_bytes(i)[1] for i in instrs if i.op == "LDGSTS")
    bulk = any(i.op == "UBLKCP" for i in instrs)
    want = km.tile.block_n * (4 + (0 if bulk else _row_bytes(case)))
    return min(1.0, want / sass_bytes) if sass_bytes else 1.0


def bulk_loader_lanes(km: KernelModel) -> list[int]:
    """Lanes of each warp of the CTA that issue bulk copies: the v1 bulk loader spreads its BN rows over the
    warps, BN / W lanes each (csrc/tree_verify/traits.h kBulkLanes, Tile::LOADER 1)."""
    w = km.tile.num_warps
    return [-(-km.tile.block_n // w)] * w


def bulk_wait_distance(km: KernelModel) -> int:
    """Iterations between a tile's bulk copies and the try_wait for them: the v1 loop issues the rows of tile
    it + STAGES - 1 and waits at its top for the tile its S reads, it + 2 with one barrier per tile (it + 1 with
    two), so for the copies issued STAGES - 3 (STAGES - 2) iterations earlier."""
    t = km.tile
    return max(0, t.num_stages - (3 if getattr(t, "bars", 2) == 1 else 2))


def bulk_sizes(km: KernelModel, path, case: Case) -> tuple[dict, str]:
    """(UBLKCP address -> bytes, where they come from) for the bulk copies of `path`: the SASS's immediates
    (analysis.bulk_copy_size), else the caller's: the tile's KV row bytes (the kernel copies one row per thread),
    shared evenly by the copies whose size the SASS sets at run time."""
    sass_sizes = dict(getattr(path, "bulk_sizes", {}) or {})
    known = {a: b for a, b in sass_sizes.items() if b is not None}
    unknown = [a for a, b in sass_sizes.items() if b is None]
    out = dict(known)
    if unknown:
        each = max(16.0, (_row_bytes(case) - sum(known.values())) / len(unknown))
        out.update({a: each for a in unknown})
    src = ("sass" if not unknown else "caller: the tile's row bytes" if not known
           else "sass + caller (the row bytes less the SASS's sizes)")
    return out, src


def bulk_spec(km: KernelModel, path, case: Case, dev: DeviceModel, warps_per_sched: int, group: int):
    """The sim.Bulk of a tile path with bulk copies, else None: the sizes (bulk_sizes), the copying lanes of each
    simulated warp (the scheduler simulated holds CTA warps 0, 4, ...: warp 0, the loader), the wait distance
    (bulk_wait_distance) and the schedulers whose warps copy (they share the SM's TMA unit)."""
    instrs = path.instrs
    if not any(i.op == "UBLKCP" for i in instrs):
        return None
    sizes, _ = bulk_sizes(km, path, case)
    cta_lanes = bulk_loader_lanes(km)
    lanes = tuple(cta_lanes[(w % group) * dev.schedulers] if (w % group) * dev.schedulers < len(cta_lanes) else 0
                  for w in range(warps_per_sched))
    issuing = len({j % dev.schedulers for j, n in enumerate(cta_lanes) if n > 0}) or dev.schedulers
    return sim.Bulk(sizes=tuple(sorted(sizes.items())), lane_of=tuple(getattr(path, "bulk_lane", ()) or ()),
                    lanes=lanes, wait_distance=bulk_wait_distance(km), issuing_schedulers=issuing)


def prefetch_spec(km: KernelModel, instrs, case: Case, dev: DeviceModel, sm_dram: float, kv_tile: float):
    """The sim.Prefetch of a tile path with L2 prefetches (CCTL.E.PF2), else None. Kernel v2 prefetches, in the
    iteration that copies tile t, the rows of tile t + V2_PREFETCH (the row's lines over its loader threads) and
    the ring's indices V2_PREFETCH copies ahead (one request per token), so every cp.async of the loop reads
    lines prefetched V2_PREFETCH iterations before (the emulator test test_v2_prefetches_exactly_the_rows_it_copies_later
    checks it). The bytes: the tile's rows and indices, over the CTA's prefetch instructions; the lane share: the
    lines and tokens named over the SASS path's lanes."""
    from verify_attn import build as vb
    pf = [i for i in instrs if classify(i) == "l2_prefetch"]
    if not pf:
        return None
    row = _row_bytes(case)
    if km.tile.version == 3:
        # Hopper's v3: the producer warpgroup prefetches, in the iteration that copies pair i, every line of pair
        # i + 1's rows (a row a thread, its 128-byte lines: kernels.V3_SM90_PREFETCH_AHEAD); `instrs` is the roles body
        # (a cluster tile's CTA prefetches the rows it gathers: its share)
        per = kernels_mod.blocks_per_iter(km) / _cluster(km)
        warps = kernels_mod.producer_warps(km.tile)
        requests = per * km.tile.block_n * -(-row // 128)
        return sim.Prefetch(ahead=kernels_mod.V3_SM90_PREFETCH_AHEAD, share=min(1.0, requests / (warps * len(pf) * 32)),
                            bytes=per * kv_tile / (warps * len(pf)), dram_bytes_per_clk=sm_dram / dev.schedulers,
                            l2_latency=dev.l2_latency_cycles.value)
    if km.tile.version != 2:
        raise ValueError(f"{km.name}: L2 prefetches in a kernel whose prefetch distance the model does not know")
    lines = -(-row // 128) + 1          # traits.h kLineLanes: every line a row touches, at any alignment
    requests = km.tile.block_n * (lines + 1)   # + one per token for its index
    sass_lanes = km.tile.num_warps * len(pf) * 32
    return sim.Prefetch(ahead=vb.V2_PREFETCH, share=min(1.0, requests / sass_lanes),
                        bytes=kv_tile / (km.tile.num_warps * len(pf)), dram_bytes_per_clk=sm_dram / dev.schedulers,
                        l2_latency=dev.l2_latency_cycles.value)


# constants the scheduler simulation does not read (it reads the others through instr_timing / simulate; the
# DRAM latency in cycles, which the clock sets, goes into the key as a derived value)
_NOT_SIMULATED = {"sms", "clock_ghz", "dram_gbs", "dram_efficiency", "l2_gbs", "l2_latency_cycles", "launch_us",
                  "pdl_launch_us", "datasheet_tflops", "dram_latency_ns"}
_SIM_CACHE: dict = {}


def _simulate(instrs, dev: DeviceModel, **kw) -> sim.SimResult:
    """sim.simulate, memoized on what it reads (the bands re-predict a call once per constant end)."""
    bulk = any(i.op == "UBLKCP" for i in instrs)   # the bulk-copy constants matter to paths with bulk copies only
    consts = tuple((k, v.value) for k, v in sorted(dev.__dict__.items())
                   if k not in _NOT_SIMULATED and hasattr(v, "value") and (bulk or not k.startswith("bulk_")))
    key = (id(instrs), len(instrs), dev.key, consts, round(dev.dram_latency_cycles, 3), tuple(sorted(
        (k, frozenset(v.items()) if isinstance(v, dict) else v) for k, v in kw.items())))
    r = _SIM_CACHE.get(key)
    if r is None:
        if len(_SIM_CACHE) > 4096:
            _SIM_CACHE.clear()
        r = _SIM_CACHE[key] = sim.simulate(instrs, dev, **kw)
    return r


def simulated_warps(tile, schedulers: int) -> list[int]:
    """A v3 CTA's warps that scheduler 0 holds and the simulation runs: math warps 0, 4, 8, ... and the producer, the
    warp after the math warps (a producer warpgroup's other three warps sit on the other schedulers)."""
    return list(range(0, tile.warps_m * tile.warps_n + 1, schedulers))


def _role_of(tile, warp: int, roles: int) -> int:
    """A v3 warp's role in the body `kernels._with_producer` built: the math warps 0 (with math roles, Tile.loader 4:
    the S warps 0, the PV warps 1; Hopper's v3: consumer warpgroup 0, then 1), the producer warp (after the math
    warps) the last."""
    math = tile.warps_m * tile.warps_n
    if warp >= math:
        return roles - 1
    return 1 if roles == 3 and warp >= math // 2 else 0


def tile_cost(km: KernelModel, dev: DeviceModel, *, path: str, resident_ctas: int, active_sms: int,
              dram_sharers: float, case: Case) -> TileCost:
    """Cycles for one CTA to finish one KV tile, with `resident_ctas` CTAs on its SM."""
    if path not in ("hot", "cold", "phantom"):
        raise ValueError(f"tile_cost: path must be 'hot', 'cold' or 'phantom', got {path!r}")
    if path == "phantom" and getattr(km, "phantom", None) is None:
        path = "cold"  # (a kernel without a phantom path runs a phantom tile's iteration on its masked path)
    reading = getattr(km, f"{path}_reading")
    tp = getattr(km, path)
    instrs = tp.instrs
    warps = km.tile.num_warps
    per_sched = max(1, resident_ctas * warps // dev.schedulers)
    group = max(1, warps // dev.schedulers)
    # the bandwidth this scheduler's copies stream at: its quarter of the SM's share of DRAM (each KV row fetched
    # once for the `dram_sharers` CTAs that read it; the others hit L2) or of L2, whichever is smaller
    sm_dram = dev.dram_bytes_per_clk / active_sms * max(1.0, dram_sharers) / max(1, resident_ctas)
    sm_l2 = dev.l2_bytes_per_clk / active_sms / max(1, resident_ctas)
    kv_tile = km.tile.block_n * _row_bytes(case) + 4 * km.tile.block_n
    # with L2 prefetches the DRAM stream is the prefetches'; the copies then stream from L2
    roles = getattr(km, f"roles_{path}", None)
    pf = prefetch_spec(km, roles[0] if roles is not None else instrs, case, dev, sm_dram, kv_tile)
    per_iter = kernels_mod.blocks_per_iter(km)   # the simulated iteration's KV tiles (Hopper's v3: a pair)
    if roles is not None:   # warp roles (v3): scheduler 0 holds CTA warps 0, 4, 8, ..., each its role's loop
        body, spans, lanes, producer = roles
        # the producer is the warp after the math warps; a producer warpgroup's other three warps sit on the other
        # schedulers, each copying its quarter, so scheduler 0 simulates one (until 2026-12-05 the role of the last simulated warp was keyed to the block's last
        # warp, which a producer warpgroup's first warp is not: the 12-warp tile was read with warp 8 on the math loop)
        sim_warps = [w for _ in range(resident_ctas) for w in simulated_warps(km.tile, dev.schedulers)]
        per_sched = len(sim_warps)
        # (Hopper's v3 copies by cp.async: no bulk copies; its producer path covers the pair's two stages)
        sizes, _ = bulk_sizes(km, producer, case) if any(i.op == "UBLKCP" for i in body) else ({}, "")
        s = _simulate(body, dev, warps=per_sched, warps_per_barrier_group=per_sched,
                      cp_bytes_per_clk=(sm_l2 if pf else min(sm_dram, sm_l2)) / dev.schedulers,
                      bank_degree=getattr(km, "bank_degree", None) or None,
                      **({"prefetch": pf} if pf is not None else {}),
                      # (a producer warpgroup's four warps sit on the four schedulers, each copying a quarter; Hopper's
                      # v3 cluster: its bulk copies, the forward to the peer, are warp 8's alone, the simulated one)
                      bulk=sim.Bulk(sizes=tuple(sorted(sizes.items())), lane_of=lanes,
                                    issuing_schedulers=1 if _cluster(km) > 1 else kernels_mod.producer_warps(km.tile),
                                    latency=dev.dsmem_latency_cycles.value if _cluster(km) > 1 else None)
                      if sizes else None,
                      roles=sim.RoleSpec(spans, (False,) * (len(spans) - 1) + (True,),
                                         tuple(_role_of(km.tile, w, len(spans)) for w in sim_warps),
                                         named_credit=((kernels_mod.ROLES_P_EMPTY, kernels_mod.ROLES_P_BUFFERS),)
                                         if km.tile.loader == 4 else (),
                                         empty_distance=max(1, km.tile.num_stages // per_iter),
                                         arrive_ahead=getattr(km, "arrive_ahead", frozenset())))
    else:
        s = _simulate(instrs, dev, warps=per_sched, warps_per_barrier_group=group,
                      cp_bytes_per_clk=(sm_l2 if pf else min(sm_dram, sm_l2)) / dev.schedulers,
                      copy_share=copy_share(km, instrs, case), bank_degree=getattr(km, "bank_degree", None) or None,
                      **({"bulk": b} if (b := bulk_spec(km, tp, case, dev, per_sched, group)) is not None else {}),
                      **({"prefetch": pf} if pf is not None else {}))
    # throughput limits of the scheduler (for naming the bound the simulation hit)
    bulk = roles is not None or any(i.op == "UBLKCP" for i in instrs)   # a warp issues its own lanes' copies only
    terms = {k: v / per_iter for k, v in {
        "issue": per_sched * (s.issued_per_iter if bulk else reading.instructions),
        "tensor": s.pipe_busy.get("tensor", 0.0),
        "smem": s.pipe_busy.get("mio", 0.0) + s.pipe_busy.get("smem_async", 0.0),
        "mufu": s.pipe_busy.get("mufu", 0.0),
        "alu": s.pipe_busy.get("alu", 0.0),
    }.items()}
    sim_cycles = s.cycles_per_iter / per_iter
    # memory: the SM's share of DRAM / L2 bandwidth, for all its resident CTAs' tiles. A CTA reads
    # each KV row (and its index) of its tile once from L2; the SASS count (reading.global_bytes)
    # assumes every lane of every warp loads, which a kernel whose loader uses some threads
    # overstates, so the tile geometry gives the bytes.
    # (a cluster tile's CTA gathers its share of each row: the peer forwards the rest through DSMEM)
    l2_per_cta = kv_tile / _cluster(km)
    dram_per_cta = kv_tile / max(1.0, dram_sharers)
    dram = resident_ctas * dram_per_cta / (dev.dram_bytes_per_clk / active_sms)
    l2 = resident_ctas * l2_per_cta / (dev.l2_bytes_per_clk / active_sms)
    # (the tiles whose bytes are in flight: the stages' copies, and with L2 prefetches pf.ahead tiles more)
    little = dev.dram_latency_cycles / max(1, km.tile.num_stages - 1 + (pf.ahead if pf else 0))
    # every resource the tile uses bounds it: the simulation schedules the issue-time pipes, but the shared-memory
    # bytes that move off the issue path (cp.async landing, wgmma operands) are only counted, so their sum with
    # the issue-time shared-memory traffic is a bound of its own
    cyc = max(sim_cycles, terms["smem"], dram, l2, little)
    allterms = {"simulated": sim_cycles, **terms, "dram": dram, "l2": l2, "latency_littles_law": little}
    if cyc == sim_cycles:
        name, val = max(terms.items(), key=lambda kv: kv[1])
        bound = name if val >= _NAME_WITHIN * sim_cycles else "latency"
    else:
        bound = {dram: "dram", l2: "l2", little: "latency_littles_law", terms["smem"]: "smem"}[cyc]
    return TileCost(cyc, bound, allterms, s)


def bulk_note(km: KernelModel, case: Case) -> str:
    """How the bulk copies of the hot tile were read and simulated: counts, sizes and their source, the loader
    lanes, the try_wait rule."""
    sizes, src = bulk_sizes(km, km.hot, case)
    lanes = bulk_loader_lanes(km)
    loaders = [f"warp {j}: {n}" for j, n in enumerate(lanes) if n]
    d = bulk_wait_distance(km)
    return (f"bulk copies (cp.async.bulk, UBLKCP): {len(sizes)} per copying lane per tile, "
            f"{', '.join(f'0x{a:x} {int(b)} B' for a, b in sorted(sizes.items()))} (size from {src}); copying lanes "
            f"{'; '.join(loaders) or 'none'} (the BN first threads); each try_wait waits for the copies issued {d} "
            f"iterations earlier (STAGES {km.tile.num_stages} - {km.tile.num_stages - d})")


def combine_us(km: KernelModel, dev: DeviceModel, case: Case, splits: int) -> float:
    if splits <= 1 or km.combine is None:
        return 0.0
    pairs = case.tree_nodes * case.batch * case.shape.num_q_heads
    combine_warps_per_cta = 4
    # combine v1 gives each 128 columns of a row a CTA whose `combine_split_warps` warps share the row's splits
    # (tree_verify_combine.cuh; until 2026-12-06 a warp each, 4 to a CTA), v0 one warp a row
    sw = km.combine_split_warps
    warps = pairs * (case.shape.head_dim_v // 128 if km.tile.version >= 1 else 1) * sw
    ctas = -(-warps // combine_warps_per_cta)
    per_sm = -(-ctas // int(dev.sms.value))
    per_sched = max(1, per_sm * combine_warps_per_cta // dev.schedulers)
    s = sim.simulate(km.combine.instrs, dev, warps=per_sched, warps_per_barrier_group=1,
                     ldg_latency=dev.l2_latency_cycles.value)
    per_warp = -(-splits // sw)                                   # each warp's share of the splits
    iters = -(-per_warp // km.combine_splits_per_iter)             # ... in groups of the loop's splits
    # the warps' sums meet in shared memory: a CTA barrier and a store and load round trip
    meet = (dev.bar_latency.value + 2 * dev.smem_latency.value) if sw > 1 else 0.0
    chain = (iters * s.cycles_per_iter + 4 * dev.l2_latency_cycles.value + meet) / dev.clock_hz * 1e6
    partial_bytes = splits * pairs * (case.shape.head_dim_v + 1) * 4
    bw = partial_bytes / (dev.l2_gbs.value * 1e9) * 1e6
    return max(chain, bw)


def split_chunk(kv_len: int, num_splits: int, block_n: int) -> int:
    """Tokens a split owns: ceil(kv_len / num_splits) rounded up to block_n (csrc/host/split.h split_chunk)."""
    return -(-(-(-max(kv_len, 1) // num_splits)) // block_n) * block_n


def split_tiles(kv_len: int, prefix: int, num_splits: int, block_n: int, per_iter: int = 1,
                phantom: bool = False) -> list[tuple[int, int, int]]:
    """(hot, cold, phantom) KV tiles of each split of one request, as the kernels cut and mask them: split s owns
    [s x chunk, min((s + 1) x chunk, kv_len)) (csrc/host/split.h split_range); a tile runs cold when it reaches into
    the tree (past `prefix`) or past its range's end (csrc/host/mask.h tile_needs_mask). A split's tiles run in whole
    loop iterations of `per_iter` (Hopper's v3: pairs); an odd count's last iteration holds a phantom tile past the
    end: with `phantom` (a kernel with a phantom path, km.phantom) that iteration's tiles are the third count, else
    the phantom tile counts cold and the third count is 0. Empty splits: (0, 0, 0)."""
    chunk = split_chunk(kv_len, num_splits, block_n)
    out = []
    for s in range(num_splits):
        begin, end = min(s * chunk, kv_len), min((s + 1) * chunk, kv_len)
        real = -(-(end - begin) // block_n) if end > begin else 0
        n = -(-real // per_iter) * per_iter
        ph = per_iter if phantom and n > real else 0   # the last iteration's tiles, the phantom among them
        cold = sum(1 for t in range(n - ph) if begin + (t + 1) * block_n > min(prefix, end))
        out.append((n - ph - cold, cold, ph))
    return out


def predict(km: KernelModel, dev: DeviceModel, case: Case, num_splits: Optional[int] = None) -> Prediction:
    if km.arch != dev.arch:
        raise ValueError(f"kernel built for {km.arch}, device {dev.key} runs {dev.arch}")
    notes: list[str] = []
    S = num_splits or default_splits(case, km, dev)
    mt = m_tiles(case, km)
    ctas = S * mt * case.shape.num_kv_heads * case.batch
    occ = ctas_per_sm(km, dev)
    if occ < 1:
        raise ValueError(f"{km.name} cannot launch on {dev.name} (registers {km.registers}, smem {km.smem_bytes} B)")
    sms = int(dev.sms.value)
    slots = sms * occ
    waves = -(-ctas // slots)
    kv_len = case.kv_len
    tiles = -(-min(split_chunk(kv_len, S, km.tile.block_n), kv_len) // km.tile.block_n)
    # a loop iteration's tiles run whole (Hopper's v3: an odd block count runs a phantom block)
    per_iter = kernels_mod.blocks_per_iter(km)
    tiles = -(-tiles // per_iter) * per_iter
    # Warp-role kernels (v3): their producer issues every load, so the consumers' cold path is the hot one plus the
    # mask, and each split is charged its own (hot, cold) tiles: the tree's masked tiles sit in the split that holds
    # the tree (until 2026-12-06 every CTA was charged a full split's tiles with the tree's among them). The kernels
    # whose math warps load (v0-v2) leave the next tile's loads out of the cold path too, so it doubles as a split's
    # last tiles: every split is charged ceil(T / BN) + 1 cold tiles (an approximation both ways; NOTES.md,
    # "The model's slowest split")
    by_split = getattr(km, "roles_hot", None) is not None
    has_phantom = getattr(km, "phantom", None) is not None
    per_split = (split_tiles(kv_len, kv_len - case.tree_nodes, S, km.tile.block_n, per_iter, phantom=has_phantom)
                 if by_split else [])
    masked = min(tiles, -(-case.tree_nodes // km.tile.block_n) + 1)
    # The M tiles of one split are launched S CTAs apart (grid x = split, fastest): the ones in the same
    # wave share each KV tile through L2; a split whose M tiles span several waves re-reads its KV from
    # DRAM once per wave unless the whole KV fits in L2.
    kv_total = kv_len * _row_bytes(case) * case.shape.num_kv_heads * case.batch
    fits_l2 = kv_total <= 0.5 * vdevice.spec(dev.arch).l2_bytes
    reads = 1.0 if fits_l2 else sum(len({(s + k * S) // slots for k in range(mt)}) for s in range(S)) / S
    sharers = mt / reads
    if reads > 1:
        notes.append(f"the M tiles of a split span {reads:.2f} waves on average and the KV ({kv_total / 1e6:.0f} MB) "
                     "exceeds L2: each wave re-reads it from DRAM")
    main_cycles = 0.0
    first: Optional[TileCost] = None
    masked_cycles = 0.0
    phantom_cycles: Optional[float] = None
    left = ctas
    for w in range(waves):
        in_wave = min(left, slots)
        left -= in_wave
        active = min(sms, in_wave)
        resident = -(-in_wave // active)
        hot = tile_cost(km, dev, path="hot", resident_ctas=resident, active_sms=active, dram_sharers=sharers, case=case)
        cold = tile_cost(km, dev, path="cold", resident_ctas=resident, active_sms=active, dram_sharers=sharers,
                         case=case)
        # (a pair with a phantom block: Hopper's v3 runs no wgmma on it, NOTES.md "the phantom block skips its wgmmas")
        ph = (tile_cost(km, dev, path="phantom", resident_ctas=resident, active_sms=active, dram_sharers=sharers,
                        case=case) if has_phantom else cold)
        first = first or hot
        masked_cycles = masked_cycles or cold.cycles
        phantom_cycles = phantom_cycles or (ph.cycles if has_phantom else None)
        if by_split:  # the wave's slowest CTA: grid x is the split (fastest), so CTA c runs split c % S
            splits_here = range(S) if in_wave >= S else {c % S for c in range(w * slots, w * slots + in_wave)}
            main_cycles += max(per_split[sp][0] * hot.cycles + per_split[sp][1] * cold.cycles
                               + per_split[sp][2] * ph.cycles for sp in splits_here)
        else:
            main_cycles += (tiles - masked) * hot.cycles + masked * cold.cycles
    assert first is not None
    # prologue per wave: kv_indices -> KV rows (two dependent DRAM round trips) + the Q tile; epilogue:
    # the fp32 partial (or 16-bit output) rows of the CTA written once. Q (read by every split) and the
    # partials (read back by the combine) stay in L2 when they fit: they move at L2 bandwidth.
    q_bytes = (km.tile.block_m // _cluster(km)) * case.shape.head_dim_qk * 2
    out_bytes = (km.tile.block_m // _cluster(km)) * case.shape.head_dim_v * (4 if S > 1 else 2)
    partials = S * case.tree_nodes * case.batch * case.shape.num_q_heads * case.shape.head_dim_v * 4
    in_l2 = partials + q_bytes * mt <= 0.5 * vdevice.spec(dev.arch).l2_bytes
    per_sm_bw = (dev.l2_bytes_per_clk if in_l2 else dev.dram_bytes_per_clk) / sms
    pro_cycles = 2 * dev.dram_latency_cycles + (q_bytes + out_bytes) * occ / per_sm_bw
    prologue = waves * pro_cycles / dev.clock_hz * 1e6
    main = main_cycles / dev.clock_hz * 1e6
    comb = combine_us(km, dev, case, S)
    # the split kernel and the v1 combine are launched with programmatic dependent launch (launch_shape.cuh): each
    # boundary costs pdl_launch_us, a plain one launch_us
    launch = ((dev.pdl_launch_us.value if km.split_pdl else dev.launch_us.value)
              + ((dev.pdl_launch_us.value if km.combine_pdl else dev.launch_us.value) if S > 1 else 0.0))
    total = main + prologue + comb + launch
    c = counts(case)
    qmma = any(i.op == "QMMA" for i in km.hot.instrs)  # e4m3 MMAs at the device's fp8 rate
    wgmma = any(i.op in sass.GMMA_OPS for i in km.hot.instrs)  # sm_90a wgmma: judged at the datasheet (wgmma) rate
    if wgmma:
        notes.append("HGMMA (wgmma) tile: the floor uses the datasheet tensor rate, not the mma.sync-class one")
    if any(i.op == "UBLKCP" for i in km.hot.instrs):
        notes.append(bulk_note(km, case))
    qgmma = any(i.op == "QGMMA" for i in km.hot.instrs)
    fl = floor(c, dev, tensor_rate_tflops(dev, wgmma=wgmma, qmma=qmma, qgmma=qgmma))
    l2_bytes = ctas * tiles * (km.tile.block_n * _row_bytes(case) + 4 * km.tile.block_n)
    dram_bytes = kv_total * (mt / sharers)
    parts = {"main loop": main, "prologue": prologue, "combine": comb, "launch": launch}
    bound = first.bound if max(parts, key=parts.get) == "main loop" else max(parts, key=parts.get)
    return Prediction(dev.key, km.name, S, ctas, occ, max(1, min(occ, -(-ctas // sms)) * km.tile.num_warps //
                                                            dev.schedulers),
                      waves, tiles, first, masked_cycles, main, prologue, comb, launch, total, fl.us, fl.bound,
                      fl.us / total, bound, dram_bytes, l2_bytes, notes, phantom_cycles)
