"""python -m integration.probe: is a long-context slowdown the kernel, the drafter, the metrics or the text?

The same repetitive text (integration/loop/texts.py: a passage that follows the target's
successor map, seen early in the prompt, its start repeated at the end) is decoded after a
SHORT and after a LONG prompt; only the distance back to the earlier occurrence changes.

--drafter oracle (the kernel probe): the drafter proposes the target's own greedy
continuation, computed with the float64 reference attention, and every verify's logits are
compared with the reference's (max |difference| <= --logit-tol, default 1e-3 fp32 / 5e-2
16-bit). A backend passes only if commit_len equals the block size at every step at both
lengths, nothing diverges and every verify is within the bound. Dropping 16 prefix rows in
the middle of a 2.5k prompt moves tiny's logits by 1.1e-1 while every commit_len stays at the
block size; interpreted fp32 Triton stays within 1e-5 of the reference.

--drafter real: the DFlash drafter must find the passage in its context. The verdict separates
  metrics bug      the loop's independent counters disagree (integration/loop/metrics.py);
  text difficulty  the target itself continues the passage for fewer tokens at the long length;
  context bug      on text the target does continue predictably ("copyable" steps), the drafter's
                   acceptance falls at the long length (or is low at both): an acceptance bug;
  context OK       none of these.
Acceptance on a step = commit_len / min(block, copyable tokens left + 1): 1.0 is a perfect
copier. --plant puts a deliberate bug in (tests): window:N | untrimmed | stale-hidden (drafter,
integration/loop/drafter.py DrafterBugs) | metrics (the loop's reported commit length) | accept-early (the accept
walk stops one node early: the output is greedy's, only slower) | accept-sibling (it accepts a sibling of the
matching child). Every real-drafter run checks each step's commit against the longest greedy-accepted
root-to-leaf path of its tree, counted independently (integration/loop/accept.py longest_accepted).

Exit status: 0 for "context OK" / "text difficulty" / an oracle pass, 1 for a bug, 2 for bad flags.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Optional

import torch

import verify_attn
from verify_attn.utils import usage_error

from ..loop.config import get_model_config
from .decode import LOGIT_TOL, _DTYPES, check_backends, cli_value, positive_tokens
from ..loop.drafter import DFlashDrafter, DrafterBugs
from ..loop.accept import AcceptMismatch
from ..loop.metrics import MetricsMismatch
from ..loop.model import MLATarget
from ..loop.spec import Engine, first_divergence, greedy_decode, speculative_decode
from ..loop.texts import PromptText, repeated_prompt
from ..loop.tp import TPGroup

ACC_DROP = 0.25      # context bug: long-context acceptance this far below the short one's
ACC_FLOOR = 0.5      # ... or below this at the long length (a perfect copier scores 1.0)
_REFS: dict = {}     # reference greedy continuations, per (model, dtype, layout, prompt): shared by probe calls


class OracleDrafter:
    """ORACLE drafter (a test instrument, not a model): proposes ref[pos+1 .. pos+B-1], the
    target's greedy continuation computed with the reference attention."""

    target_layers: tuple[int, ...] = ()

    def __init__(self, ref_tokens: list[int], prompt_len: int, vocab: int, block: int) -> None:
        self.ref, self.prompt_len, self.vocab, self.block = ref_tokens, prompt_len, vocab, block
        self.n_ctx = 0

    def reset(self) -> None:
        self.n_ctx = 0

    def commit(self, hid: torch.Tensor, start_pos: int, last_chunk: bool = True) -> None:
        self.n_ctx = start_pos + hid.shape[0]

    def draft(self, root: int, root_pos: int, timer=None) -> torch.Tensor:
        lp = torch.full((self.block - 1, self.vocab), float("-inf"))
        for k in range(1, self.block):
            i = root_pos + k - self.prompt_len          # index into ref (ref[0] is at position prompt_len)
            lp[k - 1, self.ref[i] if i < len(self.ref) else 0] = 0.0
        return lp


@dataclass
class Setup:
    target: MLATarget
    steps: int
    page_size: int
    seed: int
    logit_tol: float

    @property
    def block(self) -> int:
        return self.target.cfg.drafter.block

    def capacity(self, ctx: int) -> int:
        return ctx + (self.steps + 2) * (self.block + 2) + 2 * self.page_size

    def text(self, ctx: int, seed: int) -> PromptText:
        t = self.target
        return repeated_prompt(ctx, t.succ, t.cfg.vocab, seed)

    def reference(self, text: PromptText, n: int) -> list[int]:
        """The target's greedy continuation [n] on the float64 reference backend (memoised per prompt)."""
        t = self.target
        key = (t.cfg, t.dtype, str(t.device), self.page_size, tuple(text.prompt.tolist()))
        have = _REFS.get(key, [])
        if len(have) < n:
            e = Engine(t, backend="reference", page_size=self.page_size, capacity=self.capacity(text.prompt.numel()) + n,
                       seed=self.seed)
            _REFS[key] = have = greedy_decode(e, text.prompt, n)
        return have[:n]


