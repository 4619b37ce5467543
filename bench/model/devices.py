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

from dataclasses import asdict, dataclass, field
from typing import Optional


@dataclass(frozen=True)
class Const:
    value: float
    kind: str      # published | derived | measured | assumed
    source: str

    def __post_init__(self):
        if self.kind not in ("published", "derived", "measured", "assumed"):
            raise ValueError(f"bad constant kind {self.kind!r}")


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
    schedulers: int = 4
    notes: tuple[str, ...] = field(default_factory=tuple)
    # wgmma (sm_90a): cycles from the end of an HGMMA's tensor-pipe time to its commit group's completion
    # (what WARPGROUP.DEPBAR waits for); None on a device without wgmma
    hgmma_latency: Optional[Const] = None

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
                            "the exact 9.0 / 12.x figure for F2FP.BF16 packs was not found")
_HMMA_LAT = Const(33, "assumed", "HMMA.16816 fp32-accumulate dependent latency ~32-33 cycles reported by Ampere "
                                 "and Hopper microbenchmark papers (e.g. arXiv 2402.13499's tensor-core latency "
                                 "tables); no sm_120 figure found. Calibrate with a 1-chain mma_peak run")
_ALU_LAT = Const(4, "published", "FFMA/IADD3 dependent latency 4 cycles on Volta and later "
                                 "(arXiv 2402.13499 and 2501.12084 instruction-latency tables)")
_SMEM_LAT = Const(30, "assumed", "shared-memory load latency ~23-33 cycles in Hopper microbenchmarks "
                                 "(arXiv 2501.12084 memory-latency table); LDSM taken as equal")
_MUFU_LAT = Const(18, "assumed", "MUFU.EX2 ~ 18-23 cycles in published instruction-latency tables")
_SHFL_LAT = Const(24, "assumed", "SHFL ~ 23-33 cycles in published instruction-latency tables")
_BAR_LAT = Const(24, "assumed", "CTA barrier release after the last arrival, ~20-30 cycles")
_LAUNCH = Const(2.0, "assumed", "gap per dependent kernel in a replayed CUDA graph (~1-3 us is typical); "
                                "measured per device by bench.gpu_check's model stage")
_PDL = Const(0.7, "assumed", "with programmatic dependent launch the dependent grid is launched while the "
                             "primary drains; what remains is its grid_dependency_wait (a memory flush) and ramp")

H200 = DeviceModel(
    key="h200", name="H200", arch="sm_90a",
    sms=Const(132, "published", "NVIDIA H200 datasheet (GH100, 132 SMs)"),
    clock_ghz=Const(1.83, "derived", "989.4 TFLOP/s dense bf16 / (132 SMs x 4096 FLOP/clk/SM); " + CUDNN_FE),
    dram_gbs=Const(4800, "published", "NVIDIA H200 datasheet: 4.8 TB/s HBM3e"),
    dram_efficiency=Const(4300 / 4800, "measured", "~4.3 TB/s device-to-device copy measured on this project's "
                                                   "H200 machine in earlier sessions (shared/FACTS.md)"),
    l2_gbs=Const(9700, "published", RRZE + ": gpu-l2-cache/h200.txt, 9.7-10 TB/s for data sets of 5-40 MB "
                                        "(H100 PCIe 7.0, A100 5.4 in the same benchmark)"),
    dram_latency_ns=Const(600, "assumed", "loaded HBM latency; unloaded ~480-550 ns in Hopper microbenchmarks"),
    l2_latency_cycles=Const(270, "published", RRZE + " README: L2 latency 200-300 cycles on every GPU measured"),
    mma_flop_per_clk_sm=Const(4096 * 2 / 3, "assumed",
                              "mma.sync (HMMA) on Hopper reaches about 2/3 of the wgmma peak: the figure commonly "
                              "cited with the FlashAttention-3 paper (arXiv 2407.08608) and consistent with "
                              "DESIGN.md ('well under the wgmma peak'); bench.ceilings' mma_peak measures it"),
    datasheet_mma_flop_per_clk_sm=Const(4096, "published", CUDNN_FE),
    hmma_latency=_HMMA_LAT, smem_bytes_per_clk_sm=_SMEM, smem_latency=_SMEM_LAT, fp32_per_clk_sm=_FP32,
    int_per_clk_sm=_INT, mufu_per_clk_sm=_MUFU, shfl_per_clk_sm=_SHFL, cvt_per_clk_sm=_CVT, alu_latency=_ALU_LAT,
    mufu_latency=_MUFU_LAT, shfl_latency=_SHFL_LAT, bar_latency=_BAR_LAT, launch_us=_LAUNCH, pdl_launch_us=_PDL,
    qmma_speedup=Const(1.0, "derived", "this project's sm_90a cubins (nvcc 13.0): mma.sync .e4m3 is lowered to "
                                       "F2FP.F16.E4M3.UNPACK_B + HMMA.16816.F32 (no QMMA on sm_90; wgmma's 2x fp8 "
                                       "rate is out of reach of mma.sync), so its SASS is read as 16-bit HMMAs"),
    hgmma_latency=Const(20, "assumed",
                        "no published completion latency of one wgmma beyond its pipe time: the wgmma 'latency' "
                        "tables (arXiv 2402.13499 Table VIII: m64n256k16 128.0 cycles; m64n64k16 32 / m64n128k16 64 "
                        "/ m64n256k16 128 as quoted in arXiv 2512.02189) equal N / 2, the tensor-pipe time at 4096 "
                        "FLOP/clk/SM, i.e. they time back-to-back wgmmas. The drain + accumulator write-back + "
                        "scoreboard release after the pipe is taken as ~HMMA.16816's pipeline depth (24 cycles "
                        "dependent latency on the H800, arXiv 2402.13499 Table VII, less its ~6-8 cycle pipe "
                        "time), rounded to 20. bench.ceilings' wgmma_latency_cycles measures it (round - N / 2)"),
)

