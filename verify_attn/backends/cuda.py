"""Backend "cuda": the split-KV tree-verify kernels of csrc/tree_verify.

Ops come from, in order: the setup.py AOT extension `verify_attn._C` (every
instantiation, op namespace `verify_attn`), else a JIT build on first use with
torch.utils.cpp_extension + ninja of just the (dtype, head shape, layout)
asked for (op namespace = the module name, so several variants load side by
side; cached under torch's extensions dir). JIT targets the local GPU's arch
(sm_90a / sm_120a) or $VERIFY_ATTN_CUDA_ARCHS (e.g. "sm_90a,sm_120a");
VERIFY_ATTN_JIT_ALL=1 builds every instantiation into one module instead, and
VERIFY_ATTN_JIT_SET="mla576_bf16_page1,gqa128_bf16_page1,..." (instantiation file
stems) builds just those into one module (what `bench.gpu_check` does: one parallel
build of the instantiations its stages run); a variant outside the set is built alone.

The launch path is CUDA-graph safe: the config (tile + split count) comes from
static shapes, the grid's M tiles from problem.max_tree_nodes, the fp32
workspace is cached per device and only grows outside capture; nothing reads
device memory on the host.
"""
from __future__ import annotations

import functools
import os
import re
import threading
from typing import Optional

import torch

from .. import build as vb
from .. import device as vdevice
from ..config import MAX_SPLITS, KernelConfig, heuristic_num_splits, tile_split_args
from ..shapes import HeadShape
from . import Backend, Problem, register

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
_SPLIT_CANDIDATES = (1, 2, 4, 8, 16, 32, 64, 128, 192, 256)
_lock = threading.Lock()


# ---------------------------------------------------------------- configs ----

def _head_of(dqk: int, dv: int, shared_kv: bool, kv_fp8=False) -> Optional[str]:
    return vb.head_key(dqk, dv, shared_kv, kv_fp8)


def _fp8_arg(kv_dtype: str):
    return kv_dtype if kv_dtype in ("fp8_e4m3", "fp8_mla656") else False


def problem_head(p: Problem) -> Optional[str]:
    """The head key of p's kernels: its shape, and the fp8 variant for an fp8_e4m3 / fp8_mla656 cache."""
    return _head_of(p.head_dim_qk, p.head_dim_v, p.mla_shared_kv, _fp8_arg(p.kv_dtype))


def _shape_head(shape: HeadShape, kv_dtype: str = "bf16") -> Optional[str]:
    return _head_of(shape.head_dim_qk, shape.head_dim_v, shape.mla, _fp8_arg(kv_dtype))


def _tile_of(head: str, cfg: KernelConfig) -> Optional[vb.Tile]:
    for t in vb.TILES[head]:
        if (t.block_m, t.block_n, t.num_warps, t.num_stages) == (cfg.block_m, cfg.block_n, cfg.num_warps,
                                                                  cfg.num_stages):
            return t
    return None


def resources(config: KernelConfig, shape: HeadShape, arch: str, **_kw) -> dict:
    """Exact dynamic smem of the split kernel (SharedMemoryPlan), threads, and
    whether the tile config is compiled and fits the arch's per-block limit.
    Registers/spills are the compiler's: `python -m verify_attn.build --report`."""
    head = _shape_head(shape, _kw.get("kv_dtype", "bf16"))
    tile = _tile_of(head, config) if head else None
    limit = vb.SMEM_LIMIT.get(arch, 99 * 1024)
    if tile is None:
        return {"smem_bytes": 0, "smem_limit": limit, "threads": 32 * config.num_warps, "compiled": False,
                "fits": False}
    smem = vb.tile_smem(head, tile)
    # (cta_block_m: the rows one CTA holds, which its registers scale with; a cluster tile's block_m is its CTAs')
    # (version, family: the kernel version its name says and the kernel it is a size of; the autotuner's --versions
    # and its row pruning read them: autotune.space.filter_versions, prune_for_rows)
    return {"smem_bytes": smem, "smem_limit": limit, "threads": 32 * tile.num_warps, "compiled": True,
            "fits": smem <= limit and tile.targets(arch), "cta_block_m": tile.cta_m, "version": tile.kernel_version,
            "family": tile.family}


