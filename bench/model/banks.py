"""Shared-memory bank conflicts from the kernel's own address arithmetic: wavefronts, not instructions.

For every LDS / STS / LDSM of a kernel, the 32 lanes' shared-memory addresses are evaluated from its SASS: a
per-lane interpreter walks the function from its entry in program order, twice (fall-through; the second
walk starts from the registers the first left, so loop-carried values are there; the loops' own increments
are uniform and do not move one lane against another) and keeps each register as
  known per-lane values + at most one unknown that is the same on every lane (a CTA's base, a stage offset),
or as unresolved. Thread ids come from S2R SR_TID.X / SR_LANEID (the warp's lanes, for warps 0..W-1); uniform
registers, constants and block ids are the same-on-every-lane unknown. A uniform offset moves every lane's bank
alike, so the conflict degree depends only on the known per-lane parts.

Wavefronts per warp instruction, the hardware's rule: 32-bit accesses are served as one 32-lane phase,
64-bit as two 16-lane phases, 128-bit as four 8-lane phases; an LDSM serves each 8x8 matrix (eight 16-byte
rows, one per lane of its group of 8) as one phase. A phase takes as many wavefronts as the most distinct
4-byte words any of the 32 banks holds (the same word read twice is a broadcast). degree = wavefronts / the
conflict-free count; an access the interpreter cannot resolve is taken as conflict-free and counted as
unresolved. The wgmma descriptor reads are not analysed here: the no-swizzle core-matrix layout the kernels
use is conflict-free by construction (PTX ISA, 'Shared Memory Matrix Layout'), which NOTES.md states as an
assumption.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from .sass import Function, Instr

MASK = (1 << 32) - 1
LANES = 32


@dataclass(frozen=True)
class Val:
    lanes: tuple[int, ...]   # the known per-lane part (mod 2^32)
    uniform: bool = False    # plus one unknown that is the same on every lane

    @property
    def is_uniform(self) -> bool:
        return len(set(self.lanes)) == 1


UNKNOWN = None   # not affine in the lanes: unresolved


def const(c: int, uniform: bool = False) -> Val:
    return Val((c & MASK,) * LANES, uniform)


def _imm(s: str) -> Optional[int]:
    s = s.strip()
    neg = s.startswith("-")
    s = s.lstrip("-")
    try:
        v = int(s, 16) if s.lower().startswith("0x") else int(s)
    except ValueError:
        return None
    return -v if neg else v


def _add(*vals: Optional[Val]) -> Optional[Val]:
    if any(v is UNKNOWN for v in vals):
        return UNKNOWN
    lanes = tuple(sum(v.lanes[i] for v in vals) & MASK for i in range(LANES))
    return Val(lanes, any(v.uniform for v in vals))


def _neg(v: Optional[Val]) -> Optional[Val]:
    if v is UNKNOWN:
        return UNKNOWN
    return Val(tuple((-x) & MASK for x in v.lanes), v.uniform)


def _mul(a: Optional[Val], b: Optional[Val]) -> Optional[Val]:
    if a is UNKNOWN or b is UNKNOWN:
        return UNKNOWN
    if a.uniform and b.uniform:
        return const(0, True) if a.is_uniform and b.is_uniform else UNKNOWN
    if a.uniform or b.uniform:  # (u + x) * c: affine only when c is a plain constant
        u, c = (a, b) if a.uniform else (b, a)
        if c.is_uniform and not c.uniform:
            return Val(tuple((x * c.lanes[0]) & MASK for x in u.lanes), True)
        return UNKNOWN
    return Val(tuple((x * y) & MASK for x, y in zip(a.lanes, b.lanes)))


def _bitwise(fn, *vals: Optional[Val]) -> Optional[Val]:
    """A per-lane function of known values; with a uniform unknown only if every operand is lane-invariant."""
    if any(v is UNKNOWN for v in vals):
        return UNKNOWN
    if any(v.uniform for v in vals):
        return const(0, True) if all(v.is_uniform for v in vals) else UNKNOWN
    return Val(tuple(fn(*(v.lanes[i] for v in vals)) & MASK for i in range(LANES)))


def _lut(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for bit in range(32):
        idx = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)
        out |= ((lut >> idx) & 1) << bit
    return out


_REGNAME = re.compile(r"^(-?)(U?R(?:\d+|Z))(?:\.reuse)?(?:\.(?:64|U32|H0|H1|B\d|X\d))*$")


class Lanes:
    """The per-lane register file of one warp, advanced instruction by instruction."""

    def __init__(self, warp: int):
        self.warp = warp
        self.regs: dict[str, Optional[Val]] = {}

    def get(self, operand: str) -> Optional[Val]:
        o = operand.strip()
        o = o[1:] if o.startswith("|") else o
        imm = _imm(o)
        if imm is not None:
            return const(imm)
        m = _REGNAME.match(o)
        if not m:
            if o.startswith("c[") or o.startswith("UR") or o.startswith("SR_CTAID"):
                return const(0, True)
            return UNKNOWN
        neg, r = m.group(1), m.group(2)
        if r in ("RZ", "URZ"):
            v = const(0)
        elif r.startswith("UR"):
            v = self.regs.get(r, const(0, True))
        else:
            v = self.regs.get(r, UNKNOWN)
        return _neg(v) if neg else v

    def set(self, reg: str, v: Optional[Val]) -> None:
        if reg in ("RZ", "URZ"):
            return
        self.regs[reg] = v

    def step(self, ins: Instr) -> None:
        op, mods, ops = ins.op, ins.mods, ins.operands
        dst = ops[0].split(".")[0] if ops else ""
        written = ins.regs_written()
        try:
            v = self._eval(op, mods, ops)
        except (IndexError, ValueError):
            v = UNKNOWN
        for r in written:
            self.set(r, UNKNOWN)
        if v is not UNKNOWN or (dst in written):
            if dst.startswith("R") or dst.startswith("UR"):
                if dst.startswith("UR") and v is not UNKNOWN and not v.is_uniform:
                    v = const(0, True)
                self.set(dst, v)

    def _eval(self, op: str, mods: list[str], ops: list[str]) -> Optional[Val]:
        g = self.get
        if op == "CS2R":
            return const(0) if ops[1] == "SRZ" else UNKNOWN
        if op in ("IMNMX", "VIMNMX"):
            if len(ops) < 4 or ops[3] not in ("PT", "!PT"):
                return UNKNOWN
            fn = min if ops[3] == "PT" else max
            return _bitwise(lambda x, y: fn(x, y), g(ops[1]), g(ops[2]))
        if op == "S2R":
            sr = ops[1]
            if sr == "SR_TID.X":
                return Val(tuple(32 * self.warp + i for i in range(LANES)))
            if sr == "SR_LANEID":
                return Val(tuple(range(LANES)))
            return const(0, True) if sr.startswith("SR_CTAID") or sr.startswith("SR_TID") else UNKNOWN
        if op in ("S2UR", "ULDC", "LDC", "UMOV", "R2UR", "ULEA", "UIADD3", "UIMAD", "USHF", "ULOP3", "USEL",
                  "UFLO", "UPOPC", "UBREV", "UIMNMX", "UISETP", "UPRMT", "ULDCU", "LDCU", "S2UR"):
            return const(0, True)
        if op == "MOV":
            return g(ops[1])
        if op == "IMAD":
            if "MOV" in mods:
                return g(ops[3]) if len(ops) > 3 else g(ops[1])
            if "SHL" in mods:   # IMAD.SHL.U32 d, a, 2^k, RZ: a multiply by the power of two (a shift's hint)
                return _add(_mul(g(ops[1]), g(ops[2])), g(ops[3]))
            if "IADD" in mods:
                return _add(g(ops[1]), g(ops[3]))
            if "HI" in mods:   # the high word of a*b, plus c: the compiler's division by a constant
                signed = "U32" not in mods
                def hi(x, y, z):
                    if signed:
                        x = x - (1 << 32) if x >> 31 else x
                        y = y - (1 << 32) if y >> 31 else y
                    return ((x * y) >> 32) + z
                return _bitwise(hi, g(ops[1]), g(ops[2]), g(ops[3]))
            return _add(_mul(g(ops[1]), g(ops[2])), g(ops[3]))   # (.WIDE: the low word)
        if op == "IADD3":
            srcs = [o for o in ops[1:] if not o.startswith("P") and not o.startswith("!P")
                    and o not in ("PT", "!PT")]
            return _add(*(g(o) for o in srcs[-3:]))
        if op == "VIADD":
            return _add(g(ops[1]), g(ops[2]))
        if op == "LEA":
            srcs = [o for o in ops[1:] if not o.startswith("P") and o not in ("PT", "!PT")]
            if "HI" in mods:   # LEA.HI d, a, b, c, s: b + the high word of (c:a) << s (signed division's rounding)
                s_ = _imm(srcs[-1])
                if s_ is None or len(srcs) < 4:
                    return UNKNOWN
                return _bitwise(lambda a, b, c: b + (a >> (32 - s_)) + (c << s_), g(srcs[0]), g(srcs[1]),
                                g(srcs[2]))
            a, b, s = srcs[0], srcs[1], _imm(srcs[2])
            return _add(_mul(g(a), const(1 << s)), g(b)) if s is not None else UNKNOWN
        if op == "SHF":
            a, s, b = ops[1], _imm(ops[2]), ops[3]
            if s is None:
                return UNKNOWN
            if "L" in mods:   # (b:a) << s, low word: a << s when b's bits do not enter (b = RZ or s = 0)
                return _mul(g(a), const(1 << s)) if b in ("RZ",) or s == 0 else UNKNOWN
            # right shifts: SHF.R.[US]32.HI d, RZ, s, b  -> b >> s
            src = g(b) if a == "RZ" else UNKNOWN
            return _bitwise(lambda x: (x >> s) if "U32" in mods else ((x - (1 << 32) if x >> 31 else x) >> s), src)
        if op == "LOP3":
            a, b, c, lut = g(ops[1]), g(ops[2]), g(ops[3]), _imm(ops[4])
            if lut is None:
                return UNKNOWN
            return _bitwise(lambda x, y, z: _lut(x, y, z, lut), a, b, c)
        if op in ("IABS", "SEL", "SGXT", "BFE", "BFI", "PRMT", "FLO", "POPC", "BREV", "IMUL"):
            return UNKNOWN
        return UNKNOWN


def address(lanes: Lanes, operand: str) -> Optional[Val]:
    """The lanes' byte address of a shared-memory operand `[R12+UR4+0x80]`."""
    m = re.match(r"^\[(.*)\]$", operand.strip())
    if not m:
        return UNKNOWN
    parts = [p for p in re.split(r"\+", m.group(1).replace("-", "+-")) if p.strip()]
    vals = [lanes.get(p) for p in parts]
    return _add(*vals) if vals else UNKNOWN


