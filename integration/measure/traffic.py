"""python -m integration.traffic: bytes each part of a decode step moves, and how they grow with context.

Runs the real loop (integration.loop.spec) on the CPU, rank 0's shard of a TP-8 split
(--simulate-rank), and counts, per step part (draft, draft_swa, tree, verify_attn,
target_rest, accept_commit, allreduce), the bytes every tensor operation touches:

- attention (every tree_verify call, the target's and the drafter's): the compulsory bytes of
  the call, counted by bench/core/roofline.py's `count_call` (the helper the benchmark uses): each
  KV row once, q, out, indices, mask;
- gathers and scatters (index, index_put, embedding, index_fill): the rows they select, not the
  whole tensor they index;
- views: nothing; every other op: its tensor inputs and outputs;
- collectives: a ring's send + receive bytes per rank, counted although --simulate-rank skips them.
Floating-point values are counted at 2 bytes (the bf16 a GPU run uses); the CPU run is fp32.
Every step commits the same 4 tokens (the deepest path's first nodes, as --simulate-accept-len),
so the per-step bytes at two contexts differ only because of the context.

The model keeps the preset's per-rank attention shapes (for kimi-k2-tp8: 8 heads, 576-wide
latent rows; the DFlash drafter's 64 query / 8 KV heads of 128, window 2048, 6 layers) and
shrinks what does not change the growth with context (hidden, vocab, MLP, target depth);
the verify-attention growth is scaled to the preset's depth (61 layers). Growth per 1k tokens
is the least-squares slope over --ctx (all above the drafter's window, so its sliding layers
are saturated); per-step bytes are linear in context, so the slope holds at 185k.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from verify_attn.backends import Backend, get_backend, register
from verify_attn.utils import parse_ctx, usage_error

from .bench_e2e import PARTS, slope_per_1k
from ..loop.config import ModelConfig, get_model_config
from ..planning.costmodel import TargetShape

DRAFTER_TP = TargetShape.__dataclass_fields__["drafter_tp"].default   # 8: the deployment's convention
from ..loop.drafter import DFlashDrafter
from ..loop.model import MLATarget
from ..loop.spec import Engine, speculative_decode
from ..loop.texts import repeated_prompt
from ..loop.timing import StepTimer
from ..loop.tp import TPGroup

VALUE_BYTES = 2                      # floats counted as bf16
FORCED_COMMIT = 4                    # tokens committed per step (--simulate-accept-len), the same at every context
_VIEWS = {"view", "_unsafe_view", "reshape", "alias", "slice", "select", "expand", "t", "transpose", "permute",
          "unsqueeze", "squeeze", "as_strided", "detach", "unbind", "split", "split_with_sizes", "chunk",
          "narrow", "lift_fresh", "_reshape_alias", "view_as_real", "view_as_complex", "diagonal"}
_GATHERS = {"index", "embedding", "index_select", "gather"}
_SCATTERS = {"index_put", "index_put_", "_index_put_impl_", "index_copy", "index_copy_", "scatter", "scatter_"}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * (VALUE_BYTES if t.is_floating_point() else t.element_size())


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _tensors(y)]
    if isinstance(x, dict):
        return [t for y in x.values() for t in _tensors(y)]
    return []


class ByteCounter(TorchDispatchMode):
    """Adds each op's bytes to the part the timer has open (only while `on`)."""

    def __init__(self, timer: StepTimer) -> None:
        super().__init__()
        self.timer, self.on, self.paused = timer, False, 0
        self.bytes: dict[str, float] = {}

    def add(self, part: Optional[str], n: float) -> None:
        if self.on and not self.paused and part is not None:
            self.bytes[part] = self.bytes.get(part, 0.0) + n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.on and not self.paused:
            name = func.overloadpacket.__name__
            if name in _VIEWS:
                n = 0
            elif name in _GATHERS:
                n = 2 * sum(_nbytes(t) for t in _tensors(out)) + sum(_nbytes(t) for t in _tensors(args[1:]))
            elif name in ("index_fill", "index_fill_"):          # (self, dim, index, value): the filled rows
                self_t, dim, idx = args[0], args[1], args[2]
                n = idx.numel() * _nbytes(self_t) / max(1, self_t.shape[dim]) + _nbytes(idx)
            elif name in _SCATTERS:                              # the values written and the indices
                n = 2 * sum(_nbytes(t) for t in _tensors(args[2:])) + sum(_nbytes(t) for t in _tensors(args[1:2]))
            else:
                n = sum(_nbytes(t) for t in _tensors(args)) + sum(_nbytes(t) for t in _tensors(out))
            self.add(self.timer.current_part(), n)
        return out


