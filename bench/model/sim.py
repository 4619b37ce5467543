"""One SM sub-partition (warp scheduler) issuing a loop body for its resident warps.

Each warp runs the same instruction sequence (one loop iteration, inner loops
expanded) several times; the scheduler issues at most one instruction per cycle,
in order per warp, greedy-then-oldest across warps. An instruction issues when
its source registers are ready (a scoreboard of producer latencies), its pipe is
free (pipe occupancy = cycles per warp instruction at the pipe's throughput), and
its warp is not held at a barrier. A CTA barrier releases the warps of one CTA
on this scheduler after the last of them arrives (warps of a CTA on the other
three schedulers run the same code at the same pace). Shared memory is one SM
resource; each scheduler gets a quarter of its bytes per clock.

Memory, as the H200 runs measured it (bench/results/h200*/): each 16-byte cp.async request
occupies the LSU (the "mio" queue it shares with LDS / LDSM) for a measured number of cycles and
its address registers cannot be rewritten until then; the copies stream at the scheduler's share
of DRAM (or L2) bandwidth and land the loaded DRAM latency later; `cp.async.wait_group` holds the
warp until its groups landed; an LDG queues behind the warp's copies and returns after them.
`predict` also bounds the tile by the DRAM / L2 bandwidth of all its bytes.

wgmma (sm_90a HGMMA) is asynchronous: its warp issues it and goes on. The HGMMA
queues on the scheduler's tensor pipe (FIFO, shared with HMMAs) for its pipe time
(`DeviceModel.hgmma_interval`) and streams its shared-memory operands through the
scheduler's share of shared-memory bandwidth meanwhile; it finishes when both are
done and completes `hgmma_latency` cycles later. Its accumulators are no scoreboard
dependency (the next HGMMA of a chain issues at once); an HGMMA carrying `gsb0`
closes the warp's open commit group, and `WARPGROUP.DEPBAR.LE gsb0, K` holds the warp
until all but its K most recent committed groups have completed.

Bulk copies (cp.async.bulk -> UBLKCP, `Bulk`) go through the SM's TMA unit, not the LSU: each takes the unit
`bulk_copy_cycles` and holds its warp `bulk_issue_cycles` (both measured on the H200), its bytes stream and land like
a cp.async's, and a warp runs only its own copying lanes' iterations of nvcc's per-lane waterfall loop. An mbarrier
try_wait (`SYNCS.PHASECHK...TRYWAIT`) in iteration j holds its warp until the bulk copies of iteration j - d of its
barrier group landed, d the kernel's pipeline distance (`Bulk.wait_distance`; bench/model/README.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from .analysis import classify, smem_bytes
from .devices import HMMA_FLOP, DeviceModel
from . import sass
from .sass import Instr, hgmma_shape


@dataclass(frozen=True)
class Timing:
    pipe: str
    interval: float   # cycles the pipe is busy
    latency: float    # cycles until the destination registers are readable
    async_smem: float = 0.0  # shared-memory cycles consumed later, off the issue path (cp.async landing)
    wgmma: bool = False      # HGMMA: queued on `pipe` without holding its warp; `latency` counts from its pipe end
    operand_smem: float = 0.0  # HGMMA: cycles its shared-memory operands take at the scheduler's smem share
    holds_sources: bool = False  # its source registers stay in use until its pipe time ends (cp.async's addresses)
    hold: float = 0.0        # cycles its warp issues nothing after it (a bulk copy's issue, devices.bulk_issue_cycles)


def instr_timing(ins: Instr, dev: DeviceModel, ldg_latency: float) -> Timing:
    c = classify(ins)
    op = ins.op
    if ins.pred == "@!PT":  # never executes (the compiler's scoreboard padding): an issue slot only
        return Timing("branch", 1.0, 0.0)
    if c == "hmma":
        shape = ins.mods[0] if ins.mods else "16816"
        flops = {"16816": HMMA_FLOP, "1688": HMMA_FLOP // 2, "16832": HMMA_FLOP * 2}.get(shape, HMMA_FLOP)
        if op == "QMMA":  # native e4m3 m16n8k32: the device's fp8 tensor rate (devices.qmma_speedup)
            flops /= dev.qmma_speedup.value
        return Timing("tensor", dev.hmma_interval * flops / HMMA_FLOP, dev.hmma_latency.value)
    if c == "hgmma":
        if dev.hgmma_latency is None:
            raise ValueError(f"HGMMA (wgmma) in a loop simulated on {dev.name} ({dev.arch}), which has no wgmma")
        rd, _ = smem_bytes(ins)  # the warp's quarter of the warpgroup's operand bytes
        return Timing("tensor", dev.hgmma_interval(hgmma_shape(ins.opcode)[1]), dev.hgmma_latency.value,
                      wgmma=True, operand_smem=rd / (dev.smem_bytes_per_clk_sm.value / dev.schedulers))
    if c in ("wg_arrive", "wg_depbar", "fence_async"):  # an issue slot; DEPBAR's wait is the simulator's
        return Timing("branch", 1.0, 0.0)
    if c == "bulk_copy":
        # cp.async.bulk: one request to the SM's TMA unit (devices.bulk_copy_cycles SM cycles; a quarter of the unit
        # per scheduler, as for the LSU: `simulate` rescales it to the schedulers that issue copies), its warp held
        # devices.bulk_issue_cycles; its bytes (Bulk.sizes) stream and land in `simulate`, off the LSU
        if dev.bulk_copy_cycles is None or dev.bulk_issue_cycles is None:
            raise ValueError(f"UBLKCP (cp.async.bulk) in a loop simulated on {dev.name} ({dev.arch}), whose model has "
                             "no bulk-copy constants")
        return Timing("tma", dev.bulk_copy_cycles.value * dev.schedulers, 0.0, hold=dev.bulk_issue_cycles.value)
    if c in ("mbar_wait", "mbar_arrive", "mbar"):  # an issue slot; a try_wait's wait is the simulator's (Bulk)
        return Timing("branch", 1.0, 0.0)
    if c == "tma_other":
        raise ValueError(f"{ins.opcode} at 0x{ins.addr:x}: tensor-map TMA and bulk stores / reductions / prefetches "
                         "are not modelled (only UBLKCP, the 1D bulk copy global -> shared)")
    if c == "ldgsts":
        # cp.async: the LSU takes each 16-byte request in turn (measured: devices.ldgsts_cycles_per_chunk SM cycles;
        # a quarter of the SM's LSU per scheduler), in the same queue as LDS / LDSM, and the warp cannot rewrite
        # its address registers before; its shared-memory write happens when the data arrives, long after issue,
        # so its bytes are charged to the smem bandwidth bound ("smem_async")
        rd, wr = smem_bytes(ins)
        async_smem = wr / (dev.smem_bytes_per_clk_sm.value / dev.schedulers)
        if dev.ldgsts_cycles_per_chunk is None:
            return Timing("lsu", 1.0, 0.0, async_smem=async_smem)
        chunks = max(1.0, wr / 16)
        return Timing("mio", max(1.0, chunks * dev.ldgsts_cycles_per_chunk.value * dev.schedulers), 0.0,
                      async_smem=async_smem, holds_sources=True)
    if c == "l2_prefetch":
        # prefetch.global.L2: one request per lane in the LSU queue the cp.asyncs use, each taken as one cp.async
        # request's measured time (assumed: a line request is a request), its address registers held until then;
        # no destination register, no completion (simulate streams its bytes with a Prefetch)
        if dev.ldgsts_cycles_per_chunk is None:
            return Timing("lsu", 1.0, 0.0)
        return Timing("mio", max(1.0, 32 * dev.ldgsts_cycles_per_chunk.value * dev.schedulers), 0.0,
                      holds_sources=True)
    if c in ("ldsm", "lds", "sts"):
        rd, wr = smem_bytes(ins)
        share = dev.smem_bytes_per_clk_sm.value / dev.schedulers
        return Timing("mio", max(1.0, (rd + wr) / share), dev.smem_latency.value)
    if c == "ldg":
        if dev.ldgsts_cycles_per_chunk is not None:  # queued in the LSU behind the SM's copies, then the round trip
            # a coalesced 32 x 4-byte load taken as two 16-byte requests' LSU time (an assumption: not probed)
            interval = max(1.0, 2.0 * dev.ldgsts_cycles_per_chunk.value * dev.schedulers)
            return Timing("mio", interval, interval + ldg_latency)
        return Timing("lsu", 1.0, ldg_latency)
    if c == "stg":
        return Timing("lsu", 1.0, 0.0)
    if c == "mufu":
        return Timing("mufu", dev.pipe_cycles(dev.mufu_per_clk_sm.value), dev.mufu_latency.value)
    if c == "shfl":
        return Timing("shfl", dev.pipe_cycles(dev.shfl_per_clk_sm.value), dev.shfl_latency.value)
    if c == "cvt":
        return Timing("cvt", dev.pipe_cycles(dev.cvt_per_clk_sm.value), dev.alu_latency.value + 2)
    if c == "fp32":
        if op in ("FADD", "FMUL", "FFMA", "FADD2", "FMUL2", "FFMA2", "HADD2", "HMUL2", "HFMA2"):
            return Timing("fma", dev.pipe_cycles(dev.fp32_per_clk_sm.value), dev.alu_latency.value)
        return Timing("alu", dev.pipe_cycles(dev.int_per_clk_sm.value), dev.alu_latency.value)
    if c == "int":
        if op.startswith("U"):  # uniform datapath: one per warp, its own pipe
            return Timing("uniform", 1.0, 2.0)
        return Timing("alu", dev.pipe_cycles(dev.int_per_clk_sm.value), dev.alu_latency.value)
    if c == "other":
        if op in ("S2R", "S2UR"):
            return Timing("alu", 1.0, 20.0)
        if op in ("LDC", "LDCU", "ULDC"):
            return Timing("lsu", 1.0, 12.0)
        return Timing("alu", dev.pipe_cycles(dev.int_per_clk_sm.value), dev.alu_latency.value)
    return Timing("branch", 1.0, 0.0)  # control, barriers (handled by the simulator)


def producer_timing(t: Timing, ins: Instr) -> Timing:
    """A producer role's instruction: its global requests (cp.async, L2 prefetches, loads) take the LSU (`lsu`), apart
    from the shared-memory pipe (`mio`) the math warps' LDS / LDSM use (RoleSpec). (Until 2026-12-06 only the
    cp.asyncs did: Hopper v3's prefetches and row-id loads, 453 cycles a pair, were counted as shared-memory time.)"""
    return replace(t, pipe="lsu") if ins.op == "LDGSTS" or classify(ins) in ("l2_prefetch", "ldg") else t


