"""Gaps a mutation audit found (issue 18). Each test here fails when the bug it names is put back:
the LSE tolerance, tuned-config files with absurd or mistyped values, the command-line
errors, the reference's silent wrap-around of a negative index with value checks off, a
tree larger than its mask with value checks off, and non-finite inputs.
"""
from __future__ import annotations

import json
import warnings

import pytest
import torch

from cases import CaseSpec, check_against_reference, make_case, poisoned_out
import verify_attn
from verify_attn import KernelConfig, tree_verify, tuned
from verify_attn.backends import Backend, get_backend
from verify_attn.config import as_config
from verify_attn.reference import reference_verify
from verify_attn.tolerances import LSE_ATOL

GQA = dict(hq=4, hkv=2, dqk=64, dv=64, mla=False)
SMALL = KernelConfig(num_splits=3, block_n=16, block_m=16, num_warps=4, num_stages=1)


def _need(backend: str) -> None:
    ok, why = get_backend(backend).available()
    if not ok:
        pytest.skip(f"{backend} unavailable: {why}")


@pytest.fixture
def shapes_mode():
    verify_attn.set_validation("shapes")
    yield
    verify_attn.set_validation("full")


# --- the LSE tolerance ------------------------------------------------------------------

def _one_token_dropped(dtype):
    """(case, reference out, reference lse, lse with prefix token 0 dropped): 54 prefix tokens + a
    5-node chain, near-equal scores (tiny q), so the last node's LSE over 59 instead of 60
    tokens is off by log(60/59) = 0.0168 nat."""
    case = make_case(CaseSpec((55,), (5,), "chain", dtype=dtype, seed=50, **GQA))
    case.kwargs["q"] = (case.kwargs["q"].float() * 1e-3).to(dtype)
    ref_out, ref_lse = reference_verify(case.problem())
    kw = dict(case.kwargs)
    kw["kv_indices"] = kw["kv_indices"][1:].contiguous()
    kw["kv_lens"] = kw["kv_lens"] - 1
    kw["kv_indptr"] = torch.tensor([0, kw["kv_indices"].numel()], dtype=torch.int32)
    from verify_attn.api import build_problem
    p = build_problem(*(kw[k] for k in ("q", "k_cache", "v_cache", "qo_indptr", "kv_indptr", "kv_indices",
                                         "kv_lens", "tree_mask", "sm_scale", "page_size")))
    _, drop_lse = reference_verify(p)
    return case, ref_out, ref_lse, drop_lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_lse_tolerance_fails_one_dropped_token_of_60(dtype):
    case, ref_out, ref_lse, drop_lse = _one_token_dropped(dtype)
    shift = float((drop_lse - ref_lse).abs().min())
    assert 0.016 < shift < 0.02
    check_against_reference(ref_out.to(dtype), ref_lse.float(), case)             # the right LSE passes
    with pytest.raises(AssertionError, match="lse max abs err"):
        check_against_reference(ref_out.to(dtype), drop_lse.float(), case)        # out right, LSE off


def test_autotune_harness_rejects_an_lse_off_by_one_dropped_token():
    """The tuner's reference check uses the same LSE bound (tolerances.LSE_ATOL)."""
    from autotune.harness import BucketHarness
    from verify_attn.shapes import get_shape
    ref = get_backend("reference")

    def off(p, cfg, out, lse):
        ref.run(p, cfg, out, lse)
        lse[0, 0] += 0.0168          # = log(60/59): one of 60 equal tokens missing

    kw = dict(ctx=37, tree_nodes=5, tree_kind="ddtree", batch=1, page_size=1, dtype=torch.bfloat16,
              l2_bytes=1 << 20, reps=2, max_seconds=0.5, device="cpu")
    assert BucketHarness(ref, get_shape("gqa-d64"), **kw).check(KernelConfig(1)) is None
    assert "lse max abs err" in BucketHarness(Backend("off", run=off), get_shape("gqa-d64"), **kw).check(KernelConfig(1))
    assert max(LSE_ATOL.values()) < 0.0168 / 4