def copyable(ref: list[int], text: PromptText) -> int:
    """How many leading tokens of the target's continuation follow the passage (what a copier can know)."""
    return next((i for i, (a, b) in enumerate(zip(ref, text.continuation)) if a != b), min(len(ref), len(text.continuation)))


def pick_text_seed(s: Setup, lengths: tuple[int, ...], seed: int, tries: int = 8) -> int:
    """The first seed whose passage the target (float64 reference, independent of the loop under test)
    continues for the whole probe at every length: the same predictable text at both lengths. Falls
    back to `seed` if none does within `tries` (the verdict then reports text difficulty)."""
    need = s.steps * s.block + 1
    for k in range(tries):
        if all(copyable(s.reference(s.text(n, seed + k), need), s.text(n, seed + k)) >= need for n in lengths):
            return seed + k
    return seed


# -- oracle mode: the kernel probe -----------------------------------------------------------

def oracle_length(s: Setup, backend: str, ctx: int, text_seed: int) -> dict:
    text = s.text(ctx, text_seed)
    n_ref = s.steps * s.block + s.block + 1
    ref = s.reference(text, n_ref)
    eng = Engine(s.target, backend=backend, page_size=s.page_size, capacity=s.capacity(ctx), seed=s.seed,
                 check_backend="reference")
    drafter = OracleDrafter(ref, ctx, s.target.cfg.vocab, s.block)
    try:
        toks, metrics = speculative_decode(eng, drafter, text.prompt, s.steps, tree_kind="chain", budget=s.block - 1)
    except ValueError as e:
        if "does not support" not in str(e):
            raise
        return {"skipped": str(e)}
    errs = [m.logit_err for m in metrics]
    return {"commit_lens": [m.commit_len for m in metrics], "divergence": first_divergence(toks, ref[:len(toks)]),
            "max_logit_err": max(errs), "logit_errs": errs}


def oracle_verdict(s: Setup, r: dict) -> Optional[str]:
    """None if the backend passes at this length, else why not."""
    why = []
    if any(c != s.block for c in r["commit_lens"]):
        why.append(f"commit_len {r['commit_lens']} (want {s.block} every step)")
    if r["divergence"] is not None:
        why.append(f"diverges from reference greedy at generated token {r['divergence']}")
    if r["max_logit_err"] > s.logit_tol:
        why.append(f"verify logits differ from the float64 reference by {r['max_logit_err']:.2e} > {s.logit_tol:.0e}")
    return "; ".join(why) or None


# -- real-drafter mode -----------------------------------------------------------------------------

def real_length(s: Setup, backend: str, ctx: int, text_seed: int, bugs: DrafterBugs, plant_metrics: bool,
                accept_bug: str = "") -> dict:
    text = s.text(ctx, text_seed)
    horizon = s.steps * s.block + 1
    ref = s.reference(text, horizon)
    cop = copyable(ref, text)
    eng = Engine(s.target, backend=backend, page_size=s.page_size, capacity=s.capacity(ctx), seed=s.seed)
    drafter = DFlashDrafter(s.target, capacity=s.capacity(ctx), bugs=bugs)
    out = {"copyable": cop, "horizon": horizon}
    try:
        toks, metrics = speculative_decode(eng, drafter, text.prompt, s.steps, tree_kind="ddtree", budget=16,
                                           plant_metrics_bug=plant_metrics, accept_bug=accept_bug, check_accept=True)
    except MetricsMismatch as e:
        return dict(out, metrics_error=str(e))
    except AcceptMismatch as e:
        return dict(out, accept_error=str(e))
    out["commit_lens"] = [m.commit_len for m in metrics]
    out["divergence"] = first_divergence(toks, ref[:len(toks)])     # len(toks) <= horizon
    eff, done = [], 1                       # toks[0] came from the prefill: continuation index 1 next
    for c in out["commit_lens"]:
        left = cop - done
        if left >= 1:
            eff.append(c / min(s.block, left + 1))
        done += c
    out["acceptance"] = sum(eff) / len(eff) if eff else None
    out["copyable_steps"] = len(eff)
    return out