def cp_async_wait_depth(ins: Instr):
    """N of `DEPBAR.LE SB0, N` (cp.async.wait_group N), else None."""
    if ins.op != "DEPBAR" or not ins.operands or ins.operands[0].strip() != "SB0":
        return None
    return int(ins.operands[1], 0) if len(ins.operands) > 1 else 0


def wgmma_wait_depth(ins: Instr):
    """K of `WARPGROUP.DEPBAR.LE gsb0, K` (wgmma.wait_group K), else None."""
    if ins.op != "WARPGROUP" or "DEPBAR" not in ins.mods:
        return None
    if len(ins.operands) != 2 or ins.operands[0].strip() != "gsb0":
        raise ValueError(f"WARPGROUP.DEPBAR at 0x{ins.addr:x}: expected `gsb0, K`, got {ins.operands}")
    return int(ins.operands[1], 0)


@dataclass(frozen=True)
class Bulk:
    """What `simulate` needs to run a path's bulk copies (UBLKCP) and mbarrier waits (SYNCS.PHASECHK ... TRYWAIT).

    sizes:    (UBLKCP address, bytes per copy) for every UBLKCP of the body (read off the SASS, else the caller's);
    lane_of:  per body instruction, the copying lane whose waterfall iteration it belongs to, else -1
              (analysis.TilePath.bulk_lane); empty: every warp runs every iteration;
    lanes:    per simulated warp, how many lanes of it copy (its waterfall iterations k < lanes run, the others are
              skipped: nvcc's loop runs once per lane that copies); empty: all of the path's;
    wait_distance: a try_wait in iteration j waits for the bulk copies of iteration j - d (and earlier) of every warp
              of its barrier group, the copies of the tile the loop consumes (issued d iterations ahead); None: 0 when
              every UBLKCP of the body precedes its first wait, else 1 (the tightest pipeline);
    issuing_schedulers: the SM's schedulers whose warps issue copies: they share the TMA unit, the copies' stream
              (`cp_bytes_per_clk` is a scheduler's quarter of the SM's) and the shared-memory landing, each a quarter
              share becoming 1 / this; None: all of them;
    share:    scales every copy's bytes (the fraction of the path's copies' bytes a CTA really moves);
    latency:  cycles from a copy's bytes streaming to their landing; None: `cp_latency` (a copy from global memory).
              A copy between the CTAs of a cluster (Hopper v3's forward to its peer) lands the SM-to-SM latency later."""
    sizes: tuple[tuple[int, float], ...]
    lane_of: tuple[int, ...] = ()
    lanes: tuple[int, ...] = ()
    wait_distance: int | None = None
    issuing_schedulers: int | None = None
    share: float = 1.0
    latency: float | None = None


