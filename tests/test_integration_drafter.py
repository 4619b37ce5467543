"""The DFlash drafter (issue 15 items 1-2): its drafts depend on the context and on the injected target
states (repetitive text is drafted correctly only when the earlier occurrence and the states are there),
DDTree builds branching trees from them at tiny and Kimi shapes, and its attention reads GQA K/V natively,
the sliding layers O(window) rows."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from cases import temporary_backend
from integration.loop.config import get_model_config
from integration.loop.ddtree import build_ddtree
from integration.loop.drafter import DFlashDrafter
from integration.loop.model import MLATarget
from integration.loop.spec import Engine
from integration.loop.texts import random_prompt, repeated_prompt
from integration.loop.tp import TPGroup
from verify_attn.backends import Backend
from verify_attn.reference import _run as reference_run

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CTX = 700


def kimi_shaped():
    """Kimi K2's per-rank attention (8 heads, 576/512 rows) and Kimi-K2.5-DFlash's drafter shape (6 layers,
    64 query / 8 KV heads of 128, one full layer last, block 8); hidden, vocab, depth and window shrunk for
    the CPU (vocab > hidden, as in Kimi)."""
    base = get_model_config("kimi-k2-tp8")
    return replace(base, num_layers=2, num_heads=8, hidden=1024, vocab=4096, q_lora=256, ffn=1024,
                   drafter=replace(base.drafter, ffn=4096, window=64, target_layers=(1,), calib_tokens=2048))


@pytest.fixture(scope="module", params=["tiny", "kimi-shaped"])
def model(request):
    cfg = get_model_config("tiny") if request.param == "tiny" else kimi_shaped()
    t = MLATarget(cfg, TPGroup(), dtype=torch.float32, device="cpu")
    return request.param, t, DFlashDrafter(t, capacity=CTX + 64)


def draft_after(t, d, prompt, states: str = "real") -> tuple[int, torch.Tensor]:
    """(root, log-probs [B-1, V]) after prefilling `prompt`; states 'zero' injects zero target states."""
    e = Engine(t, backend="reference", page_size=1, capacity=CTX + 64)
    d.reset()
    if states == "real":
        root = int(e.prefill(prompt, d).argmax())
    else:
        root = int(e.prefill(prompt).argmax())
        d.commit(torch.zeros(prompt.numel(), len(d.target_layers), t.cfg.hidden), 0)
    return root, d.draft(root, e.length)


def test_drafts_copy_the_context(model) -> None:
    name, t, d = model
    text = repeated_prompt(CTX, t.succ, t.cfg.vocab, 0)
    want = torch.tensor(text.continuation[1:d.block])                 # depths 1..B-1 after the root
    root, lp = draft_after(t, d, text.prompt)
    assert root == text.continuation[0]
    p_ok = lp.gather(1, want[:, None]).exp().flatten()
    assert int((lp.argmax(-1) == want).sum()) >= d.block - 2 and float(p_ok[:4].mean()) > 0.8, p_ok
    # the same prompt with the earlier occurrence replaced by random text: nothing to copy
    cut = text.prompt.clone()
    at = text.passage_at
    cut[at:at + len(text.continuation)] = random_prompt(len(text.continuation), t.cfg.vocab, 5)
    _, lp_cut = draft_after(t, d, cut)
    # the injected target states zeroed: the drafter cannot read the context either
    _, lp_zero = draft_after(t, d, text.prompt, states="zero")
    for other in (lp_cut, lp_zero):
        assert int((other.argmax(-1) == want).sum()) <= 1
        assert float(other.gather(1, want[:, None]).exp().mean()) < 0.1


def test_ddtree_builds_branching_trees(model) -> None:
    """Not a depth-1 fan: the tree follows the copied continuation deep and branches off it."""
    name, t, d = model
    text = repeated_prompt(CTX, t.succ, t.cfg.vocab, 0)
    root, lp = draft_after(t, d, text.prompt)
    tree = build_ddtree(root, lp, 16)
    children: dict[int, int] = {}
    for p in tree.parents[1:]:
        children[p] = children.get(p, 0) + 1
    assert max(tree.depths) >= d.block - 2
    assert any(n >= 2 for p, n in children.items() if p != 0)         # a branch below the root
    assert sum(1 for x in tree.depths if x == 1) < tree.size - 2       # most nodes deeper than depth 1


def test_attention_reads_native_gqa_and_windows() -> None:
    """Every drafter attention is a tree_verify call over the caches in the model dtype, GQA K/V at their own
    head count (no expansion); sliding layers read at most window + B rows, the full layer n + B."""
    t = MLATarget(get_model_config("tiny"), TPGroup(), dtype=torch.float32, device="cpu")
    seen = []

    def capture(p, config, out, lse):
        seen.append((p.num_q_heads, p.num_kv_heads, p.head_dim_qk, p.k_cache.dtype, int(p.kv_lens[0])))
        reference_run(p, config, out, lse)

    d = DFlashDrafter(t, capacity=CTX + 64, backend="test-capture-drafter")
    c = d.cfg
    text = repeated_prompt(CTX, t.succ, t.cfg.vocab, 0)
    with temporary_backend(Backend("test-capture-drafter", capture)):
        _, _ = draft_after(t, d, text.prompt)
    assert len(seen) == c.num_layers
    for (hq, hkv, dqk, dt, n), lw in zip(seen, d.layers):
        assert (hq, hkv, dqk, dt) == (c.num_heads, c.num_kv_heads, c.head_dim, torch.float32)
        assert n == (CTX + c.block if lw.window is None else c.window + c.block)
