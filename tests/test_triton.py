"""Both Triton backends against the float64 reference.

On the CPU the kernels run under TRITON_INTERPRET=1 (tests/conftest.py sets it)
with fp32 and fp16 inputs only (FACTS.md: the interpreter's bf16 tl.dot is
broken); on a GPU the same cases also run in bf16. Every case has shuffled
slots/pages with NaN in every slot the call must not read, and a NaN-poisoned
`out`, so an out-of-range read or an unwritten row fails.

Shapes are small (prefix < 100 tokens, trees < 40 nodes) and blocks are 16
wide so the interpreter still walks several KV tiles, M tiles and splits.
"""
from __future__ import annotations

import pytest
import torch

from cases import CaseSpec, check_against_reference, make_case, poisoned_out
import verify_attn
from verify_attn import KernelConfig, tree_verify
from verify_attn.backends import get_backend
from verify_attn.shapes import get_shape

BACKENDS = ("triton-serial", "triton")
HAS_GPU = torch.cuda.is_available()
DEVICE = "cuda" if HAS_GPU else "cpu"
GPU = pytest.mark.gpu
DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=GPU, id="bfloat16")]

# (name, head fields of CaseSpec): MLA absorbed, GQA 64/128/256, odd dims, group 3,
# and the MLA head shape with a separate V (V not read from the K tile)
HEADS = {
    "mla": dict(hq=8, hkv=1, dqk=576, dv=512, mla=True),
    "gqa-d64": dict(hq=4, hkv=2, dqk=64, dv=64, mla=False),
    "gqa-d128": dict(hq=8, hkv=1, dqk=128, dv=128, mla=False),
    "gqa-d256": dict(hq=2, hkv=1, dqk=256, dv=256, mla=False),
    "odd-d80-48-g3": dict(hq=6, hkv=2, dqk=80, dv=48, mla=False),
    "mla-sep-v": dict(hq=2, hkv=1, dqk=576, dv=512, mla=False),
}

# (prefix lengths, tree sizes, tree kind, page size): odd lengths 0, 1, 54, 97, mixed
# batches, paged 16 and a non-default power of two (4); 12 nodes x 8 heads = 96 rows
# take 6 M tiles of 16 rows
LAYOUTS = [
    ((54,), (5,), "bushy", 1),
    ((0, 97), (1, 7), "deep", 1),
    ((1, 54), (3, 12), "chain", 16),
    ((20, 0, 33), (9, 4, 2), "star", 4),
]
# a tree spanning two mask words, paged 32
WIDE_TREE = ((97,), (37,), "bushy", 32)

SMALL = KernelConfig(num_splits=3, block_n=16, block_m=16, num_warps=4, num_stages=1)


def _run(case, backend, config, return_lse=True):
    out = poisoned_out(case)
    res = tree_verify(**case.kwargs, backend=backend, config=config, out=out, return_lse=return_lse)
    return res if return_lse else (res, None)


def _spec(head: str, layout, dtype, seed=0, **kw) -> CaseSpec:
    prefix, trees, kind, page = layout
    return CaseSpec(prefix_lens=prefix, tree_sizes=trees, tree_kind=kind, page_size=page, dtype=dtype,
                    seed=seed, **HEADS[head], **kw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"L{l[0]}-T{l[1]}-{l[2]}-p{l[3]}")
@pytest.mark.parametrize("backend", BACKENDS)
def test_matrix_mla(backend, layout, dtype):
    case = make_case(_spec("mla", layout, dtype, seed=len(layout[0])), device=DEVICE)
    out, lse = _run(case, backend, SMALL)
    check_against_reference(out, lse, case)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head", [h for h in HEADS if h != "mla"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_heads(backend, head, dtype):
    # one layout per dtype keeps the interpreted run short; the slow sweep crosses them all
    layout = LAYOUTS[2] if dtype == torch.float16 else LAYOUTS[1]
    case = make_case(_spec(head, layout, dtype, seed=7), device=DEVICE)
    out, lse = _run(case, backend, SMALL)
    check_against_reference(out, lse, case)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_wide_tree(backend, dtype):
    case = make_case(_spec("gqa-d64", WIDE_TREE, dtype, seed=9), device=DEVICE)
    out, lse = _run(case, backend, SMALL)
    check_against_reference(out, lse, case)


