"""DFlash block drafter (arXiv:2602.06036), Qwen3-style layers, synthetic weights.

One non-causal forward drafts a block: the inputs are the target's embeddings of
[last committed token, MASK x (B-1)] at positions n .. n+B-1. Hidden states of
the target's chosen layers ([m, len(target_layers), d]) for every committed
token are concatenated, projected (fc) and RMS-normalised into context features;
every draft layer turns them into extra K/V context (its own k/v projections,
k RMSNorm, RoPE at the tokens' positions) that the block attends to besides
itself. Sliding-window layers see only the last `window` context entries, full
layers all of them. Logits go through the target's (vocab-parallel) LM head.

The context K/V is cached per layer and appended as tokens are committed
(`commit`); a sliding layer's cache is trimmed to the window. `draft(...,
from_scratch=feats)` recomputes the same block from the stored features alone
(the test oracle for the cache).

Synthetic weights cannot predict anything, so block position k also receives
`embed[root] @ A_k`, where A_k is the linear map taking embed[t] to
embed[succ^(k-1)[t]] (least squares over the vocabulary): a stand-in for what
training would teach, and exactly the target's residual-path prediction. The
layers' updates are scaled by `layer_scale`. See README: how acceptance arises.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from .config import DrafterConfig
from .model import MLATarget, WeightMaker, rms_norm
from .rope import Rotary, plain_inv_freq
from .tp import TPGroup


@dataclass
class DraftLayer:
    norm: torch.Tensor      # [d]
    q: torch.Tensor         # [Hd*hd, d]
    k: torch.Tensor         # [Hkv*hd, d]
    v: torch.Tensor         # [Hkv*hd, d]
    q_norm: torch.Tensor    # [hd]
    k_norm: torch.Tensor    # [hd]
    o: torch.Tensor         # [d, Hd*hd]
    mlp_norm: torch.Tensor  # [d]
    gate: torch.Tensor      # [ffn, d]
    up: torch.Tensor        # [ffn, d]
    down: torch.Tensor      # [d, ffn]
    window: Optional[int]   # None: full attention over the context


class DFlashDrafter:
    def __init__(self, target: MLATarget, cfg: Optional[DrafterConfig] = None) -> None:
        self.t = target
        self.cfg = cfg = cfg or target.cfg.drafter
        d, dt, dev = target.cfg.hidden, target.dtype, target.device
        self.block = cfg.block
        # the drafter is small: replicated on every rank (no TP), except the shared vocab-parallel head
        mk = WeightMaker(target.cfg.seed + 991, TPGroup(), dt, dev)
        ones = lambda n: torch.ones(n, dtype=dt, device=dev)  # noqa: E731
        nsel = len(cfg.target_layers)
        self.fc = mk.normal((d, nsel * d), (nsel * d) ** -0.5)     # [d, nsel*d]
        self.hidden_norm = ones(d)
        self.final_norm = ones(d)
        hd, H, Hkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        self.layers = [DraftLayer(
            norm=ones(d), q=mk.normal((H * hd, d), d ** -0.5), k=mk.normal((Hkv * hd, d), d ** -0.5),
            v=mk.normal((Hkv * hd, d), d ** -0.5), q_norm=ones(hd), k_norm=ones(hd),
            o=mk.normal((d, H * hd), (H * hd) ** -0.5), mlp_norm=ones(d),
            gate=mk.normal((cfg.ffn, d), d ** -0.5), up=mk.normal((cfg.ffn, d), d ** -0.5),
            down=mk.normal((d, cfg.ffn), cfg.ffn ** -0.5),
            window=None if i in cfg.full_layers else cfg.window) for i in range(cfg.num_layers)]
        self.rotary = Rotary(*plain_inv_freq(hd, cfg.rope_theta), dev)
        self.adapters = self._adapters()                              # [B-1, d, d]
        self.reset()

    def _adapters(self) -> Optional[torch.Tensor]:
        """A_k [d, d] with embed[t] @ A_k ~= embed[succ^(k-1)[t]] (k = 1..B-1); None (identity) when vocab > d."""
        t, d, B = self.t, self.t.cfg.hidden, self.block
        n = t.succ.numel()
        if n > d:  # more tokens than dims: no such linear map; acceptance then comes from --simulate-accept-len
            return None
        E = t.embed[:n].float().cpu()
        pinv = torch.linalg.pinv(E)                                   # [d, n]
        out, idx = [], torch.arange(n)
        for _ in range(B - 1):
            out.append(pinv @ E[idx])
            idx = t.succ[idx]
        return torch.stack(out).to(t.device, t.dtype)

    @property
    def target_layers(self) -> tuple[int, ...]:
        return tuple(self.cfg.target_layers)

    def reset(self) -> None:
        # per layer: context K [m, Hkv, hd] (roped), V [m, Hkv, hd]; positions [m]
        dev, dt, c = self.t.device, self.t.dtype, self.cfg
        self.ck = [torch.empty(0, c.num_kv_heads, c.head_dim, dtype=dt, device=dev) for _ in self.layers]
        self.cv = [torch.empty(0, c.num_kv_heads, c.head_dim, dtype=dt, device=dev) for _ in self.layers]
        self.n_ctx = 0

    # -- context ------------------------------------------------------------------------------
    def features(self, hid: torch.Tensor) -> torch.Tensor:
        """target hidden states [m, nsel, d] -> context features [m, d]."""
        return rms_norm(hid.reshape(hid.shape[0], -1).to(self.t.dtype) @ self.fc.T, self.hidden_norm)

    def _ctx_kv(self, lw: DraftLayer, feats: torch.Tensor, pos: torch.Tensor):
        c = self.cfg
        k = rms_norm((feats @ lw.k.T).view(-1, c.num_kv_heads, c.head_dim), lw.k_norm)
        v = (feats @ lw.v.T).view(-1, c.num_kv_heads, c.head_dim)
        return self.rotary(k, pos), v

    def commit(self, hid: torch.Tensor, start_pos: int) -> None:
        """Append the committed tokens' target hidden states [m, nsel, d] at positions start_pos.."""
        if start_pos != self.n_ctx:
            raise AssertionError(f"drafter context out of sync: has {self.n_ctx} tokens, commit starts at {start_pos}")
        feats = self.features(hid)
        pos = torch.arange(start_pos, start_pos + feats.shape[0], device=self.t.device)
        for i, lw in enumerate(self.layers):
            k, v = self._ctx_kv(lw, feats, pos)
            ck, cv = torch.cat([self.ck[i], k]), torch.cat([self.cv[i], v])
            if lw.window is not None:          # a sliding layer never holds more than its window
                ck, cv = ck[-lw.window:], cv[-lw.window:]
            self.ck[i], self.cv[i] = ck, cv
        self.n_ctx += feats.shape[0]

    # -- the block forward ----------------------------------------------------------------------
    def draft(self, root: int, root_pos: int, from_scratch: Optional[torch.Tensor] = None, timer=None) -> torch.Tensor:
        """Log-probs [B-1, V] (float32) of the tokens at positions root_pos+1 .. root_pos+B-1.

        from_scratch: the context features of every committed token [root_pos, d]; recompute the
        context K/V from them instead of reading the cache.
        timer: a StepTimer; sliding-window layers are timed as the part "draft_swa" (it should not grow
        with context), the rest stays in the enclosing part.
        """
        t, B = self.t, self.block
        dev = t.device
        if root_pos != self.n_ctx and from_scratch is None:
            raise AssertionError(f"drafting at position {root_pos} with {self.n_ctx} context tokens")
        emb = t.embed[torch.tensor([root] + [t.cfg.mask_token] * (B - 1), device=dev)]     # [B, d]
        x = emb.clone()
        x[1:] = x[1:] + (emb[0] if self.adapters is None else emb[0] @ self.adapters)         # [B-1, d]
        pos = torch.arange(root_pos, root_pos + B, device=dev)
        for i, lw in enumerate(self.layers):
            timed = timer is not None and lw.window is not None
            with timer.part("draft_swa") if timed else contextlib.nullcontext():
                x = self._layer(i, lw, x, pos, root_pos, from_scratch)
        logits = t.head_logits(rms_norm(x[1:], self.final_norm))                           # [B-1, V]
        if t.cfg.mask_token < logits.shape[-1]:   # (--simulate-rank sees only vocab shard 0)
            logits[:, t.cfg.mask_token] = float("-inf")                                      # never draft MASK
        return torch.log_softmax(logits, -1)

    def _layer(self, i: int, lw: DraftLayer, x: torch.Tensor, pos: torch.Tensor, root_pos: int,
               from_scratch: Optional[torch.Tensor]) -> torch.Tensor:
        """One draft layer over the block x [B, d] at positions pos [B]."""
        c, B, dev = self.cfg, self.block, self.t.device
        if from_scratch is None:
            ck, cv = self.ck[i], self.cv[i]
        else:
            lo = 0 if lw.window is None else max(0, root_pos - lw.window)
            ck, cv = self._ctx_kv(lw, from_scratch[lo:root_pos], torch.arange(lo, root_pos, device=dev))
        h = rms_norm(x, lw.norm)
        q = self.rotary(rms_norm((h @ lw.q.T).view(B, c.num_heads, c.head_dim), lw.q_norm), pos)
        k = self.rotary(rms_norm((h @ lw.k.T).view(B, c.num_kv_heads, c.head_dim), lw.k_norm), pos)
        v = (h @ lw.v.T).view(B, c.num_kv_heads, c.head_dim)
        keys, vals = torch.cat([ck, k]), torch.cat([cv, v])                            # [m+B, Hkv, hd]
        g = c.num_heads // c.num_kv_heads
        keys, vals = keys.repeat_interleave(g, 1), vals.repeat_interleave(g, 1)
        # non-causal: every block position sees the whole block and the (windowed) context
        a = F.scaled_dot_product_attention(q.transpose(0, 1).float(), keys.transpose(0, 1).float(),
                                           vals.transpose(0, 1).float())                # [H, B, hd]
        o = a.transpose(0, 1).reshape(B, -1).to(x.dtype) @ lw.o.T
        x = x + c.layer_scale * o
        hm = rms_norm(x, lw.mlp_norm)
        x = x + c.layer_scale * ((F.silu(hm @ lw.gate.T) * (hm @ lw.up.T)) @ lw.down.T)
        return x