# --- tuned-config files and configs ------------------------------------------------------

H200 = "NVIDIA H200"


@pytest.fixture
def clean_tuned(monkeypatch):
    monkeypatch.delenv(tuned.ENV_FILE, raising=False)
    tuned.clear()
    monkeypatch.setitem(tuned._device_names, 0, H200)
    monkeypatch.setattr(tuned, "_usable", lambda table, backend, p: table)
    monkeypatch.setattr(tuned, "BUNDLED_DIR", tuned.Path("/nonexistent-bundled-dir"))
    yield
    tuned.clear()


def _key():
    return tuned.TableKey(H200, "cuda", 8, 1, 576, 512, "bf16", 1, True)


def _gpu_problem(ctx=1000, total_q=16, batch=1):
    from types import SimpleNamespace
    q = SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.bfloat16)
    return SimpleNamespace(q=q, device=q.device, dtype=torch.bfloat16, num_q_heads=8, num_kv_heads=1,
                           head_dim_qk=576, head_dim_v=512, page_size=1, mla_shared_kv=True, avg_kv_len=ctx,
                           total_q=total_q, batch=batch, max_tree_nodes=min(32, total_q))


def _good_doc() -> dict:
    table = tuned.ConfigTable(_key(), {(1000, 16): KernelConfig(8, 16, 32, 4, 3)})
    return tuned.table_to_json(table)


def _set(*keys):
    """A mutation of the exported document: doc[k0][k1]... = keys[-1]."""
    def f(doc):
        d = doc
        for k in keys[:-2]:
            d = d[k]
        d[keys[-2]] = keys[-1]
    return f


@pytest.mark.parametrize("mutate,match", [
    (_set("buckets", 0, "config", "num_splits", 10**9), "num_splits must be <= 1024"),
    (_set("batch", 10**6), "batch must be in \\[1, 4096\\]"),
    (_set("buckets", 0, "config", "num_splits", "16"), "num_splits must be int, got str"),
    (_set("buckets", 0, "config", "num_splits", 16.9), "num_splits must be int, got float"),
    (_set("buckets", 0, "config", "num_splits", True), "num_splits must be int, got bool"),
    (_set("buckets", 0, "config", "block_m", 1024), "block_m must be <= 512"),
    (_set("buckets", 0, "ctx", "1000"), "ctx must be an int"),
    (_set("buckets", 0, "tree_nodes", 16.0), "tree_nodes must be an int"),
    (_set("batch", "1"), "batch must be an int"),
    (_set("key", "hq", "8"), "hq must be an int"),
    (_set("key", "mla", 1), "mla must be true or false"),
], ids=["splits-1e9", "batch-1e6", "splits-str", "splits-float", "splits-bool", "block_m-1024", "ctx-str",
        "tree-float", "batch-str", "key-hq-str", "key-mla-int"])
def test_tuned_file_with_bad_values_warns_once_and_falls_back(tmp_path, clean_tuned, mutate, match):
    doc = _good_doc()
    mutate(doc)
    path = tmp_path / "table.json"
    path.write_text(json.dumps(doc))
    tuned.set_config_file(path)
    with pytest.warns(RuntimeWarning, match=match):
        assert tuned.lookup(_gpu_problem(), "cuda") is None        # None: the backend's heuristic applies
    with warnings.catch_warnings():
        warnings.simplefilter("error")                             # one warning, not one per call
        assert tuned.lookup(_gpu_problem(), "cuda") is None


def test_tuned_good_file_is_used(tmp_path, clean_tuned):
    """The control for the test above: the unmutated document is found."""
    path = tmp_path / "table.json"
    path.write_text(json.dumps(_good_doc()))
    tuned.set_config_file(path)
    assert tuned.lookup(_gpu_problem(), "cuda") == KernelConfig(8, 16, 32, 4, 3)


