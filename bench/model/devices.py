"""Device model of the SASS-level performance model: every constant with its source.

Each constant is a `Const(value, kind, source)` where kind is
  "published" -- a vendor datasheet, the CUDA programming guide, or a paper / NVIDIA code we cite;
  "derived"   -- computed from published constants (the formula is in `source`);
  "measured"  -- measured on the device by this project (bench.ceilings, bench.gpu_check);
  "assumed"   -- no public figure found; a stated engineering assumption, to be replaced
                 by a measurement (`python -m bench.model --calibrate` after a GPU run).
No constant changes to fit a result without a measurement (NOTES.md logs calibrations).

Throughputs are per SM sub-partition (one warp scheduler) and expressed as the
number of cycles a *warp instruction* occupies its pipe: the CUDA guide's
"results per clock per SM" r gives 4 * 32 / r cycles for a 32-lane instruction
issued on one of the 4 sub-partitions.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Optional


@dataclass(frozen=True)
class Const:
    value: float
    kind: str      # published | derived | measured | assumed
    source: str
    lo: Optional[float] = None   # the stated range (None: exact, value); every assumed or derived constant has one
    hi: Optional[float] = None
    why_range: str = ""          # where the range comes from

    def __post_init__(self):
        if self.kind not in ("published", "derived", "measured", "assumed"):
            raise ValueError(f"bad constant kind {self.kind!r}")
        lo, hi = self.range
        if not lo <= self.value <= hi:
            raise ValueError(f"constant {self.value} outside its range [{lo}, {hi}]")

    @property
    def range(self) -> tuple[float, float]:
        return (self.value if self.lo is None else self.lo, self.value if self.hi is None else self.hi)

    @property
    def ranged(self) -> bool:
        lo, hi = self.range
        return lo != hi

    def at(self, value: float) -> "Const":
        """This constant moved to `value` (within its range), for the model's bands."""
        return replace(self, value=value)


GUIDE = ("CUDA C++ Programming Guide, 'Arithmetic Instructions' throughput table "
         "(results per clock per SM, compute capability 9.0 / 12.x)")
CUDNN_FE = ("NVIDIA cudnn-frontend benchmarks, _FLOPS_PER_CLOCK_PER_SM table "
            "(dense bf16/fp16 MMA FLOP/clk/SM: sm_90 4096, sm_12x 1024); cudnn-frontend PR #650: "
            "'989.5 dense BF16 TFLOPS = 132 SMs x 1.83 GHz x 4096 FLOPs/clk/SM'")
HMMA_FLOP = 2 * 16 * 8 * 16  # one m16n8k16 MMA
RRZE = ("RRZE-HPC gpu-benches (github.com/RRZE-HPC/gpu-benches), measured L2 bandwidth of a read kernel whose "
        "thread blocks all over the chip re-read the same data")