@pytest.mark.parametrize("page_size", [3, 5, 7])
@pytest.mark.parametrize("backend", BACKENDS)
def test_paged_page_sizes_not_powers_of_two(backend, page_size):
    """Row t of a paged request is in page kv_indices[t // P] at offset t % P: with P = 3, 5, 7
    a kernel that computes t & (P - 1) (right for powers of two only) reads the wrong rows.
    Prefixes and trees cross page boundaries; an empty prefix starts a request at a page start."""
    case = make_case(CaseSpec(prefix_lens=(23, 0, 8), tree_sizes=(5, 4, 9), tree_kind="bushy",
                              page_size=page_size, seed=60 + page_size, **HEADS["gqa-d64"]), device=DEVICE)
    out, lse = _run(case, backend, SMALL)
    check_against_reference(out, lse, case)


@pytest.mark.parametrize("splits", [1, 2, 5, 16])
def test_split_counts(splits):
    # n_kv = 59 and 1, block_n 16: at 16 splits only 4 (request 0) and 1 (request 1) hold tokens
    case = make_case(CaseSpec(prefix_lens=(54, 0), tree_sizes=(5, 1), seed=3, **HEADS["gqa-d64"]), device=DEVICE)
    out, lse = _run(case, "triton", KernelConfig(num_splits=splits, block_n=16, block_m=16))
    check_against_reference(out, lse, case)


def test_empty_splits_never_read(monkeypatch):
    """The combine must skip splits with no tokens: fill the workspace with NaN first."""
    from verify_attn.backends import triton_split

    def nan_workspace(splits, rows, dv, device):
        return (torch.full((splits, rows, dv), float("nan"), device=device),
                torch.full((splits, rows), float("nan"), device=device))

    monkeypatch.setattr(triton_split, "_workspace", nan_workspace)
    case = make_case(CaseSpec(prefix_lens=(40, 3), tree_sizes=(6, 2), seed=5, **HEADS["gqa-d64"]), device=DEVICE)
    out, lse = _run(case, "triton", KernelConfig(num_splits=8, block_n=16, block_m=16))
    check_against_reference(out, lse, case)


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_sizes_and_no_lse(backend):
    # larger blocks than the problem (one KV tile, one M tile), more mask words than needed, no lse
    case = make_case(CaseSpec(prefix_lens=(33,), tree_sizes=(6,), words=8, seed=11, **HEADS["gqa-d128"]),
                     device=DEVICE)
    out, lse = _run(case, backend, KernelConfig(num_splits=2, block_n=64, block_m=64), return_lse=False)
    assert lse is None
    check_against_reference(out, None, case)


@pytest.mark.parametrize("backend", BACKENDS)
def test_default_config(backend):
    # config=None: the backend's own defaults (the heuristic split count for "triton")
    case = make_case(_spec("mla", LAYOUTS[1], torch.float32, seed=2), device=DEVICE)
    out, lse = _run(case, backend, None)
    check_against_reference(out, lse, case)


def test_default_config_is_static():
    """default_config reads only static shapes: it must not change when the index tensors do."""
    b = get_backend("triton")
    case = make_case(CaseSpec(prefix_lens=(90, 10), tree_sizes=(5, 5), **HEADS["mla"]))
    p = case.problem()
    cfg = b.default_config(p)
    assert cfg.num_splits >= 1 and cfg.block_m >= 16 and cfg.block_n >= 16
    p.kv_lens.fill_(7)
    assert b.default_config(p) == cfg


@pytest.mark.skipif(HAS_GPU, reason="interpreter-only checks")
def test_bf16_rejected_under_interpreter():
    case = make_case(CaseSpec(dtype=torch.bfloat16))
    for name in BACKENDS:
        why = get_backend(name).supports(case.problem())
        assert why is not None and "bfloat16" in why
        with pytest.raises(ValueError, match="bfloat16"):
            tree_verify(**case.kwargs, backend=name)


