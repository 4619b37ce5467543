"""Synthetic weights of the DFlash drafter: a copy circuit that reads the injected target states.

Random drafter weights never agree with the target, and weights that know the target's
successor map (the old `embed[root] @ A_k` adapters) ignore the context. These weights
make a draft depend on the context and on the injected hidden states, the way a trained
DFlash drafter's does on repetitive text (README: how acceptance arises):

- Features. The DFlash projection `fc` of the concatenated target states of token i is a
  ridge probe, fitted on a run of the target (the stand-in for training), that reads the
  token's embedding e(x_i) back from those states; after the RMSNorm, f_i ~ e(x_i).
- Token codes. c(t) = Z^T e(t): the embedding seen through a random `code_dim`-wide
  subspace Z orthogonal to the MASK embedding (so c(MASK) = 0); context rows use Z^T f_i.
- Layer 0 (sliding, RoPE): positional heads. Head p attends to the row at distance p+1 (a
  constant query/key on the rotary dims, like the target's LOCAL heads) and writes that
  row's code into subspace S_{p+1} of the block's residual, plus a flag that is large when
  the row is a MASK row. So block position k holds the codes of the tokens before it.
- Copy layer (the first full-attention layer, no RoPE): head m matches the 2-gram in
  [S_{m+1}, S_{m+2}] of its block position against the keys [c(x_{i-m-1}), c(x_{i-m-2})] and
  copies hd dims of f_i; its output projection turns that copy into the residual direction
  that votes for x_i through the shared LM head (row of token v = e(pred[v]), so the map is
  E_pred^T E P^T: the identity in token space, no knowledge of what follows what). At block
  position k the heads m >= k-1 hold [c(x_{n+k-m-1}), c(x_{n+k-m-2})]; in text seen before
  they all land on the row after the earlier occurrence of the same 2-gram, so depth k drafts
  what came next there, with more heads (more confidence) at shallow depths. Heads whose
  2-gram holds a MASK carry the flag and spread their attention (near-zero output).
  The one structural stand-in: the key of row i reads the codes of rows i-m-1, i-m-2. A
  trained target's hidden state at i carries information about the tokens before it
  (previous-token heads); this synthetic target's does not, so the lookback is done when
  the key is written (same key width, same bytes per context row as a plain key).
- Other layers: small random updates outside the code subspaces (there for their cost).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from .config import DrafterConfig
from .kv import LatentKVCache
from .model import MLATarget, WeightMaker, prefill_attention, rms_norm
from .tp import TPGroup


@dataclass
class DraftLayer:
    role: str                       # "positional" | "copy" | "mixer"
    window: Optional[int]           # None: full attention over the context
    rope: bool
    norm: torch.Tensor              # [d]
    wq: torch.Tensor                # [H*hd, d]
    wk: torch.Tensor                # [Hkv*hd, d]  (copy layer: unused, keys are lookback codes)
    wv: torch.Tensor                # [Hkv*hd, d]
    v_bias: torch.Tensor            # [Hkv*hd]  (copy layer: centres the copied state)
    wo: torch.Tensor                # [d, H*hd]
    q_bias: torch.Tensor            # [H, hd]   (positional heads: constant rotated query)
    k_bias: torch.Tensor            # [hd]      (positional heads: constant key)
    q_norm: torch.Tensor            # [hd]
    k_norm: torch.Tensor            # [hd]
    mlp_norm: torch.Tensor          # [d]
    gate: torch.Tensor              # [ffn, d]
    up: torch.Tensor                # [ffn, d]
    down: torch.Tensor              # [d, ffn]


@dataclass
class CopyLayout:
    """Where each copy head's 2-gram lives in its query and in its kv head's key."""

    code_dim: int
    offsets: list[tuple[int, int, int]]   # (offset m, kv head u, slot s); query head = u * group + s

    def head(self, u: int, s: int, group: int) -> int:
        return u * group + s


@dataclass
class DrafterWeights:
    fc: torch.Tensor                # [d, nsel*d]
    hidden_norm: torch.Tensor       # [d]
    final_norm: torch.Tensor        # [d]
    z: torch.Tensor                 # [d, c] code subspace (orthonormal columns)
    layers: list[DraftLayer]
    layout: CopyLayout
    probe_accuracy: float           # calibration tokens whose feature is nearest to their own embedding


def slots_per_kv_head(cfg: DrafterConfig) -> int:
    """Copy offsets 0..B-2 spread over the kv heads: one 2-gram slot per offset a kv head serves."""
    return math.ceil((cfg.block - 1) / cfg.num_kv_heads)


def code_dim_for(cfg: DrafterConfig) -> int:
    """The 2-gram slots (2 codes each) plus 2 flag dims fit one head: hd >= 2 * c * slots + 2."""
    return min(cfg.code_dim, (cfg.head_dim - 2) // (2 * slots_per_kv_head(cfg)))


def check_config(cfg: DrafterConfig, hidden: int) -> None:
    b, c = cfg.block, code_dim_for(cfg)
    g, nslot = cfg.num_heads // cfg.num_kv_heads, slots_per_kv_head(cfg)
    problems = []
    if 0 in cfg.full_layers:
        problems.append("layer 0 must slide (it carries the positional heads)")
    if not cfg.full_layers:
        problems.append("needs a full-attention layer (the copy layer)")
    if cfg.num_heads < b:
        problems.append(f"needs num_heads >= block ({b}) positional heads")
    if nslot > 2 or g < nslot:
        problems.append(f"block-1 = {b - 1} copy offsets do not fit {cfg.num_kv_heads} kv heads x 2 slots")
    if c < 4:
        problems.append(f"head_dim {cfg.head_dim} too small for token codes")
    if 1 + c + b * (c + 1) > hidden:
        problems.append(f"hidden {hidden} cannot hold the code subspaces ({1 + c + b * (c + 1)} dims)")
    if cfg.window < 1:
        problems.append("window must be >= 1")
    if problems:
        raise ValueError("drafter config: " + "; ".join(problems))


def calibration_states(target: MLATarget, n: int, keep: tuple[int, ...], seed: int,
                       seq: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [n], target states of the `keep` layers [n, len(keep), d]) for seeded prompts of `seq`
    tokens, mixing random stretches with stretches that follow the target's successor map (the probe
    must read both kinds of text), run through the target's dense prefill (the engine's prefill path)."""
    v = target.cfg.vocab
    g = torch.Generator().manual_seed(4242 + seed)
    parts, have = [], 0
    while have < n:
        seg = int(torch.randint(8, 96, (), generator=g))
        t0 = int(torch.randint(0, v - 1, (), generator=g))
        if len(parts) % 2:
            run = [t0]
            for _ in range(seg - 1):
                run.append(int(target.succ[run[-1]]))
            parts.append(torch.tensor(run))
        else:
            parts.append(torch.randint(0, v - 1, (seg,), generator=g))
        have += seg
    toks = torch.cat(parts)[:n]
    hs = []
    for s in range(0, n, seq):                  # independent prompts: sequence starts are covered too
        t = toks[s:s + seq].to(target.device)
        cache = LatentKVCache(target.cfg.num_layers, t.numel(), target.cfg.cache_dim, target.cfg.kv_lora,
                              page_size=1, dtype=target.dtype, device=target.device)
        addr = cache.extend(t.numel())
        pos = torch.arange(t.numel(), device=target.device)
        _, hid = target.forward(t, pos, prefill_attention(target, cache, addr, 0), keep)
        hs.append(hid)
    return toks, torch.cat(hs)


