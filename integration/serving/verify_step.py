"""Target verify at one launch per layer: a per-step plan shared by every layer, and a per-layer call.

SGLang hands target verify three things, and all three are the same for every layer of a forward:
  * request b's prefix: its L_b token slots, kept by SGLang in req_to_token[req_pool_indices[b], :L_b]
    (its Triton backend copies them into kv_indptr / kv_indices);
  * the draft tokens' rows, which the layer writes into the pool at out_cache_loc (T_b of them,
    rows qo_indptr[b]..qo_indptr[b+1] of q) before it attends;
  * the tree, as custom_mask / mask_indptr: per request a row-major [T_b, L_b + T_b] byte matrix.

`plan_step` turns them, once per forward, into one tree_verify problem over the pool itself:
  * one index row per request, [B, S] (S = the row capacity, in pages of `page_size` tokens): entry j
    is the slot of token j, read from the prefix source for j < L_b and from out_cache_loc for
    L_b <= j < L_b + T_b (a page entry is the page of its first token). The draft rows are a
    second index source folded into the row here, once per step, so that no layer issues a
    second call. The work is a gather of B x S entries: it does not grow with SGLang's index
    buffer (max_tokens x max_context entries under CUDA graphs), and it reads no host value;
  * kv_indptr = b x S, kv_lens = L_b + T_b (the last T_b of them are the tree's, as tree_verify
    expects);
  * the packed tree mask, [total_q, W] int32, from custom_mask (the conversion of sglang_compat).
`verify_layer` is then exactly one tree_verify call on the layer's pool: one kernel launch and,
when its split count is above one, the kernel's own combine. Nothing else runs per layer.

What differs from SGLang's Triton kernel: it attends to the draft tokens through k_extend /
v_extend (the layer's k, v as computed), we through the pool rows they were written to. In a
16-bit pool the two are the same values; in an fp8 pool ours are the quantized rows (what
SGLang's FlashInfer and FA3 backends also read) scaled by k_scale / v_scale like the prefix.

CUDA graphs: pass `buffers` (a `StepBuffers` allocated before capture for the largest batch);
the plan then writes into them and every layer's captured launch reads the same addresses.
Shapes come from the tensors' sizes and the ints given, never from device values. In full
validation mode (not under capture) `plan_step` also checks on the host, before any gather, that
every prefix fits max_kv_len and the prefix source, that out_cache_loc has one slot per draft
token, and that the draft rows continue their request's pages (page_size > 1). What the caller
guarantees without those checks (serving runs "shapes"): every prefix <= max_kv_len (SGLang's
context length bounds it); a longer one would be cut at its row, never read past it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from verify_attn.api import _capturing, tree_verify
import verify_attn.api as _api

from .sglang_compat import _MASK_DTYPES, _fp8_scales, _pack_bits, _row_info, _tree_visibility


@dataclass
class StepBuffers:
    """Fixed device buffers for a captured plan: sized once for the largest batch, rows and tree."""
    qo_indptr: torch.Tensor    # int32 [max_bs + 1]
    kv_indices: torch.Tensor   # int32 [max_bs * row_pages]
    kv_indptr: torch.Tensor    # int32 [max_bs + 1]
    kv_lens: torch.Tensor      # int32 [max_bs]
    tree_mask: torch.Tensor    # int32 [max_tokens, words]
    row_pages: int
    page_size: int

    @classmethod
    def allocate(cls, *, max_bs: int, max_tokens: int, max_kv_len: int, max_tree: int, page_size: int = 1,
                 device="cpu") -> "StepBuffers":
        for name, v in (("max_bs", max_bs), ("max_tokens", max_tokens), ("max_kv_len", max_kv_len),
                        ("max_tree", max_tree), ("page_size", page_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        pages = -(-(max_kv_len + max_tree) // page_size)
        words = -(-max_tree // 32)
        return cls(qo_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=device),
                   kv_indices=torch.zeros(max_bs * pages, dtype=torch.int32, device=device),
                   kv_indptr=torch.arange(max_bs + 1, dtype=torch.int32, device=device) * pages,
                   kv_lens=torch.zeros(max_bs, dtype=torch.int32, device=device),
                   tree_mask=torch.zeros(max_tokens, words, dtype=torch.int32, device=device),
                   row_pages=pages, page_size=page_size)


@dataclass
class VerifyStep:
    """One forward's tree_verify problem, shared by every layer (see the module docstring)."""
    qo_indptr: torch.Tensor    # [B+1]: as SGLang gave it, or its copy in the StepBuffers
    kv_indptr: torch.Tensor    # int32 [B+1] = b x row_pages
    kv_indices: torch.Tensor   # int32 [B x row_pages]: slots (page_size 1) or pages
    kv_lens: torch.Tensor      # int32 [B] = L_b + T_b
    tree_mask: torch.Tensor    # int32 [total_q, W]
    page_size: int
    max_kv_len: int            # tokens per request the launch plans its splits for

    def pool_view(self, buffer: torch.Tensor) -> torch.Tensor:
        """A [num_slots, H, D] pool as tree_verify's layout: itself, or [num_slots / P, P, H, D] (a view)."""
        if self.page_size == 1:
            return buffer
        n = buffer.shape[0]
        if n % self.page_size:
            raise ValueError(f"the KV pool has {n} slots, not a multiple of page_size={self.page_size}")
        st = buffer.stride()   # as_strided, not view: a view may restride size-1 dims, and an aliased MLA V
        return buffer.as_strided((n // self.page_size, self.page_size, *buffer.shape[1:]),   # must keep K's strides
                                 (st[0] * self.page_size, *st), buffer.storage_offset())


def _ints(name: str, t) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64) or t.dim() != 1:
        got = f"{t.dtype} of rank {t.dim()}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"{name} must be a 1-d int32 or int64 tensor, got {got}")


