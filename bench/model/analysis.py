"""Per-tile reading of a kernel's SASS: the loop, its hot path, class counts, MMA chains, bytes.

The per-KV-tile loop is found from `-lineinfo`: the kernel source marks its tile
loop with a comment `// sass-model: tile-loop` on the `for` line (the combine
marks `// sass-model: split-loop`), and the loop is the one whose backward branch
carries that source line. Blocks that run only on masked (tree / ragged) tiles
are marked `// sass-model: cold` on their `if` line; the hot path leaves out every
instruction whose kernel source line lies inside that braced block. Inner loops
are expanded by their trip count, read off the induction variable
(`IADD3 R, R, step` ... `ISETP R, bound` ... `@P BRA`).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Optional

from verify_attn import build as vb

from . import sass
from .sass import Function, Instr, Loop, hgmma_shape

MARKER = "sass-model:"

FP32_OPS = {"FADD", "FMUL", "FFMA", "FMNMX", "FSEL", "FSETP", "FCHK", "FSWZADD", "FSET", "FMNMX3", "FADD2",
            "FMUL2", "FFMA2", "HADD2", "HMUL2", "HFMA2", "HMNMX2"}
CVT_OPS = {"F2F", "F2FP", "I2F", "F2I", "I2FP", "F2IP", "FRND"}
CONTROL_OPS = {"BRA", "BRX", "EXIT", "RET", "BSSY", "BSYNC", "WARPSYNC", "NOP", "DEPBAR", "LDGDEPBAR", "YIELD",
               "CALL", "KILL", "BPT", "PREEXIT", "ACQBULK"}
MMA_OPS = {"HMMA", "QMMA", "IMMA", "OMMA", "BMMA"}   # warp-synchronous mma.sync
# TMA operations other than the 1D bulk copy global -> shared (UBLKCP): tensor-map loads / stores / prefetches,
# bulk reductions and prefetches. Classified so they are never read as ALU work; the simulator refuses them
TMA_OTHER_OPS = {"UTMASTG", "UTMAPF", "UTMAREDG", "UTMACCTL", "UTMACMDFLUSH", "UBLKRED", "UBLKPF"}
WGMMA_A_SMEM_BYTES = 64 * 32   # an SS-form HGMMA's A operand per warpgroup: 64 rows x 32 bytes of K
WGMMA_K_BYTES = 32             # every wgmma k step is 32 bytes of K per row (k16 16-bit, k32 8-bit, k8 tf32)


@dataclass(frozen=True)
class Markers:
    tile_loops: tuple[int, ...]              # source lines of marked loops (one per kernel in the file)
    split_loops: tuple[int, ...]
    cold: tuple[tuple[int, int], ...]        # inclusive line ranges
    per_iter: dict                           # marker line -> work items (tiles, splits) per loop iteration
    hot: tuple[tuple[int, int], ...] = ()    # blocks only unmasked tiles run (the masked path leaves them out)
    rare: tuple[tuple[int, int], ...] = ()   # blocks neither path runs (e.g. trees wider than the staged mask)
    pv_loops: tuple[int, ...] = ()           # kernel v3 with math roles: the PV warps' tile loop (`pv-loop`)
    # lines whose mbarrier arrive signals the next loop iteration's buffer (`arrive-ahead`: a producer that copies
    # iteration i + 1's rows in iteration i, Hopper's v3 on e4m3 caches)
    arrive_ahead: tuple[int, ...] = ()
    # split loop line -> warps that share a row's splits (`warps=N`: the v1 combine's CTA), each its own share
    split_warps: dict = field(default_factory=dict)
    # blocks only a loop iteration with a phantom tile runs (`phantom`: Hopper's v3, a pair whose second block lies
    # past the split's end), and their alternatives, which every other iteration runs (`real`)
    phantom: tuple[tuple[int, int], ...] = ()
    real: tuple[tuple[int, int], ...] = ()

    @property
    def tile_loop(self) -> Optional[int]:
        return self.tile_loops[0] if self.tile_loops else None

    @property
    def split_loop(self) -> Optional[int]:
        return self.split_loops[0] if self.split_loops else None


def this_checkout(path: str) -> str:
    """A source path recorded in a cubin's line info, read from this checkout's csrc/: a cached cubin is keyed by a
    hash of the sources, so one built in another checkout (or on another machine, .carry/cache) names that
    checkout's files, which may have changed since (CI on a clone read the markers of a file being edited)."""
    k = path.replace("\\", "/").rfind("csrc/")
    if k >= 0:
        local = vb.CSRC / path[k + len("csrc/"):]
        if local.exists():
            return str(local)
    return path


