"""The accept walk and its independent check (integration/loop/accept.py): on hand-built trees the brute-force
count of the longest greedy-accepted root-to-leaf path agrees with the walk, the two planted walk bugs are
told apart from it, and `decode --check` fails a run whose walk disagrees."""
from __future__ import annotations

import pytest
import torch

from integration.loop.accept import AcceptMismatch, accept_walk, longest_accepted
from integration.measure.decode import check_verdict

#        0 (root)
#      /   \
#     1(a)  2(b)          the target continues root -> a -> c -> e
#    / \      \
#   3(c) 4(d)  5(c)
#   |
#   6(e)
PARENTS = [-1, 0, 0, 1, 1, 2, 3]
TOKENS = [0, 10, 11, 12, 13, 12, 14]
NEXT = {0: 10, 1: 12, 2: 99, 3: 14, 4: 99, 5: 99, 6: 15}


def _next(n=len(PARENTS)):
    return [NEXT[i] for i in range(n)]


def test_walk_and_independent_count_agree():
    path, bonus = accept_walk(PARENTS, TOKENS, _next())
    assert path == [0, 1, 3, 6] and bonus == 15
    assert longest_accepted(PARENTS, TOKENS, _next()) == 3
    # a target that rejects the root's children: nothing accepted, the bonus is its own choice
    nxt = _next()
    nxt[0] = 77
    assert accept_walk(PARENTS, TOKENS, nxt) == ([0], 77) and longest_accepted(PARENTS, TOKENS, nxt) == 0
    # a single-node tree (plain decode)
    assert longest_accepted([-1], [5], [6]) == 0


def test_the_planted_walks_differ_from_the_count():
    early, _ = accept_walk(PARENTS, TOKENS, _next(), bug="early")
    assert len(early) - 1 == 2 != longest_accepted(PARENTS, TOKENS, _next())
    sib, _ = accept_walk(PARENTS, TOKENS, _next(), bug="sibling")
    assert sib[1] == 2 and TOKENS[sib[1]] != _next()[0]          # node 2 is not the target's choice


def test_speculative_decode_raises_on_a_planted_walk():
    """The loop itself, tiny model, reference attention: with check_accept a planted walk raises at its
    first disagreeing step; the correct walk passes every step."""
    from integration.loop.config import get_model_config
    from integration.loop.drafter import DFlashDrafter
    from integration.loop.model import MLATarget
    from integration.loop.spec import Engine, speculative_decode
    from integration.loop.texts import repeated_prompt
    from integration.loop.tp import TPGroup
    torch.manual_seed(0)
    target = MLATarget(get_model_config("tiny", seed=0), TPGroup(), dtype=torch.float32, device=torch.device("cpu"))
    text = repeated_prompt(300, target.succ, target.cfg.vocab, 0)
    cap = 300 + 64

    def run(bug: str):
        eng = Engine(target, backend="reference", page_size=1, capacity=cap, seed=0)
        return speculative_decode(eng, DFlashDrafter(target, capacity=cap), text.prompt, 2, budget=16,
                                  accept_bug=bug, check_accept=True)

    toks, metrics = run("")
    assert any(m.accepted_drafts > 0 for m in metrics)
    with pytest.raises(AcceptMismatch, match="longest root-to-leaf path"):
        run("early")


def test_check_verdict_fails_on_an_accept_mismatch():
    ok, msg = check_verdict({"accept_error": "step 0: the accept walk committed 2 drafts", "logit_errs": [],
                             "divergence": None, "tokens": []})
    assert not ok and "CHECK FAILED: step 0: the accept walk committed 2 drafts" in msg
