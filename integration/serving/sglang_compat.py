"""Drop-in replacement for SGLang's Triton `extend_attention_fwd`, for target verify.

SGLang's kernel (sglang/kernels/ops/attention/extend_attention.py in sglang 0.5.23;
sglang/srt/layers/attention/triton_ops/extend_attention.py in older releases) walks
the whole prefix serially per (request, head). This function keeps its positional
signature and semantics and runs our tree-verify backends instead.

Semantics matched (read from the SGLang source, not copied):
  * request b has T_b = qo_indptr[b+1]-qo_indptr[b] new ("extend") tokens, whose
    K/V are k_extend/v_extend rows qo_indptr[b]..; its prefix is
    L_b = kv_indptr[b+1]-kv_indptr[b] tokens at slots kv_indices[kv_indptr[b]:]
    of the page_size-1 pools k_buffer/v_buffer [num_slots, Hkv, D].
  * custom_mask (uint8/int8/bool) holds per request a row-major [T_b, L_b+T_b]
    matrix at offset mask_indptr[b]; an element != 0 means visible. With
    skip_prefix_custom_mask=True (SGLang's default) the prefix columns are ignored.
    Without a custom mask, is_causal gives a causal extend block, else a full one.
  * prefix logits are q.k * sm_scale * k_scale and prefix values are scaled by
    v_scale (dequantisation of an fp8 cache); the extend rows are not scaled.
    An fp8 pool (k_buffer/v_buffer float8_e4m3fn, SGLang's fp8_e4m3 KV cache; the
    extend rows stay in q's dtype) goes to tree_verify as it is, with k_scale/v_scale
    passed through (floats, or device tensors that are never read on the host).
  * sm_scale None or 0 means 1/sqrt(q_extend.shape[-1]).
  * lse_extend (optional, float32 [total_q, Hq]) receives the natural-log LSE;
    skip_prefix / skip_extend drop one of the two parts (as SGLang's DCP path uses).

How it is computed: attention over (prefix + tree) is split into two tree_verify
calls whose softmax states merge exactly by LSE, and nothing is rebuilt from the
caller's buffers (no copy of k_buffer, kv_indices or kv_indptr, ever):
  A. the prefix: a prefix-only call (tree_mask=None: every row of request b sees
     all L_b entries, L_b = 0 gives out 0 and lse -inf, so it weighs nothing in
     the merge) over the caller's own k_buffer/v_buffer, qo_indptr, kv_indptr and
     kv_indices, int32 or int64 as given, with sm_scale*k_scale. Only kv_lens = L_b
     ([B] int32, from kv_indptr on the device) is new.
  B. the tree: a tree call over a pool made of k_extend/v_extend themselves (T rows
     per request, no copy unless v_extend aliases k_extend at an offset, which our
     contract rejects; then only the small extend rows are cloned), with the packed
     tree mask taken from custom_mask.
  C. the merge, in fp32; for 16-bit inputs the two partial outputs are rounded to
     the input dtype before it (one extra rounding; within bf16 tolerance).

Cost per layer besides the two kernels (identical with or without CUDA-graph
capture; no host reads unless a check below asks for one off capture): 48
small device ops (tests/test_sglang_compat.py counts them) touching
O(B + total_q * 32W + total_q * Hq * Dv) elements, W = ceil(max_len_extend / 32):
the row->request map, the packed tree mask, kv_lens, the [total_q] extend index
list and the LSE merge of two [total_q, Hq, Dv] partials. Nothing scales with
SGLang's graph index buffer (max_num_tokens x max_context_len int64 entries) or
with the context: test_adapter_work_does_not_scale_with_index_buffer checks that
the ops and elements are the same for a 10x larger buffer and a 10x longer
context. Against the kernel: Kimi K2 at TP8 with a 16-node tree reads 213 MB of
KV per layer at 185k (119 us floor on an RTX PRO 6000); the adapter moves ~1.6 MB
(16 x 8 x 512 fp32 partials, a few passes), so its cost is the 48 launches: at an
assumed 1.5-3 us per tiny kernel inside a CUDA graph (not measured here: no GPU)
that is ~70-150 us per layer, the same order as the kernel at 185k and dominant at
short context. This signature cannot do better: it never sees out_cache_loc, where the
draft rows sit in the pool. The backend class (sglang_backend.py, on verify_step.py)
sees it, plans the step once and makes one launch per layer.
Pass `max_kv_len` (the longest prefix this graph serves) so that call A's split
count is planned for the real context, not for the index buffer's capacity.
Serving should also run `verify_attn.set_validation("shapes")`: full validation
reads the used indices on the host on every call (graph capture skips it anyway).

Until the CUDA kernels run prefix-only calls (their Backend.prefix_only flag), a
`backend` without them (cuda, cuda-emu) runs call B only; call A then goes to
backend="auto", which picks the fastest backend that has them (triton on a GPU,
the reference on a CPU), with one log line.

Unsupported options raise NotImplementedError naming the option: logit_cap != 0,
sliding_window_size > 0, window_kv_offsets, sinks, xai_temperature_len > 0,
score_mod/aux_tensors, page_size != 1, KV buffers whose dtype is neither q's nor
float8_e4m3fn, extend rows not in q's dtype, k_scale <= 0,
skip_prefix_custom_mask=False with a prefix mask that hides anything, is_causal
with a custom mask that has bits above the diagonal (SGLang's result then depends
on its BLOCK_M tile). Rows are checked to see their own node by tree_verify.

Patching SGLang (checked against sglang 0.5.23, whose TritonAttnBackend.__init__
imports extend_attention_fwd from this module at construction time): before the
model runner builds its attention backend, run

    import sglang.kernels.ops.attention.extend_attention as E; from integration.serving.sglang_compat import verify_only
    E.extend_attention_fwd = verify_only(E.extend_attention_fwd)

verify_only sends calls that carry a custom_mask (target verify of a draft tree)
here and every other call (prefill, DCP, options we do not support) to SGLang's
own kernel unchanged. Older SGLang releases keep the file at
sglang/srt/layers/attention/triton_ops/extend_attention.py (patch that module;
not tried here).
"""
from __future__ import annotations