@dataclass(frozen=True)
class DeviceModel:
    key: str                 # cli name: h200, rtx-pro-6000
    name: str
    arch: str                # cubin arch the model reads: sm_90a / sm_120a
    sms: Const
    clock_ghz: Const
    dram_gbs: Const          # datasheet bandwidth (the roofline floor's)
    dram_efficiency: Const   # achievable fraction of dram_gbs for a streaming read
    l2_gbs: Const            # aggregate L2 -> SM read bandwidth
    dram_latency_ns: Const   # loaded DRAM latency (Little's law)
    l2_latency_cycles: Const
    mma_flop_per_clk_sm: Const   # mma.sync-class rate (what our kernels can reach)
    datasheet_mma_flop_per_clk_sm: Const  # wgmma / datasheet rate (reported, not used for mma.sync kernels)
    hmma_latency: Const      # cycles, m16n8k16 fp32-accumulate, dependent issue to dependent issue
    smem_bytes_per_clk_sm: Const
    smem_latency: Const
    fp32_per_clk_sm: Const
    int_per_clk_sm: Const
    mufu_per_clk_sm: Const
    shfl_per_clk_sm: Const
    cvt_per_clk_sm: Const
    alu_latency: Const
    mufu_latency: Const
    shfl_latency: Const
    bar_latency: Const
    launch_us: Const         # per dependent kernel boundary in a captured graph
    pdl_launch_us: Const     # the same with programmatic dependent launch (the dependent's launch overlaps)
    qmma_speedup: Const      # FLOP rate of a native e4m3 mma.sync (QMMA.16832) over the 16-bit HMMA rate
    datasheet_tflops: Optional[Const] = None  # dense bf16 TFLOP/s of the datasheet (the floor of a datasheet-rate tile)
    # SM cycles the LSU spends per 16-byte cp.async (LDGSTS) of scattered KV rows: shared by the SM's schedulers
    # with LDS / LDSM (the MIO queue); the warp that issued it cannot reuse its address registers before
    ldgsts_cycles_per_chunk: Optional[Const] = None
    schedulers: int = 4
    notes: tuple[str, ...] = field(default_factory=tuple)
    # wgmma (sm_90a): cycles from the end of an HGMMA's tensor-pipe time to its commit group's completion
    # (what WARPGROUP.DEPBAR waits for); None on a device without wgmma
    hgmma_latency: Optional[Const] = None
    # bulk copies (cp.async.bulk -> UBLKCP, sm_90+): SM cycles the SM's TMA unit takes per copy request (shared by
    # the schedulers whose warps issue copies; the bytes then stream at the SM's DRAM / L2 share), and cycles a
    # UBLKCP holds its warp (nothing else of the warp issues meanwhile); None: the device has no bulk copies
    bulk_copy_cycles: Optional[Const] = None
    bulk_issue_cycles: Optional[Const] = None
    # distributed shared memory (sm_90+ clusters): cycles from a bulk copy into another CTA's shared memory leaving the
    # SM to its landing there (SM-to-SM latency); None: not modelled on the device
    dsmem_latency_cycles: Optional[Const] = None

    # ---- derived quantities used by the simulator --------------------------------
    @property
    def clock_hz(self) -> float:
        return self.clock_ghz.value * 1e9

    def pipe_cycles(self, per_clk_sm: float) -> float:
        """Cycles one 32-lane warp instruction occupies its sub-partition pipe."""
        return self.schedulers * 32 / per_clk_sm

    @property
    def hmma_interval(self) -> float:
        """Cycles between two HMMA.16816 on one sub-partition at the mma.sync-class rate."""
        return HMMA_FLOP / (self.mma_flop_per_clk_sm.value / self.schedulers)

    def hgmma_interval(self, n: int) -> float:
        """Cycles one warp's share of an m64nNk16 HGMMA (16 x N x 16, 2 FLOP per MAC) occupies its
        sub-partition's tensor pipe at the datasheet (wgmma) rate: N / 2 on sm_90. Every wgmma type's k step is
        32 bytes of K, and the datasheet rate scales with it (H100/H200 dense: bf16 989, fp8 1979, tf32 495
        TFLOP/s), so the pipe time of any HGMMA.64xNxK is that of the 16-bit m64nNk16."""
        if self.hgmma_latency is None:
            raise ValueError(f"{self.name} ({self.arch}) has no wgmma: an HGMMA cannot run on it")
        return 2 * 16 * n * 16 / (self.datasheet_mma_flop_per_clk_sm.value / self.schedulers)

    @property
    def dram_bytes_per_clk(self) -> float:
        return self.dram_gbs.value * 1e9 * self.dram_efficiency.value / self.clock_hz

    @property
    def l2_bytes_per_clk(self) -> float:
        return self.l2_gbs.value * 1e9 / self.clock_hz

    @property
    def dram_latency_cycles(self) -> float:
        return self.dram_latency_ns.value * 1e-9 * self.clock_hz

    @property
    def mma_tflops(self) -> float:
        return self.mma_flop_per_clk_sm.value * self.sms.value * self.clock_hz / 1e12

    def constants(self) -> dict:
        return {k: asdict(v) for k, v in self.__dict__.items() if isinstance(v, Const)}


_SMEM = Const(128, "published", "32 banks x 4 B per clock per SM (CUDA C++ Programming Guide, "
                                "'Shared Memory' section of the compute capability 5.x+ feature chapters)")
