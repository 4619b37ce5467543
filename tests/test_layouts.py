"""KV pools: allocation, writes, poisoning, index building and row addressing."""
import pytest
import torch

from verify_attn.layouts import PagedPool, SlotPool, gather_rows, lay_out


@pytest.mark.parametrize("page_size", [1, 3, 16, 64, 128])
def test_lay_out_round_trip(page_size):
    g = torch.Generator().manual_seed(page_size)
    seqs = [torch.randn(n, 2, 8, generator=g) for n in (0, 1, 54, 97)]
    vs = [torch.randn(n, 2, 4, generator=g) for n in (0, 1, 54, 97)]
    lay = lay_out(seqs, vs, page_size, generator=g, dtype=torch.float32)
    assert lay["kv_indptr"].dtype == torch.int32 and lay["kv_lens"].tolist() == [0, 1, 54, 97]
    for b, s in enumerate(seqs):
        idx = lay["kv_indices"][lay["kv_indptr"][b]: lay["kv_indptr"][b + 1]]
        assert idx.numel() == (s.shape[0] + page_size - 1) // page_size
        assert torch.equal(gather_rows(lay["k_cache"], idx, page_size, 0, s.shape[0]), s)
        assert torch.equal(gather_rows(lay["v_cache"], idx, page_size, 0, s.shape[0]), vs[b])
    # every slot no request owns is NaN
    owned = torch.zeros(lay["pool"].k.shape[:2], dtype=torch.bool)
    for b, s in enumerate(seqs):
        idx = lay["kv_indices"][lay["kv_indptr"][b]: lay["kv_indptr"][b + 1]].long()
        t = torch.arange(s.shape[0])
        owned[idx[t // page_size], t % page_size] = True
    assert torch.isnan(lay["pool"].k[~owned]).all()
    assert not torch.isnan(lay["pool"].k[owned]).any()


def test_mla_view_aliases_k():
    lay = lay_out([torch.randn(5, 1, 576)], None, 1, mla_dv=512)
    assert lay["v_cache"].shape == (lay["k_cache"].shape[0], 1, 512)
    assert lay["v_cache"].data_ptr() == lay["k_cache"].data_ptr()


def test_pool_alloc_release():
    pool = SlotPool(4, 1, 8, dtype=torch.float32)
    a = pool.alloc(3)
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.alloc(2)
    pool.write(a, 0, torch.ones(3, 1, 8))
    pool.release(a[:1])
    assert torch.isnan(pool.k[a[0]]).all()
    with pytest.raises(RuntimeError, match="twice"):
        pool.release(a[:1])
    with pytest.raises(ValueError, match="page_size"):
        PagedPool(4, 0, 1, 8)
