"""DFlash block drafter (arXiv:2602.06036): Qwen3-style layers over preallocated caches.

One non-causal forward drafts a block: the inputs are the target's embeddings of
[last committed token, MASK x (B-1)] at positions n .. n+B-1. The target states of the
chosen layers for every committed token are concatenated, projected (fc) and
RMS-normalised into context features; every draft layer turns them into extra K/V
context. Logits go through the target's (vocab-parallel) LM head.

Cost, as in a serving engine:
- every attention is one `verify_attn.tree_verify` call: the block is a small tree whose
  nodes all see each other, over the context rows (GQA K/V read natively, in the model's
  dtype, never expanded per query head);
- the full-attention layer's context K/V live in a cache preallocated for `capacity`
  tokens; sliding layers keep a ring of window + B rows, so they touch O(window) per step;
- the block's own K/V are written after the context and dropped by overwriting them (the
  cache length is trimmed back in place); nothing is concatenated per step;
- `draft` returns log-probs on the device; top-k runs there (ddtree.py) before any host copy.

Synthetic weights: integration/loop/drafter_weights.py (a copy circuit over the injected states).
Planted bugs (`DrafterBugs`, for the probe's tests): a window on the full layer, a block
that is not trimmed after the step, stale hidden states for non-final prefill chunks.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from verify_attn import tree as vtree
from verify_attn import tree_verify

from . import drafter_weights as dw
from .config import DrafterConfig
from .model import MLATarget, rms_norm
from .rope import Rotary, plain_inv_freq


@dataclass(frozen=True)
class DrafterBugs:
    """Deliberate drafter bugs (real code paths, off by default) that the probe must catch."""

    window: Optional[int] = None          # the full-attention layer reads only the last N context rows
    untrimmed: bool = False               # the block's rows are not trimmed after a step: the cache length
                                          # (which places the next block) runs ahead of the committed length
    stale_prefill_hidden: bool = False    # non-final prefill chunks inject a stale hidden-state buffer
                                          # (captured only for the prompt's last chunk; zeros before that)

    @staticmethod
    def parse(spec: str) -> "DrafterBugs":
        """'window:1024' | 'untrimmed' | 'stale-hidden' (comma-separated) -> DrafterBugs."""
        kw: dict = {}
        for part in [p.strip() for p in spec.split(",") if p.strip()]:
            if part.startswith("window:"):
                try:
                    kw["window"] = int(part.split(":", 1)[1])
                except ValueError:
                    raise ValueError(f"window bug needs a row count, e.g. window:1024, got {part!r}") from None
                if kw["window"] < 1:
                    raise ValueError("window bug needs a row count >= 1")
            elif part == "untrimmed":
                kw["untrimmed"] = True
            elif part == "stale-hidden":
                kw["stale_prefill_hidden"] = True
            else:
                raise ValueError(f"unknown drafter bug {part!r}; known: window:N, untrimmed, stale-hidden")
        return DrafterBugs(**kw)


class DFlashDrafter:
    def __init__(self, target: MLATarget, cfg: Optional[DrafterConfig] = None, *, capacity: int = 4096,
                 backend: Optional[str] = None, bugs: DrafterBugs = DrafterBugs()) -> None:
        self.t = target
        self.cfg = cfg = cfg or target.cfg.drafter
        self.block = cfg.block
        self.bugs = bugs
        self.backend = backend or ("auto" if target.device.type == "cuda" else "reference")
        self.w = dw.build(target, cfg)
        self.layers = self.w.layers
        self.code_dim = self.w.layout.code_dim
        self.rotary = Rotary(*plain_inv_freq(cfg.head_dim, cfg.rope_theta), target.device)
        self.capacity = capacity
        dev, dt = target.device, target.dtype
        hk, hd, b = cfg.num_kv_heads, cfg.head_dim, cfg.block
        # preallocated caches, indexed by position (full layers) or position % ring (sliding layers)
        self.ring = cfg.window + b
        self.k = [torch.zeros(self._rows(lw), hk, hd, dtype=dt, device=dev) for lw in self.layers]
        self.v = [torch.zeros(self._rows(lw), hk, hd, dtype=dt, device=dev) for lw in self.layers]
        self.codes = torch.zeros(capacity + b, self.code_dim, dtype=dt, device=dev)   # probe codes per position
        self._stale = None                                        # stale_prefill_hidden: the capture buffer
        self._ar = torch.arange(capacity + b, dtype=torch.int32, device=dev)           # kv_indices views
        self._mask = vtree.pack_mask(torch.ones(b, b, dtype=torch.bool)).to(dev)         # [B, 1] all visible
        self._qo = torch.tensor([0, b], dtype=torch.int32, device=dev)
        self.reset()

    def _rows(self, lw: dw.DraftLayer) -> int:
        return self.capacity + self.block if lw.window is None else self.ring

    @property
    def target_layers(self) -> tuple[int, ...]:
        return tuple(self.cfg.target_layers)

    def reset(self) -> None:
        self.n_ctx = 0          # committed context tokens (the logical length)
        self.length = 0         # positions written; the next block starts here (== n_ctx unless untrimmed)

    # -- context --------------------------------------------------------------------------------
    def features(self, hid: torch.Tensor) -> torch.Tensor:
        """target states [m, nsel, d] -> context features [m, d]."""
        return rms_norm(hid.reshape(hid.shape[0], -1).to(self.t.dtype) @ self.w.fc.T, self.w.hidden_norm)

    def commit(self, hid: torch.Tensor, start_pos: int, last_chunk: bool = True) -> None:
        """Append committed tokens' target states [m, nsel, d] at positions start_pos.. .
        last_chunk: False for a prefill chunk that is not the prompt's last (see DrafterBugs)."""
        if start_pos != self.n_ctx:
            raise AssertionError(f"drafter context out of sync: has {self.n_ctx} tokens, commit starts at {start_pos}")
        m = hid.shape[0]
        if start_pos + m > self.capacity:
            raise RuntimeError(f"drafter cache full: {start_pos + m} tokens > capacity {self.capacity}")
        if self.bugs.stale_prefill_hidden:
            if last_chunk:
                self._stale = hid.detach().clone()
            elif self._stale is None:  # BUG (planted): the buffer is only refreshed on the last chunk
                hid = torch.zeros_like(hid)
            else:
                hid = self._stale[torch.arange(m, device=hid.device) % self._stale.shape[0]]
        f = self.features(hid)                                                          # [m, d]
        pos = torch.arange(start_pos, start_pos + m, device=self.t.device)
        self.codes[pos] = (f @ self.w.z).to(self.codes.dtype)
        for i, lw in enumerate(self.layers):
            if lw.window is not None and m > self.ring:                                 # only the ring's worth
                k, v = self._ctx_kv(lw, f[-self.ring:], pos[-self.ring:])
                self._write(i, lw, pos[-self.ring:], k, v)
            else:
                k, v = self._ctx_kv(lw, f, pos)
                self._write(i, lw, pos, k, v)
        self.n_ctx += m
        self.length = max(self.length, self.n_ctx) if self.bugs.untrimmed else self.n_ctx

    def _heads(self, x: torch.Tensor, w: torch.Tensor, n: int) -> torch.Tensor:
        return (x @ w.T).view(x.shape[0], n, self.cfg.head_dim)

    def _ctx_kv(self, lw: dw.DraftLayer, f: torch.Tensor, pos: torch.Tensor):
        """Context K/V [m, Hkv, hd] of features f [m, d] at positions pos [m]."""
        hk = self.cfg.num_kv_heads
        v = self._heads(f, lw.wv, hk) + lw.v_bias.view(hk, -1)
        if lw.role == "copy":
            return self._lookback_keys(pos), v
        if lw.role == "positional":
            k = rms_norm(lw.k_bias.expand(f.shape[0], hk, -1), lw.k_norm)
        else:
            k = rms_norm(self._heads(f, lw.wk, hk), lw.k_norm)
        return self.rotary(k, pos), v

    def _lookback_keys(self, pos: torch.Tensor) -> torch.Tensor:
        """Copy-layer keys [m, Hkv, hd]: slot s of kv head u holds [c(x_{i-j-1}), c(x_{i-j-2})], j = u + s * Hkv
        (the 2-gram that precedes row i by j tokens; the row's value is its own code)."""
        c, hk, hd = self.code_dim, self.cfg.num_kv_heads, self.cfg.head_dim
        k = torch.zeros(pos.numel(), hk, hd, dtype=self.t.dtype, device=self.t.device)
        for j, u, s in self.w.layout.offsets:
            for part, back in ((0, j + 1), (1, j + 2)):
                src = pos - back
                ok = (src >= 0).unsqueeze(1)
                k[:, u, s * 2 * c + part * c: s * 2 * c + (part + 1) * c] = self.codes[src.clamp(min=0)] * ok
        return rms_norm(k, self.layers_copy().k_norm)

    def layers_copy(self) -> dw.DraftLayer:
        return next(lw for lw in self.layers if lw.role == "copy")

    def _write(self, i: int, lw: dw.DraftLayer, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        rows = pos if lw.window is None else pos % self.ring
        self.k[i][rows] = k.to(self.k[i].dtype)
        self.v[i][rows] = v.to(self.v[i].dtype)

    # -- the block forward ----------------------------------------------------------------------
    def draft(self, root: int, root_pos: int, timer=None) -> torch.Tensor:
        """Log-probs [B-1, V] (float32, on the device) of the tokens at positions root_pos+1 .. root_pos+B-1.

        timer: a StepTimer; sliding-window layers are timed as the part "draft_swa" (it should not grow
        with context), the rest stays in the enclosing part."""
        t, b = self.t, self.block
        if root_pos != self.n_ctx:
            raise AssertionError(f"drafting at position {root_pos} with {self.n_ctx} context tokens")
        p = self.length                                       # == n_ctx unless the untrimmed bug is planted
        if p + b > self.capacity + b:
            raise RuntimeError(f"drafter cache full: block at {p} > capacity {self.capacity}")
        pos = torch.arange(p, p + b, device=t.device)
        x = t.embed[torch.tensor([root] + [t.cfg.mask_token] * (b - 1), device=t.device)]           # [B, d]
        for i, lw in enumerate(self.layers):
            timed = timer is not None and lw.window is not None
            with timer.part("draft_swa") if timed else contextlib.nullcontext():
                x = self._layer(i, lw, x, pos, p)
        if self.bugs.untrimmed:                               # BUG (planted): the block's rows stay
            self.length = p + b
        logits = t.head_logits(rms_norm(x[1:], self.w.final_norm))                             # [B-1, V]
        if t.cfg.mask_token < logits.shape[-1]:   # (--simulate-rank sees only vocab shard 0)
            logits[:, t.cfg.mask_token] = float("-inf")                                          # never draft MASK
        return torch.log_softmax(logits, -1)

    def _layer(self, i: int, lw: dw.DraftLayer, x: torch.Tensor, pos: torch.Tensor, p: int) -> torch.Tensor:
        """One draft layer over the block x [B, d] at positions pos [B]; the context is rows < p."""
        c, b = self.cfg, self.block
        h = rms_norm(x, lw.norm)
        q = rms_norm(self._heads(h, lw.wq, c.num_heads) + lw.q_bias, lw.q_norm)              # [B, H, hd]
        v = self._heads(h, lw.wv, c.num_kv_heads) + lw.v_bias.view(c.num_kv_heads, -1)        # [B, Hkv, hd]
        if lw.role == "copy":
            k = torch.zeros_like(v)        # block rows carry no target state: nothing to match
        elif lw.role == "positional":
            k = rms_norm(lw.k_bias.expand(b, c.num_kv_heads, -1), lw.k_norm)
        else:
            k = rms_norm(self._heads(h, lw.wk, c.num_kv_heads), lw.k_norm)
        if lw.rope:
            q, k = self.rotary(q, pos), self.rotary(k, pos)
        self._write(i, lw, pos, k, v)
        if lw.window is None:
            lo = 0 if self.bugs.window is None else max(0, p - self.bugs.window)   # BUG (planted) when set
            idx = self._ar[lo:p + b]                                          # rows are positions: a view
        else:
            idx = (torch.arange(max(0, p - lw.window), p + b, device=x.device) % self.ring).to(torch.int32)
        n = idx.numel()
        o = tree_verify(q.contiguous(), self.k[i], self.v[i], self._qo,
                        torch.tensor([0, n], dtype=torch.int32, device=x.device), idx,
                        torch.tensor([n], dtype=torch.int32, device=x.device), self._mask,
                        sm_scale=c.head_dim ** -0.5, page_size=1, backend=self.backend)      # [B, H, hd]
        x = x + o.reshape(b, -1).to(x.dtype) @ lw.wo.T
        hm = rms_norm(x, lw.mlp_norm)
        return x + (F.silu(hm @ lw.gate.T) * (hm @ lw.up.T)) @ lw.down.T
