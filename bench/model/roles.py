"""Warp roles of a warp-specialized kernel, read off its SASS without markers.

A warp-specialized kernel branches on the warp (or warpgroup) index into different loops: a producer that only
copies (cp.async, cp.async.bulk, TMA) and math warps that run the MMAs, joined by mbarriers and named barriers
(FlashMLA, FA3, FlashInfer's Hopper and sm_120 MLA kernels). Reading one as if every warp ran the hot loop
overcounts the tensor work per scheduler and charges the copies to the math warps.

How the roles are found (`find_roles`):
- the role branches: a conditional branch whose predicate is a function of the thread index only and the same for
  every lane of a warp, evaluated for the warp's lane 0 (`_eval`: `S2R SR_TID.X`, moves, shifts, `LOP3` with an
  immediate, `SHFL.IDX` of lane 0, `R2UR`, `ISETP` / `UISETP`, `PLOP3`), followed forward through the control flow;
- for each warp of the CTA, the loops it can reach from the entry with those branches decided for that warp and
  every other branch taken both ways (`reachable`);
- its hot loop: the reachable loop with the most MMAs per iteration (inner loops expanded), else, for a warp that
  reaches no MMA loop, the reachable loop with the most copies: a producer;
- warps with the same hot loop form one role; `USETMAXREG` (setmaxnreg) reachable only by a role's warps gives its
  register count.
A kernel whose branches cannot be evaluated gives one role (every warp runs the hot loop), as before.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from . import analysis, sass
from .sass import Function, Instr, Loop

MMA_OPS = ("HMMA", "QMMA") + sass.GMMA_OPS
COPY_OPS = ("LDGSTS", "UBLKCP", "UTMALDG")
_CMP = {"EQ": lambda a, b: a == b, "NE": lambda a, b: a != b, "LT": lambda a, b: a < b,
        "LE": lambda a, b: a <= b, "GT": lambda a, b: a > b, "GE": lambda a, b: a >= b}


def _imm(s: str) -> Optional[int]:
    s = s.strip()
    try:
        return int(s, 0)
    except ValueError:
        return None


def _lut(lut: int, a: int, b: int, c: int) -> int:
    """LOP3's three-input truth table applied bitwise (a, b, c as 32-bit values)."""
    out = 0
    for bit in range(32):
        x, y, z = (a >> bit) & 1, (b >> bit) & 1, (c >> bit) & 1
        out |= ((lut >> (x * 4 + y * 2 + z)) & 1) << bit
    return out


def _eval(ins: Instr, get) -> Optional[int]:
    """The value `ins` writes to its first destination for lane 0 of the warp being walked, with `get(operand)` the
    operands' known values (None: unknown); None where it is not a function of the thread index and immediates."""
    ops = [o.strip() for o in ins.operands]
    op = ins.op
    if op == "S2R" and len(ops) == 2:
        return get("<tid>") if ops[1] == "SR_TID.X" else (0 if ops[1] == "SR_LANEID" else None)
    if op in ("MOV", "UMOV", "R2UR") and len(ops) >= 2:
        return get(ops[1])
    if op == "IMAD" and "MOV" in ins.mods and len(ops) == 4:        # IMAD.MOV.U32 R, RZ, RZ, x
        return get(ops[3])
    if op == "SHFL" and "IDX" in ins.mods and len(ops) >= 4 and ops[3] in ("RZ", "0x0"):
        return get(ops[2])          # lane 0's value (lane 0 is the thread this evaluates)
    if op in ("SHF", "USHF") and len(ops) == 4:
        if "R" in ins.mods and ops[1] in ("RZ", "URZ"):          # SHF.R.U32.HI R, RZ, s, x: x >> s
            sh, x = get(ops[2]), get(ops[3])
            if sh is None or x is None:
                return None
            x &= 0xFFFFFFFF
            if "S32" in ins.mods and x >> 31:                     # SHF.R.S32.HI: the sign shifted in
                return ((x - (1 << 32)) >> sh) & 0xFFFFFFFF
            return x >> sh
        if "L" in ins.mods and ops[3] in ("RZ", "URZ"):          # SHF.L.U32 R, x, s, RZ: x << s
            x, sh = get(ops[1]), get(ops[2])
            return None if sh is None or x is None else (x << sh) & 0xFFFFFFFF
        return None
    if op in ("LEA", "ULEA") and "HI" in ins.mods and len(ops) == 5 and ops[3] in ("RZ", "URZ"):
        # LEA.HI R, a, b, RZ, s: b + the high word of a << s (a signed division's rounding term, `tid / 128`)
        a, b, sh = get(ops[1]), get(ops[2]), _imm(ops[4])
        return None if None in (a, b, sh) else (b + ((a & 0xFFFFFFFF) >> (32 - sh))) & 0xFFFFFFFF
    if op in ("LOP3", "ULOP3") and len(ops) >= 5:
        a, b, c, lut = get(ops[1]), get(ops[2]), get(ops[3]), _imm(ops[4])
        return None if None in (a, b, c, lut) else _lut(lut, a, b, c)
    if op in ("ISETP", "UISETP") and len(ops) >= 4:
        cmp = next((m for m in ins.mods if m in _CMP), None)
        a, b = get(ops[2]), get(ops[3])
        if cmp is None or a is None or b is None:
            return None
        if "U32" not in ins.mods:   # signed compare
            a, b = (a - (1 << 32) if a >= 1 << 31 else a), (b - (1 << 32) if b >= 1 << 31 else b)
        r = int(_CMP[cmp](a, b))
        if len(ops) >= 5 and ops[4].lstrip("!") not in ("PT", "UPT"):   # .AND with a third predicate
            c = get(ops[4])
            return None if c is None else r & c
        return r
    if op in ("PLOP3", "UPLOP3") and len(ops) >= 7:   # PLOP3.LUT P, PT, a, b, c, lut, 0x0
        a, b, c, lut = get(ops[2]), get(ops[3]), get(ops[4]), _imm(ops[5])
        return None if None in (a, b, c, lut) else _lut(lut, a, b, c) & 1
    return None