_FP32 = Const(128, "published", GUIDE + ": 32-bit floating-point add, multiply, multiply-add = 128")
_INT = Const(64, "published", GUIDE + ": 32-bit integer add / compare / min / max / shift / logical = 64")
_MUFU = Const(16, "published", GUIDE + ": 32-bit reciprocal, rsqrt, log2 (__log2f), exp2, sin, cos = 16")
_SHFL = Const(32, "published", GUIDE + ": warp shuffle = 32")
_CVT = Const(16, "assumed", GUIDE + " lists 16/clk/SM for 32-bit to narrower conversions on most 8.x parts; "
                            "the exact 9.0 / 12.x figure for F2FP.BF16 packs was not found", lo=16, hi=64,
             why_range="16 (the 8.x figure) to 64 (the 16-bit-result conversions' rate in the same table)")
_HMMA_LAT_H200 = Const(25.0, "measured", "bench.ceilings mma_latency on this project's H200, 2026-12-04: one warp, "
                                         "one dependent bf16 m16n8k16 chain timed with clock64, 25.0 cycles "
                                         "(bench/results/h200/ceilings.json); arXiv 2402.13499 Table VII: 24.1 on the "
                                         "H800 (CALIBRATION.md gaps)", lo=24.0, hi=26.0,
                       why_range="the H800's 24.1 published to the measurement rounded up")
_HMMA_LAT_SM120 = Const(25.0, "assumed", "no sm_120 figure: the H200's measured 25.0 cycles (the former assumed 33 came "
                                         "from older papers' Ampere figures)", lo=24.0, hi=33.0,
                        why_range="Hopper's measured 24-25 to the 33 reported for Ampere")
_LDGSTS_H200 = Const(0.37, "measured",
                     "the KV stream probe on this project's H200 (bench/results/h200-run3/kv_stream.json, 2026-12-04): "
                     "with 3,000 cycles of stand-in math per tile, a 32-row tile of 1,152-byte rows takes 0.24 us more "
                     "than a 16-row one at every depth: 0.21 ns per 16-byte cp.async, x 1.795 GHz", lo=0.30, hi=0.45,
                     why_range="the clock (1.6-1.98 GHz) and the lane layouts' spread (v2's 8-rows-per-warp layout "
                               "~15% dearer)")
BULK_PROBE = ("the bulk-copy probe on this project's H200, 2026-12-04 (tests/data/bulk_issue_probe.cu, results "
              "tests/data/bulk_issue_probe_h200.json; clock64 cycles, each number the difference of two copy counts)")
_BULK_COPY_H200 = Const(3.28, "measured",
                        BULK_PROBE + ": 32 warps per SM, each lane issuing 16-byte bulk copies from L2, complete at one "
                        "copy per 3.28 SM cycles per SM (16,384 more copies in 53,660 more cycles, 1 and 132 CTAs "
                        "alike); fewer warps are warp-bound (8 warps: 6.6 cycles per copy, 16: 3.7). Larger rows are "
                        "bound by their bytes (1,152-byte rows: 10.6 cycles per copy on one SM, ~110 B/clk)",
                        lo=2.6, hi=4.0, why_range="+-20%: the probe's own per-copy work (address math, expect_tx) shares "
                                                  "the schedulers at 32 warps, so the unit may be faster; 4.0 for "
                                                  "contention with other traffic")
# the model reads the probe's waterfall iteration (ELECT, 3 R2UR, 2 PLOP3, UBLKCP, BRA.U.ANY) at 15.0 cycles without
# the hold (tests/test_model_bulk.py reads it): 52.0 measured - 15.0 = 37.0
_BULK_ISSUE_H200 = Const(37.0, "measured",
                         BULK_PROBE + ": one warp's waterfall loop (one iteration per copying lane) takes 52.0 SM cycles "
                         "per bulk copy (a round of copies: 79.2 cycles with 1 lane copying, 1,691 with 32) whatever "
                         "the size (16 B or 1,152 B, L2 or DRAM) and with 1 to 8 warps per SM (59 at 16 warps); the "
                         "model reads the loop's other instructions at 15.0 cycles, so a UBLKCP holds its warp 37.0. "
                         "Which instruction of the loop really waits (the R2UR moves or the copy) is not separated",
                         lo=31.0, hi=44.0,
                         why_range="the model's own reading of the rest of the loop (R2UR at the ALU's assumed 4-cycle "
                                   "latency: -6 over the loop) to 16 warps' 59-cycle iterations (+7)")
