"""The kernel goals of issue 27, judged by the model's readings: `python -m bench.model --arch sm_120a,sm_90a
--ctx 185k --tree 16,64 --kv-dtype bf16,fp8_e4m3,fp8_mla656` prints them after its rows. A run that reads page1
only also reads, for the paged goal, the kernel fastest at page1 at page sizes 16 and 64 (bench/model/__main__.py
goal_paged_payload); with --layout page1,paged the goal compares the fastest kernel of each layout.

Each goal takes the fastest kernel the run read for its (arch, cache format, tree, layout) by the central
value (the one the model-sourced autotuner would ship), and says met / missed with the central value and
the band's slow end. A goal whose rows the run did not read says so and names the argument that reads
them. Ratios (fp8 over bf16) give the central ratio and the range the two bands allow (bf16's slow end over
fp8's fast end, and the reverse). These are predictions with bands, not measurements.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .devices import DEVICES

# CALIBRATION.md P-18: decode attention reached 1.53 TB/s on the RTX PRO 6000 (85.5% of 1,792 GB/s)
RTX_DECODE_BW = 1.53e12


def _device(arch: str):
    return next(d for d in DEVICES.values() if d.arch == arch)


@dataclass
class Best:
    kernel: str
    us: float
    low: Optional[float]
    high: Optional[float]
    floor_us: float
    bytes: float
    flops: float


@dataclass
class Goal:
    name: str
    met: Optional[bool]   # None: not read by this run
    reading: str


def best_rows(payloads: list[dict]) -> dict:
    """(arch, kv_dtype, ctx, tree, layout label) -> Best: the fastest kernel by its central value. The goals are the
    reference devices' (devices.DEVICES): a reading on another device of the arch (`--arch h100`) is not one."""
    out: dict = {}
    for pl in payloads:
        kv = pl["kv_dtype"]
        for e in pl["kernels"]:
            for dk, d in e["detail"].items():
                if dk not in DEVICES:
                    continue
                lay = e["layout"] if e["layout"] == "page1" else f"p{e['page_size']}"
                key = (e["arch"], kv, e["ctx"], e["tree_nodes"], lay)
                b = e.get("band", {}).get(dk)
                row = Best(e["kernel"], d["predicted_us"], b["low_us"] if b else None, b["high_us"] if b else None,
                           d["floor_us"], float(e.get("call_bytes", 0)), float(e.get("call_flops", 0)))
                if key not in out or row.us < out[key].us:
                    out[key] = row
    return out


def _fmt(b: Best) -> str:
    band = f" [{b.low:.0f}-{b.high:.0f}]" if b.low is not None else ""
    return f"{b.us:.1f} us{band} ({b.kernel.split(' page')[-1].split(' ', 1)[-1]})"


def _slow(b: Best) -> float:
    return b.high if b.high is not None else b.us


