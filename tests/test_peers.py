"""bench/benchmark/peers.py on the CPU (issue 42): the fa3-mla and flashmla backends' plumbing through stand-ins that
compute what FA3's `flash_attn_with_kvcache` (with `qv`, a page table, varlen q) and FlashMLA's dense decode
document, checked against the float64 reference on NaN-poisoned pools; the LSE merge; the clean skip without
the kernels; the gpu_check stage. The real kernels only run on a GPU (a gpu-marked test at the end)."""
from __future__ import annotations

import os

import pytest
import torch

from bench.benchmark import peer_bundle as pb
from bench.benchmark import peers as bp
from bench.benchmark import verify as bv
from cases import CaseSpec, make_case
from verify_attn import tree_verify

KIMI_KW = dict(hq=8, hkv=1, dqk=576, dv=512, mla=True)


# ---------------------------------------------------------------- stand-ins with the kernels' documented semantics

def fake_fa3(q, k_cache, v_cache, qv=None, page_table=None, cache_seqlens=None, cu_seqlens_q=None,
             max_seqlen_q=None, softmax_scale=None, causal=False, return_softmax_lse=False, **unused):
    """FA3 flash_attn_with_kvcache, varlen q + page table: q [total_q, H, 64], qv [total_q, H, 512], k_cache
    [blocks, P, 1, 64], v_cache [blocks, P, 1, 512]; sequence b's keys are tokens 0..cache_seqlens[b]-1 of its
    page-table row. Returns (out [total_q, H, 512], lse [H, total_q] natural log); an empty sequence gives 0 and
    +inf (FA3's non-split epilogue)."""
    assert not causal and return_softmax_lse and not unused
    assert page_table.dtype == cache_seqlens.dtype == cu_seqlens_q.dtype == torch.int32
    assert k_cache.shape[-1] == 64 and v_cache.shape[-1] == 512 and qv.shape[-1] == 512 and q.shape[-1] == 64
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    page = k_cache.shape[1]
    cu = cu_seqlens_q.tolist()
    total_q, h = q.shape[:2]
    out = torch.zeros(total_q, h, 512, dtype=q.dtype)
    lse = torch.full((h, total_q), float("inf"))
    for b in range(len(cu) - 1):
        assert cu[b + 1] - cu[b] <= max_seqlen_q
        n = int(cache_seqlens[b])
        if n == 0:
            continue
        tok = torch.arange(n)
        blk = page_table[b, tok // page].long()
        k = k_cache[blk, tok % page, 0].double()                                    # [n, 64]
        v = v_cache[blk, tok % page, 0].double()                                    # [n, 512]
        s = (torch.einsum("thd,nd->thn", q[cu[b]:cu[b + 1]].double(), k)
             + torch.einsum("thd,nd->thn", qv[cu[b]:cu[b + 1]].double(), v)) * softmax_scale
        lse[:, cu[b]:cu[b + 1]] = torch.logsumexp(s, -1).t().float()
        out[cu[b]:cu[b + 1]] = torch.einsum("thn,nd->thd", s.softmax(-1), v).to(q.dtype)
    return out, lse


def fake_dense_decode(q, k_cache, block_table, seqlens, scale):
    """FlashMLA dense decode: q [B, S, H, 576], k_cache [blocks, 64, 1, 576] (V = the first 512 of K), no mask;
    returns (out [B, S, H, 512], lse [B, H, S] natural log), 0 and +inf for an empty sequence."""
    assert k_cache.shape[1] == 64 and k_cache.shape[2] == 1 and q.shape[-1] == 576
    assert block_table.dtype == seqlens.dtype == torch.int32
    b_n, s_n, h, _ = q.shape
    out = torch.zeros(b_n, s_n, h, 512, dtype=q.dtype)
    lse = torch.full((b_n, h, s_n), float("inf"))
    for b in range(b_n):
        n = int(seqlens[b])
        if n == 0:
            continue
        tok = torch.arange(n)
        k = k_cache[block_table[b, tok // 64].long(), tok % 64, 0].double()      # [n, 576]
        s = torch.einsum("shd,nd->shn", q[b].double(), k) * scale
        lse[b] = torch.logsumexp(s, -1).t().float()
        out[b] = torch.einsum("shn,nd->shd", s.softmax(-1), k[:, :512]).to(q.dtype)
    return out, lse


def _ref(kw: dict) -> torch.Tensor:
    return tree_verify(**kw, backend="reference")


def _close(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert torch.isfinite(out).all()
    err = (out.double() - ref.double()).abs().max().item()
    assert err < 1e-5, err


SPECS = [
    CaseSpec(prefix_lens=(70,), tree_sizes=(16,), **KIMI_KW),
    CaseSpec(prefix_lens=(0, 37, 129), tree_sizes=(5, 3, 9), tree_kind="bushy", seed=1, **KIMI_KW),  # L=0, mixed T
    CaseSpec(prefix_lens=(33, 5), tree_sizes=(4, 1), tree_kind="chain", seed=2, **KIMI_KW),           # T=1: decode
    CaseSpec(prefix_lens=(150, 64), tree_sizes=(7, 6), tree_kind="star", page_size=16, seed=3, **KIMI_KW),
    CaseSpec(prefix_lens=(130, 0), tree_sizes=(6, 2), page_size=64, seed=4, **KIMI_KW),
]


# ---------------------------------------------------------------- fa3-mla

@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.id)
def test_fa3_mla_matches_the_reference(spec):
    """The prefix pass + the tree pass as SGLang builds them + the merge, through the FA3 stand-in, on pools
    whose unused slots hold NaN."""
    case = make_case(spec)
    kw = case.kwargs
    out = torch.full((kw["q"].shape[0], 8, 512), float("nan"))
    bp.fa3_mla_prepare(fake_fa3, kw)(out)
    _close(out, _ref(kw))


def test_fa3_tree_pass_is_sglangs_page_table_by_hand():
    """Tree [-1, 0, 0, 1] after a 3-token prefix: each node's row lists the slots of the nodes its mask sets, in
    node order, then the rest (SGLang's sort keys); cache_seqlens = popcount; the prefix pass sees L_b."""
    from bench.core.inputs import make_inputs
    from verify_attn.shapes import get_shape
    kw = make_inputs(get_shape("kimi-k2-tp8"), 3, [[-1, 0, 0, 1]], 1, torch.float32, "cpu", seed=0)
    s = kw["kv_indices"].tolist()           # 3 prefix slots, then the 4 nodes' slots
    p = bp.fa3_plan(kw)
    n0, n1, n2, n3 = s[3:]
    assert p.tree_table.tolist() == [[n0, n1, n2, n3], [n0, n1, n2, n3], [n0, n2, n1, n3], [n0, n1, n3, n2]]
    assert p.tree_lens.tolist() == [1, 2, 2, 3] and p.cu_tree.tolist() == [0, 1, 2, 3, 4]
    assert p.prefix_table.tolist() == [s[:3]] and p.prefix_lens.tolist() == [3] and p.max_q == 4
    assert p.cu_q.tolist() == [0, 4]


def test_fa3_mla_parts_are_the_two_passes():
    kw = make_case(SPECS[1]).kwargs
    run = bp.fa3_mla_prepare(fake_fa3, kw)
    (oa, la), (ob, lb) = run.parts["prefix"](), run.parts["tree"]()
    assert la.shape == lb.shape == (8, kw["q"].shape[0])
    assert torch.isinf(la[:, :5]).all() and (la[:, :5] > 0).all()     # request 0 has no prefix: FA3's +inf
    assert torch.isfinite(lb).all()                                      # every node sees itself


def test_fa3_call_fits_the_real_interface():
    """Where the FA3 interface is importable (the staged bundle's, or sglang-kernel's): our two calls go through
    the real `flash_attn_with_kvcache` on meta tensors (its registered fake: argument names, shapes; num_splits=1
    because the fake refuses the heuristic's 0), and it returns the layouts the stand-in returns: out
    [total_q, H, 512], lse [H, total_q] float32."""
    fa3, info = pb.find_fa3()
    if fa3 is None:
        pytest.skip(info["why"])
    seen = []

    def through_real(*args, **kw):
        meta = lambda x: x.to("meta") if isinstance(x, torch.Tensor) else x
        o, lse = fa3(*map(meta, args), **{k: meta(v) for k, v in kw.items()}, num_splits=1)[:2]
        ours = fake_fa3(*args, **kw)
        assert (o.shape, o.dtype, lse.shape, lse.dtype) == (ours[0].shape, ours[0].dtype, ours[1].shape, torch.float32)
        seen.append(kw["max_seqlen_q"])
        return ours
    kw = make_case(SPECS[1]).kwargs
    out = torch.full((kw["q"].shape[0], 8, 512), float("nan"))
    bp.fa3_mla_prepare(through_real, kw)(out)
    assert seen == [9, 1]                     # the prefix pass (max T_b), then the tree pass (one row each)
    _close(out, _ref(kw))


# ---------------------------------------------------------------- flashmla

@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.id)
def test_flashmla_matches_the_reference(spec):
    """FlashMLA (page 64, no tree) over the prefix + the torch tree part + the merge: page 64 read in place,
    any other layout copied into NaN-filled page-64 pages."""
    kw = make_case(spec).kwargs
    out = torch.full((kw["q"].shape[0], 8, 512), float("nan"))
    run = bp.flashmla_prepare(fake_dense_decode, kw)
    run(out)
    _close(out, _ref(kw))
    assert run.copied == (spec.page_size != 64)


def test_flashmla_page64_block_table_in_place():
    spec = SPECS[4]
    kw = make_case(spec).kwargs
    p = bp.flashmla_plan(kw)
    assert p.k_cache.data_ptr() == kw["k_cache"].data_ptr()              # the caller's pool, no copy
    kvp = kw["kv_indptr"].tolist()
    assert p.block_table[0, :3].tolist() == kw["kv_indices"][kvp[0]: kvp[0] + 3].tolist()   # ceil(130 / 64) = 3
    assert p.seqlens.tolist() == [130, 0] and p.q.shape == (2, 6, 8, 576)


# ---------------------------------------------------------------- the merge

def _merge_ref(oa, la, ob, lb):
    la = torch.where(la == float("inf"), float("-inf"), la).double()
    lb = torch.where(lb == float("inf"), float("-inf"), lb).double()
    w = torch.stack([la, lb]).softmax(0)
    return oa.double() * w[0][..., None] + ob.double() * w[1][..., None]


def test_merge_states_torch_and_empty_passes():
    g = torch.Generator().manual_seed(0)
    oa, ob = torch.randn(6, 3, 40, generator=g), torch.randn(6, 3, 40, generator=g)
    la, lb = torch.randn(6, 3, generator=g) * 4, torch.randn(6, 3, generator=g) * 4
    la[0] = float("inf")                      # an empty prefix pass (FA3 / FlashMLA write +inf)
    oa[0] = 0
    out = torch.empty(6, 3, 40)
    bp.merge_states(oa, la, ob, lb, out)
    assert torch.allclose(out.double(), _merge_ref(oa, la, ob, lb), atol=1e-6)
    assert torch.allclose(out[0], ob[0], atol=1e-6)
    with pytest.raises(ValueError, match="lse_a"):
        bp.merge_states(oa, la[:, :2], ob, lb, out)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                    reason="needs Triton's interpreter or a GPU")
def test_merge_triton_kernel_with_strided_lse():
    """The Triton merge (what runs on a GPU) on FA3's [H, N] LSE read transposed, fp32 on the CPU interpreter."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(1)
    oa, ob = torch.randn(5, 4, 512, generator=g).to(dev), torch.randn(5, 4, 512, generator=g).to(dev)
    la, lb = (torch.randn(4, 5, generator=g) * 3).to(dev), (torch.randn(4, 5, generator=g) * 3).to(dev)
    la[:, 2] = float("inf")
    out = torch.full((5, 4, 512), float("nan"), device=dev)
    bp._merge_triton(oa, la.t(), ob, lb.t(), out)
    assert torch.allclose(out.double().cpu(), _merge_ref(oa, la.t(), ob, lb.t()).cpu(), atol=1e-5)


_COMPILE_MERGE = """
from bench.benchmark import peer_bundle as pb
from bench.benchmark import peers as bp
from verify_attn.backends.triton_common import ptxas_report
ptr = {n: "*fp32" for n in ("la", "lb")} | {n: "*bf16" for n in ("oa", "ob", "out")}
for arch in ("sm_90", "sm_120"):
    r = ptxas_report(bp._merge_kernel(), arch=arch, pointers=ptr, constexprs={"D": 512, "BD": 512}, num_warps=4,
                     num_stages=1)
    assert r["regs"] > 0 and r["spill_stores"] == 0, r
print("compiled")
"""


def test_merge_triton_kernel_compiles_for_sm90_and_sm120():
    """The merge kernel as the GPU gets it (compiled, bf16 out, not interpreted): builds for both archs, no
    spills (Triton's compiler and ptxas, no GPU needed)."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", _COMPILE_MERGE], capture_output=True, text=True, env=env, cwd=root,
                       timeout=600)
    assert r.returncode == 0 and "compiled" in r.stdout, r.stderr[-3000:]


# ---------------------------------------------------------------- bad input

def test_bad_input_names_the_argument():
    kw = dict(make_case(SPECS[0]).kwargs)
    with pytest.raises(ValueError, match="q must be"):
        bp.check_mla(dict(kw, q=kw["q"][0]), "fa3-mla")
    with pytest.raises(ValueError, match="kv_lens"):
        bp.rows_of(dict(kw, kv_lens=torch.tensor([3], dtype=kw["kv_lens"].dtype)))
    gqa = make_case(CaseSpec(prefix_lens=(20,), tree_sizes=(3,), hq=8, hkv=2, dqk=128, dv=128, mla=False)).kwargs
    with pytest.raises(NotImplementedError, match="MLA 576/512"):
        bp.fa3_mla_prepare(fake_fa3, gqa)
    with pytest.raises(NotImplementedError, match="MLA 576/512"):
        bp.flashmla_prepare(fake_dense_decode, gqa)


# ---------------------------------------------------------------- found, or skipped with a reason

@pytest.fixture
def no_peers(monkeypatch, tmp_path):
    """No peer package importable and no bundle: what this CPU machine is."""
    monkeypatch.setenv(pb.BUNDLE_ENV, str(tmp_path / "no-bundle"))
    import importlib
    real = importlib.import_module

    def imp(name, *a, **k):
        if name.split(".")[0] in ("sgl_kernel", "flash_mla", "flash_mla_dense", "flash_attn_interface"):
            raise ImportError(f"no {name} here")
        return real(name, *a, **k)
    monkeypatch.setattr(pb.importlib, "import_module", imp)


def test_peers_absent_skip_with_one_line_reasons(no_peers):
    """Without the kernels: the GPU path's rows are 'unsupported' with the reason; on this machine
    (no GPU) bench.verify notes why each peer is not in the table."""
    a = bv.build_parser().parse_args(["--ctx", "40", "--tree", "3", "--backend", "reference,fa3-mla,flashmla",
                                      "--dtype", "fp32", "--quiet", "--no-model", "--reps", "1"])
    from bench.core.timing import time_cpu
    d = bv.sweep(a, kernel_device="cpu", timer=lambda fns, cold: time_cpu(lambda: [f() for f in fns], reps=1,
                                                                           warmup=0), l2=1 << 12)
    rows = {r["backend"]: r for r in d["results"]}
    for n, what in (("fa3-mla", "FA3 not found"), ("flashmla", "FlashMLA not found")):
        assert rows[n]["status"] == "unsupported" and what in rows[n]["note"] and "\n" not in rows[n]["note"]
        assert what in d["peers"][n]["why"]
    assert rows["reference"]["status"] == "ok"
    if not torch.cuda.is_available():
        d = bv.sweep(bv.build_parser().parse_args(["--ctx", "300", "--tree", "4", "--backend", "fa3-mla,flashmla",
                                                   "--quiet", "--no-model"]))
        notes = "\n".join(d["notes"])
        assert "fa3-mla: unavailable here: needs a CUDA GPU; FA3 not found" in notes
        assert "flashmla: unavailable here: needs a CUDA GPU; FlashMLA not found" in notes


def test_only_the_asked_peers_are_looked_for(monkeypatch):
    """A benchmark that runs no peer imports none (FlashInfer's import alone takes seconds per gpu_check stage)."""
    from bench.benchmark import baselines
    looked = []
    monkeypatch.setattr(pb, "find_fa3", lambda: looked.append("fa3") or (None, {"why": "x"}))
    monkeypatch.setattr(pb, "find_flashmla", lambda: looked.append("flashmla") or (None, {"why": "y"}))
    real = baselines.importlib.import_module
    monkeypatch.setattr(baselines.importlib, "import_module", lambda n, *a: looked.append(n) or real(n, *a))
    found, _ = baselines.outside_baselines(["reference", "cuda"])
    assert found == {} and looked == []
    found, _ = baselines.outside_baselines(["flashmla"])
    assert set(found) == {"flashmla"} and looked == ["flashmla"] and found["flashmla"].unavailable == "y"


def test_found_peers_run_checked_timed_with_passes_and_ratio(no_peers, monkeypatch):
    """The whole bench.verify path with the stand-ins found as peers: checked against the reference, timed,
    each pass timed apart, provenance and the ratio to our best kernel in the JSON and the table."""
    monkeypatch.setattr(pb, "find_fa3", lambda: (fake_fa3, {"source": "test", "version": "v", "commit": "c0ffee"}))
    monkeypatch.setattr(pb, "find_flashmla", lambda: (lambda: fake_dense_decode,
                                                      {"source": "test", "version": "w", "commit": "beef"}))
    monkeypatch.setattr(bv, "OURS", ("reference",))   # "our best" here: the only one of ours on the CPU
    a = bv.build_parser().parse_args(["--ctx", "40", "--tree", "5", "--backend", "reference,fa3-mla,flashmla",
                                      "--dtype", "fp32", "--quiet", "--no-model"])
    from bench.core.timing import time_cpu
    d = bv.sweep(a, kernel_device="cpu", timer=lambda fns, cold: time_cpu(lambda: [f() for f in fns], reps=2,
                                                                           warmup=0), l2=1 << 12)
    rows = {r["backend"]: r for r in d["results"]}
    for n in ("fa3-mla", "flashmla"):
        r = rows[n]
        assert r["status"] == "ok" and r["max_rel_err"] < 1e-6, r["note"]
        assert set(r["parts_us"]) == {"prefix", "tree"} and all(v > 0 for v in r["parts_us"].values())
        assert r["best_ours"] == "reference"
        assert r["x_best_ours"] == pytest.approx(r["median_us"] / rows["reference"]["median_us"])
    assert rows["fa3-mla"]["peer"]["commit"] == "c0ffee" and d["peers"]["flashmla"]["commit"] == "beef"
    assert "departure" not in rows["fa3-mla"] and "copied from page-1" in rows["flashmla"]["departure"]
    from bench.benchmark.report import print_report
    import io
    import contextlib
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_report(d)
    assert "peers (serving engines' kernels)" in buf.getvalue()
    assert "flashmla departs from the contract: FlashMLA has no tree mask" in buf.getvalue()


def test_bundle_manifest_names_the_pins(tmp_path):
    script = ("FLASHMLA_REV=" + "a" * 40 + "\nFA_REV=" + "b" * 40 + "\nCUTLASS_MLA=" + "c" * 40 +
              "   # pin\n$PD -d x torch==2.11.0 flashinfer-python==0.7.2.post1\n")
    (tmp_path / "x.so").write_bytes(b"\0" * 1000)
    m = pb.manifest_of(script, tmp_path)
    assert m["flashmla_commit"] == "a" * 40 and m["flash_attention_commit"] == "b" * 40
    assert m["cutlass_flashmla_commit"] == "c" * 40 and m["flashinfer"] == "0.7.2.post1"
    assert m["torch"] == "2.11.0+cu130" and m["bytes"] == 1000
    with pytest.raises(ValueError, match="--stage"):
        pb.stage(tmp_path, tmp_path / "dest")


# ---------------------------------------------------------------- gpu_check

def test_gpu_check_peers_stage_runs_every_peer_on_the_issue_grid():
    from pathlib import Path
    from bench.gpu_run import gpu_check
    a = gpu_check._parser().parse_args([])
    stages = {s.name: s for s in gpu_check.plan(Path("/tmp/o"), a)}
    names = list(stages)
    assert names.index("peers") + 1 == names.index("peers_sweep")    # the headline point first, then the grid
    for st, ctx, tree in (("peers", {"185k"}, ["16"]), ("peers_sweep", {"185k", "64k", "16k", "4k"}, ["16", "64"])):
        argv = stages[st].argv
        arg = lambda f: argv[argv.index(f) + 1]
        assert set(arg("--ctx").split(",")) == ctx and arg("--tree").split(",") == tree and arg("--layout") == "page1"
        assert set(arg("--backend").split(",")) == {"cuda", "fa3-mla", "flashmla", "flashinfer-mla", "sglang-extend"}
        assert "--no-model" in argv and "--json" in argv
    assert "--longest-first" in stages["peers_sweep"].argv   # a budget spent late drops 4k rows, not 185k ones
    assert sum(s.cap_s for s in stages.values()) <= gpu_check.PLAN_CAP_S
    assert gpu_check.verify_stems(stages["peers_sweep"].argv) == ("mla576_bf16_page1",)


def test_longest_first_orders_the_rows():
    a = bv.build_parser().parse_args(["--ctx", "40,300,100", "--tree", "3", "--quiet", "--no-model",
                                      "--longest-first", "--cpu-ctx-cap", "50", "--reps", "1"])
    assert [r["ctx"] for r in bv.sweep(a)["results"]] == [300, 100, 40]


def test_peer_ratios_against_our_best_kernel(tmp_path):
    import json
    from bench.gpu_run import gpu_results
    row = lambda b, us: {"backend": b, "ctx": 185_000, "tree_nodes": 16, "layout": "page1", "median_us": us}
    (tmp_path / "peers_sweep.json").write_text(json.dumps({"results": [
        row("cuda", 300.0), row("cuda@m32n32w8s5", 200.0), row("fa3-mla", 500.0), row("flashmla", 100.0)]}))
    text = "\n".join(gpu_results.peer_ratios(tmp_path))
    assert "cuda@m32n32w8s5 200.0 us" in text and "fa3-mla 2.5x slower" in text and "flashmla 2.0x faster" in text


# ---------------------------------------------------------------- on a GPU with the kernels (never run yet)

@pytest.mark.gpu
@pytest.mark.parametrize("name", ["fa3-mla", "flashmla"])
def test_peer_on_gpu_matches_the_reference(name):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine")
    found, info = pb.hopper_peers()
    if name not in found:
        pytest.skip(info[name]["why"])
    from bench.core.inputs import make_inputs, make_trees
    from verify_attn.shapes import get_shape
    kw = make_inputs(get_shape("kimi-k2-tp8"), 3000, make_trees(16, "ddtree", 2), 1, torch.bfloat16, "cuda", seed=7)
    out = torch.full((32, 8, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    found[name](kw)(out)
    ref = _ref(kw)
    assert torch.allclose(out.float(), ref.float(), atol=2e-2, rtol=5e-2)


def test_gpu_session_sets_up_a_carried_bundle(tmp_path):
    """bench/gpu_run/gpu_session.sh with .carry/peers present: FlashInfer unzipped (not importable from the zip), the
    bundle and its fa3 folder on PYTHONPATH, VERIFY_ATTN_PEERS set (run from a folder without the project, so
    the gpu_check it starts fails fast: only the set-up is checked)."""
    import shutil
    import subprocess
    import zipfile
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    from pathlib import Path
    repo = Path(__file__).resolve().parent.parent
    b = tmp_path / ".carry" / "peers"
    (b / "fa3").mkdir(parents=True)
    with zipfile.ZipFile(b / "flashinfer_trim.zip", "w") as z:
        z.writestr("flashinfer/__init__.py", "__version__ = 'x'\n")
    env = {**os.environ, "PEERS_FI_DIR": str(tmp_path / "fi")}
    env.pop("OUT", None)
    r = subprocess.run(["bash", str(repo / "bench" / "gpu_run" / "gpu_session.sh"), "5"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("peers: bundle"))
    assert f"PYTHONPATH={b}:{b}/fa3:{tmp_path / 'fi'}" in line
    assert (tmp_path / "fi" / "flashinfer" / "__init__.py").is_file()