def plan_step(*, qo_indptr: torch.Tensor, prefix_lens: torch.Tensor, prefix_slots: torch.Tensor,
              prefix_base: torch.Tensor, out_cache_loc: torch.Tensor, custom_mask: Optional[torch.Tensor],
              mask_indptr: Optional[torch.Tensor], max_tree: int, max_kv_len: int, page_size: int = 1,
              is_causal: bool = True, buffers: Optional[StepBuffers] = None,
              plan_kv_len: Optional[int] = None) -> VerifyStep:
    """The per-step plan. Request b's prefix slot j is prefix_slots[prefix_base[b] + j], j < prefix_lens[b]:
      * from SGLang's req_to_token: prefix_slots = req_to_token.view(-1),
        prefix_base = req_pool_indices * req_to_token.stride(0), prefix_lens = seq_lens (`from_req_to_token`);
      * from its Triton backend's kv_indptr / kv_indices: prefix_slots = kv_indices,
        prefix_base = kv_indptr[:-1], prefix_lens = kv_indptr[1:] - kv_indptr[:-1].
    Draft token t of request b sits at slot out_cache_loc[qo_indptr[b] + t]. max_tree: the most draft
    tokens a request has (SGLang's draft_token_num); max_kv_len: the longest prefix this plan may see
    (the row capacity); plan_kv_len: the launch's planning hint if the real longest is known on the
    host (eager SGLang has seq_lens_cpu), else max_kv_len + max_tree."""
    for name, t in (("qo_indptr", qo_indptr), ("prefix_lens", prefix_lens), ("prefix_slots", prefix_slots),
                    ("prefix_base", prefix_base), ("out_cache_loc", out_cache_loc)):
        _ints(name, t)
    bsz = qo_indptr.numel() - 1
    if bsz < 1:
        raise ValueError(f"qo_indptr must have B+1 >= 2 entries, got {qo_indptr.numel()}")
    for name, t in (("prefix_lens", prefix_lens), ("prefix_base", prefix_base)):
        if t.numel() != bsz:
            raise ValueError(f"{name} must have B={bsz} entries (qo_indptr has B+1), got {t.numel()}")
    for name, v in (("max_tree", max_tree), ("max_kv_len", max_kv_len), ("page_size", page_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if custom_mask is not None:
        if custom_mask.dtype not in _MASK_DTYPES:
            raise TypeError(f"custom_mask must be uint8, int8 or bool, got {custom_mask.dtype}")
        if mask_indptr is None:
            raise ValueError("mask_indptr is required with a custom_mask")
    total_q = out_cache_loc.numel()
    dev = qo_indptr.device
    pages = -(-(max_kv_len + max_tree) // page_size)
    words = -(-max_tree // 32)
    if buffers is not None:
        if buffers.page_size != page_size or buffers.row_pages < pages:
            raise ValueError(f"buffers hold rows of {buffers.row_pages} pages of {buffers.page_size} tokens; this "
                             f"step needs {pages} pages of {page_size} (max_kv_len {max_kv_len} + max_tree {max_tree})")
        if buffers.kv_lens.numel() < bsz or buffers.tree_mask.shape[0] < total_q or buffers.tree_mask.shape[1] < words:
            raise ValueError(f"buffers hold {buffers.kv_lens.numel()} requests x {buffers.tree_mask.shape[0]} tokens "
                             f"x {32 * buffers.tree_mask.shape[1]} tree nodes; this step has {bsz} x {total_q} x "
                             f"{max_tree}")
        pages, words = buffers.row_pages, buffers.tree_mask.shape[1]   # the captured shapes

    qo = qo_indptr.to(torch.int64)
    tlen = qo[1:] - qo[:-1]                                                          # [B] T_b
    plen = prefix_lens.to(torch.int64)                                               # [B] L_b
    if _api._VALIDATION == "full" and not _capturing(dev):   # host reads, before any gather
        _check_plan(prefix_slots, prefix_base, out_cache_loc, qo, plen, tlen, page_size, max_kv_len, max_tree)
    # token of entry j: j x P; its slot from the prefix or the draft rows, its page = slot // P
    tok = (torch.arange(pages, device=dev, dtype=torch.int64) * page_size).unsqueeze(0)   # [1, pages]
    lb, tb = plen.unsqueeze(1), tlen.unsqueeze(1)
    in_prefix = tok < lb
    in_tree = (~in_prefix) & (tok < lb + tb)
    src_p = torch.where(in_prefix, prefix_base.to(torch.int64).unsqueeze(1) + tok, 0)
    src_t = torch.where(in_tree, qo[:-1].unsqueeze(1) + tok - lb, 0)
    from_prefix = prefix_slots[src_p] if prefix_slots.numel() else torch.zeros_like(src_p)
    slot = torch.where(in_prefix, from_prefix.to(torch.int64), out_cache_loc[src_t].to(torch.int64))
    entry = torch.where(in_prefix | in_tree, slot // page_size, 0).to(torch.int32)   # [B, pages]
    # a request longer than its row (the caller's max_kv_len guarantee broken; full validation says so) is cut
    # at the row, never read past it into the next request's row or past the index buffer
    kv_lens = torch.clamp(plen + tlen, max=pages * page_size).to(torch.int32)
    req, node = _row_info(qo_indptr, total_q)
    vis = _tree_visibility(custom_mask, mask_indptr, bool(is_causal), req, node, plen, tlen, 32 * words)
    packed = _pack_bits(vis)                                                         # [total_q, W]

    if buffers is None:
        kv_indices = entry.reshape(-1)
        kv_indptr = torch.arange(bsz + 1, device=dev, dtype=torch.int32) * pages
        tree_mask = packed
    else:
        kv_indices = buffers.kv_indices[: bsz * pages]
        kv_indices.copy_(entry.reshape(-1))
        kv_indptr = buffers.kv_indptr[: bsz + 1]
        buffers.kv_lens[:bsz].copy_(kv_lens)
        kv_lens = buffers.kv_lens[:bsz]
        tree_mask = buffers.tree_mask[:total_q]
        tree_mask.copy_(packed)
        buffers.qo_indptr[: bsz + 1].copy_(qo_indptr)
        qo_indptr = buffers.qo_indptr[: bsz + 1]
    hint = plan_kv_len if plan_kv_len is not None else max_kv_len + max_tree
    return VerifyStep(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_lens=kv_lens,
                      tree_mask=tree_mask, page_size=page_size, max_kv_len=max(1, int(hint)))


def _check_plan(prefix_slots, prefix_base, out_cache_loc, qo, plen, tlen, page_size, max_kv_len, max_tree):
    """Host reads (full validation, off capture): lengths within the capacity, every read in range, every
    token's slot where the plan's pages put it."""
    if int(plen.max()) > max_kv_len or int(plen.min()) < 0:
        raise ValueError(f"a prefix length is outside [0, max_kv_len={max_kv_len}]: {plen.tolist()}")
    if int(tlen.max()) > max_tree or int(tlen.min()) < 1:
        raise ValueError(f"every request needs 1..max_tree={max_tree} draft tokens, got {tlen.tolist()}")
    if int(qo[0]) != 0 or int(qo[-1]) != out_cache_loc.numel():
        raise ValueError(f"out_cache_loc must have one slot per draft token (qo_indptr[-1]={int(qo[-1])}, from 0), "
                         f"got {out_cache_loc.numel()}")
    base_all = prefix_base.to(torch.int64)
    if bool(((plen > 0) & ((base_all < 0) | (base_all + plen > prefix_slots.numel()))).any()):
        raise ValueError(f"a request's prefix runs outside the prefix slots ({prefix_slots.numel()} entries): "
                         f"bases {base_all.tolist()}, lengths {plen.tolist()}")
    if page_size == 1:
        return
    for b in range(plen.numel()):
        lb, tb = int(plen[b]), int(tlen[b])
        base = int(base_all[b])
        slots = torch.cat([prefix_slots[base: base + lb].to(torch.int64),
                           out_cache_loc[int(qo[b]): int(qo[b]) + tb].to(torch.int64)])
        pos = torch.arange(slots.numel(), dtype=torch.int64, device=slots.device)
        first = slots[(pos // page_size) * page_size]
        want = (first // page_size) * page_size + pos % page_size
        if not torch.equal(slots, want):
            j = int(torch.nonzero(slots != want)[0])
            where = "prefix slot" if j < lb else "out_cache_loc entry"
            raise ValueError(f"request {b}: token {j} ({where}) is at slot {int(slots[j])}, not at offset {j % page_size} "
                             f"of its page {int(first[j]) // page_size}: with page_size={page_size} a request's "
                             "tokens (prefix, then draft rows) must fill its pages in order")


def from_req_to_token(*, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                      out_cache_loc: torch.Tensor, qo_indptr: torch.Tensor, custom_mask, mask_indptr,
                      max_tree: int, max_kv_len: Optional[int] = None, page_size: int = 1,
                      buffers: Optional[StepBuffers] = None, plan_kv_len: Optional[int] = None) -> VerifyStep:
    """plan_step from SGLang's own per-request slot table (what ForwardBatch holds in target verify:
    seq_lens = the committed prefix lengths L_b). max_kv_len defaults to the table's width."""
    if not isinstance(req_to_token, torch.Tensor) or req_to_token.dim() != 2 or not req_to_token.is_contiguous():
        raise ValueError("req_to_token must be a contiguous 2-d [pool_size, max_context_len] int tensor")
    return plan_step(qo_indptr=qo_indptr, prefix_lens=seq_lens, prefix_slots=req_to_token.view(-1),
                     prefix_base=req_pool_indices.to(torch.int64) * req_to_token.stride(0),
                     out_cache_loc=out_cache_loc, custom_mask=custom_mask, mask_indptr=mask_indptr,
                     max_tree=max_tree, max_kv_len=max_kv_len or req_to_token.shape[1], page_size=page_size,
                     buffers=buffers, plan_kv_len=plan_kv_len)


def verify_layer(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, step: VerifyStep, *,
                 sm_scale: float, out: Optional[torch.Tensor] = None, k_scale=None, v_scale=None,
                 backend: str = "auto", config=None, return_lse: bool = False):
    """One layer of target verify: one tree_verify launch on the pool (q [total_q, Hq, Dqk], pools
    [num_slots, Hkv, D] with the draft rows already written at out_cache_loc). k_scale / v_scale:
    an fp8 pool's dequantization scales (floats, or 1-element device tensors, never read on the host);
    a 16-bit pool takes none (1.0)."""
    fp8 = k_buffer.dtype == torch.float8_e4m3fn
    kw = {}
    if fp8:
        ks, vs, vfac = _fp8_scales(k_scale, v_scale, k_buffer, v_buffer)
        if vfac != 1.0:
            raise NotImplementedError(f"v_scale {v_scale} differs from k_scale {k_scale} on an aliased (MLA) fp8 "
                                      "pool: one launch reads one scale for the shared rows")
        kw = dict(k_scale=ks, v_scale=vs)
    else:
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if s is not None and not (isinstance(s, (int, float)) and float(s) == 1.0):
                raise NotImplementedError(f"{name}={s} on a {k_buffer.dtype} pool: one launch reads the draft rows "
                                          "from the pool too, so only a scale of 1.0 means what SGLang's kernel means")
    return tree_verify(q, step.pool_view(k_buffer), step.pool_view(v_buffer), step.qo_indptr, step.kv_indptr,
                       step.kv_indices, step.kv_lens, step.tree_mask, sm_scale=sm_scale, page_size=step.page_size,
                       backend=backend, config=config, out=out, return_lse=return_lse, max_kv_len=step.max_kv_len,
                       **kw)


def glue_estimate(*, step_ops: int, step_bytes: float, layers: int, launch_us: float, dram_gbps: float,
                  kernel_us: float, layer_ops: int = 1) -> dict:
    """The serving path's glue per layer, as an estimate (no GPU here): the step plan's ops (one launch
    gap each, or their bytes at DRAM bandwidth if that is longer) shared by `layers` layers, plus any
    per-layer op beyond the attention launch, against the kernel's time per layer."""
    step_us = max(step_ops * launch_us, step_bytes / (dram_gbps * 1e3))
    per_layer = step_us / max(1, layers) + max(0, layer_ops - 1) * launch_us
    return {"glue_us_per_layer": per_layer, "step_us": step_us, "kernel_us": kernel_us,
            "share": per_layer / kernel_us, "step_ops": step_ops, "step_bytes": step_bytes, "layers": layers,
            "launch_us": launch_us, "layer_ops": layer_ops,
            "label": "estimate (op counts x the model's launch gap, bytes / DRAM bandwidth; not measured)"}


__all__ = ["StepBuffers", "VerifyStep", "plan_step", "from_req_to_token", "verify_layer", "glue_estimate"]