_ALU_LAT = Const(4, "published", "FFMA/IADD3 dependent latency 4 cycles on Volta and later "
                                 "(arXiv 2402.13499 and 2501.12084 instruction-latency tables)")
_SMEM_LAT = Const(30, "assumed", "shared-memory load latency ~23-33 cycles in Hopper microbenchmarks "
                                 "(arXiv 2501.12084 memory-latency table); LDSM taken as equal; P-06: an L1 hit "
                                 "32.1 cycles on the H800", lo=23, hi=33, why_range="the microbenchmarks' 23-33")
_MUFU_LAT = Const(18, "assumed", "MUFU.EX2 ~ 18-23 cycles in published instruction-latency tables", lo=18, hi=23,
                  why_range="the tables' 18-23")
_SHFL_LAT = Const(24, "assumed", "SHFL ~ 23-33 cycles in published instruction-latency tables", lo=23, hi=33,
                  why_range="the tables' 23-33")
_BAR_LAT = Const(24, "assumed", "CTA barrier release after the last arrival, ~20-30 cycles", lo=20, hi=30,
                 why_range="the ~20-30 cycles commonly measured")
_LAUNCH = Const(2.0, "assumed", "gap per dependent kernel in a replayed CUDA graph (~1-3 us is typical); "
                                "P-17: cuDNN's decode latency floor ~6.4 us on the H200 for a whole small call",
                lo=1.0, hi=3.0, why_range="the ~1-3 us typical of a graph replay's kernel boundary")
_PDL = Const(0.7, "assumed", "with programmatic dependent launch the dependent grid is launched while the "
                             "primary drains; what remains is its grid_dependency_wait (a memory flush) and ramp",
             lo=0.3, hi=1.5, why_range="a memory flush (~0.3 us) to most of a plain launch gap")

