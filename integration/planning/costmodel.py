"""Step cost t_step(ctx, T) of speculative decoding per device, split by part, each with its evidence.

Per TP rank and step, for a tree of T nodes (T = 1: plain decoding, no drafter):
  verify_attn   layers x one tree_verify call (ctx prefix + T nodes), from the best evidence present:
                "measured"   committed GPU rows (bench/results/<device>/*.json, bench.verify payloads),
                             interpolated inside the measured (ctx, T) range only;
                "sass-model" bench.model.predict (the SASS-level model of the CUDA kernels);
                "roofline"   bench/core/roofline.py's floor max(bytes / bandwidth, FLOPs / MMA rate).
  target_dense  the target's weights and the MLP/MoE work for T rows: roofline (weights read once
                per step; a MoE touches E (1 - (1 - k/E)^T) experts for T independent tokens).
  drafter       the DFlash forward (weights, its context read, the LM head for B-1 rows): roofline.
  allreduce     2 per layer + 1 logit gather, each latency + bytes / bandwidth: "assumed" constants.
Launch gaps and host work are not modelled. Device numbers: bench/core/roofline.py's reference devices
(datasheet bandwidth and dense bf16 MMA rate); the all-reduce constants are assumptions, labelled.
"""
from __future__ import annotations

import glob
import json
import math
import os
from dataclasses import dataclass, field
from typing import Optional

from bench.core import roofline as rl

from ..loop.config import ModelConfig, get_model_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # integration/planning/..


@dataclass(frozen=True)
class DeviceCost:
    key: str                      # "h200" | "rtx-pro-6000" (bench.model's names)
    roof: rl.Device               # bandwidth and MMA rate
    allreduce_us: float           # latency of one small all-reduce over 8 GPUs (assumed)
    link_gbs: float               # per-GPU all-reduce bus bandwidth for larger payloads (assumed)
    link: str                     # what the two assumed numbers stand for


DEVICES: dict[str, DeviceCost] = {
    "h200": DeviceCost("h200", rl.H200, 10.0, 300.0,
                       "HGX H200 NVLink (assumed: ~10 us per small NCCL all-reduce over 8 GPUs, ~300 GB/s bus)"),
    "rtx-pro-6000": DeviceCost("rtx-pro-6000", rl.RTX_PRO_6000, 25.0, 40.0,
                               "8 GPUs over PCIe Gen5, no NVLink (assumed: ~25 us per small NCCL all-reduce, "
                               "~40 GB/s bus)"),
}


@dataclass(frozen=True)
class MoE:
    experts: int
    top_k: int
    shared: int
    expert_ffn: int
    expert_bytes: float           # bytes per expert weight (0.5: INT4)
    dense_layers: int = 0         # leading layers with a dense MLP instead
    dense_ffn: int = 0


@dataclass(frozen=True)
class TargetShape:
    """What one TP rank of the target and its drafter read per step."""

    name: str
    layers: int
    hidden: int
    heads: int                    # per rank
    q_lora: int
    kv_lora: int
    rope: int
    nope: int
    v_head: int
    vocab: int                    # total (the LM head is vocab-parallel)
    tp: int
    ffn: int                      # total dense MLP width (used when moe is None)
    moe: Optional[MoE] = None
    weight_bytes: float = 2.0     # bf16 attention / dense weights
    kv_bytes: int = 2             # bf16 KV
    drafter_layers: int = 6
    drafter_heads: int = 64
    drafter_kv_heads: int = 8
    drafter_head_dim: int = 128
    drafter_ffn: int = 8192
    drafter_block: int = 8
    drafter_window: int = 2048
    drafter_full_layers: int = 1
    drafter_taps: int = 6
    drafter_tp: int = 8           # the drafter sharded like the target (its KV heads replicated when fewer): the
                                  # convention of every per-rank count here and in integration/measure/traffic.py
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def head_shape(self):
        from verify_attn.shapes import custom_shape, get_shape
        if (self.heads, self.kv_lora + self.rope, self.kv_lora) == (8, 576, 512):
            return get_shape("kimi-k2-tp8")
        return custom_shape(self.heads, 1, self.kv_lora + self.rope, self.kv_lora)


