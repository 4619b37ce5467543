"""Device facts for the split heuristics, the benchmark and the autotuner.

The GPU at hand is read once through cuda-python's runtime API
(`cudaGetDeviceProperties`: SM count, L2, shared memory and register limits),
with torch's device properties as the fallback where cuda-python is missing.
GPUs we plan for but do not have come from `SPECS` (vendor tables). The
occupancy helper applies the CUDA occupancy rules to a kernel's ptxas figures
(registers, shared memory) so the autotuner can rank tiles without a GPU.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class DeviceProps:
    name: str
    arch: str                 # sm_90a, sm_120a, ... (the "a" variant where the family has one)
    sm_count: int
    l2_bytes: int
    smem_per_block: int       # opt-in maximum dynamic + static shared memory per block
    smem_per_sm: int
    regs_per_sm: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    reserved_smem_per_block: int = 1024  # the runtime keeps 1 KB per resident block (sm_80+)
    source: str = "spec"      # cuda-python | torch | spec


# CUDA C++ Programming Guide, "Technical Specifications per Compute Capability",
# and the vendors' datasheets (SM counts, L2): for planning without the GPU.
SPECS: dict[str, DeviceProps] = {
    "sm_90a": DeviceProps("NVIDIA H200", "sm_90a", 132, 50 << 20, 232448, 233472, 65536, 2048, 32),
    "sm_120a": DeviceProps("NVIDIA RTX PRO 6000 Blackwell", "sm_120a", 188, 128 << 20, 101376, 102400, 65536,
                           1536, 32),
}
# the device heuristics assume on a machine with no GPU (config inspection, CPU tests)
DEFAULT_ARCH = "sm_90a"


def arch_name(major: int, minor: int) -> str:
    return f"sm_{major}{minor}" + ("a" if major in (9, 10, 12) else "")


def _from_cuda_python(index: int) -> DeviceProps | None:
    try:
        from cuda.bindings import runtime as rt
    except ImportError:
        return None
    err, p = rt.cudaGetDeviceProperties(index)
    if err != rt.cudaError_t.cudaSuccess:
        return None
    name = p.name.split(b"\0", 1)[0].decode() if isinstance(p.name, bytes) else str(p.name)
    return DeviceProps(name, arch_name(p.major, p.minor), p.multiProcessorCount, p.l2CacheSize,
                       p.sharedMemPerBlockOptin, p.sharedMemPerMultiprocessor, p.regsPerMultiprocessor,
                       p.maxThreadsPerMultiProcessor, p.maxBlocksPerMultiProcessor,
                       p.reservedSharedMemPerBlock, "cuda-python")


def _from_torch(index: int) -> DeviceProps:
    p = torch.cuda.get_device_properties(index)
    arch = arch_name(p.major, p.minor)
    base = SPECS.get(arch, SPECS[DEFAULT_ARCH])
    return replace(base, name=p.name, arch=arch, sm_count=p.multi_processor_count,
                   l2_bytes=int(getattr(p, "L2_cache_size", base.l2_bytes)),
                   max_threads_per_sm=int(getattr(p, "max_threads_per_multi_processor", base.max_threads_per_sm)),
                   regs_per_sm=int(getattr(p, "regs_per_multiprocessor", base.regs_per_sm)), source="torch")


@functools.lru_cache(maxsize=None)
def query(index: int = 0) -> DeviceProps:
    """The properties of CUDA device `index` (cached: one driver query per process)."""
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device: use verify_attn.device.spec(arch) to plan for one")
    return _from_cuda_python(index) or _from_torch(index)


def spec(arch: str) -> DeviceProps:
    key = {"sm_90": "sm_90a", "sm_120": "sm_120a"}.get(arch, arch)
    if key not in SPECS:
        raise ValueError(f"no device spec for arch {arch!r}; known: {', '.join(SPECS)}")
    return SPECS[key]


def props_for(device: torch.device | str | None) -> DeviceProps:
    """The GPU behind `device`, or the default planning spec for a CPU device."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type != "cuda":
        return SPECS[DEFAULT_ARCH]
    return query(device.index if device.index is not None else torch.cuda.current_device())


def sm_count(device: torch.device | str | None) -> int:
    return props_for(device).sm_count


def ctas_per_sm(props: DeviceProps, *, threads: int, regs_per_thread: int, smem_bytes: int) -> int:
    """Resident blocks per SM by the occupancy rules: threads, the block limit, registers
    (allocated per warp in units of 256, within each of the 4 SM sub-partitions) and
    shared memory (plus the runtime's per-block reserve). 0 means it cannot launch."""
    if threads < 1 or regs_per_thread < 0 or smem_bytes < 0:
        raise ValueError("ctas_per_sm: threads >= 1, regs_per_thread >= 0, smem_bytes >= 0")
    if regs_per_thread > 255 or smem_bytes > props.smem_per_block or threads > 1024:
        return 0
    warps = -(-threads // 32)
    by_threads = props.max_threads_per_sm // (warps * 32)
    regs_per_warp = -(-max(regs_per_thread, 1) * 32 // 256) * 256
    warps_by_regs = (props.regs_per_sm // 4 // regs_per_warp) * 4
    by_regs = warps_by_regs // warps
    by_smem = props.smem_per_sm // (smem_bytes + props.reserved_smem_per_block) if smem_bytes else props.max_blocks_per_sm
    return int(max(0, min(by_threads, props.max_blocks_per_sm, by_regs, by_smem)))
