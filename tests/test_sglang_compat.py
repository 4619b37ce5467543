"""integration/serving/sglang_compat.py: the SGLang `extend_attention_fwd` drop-in.

Three independent checks, all on CPU with small shapes:
  * against tree_verify on the same case (prefix in the pool, tree rows as k/v_extend),
  * against a naive dense implementation of SGLang's semantics written here from
    the SGLang source's description (flattened custom_mask, k_scale/v_scale on the
    prefix only), including short prefixes (L_b < T_b, L_b = 0) and the options,
  * against SGLang's own Triton kernel under TRITON_INTERPRET=1 when the sglang
    package can be found (installed, or a --target dir in $SGLANG_SITE); its
    imports are stubbed so nothing but the kernel file and score_mod.py load.
"""
from __future__ import annotations

import math
import os

import pytest
import torch

from cases import CaseSpec, CountOps, make_case
from integration.serving.sglang_compat import extend_attention_fwd, verify_only
from verify_attn import tree as vtree
from verify_attn.api import tree_verify


# --- SGLang-format inputs --------------------------------------------------------------

def sglang_inputs(spec: CaseSpec, k_scale: float = 1.0, v_scale: float = 1.0, mla_extend_view: bool = False):
    """A tree_verify Case re-expressed in SGLang's extend layout.

    Returns (sgl kwargs for extend_attention_fwd, tree_verify kwargs with the prefix
    rows pre-scaled by k_scale/v_scale so that both compute the same thing).
    """
    case = make_case(spec)
    kw = case.kwargs
    kvp, idx = kw["kv_indptr"].tolist(), kw["kv_indices"]
    k_cache, v_cache = kw["k_cache"], kw["v_cache"]
    prefix_ids, ext_ids, kv_indptr = [], [], [0]
    for b, (lb, tb) in enumerate(zip(spec.prefix_lens, spec.tree_sizes)):
        ids = idx[kvp[b]: kvp[b] + lb + tb]
        prefix_ids.append(ids[:lb])
        ext_ids.append(ids[lb:])
        kv_indptr.append(kv_indptr[-1] + lb)
    pre = torch.cat(prefix_ids).long()
    ext = torch.cat(ext_ids).long()
    k_extend = k_cache[ext].clone()                                   # [total_q, Hkv, Dqk]
    v_extend = k_extend[..., : spec.dv] if mla_extend_view else v_cache[ext].clone()
    custom_mask, mask_indptr = vtree.to_sglang_custom_mask(kw["tree_mask"], kw["qo_indptr"], spec.prefix_lens)
    # SGLang passes int64 kv_indices and an over-allocated index buffer: mimic both
    kv_indices = torch.cat([pre, torch.full((7,), -1, dtype=torch.int64)])
    sgl = dict(q_extend=kw["q"], k_extend=k_extend, v_extend=v_extend,
               o_extend=torch.full((kw["q"].shape[0], spec.hq, spec.dv), float("nan"), dtype=spec.dtype),
               k_buffer=k_cache, v_buffer=v_cache, qo_indptr=kw["qo_indptr"],
               kv_indptr=torch.tensor(kv_indptr, dtype=torch.int32), kv_indices=kv_indices,
               custom_mask=custom_mask, is_causal=True, mask_indptr=mask_indptr,
               max_len_extend=max(spec.tree_sizes), k_scale=k_scale, v_scale=v_scale, sm_scale=kw["sm_scale"])
    tv = dict(kw)
    if k_scale != 1.0 or v_scale != 1.0:
        if spec.mla:
            raise ValueError("scaled prefix rows cannot be expressed for an aliased MLA pool here")
        k2, v2 = k_cache.clone(), v_cache.clone()
        k2[pre] *= k_scale
        v2[pre] *= v_scale
        tv["k_cache"], tv["v_cache"] = k2, v2
    return sgl, tv


