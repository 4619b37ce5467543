"""The API a serving engine needs: int64 indices read without a copy, the `max_kv_len`
planning hint, and prefix-only calls (tree_mask=None), on every backend that runs here.

CPU only (reference, both Triton backends under the interpreter, the CUDA kernels in
the emulator); small shapes.
"""
from __future__ import annotations

import dataclasses

from types import SimpleNamespace

import pytest
import torch

from cases import TOL, CaseSpec, check_against_reference, make_case, poisoned_out
import verify_attn
from verify_attn import KernelConfig, tree_verify, tuned
from verify_attn.api import build_problem
from verify_attn.backends import get_backend

GQA = dict(hq=4, hkv=2, dqk=64, dv=64, mla=False)
MLA_SMALL = dict(hq=4, hkv=1, dqk=72, dv=64, mla=True)
SMALL = KernelConfig(num_splits=3, block_n=16, block_m=16, num_warps=4, num_stages=1)
INTERP_BACKENDS = ("triton", "triton-serial")


def _need(backend: str) -> None:
    ok, why = get_backend(backend).available()
    if not ok:
        pytest.skip(f"{backend} unavailable: {why}")


def _int64(kw: dict) -> dict:
    return {**kw, **{k: kw[k].long() for k in ("qo_indptr", "kv_indptr", "kv_indices")}}


# --- int64 indices --------------------------------------------------------------------

@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("backend", ["reference", *INTERP_BACKENDS])
def test_int64_indices_give_the_int32_result(backend, page_size):
    _need(backend)
    case = make_case(CaseSpec((54, 0, 7), (5, 3, 9), "bushy", page_size=page_size, seed=1, **GQA))
    cfg = None if backend == "reference" else SMALL
    o32, l32 = tree_verify(**case.kwargs, backend=backend, config=cfg, out=poisoned_out(case), return_lse=True)
    o64, l64 = tree_verify(**_int64(case.kwargs), backend=backend, config=cfg, out=poisoned_out(case),
                           return_lse=True)
    check_against_reference(o64, l64, case)
    assert torch.equal(o32, o64) and torch.equal(l32, l64)


class _LaunchSpy:
    """Stands in for a @triton.jit kernel: records the arguments of each launch, then launches."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, []

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            self.calls.append(args)
            return launch(*args, **kwargs)
        return run


@pytest.mark.parametrize("backend,module,kernel", [("triton", "triton_split", "_split_fwd"),
                                                   ("triton-serial", "triton_serial", "_serial_fwd")])
def test_int64_indices_reach_the_triton_kernel_without_a_copy(backend, module, kernel, monkeypatch):
    """The kernel is launched on the caller's int64 tensors themselves (qo_indptr, kv_indptr,
    kv_indices are its arguments 3, 4, 5), not on int32 copies."""
    _need(backend)
    import importlib
    mod = importlib.import_module(f"verify_attn.backends.{module}")
    spy = _LaunchSpy(getattr(mod, kernel))
    monkeypatch.setattr(mod, kernel, spy)
    case = make_case(CaseSpec((30,), (4,), "chain", seed=2, **GQA))
    kw = _int64(case.kwargs)
    out, lse = tree_verify(**kw, backend=backend, config=SMALL, out=poisoned_out(case), return_lse=True)
    check_against_reference(out, lse, case)
    args = spy.calls[0]
    assert args[3] is kw["qo_indptr"] and args[4] is kw["kv_indptr"] and args[5] is kw["kv_indices"]


def test_int64_problem_keeps_the_callers_tensors():
    case = make_case(CaseSpec((20,), (3,), seed=3, **GQA))
    kw = _int64(case.kwargs)
    p = build_problem(*(kw[k] for k in ("q", "k_cache", "v_cache", "qo_indptr", "kv_indptr", "kv_indices",
                                         "kv_lens", "tree_mask", "sm_scale", "page_size")))
    assert p.kv_indices is kw["kv_indices"] and p.kv_indptr is kw["kv_indptr"] and p.qo_indptr is kw["qo_indptr"]


def test_int64_on_the_cuda_kernels_in_the_emulator():
    """The CUDA kernels read int64 index arrays without a copy (through their low words): the same bits
    as with int32, and the reference's answer."""
    _need("cuda-emu")
    case = make_case(CaseSpec((40, 3), (5, 2), "bushy", dtype=torch.float16, seed=4,
                              hq=4, hkv=2, dqk=64, dv=64, mla=False))
    cfg = KernelConfig(num_splits=2, block_m=64, block_n=64, num_warps=4, num_stages=2)
    o32 = tree_verify(**case.kwargs, backend="cuda-emu", config=cfg, out=poisoned_out(case))
    o64, l64 = tree_verify(**_int64(case.kwargs), backend="cuda-emu", config=cfg, out=poisoned_out(case),
                           return_lse=True)
    check_against_reference(o64, l64, case)
    assert torch.equal(o32, o64)


