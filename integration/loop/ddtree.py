"""Draft trees from the drafter's per-position log-probs.

DDTree (arXiv:2604.12989): keep the top-k tokens per depth; best-first search
over prefixes scored by summed log-prob. A node is (depth, rank, parent); popping
it adds it to the tree and pushes its next sibling (same depth and parent, rank+1)
and its first child (depth+1, rank 0). Scores only fall along both moves, so the
heap pops prefixes in score order and the first `budget` pops are the best
`budget` prefixes; every selected node's ancestors were popped before it.
Node 0 is the root (the last committed token); `budget` counts draft nodes.
Top-k runs on the drafter's device: only [depth, k] values and ids are copied to the host.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    parents: list[int]     # [T], parents[0] = -1
    tokens: list[int]      # [T], tokens[0] = the root token
    depths: list[int]      # [T]
    scores: list[float]    # [T] summed log-prob (root 0)

    @property
    def size(self) -> int:
        return len(self.parents)


def build_ddtree(root_token: int, logprobs: torch.Tensor, budget: int) -> DraftTree:
    """logprobs [D, V]: row k-1 is the distribution of depth k. Returns a tree of 1 + min(budget, ...) nodes."""
    if budget < 0:
        raise ValueError(f"tree budget must be >= 0, got {budget}")
    depth_max, vocab = logprobs.shape
    k = min(budget, vocab)
    tree = DraftTree([-1], [root_token], [0], [0.0])
    if k == 0 or depth_max == 0:
        return tree
    top_lp, top_tok = torch.topk(logprobs, k, dim=-1)         # [D, k] on the device, sorted descending
    top_lp, top_tok = top_lp.double().cpu().tolist(), top_tok.cpu().tolist()   # only [D, k] goes to the host
    # heap entries: (-score, tie-break counter, depth, rank, parent node, parent score)
    heap = [(-top_lp[0][0], 0, 1, 0, 0, 0.0)]
    counter = 1
    while heap and tree.size - 1 < budget:
        neg, _, depth, rank, parent, pscore = heapq.heappop(heap)
        node = tree.size
        tree.parents.append(parent)
        tree.tokens.append(top_tok[depth - 1][rank])
        tree.depths.append(depth)
        tree.scores.append(-neg)
        if rank + 1 < k:                                            # next sibling
            heapq.heappush(heap, (-(pscore + top_lp[depth - 1][rank + 1]), counter, depth, rank + 1, parent, pscore))
            counter += 1
        if depth < depth_max:                                       # first child
            heapq.heappush(heap, (-(-neg + top_lp[depth][0]), counter, depth + 1, 0, node, -neg))
            counter += 1
    return tree


def build_chain(root_token: int, logprobs: torch.Tensor, length: int | None = None) -> DraftTree:
    """The plain DFlash block: the top-1 token at each depth (length draft nodes, default all depths)."""
    n = logprobs.shape[0] if length is None else min(length, logprobs.shape[0])
    lp, tok = logprobs[:n].max(-1)                            # on the device; [n] goes to the host
    lp, tok = lp.double().cpu(), tok.cpu()
    tree = DraftTree([-1], [root_token], [0], [0.0])
    for i in range(n):
        tree.parents.append(i)
        tree.tokens.append(int(tok[i]))
        tree.depths.append(i + 1)
        tree.scores.append(tree.scores[-1] + float(lp[i]))
    return tree


def build_tree(kind: str, root_token: int, logprobs: torch.Tensor, budget: int) -> DraftTree:
    if kind == "ddtree":
        return build_ddtree(root_token, logprobs, budget)
    if kind == "chain":
        return build_chain(root_token, logprobs)
    raise ValueError(f"unknown tree kind {kind!r}; use ddtree or chain")
