"""DDTree against brute-force enumeration; chain trees; acceptance walk and the independent metric
counters on hand-built trees."""
from __future__ import annotations

import itertools

import pytest
import torch

from integration.loop.ddtree import DraftTree, build_chain, build_ddtree
from integration.loop.accept import accept_walk, forced_path
from integration.loop.metrics import MetricsMismatch, StepMetrics
from verify_attn import tree as vtree


def brute_force_top(logprobs: torch.Tensor, budget: int) -> set[tuple[int, ...]]:
    """All token prefixes of length 1..D, scored by summed log-prob; the best `budget`."""
    d, v = logprobs.shape
    scored = []
    for n in range(1, d + 1):
        for seq in itertools.product(range(v), repeat=n):
            scored.append((sum(float(logprobs[i, t]) for i, t in enumerate(seq)), seq))
    scored.sort(key=lambda x: -x[0])
    return {seq for _, seq in scored[:budget]}


def tree_prefixes(tree: DraftTree) -> set[tuple[int, ...]]:
    out = set()
    for i in range(1, tree.size):
        seq, n = [], i
        while n > 0:
            seq.append(tree.tokens[n])
            n = tree.parents[n]
        out.add(tuple(seq[::-1]))
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("budget", [1, 3, 7, 12, 30])
def test_ddtree_matches_brute_force(seed: int, budget: int) -> None:
    g = torch.Generator().manual_seed(seed)
    depth, vocab = 3, 4
    logprobs = torch.log_softmax(torch.randn(depth, vocab, generator=g) * 2, -1)
    tree = build_ddtree(99, logprobs, budget)
    vtree.validate_parents(tree.parents)
    assert tree.tokens[0] == 99 and tree.parents[0] == -1
    assert tree.size - 1 == min(budget, sum(vocab ** n for n in range(1, depth + 1)))
    assert tree_prefixes(tree) == brute_force_top(logprobs, budget)
    assert tree.depths == vtree.depths(tree.parents)
    # ancestor-closed: each node's parent is in the tree and scores fall along edges
    for i in range(1, tree.size):
        assert tree.scores[i] <= tree.scores[tree.parents[i]] + 1e-12
    # siblings carry distinct tokens (the acceptance walk relies on it)
    for p in set(tree.parents[1:]):
        kids = [tree.tokens[i] for i in range(1, tree.size) if tree.parents[i] == p]
        assert len(kids) == len(set(kids))


def test_chain_is_top1_path() -> None:
    lp = torch.log_softmax(torch.randn(5, 9, generator=torch.Generator().manual_seed(3)), -1)
    tree = build_chain(7, lp)
    assert tree.parents == [-1, 0, 1, 2, 3, 4]
    assert tree.tokens[1:] == lp.argmax(-1).tolist()


def test_ddtree_budget_zero_is_root_only() -> None:
    tree = build_ddtree(5, torch.zeros(3, 4), 0)
    assert tree.parents == [-1] and tree.tokens == [5]


# -- acceptance walk on hand-built trees -------------------------------------------------------
#      0(r)
#     /    \
#   1(a)   2(b)
#   /  \      \
# 3(c) 4(d)   5(e)
#  |
# 6(f)
PARENTS = [-1, 0, 0, 1, 1, 2, 3]
TOKENS = [100, 1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("target_next, path, bonus", [
    ([9, 9, 9, 9, 9, 9, 9], [0], 9),                 # nothing accepted: bonus from the root
    ([1, 3, 9, 6, 9, 9, 7], [0, 1, 3, 6], 7),        # the deepest path, bonus after the leaf
    ([2, 9, 5, 9, 9, 8, 9], [0, 2, 5], 8),           # the second branch
    ([1, 4, 9, 9, 11, 9, 9], [0, 1, 4], 11),         # sibling of the deeper node
    ([1, 5, 9, 9, 9, 9, 9], [0, 1], 5),              # 5 is a cousin (child of 2), not a child of 1
])
def test_accept_walk(target_next, path, bonus) -> None:
    got_path, got_bonus = accept_walk(PARENTS, TOKENS, target_next)
    assert got_path == path and got_bonus == bonus
    depths = vtree.depths(PARENTS)
    n = len(got_path)
    m = StepMetrics(0, len(PARENTS), accepted_drafts=n - 1, accepted_depth=depths[got_path[-1]], commit_len=n,
                    tokens_emitted=n, drafter_growth=n, drafter_ctx=50, cache_len=50, max_depth=3)
    m.check()


def test_forced_path_takes_the_deepest_branch() -> None:
    tree = DraftTree(PARENTS, TOKENS, vtree.depths(PARENTS), [0.0] * 7)
    assert forced_path(tree, 1) == [0]
    assert forced_path(tree, 3) == [0, 1, 3]
    assert forced_path(tree, 10) == [0, 1, 3, 6]


@pytest.mark.parametrize("bad", [
    dict(commit_len=2),                      # the cache grew by one token less than was emitted
    dict(tokens_emitted=4),                  # an extra token emitted
    dict(drafter_growth=2),                  # the drafter missed a committed token
    dict(accepted_depth=1),                  # accepted nodes that do not form a path
    dict(accepted_drafts=5, accepted_depth=5, commit_len=6, tokens_emitted=6, drafter_growth=6),  # > tree
    dict(drafter_ctx=49),                    # drafter context out of step with the target cache
])
def test_metric_invariants_catch_inconsistency(bad) -> None:
    kw = dict(step=0, tree_size=4, accepted_drafts=2, accepted_depth=2, commit_len=3, tokens_emitted=3,
              drafter_growth=3, drafter_ctx=50, cache_len=50, max_depth=7)
    StepMetrics(**kw).check()
    kw.update(bad)
    with pytest.raises(MetricsMismatch):
        StepMetrics(**kw).check()
