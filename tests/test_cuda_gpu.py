"""backend="cuda" on a GPU against the float64 reference (marked gpu: skipped
without one). Inputs come from tests/cases.py: shuffled slots/pages with NaN in
every unused one, and a NaN-poisoned `out`, so any stray read or unwritten
element fails. Also: CUDA-graph capture and replay with changed lengths inside
the captured maxima, run-to-run determinism, explicit split counts (including
splits left empty), every compiled tile config.

The first call per (dtype, head shape, layout) JIT-builds that instantiation
(about a minute on a 16-core machine); set VERIFY_ATTN_CUDA_ARCHS to override the
target arch.
"""
from __future__ import annotations

import pytest
import torch

import verify_attn
from cases import TOL, CaseSpec, check_against_reference, check_e4m3_mma_against_reference, make_case, poisoned_out
from verify_attn import build as vb
from verify_attn import device as vdevice
from verify_attn.config import KernelConfig

pytestmark = pytest.mark.gpu

HEADS = {  # name -> (hq, hkv, dqk, dv, mla)
    "kimi-mla": (8, 1, 576, 512, True),
    "mla-g16": (16, 1, 576, 512, True),
    "llama-gqa128": (8, 1, 128, 128, False),
    "qwen-gqa128": (32, 8, 128, 128, False),
    "gqa64": (16, 2, 64, 64, False),
    "gqa256": (8, 2, 256, 256, False),
    "mha128": (4, 4, 128, 128, False),
}


def _spec(head: str, dtype=torch.bfloat16, **kw) -> CaseSpec:
    hq, hkv, dqk, dv, mla = HEADS[head]
    return CaseSpec(hq=hq, hkv=hkv, dqk=dqk, dv=dv, mla=mla, dtype=dtype, **kw)


def _quarantined(config, kv_dtype: str) -> str | None:
    """Why `config`'s tile must not run in this session (bench.gpu_check's smoke stage saw it hang or crash and set
    VERIFY_ATTN_QUARANTINE), else None."""
    from verify_attn.backends import cuda
    return None if config is None else cuda.quarantined(cuda.tile_name(config), kv_dtype)


def _run(spec: CaseSpec, config=None):
    why = _quarantined(config, spec.kv_dtype)
    if why:
        pytest.skip(why)
    case = make_case(spec, device="cuda")
    out = poisoned_out(case)
    o, lse = verify_attn.tree_verify(**case.kwargs, backend="cuda", config=config, out=out, return_lse=True)
    torch.cuda.synchronize()
    return case, o, lse


def _check(spec: CaseSpec, config=None):
    case, o, lse = _run(spec, config)
    return check_against_reference(o, lse, case, *TOL[spec.dtype])


def _check_e4m3_mma(spec: CaseSpec, config=None):
    """The e4m3-MMA tiles (Q and P rounded to e4m3) against the float64 reference on the dequantized cache, within
    tolerances.FP8_MMA_* (NOTES.md has the error study)."""
    _, o, lse = _run(spec, config)
    check_e4m3_mma_against_reference(o, lse, make_case(spec))  # the reference on the CPU copy of the case


# ------------------------------------------------------------------ matrix ----

@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("page_size", [1, 16, 32, 64])
def test_matrix_small(head, dtype, page_size):
    _check(_spec(head, dtype, prefix_lens=(97, 0, 1000), tree_sizes=(7, 1, 33), page_size=page_size,
                 tree_kind="bushy", seed=1))


@pytest.mark.parametrize("kind", ["chain", "bushy", "star", "deep"])
@pytest.mark.parametrize("tree", [1, 5, 16, 64, 200, 256])
def test_trees(kind, tree):
    _check(_spec("kimi-mla", prefix_lens=(54,), tree_sizes=(tree,), tree_kind=kind, seed=tree))


@pytest.mark.parametrize("ctx", [1, 54, 97, 4097, 16_385, 65_537])
@pytest.mark.parametrize("head", ["kimi-mla", "llama-gqa128"])
def test_odd_lengths(ctx, head):
    _check(_spec(head, prefix_lens=(ctx,), tree_sizes=(16,), seed=ctx))


