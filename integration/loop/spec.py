"""The speculative decode loop, read top to bottom in `speculative_decode`.

One step: draft a block -> build the tree -> verify it with tree_verify -> accept (accept.py:
greedy, or target-only tree sampling when temperature > 0) -> commit the accepted path to
the target cache and the drafter. Metrics come from independent counters (metrics.py) and
are checked against each other every step.

Greedy speculative decoding emits exactly the tokens plain greedy decoding emits; `--check`
compares with `greedy_decode` on the float64 reference backend, and `check_backend` (the
probe's criterion) compares every verify's logits with the reference's.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from verify_attn import tree as vtree

from .accept import AcceptMismatch, accept_walk, forced_path, longest_accepted, sample_walk
from .ddtree import DraftTree, build_tree
from .kv import LatentKVCache
from .metrics import StepMetrics
from .model import MLATarget, prefill_attention, verify_attention
from .timing import StepTimer


class Engine:
    """The target, its KV cache and the attention backend for one request.

    check_backend: when set (e.g. "reference"), every verify also runs the target with that backend
    first (the cache keeps the rows the real backend writes after it) and `last_logit_err` holds the
    largest |logit difference|: the probe's per-verify criterion."""

    def __init__(self, target: MLATarget, *, backend: str, page_size: int, capacity: int, seed: int = 0,
                 prefill_chunk: Optional[int] = None, alloc: str = "shuffled",
                 check_backend: Optional[str] = None) -> None:
        self.t, self.backend, self.page_size, self.capacity, self.seed = target, backend, page_size, capacity, seed
        self.alloc, self.check_backend = alloc, check_backend
        # prompt tokens per prefill chunk; default: long chunks on GPU (each chunk re-gathers the prefix per layer)
        self.prefill_chunk = prefill_chunk or (32768 if target.device.type == "cuda" else 1024)
        self.last_logit_err: Optional[float] = None
        self.reset()

    def reset(self) -> None:
        c = self.t.cfg
        self.cache = LatentKVCache(c.num_layers, self.capacity, c.cache_dim, c.kv_lora, page_size=self.page_size,
                                   dtype=self.t.dtype, device=self.t.device, seed=self.seed, alloc=self.alloc)

    @property
    def length(self) -> int:
        return self.cache.length

    def prefill(self, prompt: torch.Tensor, drafter=None, chunk: Optional[int] = None, all_logits: bool = False):
        """Run the prompt [L] through the target (dense causal attention), filling the cache; feed the
        drafter the chosen layers' hidden states. Returns the logits [V] after the last token (or, with
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
                drafter.commit(hid, start, last_chunk=start + chunk >= prompt.numel())
            x_last = x[-1:]
            if all_logits:
                xs.append(x)
        if all_logits:
            return self.t.logits(torch.cat(xs))
        return self.t.logits(x_last)[0]

    def verify(self, tree: DraftTree, keep: tuple[int, ...] = (), timer: Optional[StepTimer] = None):
        """Target forward over the tree's nodes -> (logits [T, V] float32 on the device, kept hidden [T, nsel, d])."""
        dev = self.t.device
        addr = self.cache.begin_tree(tree.size)
        mask = vtree.pack_mask(vtree.ancestor_mask(tree.parents)).to(dev)                 # [T, W] int32
        pos = torch.tensor(tree.depths, device=dev) + self.cache.length
        toks = torch.tensor(tree.tokens, device=dev)
        ref = None
        if self.check_backend is not None:        # first, so the real backend's rows are the ones kept
            x, _ = self.t.forward(toks, pos, verify_attention(self.t, self.cache, addr, mask, self.check_backend))
            ref = self.t.logits(x)
        attn = verify_attention(self.t, self.cache, addr, mask, self.backend, timer)
        x, hid = self.t.forward(toks, pos, attn, keep)
        lg = self.t.logits(x)                                                           # [T, V]
        self.last_logit_err = None if ref is None else float((lg - ref).abs().max())
        return lg, hid


def greedy_decode(engine: Engine, prompt: torch.Tensor, n: int, logits: Optional[list] = None,
                  logit_errs: Optional[list] = None) -> list[int]:
    """Plain greedy decoding: every step verifies a tree of one node (the last token).
    `logits`, when given, collects each decode step's logits [V]; `logit_errs` each verify's
    max |logit - reference logit| (engine.check_backend must be set)."""
    engine.reset()
    out = [int(engine.prefill(prompt).argmax())]
    single = DraftTree([-1], [0], [0], [0.0])
    while len(out) < n:
        single.tokens[0] = out[-1]
        lg, _ = engine.verify(single)
        if logits is not None:
            logits.append(lg[0])
        if logit_errs is not None:
            logit_errs.append(engine.last_logit_err)
        engine.cache.commit([0])
        out.append(int(lg[0].argmax()))
    return out[:n]


