"""python -m integration.probe: the commit-length probe for context-dependent kernel bugs.

The same trivially predictable continuation (a run of the target's successor
pattern at the end of the prompt) is decoded after a SHORT and after a LONG
context. The drafter is an ORACLE: it proposes the target's own greedy
continuation, computed beforehand with the float64 reference attention. With a
correct kernel every draft is accepted at both lengths (commit_len = block size);
a context-dependent bug (split merge, tail handling, index arithmetic) shows up
as a lower commit length, or a divergence, at the long context only.

A mismatch where the reference's top-2 logit gap is below --tie-eps is a
near-tie (rounding may legitimately flip it): reported, not counted as a failure.
Exit status 1 on a divergence at a clear margin or a commit-length drop.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

import torch

import verify_attn

from .config import get_model_config
from .decode import _DTYPES, check_backends, cli_value, positive_tokens
from .model import MLATarget
from .spec import Engine, greedy_decode, speculative_decode
from .tp import TPGroup


class OracleDrafter:
    """ORACLE drafter (a test instrument, not a model): proposes ref[pos+1 .. pos+B-1], the
    target's greedy continuation computed with the reference attention."""

    target_layers: tuple[int, ...] = ()

    def __init__(self, ref_tokens: list[int], prompt_len: int, vocab: int, block: int, device) -> None:
        self.ref, self.prompt_len, self.vocab, self.block, self.device = ref_tokens, prompt_len, vocab, block, device

    def reset(self) -> None:
        pass

    def commit(self, hid: torch.Tensor, start_pos: int) -> None:
        pass

    def draft(self, root: int, root_pos: int, timer=None) -> torch.Tensor:
        lp = torch.full((self.block - 1, self.vocab), float("-inf"))
        for k in range(1, self.block):
            i = root_pos + k - self.prompt_len          # index into ref (ref[0] is at position prompt_len)
            lp[k - 1, self.ref[i] if i < len(self.ref) else 0] = 0.0
        return lp


def probe_prompt(length: int, target: MLATarget, seed: int, tail: int = 64) -> torch.Tensor:
    """Random filler, then `tail` tokens that follow the target's successor pattern (same tail at every length)."""
    v = target.cfg.vocab
    g = torch.Generator().manual_seed(1234 + seed)
    tail = min(tail, length)
    filler = torch.randint(0, v - 1, (length - tail,), generator=g)
    t = int(torch.randint(0, v - 1, (), generator=torch.Generator().manual_seed(99 + seed)))
    run = []
    for _ in range(tail):
        run.append(t)
        t = int(target.succ[t])
    return torch.cat([filler, torch.tensor(run, dtype=torch.long)])


def run_length(target: MLATarget, backends: list[str], ctx: int, steps: int, page_size: int, seed: int,
               tie_eps: float, verbose: bool = False) -> dict:
    block = target.cfg.drafter.block
    prompt = probe_prompt(ctx, target, seed)
    cap = ctx + (steps + 2) * (block + 2) + 2 * page_size
    ref_logits: list[torch.Tensor] = []
    oracle = Engine(target, backend="reference", page_size=page_size, capacity=cap, seed=seed)
    n_ref = steps * block + block + 1
    ref = greedy_decode(oracle, prompt, n_ref, logits=ref_logits)
    # gap[i]: top-2 logit gap behind ref[i] (ref[0] comes from the prefill: margin not recorded)
    gaps = [float("inf")] + [float(x[0] - x[1]) for x in (l.topk(2).values for l in ref_logits)]
    out = {}
    for name in backends:
        eng = Engine(target, backend=name, page_size=page_size, capacity=cap, seed=seed)
        drafter = OracleDrafter(ref, ctx, target.cfg.vocab, block, target.device)
        try:
            toks, metrics = speculative_decode(eng, drafter, prompt, steps, tree_kind="chain", budget=block - 1)
        except ValueError as e:
            if "does not support" not in str(e):
                raise
            out[name] = {"skipped": str(e)}
            continue
        if verbose:
            print(f"  ctx {ctx}: {name} done, commit lens {[m.commit_len for m in metrics]}", flush=True)
        div = next((i for i, (a, b) in enumerate(zip(toks, ref)) if a != b), None)
        lens = [m.commit_len for m in metrics]
        if div is not None:   # stop counting after the first divergence: the oracle no longer applies
            upto, k = 1, 0
            while k < len(lens) and upto + lens[k] <= div:
                upto += lens[k]
                k += 1
            lens = lens[: k + 1]
        out[name] = {"commit_lens": lens, "mean_commit_len": sum(lens) / len(lens), "divergence": div,
                     "near_tie": div is not None and gaps[div] < tie_eps,
                     "gap": None if div is None else gaps[div],
                     "got": None if div is None else toks[div], "want": None if div is None else ref[div]}
    return out