@pytest.mark.skipif(HAS_GPU, reason="a GPU makes Triton available without the interpreter")
def test_available_needs_interpreter_on_cpu(monkeypatch):
    from verify_attn.backends import triton_common as tc

    assert tc.available() == (True, "")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    ok, why = tc.available()
    assert not ok and "TRITON_INTERPRET" in why


def test_resources_and_config_space():
    b = get_backend("triton")
    kimi = get_shape("kimi-k2-tp8")
    cfg = KernelConfig(num_splits=0, block_n=32, block_m=64, num_warps=8, num_stages=2)
    r90 = b.resources(cfg, kimi, "sm_90", dtype=torch.bfloat16)
    # sm_90 mainloop: Q 64x576 + 2 stages of K 32x576 (V is the K tile) + P 64x32, 2 bytes each
    assert r90["smem_bytes"] == 2 * (64 * 576 + 2 * 32 * 576 + 64 * 32)
    assert not r90["fits"]                           # a [64, 512] fp32 accumulator spills at 8 warps
    r120 = b.resources(cfg.replace(block_m=32), kimi, "sm_120", dtype=torch.bfloat16)
    # sm_120 (mma.sync, Q in registers): 2 stages of K + P; at 1 stage the epilogue (acc 32x512 fp32
    # + the one K buffer, 100 KB) is the larger phase and no longer fits 99 KB
    assert r120["smem_bytes"] == 2 * (2 * 32 * 576 + 32 * 32)
    assert r120["fits"]
    r120_1 = b.resources(cfg.replace(block_m=32, num_stages=1), kimi, "sm_120", dtype=torch.bfloat16)
    assert r120_1["smem_bytes"] == 32 * 512 * 4 + 2 * 32 * 576 and not r120_1["fits"]
    llama = get_shape("llama3-70b-tp8")
    r_gqa = b.resources(cfg.replace(num_warps=4), llama, "sm_120", dtype=torch.bfloat16)
    assert r_gqa["smem_bytes"] == 2 * (2 * (32 * 128 + 32 * 128) + 64 * 32)
    for arch in ("sm_90", "sm_120"):
        space = b.config_space(kimi, arch)
        assert space, arch
        assert all(b.resources(c, kimi, arch)["fits"] for c in space)
    assert len(b.config_space(kimi, "sm_120")) < len(b.config_space(kimi, "sm_90"))


# --------------------------------------------------------------------------------------
# GPU only
# --------------------------------------------------------------------------------------

@GPU
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_kimi_long_context_default(backend):
    # Kimi K2 per-rank head, 4k + odd tail of context, a 16-node tree, tuned/default config
    spec = CaseSpec(prefix_lens=(4097,), tree_sizes=(16,), dtype=torch.bfloat16, seed=21,
                    sm_scale=get_shape("kimi-k2-tp8").sm_scale, **HEADS["mla"])
    case = make_case(spec, device="cuda")
    out, lse = _run(case, backend, None)
    check_against_reference(out, lse, case)


@GPU
def test_gpu_cuda_graph_replay():
    """Capture once, then change the lengths and indices in place: the replay must follow."""
    spec_a = CaseSpec(prefix_lens=(300, 41), tree_sizes=(8, 8), dtype=torch.bfloat16, seed=31, **HEADS["mla"])
    spec_b = CaseSpec(prefix_lens=(41, 300), tree_sizes=(8, 8), dtype=torch.bfloat16, seed=32, **HEADS["mla"])
    a, bcase = make_case(spec_a, device="cuda"), make_case(spec_b, device="cuda")
    if any(a.kwargs[k].shape != bcase.kwargs[k].shape for k in a.kwargs if isinstance(a.kwargs[k], torch.Tensor)):
        pytest.skip("the two cases need equal tensor shapes to share a graph")
    static = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in a.kwargs.items()}
    static["v_cache"] = static["k_cache"][..., : spec_a.dv]
    cfg = KernelConfig(num_splits=4, block_n=32, block_m=64, num_warps=8, num_stages=2)
    verify_attn.set_validation("shapes")
    try:
        out = torch.empty_like(poisoned_out(a))
        tree_verify(**static, backend="triton", config=cfg, out=out)          # warm-up compiles
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            tree_verify(**static, backend="triton", config=cfg, out=out)
        for case in (a, bcase):
            for k, v in case.kwargs.items():
                if isinstance(v, torch.Tensor) and k != "v_cache":
                    static[k].copy_(v)
            out.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            check_against_reference(out, None, case)
    finally:
        verify_attn.set_validation("full")


