"""Tree utilities: parents, depths, packed ancestor masks, batching, SGLang masks."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verify_attn import tree as vt


@st.composite
def parent_lists(draw, max_nodes=70):
    t = draw(st.integers(1, max_nodes))
    return [-1] + [draw(st.integers(0, i - 1)) for i in range(1, t)]


def closure(parents):
    """Ancestor-or-self sets by brute force (independent of vt.ancestor_mask)."""
    out = []
    for i in range(len(parents)):
        s, j = set(), i
        while j != -1:
            s.add(j)
            j = parents[j]
        out.append(s)
    return out


@settings(max_examples=60, deadline=None)
@given(parent_lists())
def test_mask_is_ancestor_closure(parents):
    m = vt.ancestor_mask(parents)
    cl = closure(parents)
    for i, s in enumerate(cl):
        assert set(torch.nonzero(m[i]).flatten().tolist()) == s


@settings(max_examples=60, deadline=None)
@given(parent_lists())
def test_depths_match_ancestor_count(parents):
    d = vt.depths(parents)
    assert d == [len(s) - 1 for s in closure(parents)]
    assert vt.positions(parents, 100) == [100 + x for x in d]


@settings(max_examples=60, deadline=None)
@given(parent_lists(max_nodes=100), st.integers(0, 2))
def test_pack_unpack_round_trip(parents, extra_words):
    dense = vt.ancestor_mask(parents)
    w = vt.num_words(len(parents)) + extra_words
    packed = vt.pack_mask(dense, w)
    assert packed.dtype == torch.int32 and packed.shape == (len(parents), w)
    assert torch.equal(vt.unpack_mask(packed, len(parents)), dense)
    # bit (j % 32) of word j // 32, sign bit included
    for i in range(len(parents)):
        for j in range(len(parents)):
            bit = (int(packed[i, j // 32]) >> (j % 32)) & 1
            assert bit == int(dense[i, j])


@settings(max_examples=40, deadline=None)
@given(st.lists(parent_lists(max_nodes=40), min_size=1, max_size=4), st.data())
def test_sglang_mask_round_trip(trees, data):
    prefix = [data.draw(st.integers(0, 30)) for _ in trees]
    qo, packed = vt.pack_batch(trees)
    cm, mi = vt.to_sglang_custom_mask(packed, qo, prefix)
    assert cm.dtype == torch.uint8
    assert int(mi[-1]) == sum(len(t) * (len(t) + p) for t, p in zip(trees, prefix))
    # each row: the whole prefix, then exactly the ancestor closure
    for b, (t, p) in enumerate(zip(trees, prefix)):
        block = cm[int(mi[b]): int(mi[b + 1])].view(len(t), p + len(t))
        assert bool(block[:, :p].all())
        for i, s in enumerate(closure(t)):
            assert set(torch.nonzero(block[i, p:]).flatten().tolist()) == s
    assert torch.equal(vt.from_sglang_custom_mask(cm, mi, qo, prefix), packed)


def test_pack_batch_indptr():
    qo, mask = vt.pack_batch([[-1], [-1, 0, 0], [-1, 0]])
    assert qo.tolist() == [0, 1, 4, 6]
    assert mask.shape == (6, 1)
    assert mask[:, 0].tolist() == [1, 1, 3, 5, 1, 3]


@pytest.mark.parametrize("bad,msg", [
    ([], "at least one"), ([0], "must be -1"), ([-1, 1], "precede"), ([-1, 0, 3], "precede"), ([-1, -1], "precede"),
])
def test_bad_parents_rejected(bad, msg):
    with pytest.raises(ValueError, match=msg):
        vt.validate_parents(bad)


@pytest.mark.parametrize("kind", vt.TREE_KINDS)
def test_random_parents_valid(kind):
    for t in (1, 2, 17, 64):
        p = vt.random_parents(t, kind, torch.Generator().manual_seed(t))
        vt.validate_parents(p)
        assert len(p) == t
    assert vt.random_parents(5, "chain") == [-1, 0, 1, 2, 3]
    assert vt.random_parents(4, "star") == [-1, 0, 0, 0]


def test_sglang_mask_hiding_prefix_rejected():
    qo, packed = vt.pack_batch([[-1, 0]])
    cm, mi = vt.to_sglang_custom_mask(packed, qo, [3])
    cm[1] = 0
    with pytest.raises(ValueError, match="prefix"):
        vt.from_sglang_custom_mask(cm, mi, qo, [3])