def test_mixed_batch_mixed_lengths():
    _check(_spec("kimi-mla", prefix_lens=(0, 1, 54, 3000, 20_000), tree_sizes=(1, 17, 5, 64, 9), seed=5))


def test_185k_mla():
    _check(_spec("kimi-mla", prefix_lens=(185_000,), tree_sizes=(16,), seed=185))


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("splits", [1, 2, 7, 64, 300])
def test_split_counts_and_tiles(head, splits):
    """Every compiled tile config x split counts, including far more splits than
    a short request has tiles (empty splits must be skipped by the combine)."""
    hq, hkv, dqk, dv, mla = HEADS[head]
    key = vb.head_key(dqk, dv, mla)
    arch = vdevice.props_for(torch.device("cuda")).arch
    for t in vb.TILES[key]:
        if not t.targets(arch) or _quarantined(t, ""):  # e.g. the 180 KB sm_90-only MLA tile on an sm_120 GPU
            continue
        cfg = KernelConfig(num_splits=splits, block_n=t.block_n, block_m=t.block_m, num_warps=t.num_warps,
                           num_stages=t.num_stages)
        _check(_spec(head, prefix_lens=(5, 700), tree_sizes=(3, 12), seed=splits), cfg)


def test_paged_odd_page_size():
    _check(_spec("kimi-mla", prefix_lens=(100, 37), tree_sizes=(6, 2), page_size=7, seed=3))


# ----------------------------------------------------------- determinism ----

def test_deterministic():
    spec = _spec("kimi-mla", prefix_lens=(5000, 300), tree_sizes=(16, 4), seed=9)
    case = make_case(spec, device="cuda")
    a = verify_attn.tree_verify(**case.kwargs, backend="cuda")
    b = verify_attn.tree_verify(**case.kwargs, backend="cuda")
    assert torch.equal(a, b)


# ------------------------------------------------------------- CUDA graph ----

V0_TILE = KernelConfig(num_splits=24, block_n=16, block_m=32, num_warps=4, num_stages=3)
V1_TILE = KernelConfig(num_splits=24, block_n=16, block_m=32, num_warps=8, num_stages=3)
# v1 with the bulk loader (cp.async.bulk rows on mbarriers; sm_90a only)
V1_BULK = KernelConfig(num_splits=24, block_n=16, block_m=32, num_warps=8, num_stages=8)


def _needs_sm90():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the bulk-loader tiles are built for sm_90a only")


@pytest.mark.parametrize("block_n,stages", [(16, 8), (32, 5)])
@pytest.mark.parametrize("page_size", [1, 7, 16, 64])
def test_bulk_loader_tiles_match_reference(block_n, stages, page_size):
    """v1's bulk loader on the hardware: odd lengths (the last tile's rows past the end zero-filled by their
    threads while the others arrive with bytes), 2 requests, the headline tree, several phase wraps of every
    stage's mbarrier."""
    _needs_sm90()
    cfg = KernelConfig(num_splits=0, block_n=block_n, block_m=32, num_warps=8, num_stages=stages)
    _check(_spec("kimi-mla", prefix_lens=(20_001, 333), tree_sizes=(16, 5), page_size=page_size, seed=31), cfg)