def naive_sglang(q, k_extend, v_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask,
                 is_causal, mask_indptr, k_scale, v_scale, sm_scale, skip_prefix_custom_mask=True,
                 skip_prefix=False, skip_extend=False):
    """Dense float64 loops over SGLang's semantics. Returns (out [total_q, Hq, Dv], lse [total_q, Hq])."""
    total_q, hq, _ = q.shape
    hkv, dv = k_extend.shape[1], v_extend.shape[-1]
    g = hq // hkv
    out = torch.zeros(total_q, hq, dv, dtype=torch.float64)
    lse = torch.full((total_q, hq), float("-inf"), dtype=torch.float64)
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        t, lb = qo[b + 1] - qo[b], kvp[b + 1] - kvp[b]
        slots = kv_indices[kvp[b]: kvp[b + 1]].long()
        for i in range(t):
            r = qo[b] + i
            for h in range(hq):
                kh = h // g
                logits, values = [], []
                for p in range(0 if skip_prefix else lb):
                    if custom_mask is not None and not skip_prefix_custom_mask:
                        if custom_mask[int(mask_indptr[b]) + i * (lb + t) + p] == 0:
                            continue
                    s = int(slots[p])
                    logits.append(float(q[r, h].double() @ k_buffer[s, kh].double()) * sm_scale * k_scale)
                    values.append(v_buffer[s, kh].double() * v_scale)
                for j in range(0 if skip_extend else t):
                    if custom_mask is not None:
                        if custom_mask[int(mask_indptr[b]) + i * (lb + t) + lb + j] == 0:
                            continue
                    elif is_causal and j > i:
                        continue
                    logits.append(float(q[r, h].double() @ k_extend[qo[b] + j, kh].double()) * sm_scale)
                    values.append(v_extend[qo[b] + j, kh].double())
                if not logits:
                    continue
                s = torch.tensor(logits, dtype=torch.float64)
                m = s.max()
                e = torch.exp(s - m)
                out[r, h] = (e.unsqueeze(1) * torch.stack(values)).sum(0) / e.sum()
                lse[r, h] = m + torch.log(e.sum())
    return out, lse


def _naive_from(sgl: dict, **over):
    keys = ("q_extend", "k_extend", "v_extend", "k_buffer", "v_buffer", "qo_indptr", "kv_indptr", "kv_indices",
            "custom_mask", "is_causal", "mask_indptr", "k_scale", "v_scale", "sm_scale")
    args = {k: sgl[k] for k in keys}
    args["q"] = args.pop("q_extend")
    args.update(over)
    return naive_sglang(**args)


def _assert_close(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float, what: str) -> None:
    got = got.double()
    assert torch.isfinite(got).all(), f"{what}: {int((~torch.isfinite(got)).sum())} non-finite values"
    err = (got - want).abs()
    bad = err > atol + rtol * want.abs()
    assert not bad.any(), f"{what}: max abs err {float(err.max()):.3e} at {torch.nonzero(bad)[0].tolist()}"


SMALL_GQA = dict(hq=4, hkv=2, dqk=32, dv=32, mla=False)
SMALL_MLA = dict(hq=4, hkv=1, dqk=72, dv=64, mla=True)   # MLA-like aliasing at a CPU-friendly size


# --- against tree_verify -----------------------------------------------------------------

@pytest.mark.parametrize("spec", [
    CaseSpec(prefix_lens=(54,), tree_sizes=(7,), tree_kind="bushy", seed=1, **SMALL_GQA),
    CaseSpec(prefix_lens=(97, 3, 40), tree_sizes=(5, 9, 1), tree_kind="deep", seed=2, **SMALL_GQA),
    CaseSpec(prefix_lens=(0, 33), tree_sizes=(6, 4), tree_kind="star", seed=3, **SMALL_GQA),
    CaseSpec(prefix_lens=(61, 2), tree_sizes=(8, 8), tree_kind="bushy", seed=4, **SMALL_MLA),
    CaseSpec(prefix_lens=(20,), tree_sizes=(40,), tree_kind="bushy", seed=5, **SMALL_GQA),   # 2 mask words
], ids=lambda s: s.id)
def test_matches_tree_verify(spec):
    sgl, tv = sglang_inputs(spec)
    extend_attention_fwd(**sgl, backend="reference")
    want = tree_verify(**tv, backend="reference").double()
    _assert_close(sgl["o_extend"], want, 1e-5, 1e-5, spec.id)