import logging
import math
from typing import Callable, Optional

import torch

from verify_attn.api import tree_verify

_MASK_DTYPES = (torch.uint8, torch.int8, torch.bool)
_log = logging.getLogger(__name__)


def _capturing(dev: torch.device) -> bool:
    return dev.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _as_scale(name: str, x, dev: torch.device) -> float:
    """SGLang passes python floats (layer.k_scale_float or 1.0); accept 1-element tensors off capture."""
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got a tensor of shape {tuple(x.shape)}")
        if _capturing(dev):
            raise NotImplementedError(f"{name} as a tensor under CUDA-graph capture (needs a host read); pass a float")
        x = float(x)
    if x is None:
        return 1.0
    return float(x)


def _reject_unsupported(*, logit_cap, sliding_window_size, sinks, window_kv_offsets, xai_temperature_len,
                        page_size, score_mod, aux_tensors) -> None:
    if logit_cap is not None and float(logit_cap) != 0.0:
        raise NotImplementedError(f"logit_cap={logit_cap}: logit soft-capping is not supported (only 0.0)")
    if sliding_window_size is not None and sliding_window_size > 0:
        raise NotImplementedError(f"sliding_window_size={sliding_window_size}: sliding-window attention is not supported")
    if window_kv_offsets is not None:
        raise NotImplementedError("window_kv_offsets: sliding-window attention is not supported")
    if sinks is not None:
        raise NotImplementedError("sinks: attention sinks are not supported")
    if xai_temperature_len is not None and xai_temperature_len > 0:
        raise NotImplementedError(f"xai_temperature_len={xai_temperature_len}: temperature scaling is not supported")
    if score_mod is not None or aux_tensors is not None:
        raise NotImplementedError("score_mod/aux_tensors: custom logit terms are not supported")
    if page_size != 1:
        raise NotImplementedError(f"page_size={page_size}: only page_size 1 pools (SGLang's token-slot indices)")


