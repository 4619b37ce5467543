"""python -m integration.decode: prefill a synthetic prompt, then speculative decoding (DFlash + DDTree).

    python -m integration.decode --tp 8 --model tiny --ctx 2k --steps 8 --check
    python -m integration.decode --tp 8 --model tiny --ctx 2k --steps 8 --budget auto --check

--check decodes plain greedily on the float64 `reference` backend (a tree of one node per
token) and exits 1 at the first position where the speculative tokens differ; every step's
commit must equal the longest greedy-accepted root-to-leaf path of its tree, counted
independently of the accept walk (integration/loop/accept.py longest_accepted); it also
compares every verify's logits with the reference's (the probe's criterion) and exits 1
when one differs by more than --logit-tol. With --temperature > 0 only the logit criterion
applies (sampled tokens have no greedy counterpart).
--tp N spawns N ranks (gloo on CPU, NCCL on GPUs); --simulate-rank runs rank 0's shard of
a TP-8 split alone (collectives skipped: timing only).
--text repeat (default) plants a passage early in the prompt and its start at the end, so a
drafter that reads its context can copy the continuation; --text random has nothing to copy.
--budget auto picks the tree budget per step from the cost model and the acceptance the
drafter predicts, corrected by what it observes (integration/planning/budget.py).
--alloc sets the KV slot allocator: shuffled (default), contiguous (a sorted free list, as a
serving engine hands a long request), fragmented (shuffled runs of consecutive slots).
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from typing import Optional

import torch

from verify_attn.utils import parse_tokens, usage_error

from ..loop.config import ModelConfig, get_model_config
from ..loop.drafter import DFlashDrafter
from ..loop.kv import ALLOC_MODES
from ..loop.metrics import StepMetrics
from ..loop.model import MLATarget
from ..loop.accept import AcceptMismatch
from ..loop.spec import Engine, first_divergence, greedy_decode, speculative_decode
from ..loop.texts import TEXTS, make_prompt, random_prompt
from ..loop.tp import TPGroup, launch

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}

# Per-verify logit criterion (--check, the probe): max |logits - float64-reference logits|. On tiny,
# interpreted fp32 Triton stays within 1e-5; dropping 16 middle prefix rows at 2.5k moves the logits
# by 1.1e-1, 64 tail rows by 1.6 (tests/test_integration_probe.py). 16-bit caches round every row and
# output, so the bound there is looser (not yet measured on a GPU) and catches only larger errors.
LOGIT_TOL = {torch.float32: 1e-3, torch.float16: 5e-2, torch.bfloat16: 5e-2}


def add_common_args(ap: argparse.ArgumentParser) -> None:
    from ..loop.config import PRESETS
    ap.add_argument("--model", default="tiny", help=f"model preset: {' | '.join(PRESETS)}")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (spawned processes)")
    ap.add_argument("--simulate-rank", action="store_true",
                    help="run only rank 0's shard of a TP-8 split on one device (all-reduce skipped)")
    ap.add_argument("--layout", choices=("page1", "paged"), default="page1")
    ap.add_argument("--page-size", type=int, default=16, help="page size for --layout paged")
    ap.add_argument("--tree", choices=("ddtree", "chain"), default="ddtree")
    ap.add_argument("--tree-budget", type=int, default=16, help="draft nodes per tree (ddtree)")
    ap.add_argument("--budget", default=None,
                    help="auto | N: auto picks the draft-node budget per step (integration/planning/budget.py); "
                         "N is the same as --tree-budget N")
    ap.add_argument("--budget-device", default=None,
                    help="cost model of --budget auto: h200 | rtx-pro-6000 (default: the GPU here, else rtx-pro-6000)")
    ap.add_argument("--profile", default=None,
                    help="acceptance profile JSON for --budget auto (integration/profiles/); default: the "
                         "drafter's own probabilities, corrected online")
    ap.add_argument("--alloc", choices=ALLOC_MODES, default="shuffled",
                    help="KV slot allocator: shuffled | contiguous (sorted free list) | fragmented")
    ap.add_argument("--text", choices=TEXTS, default="repeat",
                    help="prompt: repeat (a passage seen before, copyable) | random")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="0: greedy; > 0: target-only tree sampling (the output follows the target's distribution)")
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
        if n % args.tp:   # the dims tensor parallelism splits (integration/loop/model.py)
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
    budget: object = args.tree_budget
    if args.budget is not None:
        if args.budget == "auto":
            budget = "auto"
        else:
            try:
                budget = int(args.budget)
            except ValueError:
                raise usage_error(f"error: --budget: expected auto or a node count, got {args.budget!r}") from None
            if budget < 1:
                raise usage_error("error: --budget must be auto or >= 1")
    if budget == "auto" and args.tree != "ddtree":
        raise usage_error("error: --budget auto needs --tree ddtree")
    if not args.temperature >= 0 or args.temperature != args.temperature:
        raise usage_error(f"error: --temperature must be >= 0, got {args.temperature}")
    budget_device = args.budget_device
    if budget == "auto":
        from ..planning.budget import DEVICES, load_profile
        budget_device = budget_device or _here_device() or "rtx-pro-6000"
        if budget_device not in DEVICES:
            raise usage_error(f"error: --budget-device: unknown {budget_device!r}; known: {', '.join(DEVICES)}")
        if args.profile is not None:
            try:
                load_profile(args.profile)
            except (OSError, ValueError) as e:
                raise usage_error(f"error: --profile: {e}") from None
    if args.layers is not None and args.layers < 1:
        raise usage_error("error: --layers must be >= 1")
    return dict(model=args.model, layers=args.layers, device=device, dtype=dtype,
                page_size=1 if args.layout == "page1" else args.page_size, tree=args.tree, budget=budget,
                seed=args.seed, simulate=args.simulate_rank, alloc=args.alloc, text=args.text,
                temperature=float(args.temperature), budget_device=budget_device, profile=args.profile)


def _here_device() -> Optional[str]:
    """The cost-model device name of the GPU at hand (h200 | rtx-pro-6000), or None."""
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name().lower()
    return "h200" if "h200" in name else ("rtx-pro-6000" if "rtx pro 6000" in name else None)


def synthetic_prompt(length: int, vocab: int, seed: int) -> torch.Tensor:
    """A seeded random prompt [length] (never the MASK token, the last id)."""
    return random_prompt(length, vocab, seed)


def prompt_for(s: dict, target: MLATarget, ctx: int) -> torch.Tensor:
    """The run's prompt [ctx]: --text repeat (a copyable passage) or random."""
    return make_prompt(s.get("text", "random"), ctx, target.succ, target.cfg.vocab, s["seed"]).prompt


