"""integration/serving/verify_step.py: SGLang's target verify at one launch per layer.

The inputs are SGLang's as its model runner holds them in target verify: a slot pool with the
prefix rows and the draft rows (written at out_cache_loc), req_to_token with each request's
prefix slots, and the tree as custom_mask / mask_indptr; pages allocated in order per request
and shuffled across the pool, unaddressed slots NaN. Checked against the float64 reference,
against SGLang's own extend_attention kernel (Triton interpreter) on the same inputs, and by
counting the ops a layer dispatches (torch dispatch mode on the cuda-emu backend).
"""
from __future__ import annotations

import pytest
import torch

from cases import CaseSpec, CountOps, check_against_reference, check_e4m3_mma_against_reference, make_case
import verify_attn
from verify_attn import tree as vtree
from verify_attn.backends import get_backend
from verify_attn.fp8 import quantize_kwargs
from integration.serving.sglang_compat import extend_attention_fwd
from integration.serving.verify_step import StepBuffers, from_req_to_token, plan_step, verify_layer

GQA = dict(hq=4, hkv=2, dqk=64, dv=64, mla=False)           # a head shape the CUDA kernels are built for
MLA_SMALL = dict(hq=4, hkv=1, dqk=72, dv=64, mla=True)      # MLA aliasing at a CPU-friendly size
MLA = dict(hq=8, hkv=1, dqk=576, dv=512, mla=True)


