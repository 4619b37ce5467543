"""The CUDA build path on a machine without a GPU: the ptxas report (one
instantiation file, both archs), the ptxas parser and budget rule, the JIT
binding build + import, the ops' schemas and fake (meta) implementations, and
the backend's config hooks.

Cost here (2 cores): the report of one file ~30 s and the JIT binding build
~2-3 min on the first run; both are cached (report by source hash, binding by
torch's extension cache), so reruns take seconds.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest
import torch

from verify_attn import build as vb
from verify_attn.config import KernelConfig

CUDA_HOME = vb.find_cuda_home()
needs_nvcc = pytest.mark.skipif(CUDA_HOME is None, reason="no CUDA toolkit (nvcc) here")


# ------------------------------------------------------------- discovery ----

@needs_nvcc
def test_find_cuda_home_sees_through_wrappers():
    from pathlib import Path

    root = Path(CUDA_HOME)
    assert (root / "bin" / "nvcc").exists() and (root / "include" / "cuda_runtime.h").exists()
    # the root holds the real nvcc, not a wrapper script in a generic bin folder
    assert (root / "bin" / "ptxas").exists()


@needs_nvcc
def test_find_cuda_home_ignores_a_wrong_env_root(monkeypatch, tmp_path):
    fake = tmp_path / "prefix"
    (fake / "bin").mkdir(parents=True)
    (fake / "bin" / "nvcc").write_text("#!/bin/sh\n")  # a wrapper-like nvcc without a toolkit around it
    monkeypatch.setenv("CUDA_HOME", str(fake))
    assert vb.find_cuda_home() == CUDA_HOME


# ----------------------------------------------------------- ptxas parser ----

_PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_ZN2va2tv24tree_verify_split_kernelINS0_12KernelTraitsI13__nv_bfloat16NS0_10HeadConfigILi576ELi512ELb1EEENS_4host11Page1LayoutENS0_10TileConfigILi32ELi16ELi2ELi2ELi3EEEEEEEvNS0_6ParamsEi' for 'sm_120a'
ptxas info    : Function properties for _ZN2va2tv24tree_verify_split_kernel...
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers
ptxas info    : Compiling entry function '_ZN2va2tv26tree_verify_combine_kernelI6__halfLi128EEEvNS0_6ParamsEii' for 'sm_90a'
ptxas info    : Function properties for _ZN2va2tv26tree_verify_combine_kernelI6__halfLi128EEEvNS0_6ParamsEii
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, 1024 bytes smem, 400 bytes cmem[0]
"""


def test_parse_ptxas_and_budget_rule():
    reps = vb.parse_ptxas(_PTXAS, "x.cu")
    assert len(reps) == 2
    split, comb = reps
    assert split.name == "split bf16 576x512 page1 m32 n16 w4 s3" and split.arch == "sm_120a"
    assert (split.registers, split.spill_stores, split.spill_loads, split.local_bytes) == (255, 4, 4, 8)
    assert split.dynamic_smem == vb.smem_bytes(vb.Tile(32, 16, 2, 2, 3), 576, 512, True)
    assert any("spills" in p for p in split.problems())
    assert comb.name == "combine fp16 dv128" and comb.smem_bytes == 1024 and comb.problems() == []
    # a spilling kernel's report names the command that places its register peak, whose --function matches it alone
    hint = shlex.split(vb.spill_hint(split))
    assert hint[:5] == ["python", "-m", "bench.model.regs", "x", "--arch"] and hint[5] == "sm_120a"
    pattern = re.compile(hint[hint.index("--function") + 1])
    assert pattern.search(split.mangled) and not pattern.search(comb.mangled)
    # the per-arch shared memory limit: 100 KB fails on sm_120a, passes on sm_90a
    big = vb.KernelReport("k", "sm_120a", 100, 100 * 1024, 0, 100 * 1024, 0, 0, 0, "x.cu", "k")
    assert big.problems() and not vb.KernelReport(**{**big.__dict__, "arch": "sm_90a"}).problems()


_V3_MANGLED = ("_ZN2va2tv27tree_verify_split_kernel_v3INS0_14KernelTraitsV3I13__nv_bfloat16NS0_10HeadConfigILi576ELi512"
               "ELb1EEENS_4host11Page1LayoutENS0_12TileConfigV3ILi64ELi64ELi2EEELb0EEEEEvNS0_6ParamsEi")