KIMI_K2 = TargetShape(
    "kimi-k2", layers=61, hidden=7168, heads=8, q_lora=1536, kv_lora=512, rope=64, nope=128, v_head=128,
    vocab=163840, tp=8, ffn=0,
    moe=MoE(experts=384, top_k=8, shared=1, expert_ffn=2048, expert_bytes=0.5, dense_layers=1, dense_ffn=18432),
    notes=("Kimi K2 (moonshotai config): 61 layers, 384 experts top-8 + 1 shared of 2048, first layer dense 18432",
           "routed experts assumed INT4 (0.5 B/param, as Kimi K2 Thinking ships; 1T params must fit 8 x 96 GB), "
           "attention and shared weights bf16; tokens of a tree assumed to route independently",
           "drafter: Kimi-K2.5-DFlash's published shape as issue 29 quotes it (6 layers, 1 full, 64 q / 8 KV heads of "
           "128, window 2048, YaRN), MLP 8192 assumed (not published in what we read), sharded over the 8 ranks as "
           "a TP8 deployment runs it (SGLang shards the draft model like the target)"))


def shape_of(cfg: ModelConfig, tp: int = 8) -> TargetShape:
    """The loop's own synthetic model (dense MLP) as a cost shape, rank 0 of a `tp` split."""
    d = cfg.drafter
    return TargetShape(cfg.name, cfg.num_layers, cfg.hidden, cfg.heads_per_rank(tp), cfg.q_lora, cfg.kv_lora,
                       cfg.qk_rope, cfg.qk_nope, cfg.v_head, cfg.vocab, tp, cfg.ffn, None,
                       drafter_layers=d.num_layers, drafter_heads=d.num_heads, drafter_kv_heads=d.num_kv_heads,
                       drafter_head_dim=d.head_dim, drafter_ffn=d.ffn, drafter_block=d.block, drafter_window=d.window,
                       drafter_full_layers=len(d.full_layers), drafter_taps=len(d.target_layers), drafter_tp=tp,
                       notes=(f"the loop's synthetic {cfg.name}: dense MLP; the drafter counted sharded over the "
                              f"{tp} ranks, as a TP deployment runs it (the loop itself runs it whole on every rank)",))


def target_shape(name: str) -> TargetShape:
    return KIMI_K2 if name == "kimi-k2" else shape_of(get_model_config(name))


def roof_us(nbytes: float, flops: float, dev: DeviceCost) -> float:
    return max(nbytes / (dev.roof.mem_bw_gbs * 1e9), flops / (dev.roof.mma_tflops * 1e12)) * 1e6


# -- verify attention evidence ---------------------------------------------------------------------

@dataclass(frozen=True)
class AttnQuery:
    device: str
    backend: str
    layout: str
    page_size: int
    kv_dtype: str


class Measured:
    """Committed GPU rows: (ctx, tree_nodes) -> median us for one (device, backend, layout, dtype, shape)."""

    def __init__(self, rows: dict[tuple[int, int], float]) -> None:
        self.rows = rows
        self.ctxs = sorted({c for c, _ in rows})
        self.nodes = sorted({t for _, t in rows})

    @staticmethod
    def load(q: AttnQuery, shape_name: str, root: Optional[str] = None) -> "Measured":
        rows: dict[tuple[int, int], float] = {}
        for path in sorted(glob.glob(os.path.join(root or os.path.join(REPO, "bench", "results", q.device), "*.json"))):
            try:
                with open(path) as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                continue
            if doc.get("shape", {}).get("name") != shape_name or doc.get("dtype", "bf16") != q.kv_dtype:
                continue
            for r in doc.get("results", []):
                if (r.get("status") == "ok" and r.get("timed_on") == "cuda" and r.get("backend") == q.backend
                        and r.get("layout") == q.layout and r.get("page_size") == q.page_size
                        and r.get("median_us")):
                    rows[(int(r["ctx"]), int(r["tree_nodes"]))] = float(r["median_us"])
        return Measured(rows)

    def us(self, ctx: int, nodes: int) -> Optional[float]:
        """Bilinear interpolation on the measured grid; None outside it or where a corner is missing."""
        if not self.rows or not (self.ctxs[0] <= ctx <= self.ctxs[-1] and self.nodes[0] <= nodes <= self.nodes[-1]):
            return None

        def bracket(vals: list[int], x: int) -> tuple[int, int, float]:
            hi = next(v for v in vals if v >= x)
            lo = max(v for v in vals if v <= x)
            return lo, hi, 0.0 if hi == lo else (x - lo) / (hi - lo)

        c0, c1, fc = bracket(self.ctxs, ctx)
        t0, t1, ft = bracket(self.nodes, nodes)
        corners = [self.rows.get(k) for k in ((c0, t0), (c1, t0), (c0, t1), (c1, t1))]
        if any(v is None for v in corners):
            return None
        a = corners[0] * (1 - fc) + corners[1] * fc
        b = corners[2] * (1 - fc) + corners[3] * fc
        return a * (1 - ft) + b * ft