def real_verdict(s: Setup, short: dict, long: dict) -> tuple[str, str]:
    """(verdict, why) from the two lengths' runs."""
    for name, r in (("short", short), ("long", long)):
        if "metrics_error" in r:
            return "metrics bug", f"at the {name} length: {r['metrics_error']}"
        if "accept_error" in r:
            return "loop bug", f"at the {name} length the accept walk fails its independent count: {r['accept_error']}"
    for name, r in (("short", short), ("long", long)):
        if r["divergence"] is not None:
            return "loop bug", f"at the {name} length the speculative tokens diverge from greedy at {r['divergence']}"
    a_s, a_l = short["acceptance"], long["acceptance"]
    if a_s is None:
        return "text difficulty", "the target does not continue the passage even at the short length"
    if a_l is None:
        return "text difficulty", "the target does not continue the passage at the long length (copyable 0)"
    if a_l < a_s - ACC_DROP or a_l < ACC_FLOOR:
        where = "at both lengths" if a_s < ACC_FLOOR else "at the long length only"
        return "context bug", (f"acceptance bug {where}: on text the target continues predictably the drafter "
                               f"reaches {a_l:.2f} of a perfect copier at the long length vs {a_s:.2f} at the short one")
    if long["copyable"] < short["copyable"] - s.block:
        return "text difficulty", (f"the target continues the passage for {long['copyable']} tokens at the long length "
                                   f"vs {short['copyable']} at the short one; acceptance on that text holds "
                                   f"({a_l:.2f} vs {a_s:.2f})")
    return "context OK", f"acceptance {a_s:.2f} (short) vs {a_l:.2f} (long) of a perfect copier"


# -- entry points ------------------------------------------------------------------------------

def default_backends() -> list[str]:
    """Every available backend but the reference (the oracle) and the CPU emulator (too slow for 4k)."""
    return [b for b in verify_attn.available_backends() if b not in ("reference", "cuda-emu")]


def probe(model: str = "tiny", short: int = 256, long: int = 4000, backends: Optional[list[str]] = None,
          steps: int = 6, page_size: int = 1, device: str = "cpu", dtype: str = "float32", seed: int = 0,
          drafter: str = "oracle", bugs: DrafterBugs = DrafterBugs(), plant_metrics: bool = False,
          logit_tol: Optional[float] = None, verbose: bool = False, accept_bug: str = "") -> dict:
    dt = _DTYPES[dtype]
    target = MLATarget(get_model_config(model, seed=seed), TPGroup(), dtype=dt, device=torch.device(device))
    s = Setup(target, steps, page_size, seed, LOGIT_TOL[dt] if logit_tol is None else logit_tol)
    say = print if verbose else (lambda *a, **k: None)
    # the oracle proposes whatever the target continues with: any text will do
    text_seed = seed if drafter == "oracle" else pick_text_seed(s, (short, long), seed)
    res: dict = {"mode": drafter, "block": s.block, "text_seed": text_seed, "logit_tol": s.logit_tol}
    if drafter == "oracle":
        backends = backends or default_backends() or ["reference"]
        res.update(backends=backends, short={}, long={}, failed={})
        for name in backends:
            for key, ctx in (("short", short), ("long", long)):
                res[key][name] = r = oracle_length(s, name, ctx, text_seed)
                say(f"  {key} {ctx}: {name}: {r.get('commit_lens', r.get('skipped'))}", flush=True)
            rs, rl = res["short"][name], res["long"][name]
            if "skipped" in rs or "skipped" in rl:
                continue
            why = {k: v for k, v in (("short", oracle_verdict(s, rs)), ("long", oracle_verdict(s, rl))) if v}
            if why:
                res["failed"][name] = why
        return res
    backend = (backends or ["reference"])[0]
    res["backend"] = backend
    res["short"] = real_length(s, backend, short, text_seed, bugs, plant_metrics, accept_bug)
    say(f"  short {short}: {res['short'].get('commit_lens', res['short'].get('metrics_error', res['short'].get('accept_error')))}", flush=True)
    res["long"] = real_length(s, backend, long, text_seed, bugs, plant_metrics, accept_bug)
    say(f"  long {long}: {res['long'].get('commit_lens', res['long'].get('metrics_error', res['long'].get('accept_error')))}", flush=True)
    res["verdict"], res["why"] = real_verdict(s, res["short"], res["long"])
    return res


ACCEPT_PLANTS = {"accept-early": "early", "accept-sibling": "sibling"}


def parse_plants(spec: Optional[str]) -> tuple[DrafterBugs, bool, str]:
    """(drafter bugs, the metrics bug, the accept-walk bug) of --plant."""
    if not spec:
        return DrafterBugs(), False, ""
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    metrics = "metrics" in parts
    accept = [ACCEPT_PLANTS[p] for p in parts if p in ACCEPT_PLANTS]
    if len(accept) > 1:
        raise usage_error("error: --plant: one accept-walk bug at a time (accept-early or accept-sibling)")
    rest = ",".join(p for p in parts if p != "metrics" and p not in ACCEPT_PLANTS)
    try:
        return DrafterBugs.parse(rest), metrics, accept[0] if accept else ""
    except ValueError as e:
        raise usage_error(f"error: --plant: {e}; or metrics, accept-early, accept-sibling") from None