def _getter(env: dict, warp: int):
    def get(operand: str) -> Optional[int]:
        o = operand.strip()
        if o == "<tid>":
            return 32 * warp
        neg = o.startswith("!")
        o = o.lstrip("!")
        if o.endswith(".reuse"):   # an operand-reuse hint (`R2.reuse`) names the same register
            o = o[:-len(".reuse")]
        if o in ("RZ", "URZ"):
            return 0
        if o in ("PT", "UPT"):
            return 0 if neg else 1
        v = _imm(o)
        if v is None:
            v = env.get(o)
        return None if v is None else ((1 - v) if neg else v)
    return get


def _step(ins: Instr, env: dict, warp: int) -> None:
    """env after `ins`: what it writes is unknown, unless it is unpredicated and `_eval` computes it."""
    dsts = ins.regs_written()
    if ins.op in ("ISETP", "UISETP", "PLOP3", "UPLOP3") and ins.operands:
        dsts = [o.strip() for o in ins.operands[:2]]
    v = None if ins.pred or not dsts else _eval(ins, _getter(env, warp))   # (its sources before it writes)
    for r in dsts:
        env.pop(r, None)
    if v is not None and dsts[0] not in ("PT", "UPT", "RZ", "URZ"):
        env[dsts[0]] = v


def _branch_pred(ins: Instr) -> Optional[str]:
    """A branch's predicate: its guard (`@!P0 BRA`), or the predicate operand of a uniform branch
    (`BRA.U !UP0, target`); None for an unconditional branch."""
    if ins.pred:
        return ins.pred.lstrip("@")
    if ins.operands and re.fullmatch(r"!?U?P[0-6]", ins.operands[0].strip()):
        return ins.operands[0].strip()
    return None


def _decide(ins: Instr, env: dict, warp: int) -> Optional[bool]:
    """Whether the branch `ins` is taken by the warp (True for an unconditional one); None where unknown."""
    p = _branch_pred(ins)
    if p is None:
        return True
    v = _getter(env, warp)(p)
    return None if v is None else bool(v)


def reachable(f: Function, warp: int) -> set[int]:
    """Instruction indices warp `warp` can reach from the entry. The registers and predicates that are functions of
    the thread index are followed forward (values that differ where paths join become unknown); a branch they
    decide for the warp takes one edge, any other conditional branch both."""
    n = len(f.instrs)
    starts = set(f.labels.values())
    state: dict[int, dict] = {0: {}}
    todo = [0]
    seen: set[int] = set()

    def push(j: int, env: dict) -> None:
        if j not in state:
            state[j] = dict(env)
            todo.append(j)
            return
        merged = {k: v for k, v in state[j].items() if env.get(k) == v}
        if merged != state[j]:
            state[j] = merged
            todo.append(j)

    while todo:
        i = todo.pop()
        env = dict(state[i])
        while 0 <= i < n:
            seen.add(i)
            ins = f.instrs[i]
            if ins.op in ("EXIT", "RET") and (not ins.pred or _decide(ins, env, warp) is True):
                break   # unconditional, or a guarded exit the warp's own index decides (`@P0 EXIT`, P0 = warp != 8)
            if ins.op in ("BRA", "BRX", "JMP"):
                tgt = f.labels.get(ins.target) if ins.target else None
                taken = _decide(ins, env, warp)
                if tgt is not None and taken is not False:
                    push(tgt, env)
                if taken is True:   # unconditional, or decided: no fall-through
                    break
            else:
                _step(ins, env, warp)
            i += 1
            if i in starts:
                push(i, env)
                break
    return seen