def counting_backend(counter: ByteCounter, inner: str = "reference") -> str:
    """A backend that runs `inner` with the counter paused and adds the call's compulsory bytes."""
    from bench.core import roofline as rl
    name = f"count-{inner}"

    def run(p, config, out, lse) -> None:
        lens = p.kv_lens.tolist()
        qo = p.qo_indptr.tolist()
        trees = [list(range(-1, qo[b + 1] - qo[b] - 1)) for b in range(p.batch)]   # bytes ignore the tree's shape
        c = rl.count_call(num_q_heads=p.num_q_heads, num_kv_heads=p.num_kv_heads, head_dim_qk=p.head_dim_qk,
                          head_dim_v=p.head_dim_v, mla=p.mla_shared_kv,
                          prefix_lens=[n - len(t) for n, t in zip(lens, trees)], trees=trees,
                          elem_bytes=VALUE_BYTES, page_size=p.page_size, mask_words=p.mask_words)
        counter.add(counter.timer.current_part(), c.total_bytes)
        counter.paused += 1
        try:
            get_backend(inner).run(p, config, out, lse)
        finally:
            counter.paused -= 1
    register(Backend(name, run))
    return name


def analysis_config(model: str, layers: int, window: Optional[int] = None) -> ModelConfig:
    """The preset with its per-rank attention and drafter attention shapes, the rest shrunk for a CPU
    (window: override the drafter's sliding window, for quick tests)."""
    base = get_model_config(model)
    d = base.drafter
    return replace(base, num_layers=layers, hidden=1024, vocab=4096, q_lora=256, ffn=8 * 256,
                   drafter=replace(d, ffn=1024, target_layers=tuple(range(min(layers, len(d.target_layers)))),
                                   calib_tokens=512, window=window or d.window))


