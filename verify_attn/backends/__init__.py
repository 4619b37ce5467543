"""Backend registry.

A backend is a function `run(problem, config, out, lse) -> None` that writes
`out` ([total_q, Hq, Dv], q's dtype) and, when `lse` is not None, `lse`
([total_q, Hq] float32, natural log). `problem` has already been validated by
`verify_attn.api`. Tunable backends also publish their config search space and
resource model so that the autotuner treats them alike.

Backends register lazily: importing this package imports no Triton and builds no
CUDA. `get_backend(name)` imports the backend's module on first use.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..config import KernelConfig
from ..shapes import HeadShape


@dataclass
class Problem:
    """A validated tree-verify call. Tensors are the caller's, unchanged."""

    q: torch.Tensor            # [total_q, Hq, Dqk]
    k_cache: torch.Tensor      # [num_slots, Hkv, Dqk] (page_size 1) or [num_pages, P, Hkv, Dqk]
    v_cache: torch.Tensor      # same leading dims, last dim Dv
    qo_indptr: torch.Tensor    # [B+1] int32 or int64
    kv_indptr: torch.Tensor    # [B+1] int32 or int64
    kv_indices: torch.Tensor   # [nnz] int32 or int64 slot ids or page ids (the caller's buffer, may be longer)
    kv_lens: torch.Tensor      # [B] int32, L_b + T_b (prefix-only call: L_b, may be 0)
    tree_mask: Optional[torch.Tensor]  # [total_q, W] int32 packed; None = prefix-only call (no tree block)
    sm_scale: float
    page_size: int
    # static facts derived from shapes only (no device data read)
    batch: int
    total_q: int
    num_q_heads: int
    num_kv_heads: int
    head_dim_qk: int
    head_dim_v: int
    mask_words: int            # W (0 for a prefix-only call)
    max_tree_nodes: int        # upper bound on T_b (q rows per request): min(32 * W, total_q); total_q if prefix-only
    mla_shared_kv: bool        # v_cache aliases k_cache[..., :Dv] (same storage and strides)
    # KV tokens per request that split heuristics and tuned-config lookups plan for: the caller's
    # max_kv_len hint when given, else kv_indices.numel() * page_size // batch (config.heuristic_kv_len)
    avg_kv_len: int
    max_kv_len: Optional[int] = None  # the caller's hint: every kv_lens[b] <= max_kv_len (None: not given)
    # KV storage format (verify_attn/fp8.py): "fp32" | "bf16" | "fp16" (the cache has q's dtype),
    # "fp8_e4m3" (float8_e4m3fn caches, value = code x k_scale / v_scale), "fp8_mla656" (uint8
    # [..., 1, 656] rows with per-128 scales and bf16 RoPE; v_cache is k_cache, Dv = 512)
    kv_dtype: str = "bf16"
    # fp8_e4m3 dequantization scales as the caller gave them: a float, or a 0-d float32 tensor on
    # q's device (read by the kernel, never on the host: CUDA-graph safe). 1.0 for every other format.
    k_scale: "float | torch.Tensor" = 1.0
    v_scale: "float | torch.Tensor" = 1.0

    @property
    def fp8(self) -> bool:
        """The cache is stored in one of the fp8 formats (verify_attn.fp8.FP8_KV_DTYPES)."""
        return self.kv_dtype in ("fp8_e4m3", "fp8_mla656")

    @property
    def prefix_only(self) -> bool:
        """No tree block: every q row of request b sees all kv_lens[b] entries (cascade / LSE-merge use)."""
        return self.tree_mask is None

    @property
    def group(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def dtype(self) -> torch.dtype:
        return self.q.dtype

    @property
    def layout(self) -> str:
        return "page1" if self.page_size == 1 else "paged"

    def head_shape(self) -> HeadShape:
        return HeadShape(
            "problem", self.num_q_heads, self.num_kv_heads, self.head_dim_qk, self.head_dim_v,
            self.sm_scale, self.mla_shared_kv,
        )


NATIVE_KV_FORMATS = ("fp32", "bf16", "fp16")
ALL_KV_FORMATS = NATIVE_KV_FORMATS + ("fp8_e4m3", "fp8_mla656")


def kv_format_refusal(b: "Backend", p: Problem) -> Optional[str]:
    """Why backend `b` cannot read p's fp8 KV storage format, or None. 16/32-bit caches are left to
    the backend's own `supports` (which names the dtypes it takes)."""
    if p.kv_dtype in b.kv_formats or p.kv_dtype in NATIVE_KV_FORMATS:
        return None
    return (f"KV cache format {p.kv_dtype!r} is not implemented by backend {b.name!r} "
            f"(it reads {', '.join(b.kv_formats)}); loaded backends that read it: "
            f"{', '.join(sorted(n for n, o in _REGISTRY.items() if p.kv_dtype in o.kv_formats)) or 'none'}")


RunFn = Callable[[Problem, Optional[KernelConfig], torch.Tensor, Optional[torch.Tensor]], None]


@dataclass
class Backend:
    name: str
    run: RunFn
    # (ok, reason): whether the backend can run at all here (toolkit present, ...)
    available: Callable[[], "tuple[bool, str]"] = lambda: (True, "")
    # None if the problem is supported, else a reason string (device, dtype, head dim, ...)
    supports: Callable[[Problem], Optional[str]] = lambda p: None
    # autotuning hooks (None for untunable backends)
    config_space: Optional[Callable[..., "list[KernelConfig]"]] = None     # (shape: HeadShape, arch: str, **kw)
    resources: Optional[Callable[..., dict]] = None                       # (config, shape: HeadShape, arch: str, **kw)
    default_config: Optional[Callable[[Problem], KernelConfig]] = None
    tunable: bool = False
    # runs prefix-only calls (Problem.tree_mask None: no tree block, kv_lens[b] may be 0)
    prefix_only: bool = False
    # KV storage formats (Problem.kv_dtype) the backend reads; the api refuses the others with a
    # reason before `supports` is asked. Default: the 16/32-bit caches only.
    kv_formats: tuple = NATIVE_KV_FORMATS
    meta: dict = field(default_factory=dict)


_REGISTRY: dict[str, Backend] = {}

# name -> module that registers it when imported
_LAZY: dict[str, str] = {
    "reference": "verify_attn.reference",
    "triton": "verify_attn.backends.triton_split",
    "triton-serial": "verify_attn.backends.triton_serial",
    "cuda": "verify_attn.backends.cuda",
    "cuda-emu": "verify_attn.backends.cuda_emu",
}


def register(backend: Backend) -> Backend:
    _REGISTRY[backend.name] = backend
    return backend


def known_backends() -> list[str]:
    return sorted(set(_LAZY) | set(_REGISTRY))


def _load(name: str) -> Optional[Backend]:
    if name not in _REGISTRY and name in _LAZY:
        try:
            importlib.import_module(_LAZY[name])
        except ImportError as e:  # module not written yet or a dependency missing
            _REGISTRY.setdefault(name, Backend(name, _unavailable_run(name, str(e)), lambda e=e: (False, f"import failed: {e}")))
    return _REGISTRY.get(name)


def _unavailable_run(name: str, why: str) -> RunFn:
    def run(*_a, **_k):
        raise RuntimeError(f"backend {name!r} is unavailable: {why}")
    return run


def get_backend(name: str) -> Backend:
    b = _load(name)
    if b is None:
        raise ValueError(f"unknown backend {name!r}; available: {', '.join(available_backends()) or 'none'}")
    return b


def available_backends() -> list[str]:
    out = []
    for n in known_backends():
        b = _load(n)
        if b is not None and b.available()[0]:
            out.append(n)
    return out
