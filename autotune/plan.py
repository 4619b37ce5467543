"""The tuning plan: per (context, tree size) bucket, the tiles that survived pruning and their split grids.

Static only (no GPU): the dry run prints it, the tuner walks it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from verify_attn.config import KernelConfig
from verify_attn.shapes import HeadShape

from .space import (ArchSpec, Candidate, Pruned, arch_of_device, backend_hooks, filter_versions, get_arch,
                    prune_for_rows, tile_candidates)
from .splits import heuristic_splits, split_cap, split_grid

DEFAULT_MAX_SPLITS = 1024   # workspace bound when the backend does not publish one (meta["max_splits"])


@dataclass
class TilePlan:
    candidate: Candidate
    heuristic: int           # the split count heuristic_num_splits picks for this tile
    splits: list[int]        # coarse split grid (the refine phase adds midpoints on the GPU)
    cap: int                 # most splits the refine phase may try (split_cap)


@dataclass
class BucketPlan:
    ctx: int                 # prefix tokens per request
    tree_nodes: int
    rows: int                # tree nodes x group: MMA rows per KV head
    tiles: list[TilePlan]
    row_rejected: list[tuple[KernelConfig, str]] = field(default_factory=list)

    @property
    def kv_len(self) -> int:
        return self.ctx + self.tree_nodes

    @property
    def num_candidates(self) -> int:
        return sum(len(t.splits) for t in self.tiles)


@dataclass
class Plan:
    backend: str
    shape: HeadShape
    arch: ArchSpec
    dtype: str
    page_size: int
    batch: int
    origin: str
    buckets: list[BucketPlan]
    rejected: list[tuple[KernelConfig, str]]
    max_splits: int
    report_path: Optional[str] = None
    kv_dtype: str = ""   # "" (the cache in q's dtype) or an fp8 storage format (verify_attn.fp8)
    versions: Optional[frozenset[int]] = None   # --versions: the kernel versions tuned over (None: every one)

    def to_json(self) -> dict:
        a = self.arch
        cands = []
        for b in self.buckets:
            for t in b.tiles:
                r = t.candidate.resources
                for s in t.splits:
                    cands.append({
                        "ctx": b.ctx, "tree_nodes": b.tree_nodes, "rows": b.rows,
                        "config": t.candidate.config.replace(num_splits=s).to_dict(),
                        "heuristic_splits": s == t.heuristic, "max_splits": t.cap,
                        "smem_bytes": r.get("smem_bytes"), "regs_estimate": r.get("regs_estimate"),
                        "registers": r.get("registers"), "spill_stores": r.get("spill_stores"),
                        "resource_source": r.get("source"),
                        "ctas_per_sm": _ctas_per_sm(a.name, t.candidate.config, r),
                    })
        return {
            "arch": a.name,
            "kernel_versions": None if self.versions is None else sorted(self.versions),
            "arch_limits": {"smem_per_block": a.smem_per_block, "regs_per_sm": a.regs_per_sm,
                            "max_regs_per_thread": a.max_regs_per_thread, "num_sms": a.num_sms,
                            "device_name": a.device_name},
            "backend": self.backend, "shape": self.shape.to_dict(), "dtype": self.dtype, "kv_dtype": self.kv_dtype,
            "layout": f"page{self.page_size}", "page_size": self.page_size, "batch": self.batch,
            "space": self.origin, "build_report": self.report_path, "max_splits": self.max_splits,
            "pruned": [{"config": c.to_dict(), "reason": why} for c, why in self.rejected],
            "buckets": [{"ctx": b.ctx, "tree_nodes": b.tree_nodes, "rows": b.rows, "candidates": b.num_candidates,
                         "pruned_for_rows": [{"config": c.to_dict(), "reason": why} for c, why in b.row_rejected]}
                        for b in self.buckets],
            "candidates": cands,
        }


def _ctas_per_sm(arch: str, cfg, r: dict) -> Optional[int]:
    """Resident CTAs per SM by the occupancy rules (verify_attn.device), from the ptxas
    registers when the build report has them, else the estimate."""
    from verify_attn import device as vdevice

    regs = r.get("registers") or r.get("regs_estimate")
    if regs is None or r.get("smem_bytes") is None:
        return None
    return vdevice.ctas_per_sm(vdevice.spec(arch), threads=cfg.num_warps * 32, regs_per_thread=int(regs),
                               smem_bytes=int(r["smem_bytes"]))


def make_plan(backend: str, shape: HeadShape, *, arch_name: Optional[str], ctxs: list[int], trees: list[int],
              dtype: str = "bf16", page_size: int = 1, batch: int = 1, report: Optional[list[dict]] = None,
              report_path: Optional[str] = None, use_hooks: bool = True, kv_dtype: str = "",
              versions: Optional[frozenset[int]] = None) -> Plan:
    if arch_name is not None:
        arch = get_arch(arch_name)
    else:
        import torch
        if not torch.cuda.is_available():
            raise ValueError("no GPU here: pass --arch sm_90a or --arch sm_120a to plan for one")
        arch = arch_of_device(torch.cuda.current_device())
    if kv_dtype == "fp8_mla656" and not (shape.mla and shape.head_dim_qk == 576 and shape.num_kv_heads == 1):
        raise ValueError(f"--kv-dtype fp8_mla656 is the MLA 576/512 row with one KV head, not shape {shape.name}")
    if kv_dtype and dtype not in ("bf16", "fp16"):
        raise ValueError(f"--kv-dtype {kv_dtype} needs --dtype bf16 or fp16, got {dtype}")
    pruned, origin = tile_candidates(backend, shape, arch, dtype=dtype, page_size=page_size, report=report,
                                     use_hooks=use_hooks, kv_dtype=kv_dtype)
    kept, off = filter_versions(pruned.kept, versions)
    pruned = Pruned(kept, pruned.rejected + off)
    _, _, hook_max = backend_hooks(backend) if use_hooks else (None, None, None)
    max_splits = int(hook_max or DEFAULT_MAX_SPLITS)
    buckets = []
    for ctx in ctxs:
        for tn in trees:
            rows = tn * shape.group
            fits, row_rej = prune_for_rows(pruned.kept, rows)
            tiles = []
            for c in fits:
                kv = ctx + tn
                h = min(heuristic_splits(c.config, rows=rows, kv_len=kv, shape=shape, arch=arch, batch=batch),
                        max_splits)
                grid = split_grid(c.config, rows=rows, kv_len=kv, shape=shape, arch=arch, batch=batch,
                                  max_splits=max_splits)
                cap = split_cap(c.config, kv_len=kv, max_splits=max_splits)
                tiles.append(TilePlan(c, min(h, cap), grid, cap))
            buckets.append(BucketPlan(ctx, tn, rows, tiles, row_rej))
    return Plan(backend, shape, arch, dtype, page_size, batch, origin, buckets, pruned.rejected, max_splits,
                report_path, kv_dtype, versions)
