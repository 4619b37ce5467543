"""The compiled kernels the model reads: cubins of the real build, parsed once per source hash.

One `KernelModel` is a split kernel of one tile config on one arch, with its
per-tile paths (hot = unmasked prefix tile, cold = tile that needs the tree
mask), its resources (registers from the cubin, dynamic shared memory from the
build's SharedMemoryPlan mirror), and the combine kernel's split loop.
"""
from __future__ import annotations

import functools
import re
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from verify_attn import build as vb

from . import analysis, banks, sass


@dataclass
class KernelModel:
    arch: str
    name: str                     # readable: "split bf16 576x512 page1 m32 n16 w4 s3"
    mangled: str
    tile: vb.Tile
    head: str
    dtype: str
    layout: str
    registers: int
    smem_bytes: int               # dynamic shared memory per CTA
    hot: analysis.TilePath
    cold: analysis.TilePath
    hot_reading: analysis.TileReading
    cold_reading: analysis.TileReading
    combine: Optional[analysis.TilePath]
    combine_registers: int
    combine_splits_per_iter: int = 1
    # shared-memory bank conflicts (bench.model.banks): instruction address -> wavefronts / conflict-free ones
    bank_degree: dict = field(default_factory=dict)
    bank_unresolved: int = 0      # accesses of the hot tile whose lanes' addresses could not be read
    combine_pdl: bool = False     # its combine is the v1 one, launched with programmatic dependent launch
    # the split kernel itself is launched with programmatic dependent launch: its SASS waits for the kernel before it
    # (griddepcontrol.wait, ACQBULK; launch_shape.cuh launches every split kernel that way)
    split_pdl: bool = False
    # warp roles (kernel v3, Tile.loader 2: the math warps run `hot` / `cold`, the last warp the producer's loop):
    # per path, (the math path's instructions then the producer's, their spans, each instruction's copying lane)
    roles_hot: Optional[tuple] = None
    roles_cold: Optional[tuple] = None
    # the path of a loop iteration with a phantom tile (`sass-model: phantom` / `real` blocks; Hopper's v3: a pair
    # whose second block lies past the split's end, the first one masked), its reading and roles; None: such an
    # iteration runs the masked path
    phantom: Optional[analysis.TilePath] = None
    phantom_reading: Optional[analysis.TileReading] = None
    roles_phantom: Optional[tuple] = None
    # KV tiles one iteration of the tile loop covers (its `sass-model: tile-loop tiles=N` marker; Hopper's v3: 2)
    tiles_per_iter: int = 1
    # source lines of the producer's arrives that signal the next iteration's buffer (`sass-model: arrive-ahead`)
    arrive_ahead: frozenset = frozenset()
    # warps that share one row's splits, each looping over its own (the v1 combine's CTA: `warps=N` on its split loop)
    combine_split_warps: int = 1

    @property
    def threads(self) -> int:
        return 32 * self.tile.num_warps


