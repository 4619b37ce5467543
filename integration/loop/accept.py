"""Acceptance rules: which tree nodes a verify commits, and the bonus token after them.

Greedy: start at the root; while the target's argmax at the current node equals the token
of one of its children, move to that child. The argmax at the last accepted node is the bonus.

Sampling (temperature > 0), target-only tree acceptance as serving engines do it (SGLang's
`tree_speculative_sampling_target_only`): at the current node with target distribution p,
draw u ~ U(0, 1) and walk the children in order, accumulating p(child token); the first
child whose cumulative mass exceeds u is accepted; if none, the bonus is drawn from p with
the children's tokens removed and renormalised. That is exactly one draw x ~ p per node
(inverse CDF with the children's tokens first): the emitted tokens are distributed as the
target's own samples, whatever the drafter proposed (tests/test_integration_sampling.py
checks it with a chi-square test).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Sequence

import torch

from .ddtree import DraftTree


def _children(parents: Sequence[int]) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = defaultdict(list)
    for i in range(1, len(parents)):
        kids[parents[i]].append(i)
    return kids


ACCEPT_BUGS = ("early", "sibling")   # deliberate accept-walk bugs (tests, probe --plant accept-early / accept-sibling)


def accept_walk(parents: Sequence[int], tokens: Sequence[int], target_next: Sequence[int],
                bug: str = "") -> tuple[list[int], int]:
    """Greedy acceptance. target_next[i] = the target's argmax after node i. Returns (path from the root, bonus).
    bug (tests): "early" stops one node early (the output stays greedy's, only slower); "sibling" moves to a
    sibling of the matching child where it has one (a wrong token is committed)."""
    kids = _children(parents)
    path = [0]
    while True:
        want = target_next[path[-1]]
        nxt = next((c for c in kids[path[-1]] if tokens[c] == want), None)
        if nxt is not None and bug == "sibling":            # BUG (planted): the next child over
            nxt = next((c for c in kids[path[-1]] if c != nxt), nxt)
        if nxt is None:
            if bug == "early" and len(path) > 1:              # BUG (planted): one node short
                path.pop()
                return path, target_next[path[-1]]
            return path, want
        path.append(nxt)


def longest_accepted(parents: Sequence[int], tokens: Sequence[int], target_next: Sequence[int]) -> int:
    """The accept walk's independent check, deliberately simple: every root-to-leaf path of the tree, the
    length of its prefix greedy decoding accepts (node k+1's token is the target's choice after node k), the
    longest of them. The drafts a correct greedy step commits (its commit_len is this + 1)."""
    kids = _children(parents)
    best = 0
    for leaf in range(len(parents)):
        if kids[leaf]:
            continue
        path = [leaf]
        while parents[path[-1]] != -1:
            path.append(parents[path[-1]])
        path.reverse()                                        # root .. leaf
        n = 0
        while n + 1 < len(path) and tokens[path[n + 1]] == target_next[path[n]]:
            n += 1
        best = max(best, n)
    return best


class AcceptMismatch(AssertionError):
    """A step committed another number of drafts than the longest greedy-accepted path of its tree."""


def sample_walk(parents: Sequence[int], tokens: Sequence[int], probs: Callable[[int], torch.Tensor],
                generator: torch.Generator, residual: bool = True) -> tuple[list[int], int]:
    """Target-only tree sampling. probs(i) = the target's distribution [V] after node i (float64, CPU).
    residual=False is a deliberate bug (tests): the bonus is drawn from the full distribution instead of
    the one with the rejected children removed, so rejected tokens come back too often."""
    kids = _children(parents)
    path = [0]
    while True:
        p = probs(path[-1])
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        acc, chosen = 0.0, None
        for c in kids[path[-1]]:
            acc += float(p[tokens[c]])
            if u < acc:
                chosen = c
                break
        if chosen is None:
            rest = p.clone()
            if residual:
                rest[[tokens[c] for c in kids[path[-1]]]] = 0.0
            if float(rest.sum()) <= 0.0:       # the children held all the mass (u hit rounding): take the last
                path.append(kids[path[-1]][-1])
                continue
            return path, int(torch.multinomial(rest / rest.sum(), 1, generator=generator))
        path.append(chosen)


def forced_path(tree: DraftTree, commit_len: int) -> list[int]:
    """--simulate-accept-len: the root plus the first commit_len-1 nodes of the deepest path."""
    node = max(range(tree.size), key=lambda i: (tree.depths[i], -i))
    chain = []
    while node != -1:
        chain.append(node)
        node = tree.parents[node]
    return chain[::-1][:max(1, commit_len)]