@pytest.mark.parametrize("k_scale,v_scale", [(0.5, 1.0), (1.7, 0.25)])
def test_scales_match_tree_verify(k_scale, v_scale):
    spec = CaseSpec(prefix_lens=(45, 4), tree_sizes=(6, 7), seed=6, **SMALL_GQA)
    sgl, tv = sglang_inputs(spec, k_scale, v_scale)
    extend_attention_fwd(**sgl, backend="reference")
    want = tree_verify(**tv, backend="reference").double()
    _assert_close(sgl["o_extend"], want, 1e-5, 1e-5, f"k{k_scale}-v{v_scale}")


# --- against the naive SGLang semantics ------------------------------------------------------

@pytest.mark.parametrize("spec,mla_view", [
    (CaseSpec(prefix_lens=(30, 0, 5), tree_sizes=(6, 3, 9), tree_kind="bushy", seed=7, **SMALL_GQA), False),
    (CaseSpec(prefix_lens=(17, 1), tree_sizes=(5, 4), tree_kind="deep", seed=8, **SMALL_MLA), True),
], ids=["gqa-mixed", "mla-views"])
@pytest.mark.parametrize("k_scale,v_scale", [(1.0, 1.0), (0.6, 1.9)])
def test_matches_naive(spec, mla_view, k_scale, v_scale):
    sgl, _ = sglang_inputs(spec, mla_extend_view=mla_view)
    sgl.update(k_scale=k_scale, v_scale=v_scale)
    lse = torch.empty(sgl["q_extend"].shape[:2], dtype=torch.float32)
    extend_attention_fwd(**sgl, lse_extend=lse, backend="reference")
    want, want_lse = _naive_from(sgl)
    _assert_close(sgl["o_extend"], want, 1e-5, 1e-5, "out")
    _assert_close(lse, want_lse, 1e-5, 1e-5, "lse")


def test_no_custom_mask_causal_and_full():
    spec = CaseSpec(prefix_lens=(12, 3), tree_sizes=(5, 6), seed=9, **SMALL_GQA)
    for causal in (True, False):
        sgl, _ = sglang_inputs(spec)
        sgl.update(custom_mask=None, mask_indptr=None, is_causal=causal)
        extend_attention_fwd(**sgl, backend="reference")
        want, _ = _naive_from(sgl)
        _assert_close(sgl["o_extend"], want, 1e-5, 1e-5, f"causal={causal}")


def test_skip_prefix_and_skip_extend():
    spec = CaseSpec(prefix_lens=(14, 0), tree_sizes=(4, 3), seed=10, **SMALL_GQA)
    for flag in ("skip_prefix", "skip_extend"):
        sgl, _ = sglang_inputs(spec)
        lse = torch.empty(sgl["q_extend"].shape[:2], dtype=torch.float32)
        extend_attention_fwd(**sgl, lse_extend=lse, **{flag: True}, backend="reference")
        want, want_lse = _naive_from(sgl, **{flag: True})
        # skip_extend with L_b = 0: SGLang writes out = 0, lse = -inf
        _assert_close(sgl["o_extend"], want, 1e-5, 1e-5, flag)
        fin = torch.isfinite(want_lse)
        assert torch.equal(torch.isfinite(lse), fin), flag
        _assert_close(lse[fin], want_lse[fin], 1e-5, 1e-5, flag + " lse")


def test_prefix_mask_all_ones_is_accepted_and_hidden_prefix_raises():
    spec = CaseSpec(prefix_lens=(10,), tree_sizes=(4,), seed=11, **SMALL_GQA)
    sgl, _ = sglang_inputs(spec)
    extend_attention_fwd(**sgl, skip_prefix_custom_mask=False, backend="reference")
    want, _ = _naive_from(sgl, skip_prefix_custom_mask=False)
    _assert_close(sgl["o_extend"], want, 1e-5, 1e-5, "all-ones prefix mask")
    sgl["custom_mask"] = sgl["custom_mask"].clone()
    sgl["custom_mask"][3] = 0          # row 0 hides prefix token 3
    with pytest.raises(NotImplementedError, match="skip_prefix_custom_mask"):
        extend_attention_fwd(**sgl, skip_prefix_custom_mask=False, backend="reference")