def test_batch_scaling_is_capped():
    """A table tuned at batch 4096 asked for batch 1 would scale 1024 splits to 4M: capped at 1024."""
    table = tuned.ConfigTable(_key(), {(1000, 16): KernelConfig(1024, 16, 32, 4, 3)}, batch=4096)
    assert table.pick(1000, 16, batch=1).num_splits == 1024
    assert table.pick(1000, 16, batch=8192).num_splits == 512


@pytest.mark.parametrize("bad,exc,match", [
    ({"num_splits": "16"}, TypeError, "num_splits must be int, got str"),
    ({"num_splits": 16.9}, TypeError, "num_splits must be int, got float"),
    ({"block_n": True}, TypeError, "block_n must be int, got bool"),
    ({"num_splits": 10**9}, ValueError, "num_splits must be <= 1024"),
    ({"num_warps": 64}, ValueError, "num_warps must be <= 32"),
])
def test_config_dicts_are_not_coerced(bad, exc, match):
    with pytest.raises(exc, match=match):
        as_config(bad)


# --- command lines -------------------------------------------------------------------------

def _cli(name):
    import importlib
    return importlib.import_module(name).main


@pytest.mark.parametrize("module,argv,flag", [
    ("integration.measure.decode", ["--tp", "3"], "--tp"),
    ("integration.measure.decode", ["--ctx", "0"], "--ctx"),
    ("integration.measure.probe", ["--short", "0"], "--short"),
    ("bench.verify", ["--reps", "0", "--no-save"], "--reps"),
    ("bench.verify", ["--backend", "nope", "--no-save", "--ctx", "1k"], "--backend"),
])
def test_bad_flag_is_one_line_naming_it_with_status_2(module, argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        _cli(module)(argv)
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.strip()]
    assert e.value.code == 2, f"exit status {e.value.code}"
    assert len(lines) == 1 and flag in lines[0] and "Traceback" not in err, err


# --- value checks off ----------------------------------------------------------------------

def test_reference_rejects_a_negative_index_in_shapes_mode(shapes_mode):
    """torch indexing would read slot -1 (the pool's last row) without a word."""
    case = make_case(CaseSpec((10, 3), (4, 2), seed=51, **GQA))
    kw = dict(case.kwargs)
    kw["kv_indices"] = kw["kv_indices"].clone()
    kw["kv_indices"][2] = -1
    with pytest.raises(ValueError, match="kv_indices of request 0 hold slot ids out of range"):
        tree_verify(**kw, backend="reference")
    kw["kv_indices"][2] = kw["k_cache"].shape[0]
    with pytest.raises(ValueError, match="out of range"):
        tree_verify(**kw, backend="reference")


def _tree_wider_than_mask(dtype=torch.float32):
    """One request of 40 nodes whose mask has one word (room for 32): only value checks catch it."""
    case = make_case(CaseSpec((20,), (40,), "chain", dtype=dtype, seed=52, **GQA))
    kw = dict(case.kwargs)
    kw["tree_mask"] = kw["tree_mask"][:, :1].contiguous()
    return case, kw


def test_tree_wider_than_its_mask(shapes_mode):
    case, kw = _tree_wider_than_mask()
    verify_attn.set_validation("full")
    with pytest.raises(ValueError, match="tree_mask needs W >= ceil\\(max T_b / 32\\) = 2 words, got 1"):
        tree_verify(**kw, backend="reference")
    verify_attn.set_validation("shapes")
    with pytest.raises(ValueError, match="too few for 40 columns"):
        tree_verify(**kw, backend="reference")