def config_space(shape: HeadShape, arch: str, *, splits: tuple[int, ...] = (0,), **_kw) -> list[KernelConfig]:
    """Every compiled tile config of this head shape x the split counts asked for
    (0 = the heuristic; the autotuner passes the counts it sweeps); kv_dtype "fp8_e4m3" / "fp8_mla656": the
    tiles of those cache formats."""
    kv_dtype = _kw.get("kv_dtype", "bf16")
    head = _shape_head(shape, kv_dtype)
    if head is None:
        return []
    out = []
    for t in vb.TILES[head]:
        if quarantined(tile_name(t), kv_dtype):   # a GPU session saw it hang or crash: never offered to the tuner
            continue
        for s in splits:
            c = KernelConfig(num_splits=s, block_n=t.block_n, block_m=t.block_m, num_warps=t.num_warps,
                             num_stages=t.num_stages)
            if resources(c, shape, arch, kv_dtype=kv_dtype)["fits"]:
                out.append(c)
    return out


def _problem_sms(p: Problem) -> int:
    # the GPU's own count (cuda-python, cached); on a CPU (config inspection) the H200's
    return vdevice.sm_count(p.device)


def default_config(p: Problem) -> KernelConfig:
    head = problem_head(p)
    if head is None:
        raise ValueError(f"cuda backend: no kernel for Dqk={p.head_dim_qk} Dv={p.head_dim_v} "
                         f"(V {'aliases' if p.mla_shared_kv else 'separate from'} K)")
    t = vb.default_tile(head, vdevice.props_for(p.device).arch)
    return KernelConfig(num_splits=_splits_for(p, t), block_n=t.block_n, block_m=t.block_m,
                        num_warps=t.num_warps, num_stages=t.num_stages)


# "v3": kernel v3 for Hopper (issue 40; csrc/tree_verify/sm90/, sm_90a only): a producer warpgroup and FlashMLA's
# seesaw on two consumer warpgroups. Not sm_120's v3 (that one is "v3-sm120", below).
KERNEL_VERSIONS = {"v0": 0, "v1": 1, "v2": 2, "v3": 3}
# kernel v3 for sm_120 (issue 39: a producer on FULL / EMPTY mbarriers, math warps on mma.sync), pinned by name for
# every format: the fastest of its tiles by the model that the device's arch runs, in this order: the math-roles tile
# (LOADER 4: 8 S warps, 8 PV warps, a producer warpgroup), the producer-warpgroup tile (LOADER 3: setmaxnreg gives 8
# math warps 232 registers and v1's two-tile loop), the one-producer-warp tile (LOADER 2). On the RTX PRO 6000 that is
# the math-roles tile for every format, and on the H200 too: there it is the proxy of the sm_120 kernel (the same source
# and tile built for sm_90a, never the Hopper v3). Every v3 tile of every format builds for both archs.
V3_SM120 = "v3-sm120"
V3_SM120_LOADERS = (4, 3, 2)
# Hopper's v3 as a 2-CTA cluster (issue 40; build.V3_SM90_CLUSTER_TILE): the two 64-row CTAs of a split share each
# block's gather through distributed shared memory. 16-bit MLA caches on sm_90a
V3_CLUSTER = "v3-cluster"
PINNED_NAMES = (*KERNEL_VERSIONS, V3_SM120, V3_CLUSTER)
# cuda@m32n16w8s8: one compiled tile pinned by (block_m, block_n, num_warps, num_stages), the heuristic's splits
PINNED_TILE_RE = re.compile(r"m(\d+)n(\d+)w(\d+)s(\d+)")