@pytest.mark.parametrize("opt,val", [
    ("logit_cap", 30.0), ("sliding_window_size", 8), ("sinks", torch.zeros(4)), ("xai_temperature_len", 4),
    ("page_size", 16), ("window_kv_offsets", torch.zeros(1, dtype=torch.int32)),
])
def test_unsupported_options_raise(opt, val):
    sgl, _ = sglang_inputs(CaseSpec(prefix_lens=(8,), tree_sizes=(3,), seed=12, **SMALL_GQA))
    with pytest.raises(NotImplementedError, match=opt):
        extend_attention_fwd(**sgl, **{opt: val}, backend="reference")


def test_causal_with_upper_triangular_custom_mask_raises():
    sgl, _ = sglang_inputs(CaseSpec(prefix_lens=(8,), tree_sizes=(3,), seed=13, **SMALL_GQA))
    cm = sgl["custom_mask"].clone()
    cm[8 + 2] = 1                       # row 0 sees tree node 2 (a later node)
    sgl["custom_mask"] = cm
    with pytest.raises(NotImplementedError, match="is_causal"):
        extend_attention_fwd(**sgl, backend="reference")
    sgl["is_causal"] = False             # non-causal: the mask alone decides, as in SGLang
    extend_attention_fwd(**sgl, backend="reference")
    want, _ = _naive_from(sgl)
    _assert_close(sgl["o_extend"], want, 1e-5, 1e-5, "non-causal custom mask")


def test_mixed_dtype_raises():
    sgl, _ = sglang_inputs(CaseSpec(prefix_lens=(8,), tree_sizes=(3,), seed=14, **SMALL_GQA))
    sgl["k_buffer"] = sgl["k_buffer"].half()
    with pytest.raises(NotImplementedError, match="k_buffer"):
        extend_attention_fwd(**sgl, backend="reference")
    sgl, _ = sglang_inputs(CaseSpec(prefix_lens=(8,), tree_sizes=(3,), seed=14, **SMALL_GQA))
    sgl["v_buffer"] = sgl["v_buffer"].to(torch.float8_e4m3fn)     # V fp8, K not
    with pytest.raises(NotImplementedError, match="v_buffer"):
        extend_attention_fwd(**sgl, backend="reference")


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("spec", [
    CaseSpec(prefix_lens=(30, 0), tree_sizes=(5, 3), seed=21, dtype=torch.float16, **SMALL_GQA),
    CaseSpec(prefix_lens=(25,), tree_sizes=(6,), seed=22, dtype=torch.float16, **SMALL_MLA),
], ids=lambda s: s.id)
def test_fp8_pool_passes_scales_through(spec, backend):
    """SGLang's fp8_e4m3 KV cache: fp8 k_buffer/v_buffer, extend rows in q's dtype, float or tensor
    scales; equal to SGLang's math (logits x k_scale, prefix values x v_scale) on the same fp8 codes."""
    from verify_attn.fp8 import quantize_e4m3
    sgl, _ = sglang_inputs(spec)
    kq, _ = quantize_e4m3(sgl["k_buffer"], scale=1.0 / 16)
    vq = kq[..., : spec.dv] if spec.mla else quantize_e4m3(sgl["v_buffer"], scale=1.0 / 8)[0]
    ks, vs = 0.07, (0.07 if spec.mla else 0.11)
    sgl.update(k_buffer=kq, v_buffer=vq, k_scale=ks, v_scale=vs)
    want, _ = _naive_from(sgl, k_buffer=kq.float(), v_buffer=vq.float())
    extend_attention_fwd(**sgl, backend=backend)
    _assert_close(sgl["o_extend"], want, 2e-3, 2e-2, "fp8 pool, float scales")
    sgl["o_extend"].fill_(float("nan"))
    sgl.update(k_scale=torch.tensor([ks]), v_scale=torch.tensor([vs]) if not spec.mla else None)
    extend_attention_fwd(**sgl, backend=backend)
    _assert_close(sgl["o_extend"], want, 2e-3, 2e-2, "fp8 pool, tensor scales")