RTX_PRO_6000 = DeviceModel(
    key="rtx-pro-6000", name="RTX PRO 6000 Blackwell", arch="sm_120a",
    sms=Const(188, "published", "NVIDIA RTX PRO 6000 Blackwell datasheet: 24,064 CUDA cores = 188 SMs x 128"),
    clock_ghz=Const(503.8e12 / (188 * 1024) / 1e9, "derived",
                    "503.8 TFLOP/s dense bf16 (bench/roofline.py) / (188 SMs x 1024 FLOP/clk/SM) = 2.617 GHz, "
                    "the card's listed boost clock"),
    dram_gbs=Const(1792, "published", "datasheet: 512-bit GDDR7 at 28 Gbps = 1,792 GB/s"),
    dram_efficiency=Const(0.93, "assumed", "FlashInfer's MLA template reached 93.6% of peak bandwidth on an RTX 4090 "
                                           "(GDDR6X; DESIGN.md section 7); GDDR7 taken as alike"),
    l2_gbs=Const(7200, "derived", RRZE + ": gpu-l2-cache/l40.txt measured 5.2 TB/s on the L40 (AD102: 142 SMs, "
                                      "384-bit bus, 96 MB L2, ~2.49 GHz); no GB202 figure found, so scaled by L2 "
                                      "slices (512/384-bit) and clock (2.617/2.49 GHz): 5.2 x 1.33 x 1.05 = 7.2 TB/s"),
    dram_latency_ns=Const(700, "assumed", "loaded GDDR7 latency (GDDR parts measure ~500-700 ns unloaded)"),
    l2_latency_cycles=Const(300, "published", RRZE + " README: L2 latency 200-300 cycles on every GPU measured "
                                               "(AD102's L40 among them); the upper end for the larger GB202"),
    mma_flop_per_clk_sm=Const(1024, "published", CUDNN_FE + "; on sm_120 mma.sync is the native tensor path"),
    datasheet_mma_flop_per_clk_sm=Const(1024, "published", CUDNN_FE),
    hmma_latency=_HMMA_LAT, smem_bytes_per_clk_sm=_SMEM, smem_latency=_SMEM_LAT, fp32_per_clk_sm=_FP32,
    int_per_clk_sm=_INT, mufu_per_clk_sm=_MUFU, shfl_per_clk_sm=_SHFL, cvt_per_clk_sm=_CVT, alu_latency=_ALU_LAT,
    mufu_latency=_MUFU_LAT, shfl_latency=_SHFL_LAT, bar_latency=_BAR_LAT, launch_us=_LAUNCH, pdl_launch_us=_PDL,
    qmma_speedup=Const(2.0, "published", "RTX PRO 6000 Blackwell specifications (NVIDIA's 4,000 AI TOPS, FP4 "
                                         "sparse; per-precision table e.g. hmc-tech.com/gpu): FP8 1.01 PFLOPS dense "
                                         "with FP32 accumulate vs BF16 503.8 TFLOPS: QMMA.16832 at 2x HMMA.16816's "
                                         "FLOP rate (same issue interval, twice the k)"),
    notes=("A public hand-written mma.sync GEMM reached 243 TFLOP/s on the 300 W Max-Q part "
           "(DESIGN.md section 5): the workstation card's sustained clock under tensor load may sit below 2.617 GHz.",),
)

DEVICES: dict[str, DeviceModel] = {d.key: d for d in (RTX_PRO_6000, H200)}
ARCH_OF = {d.key: d.arch for d in DEVICES.values()}


def get_device(key: str) -> DeviceModel:
    k = key.strip().lower().replace("_", "-")
    aliases = {"rtx-pro": "rtx-pro-6000", "rtxpro6000": "rtx-pro-6000", "sm_120a": "rtx-pro-6000",
               "sm-120a": "rtx-pro-6000", "sm_90a": "h200", "sm-90a": "h200"}
    k = aliases.get(k, k)
    if k not in DEVICES:
        raise ValueError(f"unknown device {key!r}; known: {', '.join(DEVICES)}")
    return DEVICES[k]