@dataclass
class Role:
    name: str                    # "producer" | "math 0", "math 1", ...
    kind: str                    # "producer" (copies, no MMA) | "math"
    warps: tuple[int, ...]       # CTA warp indices that run it
    loop: Loop
    path: analysis.TilePath
    maxnreg: Optional[int]       # setmaxnreg's register count on the role's side, if any

    @property
    def mma_per_iter(self) -> int:
        return sum(i.op in MMA_OPS for i in self.path.instrs)

    @property
    def copies_per_iter(self) -> int:
        return sum(i.op in COPY_OPS for i in self.path.instrs)


def _induction_registers(f: Function, loop: Loop) -> set[str]:
    """Registers the loop body steps by an immediate (`IADD3 R, R, imm, ...`, `VIADD R, R, imm`): its counters."""
    out = set()
    for ins in f.instrs[loop.start:loop.end + 1]:
        ops = [o.strip() for o in ins.operands]
        if ins.op in ("IADD3", "VIADD", "UIADD3") and len(ops) >= 3 and not ins.pred and ops[0] in ops[1:3] \
                and any(_imm(o) is not None for o in ops[1:3]):
            out.add(ops[0])
    return out


def first_iteration_blocks(f: Function, loop: Loop) -> list[tuple[int, int]]:
    """Address ranges [lo, hi) of the loop body that only its first iteration runs: a forward branch over them taken
    when a counter of the loop is not zero (`ISETP.NE.AND P, PT, Rk, RZ` then `@P BRA`, or `.EQ` with `@!P BRA`),
    e.g. FlashMLA's `if (block_idx == 0) { first QK^T }`. A reading without markers would otherwise count them in
    every iteration."""
    ind = _induction_registers(f, loop)
    out = []
    for k in range(loop.start, loop.end):
        br = f.instrs[k]
        if br.op != "BRA" or not br.pred or br.target not in f.labels:
            continue
        tgt = f.labels[br.target]
        if not k < tgt <= loop.end:
            continue
        p = br.pred.lstrip("@!")
        d = next((f.instrs[j] for j in range(k - 1, loop.start - 1, -1) if p in f.instrs[j].regs_written()
                  or (f.instrs[j].operands and f.instrs[j].operands[0].strip() == p)), None)
        if d is None or d.op != "ISETP" or d.pred:
            continue
        ops = [o.strip() for o in d.operands]
        cmp = next((m for m in d.mods if m in ("EQ", "NE")), None)
        zero_test = len(ops) >= 4 and {ops[2], ops[3]} & {"RZ"} and ({ops[2], ops[3]} - {"RZ"}) & ind
        if zero_test and ((cmp == "NE" and not br.pred.startswith("@!")) or (cmp == "EQ" and br.pred.startswith("@!"))):
            out.append((f.instrs[k + 1].addr, f.instrs[tgt].addr))
    return out


def _without(path: analysis.TilePath, ranges: list[tuple[int, int]]) -> analysis.TilePath:
    if not ranges:
        return path
    keep = [k for k, i in enumerate(path.instrs) if not any(lo <= i.addr < hi for lo, hi in ranges)]
    path.excluded += len(path.instrs) - len(keep)
    path.instrs = [path.instrs[k] for k in keep]
    if path.bulk_lane:
        path.bulk_lane = [path.bulk_lane[k] for k in keep]
    path.bulk_sizes = {a: b for a, b in path.bulk_sizes.items() if any(i.addr == a for i in path.instrs)}
    return path


def _loop_paths(f: Function, bulk_lanes: int = 1) -> dict[tuple[int, int], tuple[Loop, analysis.TilePath]]:
    """Every loop whose per-iteration path can be read (inner loops' trip counts known), with that path; bulk
    waterfalls and try_wait retry loops are part of their enclosing loop, never candidates themselves."""
    out = {}
    for lp in f.loops():
        # (a loop whose closing predicate a try_wait inside it also writes is a retry loop only when it is short)
        if analysis.is_waterfall(f, lp) or (analysis.is_wait_loop(f, lp) and lp.end - lp.start <= 8):
            continue
        try:
            out[(lp.start, lp.end)] = (lp, _without(analysis.tile_path(f, lp, (), "", bulk_lanes=bulk_lanes),
                                                    first_iteration_blocks(f, lp)))
        except LookupError:
            continue
    return out