def _ridge_probe(x: torch.Tensor, y: torch.Tensor, lam: float = 1e-2) -> torch.Tensor:
    """W [out, in] minimising |x W^T - y|^2 + lam * (mean squared row norm of x) |W|^2: the primal
    solve when there are more rows than features, the dual (n x n) one otherwise."""
    n, m = x.shape
    reg = lam * float(x.pow(2).sum(1).mean())
    if n >= m:
        return torch.linalg.solve(x.T @ x + reg * torch.eye(m, dtype=x.dtype, device=x.device), x.T @ y).T
    a = torch.linalg.solve(x @ x.T + reg * torch.eye(n, dtype=x.dtype, device=x.device), y)   # [n, out]
    return (x.T @ a).T                                                           # [out, in]


_CACHE: dict = {}


def build(target: MLATarget, cfg: DrafterConfig) -> DrafterWeights:
    """The weights for this target and config (built once per process: the probe fit runs the target)."""
    key = (target.cfg, cfg, target.dtype, str(target.device), target.tp.rank, target.tp.size, target.tp.simulate)
    if key not in _CACHE:
        _CACHE[key] = _build(target, cfg)
    return _CACHE[key]


def _build(target: MLATarget, cfg: DrafterConfig) -> DrafterWeights:
    d, dt, dev = target.cfg.hidden, target.dtype, target.device
    check_config(cfg, d)
    c, b = code_dim_for(cfg), cfg.block
    H, Hkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    group, nslot = H // Hkv, slots_per_kv_head(cfg)
    gen = torch.Generator().manual_seed(target.cfg.seed + 777)
    mk = WeightMaker(target.cfg.seed + 991, TPGroup(), dt, dev)     # replicated on every rank
    # small models: float64 on the CPU; Kimi-sized ones: float32 on the model's device
    wp = dict(dtype=torch.float64, device="cpu") if d <= 2048 else dict(dtype=torch.float32, device=dev)
    randn = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64).to(**wp)   # noqa: E731
    ones = lambda n: torch.ones(n, **wp)                                         # noqa: E731
    zeros = lambda *shape: torch.zeros(*shape, **wp)                             # noqa: E731

    m_vec = target.embed[target.cfg.mask_token].to(**wp)
    basis, _ = torch.linalg.qr(torch.cat([m_vec.unsqueeze(1), randn(d, d - 1)], 1))   # [d, d] orthonormal
    if float(basis[:, 0] @ m_vec) < 0:
        basis = -basis
    m_hat = basis[:, 0]                                                          # the MASK direction
    z = basis[:, 1:1 + c]                                                        # [d, c] code subspace
    s_sub = [basis[:, 1 + c + i * (c + 1): 1 + c + (i + 1) * (c + 1)] for i in range(b)]   # S_1..S_b, [d, c+1]
    used = basis[:, :1 + c + b * (c + 1)].float()                               # MASK, Z, S_1..S_b

    def noise(m: torch.Tensor) -> torch.Tensor:
        """m [d, n] with the MASK, code and S directions removed: noise that leaves the copy circuit alone."""
        m = m.float().to(used.device)
        return (m - used @ (used.T @ m)).to(**wp)

    # -- features: a ridge probe that reads the token's embedding from the target states ----------
    keep = tuple(cfg.target_layers)
    toks, hid = calibration_states(target, cfg.calib_tokens, keep, target.cfg.seed)
    x = hid.reshape(hid.shape[0], -1).to(**wp)                                   # [n, nsel*d]
    emb = target.embed[: target.cfg.vocab - 1].to(**wp)                          # [V-1, d]
    fc = _ridge_probe(x, emb[toks.to(emb.device)])                               # [d, nsel*d]
    feats = rms_norm(x @ fc.T, ones(d))                                          # [n, d]
    acc = float(((feats @ emb.T).argmax(-1).cpu() == toks).double().mean())     # in-sample nearest embedding
    # the drafter shares the LM head (row of token v = e(pred[v])): a copied code P e(x) becomes the
    # residual direction that votes for x through E_pred^T (E P^T)
    emb_pred = emb[torch.argsort(target.succ).to(emb.device)]                    # [V-1, d]: row t = e(pred[t])

    def rope_pair_bias(angle: torch.Tensor) -> torch.Tensor:
        """hd vector with pair f = (cos(angle_f), sin(angle_f)) in rotate-half layout."""
        return torch.cat([torch.cos(angle), torch.sin(angle)])

    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2, **wp) / hd)       # [hd/2]
    layers: list[DraftLayer] = []
    copy_done = False
    offsets: list[tuple[int, int, int]] = []
    for li in range(cfg.num_layers):
        full = li in cfg.full_layers
        role = "positional" if li == 0 else ("copy" if full and not copy_done else "mixer")
        copy_done = copy_done or role == "copy"
        wq, wk, wv, wo = zeros(H * hd, d), zeros(Hkv * hd, d), zeros(Hkv * hd, d), zeros(d, H * hd)
        v_bias, q_bias, k_bias = zeros(Hkv * hd), zeros(H, hd), zeros(hd)
        qn, kn = ones(hd), ones(hd)
        if role == "positional":
            k_bias = rope_pair_bias(zeros(hd // 2))                               # pairs (1, 0)
            for p in range(b):                                                    # head p: distance p + 1
                q_bias[p] = rope_pair_bias(-(p + 1) * inv_freq)
                wo[:, p * hd: p * hd + c + 1] = cfg.code_gain * s_sub[p]
            for u in range(Hkv):                                                  # value: [code, MASK flag]
                wv[u * hd: u * hd + c] = z.T
                wv[u * hd + c] = m_hat
            qn, kn = ones(hd) * cfg.pos_sharpness, ones(hd) * cfg.pos_sharpness
        elif role == "copy":
            flag = 2.0         # a MASK row's flag (~sqrt(d)) swamps the codes; a real row's (~1) does not
            keep_out = torch.eye(d, **wp) - torch.outer(m_hat, m_hat)
            pu = []
            for u in range(Hkv):                                                  # value: hd dims of the embedding
                q_u, _ = torch.linalg.qr(keep_out @ randn(d, hd))
                pu.append(q_u[:, :hd].T)                                          # [hd, d]
                wv[u * hd:(u + 1) * hd] = pu[-1]
            memory = emb.shape[0] <= cfg.ffn    # the MLP can hold one unit per token (a key-value memory)
            decs = None if memory else [emb_pred.T @ (emb @ p_u.T) for p_u in pu]   # [d, hd]: code -> vote
            for m in range(b - 1):
                u, s = m % Hkv, m // Hkv
                h = u * group + s
                offsets.append((m, u, s))
                base = h * hd + s * 2 * c
                wq[base: base + c] = s_sub[m][:, :c].T                            # code of the row at distance m+1
                wq[base + c: base + 2 * c] = s_sub[m + 1][:, :c].T                # ... and at distance m+2
                wq[h * hd + 2 * c * nslot] = flag * s_sub[m][:, c]
                wq[h * hd + 2 * c * nslot + 1] = flag * s_sub[m + 1][:, c]
                if memory:                      # put the copied slice of f back where it came from
                    wo[:, h * hd:(h + 1) * hd] = cfg.copy_gain * pu[u].T
                else:                           # decode it linearly into the LM head's vote (crosstalk grows with V)
                    wo[:, h * hd:(h + 1) * hd] = cfg.copy_gain * decs[u] / float(decs[u].norm(dim=0).mean())
            qn, kn = ones(hd) * cfg.match_sharpness, ones(hd) * cfg.match_sharpness
        else:                                                                     # mixer: small noise
            g32 = lambda *shape: torch.randn(*shape, generator=gen).to(wp["device"])   # noqa: E731
            wq, wk, wv = g32(H * hd, d) * d ** -0.5, g32(Hkv * hd, d) * d ** -0.5, g32(Hkv * hd, d) * d ** -0.5
            wo = cfg.layer_scale * noise(g32(d, H * hd)) * (H * hd) ** -0.5
        gate = mk.normal((cfg.ffn, d), d ** -0.5)
        up = mk.normal((cfg.ffn, d), d ** -0.5)
        down = cfg.layer_scale * noise(mk.normal((d, cfg.ffn), cfg.ffn ** -0.5))
        if role == "copy" and memory:
            # a key-value memory: unit t fires (silu(g) * u ~ g^2) when the copied state looks like e(t)
            # and writes the LM-head row of t (e(pred[t])): sharp decoding, no crosstalk over the vocabulary
            keys = emb - torch.outer(emb @ m_hat, m_hat)
            keys = keys / keys.norm(dim=1, keepdim=True)                          # [V-1, d]
            gate, up = zeros(cfg.ffn, d), zeros(cfg.ffn, d)
            gate[: keys.shape[0]] = cfg.memory_sharpness * keys
            up[: keys.shape[0]] = cfg.memory_sharpness * keys
            down = zeros(d, cfg.ffn)
            down[:, : keys.shape[0]] = emb_pred.T / float(emb_pred.norm(dim=1).mean())
        cast = lambda t: t.to(dev, dt).contiguous()                               # noqa: E731
        layers.append(DraftLayer(
            role=role, window=None if full else cfg.window, rope=role != "copy", norm=cast(ones(d)),
            wq=cast(wq), wk=cast(wk), wv=cast(wv), v_bias=cast(v_bias), wo=cast(wo), q_bias=cast(q_bias),
            k_bias=cast(k_bias), q_norm=cast(qn), k_norm=cast(kn), mlp_norm=cast(ones(d)), gate=cast(gate),
            up=cast(up), down=cast(down)))
    return DrafterWeights(fc=fc.to(dev, dt).contiguous(), hidden_norm=torch.ones(d, dtype=dt, device=dev),
                          final_norm=torch.ones(d, dtype=dt, device=dev), z=z.to(dev, dt).contiguous(),
                          layers=layers, layout=CopyLayout(c, offsets), probe_accuracy=acc)