@pytest.mark.parametrize("backend", ["triton", "triton-serial"])
def test_triton_poisons_a_tree_wider_than_its_mask(backend, shapes_mode):
    """With value checks off the Triton kernels cannot serve such a request (their grid covers
    32 * W nodes): every row they write is NaN, never a plausible partial answer."""
    _need(backend)
    case, kw = _tree_wider_than_mask()
    out = torch.zeros(40, GQA["hq"], GQA["dv"])
    tree_verify(**kw, backend=backend, config=SMALL, out=out)
    assert torch.isnan(out[:32]).all()


@pytest.mark.parametrize("splits", [1, 3])
def test_cuda_kernels_poison_a_tree_wider_than_its_mask_and_flag_it(shapes_mode, splits):
    """csrc guard: a request with T_b > 32 * W gets NaN in every row the grid covers (the split kernel
    with one split, the combine with several), and an error bit verify_attn.kernel_errors reads;
    the other request of the batch is computed normally."""
    _need("cuda-emu")
    import verify_attn
    case, kw = _tree_wider_than_mask(dtype=torch.float16)
    good = make_case(CaseSpec((9,), (3,), "bushy", dtype=torch.float16, seed=61, **GQA))
    assert verify_attn.kernel_errors("cpu") == []
    out = torch.zeros(40, GQA["hq"], GQA["dv"], dtype=torch.float16)
    tree_verify(**kw, backend="cuda-emu", config=KernelConfig(splits, 64, 64, 4, 2), out=out)
    assert torch.isnan(out[:32]).all()
    errs = verify_attn.kernel_errors("cpu")
    assert len(errs) == 1 and "T_b > 32 * W" in errs[0]
    assert verify_attn.kernel_errors("cpu") == []  # read and cleared
    o = tree_verify(**good.kwargs, backend="cuda-emu", config=KernelConfig(splits, 64, 64, 4, 2),
                    out=poisoned_out(good))
    check_against_reference(o, None, good)
    assert verify_attn.kernel_errors("cpu") == []


# --- non-finite inputs propagate (api.py docstring) ----------------------------------------

def _nonfinite_case(backend):
    dtype = torch.float16 if backend == "cuda-emu" else torch.float32
    case = make_case(CaseSpec((20, 10), (4, 3), "bushy", dtype=dtype, seed=53, **GQA))
    cfg = None if backend == "reference" else (
        KernelConfig(2, 64, 64, 4, 2) if backend == "cuda-emu" else SMALL)   # several splits: a combine
    return case, cfg


def _poisoned_runs(backend):
    """[(out, lse, rows that must be hit [total_q, Hq] bool)]: (a) a NaN KV row in request 0's
    prefix (every row of request 0 reads it); (b) inf in one value of q[5, 1] (that row and head)."""
    case, cfg = _nonfinite_case(backend)
    kw = dict(case.kwargs)
    runs = []
    k, v = kw["k_cache"].clone(), kw["v_cache"].clone()
    slot = int(kw["kv_indices"][5])
    k[slot], v[slot] = float("nan"), float("nan")
    hit = torch.zeros(7, GQA["hq"], dtype=torch.bool)
    hit[:4] = True
    runs.append((*tree_verify(**{**kw, "k_cache": k, "v_cache": v}, backend=backend, config=cfg,
                              out=poisoned_out(case), return_lse=True), hit))
    q = kw["q"].clone()
    q[5, 1, 0] = float("inf")
    hit = torch.zeros(7, GQA["hq"], dtype=torch.bool)
    hit[5, 1] = True
    runs.append((*tree_verify(**{**kw, "q": q}, backend=backend, config=cfg, out=poisoned_out(case),
                              return_lse=True), hit))
    return runs


@pytest.mark.parametrize("backend", ["reference", "triton", "triton-serial", "cuda-emu"])
def test_nonfinite_input_marks_the_rows_that_read_it_and_only_those(backend):
    """Every backend: a (row, head) that reads a NaN/inf gets a non-finite out or lse, and
    every other (row, head), other requests included, stays finite."""
    _need(backend)
    for out, lse, hit in _poisoned_runs(backend):
        bad = ~torch.isfinite(out).all(-1) | ~torch.isfinite(lse)
        assert torch.equal(bad, hit), torch.nonzero(bad != hit).tolist()