@dataclass(frozen=True)
class Prefetch:
    """What `simulate` needs to run a path's L2 prefetches (prefetch.global.L2 -> CCTL.E.PF2).

    ahead:     iterations between a warp's prefetch of rows and its cp.asyncs of the same rows: every LDGSTS of
               iteration j copies what the warp's prefetches of iteration j - ahead named (iterations j < ahead: the
               prologue's prefetches, issued at time 0);
    share:     the fraction of the path's prefetch lanes that really prefetch (scales each CCTL's LSU time);
    bytes:     DRAM bytes each prefetch instruction brings into L2 (the tile's bytes over the CTA's prefetches);
    dram_bytes_per_clk: the scheduler's share of the DRAM bandwidth the prefetches stream at (the copies then
               stream at `cp_bytes_per_clk`, the L2 share);
    l2_latency: cycles from a copy's request to its landing when its line is in L2.
    A prefetch's bytes land in L2 the loaded DRAM latency after they streamed; a copy of a prefetched line lands
    the L2 latency after its own bytes streamed, or when the prefetch lands if that is later."""
    ahead: int
    share: float
    bytes: float
    dram_bytes_per_clk: float
    l2_latency: float


@dataclass(frozen=True)
class RoleSpec:
    """Warp roles (bench.model.roles) for `simulate`: the body is the roles' loop bodies one after another.

    spans:     per role, [lo, hi) of the body: the loop iteration its warps run;
    producer:  per role, whether it only copies: its cp.async requests take the LSU apart from the shared-memory
               pipe the math warps' LDS / LDSM use (the two roles' units overlap; they still share the shared
               memory's bandwidth, by bytes, in the `smem` bound);
    warp_role: per simulated warp, its role;
    empty_distance: a producer's mbarrier wait of iteration j waits for the arrives (releases) on the same barrier of
               iteration j - empty_distance (the stages between a fill and the refill of the same buffer, counted in
               loop iterations; 1: each barrier's buffer filled once an iteration).
    An mbarrier wait names its barrier by the immediate offset of its address (`[URx+0x38588]`, roles.barrier_offset):
    - a wait on a barrier that warps of this scheduler arrive on (SYNCS.ARRIVE, ARRIVES.LDGSTSBAR) holds until each
      of them issued its arrives on it of iteration j (a math warp's wait, or a producer's on a barrier only
      producers arrive on: d = 0) or j - empty_distance (a producer's wait on the math warps' releases). A producer's arrive counts when its copies issued before it landed (noinc, complete_tx); a
      math warp's when it issues;
    - a wait on a barrier whose address is a register (a stage index) or that nobody here arrives on, in a kernel
      with a producer role: a math warp's holds until the producers issued the copies of its iteration and they
      landed; a producer's until every math warp issued its arrives of iteration j - empty_distance;
    - without a producer role (TMA issued by the math warps themselves, FlashMLA's dense decode): the bulk copies'
      rule (`Bulk.wait_distance`) over every warp of the scheduler.
    Named barriers (`BAR.SYNC id, n` / `BAR.ARV id, n`) join the warps whose body has the same id: the k-th arrival of
    each makes generation k; `BAR.SYNC` holds its warp until the generation is complete, `BAR.ARV` does not."""
    spans: tuple[tuple[int, int], ...]
    producer: tuple[bool, ...]
    warp_role: tuple[int, ...]
    empty_distance: int = 1
    # source lines of arrives that signal the next iteration's buffer (`sass-model: arrive-ahead`: Hopper's v3 on e4m3
    # caches copies pair i + 1 in iteration i). Their arrives of iteration j count for the waits of iteration j + 1,
    # every role's wait on such a barrier holds for the arrives of its own iteration (distance 0), and the waits of
    # iteration 0 pass (the prologue's copies, issued before the loop, taken as landed)
    arrive_ahead: frozenset = frozenset()
    # (named barrier id, d): the warps that wait on it (BAR.SYNC) pass their first d generations without the warps
    # that only arrive (BAR.ARV): the buffers a kernel fills before it first waits for one to be freed (v3 with math
    # roles: the S warps write P(0) and P(1) before they wait on P_EMPTY)
    named_credit: tuple[tuple[int, int], ...] = ()


@dataclass
class SimResult:
    cycles_per_iter: float          # steady-state cycles for every warp of the scheduler to finish one iteration
    issued_per_iter: float          # instructions per iteration per warp
    pipe_busy: dict[str, float]     # cycles per iteration each pipe is busy (all warps)
    warps: int
    iters: int
    trace_end: float = 0.0
    per_warp_finish: list[list[float]] = field(default_factory=list)
    # (issue cycle, stall before it, instruction index) of warp 0 in the window's last iteration (before the drain)
    trace: list[tuple[float, float, int]] = field(default_factory=list)
    # (issue cycle, warp, instruction index) of every warp in the window's last iteration
    full_trace: list[tuple[float, int, int]] = field(default_factory=list)
    # per warp, cycles per iteration it waited at mbarrier waits and named barriers (the steady state's window)
    sync_stall: list[float] = field(default_factory=list)
    # per warp, the shared-memory cycles per iteration its instructions took at the scheduler's share of the SM's
    # bandwidth: "issued" (LDS / STS / LDSM and a math warp's cp.async requests: the `mio` pipe), "copies" (cp.async
    # and bulk-copy bytes landing) and "operands" (wgmma operands). Summed over the warps: the `mio` and `smem_async`
    # of pipe_busy, which call.tile_cost's "smem" bound adds up.
    smem_by_warp: list[dict] = field(default_factory=list)

    def utilization(self, pipe: str) -> float:
        return self.pipe_busy.get(pipe, 0.0) / self.cycles_per_iter if self.cycles_per_iter else 0.0


