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
  * sm_scale None or 0 means 1/sqrt(q_extend.shape[-1]).
  * lse_extend (optional, float32 [total_q, Hq]) receives the natural-log LSE;
    skip_prefix / skip_extend drop one of the two parts (as SGLang's DCP path uses).

How it is computed (no copy of k_buffer, ever): attention over (prefix + tree) is
split into two tree_verify calls whose softmax states merge exactly by LSE:
  A. the prefix, over the caller's k_buffer/v_buffer with sm_scale*k_scale. Our
     contract treats the last T_b KV entries of a request as the tree block and
     every node must see its own entry, so: if L_b >= T_b the tree block is the
     last T_b prefix rows with an all-ones mask; if 0 < L_b < T_b the sequence is
     padded to T_b entries with copies of prefix row 0, and a node n >= L_b sees
     its own (duplicate) entry n in place of entry 0, so each prefix row counts
     exactly once; if L_b = 0 slot 0 is read for form's sake and the part is
     dropped by a where() on L_b (never multiplied, so a NaN slot cannot leak).
  B. the tree, over a pool made of k_extend/v_extend themselves (T rows per
     request, no copy unless v_extend aliases k_extend at an offset, which our
     contract rejects; then only the small extend rows are cloned), with the
     packed tree mask taken from custom_mask.
The merge is done in fp32; for 16-bit inputs the two partial outputs are
rounded to the input dtype before it (one extra rounding; within bf16 tolerance).
Index/mask preparation is device-side torch ops with static shapes. When not under
CUDA-graph capture the host reads kv_indptr[-1] and one bool (any L_b < T_b) and
skips the index rebuild in the common case (prefix longer than the tree): call A
then uses the caller's kv_indptr and the used part of kv_indices as they are
(converted to int32 if int64: 12 bytes per token against 1152 bytes of MLA KV).
Under capture nothing is read on the host, so the padded index array is always
rebuilt over the whole kv_indices buffer (static size). CAVEAT: SGLang's graph
buffer is max_num_tokens * max_context_len int64 entries, so inside SGLang's CUDA
graphs this rebuild costs O(that buffer) per layer; the fix belongs in the kernel
contract (int64 kv_indices and a prefix-only call with no tree block), which
is proposed for verify_attn.api and not there yet. Eager use has no such cost.

Unsupported options raise NotImplementedError naming the option: logit_cap != 0,
sliding_window_size > 0, window_kv_offsets, sinks, xai_temperature_len > 0,
score_mod/aux_tensors, page_size != 1, KV buffers whose dtype differs from q
(fp8 caches: our backends take one dtype), k_scale <= 0,
skip_prefix_custom_mask=False with a prefix mask that hides anything, is_causal
with a custom mask that has bits above the diagonal (SGLang's result then depends
on its BLOCK_M tile). Rows are checked to see their own node by tree_verify.

Patching SGLang (checked against sglang 0.5.23, whose TritonAttnBackend.__init__
imports extend_attention_fwd from this module at construction time): before the
model runner builds its attention backend, run

    import sglang.kernels.ops.attention.extend_attention as E; from integration.sglang_compat import verify_only
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
from typing import Callable

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


def _prefix_call_args(kv_indptr, kv_indices, plen, tlen, req, node, words: int, dev):
    """Index tensors and packed all-prefix mask for call A (see the module docstring)."""
    n_seq = torch.maximum(plen, tlen)                                             # [B] entries per request
    kv_lens_a = n_seq.to(torch.int32)
    capturing = _capturing(dev)
    if not capturing:   # SGLang over-allocates kv_indices: touch only the used part
        kv_indices = kv_indices[: int(kv_indptr[-1])]
    if capturing or bool((plen < tlen).any()):
        ind_a = torch.zeros(plen.numel() + 1, dtype=torch.int64, device=dev)
        ind_a[1:] = torch.cumsum(n_seq, 0)
        # static bound under capture (sum max(L,T) <= sum L + sum T); exact size otherwise
        cap = kv_indices.numel() + req.numel() if capturing else int(ind_a[-1])
        pos = torch.arange(cap, device=dev, dtype=torch.int64)
        b = torch.searchsorted(ind_a[1:], pos, right=True).clamp_(max=plen.numel() - 1)
        k = pos - ind_a[b]
        src = kv_indptr.to(torch.int64)[b] + torch.where(k < plen[b], k, torch.zeros_like(k))
        src = src.clamp_(0, max(kv_indices.numel() - 1, 0))
        slots = kv_indices[src].to(torch.int64) if kv_indices.numel() else torch.zeros_like(src)
        slots = torch.where(plen[b] > 0, slots, torch.zeros_like(slots))           # L_b = 0: any valid slot
        kv_indptr_a, kv_indices_a = ind_a.to(torch.int32), slots.to(torch.int32)
    else:   # every L_b >= T_b: the caller's indices as they are (int32 view or an int64->int32 copy)
        kv_indptr_a, kv_indices_a = kv_indptr.to(torch.int32), kv_indices.to(torch.int32)
    j = torch.arange(32 * words, device=dev, dtype=torch.int64).unsqueeze(0)
    l_r, t_r, n_r = plen[req].unsqueeze(1), tlen[req].unsqueeze(1), node.unsqueeze(1)
    # entries j < L_b are prefix rows; entries L_b <= j < T_b duplicate prefix row 0
    vis = (j < t_r) & ((l_r >= t_r) | ((j < l_r) & ~((j == 0) & (n_r >= l_r))) | (j == n_r))
    return kv_indptr_a, kv_indices_a, kv_lens_a, _pack_bits(vis)


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
    *, backend: str = "auto", config=None,
):
    """SGLang's extend_attention_fwd signature; writes o_extend [total_q, Hq, Dv] (and lse_extend).

    q_extend [total_q, Hq, Dqk]; k_extend [total_q, Hkv, Dqk]; v_extend [total_q, Hkv, Dv];
    k_buffer [num_slots, Hkv, Dqk]; v_buffer [num_slots, Hkv, Dv] (may be k_buffer[..., :Dv]).
    extend_seq_lens_cpu is a launch-grid hint in SGLang and is ignored here.
    """
    _reject_unsupported(logit_cap=logit_cap, sliding_window_size=sliding_window_size, sinks=sinks,
                        window_kv_offsets=window_kv_offsets, xai_temperature_len=xai_temperature_len,
                        page_size=page_size, score_mod=score_mod, aux_tensors=aux_tensors)
    dev = q_extend.device
    for name, t in (("k_extend", k_extend), ("v_extend", v_extend), ("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if t.dtype != q_extend.dtype:
            raise NotImplementedError(f"{name} dtype {t.dtype} differs from q_extend's {q_extend.dtype}: "
                                      "mixed-dtype (e.g. fp8) KV is not supported")
    if custom_mask is not None:
        if custom_mask.dtype not in _MASK_DTYPES:
            raise TypeError(f"custom_mask must be uint8, int8 or bool, got {custom_mask.dtype}")
        if mask_indptr is None:
            raise ValueError("mask_indptr is required with a custom_mask")
    if skip_prefix and skip_extend:
        raise ValueError("skip_prefix and skip_extend together leave nothing to attend to")
    k_scale_f, v_scale_f = _as_scale("k_scale", k_scale, dev), _as_scale("v_scale", v_scale, dev)
    if not skip_prefix and not k_scale_f > 0:
        raise NotImplementedError(f"k_scale={k_scale_f}: only positive k_scale is supported")
    sm = float(sm_scale) if sm_scale else 1.0 / math.sqrt(q_extend.shape[-1])

    total_q, hq, _ = q_extend.shape
    bsz = qo_indptr.numel() - 1
    if total_q == 0 or bsz < 1:
        return o_extend
    qo32 = qo_indptr.to(torch.int32)
    tlen = (qo_indptr[1:] - qo_indptr[:-1]).to(torch.int64)                          # [B] T_b
    plen = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int64)                          # [B] L_b
    if identity_kv_indices:  # SGLang then addresses slot kv_indptr[b] + t directly
        kv_indices = torch.arange(k_buffer.shape[0], device=dev, dtype=torch.int32)
    req, node = _row_info(qo_indptr, total_q)
    words = max(1, -(-int(max_len_extend) // 32))
    if custom_mask is not None and not skip_prefix_custom_mask and not skip_prefix:
        _check_prefix_mask(custom_mask, mask_indptr, plen, tlen)

    # the tree mask first: its checks raise before any kernel runs
    vis = None if skip_extend else _tree_visibility(custom_mask, mask_indptr, bool(is_causal), req, node, plen,
                                                    tlen, 32 * words)
    parts = []   # (out [total_q, Hq, Dv] in q dtype, lse float32 [total_q, Hq], value scale, row mask or None)
    if not skip_prefix and k_buffer.shape[0] > 0:
        ind_a, idx_a, lens_a, mask_a = _prefix_call_args(kv_indptr, kv_indices, plen, tlen, req, node, words, dev)
        out_a, lse_a = tree_verify(q_extend, k_buffer, v_buffer, qo32, ind_a, idx_a, lens_a, mask_a,
                                   sm_scale=sm * k_scale_f, backend=backend, config=config, return_lse=True)
        parts.append((out_a, lse_a, v_scale_f, (plen > 0)[req]))
    if not skip_extend:
        kx, vx = _pool_view(k_extend, v_extend)
        lens_b = tlen.to(torch.int32)
        idx_b = torch.arange(kx.shape[0], device=dev, dtype=torch.int32)
        out_b, lse_b = tree_verify(q_extend, kx, vx, qo32, qo32, idx_b, lens_b, _pack_bits(vis),
                                   sm_scale=sm, backend=backend, config=config, return_lse=True)
        parts.append((out_b, lse_b, 1.0, None))

    out, lse = _merge(parts, total_q, hq, o_extend.shape[-1], dev)
    o_extend.copy_(out.to(o_extend.dtype))
    if lse_extend is not None:
        lse_extend.copy_(lse.to(lse_extend.dtype))
    return o_extend


def _merge(parts, total_q: int, hq: int, dv: int, dev) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact softmax-state merge by LSE in fp32; a part whose row mask is False contributes nothing."""
    lses, outs = [], []
    for out, lse, vscale, rows in parts:
        lse = lse.float()
        o = out.float() * vscale
        if rows is not None:   # where(), not a multiply: a dropped part may hold NaN
            lse = torch.where(rows.unsqueeze(1), lse, torch.full_like(lse, float("-inf")))
            o = torch.where(rows.view(-1, 1, 1), o, torch.zeros_like(o))
        lses.append(lse)
        outs.append(o)
    if not lses:
        return (torch.zeros(total_q, hq, dv, device=dev), torch.full((total_q, hq), float("-inf"), device=dev))
    stack = torch.stack(lses)                                                        # [P, total_q, Hq]
    m = stack.amax(0)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))                 # rows that see nothing
    w = torch.exp(stack - m_safe)                                                    # [P, total_q, Hq]
    den = w.sum(0)
    num = sum(wi.unsqueeze(-1) * oi for wi, oi in zip(w, outs))
    out = num / torch.where(den > 0, den, torch.ones_like(den)).unsqueeze(-1)
    lse = torch.where(den > 0, m_safe + torch.log(den), torch.full_like(den, float("-inf")))
    return out, lse


def verify_only(original: Callable, *, backend: str = "auto", config=None) -> Callable:
    """Wrap SGLang's extend_attention_fwd: tree-verify calls (custom_mask given) run on our
    backends; all other calls, and calls with options we do not support (NotImplementedError,
    raised before o_extend is written), run `original` with the same arguments."""
    warned: set[str] = set()

    def fwd(*args, **kwargs):
        custom_mask = args[9] if len(args) > 9 else kwargs.get("custom_mask")
        if custom_mask is None:
            return original(*args, **kwargs)
        try:
            return extend_attention_fwd(*args, **kwargs, backend=backend, config=config)
        except NotImplementedError as e:
            if str(e) not in warned:
                warned.add(str(e))
                _log.warning("verify_attn: falling back to SGLang's extend_attention_fwd: %s", e)
            return original(*args, **kwargs)

    fwd.__wrapped__ = original
    return fwd
