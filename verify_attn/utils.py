"""Small helpers shared by the command-line tools (bench, autotune, integration)."""
from __future__ import annotations

import argparse  # noqa: F401 (dash_values' annotation)
import math
import os
import re
import sys
from pathlib import Path

_NUM = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def parse_tokens(s: str) -> int:
    """'185k' -> 185000, '1.4k' -> 1400, '2m' -> 2000000, '97' -> 97. k = 1,000 tokens."""
    m = _NUM.match(s)
    if not m:
        raise ValueError(f"not a token count: {s!r} (expected e.g. 97, 1.4k, 185k)")
    mult = {"": 1, "k": 1_000, "m": 1_000_000}[m.group(2).lower()]
    v = float(m.group(1)) * mult
    if v != int(v):
        raise ValueError(f"token count {s!r} is not a whole number of tokens")
    return int(v)


def parse_ctx(spec: str, *, points_per_decade: int = 4) -> list[int]:
    """Parse a context-length spec.

    '185k' | '4k,16k,64k,185k' | '1k..256k' (log-spaced, `points_per_decade`
    per factor of 10, ends included) | mixtures separated by commas.
    k means 1,000 tokens. Returns sorted unique positive ints.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("context spec is empty (expected e.g. 185k, 4k,16k or 1k..256k)")
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if ".." in part:
            lo_s, hi_s = part.split("..", 1)
            lo, hi = parse_tokens(lo_s), parse_tokens(hi_s)
            if lo < 1 or hi < lo:
                raise ValueError(f"bad range {part!r}: need 1 <= low <= high")
            n = max(2, int(round(math.log10(hi / lo) * points_per_decade)) + 1) if hi > lo else 1
            for i in range(n):
                out.add(int(round(lo * (hi / lo) ** (i / max(1, n - 1)))))
        else:
            v = parse_tokens(part)
            if v < 1:
                raise ValueError(f"context length must be >= 1, got {part!r}")
            out.add(v)
    if not out:
        raise ValueError(f"context spec {spec!r} names no length")
    return sorted(out)


def parse_int_list(spec: str, name: str = "list") -> list[int]:
    try:
        vals = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{name} must be comma-separated integers, got {spec!r}") from None
    if not vals or min(vals) < 1:
        raise ValueError(f"{name} must be positive integers, got {spec!r}")
    return vals


def flag_value(parse, value: str, flag: str):
    """parse(value), its ValueError naming `flag` (`--ctx: not a token count: '-5k' ...`)."""
    try:
        return parse(value)
    except ValueError as e:
        raise ValueError(f"{flag}: {e}") from None


def dash_values(ap: "argparse.ArgumentParser") -> "argparse.ArgumentParser":
    """Let an option's value start with a minus sign and a digit (`--ctx -5k`, `--tree -1`), as Python 3.13's
    argparse does: the value then reaches the tool's own range check and its message, instead of argparse's
    "expected one argument". Returns `ap`."""
    ap._negative_number_matcher = re.compile(r"^-\.?\d")
    return ap


def _program() -> str | None:
    """'python -m integration.decode' when this process runs a module of this project with -m (runpy puts its
    file in sys.argv[0]); None otherwise (e.g. under pytest)."""
    try:
        rel = Path(sys.argv[0]).resolve().relative_to(Path(__file__).resolve().parent.parent)
    except (IndexError, ValueError, OSError):
        return None
    parts = list(rel.with_suffix("").parts)
    if parts and parts[-1] == "__main__":
        parts = parts[:-1]
    return "python -m " + ".".join(parts) if parts and rel.suffix == ".py" else None


def usage_error(msg: str) -> SystemExit:
    """A bad command-line value: print `msg` (one line naming the flag) on stderr and
    return a SystemExit with argparse's usage-error status 2 (raise it). str() of the
    exception is the message, so callers and tests can match it."""
    line = " ".join(str(msg).split())
    prog = _program()
    if line.startswith("error: ") and prog:   # the tools that raise a bare "error: ..." get their name
        line = f"{prog}: {line}"
    print(line, file=sys.stderr)
    e = SystemExit(line)
    e.code = 2
    return e


def cache_dir() -> Path:
    """The project's one cache root: $VERIFY_ATTN_CACHE, else $XDG_CACHE_HOME/verify_attn, else
    ~/.cache/verify_attn. Every cache lives under it: the emulator builds (emu/), the build report and cubins
    (build_report/, cubins/), the GPU ceilings (ceilings.json), the autotune cache (autotune_cache.json)."""
    env = os.environ.get("VERIFY_ATTN_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "verify_attn"
