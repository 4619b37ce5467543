"""Build tooling of the CUDA kernel family: toolkit discovery, the kernel
family table, the ptxas resource report, and the setup.py AOT extension list.

    python -m verify_attn.build --arch sm_90a,sm_120a --report [--json PATH]

compiles every instantiation file (csrc/tree_verify/instantiations/*.cu) with
nvcc directly (no torch headers; one nvcc call per file with one -gencode per
architecture; no GPU needed), parses the `-Xptxas=-v` output and prints, per
kernel and architecture, registers, shared memory (static from ptxas + the
dynamic bytes the launch passes, from the tile config), spill stores/loads and
local memory (stack frame). It exits 1 if any kernel spills, uses local memory,
or exceeds the per-block shared memory limit (99 KB on sm_120, 227 KB on sm_90),
and 2 if a compile fails. Results are cached per file by a hash of the sources,
flags and nvcc version, so reruns are instant.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterable, Optional

REPO = Path(__file__).resolve().parent.parent
CSRC = REPO / "csrc"
TV = CSRC / "tree_verify"
INST_DIR = TV / "instantiations"

# --------------------------------------------------------------------------
# The kernel family (mirrors csrc/tree_verify/config.h; tests/test_host_math.py
# checks the two agree through the host module).
# --------------------------------------------------------------------------

# head key -> (Dqk, Dv, V shares the K row)
HEADS: dict[str, tuple[int, int, bool]] = {
    "mla576": (576, 512, True),
    "gqa64": (64, 64, False),
    "gqa128": (128, 128, False),
    "gqa256": (256, 256, False),
    "mla576e4m3": (576, 512, True),  # e4m3 caches (TilesForFp8<HeadMLA>): q / out bf16 or fp16
    "mla576x656": (576, 512, True),  # FlashMLA's 656-byte fp8 MLA rows (TilesFor656<HeadMLA>)
    "gqa128e4m3": (128, 128, False),  # e4m3 caches (TilesForFp8<HeadG128>): kernel v1's f16 tile
    "gqa64e4m3": (64, 64, False),     # e4m3 caches (TilesForFp8<HeadG64>): the f16 tile on 4 warps
    "gqa256e4m3": (256, 256, False),  # e4m3 caches (TilesForFp8<HeadG256>): kernel v1's f16 tile
}
# head key -> its e4m3-cache variant (VA_TV_INSTANTIATE_FP8); the heads that have one
FP8_HEADS: dict[str, str] = {"mla576": "mla576e4m3", "gqa64": "gqa64e4m3", "gqa128": "gqa128e4m3",
                             "gqa256": "gqa256e4m3"}
# head key -> its 656-byte-row variant (VA_TV_INSTANTIATE_656)
MLA656_HEADS: dict[str, str] = {"mla576": "mla576x656"}
# K row bytes in the cache where they are not Dqk x the element size
KV_ROW_BYTES: dict[str, int] = {"mla576x656": 656}


@dataclass(frozen=True)
class Tile:
    block_m: int     # BM rows per CTA
    block_n: int     # BN KV tokens per tile
    warps_m: int     # WM: v0, warps along M (16 rows each); v1, warps splitting the m tiles in S
    warps_n: int     # WN: v0, warps sharing 16 rows (tokens for S, Dv for O); v1, KSPLIT (Dqk split for S)
    num_stages: int  # cp.async stages
    version: int = 0  # 0: tree_verify_kernel.cuh (TileConfig), 1: ..._v1.cuh (TileConfigV1), 2: ..._v2.cuh (wgmma),
    #                   3: sm90/tree_verify_kernel_v3.cuh (TileConfigV3: Hopper's producer warpgroup + seesaw)
    sn: int = 1       # v1: warps splitting the tile's tokens in S (SN)
    archs: tuple[str, ...] = ("sm_90a", "sm_120a")  # the archs whose per-block shared memory it fits
    fp8_mma: int = 1  # e4m3 caches: 1, products on e4m3 MMAs; 0, K / V converted to f16, f16 MMAs
    bars: int = 2     # v1: CTA barriers per KV tile (1: S two tiles ahead, partial scores double-buffered)
    # v1: 0, cp.async 16-byte chunks; 1, one cp.async.bulk per KV row on the stage's mbarrier; 2, kernel v3: a producer
    # warp beside the num_warps math warps (32 x num_warps + 32 threads) issues the bulk copies on FULL / EMPTY mbarriers;
    # 3, kernel v3 with a producer warpgroup (+ 128 threads; setmaxnreg moves its registers to the math warps, which
    # run v1's two-tile loop); 4, kernel v3 with a producer warpgroup and math roles (num_warps - 4 = 16 math warps:
    # 8 S-and-softmax warps, 8 PV warps)
    loader: int = 0

    def targets(self, arch: str) -> bool:
        return normalize_arch(arch) in self.archs

    @property
    def num_warps(self) -> int:
        """The block's warps (the key a config selects the tile by): v3's math warps + its producer warp(group)."""
        if self.version == 3:  # kernel v3 for Hopper: 2 consumer warpgroups (4 x 2 warps) + the producer warpgroup
            return self.warps_m * self.warps_n + 4
        return self.warps_m * self.warps_n + {2: 1, 3: 4, 4: 4}.get(self.loader, 0)

    @property
    def cluster(self) -> int:
        """CTAs of a thread-block cluster sharing each KV block's gather: Hopper's v3 at block_m 128 is two 64-row
        CTAs (TileConfigV3<128, ...>, kCluster 2); every other tile 1."""
        return self.block_m // 64 if self.version == 3 else 1

    @property
    def cta_m(self) -> int:
        """Rows one CTA holds: block_m, or a cluster tile's block_m over its CTAs (the grid's M tiles count these)."""
        return self.block_m // self.cluster

    @property
    def ksplit(self) -> int:
        return self.warps_n if self.version >= 1 else 1

    @property
    def blocks_per_iter(self) -> int:
        """KV tiles one iteration of the split kernel's loop runs: Hopper's v3 runs its 64-token blocks in pairs (block
        2i + s in stage s; an odd count runs a phantom block), every other kernel one tile."""
        return self.num_stages if self.version == 3 else 1

    @property
    def sm120_v3(self) -> bool:
        """sm_120's kernel v3: v1's math (version 1) with a producer warp or warpgroup (loader >= 2)."""
        return self.version == 1 and self.loader >= 2

    @property
    def kernel_version(self) -> int:
        """The kernel version its label names: 3 for sm_120's v3 tiles, as in bench.model's names and the backend's
        "v3-sm120" pin; else `version`."""
        return 3 if self.sm120_v3 else self.version

    @property
    def family(self) -> str:
        """The kernel a tile is a size of, by the backend's pin names: v0, v1, v2, v3 (Hopper's), v3-sm120."""
        return "v3-sm120" if self.sm120_v3 else f"v{self.version}"

    def label(self) -> str:
        """'v3 m32 n16 w20 s4 k2 sn2 producer-wg roles': the tile in bench.model's kernel names (label_family reads
        one back)."""
        base = f"m{self.block_m} n{self.block_n} w{self.num_warps} s{self.num_stages}"
        if self.version == 2:
            return f"v2 {base} wg{self.warps_n} wgmma"
        if self.version == 3:
            return f"v3 {base} sm90 seesaw" + (f" cluster{self.cluster}" if self.cluster > 1 else "")
        if self.sm120_v3:
            return f"v3 {base} k{self.ksplit} sn{self.sn} " + {2: "producer", 3: "producer-wg"}.get(self.loader,
                                                                                                   "producer-wg roles")
        return (f"v1 {base} k{self.ksplit} sn{self.sn}" + ("" if self.fp8_mma else " f16")
                + (" b1" if self.bars == 1 else "") + (" bulk" if self.loader else "") if self.version == 1 else base)


# a Tile.label inside a name (bench.model's kernel names embed it): version, block_m, block_n, warps, stages; v0's
# labels carry no version ('split bf16 576x512 page1 m16 n32 w4 s2')
LABEL_RE = re.compile(r"(?:^|\s)(?:v(\d) )?m(\d+) n(\d+) w(\d+) s(\d+)\b")


def label_family(name: str) -> Optional[str]:
    """The family (Tile.family: v0, v1, v2, v3, v3-sm120) of the tile whose label stands in `name`; None if none
    does. sm_120's v3 is v1's math with a producer ('v3 m32 n16 w20 s4 k2 sn2 producer-wg roles'), Hopper's v3 the
    seesaw ('v3 m64 n64 w12 s2 sm90 seesaw'): two kernels, which labels and `bench.model --validate` keep apart."""
    m = LABEL_RE.search(name or "")
    if not m:
        return None
    v = int(m.group(1) or 0)
    return "v3-sm120" if v == 3 and " producer" in name else f"v{v}"


# the fp8 caches' f16 tile (TileFp8F16 in config.h): K / V converted to f16 in registers, f16 MMAs
_FP8_F16_TILE = Tile(32, 32, 4, 2, 3, version=1, sn=2, fp8_mma=0)
# v1's sm_90-only tile (199 KB: 32 tokens x 4 stages, one barrier per tile)
_V1_SM90_TILE = Tile(32, 32, 2, 4, 4, version=1, sn=2, archs=("sm_90a",), bars=1)
# v1 with the bulk loader (cp.async.bulk per KV row, mbarrier stages, the rows spread over the warps), sm_90a
# only, one barrier per tile: 16 tokens x 8 stages (5 tiles, 92 KB, in flight while 3 are read), Dqk split 4;
# 32 tokens x 5 stages (2 tiles, 75 KB, in flight), Dqk split 2
_V1_BULK_S8 = Tile(32, 16, 2, 4, 8, version=1, sn=2, archs=("sm_90a",), bars=1, loader=1)
_V1_BULK_N32 = Tile(32, 32, 4, 2, 5, version=1, sn=2, archs=("sm_90a",), bars=1, loader=1)
# kernel v3 (issue 39): v1's math on 8 math warps + 1 producer warp (cp.async.bulk per KV row, FULL / EMPTY mbarriers,
# named barriers among the math warps), 32 rows x 16 tokens x 4 stages, one tile at a time (3 in flight), Dqk split 4,
# M 2: 90,048 B (TileMlaV3 in config.h), for sm_120a; also built for sm_90a (the H200 as a proxy). Selected by its
# block's 9 warps: backend "cuda@m32n16w9s4"; no arch's default until a GPU has timed it.
V3_TILE = Tile(32, 16, 2, 4, 4, version=1, sn=1, bars=2, loader=2)
# kernel v3 on e4m3 and 656-byte rows (TileMlaV3Fp8): the e4m3-MMA tile's math (32 tokens, S warps 2 x 2 x 2) on the
# same roles, 89,664 B (e4m3) / 100,928 B (656); built for sm_90a too, where nvcc lowers the e4m3 MMAs to f16 HMMAs
# (the H200 runs the same source as the sm_120 proxy): backend "cuda@m32n32w9s4". (On 656-byte rows, with the 168
# registers 9 warps allow, it spilled 12 B on sm_90a until its S recomputed the lane's K address each tile,
# arch::lane_id_fresh; 40 B before P V ran on arch::E4m3OnSm90::kF16)
V3_FP8_TILE = Tile(32, 32, 4, 2, 4, version=1, sn=2, bars=2, loader=2)
# kernel v3 with a producer warpgroup (TileMlaV3Wg / TileMlaV3WgFp8): the producer's 4 warps drop to 40 registers
# (setmaxnreg.dec), the 8 math warps rise to 232 and run v1's two-tile loop on v1's sm_120 tiles (bf16: 32 x 16, S
# warps 4 x 2, Q 72 registers; e4m3 / 656: 32 x 32, S warps 2 x 2 x 2): 90,560 / 89,664 / 100,928 B.
# Backends "cuda@m32n16w12s4" (bf16) and "cuda@m32n32w12s4" (fp8; on 656-byte rows the H200's "cuda@v3-sm120": there
# ptxas's lowering of the e4m3 MMAs spilled 12 B at 232 registers, arch::E4m3OnSm90::kF16 none)
V3_WG_TILE = Tile(32, 16, 2, 4, 4, version=1, sn=2, bars=2, loader=3)
V3_WG_FP8_TILE = Tile(32, 32, 4, 2, 4, version=1, sn=2, bars=2, loader=3)
# ... and with math roles on e4m3 rows (TileMlaV3RolesFp8): S warps 2 (dims) x 2 (tokens) x 2 (M), 8 PV warps:
# 99,520 B (two sets of partial scores: its S warps issue S(i + 1) before the softmax of i); backend "cuda@m32n32w20s4",
# and "cuda@v3-sm120" on either arch (backends/cuda.py, v3_sm120_tile). On sm_90a, which lowers the e4m3 MMAs to f16
# HMMAs, P V runs on arch::E4m3OnSm90::kF16: ptxas's own lowering spilled 72 B at 112 registers.
# The same tile on 656-byte rows (100,544 B): the S warps hand over one unscaled f16 P, each PV warp scales it by its
# own block's scales (traits.h, k656Roles). Built for sm_90a too since its PV warps take rcp.approx reciprocals,
# rescale O before building P's fragments and run P V m tile by m tile (20 B of spills before, 88 B before kF16)
V3_ROLES_FP8_TILE = Tile(32, 32, 8, 2, 4, version=1, sn=2, bars=2, loader=4)
# kernel v3 with math roles (TileMlaV3Roles, 20 warps; setmaxnreg: the launch's 96 registers to 32 for the producer
# warpgroup, 112 for the math warps): 8 S warps (S split 2 (dims) x 2 (tokens) x 2 (M), and the softmax) and 8 PV warps
# (64 Dv columns each), P double-buffered between them on named barriers, so the softmax of a tile runs under P V's MMAs
# of the one before; the S warps issue S(i + 1) before the softmax of i (two sets of partial scores). 90,176 B.
# Backend "cuda@m32n16w20s4", and "cuda@v3-sm120" (on either arch: the fastest v3 tile for sm_120 by the model)
V3_ROLES_TILE = Tile(32, 16, 8, 2, 4, version=1, sn=2, bars=2, loader=4)
# kernel v3 for Hopper (issue 40; TileMlaV3Sm90 = TileConfigV3<64, 64, 2>, csrc/tree_verify/sm90/): a producer warpgroup
# gathers 64-token blocks into 128-byte-swizzled stages (16-byte cp.async, FULL / EMPTY mbarriers), two consumer
# warpgroups run FlashMLA's seesaw (S of one block each over all 576 dims, O's 512 columns split between them), 64 rows,
# 2 stages: 224,320 B, sm_90a only. Backend "cuda@v3" (or "cuda@m64n64w12s2"); no arch's default until a GPU timed it.
V3_SM90_TILE = Tile(64, 64, 4, 2, 2, version=3, archs=("sm_90a",))
# ... as a 2-CTA cluster (TileMlaV3Sm90Cluster = TileConfigV3<128, 64, 2>): the two 64-row CTAs of a split each gather
# half of every block's rows (16-byte cp.async) and forward them to the other with one bulk copy per 4 KB half dim
# block through distributed shared memory, halving each producer's cp.async issue and the split's L2 reads; the
# consumers free a stage half in both CTAs. 224,368 B a CTA, 16-bit caches, sm_90a only. Backend "cuda@v3-cluster" (or
# "cuda@m128n64w12s2")
V3_SM90_CLUSTER_TILE = Tile(128, 64, 4, 2, 2, version=3, archs=("sm_90a",))
# v2 (wgmma, sm_90a only): 64 rows, 2 warpgroups (4 warps x 16 rows each; Dqk / Dv halves)
_V2_TILE = Tile(64, 32, 4, 2, 3, version=2, archs=("sm_90a",))
# v2 on e4m3 caches: both products on wgmma .e4m3 (k32), V transposed per tile into a V^T buffer, 4 stages
_V2_FP8_TILE = Tile(64, 32, 4, 2, 4, version=2, archs=("sm_90a",))

# head key -> compiled tile configs, default first (TilesFor<...> in config.h). A config is
# selected by (block_m, block_n, num_warps, num_stages), unique across kernel versions: v0's
# MLA tiles (32x16 w4 s3, 16x32 w4 s2) stay selectable next to v1's.
TILES: dict[str, list[Tile]] = {
    "mla576": [Tile(32, 16, 2, 4, 4, version=1, sn=2), Tile(32, 16, 2, 4, 3, version=1, sn=2),
               _V1_SM90_TILE, Tile(32, 16, 2, 2, 3), Tile(16, 32, 1, 4, 2), _V2_TILE, _V1_BULK_S8, _V1_BULK_N32,
               V3_TILE, V3_WG_TILE, V3_ROLES_TILE, V3_SM90_TILE, V3_SM90_CLUSTER_TILE],
    # e4m3 caches: 32 tokens (one k step of the e4m3 P.V MMA), S warps 2 (dims) x 2 (tokens) x 2 (M)
    # The e4m3-MMA tile is sm_120's (4 stages, two barriers per tile: two tiles in flight in 91 KB): on sm_90
    # nvcc lowers its MMAs to f16 HMMAs (no e4m3 rate there). The f16 tile keeps Q and P exact (any arch); the H200's
    # default is kernel v2 on wgmma .e4m3 (DEFAULT_TILE).
    # Hopper's v3 (V3_SM90_TILE) too, on wgmma .e4m3: P V swapped (O^T = V^T P^T, V^T's fragments from the rows)
    "mla576e4m3": [Tile(32, 32, 4, 2, 4, version=1, sn=2, archs=("sm_120a",)), _FP8_F16_TILE,  # f16: the exact one
                   _V2_FP8_TILE, V3_FP8_TILE, V3_WG_FP8_TILE, V3_ROLES_FP8_TILE, V3_SM90_TILE],
    # 656-byte rows: sm_120's tile on e4m3 MMAs (per-block scales on S's block sums and on P, RoPE in q's type;
    # 4 stages, two tiles in flight, 100,864 B); the f16 tile is the H200's and the exact one
    "mla576x656": [Tile(32, 32, 4, 2, 4, version=1, sn=2, archs=("sm_120a",)), _FP8_F16_TILE, V3_FP8_TILE,
                   V3_WG_FP8_TILE, V3_ROLES_FP8_TILE],
    # GQA: the f16 tile with deeper rings than MLA's (a GQA stage is 4.6-17 KB): 6 stages at d128, 4 at d256 (5
    # would pass sm_120's 99 KB), the 3-stage tile kept; d64 on 4 warps (8 would leave each 8 Dv columns, under
    # the n16 pair of ldmatrix .trans: TileFp8F16W4)
    "gqa128e4m3": [Tile(32, 32, 4, 2, 6, version=1, sn=2, fp8_mma=0), _FP8_F16_TILE],
    "gqa256e4m3": [Tile(32, 32, 4, 2, 4, version=1, sn=2, fp8_mma=0), _FP8_F16_TILE],
    "gqa64e4m3": [Tile(32, 32, 2, 2, 6, version=1, sn=2, fp8_mma=0)],
    "gqa64": [Tile(64, 64, 4, 1, 2)],
    # GQA 128 bf16: v0's m64 tile stays the default (measured on the H200: 144.5 us at 185k / 16 nodes); kernel v1
    # (V rows apart from K's, 4 stages, 87 KB) is a candidate the autotuner times and the model reads
    "gqa128": [Tile(64, 32, 4, 1, 2), Tile(128, 32, 8, 1, 2), Tile(32, 32, 4, 2, 4, version=1, sn=2)],
    "gqa256": [Tile(32, 32, 2, 2, 2)],
}
# The default tile per (head, arch): the first compiled tile the arch can run, unless named here
# (python -m bench.model reads both archs' SASS to choose; the autotuner refines per context).
DEFAULT_TILE: dict[tuple[str, str], Tile] = {
    # sm_90: the wgmma kernel v2, 148.4 us [132-169] vs v1's 345.7 [306-389] by the corrected model at 185k / 16
    # nodes (NOTES.md, "L2 prefetches in kernel v2"); v1 keeps the shorter contexts in the autotuner's hands
    ("mla576", "sm_90a"): _V2_TILE,
    # sm_120: the two-barrier 4-stage tile (Dqk split 4 ways, 92 KB; two tiles in flight), 215.5 us by the
    # model at 185k / 16 nodes against 430-433 for the 3-stage tile and the one-barrier 4-stage one it replaced
    # (one tile in flight each: latency-bound; NOTES.md, "Two tiles in flight on sm_120"); the 3-stage tile
    # stays compiled for the autotuner
    ("mla576", "sm_120a"): Tile(32, 16, 2, 4, 4, version=1, sn=2),
    # e4m3 caches on sm_90: kernel v2 on wgmma .e4m3 (k32), 97.7 us [88-110] by the model at 185k / 16 nodes
    # against 296.0 for the f16 tile (mma.sync has no e4m3 rate on sm_90: nvcc lowers it to f16 HMMAs); the f16
    # tile, exact in Q and P, stays compiled (NOTES.md, "Kernel v2 on e4m3 caches")
    ("mla576e4m3", "sm_90a"): _V2_FP8_TILE,
    ("mla576x656", "sm_90a"): _FP8_F16_TILE,
}


# The tile a kernel version pinned with cuda@vN uses on an arch when the arch's default is another version
# (cuda@v1 on the H200 keeps v1's own sm_90 tile); else that version's first tile the arch runs.
VERSION_DEFAULT_TILE: dict[tuple[str, str, int], Tile] = {("mla576", "sm_90a", 1): _V1_SM90_TILE}


def normalize_arch(arch: str) -> str:
    return {"sm_90": "sm_90a", "sm_120": "sm_120a"}.get(arch, arch)


def default_tile(head: str, arch: str) -> Tile:
    """The tile a call uses when nothing is tuned: DEFAULT_TILE, else the first TILES entry for the arch."""
    arch = normalize_arch(arch)
    t = DEFAULT_TILE.get((head, arch))
    if t is not None:
        return t
    return next((t for t in TILES[head] if t.targets(arch)), TILES[head][0])


DTYPES = ("bf16", "fp16")
LAYOUTS = ("page1", "paged")
SMEM_LIMIT = {"sm_90": 227 * 1024, "sm_90a": 227 * 1024, "sm_120": 99 * 1024, "sm_120a": 99 * 1024}


def head_key(dqk: int, dv: int, shared_kv: bool, kv_fp8=False) -> Optional[str]:
    """The kernel family's head key for a shape; kv_fp8 True / "fp8_e4m3": its e4m3-cache variant,
    "fp8_mla656": its 656-byte-row variant (None if not built)."""
    variants = set(FP8_HEADS.values()) | set(MLA656_HEADS.values())
    for k, v in HEADS.items():
        if v == (dqk, dv, shared_kv) and k not in variants:
            if kv_fp8 == "fp8_mla656":
                return MLA656_HEADS.get(k)
            return FP8_HEADS.get(k) if kv_fp8 else k
    return None


def kv_bytes_of(head: str) -> int:
    """Bytes per K / V element of a head key's kernels (1: the fp8 caches)."""
    return 1 if head in FP8_HEADS.values() or head in MLA656_HEADS.values() else 2