# --- max_kv_len -------------------------------------------------------------------------

def _padded(case, extra: int) -> dict:
    """The case's arguments with kv_indices in an engine-style preallocated buffer (`extra` unused ids)."""
    kw = dict(case.kwargs)
    kw["kv_indices"] = torch.cat([kw["kv_indices"], torch.zeros(extra, dtype=kw["kv_indices"].dtype)])
    return kw


def _problem(kw: dict, **hint):
    return build_problem(*(kw[k] for k in ("q", "k_cache", "v_cache", "qo_indptr", "kv_indptr", "kv_indices",
                                           "kv_lens", "tree_mask", "sm_scale", "page_size")), **hint)


@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_max_kv_len_plans_splits_for_the_real_context(backend):
    """A preallocated index buffer (100k ids for a 1,005-token request) makes the size estimate
    pick ~20x too many splits; the hint gives the packed call's split count. `cuda` reads the
    hint through Problem.avg_kv_len (its default_config runs without a GPU)."""
    b = get_backend(backend)
    case = make_case(CaseSpec((1000,), (5,), "bushy", seed=5, **MLA_SMALL if backend == "triton" else
                              dict(hq=8, hkv=1, dqk=576, dv=512, mla=True)))
    packed = b.default_config(_problem(case.kwargs)).num_splits
    padded_kw = _padded(case, 100_000)
    guessed = b.default_config(_problem(padded_kw)).num_splits
    hinted_p = _problem(padded_kw, max_kv_len=1005)
    assert hinted_p.max_kv_len == 1005 and hinted_p.avg_kv_len == 1005
    assert guessed > 4 * packed
    assert b.default_config(hinted_p).num_splits == packed


def test_max_kv_len_call_is_correct_and_checked():
    _need("triton")
    case = make_case(CaseSpec((60, 9), (5, 2), "bushy", seed=6, **GQA))
    kw = _padded(case, 5000)
    out, lse = tree_verify(**kw, backend="triton", out=poisoned_out(case), return_lse=True, max_kv_len=65)
    check_against_reference(out, lse, case)
    with pytest.raises(ValueError, match="kv_lens\\[0\\]=65 exceeds the max_kv_len hint 64"):
        tree_verify(**kw, backend="triton", max_kv_len=64)


