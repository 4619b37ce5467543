"""`python -m bench.model --validate`: the model against measurements made outside it.

Each item is a published figure (shared/CALIBRATION.md, P-nn) or one of this project's own H200 measurements
(bench/results/h200*/), the model's prediction of it, and whether the item was used to set a constant:
  fit       -- a constant's central value was taken from it (not evidence for the model, listed for the record)
  held out  -- no constant came from it: the evidence
  not reached -- the model cannot read the kernel behind it yet (why, and what would)
An item within +-25% passes; a miss names the mechanism (`note`). No constant is tuned to a single item.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from verify_attn import build as vb

from . import devices, probes

RESULTS = vb.REPO / "bench" / "results"


@dataclass
class Item:
    id: str
    what: str
    observed: Optional[float]
    predicted: Optional[float]
    unit: str
    status: str          # fit | held out | not reached
    note: str = ""

    @property
    def ratio(self) -> Optional[float]:
        if not self.observed or not self.predicted:
            return None
        return self.observed / self.predicted

    @property
    def within(self) -> Optional[bool]:
        r = self.ratio
        return None if r is None else 0.75 <= r <= 1.25

    def to_dict(self) -> dict:
        return {"id": self.id, "what": self.what, "observed": self.observed, "predicted": self.predicted,
                "unit": self.unit, "status": self.status, "ratio": self.ratio, "within_25pct": self.within,
                "note": self.note}


def _probe_items() -> list[Item]:
    out = []
    k = probes.probe_constants()
    try:
        rtx_loops = probes.read("sm_120a")
        h200_loops = probes.read("sm_90a")
    except (RuntimeError, LookupError) as e:  # no toolkit or SASS tools here
        return [Item("probes", "the ceiling probes", None, None, "", "not reached", str(e)[:200])]
    # P-03: the Max-Q card, 1 block of 8 warps per SM, 8 chains per warp, at its measured 2,257 MHz
    maxq = replace(devices.RTX_PRO_6000, clock_ghz=devices.RTX_PRO_6000.clock_ghz.at(2.257))
    p = probes.rate(probes.find(rtx_loops, "mma_peak_kernelI13__nv_bfloat16"), maxq, threads=k["kThreads"],
                    smem_bytes=0, blocks_per_sm=1)
    out.append(Item("P-03", "sm_120 mma.sync m16n8k16 rate, RTX PRO 6000 Max-Q, 1 block x 8 warps/SM, 8 chains/warp, "
                            "2,257 MHz (f32 accumulate)", 426.7, p.value, "TFLOP/s", "held out",
                     "checks the issue simulation (2 warps x 8 chains per scheduler at HMMA latency 25); the rate "
                     "constant is P-01's vendor figure"))
    h = devices.H200
    p = probes.rate(probes.find(h200_loops, "mma_peak_kernelI13__nv_bfloat16"), h, threads=k["kThreads"],
                    smem_bytes=0, blocks_per_sm=8)
    out.append(Item("H200 mma_peak", "H200 mma.sync bf16 rate, 8 CTAs/SM (bench.ceilings, 2026-12-04)", 578.3,
                    p.value, "TFLOP/s", "fit", "mma_flop_per_clk_sm was set from it"))
    p = probes.rate(probes.find(h200_loops, "wgmma_peak_kernel"), h, threads=k["kWgThreads"],
                    smem_bytes=k["kWgSmemBytes"], blocks_per_sm=1)
    out.append(Item("H200 wgmma_peak", "H200 wgmma m64n256k16 rate (bench.ceilings, 2026-12-04)", 937.7, p.value,
                    "TFLOP/s", "held out", "the datasheet's 4,096 FLOP/clk/SM at the measured 1.795 GHz clock"))
    for n, meas in ((64, 96.1), (256, 192.1)):
        p = probes.cycles(probes.find(h200_loops, f"wgmma_latency_kernelILi{n}E"), h)
        out.append(Item(f"H200 wgmma round N={n}", f"one (wgmma m64n{n}k16 + wait_group 0) round, one warpgroup",
                        meas, p.value, "cycles", "fit", "hgmma_latency was set from both"))
    return out


def _constant_items() -> list[Item]:
    h, r = devices.H200, devices.RTX_PRO_6000
    h_stream = h.dram_gbs.value * h.dram_efficiency.value
    return [
        Item("P-17", "H200 decode streaming bandwidth (cuDNN, b128, kv 131k, 16/2 heads): 4,567.7 GB/s", 4567.7, h_stream,
             "GB/s", "held out", "the model's streaming read (dram_gbs x dram_efficiency, measured here by "
                                 "bench.ceilings' read sweep); P-17 is its range's upper end"),
        Item("P-18", "RTX PRO 6000 decode streaming bandwidth (cuDNN, b32, kv 131k): 1,532 GB/s", 1532.2,
             r.dram_gbs.value * r.dram_efficiency.value, "GB/s", "fit", "dram_efficiency was set from it"),
        Item("P-06 L2", "H800 PCIe L2 latency, dependent loads (16-20 MB footprint)", 264.5, h.l2_latency_cycles.value,
             "cycles", "fit", "l2_latency_cycles was set from it"),
        Item("P-06 DRAM", "H800 PCIe DRAM latency, dependent loads (unloaded, 462 MB footprint)", 652.2,
             h.dram_latency_ns.value * 1e-9 * 1.755e9, "cycles", "held out",
             "miss by design: P-06 is one dependent load at a time; the model's DRAM latency is the loaded one "
             "(Little's law on the KV stream probe at 18-36 KB in flight per SM): queueing under load, not a "
             "constant to tune"),
        Item("H200 HMMA latency", "H200 dependent HMMA.16816 (bench.ceilings, clock64)", 25.0, h.hmma_latency.value,
             "cycles", "fit", "arXiv 2402.13499 Table VII gives 24.1 on the H800 (held out: ratio 0.96)"),
    ]


def _little_items() -> list[Item]:
    """P-07: TMA throughput against bytes in flight on an H800 PCIe (114 SMs, ~2.0 TB/s, 1,755 MHz), by Little's
    law with the model's loaded DRAM latency and streaming efficiency."""
    h = devices.H200
    bw = 2000.0 * h.dram_efficiency.value
    out = []
    for blocks, kb, meas in ((114, 1, 222.8), (342, 8, 1811.0), (456, 16, 1826.1)):
        inflight = blocks * kb * 1024
        pred = min(bw, inflight / (h.dram_latency_ns.value * 1e-9) / 1e9)
        out.append(Item(f"P-07 {blocks}x{kb}KB", f"H800 PCIe TMA read, {blocks} blocks x {kb} KB in flight", meas, pred,
                        "GB/s", "held out",
                        "Little's law with the loaded latency: at 1 KB per SM the queue is empty and the real "
                        "latency is the unloaded one (~0.4 us), so the model undershoots" if kb == 1 else
                        "bandwidth-bound: the model's streaming efficiency"))
    return out