def evaluate(payloads: list[dict], ctx: int = 185_000) -> list[Goal]:
    rows = best_rows(payloads)
    g: list[Goal] = []

    def get(arch, kv, tree, lay="page1"):
        return rows.get((arch, kv, ctx, tree, lay))

    def missing(what: str, how: str) -> Goal:
        return Goal(what, None, f"not read by this run ({how})")

    # 1. H200 bf16 at >= 70% of the datasheet floor: <= 74 us central, slow end <= 87
    name = "H200 bf16, 16 nodes: <= 74 us (70% of the 52.1 us floor), slow end <= 87"
    b = get("sm_90a", "bf16", 16)
    g.append(missing(name, "--arch sm_90a --kv-dtype bf16 --tree 16") if b is None else
             Goal(name, b.us <= 74 and _slow(b) <= 87, _fmt(b)))
    # 2. RTX PRO 6000 bf16 within 5% of the floor at the achieved decode bandwidth; slow end within 15%
    b = get("sm_120a", "bf16", 16)
    name = "RTX PRO 6000 bf16, 16 nodes: within 5% of the floor at 1.53 TB/s (P-18), slow end within 15%"
    if b is None:
        g.append(missing(name, "--arch sm_120a --kv-dtype bf16 --tree 16"))
    else:
        fl = b.bytes / RTX_DECODE_BW * 1e6 if b.bytes else b.floor_us * 1792e9 / RTX_DECODE_BW
        g.append(Goal(name, b.us <= 1.05 * fl and _slow(b) <= 1.15 * fl, f"{_fmt(b)} vs {fl:.1f} us"))
    # 3. paged (page 16 and 64) within 5% of page1, both archs
    for arch in ("sm_120a", "sm_90a"):
        dev = _device(arch).name
        for ps in (16, 64):
            name = f"{dev} bf16 paged {ps} within 5% of page1, 16 nodes"
            b1, bp = get(arch, "bf16", 16), get(arch, "bf16", 16, f"p{ps}")
            if b1 is None or bp is None:
                g.append(missing(name, f"--arch {arch} --layout page1,paged --page-size {ps}"))
            else:
                r = bp.us / b1.us
                g.append(Goal(name, r <= 1.05, f"{bp.us:.1f} vs {b1.us:.1f} us ({100 * (r - 1):+.1f}%)"))
    # 4. 64-node tree at >= 75% of the tensor rate the arch can reach (the datasheet rate's floor)
    for arch in ("sm_120a", "sm_90a"):
        dev = _device(arch)
        name = f"{dev.name} bf16, 64 nodes: >= 75% of the tensor rate"
        b = get(arch, "bf16", 64)
        if b is None:
            g.append(missing(name, f"--arch {arch} --kv-dtype bf16 --tree 64"))
            continue
        fl = b.flops / (dev.datasheet_tflops.value * 1e12) * 1e6 if b.flops else b.floor_us
        g.append(Goal(name, fl / b.us >= 0.75, f"{_fmt(b)}: {100 * fl / b.us:.0f}% of the {fl:.1f} us floor"))
    # 5-7. fp8 over bf16
    for arch, kv, want in (("sm_120a", "fp8_e4m3", 1.85), ("sm_90a", "fp8_e4m3", 1.5), ("sm_120a", "fp8_mla656", 1.6)):
        dev = _device(arch).name
        name = f"{dev} {kv} over bf16, 16 nodes: >= {want}x"
        bb, bf = get(arch, "bf16", 16), get(arch, kv, 16)
        if bb is None or bf is None:
            g.append(missing(name, f"--arch {arch} --kv-dtype bf16,{kv} --tree 16"))
            continue
        r = bb.us / bf.us
        rng = ""
        if None not in (bb.low, bb.high, bf.low, bf.high):
            rng = f" [{bb.low / bf.high:.2f}-{bb.high / bf.low:.2f}]"
        g.append(Goal(name, r >= want, f"{r:.2f}x{rng}: {bf.us:.1f} vs {bb.us:.1f} us"))
    # 8. GQA with fp8 caches in CUDA: built and correct (the emulator's tests, not a model reading)
    from verify_attn import build as vb
    built = sorted(k for k in vb.HEADS if k.startswith("gqa") and k in vb.FP8_HEADS.values())
    g.append(Goal("GQA with fp8 caches in CUDA: built and correct", bool(built),
                  f"built: {', '.join(built) or 'none'}; correctness: tests/test_cuda_emu.py -k 'gqa_fp8 or "
                  "fp8_e4m3_gqa' (emulator), tests/test_cuda_gpu.py -k fp8_e4m3_gqa (GPU)"))
    return g


def print_goals(payloads: list[dict]) -> None:
    goals = evaluate(payloads)
    print("\nissue 27's goals at 185k, Kimi K2 TP8 (the fastest kernel the model read per row; predictions, "
          "not measurements)")
    for x in goals:
        tag = "met" if x.met else ("not read" if x.met is None else "MISSED")
        print(f"  {tag:8} {x.name}: {x.reading}")