class AttnCost:
    """Per-call verify attention time with its evidence: measured, else SASS model, else roofline."""

    def __init__(self, shape: TargetShape, q: AttnQuery, evidence: str = "auto", results_root: Optional[str] = None):
        if evidence not in ("auto", "measured", "sass-model", "roofline"):
            raise ValueError(f"unknown evidence {evidence!r}; use auto | measured | sass-model | roofline")
        self.shape, self.q, self.evidence = shape, q, evidence
        self.measured = Measured.load(q, shape.head_shape.name, results_root) \
            if evidence in ("auto", "measured") else Measured({})
        self._sass_ok = evidence in ("auto", "sass-model")
        self.cache: dict[tuple[int, int], tuple[float, str]] = {}

    def __call__(self, ctx: int, nodes: int) -> tuple[float, str]:
        key = (ctx, nodes)
        if key not in self.cache:
            self.cache[key] = self._eval(ctx, nodes)
        return self.cache[key]

    def _eval(self, ctx: int, nodes: int) -> tuple[float, str]:
        m = self.measured.us(ctx, nodes)
        if m is not None:
            return m, "measured"
        if self._sass_ok:
            try:
                from bench.model import predict
                r = predict(self.q.device, ctx=ctx, tree_nodes=nodes, shape=self.shape.head_shape, layout=self.q.layout,
                            page_size=self.q.page_size, kv_dtype=self.q.kv_dtype)
                if r is not None:
                    return float(r["us"]), "sass-model"
            except (ImportError, LookupError, RuntimeError, ValueError, OSError):
                self._sass_ok = False          # no toolkit / kernels here: do not retry every call
        sh = self.shape.head_shape
        chain = list(range(-1, nodes - 1))
        c = rl.count_shape(sh, [ctx], [chain], elem_bytes=self.shape.kv_bytes, page_size=self.q.page_size)
        return rl.floor(c, DEVICES[self.q.device].roof).us, "roofline"


# -- the whole step ------------------------------------------------------------------------------------