def default_backends() -> list[str]:
    """Every available backend but the reference (the oracle) and the CPU emulator (too slow for 4k)."""
    return [b for b in verify_attn.available_backends() if b not in ("reference", "cuda-emu")]


def probe(model: str = "tiny", short: int = 256, long: int = 4000, backends: Optional[list[str]] = None,
          steps: int = 6, page_size: int = 1, device: str = "cpu", dtype: str = "float32", seed: int = 0,
          tie_eps: float = 1e-3, verbose: bool = False) -> dict:
    target = MLATarget(get_model_config(model, seed=seed), TPGroup(), dtype=_DTYPES[dtype], device=torch.device(device))
    backends = backends or default_backends()
    res = {"short": run_length(target, backends, short, steps, page_size, seed, tie_eps, verbose),
           "long": run_length(target, backends, long, steps, page_size, seed, tie_eps, verbose),
           "block": target.cfg.drafter.block, "backends": backends, "failed": []}
    for name in backends:
        s, l = res["short"][name], res["long"][name]
        if "skipped" in s or "skipped" in l:
            continue
        bad_div = [k for k, r in (("short", s), ("long", l)) if r["divergence"] is not None and not r["near_tie"]]
        if bad_div or l["mean_commit_len"] < s["mean_commit_len"]:
            res["failed"].append(name)
    return res


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m integration.probe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--short", default="256", help="short context (k = 1,000 tokens)")
    ap.add_argument("--long", default="4k", help="long context")
    ap.add_argument("--attn-backend", default=None, help="comma-separated backends (default: all available but reference)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--layout", choices=("page1", "paged"), default="page1")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tie-eps", type=float, default=None,
                    help="reference top-2 logit gap below which a mismatch counts as a near-tie "
                         "(default 1e-3 for fp32, 5e-2 for 16-bit)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():  # Triton backends run on CPU tensors only under the interpreter
        os.environ.setdefault("TRITON_INTERPRET", "1")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    if dtype not in _DTYPES:
        raise SystemExit(f"--dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    tie = args.tie_eps if args.tie_eps is not None else (1e-3 if _DTYPES[dtype] == torch.float32 else 5e-2)
    if device == "cpu":
        torch.set_num_threads(1)
    short = positive_tokens(args.short, "--short")
    long = positive_tokens(args.long, "--long")
    if long <= short:
        raise SystemExit(f"error: --long ({long}) must be longer than --short ({short})")
    if args.steps < 1:
        raise SystemExit("--steps must be >= 1")
    backends = check_backends([b.strip() for b in args.attn_backend.split(",")]) if args.attn_backend else None
    if backends is None and not default_backends():
        print("no backend other than reference is available; probing reference itself")
        backends = ["reference"]
    ps = 1 if args.layout == "page1" else args.page_size
    cli_value(get_model_config, args.model, "--model")
    res = probe(args.model, short, long, backends, args.steps, ps, device,
                dtype, args.seed, tie, verbose=True)
    print(f"commit-length probe: model {args.model}, ORACLE drafter (reference greedy continuation), "
          f"block {res['block']} (full acceptance = commit_len {res['block']}), layout {args.layout}, {dtype}")
    print(f"{'backend':16s} {'short':>8s} {'long':>8s}  first divergence")
    for name in res["backends"]:
        s, l = res["short"][name], res["long"][name]
        if "skipped" in s or "skipped" in l:
            print(f"{name:16s} {'-':>8s} {'-':>8s}  skipped: {(s.get('skipped') or l.get('skipped'))}")
            continue
        notes = []
        for k, r in (("short", s), ("long", l)):
            if r["divergence"] is not None:
                notes.append(f"{k}: generated token {r['divergence']} got {r['got']} want {r['want']} "
                             f"(ref gap {r['gap']:.2e}{', near-tie' if r['near_tie'] else ''})")
        print(f"{name:16s} {s['mean_commit_len']:8.2f} {l['mean_commit_len']:8.2f}  {'; '.join(notes) or 'none'}")
    if res["failed"]:
        print(f"PROBE FAILED for: {', '.join(res['failed'])}")
        return 1
    print("probe OK: same commit length at both context lengths")
    return 0


if __name__ == "__main__":
    sys.exit(main())
