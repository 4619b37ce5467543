"""Sampling acceptance (issue 15 item 7): target-only tree sampling emits tokens distributed exactly as
the target's own samples, whatever the drafter proposes. A chi-square test on a small vocabulary
compares the first three emitted tokens with the target's exact joint distribution; a deliberate bug
(the bonus drawn without removing the rejected children) fails the same test."""
from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare

from integration.loop.accept import sample_walk
from integration.loop.config import get_model_config
from integration.loop.drafter import DFlashDrafter
from integration.loop.model import MLATarget
from integration.loop.spec import Engine, speculative_decode
from integration.loop.texts import repeated_prompt
from integration.loop.tp import TPGroup
from verify_attn import tree as vtree

V, N = 5, 12000


def bigram(seed: int = 0) -> torch.Tensor:
    """P[a] = the target's next-token distribution after token a [V, V] (peaked enough for drafts to hit)."""
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(V, V, generator=g, dtype=torch.float64) * 1.5, -1)


def emitted(P: torch.Tensor, n_tokens: int, trials: int, residual: bool, seed: int = 1) -> list[tuple[int, ...]]:
    """Run the speculative process on random draft trees whose tokens a drafter samples (without
    replacement among siblings) from a blurred copy of the target's distribution: drafts correlate with
    the target, as real ones do. The first n_tokens emitted per trial."""
    g = torch.Generator().manual_seed(seed)
    Q = torch.softmax(P.log() + torch.randn(V, V, generator=g, dtype=torch.float64), -1)     # the drafter
    out = []
    for _ in range(trials):
        seq = [0]                                                     # the root token
        while len(seq) < n_tokens + 1:
            t = int(torch.randint(1, 9, (), generator=g))
            parents = vtree.random_parents(t, "star" if t <= 3 else "bushy", g)
            tokens = [seq[-1]] + [0] * (t - 1)
            for p in sorted(set(parents[1:])):
                kids = [i for i in range(1, t) if parents[i] == p][:V]
                for i, v in zip(kids, torch.multinomial(Q[tokens[p]], len(kids), generator=g).tolist()):
                    tokens[i] = v
            path, bonus = sample_walk(parents, tokens, lambda i: P[tokens[i]], g, residual=residual)
            seq += [tokens[i] for i in path[1:]] + [bonus]
        out.append(tuple(seq[1:n_tokens + 1]))
    return out


def chi2_pvalue(P: torch.Tensor, samples: list[tuple[int, ...]]) -> float:
    cells = list(itertools.product(range(V), repeat=3))
    exact = torch.tensor([float(P[0, a] * P[a, b] * P[b, c]) for a, b, c in cells])
    counts = torch.zeros(len(cells))
    index = {c: i for i, c in enumerate(cells)}
    for s in samples:
        counts[index[s]] += 1
    return float(chisquare(counts.numpy(), (exact * len(samples)).numpy()).pvalue)


def test_tree_sampling_matches_the_target_distribution() -> None:
    P = bigram()
    assert chi2_pvalue(P, emitted(P, 3, N, residual=True)) > 1e-3


def test_chi_square_catches_a_biased_bonus() -> None:
    P = bigram()
    assert chi2_pvalue(P, emitted(P, 3, N, residual=False)) < 1e-6


@pytest.mark.usefixtures("one_torch_thread")
def test_loop_samples_with_temperature() -> None:
    """The loop runs with temperature > 0 on tiny: drafts still get accepted on repetitive text, the
    counters agree, and the same seed gives the same tokens."""
    t = MLATarget(get_model_config("tiny"), TPGroup(), dtype=torch.float32, device="cpu")
    prompt = repeated_prompt(200, t.succ, t.cfg.vocab, 0).prompt
    runs = []
    for _ in range(2):
        e = Engine(t, backend="reference", page_size=1, capacity=400)
        toks, metrics = speculative_decode(e, DFlashDrafter(t, capacity=400), prompt, 4, temperature=0.7, seed=3)
        runs.append(toks)
    assert runs[0] == runs[1]
    assert sum(m.accepted_drafts for m in metrics) > 0
