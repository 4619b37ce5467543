"""The speculative decode loop (greedy), read top to bottom in `speculative_decode`.

Acceptance rule (greedy): start at the root; while the target's argmax at the
current node equals the token of one of its children, move to that child
(accepted). The target's argmax at the last accepted node is the bonus token.
Metrics (DESIGN.md section 6), checked against each other every step:
  accepted_drafts = accepted non-root nodes
  accepted_depth  = depth of the deepest accepted node (== accepted_drafts: they form a path)
  commit_len      = accepted_drafts + 1 (the bonus); 1 means no draft was accepted.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from verify_attn import tree as vtree

from .ddtree import DraftTree, build_tree
from .kv import LatentKVCache
from .model import MLATarget, prefill_attention, verify_attention
from .timing import StepTimer


@dataclass
class StepMetrics:
    step: int
    tree_size: int
    accepted_drafts: int
    accepted_depth: int
    commit_len: int
    step_s: float = 0.0
    parts: dict = field(default_factory=dict)   # exclusive seconds per part
    forced: bool = False                         # commit length forced by --simulate-accept-len

    def check(self, max_depth: int) -> None:
        if self.commit_len != self.accepted_drafts + 1:
            raise AssertionError(f"step {self.step}: commit_len {self.commit_len} != accepted_drafts + 1")
        if self.accepted_depth != self.accepted_drafts:
            raise AssertionError(f"step {self.step}: accepted_depth {self.accepted_depth} != accepted_drafts "
                                 f"{self.accepted_drafts} (accepted nodes must form a path)")
        if not 0 <= self.accepted_drafts <= min(self.tree_size - 1, max_depth):
            raise AssertionError(f"step {self.step}: accepted_drafts {self.accepted_drafts} outside "
                                 f"[0, min(tree_size-1, max depth)]")


def accept_walk(parents: Sequence[int], tokens: Sequence[int], target_next: Sequence[int]) -> tuple[list[int], int]:
    """Greedy acceptance. target_next[i] = the target's argmax after node i. Returns (path from the root, bonus)."""
    children: dict[int, list[int]] = defaultdict(list)
    for i in range(1, len(parents)):
        children[parents[i]].append(i)
    path = [0]
    while True:
        want = target_next[path[-1]]
        nxt = next((c for c in children[path[-1]] if tokens[c] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)


def forced_path(tree: DraftTree, commit_len: int) -> list[int]:
    """--simulate-accept-len: the root plus the first commit_len-1 nodes of the deepest path."""
    node = max(range(tree.size), key=lambda i: (tree.depths[i], -i))
    chain = []
    while node != -1:
        chain.append(node)
        node = tree.parents[node]
    return chain[::-1][:max(1, commit_len)]


class Engine:
    """The target, its KV cache and the attention backend for one request."""

    def __init__(self, target: MLATarget, *, backend: str, page_size: int, capacity: int, seed: int = 0,
                 prefill_chunk: Optional[int] = None) -> None:
        self.t, self.backend, self.page_size, self.capacity, self.seed = target, backend, page_size, capacity, seed
        # prompt tokens per prefill chunk; default: long chunks on GPU (each chunk re-gathers the prefix per layer)
        self.prefill_chunk = prefill_chunk or (32768 if target.device.type == "cuda" else 1024)
        self.reset()

    def reset(self) -> None:
        c = self.t.cfg
        self.cache = LatentKVCache(c.num_layers, self.capacity, c.cache_dim, c.kv_lora, page_size=self.page_size,
                                   dtype=self.t.dtype, device=self.t.device, seed=self.seed)

    @property
    def length(self) -> int:
        return self.cache.length

    def prefill(self, prompt: torch.Tensor, drafter=None, chunk: Optional[int] = None, all_logits: bool = False):
        """Run the prompt [L] through the target (dense causal attention), filling the cache; feed the
        drafter the chosen layers' hidden states. Returns the first generated token (or, with
        all_logits, the logits [L, V] at every position)."""
        keep = tuple(drafter.target_layers) if drafter is not None else ()
        chunk = chunk or self.prefill_chunk
        x_last, xs = None, []
        for start in range(0, prompt.numel(), chunk):
            toks = prompt[start:start + chunk].to(self.t.device)
            addr = self.cache.extend(toks.numel())
            pos = torch.arange(start, start + toks.numel(), device=self.t.device)
            x, hid = self.t.forward(toks, pos, prefill_attention(self.t, self.cache, addr, start), keep)
            if drafter is not None:
                drafter.commit(hid, start)
            x_last = x[-1:]
            if all_logits:
                xs.append(x)
        if all_logits:
            return self.t.logits(torch.cat(xs))
        return int(self.t.logits(x_last).argmax(-1))

    def verify(self, tree: DraftTree, keep: tuple[int, ...] = (), timer: Optional[StepTimer] = None,
               logits: Optional[list] = None):
        """Target forward over the tree's nodes -> (argmax after each node [T] list, kept hidden [T, nsel, d])."""
        dev = self.t.device
        addr = self.cache.begin_tree(tree.size)
        mask = vtree.pack_mask(vtree.ancestor_mask(tree.parents)).to(dev)                 # [T, W] int32
        pos = torch.tensor(tree.depths, device=dev) + self.cache.length
        toks = torch.tensor(tree.tokens, device=dev)
        attn = verify_attention(self.t, self.cache, addr, mask, self.backend, timer)
        x, hid = self.t.forward(toks, pos, attn, keep)
        lg = self.t.logits(x)                                                           # [T, V]
        if logits is not None:
            logits.extend(lg)
        return lg.argmax(-1).tolist(), hid


def greedy_decode(engine: Engine, prompt: torch.Tensor, n: int, logits: Optional[list] = None) -> list[int]:
    """Plain greedy decoding: every step verifies a tree of one node (the last token).
    `logits`, when given, collects each decode step's logits [V]."""
    engine.reset()
    out = [engine.prefill(prompt)]
    single = DraftTree([-1], [0], [0], [0.0])
    while len(out) < n:
        single.tokens[0] = out[-1]
        nxt, _ = engine.verify(single, logits=logits)
        engine.cache.commit([0])
        out.append(nxt[0])
    return out[:n]


def speculative_decode(engine: Engine, drafter, prompt: torch.Tensor, steps: int, *, tree_kind: str = "ddtree",
                       budget: int = 16, simulate_accept_len: Optional[int] = None,
                       timer: Optional[StepTimer] = None, check_cache: bool = False,
                       on_step=None) -> tuple[list[int], list[StepMetrics]]:
    """Prefill, then `steps` draft -> tree -> verify -> accept -> commit steps. Returns (tokens, metrics):
    tokens[0] is the token the prefill produced, then every step's accepted drafts and bonus."""
    engine.reset()
    drafter.reset()
    timer = timer or StepTimer(engine.t.device)
    engine.t.tp.timer = timer
    out = [engine.prefill(prompt, drafter)]
    metrics: list[StepMetrics] = []
    keep = tuple(drafter.target_layers)
    for s in range(steps):
        timer.start()
        root, n = out[-1], engine.length                      # the root sits at position n, its KV not yet written
        with timer.part("draft"):
            logprobs = drafter.draft(root, n, timer=timer)    # [B-1, V]
        with timer.part("tree"):
            tree = build_tree(tree_kind, root, logprobs, budget)
        with timer.part("target_rest"):                       # verify_attn and allreduce nest inside
            target_next, hid = engine.verify(tree, keep, timer)
        with timer.part("accept_commit"):                     # (each part is also an NVTX range on CUDA)
            if simulate_accept_len is None:
                path, bonus = accept_walk(tree.parents, tree.tokens, target_next)
            else:
                path = forced_path(tree, simulate_accept_len)
                bonus = target_next[path[-1]]
            engine.cache.commit(path)
            drafter.commit(hid[path], n)                       # root + accepted drafts join the context
            out += [tree.tokens[i] for i in path[1:]] + [bonus]
        total, parts = timer.finish()
        m = StepMetrics(s, tree.size, len(path) - 1, tree.depths[path[-1]], len(path), total, parts,
                        simulate_accept_len is not None)
        m.check(logprobs.shape[0])
        if check_cache:
            engine.cache.check()
        metrics.append(m)
        if on_step is not None:
            on_step(m)
    engine.t.tp.timer = None
    return out, metrics


def first_divergence(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
