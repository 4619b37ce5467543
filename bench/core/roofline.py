"""Compulsory bytes and FLOPs of a tree-verify call, device ceilings, roofline floors.

One helper (`count_call`) counts every call the benchmarks report; tests check it
against hand-computed cases. Only *compulsory* traffic is counted: what any
kernel must move at least once. Split-KV workspaces, page-tail padding, L2
re-reads and the combine pass are NOT counted, so the floor is a true lower bound.

Floor of a call on a device = max(bytes / bandwidth, FLOPs / MMA rate); the larger
term names the bound ("memory" or "compute").
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import torch

from verify_attn.fp8 import kv_row_bytes

INDEX_BYTES = 4  # one int32 slot id (page_size 1) or page id (paged)


@dataclass(frozen=True)
class Device:
    name: str
    sms: int
    mem_bw_gbs: float     # GB/s (1e9 B/s) DRAM bandwidth used for the memory floor
    mma_tflops: float     # dense 16-bit MMA rate with fp32 accumulate, TFLOP/s (1e12)
    l2_mb: float          # L2 size in MB (1e6 B): what cold-L2 rotation must exceed
    source: str           # where the two rates come from
    measured: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


# Reference devices: always reported, whatever machine the benchmark runs on.
#
# RTX PRO 6000 Blackwell (GB202, sm_120, 188 SMs, 128 MB L2): 1,792 GB/s is the
# GDDR7 datasheet bandwidth (512-bit, 28 Gbps). The MMA rate 503.8 TFLOP/s is the
# dense BF16 tensor rate with FP32 accumulate listed for this card by third-party
# spec aggregators (e.g. hmc-tech.com's RTX PRO 6000 Blackwell page: "BF16 503.8
# TFLOPS Tensor", "FP16 503.8 TFLOPS Tensor (FP32 Accumulate)"), consistent with
# DESIGN.md's "~500 dense bf16 TFLOPS per vendor aggregators". Not measured here.
# Caveat kept visible: a public hand-written mma.sync GEMM reached only 243 TFLOP/s
# on the 300 W Max-Q part, at which rate 16-node verify at 185k is compute-bound.
# With 503.8 the 185k / 16-node / MLA floor is memory-bound at ~119 us (213 MB /
# 1.792 TB/s) against ~102 us of compute.
RTX_PRO_6000 = Device(
    name="RTX PRO 6000 Blackwell", sms=188, mem_bw_gbs=1792.0, mma_tflops=503.8, l2_mb=128.0,
    source="datasheet 1,792 GB/s; 503.8 TFLOP/s dense bf16 fp32-acc (spec aggregators, GB202)",
)
# H200 SXM (sm_90, 132 SMs, 50 MB L2): 4.8 TB/s HBM3e and 989 TFLOP/s dense BF16
# tensor, both NVIDIA datasheet. On an H200 the measured ceilings (bench/core/ceilings.py)
# are reported as a separate device next to these.
H200 = Device(
    name="H200", sms=132, mem_bw_gbs=4800.0, mma_tflops=989.0, l2_mb=50.0,
    source="NVIDIA datasheet: 4.8 TB/s, 989 TFLOP/s dense bf16",
)
REFERENCE_DEVICES: tuple[Device, ...] = (RTX_PRO_6000, H200)
# H100 SXM5 (sm_90, 132 SMs, 50 MB L2; the device tool's nvidia-h100-x1, "NVIDIA H100 80GB HBM3"): 3.35 TB/s HBM3
# and 989 TFLOP/s dense BF16, NVIDIA datasheet. Not a reference device (the tables carry the two above): the floor of
# a run on one. The H100 PCIe and NVL share its name and are not it (_OTHER_PARTS).
H100 = Device(
    name="H100", sms=132, mem_bw_gbs=3350.0, mma_tflops=989.0, l2_mb=50.0,
    source="NVIDIA H100 SXM5 datasheet: 3.35 TB/s, 989 TFLOP/s dense bf16",
)
KNOWN_DEVICES: tuple[Device, ...] = REFERENCE_DEVICES + (H100,)
# GPU names of parts that share a known part's name but not its memory or SM count (bench.model.devices reads the
# same table): the H100 PCIe (114 SMs, 2.0 TB/s HBM2e) and the H100 NVL (3.9 TB/s) are not the H100 SXM5
_OTHER_PARTS = {"h100": ("pcie", "nvl")}


def is_other_part(part: str, gpu_name: str) -> bool:
    """Whether `gpu_name` (lowercase) names another part than `part` though it contains its name ('nvidia h100 pcie'
    is not the H100)."""
    return any(x in gpu_name for x in _OTHER_PARTS.get(part.lower(), ()))


@dataclass(frozen=True)
class Counts:
    """Compulsory traffic and arithmetic of one tree-verify call (bytes, FLOPs)."""

    kv_bytes: int      # every KV row of every request read once
    q_bytes: int       # q [total_q, Hq, Dqk]
    out_bytes: int     # out [total_q, Hq, Dv] (+ lse [total_q, Hq] fp32 when asked)
    index_bytes: int   # slot ids (page1) or page ids (paged), 4 B each
    meta_bytes: int    # qo_indptr, kv_indptr [B+1] and kv_lens [B], int32
    mask_bytes: int    # packed tree mask [total_q, W] int32
    flops: int         # QK^T and PV: 2 * (Dqk + Dv) per (tree row, q head, visible KV token)

    @property
    def total_bytes(self) -> int:
        return self.kv_bytes + self.q_bytes + self.out_bytes + self.index_bytes + self.meta_bytes + self.mask_bytes

    def to_dict(self) -> dict:
        d = asdict(self)
        d["total_bytes"] = self.total_bytes
        return d


def dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def tree_depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node (root 0) from a parent list (parent[0] = -1, parents precede children)."""
    if not parents or parents[0] != -1:
        raise ValueError(f"parents must start with -1 (the root), got {list(parents)[:4]}")
    d = [0] * len(parents)
    for i in range(1, len(parents)):
        p = parents[i]
        if not 0 <= p < i:
            raise ValueError(f"parents[{i}]={p}: a parent must be an earlier node")
        d[i] = d[p] + 1
    return d