# kernel v2 prefetches (prefetch.global.L2) each tile's KV rows and indices this many iterations before their
# cp.asyncs (KernelTraitsV2::kPrefetch in csrc/tree_verify/traits.h; bench.model reads the distance here)
V2_PREFETCH = 2


def tile_smem(head: str, tile: "Tile") -> int:
    """Dynamic shared memory of a head key's split kernel with `tile`."""
    dqk, dv, shared = HEADS[head]
    return smem_bytes(tile, dqk, dv, shared, kv_bytes=kv_bytes_of(head), kv_row=KV_ROW_BYTES.get(head, 0))


def smem_bytes(tile: Tile, dqk: int, dv: int, shared_kv: bool, kv_bytes: int = 2, kv_row: int = 0) -> int:
    """Dynamic shared memory of the split kernel (SharedMemoryPlan / SharedMemoryPlanV1 in traits.h);
    kv_bytes 1: the e4m3-cache kernels (K / V one byte per element; P too on e4m3 MMAs, f16 otherwise)."""
    pad, elem = 8, 2
    if tile.version == 3:  # KernelTraitsV3: Q + STAGES x BN rows (no pad) + row stats + 8 mask words + mbarriers
        bm = tile.cta_m   # (a cluster tile: one CTA's)
        if kv_bytes == 1:  # e4m3: 2 slots of STAGES stages, an e4m3 P^T buffer per stage of each slot, row stats, mask
            #                words, Q's row scales, alphas and 1 / l per warpgroup and row; FULL / EMPTY per buffer
            bufs = 2 * tile.num_stages
            return ((bm + bufs * tile.block_n) * dqk + 2 * 2 * bm * 4 + bm * 8 * 4 + bufs * bm * tile.block_n
                    + bm * 4 + 2 * 2 * bm * 4 + 2 * bufs * 8)
        base = ((bm + tile.num_stages * tile.block_n) * dqk * kv_bytes + 2 * 2 * bm * 4 + bm * 8 * 4)
        # FULL and EMPTY per stage half (a cluster: + FULL_PEER per stage half, SENT per stage)
        return base + 2 * tile.num_stages * 2 * 8 + (3 * tile.num_stages * 8 if tile.cluster > 1 else 0)
    if tile.version == 2:  # KernelTraitsV2: Q (BM rows) + STAGES x BN KV rows (core-matrix layout, no pad)
        fp8 = (2 * (dv // 8) * 288 + tile.block_m * 4) if kv_bytes == 1 else 0  # e4m3: 2 V^T buffers, Q scales
        slots = 1 << (tile.num_stages - 2 + V2_PREFETCH - 1).bit_length()  # kIdxSlots: a power of two
        ring = slots * 32 * tile.num_warps * 4  # the kv_indices ring (kIdxSlots x threads)
        return ((tile.block_m + tile.num_stages * tile.block_n) * dqk * kv_bytes  # + 2 sets of partial scores
                + 2 * tile.warps_n * 128 * (tile.block_n // 2) * 4 + tile.block_m * 4 * 4 + fp8 + ring)  # + mask words
    if tile.version == 1:
        kpad = 16 // kv_bytes
        roles656 = bool(kv_row) and tile.loader == 4  # 656-byte rows on the math-roles tile: one f16 P, no pad
        pb = 1 if kv_bytes == 1 and tile.fp8_mma and not roles656 else 2  # P element bytes
        krow = kv_row if kv_row else dqk + kpad   # kv_row: 656-byte rows, unpadded (41 16-byte units, odd)
        stage = tile.block_n * krow + (0 if shared_kv else tile.block_n * (dv + kpad))
        # two sets of partial scores: one barrier per tile, or the math-roles tile's S warps storing S(i + 1)'s
        # after the softmax of i read i's (kSAhead; not with the 656-byte rows)
        parts = 2 if tile.bars == 1 or (tile.loader == 4 and not kv_row) else 1
        producer = tile.loader >= 2  # kernel v3: 8 staged mask words, FULL + EMPTY mbarriers, no index ring
        spitch = tile.block_n + (4 if parts == 2 else 8)
        part = tile.ksplit * tile.block_m * spitch * 4 * parts
        blocks = bool(kv_row) and not roles656  # 656-byte rows: P once per 128-column block, 4 side by side
        # P: parts buffers; the 4-block rows (128 bytes) and the roles tile's 64-byte f16 rows swizzled, not padded
        pbufs = 2 if parts == 2 or tile.loader == 4 else 1  # P / alpha buffers (v3's math roles: P double-buffered)
        p = pbufs * tile.block_m * ((4 * tile.block_n) if blocks else tile.block_n + (0 if roles656 else 16 // pb)) * pb
        stats = (pbufs + 2 + (1 if kv_bytes == 1 else 0)) * tile.block_m * 4  # alpha x buffers, 1/l, lse2 (+ Q scale)
        stats += 4 * tile.block_n * 4 if blocks else 0  # the tile's block scales per token
        slots = tile.num_stages - 2  # kv_indices ring slots (kIdxSlots)
        idx_ring = slots * _ring_threads(tile, dqk, dv, shared_kv, kv_bytes, kv_row) * 4
        mask = tile.block_m * (8 if producer else 4) * 4  # the first 4 (v3: 8) tree-mask words of each row (kMaskStage)
        bars = 8 * tile.num_stages * (2 if producer else 1) if tile.loader else 0  # the bulk loader's / v3's mbarriers
        pidx = tile.num_stages * 32 * 4 if producer else 0  # v3: the producer's kv_indices ring (kPIdxSlots x 32)
        return tile.num_stages * stage * kv_bytes + part + p + stats + idx_ring + mask + bars + pidx
    q = tile.block_m * (dqk + pad) * elem
    k = tile.num_stages * tile.block_n * (dqk + pad) * elem
    v = 0 if shared_kv else tile.num_stages * tile.block_n * (dv + pad) * elem
    p = tile.block_m * (tile.block_n + pad) * elem if tile.warps_n > 1 else 0
    red = 2 * tile.warps_n * tile.block_m * 4 if tile.warps_n > 1 else 0
    return q + k + v + p + red


def _ring_threads(tile: Tile, dqk: int, dv: int, shared_kv: bool, kv_bytes: int, kv_row: int) -> int:
    """Threads with a kv_indices ring slot (kRingThreads in traits.h): every thread with the bulk loader, else
    the BN x kThreadsPerRow loaders."""
    threads = 32 * tile.num_warps
    if tile.loader >= 2:  # the producer warp has its own index ring
        return 0
    if tile.loader:
        return threads
    per_chunk = 16 // kv_bytes
    row_chunks = (kv_row or dqk) // per_chunk
    other = row_chunks if shared_kv else dv // per_chunk
    cap = threads // tile.block_n
    tpr = next((d for d in range(cap, 1, -1) if row_chunks % d == 0 and other % d == 0), 1)
    if tpr == 1 and shared_kv:  # a prime chunk count (the 656-byte rows' 41): spread anyway (4 per row on e4m3)
        tpr = 4 if (kv_row and tile.fp8_mma) else cap
    return tile.block_n * tpr


def instantiation_file(dtype: str, head: str, layout: str) -> Path:
    return INST_DIR / f"{head}_{dtype}_{layout}.cu"


def instantiation_files(dtypes: Iterable[str] = DTYPES, heads: Iterable[str] = tuple(HEADS),
                        layouts: Iterable[str] = LAYOUTS) -> list[Path]:
    return [instantiation_file(d, h, l) for h in heads for d in dtypes for l in layouts]


def kernel_sources(files: Optional[list[Path]] = None) -> list[Path]:
    """Torch-free translation units of a build: the dispatcher + instantiations."""
    return [TV / "dispatch.cu"] + (files if files is not None else instantiation_files())


def source_hash(extra: Iterable[str] = ()) -> str:
    """Hash of every header/source the kernels see (csrc/arch, host, tree_verify)."""
    h = hashlib.sha256()
    for d in ("arch", "host", "tree_verify"):
        for f in sorted((CSRC / d).rglob("*")):
            if f.is_file() and f.suffix in (".h", ".cuh", ".cu", ".cpp", ".inc"):
                h.update(str(f.relative_to(CSRC)).encode())
                h.update(f.read_bytes())
    for e in extra:
        h.update(e.encode())
    return h.hexdigest()[:20]


# --------------------------------------------------------------------------
# Toolkit discovery
# --------------------------------------------------------------------------

def _has_nvcc(root: Optional[str]) -> bool:
    # a toolkit root holds nvcc AND the runtime headers: a generic prefix such as
    # /usr/local with only a wrapper script in bin/ is not one
    return bool(root) and (Path(root) / "bin" / "nvcc").exists() and \
        (Path(root) / "include" / "cuda_runtime.h").exists()


def find_cuda_home() -> Optional[str]:
    """CUDA toolkit root: $CUDA_HOME / $CUDA_PATH if they hold bin/nvcc, else the
    root nvcc itself reports (`nvcc --dryrun` prints `#$ TOP=<root>/bin/..`, which
    sees through wrapper scripts on PATH), else /usr/local/cuda. None if none."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if _has_nvcc(os.environ.get(var)):
            return str(Path(os.environ[var]).resolve())
    nvcc = shutil.which("nvcc")
    if nvcc:
        with tempfile.TemporaryDirectory() as d:
            src = Path(d) / "probe.cu"
            src.write_text("int main() { return 0; }\n")
            try:
                r = subprocess.run([nvcc, "--dryrun", "-c", str(src), "-o", str(Path(d) / "probe.o")],
                                   capture_output=True, text=True, timeout=60)
                m = re.search(r"^#\$ TOP=(.+)$", r.stdout + r.stderr, re.M)
                if m and _has_nvcc(str(Path(m.group(1).strip()).resolve())):
                    return str(Path(m.group(1).strip()).resolve())
            except (OSError, subprocess.SubprocessError):
                pass
        root = Path(nvcc).resolve().parent.parent
        if _has_nvcc(str(root)):
            return str(root)
    if _has_nvcc("/usr/local/cuda"):
        return str(Path("/usr/local/cuda").resolve())
    return None


def ensure_cuda_home() -> str:
    """find_cuda_home(), exported as CUDA_HOME for torch's extension builder; raises if none."""
    root = find_cuda_home()
    if root is None:
        raise RuntimeError("no CUDA toolkit found (set CUDA_HOME or put nvcc on PATH); "
                           "without one use backend='triton' or 'reference' (or 'cuda-emu' on the CPU)")
    os.environ["CUDA_HOME"] = root
    # torch's extension builder reads CUDA_HOME once, at import: correct a stale guess
    cpp_ext = sys.modules.get("torch.utils.cpp_extension")
    if cpp_ext is not None and getattr(cpp_ext, "CUDA_HOME", None) != root:
        cpp_ext.CUDA_HOME = root
    return root


def nvcc_path() -> str:
    return str(Path(ensure_cuda_home()) / "bin" / "nvcc")


def gencode_flags(archs: Iterable[str]) -> list[str]:
    out = []
    for a in archs:
        a = a.strip()
        if not re.fullmatch(r"sm_\d+[af]?", a):
            raise ValueError(f"--arch entries look like sm_90a or sm_120a, got {a!r}")
        n = a[3:]
        out.append(f"-gencode=arch=compute_{n},code=sm_{n}")
    return out


NVCC_FLAGS = ["-std=c++17", "-O3", "-lineinfo", "--expt-relaxed-constexpr", "-Xptxas=-v"]


# --------------------------------------------------------------------------
# ptxas report
# --------------------------------------------------------------------------

@dataclass
class KernelReport:
    name: str           # readable: "split bf16 576x512 page1 m32 n16 w4 s3" / "combine bf16 dv512"
    arch: str
    registers: int
    smem_bytes: int     # static (ptxas) + dynamic as launched
    static_smem: int
    dynamic_smem: int
    spill_stores: int
    spill_loads: int
    local_bytes: int    # stack frame (local memory per thread)
    source: str
    mangled: str
    targets_arch: bool = True  # False: a tile meant for other archs only (its smem is not checked here)
    expect_regs: int = 0       # a setmaxnreg tile: the registers its budget moves (setmaxnreg_launch_regs), else 0

    def problems(self) -> list[str]:
        """What fails the report: spills, local memory, smem over the arch's limit, for a tile built to run on
        this arch (a tile meant for other archs only is never launched here: see findings())."""
        return self.findings() if self.targets_arch else []

    def findings(self) -> list[str]:
        out = []
        if self.spill_stores or self.spill_loads:
            out.append(f"spills ({self.spill_stores} B stores, {self.spill_loads} B loads)")
        if self.local_bytes:
            out.append(f"{self.local_bytes} B local memory")
        if self.expect_regs and self.registers != self.expect_regs:
            out.append(f"{self.registers} registers, but its setmaxnreg budget moves {self.expect_regs} a thread "
                       "(with fewer, the math warps' setmaxnreg.inc would wait forever on a GPU)")
        lim = SMEM_LIMIT.get(self.arch)
        if self.targets_arch and lim is not None and self.smem_bytes > lim:
            out.append(f"shared memory {self.smem_bytes} B > {lim} B limit")
        return out


_ELEM = {"13__nv_bfloat16": "bf16", "6__half": "fp16"}


def spill_hint(r: KernelReport) -> str:
    """The command that places a spilling kernel's register peak (bench/model/regs.py: live registers per SASS
    instruction, by source line)."""
    return (f"python -m bench.model.regs {Path(r.source).stem} --arch {r.arch} --function '^{r.mangled}$' --inner "
            "--top 8")


def tile_of_mangled(mangled: str) -> Tile:
    """The tile config of a split kernel from its mangled name: TileConfig<BM, BN, WM, WN, STAGES> (v0)
    or TileConfigV1<BM, BN, W, STAGES, KSPLIT, SN[, FP8_MMA[, BARS[, LOADER]]]> (v1) or TileConfigV2<BM, BN, WG, STAGES>."""
    m = re.search(r"TileConfigV3ILi(\d+)ELi(\d+)ELi(\d+)EE", mangled)
    if m:
        bm, bn, st = map(int, m.groups())
        return Tile(bm, bn, 4, 2, st, version=3)
    m = re.search(r"TileConfigV2ILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)E", mangled)
    if m:
        bm, bn, wg, st = map(int, m.groups())
        return Tile(bm, bn, 4, wg, st, version=2)
    m = re.search(r"TileConfigV1ILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)E(?:Li(\d+)E)?(?:Li(\d+)E)?"
                  r"(?:Li(\d+)E)?", mangled)
    if m:
        bm, bn, w, st, ks, sn = map(int, m.groups()[:6])
        return Tile(bm, bn, w // ks, ks, st, version=1, sn=sn, fp8_mma=int(m.group(7) or 1),
                    bars=int(m.group(8) or 2), loader=int(m.group(9) or 0))
    t = [int(x) for x in re.search(r"TileConfigILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)E", mangled).groups()]
    return Tile(t[0], t[1], t[2], t[3], t[4])


def is_fp8_mangled(mangled: str) -> bool:
    """A split kernel built for e4m3 caches: KernelTraitsV1<..., TileConfigV1<...>, true>, KernelTraitsV2<...,
    TileConfigV2<...>, true> or KernelTraitsV3<..., TileConfigV3<...>, true>."""
    return re.search(r"TileConfigV[123]I(?:Li\d+E)+EELb1E", mangled) is not None


def is_656_mangled(mangled: str) -> bool:
    """A v1 split kernel built for the 656-byte MLA rows: KernelTraitsV1<..., TileConfigV1<...>, true, true>."""
    return re.search(r"TileConfigV1I(?:Li\d+E)+EELb1ELb1E", mangled) is not None


def _head_dims(mangled: str) -> Optional[tuple[int, int, bool]]:
    """(Dqk, Dv, shared KV) of a split kernel's HeadConfig in its mangled name; None when it has none."""
    m = re.search(r"HeadConfigILi(\d+)ELi(\d+)ELb([01])E", mangled)
    return (int(m.group(1)), int(m.group(2)), m.group(3) == "1") if m else None


def _compiled_tile(mangled: str) -> Tile:
    """The TILES entry (with its target archs) of a split kernel's mangled name: its own head's first (the same tile
    fields can target other archs in another head, e.g. m32 n32 w8 s4 k2: sm_120's e4m3-MMA tile, both archs' GQA 128
    bf16 tile), then any head's."""
    t = tile_of_mangled(mangled)
    head, dims = None, _head_dims(mangled)
    if dims:
        fmt = "fp8_mla656" if is_656_mangled(mangled) else "fp8_e4m3" if is_fp8_mangled(mangled) else False
        head = head_key(*dims, fmt)
    for tiles in ([TILES[head]] if head in TILES else []) + list(TILES.values()):
        for x in tiles:
            if replace(x, archs=t.archs) == t:  # every field the mangled name carries
                return x
    return t


def _describe(mangled: str) -> tuple[str, int]:
    """Readable name and dynamic smem (bytes) of a kernel from its mangled name."""
    elem = next((v for k, v in _ELEM.items() if k in mangled), "?")
    if "tree_verify_split_kernel" in mangled:
        dqk, dv, shared = _head_dims(mangled)
        layout = "paged" if "PagedLayout" in mangled else "page1"
        tile = tile_of_mangled(mangled)
        fp8, m656 = is_fp8_mangled(mangled), is_656_mangled(mangled)
        dyn = smem_bytes(tile, dqk, dv, shared, kv_bytes=1 if fp8 else 2, kv_row=656 if m656 else 0)
        name = f"split {elem}{'q-656kv' if m656 else 'q-e4m3kv' if fp8 else ''} {dqk}x{dv} {layout} {tile.label()}"
        return name, dyn
    if "tree_verify_combine_kernel" in mangled:
        dv = re.search(r"Li(\d+)EEEv", mangled)
        version = " v1" if "combine_kernel_v1" in mangled else ""
        return f"combine{version} {elem} dv{dv.group(1) if dv else '?'}", 0
    return mangled, 0


def setmaxnreg_launch_regs(t: Tile) -> int:
    """The registers a thread of a setmaxnreg tile must be launched with (0 for a tile without setmaxnreg): its budget
    (traits.h kLaunchRegs, traits_v3.h) moves the launch's whole pool, 65,536 over its warpgroups' threads in 8s,
    between the producer and the math warpgroups. ptxas launching it with fewer leaves the pool short, and the math
    warps' setmaxnreg.inc waits for registers that never come: a hang on a GPU that no emulator shows."""
    if not (t.version == 3 or (t.version == 1 and t.loader >= 3)):
        return 0
    return 65536 // (128 * ((t.num_warps + 3) // 4)) // 8 * 8


def parse_ptxas(text: str, source: str) -> list[KernelReport]:
    out: list[KernelReport] = []
    cur: Optional[dict] = None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)' for '(sm_\w+)'", line)
        if m:
            cur = {"mangled": m.group(1), "arch": m.group(2), "stack": 0, "ss": 0, "sl": 0, "regs": 0, "smem": 0}
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            cur["stack"], cur["ss"], cur["sl"] = map(int, m.groups())
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(s.group(1)) if s else 0
            name, dyn = _describe(cur["mangled"])
            tile = _compiled_tile(cur["mangled"]) if "tree_verify_split_kernel" in cur["mangled"] else None
            targets = tile is None or tile.targets(cur["arch"])
            out.append(KernelReport(name, cur["arch"], cur["regs"], cur["smem"] + dyn, cur["smem"], dyn,
                                    cur["ss"], cur["sl"], cur["stack"], source, cur["mangled"], targets,
                                    setmaxnreg_launch_regs(tile) if tile is not None else 0))
            cur = None
    return out


def _cache_dir() -> Path:
    from .utils import cache_dir
    d = cache_dir() / "build_report"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _nvcc_version(nvcc: str) -> str:
    return subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]


def compile_report(src: Path, archs: list[str], nvcc: str, key: str, use_cache: bool = True) -> list[KernelReport]:
    """ptxas report of one translation unit for all archs (one nvcc call), cached by `key`. The cache
    holds ptxas's own text, parsed on every read, so a change to the parser needs no rebuild."""
    cache = _cache_dir() / f"{src.stem}-{key}.ptxas.txt"
    if use_cache and cache.exists():
        return parse_ptxas(cache.read_text(), src.name)
    with tempfile.TemporaryDirectory() as d:
        cmd = [nvcc, *NVCC_FLAGS, *gencode_flags(archs), f"-I{CSRC}", "-c", str(src), "-o", str(Path(d) / "k.o")]
        r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nvcc failed for {src.name} (exit {r.returncode}):\n{' '.join(cmd)}\n{r.stderr[-6000:]}")
    text = r.stdout + r.stderr
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(cache)
    return parse_ptxas(text, src.name)


# The timing-experiment bits a kernel build takes (-DVA_TV_KNOCKOUT; csrc/tree_verify/request.cuh kKo*): 0 .. this - 1
KNOCKOUT_LIMIT = 32


def compile_cubin(src: Path, arch: str, use_cache: bool = True, knockout: int = 0) -> Path:
    """The cubin of one translation unit for one arch, built with the real build's flags
    (NVCC_FLAGS, so -lineinfo is in), cached by a hash of the sources, flags and nvcc.
    The SASS-level performance model (bench.model) reads these. `knockout`: the timing-experiment bits
    bench.knockout builds with (-DVA_TV_KNOCKOUT; csrc/tree_verify/request.cuh), so the model can read a variant
    the GPU measured."""
    nvcc = nvcc_path()
    gencode_flags([arch])  # validates the name
    if not 0 <= knockout < KNOCKOUT_LIMIT:
        raise ValueError(f"knockout: bits 0..{KNOCKOUT_LIMIT - 1}, got {knockout}")
    defines = [f"-DVA_TV_KNOCKOUT={knockout}"] if knockout else []
    key = source_hash(["cubin-v1", *NVCC_FLAGS, *defines, arch, _nvcc_version(nvcc)])
    out = _cache_dir().parent / "cubins" / f"{src.stem}-{arch}-{key}.cubin"
    if use_cache and out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    cmd = [nvcc, *NVCC_FLAGS, *defines, "-cubin", f"-arch={arch}", f"-I{CSRC}", str(src), "-o", str(tmp)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nvcc -cubin failed for {src.name} ({arch}):\n{' '.join(cmd)}\n{r.stderr[-6000:]}")
    tmp.replace(out)
    return out


def build_report(archs: list[str], files: Optional[list[Path]] = None, jobs: int = 1,
                 use_cache: bool = True, log=print) -> list[KernelReport]:
    nvcc = nvcc_path()
    files = files if files is not None else instantiation_files()
    key = source_hash(["report-v3", *NVCC_FLAGS, *archs, _nvcc_version(nvcc)])
    reps: list[KernelReport] = []

    def one(f: Path) -> list[KernelReport]:
        return compile_report(f, archs, nvcc, key, use_cache)

    with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        for f, rs in zip(files, ex.map(one, files)):
            log(f"  compiled {f.name}: {len(rs)} kernel entries")
            reps.extend(rs)
    # the combine kernel is compiled into every file of its dtype/Dv: report it once per arch
    seen, uniq = set(), []
    for r in reps:
        if (r.name, r.arch) not in seen:
            seen.add((r.name, r.arch))
            uniq.append(r)
    return sorted(uniq, key=lambda r: (r.name, r.arch))


def format_table(reps: list[KernelReport]) -> str:
    hdr = f"{'kernel':48} {'arch':8} {'regs':>5} {'smem B':>8} {'spill st':>9} {'spill ld':>9} {'local B':>8}  status"
    lines = [hdr, "-" * len(hdr)]
    for r in reps:
        pr = r.problems()
        if pr:
            status = 'FAIL: ' + '; '.join(pr)
        elif r.targets_arch:
            status = 'ok'
        else:  # informational: never launched on this arch (the backend refuses it there)
            status = 'ok (not a tile for this arch' + ''.join(f'; {x}' for x in r.findings()) + ')'
        lines.append(f"{r.name:48} {r.arch:8} {r.registers:5d} {r.smem_bytes:8d} {r.spill_stores:9d} "
                     f"{r.spill_loads:9d} {r.local_bytes:8d}  {status}")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# setup.py AOT build (VERIFY_ATTN_BUILD_CUDA=1)
# --------------------------------------------------------------------------

DEFAULT_ARCHS = ("sm_90a", "sm_120a")


def extension_sources(files: Optional[list[Path]] = None) -> list[str]:
    return [str(CSRC / "bindings" / "torch_ops.cpp")] + [str(p) for p in kernel_sources(files)]


def nvcc_extension_flags(archs: Iterable[str] = DEFAULT_ARCHS) -> list[str]:
    return ["-O3", "-lineinfo", "--expt-relaxed-constexpr", *gencode_flags(archs)]


def aot_extensions(archs: Iterable[str] = DEFAULT_ARCHS) -> list:
    """The CUDAExtension list setup.py builds when VERIFY_ATTN_BUILD_CUDA=1: one
    extension `verify_attn._C` with every instantiation (op namespace verify_attn)."""
    ensure_cuda_home()
    from torch.utils.cpp_extension import CUDAExtension

    srcs = [os.path.relpath(s, REPO) for s in extension_sources()]
    return [CUDAExtension(
        name="verify_attn._C",
        sources=srcs,
        include_dirs=[str(CSRC)],
        define_macros=[("VA_OP_NAMESPACE", "verify_attn")],
        extra_compile_args={"cxx": ["-O2"], "nvcc": nvcc_extension_flags(archs)},
    )]


# --------------------------------------------------------------------------
# Host math module (tests)
# --------------------------------------------------------------------------

def load_host_math(verbose: bool = False):
    """Build (once, cached by torch's extension builder) and import the host-only
    pybind11 module of csrc/host as `verify_attn._host_math`. Needs only a C++
    compiler: no CUDA toolkit, no torch headers in the source."""
    if "verify_attn._host_math" in sys.modules:
        return sys.modules["verify_attn._host_math"]
    if find_cuda_home() is not None:
        ensure_cuda_home()  # before torch's builder guesses a wrong CUDA_HOME from the nvcc wrapper
    from torch.utils.cpp_extension import load

    mod = load(name=f"va_host_math_{source_hash()[:8]}", sources=[str(CSRC / "host" / "host_math_py.cpp")],
               extra_include_paths=[str(CSRC)], extra_cflags=["-O1"], verbose=verbose)
    sys.modules["verify_attn._host_math"] = mod
    return mod


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------

def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verify_attn.build", description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default=",".join(DEFAULT_ARCHS), help="comma-separated, e.g. sm_90a,sm_120a")
    ap.add_argument("--report", action="store_true", help="compile every instantiation and print the ptxas report")
    ap.add_argument("--json", type=Path, help="also write the report as JSON here")
    ap.add_argument("--only", default="", help="comma-separated substrings of instantiation file names to compile")
    ap.add_argument("-j", "--jobs", type=int, default=1, help="parallel nvcc processes (default 1)")
    ap.add_argument("--no-cache", action="store_true", help="recompile even if a cached report matches")
    from .utils import dash_values
    a = dash_values(ap).parse_args(argv)
    if not a.report:
        ap.error("nothing to do: pass --report to compile every instantiation and print the ptxas report")
    archs = [x.strip() for x in a.arch.split(",") if x.strip()]
    unknown = [x for x in archs if x not in SMEM_LIMIT]
    if not archs or unknown:
        ap.error(f"--arch: no shared-memory limit known for {unknown or a.arch!r}; known: {', '.join(SMEM_LIMIT)}")
    files = instantiation_files()
    if a.only:
        files = [f for f in files if any(s in f.name for s in a.only.split(","))]
    try:
        reps = build_report(archs, files, jobs=a.jobs, use_cache=not a.no_cache,
                            log=lambda s: print(s, file=sys.stderr))
    except RuntimeError as e:
        print(str(e), file=sys.stderr)
        return 2
    print(format_table(reps))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps([asdict(r) for r in reps], indent=1))
    bad = [r for r in reps if r.problems()]
    missing = [x for x in archs if not any(r.arch == x for r in reps)]
    if missing:
        print(f"no kernels reported for {missing}", file=sys.stderr)
        return 2
    if bad:
        print(f"{len(bad)} kernel(s) over budget", file=sys.stderr)
        for r in bad:
            if r.spill_stores or r.spill_loads:
                print(f"  {r.name} {r.arch}: where its registers peak, by source line:\n    "
                      f"{spill_hint(r)}", file=sys.stderr)
        return 1
    print(f"{len(reps)} kernel entries ok (no spills, smem within limits)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
