"""Outside baselines that join the table when their packages are installed (optional imports).

- "sglang-extend": SGLang's Triton `extend_attention_fwd` with a custom (tree) mask,
  the kernel the seed story measured (serial over the prefix). page_size=1 only.
  The tree nodes' own K/V go in as the contiguous "extend" tensors, the prefix
  through the slot pool, as SGLang's verify step passes them. The adapter follows
  the keyword names of recent SGLang releases; it has not been run in this repo's
  CI (SGLang is not installed there), so its output is checked against the
  reference like every backend before it is timed.
- FlashInfer: its custom-mask path is the FA2 prefill wrapper; no adapter yet (noted).
"""
from __future__ import annotations

import importlib
from typing import Callable, Optional

import torch

from verify_attn.tree import to_sglang_custom_mask

_SGLANG_MODULES = (
    "sglang.srt.layers.attention.triton_ops.extend_attention",
    "sglang.kernels.ops.attention.extend_attention",
)


def _find_sglang_extend() -> Optional[Callable]:
    for mod in _SGLANG_MODULES:
        try:
            return getattr(importlib.import_module(mod), "extend_attention_fwd")
        except Exception:  # absent, or present with unmet imports: not a baseline here
            continue
    return None


def sglang_extend_prepare(fn: Callable, kw: dict) -> Callable[[torch.Tensor], None]:
    """Host-side preparation (outside timing) -> run(out) launching SGLang's kernel once."""
    if kw["page_size"] != 1:
        raise NotImplementedError("sglang-extend runs on the page_size=1 slot pool only")
    qo = kw["qo_indptr"].tolist()
    kvp = kw["kv_indptr"].tolist()
    lens = kw["kv_lens"].tolist()
    idx = kw["kv_indices"]
    prefix_idx, tree_idx, prefix_lens = [], [], []
    for b in range(len(qo) - 1):
        t = qo[b + 1] - qo[b]
        ids = idx[kvp[b]: kvp[b] + lens[b]]
        prefix_idx.append(ids[: lens[b] - t])
        tree_idx.append(ids[lens[b] - t:])
        prefix_lens.append(lens[b] - t)
    dev = kw["q"].device
    p_indices = torch.cat(prefix_idx).to(torch.int32)
    p_indptr = torch.tensor([0] + torch.tensor(prefix_lens).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    t_ids = torch.cat(tree_idx).long()
    k_ext = kw["k_cache"][t_ids].contiguous()                   # [total_q, Hkv, Dqk]
    v_ext = kw["v_cache"][t_ids].contiguous()                   # [total_q, Hkv, Dv]
    custom_mask, mask_indptr = to_sglang_custom_mask(kw["tree_mask"], kw["qo_indptr"], prefix_lens)
    custom_mask, mask_indptr = custom_mask.to(dev), mask_indptr.to(dev)
    max_t = max(qo[b + 1] - qo[b] for b in range(len(qo) - 1))

    def run(out: torch.Tensor) -> None:
        fn(kw["q"], k_ext, v_ext, out, kw["k_cache"], kw["v_cache"], kw["qo_indptr"], p_indptr, p_indices,
           custom_mask, False, mask_indptr, max_t, sm_scale=kw["sm_scale"])
    return run


def outside_baselines() -> tuple[dict[str, Callable], list[str]]:
    """({name: prepare(kw) -> run(out)}, notes about what is absent)."""
    found: dict[str, Callable] = {}
    notes: list[str] = []
    fn = _find_sglang_extend()
    if fn is not None:
        found["sglang-extend"] = lambda kw, fn=fn: sglang_extend_prepare(fn, kw)
    else:
        notes.append("SGLang not installed: its extend_attention baseline is not in the table")
    try:
        importlib.import_module("flashinfer")
        notes.append("FlashInfer found, but no tree-mask adapter is written yet: not in the table")
    except Exception:
        notes.append("FlashInfer not installed: not in the table")
    return found, notes
