"""The public entry point `tree_verify` and its argument validation.

Validation runs in a fixed order (dtype, device, rank, shapes, then values) and
raises TypeError/ValueError naming the argument. Structural checks read only
shapes and are always on. Value checks (indptr monotone, ids in range, each
node sees itself) read the index tensors on the host; they are skipped while a
CUDA graph is being captured (a host read would break capture) and can be
turned off for a hot path with `set_validation("shapes")` or the environment
variable VERIFY_ATTN_VALIDATE=shapes.

What the caller guarantees when value checks are off (shapes mode, graph capture):
everything the value checks would have checked; in particular every request's tree
fits its mask rows (T_b <= 32 * W, with W = tree_mask.shape[1]) and every index is in
range. The backends size their grids from static shapes (M tiles from
min(32 * W, total_q) nodes per request), so a request with more nodes than that is
not covered. The Triton kernels read the mask only inside its W words and write NaN
to every row of that request they reach; the reference (a host computation)
raises; the CUDA kernels (cuda, cuda-emu) write NaN to every row of that request
their grid covers and set an error bit in a per-device flag that
`verify_attn.kernel_errors(device)` reads (a host sync: call it when convenient,
never inside graph capture). Never rely on any of these: check in full mode while
developing.

Non-finite values: q, k_cache and v_cache are never checked for NaN or inf (that
would read the whole cache on the host, 213 MB per layer at 185k). They propagate:
a non-finite value in q[i, h] reaches out[i, h] and lse[i, h]; one in a KV row that
request b addresses (any of its kv_lens[b] entries; a masked tree entry still
enters the PV product as 0 x value) reaches rows of request b. The reference and
the Triton backends give out NaN and lse NaN (or +inf) there, never a plausible
number; other requests, and KV rows a call does not address, are never affected
(tests fill unaddressed rows with NaN). The CUDA kernels (csrc v0) mark such rows
with lse -inf and, with more than one split, out 0: check lse, or run with one of
the other backends, when hunting a NaN (tests/test_hardening.py pins both).

Index dtypes: qo_indptr, kv_indptr and kv_indices may be int32 or int64 (SGLang keeps
int64 indices) and every backend reads them as given, without a copy (the CUDA kernels
read an int64 array through its low 32-bit words: its values are below 2^31); kv_lens
and tree_mask are int32.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from . import fp8
from .backends import Problem, available_backends, get_backend, known_backends, kv_format_refusal
from .config import KernelConfig, as_config, heuristic_kv_len

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INDEX_DTYPES = (torch.int32, torch.int64)   # qo_indptr, kv_indptr, kv_indices
_VALIDATION = os.environ.get("VERIFY_ATTN_VALIDATE", "full")


def set_validation(mode: str) -> None:
    """'full' (default): shapes and values; 'shapes': shapes only (no host reads)."""
    global _VALIDATION
    if mode not in ("full", "shapes"):
        raise ValueError(f"validation mode must be 'full' or 'shapes', got {mode!r}")
    _VALIDATION = mode


def _check_tensor(name: str, t, *, dtypes, ndim: int | None = None, device=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype {want}, got {str(t.dtype).replace('torch.', '')}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} must be on {device} (the device of q), got {t.device}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def build_problem(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_lens, tree_mask,
                  sm_scale, page_size, *, max_kv_len: Optional[int] = None, k_scale=None, v_scale=None,
                  kv_format: Optional[str] = None) -> Problem:
    # -- dtypes, device, rank ------------------------------------------------
    _check_tensor("q", q, dtypes=_FLOAT_DTYPES, ndim=3)
    dev = q.device
    if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
        raise ValueError(f"page_size must be an int >= 1, got {page_size!r}")
    cache_ndim = 3 if page_size == 1 else 4
    kv_dtype = _kv_format(q, k_cache, v_cache, kv_format)
    if kv_dtype == "fp8_mla656":
        _check_tensor("k_cache", k_cache, dtypes=(torch.uint8,), ndim=cache_ndim, device=dev)
        if v_cache is not None and v_cache is not k_cache:
            raise ValueError("v_cache must be None (or k_cache itself) with kv_format='fp8_mla656': V is the first "
                             "512 dequantized values of the same 656-byte rows")
        v_cache = k_cache
    else:
        _check_tensor("k_cache", k_cache, dtypes=(k_cache.dtype if kv_dtype == "fp8_e4m3" else q.dtype,),
                      ndim=cache_ndim, device=dev)
        _check_tensor("v_cache", v_cache, dtypes=(k_cache.dtype,), ndim=cache_ndim, device=dev)
    for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_indices", kv_indices)):
        _check_tensor(name, t, dtypes=_INDEX_DTYPES, ndim=1, device=dev)
    _check_tensor("kv_lens", kv_lens, dtypes=(torch.int32,), ndim=1, device=dev)
    if tree_mask is not None:   # None: a prefix-only call (no tree block)
        _check_tensor("tree_mask", tree_mask, dtypes=(torch.int32,), ndim=2, device=dev)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)):
        raise TypeError(f"sm_scale must be a float, got {type(sm_scale).__name__}")
    sm_scale = float(sm_scale)
    if not (sm_scale > 0 and sm_scale < float("inf")):
        raise ValueError(f"sm_scale must be a finite positive float, got {sm_scale}")
    if max_kv_len is not None:
        if isinstance(max_kv_len, bool) or not isinstance(max_kv_len, int):
            raise TypeError(f"max_kv_len must be an int or None, got {type(max_kv_len).__name__}")
        if max_kv_len < 1:
            raise ValueError(f"max_kv_len must be >= 1 (the longest kv_lens[b] the call may see), got {max_kv_len}")

    # -- shapes -------------------------------------------------------------
    total_q, hq, dqk = q.shape
    if page_size > 1 and k_cache.shape[1] != page_size:
        raise ValueError(f"k_cache must be [num_pages, page_size={page_size}, Hkv, Dqk], got {tuple(k_cache.shape)}")
    hkv, dk = k_cache.shape[-2], k_cache.shape[-1]
    if kv_dtype == "fp8_mla656":
        if dk != fp8.MLA656_ROW_BYTES:
            raise ValueError(f"k_cache rows must be {fp8.MLA656_ROW_BYTES} bytes with kv_format='fp8_mla656', got {dk}")
        if hkv != 1:
            raise ValueError(f"kv_format='fp8_mla656' is one latent KV head (Hkv=1), k_cache has Hkv={hkv}")
        if dqk != fp8.MLA656_DQK:
            raise ValueError(f"kv_format='fp8_mla656' needs q's head dim Dqk={fp8.MLA656_DQK} (512 latent + 64 rope), "
                             f"got {dqk}")
        dk = dqk
    if dk != dqk:
        raise ValueError(f"k_cache last dim must equal q's head dim {dqk}, got {dk}")
    if v_cache.shape[:-1] != k_cache.shape[:-1]:
        raise ValueError(f"v_cache leading dims must match k_cache {tuple(k_cache.shape[:-1])}, got {tuple(v_cache.shape[:-1])}")
    dv = fp8.MLA656_NOPE if kv_dtype == "fp8_mla656" else v_cache.shape[-1]
    if min(hq, hkv, dqk, dv) < 1:
        raise ValueError(f"head counts and dims must be >= 1: q {tuple(q.shape)}, v_cache {tuple(v_cache.shape)}")
    if hq % hkv:
        raise ValueError(f"q's head count Hq={hq} must be a multiple of the cache's Hkv={hkv}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dim (stride 1), got stride {t.stride(-1)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        # the CUDA kernels address a row as a 32-bit page (or slot) index times a 32-bit stride
        for d in ((0, 1) if page_size > 1 else (0,)):
            if t.stride(d) >= 2 ** 31:
                raise ValueError(f"{name}.stride({d}) must be below 2**31 elements (the kernels multiply 32-bit "
                                 f"page / row indices by it), got {t.stride(d)}")
        if page_size > 1 and (page_size - 1) * t.stride(1) >= 2 ** 31:
            raise ValueError(f"{name}: (page_size - 1) x stride(1) must be below 2**31 elements (a row's offset in "
                             f"its page is a 32-bit product), got {(page_size - 1) * t.stride(1)}")
    if kv_dtype == "fp8_mla656":
        try:   # the kernels read the scales through a float32 view and the RoPE through a bf16 view
            k_cache.view(torch.float32)
        except RuntimeError as e:
            raise ValueError("k_cache (fp8_mla656) must be viewable as float32: its storage offset and strides "
                             f"must be multiples of 4 bytes ({e})") from None
    mla_shared = _shares_storage(k_cache, v_cache) and v_cache.data_ptr() == k_cache.data_ptr()
    if _shares_storage(k_cache, v_cache) and not mla_shared:
        raise ValueError("v_cache shares storage with k_cache but does not start at k_cache's first value; "
                         "an aliased V must be k_cache[..., :Dv]")
    if mla_shared:
        if dv > dqk:
            raise ValueError(f"v_cache aliases k_cache, so Dv ({dv}) must be <= Dqk ({dqk})")
        if v_cache.stride()[:-1] != k_cache.stride()[:-1]:
            raise ValueError("v_cache aliases k_cache but has different strides; pass k_cache[..., :Dv]")
    if qo_indptr.numel() < 2:
        raise ValueError(f"qo_indptr must have B+1 >= 2 entries, got {qo_indptr.numel()}")
    batch = qo_indptr.numel() - 1
    if kv_indptr.numel() != batch + 1:
        raise ValueError(f"kv_indptr must have B+1={batch + 1} entries (like qo_indptr), got {kv_indptr.numel()}")
    if kv_lens.numel() != batch:
        raise ValueError(f"kv_lens must have B={batch} entries, got {kv_lens.numel()}")
    if tree_mask is not None:
        if tree_mask.shape[0] != total_q:
            raise ValueError(f"tree_mask must have total_q={total_q} rows, got {tree_mask.shape[0]}")
        w = tree_mask.shape[1]
        if w < 1:
            raise ValueError("tree_mask must have at least one 32-bit word per row")
    else:
        w = 0
    if total_q < 1:
        raise ValueError("q must have at least one row (every request has a root node)")
    for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_indices", kv_indices),
                    ("kv_lens", kv_lens), ("tree_mask", tree_mask)):
        if t is not None and not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")

    k_scale, v_scale = _check_scales(kv_dtype, k_scale, v_scale, mla_shared, dev)

    num_blocks = k_cache.shape[0]  # slots (page_size 1) or pages
    prob = Problem(
        q=q, k_cache=k_cache, v_cache=v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
        kv_indices=kv_indices, kv_lens=kv_lens, tree_mask=tree_mask, sm_scale=sm_scale, page_size=page_size,
        batch=batch, total_q=total_q, num_q_heads=hq, num_kv_heads=hkv, head_dim_qk=dqk, head_dim_v=dv,
        mask_words=w, max_tree_nodes=min(32 * w, total_q) if tree_mask is not None else total_q,
        mla_shared_kv=mla_shared,
        avg_kv_len=heuristic_kv_len(index_capacity=kv_indices.numel(), page_size=page_size, batch=batch,
                                    max_kv_len=max_kv_len),
        max_kv_len=max_kv_len, kv_dtype=kv_dtype, k_scale=k_scale, v_scale=v_scale,
    )

    # -- values (host reads; skipped under graph capture or when disabled) ---
    if _VALIDATION == "full" and not _capturing(dev):
        _check_values(prob, num_blocks)
    return prob


def _kv_format(q, k_cache, v_cache, kv_format) -> str:
    """The cache's storage format (Problem.kv_dtype) from k_cache's dtype and the kv_format keyword,
    with the dtype combinations that make no sense named."""
    if kv_format is not None:
        if not isinstance(kv_format, str):
            raise TypeError(f"kv_format must be a str or None, got {type(kv_format).__name__}")
        if kv_format not in fp8.KV_DTYPES:
            raise ValueError(f"kv_format must be one of {', '.join(fp8.KV_DTYPES)} (or None: from k_cache's dtype), "
                             f"got {kv_format!r}")
    if not isinstance(k_cache, torch.Tensor):
        raise TypeError(f"k_cache must be a torch.Tensor, got {type(k_cache).__name__}")
    if kv_format == "fp8_mla656" or k_cache.dtype == torch.uint8:
        if kv_format != "fp8_mla656":
            raise TypeError("k_cache has dtype uint8: that is the 656-byte FP8 MLA row format, pass "
                            "kv_format='fp8_mla656' (or a float8_e4m3fn / 16-bit cache)")
        if k_cache.dtype != torch.uint8:
            raise TypeError(f"k_cache must have dtype uint8 (656-byte rows) with kv_format='fp8_mla656', got "
                            f"{_dt(k_cache.dtype)}; a FlashMLA float8_e4m3fn byte buffer passes as "
                            "k_cache.view(torch.uint8)")
        if q.dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"q must have dtype bfloat16 or float16 with an fp8 KV cache, got {_dt(q.dtype)}")
        return "fp8_mla656"
    if k_cache.dtype == torch.float8_e4m3fn:
        if q.dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"q must have dtype bfloat16 or float16 with an fp8 KV cache (k_cache float8_e4m3fn), "
                            f"got {_dt(q.dtype)}")
        if isinstance(v_cache, torch.Tensor) and v_cache.dtype != torch.float8_e4m3fn:
            raise TypeError(f"v_cache must have dtype float8_e4m3fn like k_cache (both fp8 or neither), "
                            f"got {_dt(v_cache.dtype)}")
        fmt = "fp8_e4m3"
    else:
        if isinstance(v_cache, torch.Tensor) and v_cache.dtype == torch.float8_e4m3fn:
            raise TypeError(f"v_cache has dtype float8_e4m3fn but k_cache has {_dt(k_cache.dtype)}: "
                            "both fp8 or neither")
        fmt = fp8.KV_DTYPE_OF.get(k_cache.dtype, "?")
    if kv_format is not None and kv_format != fmt:
        raise ValueError(f"kv_format={kv_format!r} does not match k_cache's dtype {_dt(k_cache.dtype)} "
                         f"(format {fmt!r})")
    return fmt


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _check_scale(name: str, s, dev: torch.device):
    """A float (finite, > 0) or a 0-d float32 tensor on q's device, unchanged (never read on the host)."""
    if isinstance(s, torch.Tensor):
        if s.dtype != torch.float32:
            raise TypeError(f"{name} must be a float or a 0-d float32 tensor, got a {_dt(s.dtype)} tensor")
        if s.dim() != 0:
            raise ValueError(f"{name} must be a 0-d tensor (one scale per tensor), got shape {tuple(s.shape)}")
        if s.device != dev:
            raise ValueError(f"{name} must be on {dev} (the device of q), got {s.device}")
        return s
    if isinstance(s, bool) or not isinstance(s, (int, float)):
        raise TypeError(f"{name} must be a float or a 0-d float32 tensor, got {type(s).__name__}")
    s = float(s)
    if not (s > 0 and s < float("inf")):
        raise ValueError(f"{name} must be a finite positive float, got {s}")
    return s