@lru_cache(maxsize=None)
def read_markers(path: str) -> Markers:
    """Marker comments of one source file (1-based lines). `// sass-model: split-loop splits=4`
    says one iteration of that loop covers 4 splits (`tiles=N` likewise for a tile loop); `warps=N` on a split loop,
    that N warps share a row's splits, each running the loop over its own."""
    lines = Path(path).read_text().splitlines()
    tiles, splits, cold, hot, rare, pv, ahead, per, warps, phantom, real = [], [], [], [], [], [], [], {}, {}, [], []
    for i, text in enumerate(lines, start=1):
        if MARKER not in text:
            continue
        words = text.split(MARKER, 1)[1].strip().split()
        what = words[0]
        for w in words[1:]:
            if "=" in w:
                key, val = w.split("=", 1)
                if key in ("splits", "tiles"):
                    per[i] = int(val)
                elif key == "warps":
                    warps[i] = int(val)
                else:
                    raise ValueError(f"{path}:{i}: unknown sass-model marker field {key!r}")
        if what == "tile-loop":
            tiles.append(i)
        elif what == "split-loop":
            splits.append(i)
        elif what == "pv-loop":
            pv.append(i)
        elif what == "arrive-ahead":
            ahead.append(i)
        elif what == "cold":  # the block's body: the `if` line itself (its branch) runs on every tile
            cold.append((i + 1, _block_end(lines, i)))
        elif what == "hot":  # e.g. `} else {  // sass-model: hot` after a cold block: its alternative
            hot.append((i + 1, _block_end(lines, i)))
        elif what == "rare":  # neither the hot nor the masked tile of the modelled shapes runs it
            rare.append((i + 1, _block_end(lines, i)))
        elif what == "phantom":  # only an iteration with a phantom tile runs it (the phantom path)
            phantom.append((i + 1, _block_end(lines, i)))
        elif what == "real":  # its alternative: every iteration but a phantom one (the hot and masked paths)
            real.append((i + 1, _block_end(lines, i)))
        else:
            raise ValueError(f"{path}:{i}: unknown sass-model marker {what!r}")
    return Markers(tuple(tiles), tuple(splits), tuple(cold), per, tuple(hot), tuple(rare), tuple(pv), tuple(ahead),
                   warps, tuple(phantom), tuple(real))


def _block_end(lines: list[str], start: int) -> int:
    """Last line of the braced block that opens at or after `start` (1-based). On the marker's own
    line the block is the one its last `{` opens (so `} else if (x) {  // marker` works)."""
    depth, opened = 0, False
    for i in range(start - 1, len(lines)):
        code = lines[i].split("//", 1)[0]
        if i == start - 1 and "{" in code:
            code = code[code.rindex("{"):]
        for ch in code:
            if ch == "{":
                depth += 1
                opened = True
            elif ch == "}":
                depth -= 1
                if opened and depth == 0:
                    return i + 1
    raise ValueError(f"no closing brace for the block at line {start}")


# ------------------------------------------------------------------ classes

def ldsm_kind(ins: Instr) -> str:
    n = next((m for m in reversed(ins.mods) if m in ("1", "2", "4")), "1")
    return f"x{n}" + (".trans" if "MT88" in ins.mods or "T" in ins.mods else "")


def width_bytes(ins: Instr) -> int:
    """Bytes per lane of a load / store / async copy."""
    for m in ins.mods:
        if m == "128":
            return 16
        if m == "64":
            return 8
        if m in ("U16", "S16"):
            return 2
        if m in ("U8", "S8"):
            return 1
    return 4