@pytest.mark.parametrize("regs,ok", [(168, True), (160, False)])
def test_a_setmaxnreg_tile_must_be_launched_with_the_registers_its_budget_moves(regs, ok):
    """Hopper's v3 (384 threads: 168 registers a thread, moved to 64 for the producer and 216 for the consumers): a
    ptxas report of fewer fails the build report (on a GPU the consumers' setmaxnreg.inc would wait forever)."""
    text = (f"ptxas info    : Compiling entry function '{_V3_MANGLED}' for 'sm_90a'\n"
            "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
            f"ptxas info    : Used {regs} registers, used 6 barriers\n")
    (rep,) = vb.parse_ptxas(text, "x.cu")
    assert rep.expect_regs == 168 and (rep.problems() == []) == ok, rep.problems()
    # every setmaxnreg tile's expectation, against the budgets the kernels' static_asserts hold (traits.h, traits_v3.h)
    for tiles in vb.TILES.values():
        for t in tiles:
            want = {12: 168, 20: 96}.get(t.num_warps) if (t.version == 3 or t.loader >= 3) else 0
            assert vb.setmaxnreg_launch_regs(t) == want, t


def test_every_tile_config_fits_the_archs_it_targets():
    for head, tiles in vb.TILES.items():
        dqk, dv, shared = vb.HEADS[head]
        assert any(t.targets("sm_120a") for t in tiles) and any(t.targets("sm_90a") for t in tiles), head
        for t in tiles:
            assert t.archs, (head, t)
            for arch in t.archs:
                smem = vb.tile_smem(head, t)
                assert smem <= vb.SMEM_LIMIT[arch], (head, t, arch)
        for arch in ("sm_90a", "sm_120a"):  # the default of every arch runs on it
            d = vb.default_tile(head, arch)
            assert d in tiles and d.targets(arch), (head, arch, d)


def test_sm90_only_tile_is_not_checked_against_sm120_smem():
    t = vb.TILES["mla576"][2]
    assert t.archs == ("sm_90a",) and vb.smem_bytes(t, 576, 512, True) > vb.SMEM_LIMIT["sm_120a"]
    rep = vb.KernelReport("k", "sm_120a", 100, 180 * 1024, 0, 180 * 1024, 0, 0, 0, "x.cu", "k", targets_arch=False)
    assert rep.problems() == []
    assert vb.KernelReport(**{**rep.__dict__, "targets_arch": True}).problems()


def test_instantiation_files_exist():
    files = vb.instantiation_files()
    assert len(files) == len(vb.DTYPES) * len(vb.HEADS) * len(vb.LAYOUTS)
    assert all(f.exists() for f in files)
    assert sorted(files) == sorted(vb.INST_DIR.glob("*.cu")), "every instantiation file is in the family table"
    for f in files:  # kernel translation units see no torch
        assert "torch" not in f.read_text()
    for f in (vb.TV).glob("*.*"):
        assert "#include <torch" not in f.read_text(), f


# ----------------------------------------------------------- ptxas report ----

@needs_nvcc
def test_build_report_one_file_both_archs(tmp_path):
    out = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "verify_attn.build", "--arch", "sm_90a,sm_120a", "--report",
                        "--only", "gqa64_fp16_page1", "--json", str(out)], capture_output=True, text=True,
                       cwd=vb.REPO, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    reps = json.loads(out.read_text())
    for field in ("name", "arch", "registers", "smem_bytes", "spill_stores", "spill_loads"):
        assert all(field in x for x in reps)
    assert {x["arch"] for x in reps} == {"sm_90a", "sm_120a"}
    split = [x for x in reps if x["name"].startswith("split fp16 64x64 page1")]
    assert len(split) == 2 * len(vb.TILES["gqa64"])
    for x in split:
        assert x["spill_stores"] == 0 and x["spill_loads"] == 0 and 0 < x["registers"] <= 255
        assert x["smem_bytes"] >= vb.smem_bytes(vb.TILES["gqa64"][0], 64, 64, False)
    assert any(x["name"] == "combine fp16 dv64" for x in reps)


# ------------------------------------------------- JIT binding + fake ops ----

@pytest.fixture(scope="module")
def ops():
    if CUDA_HOME is None:
        pytest.skip("no CUDA toolkit (nvcc) here")
    from verify_attn.backends import cuda

    return cuda.load_ops("fp16", "gqa64", "page1", archs=["sm_90a", "sm_120a"])


def test_jit_binding_builds_and_imports(ops):
    kernels = list(ops.built_kernels())
    assert kernels == ["fp16-64x64-page1 [64x64 w4 s2]"]
    schema = ops.tree_verify.default._schema
    writes = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert writes == {"out", "lse", "workspace", "errors"}  # errors: the kernel's error-flag word
    assert len(schema.returns) == 0


