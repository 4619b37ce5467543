"""SASS text -> instructions with registers, source lines and loops.

Input is `nvdisasm -c -gi` output of a cubin built with `-lineinfo`: each
instruction line `/*addr*/ [@pred] OPCODE operands ;`, labels `.L_x_N:`, and
`//## File "f", line n [inlined at ...]` comments whose last, un-inlined entry
names the kernel source line the instruction came from (the call site in the
kernel's own file, even when the code was inlined from a helper header).

What the model needs from each instruction: its opcode and modifiers, the
registers it writes and reads (with widths: `R164` of an LDSM.x4 is R164..R167),
its predicate, its branch target, and its source line. Loops are the ranges
closed by backward branches.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*$")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_FUNC = re.compile(r"^\s*\.text\.(\S+):\s*$")
_LINE = re.compile(r'^\s*//## File "([^"]+)", line (\d+)(\s+inlined at)?')
_TARGET = re.compile(r"`?\((\.L_x_\d+)\)")
_REG = re.compile(r"^(!?)(U?R\d+|U?RZ|U?P\d+|U?PT|SR_\w+|SRZ|B\d+)(\.reuse)?(\.64|\.U32|\.H1|\.H0|\.F16x2|\.B\d+)?$")

# opcodes that write no register (stores, barriers, control, async copies)
_NO_DST = {"STS", "STG", "ST", "STL", "RED", "REDG", "REDUX", "BAR", "BRA", "BRX", "EXIT", "RET", "CALL", "DEPBAR",
           "LDGDEPBAR", "NOP", "BSSY", "BSYNC", "WARPSYNC", "MEMBAR", "FENCE", "CCTL", "LDGSTS", "ERRBAR", "YIELD",
           "ARRIVES", "UCGABAR_ARV", "UCGABAR_WAIT", "CGAERRBAR", "SYNCS", "STAS", "UTMACCTL", "BPT", "KILL",
           "PREEXIT", "ACQBULK", "UBLKCP", "UTMALDG", "UTMASTG", "UTMAPF", "UTMACMDFLUSH", "STSM"}
# compare-style opcodes: the first two operands are predicate destinations
_SETP = re.compile(r"^U?(I|F|D|H|HF|P|B)?SETP|^UISETP|^PLOP3|^FCHK|^HSETP2")


@dataclass
class Instr:
    addr: int
    opcode: str              # full mnemonic with modifiers: "HMMA.16816.F32.BF16"
    operands: list[str]
    pred: Optional[str]      # "@P0", "@!P1" or None
    line: Optional[int]      # kernel source line (outermost inline frame)
    file: Optional[str]
    label: Optional[str] = None          # label naming this address, if any
    dsts: list[tuple[str, int]] = field(default_factory=list)   # (first register, width)
    srcs: list[tuple[str, int]] = field(default_factory=list)
    frames: tuple[tuple[str, int], ...] = ()  # every (file, line) of its inline chain, innermost first

    @property
    def op(self) -> str:
        return self.opcode.split(".", 1)[0]

    @property
    def mods(self) -> list[str]:
        return self.opcode.split(".")[1:]

    @property
    def target(self) -> Optional[str]:
        for o in self.operands:
            m = _TARGET.search(o)
            if m:
                return m.group(1)
        return None

    def regs_written(self) -> list[str]:
        return [r for base, w in self.dsts for r in _expand(base, w)]

    def regs_read(self) -> list[str]:
        out = [r for base, w in self.srcs for r in _expand(base, w)]
        if self.pred:
            out.append(self.pred.lstrip("@!"))
        return out


@dataclass
class Function:
    name: str
    instrs: list[Instr]
    labels: dict[str, int]   # label -> index into instrs

    def index_of_label(self, label: str) -> int:
        return self.labels[label]

    def loops(self) -> list["Loop"]:
        """Every backward branch closes a loop [target, branch] (indices into instrs), except the return jump of
        an out-of-line mbarrier try_wait retry (`_is_retry_return`)."""
        out = []
        for i, ins in enumerate(self.instrs):
            if ins.op in ("BRA", "BRX") and ins.target is not None and ins.target in self.labels:
                t = self.labels[ins.target]
                if t <= i and not self._is_retry_return(t, i):
                    out.append(Loop(t, i, ins))
        return out

    def _is_retry_return(self, t: int, i: int) -> bool:
        """nvcc places an mbarrier try_wait's retry loop out of line: `@!P0 BRA .L_retry` after the first
        `SYNCS.PHASECHK...TRYWAIT`, and at the function's end `.L_retry: TRYWAIT; @!P0 BRA .L_retry; BRA .L_back`,
        .L_back the instruction after the forward branch. That unconditional jump back is no loop of the code
        between .L_back and the retry block: it is taken once, when the wait succeeds."""
        br = self.instrs[i]
        if br.pred or t == 0:
            return False
        out = self.instrs[t - 1]
        if out.op != "BRA" or not out.pred or out.target not in self.labels:
            return False
        k = self.labels[out.target]
        return t <= k <= i and any(x.op == "SYNCS" and "PHASECHK" in x.mods for x in self.instrs[k:i + 1])


@dataclass(frozen=True)
class Loop:
    start: int     # first instruction of the body (branch target)
    end: int       # the backward branch itself
    branch: Instr

    def contains(self, other: "Loop") -> bool:
        return self.start <= other.start and other.end <= self.end and self != other


def _is_zero(reg: str) -> bool:
    return reg in ("RZ", "URZ", "PT", "UPT", "SRZ")


def _expand(base: str, width: int) -> list[str]:
    if _is_zero(base) or width <= 0:
        return []
    m = re.match(r"^(U?R)(\d+)$", base)
    if not m:
        return [base]
    return [f"{m.group(1)}{int(m.group(2)) + k}" for k in range(width)]


def _reg_of(operand: str) -> Optional[tuple[str, bool]]:
    """(register, is_64bit) of a plain register operand, else None."""
    o = operand.strip().lstrip("-|~").rstrip("|")
    m = _REG.match(o)
    if not m:
        return None
    return m.group(2), m.group(4) == ".64"


def _mem_regs(operand: str) -> list[tuple[str, int]]:
    """Registers read by an address operand `[R2.64+0x10]`, `[R1+UR4]`, `desc[UR18][R2.64]`."""
    out = []
    for inner in re.findall(r"\[([^\]]*)\]", operand):
        for part in re.split(r"[+\-]", inner):
            r = _reg_of(part.strip())
            if r and not _is_zero(r[0]):
                out.append((r[0], 2 if r[1] else 1))
    return out


def _data_width(ins_opcode: str) -> int:
    """Registers moved per lane by a load/store/shared-matrix opcode."""
    mods = ins_opcode.split(".")
    op = mods[0]
    if op == "LDSM":
        # LDSM.16.M88.4 / LDSM.16.MT88.2 / LDSM.16.M88 (x1)
        n = mods[-1] if mods[-1] in ("1", "2", "4") else (mods[-2] if len(mods) > 2 and mods[-2] in ("1", "2", "4")
                                                         else "1")
        return int(n)
    for m in mods[1:]:
        if m == "128":
            return 4
        if m == "64":
            return 2
    return 1


def _mma_widths(opcode: str) -> tuple[int, int, int, int]:
    """(D, A, B, C) register widths of an HMMA/QMMA/IMMA."""
    mods = opcode.split(".")
    shape = mods[1] if len(mods) > 1 else ""
    f16_acc = "F32" not in mods and opcode.startswith("HMMA")
    acc = 2 if f16_acc else 4
    if shape in ("16816", "16832", "168128", "16864"):
        return acc, 4, 2, acc
    if shape == "1688":
        return acc, 2, 1, acc
    if shape == "884":
        return 8 if not f16_acc else 4, 2, 2, 8 if not f16_acc else 4
    return acc, 4, 2, acc


# wgmma.mma_async in SASS: HGMMA (16-bit and tf32 operands), QGMMA (e4m3 / e5m2: k32, the same 32 bytes of K per
# instruction at twice the 16-bit FLOP rate). The model reads both alike ("HGMMA" in its prose means either).
GMMA_OPS = ("HGMMA", "QGMMA")


def hgmma_shape(opcode: str) -> tuple[int, int, int]:
    """(M, N, K) of an HGMMA / QGMMA mnemonic: `HGMMA.64x256x16.F32.BF16` -> (64, 256, 16),
    `QGMMA.64x32x32.F32.E4M3.E4M3` -> (64, 32, 32)."""
    m = re.match(r"^[HQ]GMMA\.(\d+)x(\d+)x(\d+)", opcode)
    if not m:
        raise ValueError(f"not an HGMMA mnemonic with an MxNxK shape: {opcode!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def _decode_hgmma(ins: Instr) -> None:
    """HGMMA (sm_90a wgmma.mma_async) operands: `D, [A regs,] gdesc[URx], C[, UPp][, gsb0]`.

    D and C are the thread's accumulator fragment: N / 2 registers for fp32 accumulators (64 x N over 128
    threads), N / 4 for f16 ones. A from registers (RS form) is 4 registers (16 x 32 bytes of a warp's rows);
    `gdesc[URx]` reads the descriptor pair URx..URx+3 (A's and B's 64-bit descriptors; the RS form uses B's)."""
    _, n, _ = hgmma_shape(ins.opcode)
    acc = n // 2 if "F32" in ins.mods or "S32" in ins.mods else n // 4
    ops = ins.operands
    d = _reg_of(ops[0]) if ops else None
    if d and not _is_zero(d[0]):
        ins.dsts = [(d[0], acc)]
    for i, o in enumerate(ops[1:], start=1):
        if o.startswith("gdesc["):
            ins.srcs += [(r, 4) for r, _ in _mem_regs(o)]
            continue
        r = _reg_of(o)
        if r is None or _is_zero(r[0]):
            continue
        if r[0].startswith(("P", "UP")):
            ins.srcs.append((r[0], 1))
        elif i == 1:  # A fragment (RS form)
            ins.srcs.append((r[0], 4))
        else:  # C
            ins.srcs.append((r[0], acc))


def _decode_syncs(ins: Instr) -> None:
    """SYNCS (sm_90+ mbarrier operations): `SYNCS.EXCH.64 URZ, [UR6], UR4` (mbarrier.init), `SYNCS.ARRIVE.TRANS64
    RZ, [UR11], R8` (arrive.expect_tx: R8 bytes; `.A1T0` etc. a plain arrive), `SYNCS.PHASECHK.TRANS64.TRYWAIT P0,
    [UR11], R17` (try_wait.parity: P0 = the phase completed). The first operand, outside brackets, is written (the
    predicate of a PHASECHK, the state of an arrive / exchange); the barrier address and the rest are read."""
    for i, o in enumerate(ins.operands):
        if "[" in o:
            ins.srcs += _mem_regs(o)
            continue
        r = _reg_of(o)
        if r is None or _is_zero(r[0]):
            continue
        if i == 0:
            ins.dsts.append((r[0], 2 if ("64" in ins.mods and not r[0].startswith(("P", "UP"))
                                         and "PHASECHK" not in ins.mods) else 1))
        else:
            ins.srcs.append((r[0], 2 if r[1] else 1))


def _decode_ublkcp(ins: Instr) -> None:
    """UBLKCP (cp.async.bulk, global -> shared): `UBLKCP.S.G [URd], [URs], URn`. Uniform operands: URd..URd+1 the
    shared destination and the mbarrier address (nvcc moves both with R2UR right before it), URs..URs+1 the 64-bit
    global source, URn the size in 16-byte units. Writes no register."""
    for o in ins.operands:
        if "[" in o:
            ins.srcs += [(r, 2) for r, _ in _mem_regs(o)]
            continue
        r = _reg_of(o)
        if r and not _is_zero(r[0]):
            ins.srcs.append((r[0], 1))


def decode_registers(ins: Instr) -> None:
    """Fill ins.dsts / ins.srcs from its opcode and operands."""
    op, ops = ins.op, ins.operands
    if op in GMMA_OPS:
        _decode_hgmma(ins)
        return
    if op in ("HMMA", "QMMA", "IMMA", "OMMA", "BMMA"):
        wd, wa, wb, wc = _mma_widths(ins.opcode)
        regs = [_reg_of(o) for o in ops[:4]]
        if all(regs):
            ins.dsts = [(regs[0][0], wd)]
            ins.srcs = [(regs[1][0], wa), (regs[2][0], wb), (regs[3][0], wc)]
            ins.srcs += [(r[0], 1) for r in (_reg_of(o) for o in ops[4:]) if r]
        return
    if op == "SYNCS":
        _decode_syncs(ins)
        return
    if op == "UBLKCP":
        _decode_ublkcp(ins)
        return
    if op in _NO_DST:
        w = _data_width(ins.opcode) if op in ("STS", "STG", "ST", "STL", "RED", "REDG") else 1
        for i, o in enumerate(ops):
            ins.srcs += _mem_regs(o)
            r = _reg_of(o)
            if r and not _is_zero(r[0]) and "[" not in o:
                ins.srcs.append((r[0], w if (i == len(ops) - 1 and w > 1) else (2 if r[1] else 1)))
        return
    ndst = 1
    if _SETP.match(op):
        ndst = 2
    elif ops and (_reg_of(ops[0]) or ("", False))[0].startswith(("P", "UP")) and op in ("SHFL", "LOP3", "ULOP3",
                                                                                         "VOTE", "VOTEU", "R2P"):
        ndst = 2
    else:
        # carry-out predicates right after the destination (IADD3 R0, P0, PT, ...; LEA R2, P1, ...)
        k = 1
        while k < len(ops) and (_reg_of(ops[k]) or ("", False))[0].startswith(("P", "UP")) and op in (
                "IADD3", "UIADD3", "LEA", "ULEA", "IMAD", "IADD", "UIADD", "IABS", "ISCADD"):
            k += 1
            if op in ("IMAD",):
                break
        ndst = k
    wload = _data_width(ins.opcode) if op in ("LDS", "LDG", "LD", "LDL", "LDSM", "LDC", "ULDC", "LDCU", "ATOMS",
                                              "ATOMG", "ATOM", "LDGSTS") else 1
    for i, o in enumerate(ops):
        if i < ndst:
            r = _reg_of(o)
            if r and not _is_zero(r[0]):
                w = wload if wload > 1 else (2 if (r[1] or ins.opcode.startswith(("IMAD.WIDE", "CS2R", "MOV.64",
                                                                                    "IADD.64", "LDCU.64", "LDC.64",
                                                                                    "ULDC.64", "UMOV.64")))
                                             else 1)
                ins.dsts.append((r[0], w))
            continue
        ins.srcs += _mem_regs(o)
        r = _reg_of(o)
        if r and not _is_zero(r[0]) and "[" not in o:
            wide = r[1] or (op == "IMAD" and "WIDE" in ins.opcode and i == len(ops) - 1)
            ins.srcs.append((r[0], 2 if wide else 1))


def parse(text: str, kernel_file_suffix: Optional[str] = None) -> dict[str, Function]:
    """Parse `nvdisasm -c -gi` text into functions (by mangled name).

    The source line of an instruction is the last `//## File` comment before it
    that is not an inlined frame (the outermost call site); instructions with no
    comment of their own keep the previous one's line.
    """
    funcs: dict[str, Function] = {}
    cur: Optional[Function] = None
    line: Optional[int] = None
    file: Optional[str] = None
    frames: list[tuple[str, int]] = []
    chain_open = False  # the previous line was a //## comment: the next comment extends the same chain
    pending_labels: list[str] = []
    for raw in text.splitlines():
        m = _FUNC.match(raw)
        if m:
            cur = Function(m.group(1), [], {})
            funcs[cur.name] = cur
            line, file, pending_labels = None, None, []
            continue
        if cur is None:
            continue
        m = _LINE.match(raw)
        if m:
            if not chain_open:
                frames = []
            chain_open = True
            frames.append((os.path.normpath(m.group(1)), int(m.group(2))))
            if not m.group(3):  # outermost frame
                file, line = os.path.normpath(m.group(1)), int(m.group(2))
            continue
        chain_open = False
        m = _LABEL.match(raw)
        if m:
            pending_labels.append(m.group(1))
            continue
        m = _INSTR.match(raw)
        if not m:
            continue
        body = m.group(2).strip()
        pred = None
        if body.startswith("@"):
            pred, body = body.split(None, 1)
        parts = body.split(None, 1)
        opcode = parts[0]
        operands = [o.strip() for o in _split_operands(parts[1])] if len(parts) > 1 else []
        ins = Instr(int(m.group(1), 16), opcode, operands, pred, line, file, frames=tuple(frames))
        for lb in pending_labels:
            cur.labels[lb] = len(cur.instrs)
            ins.label = lb
        pending_labels = []
        decode_registers(ins)
        cur.instrs.append(ins)
    return funcs


def _split_operands(s: str) -> list[str]:
    """Split on commas outside brackets."""
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return out


# ------------------------------------------------------------------ tools

def find_tool(name: str) -> Optional[str]:
    """cuobjdump / nvdisasm: on PATH, in the toolkit, or in the nvidia-cuda-* wheels' bin folders."""
    p = shutil.which(name)
    if p:
        return p
    cands = []
    try:
        import nvidia  # namespace package of the nvidia-cuda-* wheels
        for base in getattr(nvidia, "__path__", []):
            cands += sorted(Path(base).glob(f"*/bin/{name}"))
    except ImportError:
        pass
    home = os.environ.get("CUDA_HOME")
    if home:
        cands.append(Path(home) / "bin" / name)
    for c in cands:
        if c.exists() and os.access(c, os.X_OK):
            return str(c)
    return None


def disassemble(cubin: Path) -> str:
    tool = find_tool("nvdisasm")
    if tool is None:
        raise RuntimeError("nvdisasm not found: `pip install nvidia-cuda-nvdisasm` (the project's setup.py "
                           "installs it) or put the CUDA toolkit's nvdisasm on PATH")
    r = subprocess.run([tool, "-c", "-gi", str(cubin)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nvdisasm failed on {cubin}: {r.stderr[-2000:]}")
    return r.stdout