def classify(ins: Instr) -> str:
    op = ins.op
    if op in MMA_OPS:
        return "hmma"
    if op in sass.GMMA_OPS:  # wgmma.mma_async: asynchronous, warpgroup-wide (sim.py)
        return "hgmma"
    if op == "WARPGROUP":  # WARPGROUP.ARRIVE = wgmma.fence; WARPGROUP.DEPBAR.LE gsb0, K = wgmma.wait_group K
        return "wg_depbar" if "DEPBAR" in ins.mods else "wg_arrive"
    if op == "FENCE" and "ASYNC" in ins.mods:  # fence.proxy.async (FENCE.VIEW.ASYNC.S)
        return "fence_async"
    if op == "LDSM":
        return "ldsm"
    if op in ("UBLKCP", "UTMALDG"):  # cp.async.bulk global -> shared, 1D or a tensor-map box (the TMA unit;
        return "bulk_copy"            # completes on an mbarrier): sim.py; a box's size is not in the SASS
    if op in TMA_OTHER_OPS:  # tensor-map TMA, bulk stores / reductions / prefetches: not modelled (sim.py refuses)
        return "tma_other"
    if op == "ARRIVES":  # cp.async.mbarrier.arrive(.noinc): the barrier counts the thread once its cp.asyncs landed
        return "mbar_arrive"
    if op == "SYNCS":  # mbarrier operations
        if "PHASECHK" in ins.mods:  # try_wait / test_wait: the warp waits for the phase (sim.py)
            return "mbar_wait"
        if any(m.startswith("ARRIVE") for m in ins.mods):  # arrive, arrive.expect_tx
            return "mbar_arrive"
        return "mbar"  # init (EXCH), and the rest
    if op == "CCTL" and any(m.startswith("PF") for m in ins.mods):  # prefetch.global.L2 / .L1 (CCTL.E.PF2)
        return "l2_prefetch"
    if op == "LDGSTS":
        return "ldgsts"
    if op in ("LDG", "LD"):
        return "ldg"
    if op in ("STG", "ST", "RED", "REDG", "ATOMG", "ATOM"):
        return "stg"
    if op == "LDS":
        return "lds"
    if op in ("STS", "STSM"):
        return "sts"
    if op == "SHFL":
        return "shfl"
    if op == "BAR":
        return "bar"
    if op == "MUFU":
        return "mufu"
    if op in FP32_OPS:
        return "fp32"
    if op in CVT_OPS:
        return "cvt"
    if op in CONTROL_OPS:
        return "control"
    if op in ("LDC", "ULDC", "LDCU", "S2R", "S2UR", "CS2R", "R2UR", "VOTE", "VOTEU", "MATCH", "POPC", "FLO",
              "BREV", "ELECT"):
        return "other"
    return "int"


def hgmma_a_from_smem(ins: Instr) -> bool:
    """An HGMMA's A operand is a shared-memory descriptor (SS form: `D, gdesc[..], C`), not registers
    (RS form: `D, Ra, gdesc[..], C`)."""
    return len(ins.operands) > 1 and ins.operands[1].startswith("gdesc[")


def hgmma_smem_bytes(ins: Instr) -> int:
    """Shared bytes one warpgroup's HGMMA reads: B (N rows x 32 bytes of K) plus, in the SS form, A
    (64 x 32). The warpgroup reads each operand once; each of its 4 warps issues the instruction."""
    _, n, _ = hgmma_shape(ins.opcode)
    return n * WGMMA_K_BYTES + (WGMMA_A_SMEM_BYTES if hgmma_a_from_smem(ins) else 0)