def _meta_problem(total_q=7, hq=4, hkv=2, d=64, slots=50, batch=2, words=1):
    m = "meta"
    return dict(
        q=torch.empty(total_q, hq, d, dtype=torch.float16, device=m),
        k_cache=torch.empty(slots, hkv, d, dtype=torch.float16, device=m),
        v_cache=torch.empty(slots, hkv, d, dtype=torch.float16, device=m),
        qo_indptr=torch.empty(batch + 1, dtype=torch.int32, device=m),
        kv_indptr=torch.empty(batch + 1, dtype=torch.int32, device=m),
        kv_indices=torch.empty(40, dtype=torch.int32, device=m),
        kv_lens=torch.empty(batch, dtype=torch.int32, device=m),
        tree_mask=torch.empty(total_q, words, dtype=torch.int32, device=m),
    )


def test_fake_op_on_meta_tensors(ops):
    t = _meta_problem()
    out = torch.empty(7, 4, 64, dtype=torch.float16, device="meta")
    lse = torch.empty(7, 4, dtype=torch.float32, device="meta")
    ws = torch.empty(4 * 7 * 4 * 65 * 4, dtype=torch.uint8, device="meta")
    err = torch.zeros(1, dtype=torch.int32, device="meta")
    res = ops.tree_verify(*t.values(), out, lse, ws, err, 0.125, 1, 7, 4, 64, 64, 4, 2)
    assert res is None and out.shape == (7, 4, 64) and lse.shape == (7, 4)
    assert ops.workspace_bytes(t["q"], t["v_cache"], 4) == 4 * 7 * 4 * 65 * 4
    assert ops.workspace_bytes(t["q"], t["v_cache"], 1) == 0