def test_the_merge_never_copies_the_pool(monkeypatch):
    """Call A must get the caller's k_buffer/v_buffer objects (no copy of the pool)."""
    import integration.serving.sglang_compat as mod
    seen = []
    real = mod.tree_verify

    def spy(q, k_cache, v_cache, *a, **kw):
        seen.append((k_cache.data_ptr(), v_cache.data_ptr(), k_cache.shape[0]))
        return real(q, k_cache, v_cache, *a, **kw)
    monkeypatch.setattr(mod, "tree_verify", spy)
    sgl, _ = sglang_inputs(CaseSpec(prefix_lens=(40, 2), tree_sizes=(3, 5), seed=15, **SMALL_MLA))
    extend_attention_fwd(**sgl, backend="reference")
    assert seen[0][:2] == (sgl["k_buffer"].data_ptr(), sgl["v_buffer"].data_ptr())
    assert seen[1][2] == sgl["q_extend"].shape[0]     # call B's pool is the T extend rows


def test_adapter_work_does_not_scale_with_index_buffer(monkeypatch):
    """Inside SGLang's CUDA graphs kv_indices is a max_tokens x max_context int64 buffer.
    The adapter's own work per layer (every aten op it dispatches, with the elements each
    touches; the two kernels are a spy backend here) must be the same for a 10,000x larger
    index buffer and a 100x longer context, and call A must get the caller's kv_indptr,
    kv_indices and qo_indptr objects themselves (int64 kept, no copy, no rebuild)."""
    import integration.serving.sglang_compat as mod
    from cases import temporary_backend
    from verify_attn.backends import Backend
    import verify_attn

    monkeypatch.setattr(mod, "_capturing", lambda dev: True)   # the graph path: no host reads in the adapter
    seen = []

    def spy(p, cfg, out, lse):
        seen.append(p)
        out.zero_()
        lse.zero_()

    runs = []
    verify_attn.set_validation("shapes")   # as under capture (full checks would read the indices on the host)
    try:
        with temporary_backend(Backend("spy-kernels", spy, prefix_only=True)):
            for prefix_lens, pad in (((30, 0, 5), 7), ((30, 0, 5), 70_000), ((3000, 0, 500), 7)):
                sgl, _ = sglang_inputs(CaseSpec(prefix_lens=prefix_lens, tree_sizes=(6, 3, 9), seed=16, **SMALL_GQA))
                sgl["kv_indices"] = torch.cat([sgl["kv_indices"], torch.full((pad,), -1, dtype=torch.int64)])
                sgl["qo_indptr"] = sgl["qo_indptr"].long()
                seen.clear()
                with CountOps() as c:
                    extend_attention_fwd(**sgl, backend="spy-kernels")
                runs.append((c, seen[0], sgl))
    finally:
        verify_attn.set_validation("full")
    assert runs[1][0].ops == runs[0][0].ops, "adapter work grows with the index buffer"
    assert runs[2][0].ops == runs[0][0].ops, "adapter work grows with the context length"
    for _, a, sgl in runs:   # call A: the caller's own index tensors
        assert a.prefix_only and a.kv_indices is sgl["kv_indices"] and a.kv_indptr is sgl["kv_indptr"]
        assert a.qo_indptr is sgl["qo_indptr"] and a.kv_indices.dtype == torch.int64
    runs = [r[0] for r in runs]
    biggest = max(n for _, n in runs[0].ops)
    assert biggest < 10_000, f"an op touches {biggest} elements"
    # the documented cost (module docstring: ~48 small kernels per layer besides the two attention calls;
    # the spy's 4 fills stand in for those): a guard against the glue growing unnoticed
    assert len(runs[0].kernels()) <= 4 + 50, [o for o, _ in runs[0].kernels()]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_merge(dtype):
    """16-bit inputs: the two partial outputs are rounded to the dtype before the fp32
    merge; the result stays within the project's tolerance for that dtype."""
    from cases import TOL
    spec = CaseSpec(prefix_lens=(50, 3), tree_sizes=(6, 8), seed=24, dtype=dtype, **SMALL_GQA)
    sgl, _ = sglang_inputs(spec)
    extend_attention_fwd(**sgl, backend="reference")
    want, _ = _naive_from(sgl)
    assert sgl["o_extend"].dtype == dtype
    _assert_close(sgl["o_extend"], want, *TOL[dtype], str(dtype))