class StepCost:
    """t_step(ctx, T) in microseconds per part, for one target shape on one device."""

    def __init__(self, shape: TargetShape, device: str, attn: AttnCost) -> None:
        if device not in DEVICES:
            raise ValueError(f"unknown device {device!r}; known: {', '.join(DEVICES)}")
        self.s, self.dev, self.attn = shape, DEVICES[device], attn

    def dense_us(self, t: int) -> float:
        s, wb = self.s, self.s.weight_bytes
        per_rank_heads = s.heads
        attn_proj = (s.hidden * s.q_lora + s.q_lora * per_rank_heads * (s.nope + s.rope)
                     + s.hidden * (s.kv_lora + s.rope) + s.kv_lora * per_rank_heads * (s.nope + s.v_head)
                     + per_rank_heads * s.v_head * s.hidden)                               # params per layer
        total_us = 0.0
        for layer in range(s.layers):
            nbytes = attn_proj * wb
            flops = 2 * attn_proj * t
            if s.moe is None or layer < s.moe.dense_layers:
                ffn = (s.moe.dense_ffn if s.moe else s.ffn) // s.tp
                nbytes += 3 * s.hidden * ffn * wb
                flops += 2 * 3 * s.hidden * ffn * t
            else:
                m = s.moe
                per_expert = 3 * s.hidden * m.expert_ffn / s.tp
                touched = m.experts * (1 - (1 - m.top_k / m.experts) ** t)
                nbytes += touched * per_expert * m.expert_bytes + m.shared * per_expert * wb
                flops += 2 * per_expert * (m.top_k + m.shared) * t
            total_us += roof_us(nbytes, flops, self.dev)
        head = s.vocab // s.tp * s.hidden
        return total_us + roof_us(head * wb, 2 * head * t, self.dev)

    def drafter_us(self, ctx: int) -> float:
        s, wb = self.s, self.s.weight_bytes
        dh = s.drafter_heads * s.drafter_head_dim
        dkv = s.drafter_kv_heads * s.drafter_head_dim
        per_layer = s.hidden * dh + 2 * s.hidden * dkv + dh * s.hidden + 3 * s.hidden * s.drafter_ffn
        params = (s.drafter_layers * per_layer + s.drafter_taps * s.hidden * s.hidden) / s.drafter_tp
        kv_heads_rank = max(1.0, s.drafter_kv_heads / s.drafter_tp)
        row = kv_heads_rank * s.drafter_head_dim * 2 * s.kv_bytes + 4                       # K, V, slot id
        rows = s.drafter_full_layers * (ctx + s.drafter_block) + \
            (s.drafter_layers - s.drafter_full_layers) * (min(ctx, s.drafter_window) + s.drafter_block)
        head = s.vocab // s.tp * s.hidden
        b = s.drafter_block
        nbytes = params * wb + rows * row + head * wb
        flops = 2 * (params + head) * b + 4 * s.drafter_heads / s.drafter_tp * s.drafter_head_dim * b * rows
        return roof_us(nbytes, flops, self.dev)

    def allreduce_us(self, t: int, drafter: bool) -> float:
        s = self.s
        n = 2 * s.layers + 1 + ((2 * s.drafter_layers + 1) if drafter and s.drafter_tp > 1 else 0)
        payload = t * s.hidden * 2
        return n * (self.dev.allreduce_us + payload / (self.dev.link_gbs * 1e9) * 1e6)

    def parts(self, ctx: int, nodes: int) -> tuple[dict[str, float], dict[str, str]]:
        """({part: us}, {part: evidence}) of one step verifying `nodes` tree nodes (1: plain decoding)."""
        a_us, a_src = self.attn(ctx, nodes)
        spec = nodes > 1
        us = {"verify_attn": self.s.layers * a_us, "target_dense": self.dense_us(nodes),
              "drafter": self.drafter_us(ctx) if spec else 0.0, "allreduce": self.allreduce_us(nodes, spec)}
        src = {"verify_attn": a_src, "target_dense": "roofline", "drafter": "roofline" if spec else "-",
               "allreduce": "assumed"}
        return us, src

    def step_us(self, ctx: int, nodes: int) -> float:
        return sum(self.parts(ctx, nodes)[0].values())


def make_cost(target: str | TargetShape, device: str, backend: str = "cuda", layout: str = "page1",
              page_size: int = 1, kv_dtype: str = "bf16", evidence: str = "auto",
              results_root: Optional[str] = None) -> StepCost:
    shape = target if isinstance(target, TargetShape) else target_shape(target)
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; known: {', '.join(DEVICES)}")
    q = AttnQuery(device, backend, layout, page_size if layout != "page1" else 1, kv_dtype)
    return StepCost(shape, device, AttnCost(shape, q, evidence, results_root))


def ctx_bucket(ctx: int) -> int:
    """Context rounded to 1/8 of a power of two (the loop re-plans when the bucket changes)."""
    if ctx < 64:
        return max(1, ctx)
    e = 2 ** int(math.log2(ctx))
    return int(round(ctx / (e / 8)) * (e / 8))