def test_fake_op_traces_with_output_shapes(ops):
    """make_fx in fake mode (what torch.compile does first): the op appears in
    the graph, functionalized, with the caller's out/lse shapes."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(q, k, v, qo, kvp, kvi, kvl, mask):
        out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype, device=q.device)
        lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
        ops.tree_verify(q, k, v, qo, kvp, kvi, kvl, mask, out, lse, None, None, 0.125, 1, 7, 1, 64, 64, 4, 2)
        return out, lse

    t = _meta_problem()
    gm = make_fx(f, tracing_mode="fake")(*t.values())
    assert "tree_verify" in gm.code
    o, l = gm(*t.values())
    assert o.shape == (7, 4, 64) and o.dtype == torch.float16 and l.shape == (7, 4) and l.dtype == torch.float32


# ---------------------------------------------------------- config hooks ----

def _cpu_problem(**kw):
    from cases import CaseSpec, make_case

    return make_case(CaseSpec(**kw)).problem()


def test_backend_config_hooks():
    from verify_attn.backends import cuda
    from verify_attn.shapes import get_shape

    p = _cpu_problem(prefix_lens=(300, 40), tree_sizes=(9, 4), hq=8, hkv=1, dqk=576, dv=512, mla=True,
                     dtype=torch.bfloat16)
    cfg = cuda.default_config(p)
    from verify_attn import device as vdevice
    t = vb.default_tile("mla576", vdevice.props_for(p.device).arch)  # CPU tensors: the planning arch
    assert (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages) == (t.block_m, t.block_n, t.num_warps,
                                                                          t.num_stages)
    assert cfg.num_splits >= 1
    assert cuda.m_tiles(p, t.block_m) == -(-(p.max_tree_nodes * 8) // t.block_m)
    assert cuda.resolve_config(p, cfg.replace(num_splits=0)).num_splits == cfg.num_splits
    with pytest.raises(ValueError, match="not compiled"):
        cuda.resolve_config(p, KernelConfig(num_splits=2, block_m=64, block_n=64, num_warps=4, num_stages=2))
    # a tile built for other archs only: refused for the device's arch, run by the emulator (no arch)
    sm90_only = KernelConfig(num_splits=2, block_m=32, block_n=32, num_warps=8, num_stages=4)
    assert cuda.resolve_config(p, sm90_only, arch="sm_90a") == sm90_only
    assert cuda.resolve_config(p, sm90_only) == sm90_only
    with pytest.raises(ValueError, match="built for sm_90a, not for this device's sm_120a"):
        cuda.resolve_config(p, sm90_only, arch="sm_120a")
    space = cuda.config_space(get_shape("kimi-k2-tp8"), "sm_120a", splits=(0, 8))
    assert len(space) == 2 * sum(1 for x in vb.TILES["mla576"] if x.targets("sm_120a"))
    assert len(cuda.config_space(get_shape("kimi-k2-tp8"), "sm_90a", splits=(0,))) == len(vb.TILES["mla576"])
    for c in space:
        r = cuda.resources(c, get_shape("kimi-k2-tp8"), "sm_120a")
        assert r["fits"] and r["compiled"] and r["smem_bytes"] <= 99 * 1024
    assert cuda.config_space(get_shape("gqa-d256"), "sm_90a")
    assert "CUDA device" in cuda.supports(p)  # CPU tensors
    assert cuda.workspace_bytes(p, 1) == 0 and cuda.workspace_bytes(p, 3) == 3 * p.total_q * 8 * 513 * 4


def test_backend_unavailable_without_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    from verify_attn.backends import get_backend

    ok, why = get_backend("cuda").available()
    assert not ok and "CUDA device" in why


@pytest.mark.parametrize("argv,msg", [
    (["--arch", "sm_99", "--report"], "no shared-memory limit known for \\['sm_99'\\]"),
    ([], "nothing to do: pass --report"),
])
def test_build_cli_rejects_bad_arguments(argv, msg, capsys):
    from verify_attn import build
    with pytest.raises(SystemExit):
        build.main(argv)
    import re
    assert re.search(msg, capsys.readouterr().err)


def test_mma_peak_probe_compiles_without_spills(tmp_path):
    """The ceiling probes (bench.ceilings) build for both arches, register-resident; the sm_90a wgmma ones
    keep their wgmmas asynchronous (ptxas says when it serializes them: C7510-C7520 'Potential Performance
    Loss: wgmma.mma_async instructions are serialized ...')."""
    if CUDA_HOME is None:
        pytest.skip("no CUDA toolkit (nvcc) here")
    from verify_attn import build as vb
    r = subprocess.run([vb.nvcc_path(), "-std=c++17", "-O3", "-Xptxas=-v", *vb.gencode_flags(["sm_90a", "sm_120a"]),
                        "-I", str(vb.CSRC), "-c", str(vb.CSRC / "ceilings" / "mma_peak.cu"),
                        "-o", str(tmp_path / "mma_peak.o")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    spills = [ln for ln in r.stderr.splitlines() if "spill" in ln]
    # 2 archs x (the bf16 and fp16 peak kernels, the MMA latency chain, the read-bandwidth sweep, the wgmma peak,
    # the wgmma latency rounds at N = 64 and 256, the wgmma operand kernels: RS and SS at N = 16, 32, 64, 256)
    assert len(spills) == 30 and all("0 bytes spill stores, 0 bytes spill loads" in ln for ln in spills), r.stderr
    assert "serialized" not in r.stderr, r.stderr
    # the cluster residency probe (cudaOccupancyMaxActiveClusters) builds for both too
    r = subprocess.run([vb.nvcc_path(), "-std=c++17", "-O3", *vb.gencode_flags(["sm_90a", "sm_120a"]),
                        "-I", str(vb.CSRC), "-c", str(vb.CSRC / "ceilings" / "clusters.cu"),
                        "-o", str(tmp_path / "clusters.o")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.gpu
def test_model_calibration_probes_are_measured():
    from bench.core.ceilings import measure_l2_gbs, measure_mma_latency_cycles, measure_read_gbs
    assert 8.0 < measure_mma_latency_cycles(iters=512) < 200.0
    l2, dram = measure_l2_gbs(), measure_read_gbs(1 << 30, repeats=1, reps=3)
    assert 100.0 < dram < l2 < 100_000.0


@pytest.mark.gpu
def test_mma_sync_ceiling_is_measured():
    from bench.core.ceilings import measure_mma_sync_tflops
    tflops = measure_mma_sync_tflops(reps=3, iters=64)
    assert 1.0 < tflops < 5000.0


@pytest.mark.gpu
def test_wgmma_ceiling_is_measured_on_sm90_only():
    """On a compute capability 9.0 GPU the wgmma probes measure a rate and a (wgmma + wait) round that
    grows with N; elsewhere they refuse with a clear error instead of launching sm_90a code."""
    import torch

    from bench.core.ceilings import measure_wgmma_latency_cycles, measure_wgmma_tflops
    if tuple(torch.cuda.get_device_capability()) != (9, 0):
        with pytest.raises(RuntimeError, match="compute capability 9.0"):
            measure_wgmma_tflops(reps=1, iters=4)
        return
    assert 100.0 < measure_wgmma_tflops(reps=3, iters=256) < 5000.0
    c64, c256 = measure_wgmma_latency_cycles(iters=256)
    assert 32.0 <= c64 < c256 < 1000.0


@pytest.mark.gpu
def test_the_wgmma_operand_rates_are_measured_on_sm90_only():
    """The operand probe: eight finite rates (A from registers and from shared memory at N = 16, 32, 64, 256) and the
    copies-beside-operands timings (wgmmas, copies, both: both no faster than either alone) on a compute capability 9.0
    GPU; an N it was not built for, or a source too small for the copier, is refused by name; elsewhere a clear
    error."""
    import torch

    from bench.core.ceilings import (WGMMA_OPERAND_NS, _probe_module, measure_smem_share,
                                     measure_wgmma_operand_tflops)
    if tuple(torch.cuda.get_device_capability()) != (9, 0):
        with pytest.raises(RuntimeError, match="compute capability 9.0"):
            measure_wgmma_operand_tflops(reps=1, iters=4)
        with pytest.raises(RuntimeError, match="compute capability 9.0"):
            measure_smem_share(reps=1, iters=4)
        return
    rates = measure_wgmma_operand_tflops(reps=3, iters=256)
    assert sorted(rates) == sorted(f"{f} N={n}" for n in WGMMA_OPERAND_NS for f in ("RS", "SS"))
    assert all(10.0 < v < 5000.0 for v in rates.values()), rates
    share = measure_smem_share(reps=3, iters=256)
    assert sorted(share) == ["RS N=64", "SS N=64"]
    for v in share.values():   # (separate timed runs of a few reps each: 15% for their noise, not a physics bound)
        assert v["copy_bytes"] > 0 and 0 < v["copy_us"] and 0 < v["wgmma_us"] <= v["both_us"] * 1.15, v
    mod = _probe_module()
    out = torch.empty(256, dtype=torch.float32, device="cuda")
    src = torch.zeros(mod.wgmma_operand_src_bytes(), dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="N must be 16, 32, 64 or 256"):
        mod.wgmma_operands(src, out, 1, 1, 0, 128, True)
    with pytest.raises(RuntimeError, match="src: a contiguous CUDA tensor of at least"):
        mod.wgmma_operands(src[:16], out, 1, 1, 1, 64, True)


@pytest.mark.gpu
def test_the_v3_cluster_residency_is_measured():
    """How many of Hopper v3's 2-CTA clusters (224 KB a CTA: one CTA an SM) the GPU holds at once: at least one, and
    no more than one a pair of SMs (cudaOccupancyMaxActiveClusters; bench.ceilings prints it beside what bench.model
    assumes)."""
    from bench.core.ceilings import measure_v3_cluster_residency
    r = measure_v3_cluster_residency()
    assert 1 <= r["max_active_clusters"] <= r["clusters_one_wave"], r


def test_any_tile_arch_runs_a_tile_off_its_archs_only_where_its_shared_memory_fits(monkeypatch):
    """VERIFY_ATTN_ANY_TILE_ARCH=1 (validation only): sm_120's e4m3-MMA tiles on an sm_90 device (227 KB), not the
    sm_90-only 199 KB tile on sm_120 (99 KB), and nothing without it."""
    from verify_attn.backends import cuda
    from verify_attn.shapes import get_shape

    mla656 = _cpu_problem(prefix_lens=(300,), tree_sizes=(9,), hq=8, hkv=1, dqk=576, dv=512, mla=True,
                          dtype=torch.bfloat16, kv_dtype="fp8_mla656")
    bf16 = _cpu_problem(prefix_lens=(300,), tree_sizes=(9,), hq=8, hkv=1, dqk=576, dv=512, mla=True,
                        dtype=torch.bfloat16)
    e4m3_tile = KernelConfig(num_splits=2, block_m=32, block_n=32, num_warps=8, num_stages=4)  # sm_120a only
    monkeypatch.delenv(cuda.ANY_TILE_ARCH_ENV, raising=False)
    with pytest.raises(ValueError, match=f"not for this device's sm_90a; {cuda.ANY_TILE_ARCH_ENV}=1 runs it"):
        cuda.resolve_config(mla656, e4m3_tile, arch="sm_90a")
    monkeypatch.setenv(cuda.ANY_TILE_ARCH_ENV, "1")
    assert cuda.resolve_config(mla656, e4m3_tile, arch="sm_90a") == e4m3_tile
    with pytest.raises(ValueError, match=r"not for this device's sm_120a \(\d+ B of shared memory, over its 101376\)"):
        cuda.resolve_config(bf16, e4m3_tile, arch="sm_120a")   # the same key is the 199 KB sm_90-only bf16 tile
    space = cuda.config_space(get_shape("kimi-k2-tp8"), "sm_90a", splits=(0,), kv_dtype="fp8_mla656")
    assert all((c.num_warps, c.num_stages) != (8, 4) for c in space)  # tuning never picks it either