def report(res: dict, args, dtype: str) -> int:
    if res["mode"] == "oracle":
        print(f"commit-length probe: model {args.model}, ORACLE drafter (reference greedy continuation), block "
              f"{res['block']} (pass = commit_len {res['block']} every step), logits within {res['logit_tol']:.0e} of "
              f"the float64 reference, {dtype}")
        print(f"{'backend':16s} {'short':>8s} {'long':>8s} {'max logit err':>14s}  verdict")
        for name in res["backends"]:
            s, l = res["short"][name], res["long"][name]
            if "skipped" in s or "skipped" in l:
                print(f"{name:16s} {'-':>8s} {'-':>8s} {'-':>14s}  skipped: {s.get('skipped') or l.get('skipped')}")
                continue
            mean = lambda r: sum(r["commit_lens"]) / len(r["commit_lens"])   # noqa: E731
            why = res["failed"].get(name)
            err = max(s["max_logit_err"], l["max_logit_err"])
            verdict = "OK" if not why else "FAIL: " + "; ".join(f"{k}: {v}" for k, v in why.items())
            print(f"{name:16s} {mean(s):8.2f} {mean(l):8.2f} {err:14.2e}  {verdict}")
        if res["failed"]:
            print(f"PROBE FAILED for: {', '.join(res['failed'])}")
            return 1
        print("probe OK: full acceptance and reference-exact logits at both context lengths")
        return 0
    print(f"commit-length probe: model {args.model}, REAL DFlash drafter, backend {res['backend']}, block "
          f"{res['block']}, text seed {res['text_seed']}")
    for k in ("short", "long"):
        r = res[k]
        if "metrics_error" in r or "accept_error" in r:
            print(f"  {k:5s}: {r.get('metrics_error') or r.get('accept_error')}")
            continue
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        print(f"  {k:5s}: commit_len {r['commit_lens']}  copyable {r['copyable']}/{r['horizon']} tokens  "
              f"acceptance on copyable steps {acc} ({r['copyable_steps']} steps)")
    print(f"verdict: {res['verdict']}: {res['why']}")
    return 0 if res["verdict"] in ("context OK", "text difficulty") else 1


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m integration.probe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--short", default="256", help="short context (k = 1,000 tokens)")
    ap.add_argument("--long", default="4k", help="long context")
    ap.add_argument("--drafter", choices=("oracle", "real"), default="oracle",
                    help="oracle: the kernel probe; real: the DFlash drafter, with a verdict")
    ap.add_argument("--attn-backend", default=None,
                    help="comma-separated backends (oracle default: all available but reference; real: reference)")
    ap.add_argument("--plant", default=None, help="deliberate bugs (with --drafter real): window:N, untrimmed, "
                    "stale-hidden, metrics, accept-early, accept-sibling")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--layout", choices=("page1", "paged"), default="page1")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--logit-tol", type=float, default=None,
                    help="max |logits - float64 reference| per verify (default 1e-3 fp32, 5e-2 16-bit)")
    from verify_attn.utils import dash_values
    args = dash_values(ap).parse_args(argv)
    if not torch.cuda.is_available():  # Triton backends run on CPU tensors only under the interpreter
        os.environ.setdefault("TRITON_INTERPRET", "1")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    if dtype not in _DTYPES:
        raise usage_error(f"error: --dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    short = positive_tokens(args.short, "--short")
    long = positive_tokens(args.long, "--long")
    if long <= short:
        raise usage_error(f"error: --long ({long}) must be longer than --short ({short})")
    if args.steps < 1:
        raise usage_error("error: --steps must be >= 1")
    if args.logit_tol is not None and not args.logit_tol > 0:
        raise usage_error("error: --logit-tol must be > 0")
    backends = check_backends([b.strip() for b in args.attn_backend.split(",")]) if args.attn_backend else None
    bugs, plant_metrics, accept_bug = parse_plants(args.plant)
    if args.drafter == "oracle" and (bugs != DrafterBugs() or plant_metrics or accept_bug):
        raise usage_error("error: --plant needs --drafter real")
    if args.drafter == "real" and backends and len(backends) > 1:
        raise usage_error("error: --attn-backend: --drafter real runs one backend")
    if args.drafter == "oracle" and backends is None and not default_backends():
        print("no backend other than reference is available; probing reference itself")
        backends = ["reference"]
    cli_value(get_model_config, args.model, "--model")
    if device == "cpu":
        torch.set_num_threads(1)
    ps = 1 if args.layout == "page1" else args.page_size
    res = probe(args.model, short, long, backends, args.steps, ps, device, dtype, args.seed, args.drafter, bugs,
                plant_metrics, args.logit_tol, verbose=True, accept_bug=accept_bug)
    return report(res, args, dtype)


if __name__ == "__main__":
    sys.exit(main())