def _pack_bits(vis: torch.Tensor) -> torch.Tensor:
    """bool [R, 32*W] -> int32 [R, W], bit j%32 of word j//32 (device-side, no host sync)."""
    r, n = vis.shape
    w = n // 32
    shifts = torch.arange(32, device=vis.device, dtype=torch.int64)
    words = (vis.view(r, w, 32).to(torch.int64) << shifts).sum(-1)       # [R, W] in [0, 2^32)
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words)         # two's complement int32
    return words.to(torch.int32)


def _row_info(qo: torch.Tensor, total_q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query row: (request id int64 [total_q], node index within its request int64 [total_q])."""
    rows = torch.arange(total_q, device=qo.device, dtype=torch.int64)
    req = torch.searchsorted(qo[1:].to(torch.int64), rows, right=True)
    return req, rows - qo.to(torch.int64)[req]


def _tree_visibility(custom_mask, mask_indptr, is_causal: bool, req, node, plen, tlen, ncols: int) -> torch.Tensor:
    """bool [total_q, ncols]: row r sees tree entry j of its request (SGLang's extend block)."""
    j = torch.arange(ncols, device=req.device, dtype=torch.int64).unsqueeze(0)   # [1, ncols]
    t_r = tlen[req].unsqueeze(1)                                                  # [R, 1]
    n_r = node.unsqueeze(1)
    in_tree = j < t_r
    if custom_mask is None:
        return in_tree & (j <= n_r) if is_causal else in_tree
    l_r = plen[req].unsqueeze(1)
    start = mask_indptr.to(torch.int64)[req].unsqueeze(1)
    idx = start + n_r * (l_r + t_r) + l_r + j                                     # flat offset in custom_mask
    idx = torch.where(in_tree, idx, torch.zeros_like(idx)).clamp_(0, max(custom_mask.numel() - 1, 0))
    vis = (custom_mask.reshape(-1)[idx] != 0) & in_tree
    if is_causal:
        if not _capturing(req.device) and bool((vis & (j > n_r)).any()):
            raise NotImplementedError("is_causal=True with a custom_mask that has bits above the diagonal: "
                                      "SGLang's result then depends on its BLOCK_M tile; order tree nodes "
                                      "parents-first or pass is_causal=False")
        vis = vis & (j <= n_r)   # a no-op for parents-first trees (what SGLang builds)
    return vis


def _check_prefix_mask(custom_mask, mask_indptr, plen, tlen) -> None:
    """skip_prefix_custom_mask=False: the prefix columns must all be visible (tree verify sees the prefix)."""
    dev = custom_mask.device
    if _capturing(dev):
        raise NotImplementedError("skip_prefix_custom_mask=False under CUDA-graph capture (the prefix mask "
                                  "cannot be checked); tree verify always sees the whole prefix")
    mi = mask_indptr.to(torch.int64)
    if mi.numel() != plen.numel() + 1:
        raise ValueError(f"mask_indptr must have B+1={plen.numel() + 1} entries, got {mi.numel()}")
    n = int(mi[-1])
    pos = torch.arange(n, device=dev, dtype=torch.int64)
    b = torch.searchsorted(mi[1:], pos, right=True).clamp_(max=plen.numel() - 1)
    off = pos - mi[b]
    width = plen[b] + tlen[b]
    inside = (off >= 0) & (off < tlen[b] * width)
    is_prefix = inside & ((off % width.clamp(min=1)) < plen[b])
    hidden = is_prefix & (custom_mask.reshape(-1)[:n] == 0)
    if bool(hidden.any()):
        raise NotImplementedError("skip_prefix_custom_mask=False with a custom_mask that hides prefix tokens: "
                                  "tree verify always sees the whole prefix")


_IDENTITY: dict[tuple, torch.Tensor] = {}   # (device, n) -> arange(n) int32, made off capture


def _identity_indices(n: int, dev: torch.device) -> torch.Tensor:
    """arange(n) int32 slot ids for identity_kv_indices: cached (made once per pool size, off
    capture), so a layer does not allocate O(pool). Under capture without a cached copy a
    fresh one is recorded into the graph (its values exist only once the graph replays)."""
    key = (dev, n)
    t = _IDENTITY.get(key)
    if t is None:
        t = torch.arange(n, device=dev, dtype=torch.int32)
        if not _capturing(dev):
            _IDENTITY[key] = t
    return t


def _pool_view(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k_extend/v_extend as a tree_verify pool; clone (small: T rows) only what the contract rejects."""
    if k.stride(-1) != 1:
        k = k.contiguous()
    same_storage = v.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()
    if v.stride(-1) != 1 or (same_storage and (v.data_ptr() != k.data_ptr() or v.stride()[:-1] != k.stride()[:-1])):
        v = v.contiguous().clone() if same_storage else v.contiguous()
    return k, v


def extend_attention_fwd(
    q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
    custom_mask, is_causal, mask_indptr, max_len_extend, k_scale, v_scale, sm_scale=None, logit_cap=0.0,
    skip_prefix_custom_mask=True, sliding_window_size=-1, sinks=None, window_kv_offsets=None,
    xai_temperature_len=-1, lse_extend=None, skip_prefix=False, skip_extend=False, page_size: int = 1,
    score_mod=None, aux_tensors=None, extend_seq_lens_cpu=None, identity_kv_indices: bool = False,
    *, backend: str = "auto", config=None, max_kv_len: Optional[int] = None,
):
    """SGLang's extend_attention_fwd signature; writes o_extend [total_q, Hq, Dv] (and lse_extend).

    q_extend [total_q, Hq, Dqk]; k_extend [total_q, Hkv, Dqk]; v_extend [total_q, Hkv, Dv];
    k_buffer [num_slots, Hkv, Dqk]; v_buffer [num_slots, Hkv, Dv] (may be k_buffer[..., :Dv]).
    extend_seq_lens_cpu is a launch-grid hint in SGLang and is ignored here.
    max_kv_len (ours): the longest prefix L_b this call may see, tree_verify's planning hint.
    """
    _reject_unsupported(logit_cap=logit_cap, sliding_window_size=sliding_window_size, sinks=sinks,
                        window_kv_offsets=window_kv_offsets, xai_temperature_len=xai_temperature_len,
                        page_size=page_size, score_mod=score_mod, aux_tensors=aux_tensors)
    dev = q_extend.device
    for name, t in (("k_extend", k_extend), ("v_extend", v_extend)):
        if t.dtype != q_extend.dtype:
            raise NotImplementedError(f"{name} dtype {t.dtype} differs from q_extend's {q_extend.dtype}: "
                                      "the extend rows must be in q's dtype")
    fp8_pool = k_buffer.dtype == torch.float8_e4m3fn
    for name, t in (("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if t.dtype != q_extend.dtype and not (fp8_pool and t.dtype == torch.float8_e4m3fn):
            raise NotImplementedError(f"{name} dtype {t.dtype} is neither q_extend's {q_extend.dtype} nor "
                                      "float8_e4m3fn (with k_buffer float8_e4m3fn too)")
    if custom_mask is not None:
        if custom_mask.dtype not in _MASK_DTYPES:
            raise TypeError(f"custom_mask must be uint8, int8 or bool, got {custom_mask.dtype}")
        if mask_indptr is None:
            raise ValueError("mask_indptr is required with a custom_mask")
    if skip_prefix and skip_extend:
        raise ValueError("skip_prefix and skip_extend together leave nothing to attend to")
    if fp8_pool:   # the scales go to tree_verify as given (floats or device tensors: never read on the host)
        ks_arg, vs_arg, vfac = _fp8_scales(k_scale, v_scale, k_buffer, v_buffer)
        k_scale_f, v_scale_f = 1.0, vfac
    else:
        k_scale_f, v_scale_f = _as_scale("k_scale", k_scale, dev), _as_scale("v_scale", v_scale, dev)
    if not skip_prefix and not k_scale_f > 0:
        raise NotImplementedError(f"k_scale={k_scale_f}: only positive k_scale is supported")
    sm = float(sm_scale) if sm_scale else 1.0 / math.sqrt(q_extend.shape[-1])

    total_q, hq, _ = q_extend.shape
    bsz = qo_indptr.numel() - 1
    if total_q == 0 or bsz < 1:
        return o_extend
    tlen = (qo_indptr[1:] - qo_indptr[:-1]).to(torch.int64)                          # [B] T_b
    plen = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int64)                          # [B] L_b
    if identity_kv_indices:  # SGLang then addresses slot kv_indptr[b] + t directly
        kv_indices = _identity_indices(k_buffer.shape[0], dev)
    req, node = _row_info(qo_indptr, total_q)
    words = max(1, -(-int(max_len_extend) // 32))
    if custom_mask is not None and not skip_prefix_custom_mask and not skip_prefix:
        _check_prefix_mask(custom_mask, mask_indptr, plen, tlen)

    # the tree mask first: its checks raise before any kernel runs
    vis = None if skip_extend else _tree_visibility(custom_mask, mask_indptr, bool(is_causal), req, node, plen,
                                                    tlen, 32 * words)
    parts = []   # (out [total_q, Hq, Dv] in q dtype, lse float32 [total_q, Hq], value scale)
    if not skip_prefix and k_buffer.shape[0] > 0:
        # A: prefix-only over the caller's own buffers (indices int32 or int64, no copy)
        fp8_kw = dict(k_scale=ks_arg, v_scale=vs_arg) if fp8_pool else {}
        out_a, lse_a = tree_verify(q_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
                                   plen.to(torch.int32), None, sm_scale=sm * k_scale_f,
                                   backend=_prefix_backend(backend, fp8_pool), config=config, return_lse=True,
                                   max_kv_len=max_kv_len, **fp8_kw)
        parts.append((out_a, lse_a, v_scale_f))
    if not skip_extend:
        # B: the tree over the extend rows themselves
        kx, vx = _pool_view(k_extend, v_extend)
        idx_b = torch.arange(kx.shape[0], device=dev, dtype=torch.int32)
        out_b, lse_b = tree_verify(q_extend, kx, vx, qo_indptr, qo_indptr, idx_b, tlen.to(torch.int32),
                                   _pack_bits(vis), sm_scale=sm, backend=backend, config=config, return_lse=True,
                                   max_kv_len=max(1, int(max_len_extend)))
        parts.append((out_b, lse_b, 1.0))

    out, lse = _merge(parts, total_q, hq, o_extend.shape[-1], dev)
    o_extend.copy_(out.to(o_extend.dtype))
    if lse_extend is not None:
        lse_extend.copy_(lse.to(lse_extend.dtype))
    return o_extend


_warned_prefix: set[str] = set()


def _prefix_backend(backend: str, fp8: bool = False) -> str:
    """`backend` if it runs prefix-only calls, else "auto" (logged once per backend name)."""
    if backend == "auto":
        return backend
    from verify_attn.backends import get_backend
    b = get_backend(backend)
    if b.prefix_only and (not fp8 or "fp8_e4m3" in b.kv_formats):
        return backend
    if backend not in _warned_prefix:
        _warned_prefix.add(backend)
        _log.warning("verify_attn: backend %r has no prefix-only calls yet; the prefix part of tree verify "
                     "runs on backend='auto'", backend)
    return "auto"


def _fp8_scales(k_scale, v_scale, k_buffer, v_buffer):
    """(k_scale, v_scale for tree_verify, a float factor on the prefix values) for an fp8 pool.

    Floats pass as floats; tensors as 0-d float32 views on the pool's device (a [1] tensor is
    viewed, never read, so capture stays valid). An MLA pool (v_buffer aliases k_buffer) has one
    set of fp8 values: tree_verify takes k_scale for both, and a float v_scale that differs becomes
    the factor v_scale / k_scale on the prefix part's values (a tensor v_scale must be k_scale's)."""
    def arg(name, x):
        if x is None:
            return None
        if isinstance(x, torch.Tensor):
            if x.numel() != 1:
                raise ValueError(f"{name} must be a scalar, got a tensor of shape {tuple(x.shape)}")
            return x.reshape(()).to(device=k_buffer.device, dtype=torch.float32)
        return float(x)
    ks, vs = arg("k_scale", k_scale), arg("v_scale", v_scale)
    aliased = (v_buffer.untyped_storage().data_ptr() == k_buffer.untyped_storage().data_ptr()
               and v_buffer.data_ptr() == k_buffer.data_ptr())
    if not aliased or vs is None:
        return ks, vs, 1.0
    if isinstance(vs, torch.Tensor) or isinstance(ks, torch.Tensor):
        if v_scale is k_scale:
            return ks, None, 1.0
        raise NotImplementedError("v_scale as a tensor other than k_scale with an aliased (MLA) fp8 pool")
    return ks, None, vs / (ks if ks is not None else 1.0)


def _merge(parts, total_q: int, hq: int, dv: int, dev) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact softmax-state merge by LSE in fp32. A part with lse -inf for a row (an empty
    prefix) weighs exactly 0 there; its out is 0 by the prefix-only contract."""
    if not parts:
        return (torch.zeros(total_q, hq, dv, device=dev), torch.full((total_q, hq), float("-inf"), device=dev))
    if len(parts) == 1:
        out, lse, vscale = parts[0]
        return out.float() * vscale, lse.float()
    (oa, la, sa), (ob, lb, sb) = parts
    lse = torch.logaddexp(la, lb)                                                    # [total_q, Hq]
    ref = torch.where(lse == float("-inf"), torch.zeros_like(lse), lse)              # rows that see nothing
    wa, wb = torch.exp(la - ref), torch.exp(lb - ref)                                # weights, sum 1 (or 0)
    if sa != 1.0:
        wa = wa * sa
    if sb != 1.0:
        wb = wb * sb
    out = oa.float() * wa.unsqueeze(-1) + ob.float() * wb.unsqueeze(-1)
    return out, lse


def verify_only(original: Callable, *, backend: str = "auto", config=None,
                max_kv_len: Optional[int] = None) -> Callable:
    """Wrap SGLang's extend_attention_fwd: tree-verify calls (custom_mask given) run on our
    backends; all other calls, and calls with options we do not support (NotImplementedError,
    raised before o_extend is written), run `original` with the same arguments.
    max_kv_len: the server's longest context (planning hint for the prefix call)."""
    warned: set[str] = set()

    def fwd(*args, **kwargs):
        custom_mask = args[9] if len(args) > 9 else kwargs.get("custom_mask")
        if custom_mask is None:
            return original(*args, **kwargs)
        try:
            return extend_attention_fwd(*args, **kwargs, backend=backend, config=config, max_kv_len=max_kv_len)
        except NotImplementedError as e:
            if str(e) not in warned:
                warned.add(str(e))
                _log.warning("verify_attn: falling back to SGLang's extend_attention_fwd: %s", e)
            return original(*args, **kwargs)

    fwd.__wrapped__ = original
    return fwd
