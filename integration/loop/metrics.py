"""Per-step metrics of the speculative loop, from independent counters, checked against each other.

Each number is read where it is produced, not derived from the others:
  commit_len      the growth of the target cache's committed length (kv.py)
  tokens_emitted  the growth of the output token list (the loop)
  drafter_growth  the growth of the drafter's context length (drafter.py)
  accepted_depth  the tree depth of the last accepted node (the tree)
  accepted_drafts the accepted non-root nodes on the path (the acceptance walk)
They must agree every step: commit_len == tokens_emitted == drafter_growth
== accepted_depth + 1 == accepted_drafts + 1 (the +1 is the bonus token), and the drafter's
context length must equal the target cache's. A mismatch raises MetricsMismatch naming
every counter, which is how a metrics bug (counters kept in different places, as in the
field report) shows up instead of a plausible-looking commit length.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


class MetricsMismatch(AssertionError):
    """The independent counters of one step disagree."""


@dataclass
class StepMetrics:
    step: int
    tree_size: int
    accepted_drafts: int            # accepted non-root nodes (the acceptance walk)
    accepted_depth: int             # tree depth of the last accepted node
    commit_len: int                 # growth of the target cache's committed length
    tokens_emitted: int             # growth of the output token list
    drafter_growth: int             # growth of the drafter's context length
    drafter_ctx: int = 0            # drafter context length after the step
    cache_len: int = 0              # target cache length after the step
    max_depth: int = 0              # deepest depth the drafter proposes (block - 1)
    budget: int = 0                 # draft-node budget the tree was built with
    step_s: float = 0.0
    parts: dict = field(default_factory=dict)   # exclusive seconds per part
    forced: bool = False            # commit length forced by --simulate-accept-len
    logit_err: Optional[float] = None   # max |logits - float64-reference logits| of this verify, when checked

    def counters(self) -> dict[str, int]:
        return {"commit_len (reported; the target cache growth)": self.commit_len,
                "tokens emitted": self.tokens_emitted,
                "drafter context growth": self.drafter_growth,
                "depth of the last accepted node + 1": self.accepted_depth + 1,
                "accepted drafts + 1": self.accepted_drafts + 1}

    def check(self) -> None:
        c = self.counters()
        if len(set(c.values())) != 1:
            raise MetricsMismatch(f"step {self.step}: counters disagree: "
                                  + ", ".join(f"{k} = {v}" for k, v in c.items()))
        if self.drafter_ctx != self.cache_len:
            raise MetricsMismatch(f"step {self.step}: drafter context {self.drafter_ctx} != target cache "
                                  f"length {self.cache_len}")
        if not 0 <= self.accepted_drafts <= min(self.tree_size - 1, self.max_depth):
            raise MetricsMismatch(f"step {self.step}: accepted_drafts {self.accepted_drafts} outside "
                                  f"[0, min(tree_size-1={self.tree_size - 1}, max depth={self.max_depth})]")