def budget_of(s: dict) -> int:
    """The largest draft-node budget a run may use (capacity planning)."""
    if s["budget"] == "auto":
        from ..planning.budget import MAX_AUTO_BUDGET
        return MAX_AUTO_BUDGET
    return int(s["budget"])


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
    drafter = DFlashDrafter(target, capacity=capacity)
    engine = Engine(target, backend=backend, page_size=s["page_size"], capacity=capacity, seed=s["seed"],
                    alloc=s.get("alloc", "shuffled"))
    return target, drafter, engine


def capacity_for(ctx: int, steps: int, budget: int, block: int, page_size: int) -> int:
    return ctx + (steps + 2) * (max(budget, block) + 2) + 2 * page_size


def rank_bytes(cfg: ModelConfig, s: dict, tp: int, capacity: int, check: bool) -> int:
    """An upper estimate of one rank's peak bytes: its weight shard (the embedding whole, the head's vocab shard,
    per layer the MLA projections and the MLP's shard), the latent KV cache (a second one for --check's reference
    engine), the drafter's weights and caches, in the run's dtype; plus the embedding once in fp32 (weights are
    drawn in fp32, then cast)."""
    elem = _DTYPES[s["dtype"]].itemsize
    tp = 8 if s["simulate"] else tp
    h, d, c = cfg.num_heads // tp, cfg.hidden, cfg
    layer = (d * c.q_lora + c.q_lora * h * (c.qk_nope + c.qk_rope) + d * c.cache_dim + h * c.qk_nope * c.kv_lora
             + h * c.kv_lora * c.v_head + h * c.v_head * d + 3 * d * c.ffn // tp)
    weights = c.vocab * d + c.vocab // tp * d + c.num_layers * layer
    kv = c.num_layers * (capacity + 2 * s["page_size"]) * c.cache_dim * (2 if check else 1)
    dr = c.drafter
    drafter = dr.num_layers * (d * (dr.num_heads + 2 * dr.num_kv_heads) * dr.head_dim + dr.num_heads * dr.head_dim * d
                               + 3 * d * dr.ffn + (capacity + dr.block) * dr.num_kv_heads * dr.head_dim * 2)
    return (weights + kv + drafter) * elem + 4 * c.vocab * d


def check_fits(s: dict, tp: int, ctx: int, steps: int, check: bool, what: str) -> None:
    """Refuse, before any rank starts, a run whose ranks cannot fit the memory they allocate on (bench.core.memory:
    the host's for CPU ranks, which share it; a GPU's for its share of the ranks): one line with the figure."""
    from bench.core.memory import available_bytes, fit_error
    cfg = model_config(s)
    need = rank_bytes(cfg, s, tp, capacity_for(ctx, steps, budget_of(s), cfg.drafter.block, s["page_size"]), check)
    ranks, device = (1 if s["simulate"] else tp), ("cuda" if s["device"].startswith("cuda") else None)
    if device:
        ranks = -(-ranks // max(1, torch.cuda.device_count()))   # ranks beyond the GPUs share them
    why = fit_error(what, ranks * need, available_bytes(device), device,
                    f"weights, KV cache and drafter: {need / 1e9:,.2f} GB per rank x {ranks}",
                    "lower --ctx or --layers" + ("" if s["simulate"] else ", or run one rank's shard with --simulate-rank"))
    if why:
        raise usage_error(f"error: {why}")


def run_rank(tp: TPGroup, s: dict, backend: str, ctx: int, steps: int, check: bool, verbose: bool) -> dict:
    """One rank's whole run (rank 0's dict is the result)."""
    torch.manual_seed(s["seed"])
    cfg = model_config(s)
    cap = capacity_for(ctx, steps, budget_of(s), cfg.drafter.block, s["page_size"])
    target, drafter, engine = build(tp, s, backend, cap)
    prompt = prompt_for(s, target, ctx)
    say = (lambda *a: print(*a, flush=True)) if (verbose and tp.rank == 0) else (lambda *a: None)
    budget: object = s["budget"]
    if budget == "auto":
        from ..planning.budget import auto_budget_for
        budget = auto_budget_for(cfg, s, backend)
    if check:
        engine.check_backend = "reference"

    def show(m: StepMetrics) -> None:
        parts = " ".join(f"{k}={v * 1e3:.1f}" for k, v in sorted(m.parts.items()))
        err = "" if m.logit_err is None else f"  logit err {m.logit_err:.1e}"
        say(f"step {m.step:3d}  budget {m.budget:3d}  tree {m.tree_size:3d}  accepted_drafts {m.accepted_drafts}  "
            f"commit_len {m.commit_len}  {m.step_s * 1e3:8.1f} ms{err}  [{parts}]")

    try:
        tokens, metrics = speculative_decode(engine, drafter, prompt, steps, tree_kind=s["tree"], budget=budget,
                                             temperature=s.get("temperature", 0.0), seed=s["seed"],
                                             check_cache=True, check_accept=check, on_step=show)
    except AcceptMismatch as e:   # --check's independent accept count disagreed: reported, not a traceback
        return {"tokens": [], "commit_lens": [], "budgets": [], "step_s": [], "divergence": None, "checked": True,
                "logit_errs": [], "logit_tol": LOGIT_TOL[target.dtype], "accept_error": str(e)}
    res = {"tokens": tokens, "commit_lens": [m.commit_len for m in metrics], "budgets": [m.budget for m in metrics],
           "step_s": [m.step_s for m in metrics], "divergence": None, "checked": False,
           "logit_errs": [m.logit_err for m in metrics], "logit_tol": s.get("logit_tol") or LOGIT_TOL[target.dtype],
           "budget_notes": getattr(budget, "notes", None)}
    if check:
        res["checked"] = True
        if s.get("temperature", 0.0) <= 0:
            ref_engine = Engine(target, backend="reference", page_size=s["page_size"], capacity=cap, seed=s["seed"],
                                alloc=s.get("alloc", "shuffled"))
            ref_logits: list = []
            ref = greedy_decode(ref_engine, prompt, len(tokens), logits=ref_logits)
            res["divergence"] = i = first_divergence(tokens, ref)
            res["greedy"] = ref
            if i is not None and i >= 1:          # ref[i] came from step i-1's logits
                top2 = ref_logits[i - 1].float().topk(2).values
                res["divergence_gap"] = float(top2[0] - top2[1])
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
             f"{new_tokens / max(total_s, 1e-9):.1f} tok/s, budgets {sorted(set(res['budgets']))}"]
    if res.get("budget_notes"):
        lines.append(f"budget auto: {res['budget_notes']}")
    return "\n".join(lines)


def check_verdict(res: dict) -> tuple[bool, str]:
    """(ok, message) of --check: every step's commit against the independent accept count, exact tokens against
    reference greedy, and the per-verify logit bound."""
    if res.get("accept_error"):
        return False, f"CHECK FAILED: {res['accept_error']}"
    errs = [e for e in res["logit_errs"] if e is not None]
    worst = max(errs) if errs else None
    near_tie = ""
    if res["divergence"] is not None:
        i, gap = res["divergence"], res.get("divergence_gap")
        if gap is None or gap >= 2 * res["logit_tol"]:
            return False, (f"CHECK FAILED: speculative output diverges from greedy decoding on the reference backend "
                           f"at generated position {i}: spec {res['tokens'][i:i + 8]} vs greedy {res['greedy'][i:i + 8]}"
                           + ("" if gap is None else f" (reference top-2 gap {gap:.1e})"))
        near_tie = (f"tokens identical up to generated position {i}, where the reference's top-2 gap {gap:.1e} is "
                    f"within the rounding bound (a near-tie); ")
    if worst is not None and worst > res["logit_tol"]:
        step = next(k for k, e in enumerate(res["logit_errs"]) if e is not None and e > res["logit_tol"])
        return False, (f"CHECK FAILED: step {step}'s verify logits differ from the float64 reference by {worst:.2e} "
                       f"> {res['logit_tol']:.0e}")
    what = ("identical to plain greedy decoding on the reference backend, "
            if "greedy" in res else "(sampled: no greedy comparison), ")
    if near_tie:
        what = near_tie
    return True, (f"check OK: {len(res['tokens'])} speculative tokens {what}verify logits within "
                  f"{worst:.1e} of the reference (bound {res['logit_tol']:.0e})")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m integration.decode", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap)
    ap.add_argument("--ctx", default="2k", help="prompt length (k = 1,000 tokens)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--attn-backend", default=None, help="verify_attn backend (default: reference on CPU, auto on GPU)")
    ap.add_argument("--check", action="store_true",
                    help="compare with plain greedy decoding on the reference backend and every verify's logits "
                         "with the reference's; exit 1 on a difference")
    ap.add_argument("--logit-tol", type=float, default=None,
                    help="with --check: the bound on |verify logits - reference| (default 1e-3 fp32, 5e-2 fp16/bf16)")
    from verify_attn.utils import dash_values
    args = dash_values(ap).parse_args(argv)
    if args.logit_tol is not None and not args.logit_tol > 0:
        raise usage_error(f"error: --logit-tol must be > 0, got {args.logit_tol}")
    if not torch.cuda.is_available():  # Triton backends run on CPU tensors only under the interpreter
        os.environ.setdefault("TRITON_INTERPRET", "1")
    s = resolve(args)
    s["logit_tol"] = args.logit_tol
    backend = check_backends([args.attn_backend or ("auto" if s["device"].startswith("cuda") else "reference")])[0]
    ctx = positive_tokens(args.ctx, "--ctx")
    check_fits(s, args.tp, ctx, args.steps, args.check, f"--model {s['model']} --ctx {ctx:,}")
    if s["device"] == "cpu":
        torch.set_num_threads(1)  # tiny matmuls: extra threads only contend (and ranks share the cores)
    desc = "simulated rank 0 of TP 8, all-reduce skipped" if s["simulate"] else f"TP {args.tp}"
    extra = ("" if s["page_size"] == 1 else f" page_size {s['page_size']}") + \
        (f" budget {s['budget']}" if s["tree"] == "ddtree" else "") + \
        (f" ({s['budget_device']} cost model)" if s["budget"] == "auto" else "") + \
        (f" temperature {s['temperature']}" if s["temperature"] > 0 else "")
    print(f"model {s['model']}  {desc}  ctx {ctx}  layout {args.layout}  alloc {s['alloc']}  text {s['text']}  "
          f"tree {s['tree']}{extra}  attn {backend}  {s['device']} {s['dtype']}", flush=True)
    res = launch(args.tp, run_rank, s, backend, ctx, args.steps, args.check, True)
    print(summarize(res, desc))
    if res["checked"]:
        ok, msg = check_verdict(res)
        print(msg)
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