def _check_scales(kv_dtype: str, k_scale, v_scale, mla_shared: bool, dev: torch.device):
    """(k_scale, v_scale) for the Problem. fp8_e4m3: None -> 1.0, except an aliased V (MLA: the same
    fp8 values) whose scale is K's; a v_scale that contradicts it is refused. Other formats take none."""
    if kv_dtype != "fp8_e4m3":
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if s is not None:
                why = ("the fp8_mla656 rows carry their own per-128 scales" if kv_dtype == "fp8_mla656"
                       else f"the cache is {kv_dtype}, not fp8_e4m3")
                raise ValueError(f"{name} must be None: {why}")
        return 1.0, 1.0
    ks = 1.0 if k_scale is None else _check_scale("k_scale", k_scale, dev)
    if v_scale is None:
        return ks, (ks if mla_shared else 1.0)
    vs = _check_scale("v_scale", v_scale, dev)
    if mla_shared:
        same = (vs is ks) if isinstance(vs, torch.Tensor) or isinstance(ks, torch.Tensor) else vs == ks
        if not same:
            raise ValueError("v_scale must equal k_scale (the same float, or the same tensor) when v_cache aliases "
                             "k_cache (MLA: V is the same fp8 values as K); pass v_scale=None")
    return ks, vs


def _check_values(p: Problem, num_blocks: int) -> None:
    qo = p.qo_indptr.cpu().long()
    kvp = p.kv_indptr.cpu().long()
    lens = p.kv_lens.cpu().long()
    if qo[0] != 0 or kvp[0] != 0:
        raise ValueError(f"qo_indptr[0] and kv_indptr[0] must be 0, got {int(qo[0])} and {int(kvp[0])}")
    t = qo[1:] - qo[:-1]
    if (t < 1).any():
        b = int(torch.nonzero(t < 1)[0])
        raise ValueError(f"qo_indptr must be strictly increasing (every request has >= 1 tree node); request {b} has {int(t[b])}")
    if int(qo[-1]) != p.total_q:
        raise ValueError(f"qo_indptr[-1] must equal q.shape[0]={p.total_q}, got {int(qo[-1])}")
    nidx = kvp[1:] - kvp[:-1]
    if (nidx < 0).any():
        raise ValueError("kv_indptr must be non-decreasing")
    if int(kvp[-1]) > p.kv_indices.numel():
        raise ValueError(f"kv_indptr[-1]={int(kvp[-1])} exceeds kv_indices.numel()={p.kv_indices.numel()}")
    if (lens < 0).any():
        b = int(torch.nonzero(lens < 0)[0])
        raise ValueError(f"kv_lens[{b}]={int(lens[b])} is negative")
    if not p.prefix_only and (lens < t).any():
        b = int(torch.nonzero(lens < t)[0])
        raise ValueError(f"kv_lens[{b}]={int(lens[b])} is smaller than the request's tree size T_b={int(t[b])}")
    if p.max_kv_len is not None and lens.numel() and int(lens.max()) > p.max_kv_len:
        b = int(torch.argmax(lens))
        raise ValueError(f"kv_lens[{b}]={int(lens[b])} exceeds the max_kv_len hint {p.max_kv_len}")
    need = (lens + p.page_size - 1) // p.page_size
    if (nidx < need).any():
        b = int(torch.nonzero(nidx < need)[0])
        what = "slot ids" if p.page_size == 1 else f"page ids (page_size {p.page_size})"
        raise ValueError(f"kv_indices: request {b} needs {int(need[b])} {what} for kv_lens={int(lens[b])}, "
                         f"kv_indptr gives {int(nidx[b])}")
    used = p.kv_indices[: int(kvp[-1])].cpu()
    if used.numel() and (int(used.min()) < 0 or int(used.max()) >= num_blocks):
        what = "slot" if p.page_size == 1 else "page"
        raise ValueError(f"kv_indices holds {what} ids out of range [0, {num_blocks}): "
                         f"min {int(used.min())}, max {int(used.max())}")
    if p.prefix_only:
        return
    maxt = int(t.max())
    if p.mask_words * 32 < maxt:
        raise ValueError(f"tree_mask needs W >= ceil(max T_b / 32) = {(maxt + 31) // 32} words, got {p.mask_words}")
    mask = p.tree_mask.cpu()
    node = torch.arange(p.total_q) - torch.repeat_interleave(qo[:-1], t)       # node index within its request
    own = (mask.gather(1, (node // 32).unsqueeze(1)).squeeze(1).long() >> (node % 32)) & 1
    if (own == 0).any():
        i = int(torch.nonzero(own == 0)[0])
        raise ValueError(f"tree_mask row {i} (node {int(node[i])} of its request) must see its own node (bit set)")
    # bits for nodes >= T_b of the row's request would name nodes that do not exist
    tb = torch.repeat_interleave(t, t)
    word = torch.arange(p.mask_words)
    lo = (tb.unsqueeze(1) - word * 32).clamp(0, 32)                               # valid bits in each word
    allowed = torch.where(lo >= 32, torch.full_like(lo, -1), (1 << lo) - 1)
    bad = (mask.long() & 0xFFFFFFFF) & ~(allowed & 0xFFFFFFFF)
    if (bad != 0).any():
        i = int(torch.nonzero((bad != 0).any(1))[0])
        raise ValueError(f"tree_mask row {i} has bits set for nodes >= its request's T_b={int(tb[i])}")


def _pick_auto(p: Problem) -> str:
    order = ["cuda", "triton", "reference"] if p.device.type == "cuda" else ["reference"]
    for name in order:
        b = get_backend(name)
        if p.prefix_only and not b.prefix_only:
            continue
        if b.available()[0] and kv_format_refusal(b, p) is None and b.supports(p) is None:
            return name
    return "reference"


def tree_verify(
    q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_lens, tree_mask,
    *, sm_scale: float, page_size: int = 1, backend: str = "auto",
    config=None, out: Optional[torch.Tensor] = None, return_lse: bool = False,
    max_kv_len: Optional[int] = None, k_scale=None, v_scale=None, kv_format: Optional[str] = None,
):
    """Tree-verify attention; see README.md and DESIGN.md section 3 for the contract.

    Returns out [total_q, Hq, Dv] in q's dtype, or (out, lse) with lse
    [total_q, Hq] float32 (natural log) when return_lse is True.

    max_kv_len: optional hint, an upper bound on every kv_lens[b]. The split
    heuristic and the tuned-config lookup plan for it instead of estimating the
    context from kv_indices.numel() (which overshoots on a preallocated index
    buffer); pass it when capturing CUDA graphs. Full validation checks it.

    tree_mask=None makes a prefix-only call: no tree block, every q row of
    request b sees all kv_lens[b] entries (kv_lens[b] may be 0: then out is 0 and
    lse -inf). With return_lse it is one half of a cascade whose other half (a
    tree call) is merged by LSE; integration/serving/sglang_compat.py does exactly that.

    FP8 KV caches (verify_attn/fp8.py; q bf16 or fp16, out in q's dtype):
      - k_cache/v_cache torch.float8_e4m3fn ("fp8_e4m3", SGLang's): K = code x k_scale,
        V = code x v_scale; each scale a float or a 0-d float32 tensor on q's device (read by
        the kernel, never on the host: CUDA-graph safe), default 1.0. An aliased MLA V
        (v_cache = k_cache[..., :512]) takes k_scale; a different v_scale is refused.
      - kv_format="fp8_mla656" (FlashMLA's FP8 MLA row): k_cache uint8 [num_slots, 1, 656]
        or [num_pages, P, 1, 656], v_cache None; Dqk 576, Dv 512; no k_scale/v_scale.
    kv_format=None infers the format from k_cache's dtype; given, it must match.
    """
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {type(backend).__name__}")
    if backend != "auto" and backend not in known_backends():
        raise ValueError(f"unknown backend {backend!r}; available: {', '.join(['auto'] + available_backends())}")
    cfg = as_config(config)
    p = build_problem(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_lens, tree_mask, sm_scale, page_size,
                      max_kv_len=max_kv_len, k_scale=k_scale, v_scale=v_scale, kv_format=kv_format)
    name = _pick_auto(p) if backend == "auto" else backend
    b = get_backend(name)
    ok, why = b.available()
    if not ok:
        raise ValueError(f"backend {name!r} is not available here ({why}); available: "
                         f"{', '.join(['auto'] + available_backends())}")
    if p.prefix_only and not b.prefix_only:
        raise ValueError(f"backend {name!r} does not support prefix-only calls (tree_mask=None); "
                         f"use backend='auto' or one of: {', '.join(_prefix_only_backends())}")
    why = kv_format_refusal(b, p) or b.supports(p)
    if why is not None:
        raise ValueError(f"backend {name!r} does not support this call: {why}")

    if out is None:
        out = torch.empty(p.total_q, p.num_q_heads, p.head_dim_v, dtype=q.dtype, device=q.device)
    else:
        _check_tensor("out", out, dtypes=(q.dtype,), ndim=3, device=q.device)
        if tuple(out.shape) != (p.total_q, p.num_q_heads, p.head_dim_v):
            raise ValueError(f"out must have shape {(p.total_q, p.num_q_heads, p.head_dim_v)}, got {tuple(out.shape)}")
        if not out.is_contiguous():
            raise ValueError("out must be contiguous")
    lse = torch.empty(p.total_q, p.num_q_heads, dtype=torch.float32, device=q.device) if return_lse else None

    if cfg is None and b.tunable:
        cfg = resolve_config(p, name)
    b.run(p, cfg, out, lse)
    return (out, lse) if return_lse else out


def _prefix_only_backends() -> list[str]:
    return [n for n in available_backends() if get_backend(n).prefix_only]


def resolve_config(p: Problem, name: str) -> Optional[KernelConfig]:
    """The config `tree_verify(config=None)` uses: the tuned one for this shape
    (autotune lookup), else the backend's default heuristic; None if untunable."""
    b = get_backend(name)
    if not b.tunable:
        return None
    try:
        from . import tuned  # run-time lookup of autotuned configs
    except ImportError:
        tuned = None
    if tuned is not None:
        cfg = tuned.lookup(p, name)
        if cfg is not None:
            return cfg
    return b.default_config(p) if b.default_config is not None else None