@pytest.mark.parametrize("backend", [
    "reference", "triton", "triton-serial",
    "cuda-emu",  # csrc: row_lse2 / row_inv_l keep a NaN row sum NaN, so no combine takes it for "empty"
])
def test_nonfinite_input_propagates_to_out_and_lse(backend):
    """The documented behaviour (api.py): out is non-finite AND lse is NaN or +inf, never a
    plausible number, nor -inf (which means "saw nothing")."""
    _need(backend)
    for out, lse, hit in _poisoned_runs(backend):
        out_bad = ~torch.isfinite(out).all(-1)
        lse_bad = torch.isnan(lse) | torch.isposinf(lse)
        assert torch.equal(out_bad, hit) and torch.equal(lse_bad, hit), (
            torch.nonzero(out_bad != hit).tolist(), torch.nonzero(lse_bad != hit).tolist())


@pytest.mark.parametrize("page_size", [1, 16])
def test_cache_strides_of_2_31_elements_or_more_are_refused(page_size):
    """The CUDA kernels address a cache row as a 32-bit page / slot index times a 32-bit stride: a page
    (or row) stride of 2**31 elements or more gets a ValueError naming the tensor and the dim. (Meta
    tensors: no memory is allocated for the huge strides; validation runs before any backend.)"""
    case = make_case(CaseSpec((20,), (3,), "bushy", dtype=torch.bfloat16, page_size=page_size, seed=5,
                              hq=8, hkv=1, dqk=64, dv=64, mla=False))
    kw = {n: (t.to("meta") if isinstance(t, torch.Tensor) else t) for n, t in case.kwargs.items()}
    k = kw["k_cache"]
    for d in ((0, 1) if page_size > 1 else (0,)):
        strides = list(k.stride())
        strides[d] = 2 ** 31
        huge = torch.empty_strided(k.shape, strides, dtype=k.dtype, device="meta")
        with pytest.raises(ValueError, match=rf"k_cache.stride\({d}\) must be below 2\*\*31"):
            verify_attn.api.build_problem(kw["q"], huge, kw["v_cache"], kw["qo_indptr"], kw["kv_indptr"],
                                          kw["kv_indices"], kw["kv_lens"], kw["tree_mask"], 0.1, page_size)
    if page_size > 1:  # a row stride below 2**31 whose offset in a 16-row page is not
        strides = list(k.stride())
        strides[1] = 2 ** 31 // 15 + 1
        tall = torch.empty_strided(k.shape, strides, dtype=k.dtype, device="meta")
        with pytest.raises(ValueError, match=r"k_cache: \(page_size - 1\) x stride\(1\) must be below 2\*\*31"):
            verify_attn.api.build_problem(kw["q"], tall, kw["v_cache"], kw["qo_indptr"], kw["kv_indptr"],
                                          kw["kv_indices"], kw["kv_lens"], kw["tree_mask"], 0.1, page_size)


def test_error_flags_are_one_word_per_device_whatever_the_spelling(monkeypatch):
    """The first GPU run (2026-12-04, H200) found kernel_errors("cuda") reading a fresh word while the kernels
    had set the one of torch.device("cuda:0") (a tensor's .device): one key per physical device."""
    from verify_attn.backends import cuda
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert cuda._device_key(torch.device("cuda")) == cuda._device_key("cuda:0") == torch.device("cuda", 0)
    assert cuda._device_key(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert cuda._device_key("cpu") == torch.device("cpu")
    cuda._ERRORS.pop(torch.device("cpu"), None)
    cuda.error_flags(torch.device("cpu")).fill_(1)
    assert cuda.read_errors("cpu") and not cuda.read_errors(torch.device("cpu"))   # the same word, read and cleared