def _kernel_items() -> list[Item]:
    from verify_attn.build import label_family
    from .calibrate import rows
    files = [p for n in ("headline", "sweep", "fp8", "fp8_656", "peers") for p in [RESULTS / "h200" / f"{n}.json"]
             if p.exists()]
    if not files:
        return [Item("H200 kernels", "this project's H200 kernel rows", None, None, "", "not reached",
                     "bench/results/h200/ holds no benchmark JSON")]
    rs = rows(files)
    out = []
    groups: dict[str, list[dict]] = {}
    for r in rs:
        k = r["kernel"]
        ver = label_family(k) or "v0"   # v3's rows as v3 (Hopper) or v3-sm120, never as v0's
        fmt = "656" if "656kv" in k else "e4m3" if "e4m3kv" in k else "bf16"
        groups.setdefault(f"{ver} {fmt}", []).append(r)
    for g, rr in sorted(groups.items()):
        ratios = [r["ratio"] for r in rr]
        med = statistics.median(ratios)
        within = sum(0.75 <= x <= 1.25 for x in ratios)
        ms = statistics.median(r["measured_us"] for r in rr)
        out.append(Item(f"H200 {g}", f"{len(rr)} measured rows (ctx 4k-185k, trees 1-64, page1 / paged 64), median "
                                     f"ratio; {within}/{len(rr)} within +-25%, range {min(ratios):.2f}-{max(ratios):.2f}",
                        ms, ms / med, "us (median row)", "held out", _KERNEL_NOTES.get(g.split()[0], "")))
    return out