H200_RUN = "this project's H200, 2026-12-04 (bench/results/h200/)"
H200 = DeviceModel(
    key="h200", name="H200", arch="sm_90a",
    sms=Const(132, "published", "NVIDIA H200 datasheet (GH100, 132 SMs)"),
    clock_ghz=Const(1.795, "measured", "SM clock under the v2 kernel at 185k: ncu gpc__cycles_elapsed / gpu__time_duration "
                                       "= 542,228 cycles / 302.0 us (bench/results/h200/ncu_raw.csv), " + H200_RUN +
                    "; consistent with the measured wgmma rate (938 TFLOP/s = 132 x 4096 x 1.73 GHz at 100%)",
                    lo=1.60, hi=1.98, why_range="P-05: an H800 under MLA decode load throttled to ~1,600 MHz; "
                                                "1,980 MHz the boost clock nvidia-smi read under load here"),
    dram_gbs=Const(4800, "published", "NVIDIA H200 datasheet: 4.8 TB/s HBM3e"),
    dram_efficiency=Const(4171 / 4800, "measured", "bench.ceilings read sweep of a 1 GiB buffer: 4,171 GB/s, " + H200_RUN,
                          lo=3810 / 4800, hi=4568 / 4800,
                          why_range="3,810 GB/s, the KV stream probe's scattered 1,152-byte rows at its best depth "
                                    "(bench/results/h200-run3/kv_stream.json), to P-17's cuDNN decode, 4,567.7 GB/s "
                                    "(95.2%) on an H200"),
    l2_gbs=Const(17732, "measured", "bench.ceilings L2 read sweep (a quarter of L2, 50 passes): 17.7 TB/s, " + H200_RUN,
                 lo=9700, hi=17732, why_range="RRZE gpu-benches' 9.7 TB/s on an H200 (another access pattern: " + RRZE +
                                              ") to the measurement"),
    dram_latency_ns=Const(1000, "measured", "loaded latency by Little's law from the KV stream probe: 18 KB in flight "
                                            "per SM streamed 2,358 GB/s -> 18,432 B x 132 / 2.358e12 = 1.03 us; "
                                            "36 KB: 3,197 GB/s -> 1.52 us (bench/results/h200-run3/kv_stream.json)",
                          lo=650, hi=1520, why_range="P-06's unloaded H800 DRAM latency (638-652 cycles at 1.755 GHz "
                                                     "= ~370 ns) is far below; 650 ns to the probe's 1.52 us"),
    l2_latency_cycles=Const(265, "published", "P-06: 264.5 cycles per dependent load on an L2-resident footprint, H800 "
                                              "PCIe (HPMLL/NVIDIA-Hopper-Benchmark)",
                            lo=200, hi=370, why_range="RRZE's 200-300 to P-06's TMA-issued 369.1"),
    mma_flop_per_clk_sm=Const(578.3e12 / (132 * 1.795e9), "measured",
                              "bench.ceilings mma_peak (register-resident bf16 m16n8k16, 8 chains per warp, 8 CTAs per "
                              "SM): 578 TFLOP/s, " + H200_RUN + ", at the measured 1.795 GHz: 59% of wgmma's 4096",
                              lo=578.3e12 / (132 * 1.98e9), hi=0.65 * 4096,
                              why_range="the same rate at the 1.98 GHz boost clock, to P-09's 63-65% of the wgmma peak "
                                        "(H800, low confidence)"),
    datasheet_mma_flop_per_clk_sm=Const(4096, "published", CUDNN_FE, lo=937.7e12 / (132 * 1.795e9), hi=4096,
                                        why_range="bench.ceilings' wgmma_peak: 938 TFLOP/s at the measured clock "
                                                  "(97%) to the datasheet"),
    hmma_latency=_HMMA_LAT_H200, smem_bytes_per_clk_sm=_SMEM, smem_latency=_SMEM_LAT, fp32_per_clk_sm=_FP32,
    int_per_clk_sm=_INT, mufu_per_clk_sm=_MUFU, shfl_per_clk_sm=_SHFL, cvt_per_clk_sm=_CVT, alu_latency=_ALU_LAT,
    mufu_latency=_MUFU_LAT, shfl_latency=_SHFL_LAT, bar_latency=_BAR_LAT, launch_us=_LAUNCH, pdl_launch_us=_PDL,
    qmma_speedup=Const(1.0, "derived", "this project's sm_90a cubins (nvcc 13.0): mma.sync .e4m3 is lowered to "
                                       "F2FP.F16.E4M3.UNPACK_B + HMMA.16816.F32 (no QMMA on sm_90; wgmma's 2x fp8 "
                                       "rate is out of reach of mma.sync), so its SASS is read as 16-bit HMMAs"),
    hgmma_latency=Const(58, "measured",
                        "bench.ceilings wgmma_latency, " + H200_RUN + ": 96.1 / 192.1 cycles per (wgmma + wait_group 0) "
                        "round at N = 64 / 256 (clock64); the model reads the same probe loops as 38 / 134 cycles plus "
                        "this constant, so 58 at both N (the assumed 20 before: the wgmma 'latency' tables of arXiv "
                        "2402.13499 time back-to-back wgmmas, N / 2)", lo=54, hi=62,
                        why_range="the two N's agree to the cycle; +-4 for the probe's own loop overhead"),
    ldgsts_cycles_per_chunk=_LDGSTS_H200,
    datasheet_tflops=Const(989.4, "published", CUDNN_FE),
    bulk_copy_cycles=_BULK_COPY_H200, bulk_issue_cycles=_BULK_ISSUE_H200,
    dsmem_latency_cycles=Const(181, "published", "P-08: SM-to-SM latency in a 2-CTA cluster, 181 cycles (rank 0 on SM "
                                                 "110 to rank 1 on SM 111; H800, HPMLL/NVIDIA-Hopper-Benchmark)",
                               lo=181, hi=369, why_range="P-08's 181 (a load) to P-06's TMA-issued L2 latency 369.1: a "
                                                         "bulk copy's own setup may cost what a TMA load's does"),
)

