"""python -m bench.emu_sweep: random cases through chosen CUDA tiles on the CPU emulator, against the float64 reference.

Each case draws a batch of 1-3 requests (prefixes 0-600 tokens, trees of 1-37 nodes of every kind), a page size,
a split count, q's dtype, an emulator schedule and a cp.async landing, runs one compiled tile through
`backend="cuda-emu"` and compares with the reference on the (dequantized) cache. The 16-bit tiles and the f16 fp8
tiles are held to the 16-bit tolerance (tests/cases.py); the e4m3-MMA tiles, which round Q and P to e4m3, to
`tolerances.check_e4m3_mma` against the reference with q rounded as they round it (their scores and LSE to fp32
rounding; out within FP8_MMA_REL_TOL). It prints, per tile, the cases, the failures and the error distribution
against the exact reference (max |err| / max |ref| per call: p50, p90, p99, max), so the format's cost can be read
against the tail of FP8_MMA_REL_TOL.

    python -m bench.emu_sweep                          # every tile below, 40 cases each
    python -m bench.emu_sweep --tiles mla-e4m3-mma --cases 400 --seed 7
    python -m bench.emu_sweep --list

Run from the repository root (it reads the test suite's case builder, tests/cases.py). Emulator results, not GPU
measurements; the first run builds the emulator (1-4 minutes on 2 cores).
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

# (name, head kwargs of CaseSpec (hq is drawn for GQA: hkv x group), kv_dtype or None, tile (bm, bn, warps, stages),
#  e4m3-MMA tolerance)
TILES: dict[str, tuple[dict, Optional[str], tuple[int, int, int, int], bool]] = {
    "mla-bf16-n16-s4": (dict(hq=8, hkv=1, dqk=576, dv=512, mla=True), None, (32, 16, 8, 4), False),
    "mla-e4m3-mma": (dict(hq=8, hkv=1, dqk=576, dv=512, mla=True), "fp8_e4m3", (32, 32, 8, 4), True),
    "mla-656-f16": (dict(hq=8, hkv=1, dqk=576, dv=512, mla=True), "fp8_mla656", (32, 32, 8, 3), False),
    "mla-656-e4m3-mma": (dict(hq=8, hkv=1, dqk=576, dv=512, mla=True), "fp8_mla656", (32, 32, 8, 4), True),
    "gqa64-e4m3-s6": (dict(hkv=2, dqk=64, dv=64, mla=False), "fp8_e4m3", (32, 32, 4, 6), False),
    "gqa128-e4m3-s6": (dict(hkv=1, dqk=128, dv=128, mla=False), "fp8_e4m3", (32, 32, 8, 6), False),
    "gqa256-e4m3-s4": (dict(hkv=2, dqk=256, dv=256, mla=False), "fp8_e4m3", (32, 32, 8, 4), False),
    "gqa128-bf16-v1": (dict(hkv=2, dqk=128, dv=128, mla=False), None, (32, 32, 8, 4), False),
    # the sm_90a wgmma kernels (v2; Hopper's v3, whose odd block counts run a phantom block): the tree mask of a wgmma
    # accumulator (mask_m64_scores) over random trees, prefixes and split counts
    "mla-bf16-v2": (dict(hq=8, hkv=1, dqk=576, dv=512, mla=True), None, (64, 32, 8, 3), False),
    "mla-bf16-v3h": (dict(hq=8, hkv=1, dqk=576, dv=512, mla=True), None, (64, 64, 12, 2), False),
    "mla-e4m3-v3h": (dict(hq=8, hkv=1, dqk=576, dv=512, mla=True), "fp8_e4m3", (64, 64, 12, 2), True),
    # Hopper's v3 as a 2-CTA cluster ("cuda@v3-cluster"; 16-bit caches): the emulator runs a cluster's CTAs together
    "mla-bf16-v3c": (dict(hq=8, hkv=1, dqk=576, dv=512, mla=True), None, (128, 64, 12, 2), False),
    # sm_120's v3 tiles (the RTX's, and the H200's "cuda@v3-sm120" proxy): one producer warp (w9), a producer
    # warpgroup (w12), math roles (w20, the pin); e4m3 and 656-byte rows on e4m3 MMAs
    "mla-bf16-v3-w9": (dict(hq=8, hkv=1, dqk=576, dv=512, mla=True), None, (32, 16, 9, 4), False),
    "mla-bf16-v3-w12": (dict(hq=8, hkv=1, dqk=576, dv=512, mla=True), None, (32, 16, 12, 4), False),
    "mla-bf16-v3-roles": (dict(hq=8, hkv=1, dqk=576, dv=512, mla=True), None, (32, 16, 20, 4), False),
    "mla-e4m3-v3-w9": (dict(hq=8, hkv=1, dqk=576, dv=512, mla=True), "fp8_e4m3", (32, 32, 9, 4), True),
    "mla-e4m3-v3-w12": (dict(hq=8, hkv=1, dqk=576, dv=512, mla=True), "fp8_e4m3", (32, 32, 12, 4), True),
    "mla-e4m3-v3-roles": (dict(hq=8, hkv=1, dqk=576, dv=512, mla=True), "fp8_e4m3", (32, 32, 20, 4), True),
    "mla-656-v3-w9": (dict(hq=8, hkv=1, dqk=576, dv=512, mla=True), "fp8_mla656", (32, 32, 9, 4), True),
    "mla-656-v3-w12": (dict(hq=8, hkv=1, dqk=576, dv=512, mla=True), "fp8_mla656", (32, 32, 12, 4), True),
    "mla-656-v3-roles": (dict(hq=8, hkv=1, dqk=576, dv=512, mla=True), "fp8_mla656", (32, 32, 20, 4), True),
}
SCHEDULES = ("forward", "warp-ahead", "warp-ahead-reverse", "random", "reverse")


@dataclass
class TileResult:
    cases: int = 0
    failures: int = 0
    rel: list = None   # max |err| / max |ref| per case
    worst: str = ""    # the case with the largest of them (its spec id and split count), to rerun it alone

    def quantile(self, q: float) -> float:
        r = sorted(self.rel)
        return r[min(len(r) - 1, int(q * len(r)))] if r else float("nan")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.emu_sweep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiles", default="all", help=f"comma-separated of {', '.join(TILES)}, or all")
    ap.add_argument("--cases", type=int, default=40, help="random cases per tile (default 40)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--list", action="store_true", help="list the tiles and exit")
    from verify_attn.utils import dash_values
    return dash_values(ap)


def main(argv: Optional[list[str]] = None) -> int:
    a = build_parser().parse_args(argv)
    if a.list:
        for k, (head, kv, tile, mma) in TILES.items():
            print(f"{k:18} {kv or 'bf16/fp16':10} tile {tile}  head {head}{'  (e4m3-MMA tolerance)' if mma else ''}")
        return 0
    names = list(TILES) if a.tiles == "all" else [x.strip() for x in a.tiles.split(",") if x.strip()]
    bad = [x for x in names if x not in TILES]
    if bad or not names:
        print(f"python -m bench.emu_sweep: error: --tiles: unknown {', '.join(bad) or '(none)'}; known: "
              f"{', '.join(TILES)}", file=sys.stderr)
        return 2
    if a.cases < 1:
        print(f"python -m bench.emu_sweep: error: --cases must be >= 1, got {a.cases}", file=sys.stderr)
        return 2
    tests = Path(__file__).resolve().parents[2] / "tests"
    if not (tests / "cases.py").exists():
        print(f"bench.emu_sweep needs the test suite's case builder ({tests / 'cases.py'}): run it from a checkout",
              file=sys.stderr)
        return 2
    sys.path.insert(0, str(tests))
    import torch
    from cases import CaseSpec, check_against_reference, make_case, poisoned_out
    from verify_attn import tree_verify
    from verify_attn.backends import cuda_emu
    from verify_attn.config import KernelConfig
    from verify_attn.reference import reference_e4m3_mma, reference_verify
    from verify_attn.tolerances import check_e4m3_mma

    ok, why = cuda_emu.available()
    if not ok:
        print(f"bench.emu_sweep: the emulator is not available: {why}", file=sys.stderr)
        return 2
    emu = cuda_emu.load_extension()
    rng = random.Random(a.seed)
    results = {n: TileResult(rel=[]) for n in names}
    t0 = time.time()
    for k in range(a.cases * len(names)):
        name = names[k % len(names)]
        head, kv, tile, mma = TILES[name]
        head = dict(head)
        if not head["mla"]:
            head["hq"] = head["hkv"] * rng.choice([1, 2, 4, 8])
        nb = rng.choice([1, 1, 2, 3])
        prefix = tuple(rng.choice([0, 1, 7, 31, 32, 33, 95, 160, 257, 600]) for _ in range(nb))
        nodes = tuple(rng.choice([1, 2, 5, 9, 16, 37]) for _ in range(nb))
        spec = CaseSpec(prefix, nodes, rng.choice(["bushy", "chain", "star", "deep"]),
                        dtype=rng.choice([torch.bfloat16, torch.float16]), page_size=rng.choice([1, 1, 3, 5, 7, 16, 64]),
                        seed=a.seed * 100_000 + k, **({"kv_dtype": kv} if kv else {}), **head)
        splits = rng.choice([1, 2, 3, 5, 8, 16])
        emu.set_schedule(SCHEDULES[k % len(SCHEDULES)], seed=k)
        emu.set_cp_async_landing("issue" if k % 2 else "wait")
        r = results[name]
        r.cases += 1
        try:
            case = make_case(spec)
            out, lse = tree_verify(**case.kwargs, backend="cuda-emu", out=poisoned_out(case), return_lse=True,
                                   config=KernelConfig(num_splits=splits, block_m=tile[0], block_n=tile[1],
                                                       num_warps=tile[2], num_stages=tile[3]))
            ref, _ = reference_verify(case.problem())
            rel = float((out.double() - ref).abs().max() / ref.abs().max())
            if rel > max(r.rel, default=-1.0):
                r.worst = f"case {k} (seed {spec.seed}): {spec.id}, {splits} splits, {SCHEDULES[k % len(SCHEDULES)]}"
            r.rel.append(rel)
            if mma:
                ref_q, ref_q_lse = reference_e4m3_mma(case.problem())
                why = check_e4m3_mma(out, ref_q, spec.dtype, lse, ref_q_lse, emulated=True)
                assert why is None, why
            else:
                check_against_reference(out, lse, case)
        except Exception as e:  # a failing case is reported, the sweep goes on
            r.failures += 1
            print(f"FAIL {name} {spec.id} splits {splits}: {type(e).__name__}: {str(e)[:240]}")
    print(f"\nbench.emu_sweep (emulator, not a GPU): seed {a.seed}, {a.cases} cases per tile, {time.time() - t0:.0f} s")
    print(f"{'tile':18} {'cases':>5} {'fail':>4} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7}   "
          "(max |err| / max |ref| per call) the worst call")
    for n in names:
        r = results[n]
        print(f"{n:18} {r.cases:>5} {r.failures:>4} {r.quantile(.5):>7.4f} {r.quantile(.9):>7.4f} "
              f"{r.quantile(.99):>7.4f} {max(r.rel, default=float('nan')):>7.4f}   {r.worst}")
    return 1 if any(r.failures for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
