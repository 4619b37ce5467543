"""The MLA target: Kimi K2 / DeepSeek-V3 attention in absorbed form, tensor parallel.

Per layer and rank (H = heads per rank):
  q   = q_b(RMSNorm(q_a(h)))                      [T, H, nope + rope]   (q_b column-parallel by head)
  kv  = kv_a(h) -> c = RMSNorm(kv[:kv_lora]), k_pe = rope(kv[kv_lora:])  (replicated on every rank)
  cache row = [c, k_pe]                           [T, kv_lora + rope] = 576 for Kimi K2
  q_lat = q_nope @ W_UK (absorbed)                [T, H, kv_lora];  q = [q_lat, rope(q_pe)]  [T, H, 576]
  o_lat = tree_verify(q, cache, V = cache[..., :kv_lora])   [T, H, kv_lora]
  o = o_proj(o_lat @ W_UV)                        row-parallel: one all-reduce
(prefill uses the equivalent plain form, K = [W_UK c, k_pe], V = W_UV c, through a fused kernel)
then a SwiGLU MLP (gate/up column-parallel, down row-parallel: one all-reduce), and a
vocab-parallel LM head whose logit shards are all-gathered.

Synthetic weights (README: how acceptance arises): the LM head is the embedding
table re-indexed by a fixed permutation `succ`, so the residual stream of token t
votes for succ[t]; attention and MLP updates (scaled by attn_scale/mlp_scale)
perturb that vote with context. LOCAL heads get a constant vector added to q_pe and
k_pe before rotation, so they favour recent tokens (q.k gains sum_i |b_i|^2 cos(theta_i *
distance)); RETRIEVAL heads get sharpened content scores, so a few tokens anywhere dominate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from verify_attn import tree_verify

from .config import ModelConfig
from .rope import Rotary, yarn_inv_freq
from .timing import nvtx_range
from .tp import TPGroup

_FULL_WEIGHT_LIMIT = 1 << 24  # below this size: full weight on the CPU, then narrow (TP1 == TP8 model)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


class WeightMaker:
    """Seeded synthetic weights. Small tensors: full tensor generated on the CPU, then this rank's
    shard taken with narrow (so TP 1 and TP 8 hold the same model). Large ones: the shard alone,
    seeded by (name, rank), generated on the device."""

    def __init__(self, seed: int, tp: TPGroup, dtype: torch.dtype, device: torch.device) -> None:
        self.seed, self.tp, self.dtype, self.device = seed, tp, dtype, device
        self._n = 0

    def _gen(self, salt: int, device) -> torch.Generator:
        g = torch.Generator(device=device)
        g.manual_seed((self.seed * 1_000_003 + salt) % (2**63))
        return g

    def normal(self, shape: tuple[int, ...], std: float, shard_dim: Optional[int] = None, what: str = "") -> torch.Tensor:
        self._n += 1
        salt = self._n * 7919
        if math.prod(shape) <= _FULL_WEIGHT_LIMIT:
            w = torch.randn(shape, generator=self._gen(salt, "cpu"), dtype=torch.float32) * std
            if shard_dim is not None:
                s, n = self.tp.shard(shape[shard_dim], what)
                w = w.narrow(shard_dim, s, n)
            return w.to(self.device, self.dtype).contiguous()
        local = list(shape)
        if shard_dim is not None:
            local[shard_dim] = self.tp.shard(shape[shard_dim], what)[1]
            salt += 131 * (self.tp.rank + 1)
        g = self._gen(salt, self.device)
        return (torch.randn(local, generator=g, device=self.device, dtype=torch.float32) * std).to(self.dtype)


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor   # [d]
    q_a: torch.Tensor         # [q_lora, d] replicated
    q_a_norm: torch.Tensor    # [q_lora]
    q_b: torch.Tensor         # [H*(nope+rope), q_lora] this rank's heads
    kv_a: torch.Tensor        # [kv_lora+rope, d] replicated
    kv_a_norm: torch.Tensor   # [kv_lora]
    w_uk: torch.Tensor        # [H, nope, kv_lora]
    w_uv: torch.Tensor        # [H, kv_lora, v_head]
    o: torch.Tensor           # [d, H*v_head] this rank's columns
    mlp_norm: torch.Tensor    # [d]
    gate: torch.Tensor        # [ffn/tp, d]
    up: torch.Tensor          # [ffn/tp, d]
    down: torch.Tensor        # [d, ffn/tp]


# attention callback: (layer, q_nope [T, H, nope], q_pe [T, H, rope] (rotated), new cache rows [T, 576])
#   -> per-head output [T, H, v_head]
AttnFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class MLATarget:
    def __init__(self, cfg: ModelConfig, tp: TPGroup, *, dtype: torch.dtype, device: torch.device) -> None:
        self.cfg, self.tp, self.dtype, self.device = cfg, tp, dtype, torch.device(device)
        self.h = cfg.heads_per_rank(tp.size)
        d, c = cfg.hidden, cfg
        mk = WeightMaker(cfg.seed, tp, dtype, self.device)
        ones = lambda n: torch.ones(n, dtype=dtype, device=self.device)  # noqa: E731
        # embedding [V, d] (replicated); the head row of token v is the embedding of succ^-1[v]
        self.embed = mk.normal((c.vocab, d), 1.0)
        g = torch.Generator().manual_seed(cfg.seed + 17)
        n_real = c.vocab - 1                                   # the last id is DFlash's MASK token
        self.succ = torch.randperm(n_real, generator=g)        # succ[t]: the token t "votes" for
        pred = torch.empty(n_real, dtype=torch.long)
        pred[self.succ] = torch.arange(n_real)
        vs, vn = tp.shard(c.vocab, "vocab")
        head = torch.zeros(vn, d, dtype=dtype, device=self.device)
        ids = torch.arange(vs, vs + vn)
        real = ids < n_real                                    # CPU mask over this rank's vocab ids
        head[real.to(self.device)] = self.embed[pred[ids[real]].to(self.device)] * (c.lm_gain / math.sqrt(d))
        self.lm_head = head                                    # [V/tp, d]; the MASK row stays 0
        self.final_norm = ones(d)
        qk = c.qk_nope + c.qk_rope
        self.layers: list[LayerWeights] = []
        for _ in range(c.num_layers):
            kv_b = mk.normal((c.num_heads, c.qk_nope + c.v_head, c.kv_lora), c.kv_lora ** -0.5, 0, "heads")
            self.layers.append(LayerWeights(
                attn_norm=ones(d),
                q_a=mk.normal((c.q_lora, d), d ** -0.5), q_a_norm=ones(c.q_lora),
                q_b=mk.normal((c.num_heads * qk, c.q_lora), c.q_lora ** -0.5, 0, "heads*qk"),
                kv_a=mk.normal((c.kv_lora + c.qk_rope, d), d ** -0.5), kv_a_norm=ones(c.kv_lora),
                w_uk=kv_b[:, : c.qk_nope].contiguous(),
                w_uv=kv_b[:, c.qk_nope:].transpose(1, 2).contiguous(),
                o=mk.normal((d, c.num_heads * c.v_head), (c.num_heads * c.v_head) ** -0.5, 1, "heads*v"),
                mlp_norm=ones(d),
                gate=mk.normal((c.ffn, d), d ** -0.5, 0, "ffn"), up=mk.normal((c.ffn, d), d ** -0.5, 0, "ffn"),
                down=mk.normal((d, c.ffn), c.ffn ** -0.5, 1, "ffn"),
            ))
        # Two kinds of heads (by global head index, so every TP split holds the same model):
        # even heads are LOCAL: a constant rope component on q and k favours recent tokens;
        # odd heads are RETRIEVAL: no recency, content scores sharpened so that a few tokens
        # anywhere in the context dominate. Both make the output depend on where the kernel reads.
        first = tp.rank * self.h if not tp.simulate else 0
        local = (torch.arange(first, first + self.h) % 2 == 0).to(self.device)
        b = c.recency / math.sqrt(2)
        self.k_rope_bias = torch.full((c.qk_rope,), b, dtype=dtype, device=self.device)           # [rope]
        self.q_rope_bias = (local.to(dtype).unsqueeze(1) * b).expand(self.h, c.qk_rope).to(dtype)  # [H, rope]
        self.q_nope_scale = torch.where(local, 1.0, c.retrieval_sharpness).to(dtype).unsqueeze(1)  # [H, 1]
        inv_freq, mult = yarn_inv_freq(c.qk_rope, c.rope)
        self.rotary = Rotary(inv_freq, mult, self.device)
        self.sm_scale = cfg.sm_scale()

    # -- pieces ---------------------------------------------------------------------------------
    def qkv(self, lw: LayerWeights, x: torch.Tensor, pos: torch.Tensor):
        """x [T, d] -> (q_nope [T, H, nope], q_pe [T, H, rope] rotated, cache rows [T, kv_lora + rope])."""
        c = self.cfg
        h = rms_norm(x, lw.attn_norm)
        q = (rms_norm(h @ lw.q_a.T, lw.q_a_norm) @ lw.q_b.T).view(-1, self.h, c.qk_nope + c.qk_rope)
        q_nope, q_pe = q[..., : c.qk_nope] * self.q_nope_scale, q[..., c.qk_nope:]
        q_pe = self.rotary(q_pe + self.q_rope_bias, pos)                           # [T, H, rope]
        kv = h @ lw.kv_a.T                                                         # [T, kv_lora + rope]
        latent = rms_norm(kv[:, : c.kv_lora], lw.kv_a_norm)
        k_pe = self.rotary(kv[:, c.kv_lora:] + self.k_rope_bias, pos)
        return q_nope, q_pe, torch.cat([latent, k_pe], -1)

    def absorb(self, lw: LayerWeights, q_nope: torch.Tensor, q_pe: torch.Tensor) -> torch.Tensor:
        """Absorbed query [T, H, kv_lora + rope]: q_nope @ W_UK scores the latent directly."""
        q_lat = torch.einsum("thn,hnc->thc", q_nope, lw.w_uk)                      # [T, H, kv_lora]
        return torch.cat([q_lat, q_pe], -1).contiguous()

    def attn_out(self, lw: LayerWeights, o: torch.Tensor) -> torch.Tensor:
        """Per-head output [T, H, v_head] -> row-parallel o_proj, all-reduced [T, d]."""
        return self.tp.all_reduce(o.reshape(o.shape[0], -1) @ lw.o.T)

    def mlp(self, lw: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        h = rms_norm(x, lw.mlp_norm)
        return self.tp.all_reduce((F.silu(h @ lw.gate.T) * (h @ lw.up.T)) @ lw.down.T)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, d] final residual -> full-vocab logits [T, V] float32 (all-gathered shards)."""
        return self.tp.all_gather_last((rms_norm(x, self.final_norm) @ self.lm_head.T).float())

    def head_logits(self, h: torch.Tensor) -> torch.Tensor:
        """LM head on an already-normalised hidden [n, d] (the drafter's output) -> [n, V] float32."""
        return self.tp.all_gather_last((h.to(self.dtype) @ self.lm_head.T).float())

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor, attn: AttnFn,
                keep_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens, pos [T] -> (final residual [T, d], hidden states of keep_layers [T, len, d])."""
        x = self.embed[tokens]
        kept = []
        for i, lw in enumerate(self.layers):
            q_nope, q_pe, rows = self.qkv(lw, x, pos)
            x = x + self.cfg.attn_scale * self.attn_out(lw, attn(i, q_nope, q_pe, rows))
            x = x + self.cfg.mlp_scale * self.mlp(lw, x)
            if i in keep_layers:
                kept.append(x)
        hid = torch.stack(kept, 1) if kept else x.new_zeros(x.shape[0], 0, x.shape[1])
        return x, hid


# -- attention callbacks ----------------------------------------------------------------------

def verify_attention(model: MLATarget, cache, addr, parents_mask: torch.Tensor, backend: str, timer=None) -> AttnFn:
    """Tree verify through verify_attn.tree_verify (absorbed MLA: one 576-wide latent row per token, V its
    first 512): write the nodes' rows, then attend to the prefix and each node's ancestors."""
    idx = cache.indices()
    t = parents_mask.shape[0]
    qo = torch.tensor([0, t], dtype=torch.int32, device=model.device)

    def fn(layer: int, q_nope: torch.Tensor, q_pe: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        lw = model.layers[layer]
        cache.write(layer, addr, rows)
        q = model.absorb(lw, q_nope, q_pe)                                            # [T, H, 576]
        ctx = timer.part("verify_attn") if timer is not None else nvtx_range("verify_attn", model.device)
        with ctx:
            o_lat = tree_verify(q, cache.k_cache(layer), cache.v_cache(layer), qo, idx["kv_indptr"],
                                idx["kv_indices"], idx["kv_lens"], parents_mask, sm_scale=model.sm_scale,
                                page_size=cache.page_size, backend=backend)          # [T, H, kv_lora]
        return torch.einsum("thc,hcv->thv", o_lat, lw.w_uv)                           # [T, H, v_head]
    return fn


def prefill_attention(model: MLATarget, cache, addr, start: int) -> AttnFn:
    """Causal attention for a prefill chunk at positions [start, start+n), in the plain (non-absorbed)
    form so a fused kernel can run it (head dim nope + rope = 192, not 576): the chunk's rows are written
    to the cache first; per-head K = [W_UK c, k_pe] and V = W_UV c are rebuilt from the cached latent rows
    [0, start+n) and the chunk attends bottom-right causally. Mathematically the same as the absorbed form
    (tests/test_integration_model.py checks it)."""
    from torch.nn.attention.bias import causal_lower_right

    c = model.cfg

    def fn(layer: int, q_nope: torch.Tensor, q_pe: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        lw = model.layers[layer]
        cache.write(layer, addr, rows)
        n, h = q_nope.shape[0], q_nope.shape[1]
        kv = cache.prefix_rows(layer, start + n)                                      # [S, 576], S = start+n
        latent, k_pe = kv[:, : c.kv_lora], kv[:, c.kv_lora:]
        k_nope = torch.einsum("sc,hnc->hsn", latent, lw.w_uk)                         # [H, S, nope]
        k = torch.cat([k_nope, k_pe.unsqueeze(0).expand(h, -1, -1)], -1)              # [H, S, nope + rope]
        v = torch.einsum("sc,hcv->hsv", latent, lw.w_uv)                              # [H, S, v_head]
        dq = k.shape[-1]
        if v.shape[-1] < dq:     # fused kernels want one head dim: pad V, drop the padding after
            v = torch.nn.functional.pad(v, (0, dq - v.shape[-1]))
        q = torch.cat([q_nope, q_pe], -1).transpose(0, 1)                             # [H, n, nope + rope]
        o = F.scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
                                           attn_mask=causal_lower_right(n, start + n), scale=model.sm_scale)
        return o[0, :, :, : c.v_head].transpose(0, 1)                                 # [n, H, v_head]
    return fn