def _hot(loops: dict[tuple[int, int], tuple[Loop, analysis.TilePath]], within: set[int]) -> Optional[tuple[tuple[int, int], str]]:
    """The hot loop among those whose body lies in `within`: the most MMAs per iteration (innermost on a tie),
    else the most copies (a producer)."""
    best = None
    for key0, (lp, p) in loops.items():
        if lp.start not in within or lp.end not in within:
            continue
        mma = sum(i.op in MMA_OPS for i in p.instrs)
        cps = sum(i.op in COPY_OPS for i in p.instrs)
        key = (mma > 0, mma if mma else cps, -(lp.end - lp.start))
        if (mma or cps) and (best is None or key > best[0]):
            best = (key, key0, "math" if mma else "producer")
    return None if best is None else (best[1], best[2])


def find_roles(f: Function, threads: int, bulk_lanes: int = 1) -> list[Role]:
    """The roles of `f` launched with `threads` per CTA (see the module doc); [] if no loop has an MMA.
    `bulk_lanes`: the lanes of a warp that run a bulk copy's per-lane waterfall loop (1: one elected thread, the
    CUTLASS idiom; a producer warp copying one row per lane: its rows per tile)."""
    if threads < 32 or threads % 32:
        raise ValueError(f"threads must be a positive multiple of 32, got {threads}")
    loops = _loop_paths(f, bulk_lanes)
    setmax = [k for k, i in enumerate(f.instrs) if i.op == "USETMAXREG"]
    by_loop: dict[tuple[int, int], list[int]] = {}
    kind_of: dict[tuple[int, int], str] = {}
    regs_of: dict[tuple[int, int], set[int]] = {}
    for w in range(threads // 32):
        reach = reachable(f, w)
        hot = _hot(loops, reach)
        if hot is None:
            continue
        by_loop.setdefault(hot[0], []).append(w)
        kind_of[hot[0]] = hot[1]
        regs_of.setdefault(hot[0], set()).update(
            _imm(f.instrs[k].operands[-1]) for k in setmax if k in reach and _imm(f.instrs[k].operands[-1]))
    if not by_loop:
        return []
    if not any(kind_of[lp] == "math" for lp in by_loop):
        return []
    # setmaxnreg a role reaches and the others do not: its own register count
    shared = set.intersection(*regs_of.values()) if len(regs_of) > 1 else set()
    out, m = [], 0
    for key in sorted(by_loop, key=lambda x: (kind_of[x] != "math", x)):
        own = sorted(regs_of[key] - shared)
        name = "producer" if kind_of[key] == "producer" else f"math {m}"
        m += kind_of[key] == "math"
        lp, path = loops[key]
        out.append(Role(name, kind_of[key], tuple(by_loop[key]), lp, path, own[0] if len(own) == 1 else None))
    return out


def barrier_offset(ins: Instr) -> Optional[int]:
    """The immediate offset of an mbarrier operand `[URx+0xOFF]` (`[URx]`: 0) of a SYNCS or ARRIVES: which barrier of
    the kernel's shared-memory plan an arrive or wait names. This takes every mbarrier as addressed from one base,
    as a CUTLASS-style shared-storage struct is (FlashMLA's `plan`); None where the address is not register +
    immediate (`[Rx+URZ+0xOFF]`, the zero uniform register between them, counts as register + immediate, and so does
    `[Rx+URy+0xOFF]`: a register index over a row of barriers, such as Hopper v3 e4m3's slots, pair i's barriers at
    slot i % 2, is folded onto the row's first, which plays the same part in the one steady-state iteration the
    model simulates)."""
    for o in ins.operands:
        m = re.match(r"^\[\s*U?R\d+\s*(?:\+\s*(0x[0-9a-f]+|\d+)\s*)?\]$", o.strip())
        if m:
            return int(m.group(1), 0) if m.group(1) else 0
        m = re.match(r"^\[\s*R\d+\s*\+\s*UR(?:Z|\d+)\s*\+\s*(0x[0-9a-f]+|\d+)\s*\]$", o.strip())
        if m:
            return int(m.group(1), 0)
    return None


def named_barrier(ins: Instr) -> Optional[tuple[int, Optional[int], bool]]:
    """(id, thread count or None, waits) of `BAR.SYNC id[, count]` / `BAR.ARV id, count` / `BAR.RED...`, where the
    id is an immediate; None for other instructions or a register id."""
    if ins.op != "BAR":
        return None
    ops = [o.strip() for o in ins.operands]
    bid = _imm(ops[0]) if ops else 0
    if bid is None:
        return None
    count = _imm(ops[1]) if len(ops) > 1 else None
    return bid, count, "ARV" not in ins.mods