def test_default_sm_scale_and_fp32_output_buffer():
    """sm_scale None -> 1/sqrt(Dqk) as in SGLang; o_extend may be fp32 for 16-bit q (SGLang's DCP path)."""
    spec = CaseSpec(prefix_lens=(21,), tree_sizes=(5,), seed=25, dtype=torch.float16, **SMALL_GQA)
    sgl, _ = sglang_inputs(spec)
    sgl["o_extend"] = torch.full(sgl["o_extend"].shape, float("nan"), dtype=torch.float32)
    sgl["sm_scale"] = None
    extend_attention_fwd(**sgl, backend="reference")
    want, _ = _naive_from(sgl, sm_scale=1.0 / math.sqrt(spec.dqk))
    _assert_close(sgl["o_extend"], want, 2e-3, 2e-2, "default scale")


def test_identity_kv_indices():
    """identity_kv_indices=True: prefix token t of request b sits in slot kv_indptr[b] + t."""
    spec = CaseSpec(prefix_lens=(11, 2, 6), tree_sizes=(3, 5, 4), seed=26, **SMALL_GQA)
    sgl, _ = sglang_inputs(spec)
    n = int(sgl["kv_indptr"][-1])
    dense_k = sgl["k_buffer"][sgl["kv_indices"][:n]].clone()      # the prefix rows, packed in order
    dense_v = sgl["v_buffer"][sgl["kv_indices"][:n]].clone()
    sgl.update(k_buffer=dense_k, v_buffer=dense_v, kv_indices=torch.arange(n))
    want, _ = _naive_from(sgl)
    sgl["kv_indices"] = torch.full((n,), -1, dtype=torch.int64)   # must not be read
    extend_attention_fwd(**sgl, identity_kv_indices=True, backend="reference")
    _assert_close(sgl["o_extend"], want, 1e-5, 1e-5, "identity_kv_indices")


def test_verify_only_routes_calls():
    """Tree-verify calls run here; plain extend calls and unsupported options go to SGLang's."""
    calls = []

    def original(*args, **kwargs):
        calls.append(kwargs.get("logit_cap", 0.0))
        args[3].fill_(7.0)
        return args[3]
    fwd = verify_only(original, backend="reference")
    sgl, _ = sglang_inputs(CaseSpec(prefix_lens=(9, 2), tree_sizes=(4, 5), seed=20, **SMALL_GQA))
    order = ("q_extend", "k_extend", "v_extend", "o_extend", "k_buffer", "v_buffer", "qo_indptr", "kv_indptr",
             "kv_indices", "custom_mask", "is_causal", "mask_indptr", "max_len_extend", "k_scale", "v_scale")
    pos = [sgl[k] for k in order]
    fwd(*pos, sm_scale=sgl["sm_scale"])                      # positional, as SGLang calls it
    assert calls == []
    want, _ = _naive_from(sgl)
    _assert_close(sgl["o_extend"], want, 1e-5, 1e-5, "verify_only")
    fwd(*pos, sm_scale=sgl["sm_scale"], logit_cap=30.0)     # unsupported: SGLang's kernel
    assert calls == [30.0] and bool((sgl["o_extend"] == 7.0).all())
    pos[9] = None                                            # no custom mask: prefill, SGLang's kernel
    fwd(*pos, sm_scale=sgl["sm_scale"])
    assert len(calls) == 2