def split_pin(version: str) -> tuple[str, Optional[int]]:
    """("v3", 15) for "v3:15": a pinned name or tile, then ":" and a fixed split count (an A/B of the split
    heuristic: `bench.verify --backend cuda@v3:15,cuda@v3`); (version, None) without one."""
    name, sep, n = version.partition(":")
    if not sep:
        return version, None
    if not n.isdigit() or not 1 <= int(n) <= MAX_SPLITS:
        raise ValueError(f"kernel version {version!r}: the split count after ':' must be an integer in "
                         f"[1, {MAX_SPLITS}], got {n!r}")
    return name, int(n)


def v3_sm120_tile(head: str, arch: str) -> Optional[vb.Tile]:
    """The tile "v3-sm120" pins for `head` on `arch`: the first of V3_SM120_LOADERS the arch runs, else (no such tile
    built for the arch) the first compiled, which resolve_config refuses unless
    VERIFY_ATTN_ANY_TILE_ARCH is set; None for a head without v3 tiles (GQA)."""
    tiles = [next((x for x in vb.TILES[head] if x.version == 1 and x.loader == ld), None) for ld in V3_SM120_LOADERS]
    tiles = [x for x in tiles if x is not None]
    return next((x for x in tiles if x.targets(arch)), tiles[0] if tiles else None)


def v3_cluster_tile(head: str) -> Optional[vb.Tile]:
    """The tile "v3-cluster" pins for `head`: Hopper's v3 as a 2-CTA cluster (16-bit MLA caches), else None."""
    return next((x for x in vb.TILES.get(head, ()) if x.version == 3 and x.cluster > 1), None)


def version_config(p: Problem, version: str) -> KernelConfig:
    """The config of `version` (see `_version_config`), with its split count fixed when the name carries one
    (`v3:15`, `split_pin`)."""
    name, splits = split_pin(version)
    cfg = _version_config(p, name)
    return cfg if splits is None else cfg.replace(num_splits=splits)


def _version_config(p: Problem, version: str) -> KernelConfig:
    """The config a call uses with kernel `version` ("v0", "v1" or "v2") pinned: that version's default tile
    for the device's arch (build.default_tile when it is that version, else the version's first tile the arch
    runs; v2 is sm_90a's wgmma kernel), the split heuristic. How the benchmark times the versions side by side
    (`bench.verify --backend cuda@v0,cuda@v1,cuda@v2`)."""
    pinned = PINNED_TILE_RE.fullmatch(version)
    if version not in PINNED_NAMES and not pinned:
        raise ValueError(f"kernel version {version!r}: known {', '.join(PINNED_NAMES)}, or a tile "
                         "mBMnBNwWARPSsSTAGES such as m32n16w8s8")
    head = problem_head(p)
    if head is None:
        raise ValueError(f"cuda backend: no kernel for Dqk={p.head_dim_qk} Dv={p.head_dim_v}")
    arch = vdevice.props_for(p.device).arch
    if version == V3_SM120:
        t = v3_sm120_tile(head, arch)
        if t is None:
            raise LookupError(f"no {V3_SM120} tile compiled for {head} (kernel v3 runs MLA rows only)")
        cfg = KernelConfig(block_m=t.block_m, block_n=t.block_n, num_warps=t.num_warps, num_stages=t.num_stages)
        return resolve_config(p, cfg, arch)  # refuses the 656-byte tile on sm_90a unless any-tile-arch is set
    if version == V3_CLUSTER:
        t = v3_cluster_tile(head)
        if t is None:
            raise LookupError(f"no {V3_CLUSTER} tile compiled for {head} (the cluster runs 16-bit MLA caches only)")
        cfg = KernelConfig(block_m=t.block_m, block_n=t.block_n, num_warps=t.num_warps, num_stages=t.num_stages)
        return resolve_config(p, cfg, arch)  # refuses it off sm_90a
    if pinned:
        bm, bn, w, st = map(int, pinned.groups())
        cfg = KernelConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=st)
        return resolve_config(p, cfg, arch)  # refuses a tile not compiled, or not built for this arch
    t = _version_tile(head, arch, KERNEL_VERSIONS[version])
    if t is None:
        raise LookupError(f"no {version} tile compiled for {head} on {arch}")
    return KernelConfig(num_splits=_splits_for(p, t), block_n=t.block_n, block_m=t.block_m, num_warps=t.num_warps,
                        num_stages=t.num_stages)