def measure(model: str, ctxs: list[int], steps: int, layers: int = 2, seed: int = 0, window: Optional[int] = None,
            drafter_cls=DFlashDrafter) -> dict:
    """Bytes per step per part at each context, and their growth per 1k tokens (see the module doc).
    drafter_cls: the drafter class (tests pass a deliberately O(L) one to see the count catch it)."""
    cfg = analysis_config(model, layers, window)
    target = MLATarget(cfg, TPGroup(0, 8, simulate=True), dtype=torch.float32, device=torch.device("cpu"))
    cap = max(ctxs) + (steps + 2) * 40
    timer = StepTimer(target.device)
    counter = ByteCounter(timer)
    backend = counting_backend(counter)
    drafter = drafter_cls(target, capacity=cap, backend=backend)
    target.tp.traffic = counter.add
    rows = []
    for ctx in ctxs:
        text = repeated_prompt(ctx, target.succ, cfg.vocab, seed)
        engine = Engine(target, backend=backend, page_size=1, capacity=cap, seed=seed)
        counter.bytes = {}

        def on_step(m, _c=counter) -> None:
            if not _c.on:         # count from the end of step 0 on: the prefill (and a warm-up step) stay out
                _c.on = True
                _c.__enter__()

        counter.on = False
        try:
            # every step commits the same 4 tokens (forced), so per-step bytes differ only by context
            _, metrics = speculative_decode(engine, drafter, text.prompt, steps + 1, tree_kind="ddtree", budget=16,
                                            timer=timer, on_step=on_step, simulate_accept_len=FORCED_COMMIT)
        finally:
            if counter.on:
                counter.__exit__(None, None, None)
                counter.on = False
        per_step = {p: counter.bytes.get(p, 0.0) / steps for p in PARTS}
        rows.append({"ctx": ctx, "bytes_per_step": per_step,
                     "tokens_per_step": sum(m.commit_len for m in metrics[1:]) / steps})
    target.tp.traffic = None
    growth = {p: slope_per_1k([r["ctx"] for r in rows], [r["bytes_per_step"][p] for r in rows]) for p in PARTS}
    full = get_model_config(model)
    scale = full.num_layers / cfg.num_layers
    verify_full = (growth["verify_attn"] or 0.0) * scale
    draft_whole = (growth["draft"] or 0.0) + (growth["draft_swa"] or 0.0)
    # one sharding convention (integration/planning/costmodel.py TargetShape.drafter_tp): a TP deployment shards the
    # drafter's heads over the ranks like the target's, so a rank reads its share of the drafter's KV; the loop
    # runs the whole drafter on every rank, so its measured bytes are divided (KV heads replicated when fewer)
    kv = cfg.drafter.num_kv_heads
    per_rank = max(1.0, kv / DRAFTER_TP) / kv
    draft = draft_whole * per_rank
    return {"model": model, "analysed_layers": cfg.num_layers, "preset_layers": full.num_layers, "ctxs": ctxs,
            "steps": steps, "rows": rows, "growth_bytes_per_1k": growth, "verify_attn_growth_full_depth": verify_full,
            "drafter_growth_whole": draft_whole, "drafter_growth": draft, "drafter_tp": DRAFTER_TP,
            "drafter_share_of_verify_growth": draft / verify_full if verify_full else None}


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m integration.traffic", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="kimi-k2-tp8", help="preset whose per-rank shapes are analysed")
    ap.add_argument("--simulate-rank", action="store_true", default=True,
                    help="rank 0's shard of a TP-8 split (the only mode: kept for the command's readability)")
    ap.add_argument("--ctx", default="2.5k,4k,6k", help="contexts for the growth fit (above the drafter window)")
    ap.add_argument("--steps", type=int, default=3, help="counted steps per context (after one warm-up step)")
    ap.add_argument("--layers", type=int, default=2, help="target layers actually run (growth scaled to the preset)")
    ap.add_argument("--json", default=None, help="write the result as JSON")
    from verify_attn.utils import dash_values
    args = dash_values(ap).parse_args(argv)
    try:
        cfg = get_model_config(args.model)
        ctxs = parse_ctx(args.ctx)
    except ValueError as e:
        raise usage_error(f"error: {'--ctx' if 'context' in str(e) or 'token' in str(e) else '--model'}: {e}") from None
    if len(ctxs) < 2:
        raise usage_error("error: --ctx needs at least two contexts for a growth fit")
    if min(ctxs) <= cfg.drafter.window + cfg.drafter.block:
        raise usage_error(f"error: --ctx: every context must exceed the drafter window ({cfg.drafter.window}) so "
                          "its sliding layers are saturated")
    if args.steps < 1 or args.layers < 1:
        raise usage_error("error: --steps and --layers must be >= 1")
    torch.set_num_threads(1)
    res = measure(args.model, ctxs, args.steps, args.layers)
    print(f"bytes per decode step, rank 0 of TP 8 (simulated), model {args.model}: attention shapes as the preset, "
          f"{res['analysed_layers']} of {res['preset_layers']} target layers run; floats counted at {VALUE_BYTES} B")
    print(f"{'part':>14s}" + "".join(f"{'ctx ' + str(r['ctx']):>14s}" for r in res["rows"]) + f"{'growth/1k':>14s}")
    for p in PARTS:
        g = res["growth_bytes_per_1k"][p]
        print(f"{p:>14s}" + "".join(f"{r['bytes_per_step'][p] / 1e6:12.3f}MB" for r in res["rows"])
              + f"{(g or 0) / 1e3:12.1f}kB")
    v, dr = res["verify_attn_growth_full_depth"], res["drafter_growth"]
    share = res["drafter_share_of_verify_growth"]
    print(f"verify attention growth at {res['preset_layers']} layers: {v / 1e6:.2f} MB per extra 1k tokens; drafter "
          f"(draft + draft_swa) per rank, sharded over {res['drafter_tp']} ranks as a TP deployment runs it: "
          f"{dr / 1e6:.3f} MB per 1k = {100 * share:.2f}% of it (the whole drafter, as the loop runs it on every "
          f"rank: {res['drafter_growth_whole'] / 1e6:.3f} MB)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
