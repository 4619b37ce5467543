"""Acceptance model: expected committed tokens per step for a draft-node budget.

Three sources, one rule. DDTree's best-first tree of `budget` nodes holds the `budget` prefixes
with the largest path probabilities; if the drafter is calibrated, node i is accepted with
its path probability, so

    E[tokens per step](budget) = 1 + sum over the tree's nodes of prod over its path of q
    (the 1 is the bonus token; budget 0 = plain decoding = 1 token)

- from the drafter's per-position log-probs ([depth, V], top-k on the device), every step;
- corrected by what is observed: an online factor EMA(accepted drafts) / EMA(predicted drafts
  of the trees actually built), applied to the predicted drafts;
- or from an imported acceptance profile (JSON, format below), e.g. converted from a serving
  engine's metrics log lines (`profile_from_vllm_log`).

Profile format ("verify_attn.acceptance/1"):
    {"format": "verify_attn.acceptance/1",
     "source": "where the numbers come from",
     "accept": [[q(1,1), q(1,2), ...],      # q(d, r): the probability that the rank-r draft at depth d
                [q(2,1), ...], ...],        #   is the target's token, given the path to depth d-1 was
                                            #   accepted (ranks are mutually exclusive: sum_r q(d,r) <= 1)
     "notes": ["..."]}
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Iterable, Optional

import torch

from ..loop.ddtree import build_ddtree

FORMAT = "verify_attn.acceptance/1"


def expected_tokens(logq: torch.Tensor, budgets: Iterable[int]) -> dict[int, float]:
    """{budget: E[tokens per step]} for per-depth log-probabilities logq [depth, ranks or vocab]:
    the best-first tree's node path probabilities, summed (ddtree.build_ddtree's order)."""
    budgets = sorted(set(int(b) for b in budgets))
    if min(budgets) < 0:
        raise ValueError(f"budgets must be >= 0, got {budgets}")
    tree = build_ddtree(0, logq, budgets[-1])
    gains = [pow(2.718281828459045, s) for s in tree.scores[1:]]                  # best first
    out, acc, i = {}, 1.0, 0
    for b in budgets:
        while i < min(b, len(gains)):
            acc += gains[i]
            i += 1
        out[b] = acc
    return out


@dataclass(frozen=True)
class AcceptanceProfile:
    accept: tuple[tuple[float, ...], ...]   # [depth][rank] conditional acceptance
    source: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.accept or not all(self.accept):
            raise ValueError("profile: 'accept' must be a non-empty list of non-empty per-depth lists")
        for d, row in enumerate(self.accept, 1):
            if any(not (0.0 <= q <= 1.0) for q in row) or sum(row) > 1.0 + 1e-6:
                raise ValueError(f"profile: depth {d}: rates must be in [0, 1] and sum to <= 1, got {list(row)}")

    @property
    def depth(self) -> int:
        return len(self.accept)

    def logq(self) -> torch.Tensor:
        """[depth, ranks] log-probabilities (padded with -inf)."""
        r = max(len(row) for row in self.accept)
        q = torch.zeros(self.depth, r, dtype=torch.float64)
        for d, row in enumerate(self.accept):
            q[d, : len(row)] = torch.tensor(row, dtype=torch.float64)
        return q.log()

    def expected(self, budgets: Iterable[int]) -> dict[int, float]:
        return expected_tokens(self.logq(), budgets)

    def to_json(self) -> dict:
        return {"format": FORMAT, "source": self.source, "accept": [list(r) for r in self.accept],
                "notes": list(self.notes)}


def load_profile(path: str) -> AcceptanceProfile:
    with open(path) as f:
        try:
            doc = json.load(f)
        except ValueError as e:
            raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not an acceptance profile (want \"format\": \"{FORMAT}\")")
    try:
        return AcceptanceProfile(tuple(tuple(float(q) for q in row) for row in doc["accept"]), doc.get("source", ""),
                                 tuple(doc.get("notes", [])))
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path}: bad 'accept' ({e})") from None


_VLLM = re.compile(r"SpecDecoding metrics:.*?Drafted: (\d+) tokens.*?Per-position acceptance rate: ([0-9., ]+?),"
                   r" Avg Draft")


def profile_from_vllm_log(lines: Iterable[str], ranks: int = 4, rank_decay: float = 0.5,
                          source: str = "") -> AcceptanceProfile:
    """Per-depth acceptance from vLLM's "SpecDecoding metrics" lines (vllm/v1/spec_decode/metrics.py):
    "Per-position acceptance rate" is unconditional (position i counts when positions 1..i were all
    accepted), so the conditional rate at depth d is a_d / a_(d-1), averaged over lines weighted by the
    drafts each line counts. The log has no per-rank counts; ranks >= 2 are an assumption:
    q(d, r) = q(d, 1) * ((1 - q(d, 1)) * rank_decay)^(r - 1)."""
    num: Optional[list[float]] = None
    drafts_total = 0.0
    for line in lines:
        m = _VLLM.search(line)
        if not m:
            continue
        rates = [float(x) for x in m.group(2).split(",") if x.strip()]
        drafts = int(m.group(1)) / max(1, len(rates))               # draft steps this line covers
        if num is None:
            num = [0.0] * len(rates)
        if len(rates) != len(num):
            raise ValueError("log mixes different numbers of speculative positions")
        for i, a in enumerate(rates):
            num[i] += a * drafts
        drafts_total += drafts
    if num is None or drafts_total == 0:
        raise ValueError("no 'SpecDecoding metrics ... Per-position acceptance rate' lines found")
    uncond = [x / drafts_total for x in num]
    accept, prev = [], 1.0
    for a in uncond:
        c = min(1.0, a / prev) if prev > 0 else 0.0
        prev = a
        row = [c * ((1 - c) * rank_decay) ** (r - 1) for r in range(1, ranks + 1)]
        accept.append(tuple(row))
    notes = (f"per-depth conditional rates from vLLM per-position (unconditional) rates over {drafts_total:.0f} "
             "draft steps", f"ranks >= 2 assumed: q(d,r) = q(d,1) * ((1 - q(d,1)) * {rank_decay})^(r-1)")
    return AcceptanceProfile(tuple(accept), source, notes)


def rank_profile(p: float, depth: int, ranks: int = 4, decay: float = 0.5, source: str = "",
                 notes: tuple[str, ...] = ()) -> AcceptanceProfile:
    """A profile with the same rate at every depth: q(d, 1) = p, q(d, r) = p ((1 - p) decay)^(r - 1)."""
    row = tuple(p * ((1 - p) * decay) ** (r - 1) for r in range(1, ranks + 1))
    return AcceptanceProfile((row,) * depth, source, notes)


def chain_tokens(p: float, depth: int) -> float:
    """Expected tokens per step of a chain draft of `depth` tokens at a per-depth rate p: 1 + p + ... + p^depth."""
    return 1.0 + sum(p ** k for k in range(1, depth + 1))


def fit_chain(tau: float, depth: int) -> float:
    """The per-depth rate p whose chain of `depth` drafts gives `tau` tokens per step (bisection)."""
    if not 1.0 <= tau <= depth + 1:
        raise ValueError(f"a chain of {depth} drafts gives 1 to {depth + 1} tokens per step, not {tau}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chain_tokens(mid, depth) < tau else (lo, mid)
    return (lo + hi) / 2


def fit_profile(points: dict[int, float], depth: int, ranks: int = 4, source: str = "",
                p_fixed: Optional[float] = None) -> tuple[AcceptanceProfile, dict[int, float]]:
    """The rank_profile (p, decay) whose expected tokens per step best match `points` ({budget: tau}, least
    squares on the relative error, a grid over p and decay); p_fixed keeps p (fit the decay only). Returns
    (profile, {budget: relative error of the fit}); the errors go into the profile's notes."""
    ps = [p_fixed] if p_fixed is not None else [i / 400 for i in range(4, 400)]
    decays = [i / 40 for i in range(1, 41)]
    best = None
    for p in ps:
        for dec in decays:
            e = rank_profile(p, depth, ranks, dec).expected(points)
            err = sum(((e[b] - t) / t) ** 2 for b, t in points.items())
            if best is None or err < best[0]:
                best = (err, p, dec, e)
    _, p, dec, e = best
    errs = {b: (e[b] - t) / t for b, t in points.items()}
    notes = (f"fitted: q(d, 1) = {p:.4f} at every depth, q(d, r) = q(d, 1) ((1 - q(d, 1)) x {dec:.3f})^(r - 1), "
             f"{ranks} ranks, depth {depth}", "fit: " + ", ".join(f"budget {b}: {t} published, {e[b]:.2f} fitted "
                                                               f"({100 * errs[b]:+.1f}%)" for b, t in points.items()))
    return rank_profile(p, depth, ranks, dec, source, notes), errs


class OnlineCorrection:
    """factor = EMA(observed accepted drafts) / EMA(predicted accepted drafts), predicted for the tree the
    loop built. Starts at 1 (trust the model) and moves by `alpha` per step."""

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha, self.obs, self.pred = alpha, None, None

    @property
    def factor(self) -> float:
        if self.obs is None or not self.pred:
            return 1.0
        return min(2.0, max(0.02, self.obs / self.pred))

    def update(self, observed: float, predicted: float) -> None:
        a = self.alpha
        self.obs = observed if self.obs is None else (1 - a) * self.obs + a * observed
        self.pred = predicted if self.pred is None else (1 - a) * self.pred + a * predicted

    def apply(self, expected: dict[int, float], cap: Optional[float] = None) -> dict[int, float]:
        """The corrected expectation, at most `cap` tokens per step (the block size: a step commits at most
        block - 1 drafts and the bonus, whatever the correction factor says)."""
        out = {b: 1.0 + self.factor * (e - 1.0) for b, e in expected.items()}
        return out if cap is None else {b: min(cap, e) for b, e in out.items()}