def test_max_kv_len_picks_the_tuned_bucket(monkeypatch):
    """The tuned-config lookup buckets by the hint, not by the index buffer's capacity."""
    tuned.clear()
    monkeypatch.setitem(tuned._device_names, 0, "NVIDIA H200")
    monkeypatch.setattr(tuned, "_usable", lambda table, backend, p: table)
    monkeypatch.setattr(tuned, "BUNDLED_DIR", tuned.Path("/nonexistent-bundled-dir"))
    case = make_case(CaseSpec((1000,), (16,), "bushy", dtype=torch.bfloat16, seed=7,
                              hq=8, hkv=1, dqk=576, dv=512, mla=True))
    key = tuned.TableKey("NVIDIA H200", "cuda", 8, 1, 576, 512, "bf16", 1, True)
    short, long = KernelConfig(4, 16, 32, 4, 3), KernelConfig(96, 16, 32, 4, 3)
    tuned.register(tuned.ConfigTable(key, {(1000, 16): short, (185_000, 16): long}))
    try:
        def on_gpu(p):   # the real Problem, seen as if its tensors were on cuda:0 (lookup is CUDA-only)
            q = SimpleNamespace(device=torch.device("cuda", 0), dtype=p.dtype)
            return SimpleNamespace(**{**vars(p), "q": q, "device": q.device, "dtype": p.dtype,
                                      "head_shape": p.head_shape})
        kw = _padded(case, 400_000)
        assert tuned.lookup(on_gpu(_problem(kw)), "cuda") == long              # buffer capacity: ~400k
        assert tuned.lookup(on_gpu(_problem(kw, max_kv_len=1016)), "cuda") == short
    finally:
        tuned.clear()


# --- prefix-only calls ------------------------------------------------------------------