def access_of(ins: Instr) -> Optional[tuple[str, int, str]]:
    """(kind, bytes per lane, address operand) of a shared-memory access, else None."""
    if ins.op in ("LDS", "STS"):
        width = 16 if "128" in ins.mods else 8 if "64" in ins.mods else 4
        addr = ins.operands[1] if ins.op == "LDS" else ins.operands[0]
        return ins.op, width, addr
    if ins.op == "LDSM":
        n = 4 if ins.mods and ins.mods[-1] == "4" else 2 if ins.mods and ins.mods[-1] == "2" else 1
        return "LDSM", n, ins.operands[1]
    return None


def wavefronts(kind: str, width: int, addr: tuple[int, ...]) -> tuple[int, int]:
    """(wavefronts, conflict-free wavefronts) of one warp access at the lanes' byte addresses."""
    if kind == "LDSM":
        groups = [list(range(8 * m, 8 * m + 8)) for m in range(width)]   # one 8x8 matrix per 8 lanes
        row_bytes = 16
    else:
        per = {4: 32, 8: 16, 16: 8}[width]
        groups = [list(range(p, p + per)) for p in range(0, LANES, per)]
        row_bytes = width
    total = 0
    for g in groups:
        banks: dict[int, set[int]] = {}
        for lane in g:
            for w in range(row_bytes // 4):
                word = (addr[lane] + 4 * w) // 4
                banks.setdefault(word % 32, set()).add(word)
        total += max(len(v) for v in banks.values())
    return total, len(groups) * max(1, (row_bytes * len(groups[0])) // 128)


@dataclass
class Access:
    addr: int          # instruction address
    line: Optional[int]
    opcode: str
    degree: float      # wavefronts / conflict-free wavefronts, worst over the warps evaluated
    resolved: bool


def conflicts(f: Function, warps: int = 8) -> dict[int, Access]:
    """Every shared-memory access of `f` with its conflict degree (max over warps 0..warps-1). The function is
    walked twice: a register a loop reads before the loop's own code redefines it (an induction variable,
    carried by the back edge) has, on the second walk, the value the first walk left in it."""
    out: dict[int, Access] = {}
    for w in range(max(1, warps)):
        lanes = Lanes(w)
        for ins in f.instrs:   # first walk: the values loops carry
            lanes.step(ins)
        for ins in f.instrs:
            acc = access_of(ins)
            if acc is not None:
                kind, width, op = acc
                a = address(lanes, op)
                if a is UNKNOWN:
                    deg, ok = 1.0, False
                else:
                    wf, ideal = wavefronts(kind, width, a.lanes)
                    deg, ok = wf / ideal, True
                prev = out.get(ins.addr)
                if prev is None or deg > prev.degree:
                    out[ins.addr] = Access(ins.addr, ins.line, ins.opcode, deg, ok if prev is None else prev.resolved
                                           and ok)
            lanes.step(ins)
    return out
