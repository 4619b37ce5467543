"""Every bad argument gets a clear exception naming the argument, before any kernel runs."""
import pytest
import torch

from cases import CaseSpec, make_case
import verify_attn


@pytest.fixture
def kw():
    c = make_case(CaseSpec(prefix_lens=(10, 3), tree_sizes=(4, 2), hq=4, hkv=2, dqk=64, dv=64, mla=False))
    return dict(c.kwargs)


@pytest.fixture
def kw_paged():
    c = make_case(CaseSpec(prefix_lens=(10, 3), tree_sizes=(4, 2), page_size=16))
    return dict(c.kwargs)


def call(kw, **over):
    a = {"backend": "reference", **kw, **over}
    return verify_attn.tree_verify(**a)


def edit(t, fn):
    t = t.clone()
    fn(t)
    return t


BAD = [
    ("q", lambda k: {"q": k["q"].to(torch.int32)}, TypeError, "q must have dtype"),
    ("q", lambda k: {"q": k["q"].numpy()}, TypeError, "q must be a torch.Tensor"),
    ("q", lambda k: {"q": k["q"][0]}, ValueError, "q must have 3 dims"),
    ("k_cache", lambda k: {"k_cache": k["k_cache"].half()}, TypeError, "k_cache must have dtype"),
    ("k_cache", lambda k: {"k_cache": k["k_cache"].to("meta")}, ValueError, "k_cache must be on cpu"),
    ("k_cache", lambda k: {"k_cache": k["k_cache"][..., :32]}, ValueError, "k_cache last dim"),
    ("v_cache", lambda k: {"v_cache": k["v_cache"][:-1]}, ValueError, "v_cache leading dims"),
    ("heads", lambda k: {"q": k["q"][:, :3].contiguous()}, ValueError, "multiple of the cache's Hkv"),
    ("qo_indptr", lambda k: {"qo_indptr": k["qo_indptr"].short()}, TypeError, "qo_indptr must have dtype int32 or int64"),
    ("kv_indices", lambda k: {"kv_indices": k["kv_indices"].float()}, TypeError, "kv_indices must have dtype int32 or int64"),
    ("kv_lens", lambda k: {"kv_lens": k["kv_lens"].long()}, TypeError, "kv_lens must have dtype int32"),
    ("max_kv_len", lambda k: {"max_kv_len": 14.0}, TypeError, "max_kv_len must be an int"),
    ("max_kv_len", lambda k: {"max_kv_len": True}, TypeError, "max_kv_len must be an int"),
    ("max_kv_len", lambda k: {"max_kv_len": 0}, ValueError, "max_kv_len must be >= 1"),
    ("max_kv_len", lambda k: {"max_kv_len": 13}, ValueError, "kv_lens\\[0\\]=14 exceeds the max_kv_len hint 13"),
    ("qo_indptr", lambda k: {"qo_indptr": torch.tensor([0, 4, 3], dtype=torch.int32)}, ValueError, "qo_indptr"),
    ("qo_indptr", lambda k: {"qo_indptr": torch.tensor([0, 4, 5], dtype=torch.int32)}, ValueError, "qo_indptr\\[-1\\]"),
    ("kv_indptr", lambda k: {"kv_indptr": k["kv_indptr"][:2]}, ValueError, "kv_indptr must have B\\+1"),
    ("kv_indptr", lambda k: {"kv_indptr": torch.tensor([0, 20, 5], dtype=torch.int32)}, ValueError, "kv_indptr"),
    ("kv_lens", lambda k: {"kv_lens": torch.tensor([14, 1], dtype=torch.int32)}, ValueError, "kv_lens\\[1\\]=1 is smaller"),
    ("kv_lens", lambda k: {"kv_lens": torch.tensor([30, 5], dtype=torch.int32)}, ValueError, "kv_indices: request 0 needs"),
    ("kv_indices", lambda k: {"kv_indices": edit(k["kv_indices"], lambda t: t.__setitem__(0, 10**6))}, ValueError, "out of range"),
    ("kv_indices", lambda k: {"kv_indices": edit(k["kv_indices"], lambda t: t.__setitem__(0, -1))}, ValueError, "out of range"),
    ("tree_mask", lambda k: {"tree_mask": edit(k["tree_mask"], lambda t: t.__setitem__((2, 0), 1))}, ValueError, "row 2 .* own node"),
    ("tree_mask", lambda k: {"tree_mask": edit(k["tree_mask"], lambda t: t.__setitem__((4, 0), 7))}, ValueError, "nodes >= its request's T_b"),
    ("tree_mask", lambda k: {"tree_mask": k["tree_mask"][:-1]}, ValueError, "tree_mask must have total_q"),
    ("tree_mask", lambda k: {"tree_mask": k["tree_mask"][:, :0]}, ValueError, "tree_mask must have at least one"),
    ("sm_scale", lambda k: {"sm_scale": -1.0}, ValueError, "sm_scale"),
    ("sm_scale", lambda k: {"sm_scale": "0.1"}, TypeError, "sm_scale"),
    ("page_size", lambda k: {"page_size": 0}, ValueError, "page_size"),
    ("page_size", lambda k: {"page_size": 16}, ValueError, "k_cache must have 4 dims"),
    ("out", lambda k: {"out": torch.empty(3, 4, 64)}, ValueError, "out must have shape"),
    ("out", lambda k: {"out": torch.empty(6, 4, 64, dtype=torch.float16)}, TypeError, "out must have dtype"),
    ("backend", lambda k: {"backend": "nope"}, ValueError, "unknown backend 'nope'; available: auto"),
    ("config", lambda k: {"config": {"block_q": 3}}, ValueError, "unknown KernelConfig fields"),
    ("q", lambda k: {"q": k["q"].transpose(1, 2).contiguous().transpose(1, 2)}, ValueError, "q must be contiguous in its last dim"),
]