_KERNEL_NOTES = {
    "v2": "miss: the model's copy chain (LSU issue + stream + loaded latency) is ~3,700 cycles a tile, v2 measures "
          "4,940 without its index loads and 6,160 with them (bench.knockout); the rest is unexplained: candidates "
          "are v2's 8-rows-per-instruction loader (the probe's across-row layout) and two CTAs waiting on the same "
          "DRAM lines. The rows measured v2 before its L2 prefetches (2026-12-05): the model reads today's v2, which "
          "it puts ~12% faster at 185k, so this ratio mixes two kernels until the next H200 run",
    "v1": "the one-tile prefetch of the one-barrier loop (4 stages: 3 read, 1 loading) is latency + stream per tile",
    "v0": "",
}


def _foreign_items() -> list[Item]:
    """P-12: FlashAttention-2's forward kernel, read from its own cubin without markers (bench/model/foreign.py)."""
    from . import foreign
    what = "FlashAttention-2 forward, non-causal, on an H100 SXM5 (b2 h16 s8192 d128): its cubin, no markers"
    cubin = foreign.fa2_cubin()
    if cubin is None:
        return [Item("P-12", what, 388.3, None, "TFLOP/s", "not reached",
                     "FA2's cubin is not built here: bash bench/model/build_fa2.sh FA2_DIR CUTLASS_DIR (7 min; "
                     "NOTES.md has the reading)")]
    try:
        r = foreign.read(cubin, foreign.FA2_PATTERN)
        p = foreign.predict(r, foreign.H100_SXM, **foreign.FA2_P12, band=False)
    except (LookupError, ValueError, RuntimeError) as e:
        return [Item("P-12", what, 388.3, None, "TFLOP/s", "not reached", f"{type(e).__name__}: {e}"[:200])]
    return [Item("P-12", what, 388.3, p["tflops"], "TFLOP/s", "held out",
                 f"hot loop {p['mma_per_iter']} HMMA/warp, {p['cycles_per_iter']:.0f} cycles, {p['ctas_per_sm']} "
                 f"CTAs/SM, {p['waves']} waves; the H200's model with the H100's DRAM")]


def _flashmla_items() -> list[Item]:
    """FlashMLA's warp-specialized sm_90 kernels (P-15), read from their own cubins without markers, roles and all
    (bench/model/roles.py): the sparse prefill (a producer warpgroup gathering rows by cp.async, two math
    warpgroups) and the dense decode (two math warpgroups, TMA boxes, the "seesaw" on named barriers)."""
    from . import foreign
    out = []
    for kind, what, observed, pattern, shape in (
            ("sparse", "FlashMLA sparse prefill on an H800 SXM5 (d_qk 576, h_q 128, topk 2048, s_q 4096; README: "
             "'up to 640 TFlops')", 640.0, foreign.FLASHMLA_SPARSE_PATTERN, foreign.FLASHMLA_SPARSE),
            ("dense", "FlashMLA dense decode on an H800 SXM5, compute-bound (README: 660 TFLOPS; its shape not "
             "stated: read at b 128, s_q 1, h_q 128, s_k 8192)", 660.0, foreign.FLASHMLA_DENSE_PATTERN,
             foreign.FLASHMLA_DENSE)):
        cubin = foreign.flashmla_cubin(kind)
        iid = f"P-15 FlashMLA {kind}"
        if cubin is None:
            out.append(Item(iid, what, observed, None, "TFLOP/s", "not reached",
                            "its cubin is not built here: bash bench/model/build_flashmla.sh FLASHMLA_DIR CUTLASS_DIR "
                            "(~2 min; needs the public sources; NOTES.md has the reading)"))
            continue
        try:
            shape = dict(shape)
            r, found = foreign.read_roles(cubin, pattern, shape["threads"])
            if not found:
                raise LookupError("no warp roles found")
            p = foreign.predict_roles(r, found, foreign.H800_SXM, band=False, **shape)
        except (LookupError, ValueError, RuntimeError) as e:
            out.append(Item(iid, what, observed, None, "TFLOP/s", "not reached", f"{type(e).__name__}: {e}"[:200]))
            continue
        roles_txt = "; ".join(f"{ro['role']} warps {ro['warps'][0]}-{ro['warps'][-1]} {ro['mma_per_iter']} MMA "
                              f"{ro['copies_per_iter']} copies, {ro['bound']}" for ro in p["roles"])
        out.append(Item(iid, what, observed, p["tflops"], "TFLOP/s", "held out",
                        f"{p['cycles_per_iter']:.0f} cycles / iteration; {roles_txt}; the H100's model at 1.6 GHz"))
    return out