@pytest.mark.parametrize("cfg", [V0_TILE, V1_TILE, V1_BULK], ids=["v0", "v1", "v1-bulk"])
def test_cuda_graph_replay_with_changed_lengths(cfg):
    """Capture at the maxima, then replay with shorter prefixes and other trees of
    the same sizes copied into the static buffers: the graph's grid is static,
    the real lengths come from the device. v1's combine is launched with PDL
    (programmatic dependent launch), which must capture and replay too."""
    big = make_case(_spec("kimi-mla", prefix_lens=(3000, 800), tree_sizes=(16, 8), seed=11), device="cuda")
    small = make_case(_spec("kimi-mla", prefix_lens=(1200, 3), tree_sizes=(16, 8), tree_kind="chain", seed=12),
                      device="cuda")
    kw = big.kwargs
    out = torch.empty_like(poisoned_out(big))
    lse = torch.empty(out.shape[:2], dtype=torch.float32, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up: JIT load + workspace reservation outside capture
        verify_attn.tree_verify(**kw, backend="cuda", config=cfg, out=out)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o, l = verify_attn.tree_verify(**kw, backend="cuda", config=cfg, out=out, return_lse=True)
    lse = l
    g.replay()
    torch.cuda.synchronize()
    check_against_reference(out, lse, big, *TOL[torch.bfloat16])

    sk = small.kwargs
    for name in ("q", "qo_indptr", "kv_indptr", "kv_lens", "tree_mask"):
        assert kw[name].shape == sk[name].shape, name
        kw[name].copy_(sk[name])
    kw["kv_indices"][: sk["kv_indices"].numel()].copy_(sk["kv_indices"])
    n = sk["k_cache"].shape[0]
    assert n <= kw["k_cache"].shape[0]
    kw["k_cache"][:n].copy_(sk["k_cache"])
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    check_against_reference(out, lse, small, *TOL[torch.bfloat16])


# ------------------------------------------------------- v0 and v1 agree ----

@pytest.mark.parametrize("version", ["v0", "v1", "v2", "v3", "v3-cluster", "v3-sm120", "m32n16w9s4", "m32n16w12s4"])
@pytest.mark.parametrize("page_size", [1, 64])
def test_kernel_versions_match_reference(version, page_size):
    """The pinned versions bench.verify times as cuda@v0 / cuda@v1 / cuda@v2 (sm_90a's wgmma kernel) / cuda@v3 (Hopper's
    warp-specialized seesaw kernel, csrc/tree_verify/sm90/) / cuda@v3-cluster (the same as a 2-CTA cluster sharing
    each block's gather through distributed shared memory; the second request's 5 nodes, 40 rows, leave its cluster's
    second CTA padding rows only) / cuda@v3-sm120
    (kernel v3's math-roles tile: S warps, PV warps, a producer warpgroup; on the H200 the proxy of the sm_120 kernel) /
    cuda@m32n16w9s4 (its one-producer-warp tile) / cuda@m32n16w12s4 (its producer-warpgroup tile), on the headline
    shape at 20k."""
    from verify_attn.backends import cuda

    if version in ("v2", "v3", "v3-cluster") and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"kernel {version} (wgmma) is built for sm_90a only")
    spec = _spec("kimi-mla", prefix_lens=(20_000, 333), tree_sizes=(16, 5), page_size=page_size, seed=21)
    case = make_case(spec, device="cuda")
    cfg = cuda.version_config(case.problem(), version)
    _check(spec, cfg)


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_mla656"])
@pytest.mark.parametrize("version", ["v3-sm120", "m32n32w9s4", "m32n32w12s4", "m32n32w20s4"])
def test_kernel_v3_fp8_matches_reference(version, kv_dtype, monkeypatch):
    """Kernel v3 on e4m3 and 656-byte rows (its one-producer-warp, producer-warpgroup and math-roles tiles, the
    e4m3-MMA tolerance), page 64 at 20k; every one is built for sm_90a too. The math-roles tile's PV warps scale P by
    their block's scales. On the H200 the P V products run on arch::E4m3OnSm90::kF16, the S products as ptxas lowers
    the e4m3 instruction."""
    from verify_attn.backends import cuda

    monkeypatch.delenv("VERIFY_ATTN_ANY_TILE_ARCH", raising=False)  # (no tile of these needs the override)
    spec = _spec("kimi-mla", prefix_lens=(20_000, 333), tree_sizes=(16, 5), page_size=64, seed=23, kv_dtype=kv_dtype)
    cfg = cuda.version_config(make_case(spec, device="cuda").problem(), version)
    _check_e4m3_mma(spec, cfg)


