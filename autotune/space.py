"""Candidate configs per backend and arch, and the pruning that runs before any timing.

A candidate is a *tile* config (block_n, block_m, num_warps, num_stages) times a
split count. Tiles come from the backend's own `config_space` hook when it has
one, else from the documented default space below; their resources come from
the backend's `resources` hook, else from the default models below, and, for
CUDA tiles that map to a kernel in the build report (`python -m verify_attn.build
--report --json`), from the compiler's numbers (ptxas registers, smem, spills).

Pruning rules (each rejection carries its reason):
- shared memory per block <= the arch's limit (sm_120a 101376 B, sm_90a 232448 B);
- registers per thread <= 255 and registers x threads <= 64K per SM (one CTA fits);
- no spills in the build report;
- divisibility: block_m and block_n multiples of 16 (mma m16n8k16), head dims
  multiples of 16; for CUDA the static_asserts of csrc/tree_verify/config.h
  (warps tile the rows in 16-row slices and split the KV tile and Dv evenly);
- block_m no larger than needed: a tile wider than the call's rows
  (tree nodes x group, rounded up to a power of two, at least 16) is pruned when
  a narrower one survives, as it only adds masked rows;
- split counts (autotune.splits): 1 <= num_splits <= min(max_splits, KV tokens / 2 tiles).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from verify_attn.config import KernelConfig
from verify_attn.shapes import HeadShape

from .report import report_entry


@dataclass(frozen=True)
class ArchSpec:
    name: str
    smem_per_block: int      # bytes of shared memory one block may use (opt-in maximum)
    regs_per_sm: int
    max_regs_per_thread: int
    num_sms: int
    l2_bytes: int
    device_name: str         # the reference device of this arch, for planning


ARCHS: dict[str, ArchSpec] = {
    # RTX PRO 6000 Blackwell (GB202): 99 KB per block, 188 SMs, 128 MB L2 (DESIGN.md section 5)
    "sm_120a": ArchSpec("sm_120a", 101376, 65536, 255, 188, 128 << 20, "NVIDIA RTX PRO 6000 Blackwell"),
    # H200: 227 KB per block, 132 SMs, 50 MB L2
    "sm_90a": ArchSpec("sm_90a", 232448, 65536, 255, 132, 50 << 20, "NVIDIA H200"),
}
_ALIASES = {"sm_120": "sm_120a", "sm120": "sm_120a", "sm_90": "sm_90a", "sm90": "sm_90a"}


def get_arch(name: str) -> ArchSpec:
    n = _ALIASES.get(name.lower(), name.lower())
    if n not in ARCHS:
        raise ValueError(f"unknown --arch {name!r}; known: {', '.join(ARCHS)}")
    return ARCHS[n]


def arch_of_device(index: int = 0) -> ArchSpec:
    """The arch spec of the GPU at hand, with its real SM count, L2 and smem limit
    (read through cuda-python by verify_attn.device)."""
    import dataclasses

    from verify_attn import device as vdevice

    props = vdevice.query(index)
    base = {"sm_90a": "sm_90a", "sm_120a": "sm_120a"}.get(props.arch)
    if base is None:
        raise RuntimeError(f"no arch spec for {props.arch}; pass --arch sm_90a or sm_120a")
    return dataclasses.replace(ARCHS[base], num_sms=props.sm_count, l2_bytes=props.l2_bytes,
                               smem_per_block=props.smem_per_block, device_name=props.name)


# --- default spaces (used when a backend has no config_space hook) ---------------

DEFAULT_TILES: dict[str, dict[str, tuple[int, ...]]] = {
    # mirrors the axes of csrc/tree_verify/config.h TileConfig; the cuda backend's own
    # config_space (the compiled tiles) replaces this when verify_attn.backends.cuda has it
    "cuda": {"block_n": (16, 32, 64), "block_m": (16, 32, 64, 128), "num_warps": (2, 4, 8), "num_stages": (2, 3)},
    "triton": {"block_n": (16, 32, 64, 128), "block_m": (16, 32, 64), "num_warps": (4, 8), "num_stages": (1, 2, 3)},
}


def default_tiles(backend: str) -> list[KernelConfig]:
    axes = DEFAULT_TILES.get(backend, DEFAULT_TILES["cuda"])
    return [KernelConfig(0, bn, bm, w, s) for bn in axes["block_n"] for bm in axes["block_m"]
            for w in axes["num_warps"] for s in axes["num_stages"]]


def _torch_dtypes() -> dict:
    import torch
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


_TORCH_DTYPES = _torch_dtypes()


def _esize(dtype: str) -> int:
    return 4 if dtype == "fp32" else 2


def warps_n(cfg: KernelConfig) -> int:
    """Warps that share one 16-row slice (they split the tile's tokens for S and Dv for O)."""
    return max(1, cfg.num_warps // max(1, cfg.block_m // 16))


def model_resources(backend: str, cfg: KernelConfig, shape: HeadShape, dtype: str = "bf16") -> dict[str, Any]:
    """Default smem/register model (an estimate, labelled source='model').

    CUDA mirrors csrc/tree_verify/traits.h SharedMemoryPlan: rows padded by 16 B;
    a Q tile [block_m, Dqk]; num_stages K tiles [block_n, Dqk] (+ V tiles
    [block_n, Dv] unless V is inside the MLA row); when several warps share 16
    rows (WN > 1), P [block_m, block_n] and a row max/sum per warp column.
    Registers: the fp32 accumulator (Dv / WN / 2 per thread) and S (block_n / WN
    / 2 per thread) plus ~48 for addresses, loop state and fragments.
    Triton: the same operands, but Q stays in registers and only the KV tiles
    (and one P tile) are staged in smem, num_stages deep.
    """
    e = _esize(dtype)
    threads = 32 * cfg.num_warps
    acc = cfg.block_m * shape.head_dim_v / threads
    s_frag = cfg.block_m * cfg.block_n / threads
    if backend == "triton":
        kv_row = shape.head_dim_qk * e + (0 if shape.mla else shape.head_dim_v * e)
        smem = cfg.num_stages * cfg.block_n * kv_row + cfg.block_m * cfg.block_n * e
        q_regs = cfg.block_m * shape.head_dim_qk * e / 4 / threads
        regs = int(math.ceil(acc + s_frag + q_regs + 48))
    else:
        pad = 8  # elements (16 B) per smem row, against ldmatrix bank conflicts
        wn = warps_n(cfg)
        k_stage = cfg.block_n * (shape.head_dim_qk + pad) * e
        v_stage = 0 if shape.mla else cfg.block_n * (shape.head_dim_v + pad) * e
        p_tile = cfg.block_m * (cfg.block_n + pad) * e if wn > 1 else 0
        red = 2 * wn * cfg.block_m * 4 if wn > 1 else 0
        smem = cfg.block_m * (shape.head_dim_qk + pad) * e + cfg.num_stages * (k_stage + v_stage) + p_tile + red
        regs = int(math.ceil(acc + s_frag + 48))
    return {"smem_bytes": int(smem), "regs_estimate": regs, "threads": threads, "source": "model"}


def divisibility_issue(cfg: KernelConfig, shape: HeadShape, backend: str = "cuda") -> Optional[str]:
    """Why the kernel cannot be built for this config (None if it can).

    CUDA: the static_asserts of csrc/tree_verify/config.h and traits.h (BM = 16 x
    warps along M; the WN warps sharing 16 rows take whole n8 tiles of the KV
    tile and whole n16 pairs of Dv, at most 128 accumulator registers each; every
    thread loads part of one KV row; 2..8 stages). Triton: tl.dot needs 16-multiples.
    """
    if cfg.block_m % 16 or cfg.block_n % 16:
        return f"block_m={cfg.block_m} and block_n={cfg.block_n} must be multiples of 16 (mma m16n8k16)"
    if shape.head_dim_qk % 16 or shape.head_dim_v % 16:
        return f"head dims {shape.head_dim_qk}/{shape.head_dim_v} must be multiples of 16"
    if backend == "triton":
        return None
    warps_m = cfg.block_m // 16
    if cfg.num_warps % warps_m:
        return f"{cfg.num_warps} warps cannot cover {warps_m} row slices of 16 (block_m={cfg.block_m})"
    wn = warps_n(cfg)
    if cfg.block_n % (8 * wn):
        return f"block_n={cfg.block_n} does not split into whole n8 tiles over {wn} warps"
    if shape.head_dim_v % (16 * wn):
        return f"Dv={shape.head_dim_v} does not split over {wn} warps in 16-column pairs"
    if shape.head_dim_v // wn > 256:
        return f"Dv/{wn} = {shape.head_dim_v // wn} columns per warp needs > 128 accumulator registers"
    if (32 * cfg.num_warps) % cfg.block_n:
        return f"{32 * cfg.num_warps} threads do not divide over block_n={cfg.block_n} KV rows"
    if not 2 <= cfg.num_stages <= 8:
        return f"num_stages={cfg.num_stages} outside 2..8"
    return None


# --- candidates ---------------------------------------------------------------

@dataclass
class Candidate:
    config: KernelConfig
    resources: dict
    notes: list[str] = field(default_factory=list)


@dataclass
class Pruned:
    kept: list[Candidate]
    rejected: list[tuple[KernelConfig, str]]


def backend_hooks(backend_name: str):
    """(tiles_fn, resources_fn, max_splits) from the registry, or None where a hook is missing."""
    try:
        from verify_attn.backends import get_backend
        b = get_backend(backend_name)
    except Exception:  # the backend module may not exist yet
        return None, None, None
    return b.config_space, b.resources, b.meta.get("max_splits") if isinstance(b.meta, dict) else None


def _call_hook(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except TypeError:  # a hook that takes no keyword extras
        return fn(*args)


def tile_candidates(backend: str, shape: HeadShape, arch: ArchSpec, *, dtype: str = "bf16", page_size: int = 1,
                    report: Optional[list[dict]] = None, use_hooks: bool = True,
                    kv_dtype: str = "") -> tuple[Pruned, str]:
    """Tiles (num_splits=0) that fit the arch, with resources; and where the space came from."""
    space_fn, res_fn, _ = backend_hooks(backend) if use_hooks else (None, None, None)
    hook_kw = {"dtype": _TORCH_DTYPES.get(dtype, dtype), "page_size": page_size}
    if kv_dtype:   # fp8 caches: the backend's own fit for fp8 conversion in registers (triton_split.resources)
        hook_kw["kv_dtype"] = kv_dtype
    if space_fn is not None:
        tiles = [c.replace(num_splits=0) for c in _call_hook(space_fn, shape, arch.name, **hook_kw)]
        origin = f"{backend} backend config_space"
    else:
        tiles = default_tiles(backend)
        origin = f"autotune.space default space for {backend}"
    seen: set[KernelConfig] = set()
    kept, rejected = [], []
    for t in tiles:
        if t in seen:
            continue
        seen.add(t)
        # the CUDA backend's config_space lists compiled tiles, buildable by construction; the rule below is
        # v0's warp layout (warps along M, n8 tiles over WN warps) and would refuse v1 / v2 tiles, whose warps
        # split Dqk or the tile's tokens instead (v1 m32 n16 w8 was refused that way: the sm_120a default)
        why = None if (backend == "cuda" and space_fn is not None) else divisibility_issue(t, shape, backend)
        if why:
            rejected.append((t, why))
            continue
        if res_fn is not None:
            res = _normalise(dict(_call_hook(res_fn, t, shape, arch.name, **hook_kw)))
            res.setdefault("source", f"{backend} resources hook")
            if res.get("regs_estimate") is None and res.get("registers") is None:
                # (a cluster tile's registers are one CTA's: the hook's cta_block_m rows, not block_m)
                per_cta = t.replace(block_m=res["cta_block_m"]) if res.get("cta_block_m") else t
                res["regs_estimate"] = model_resources(backend, per_cta, shape, dtype)["regs_estimate"]
                res["source"] += " + model registers"
        else:
            res = model_resources(backend, t, shape, dtype)
        row = report_entry(report, t, shape, arch.name, dtype, page_size)
        if row is not None:
            res.update({"registers": row.get("registers"), "spill_stores": row.get("spill_stores", 0),
                        "spill_loads": row.get("spill_loads", 0), "kernel": row.get("name"),
                        "source": res.get("source", "").replace(" + model registers", "") + " + build report"})
            if row.get("smem_bytes") is not None:
                res["smem_bytes"] = int(row["smem_bytes"])
        why = resource_issue(res, t, arch)
        if why:
            rejected.append((t, why))
        else:
            kept.append(Candidate(t, res))
    return Pruned(kept, rejected), origin


def _normalise(res: dict) -> dict:
    """Hooks name their register estimate differently; the pruning reads `regs_estimate`."""
    for k in ("regs_per_thread_est", "regs_per_thread", "regs"):
        if k in res and "regs_estimate" not in res:
            res["regs_estimate"] = res[k]
    return res


def resource_issue(res: dict, cfg: KernelConfig, arch: ArchSpec) -> Optional[str]:
    if res.get("compiled") is False:
        return "no kernel is compiled for this tile (backend resources hook)"
    smem = res.get("smem_bytes")
    if smem is not None and smem > arch.smem_per_block:
        return f"smem {smem} B > {arch.smem_per_block} B per block on {arch.name}"
    regs = res.get("registers") or res.get("regs_estimate")
    if regs is not None:
        if regs > arch.max_regs_per_thread:
            return f"~{regs} registers/thread > {arch.max_regs_per_thread}"
        if regs * 32 * cfg.num_warps > arch.regs_per_sm:
            return f"{regs} regs x {32 * cfg.num_warps} threads > {arch.regs_per_sm} per SM"
    if (res.get("spill_stores") or 0) > 0 or (res.get("spill_loads") or 0) > 0:
        return f"spills ({res.get('spill_stores')} stores, {res.get('spill_loads')} loads) in the build report"
    if res.get("fits") is False:
        return "the backend's resources hook says it does not fit"
    return None


def prune_for_rows(cands: list[Candidate], rows: int) -> tuple[list[Candidate], list[tuple[KernelConfig, str]]]:
    """Drop tiles wider than the call's rows when a narrower tile of the same kernel family survives.

    A family is the kernel a tile is a size of (`resources["family"]`, which the CUDA backend's hook gives: v0, v1,
    v2, v3, v3-sm120; one family where no hook does): a wider tile of one kernel only computes empty rows that its
    narrower tile would not, but another kernel's wide tile may be the faster one (for 8 rows at 185k, bench.model
    reads v1's 32-row tile ~2x faster than v0's 16-row tile on both archs: pruning across kernels dropped it)."""
    need = max(16, 1 << max(0, (rows - 1).bit_length()))
    keep: set[int] = set()
    for fam in {c.resources.get("family") for c in cands}:
        mine = [c for c in cands if c.resources.get("family") == fam]
        fits = [c for c in mine if c.config.block_m <= need]
        if not fits:
            narrowest = min(c.config.block_m for c in mine)
            fits = [c for c in mine if c.config.block_m == narrowest]
        keep |= {id(c) for c in fits}
    return [c for c in cands if id(c) in keep], \
        [(c.config, f"block_m={c.config.block_m} > {need} rows needed ({rows} rows), and a narrower tile of "
                    f"{_family(c)} is kept") for c in cands if id(c) not in keep]


def _family(c: Candidate) -> str:
    return c.resources.get("family") or "the same kernel"


def filter_versions(cands: list[Candidate], versions: Optional[frozenset[int]]) -> tuple[
        list[Candidate], list[tuple[KernelConfig, str]]]:
    """Keep the tiles whose kernel version (`resources["version"]`) is in `versions` (None: all). A tile without a
    version (a backend whose hook gives none) is refused by any filter: it cannot be shown to be one of them."""
    if versions is None:
        return cands, []
    keep = [c for c in cands if c.resources.get("version") in versions]
    kept = {id(c) for c in keep}
    names = ", ".join(f"v{v}" for v in sorted(versions))
    return keep, [(c.config, f"kernel {c.resources.get('family') or 'of unknown version'} not in --versions "
                             f"({names})") for c in cands if id(c) not in kept]