RTX_PRO_6000 = DeviceModel(
    key="rtx-pro-6000", name="RTX PRO 6000 Blackwell", arch="sm_120a",
    sms=Const(188, "published", "NVIDIA RTX PRO 6000 Blackwell datasheet: 24,064 CUDA cores = 188 SMs x 128"),
    clock_ghz=Const(2.617 * 1.795 / 1.98, "derived",
                    "the listed boost 2.617 GHz (503.8 TFLOP/s / (188 SMs x 1024 FLOP/clk/SM)) times the H200's measured "
                    "sustained / boost ratio under tensor load (1.795 / 1.98): 2.37 GHz. P-05: loaded cards run below "
                    "their boost clock", lo=2.257, hi=2.617,
                    why_range="P-03: the 300 W Max-Q part averaged 2,257 MHz under mma.sync load (power cap), to the "
                              "listed boost"),
    dram_gbs=Const(1792, "published", "datasheet: 512-bit GDDR7 at 28 Gbps = 1,792 GB/s"),
    dram_efficiency=Const(0.855, "published", "P-18: cuDNN decode on the RTX PRO 6000 Server Edition reached 1,532 GB/s "
                                              "= 85.5% of 1,792 (NVIDIA/cudnn-frontend decode_sweep)",
                          lo=0.731, hi=0.936, why_range="P-18's batch-1 131k row (73.1%) to FlashInfer's MLA template "
                                                        "on an RTX 4090 (93.6%, DESIGN.md section 7)"),
    l2_gbs=Const(7200, "derived", RRZE + ": gpu-l2-cache/l40.txt measured 5.2 TB/s on the L40 (AD102: 142 SMs, "
                                      "384-bit bus, 96 MB L2, ~2.49 GHz); no GB202 figure found, so scaled by L2 "
                                      "slices (512/384-bit) and clock (2.617/2.49 GHz): 5.2 x 1.33 x 1.05 = 7.2 TB/s",
                 lo=7200, hi=7200 * 17732 / 9700,
                 why_range="on the H200 this project measured 1.83x the RRZE figure (17.7 vs 9.7 TB/s): the same "
                           "factor on the derived 7.2"),
    dram_latency_ns=Const(1000, "assumed", "the H200's measured loaded latency (KV stream probe); GDDR7 unmeasured",
                          lo=700, hi=1520, why_range="GDDR parts' ~500-700 ns unloaded to the H200's loaded 1.52 us"),
    l2_latency_cycles=Const(300, "published", RRZE + " README: L2 latency 200-300 cycles on every GPU measured "
                                               "(AD102's L40 among them); the upper end for the larger GB202",
                            lo=200, hi=370, why_range="RRZE's 200-300 to P-06's TMA-issued 369.1 (H800)"),
    mma_flop_per_clk_sm=Const(1024, "published", CUDNN_FE + "; P-03 measured 1,023.8 FLOP/clk/SM for mma.sync "
                                                 "m16n8k16 (RTX PRO 6000 Max-Q); on sm_120 mma.sync is the native path",
                              lo=1023.8, hi=1024, why_range="P-03's measurement to the vendor figure"),
    datasheet_mma_flop_per_clk_sm=Const(1024, "published", CUDNN_FE),
    hmma_latency=_HMMA_LAT_SM120, smem_bytes_per_clk_sm=_SMEM, smem_latency=_SMEM_LAT, fp32_per_clk_sm=_FP32,
    int_per_clk_sm=_INT, mufu_per_clk_sm=_MUFU, shfl_per_clk_sm=_SHFL, cvt_per_clk_sm=_CVT, alu_latency=_ALU_LAT,
    mufu_latency=_MUFU_LAT, shfl_latency=_SHFL_LAT, bar_latency=_BAR_LAT, launch_us=_LAUNCH, pdl_launch_us=_PDL,
    qmma_speedup=Const(2.0, "published", "RTX PRO 6000 Blackwell specifications (NVIDIA's 4,000 AI TOPS, FP4 "
                                         "sparse; per-precision table e.g. hmc-tech.com/gpu): FP8 1.01 PFLOPS dense "
                                         "with FP32 accumulate vs BF16 503.8 TFLOPS: QMMA.16832 at 2x HMMA.16816's "
                                         "FLOP rate (same issue interval, twice the k); P-01: fp8 2048 vs bf16 1024 "
                                         "FLOP/clk/SM on sm_12x"),
    ldgsts_cycles_per_chunk=Const(0.37, "assumed", "the H200's measured cost (KV stream probe); no sm_120 measurement",
                                  lo=0.30, hi=0.60, why_range="the H200's range, and up to 0.6 for a narrower L1 path"),
    datasheet_tflops=Const(503.8, "published", CUDNN_FE + " (RTX PRO 6000: 503.8 dense bf16 TFLOPS, fp32 accumulate)"),
    bulk_copy_cycles=Const(3.28, "assumed", "the H200's measured TMA request rate (" + BULK_PROBE + "); no sm_120 "
                                            "measurement. A public RTX 5090 (sm_120a) benchmark found cp.async.bulk "
                                            "tiles slower than cp.async at 16-32 KB (kekzl/imp PR #169: 'fixed setup "
                                            "overhead per tile')", lo=2.6, hi=8.0,
                           why_range="the H200's range, up to 8 for a slower TMA unit on the workstation part"),
    bulk_issue_cycles=Const(37.0, "assumed", "the H200's measured hold of a UBLKCP on its warp (" + BULK_PROBE +
                                             "); no sm_120 measurement", lo=31.0, hi=60.0,
                            why_range="the H200's range, up to 60 for a slower issue path on sm_120"),
    notes=("A public hand-written mma.sync GEMM reached 243 TFLOP/s on the 300 W Max-Q part "
           "(DESIGN.md section 5): the workstation card's sustained clock under tensor load may sit below 2.617 GHz.",),
)