def speculative_decode(engine: Engine, drafter, prompt: torch.Tensor, steps: int, *, tree_kind: str = "ddtree",
                       budget=16, simulate_accept_len: Optional[int] = None, temperature: float = 0.0,
                       seed: int = 0, timer: Optional[StepTimer] = None, check_cache: bool = False,
                       plant_metrics_bug: bool = False, accept_bug: str = "", check_accept: bool = False,
                       on_step=None) -> tuple[list[int], list[StepMetrics]]:
    """Prefill, then `steps` draft -> tree -> verify -> accept -> commit steps. Returns (tokens, metrics):
    tokens[0] is the token the prefill produced, then every step's accepted drafts and bonus.

    budget: draft nodes per tree (an int), or a policy with choose(ctx, logprobs) -> int and
    observe(metrics, tree, logprobs) (integration/planning/budget.py: --budget auto).
    temperature > 0: target-only tree sampling (accept.py), seeded by `seed`.
    plant_metrics_bug: a deliberate metrics bug (tests): the reported commit length is read from the
    acceptance counter, kept apart from the cache, which misses the bonus token.
    accept_bug: a deliberate accept-walk bug (tests): "early" | "sibling" (accept.accept_walk).
    check_accept (greedy): every step's accepted drafts must equal the longest greedy-accepted root-to-leaf path
    of its tree, found by accept.longest_accepted (an independent, brute-force count); AcceptMismatch if not."""
    engine.reset()
    drafter.reset()
    timer = timer or StepTimer(engine.t.device)
    engine.t.tp.timer = timer
    gen = torch.Generator().manual_seed(20_000 + seed)

    def pick(lg_row: torch.Tensor) -> int:
        if temperature <= 0:
            return int(lg_row.argmax())
        return int(torch.multinomial(torch.softmax(lg_row.double().cpu() / temperature, -1), 1, generator=gen))

    out = [pick(engine.prefill(prompt, drafter))]
    metrics: list[StepMetrics] = []
    keep = tuple(drafter.target_layers)
    for s in range(steps):
        timer.start()
        root, n = out[-1], engine.length                      # the root sits at position n, its KV not yet written
        n_out, n_draft = len(out), drafter.n_ctx
        with timer.part("draft"):
            logprobs = drafter.draft(root, n, timer=timer)    # [B-1, V] on the device
            b = budget.choose(n, logprobs) if hasattr(budget, "choose") else int(budget)
        with timer.part("tree"):
            tree = build_tree(tree_kind, root, logprobs, b)   # top-k on the device, then [B-1, k] to the host
        with timer.part("target_rest"):                       # verify_attn and allreduce nest inside
            lg, hid = engine.verify(tree, keep, timer)        # [T, V]
        with timer.part("accept_commit"):                     # (each part is also an NVTX range on CUDA)
            if simulate_accept_len is not None:
                path = forced_path(tree, simulate_accept_len)
                bonus = pick(lg[path[-1]])
            elif temperature > 0:
                probs = torch.softmax(lg.float() / temperature, -1)                      # [T, V] on the device
                path, bonus = sample_walk(tree.parents, tree.tokens, lambda i: probs[i].double().cpu(), gen)
            else:
                target_next = lg.argmax(-1).tolist()
                path, bonus = accept_walk(tree.parents, tree.tokens, target_next, bug=accept_bug)
                if check_accept:
                    want = longest_accepted(tree.parents, tree.tokens, target_next)
                    wrong = next((k for k in range(1, len(path)) if tree.parents[path[k]] != path[k - 1]
                                  or tree.tokens[path[k]] != target_next[path[k - 1]]), None)
                    if wrong is not None or len(path) - 1 != want:
                        raise AcceptMismatch(
                            f"step {s}: the accept walk committed {len(path) - 1} drafts"
                            + (f", its node {path[wrong]} (token {tree.tokens[path[wrong]]}) is not the target's "
                               f"choice {target_next[path[wrong - 1]]} after node {path[wrong - 1]}" if wrong else "")
                            + f"; the longest root-to-leaf path greedy decoding accepts has {want}")
            engine.cache.commit(path)
            drafter.commit(hid[path], n)                       # root + accepted drafts join the context
            out += [tree.tokens[i] for i in path[1:]] + [bonus]
        total, parts = timer.finish()
        commit_len = engine.length - n
        if plant_metrics_bug:                                  # BUG (planted): a counter kept elsewhere
            commit_len = len(path) - 1
        m = StepMetrics(s, tree.size, accepted_drafts=len(path) - 1, accepted_depth=tree.depths[path[-1]],
                        commit_len=commit_len, tokens_emitted=len(out) - n_out,
                        drafter_growth=drafter.n_ctx - n_draft, drafter_ctx=drafter.n_ctx, cache_len=engine.length,
                        max_depth=logprobs.shape[0], budget=b, step_s=total, parts=parts,
                        forced=simulate_accept_len is not None, logit_err=engine.last_logit_err)
        m.check()
        if hasattr(budget, "observe"):
            budget.observe(m, tree, logprobs)
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