def hgmma_flops(ins: Instr) -> int:
    """FLOPs of one warp's share (16 of the 64 rows) of an HGMMA: 2 x 16 x N x K."""
    m, n, k = hgmma_shape(ins.opcode)
    return 2 * (m // 4) * n * k


def smem_bytes(ins: Instr) -> tuple[int, int]:
    """(shared bytes read, shared bytes written) by one warp instruction (all 32 lanes active). An HGMMA
    is charged a quarter of its warpgroup's operand bytes per warp."""
    c = classify(ins)
    if c == "hgmma":
        return hgmma_smem_bytes(ins) // 4, 0
    if c == "ldsm":
        n = int(ldsm_kind(ins)[1])
        return 128 * n, 0
    if c == "lds":
        return 32 * width_bytes(ins), 0
    if c == "sts":
        return 0, 32 * width_bytes(ins)
    if c == "ldgsts":
        return 0, 32 * width_bytes(ins)
    return 0, 0


def global_bytes(ins: Instr) -> int:
    c = classify(ins)
    if c in ("ldgsts", "ldg"):
        return 32 * width_bytes(ins)
    return 0


# ------------------------------------------------------------------ loops

def _immediate(s: str) -> Optional[int]:
    s = s.strip()
    try:
        return int(s, 16) if s.lower().lstrip("-").startswith("0x") else int(s)
    except ValueError:
        return None


def trip_count(f: Function, loop: Loop) -> Optional[int]:
    """Trip count of a counted inner loop from its induction variable, or None."""
    br = loop.branch
    if not br.pred:
        return None
    pname = br.pred.lstrip("@!")
    body = f.instrs[loop.start:loop.end]
    cmp = next((i for i in reversed(body) if pname in i.regs_written() and i.op in ("ISETP", "UISETP")), None)
    if cmp is None:
        return None
    ops = cmp.operands[2:]
    reg = next((o for o in ops if re.fullmatch(r"U?R\d+", o.strip())), None)
    bound = next((_immediate(o) for o in ops if _immediate(o) is not None), None)
    if reg is None or bound is None:
        return None
    step = None
    for i in body:
        if reg in i.regs_written() and i.op in ("IADD3", "VIADD", "UIADD3", "IADD"):
            srcs = [o.strip() for o in i.operands[1:]]
            if reg in srcs:
                imm = next((_immediate(o) for o in srcs if _immediate(o) is not None), None)
                if imm:
                    step = imm
    if not step:
        return None
    init = 0  # a value set before the loop, else 0 (e.g. a thread's first chunk index 0..k-1)
    for i in reversed(f.instrs[:loop.start]):
        if reg in i.regs_written():
            if i.op in ("MOV", "UMOV", "IMAD") and i.operands:
                vals = [_immediate(o) for o in i.operands[1:]]
                if i.op in ("MOV", "UMOV") and vals and vals[-1] is not None:
                    init = vals[-1]
                elif all(o.strip() in ("RZ", "URZ") for o in i.operands[1:]):
                    init = 0
            break
    n = (bound - init + step - 1) // step if step > 0 else (init - bound + (-step) - 1) // (-step)
    return n if n >= 1 else None


def find_loop(f: Function, marker_lines, marker_file: str) -> Loop:
    """The function's loop whose backward branch sits on one of the marker lines (the largest)."""
    lines = (marker_lines,) if isinstance(marker_lines, int) else tuple(marker_lines)
    mfile = Path(marker_file).resolve()
    cands = [lp for lp in f.loops() if lp.branch.line in lines and lp.branch.file and
             Path(lp.branch.file).resolve() == mfile]
    if cands:
        return max(cands, key=lambda lp: lp.end - lp.start)
    # the compiler may credit the backward branch to the body's last statement: then the innermost
    # loop that holds the marker line's own instructions (the induction update and the exit test)
    at_marker = [k for k, i in enumerate(f.instrs) if i.line in lines and i.file and Path(i.file).resolve() == mfile]
    holders = [lp for lp in f.loops() if lp.end > lp.start and any(lp.start <= a <= lp.end for a in at_marker)]
    if not holders:
        raise LookupError(f"{f.name[:60]}...: no loop closes at {marker_file}:{list(lines)}")
    return min(holders, key=lambda lp: lp.end - lp.start)


def is_waterfall(f: Function, loop: Loop) -> bool:
    """A loop nvcc wraps around a bulk copy (UBLKCP), whose operands are uniform registers while the copy's
    addresses are per thread: one iteration per lane that copies (`ELECT` a lane, `R2UR` its addresses, the copy,
    `@P BRA.U.ANY` back while lanes remain; sm_90a and sm_120a)."""
    return "ANY" in loop.branch.mods and any(i.op in ("UBLKCP", "UTMALDG") for i in f.instrs[loop.start:loop.end])


def is_wait_loop(f: Function, loop: Loop) -> bool:
    """The retry loop of `mbarrier.try_wait`: `SYNCS.PHASECHK.TRANS64.TRYWAIT Pp, [bar], parity` and `@!Pp BRA` back
    to it (nvcc places it inline or out of line). The simulator holds the warp at the wait until the phase's
    copies landed, so the loop runs once."""
    br = loop.branch
    if not br.pred:
        return False
    p = br.pred.lstrip("@!")
    # the branch's predicate as last written before it in the loop body: the try_wait's (a tile loop whose back
    # branch tests its counter in a predicate register some try_wait inside it also wrote is not a retry loop)
    for i in reversed(f.instrs[loop.start:loop.end]):
        if p in i.regs_written():
            return i.op == "SYNCS" and "PHASECHK" in i.mods
    return False


def _value_before(f: Function, idx: int, reg: str, depth: int = 0) -> Optional[int]:
    """The value `reg` holds at instruction `idx` where straight-line code before it sets it from an immediate
    (through moves, R2UR, a 16-bit UPRMT and shifts right), else None."""
    if depth > 8:
        return None
    for k in range(idx - 1, -1, -1):
        ins = f.instrs[k]
        if reg not in ins.regs_written():
            continue
        ops = [o.strip() for o in ins.operands]
        if ins.op in ("MOV", "UMOV") and len(ops) >= 2:
            v = _immediate(ops[-1])
            return v if v is not None else (_value_before(f, k, ops[-1], depth + 1)
                                            if re.fullmatch(r"U?R\d+", ops[-1]) else None)
        if ins.op == "IMAD" and "MOV" in ins.mods and len(ops) == 4:      # IMAD.MOV.U32 R, RZ, RZ, x
            v = _immediate(ops[3])
            return v if v is not None else (_value_before(f, k, ops[3], depth + 1)
                                            if re.fullmatch(r"U?R\d+", ops[3]) else None)
        if ins.op == "IMAD" and "U32" in ins.mods and len(ops) == 4 and ops[1] in ("RZ",) and ops[2] == "RZ":
            return _value_before(f, k, ops[3], depth + 1) if re.fullmatch(r"U?R\d+", ops[3]) else _immediate(ops[3])
        if ins.op == "R2UR" and len(ops) >= 2 and re.fullmatch(r"R\d+", ops[-1]):
            return _value_before(f, k, ops[-1], depth + 1)
        if ins.op == "UPRMT" and len(ops) == 4 and ops[2] == "0x5410" and ops[3] in ("URZ", "RZ"):
            v = _value_before(f, k, ops[1], depth + 1)   # the low 16 bits, kept
            return None if v is None else v & 0xFFFF
        if ins.op in ("SHF", "USHF") and "R" in ins.mods and len(ops) == 4 and ops[1] in ("RZ", "URZ"):
            sh = _immediate(ops[2])                       # SHF.R.U32.HI R, RZ, 0x4, Rx: Rx >> 4
            v = _value_before(f, k, ops[3], depth + 1) if re.fullmatch(r"U?R\d+", ops[3]) else _immediate(ops[3])
            return None if v is None or sh is None else v >> sh
        return None
    return None


def bulk_copy_size(f: Function, idx: int) -> Optional[int]:
    """Bytes of the UBLKCP at f.instrs[idx] where the SASS sets its size operand from an immediate
    (`UMOV UR4, 0x48`: the operand counts 16-byte units, so 0x48 is 1,152 bytes; also a register shifted right by 4,
    `SHF.R.U32.HI R6, RZ, 0x4, R6`, when R6 is an immediate number of bytes), else None (set at run time: the
    caller supplies it)."""
    ins = f.instrs[idx]
    size_op = next((o.strip() for o in ins.operands[2:] if re.fullmatch(r"U?R\d+", o.strip())), None)
    if size_op is None:
        return None
    v = _value_before(f, idx, size_op)
    return None if v is None or v <= 0 else 16 * v


@dataclass
class TilePath:
    """The instructions one warp issues per loop iteration (inner loops expanded)."""
    instrs: list[Instr]
    inner_loops: list[tuple[int, int, int]] = field(default_factory=list)   # (start addr, end addr, trips)
    excluded: int = 0  # instructions of the loop left out (blocks of the other path, rare blocks)
    # bulk copies (UBLKCP): for each instruction of `instrs`, the copying lane (0..bulk_lanes-1) whose iteration of a
    # waterfall loop it belongs to, else -1 (a warp whose lanes are fewer skips the later iterations: sim.Bulk)
    bulk_lane: list[int] = field(default_factory=list)
    bulk_sizes: dict = field(default_factory=dict)   # UBLKCP address -> bytes read off the SASS, or None
    waterfalls: list[tuple[int, int, int]] = field(default_factory=list)   # (start addr, end addr, lanes)
    wait_loops: list[tuple[int, int]] = field(default_factory=list)        # try_wait retry loops run once


def tile_path(f: Function, loop: Loop, cold: tuple[tuple[int, int], ...], cold_file: str,
              include_cold: bool = False, hot: tuple[tuple[int, int], ...] = (),
              rare: tuple[tuple[int, int], ...] = (), bulk_lanes: int = 1,
              skip: tuple[tuple[int, int], ...] = ()) -> TilePath:
    """The instructions one tile runs: the hot path leaves out the `cold` blocks; the masked path
    (include_cold) takes them and leaves out the `hot` ones (their alternatives); either leaves out the `skip`
    blocks too (Markers.phantom on the hot and masked paths, Markers.real on the phantom one). A bulk copy's
    waterfall loop (is_waterfall) is expanded `bulk_lanes` times (the most lanes of a warp that copy; 1: one elected
    thread, the CUTLASS idiom), its iterations tagged with their lane (TilePath.bulk_lane); an mbarrier try_wait retry
    loop (is_wait_loop) runs once."""
    if bulk_lanes < 0:
        raise ValueError(f"bulk_lanes must be >= 0, got {bulk_lanes}")
    inner = [lp for lp in f.loops() if loop.contains(lp)]
    direct = [lp for lp in inner if not any(o.contains(lp) for o in inner)]
    out = TilePath([])

    cold_path = Path(cold_file).resolve()
    # the blocks of the other path: cold blocks (hot path) or hot-only blocks (masked path); rare blocks
    skip = (hot if include_cold else cold) + rare + skip

    def left_out(ins: Instr) -> bool:
        # when any frame of its inline chain (the kernel line, or a lambda's body line) is in a skipped block; a
        # device function of another file (inlined from a shared header) is left out by its own file's `rare`
        # blocks, which no path runs wherever it is called from (its hot / cold blocks are the kernel file's)
        frames = ins.frames or ((ins.file, ins.line),)
        for f, ln in frames:
            if not f or ln is None:
                continue
            fp = Path(f).resolve()
            if fp == cold_path:
                if any(a <= ln <= b for a, b in skip):
                    return True
            else:
                local = Path(this_checkout(f))
                if local.exists() and any(a <= ln <= b for a, b in read_markers(str(local)).rare):
                    return True
        return False

    def emit(lo: int, hi: int, nested: list[Loop]) -> list[tuple[Instr, int]]:
        seq: list[tuple[Instr, int]] = []
        i = lo
        while i <= hi:
            lp = next((x for x in nested if x.start == i), None)
            if lp is not None:
                sub = [x for x in f.loops() if lp.contains(x)]
                sub_direct = [x for x in sub if not any(o.contains(x) for o in sub)]
                a, b = f.instrs[lp.start].addr, f.instrs[lp.end].addr
                body = emit(lp.start, lp.end, sub_direct)
                if is_waterfall(f, lp):  # one iteration per copying lane, each tagged with its lane
                    if any(ins.op in ("UBLKCP", "UTMALDG") for ins, _ in body):   # (not a block this path leaves out)
                        out.waterfalls.append((a, b, bulk_lanes))
                    seq += [(ins, k) for k in range(bulk_lanes) for ins, _ in body]
                    i = lp.end + 1
                    continue
                if is_wait_loop(f, lp):
                    out.wait_loops.append((a, b))
                    seq += body
                    i = lp.end + 1
                    continue
                trips = trip_count(f, lp)
                if trips is None:
                    raise LookupError(f"trip count of the inner loop at 0x{f.instrs[lp.start].addr:x} "
                                      f"(source line {lp.branch.line}) could not be read from its induction variable")
                out.inner_loops.append((a, b, trips))
                seq += body * trips
                i = lp.end + 1
                continue
            ins = f.instrs[i]
            if left_out(ins):
                out.excluded += 1
            else:
                seq.append((ins, -1))
            i += 1
        return seq

    seq = emit(loop.start, loop.end, direct)
    out.instrs = [ins for ins, _ in seq]
    out.bulk_lane = [k for _, k in seq]
    index = {id(ins): k for k, ins in enumerate(f.instrs)}
    out.bulk_sizes = {ins.addr: bulk_copy_size(f, index[id(ins)]) if ins.op == "UBLKCP" else None
                      for ins in out.instrs if ins.op in ("UBLKCP", "UTMALDG")}
    return out


# ------------------------------------------------------------------ per-tile reading

def mma_chain_depth(instrs: list[Instr]) -> int:
    """Longest chain of MMAs linked through their accumulator (C -> D) registers."""
    depth: dict[str, int] = {}
    best = 0
    for ins in instrs:
        if ins.op in MMA_OPS and len(ins.srcs) >= 3:
            cbase, cw = ins.srcs[2]
            from .sass import _expand
            d = 1 + max((depth.get(r, 0) for r in _expand(cbase, cw)), default=0)
            for r in ins.regs_written():
                depth[r] = d
            best = max(best, d)
        else:
            for r in ins.regs_written():
                depth[r] = 0
    return best


def mma_independent_chains(instrs: list[Instr]) -> int:
    """Distinct accumulators the MMAs of the path write (independent chains per tile)."""
    return len({ins.dsts[0][0] for ins in instrs if ins.op in MMA_OPS and ins.dsts})


@dataclass
class TileReading:
    instructions: int
    classes: dict[str, int]
    hmma: int
    hmma_shapes: dict[str, int]
    hmma_flops: int
    hmma_chain_depth: int
    hmma_accumulators: int
    ldsm: int
    ldsm_kinds: dict[str, int]
    lds_sts_widths: dict[str, int]
    ldgsts: int
    barriers: int
    fmul_fp32: int
    smem_read_bytes: int        # per warp
    smem_write_bytes: int       # per warp (STS + cp.async landing)
    global_bytes: int           # per warp (cp.async + LDG)
    inner_loops: list
    # sm_90a wgmma (HGMMA): per warp; hgmma_shapes by mnemonic, hgmma_n by N; groups = HGMMAs closing a
    # commit group (`gsb0`), waits = WARPGROUP.DEPBAR; smem bytes are also in smem_read_bytes
    hgmma: int = 0
    hgmma_shapes: dict = field(default_factory=dict)
    hgmma_n: dict = field(default_factory=dict)
    hgmma_flops: int = 0
    hgmma_smem_bytes: int = 0
    hgmma_groups: int = 0
    wgmma_waits: int = 0
    # bulk copies (UBLKCP, cp.async.bulk): on the path as read (a waterfall loop expanded by the copying lanes of
    # the loader warp); sizes: address -> bytes read off the SASS, or None (set at run time: the caller's row bytes)
    bulk_copies: int = 0
    bulk_sizes: dict = field(default_factory=dict)
    bulk_lanes: int = 0           # the lanes the waterfall loop was expanded by (0: no waterfall)
    mbar_waits: int = 0           # SYNCS.PHASECHK (try_wait) on the path
    mbar_arrives: int = 0         # SYNCS.ARRIVE* (arrive, arrive.expect_tx)

    def bulk_size_source(self) -> str:
        """Where the simulated bulk copies' sizes come from: "sass" (every size an immediate), "caller" (none
        readable: the tile's row bytes), "sass+caller", or "" (no bulk copies)."""
        if not self.bulk_sizes:
            return ""
        known = [v is not None for v in self.bulk_sizes.values()]
        return "sass" if all(known) else ("caller" if not any(known) else "sass+caller")

    def to_dict(self, warps: int) -> dict:
        return {
            "instructions": self.instructions, "classes": self.classes, "hmma": self.hmma,
            "hmma_shapes": self.hmma_shapes, "hmma_chain_depth": self.hmma_chain_depth,
            "hmma_accumulators": self.hmma_accumulators, "ldsm": self.ldsm, "ldsm_kinds": self.ldsm_kinds,
            "lds_sts": self.lds_sts_widths, "ldgsts": self.ldgsts, "barriers": self.barriers,
            "fmul": self.fmul_fp32,
            "smem_read_bytes": self.smem_read_bytes * warps, "smem_write_bytes": self.smem_write_bytes * warps,
            "global_bytes": self.global_bytes * warps,
            "per_warp": {"smem_read_bytes": self.smem_read_bytes, "global_bytes": self.global_bytes},
            "inner_loops": [{"start": f"0x{a:x}", "end": f"0x{b:x}", "trips": t} for a, b, t in self.inner_loops],
            "hgmma": self.hgmma, "hgmma_shapes": self.hgmma_shapes, "hgmma_n": self.hgmma_n,
            "hgmma_flops": self.hgmma_flops, "hgmma_smem_read_bytes": self.hgmma_smem_bytes * warps,
            "hgmma_groups": self.hgmma_groups, "wgmma_waits": self.wgmma_waits,
            "bulk_copies": self.bulk_copies, "bulk_lanes": self.bulk_lanes,
            "bulk_copy_bytes": {f"0x{a:x}": b for a, b in self.bulk_sizes.items()},
            "bulk_size_source": self.bulk_size_source(), "mbar_waits": self.mbar_waits,
            "mbar_arrives": self.mbar_arrives,
        }


def read_tile(path: TilePath) -> TileReading:
    ins = path.instrs
    classes = Counter(classify(i) for i in ins)
    shapes = Counter(i.opcode for i in ins if i.op in MMA_OPS)
    flops = 0
    for i in ins:
        if i.op in MMA_OPS:
            shape = i.mods[0] if i.mods else "16816"
            m, n, k = {"16816": (16, 8, 16), "1688": (16, 8, 8), "16832": (16, 8, 32)}.get(shape, (16, 8, 16))
            flops += 2 * m * n * k
    ldsm = Counter(ldsm_kind(i) for i in ins if i.op == "LDSM")
    widths = Counter(f"{i.op}.{8 * width_bytes(i)}" for i in ins if classify(i) in ("lds", "sts"))
    rd = sum(smem_bytes(i)[0] for i in ins)
    wr = sum(smem_bytes(i)[1] for i in ins)
    hg = [i for i in ins if i.op in sass.GMMA_OPS]
    return TileReading(
        instructions=len(ins), classes=dict(classes), hmma=classes.get("hmma", 0), hmma_shapes=dict(shapes),
        hmma_flops=flops, hmma_chain_depth=mma_chain_depth(ins), hmma_accumulators=mma_independent_chains(ins),
        ldsm=classes.get("ldsm", 0), ldsm_kinds=dict(ldsm), lds_sts_widths=dict(widths),
        ldgsts=classes.get("ldgsts", 0), barriers=classes.get("bar", 0),
        fmul_fp32=sum(1 for i in ins if i.op == "FMUL"), smem_read_bytes=rd, smem_write_bytes=wr,
        global_bytes=sum(global_bytes(i) for i in ins), inner_loops=path.inner_loops,
        hgmma=len(hg), hgmma_shapes=dict(Counter(i.opcode for i in hg)),
        hgmma_n=dict(Counter(hgmma_shape(i.opcode)[1] for i in hg)), hgmma_flops=sum(hgmma_flops(i) for i in hg),
        hgmma_smem_bytes=sum(smem_bytes(i)[0] for i in hg), hgmma_groups=sum(1 for i in hg if "gsb0" in i.operands),
        wgmma_waits=classes.get("wg_depbar", 0),
        bulk_copies=classes.get("bulk_copy", 0), bulk_sizes=dict(path.bulk_sizes),
        bulk_lanes=max((n for _, _, n in path.waterfalls), default=0), mbar_waits=classes.get("mbar_wait", 0),
        mbar_arrives=classes.get("mbar_arrive", 0),
    )