# The H100 SXM5 (the device tool's `nvidia-h100-x1`, "NVIDIA H100 80GB HBM3"; a session's first plain `run` gets one):
# the same GH100 die as the H200 (132 SMs, the same clocks, 700 W, tensor and shared-memory rates), with 3.35 TB/s of
# HBM3 instead of 4.8 TB/s of HBM3e and 50 MB of L2. Every constant the die sets is the H200's, measured there; the
# DRAM bandwidth is the datasheet's, and the streaming fraction the H200's measured one (the workplace's device notes
# saw the same device-to-device copy fraction on both parts). No H100 figure here is this project's measurement.
H100 = replace(
    H200, key="h100", name="H100",
    dram_gbs=Const(3350, "published", "NVIDIA H100 SXM5 datasheet: 3.35 TB/s HBM3 (80 GB)"),
    dram_efficiency=Const(4171 / 4800, "assumed",
                          "the H200's measured read-sweep fraction (4,171 of 4,800 GB/s, " + H200_RUN + "); the "
                          "workplace's device notes (.library/device/KINDS.md, 2026-11) saw one device-to-device "
                          "copy fraction on both parts: ~3.0 of 3.35 TB/s on the H100, ~4.3 of 4.8 on the H200 "
                          "(0.90 each, bytes read + written)",
                          lo=3810 / 4800, hi=4568 / 4800, why_range="the H200's range (its fractions)"),
    notes=("the H200's model (the same GH100 die: 132 SMs, clocks, tensor and shared-memory rates, latencies, all "
           "measured on this project's H200) with the H100 SXM5's HBM3: 3.35 TB/s; not yet measured on an H100",),
)

# DEVICES: the reference device of each arch (what `--arch sm_90a` and every table read); MODELLED adds the parts a
# device model exists for beside them (`--arch h100`, bench.model.predict("h100", ...), --calibrate on an H100 run)
DEVICES: dict[str, DeviceModel] = {d.key: d for d in (RTX_PRO_6000, H200)}
MODELLED: dict[str, DeviceModel] = {**DEVICES, H100.key: H100}
ARCH_OF = {d.key: d.arch for d in DEVICES.values()}


def get_device(key: str) -> DeviceModel:
    k = key.strip().lower().replace("_", "-")
    aliases = {"rtx-pro": "rtx-pro-6000", "rtxpro6000": "rtx-pro-6000", "sm-120a": "rtx-pro-6000", "sm-90a": "h200",
               "h100-sxm": "h100", "h100-sxm5": "h100"}
    k = aliases.get(k, k)
    if k not in MODELLED:
        raise ValueError(f"unknown device {key!r}; known: {', '.join(MODELLED)}")
    return MODELLED[k]


def device_for_gpu(gpu_name: Optional[str]) -> Optional[DeviceModel]:
    """The device model of a GPU by its CUDA name ('NVIDIA H200' -> H200, 'NVIDIA H100 80GB HBM3' -> H100,
    'NVIDIA RTX PRO 6000 Blackwell Server Edition' -> RTX_PRO_6000), None for a part no model describes (the
    H100 PCIe and NVL: bench.core.roofline's table of parts that share a name)."""
    from bench.core.roofline import is_other_part
    n = (gpu_name or "").lower()
    for d in MODELLED.values():
        if (d.name.lower() in n or d.key.replace("-", " ") in n) and not is_other_part(d.key, n):
            return d
    return None