def _version_tile(head: str, arch: str, want: int) -> Optional[vb.Tile]:
    """Kernel version `want`'s tile for `head` on `arch`: the arch's default when it is that version, else the
    version's default there (build.VERSION_DEFAULT_TILE), else its first tile the arch runs."""
    d = vb.default_tile(head, arch)
    return d if d.version == want else vb.VERSION_DEFAULT_TILE.get((head, vb.normalize_arch(arch), want)) or next(
        (x for x in vb.TILES[head] if x.version == want and x.targets(arch)), None)


def m_tiles(p: Problem, block_m: int, cluster: int = 1) -> int:
    """The grid's M tiles: from the static bound on tree rows, never from qo_indptr (a cluster tile: its CTAs, each
    block_m / cluster rows, whole clusters)."""
    return -(-(p.max_tree_nodes * p.group) // block_m) * cluster


def _splits_for(p: Problem, t: vb.Tile) -> int:
    return heuristic_num_splits(batch=p.batch, num_kv_heads=p.num_kv_heads, m_tiles=m_tiles(p, t.block_m, t.cluster),
                                avg_kv_len=p.avg_kv_len, num_sms=_problem_sms(p),
                                **tile_split_args(t.block_n, t.blocks_per_iter))


def resolve_config(p: Problem, config: Optional[KernelConfig], arch: Optional[str] = None) -> KernelConfig:
    """Fill num_splits=0 with the heuristic; check the tile config is compiled and, given the device's
    `arch`, built for it (the emulator passes none: it runs every compiled tile)."""
    cfg = config if config is not None else default_config(p)
    head = problem_head(p)
    t = _tile_of(head, cfg)
    if t is None:
        have = ", ".join(f"(block_m={x.block_m}, block_n={x.block_n}, num_warps={x.num_warps}, "
                         f"num_stages={x.num_stages})" for x in vb.TILES[head])
        raise ValueError(f"cuda backend: tile config {cfg} is not compiled for {head}; compiled: {have}")
    if arch is not None and not t.targets(arch):  # e.g. the 190 KB sm_90 tile, the e4m3-MMA tile on sm_90
        smem, limit = vb.tile_smem(head, t), vb.SMEM_LIMIT.get(arch, 99 * 1024)
        if not any_tile_arch() or smem > limit:
            raise ValueError(f"cuda backend: tile config {cfg} of {head} is built for {', '.join(t.archs)}, "
                             f"not for this device's {arch}" + (f" ({smem} B of shared memory, over its {limit})"
                                                                if smem > limit else
                                                                f"; {ANY_TILE_ARCH_ENV}=1 runs it anyway"))
    if cfg.num_splits == 0:
        cfg = cfg.replace(num_splits=_splits_for(p, t))
    return cfg


# ---------------------------------------------------------- availability ----

def split_pdl() -> bool:
    """Whether this process launches the split kernel with programmatic dependent launch (launch_shape.cuh reads the
    same variable once a process): yes unless VERIFY_ATTN_NO_PDL is set to something other than '' or '0'."""
    return os.environ.get("VERIFY_ATTN_NO_PDL", "") in ("", "0")


def available() -> tuple[bool, str]:
    if not torch.cuda.is_available():
        return False, "no CUDA device (torch.cuda.is_available() is False)"
    if _aot_module() is None and vb.find_cuda_home() is None:
        return False, ("no CUDA toolkit for the JIT build and no AOT build (verify_attn._C); set CUDA_HOME, "
                       "or pip install with VERIFY_ATTN_BUILD_CUDA=1; fallback: backend='triton'")
    return True, ""


def supports(p: Problem) -> Optional[str]:
    if p.device.type != "cuda":
        return f"tensors are on {p.device}, the cuda backend needs a CUDA device"
    return family_problem(p) or index_range_problem(p) or alignment_problem(p)


def family_problem(p: Problem) -> Optional[str]:
    """Why the kernel family has no kernel for p (dtype, head shape, cache format), or None."""
    if p.dtype not in _DTYPES:
        return f"dtype {p.dtype} (bfloat16 and float16 only)"
    if _head_of(p.head_dim_qk, p.head_dim_v, p.mla_shared_kv) is None:
        return (f"head shape Dqk={p.head_dim_qk} Dv={p.head_dim_v} with V "
                f"{'aliasing' if p.mla_shared_kv else 'separate from'} K (compiled: MLA 576/512 with "
                f"v_cache = k_cache[..., :512]; GQA 64, 128, 256)")
    if p.kv_dtype not in KV_FORMATS:
        return f"KV cache format {p.kv_dtype!r} (the kernels read {', '.join(KV_FORMATS)})"
    if problem_head(p) is None:
        return ("fp8 caches: the kernels are built for MLA 576/512 (v_cache = k_cache[..., :512]; e4m3 and 656-byte "
                "rows) and GQA 64 / 128 / 256 (e4m3) only")
    return None


def alignment_problem(p: Problem) -> Optional[str]:
    for name, t in (("q", p.q), ("k_cache", p.k_cache), ("v_cache", p.v_cache)):
        per16 = 16 // t.element_size()
        if t.data_ptr() % 16 or any(s % per16 for s in t.stride()[:-1]):
            return (f"{name} rows must be 16-byte aligned (strides multiples of {per16} elements) for cp.async")
    return None


KV_FORMATS = ("bf16", "fp16", "fp8_e4m3", "fp8_mla656")  # Problem.kv_dtype values the kernels read


def scale_args(p: Problem) -> dict:
    """The op's k_scale / v_scale arguments: a float, or a 0-d device tensor the kernel reads."""
    out = {}
    for name in ("k_scale", "v_scale"):
        v = getattr(p, name)
        if isinstance(v, torch.Tensor):
            out[name], out[name + "_t"] = 1.0, v.reshape(1)
        else:
            out[name], out[name + "_t"] = float(v), None
    return out


def index_range_problem(p: Problem) -> Optional[str]:
    """The kernels read int64 index arrays through their low 32-bit words: every id and offset must
    stay below 2^31, which the pool and index sizes bound statically."""
    if p.k_cache.shape[0] >= 2**31 or p.kv_indices.numel() >= 2**31 or p.total_q >= 2**31:
        return (f"indices must stay below 2^31 (k_cache.shape[0]={p.k_cache.shape[0]}, "
                f"kv_indices.numel()={p.kv_indices.numel()})")
    return None


# ------------------------------------------------------------ error bits ----

KERNEL_ERRORS = {1: "a request had more tree nodes than its tree_mask rows describe (T_b > 32 * W): its rows "
                    "are NaN (or unwritten past the grid's 32 * W nodes)"}
_ERRORS: dict[torch.device, torch.Tensor] = {}


def _device_key(device: torch.device) -> torch.device:
    """One key per physical device: torch.device("cuda") and torch.device("cuda:0") name the same one (a tensor's
    .device always carries the index; a user's kernel_errors("cuda") does not)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def error_flags(device: torch.device) -> torch.Tensor:
    """The device's int32 [1] error-bit word the kernels set (allocated once; before graph capture)."""
    device = _device_key(device)
    t = _ERRORS.get(device)
    if t is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("cuda backend: the error flag must exist before CUDA-graph capture; make one call "
                               "(or call verify_attn.kernel_errors) first")
        t = torch.zeros(1, dtype=torch.int32, device=device)
        _ERRORS[device] = t
    return t


def read_errors(device: torch.device, clear: bool = True) -> list[str]:
    """Messages for the error bits set since the last read (a host read: synchronizes the device)."""
    t = error_flags(device)
    bits = int(t.item())
    if clear and bits:
        t.zero_()
    return [msg for bit, msg in KERNEL_ERRORS.items() if bits & bit] + (
        [f"unknown error bits 0x{bits & ~sum(KERNEL_ERRORS):x}"] if bits & ~sum(KERNEL_ERRORS) else [])


# ------------------------------------------------------------ op loading ----

@functools.lru_cache(maxsize=None)
def _aot_module():
    try:
        import verify_attn._C  # noqa: F401  (registers torch.ops.verify_attn.*)
    except ImportError:
        return None
    return "verify_attn"


def jit_archs() -> list[str]:
    env = os.environ.get("VERIFY_ATTN_CUDA_ARCHS")
    if env:
        return [a.strip() for a in env.split(",") if a.strip()]
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        suffix = "a" if major in (9, 10, 12) else ""
        return [f"sm_{major}{minor}{suffix}"]
    return list(vb.DEFAULT_ARCHS)


def variant_name(dtype: str, head: str, layout: str, archs: list[str]) -> str:
    tag = vb.source_hash([str(vb.CSRC / "bindings" / "torch_ops.cpp"), *archs])[:8]
    return f"va_tv_{head}_{dtype}_{layout}_{'_'.join(a.replace('sm_', '') for a in archs)}_{tag}"


_LOADED: dict[str, str] = {}


def jit_set() -> Optional[list[str]]:
    """The instantiation stems of $VERIFY_ATTN_JIT_SET (validated against the files), sorted; None if unset."""
    env = os.environ.get("VERIFY_ATTN_JIT_SET", "").strip()
    if not env:
        return None
    stems = sorted({s.strip() for s in env.split(",") if s.strip()})
    known = {f.stem for f in vb.instantiation_files()}
    unknown = [s for s in stems if s not in known]
    if unknown:
        raise ValueError(f"VERIFY_ATTN_JIT_SET: no instantiation file {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(known))}")
    return stems


ANY_TILE_ARCH_ENV = "VERIFY_ATTN_ANY_TILE_ARCH"


def any_tile_arch() -> bool:
    """$VERIFY_ATTN_ANY_TILE_ARCH=1: an explicit config may name a compiled tile its arch does not target when its
    shared memory fits the device, for validation only: sm_120's e4m3-MMA tiles on an H200, where nvcc lowers the
    e4m3 MMAs to f16 ones (slow there, the same code otherwise). Defaults and tuning never pick such a tile."""
    return os.environ.get(ANY_TILE_ARCH_ENV, "").strip() == "1"


def runs_e4m3_mma(p: Problem, config: Optional[KernelConfig]) -> bool:
    """Whether this call rounds Q and P to e4m3 (an fp8 cache on an e4m3-MMA tile: v1's and v3's sm_120 tiles, v2's
    and Hopper v3's wgmma .e4m3; not the f16 tiles, which convert K / V to f16), so that it is judged by
    tolerances.check_e4m3_mma and not by the 16-bit tolerance. `config` None: the arch's default."""
    if not _fp8_arg(p.kv_dtype):
        return False
    head = problem_head(p)
    if head is None:
        return False
    t = _tile_of(head, config if config is not None else default_config(p))
    return t is not None and bool(t.fp8_mma)


QUARANTINE_ENV = "VERIFY_ATTN_QUARANTINE"


def tile_name(t) -> str:
    """'m32n16w20s4': the name a tile or a config is pinned by (cuda@m32n16w20s4)."""
    return f"m{t.block_m}n{t.block_n}w{t.num_warps}s{t.num_stages}"


def quarantine_key(name: str, kv_dtype: Optional[str]) -> str:
    """'m32n16w20s4/bf16': a version or tile and its cache format (16-bit caches are one key: the same tiles)."""
    return f"{name}/{'bf16' if kv_dtype in (None, '', 'bf16', 'fp16') else kv_dtype}"


def quarantined(name: str, kv_dtype: Optional[str] = "bf16") -> Optional[str]:
    """Why `name` (a pinned version such as v3-sm120, or a tile such as m32n16w20s4) must not run on `kv_dtype` in
    this process, or None: $VERIFY_ATTN_QUARANTINE lists "name/kv_dtype" entries that a GPU session's smoke stage
    saw hang or crash (bench/gpu_run/smoke.py). The GPU tests skip them and the autotuner does not offer them, so
    one broken kernel cannot take a session's other measurements with it. Unset everywhere else."""
    raw = os.environ.get(QUARANTINE_ENV, "")
    if not raw.strip():
        return None
    key = quarantine_key(name, kv_dtype)
    if key in {k.strip() for k in raw.split(",")}:
        return f"{key} is quarantined ({QUARANTINE_ENV}): this GPU session's smoke stage saw it hang or crash"
    return None


def pinned_tile(head: str, arch: str, version: str) -> Optional[vb.Tile]:
    """The compiled tile `version` pins for `head` on `arch`, without a problem (the split count aside): what
    `version_config` resolves, for a caller that needs the tile's name only (the smoke stage's quarantine). None when
    the version names no tile there."""
    name, _ = split_pin(version)
    pinned = PINNED_TILE_RE.fullmatch(name)
    if pinned:
        want = tuple(map(int, pinned.groups()))   # (any numbers: not a KernelConfig, which refuses odd ones)
        return next((t for t in vb.TILES.get(head, ()) if (t.block_m, t.block_n, t.num_warps, t.num_stages) == want),
                    None)
    if name == V3_SM120:
        return v3_sm120_tile(head, arch)
    if name == V3_CLUSTER:
        return v3_cluster_tile(head)
    if name in KERNEL_VERSIONS:
        return _version_tile(head, arch, KERNEL_VERSIONS[name])
    return None


def knockout_bits() -> int:
    """$VERIFY_ATTN_KNOCKOUT: the kernels' timing-experiment bits (csrc/tree_verify/request.cuh kKo*; results wrong by
    design), 0 when unset. Only bench/gpu_run/knockout.py sets it."""
    v = os.environ.get("VERIFY_ATTN_KNOCKOUT", "").strip()
    if not v:
        return 0
    if not v.isdigit() or not 0 <= int(v) < vb.KNOCKOUT_LIMIT:
        raise ValueError(f"VERIFY_ATTN_KNOCKOUT: bits 0..{vb.KNOCKOUT_LIMIT - 1} (1 no KV copies, 2 no index loads, "
                         f"4 no v2 exchange, 8 no v2 L2 prefetch, 16 v3 half the rows), got {v!r}")
    return int(v)


def _module_plan(dtype: str, head: str, layout: str, archs: list[str]) -> tuple[str, list]:
    """(module name, instantiation files) of the JIT build that holds (dtype, head, layout)."""
    if os.environ.get("VERIFY_ATTN_JIT_ALL") == "1":
        return variant_name("all", "kernels", "any", archs), vb.instantiation_files()
    stems = jit_set()
    one = vb.instantiation_file(dtype, head, layout)
    if stems and one.stem in stems:
        tag = vb.source_hash(stems)[:6]   # the set is part of the name: another set is another module
        return variant_name("set", f"k{len(stems)}x{tag}", "any", archs), [vb.INST_DIR / f"{s}.cu" for s in stems]
    return variant_name(dtype, head, layout, archs), [one]


def load_ops(dtype: str, head: str, layout: str, archs: Optional[list[str]] = None, verbose: bool = False):
    """The torch.ops namespace holding the kernels for (dtype, head, layout):
    the AOT module's, or a JIT build of just that instantiation (built once, cached),
    or of the JIT set / every instantiation that holds it (VERIFY_ATTN_JIT_SET / _ALL)."""
    if _aot_module() is not None:
        _fake_registered_aot()
        return getattr(torch.ops, "verify_attn")
    archs = archs or jit_archs()
    name, files = _module_plan(dtype, head, layout, archs)
    defines = [f"-DVA_OP_NAMESPACE={name}"]
    ko = knockout_bits()
    if ko:  # a timing experiment's build (bench/gpu_run/knockout.py): its own module, never the shipped one
        name = f"{name}_ko{ko}"
        defines = [f"-DVA_OP_NAMESPACE={name}", f"-DVA_TV_KNOCKOUT={ko}"]
    with _lock:
        if name not in _LOADED:
            vb.ensure_cuda_home()
            from torch.utils.cpp_extension import load

            # one instantiation, or several in a single build, which ninja compiles in
            # parallel: the quickest way to cover a matrix on a many-core GPU machine
            srcs = vb.extension_sources(files)
            lib = load(name=name, sources=srcs, extra_include_paths=[str(vb.CSRC)],
                       extra_cflags=["-O2", *defines], extra_cuda_cflags=vb.nvcc_extension_flags(archs) + defines,
                       is_python_module=False, verbose=verbose)
            if isinstance(lib, str):  # older torch returns the path without loading it
                torch.ops.load_library(lib)
            _register_fake(name)
            _LOADED[name] = name
    return getattr(torch.ops, name)


def _register_fake(ns: str) -> None:
    """Fake (meta) kernels: the op only writes its mutable outputs, so shapes
    and dtypes come from the caller's tensors and the fake op does nothing."""
    @torch.library.register_fake(f"{ns}::tree_verify")
    def _fake(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_lens, tree_mask, out, lse, workspace,
              errors, sm_scale, page_size, max_tree_nodes, num_splits, block_n, block_m, num_warps, num_stages,
              k_scale=1.0, v_scale=1.0, k_scale_t=None, v_scale_t=None):
        return None


@functools.lru_cache(maxsize=None)
def _fake_registered_aot() -> bool:
    _register_fake("verify_attn")
    return True


# -------------------------------------------------------------- workspace ----

_WORKSPACE: dict[torch.device, torch.Tensor] = {}


def workspace_bytes(p: Problem, num_splits: int) -> int:
    """fp32 partial O + log2-sum-exp2 per (split, q row, head) when num_splits > 1."""
    return 0 if num_splits <= 1 else num_splits * p.total_q * p.num_q_heads * (p.head_dim_v + 1) * 4


def reserve_workspace(device: torch.device, nbytes: int) -> torch.Tensor:
    """The device's cached workspace, grown to >= nbytes. Call before CUDA-graph
    capture with the captured maxima; a capture that needs more raises."""
    ws = _WORKSPACE.get(device)
    if ws is None or ws.numel() < nbytes:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"cuda backend: workspace of {nbytes} B needed during CUDA-graph capture but only "
                               f"{0 if ws is None else ws.numel()} B reserved; run the call once (or "
                               f"reserve_workspace) with the captured maxima before capturing")
        ws = torch.empty(max(nbytes, 1 << 20), dtype=torch.uint8, device=device)
        _WORKSPACE[device] = ws
    return ws


# -------------------------------------------------------------------- run ----

def _run(p: Problem, config: Optional[KernelConfig], out: torch.Tensor, lse: Optional[torch.Tensor]) -> None:
    cfg = resolve_config(p, config, arch=vdevice.props_for(p.device).arch)
    ops = load_ops(_DTYPES[p.dtype], problem_head(p), p.layout)
    need = workspace_bytes(p, cfg.num_splits)
    ws = reserve_workspace(p.device, need) if need else None
    ops.tree_verify(p.q, p.k_cache, p.v_cache, p.qo_indptr, p.kv_indptr, p.kv_indices, p.kv_lens, p.tree_mask,
                    out, lse, ws, error_flags(p.device), p.sm_scale, p.page_size, p.max_tree_nodes, cfg.num_splits,
                    cfg.block_n, cfg.block_m, cfg.num_warps, cfg.num_stages, **scale_args(p))


register(Backend(
    "cuda", _run, available=available, supports=supports, config_space=config_space, resources=resources,
    default_config=default_config, tunable=True, prefix_only=True, kv_formats=KV_FORMATS,
    meta={"kind": "split-kv", "grid": "(KV split, M tile x KV head, request) + combine",
          "sources": "csrc/tree_verify"},
))