def simulate(body: list[Instr], dev: DeviceModel, *, warps: int, warps_per_barrier_group: int,
             iters: int = 6, ldg_latency: float | None = None, cp_latency: float | None = None,
             cp_bytes_per_clk: float | None = None, copy_share: float = 1.0, bank_degree: dict | None = None,
             timing: Callable[[Instr, DeviceModel, float], Timing] = instr_timing, bulk: Bulk | None = None,
             prefetch: Prefetch | None = None, roles: RoleSpec | None = None) -> SimResult:
    """Cycles per loop iteration of `warps` warps sharing one scheduler (steady state).

    cp.async (LDGSTS) lands `cp_latency` cycles (default: the device's loaded DRAM latency) after the LSU took
    it; LDGDEPBAR commits the warp's copies since the last one as a group and `DEPBAR.LE SB0, N`
    (cp.async.wait_group N) holds the warp until all but its N most recent groups landed. Groups committed
    before the loop (the prologue's) are taken as landed. With `cp_bytes_per_clk` (this scheduler's share of the
    bandwidth its copies stream at: DRAM or L2) the copies' bytes also queue on that stream, so a tile's rows land
    one after the other. An LDG issued after a warp's copies returns no earlier than they land (a warp's
    global requests complete in order: the KV stream probe's kv_indices load costs as much loaded just before
    its copy as one tile ahead, bench/results/h200-run3/kv_stream.json). `copy_share` (<= 1) scales each
    LDGSTS's LSU time and bytes: the fraction of the warps' lanes that really copy where a loader uses some threads
    only (the SASS path is every warp's; the caller knows the tile's bytes). `bank_degree` ({instruction address:
    wavefronts / conflict-free wavefronts}, bench.model.banks) multiplies a conflicted LDS / STS / LDSM's time in
    the shared-memory pipe: wavefronts are charged, not instructions.

    Bulk copies (UBLKCP, `bulk`: sizes, copying lanes per warp, the wait distance): each takes the SM's TMA unit
    devices.bulk_copy_cycles (shared by the schedulers that issue copies) and holds its warp
    devices.bulk_issue_cycles; its bytes go through no LSU: they stream at `cp_bytes_per_clk` with the cp.asyncs and
    land `cp_latency` later, into shared memory ("smem_async"). A warp runs the waterfall iterations of its own
    copying lanes only (a non-loader warp none). `SYNCS.PHASECHK...TRYWAIT` (mbarrier.try_wait) in iteration j holds
    the warp until every warp of its barrier group has issued its copies of iteration j - wait_distance and they
    landed: the mbarrier completes when the tile's copies, all loader threads', are in. Copies issued before the
    loop (iteration < 0, the prologue's) are taken as landed. Not modelled: which mbarrier a wait names (every
    try_wait is read as the wait for the tile the loop consumes; a wait for consumers' arrivals, an "empty"
    barrier, is not distinguished), the TMA unit's limit on copies in flight, and LDG ordering behind bulk copies.

    L2 prefetches (CCTL.E.PF2, `prefetch`: sim.Prefetch): each takes the LSU like a cp.async request per lane, its
    bytes stream at the DRAM share and land in L2 the loaded DRAM latency later; a cp.async of iteration j then
    copies from L2 what the warp prefetched in iteration j - ahead (`cp_bytes_per_clk` is then the L2 share). A body
    with prefetches and no `prefetch` is refused: its copies' source would be guessed."""
    if warps < 1 or not body:
        raise ValueError("simulate: needs >= 1 warp and a non-empty loop body")
    ldg_lat = dev.dram_latency_cycles if ldg_latency is None else ldg_latency
    cp_lat = dev.dram_latency_cycles if cp_latency is None else cp_latency
    tim = [timing(i, dev, ldg_lat) for i in body]
    if bank_degree:
        tim = [replace(t, interval=t.interval * bank_degree[b.addr]) if b.addr in bank_degree and t.pipe == "mio"
               and b.op != "LDGSTS" else t for t, b in zip(tim, body)]
    if copy_share < 1.0:
        tim = [replace(t, interval=max(1.0, t.interval * copy_share), async_smem=t.async_smem * copy_share)
               if b.op == "LDGSTS" else t for t, b in zip(tim, body)]
    n = len(body)
    is_pf = [classify(i) == "l2_prefetch" for i in body]
    if any(is_pf) and prefetch is None:
        raise ValueError("simulate: the body has L2 prefetches (CCTL.E.PF2): pass sim.Prefetch (the distance to the "
                         "copies of the same rows, the bytes, the DRAM share)")
    if prefetch is not None:
        if prefetch.ahead < 1:
            raise ValueError(f"simulate: Prefetch.ahead must be >= 1, got {prefetch.ahead}")
        if prefetch.share < 1.0:
            tim = [replace(t, interval=max(1.0, t.interval * prefetch.share)) if p else t for t, p in zip(tim, is_pf)]
        iters = max(iters, 2 * prefetch.ahead + 4)   # the later half: copies of rows the loop itself prefetched
    is_bulk = [classify(i) == "bulk_copy" for i in body]
    bulk_wait = [classify(i) == "mbar_wait" for i in body]
    bulk_bytes = [0.0] * n
    seqs: list[list[int]] = []          # per warp, the body indices it runs (a warp skips other lanes' copies)
    d_wait = 0
    if any(is_bulk) or (bulk is not None and any(bulk_wait)):
        if bulk is None:
            raise ValueError("simulate: the body has bulk copies (UBLKCP): pass sim.Bulk (their sizes, the copying "
                             "lanes per warp, the wait distance)")
        sizes = dict(bulk.sizes)
        missing = sorted({b.addr for b, c in zip(body, is_bulk) if c and b.addr not in sizes})
        if missing:
            raise ValueError(f"simulate: no size for the bulk copies at {', '.join(f'0x{a:x}' for a in missing)}")
        if bulk.lane_of and len(bulk.lane_of) != n:
            raise ValueError("simulate: Bulk.lane_of must have one entry per body instruction")
        # the schedulers that issue copies have the SM's TMA unit, its copy stream and its shared-memory landing
        # to themselves: a scheduler's quarter shares become 1 / issuing_schedulers (a stream `scale` times faster)
        scale = max(1, bulk.issuing_schedulers or dev.schedulers) / dev.schedulers
        smem_share = dev.smem_bytes_per_clk_sm.value / dev.schedulers
        for k, b in enumerate(body):
            if is_bulk[k]:
                bulk_bytes[k] = bulk.share * sizes[b.addr] * scale   # in this scheduler's stream's bytes
                tim[k] = replace(tim[k], interval=tim[k].interval * scale, async_smem=bulk_bytes[k] / smem_share)
        lane_of = bulk.lane_of or (-1,) * n
        for w in range(warps):
            lanes = bulk.lanes[w % len(bulk.lanes)] if bulk.lanes else None
            seqs.append([k for k in range(n) if lanes is None or lane_of[k] < lanes])
        copies = [k for k in range(n) if is_bulk[k]]
        waits = [k for k in range(n) if bulk_wait[k]]
        if bulk.wait_distance is None:
            d_wait = 0 if copies and waits and max(copies) < min(waits) else 1
        else:
            d_wait = bulk.wait_distance
        if d_wait < 0:
            raise ValueError(f"simulate: Bulk.wait_distance must be >= 0, got {d_wait}")
        if d_wait == 0 and copies and waits and min(waits) < max(copies):
            raise ValueError("simulate: a try_wait before the iteration's last bulk copy cannot wait for that "
                             "iteration's copies (wait_distance 0): give the pipeline's distance")
        if d_wait >= 2 and waits:   # enough iterations to reach the pipeline's steady state, and one full period
            iters = max(iters, 2 * d_wait + 2)
    else:
        seqs = [list(range(n))] * warps
    if roles is not None:
        if len(roles.warp_role) != warps or len(roles.producer) != len(roles.spans):
            raise ValueError("simulate: RoleSpec needs one role per simulated warp and one kind per span")
        iters = max(iters, 2 * roles.empty_distance + 4)   # past the producer's free first stages: a steady state
        seqs = [[k for k in seqs[w] if roles.spans[roles.warp_role[w]][0] <= k < roles.spans[roles.warp_role[w]][1]]
                for w in range(warps)]
        for r, (lo, hi) in enumerate(roles.spans):
            if roles.producer[r]:
                tim[lo:hi] = [producer_timing(t, b) for t, b in zip(tim[lo:hi], body[lo:hi])]
    # The loop's last iterations drain: nothing follows them (no next tile's copies or prefetches to issue, a producer
    # `empty_distance` ahead already done), so they run faster than a tile in the middle of a CTA's 100+ does (the
    # H200 proxy's last iteration 487 cycles against 935-950). They are simulated, after the window the steady state
    # is read over, and not counted in it (until 2026-12-07 the window ended at the last iteration).
    drain = max(1, roles.empty_distance if roles is not None else 0, prefetch.ahead if prefetch is not None else 0,
                d_wait)
    iters += drain
    shown = iters - 1 - drain                 # the window's last iteration: the one the traces show
    window_lo = max(1, (shown + 1) // 2)      # the window: the later half of the iterations before the drain
    seq_len = [len(q) for q in seqs]
    if not all(seq_len):
        raise ValueError("simulate: a warp would run no instruction of the body (every one a skipped lane's)")
    bulk_last = [max((p for p, k in enumerate(q) if is_bulk[k]), default=-1) for q in seqs]
    reads = [i.regs_read() for i in body]
    writes = [i.regs_written() for i in body]
    is_bar = [i.op == "BAR" for i in body]
    closes = [i.op in sass.GMMA_OPS and "gsb0" in i.operands for i in body]   # ends the warp's open commit group
    depbar = [wgmma_wait_depth(i) for i in body]                          # K of WARPGROUP.DEPBAR.LE gsb0, K
    cp_wait = [cp_async_wait_depth(i) for i in body]                      # N of DEPBAR.LE SB0, N
    cp_commit = [i.op == "LDGDEPBAR" for i in body]
    is_copy = [i.op == "LDGSTS" for i in body]
    group_of = [w // max(1, warps_per_barrier_group) for w in range(warps)]
    if roles is not None:   # the bulk copies' rule spans the scheduler's warps, whatever their role
        group_of = [0] * warps
    members_of = {g: [x for x in range(warps) if group_of[x] == g] for g in set(group_of)}
    # roles: which barrier each mbarrier wait / arrive names, who arrives on it, named barriers' participants
    from .roles import barrier_offset, named_barrier
    is_arrive = [classify(i) == "mbar_arrive" for i in body]
    bar_off = [barrier_offset(i) if (bulk_wait[k] or is_arrive[k]) else None for k, i in enumerate(body)]
    arrivers: dict[int, list[int]] = {}
    arrives_per_iter: dict[tuple[int, int], int] = {}
    named = [named_barrier(i) if roles is not None else None for i in body]
    named_members: dict[int, list[int]] = {}
    if roles is not None:
        for w in range(warps):
            for k in seqs[w]:
                if is_arrive[k] and bar_off[k] is not None:
                    arrives_per_iter[(w, bar_off[k])] = arrives_per_iter.get((w, bar_off[k]), 0) + 1
                if named[k] is not None and w not in named_members.setdefault(named[k][0], []):
                    named_members[named[k][0]].append(w)
        for (w, off) in arrives_per_iter:
            arrivers.setdefault(off, []).append(w)
    ahead = [roles is not None and is_arrive[k] and body[k].line in roles.arrive_ahead for k in range(len(body))]
    ahead_bars = {bar_off[k] for k in range(len(body)) if ahead[k] and bar_off[k] is not None}
    arrive_t: dict[tuple[int, int, int], list[float]] = {}   # (warp, iteration, barrier) -> its arrives' times
    arrive_any: dict[tuple[int, int], list[float]] = {}      # (warp, iteration) -> all its arrives' times
    producers = [w for w in range(warps) if roles is not None and roles.producer[roles.warp_role[w]]]
    math_warps = [w for w in range(warps) if roles is not None and w not in producers]
    arrives_total = [sum(1 for k in seqs[w] if is_arrive[k]) for w in range(warps)]
    copy_last = [max((p for p, k in enumerate(q) if is_bulk[k] or is_copy[k]), default=-1) for q in seqs]
    copy_issued = [-1 if copy_last[w] >= 0 else iters for w in range(warps)]   # last iteration whose copies issued
    copy_land = [[0.0] * iters for _ in range(warps)]                          # their latest landing per iteration
    named_gen: dict[tuple[int, int], int] = {}                # (warp, barrier id) -> arrivals so far
    for bid, d in (roles.named_credit if roles is not None else ()):
        for w in range(warps):
            if any(named[k] is not None and named[k][0] == bid and named[k][2] for k in seqs[w]):
                named_gen[(w, bid)] = -d   # its first d waits pass (generation < 0)
    named_arr: dict[tuple[int, int], list[tuple[int, float, bool]]] = {}   # (id, generation) -> (warp, t, waits)
    sync_stall = [0.0] * warps
    last_issue = [0.0] * warps
    after_hold = [False] * warps           # the warp's last instruction was a barrier that holds it

    pc = [0] * warps                       # index into the unrolled stream (iteration * n + i)
    ready: list[dict[str, float]] = [dict() for _ in range(warps)]
    held: list[dict[str, float]] = [dict() for _ in range(warps)]   # source registers of queued cp.asyncs
    held_until = [0.0] * warps             # barrier release
    waiting_bar = [False] * warps
    bar_arrivals: dict[tuple[int, int], list[float]] = {}
    pipe_free: dict[str, float] = {}
    pipe_busy: dict[str, float] = {}
    smem_warp = [{"issued": 0.0, "copies": 0.0, "operands": 0.0} for _ in range(warps)]
    finish = [[0.0] * iters for _ in range(warps)]
    totals = [q * iters for q in seq_len]
    t = 0.0
    last = 0
    trace: list[tuple[float, float, int]] = []
    full_trace: list[tuple[float, int, int]] = []
    prev_issue = 0.0
    groups: list[list[float]] = [[] for _ in range(warps)]  # completion of each committed wgmma group, oldest first
    open_done = [0.0] * warps       # latest completion among the HGMMAs of the warp's open (uncommitted) group
    wgmma_done = [0.0] * warps      # latest completion of any HGMMA of the warp
    smem_stream_free = 0.0          # the scheduler's share of shared memory, as HGMMA operands stream through it
    cp_groups: list[list[float]] = [[] for _ in range(warps)]  # landing of each committed cp.async group
    cp_open = [0.0] * warps         # latest landing among the warp's copies since its last LDGDEPBAR
    cp_last = [0.0] * warps         # latest landing of any of the warp's copies
    stream_free = 0.0               # the scheduler's share of the copies' bandwidth
    is_ldg = [classify(i) == "ldg" for i in body]
    bulk_land = [[0.0] * iters for _ in range(warps)]   # latest landing of each warp's bulk copies per iteration
    bulk_issued = [-1 if bulk_last[w] >= 0 else iters for w in range(warps)]  # last iteration whose copies issued
    pf_land = [[0.0] * iters for _ in range(warps)]     # latest landing in L2 of each warp's prefetches per iteration
    pf_free = 0.0                                       # the scheduler's share of DRAM, as the prefetches stream

    def earliest(w: int) -> float:
        if pc[w] >= totals[w] or waiting_bar[w]:
            return float("inf")
        i = seqs[w][pc[w] % seq_len[w]]
        e = max(t, held_until[w], 0.0 if tim[i].wgmma else pipe_free.get(tim[i].pipe, 0.0))
        if bulk_wait[i] and roles is not None and bar_off[i] in arrivers:
            # a barrier warps here arrive on: their arrives of iteration j (full) or j - empty_distance (empty); a
            # producer's wait on its own role's arrivals (Hopper v3's cluster forwarder waiting for its rows to land,
            # on FULL) is a wait of iteration j too
            own = all(roles.producer[roles.warp_role[x]] for x in arrivers[bar_off[i]])
            k = pc[w] // seq_len[w] - (roles.empty_distance if roles.producer[roles.warp_role[w]] and not own else 0)
            if bar_off[i] in ahead_bars:
                k = pc[w] // seq_len[w] if pc[w] // seq_len[w] >= 1 else -1
            if k >= 0:
                for x in arrivers[bar_off[i]]:
                    got = arrive_t.get((x, k, bar_off[i]), [])
                    if len(got) < arrives_per_iter[(x, bar_off[i])]:
                        return float("inf")   # not arrived yet: the warp waits for the other role
                    e = max(e, max(got))
        elif bulk_wait[i] and producers:
            # a barrier whose address is a register (a stage index): read by role. A math warp waits for the
            # producers' copies of its iteration; a producer for every math warp's arrives of iteration
            # j - empty_distance (the stage it refills)
            j = pc[w] // seq_len[w]
            if w in producers:
                k = j - roles.empty_distance
                if k >= 0:
                    for x in math_warps:
                        got = arrive_any.get((x, k), [])
                        if len(got) < arrives_total[x]:
                            return float("inf")
                        if got:
                            e = max(e, max(got))
            else:
                for x in producers:
                    if copy_issued[x] < j:
                        return float("inf")   # the producer has not issued this tile's copies yet
                    e = max(e, copy_land[x][j] if j < iters else 0.0)
        elif bulk_wait[i]:   # mbarrier try_wait: the copies of iteration j - d, every loader of the group's
            k = pc[w] // seq_len[w] - d_wait
            if k >= 0:
                for x in members_of[group_of[w]]:
                    if bulk_issued[x] < k:
                        return float("inf")   # not issued yet: the warp waits for the loader
                    e = max(e, max(bulk_land[x][:k + 1]))
        k = depbar[i]
        if k is not None and len(groups[w]) > k:
            e = max(e, groups[w][-k - 1])
        k = cp_wait[i]
        if k is not None and len(cp_groups[w]) > k:
            e = max(e, cp_groups[w][-k - 1])
        rw = ready[w]
        for r in reads[i]:
            v = rw.get(r)
            if v is not None and v > e:
                e = v
        hw = held[w]
        if hw:
            for r in writes[i]:   # a register a queued cp.async still reads cannot be rewritten yet
                v = hw.get(r)
                if v is not None and v > e:
                    e = v
        return e

    while any(pc[w] < totals[w] for w in range(warps)):
        # greedy: keep issuing the last warp while it can; else the oldest ready warp
        order = [last] + [w for w in range(warps) if w != last]
        best_w, best_t = -1, float("inf")
        for w in order:
            e = earliest(w)
            if e <= t:
                best_w, best_t = w, t
                break
            if e < best_t:
                best_w, best_t = w, e
        if best_w < 0:
            raise RuntimeError("simulate: every warp is blocked (barrier deadlock in the loop body?)")
        t = max(t, best_t)
        w = best_w
        i = seqs[w][pc[w] % seq_len[w]]
        it = pc[w] // seq_len[w]
        tm = tim[i]
        pipe_busy[tm.pipe] = pipe_busy.get(tm.pipe, 0.0) + tm.interval
        if tm.pipe == "mio":
            smem_warp[w]["issued"] += tm.interval
        if tm.async_smem:
            pipe_busy["smem_async"] = pipe_busy.get("smem_async", 0.0) + tm.async_smem
            smem_warp[w]["copies"] += tm.async_smem
        if tm.wgmma:
            # queued: operands stream through shared memory while the pipe computes; done when both are
            s0 = max(t, smem_stream_free)
            smem_stream_free = s0 + tm.operand_smem
            pipe_busy["smem_async"] = pipe_busy.get("smem_async", 0.0) + tm.operand_smem
            smem_warp[w]["operands"] += tm.operand_smem
            end = max(max(t, pipe_free.get(tm.pipe, 0.0)) + tm.interval, smem_stream_free)
            pipe_free[tm.pipe] = end
            open_done[w] = max(open_done[w], end + tm.latency)
            wgmma_done[w] = max(wgmma_done[w], end + tm.latency)
            if closes[i]:
                groups[w].append(open_done[w])
                open_done[w] = 0.0
        else:
            pipe_free[tm.pipe] = t + tm.interval
            for r in writes[i]:
                ready[w][r] = max(t + tm.latency, cp_last[w]) if is_ldg[i] else t + tm.latency
            if tm.holds_sources:
                for r in reads[i]:
                    held[w][r] = t + tm.interval
        if depbar[i] is not None:  # issued: every group older than the K most recent has completed
            groups[w] = groups[w][-depbar[i]:] if depbar[i] else []
        if tm.hold:
            held_until[w] = max(held_until[w], t + tm.hold)
        if is_bulk[i]:  # off the LSU: the TMA unit's time, then the bytes stream and land
            start = t + tm.interval
            if cp_bytes_per_clk:
                stream_free = max(stream_free, start) + bulk_bytes[i] / cp_bytes_per_clk
                start = stream_free
            bulk_land[w][it] = max(bulk_land[w][it], start + (bulk.latency if bulk.latency is not None else cp_lat))
            if pc[w] % seq_len[w] == bulk_last[w]:
                bulk_issued[w] = it
        elif is_pf[i]:
            start = max(pf_free, t + tm.interval)
            pf_free = start + prefetch.bytes / prefetch.dram_bytes_per_clk
            pf_land[w][it] = max(pf_land[w][it], pf_free + cp_lat)
        elif is_copy[i]:
            start = t + tm.interval
            if cp_bytes_per_clk:
                stream_free = max(stream_free, start) + copy_share * smem_bytes(body[i])[1] / cp_bytes_per_clk
                start = stream_free
            if prefetch is not None:   # from L2, once the prefetch of the same rows landed there
                src = it - prefetch.ahead
                land = max(start + prefetch.l2_latency, pf_land[w][src] if src >= 0 else cp_lat)
            else:
                land = start + cp_lat
            cp_open[w] = max(cp_open[w], land)
            cp_last[w] = max(cp_last[w], land)
        elif cp_commit[i]:
            cp_groups[w].append(cp_open[w])
            cp_open[w] = 0.0
        elif cp_wait[i] is not None:
            cp_groups[w] = cp_groups[w][-cp_wait[i]:] if cp_wait[i] else []
        if roles is not None and (is_bulk[i] or is_copy[i]):
            copy_land[w][it] = max(copy_land[w][it], bulk_land[w][it], cp_last[w])
            if pc[w] % seq_len[w] == copy_last[w]:
                copy_issued[w] = it
        if roles is not None and is_arrive[i]:
            # a producer's arrive signals its copies (noinc / complete_tx): it counts once they landed
            done = max(t, cp_last[w], bulk_land[w][it]) if roles.producer[roles.warp_role[w]] else t
            arrive_any.setdefault((w, it), []).append(done)
            if bar_off[i] is not None:
                arrive_t.setdefault((w, it + 1 if ahead[i] else it, bar_off[i]), []).append(done)
        # a warp's waits at barriers: an mbarrier try-wait issues once its phase completed (the gap before it); a
        # named or CTA barrier that waits issues at once and holds the warp (the gap before its next instruction)
        if (bulk_wait[i] or after_hold[w]) and window_lo <= it <= shown:
            sync_stall[w] += t - last_issue[w] - 1
        after_hold[w] = named[i][2] if named[i] is not None else is_bar[i]
        last_issue[w] = t
        if w == 0 and it == shown:
            trace.append((t, t - prev_issue, i))
        if it == shown:
            full_trace.append((t, w, i))
        if w == 0:
            prev_issue = t
        pc[w] += 1
        last = w
        if named[i] is not None:   # a named barrier: generation by generation among the warps that use its id
            bid, _, waits = named[i]
            g = named_gen.get((w, bid), 0)
            named_gen[(w, bid)] = g + 1
            if g >= 0:   # (g < 0: a credited generation, RoleSpec.named_credit: nothing to wait for)
                arr2 = named_arr.setdefault((bid, g), [])
                arr2.append((w, t, waits))
                if len(arr2) == len(named_members[bid]):
                    rel = max(a[1] for a in arr2) + dev.bar_latency.value
                    for x, _, wt in arr2:
                        if wt:
                            held_until[x] = max(held_until[x], rel)
                            waiting_bar[x] = False
                    del named_arr[(bid, g)]
                elif waits:
                    waiting_bar[w] = True
        elif is_bar[i]:
            key = (group_of[w], it, i)
            arr = bar_arrivals.setdefault(key, [])
            arr.append(t)
            members = members_of[group_of[w]]
            if len(arr) == len(members):
                rel = max(arr) + dev.bar_latency.value
                for x in members:
                    held_until[x] = rel
                    waiting_bar[x] = False
                del bar_arrivals[key]
            else:
                waiting_bar[w] = True
        if pc[w] % seq_len[w] == 0:  # an iteration ends when its last instruction issued and its wgmmas are done
            finish[w][it] = max(t + 1, wgmma_done[w])
        t += 1  # one issue per cycle per scheduler

    ends = [max(finish[w][k] for w in range(warps)) for k in range(iters)]
    if d_wait >= 2 and any(bulk_wait):
        # a try_wait d iterations behind its copies: one full period of d iterations, after the first d
        per_iter = (ends[shown] - ends[shown - d_wait]) / d_wait
    else:
        per_iter = (ends[shown] - ends[window_lo - 1]) / (shown - window_lo + 1)
    busy = {p: v / iters for p, v in pipe_busy.items()}
    half = shown - window_lo + 1
    return SimResult(per_iter, sum(seq_len) / warps, busy, warps, iters, ends[-1], finish, trace, full_trace,
                     [x / half for x in sync_stall], [{k: v / iters for k, v in d.items()} for d in smem_warp])


def pipe_gaps(body: list[Instr], res: SimResult, pipe: str, dev: DeviceModel, min_gap: float = 40.0) -> list[str]:
    """Stretches of the traced iteration (the window's last) in which `pipe` sat idle, with the instructions issued
    meanwhile."""
    busy_until = None
    out = []
    issued_between: list[str] = []
    for t, w, i in res.full_trace:
        tm = instr_timing(body[i], dev, dev.dram_latency_cycles)
        if tm.pipe == pipe:
            if busy_until is not None and t - busy_until >= min_gap:
                out.append(f"  {pipe} idle {t - busy_until:5.0f} cyc before {t:8.0f}: " + "; ".join(issued_between[-6:]))
            busy_until = t + tm.interval if busy_until is None else max(busy_until, t) + tm.interval
            issued_between = []
        else:
            issued_between.append(f"w{w} L{body[i].line} {body[i].opcode}")
    return out


def holds(ins: Instr) -> bool:
    """A barrier that issues at once and holds its warp until it completes (bar.sync, a named barrier that waits):
    the gap before the warp's next instruction is this barrier's wait. (An mbarrier try-wait issues once its phase
    completed: its wait is the gap before it.)"""
    from .roles import named_barrier
    if ins.op != "BAR":
        return False
    nb = named_barrier(ins)
    return nb[2] if nb is not None else "ARV" not in ins.mods


def _stall_line(ins: Instr, stall: float, t: float, who: str = "") -> str:
    """One stall of a trace: who waited (a label, or nothing for warp 0), how long, when, and the instruction that
    waited with its source line."""
    return (f"  {who}+{stall:6.0f} cyc @ {t:8.0f}  line {ins.line or '?':>4}  {ins.pred or '':5} {ins.opcode} "
            f"{', '.join(ins.operands)[:60]}")


def explain_warps(body: list[Instr], res: SimResult, names: dict[int, str], min_stall: float = 100.0) -> list[str]:
    """The stalls of `min_stall` cycles or more of each simulated warp in `names` (its index in the simulation -> a
    label) in its last simulated iteration, from `full_trace`: what the roles other than warp 0's wait on (a warp
    specialized tile's limit is often another role's wait: Hopper v3's warpgroup 1 for stage 1's late half). A gap
    after a barrier that holds its warp is named by that barrier (the instruction after it only waited for it)."""
    out = []
    last: dict[int, tuple[float, int]] = {}
    for t, w, i in res.full_trace:
        if w in last and w in names and t - last[w][0] >= min_stall:
            who = body[last[w][1]] if holds(body[last[w][1]]) else body[i]
            out.append(_stall_line(who, t - last[w][0], t, f"{names[w]} "))
        last[w] = (t, i)
    return out


def explain(body: list[Instr], res: SimResult, min_stall: float = 20.0) -> list[str]:
    """Warp 0's stalls of `min_stall` cycles or more in the last simulated iteration, with the
    instruction that waited (or the barrier that held the warp) and its source line: where a tile's cycles go."""
    out = []
    prev = None
    for t, stall, i in res.trace:
        if stall >= min_stall:
            out.append(_stall_line(body[prev] if prev is not None and holds(body[prev]) else body[i], stall, t))
        prev = i
    return out


def _frame(ins: Instr, depth: int) -> tuple[str | None, int | None]:
    """(file, line) of an instruction's inline frame `depth` levels inside its outermost one (0: the outermost, the
    kernel's own line); the innermost when the chain is shorter."""
    if not ins.frames:
        return ins.file, ins.line
    return ins.frames[max(0, len(ins.frames) - 1 - depth)]


def timeline(body: list[Instr], res: SimResult, names: dict[int, str], *,
             source: Callable[[str | None, int | None], str] = lambda f, ln: "", merge_below: float = 12.0) -> list[str]:
    """Each simulated warp in `names` (its index in the simulation -> a label) over its last simulated iteration,
    as phases: runs of instructions from one kernel source line (the outermost inline frame; a warp whose loop is
    mostly one call, a producer's, one frame further in), each with the cycles it took, its instruction mix and its
    long waits (>= 20 cycles), and `source(file, line)` (the line's text). The phases partition the iteration: an
    instruction owns the gap before its issue, except after a barrier that holds the warp (`holds`), whose wait is
    the barrier's. Runs shorter than `merge_below` cycles of at most 3 instructions (ptxas interleaves a few address
    or loop-control instructions of other lines) join the phase before them."""
    out = []
    for w, label in names.items():
        items = [(t, i) for t, x, i in res.full_trace if x == w]
        if not items:
            continue
        phases = _phases(body, items, 0, merge_below)
        by_frame: dict = {}
        for ph in phases:
            by_frame[ph["frame"]] = by_frame.get(ph["frame"], 0.0) + ph["cycles"]
        if max(by_frame.values()) >= 0.75 * max(1.0, items[-1][0] - items[0][0]):
            phases = _phases(body, items, 1, merge_below)   # (one call holds the loop: a producer's produce())
        out.append(f"  {label}: its last simulated iteration, {items[-1][0] - items[0][0]:.0f} cycles from its first "
                   "issue to its last")
        for ph in phases:
            ops = ", ".join(f"{o} {c}" for o, c in ph["ops"].most_common(3))
            waits = ", ".join(f"{o} {c:.0f}" for o, c in ph["waits"].most_common(2))
            text = source(*ph["frame"])
            out.append(f"    @{ph['at']:6.0f} {ph['cycles']:6.0f} cyc  line {ph['frame'][1] or '?':>4} {ph['n']:4d} "
                       f"instr ({ops}){'; waits ' + waits if waits else ''}{'  | ' + text if text else ''}")
    return out


def _phases(body: list[Instr], items: list[tuple[float, int]], depth: int, merge_below: float) -> list[dict]:
    """timeline's phases of one warp's (issue cycle, instruction) list, by the source frame `depth` levels in."""
    from collections import Counter
    phases: list[dict] = []
    t0 = items[0][0]
    prev_t, prev_i = t0, None
    for t, i in items:
        gap = t - prev_t
        owner = prev_i if prev_i is not None and holds(body[prev_i]) else i
        frame = _frame(body[i], depth)
        new = not phases or phases[-1]["frame"] != frame
        if new:
            phases.append({"frame": frame, "at": (prev_t if owner == i else t) - t0, "cycles": 0.0, "n": 0,
                           "ops": Counter(), "waits": Counter()})
        ph = phases[-2] if new and owner != i and len(phases) > 1 else phases[-1]
        ph["cycles"] += gap
        if gap >= 20:
            ph["waits"][body[owner].opcode] += gap
        phases[-1]["n"] += 1
        phases[-1]["ops"][body[i].op] += 1
        prev_t, prev_i = t, i
    merged: list[dict] = []
    for ph in phases:
        if merged and (merged[-1]["frame"] == ph["frame"] or (ph["cycles"] < merge_below and ph["n"] <= 3)):
            m = merged[-1]
            m["cycles"] += ph["cycles"]
            m["n"] += ph["n"]
            m["ops"].update(ph["ops"])
            m["waits"].update(ph["waits"])
        else:
            merged.append(ph)
    return merged