# --------------------------------------------------------------------------------------
# slow sweep
# --------------------------------------------------------------------------------------

SWEEP_LAYOUTS = LAYOUTS + [
    WIDE_TREE,
    ((97, 54, 1, 0), (17, 3, 1, 25), "bushy", 8),
    ((64,), (64,), "deep", 64),
    ((5,), (256,), "bushy", 1),
]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_sweep(backend, head, dtype):
    for i, layout in enumerate(SWEEP_LAYOUTS):
        if head == "mla" and max(layout[1]) > 64 and not HAS_GPU:
            continue  # 256 nodes x 8 heads is minutes under the interpreter
        for cfg in (SMALL, KernelConfig(num_splits=7, block_n=32, block_m=32),
                    KernelConfig(num_splits=1, block_n=16, block_m=64)):
            case = make_case(_spec(head, layout, dtype, seed=100 + i), device=DEVICE)
            out, lse = _run(case, backend, cfg)
            check_against_reference(out, lse, case)


_COMPILE_SCRIPT = r"""
import json, sys, torch
from verify_attn.backends import triton_common as tc, triton_serial as tsr, triton_split as ts
from verify_attn.config import KernelConfig
from verify_attn.shapes import get_shape
rows = []
for arch in ("sm_90", "sm_120"):
    for name in ("kimi-k2-tp8", "llama3-70b-tp8", "gqa-d64"):
        sh = get_shape(name)
        bm, bn, w, s = ts.default_blocks(sh, arch, torch.bfloat16, 16 * sh.group)
        for page in (1, 16):
            r = ts.compile_report(sh, KernelConfig(0, bn, bm, w, s), arch, page_size=page)
            rows.append(dict(kernel="split", arch=arch, shape=name, page=page, limit=tc.smem_limit(arch), **r))
        r = tsr.compile_report(sh, tsr.default_blocks(sh.head_dim_qk, arch, 16), arch)
        rows.append(dict(kernel="serial", arch=arch, shape=name, page=1, limit=tc.smem_limit(arch), **r))
        hb = tc.head_blocks(sh.head_dim_qk, sh.head_dim_v, sh.mla)
        r = tc.ptxas_report(ts._combine, arch=arch, num_warps=4, constexprs=dict(
            HQ=sh.num_q_heads, DV=sh.head_dim_v, BLOCK_DV=hb.block_dv, BLOCK_N=bn,
            BLOCK_R=ts.combine_rows(hb.block_dv), HAS_LSE=True), pointers=dict(
            PART_O="*fp32", PART_LSE="*fp32", QO_INDPTR="*i32", KV_LENS="*i32", OUT="*bf16", LSE="*fp32"))
        rows.append(dict(kernel="combine", arch=arch, shape=name, page=1, limit=tc.smem_limit(arch), **r))
print(json.dumps(rows))
"""


@pytest.mark.slow
def test_default_configs_compile_for_sm90_and_sm120():
    """Compile both kernels' default configs for sm_90 and sm_120 here (no GPU needed): they must
    build, fit the arch's shared memory, and the split and combine kernels must not spill (ptxas -v).
    ~2 min cold, under a minute from Triton's cache."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, not interpret
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], capture_output=True, text=True, env=env,
                         cwd=root, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(rows) == 24
    for r in rows:
        what = f"{r['kernel']} {r['arch']} {r['shape']} page {r['page']}: {r['ptxas']}"
        assert r["regs"] > 0, what
        assert r["smem_bytes"] <= r["limit"], what
        if r["kernel"] != "serial":
            assert r["spill_stores"] == 0 and r["spill_loads"] == 0, what