def count_call(
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim_qk: int,
    head_dim_v: int,
    mla: bool,
    prefix_lens: Sequence[int],
    trees: Sequence[Sequence[int]],
    elem_bytes: int = 2,
    page_size: int = 1,
    mask_words: Optional[int] = None,
    return_lse: bool = False,
    kv_dtype: Optional[str] = None,
) -> Counts:
    """Count one call: request b has `prefix_lens[b]` committed tokens and a tree `trees[b]` (parent list).

    KV rows per request = L_b + T_b (the tree nodes' own K/V are in the cache too).
    MLA: one Dqk-wide row per token per kv head (V is its first Dv values, not re-read).
    GQA: a Dqk-wide K row and a Dv-wide V row per token per kv head.
    Node i of request b sees L_b prefix tokens + (depth_i + 1) tree entries (its
    ancestors and itself), for each of the Hq query heads.
    Paged: only the tokens are compulsory, not the unused tail of the last page.
    kv_dtype (verify_attn.fp8): the cache's storage format when it differs from q's
    `elem_bytes`: "fp8_e4m3" 1 byte per value (MLA row 576 B), "fp8_mla656" 656 B per
    MLA row (512 codes, 4 fp32 scales, 64 bf16 RoPE values); q and out stay `elem_bytes`.
    """
    if len(prefix_lens) != len(trees) or not trees:
        raise ValueError(f"prefix_lens ({len(prefix_lens)}) and trees ({len(trees)}) must be non-empty and equal length")
    if min(num_q_heads, num_kv_heads, head_dim_qk, head_dim_v, elem_bytes, page_size) < 1:
        raise ValueError("head counts, head dims, elem_bytes and page_size must be >= 1")
    if min(prefix_lens) < 0:
        raise ValueError(f"prefix lengths must be >= 0, got {min(prefix_lens)}")
    sizes = [len(t) for t in trees]
    total_q = sum(sizes)
    w = mask_words if mask_words is not None else math.ceil(max(sizes) / 32)
    tokens = sum(L + t for L, t in zip(prefix_lens, sizes))
    if kv_dtype is None:
        row_values = head_dim_qk if mla else head_dim_qk + head_dim_v
        kv_bytes = tokens * num_kv_heads * row_values * elem_bytes
    else:
        kv_bytes = tokens * num_kv_heads * kv_row_bytes(kv_dtype, head_dim_qk, head_dim_v, mla)
    ids = tokens if page_size == 1 else sum(math.ceil((L + t) / page_size) for L, t in zip(prefix_lens, sizes))
    visible = sum(L * len(t) + sum(d + 1 for d in tree_depths(t)) for L, t in zip(prefix_lens, trees))
    b = len(trees)
    return Counts(
        kv_bytes=kv_bytes,
        q_bytes=total_q * num_q_heads * head_dim_qk * elem_bytes,
        out_bytes=total_q * num_q_heads * (head_dim_v * elem_bytes + (4 if return_lse else 0)),
        index_bytes=ids * INDEX_BYTES,
        meta_bytes=(2 * (b + 1) + b) * 4,
        mask_bytes=total_q * w * 4,
        flops=2 * (head_dim_qk + head_dim_v) * num_q_heads * visible,
    )