def _dense_prefix_only(kw: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 loops: every q row of request b attends to all kv_lens[b] entries; none -> (0, -inf)."""
    q, kc, vc = kw["q"].double(), kw["k_cache"].double(), kw["v_cache"].double()
    qo, kvp, lens, ps = kw["qo_indptr"].tolist(), kw["kv_indptr"].tolist(), kw["kv_lens"].tolist(), kw["page_size"]
    hq, hkv, dv = q.shape[1], kc.shape[-2], vc.shape[-1]
    out = torch.zeros(q.shape[0], hq, dv, dtype=torch.float64)
    lse = torch.full((q.shape[0], hq), float("-inf"), dtype=torch.float64)
    for b in range(len(lens)):
        ids = kw["kv_indices"][kvp[b]:kvp[b + 1]].long()
        t = torch.arange(lens[b])
        k = kc[ids[t]] if ps == 1 else kc[ids[t // ps], t % ps]                  # [n, Hkv, D]
        v = vc[ids[t]] if ps == 1 else vc[ids[t // ps], t % ps]
        for r in range(qo[b], qo[b + 1]):
            for h in range(hq):
                if lens[b] == 0:
                    continue
                s = (k[:, h // (hq // hkv)] @ q[r, h]) * kw["sm_scale"]
                out[r, h] = torch.softmax(s, 0) @ v[:, h // (hq // hkv)]
                lse[r, h] = torch.logsumexp(s, 0)
    return out, lse


def _prefix_only_kw(spec: CaseSpec, lens: tuple[int, ...]) -> dict:
    """A tree case turned prefix-only: kv_lens = `lens` (<= each request's KV), tree_mask None."""
    kw = dict(make_case(spec).kwargs)
    kw["kv_lens"] = torch.tensor(lens, dtype=torch.int32)
    kw["tree_mask"] = None
    return kw


PREFIX_ONLY_CASES = [   # (spec, kv_lens): L_b = 0, L_b < T_b, L_b > T_b, paged; mixed in one batch
    (CaseSpec((30, 2, 0), (6, 5, 3), "bushy", seed=8, **GQA), (36, 2, 0)),
    (CaseSpec((40, 0), (4, 7), "chain", page_size=16, seed=9, **MLA_SMALL), (17, 0)),
    (CaseSpec((0,), (4,), "star", seed=10, **GQA), (0,)),
]


@pytest.mark.parametrize("i", range(len(PREFIX_ONLY_CASES)))
@pytest.mark.parametrize("backend", ["reference", *INTERP_BACKENDS])
def test_prefix_only_call(backend, i):
    _need(backend)
    spec, lens = PREFIX_ONLY_CASES[i]
    kw = _prefix_only_kw(spec, lens)
    want_o, want_l = _dense_prefix_only(kw)
    out = torch.full((kw["q"].shape[0], spec.hq, spec.dv), float("nan"))
    cfgs = [None] if backend == "reference" else [SMALL, KernelConfig(num_splits=1, block_n=16, block_m=16)]
    for cfg in cfgs:   # split-KV with a combine, and one split writing out directly
        o, l = tree_verify(**_int64(kw) if i == 0 else kw, backend=backend, config=cfg, out=out.clone(),
                           return_lse=True)
        atol, rtol = TOL[torch.float32]
        assert torch.allclose(o.double(), want_o, atol=atol, rtol=rtol), f"{backend} {cfg}: out"
        finite = torch.isfinite(want_l)
        assert torch.equal(torch.isfinite(l), finite), f"{backend} {cfg}: lse -inf where nothing is seen"
        assert torch.allclose(l.double()[finite], want_l[finite], atol=1e-5), f"{backend} {cfg}: lse"


def test_prefix_only_validation_and_backend_choice():
    spec, lens = PREFIX_ONLY_CASES[0]
    kw = _prefix_only_kw(spec, lens)
    with pytest.raises(ValueError, match="kv_lens\\[1\\]=-1 is negative"):
        tree_verify(**{**kw, "kv_lens": torch.tensor([36, -1, 0], dtype=torch.int32)}, backend="reference")
    with pytest.raises(ValueError, match="request 0 needs 37 slot ids"):
        tree_verify(**{**kw, "kv_lens": torch.tensor([37, 2, 0], dtype=torch.int32)}, backend="reference")
    # a backend without prefix-only support is refused by name (every shipped backend has it now)
    from cases import temporary_backend
    from verify_attn.backends import Backend
    with temporary_backend(Backend("no-prefix-only", lambda *a: None)):
        with pytest.raises(ValueError, match="backend 'no-prefix-only' does not support prefix-only calls"):
            tree_verify(**kw, backend="no-prefix-only")
    assert verify_attn.api._pick_auto(_problem(kw)) == "reference"


@pytest.mark.parametrize("i", range(len(PREFIX_ONLY_CASES)))
def test_prefix_only_call_on_the_cuda_kernels_in_the_emulator(i):
    """csrc: no tree block (prefix = kv_len, no mask reads), kv_lens 0 -> out 0 and lse -inf, with one
    split (the split kernel writes) and with several (the combine writes), v1 and v0 tiles."""
    _need("cuda-emu")
    spec, lens = PREFIX_ONLY_CASES[i]
    mla = spec.mla  # the kernel family's MLA head is Kimi's 576/512
    spec = dataclasses.replace(spec, dtype=torch.float16, **(dict(hq=8, hkv=1, dqk=576, dv=512) if mla else {}))
    kw = _prefix_only_kw(spec, lens)
    want_o, want_l = _dense_prefix_only(kw)
    tiles = [(32, 16, 8, 4), (32, 16, 4, 3)] if mla else [(64, 64, 4, 2)]
    for bm, bn, w, st in tiles:
        for splits in (1, 3):
            cfg = KernelConfig(num_splits=splits, block_m=bm, block_n=bn, num_warps=w, num_stages=st)
            out = torch.full((kw["q"].shape[0], spec.hq, spec.dv), float("nan"), dtype=torch.float16)
            o, l = tree_verify(**_int64(kw) if i == 0 else kw, backend="cuda-emu", config=cfg, out=out,
                               return_lse=True)
            atol, rtol = TOL[torch.float16]
            assert torch.allclose(o.double(), want_o, atol=atol, rtol=rtol), f"{cfg}: out"
            finite = torch.isfinite(want_l)
            assert torch.equal(torch.isfinite(l), finite), f"{cfg}: lse -inf where nothing is seen"
            assert torch.allclose(l.double()[finite], want_l[finite], atol=5e-3), f"{cfg}: lse"