def test_graph_safe_path_matches(monkeypatch):
    """The path taken under CUDA-graph capture (no host reads in the adapter: the padded
    index array is always rebuilt, sized by a static bound) computes the same thing."""
    import integration.serving.sglang_compat as mod
    monkeypatch.setattr(mod, "_capturing", lambda dev: True)
    for spec in (CaseSpec(prefix_lens=(30, 0, 5), tree_sizes=(6, 3, 9), seed=16, **SMALL_GQA),
                 CaseSpec(prefix_lens=(25, 11), tree_sizes=(4, 6), seed=17, **SMALL_MLA)):
        sgl, _ = sglang_inputs(spec, mla_extend_view=spec.mla)
        extend_attention_fwd(**sgl, backend="reference")
        want, _ = _naive_from(sgl)
        _assert_close(sgl["o_extend"], want, 1e-5, 1e-5, spec.id)


@pytest.mark.parametrize("backend", ["triton", "triton-serial"])
def test_triton_backends_on_cpu(backend):
    """The adapter over a real kernel backend (Triton interpreter here, fp32 inputs)."""
    from verify_attn.backends import get_backend
    _need_interpreter()
    ok, why = get_backend(backend).available()
    if not ok:
        pytest.skip(f"{backend} unavailable: {why}")
    for spec in (CaseSpec(prefix_lens=(30, 0, 5), tree_sizes=(6, 3, 9), seed=18, **SMALL_GQA),
                 CaseSpec(prefix_lens=(17, 1), tree_sizes=(5, 4), tree_kind="deep", seed=19, **SMALL_MLA)):
        sgl, _ = sglang_inputs(spec, mla_extend_view=spec.mla)
        sgl.update(k_scale=0.6, v_scale=1.9)
        extend_attention_fwd(**sgl, backend=backend)
        want, _ = _naive_from(sgl)
        _assert_close(sgl["o_extend"], want, 1e-4, 1e-4, f"{backend} {spec.id}")


@pytest.mark.slow
def test_cuda_emu_backend_fp16_mla():
    """The CPU emulation of the CUDA kernel under the adapter (fp16, Kimi-shaped heads).
    Slow: JIT-builds the emulator (~4.5 min here under load on first use)."""
    from verify_attn.backends import get_backend
    ok, why = get_backend("cuda-emu").available()
    if not ok:
        pytest.skip(f"cuda-emu unavailable: {why}")
    spec = CaseSpec(prefix_lens=(30, 0, 5), tree_sizes=(6, 3, 9), seed=7, hq=8, hkv=1, dqk=576, dv=512,
                    mla=True, dtype=torch.float16)
    sgl, _ = sglang_inputs(spec, mla_extend_view=True)
    sgl.update(k_scale=0.6, v_scale=1.9)
    extend_attention_fwd(**sgl, backend="cuda-emu")
    want, _ = _naive_from(sgl)
    _assert_close(sgl["o_extend"], want, 2e-3, 2e-2, "cuda-emu fp16")


# --- against SGLang's own Triton kernel (interpreter) --------------------------------------

def _need_interpreter() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("CPU tensors in a Triton kernel need TRITON_INTERPRET=1 (conftest sets it without a GPU)")


def _load_sglang_kernel():
    """SGLang's extend_attention.py by path with its sglang imports stubbed (bench.benchmark.baselines, which the
    benchmark's sglang-extend peer uses too)."""
    from bench.benchmark.baselines import load_sglang_extend, sglang_kernel_file, sglang_root
    root = sglang_root()
    if root is None:
        pytest.skip("sglang not found: pip install --no-deps sglang==0.5.23, or unzip its wheel into "
                    "tests/sglang_ref/ or $SGLANG_SITE")
    path = sglang_kernel_file(root)
    if path is None:
        pytest.skip(f"no extend_attention.py under {root}")
    return load_sglang_extend(path)


@pytest.fixture(scope="module")
def sgl_kernel():
    return _load_sglang_kernel()


def _sglang_output(sgl_kernel, sgl: dict) -> torch.Tensor:
    """SGLang's own extend_attention_fwd on the same inputs (positional, as SGLang calls it),
    into a fresh output; returns that output in float64."""
    theirs = dict(sgl)
    theirs["o_extend"] = torch.zeros_like(sgl["o_extend"])
    sgl_kernel.extend_attention_fwd(*[theirs[k] for k in (
        "q_extend", "k_extend", "v_extend", "o_extend", "k_buffer", "v_buffer", "qo_indptr", "kv_indptr",
        "kv_indices", "custom_mask", "is_causal", "mask_indptr", "max_len_extend", "k_scale", "v_scale")],
        sm_scale=sgl["sm_scale"])
    return theirs["o_extend"].double()