def _not_reached() -> list[Item]:
    return [
        Item("P-13", "FlashAttention-3 forward on an H100 (hd128 non-causal, 4 x 8448 x 16: 661 TFLOP/s at 1830 MHz)",
             661.0, None, "TFLOP/s", "not reached",
             "its hdim-128 bf16 forward builds for sm_90a in ~1 min and the role reader finds producer warps 0-3 "
             "(setmaxnreg 24) and math warps 4-11 (setmaxnreg 240, 16 S + 22 P V HGMMAs an iteration), but its "
             "mbarriers are stage-indexed through registers ([R10+URZ+0x34840]) and its producer's hot loop is the "
             "persistent tile loop: the waits cannot be matched to arrivals (NOTES.md, warp roles)"),
        Item("P-16", "FlashMLA decode on an H100 (b128, 4k, s_q 2)", 0.218, None, "ms", "not reached",
             "measured on FlashMLA's Feb 2025 kernel; the model reads today's (P-15 FlashMLA dense, above), "
             "whose schedule differs (the 2025-04 'seesaw')"),
        Item("P-20", "cuDNN OSS sm_120 attention (CuTe DSL)", 3699.0, None, "us", "not reached",
             "a Python DSL kernel: no SASS without its toolchain and a GPU"),
        Item("P-10", "ThunderKittens bf16 GEMM 4096^3 on an H100", 774.5, None, "TFLOP/s", "not reached",
             "not built here"),
    ]


def items() -> list[Item]:
    return _probe_items() + _constant_items() + _little_items() + _kernel_items() + _foreign_items() + _flashmla_items() + _not_reached()


def validate(json_path: Optional[str] = None) -> int:
    its = items()
    print("bench.model --validate: predicted against measured outside the model (fit: a constant came from the item; "
          "held out: the evidence)")
    print(f"{'item':26} {'status':11} {'observed':>10} {'model':>10} {'obs/model':>9}  {'unit':12} what; note")
    for it in its:
        obs = "-" if it.observed is None else f"{it.observed:10.1f}"
        pred = "-" if it.predicted is None else f"{it.predicted:10.1f}"
        rat = "-" if it.ratio is None else f"{it.ratio:9.2f}"
        flag = "" if it.within is None else (" ok" if it.within else " MISS")
        print(f"{it.id:26} {it.status:11} {obs:>10} {pred:>10} {rat:>9}{flag:5} {it.unit:12} {it.what}"
              + (f"; {it.note}" if it.note else ""))
    held = [i for i in its if i.status == "held out" and i.within is not None]
    print(f"held out: {sum(i.within for i in held)}/{len(held)} within +-25%; "
          f"not reached: {sum(i.status == 'not reached' for i in its)}")
    if json_path:
        import json
        Path(json_path).write_text(json.dumps([i.to_dict() for i in its], indent=1))
    return 0
