"""Where a kernel's registers peak: live vector registers per SASS instruction, by source line.

ptxas reports one number a kernel ("Used 96 registers", and spill bytes when the code does not fit). When a tile
spills, the question is where: which source line holds the most values live at once. This reads the SASS
(`nvdisasm -c -gi` of a cubin built with -lineinfo, as the model does), builds the control-flow graph from the
branches and solves the usual backward dataflow for the vector registers R0..R254 (uniform and predicate registers
have files of their own and are not counted).

How it counts:
- A predicated write does not end the old value's life (it survives where the predicate is false).
- CALL falls through: the registers the called subroutine (an IEEE division's slow path, say) uses are not counted.
  A CALL in a hot loop is worth a look when a tile spills: its calling convention pins registers.
- The count is after each instruction (its live-out), so a value read for the last time there is not counted.
- It counts the code as ptxas scheduled it, spill code included: a spilled value is not live between its store and
  its reload.

    python -m bench.model.regs mla576x656_bf16_page1 --arch sm_90a --function 'ILi16ELi4ELi2ELi2ELi1ELi2ELi4E'
    python -m bench.model.regs path/to/kernel.cubin --top 20 --around 0x8f10

A stem names an instantiation file (csrc/tree_verify/instantiations/<stem>.cu), built by the model's cached build.
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import sass

_VREG = re.compile(r"R\d+")


@dataclass(frozen=True)
class Liveness:
    function: sass.Function
    live_out: tuple[frozenset, ...]  # per instruction, the vector registers live after it

    @property
    def peak(self) -> int:
        return max((len(x) for x in self.live_out), default=0)

    def peak_index(self) -> int:
        return max(range(len(self.live_out)), key=lambda i: len(self.live_out[i]))

    def by_line(self, inner: bool = False) -> list[tuple[Optional[str], Optional[int], int]]:
        """(file, line, the most registers live after any of its instructions), most first. A line is the kernel's
        own (the outermost inline frame: a lambda's call site), or with `inner` the innermost frame outside
        csrc/arch (the line in the lambda itself)."""
        top: dict[tuple[Optional[str], Optional[int]], int] = collections.defaultdict(int)
        for ins, live in zip(self.function.instrs, self.live_out):
            k = (ins.file, ins.line)
            if inner:
                k = next(((fl, ln) for fl, ln in ins.frames if "/arch/" not in fl.replace("\\", "/")), k)
            top[k] = max(top[k], len(live))
        return sorted(((f, ln, n) for (f, ln), n in top.items()), key=lambda t: (-t[2], t[1] or 0))


def _successors(f: sass.Function) -> list[list[int]]:
    n, out = len(f.instrs), []
    for i, ins in enumerate(f.instrs):
        nxt = [i + 1] if i + 1 < n else []
        if ins.op in ("BRA", "BRX") and ins.target is not None and ins.target in f.labels:
            out.append([f.labels[ins.target]] + (nxt if ins.pred else []))
        elif ins.op in ("EXIT", "RET", "BRA", "BRX"):  # (a BRX without a known target: no successor we can name)
            out.append(nxt if ins.pred else [])
        else:
            out.append(nxt)
    return out


def liveness(f: sass.Function) -> Liveness:
    """Live vector registers after each instruction of `f` (backward dataflow to a fixed point)."""
    n = len(f.instrs)
    succ = _successors(f)
    use = [frozenset(r for r in ins.regs_read() if _VREG.fullmatch(r)) for ins in f.instrs]
    kill = [frozenset() if ins.pred else frozenset(r for r in ins.regs_written() if _VREG.fullmatch(r))
            for ins in f.instrs]
    live_in: list[frozenset] = [frozenset()] * n
    changed = True
    while changed:
        changed = False
        for i in range(n - 1, -1, -1):
            out = frozenset().union(*(live_in[s] for s in succ[i])) if succ[i] else frozenset()
            new = (out - kill[i]) | use[i]
            if new != live_in[i]:
                live_in[i], changed = new, True
    live_out = tuple(frozenset().union(*(live_in[s] for s in succ[i])) if succ[i] else frozenset()
                     for i in range(n))
    return Liveness(f, live_out)


def _source_text(path: Optional[str], line: Optional[int]) -> str:
    if not path or not line:
        return ""
    try:
        return Path(path).read_text().splitlines()[line - 1].strip()
    except (OSError, IndexError):
        return ""


def report(lv: Liveness, top: int = 12, around: Optional[int] = None, window: int = 12,
           inner: bool = False) -> list[str]:
    """The peak, the CALLs, the `top` source lines by registers live, and (`around`) the instructions near an
    address with the count after each."""
    f = lv.function
    i = lv.peak_index() if f.instrs else None
    out = [f"{f.name}", f"  peak: {lv.peak} vector registers live"
           + (f" after /*{f.instrs[i].addr:04x}*/ {f.instrs[i].opcode} (line {f.instrs[i].line})" if i is not None
              else "")]
    calls = [ins for ins in f.instrs if ins.op == "CALL"]
    if calls:
        out.append(f"  {len(calls)} CALL(s) (the registers their subroutines use are not counted): "
                   + ", ".join(f"/*{c.addr:04x}*/ line {c.line}" for c in calls[:8]) + (" ..." if len(calls) > 8
                                                                                          else ""))
    out.append(f"  the {top} source lines with the most registers live after one of their instructions:")
    for path, line, k in lv.by_line(inner)[:top]:
        name = Path(path).name if path else "?"
        out.append(f"    {k:4d}  {name}:{line}  {_source_text(path, line)[:90]}")
    if around is not None:
        j = min(range(len(f.instrs)), key=lambda t: abs(f.instrs[t].addr - around))
        out.append(f"  instructions around /*{around:04x}*/ (live after each):")
        for t in range(max(0, j - window), min(len(f.instrs), j + window + 1)):
            ins = f.instrs[t]
            out.append(f"    /*{ins.addr:04x}*/ {len(lv.live_out[t]):4d}  {ins.pred or '':5s} {ins.opcode} "
                       f"{', '.join(ins.operands)[:70]}  (line {ins.line})")
    return out


def _cubin(arg: str, arch: str) -> Path:
    p = Path(arg)
    if p.suffix == ".cubin":
        if not p.is_file():
            raise ValueError(f"cubin {arg}: no such file")
        return p
    from verify_attn import build as vb
    src = vb.CSRC / "tree_verify" / "instantiations" / f"{arg}.cu"
    if not src.is_file():
        known = sorted(x.stem for x in src.parent.glob("*.cu"))
        raise ValueError(f"{arg!r} is neither a .cubin nor an instantiation stem; stems: {', '.join(known)}")
    return vb.compile_cubin(src, arch)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.model.regs", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("cubin", help="a .cubin (built with -lineinfo for source lines), or an instantiation stem such "
                                  "as mla576x656_bf16_page1")
    ap.add_argument("--arch", default="sm_90a", help="the arch a stem is built for (default sm_90a)")
    ap.add_argument("--function", default="", help="regex on the mangled names (default: every function)")
    ap.add_argument("--top", type=int, default=12, help="source lines to list per function (default 12)")
    ap.add_argument("--around", default=None, help="also list the instructions near this SASS address (hex)")
    ap.add_argument("--inner", action="store_true", help="lines of the innermost frame outside csrc/arch (inside a "
                                                         "lambda) instead of the kernel's own (its call site)")
    a = ap.parse_args(argv)
    if a.top < 1:
        ap.error(f"--top must be >= 1, got {a.top}")
    around = None
    if a.around is not None:
        try:
            around = int(a.around, 16)
        except ValueError:
            ap.error(f"--around: a hex address such as 0x8f10, got {a.around!r}")
    try:
        pattern = re.compile(a.function)
    except re.error as e:
        ap.error(f"--function: not a regex ({e})")
    try:
        funcs = sass.parse(sass.disassemble(_cubin(a.cubin, a.arch)))
    except (ValueError, RuntimeError) as e:
        print(f"bench.model.regs: {e}", file=sys.stderr)
        return 2
    chosen = [f for name, f in funcs.items() if pattern.search(name)]
    if not chosen:
        print(f"bench.model.regs: no function matches {a.function!r}; functions: " + ", ".join(funcs),
              file=sys.stderr)
        return 2
    for f in chosen:
        print("\n".join(report(liveness(f), a.top, around, inner=a.inner)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