def test_hopper_v3_e4m3_matches_reference():
    """Hopper's v3 on e4m3 caches (wgmma .e4m3; P V swapped, O^T = V^T P^T with V^T's A fragments built from the
    rows in registers, the real wgmma's register operands), page 64 at 20k and page 1 at 3k, the e4m3-MMA
    tolerance. sm_90a only."""
    from verify_attn.backends import cuda

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("kernel v3 for Hopper is sm_90a's")
    for spec in (_spec("kimi-mla", prefix_lens=(20_000, 333), tree_sizes=(16, 5), page_size=64, seed=24,
                       kv_dtype="fp8_e4m3"),
                 _spec("kimi-mla", prefix_lens=(3_000,), tree_sizes=(37,), seed=25, kv_dtype="fp8_e4m3")):
        cfg = cuda.version_config(make_case(spec, device="cuda").problem(), "v3")
        assert (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages) == (64, 64, 12, 2)
        _check_e4m3_mma(spec, cfg)


def test_int64_indices_prefix_only_and_too_wide_tree():
    """The serving API on the device: int64 index tensors read in place, a prefix-only call
    (tree_mask=None), and a tree wider than its mask rows (value checks off) comes back as
    NaN rows with the kernel's error flag set, not as silently wrong numbers."""
    spec = _spec("kimi-mla", prefix_lens=(3000, 50), tree_sizes=(9, 3), seed=22)
    case = make_case(spec, device="cuda")
    kw = dict(case.kwargs)
    for name in ("qo_indptr", "kv_indptr", "kv_indices"):
        kw[name] = kw[name].long()
    o, lse = verify_attn.tree_verify(**kw, backend="cuda", out=poisoned_out(case), return_lse=True)
    check_against_reference(o, lse, case, *TOL[spec.dtype])

    kw["tree_mask"] = None  # prefix-only: every row sees all kv_lens[b] entries
    o, lse = verify_attn.tree_verify(**kw, backend="cuda", out=poisoned_out(case), return_lse=True)
    cpu = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    ro, rl = verify_attn.tree_verify(**cpu, backend="reference", return_lse=True)
    atol, rtol = TOL[spec.dtype]
    assert torch.allclose(o.float().cpu(), ro.float(), atol=atol, rtol=rtol)
    assert torch.allclose(lse.cpu(), rl, atol=1e-2)

    wide = make_case(_spec("kimi-mla", prefix_lens=(100,), tree_sizes=(40,), tree_kind="chain", seed=23),
                     device="cuda")
    kw = dict(wide.kwargs)
    kw["tree_mask"] = kw["tree_mask"][:, :1].contiguous()  # 40 nodes, room for 32
    verify_attn.kernel_errors("cuda")  # clear
    verify_attn.set_validation("shapes")
    try:
        o = verify_attn.tree_verify(**kw, backend="cuda", out=torch.zeros_like(poisoned_out(wide)))
        torch.cuda.synchronize()
    finally:
        verify_attn.set_validation("full")
    assert torch.isnan(o[:32]).all()
    errs = verify_attn.kernel_errors("cuda")
    assert len(errs) == 1 and "T_b > 32 * W" in errs[0]


# ------------------------------------------------------------ e4m3 caches ----

@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("head", ["llama-gqa128", "qwen-gqa128", "gqa64", "gqa256"])
def test_fp8_e4m3_gqa_matches_reference(page_size, head):
    """GQA 64 / 128 / 256 with e4m3 caches: kernel v1's f16 tile (K / V codes to f16 in registers; d64 on its
    4-warp twin, merged by the v0 combine), 16-bit tolerance."""
    _check(_spec(head, prefix_lens=(4097, 300), tree_sizes=(16, 5), page_size=page_size, seed=33,
                 kv_dtype="fp8_e4m3"))


