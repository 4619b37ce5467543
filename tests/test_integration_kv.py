"""Slot/page bookkeeping over many steps, the drafter's cache vs a from-scratch recompute,
and the target's cached decode vs a full recompute."""
from __future__ import annotations

import random

import pytest
import torch

from integration.loop.config import get_model_config
from integration.loop.drafter import DFlashDrafter
from integration.loop.kv import LatentKVCache
from integration.loop.model import MLATarget
from integration.loop.spec import Engine, greedy_decode
from integration.loop.tp import TPGroup
from verify_attn import tree as vtree


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_bookkeeping_many_steps(page_size: int) -> None:
    """Random trees and accepted paths for 150 steps: no row leaked or reused while live, committed rows
    keep their contents (row value = token index), dead rows are NaN."""
    rng = random.Random(page_size)
    c = LatentKVCache(2, 4000, 3, 2, page_size=page_size, seed=page_size)
    addr = c.extend(37)
    for layer in range(2):
        c.write(layer, addr, torch.arange(37, dtype=torch.float32).unsqueeze(1).expand(37, 3))
    for step in range(150):
        t = rng.randint(1, 20)
        parents = vtree.random_parents(t, "bushy", torch.Generator().manual_seed(step))
        base = c.length
        addr = c.begin_tree(t)
        c.check()
        for layer in range(2):   # node i holds 1000 + i until it is committed
            c.write(layer, addr, (1000 + torch.arange(t, dtype=torch.float32)).unsqueeze(1).expand(t, 3))
        idx = c.indices()
        assert int(idx["kv_lens"][0]) == base + t
        leaf = rng.randrange(t)
        path = []
        while leaf != -1:
            path.append(leaf)
            leaf = parents[leaf]
        path = path[::-1][: rng.randint(1, 8)]
        c.commit(path)
        c.check()
        # committed rows now hold the node ids; rewrite them as token indices for the next check
        rows = c.prefix_rows(0, c.length)[:, 0]
        assert rows[base:].tolist() == [1000.0 + i for i in path]
        if page_size == 1:
            sel = torch.tensor(c.pages[base:], dtype=torch.long)
            for layer in range(2):
                c.pools[layer].k[sel, 0, 0] = torch.arange(base, c.length, dtype=torch.float32).unsqueeze(1)
        else:
            pg, off = c._rows(base, c.length - base)
            for layer in range(2):
                c.pools[layer].k[pg, off, 0] = torch.arange(base, c.length, dtype=torch.float32).unsqueeze(1)
        assert c.prefix_rows(1, c.length)[:, 1].tolist() == list(map(float, range(c.length)))
    # every row not owned is poisoned
    owned = set(c.pages)
    free = torch.tensor(sorted(set(range(c.pools[0].num_pages)) - owned))
    assert torch.isnan(c.pools[0].k[free]).all()
    if page_size > 1:  # the tail of the last page past the committed length is poisoned as well
        last = c.length % page_size
        if last:
            assert torch.isnan(c.pools[0].k[c.pages[-1], last:]).all()


def test_commit_rejects_bad_paths() -> None:
    c = LatentKVCache(1, 100, 3, 2, page_size=1)
    c.extend(5)
    c.begin_tree(4)
    for bad in ([], [1], [0, 2, 1], [0, 4]):
        with pytest.raises(ValueError):
            c.commit(bad)


@pytest.fixture(scope="module")
def tiny():
    cfg = get_model_config("tiny")
    return MLATarget(cfg, TPGroup(), dtype=torch.float32, device="cpu")


def test_drafter_cache_equals_recompute(tiny) -> None:
    """Over 40 commits of random lengths the drafter's preallocated caches (full layer indexed by
    position, sliding rings of window + B rows, lookback codes) give the same draft as a fresh drafter
    that ingests the whole context in one commit; the windows were exercised."""
    d = DFlashDrafter(tiny, capacity=600)
    fresh = DFlashDrafter(tiny, capacity=600)
    rng = random.Random(0)
    g = torch.Generator().manual_seed(0)
    nsel, hdim = len(d.target_layers), tiny.cfg.hidden
    hids, pos = [], 0
    for step in range(40):
        m = 20 if step == 0 else rng.randint(1, 8)
        hid = torch.randn(m, nsel, hdim, generator=g)
        d.commit(hid, pos)
        hids.append(hid)
        pos += m
        if step % 5 == 4:
            root = rng.randrange(tiny.cfg.vocab - 1)
            fresh.reset()
            fresh.commit(torch.cat(hids), 0)
            torch.testing.assert_close(d.draft(root, pos), fresh.draft(root, pos), atol=1e-5, rtol=1e-5)
    assert any(lw.window is not None for lw in d.layers) and any(lw.window is None for lw in d.layers)
    assert pos > d.cfg.window + d.block  # the rings wrapped


@pytest.mark.parametrize("alloc", ["shuffled", "contiguous", "fragmented"])
def test_alloc_policies(alloc: str) -> None:
    """contiguous hands a request consecutive slots (a sorted free list, freed ids reused lowest first);
    fragmented hands runs of consecutive ids; shuffled scatters them. Bookkeeping holds for all three."""
    c = LatentKVCache(1, 3000, 3, 2, page_size=1, seed=3, alloc=alloc)
    c.extend(1000)
    steps = sum(int(b - a == 1) for a, b in zip(c.pages, c.pages[1:]))      # consecutive slot pairs
    if alloc == "contiguous":
        assert c.pages == list(range(1000))
    elif alloc == "fragmented":
        assert 900 < steps < 999
    else:
        assert steps < 20
    c.begin_tree(5)
    c.commit([0, 2])
    c.check()
    if alloc == "contiguous":                      # the tree took 1000..1004; 1001, 1003, 1004 came back
        assert c.pages[-2:] == [1000, 1002] and c.begin_tree(2)[0].tolist() == [1001, 1003]
    with pytest.raises(ValueError, match="unknown allocator policy"):
        LatentKVCache(1, 10, 3, 2, alloc="random")


@pytest.mark.parametrize("page_size", [1, 16])
def test_target_cached_decode_equals_full_recompute(tiny, page_size: int) -> None:
    """Greedy decode through the cache (tree_verify, one node per step) gives the same logits as a
    dense prefill of prompt + generated tokens (in chunks of 64: the chunked prefill is checked too)."""
    prompt = torch.randint(0, tiny.cfg.vocab - 1, (150,), generator=torch.Generator().manual_seed(1))
    e = Engine(tiny, backend="reference", page_size=page_size, capacity=400)
    step_logits: list[torch.Tensor] = []
    toks = greedy_decode(e, prompt, 24, logits=step_logits)
    full = Engine(tiny, backend="reference", page_size=page_size, capacity=400, prefill_chunk=64)
    seq = torch.cat([prompt, torch.tensor(toks[:-1])])
    all_logits = full.prefill(seq, all_logits=True)                      # [L + 23, V]
    torch.testing.assert_close(torch.stack(step_logits), all_logits[prompt.numel():], atol=2e-4, rtol=1e-4)
    assert all_logits[prompt.numel() - 1:].argmax(-1).tolist() == toks