@pytest.mark.parametrize("name,mk,exc,msg", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_argument(kw, name, mk, exc, msg):
    with pytest.raises(exc, match=msg):
        call(kw, **mk(kw))


def test_paged_page_size_mismatch(kw_paged):
    with pytest.raises(ValueError, match="page_size=32"):
        call(kw_paged, page_size=32)


def test_paged_page_id_out_of_range(kw_paged):
    bad = kw_paged["kv_indices"].clone()
    bad[-1] = kw_paged["k_cache"].shape[0]
    with pytest.raises(ValueError, match="page ids out of range"):
        call(kw_paged, kv_indices=bad)


def test_aliased_v_longer_than_k_rejected(kw_paged):
    rows = torch.randn(kw_paged["k_cache"].shape[:-1] + (600,))
    with pytest.raises(ValueError, match="Dv \\(600\\) must be <= Dqk \\(576\\)"):
        call(kw_paged, k_cache=rows[..., :576], v_cache=rows)


def test_shapes_only_validation_skips_host_reads(kw):
    bad = kw["kv_indices"].clone()
    bad[0] = -5
    verify_attn.set_validation("shapes")
    try:
        # the shape checks still run ...
        with pytest.raises(ValueError, match="tree_mask must have total_q"):
            call(kw, tree_mask=kw["tree_mask"][:-1])
    finally:
        verify_attn.set_validation("full")
    with pytest.raises(ValueError, match="out of range"):
        call(kw, kv_indices=bad)
    with pytest.raises(ValueError, match="validation mode"):
        verify_attn.set_validation("none")


def test_good_call_passes(kw):
    out, lse = call(kw, return_lse=True)
    assert out.shape == (6, 4, 64) and lse.shape == (6, 4) and lse.dtype == torch.float32
    assert torch.isfinite(out).all()


def test_auto_on_cpu_uses_reference(kw):
    out = verify_attn.tree_verify(**kw)
    ref = verify_attn.tree_verify(**kw, backend="reference")
    assert torch.equal(out, ref)