def _resource_usage(cubin: Path) -> dict[str, int]:
    tool = sass.find_tool("cuobjdump")
    if tool is None:
        raise RuntimeError("cuobjdump not found: `pip install nvidia-cuda-cuobjdump` (the project's setup.py "
                           "installs it) or put the CUDA toolkit's cuobjdump on PATH")
    r = subprocess.run([tool, "-res-usage", str(cubin)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"cuobjdump -res-usage failed on {cubin}: {r.stderr[-2000:]}")
    regs, cur = {}, None
    for line in r.stdout.splitlines():
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            cur = m.group(1)
            continue
        m = re.search(r"REG:(\d+)", line)
        if m and cur:
            regs[cur] = int(m.group(1))
    return regs


def _marked_loop(f: sass.Function, marker: str) -> tuple[str, "analysis.Markers", "sass.Loop"]:
    """(source file, its markers, the loop) of the function's loop marked `marker` (tile_loops / split_loops)."""
    files = sorted({i.file for i in f.instrs if i.file})
    for fl in files:
        local = analysis.this_checkout(fl)
        if not Path(local).exists():
            continue
        mk = analysis.read_markers(local)  # the line numbers match: the cubin's key hashes these sources
        lines = getattr(mk, marker)
        if not lines:
            continue
        try:
            return fl, mk, analysis.find_loop(f, lines, fl)
        except LookupError:
            continue
    raise LookupError(f"{f.name[:70]}...: no loop marked `sass-model: {marker[:-1].replace('_', '-')}`")


# (arch, head, dtype, layout) -> [(kernel, why)]: split kernels of a cubin the model could not read
_UNREADABLE: dict[tuple, list[tuple[str, str]]] = {}


def unreadable(arch: str, head: str, dtype: str, layout: str) -> list[tuple[str, str]]:
    """The split kernels of one instantiation file that `load` left out, each with the reason (after `load`)."""
    return list(_UNREADABLE.get((arch, head, dtype, layout), ()))


def waits_for_previous_grid(f: sass.Function) -> bool:
    """The kernel runs griddepcontrol.wait (SASS ACQBULK): it is launched with programmatic dependent launch, and its
    launch overlaps the end of the kernel before it (csrc/arch/launch.cuh launch_dependent)."""
    return any(i.op == "ACQBULK" for i in f.instrs)


@functools.lru_cache(maxsize=None)
def load(arch: str, head: str, dtype: str, layout: str, knockout: int = 0) -> tuple[KernelModel, ...]:
    """Every split kernel (tile config) of one instantiation file, read from its cubin (`knockout`: a timing
    experiment's variant, as bench.knockout builds it)."""
    src = vb.instantiation_file(dtype, head, layout)
    cubin = vb.compile_cubin(src, arch, knockout=knockout)
    funcs = sass.parse(sass.disassemble(cubin))
    regs = _resource_usage(cubin)
    combines = {}  # kernel version -> (path, registers, splits per iteration)
    for n, f in funcs.items():
        if "tree_verify_combine_kernel" not in n:
            continue
        cfile, mk, lp = _marked_loop(f, "split_loops")
        combines[1 if "combine_kernel_v1" in n else 0] = (analysis.tile_path(f, lp, mk.cold, cfile),
                                                           regs.get(n, 0), mk.per_iter.get(lp.branch.line, 1),
                                                           mk.split_warps.get(lp.branch.line, 1))
    dqk, dv, shared = vb.HEADS[head]
    out, skipped = [], []
    for name, f in funcs.items():
        if "tree_verify_split_kernel" not in name:
            continue
        readable, dyn = vb._describe(name)
        tile = vb._compiled_tile(name)  # the TILES entry, with the archs it targets
        if not tile.targets(arch):  # e.g. the wgmma tile built for sm_120a: compiled to nothing, never launched
            continue
        kfile, mk, lp = _marked_loop(f, "tile_loops")
        producer = None
        if tile.version == 3:  # kernel v3 for Hopper: two consumer warpgroups in one tile loop, a producer warpgroup
            try:
                km = _hopper_v3(arch, readable, name, tile, head, dtype, layout, f, regs, lp, mk, kfile,
                                combines.get(1, (None, 0, 1, 1)))
            except LookupError as e:
                skipped.append((readable, f"kernel v3 (sm90): {e}"))
                continue
            km.split_pdl = waits_for_previous_grid(f)
            out.append(km)
            continue
        if tile.loader >= 2:  # kernel v3: the producer warp's loop, found from the SASS (bench/model/roles.py)
            from .roles import find_roles
            # the producer warp follows the math warps; a producer warpgroup's four warps each copy a quarter of the
            # tile's rows (their waterfall loops: that many lanes)
            pwarps = producer_warps(tile)
            plane = -(-tile.block_n // pwarps)
            found = [r for r in find_roles(f, 32 * tile.num_warps, bulk_lanes=min(32, plane)) if r.kind == "producer"]
            m = tile.warps_m * tile.warps_n
            if len(found) != 1 or found[0].warps != tuple(range(m, m + pwarps)):
                skipped.append((readable, "kernel v3: its producer warp's loop was not found in the SASS"))
                continue
            # our own producer loop read with its source markers too (roles.py reads foreign SASS without them): its
            # `sass-model: rare` blocks (a row past the range's end zero-filled with 72 st.shared, the Q stages'
            # barrier of one tile) are not every tile's (until 2026-12-05 the model charged both to every tile)
            from .roles import _without, first_iteration_blocks
            ploop = found[0].loop
            producer = _without(analysis.tile_path(f, ploop, mk.cold, kfile, rare=mk.rare, bulk_lanes=min(32, plane)),
                                first_iteration_blocks(f, ploop))
        # a bulk loader's waterfall loops: one iteration per lane that could copy (at most min(32, BN)); the
        # simulation runs each warp's own copying lanes only (call.bulk_loader_lanes: BN / W, the rows spread over
        # the warps); paths without bulk copies are unaffected
        lanes = min(32, tile.block_n)
        try:
            hot = analysis.tile_path(f, lp, mk.cold, kfile, rare=mk.rare, bulk_lanes=lanes)
            cold = analysis.tile_path(f, lp, mk.cold, kfile, include_cold=True, hot=mk.hot, rare=mk.rare,
                                      bulk_lanes=lanes)
        except LookupError as e:  # e.g. GQA's v0 tiles: a copy loop whose trip count depends on the thread
            skipped.append((readable, str(e)))
            continue
        # v1 / v2 launch the v1 combine (128 columns per warp), except for a Dv under 128 (GQA 64 with e4m3 caches),
        # which takes v0's (csrc/tree_verify/launch_shape.cuh)
        comb_v = 1 if tile.version >= 1 and dv % 128 == 0 else 0
        comb_path, comb_regs, comb_per, comb_warps = combines.get(comb_v, (None, 0, 1, 1))
        acc = banks.conflicts(f, warps=tile.num_warps)
        hot_addrs = {i.addr for i in hot.instrs}
        km = KernelModel(arch, readable, name, tile, head, dtype, layout, regs.get(name, 0),
                         vb.tile_smem(head, tile), hot, cold,
                         analysis.read_tile(hot),
                         analysis.read_tile(cold), comb_path, comb_regs, comb_per,
                         {a: x.degree for a, x in acc.items() if x.degree > 1.0},
                         sum(1 for a, x in acc.items() if a in hot_addrs and not x.resolved),
                         comb_v == 1, combine_split_warps=comb_warps)
        if producer is not None:
            pv = None
            if tile.loader == 4:  # math roles: the PV warps' own loop (`sass-model: pv-loop`) between S's and the producer's
                pfile, pmk, plp = _marked_loop(f, "pv_loops")
                pv = tuple(analysis.tile_path(f, plp, pmk.cold, pfile, include_cold=c, hot=pmk.hot if c else (),
                                              rare=pmk.rare, bulk_lanes=lanes) for c in (False, True))
            km.roles_hot, km.roles_cold = (_with_producer(p, producer, pv[k] if pv else None)
                                           for k, p in enumerate((hot, cold)))
        km.split_pdl = waits_for_previous_grid(f)
        out.append(km)
    _UNREADABLE[(arch, head, dtype, layout)] = skipped
    if not out:
        why = "; ".join(f"{k}: {e}" for k, e in skipped)
        raise LookupError(f"no split kernels the model can read in {cubin}" + (f" ({why})" if why else ""))
    order = {t: i for i, t in enumerate(vb.TILES[head])}
    return tuple(sorted(out, key=lambda k: order.get(k.tile, 99)))


# Hopper's v3 producer prefetches into L2, in the iteration that copies pair i, the rows of pair i + 1
# (sm90/tree_verify_kernel_v3.cuh)
V3_SM90_PREFETCH_AHEAD = 1


def blocks_per_iter(km) -> int:
    """KV tiles of `tile.block_n` tokens one iteration of the simulated loop covers: the tile loop's `tiles=N` marker
    (Hopper's v3: a pair of blocks), else 1."""
    return getattr(km, "tiles_per_iter", 1)


def _hopper_v3(arch, readable, name, tile, head, dtype, layout, f, regs, lp, mk, kfile, comb) -> KernelModel:
    """The KernelModel of Hopper's v3: roles_hot / roles_cold hold warpgroup 0's part of the tile loop, warpgroup 1's,
    and the producer warpgroup's loop, each with only what its warps reach (the tile loop branches on the warpgroup:
    roles.reachable decides `wg == 0` per warp). Both loops run a pair of blocks an iteration (the tile loop's
    `tiles=2` marker), so the mbarriers each names are the same in every iteration: each consumer waits for the FULL
    arrives of its own block's halves, the producer for the releases of the half it refills."""
    from .roles import find_roles, first_iteration_blocks, reachable, _without
    found = [r for r in find_roles(f, 32 * tile.num_warps) if r.kind == "producer"]
    m = tile.warps_m * tile.warps_n
    if len(found) != 1 or found[0].warps != tuple(range(m, m + 4)):
        raise LookupError("the producer warpgroup's loop was not found in the SASS")
    ploop = found[0].loop
    producer = _without(analysis.tile_path(f, ploop, mk.cold, kfile, rare=mk.rare), first_iteration_blocks(f, ploop))
    if not any(i.op == "LDGSTS" for i in producer.instrs):
        raise LookupError("the producer's loop issues no cp.async")
    hot = analysis.tile_path(f, lp, mk.cold, kfile, rare=mk.rare, skip=mk.phantom)
    cold = analysis.tile_path(f, lp, mk.cold, kfile, include_cold=True, hot=mk.hot, rare=mk.rare, skip=mk.phantom)
    # a pair with a phantom block: its real block takes the masked path (it is its split's last), the phantom the
    # `phantom` blocks
    phantom = (analysis.tile_path(f, lp, mk.cold, kfile, include_cold=True, hot=mk.hot, rare=mk.rare, skip=mk.real)
               if mk.phantom else None)
    per_wg = 4  # warps of a warpgroup
    reach = [{f.instrs[k].addr for k in reachable(f, w)} for w in range(0, m, per_wg)]
    if len(reach) != 2 or not all(any(i.op in sass.GMMA_OPS and i.addr in r for i in hot.instrs) for r in reach):
        raise LookupError("the two consumer warpgroups' wgmma were not told apart in the tile loop")

    def part(path: analysis.TilePath, r: set) -> analysis.TilePath:
        return replace(path, instrs=[i for i in path.instrs if i.addr in r], bulk_lane=[], bulk_sizes={})

    km = KernelModel(arch, readable, name, tile, head, dtype, layout, regs.get(name, 0), vb.tile_smem(head, tile),
                     hot, cold, analysis.read_tile(hot), analysis.read_tile(cold), *comb[:3],
                     {a: x.degree for a, x in banks.conflicts(f, warps=tile.num_warps).items() if x.degree > 1.0},
                     combine_pdl=True,  # the v1 combine, launched with programmatic dependent launch (launch_shape.cuh)
                     combine_split_warps=comb[3],
                     tiles_per_iter=mk.per_iter.get(lp.branch.line, 1), arrive_ahead=frozenset(mk.arrive_ahead))
    km.roles_hot, km.roles_cold = (_with_producer(part(p, reach[0]), producer, part(p, reach[1]), named_ids=False)
                                   for p in (hot, cold))
    if phantom is not None:
        km.phantom, km.phantom_reading = phantom, analysis.read_tile(phantom)
        km.roles_phantom = _with_producer(part(phantom, reach[0]), producer, part(phantom, reach[1]), named_ids=False)
    return km


def producer_warps(tile: vb.Tile) -> int:
    """Kernel v3's warps that issue KV copies (traits.h kProducerWarps): one producer warp, or the four of a warpgroup
    (Tile.loader 3 and 4; Hopper's v3, sm90/traits_v3.h kProducerThreads)."""
    return 4 if tile.loader >= 3 or tile.version == 3 else 1


# kernel v3 with math roles: the P handoff's named barriers take their id from a register (kPFullBarrier + t % 2,
# kPEmptyBarrier + t % 2: two buffers). The simulator pairs named barriers generation by generation per id, which the
# alternation does not change, so each direction gets one id of its own: the S warps' BAR.ARV and the PV warps'
# BAR.SYNC are P_FULL, the PV warps' BAR.ARV and the S warps' BAR.SYNC are P_EMPTY, whose waiters (the S warps) pass
# their first ROLES_P_BUFFERS generations (sim.RoleSpec.named_credit: P(0) and P(1) are written before any wait).
ROLES_P_FULL, ROLES_P_EMPTY, ROLES_P_BUFFERS = 14, 15, 2


def _roles_named_ids(path: analysis.TilePath, s_side: bool) -> analysis.TilePath:
    """`path` with its register-id named barriers given the P handoff's ids (above), as the S (or PV) warps use them."""
    out = []
    for i in path.instrs:
        ops = [o.strip() for o in i.operands]
        if i.op == "BAR" and ops and ops[0].startswith("R"):
            arrive = "ARV" in i.opcode.split(".")
            bid = ROLES_P_FULL if arrive == s_side else ROLES_P_EMPTY
            i = replace(i, operands=[hex(bid)] + list(i.operands[1:]))
        out.append(i)
    return replace(path, instrs=out)


def _with_producer(math: analysis.TilePath, producer: analysis.TilePath,
                   pv: Optional[analysis.TilePath] = None, named_ids: bool = True) -> tuple:
    """(instructions, spans, copying lane per instruction, producer path) of a math path, with math roles the PV
    warps' path (Hopper's v3: warpgroup 1's), and the producer's loop, one after the other: the body sim.RoleSpec
    simulates (built once, so the simulation's memo keys on one list). `named_ids`: give the P handoff's
    register-id named barriers their ids (v3 with math roles; Hopper's v3 names its barriers by immediates)."""
    if pv is not None and named_ids:
        math, pv = _roles_named_ids(math, True), _roles_named_ids(pv, False)
    paths = [math] + ([pv] if pv is not None else []) + [producer]
    body, spans, lanes = [], [], []
    for k, p in enumerate(paths):
        spans.append((len(body), len(body) + len(p.instrs)))
        body += list(p.instrs)
        lanes += list(p.bulk_lane or [-1] * len(p.instrs)) if k == len(paths) - 1 else [-1] * len(p.instrs)
    return body, tuple(spans), tuple(lanes), producer


def find(arch: str, head: str, dtype: str, layout: str, tile: Optional[vb.Tile] = None) -> KernelModel:
    ks = load(arch, head, dtype, layout)
    if tile is None:
        return ks[0]  # the default tile config (first in TILES)
    for k in ks:
        if k.tile == tile:
            return k
    raise LookupError(f"tile {tile} is not compiled for {head}; compiled: {[k.tile for k in ks]}")