def serving_inputs(spec: CaseSpec, page_size: int = 1, *, extra_pages: int = 3, table_width: int | None = None,
                   kv_dtype: str = "") -> tuple[dict, object]:
    """(SGLang's view of a Case, the Case): a fresh [num_slots, Hkv, D] pool at page_size, each
    request's tokens (prefix then draft) filling its own shuffled pages in order, every other slot
    NaN; req_to_token rows at shuffled pool indices; out_cache_loc = the draft rows' slots."""
    case = make_case(spec)
    kw = case.kwargs
    if kv_dtype:
        case.kwargs = kw = quantize_kwargs(kw, kv_dtype, mla_dv=spec.dv if spec.mla else None)
    g = torch.Generator().manual_seed(77 + spec.seed)
    lens = [lb + tb for lb, tb in zip(spec.prefix_lens, spec.tree_sizes)]
    need = [-(-n // page_size) for n in lens]
    num_pages = sum(need) + extra_pages
    perm = torch.randperm(num_pages, generator=g).tolist()
    k_src, kvp, idx = kw["k_cache"], kw["kv_indptr"].tolist(), kw["kv_indices"]
    nan = float("nan")
    if k_src.dtype == torch.float8_e4m3fn:
        k_pool = torch.full((num_pages * page_size, *k_src.shape[1:]), nan).to(k_src.dtype)
    else:
        k_pool = torch.full((num_pages * page_size, *k_src.shape[1:]), nan, dtype=k_src.dtype)
    v_pool = k_pool[..., : spec.dv] if spec.mla else torch.full((num_pages * page_size, *kw["v_cache"].shape[1:]),
                                                                 nan, dtype=kw["v_cache"].dtype)
    width = table_width or max(lens) + 5
    req_to_token = torch.full((len(lens) + 3, width), -1, dtype=torch.int32)
    rpi = torch.randperm(len(lens) + 3, generator=g)[: len(lens)]
    out_cache_loc, used = [], 0
    for b, (lb, n) in enumerate(zip(spec.prefix_lens, lens)):
        pages = perm[used: used + need[b]]
        used += need[b]
        slots = torch.tensor([pages[j // page_size] * page_size + j % page_size for j in range(n)], dtype=torch.int64)
        src = idx[kvp[b]: kvp[b] + n].long()           # the case's rows of request b (page_size 1 case)
        k_pool[slots] = k_src[src]
        if not spec.mla:
            v_pool[slots] = kw["v_cache"][src]
        req_to_token[rpi[b], :lb] = slots[:lb].to(torch.int32)
        out_cache_loc.append(slots[lb:])
    custom_mask, mask_indptr = vtree.to_sglang_custom_mask(kw["tree_mask"], kw["qo_indptr"], spec.prefix_lens)
    sgl = dict(q=kw["q"], k_buffer=k_pool, v_buffer=v_pool, req_to_token=req_to_token, req_pool_indices=rpi,
               seq_lens=torch.tensor(spec.prefix_lens, dtype=torch.int64), out_cache_loc=torch.cat(out_cache_loc),
               qo_indptr=kw["qo_indptr"], custom_mask=custom_mask, mask_indptr=mask_indptr,
               max_tree=max(spec.tree_sizes), sm_scale=kw["sm_scale"], page_size=page_size,
               k_scale=kw.get("k_scale"), v_scale=kw.get("v_scale"))
    return sgl, case


def plan(sgl: dict, **kw):
    return from_req_to_token(req_to_token=sgl["req_to_token"], req_pool_indices=sgl["req_pool_indices"],
                             seq_lens=sgl["seq_lens"], out_cache_loc=sgl["out_cache_loc"],
                             qo_indptr=sgl["qo_indptr"], custom_mask=sgl["custom_mask"],
                             mask_indptr=sgl["mask_indptr"], max_tree=sgl["max_tree"], page_size=sgl["page_size"],
                             **kw)


def layer(sgl: dict, step, **kw):
    out = torch.full((sgl["q"].shape[0], sgl["q"].shape[1], sgl["v_buffer"].shape[-1]), float("nan"),
                     dtype=sgl["q"].dtype)
    return verify_layer(sgl["q"], sgl["k_buffer"], sgl["v_buffer"], step, sm_scale=sgl["sm_scale"], out=out,
                        k_scale=sgl["k_scale"], v_scale=sgl["v_scale"], return_lse=True, **kw)


def _need(backend: str) -> None:
    ok, why = get_backend(backend).available()
    if not ok:
        pytest.skip(f"{backend} unavailable: {why}")


SPECS = [
    CaseSpec(prefix_lens=(54,), tree_sizes=(7,), tree_kind="bushy", seed=1, **GQA),
    CaseSpec(prefix_lens=(97, 3, 40), tree_sizes=(5, 9, 1), tree_kind="deep", seed=2, **GQA),
    CaseSpec(prefix_lens=(0, 33), tree_sizes=(6, 4), tree_kind="star", seed=3, **GQA),
    CaseSpec(prefix_lens=(61, 2), tree_sizes=(8, 8), tree_kind="bushy", seed=4, **MLA_SMALL),
    CaseSpec(prefix_lens=(20,), tree_sizes=(40,), tree_kind="bushy", seed=5, **GQA),   # 2 mask words
]


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.id)
def test_one_launch_matches_reference(spec, page_size):
    sgl, case = serving_inputs(spec, page_size)
    step = plan(sgl)
    out, lse = layer(sgl, step, backend="reference")
    check_against_reference(out, lse, case)


@pytest.mark.parametrize("backend", ["triton", "cuda-emu"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_one_launch_on_the_kernels(backend, page_size):
    _need(backend)
    spec = CaseSpec(prefix_lens=(45, 0, 19), tree_sizes=(6, 3, 9), tree_kind="bushy", seed=8, dtype=torch.float16,
                    **GQA)   # fp16: the interpreter's bf16 tl.dot is broken (FACTS.md)
    sgl, case = serving_inputs(spec, page_size)
    out, lse = layer(sgl, plan(sgl), backend=backend)
    check_against_reference(out, lse, case)


@pytest.mark.parametrize("page_size", [1, 16])
def test_one_launch_fp8_pool_on_the_emulated_kernels(page_size):
    """An fp8_e4m3 MLA pool (SGLang's fp8 KV cache): the draft rows are read back from the pool,
    dequantized with the layer's k_scale, like the prefix. The default tile of the planning arch (CPU tensors: the
    H200's, kernel v2 on wgmma .e4m3) rounds Q and P to e4m3: the e4m3-MMA tolerances, else the 16-bit ones."""
    _need("cuda-emu")
    from verify_attn import build as vb
    from verify_attn import device as vdevice

    spec = CaseSpec(prefix_lens=(21, 4), tree_sizes=(5, 3), tree_kind="bushy", seed=9, dtype=torch.bfloat16, **MLA)
    sgl, case = serving_inputs(spec, page_size, kv_dtype="fp8_e4m3")
    out, lse = layer(sgl, plan(sgl), backend="cuda-emu")
    case = dataclass_replace_kv(case, "fp8_e4m3")
    if vb.default_tile("mla576e4m3", vdevice.props_for("cpu").arch).fp8_mma:
        check_e4m3_mma_against_reference(out, lse, case)
    else:
        check_against_reference(out, lse, case)


def dataclass_replace_kv(case, kv_dtype: str):
    """The Case with its spec marked fp8 (its kwargs already hold the quantized cache): fp8 tolerances."""
    import dataclasses
    case.spec = dataclasses.replace(case.spec, kv_dtype=kv_dtype)
    return case


def test_many_layers_share_one_plan():
    """Per-layer pools differ, the plan is the same object for every layer."""
    spec = CaseSpec(prefix_lens=(30, 12), tree_sizes=(5, 7), seed=10, **GQA)
    sgl, case = serving_inputs(spec, 16)
    step = plan(sgl)
    for i in range(3):
        sgl_i, case_i = dict(sgl), case
        if i:
            sgl_i["k_buffer"] = sgl["k_buffer"] * (1 + i)       # another layer's pool, same slots
            sgl_i["v_buffer"] = sgl["v_buffer"] - i
            case_i = make_case(spec)
            case_i.kwargs["k_cache"] = case.kwargs["k_cache"] * (1 + i)
            case_i.kwargs["v_cache"] = case.kwargs["v_cache"] - i
        out, lse = layer(sgl_i, step, backend="reference")
        check_against_reference(out, lse, case_i)


def test_plan_from_sglang_triton_indices_equals_req_to_token():
    """The second prefix source (SGLang's Triton backend kv_indptr / kv_indices, padded like its graph
    buffer) gives the same plan as req_to_token."""
    spec = CaseSpec(prefix_lens=(40, 0, 7), tree_sizes=(4, 6, 2), seed=11, **GQA)
    sgl, _ = serving_inputs(spec, 1)
    a = plan(sgl)
    rows = [sgl["req_to_token"][int(r), :int(n)].long() for r, n in zip(sgl["req_pool_indices"], sgl["seq_lens"])]
    kv_indices = torch.cat(rows + [torch.full((1000,), -1, dtype=torch.int64)])
    kv_indptr = torch.tensor([0] + torch.tensor([len(r) for r in rows]).cumsum(0).tolist())
    b = plan_step(qo_indptr=sgl["qo_indptr"], prefix_lens=kv_indptr[1:] - kv_indptr[:-1], prefix_slots=kv_indices,
                  prefix_base=kv_indptr[:-1], out_cache_loc=sgl["out_cache_loc"], custom_mask=sgl["custom_mask"],
                  mask_indptr=sgl["mask_indptr"], max_tree=sgl["max_tree"], max_kv_len=sgl["req_to_token"].shape[1])
    for name in ("kv_indptr", "kv_indices", "kv_lens", "tree_mask"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


# --- one op per layer ----------------------------------------------------------------------

def test_one_op_per_layer_and_the_plan_once_per_step():
    """torch dispatch mode on the CPU backend (cuda-emu, whose launch is one op like the GPU build's):
    each layer dispatches exactly one op, the kernel; the step plan's ops are dispatched once and
    do not grow with the index table, the context, or the number of layers."""
    _need("cuda-emu")
    verify_attn.set_validation("shapes")        # as in serving (full checks read indices on the host)
    try:
        counts = []
        for prefix_lens, width in (((30, 0, 5), None), ((30, 0, 5), 5000), ((300, 0, 50), None)):
            spec = CaseSpec(prefix_lens=prefix_lens, tree_sizes=(6, 3, 9), seed=12, dtype=torch.bfloat16, **GQA)
            sgl, case = serving_inputs(spec, 1, table_width=width)
            layer(sgl, plan(sgl, max_kv_len=350), backend="cuda-emu")   # warm: build, error flags, config
            with CountOps() as c_plan:
                step = plan(sgl, max_kv_len=350)
            per_layer = []
            out = torch.full((sgl["q"].shape[0], spec.hq, spec.dv), float("nan"), dtype=sgl["q"].dtype)
            for _ in range(3):   # SGLang's layer owns its output buffer and asks for no LSE
                with CountOps() as c:
                    verify_layer(sgl["q"], sgl["k_buffer"], sgl["v_buffer"], step, sm_scale=sgl["sm_scale"],
                                 out=out, backend="cuda-emu")
                per_layer.append([o for o, _ in c.kernels()])
            check_against_reference(out, None, case)
            assert per_layer == [["verify_attn_emu.tree_verify"]] * 3, per_layer
            counts.append([o for o, _ in c_plan.kernels()])
            biggest = max(n for _, n in c_plan.ops)
            assert biggest < 40_000, f"a plan op touches {biggest} elements"
    finally:
        verify_attn.set_validation("full")
    assert counts[1] == counts[0] and counts[2] == counts[0], "the step plan's ops depend on the table or context"
    assert len(counts[0]) <= 80, counts[0]   # 66 today: ~1 launch per layer over a 61-layer model


def test_compat_path_for_comparison_dispatches_more():
    """The positional drop-in (sglang_compat.extend_attention_fwd) cannot see out_cache_loc: it runs
    two calls and a merge per layer. The one-launch path is what a backend class uses."""
    _need("cuda-emu")
    spec = CaseSpec(prefix_lens=(30, 5), tree_sizes=(6, 3), seed=13, dtype=torch.bfloat16, **GQA)
    sgl, _ = serving_inputs(spec, 1)
    prefix = torch.cat([sgl["req_to_token"][int(r), :int(n)].long()
                        for r, n in zip(sgl["req_pool_indices"], sgl["seq_lens"])])
    kv_indptr = torch.tensor([0, 30, 35], dtype=torch.int32)
    ext = sgl["out_cache_loc"]
    o = torch.empty(sgl["q"].shape[0], spec.hq, spec.dv, dtype=sgl["q"].dtype)
    args = dict(q_extend=sgl["q"], k_extend=sgl["k_buffer"][ext], v_extend=sgl["v_buffer"][ext], o_extend=o,
                k_buffer=sgl["k_buffer"], v_buffer=sgl["v_buffer"], qo_indptr=sgl["qo_indptr"], kv_indptr=kv_indptr,
                kv_indices=prefix, custom_mask=sgl["custom_mask"], is_causal=True, mask_indptr=sgl["mask_indptr"],
                max_len_extend=9, k_scale=1.0, v_scale=1.0, sm_scale=sgl["sm_scale"])
    extend_attention_fwd(**args, backend="cuda-emu")    # warm
    verify_attn.set_validation("shapes")
    try:
        with CountOps() as c:
            extend_attention_fwd(**args, backend="cuda-emu")
    finally:
        verify_attn.set_validation("full")
    assert len(c.kernels()) > 20


# --- CUDA-graph buffers ---------------------------------------------------------------------

def test_fixed_buffers_keep_their_addresses_and_results():
    """A plan into StepBuffers (allocated once for the largest batch) writes the same addresses
    for every batch of a size, as captured launches need; results stay exact."""
    bufs = StepBuffers.allocate(max_bs=4, max_tokens=40, max_kv_len=120, max_tree=10, page_size=16)
    ptrs = None
    for seed, lens in ((20, (50, 7)), (21, (3, 99))):
        spec = CaseSpec(prefix_lens=lens, tree_sizes=(9, 10), seed=seed, **GQA)
        sgl, case = serving_inputs(spec, 16)
        step = plan(sgl, max_kv_len=120, buffers=bufs)
        now = tuple(getattr(step, n).data_ptr() for n in ("kv_indices", "kv_indptr", "kv_lens", "tree_mask"))
        assert ptrs is None or now == ptrs
        ptrs = now
        out, lse = layer(sgl, step, backend="reference")
        check_against_reference(out, lse, case)
    with pytest.raises(ValueError, match="buffers hold"):
        plan(serving_inputs(CaseSpec(prefix_lens=(200,), tree_sizes=(4,), seed=22, **GQA), 16)[0],
             max_kv_len=200, buffers=bufs)


# --- bad input --------------------------------------------------------------------------------

def test_draft_rows_off_their_pages_raise():
    spec = CaseSpec(prefix_lens=(20,), tree_sizes=(5,), seed=23, **GQA)
    sgl, _ = serving_inputs(spec, 16)
    sgl["out_cache_loc"] = sgl["out_cache_loc"].flip(0)        # draft rows out of page order
    with pytest.raises(ValueError, match="out_cache_loc entry"):
        plan(sgl)


@pytest.mark.parametrize("what,value,err,match", [
    ("out_cache_loc", torch.zeros(3), TypeError, "out_cache_loc must be a 1-d int32 or int64"),
    ("max_tree", 0, ValueError, "max_tree must be an int >= 1"),
    ("custom_mask", torch.zeros(3, dtype=torch.float32), TypeError, "custom_mask must be uint8"),
    ("seq_lens", torch.zeros(5, dtype=torch.int64), ValueError, "prefix_lens must have B=1"),
])
def test_bad_plan_inputs_name_the_argument(what, value, err, match):
    sgl, _ = serving_inputs(CaseSpec(prefix_lens=(20,), tree_sizes=(5,), seed=24, **GQA), 1)
    sgl[what] = value
    with pytest.raises(err, match=match):
        plan(sgl)


def test_scaled_16bit_pool_is_refused():
    sgl, _ = serving_inputs(CaseSpec(prefix_lens=(20,), tree_sizes=(5,), seed=25, **GQA), 1)
    sgl["k_scale"] = 0.5
    with pytest.raises(NotImplementedError, match="k_scale=0.5"):
        layer(sgl, plan(sgl), backend="reference")


# --- against SGLang's own kernel --------------------------------------------------------------

@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("spec", [
    CaseSpec(prefix_lens=(70, 5), tree_sizes=(7, 9), tree_kind="bushy", seed=26, **GQA),
    CaseSpec(prefix_lens=(40,), tree_sizes=(8,), tree_kind="star", seed=27, **MLA),
], ids=["gqa", "mla-576"])
def test_matches_sglang_kernel(spec, page_size):
    """SGLang's extend_attention_fwd (Triton interpreter) on the same pool: the prefix by its token
    slots, the draft rows as k_extend / v_extend read from where they were written."""
    from test_sglang_compat import _load_sglang_kernel, _need_interpreter
    _need_interpreter()
    kernel = _load_sglang_kernel()
    sgl, _ = serving_inputs(spec, page_size)
    out, _ = layer(sgl, plan(sgl), backend="reference")
    prefix = torch.cat([sgl["req_to_token"][int(r), :int(n)].long()
                        for r, n in zip(sgl["req_pool_indices"], sgl["seq_lens"])])
    kv_indptr = torch.tensor([0] + torch.tensor(spec.prefix_lens).cumsum(0).tolist(), dtype=torch.int32)
    ext = sgl["out_cache_loc"]
    theirs = torch.zeros_like(out)
    kernel.extend_attention_fwd(sgl["q"], sgl["k_buffer"][ext].contiguous(), sgl["v_buffer"][ext].contiguous(),
                                theirs, sgl["k_buffer"], sgl["v_buffer"], sgl["qo_indptr"], kv_indptr, prefix,
                                sgl["custom_mask"], True, sgl["mask_indptr"], sgl["max_tree"], 1.0, 1.0,
                                sm_scale=sgl["sm_scale"])
    err = (out.double() - theirs.double()).abs().max()
    assert err < 1e-4, f"one-launch vs SGLang's kernel: max abs err {float(err):.3e}"


# --- on a GPU: captured and replayed ------------------------------------------------------------

@pytest.mark.gpu
def test_graph_capture_and_replay_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine")
    dev = torch.device("cuda")
    spec = CaseSpec(prefix_lens=(300, 41), tree_sizes=(16, 9), seed=28, dtype=torch.bfloat16, **MLA)
    sgl, case = serving_inputs(spec, 1)
    sgl = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in sgl.items()}
    if spec.mla:
        sgl["v_buffer"] = sgl["k_buffer"][..., : spec.dv]
    bufs = StepBuffers.allocate(max_bs=2, max_tokens=25, max_kv_len=400, max_tree=16, device=dev)
    out = torch.full((25, spec.hq, spec.dv), float("nan"), dtype=torch.bfloat16, device=dev)
    verify_attn.set_validation("shapes")
    try:
        def step_and_layers():
            st = plan(sgl, max_kv_len=400, buffers=bufs)
            for _ in range(3):
                verify_layer(sgl["q"], sgl["k_buffer"], sgl["v_buffer"], st, sm_scale=sgl["sm_scale"], out=out,
                             backend="cuda")
        step_and_layers()                      # warm: build, workspace
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step_and_layers()
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
    finally:
        verify_attn.set_validation("full")
    check_against_reference(out.cpu(), None, case)


# --- the glue, as an estimate ---------------------------------------------------------------------

def test_glue_estimate_at_185k_is_within_five_percent_of_the_kernel():
    """The issue's goal, estimated without a GPU: the step plan's ops (counted here) and bytes (their
    per-entry element count, measured at two row capacities, scaled to a 185k row) over a 61-layer
    model (Kimi K2), at the model's slowest launch gap and the H200's DRAM bandwidth, against the fast
    end of the model's band for the kernel (the conservative side). An estimate, labelled so."""
    from bench.model import predict
    from bench.model.devices import get_device
    verify_attn.set_validation("shapes")
    try:
        spec = CaseSpec(prefix_lens=(30,), tree_sizes=(16,), seed=29, dtype=torch.bfloat16, **GQA)
        sgl, _ = serving_inputs(spec, 1, table_width=2100)
        runs = []
        for cap in (1000, 2000):
            with CountOps() as c:
                plan(sgl, max_kv_len=cap)
            runs.append((len(c.kernels()), sum(n for _, n in c.ops)))
    finally:
        verify_attn.set_validation("full")
    assert runs[0][0] == runs[1][0]
    per_entry = (runs[1][1] - runs[0][1]) / 1000                 # elements touched per row entry
    ctx = 185_000
    step_bytes = per_entry * 8 * (ctx + 16)                      # int64 elements, one request
    dev = get_device("h200")
    kernel = predict("h200", ctx=ctx, tree_nodes=16)
    if kernel is None:
        pytest.skip("the model cannot read the kernels here (no CUDA toolkit / SASS tools)")
    from integration.serving.verify_step import glue_estimate
    est = glue_estimate(step_ops=runs[0][0], step_bytes=step_bytes, layers=61, launch_us=dev.launch_us.hi,
                        dram_gbps=dev.dram_gbs.value, kernel_us=kernel["low_us"])
    print(f"glue per layer at 185k: {est['glue_us_per_layer']:.2f} us = {100 * est['share']:.2f}% of the kernel's "
          f"{kernel['low_us']:.1f} us (model band fast end); step: {est['step_ops']} ops, "
          f"{est['step_bytes'] / 1e6:.1f} MB, {est['step_us']:.1f} us; {est['label']}")
    assert est["share"] <= 0.05, est


def test_serving_glue_command_runs_on_a_cpu(tmp_path, capsys):
    """python -m integration.measure.serving_glue, the GPU measurement of the glue, as a CPU smoke run:
    all three paths run and agree (one launch: the kernel path's exact launches), labelled not a GPU figure."""
    import json
    from integration.measure import serving_glue
    out = tmp_path / "glue.json"
    assert serving_glue.main(["--device", "cpu", "--ctx", "300", "--tree", "5", "--layers", "2", "--reps", "1",
                              "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert set(res["us_per_layer"]) == {"kernel", "one", "compat"}
    assert res["max_abs_diff_vs_kernel"]["one"] == 0.0 and res["max_abs_diff_vs_kernel"]["compat"] < 1e-4
    assert "not a GPU figure" in res["timing"] and "not a GPU figure" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        serving_glue.main(["--device", "cpu", "--paths", "kernel,fast"])
    assert e.value.code == 2


def test_prefix_longer_than_the_capacity_is_refused_or_cut():
    """Full validation refuses a prefix beyond max_kv_len before any gather; in shapes mode (serving) the row
    is cut at its capacity: kv_lens never points past the request's own row."""
    sgl, _ = serving_inputs(CaseSpec(prefix_lens=(60, 10), tree_sizes=(4, 4), seed=30, **GQA), 1)
    with pytest.raises(ValueError, match="outside \\[0, max_kv_len=40\\]"):
        plan(sgl, max_kv_len=40)
    verify_attn.set_validation("shapes")
    try:
        step = plan(sgl, max_kv_len=40)
    finally:
        verify_attn.set_validation("full")
    assert step.kv_lens.tolist() == [44, 14]                   # 60 + 4 cut at the row of 40 + 4
