"""Prompts: random text, and repetitive text that a drafter with context can copy from.

Repetitive text (README: how acceptance arises) is a passage that follows the target's
successor map, seen once early in the prompt and again at its end:

    [random lead][passage][random filler ...][first `tail` tokens of the passage]

The target continues the passage (it is the target's own "language"); the drafter can
predict that continuation only by finding the earlier occurrence in its context. The same
passage sits at the same offset from the start at every prompt length, so a long prompt
only moves it further back: the field report's decisive test.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

TEXTS = ("repeat", "random")


@dataclass(frozen=True)
class PromptText:
    prompt: torch.Tensor        # [L] token ids (never the MASK token, the last id)
    continuation: list[int]     # what follows the prompt in the passage ([] for random text)
    passage_at: int = -1        # position of the passage's first occurrence (-1: random text)


def random_prompt(length: int, vocab: int, seed: int) -> torch.Tensor:
    """A seeded random prompt [length]."""
    return torch.randint(0, vocab - 1, (length,), generator=torch.Generator().manual_seed(7 + seed))


def _cycle_lengths(succ: torch.Tensor) -> torch.Tensor:
    """cyc[t] = the length of the successor cycle through token t."""
    n = succ.numel()
    cyc = torch.zeros(n, dtype=torch.long)
    seen = torch.zeros(n, dtype=torch.bool)
    for a in range(n):
        if seen[a]:
            continue
        members, x = [], a
        while not seen[x]:
            seen[x] = True
            members.append(x)
            x = int(succ[x])
        cyc[members] = len(members)
    return cyc


def repeated_prompt(length: int, succ: torch.Tensor, vocab: int, seed: int, passage: int = 160,
                    tail: int = 16, lead: int = 48) -> PromptText:
    """[lead][passage][filler][passage[:tail]]; shrinks lead and passage for short lengths.

    The passage starts on the longest successor cycle (a small vocabulary's cycles are short). A passage
    longer than its cycle is cut to whole periods, so every 2-gram in it is followed by the same token
    each time it occurs (the copy a drafter makes is unambiguous); the continuation follows the cycle."""
    if length < 2 * tail + 8:
        return PromptText(random_prompt(length, vocab, seed), [], -1)
    g = torch.Generator().manual_seed(31 + seed)
    lead = min(lead, max(0, (length - 2 * tail) // 4))
    passage = max(tail + 1, min(passage, length - tail - lead))
    cyc = _cycle_lengths(succ)
    pool = torch.nonzero(cyc >= passage).flatten()
    if not pool.numel():
        pool = torch.nonzero(cyc == cyc.max()).flatten()
        period = int(cyc.max())
        passage = max(period * (passage // period), min(passage, period))
    x = int(pool[int(torch.randint(0, pool.numel(), (), generator=g))])
    run = []
    for _ in range(max(passage, tail + 160)):
        run.append(x)
        x = int(succ[x])
    filler = length - lead - passage - tail
    prompt = torch.cat([torch.randint(0, vocab - 1, (lead,), generator=g), torch.tensor(run[:passage]),
                        torch.randint(0, vocab - 1, (filler,), generator=g), torch.tensor(run[:tail])])
    return PromptText(prompt, run[tail:], lead)


def make_prompt(text: str, length: int, succ: torch.Tensor, vocab: int, seed: int) -> PromptText:
    if text == "random":
        return PromptText(random_prompt(length, vocab, seed), [], -1)
    if text == "repeat":
        return repeated_prompt(length, succ, vocab, seed)
    raise ValueError(f"unknown text {text!r}; known: {', '.join(TEXTS)}")
