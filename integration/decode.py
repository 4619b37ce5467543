"""python -m integration.decode: prefill a synthetic prompt, then speculative decoding (DFlash + DDTree).

    python -m integration.decode --tp 8 --model tiny --ctx 2k --steps 8 --check

--check also decodes plain greedily (a tree of one node per token) and exits 1,
printing the first diverging position, unless the speculative tokens are
identical. --tp N spawns N ranks (gloo on CPU, NCCL on GPUs); --simulate-rank
runs rank 0's shard of a TP-8 split alone (collectives skipped: timing only).
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from typing import Optional

import torch

from verify_attn.utils import parse_tokens, usage_error

from .config import ModelConfig, get_model_config
from .drafter import DFlashDrafter
from .model import MLATarget
from .spec import Engine, StepMetrics, first_divergence, greedy_decode, speculative_decode
from .tp import TPGroup, launch

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def add_common_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="tiny", help="model preset: tiny | kimi-k2-tp8")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (spawned processes)")
    ap.add_argument("--simulate-rank", action="store_true",
                    help="run only rank 0's shard of a TP-8 split on one device (all-reduce skipped)")
    ap.add_argument("--layout", choices=("page1", "paged"), default="page1")
    ap.add_argument("--page-size", type=int, default=16, help="page size for --layout paged")
    ap.add_argument("--tree", choices=("ddtree", "chain"), default="ddtree")
    ap.add_argument("--tree-budget", type=int, default=16, help="draft nodes per tree (ddtree)")
    ap.add_argument("--device", default=None, help="cpu | cuda (default: cuda if available)")
    ap.add_argument("--dtype", default=None, help="float32 | float16 | bfloat16 (default: fp32 on CPU, bf16 on CUDA)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=None,
                    help="override the preset's layer count (quick checks; drafter taps spread over the layers)")


def cli_value(parse, text: str, flag: str):
    """parse(text), or exit 2 with a one-line usage error naming the flag (no traceback)."""
    try:
        return parse(text)
    except ValueError as e:
        raise usage_error(f"error: {flag}: {e}") from None


def positive_tokens(text: str, flag: str) -> int:
    """A token count >= 1 (a context of 0 tokens has no last token to decode from), or exit 2."""
    n = cli_value(parse_tokens, text, flag)
    if n < 1:
        raise usage_error(f"error: {flag} must be >= 1 token, got {text!r}")
    return n


def check_backends(names: list[str]) -> list[str]:
    """Exit with the list of known backends when a name is unknown (before any rank spawns)."""
    import verify_attn

    known = verify_attn.known_backends()
    bad = [n for n in names if n != "auto" and n not in known]
    if bad:
        raise usage_error(f"error: --attn-backend: unknown {', '.join(bad)}; known: auto, {', '.join(known)}")
    return names


def resolve(args) -> dict:
    """Plain, picklable settings from parsed args (shipped to spawned ranks)."""
    cfg = cli_value(get_model_config, args.model, "--model")
    if args.tp < 1:
        raise usage_error("error: --tp must be >= 1")
    for what, n in (("attention heads", cfg.num_heads), ("MLP width", cfg.ffn), ("vocab", cfg.vocab)):
        if n % args.tp:   # the dims tensor parallelism splits (integration/model.py)
            raise usage_error(f"error: --tp {args.tp} does not divide the {what} of model {args.model} ({n})")
    if getattr(args, "steps", 1) < 1:
        raise usage_error("error: --steps must be >= 1")
    if args.layout == "paged" and not 1 <= args.page_size <= 128:
        raise usage_error("error: --page-size must be in 1..128")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    if dtype not in _DTYPES:
        raise usage_error(f"error: --dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    if args.simulate_rank and args.tp != 1:
        raise usage_error("error: --simulate-rank runs one process: leave --tp at 1")
    if args.tree_budget < 1:
        raise usage_error("error: --tree-budget must be >= 1")
    if args.layers is not None and args.layers < 1:
        raise usage_error("error: --layers must be >= 1")
    return dict(model=args.model, layers=args.layers, device=device, dtype=dtype,
                page_size=1 if args.layout == "page1" else args.page_size, tree=args.tree, budget=args.tree_budget,
                seed=args.seed, simulate=args.simulate_rank)


def synthetic_prompt(length: int, vocab: int, seed: int) -> torch.Tensor:
    """A seeded random prompt [length] (never the MASK token, the last id)."""
    return torch.randint(0, vocab - 1, (length,), generator=torch.Generator().manual_seed(7 + seed))


def model_config(s: dict) -> ModelConfig:
    """The preset, with --layers applied (the drafter's target taps spread evenly over the new depth)."""
    cfg = get_model_config(s["model"], seed=s["seed"])
    n = s.get("layers")
    if n is None or n == cfg.num_layers:
        return cfg
    k = len(cfg.drafter.target_layers)
    taps = tuple(sorted({round(i * (n - 1) / max(1, k - 1)) for i in range(k)}))
    return replace(cfg, num_layers=n, drafter=replace(cfg.drafter, target_layers=taps))


def build(tp: TPGroup, s: dict, backend: str, capacity: int):
    cfg = model_config(s)
    if s["simulate"]:
        tp = TPGroup(0, 8, simulate=True)
    if s["device"] == "cuda" and tp.real:   # one GPU per rank (NCCL); fewer GPUs than ranks share them (gloo)
        dev = torch.device("cuda", tp.rank % torch.cuda.device_count())
    else:
        dev = torch.device(s["device"])
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    target = MLATarget(cfg, tp, dtype=_DTYPES[s["dtype"]], device=dev)
    drafter = DFlashDrafter(target)
    engine = Engine(target, backend=backend, page_size=s["page_size"], capacity=capacity, seed=s["seed"])
    return target, drafter, engine


def capacity_for(ctx: int, steps: int, budget: int, block: int, page_size: int) -> int:
    return ctx + (steps + 2) * (max(budget, block) + 2) + 2 * page_size


def run_rank(tp: TPGroup, s: dict, backend: str, ctx: int, steps: int, check: bool, verbose: bool) -> dict:
    """One rank's whole run (rank 0's dict is the result)."""
    torch.manual_seed(s["seed"])
    cfg = model_config(s)
    cap = capacity_for(ctx, steps, s["budget"], cfg.drafter.block, s["page_size"])
    target, drafter, engine = build(tp, s, backend, cap)
    prompt = synthetic_prompt(ctx, cfg.vocab, s["seed"])
    say = (lambda *a: print(*a, flush=True)) if (verbose and tp.rank == 0) else (lambda *a: None)

    def show(m: StepMetrics) -> None:
        parts = " ".join(f"{k}={v * 1e3:.1f}" for k, v in sorted(m.parts.items()))
        say(f"step {m.step:3d}  tree {m.tree_size:3d}  accepted_drafts {m.accepted_drafts}  "
            f"commit_len {m.commit_len}  {m.step_s * 1e3:8.1f} ms  [{parts}]")

    tokens, metrics = speculative_decode(engine, drafter, prompt, steps, tree_kind=s["tree"], budget=s["budget"],
                                         check_cache=True, on_step=show)
    res = {"tokens": tokens, "commit_lens": [m.commit_len for m in metrics],
           "step_s": [m.step_s for m in metrics], "divergence": None, "checked": False}
    if check:
        ref = greedy_decode(engine, prompt, len(tokens))
        res["checked"] = True
        res["divergence"] = first_divergence(tokens, ref)
        res["greedy"] = ref
    return res


def run_many(tp: TPGroup, jobs: list[tuple]) -> list[dict]:
    """Several run_rank jobs (s, backend, ctx, steps, check) in one process group (one spawn for all)."""
    return [run_rank(tp, s, backend, ctx, steps, check, False) for s, backend, ctx, steps, check in jobs]


def summarize(res: dict, tp_desc: str) -> str:
    cl = res["commit_lens"]
    hist: dict[int, int] = {}
    for c in cl:
        hist[c] = hist.get(c, 0) + 1
    total_s = sum(res["step_s"])
    new_tokens = sum(cl)
    lines = [f"summary ({tp_desc}): {len(cl)} steps, mean commit_len {new_tokens / max(1, len(cl)):.2f}, "
             f"histogram {dict(sorted(hist.items()))}, {new_tokens} tokens in {total_s:.3f} s = "
             f"{new_tokens / max(total_s, 1e-9):.1f} tok/s"]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m integration.decode", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap)
    ap.add_argument("--ctx", default="2k", help="prompt length (k = 1,000 tokens)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--attn-backend", default=None, help="verify_attn backend (default: reference on CPU, auto on GPU)")
    ap.add_argument("--check", action="store_true", help="compare with plain greedy decoding; exit 1 on divergence")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():  # Triton backends run on CPU tensors only under the interpreter
        os.environ.setdefault("TRITON_INTERPRET", "1")
    s = resolve(args)
    backend = check_backends([args.attn_backend or ("auto" if s["device"].startswith("cuda") else "reference")])[0]
    ctx = positive_tokens(args.ctx, "--ctx")
    if s["device"] == "cpu":
        torch.set_num_threads(1)  # tiny matmuls: extra threads only contend (and ranks share the cores)
    desc = "simulated rank 0 of TP 8, all-reduce skipped" if s["simulate"] else f"TP {args.tp}"
    extra = ("" if s["page_size"] == 1 else f" page_size {s['page_size']}") + \
        (f" budget {s['budget']}" if s["tree"] == "ddtree" else "")
    print(f"model {s['model']}  {desc}  ctx {ctx}  layout {args.layout}  tree {s['tree']}{extra}  "
          f"attn {backend}  {s['device']} {s['dtype']}", flush=True)
    res = launch(args.tp, run_rank, s, backend, ctx, args.steps, args.check, True)
    print(summarize(res, desc))
    if res["checked"]:
        if res["divergence"] is not None:
            i = res["divergence"]
            print(f"CHECK FAILED: speculative output diverges from greedy at generated position {i}: "
                  f"spec {res['tokens'][i:i + 8]} vs greedy {res['greedy'][i:i + 8]}")
            return 1
        print(f"check OK: {len(res['tokens'])} speculative tokens identical to plain greedy decoding")
    return 0


if __name__ == "__main__":
    sys.exit(main())
