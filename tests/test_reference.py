"""The float64 reference against an independent, deliberately naive implementation of
SGLang's tree-verify semantics: a dense uint8 custom mask of T x (prefix + T) per
request, built by walking parent pointers, explicit per-token row lookups, and a
numpy softmax per (node, head)."""
import math

import numpy as np
import pytest
import torch

from cases import CaseSpec, check_against_reference, make_case, poisoned_out
import verify_attn


def naive_sglang_verify(case):
    kw = case.kwargs
    q = kw["q"].double().numpy()
    kc, vc = kw["k_cache"].double().numpy(), kw["v_cache"].double().numpy()
    qo, kvp = kw["qo_indptr"].tolist(), kw["kv_indptr"].tolist()
    idx, lens, ps = kw["kv_indices"].tolist(), kw["kv_lens"].tolist(), kw["page_size"]
    hq, hkv = q.shape[1], kc.shape[-2]
    g = hq // hkv
    out = np.zeros((q.shape[0], hq, vc.shape[-1]))
    lse = np.zeros((q.shape[0], hq))
    for b, parents in enumerate(case.parents):
        t = len(parents)
        n = lens[b]
        prefix = n - t
        mask = np.zeros((t, prefix + t), dtype=np.uint8)  # SGLang custom_mask block of request b
        for i in range(t):
            mask[i, :prefix] = 1
            j = i
            while j != -1:
                mask[i, prefix + j] = 1
                j = parents[j]

        def row(cache, tok):
            if ps == 1:
                return cache[idx[kvp[b] + tok]]
            return cache[idx[kvp[b] + tok // ps], tok % ps]

        ks = np.stack([row(kc, x) for x in range(n)]) if n else np.zeros((0, hkv, kc.shape[-1]))
        vs = np.stack([row(vc, x) for x in range(n)]) if n else np.zeros((0, hkv, vc.shape[-1]))
        for i in range(t):
            for h in range(hq):
                kh = h // g
                s = np.array([kw["sm_scale"] * float(q[qo[b] + i, h] @ ks[x, kh]) if mask[i, x] else -math.inf
                              for x in range(n)])
                m = s.max()
                e = np.exp(s - m)
                out[qo[b] + i, h] = (e[:, None] * vs[:, kh]).sum(0) / e.sum()
                lse[qo[b] + i, h] = m + math.log(e.sum())
    return torch.from_numpy(out), torch.from_numpy(lse)


CASES = [
    CaseSpec(prefix_lens=(54,), tree_sizes=(9,), tree_kind="bushy", page_size=1, seed=1),
    CaseSpec(prefix_lens=(0, 1, 97), tree_sizes=(1, 7, 33), tree_kind="deep", page_size=16, seed=2),
    CaseSpec(prefix_lens=(97, 54), tree_sizes=(12, 1), tree_kind="star", page_size=16, seed=3),
    CaseSpec(prefix_lens=(31, 0), tree_sizes=(6, 4), tree_kind="chain", page_size=1, seed=4,
             hq=8, hkv=2, dqk=64, dv=64, mla=False),
    CaseSpec(prefix_lens=(17, 40), tree_sizes=(5, 3), tree_kind="bushy", page_size=16, seed=5,
             hq=6, hkv=3, dqk=128, dv=128, mla=False),
    CaseSpec(prefix_lens=(5,), tree_sizes=(40,), tree_kind="bushy", page_size=1, seed=6,
             hq=16, hkv=1, dqk=256, dv=256, mla=False),
]


@pytest.mark.parametrize("spec", CASES, ids=lambda s: s.id)
def test_reference_matches_naive_sglang_semantics(spec):
    case = make_case(spec)
    out, lse = verify_attn.tree_verify(**case.kwargs, backend="reference", return_lse=True, out=poisoned_out(case))
    want_out, want_lse = naive_sglang_verify(case)
    rel = float(((out.double() - want_out).abs() / want_out.abs().clamp_min(1e-6)).max())
    # fp32 inputs: both compute in float64; the reference's output is rounded to
    # float32 (q's dtype), so they agree to ~6e-8 (measured); 1e-4 is the bar.
    assert rel < 1e-4, rel
    assert float((lse.double() - want_lse).abs().max()) < 1e-4


@pytest.mark.parametrize("page_size", [1, 16])
def test_layouts_give_identical_results(page_size):
    """The same logical KV in page_size=1 and paged layouts (shuffled, NaN-poisoned) gives
    bitwise-identical reference outputs."""
    base = CaseSpec(prefix_lens=(97, 0, 33), tree_sizes=(5, 3, 17), seed=11, page_size=1)
    a = make_case(base)
    b = make_case(CaseSpec(**{**base.__dict__, "page_size": 16 if page_size == 1 else 64}))
    oa = verify_attn.tree_verify(**a.kwargs, backend="reference")
    ob = verify_attn.tree_verify(**b.kwargs, backend="reference")
    assert torch.isfinite(oa).all()
    assert torch.equal(oa, ob)


def test_reference_is_chunked_at_long_context(monkeypatch):
    """Chunking the KV does not change the result (online softmax merge is exact)."""
    from verify_attn import reference
    case = make_case(CaseSpec(prefix_lens=(300,), tree_sizes=(6,), seed=12, hq=4, hkv=2, dqk=64, dv=64, mla=False))
    full = verify_attn.tree_verify(**case.kwargs, backend="reference", return_lse=True)
    monkeypatch.setattr(reference, "CHUNK", 37)
    chunked = verify_attn.tree_verify(**case.kwargs, backend="reference", return_lse=True)
    torch.testing.assert_close(full[0], chunked[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(full[1], chunked[1], atol=1e-6, rtol=1e-6)


def test_check_against_reference_catches_a_wrong_output():
    case = make_case(CaseSpec(prefix_lens=(20,), tree_sizes=(4,), hq=2, hkv=1, dqk=64, dv=64, mla=False))
    out = verify_attn.tree_verify(**case.kwargs, backend="reference")
    check_against_reference(out, None, case)
    out[1, 0, 3] += 0.05
    with pytest.raises(AssertionError):
        check_against_reference(out, None, case)