@pytest.mark.parametrize("page_size", [1, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp8_e4m3_cache_matches_reference(page_size, dtype):
    """The e4m3 caches through the arch's default tile: sm_120's runs both products on e4m3 MMAs, sm_90's is kernel
    v2 on wgmma .e4m3 (V transposed in shared memory per tile); both within tolerances.FP8_MMA_*."""
    _check_e4m3_mma(_spec("kimi-mla", dtype, prefix_lens=(4097, 300, 0), tree_sizes=(16, 5, 1), page_size=page_size,
                          seed=31, kv_dtype="fp8_e4m3"))


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_mla656"])
@pytest.mark.parametrize("page_size", [1, 64])
def test_sm120_e4m3_mma_tiles_on_this_gpu(kv_dtype, page_size, monkeypatch):
    """sm_120's e4m3-MMA tiles (32 x 32, 8 warps, 4 stages; TilesForFp8 and TilesFor656) on whatever GPU this is:
    on an H200 through VERIFY_ATTN_ANY_TILE_ARCH=1, where nvcc lowers the e4m3 MMAs to f16 ones (the same kernel
    code, slowly), so an H200 session validates them on hardware."""
    from verify_attn.backends import cuda

    monkeypatch.setenv(cuda.ANY_TILE_ARCH_ENV, "1")
    _check_e4m3_mma(_spec("kimi-mla", torch.bfloat16, prefix_lens=(4097, 300, 0), tree_sizes=(16, 5, 1),
                          page_size=page_size, seed=35, kv_dtype=kv_dtype), KernelConfig(0, 32, 32, 8, 4))


@pytest.mark.parametrize("page_size", [1, 64])
def test_fp8_mla656_default_matches_reference(page_size):
    """The 656-byte rows through the arch's default tile: sm_120's runs S and P.V on e4m3 MMAs (per-block scales;
    tolerances.FP8_MMA_*), sm_90's is the f16 tile (the 16-bit tolerance)."""
    spec = _spec("kimi-mla", torch.bfloat16, prefix_lens=(4097, 300, 0), tree_sizes=(16, 5, 1), page_size=page_size,
                 seed=34, kv_dtype="fp8_mla656")
    if vb.default_tile("mla576x656", vdevice.props_for(torch.device("cuda")).arch).fp8_mma:
        _check_e4m3_mma(spec)
    else:
        _check(spec)


def test_fp8_scale_tensor_is_read_on_the_device_in_a_graph():
    """A 0-d k_scale tensor is read by the kernel: changing it between CUDA-graph replays changes the
    result exactly as a new call with that scale does (no host read, no recapture)."""
    spec = _spec("kimi-mla", prefix_lens=(2000,), tree_sizes=(16,), seed=32, kv_dtype="fp8_e4m3")
    case = make_case(spec, device="cuda")
    kw = dict(case.kwargs)
    scale = torch.tensor(float(kw["k_scale"]), device="cuda")
    kw.update(k_scale=scale, v_scale=None)
    out = torch.empty_like(poisoned_out(case))
    verify_attn.tree_verify(**kw, backend="cuda", out=out)  # warm-up: JIT load, workspace
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        verify_attn.tree_verify(**kw, backend="cuda", out=out)
    for mul in (1.0, 0.5):
        scale.fill_(float(case.kwargs["k_scale"]) * mul)
        g.replay()
        torch.cuda.synchronize()
        want = verify_attn.tree_verify(**dict(kw, k_scale=float(case.kwargs["k_scale"]) * mul), backend="cuda")
        assert torch.equal(out, want), mul


@pytest.mark.parametrize("kv_dtype,tile", [("fp8_e4m3", (32, 32, 8, 3)), ("fp8_mla656", (32, 32, 8, 3))],
                         ids=["e4m3-f16-tile", "mla656-f16-tile"])
@pytest.mark.parametrize("page_size", [1, 64])
def test_fp8_f16_path_matches_reference_at_16_bit_tolerance(kv_dtype, tile, page_size):
    """The f16 tile (K / V converted in registers; the sm_90 default for e4m3) and the 656-byte rows:
    exact conversions, so the 16-bit tolerance (tolerances.FP8_TOL through check_against_reference)."""
    cfg = None if tile is None else KernelConfig(0, tile[1], tile[0], tile[2], tile[3])
    _check(_spec("kimi-mla", torch.bfloat16, prefix_lens=(4097, 300, 0), tree_sizes=(16, 5, 1),
                 page_size=page_size, seed=33, kv_dtype=kv_dtype), cfg)