@pytest.mark.parametrize("spec,k_scale,v_scale", [
    (CaseSpec(prefix_lens=(70, 5), tree_sizes=(7, 9), tree_kind="bushy", seed=21, **SMALL_GQA), 1.0, 1.0),
    (CaseSpec(prefix_lens=(33, 0, 2), tree_sizes=(4, 3, 6), tree_kind="deep", seed=22, **SMALL_GQA), 0.7, 1.3),
    (CaseSpec(prefix_lens=(40,), tree_sizes=(8,), tree_kind="star", seed=23, hq=4, hkv=1, dqk=576, dv=512,
              mla=True), 1.0, 1.0),
], ids=["gqa", "gqa-short-prefix-scaled", "mla-576"])
def test_matches_sglang_kernel(sgl_kernel, spec, k_scale, v_scale):
    _need_interpreter()
    sgl, _ = sglang_inputs(spec, mla_extend_view=spec.mla)
    sgl.update(k_scale=k_scale, v_scale=v_scale)
    want = _sglang_output(sgl_kernel, sgl)
    extend_attention_fwd(**sgl, backend="reference")
    assert torch.isfinite(want).all()
    rel = float((sgl["o_extend"].double() - want).abs().max() / want.abs().max())
    assert rel < 1e-4, f"relative error vs SGLang's kernel {rel:.2e}"


# --- GPU: the CUDA-graph path for real, and SGLang's kernel compiled -------------------------

def _to_cuda(sgl: dict) -> dict:
    out = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in sgl.items()}
    for view, base in (("v_buffer", "k_buffer"), ("v_extend", "k_extend")):   # keep MLA aliases on the device
        if sgl[view].untyped_storage().data_ptr() == sgl[base].untyped_storage().data_ptr():
            out[view] = out[base][..., : sgl[view].shape[-1]]
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_graph_capture_and_replay(dtype):
    """Capture the adapter in a CUDA graph (as SGLang does for target verify), change the
    data in place, replay, and compare with the naive semantics on the new data."""
    spec = CaseSpec(prefix_lens=(300, 2, 1000), tree_sizes=(8, 8, 8), seed=31, hq=8, hkv=1, dqk=576, dv=512,
                    mla=True, dtype=dtype)
    sgl = _to_cuda(sglang_inputs(spec, mla_extend_view=True)[0])
    extend_attention_fwd(**sgl)                             # warm-up (JIT, autotune lookups) off capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        extend_attention_fwd(**sgl)
    gen = torch.Generator(device="cuda").manual_seed(5)
    sgl["q_extend"].copy_(torch.randn(sgl["q_extend"].shape, generator=gen, device="cuda").to(dtype))
    g.replay()
    torch.cuda.synchronize()
    cpu = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in sgl.items()}
    cpu["v_extend"] = cpu["k_extend"][..., : spec.dv]
    cpu["v_buffer"] = cpu["k_buffer"][..., : spec.dv]
    want, _ = _naive_from(cpu)
    _assert_close(cpu["o_extend"].float(), want, 2e-2, 2e-2, f"graph replay {dtype}")


@pytest.mark.gpu
def test_matches_sglang_kernel_on_gpu(sgl_kernel):
    """bf16 at a longer prefix, both compiled for the GPU; agreement within bf16 rounding."""
    spec = CaseSpec(prefix_lens=(4000, 17), tree_sizes=(16, 9), seed=32, hq=8, hkv=1, dqk=576, dv=512,
                    mla=True, dtype=torch.bfloat16)
    sgl = _to_cuda(sglang_inputs(spec, mla_extend_view=True)[0])
    want = _sglang_output(sgl_kernel, sgl)
    extend_attention_fwd(**sgl)
    assert torch.isfinite(want).all()
    _assert_close(sgl["o_extend"], want, 2e-2, 2e-2, "vs SGLang kernel on GPU")
