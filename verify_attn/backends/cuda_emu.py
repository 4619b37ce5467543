"""Backend "cuda-emu": the CUDA kernel sources run on the CPU by a SIMT emulator.

The kernel translation units (csrc/tree_verify/dispatch.cu and
instantiations/*.cu) are compiled by the host C++ compiler with
-DVA_EMULATION=1, which switches the device API (csrc/arch) to lane-by-lane
software versions of mma.sync, ldmatrix, cp.async, shuffles and barriers, run by
the emulator runtime (csrc/emu: threads as fibers, strict shared/global memory
checks). The same sources, unchanged, are what nvcc builds for the GPU.

It is slow (measured here: ~6 us of CPU per emulated mma.sync, all in; an MLA
call with 16 nodes over 1k tokens ~0.4 s of CPU): meant for CI on small shapes.

Build (on first use, cached under VERIFY_ATTN_CACHE or ~/.cache/verify_attn/emu):
the kernel units, the emulator runtime and two C interfaces become one shared
library built with g++ through ninja (incremental, all cores, no torch
headers); a small torch extension (csrc/bindings/emu_binding.cpp, built once
with torch.utils.cpp_extension.load) loads it by path and calls it, so editing
a kernel never recompiles torch headers. The emulator's settings (fault
injection, schedule) live in the library and are reached through ctypes
(`Emulator`).

Also here, shared with tests/test_arch_emu.py: the toolchain helpers
(`toolkit_include`, `emu_cflags`, `build_shared_library`) that build emulation
code without torch.

Environment: VA_EMU_WORKERS (OS threads running blocks; default: all cores),
VA_EMU_SCHEDULE (forward | reverse | random | warp-ahead | warp-ahead-reverse | lagging | lagging-mid | lagging-tail | starve-last | lagging-head |
stalled-mid | stalled-head | stalled-peer | stalled-peer-mid),
VA_EMU_CP_ASYNC (wait | issue: when cp.async bytes land), VA_EMU_STACK_KB (fiber stack),
VERIFY_ATTN_CACHE (build cache root).
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from ..config import KernelConfig
from . import Backend, Problem, register

REPO = Path(__file__).resolve().parent.parent.parent
CSRC = REPO / "csrc"
EMU = CSRC / "emu"
TV = CSRC / "tree_verify"
BINDING = CSRC / "bindings" / "emu_binding.cpp"

# The emulator runtime: launcher, scheduler, fibers.
RUNTIME_SOURCES = (EMU / "runtime.cpp", EMU / "fiber.cpp")

_DTYPES = (torch.bfloat16, torch.float16)
_lock = threading.Lock()
_ext: "Optional[Emulator]" = None


# ------------------------------------------------------------ toolchain ----

@functools.lru_cache(maxsize=None)
def toolkit_include() -> Optional[str]:
    """The CUDA toolkit's include folder (cuda_bf16.h / cuda_fp16.h are usable
    from host C++; no GPU needed), or None. Cached: tree_verify asks on every call."""
    roots: list[str] = []
    try:
        from ..build import find_cuda_home  # shared discovery; sees through nvcc wrapper scripts

        root = find_cuda_home()
        if root:
            roots.append(root)
    except ImportError:
        pass
    roots += [os.environ[v] for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    roots.append("/usr/local/cuda")
    for r in roots:
        inc = Path(r) / "include"
        if (inc / "cuda_bf16.h").exists() and (inc / "cuda_fp16.h").exists():
            return str(inc.resolve())
    return None


def host_compiler() -> Optional[str]:
    return shutil.which(os.environ.get("CXX", "g++")) or shutil.which("g++")


def toolchain_available() -> tuple[bool, str]:
    """(ok, reason) for building emulation code here."""
    if host_compiler() is None:
        return False, "no host C++ compiler (g++ or $CXX) on PATH"
    if toolkit_include() is None:
        return False, ("CUDA toolkit headers (cuda_bf16.h, cuda_fp16.h) not found; set CUDA_HOME to a toolkit "
                       "root (headers only are needed, no GPU)")
    return True, ""


def emu_cflags(opt: str = "-O2") -> list[str]:
    """Compile flags of an emulation build (both the torch extension and ctypes libraries)."""
    inc = toolkit_include()
    if inc is None:
        raise RuntimeError(toolchain_available()[1])
    # -fvisibility=hidden keeps two emulation builds loaded in one process apart
    # (each has its own runtime and settings).
    # -Wno-unknown-pragmas: g++ does not know CUDA's `#pragma unroll`.
    return [opt, "-std=c++20", "-DVA_EMULATION=1", "-fvisibility=hidden", "-fvisibility-inlines-hidden",
            "-Wno-unknown-pragmas", f"-I{CSRC}", f"-I{inc}"]


def cache_root() -> Path:
    from ..utils import cache_dir
    return cache_dir() / "emu"


def _hash_files(files: Sequence[Path], extra: Sequence[str] = ()) -> str:
    h = hashlib.sha256()
    for f in sorted({Path(p).resolve() for p in files}):
        h.update(str(f.relative_to(REPO) if f.is_relative_to(REPO) else f).encode())
        h.update(f.read_bytes() if f.exists() else b"<missing>")
    for e in extra:
        h.update(e.encode())
    return h.hexdigest()[:16]


def _ninja_escape(p: str) -> str:
    return p.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def build_shared_library(name: str, sources: Sequence[Path], *, opt: str = "-O2", defines: Sequence[str] = ()) -> Path:
    """Build `sources` (.cpp; .cu compiled as C++) + the emulator runtime into
    one shared library, without torch. Incremental (ninja with the compiler's
    header dependencies, one object per source, all cores) in a stable build
    folder; the result is copied to a content-addressed file so a library that
    another process has loaded is never overwritten. `defines`: extra -D flags
    (e.g. -DVA_TV_KNOCKOUT=1, a knockout build). Returns its path."""
    import fcntl

    cxx = host_compiler()
    if cxx is None:
        raise RuntimeError(toolchain_available()[1])
    srcs = [Path(s).resolve() for s in sources] + [p.resolve() for p in RUNTIME_SOURCES]
    flags = emu_cflags(opt) + ["-fPIC", *defines]
    bdir = cache_root() / f"build-{name}-{_hash_files([], [cxx, *flags, *map(str, srcs)])}"
    bdir.mkdir(parents=True, exist_ok=True)
    lines = [
        "ninja_required_version = 1.3",
        f"cxx = {cxx}",
        "cflags = " + " ".join(_ninja_escape(f) for f in flags),
        "rule cxx",
        "  command = $cxx -MMD -MF $out.d $cflags $lang -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = CXX $in",
        "rule link",
        "  command = $cxx -shared -o $out $in -pthread",
        "  description = LINK $out",
    ]
    objs = []
    for s in srcs:
        obj = f"obj/{s.parent.name}_{s.stem}{s.suffix.replace('.', '_')}.o"
        objs.append(obj)
        lines.append(f"build {obj}: cxx {_ninja_escape(str(s))}")
        lines.append("  lang = -x c++" if s.suffix == ".cu" else "  lang =")
    lines.append(f"build lib{name}.so: link {' '.join(objs)}")
    lines.append(f"default lib{name}.so")
    text = "\n".join(lines) + "\n"
    with open(bdir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per folder (pytest workers, parallel CI jobs)
        if not (bdir / "build.ninja").exists() or (bdir / "build.ninja").read_text() != text:
            (bdir / "build.ninja").write_text(text)
        ninja = shutil.which("ninja")
        if ninja is None:
            raise RuntimeError("cuda-emu: the 'ninja' build tool is required (pip install ninja)")
        r = subprocess.run([ninja, "-C", str(bdir), f"-j{max(1, os.cpu_count() or 1)}"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"emulation build of {name} failed in {bdir}:\n{(r.stdout + r.stderr)[-8000:]}")
        built = bdir / f"lib{name}.so"
        final = bdir / f"lib{name}-{_hash_files([built])}.so"
        if not final.exists():
            tmp = final.with_suffix(f".tmp{os.getpid()}")
            shutil.copyfile(built, tmp)
            os.replace(tmp, final)
            # keep the newest few copies (unlinking one a process has loaded is safe on Linux)
            old = sorted(bdir.glob(f"lib{name}-*.so"), key=lambda f: f.stat().st_mtime)[:-4]
            for f in old:
                f.unlink(missing_ok=True)
    return final


# ------------------------------------------------------------ extension ----

def kernel_units() -> list[Path]:
    """The kernel translation units an emulation build compiles: the dispatcher
    and every instantiation file present."""
    inst = sorted((TV / "instantiations").glob("*.cu"))
    return [TV / "dispatch.cu", *inst]


def available() -> tuple[bool, str]:
    ok, why = toolchain_available()
    if not ok:
        return ok, why
    missing = [str(p.relative_to(REPO)) for p in (TV / "api.h", TV / "dispatch.cu", BINDING,
                                                  CSRC / "bindings" / "params_from_tensors.h") if not p.exists()]
    if missing:
        return False, f"kernel sources missing: {', '.join(missing)}"
    if len(kernel_units()) < 2:
        return False, "no kernel instantiations in csrc/tree_verify/instantiations"
    return True, ""


def load_emu_library(path: Path):
    """ctypes handle of a library built with csrc/emu/c_api.cpp, with the emulator's
    C API typed (the kernel library below and the device-API test kernels share it)."""
    import ctypes

    lib = ctypes.CDLL(str(path))
    lib.va_emu_register_global.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    lib.va_emu_set_fault.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.va_emu_set_fault.restype = ctypes.c_char_p
    lib.va_emu_set_schedule.argtypes = [ctypes.c_char_p, ctypes.c_ulonglong]
    lib.va_emu_set_schedule.restype = ctypes.c_char_p
    lib.va_emu_set_num_workers.restype = ctypes.c_char_p
    lib.va_emu_set_cp_async_landing.argtypes = [ctypes.c_char_p]
    lib.va_emu_set_cp_async_landing.restype = ctypes.c_char_p
    lib.va_emu_set_fault_threads.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.va_emu_set_fault_threads.restype = ctypes.c_char_p
    lib.va_emu_fault_hits.restype = ctypes.c_longlong
    return lib


class Emulator:
    """The loaded emulation build: the kernels (a ctypes library, which also
    holds the emulator's settings) and the torch binding that calls them."""

    def __init__(self, lib_path: Path, binding: Any):
        import ctypes

        self.path = lib_path
        self.lib = load_emu_library(lib_path)  # same instance the binding dlopens (same path)
        self.lib.va_emu_set_smem_limit.argtypes = [ctypes.c_size_t]
        self.lib.va_emu_tv_built_kernels.restype = ctypes.c_char_p
        self.lib.va_emu_max_dyn_smem.restype = ctypes.c_longlong
        self.binding = binding
        binding.load_kernels(str(lib_path))

    def _check(self, err: Optional[bytes]) -> None:
        if err is not None:
            raise ValueError(err.decode())

    def set_fault(self, what: str, nth: int = -1, threads: Optional[tuple[int, int]] = None) -> None:
        """'skip_block_sync' | 'skip_cp_async_wait' | 'skip_wgmma_wait' | 'skip_fence_proxy_async' |
        'skip_mbarrier_wait' | 'named_barrier_miscount' (the call counts 32 threads fewer) | 'skip_named_barrier' (the
        call is not made) | 'none'; nth:
        per-thread call index, -1 = every call; threads: (lo, hi), only threadIdx.x in [lo, hi) (one warp role),
        None = every thread."""
        self._check(self.lib.va_emu_set_fault(what.encode(), nth))
        if threads is not None:
            self._check(self.lib.va_emu_set_fault_threads(*threads))

    def clear_faults(self) -> None:
        self.set_fault("none", -1)

    def fault_hits(self) -> int:
        return int(self.lib.va_emu_fault_hits())

    def set_schedule(self, name: str, seed: int = 0) -> None:
        """'forward' | 'reverse' | 'random' (seeded): the order runnable threads are resumed in."""
        self._check(self.lib.va_emu_set_schedule(name.encode(), seed))

    def set_cp_async_landing(self, when: str) -> None:
        """'wait' (default: bytes land at the covering wait_group; finds missing waits) or
        'issue' (they land at once; with a warp-ahead schedule finds stages reused too early)."""
        self._check(self.lib.va_emu_set_cp_async_landing(when.encode()))

    def set_num_workers(self, n: int) -> None:
        self._check(self.lib.va_emu_set_num_workers(n))

    def set_smem_limit(self, nbytes: int) -> None:
        self.lib.va_emu_set_smem_limit(nbytes)

    def stats(self) -> dict:
        import ctypes

        out = (ctypes.c_longlong * 7)()
        self.lib.va_emu_stats(out)
        keys = ("launches", "blocks", "threads", "block_syncs", "warp_collectives", "mma", "cp_async_bytes")
        return dict(zip(keys, list(out)))

    def prefetch_stats(self) -> dict:
        """prefetch.global.L2 requests, the cp.async source bytes, those of them in a 128-byte line the same
        block prefetched before the copy, and those by 16-byte copies (since the last reset_stats)."""
        import ctypes

        out = (ctypes.c_longlong * 4)()
        self.lib.va_emu_prefetch_stats(out)
        return dict(zip(("l2_prefetches", "cp_async_src_bytes", "cp_async_src_prefetched", "cp_async16_src_prefetched"),
                        list(out)))

    def max_dyn_smem(self) -> int:
        """The most dynamic shared memory one launch asked for since the last reset_stats (bytes): the host code's
        own figure for a kernel's shared-memory plan."""
        return int(self.lib.va_emu_max_dyn_smem())

    def reset_stats(self) -> None:
        self.lib.va_emu_reset_stats()

    def built_kernels(self) -> list[str]:
        return [s for s in self.lib.va_emu_tv_built_kernels().decode().split("\n") if s]


def _binding_deps() -> list[Path]:
    """What the torch binding is compiled from (it sees the kernels only through
    Params / LaunchConfig and the C interface)."""
    return [BINDING, CSRC / "bindings" / "params_from_tensors.h", TV / "params.h", TV / "api.h",
            CSRC / "arch" / "defs.cuh"]


def load_extension(verbose: bool = False) -> Emulator:
    """Build (first use: ~1 minute for the binding's torch headers plus the
    kernel units on all cores; then incremental) or load the emulation build."""
    global _ext
    with _lock:
        if _ext is not None:
            return _ext
        ok, why = available()
        if not ok:
            raise RuntimeError(f"cuda-emu is unavailable: {why}")
        lib_path = build_shared_library("va_tv_emu", [*kernel_units(), EMU / "tv_c_api.cpp", EMU / "c_api.cpp"])
        os.environ.setdefault("CUDA_HOME", str(Path(toolkit_include()).parent))  # quiets torch's CUDA probe
        from torch.utils.cpp_extension import load

        flags = emu_cflags()
        key = _hash_files(_binding_deps(), flags)
        build_dir = cache_root() / f"binding-{key}"
        build_dir.mkdir(parents=True, exist_ok=True)
        binding = load(name=f"va_cuda_emu_{key}", sources=[str(BINDING)], extra_cflags=flags,
                       extra_ldflags=["-ldl"], build_directory=str(build_dir), with_cuda=False, verbose=verbose)
        _ext = Emulator(lib_path, binding)
        return _ext


# --------------------------------------------------------------- configs ----

def _cuda_configs():
    """The kernel family's config logic lives with the CUDA backend; reuse it."""
    from . import cuda

    return cuda


def default_config(p: Problem) -> KernelConfig:
    return _cuda_configs().default_config(p)


def config_space(shape, arch: str = "sm_120a", **kw) -> list[KernelConfig]:
    return _cuda_configs().config_space(shape, arch, **kw)


def resources(config: KernelConfig, shape, arch: str = "sm_120a", **kw) -> dict:
    return _cuda_configs().resources(config, shape, arch, **kw)


def supports(p: Problem) -> Optional[str]:
    if p.device.type != "cpu":
        return f"tensors are on {p.device}; cuda-emu runs on CPU tensors"
    cuda = _cuda_configs()
    return cuda.family_problem(p) or cuda.index_range_problem(p) or cuda.alignment_problem(p)


@torch.library.custom_op("verify_attn_emu::tree_verify", mutates_args=("out", "lse", "errors"), device_types="cpu")
def emu_tree_verify(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, qo_indptr: torch.Tensor,
                    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_lens: torch.Tensor,
                    tree_mask: Optional[torch.Tensor], out: torch.Tensor, lse: Optional[torch.Tensor],
                    errors: torch.Tensor, sm_scale: float, page_size: int, max_tree_nodes: int, num_splits: int,
                    block_n: int, block_m: int, num_warps: int, num_stages: int, k_scale: float = 1.0,
                    v_scale: float = 1.0, k_scale_t: Optional[torch.Tensor] = None,
                    v_scale_t: Optional[torch.Tensor] = None) -> None:
    """One emulated launch (kernel + its combine) as one torch op, with the signature of the GPU
    build's `tree_verify` op: a dispatch-mode counter sees one op per call on either backend
    (integration/serving counts the ops a layer dispatches this way)."""
    load_extension().binding.run(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_lens, tree_mask, out,
                                 lse, sm_scale, page_size, max_tree_nodes, num_splits, block_n, block_m, num_warps,
                                 num_stages, errors, k_scale=k_scale, v_scale=v_scale, k_scale_t=k_scale_t,
                                 v_scale_t=v_scale_t)


def _run(p: Problem, config: Optional[KernelConfig], out: torch.Tensor, lse: Optional[torch.Tensor]) -> None:
    why = supports(p)
    if why is not None:
        raise ValueError(f"cuda-emu does not support this problem: {why}")
    cfg = _cuda_configs().resolve_config(p, config)
    load_extension()   # builds on first use, outside the op
    emu_tree_verify(p.q, p.k_cache, p.v_cache, p.qo_indptr, p.kv_indptr, p.kv_indices, p.kv_lens, p.tree_mask,
                    out, lse, _cuda_configs().error_flags(p.device), p.sm_scale, p.page_size, p.max_tree_nodes,
                    cfg.num_splits, cfg.block_n, cfg.block_m, cfg.num_warps, cfg.num_stages,
                    **_cuda_configs().scale_args(p))


register(Backend(
    name="cuda-emu", run=_run, available=available, supports=supports, config_space=config_space,
    resources=resources, default_config=default_config, tunable=False, prefix_only=True,
    kv_formats=("bf16", "fp16", "fp8_e4m3", "fp8_mla656"),
    meta={"kind": "emulator", "runs": "the CUDA kernel sources on the CPU (csrc/emu)"},
))


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m verify_attn.backends.cuda_emu`: build (or find cached) the
    emulation and list the kernels it holds; CI runs it to warm the cache."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m verify_attn.backends.cuda_emu", description=main.__doc__)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    ok, why = available()
    if not ok:
        print(f"cuda-emu unavailable: {why}")
        return 1
    emu = load_extension(verbose=args.verbose)
    print(f"cuda-emu kernels ({emu.path}):")
    for k in emu.built_kernels():
        print("  " + k)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