def count_shape(shape, prefix_lens: Sequence[int], trees: Sequence[Sequence[int]], **kw) -> Counts:
    """count_call for a verify_attn.shapes.HeadShape."""
    return count_call(num_q_heads=shape.num_q_heads, num_kv_heads=shape.num_kv_heads,
                      head_dim_qk=shape.head_dim_qk, head_dim_v=shape.head_dim_v, mla=shape.mla,
                      prefix_lens=prefix_lens, trees=trees, **kw)


def visible_tree_entries(tree_mask: torch.Tensor) -> torch.Tensor:
    """Per tree row, how many tree entries it sees (popcount of its packed mask row) -> int64 [total_q]."""
    m = tree_mask.to(torch.int64) & 0xFFFFFFFF  # [total_q, W] as unsigned words
    bits = torch.arange(32, dtype=torch.int64, device=m.device)
    return ((m.unsqueeze(-1) >> bits) & 1).sum(dim=(1, 2))


@dataclass(frozen=True)
class Floor:
    us: float          # max of the two below
    memory_us: float   # bytes / bandwidth
    compute_us: float  # flops / MMA rate
    bound: str         # "memory" | "compute"


def floor(counts: Counts, device: Device) -> Floor:
    mem = counts.total_bytes / (device.mem_bw_gbs * 1e9) * 1e6
    comp = counts.flops / (device.mma_tflops * 1e12) * 1e6
    return Floor(us=max(mem, comp), memory_us=mem, compute_us=comp, bound="memory" if mem >= comp else "compute")


def match_reference(gpu_name: str) -> Optional[Device]:
    """The known device whose name the GPU's name contains (e.g. 'NVIDIA H200' -> H200, 'NVIDIA H100 80GB HBM3' ->
    H100; the H100 PCIe and NVL -> None)."""
    n = gpu_name.lower()
    for d in KNOWN_DEVICES:
        if d.name.lower() in n and not is_other_part(d.name, n):
            return d
    return None


def device_from_ceilings(gpu_name: str, ceil: dict, sms: int, l2_mb: float) -> Device:
    """A Device for the GPU at hand from measured ceilings (bench.ceilings)."""
    return Device(name=f"{gpu_name} (measured)", sms=sms, mem_bw_gbs=float(ceil["copy_gbs"]),
                  mma_tflops=float(ceil["mma_tflops"]), l2_mb=l2_mb,
                  source=f"measured by bench.ceilings on {ceil.get('date', '?')}", measured=True)
