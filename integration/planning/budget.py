"""python -m integration.budget: the draft-tree budget per context length, from kernel cost and acceptance.

For each context length the planner picks the draft-node budget b (a tree of T = b + 1 nodes; b = 0 is
plain decoding) that maximises expected tokens per second,

    tok/s(ctx, b) = E[tokens per step](b) / t_step(ctx, T = b + 1),

over the candidate budgets (integration/planning/costmodel.py for t_step and where each number comes from,
integration/planning/acceptance.py for E). The decode loop (--budget auto) re-plans every step from the
drafter's own probabilities, corrected by the acceptance it observes, and only switches when the new
budget beats the current one by more than the hysteresis margin.

    python -m integration.budget --profile integration/profiles/vllm-dflash-example.json \\
        --device rtx-pro-6000 --ctx 1.4k,16k,64k,185k --json b.json --plot b.png

prints, per context: the chosen budget and its expected tok/s, the fixed budgets 16 / 64 / 256 and
no speculation side by side, the chosen step's parts and the evidence behind verify attention.
--from-vllm-log LOG --write-profile P.json converts vLLM "SpecDecoding metrics" lines into a profile.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from verify_attn.utils import parse_ctx, usage_error

from .acceptance import AcceptanceProfile, OnlineCorrection, expected_tokens, load_profile, profile_from_vllm_log
from .costmodel import DEVICES, StepCost, ctx_bucket, make_cost, shape_of

CANDIDATES = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 511)
FIXED = (16, 64, 256)
MAX_AUTO_BUDGET = 64          # the loop's largest tree (CPU runs verify every node in float64)
HYSTERESIS = 0.05             # switch only for a > 5% better expected tok/s ...
MIN_WINS = 2                  # ... on this many consecutive steps (one uncertain draft does not move it)
TIE = 0.02                    # budgets within 2% of the best expected tok/s are reported as a tie


@dataclass
class Plan:
    ctx: int
    budget: int                       # draft nodes (0: no speculation)
    tok_s: dict[int, float]           # expected tok/s per candidate budget
    tokens: dict[int, float]          # expected tokens per step per candidate budget
    step_us: dict[int, float]         # step time per candidate budget

    @property
    def best_tok_s(self) -> float:
        return self.tok_s[self.budget]


def plan(ctx: int, tokens: dict[int, float], step_us: Callable[[int, int], float],
         candidates: tuple[int, ...] = CANDIDATES) -> Plan:
    """The budget maximising tokens[b] / step_us(ctx, b + 1); ties go to the smaller budget."""
    rate, times = {}, {}
    for b in candidates:
        times[b] = step_us(ctx, b + 1)
        rate[b] = tokens[b] / times[b] * 1e6
    best = max(candidates, key=lambda b: (rate[b], -b))
    return Plan(ctx, best, rate, {b: tokens[b] for b in candidates}, times)


class AutoBudget:
    """--budget auto for the loop: choose(ctx, logprobs) before each tree, observe(metrics, tree, logprobs) after.

    Expected tokens come from the drafter's log-probs (or a fixed profile), times the online correction;
    step costs from `cost`, memoised per context bucket; the budget changes only when another one beats
    the current by more than `hysteresis` (relative expected tok/s)."""

    def __init__(self, cost: StepCost, profile: Optional[AcceptanceProfile] = None,
                 candidates: tuple[int, ...] = tuple(b for b in CANDIDATES if b <= MAX_AUTO_BUDGET),
                 hysteresis: float = HYSTERESIS, min_wins: int = MIN_WINS) -> None:
        self.cost, self.profile, self.candidates, self.hysteresis = cost, profile, candidates, hysteresis
        self.min_wins = max(1, min_wins)
        self.correction = OnlineCorrection()
        self.current: Optional[int] = None
        self.switches = 0
        self._challenger: Optional[int] = None   # the budget that beat the current one last step, and how often
        self._wins = 0
        self._times: dict[int, dict[int, float]] = {}
        self._predicted: dict[int, float] = {}

    def _step_us(self, ctx: int, nodes: int) -> float:
        row = self._times.setdefault(ctx_bucket(ctx), {})
        if nodes not in row:
            row[nodes] = self.cost.step_us(ctx_bucket(ctx), nodes)
        return row[nodes]

    def choose(self, ctx: int, logprobs: torch.Tensor) -> int:
        raw = self.profile.expected(self.candidates) if self.profile else expected_tokens(logprobs, self.candidates)
        self._predicted = raw
        depth = self.profile.depth if self.profile else int(logprobs.shape[0])
        p = plan(ctx, self.correction.apply(raw, cap=depth + 1.0), self._step_us, self.candidates)
        if self.current is None:
            self.current = p.budget
        elif p.budget != self.current and p.tok_s[p.budget] > (1 + self.hysteresis) * p.tok_s[self.current]:
            # a better budget must win MIN_WINS steps in a row: one confident (or confused) draft is no evidence
            self._wins = self._wins + 1 if p.budget == self._challenger else 1
            self._challenger = p.budget
            if self._wins >= self.min_wins:
                self.current, self._challenger, self._wins = p.budget, None, 0
                self.switches += 1
        else:
            self._challenger, self._wins = None, 0
        return self.current

    def observe(self, m, tree, logprobs) -> None:
        predicted = self._predicted.get(m.budget, 1.0) - 1.0
        self.correction.update(float(m.accepted_drafts), predicted)

    @property
    def notes(self) -> str:
        return (f"{self.switches} budget switches, acceptance correction x{self.correction.factor:.2f} "
                f"({'profile' if self.profile else 'drafter log-probs'})")


def auto_budget_for(cfg, s: dict, backend: str) -> AutoBudget:
    """The loop's planner: its own model's shape (rank 0 of TP 8) on --budget-device."""
    profile = load_profile(s["profile"]) if s.get("profile") else None
    cost = make_cost(shape_of(cfg), s["budget_device"], backend="cuda" if backend in ("auto", "cuda") else backend,
                     layout="page1" if s["page_size"] == 1 else "paged", page_size=s["page_size"])
    return AutoBudget(cost, profile)


# -- what the planner assumes, and what moves its decision ------------------------------------------

# The verify-attention cost's range by its evidence: measured rows repeat within a few %; the SASS model's band
# is about -20% .. +30% at 185k (bench.model's bands); the roofline floor is what no kernel beats, and the
# measured kernels ran 3.1-5.3x over it on the H200 (bench/results/h200/headline.json)
ATTN_RANGE = {"measured": (0.95, 1.05), "sass-model": (0.8, 1.3), "roofline": (1.0, 5.3)}


class _ScaledAttn:
    def __init__(self, attn, f: float) -> None:
        self.attn, self.f = attn, f

    def __call__(self, ctx: int, nodes: int):
        us, src = self.attn(ctx, nodes)
        return us * self.f, src


def _scaled_ranks(profile: AcceptanceProfile, f: float) -> AcceptanceProfile:
    """Ranks >= 2 scaled by f (a row's total kept <= 1): the per-rank split the logs do not carry."""
    rows = []
    for row in profile.accept:
        rest = [q * f for q in row[1:]]
        room = max(0.0, 1.0 - row[0])
        k = min(1.0, room / sum(rest)) if sum(rest) > 0 else 1.0
        rows.append((row[0], *(q * k for q in rest)))
    return AcceptanceProfile(tuple(rows), profile.source, profile.notes)


def assumed_constants(cost: StepCost, profile: AcceptanceProfile, evidence: str) -> dict:
    """{name: (low, high, make(value) -> (cost, profile), why)} of the planner's assumed constants."""
    from dataclasses import replace as dc_replace

    dev = cost.dev
    ar = {"h200": (5.0, 20.0), "rtx-pro-6000": (15.0, 50.0)}.get(dev.key, (0.5 * dev.allreduce_us, 2 * dev.allreduce_us))
    link = {"h200": (150.0, 450.0), "rtx-pro-6000": (25.0, 64.0)}.get(dev.key, (0.5 * dev.link_gbs, 1.5 * dev.link_gbs))

    def with_dev(**kw):
        c = StepCost(cost.s, dev.key, cost.attn)
        c.dev = dc_replace(dev, **kw)
        return c, profile

    def with_attn(f):
        return StepCost(cost.s, dev.key, _ScaledAttn(cost.attn, f)), profile

    out = {
        "allreduce_us": (*ar, lambda v: with_dev(allreduce_us=v), "one small NCCL all-reduce over 8 GPUs"),
        "link_gbs": (*link, lambda v: with_dev(link_gbs=v), "all-reduce bus bandwidth"),
        "verify_attn_scale": (*ATTN_RANGE.get(evidence.split(":")[-1].strip(), (0.8, 1.3)), with_attn,
                              f"verify attention's cost against its {evidence} evidence"),
        "rank_split": (0.5, 1.5, lambda v: (cost, _scaled_ranks(profile, v)),
                       "acceptance of ranks >= 2, which serving logs do not report per rank"),
    }
    if cost.s.moe is not None:
        def with_experts(v):
            shape = dc_replace(cost.s, moe=dc_replace(cost.s.moe, expert_bytes=v))
            return StepCost(shape, dev.key, cost.attn), profile
        out["expert_bytes"] = (0.5, 1.0, with_experts, "routed experts INT4 (0.5 B) .. FP8 (1 B)")
    return out


def sensitivity(profile: AcceptanceProfile, cost: StepCost, ctx: int, evidence: str, central: "Plan") -> dict:
    """Every assumed constant at each end of its range: the budget the planner would choose, and the budgets
    that tie with the best within TIE at the central values. {"ties": [...], "changes": [...]}"""
    best = central.best_tok_s
    ties = sorted(b for b, r in central.tok_s.items() if r >= (1 - TIE) * best)
    changes, optimal = [], {central.budget}
    for name, (lo, hi, make, why) in assumed_constants(cost, profile, evidence).items():
        for v in (lo, hi):
            c, prof = make(v)
            p = plan(ctx, prof.expected(CANDIDATES), c.step_us)
            optimal.add(p.budget)
            if p.budget != central.budget:
                changes.append({"constant": name, "value": v, "range": [lo, hi], "why": why,
                                "chosen_budget": p.budget, "chosen_nodes": p.budget + 1})
    return {"ties": ties, "optimal_under_ranges": sorted(optimal), "changes": changes}


def tie_text(row: dict) -> str:
    ties, opt = row["ties"], row["optimal_under_ranges"]
    parts = []
    if len(ties) > 1:
        parts.append(f"budgets {ties[0]}-{ties[-1]} within {TIE:.0%} of the best: no clear optimum")
    if len(opt) > 1:
        parts.append(f"the assumed constants' ranges move the choice over budgets {', '.join(map(str, opt))}")
    return "; ".join(parts) or "a clear optimum (no tie within 2%, no assumed constant moves it)"


# -- the command line --------------------------------------------------------------------------------

def table(profile: AcceptanceProfile, cost: StepCost, ctxs: list[int], evidence: str = "auto") -> list[dict]:
    tokens = profile.expected(CANDIDATES)
    rows = []
    for ctx in ctxs:
        p = plan(ctx, tokens, cost.step_us)
        parts, src = cost.parts(ctx, p.budget + 1)
        row = {"ctx": ctx, "chosen_nodes": p.budget + 1, "chosen_budget": p.budget,
               "expected_tok_s": p.best_tok_s, "expected_tokens_per_step": tokens[p.budget],
               "fixed": {str(b): p.tok_s[b] for b in FIXED}, "no_spec": p.tok_s[0],
               "step_ms": p.step_us[p.budget] / 1e3, "parts_ms": {k: v / 1e3 for k, v in parts.items()},
               "evidence": src, "tok_s_by_budget": {str(b): v for b, v in p.tok_s.items()}}
        row.update(sensitivity(profile, cost, ctx, src.get("verify_attn", evidence), p))
        rows.append(row)
    return rows


def plot(rows: list[dict], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in rows:
        xs = [int(b) + 1 for b in r["tok_s_by_budget"]]
        ys = list(r["tok_s_by_budget"].values())
        line, = ax.plot(xs, ys, "o-", ms=3, label=f"ctx {r['ctx']:,}")
        ax.plot([r["chosen_nodes"]], [r["expected_tok_s"]], "*", ms=14, color=line.get_color(),
                markeredgecolor="black")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tree nodes T (budget + 1; T = 1: no speculation)")
    ax.set_ylabel("expected tok/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fit_main(args) -> int:
    """--fit-budgets / --chain-tau: a profile from published tokens-per-step figures, with the fit's error."""
    from .acceptance import chain_tokens, fit_chain, fit_profile, rank_profile
    if not args.write_profile or not args.depth or args.depth < 1 or not args.source:
        raise usage_error("error: --fit-budgets / --chain-tau need --depth N (>= 1), --source CITATION and "
                          "--write-profile P.json")
    if args.fit_budgets:
        try:
            points = {int(b): float(t) for b, t in (x.split(":") for x in args.fit_budgets.split(",") if x.strip())}
        except ValueError:
            raise usage_error(f"error: --fit-budgets: want B:TAU,B:TAU (e.g. 16:8.6,64:9.75), got {args.fit_budgets!r}")
        prof, errs = fit_profile(points, args.depth, source=args.source)
        worst = max(abs(e) for e in errs.values())
        print(f"fitted {len(points)} points within {100 * worst:.1f}%: " + "; ".join(prof.notes))
    else:
        try:
            p = fit_chain(args.chain_tau, args.depth)
        except ValueError as e:
            raise usage_error(f"error: --chain-tau: {e}") from None
        prof = rank_profile(p, args.depth, decay=args.rank_decay, source=args.source, notes=(
            f"per-depth rate {p:.4f}: a chain of {args.depth} drafts gives {chain_tokens(p, args.depth):.2f} tokens "
            f"per step (published {args.chain_tau})",
            f"ranks >= 2 assumed: q(d, r) = q(d, 1) ((1 - q(d, 1)) x {args.rank_decay})^(r - 1) (a chain has no "
            "rank data)"))
        e = prof.expected((16, 64, 256))
        print(f"chain rate {p:.4f} at depth {args.depth}; as a DDTree profile: " +
              ", ".join(f"{v:.2f} tokens/step at budget {b}" for b, v in e.items()))
    with open(args.write_profile, "w") as f:
        json.dump(prof.to_json(), f, indent=1)
    print(f"wrote {args.write_profile}")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m integration.budget", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", help="acceptance profile JSON (integration/profiles/)")
    ap.add_argument("--device", default="rtx-pro-6000", help=f"cost model device: {' | '.join(DEVICES)}")
    ap.add_argument("--ctx", default="1.4k,16k,64k,185k", help="contexts: 185k | 1.4k,16k | 1.4k..185k (log-spaced)")
    ap.add_argument("--target", default="kimi-k2",
                    help="model whose step is costed: kimi-k2 (the deployment: MoE, INT4 experts) or a loop preset")
    ap.add_argument("--backend", default="cuda", help="backend whose measured rows count as evidence (default cuda)")
    ap.add_argument("--layout", choices=("page1", "paged"), default="page1")
    ap.add_argument("--page-size", type=int, default=64, help="page size of --layout paged")
    ap.add_argument("--evidence", default="auto", choices=("auto", "measured", "sass-model", "roofline"),
                    help="verify-attention evidence: auto = measured, else SASS model, else roofline")
    ap.add_argument("--results", default=None, help="folder of bench.verify JSON payloads (default bench/results/<device>)")
    ap.add_argument("--json", default=None, help="write {device, profile, cost_source, rows} as JSON")
    ap.add_argument("--plot", default=None, help="PNG of tok/s against tree size per context, chosen point marked")
    ap.add_argument("--from-vllm-log", default=None, help="convert vLLM SpecDecoding metrics lines to a profile")
    ap.add_argument("--write-profile", default=None, help="where --from-vllm-log writes the profile")
    ap.add_argument("--rank-decay", type=float, default=0.5, help="--from-vllm-log / --chain-tau: assumed per-rank "
                    "decay")
    ap.add_argument("--fit-budgets", default=None, metavar="B:TAU,...", help="fit a profile to published tokens per "
                    "step by DDTree budget (e.g. 16:8.6,64:9.75), with --depth and --source; writes --write-profile")
    ap.add_argument("--chain-tau", type=float, default=None, help="make a profile from a published chain tokens per "
                    "step (one rate at every depth), with --depth, --rank-decay and --source")
    ap.add_argument("--depth", type=int, default=None, help="drafts per block (block size - 1) of --fit-budgets / "
                    "--chain-tau")
    ap.add_argument("--source", default="", help="the citation written into a fitted profile's source field")
    from verify_attn.utils import dash_values
    args = dash_values(ap).parse_args(argv)
    if args.fit_budgets or args.chain_tau is not None:
        return fit_main(args)
    if args.from_vllm_log:
        if not args.write_profile:
            raise usage_error("error: --from-vllm-log needs --write-profile")
        try:
            with open(args.from_vllm_log) as f:
                prof = profile_from_vllm_log(f, rank_decay=args.rank_decay, source=args.from_vllm_log)
        except (OSError, ValueError) as e:
            raise usage_error(f"error: --from-vllm-log: {e}") from None
        with open(args.write_profile, "w") as f:
            json.dump(prof.to_json(), f, indent=1)
        print(f"wrote {args.write_profile}: {prof.depth} depths, depth-1 rank-1 acceptance {prof.accept[0][0]:.3f}")
        return 0
    if not args.profile:
        raise usage_error("error: --profile is required (or --from-vllm-log)")
    if args.device not in DEVICES:
        raise usage_error(f"error: --device: unknown {args.device!r}; known: {', '.join(DEVICES)}")
    try:
        profile = load_profile(args.profile)
    except (OSError, ValueError) as e:
        raise usage_error(f"error: --profile: {e}") from None
    try:
        ctxs = parse_ctx(args.ctx)
    except ValueError as e:
        raise usage_error(f"error: --ctx: {e}") from None
    if args.layout == "paged" and not 2 <= args.page_size <= 128:
        raise usage_error("error: --page-size must be in 2..128 for --layout paged")
    try:
        cost = make_cost(args.target, args.device, backend=args.backend, layout=args.layout,
                         page_size=args.page_size, evidence=args.evidence, results_root=args.results)
    except ValueError as e:
        raise usage_error(f"error: --target: {e}") from None
    rows = table(profile, cost, ctxs, args.evidence)
    sources = sorted({r["evidence"]["verify_attn"] for r in rows})
    cost_source = sources[0] if len(sources) == 1 else "mixed: " + ", ".join(sources)
    print(f"budget planner: target {cost.s.name} on {args.device}, profile {args.profile} ({profile.depth} depths); "
          f"verify attention from {cost_source}, the rest roofline / assumed all-reduce")
    head = f"{'ctx':>8s} {'chosen T':>9s} {'tok/step':>9s} {'tok/s':>8s} " + \
        "".join(f"{'T=' + str(b + 1):>9s}" for b in FIXED) + f"{'no spec':>9s} {'step ms':>8s}  parts ms (attn/dense/draft/ar)"
    print(head)
    for r in rows:
        p = r["parts_ms"]
        print(f"{r['ctx']:>8d} {r['chosen_nodes']:>9d} {r['expected_tokens_per_step']:>9.2f} {r['expected_tok_s']:>8.1f} "
              + "".join(f"{r['fixed'][str(b)]:>9.1f}" for b in FIXED) + f"{r['no_spec']:>9.1f} {r['step_ms']:>8.2f}  "
              f"{p['verify_attn']:.2f}/{p['target_dense']:.2f}/{p['drafter']:.2f}/{p['allreduce']:.2f}")
    print("(T = tree nodes incl. the root = budget + 1; fixed columns are DDTree budgets 16/64/256)")
    for r in rows:
        print(f"ctx {r['ctx']:>8,}: chosen budget {r['chosen_budget']}; {tie_text(r)}")
        for c in r["changes"]:
            print(f"    {c['constant']} = {c['value']:g} (range {c['range'][0]:g}-{c['range'][1]:g}: {c['why']}) "
                  f"-> budget {c['chosen_budget']}")
    print("note: the acceptance profile does not depend on context: where the chosen tree changes with context, "
          "that follows from the step cost alone and holds only if acceptance does not fall with context")
    for n in cost.s.notes:
        print(f"note: {n}")
    print(f"note: all-reduce {DEVICES[args.device].link}")
    doc = {"device": args.device, "profile": args.profile, "cost_source": cost_source, "target": cost.s.name,
           "evidence_by_part": {"verify_attn": cost_source, "target_dense": "roofline", "drafter": "roofline",
                                "allreduce": "assumed"},
           "rows": rows, "notes": list(cost.s.notes) + [f"all-reduce: {DEVICES[args.device].link}"]}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    if args.plot:
        plot(rows, args.plot, f"{cost.s.name} on {args.device}, profile {args.profile}, verify attn: {cost_source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
