"""Autotuner and run-time config lookup: everything that runs without a GPU.

Pruning per arch, the split grid, bucket lookup edge cases, the cache (merge,
atomic write, concurrent writers), export/import, bad files falling back with a
warning, the tuning loop with an injected timer and a deliberately wrong config,
and the dry-run command.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import time
import warnings
from types import SimpleNamespace

import pytest
import torch

from autotune import space, splits
from autotune.__main__ import main as autotune_main
from autotune.cache import TuneCache, entry_key
from autotune.export import export_table
from autotune.plan import make_plan
from autotune.search import BucketResult, estimate_trials, tune_bucket
from verify_attn import tuned
from verify_attn.backends import Backend, _REGISTRY, register
from verify_attn.config import KernelConfig
from verify_attn.shapes import get_shape

KIMI = get_shape("kimi-k2-tp8")
LLAMA = get_shape("llama3-70b-tp8")
SM120, SM90 = space.get_arch("sm_120a"), space.get_arch("sm_90a")
H200 = "NVIDIA H200"
REAL_USABLE = tuned._usable


@pytest.fixture(autouse=True)
def _clean_tuned(monkeypatch):
    """Every test starts with no memory tables, no user file and a fake GPU name for device 0; tables
    with made-up tiles are not checked against a real backend's tiles (only where a test asks for it)."""
    monkeypatch.delenv(tuned.ENV_FILE, raising=False)
    tuned.clear()
    monkeypatch.setitem(tuned._device_names, 0, H200)
    monkeypatch.setattr(tuned, "_usable", lambda table, backend, p: table)
    monkeypatch.setattr(tuned, "BUNDLED_DIR", tuned.Path("/nonexistent-bundled-dir"))
    yield
    tuned.clear()


# --- pruning --------------------------------------------------------------------

def _kept(arch, shape=KIMI, backend="cuda", **kw):
    pruned, origin = space.tile_candidates(backend, shape, arch, use_hooks=False, **kw)
    return pruned, origin


def test_sm120_prunes_by_shared_memory_and_sm90_keeps_more():
    p120, origin = _kept(SM120)
    p90, _ = _kept(SM90)
    assert "default space" in origin
    assert p120.kept and all(c.resources["smem_bytes"] <= 101376 for c in p120.kept)
    assert any("smem" in why and "101376" in why for _, why in p120.rejected)
    # a 64-row x 576 bf16 Q tile (72 KB) plus two 32-token KV stages (72 KB) cannot fit 99 KB, fits 227 KB
    big = KernelConfig(0, 32, 64, 8, 2)
    assert big not in {c.config for c in p120.kept}
    assert big in {c.config for c in p90.kept}
    assert {c.config for c in p120.kept} < {c.config for c in p90.kept}
    assert all(c.resources["smem_bytes"] <= 232448 for c in p90.kept)


def test_register_and_divisibility_rules():
    cfg = KernelConfig(0, 32, 64, 4, 2)
    # 64 rows x 512 fp32 accumulators over 128 threads = 256 registers before anything else
    assert "registers/thread" in space.resource_issue(space.model_resources("cuda", cfg, KIMI), cfg, SM90)
    wide = KernelConfig(0, 16, 16, 16, 2)
    assert "per SM" in space.resource_issue({"smem_bytes": 1000, "registers": 200}, wide, SM90)
    assert space.resource_issue({"smem_bytes": 1000, "registers": 128}, wide, SM90) is None
    assert "multiples of 16" in space.divisibility_issue(KernelConfig(0, 32, 8, 4, 2), KIMI)
    assert "multiples of 16" in space.divisibility_issue(KernelConfig(0, 8, 32, 4, 2), KIMI)
    odd = get_shape("gqa-d64").__class__("odd", 8, 1, 72, 72, 0.1, False)
    assert "head dims" in space.divisibility_issue(KernelConfig(0, 16, 16, 4, 2), odd)
    # the static_asserts of csrc/tree_verify/config.h + traits.h: 16 rows -> one row slice, so 2 warps
    # share it (WN=2): they split a 16-token tile into n8 tiles and Dv=64 into 16-column pairs
    d64 = odd.__class__("d64", 8, 1, 64, 64, 0.1, False)
    assert space.divisibility_issue(KernelConfig(0, 16, 16, 2, 2), d64) is None
    assert "n8 tiles" in space.divisibility_issue(KernelConfig(0, 16, 16, 4, 2), d64)
    d48 = odd.__class__("d48", 8, 1, 64, 48, 0.1, False)
    assert "16-column pairs" in space.divisibility_issue(KernelConfig(0, 16, 16, 2, 2), d48)
    assert "row slices" in space.divisibility_issue(KernelConfig(0, 16, 64, 2, 2), d64)
    assert "accumulator registers" in space.divisibility_issue(KernelConfig(0, 16, 32, 2, 2), KIMI)
    assert "stages" in space.divisibility_issue(KernelConfig(0, 32, 16, 4, 1), KIMI)
    # the two MLA tiles the kernel compiles (config.h TilesFor<HeadMLA>) pass
    assert space.divisibility_issue(KernelConfig(0, 16, 32, 4, 3), KIMI) is None
    assert space.divisibility_issue(KernelConfig(0, 32, 16, 4, 2), KIMI) is None
    assert space.divisibility_issue(KernelConfig(0, 16, 16, 4, 1), KIMI, backend="triton") is None


def test_build_report_overrides_model_and_rejects_spills():
    good = KernelConfig(0, 32, 16, 4, 2)
    spilled = KernelConfig(0, 16, 32, 4, 3)
    report = [
        # named the way verify_attn.build names split kernels
        {"name": "split bf16 576x512 page1 m16 n32 w4 s2", "arch": "sm_120a", "registers": 168,
         "smem_bytes": 60000, "spill_stores": 0, "spill_loads": 0},
        {"name": "split bf16 576x512 paged m16 n32 w4 s2", "arch": "sm_120a", "registers": 1,
         "smem_bytes": 1, "spill_stores": 0, "spill_loads": 0},                 # other layout: not ours
        {"name": "split fp16 576x512 page1 m16 n32 w4 s2", "arch": "sm_120a", "registers": 2,
         "smem_bytes": 2, "spill_stores": 0, "spill_loads": 0},                 # other dtype
        {"name": "x", "arch": "sm_120a", "config": {"block_n": 16, "block_m": 32, "num_warps": 4,
         "num_stages": 3}, "registers": 255, "smem_bytes": 60000, "spill_stores": 24, "spill_loads": 24},
        {"name": "combine bf16 dv512", "arch": "sm_120a", "registers": 40, "smem_bytes": 0,
         "spill_stores": 0, "spill_loads": 0},
        {"name": "split bf16 576x512 page1 m16 n32 w4 s2", "arch": "sm_90a", "registers": 3, "smem_bytes": 3,
         "spill_stores": 0, "spill_loads": 0},                                  # other arch
    ]
    pruned, _ = _kept(SM120, report=report)
    byc = {c.config: c for c in pruned.kept}
    assert byc[good].resources["registers"] == 168 and byc[good].resources["smem_bytes"] == 60000
    assert "build report" in byc[good].resources["source"]
    assert spilled not in byc
    assert any(c == spilled and "spills" in why for c, why in pruned.rejected)


def test_prune_for_rows_keeps_narrowest_when_none_fit():
    cands = [space.Candidate(KernelConfig(0, 16, bm, 4, 2), {}) for bm in (16, 32, 64)]
    fits, rej = space.prune_for_rows(cands, rows=8)          # 8 rows -> 16 needed
    assert [c.config.block_m for c in fits] == [16] and len(rej) == 2
    fits, _ = space.prune_for_rows(cands, rows=128)
    assert [c.config.block_m for c in fits] == [16, 32, 64]
    fits, _ = space.prune_for_rows(cands[1:], rows=8)        # no 16-row tile: keep the narrowest there is
    assert [c.config.block_m for c in fits] == [32]


def test_prune_for_rows_keeps_each_kernel_familys_own_narrowest_tile():
    """A wide tile is dropped only for a narrower tile of the same kernel: v0's 16-row tile does not push out v1's or
    v2's wider ones (it did: the model-sourced tables' one-node buckets all ran v0)."""
    def cand(bm, fam):
        return space.Candidate(KernelConfig(0, 16, bm, 4, 2), {"family": fam})
    cands = [cand(16, "v0"), cand(32, "v0"), cand(32, "v1"), cand(64, "v1"), cand(64, "v2"), cand(32, "v3-sm120")]
    fits, rej = space.prune_for_rows(cands, rows=8)
    assert [(c.config.block_m, c.resources["family"]) for c in fits] == \
        [(16, "v0"), (32, "v1"), (64, "v2"), (32, "v3-sm120")]
    assert sorted((c.block_m, why.split(" of ")[-1]) for c, why in rej) == [(32, "v0 is kept"), (64, "v1 is kept")]
    fits, rej = space.prune_for_rows(cands, rows=128)
    assert len(fits) == len(cands) and not rej


def test_filter_versions_keeps_the_versions_asked_for():
    cands = [space.Candidate(KernelConfig(0, 16, 32, 8, 4), {"version": v, "family": f})
             for v, f in ((0, "v0"), (1, "v1"), (3, "v3-sm120"), (3, "v3"))] + [space.Candidate(
                 KernelConfig(0, 16, 16, 4, 2), {})]
    assert space.filter_versions(cands, None) == (cands, [])
    keep, off = space.filter_versions(cands, frozenset({0, 1}))
    assert [c.resources.get("family") for c in keep] == ["v0", "v1"]
    assert [why for _, why in off] == ["kernel v3-sm120 not in --versions (v0, v1)", "kernel v3 not in --versions "
                                       "(v0, v1)", "kernel of unknown version not in --versions (v0, v1)"]


def test_cuda_tiles_name_their_kernel_version_and_family():
    from verify_attn import build as vb
    from verify_attn.backends import cuda
    by = {(t.block_m, t.block_n, t.num_warps, t.num_stages, t.loader): t for t in vb.TILES["mla576"]}
    for key, ver, fam in (((16, 32, 4, 2, 0), 0, "v0"), ((32, 16, 8, 4, 0), 1, "v1"), ((64, 32, 8, 3, 0), 2, "v2"),
                          ((32, 16, 20, 4, 4), 3, "v3-sm120"), ((64, 64, 12, 2, 0), 3, "v3")):
        t = by[key]
        assert (t.kernel_version, t.family) == (ver, fam)
        assert t.label().startswith(f"v{ver} ") if ver else t.label()[0] == "m"   # the model's names say the same
        res = cuda.resources(KernelConfig(0, t.block_n, t.block_m, t.num_warps, t.num_stages), KIMI, "sm_90a")
        assert (res["version"], res["family"]) == (ver, fam)


@pytest.mark.parametrize("arch", ["sm_120a", "sm_90a"])
def test_one_node_plans_offer_every_kernels_tiles(arch):
    """8 rows (one node of Kimi K2 TP8): v1's 32-row tiles (the arch's default kernel) are candidates beside v0's
    16-row tile; --versions leaves v3's out and the plan says so."""
    from verify_attn import build as vb
    plan = make_plan("cuda", KIMI, arch_name=arch, ctxs=[185_000], trees=[1])
    fams = {t.candidate.resources["family"] for t in plan.buckets[0].tiles}
    assert {"v0", "v1", "v3-sm120"} <= fams
    d = vb.default_tile("mla576", arch)
    assert (d.block_m, d.block_n, d.num_warps, d.num_stages) in {
        (c.config.block_m, c.config.block_n, c.config.num_warps, c.config.num_stages)
        for c in (t.candidate for t in plan.buckets[0].tiles)}
    plan = make_plan("cuda", KIMI, arch_name=arch, ctxs=[185_000], trees=[1], versions=frozenset({0, 1, 2}))
    assert all(t.candidate.resources["version"] in (0, 1, 2) for t in plan.buckets[0].tiles)
    assert any("not in --versions" in why for _, why in plan.rejected)
    assert plan.to_json()["kernel_versions"] == [0, 1, 2]


def test_versions_flag_refuses_what_it_cannot_read(capsys):
    assert autotune_main(["--dry-run", "--arch", "sm_120a", "--ctx", "4k", "--versions", "v1,x"]) == 2
    assert "--versions: 'x' is not a kernel version" in capsys.readouterr().err
    assert autotune_main(["--dry-run", "--arch", "sm_120a", "--ctx", "4k", "--versions", "v1,v9"]) == 2
    assert "--versions: no CUDA kernel v9 is built; the kernels are v0, v1, v2, v3" in capsys.readouterr().err
    assert autotune_main(["--dry-run", "--backend", "triton", "--arch", "sm_120a", "--ctx", "4k",
                          "--versions", "v1"]) == 2
    assert "not backend 'triton'" in capsys.readouterr().err
    assert autotune_main(["--dry-run", "--arch", "sm_120a", "--ctx", "4k", "--tree", "16", "--versions",
                          "v0,v1,v2"]) == 0
    assert "not in --versions (v0, v1, v2)" in capsys.readouterr().out


@pytest.mark.parametrize("ctx", [1, 54, 1000, 185_000, 256_000])
def test_split_grid_bounds(ctx):
    tile = KernelConfig(0, 32, 16, 4, 2)
    grid = splits.split_grid(tile, rows=128, kv_len=ctx + 16, shape=KIMI, arch=SM120, max_splits=512)
    assert grid == sorted(set(grid)) and grid[0] >= 1 and grid[-1] <= 512
    assert all(s * 2 * tile.block_n <= max(ctx + 16, 2 * tile.block_n) or s == 1 for s in grid)
    h = splits.heuristic_splits(tile, rows=128, kv_len=ctx + 16, shape=KIMI, arch=SM120)
    if h <= grid[-1]:
        assert h in grid
    if ctx >= 100_000:
        assert len(grid) >= 6   # several split counts worth timing at long context


def test_backend_hooks_are_used_when_present():
    calls = []

    def config_space(shape, arch, **kw):
        calls.append((shape.name, arch, kw.get("dtype")))
        return [KernelConfig(7, 32, 16, 4, 2), KernelConfig(0, 32, 16, 4, 2), KernelConfig(0, 64, 64, 8, 3)]

    def resources(cfg, shape, arch, **kw):
        return {"smem_bytes": 200_000 if cfg.block_n == 64 else 50_000, "registers": 100}

    register(Backend("fake-tunable", run=lambda *a: None, config_space=config_space, resources=resources,
                     tunable=True, meta={"max_splits": 64}))
    try:
        plan = make_plan("fake-tunable", KIMI, arch_name="sm_120a", ctxs=[185_000], trees=[16])
        assert calls == [("kimi-k2-tp8", "sm_120a", torch.bfloat16)]
        assert "fake-tunable backend config_space" in plan.origin
        [b] = plan.buckets
        assert [t.candidate.config for t in b.tiles] == [KernelConfig(0, 32, 16, 4, 2)]   # deduplicated
        assert plan.max_splits == 64 and max(b.tiles[0].splits) <= 64
        assert any("smem 200000" in why for _, why in plan.rejected)
    finally:
        _REGISTRY.pop("fake-tunable", None)


# --- bucket lookup --------------------------------------------------------------

def test_pick_bucket_rule():
    b = [1000, 4000, 185_000]
    assert tuned.pick_bucket(b, 1) == 1000            # below every bucket: the smallest
    assert tuned.pick_bucket(b, 1000) == 1000         # exact
    assert tuned.pick_bucket(b, 3999) == 1000         # largest not above
    assert tuned.pick_bucket(b, 4000) == 4000
    assert tuned.pick_bucket(b, 10**9) == 185_000     # above every bucket: the largest
    assert tuned.pick_bucket([5], 1) == 5


def _key(**kw):
    d = dict(device_name=H200, backend="cuda", hq=8, hkv=1, dqk=576, dv=512, dtype="bf16", page_size=1, mla=True)
    d.update(kw)
    return tuned.TableKey(**d)


def _table(batch=1, **kw):
    entries = {(1000, 1): KernelConfig(4, 32, 16, 4, 2), (1000, 16): KernelConfig(8, 32, 16, 4, 2),
               (185_000, 16): KernelConfig(96, 16, 16, 4, 2), (185_000, 64): KernelConfig(48, 16, 32, 8, 2)}
    return tuned.ConfigTable(_key(**kw), entries, batch)


def test_table_pick_edges_and_batch_scaling():
    t = _table()
    assert t.pick(185_016, 16) == KernelConfig(96, 16, 16, 4, 2)
    assert t.pick(185_016, 8) == KernelConfig(96, 16, 16, 4, 2)     # below the 185k tree buckets -> smallest
    assert t.pick(300_000, 1000) == KernelConfig(48, 16, 32, 8, 2)
    assert t.pick(5, 1) == KernelConfig(4, 32, 16, 4, 2)            # below every ctx bucket
    assert t.pick(184_999, 64) == KernelConfig(8, 32, 16, 4, 2)     # tree buckets of the 1k context apply
    # batch 4 at a table tuned with batch 1: a quarter of the splits keeps the CTA count
    assert t.pick(185_016, 16, batch=4).num_splits == 24
    assert t.pick(1000, 1, batch=64).num_splits == 1


def _problem(device="cuda", dtype=torch.bfloat16, ctx=185_016, total_q=16, batch=1, page_size=1, mla=True, dqk=576):
    q = SimpleNamespace(device=torch.device(device, 0) if device == "cuda" else torch.device("cpu"), dtype=dtype)
    p = SimpleNamespace(q=q, device=q.device, dtype=dtype, num_q_heads=8, num_kv_heads=1, head_dim_qk=dqk,
                        head_dim_v=512, page_size=page_size, mla_shared_kv=mla, avg_kv_len=ctx,
                        total_q=total_q, batch=batch, max_tree_nodes=min(32, total_q))
    p.head_shape = lambda: KIMI
    return p


def test_lookup_memory_then_none_on_cpu_and_other_shapes():
    tuned.register(_table())
    assert tuned.lookup(_problem(), "cuda") == KernelConfig(96, 16, 16, 4, 2)
    assert tuned.lookup(_problem(total_q=64, batch=4), "cuda") == KernelConfig(24, 16, 16, 4, 2)
    assert tuned.lookup(_problem(device="cpu"), "cuda") is None          # CPU: no lookup at all
    assert tuned.lookup(_problem(), "triton") is None                     # other backend
    assert tuned.lookup(_problem(dtype=torch.float16), "cuda") is None    # other dtype
    assert tuned.lookup(_problem(page_size=64), "cuda") is None           # other layout
    assert tuned.lookup(_problem(mla=False), "cuda") is None              # separate V: another kernel
    tuned._device_names[0] = "NVIDIA RTX PRO 6000 Blackwell"
    tuned.clear()
    tuned._device_names[0] = "NVIDIA RTX PRO 6000 Blackwell"
    tuned.register(_table())
    assert tuned.lookup(_problem(), "cuda") is None                       # tuned on another GPU


def test_lookup_skips_buckets_whose_tile_the_backend_lacks(monkeypatch):
    """A stale file (tiles no longer compiled) warns once and falls back; it never reaches the kernel."""
    have = KernelConfig(0, 16, 16, 4, 2)
    seen = []

    def config_space(shape, arch, **kw):
        seen.append(arch)
        return [have]

    register(Backend("fake-tunable2", run=lambda *a: None, config_space=config_space, tunable=True))
    monkeypatch.setattr(tuned, "_usable", REAL_USABLE)
    monkeypatch.setitem(tuned._arch_names, 0, "sm_90a")
    try:
        tuned.register(_table(backend="fake-tunable2"))   # only the 185k/16 bucket uses the tile it has
        with pytest.warns(RuntimeWarning, match="does not have"):
            assert tuned.lookup(_problem(), "fake-tunable2") == KernelConfig(96, 16, 16, 4, 2)
        assert seen == ["sm_90a"]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert tuned.lookup(_problem(ctx=1000, total_q=1), "fake-tunable2") == KernelConfig(96, 16, 16, 4, 2)
        assert seen == ["sm_90a"]                             # checked once per shape key
    finally:
        _REGISTRY.pop("fake-tunable2", None)


def test_lookup_on_a_real_cpu_problem_is_none():
    from tests.cases import CaseSpec, make_case
    case = make_case(CaseSpec(prefix_lens=(20,), tree_sizes=(3,)))
    tuned.register(_table(dtype="fp32"))
    assert tuned.lookup(case.problem(), "cuda") is None


def test_lookup_is_cheap_per_call():
    tuned.register(_table())
    p = _problem()
    tuned.lookup(p, "cuda")
    n = 20_000
    t0 = time.perf_counter()
    for _ in range(n):
        tuned.lookup(p, "cuda")
    per_call_us = (time.perf_counter() - t0) / n * 1e6
    assert per_call_us < 50, per_call_us   # a dict hit and two bisections (~2 us here)


# --- cache ----------------------------------------------------------------------

def _writer(path: str, who: int, n: int) -> None:
    c = TuneCache(path)
    for i in range(n):
        c.merge({f"w{who}-e{i}": {"who": who, "i": i, "pad": "x" * 2000}})


def test_cache_concurrent_writers_do_not_corrupt(tmp_path):
    path = tmp_path / "cache.json"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(path), w, 15)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    entries = TuneCache(path).load()
    assert len(entries) == 60
    assert all(entries[f"w{w}-e{i}"] == {"who": w, "i": i, "pad": "x" * 2000} for w in range(4) for i in range(15))
    assert not list(tmp_path.glob(".cache.json.*.tmp"))   # no temp file left behind


def test_cache_merge_keeps_old_entries_and_replaces_same_key(tmp_path):
    c = TuneCache(tmp_path / "c.json")
    c.merge({"a": {"v": 1}, "b": {"v": 1}})
    c.merge({"b": {"v": 2}, "c": {"v": 3}})
    assert c.load() == {"a": {"v": 1}, "b": {"v": 2}, "c": {"v": 3}}
    k1 = entry_key(device_name=H200, backend="cuda", shape_key=KIMI.key(), mla=True, dtype="bf16", page_size=1,
                   batch=1, tree_kind="ddtree", ctx=185_000, tree_nodes=16)
    assert k1 != entry_key(device_name=H200, backend="cuda", shape_key=KIMI.key(), mla=True, dtype="bf16",
                           page_size=1, batch=1, tree_kind="ddtree", ctx=185_000, tree_nodes=32)


def test_corrupt_cache_is_moved_aside_with_a_warning(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"format": "verify_attn.autotune_cache", "entries": {"a": ')   # torn write
    c = TuneCache(path)
    with pytest.warns(RuntimeWarning, match="unreadable"):
        assert c.load() == {}
    with pytest.warns(RuntimeWarning, match="moved to"):
        c.merge({"x": {"v": 1}})
    assert c.load() == {"x": {"v": 1}}
    assert (tmp_path / "c.json.corrupt").exists()


# --- export / import --------------------------------------------------------------

def _result(ctx, tree, cfg, us=100.0, default_us=150.0):
    r = BucketResult(ctx, tree, cfg, us, KernelConfig(), default_us, floor_us=50.0)
    return r


def test_export_import_round_trip_and_merge(tmp_path):
    key = _key()
    results = [_result(1000, 16, KernelConfig(8, 32, 16, 4, 2), 10.0, 12.0),
               _result(185_000, 16, KernelConfig(96, 16, 16, 4, 2), 300.0, 600.0),
               BucketResult(4000, 16)]          # nothing correct there: not exported
    path = export_table(tmp_path, key, results, meta={"date": "2026-12-02", "versions": {"torch": "x"}})
    assert path.name == ("device_name=NVIDIA_H200,backend=cuda,dqk=576,dv=512,hq=8,hkv=1,dtype=bf16,"
                         "layout=page1.json")
    doc = json.loads(path.read_text())
    b185 = next(b for b in doc["buckets"] if b["ctx"] == 185_000)
    assert b185["gain_over_default"] == pytest.approx(2.0) and b185["floor_us"] == 50.0
    assert doc["versions"] == {"torch": "x"} and doc["date"] == "2026-12-02"
    t = tuned.load_table(path)
    assert t.key == key and set(t.entries) == {(1000, 16), (185_000, 16)}
    # a second export merges bucket by bucket
    export_table(tmp_path, key, [_result(185_000, 64, KernelConfig(48, 16, 32, 8, 2)),
                                 _result(1000, 16, KernelConfig(4, 32, 16, 4, 2))])
    t2 = tuned.load_table(path)
    assert set(t2.entries) == {(1000, 16), (185_000, 16), (185_000, 64)}
    assert t2.entries[(1000, 16)] == KernelConfig(4, 32, 16, 4, 2)
    # and the run-time lookup finds it through a user folder
    tuned.set_config_file(tmp_path)
    assert tuned.lookup(_problem(ctx=185_016, total_q=64), "cuda") == KernelConfig(48, 16, 32, 8, 2)


def test_env_var_user_file_then_bundled(tmp_path, monkeypatch):
    user, bundled = tmp_path / "user", tmp_path / "bundled"
    export_table(user, _key(), [_result(1000, 1, KernelConfig(3, 16, 16, 4, 2))])
    export_table(bundled, _key(), [_result(1000, 1, KernelConfig(5, 16, 16, 4, 2))])
    monkeypatch.setattr(tuned, "BUNDLED_DIR", bundled)
    assert tuned.lookup(_problem(), "cuda") == KernelConfig(5, 16, 16, 4, 2)
    tuned.clear()
    tuned._device_names[0] = H200
    monkeypatch.setenv(tuned.ENV_FILE, str(user / _key().filename()))
    assert tuned.lookup(_problem(), "cuda") == KernelConfig(3, 16, 16, 4, 2)     # user file wins over bundled
    tuned.set_config_file(bundled)                                               # an argument beats the env var
    assert tuned.lookup(_problem(), "cuda") == KernelConfig(5, 16, 16, 4, 2)
    tuned.set_config_file(None)                                                  # back to the env var
    assert tuned.lookup(_problem(), "cuda") == KernelConfig(3, 16, 16, 4, 2)
    tuned.register(_table())
    assert tuned.lookup(_problem(), "cuda") == KernelConfig(96, 16, 16, 4, 2)    # memory wins over both


def _lookup_warns(match):
    with pytest.warns(RuntimeWarning, match=match):
        assert tuned.lookup(_problem(), "cuda") is None
    with warnings.catch_warnings():          # one warning, not one per call
        warnings.simplefilter("error")
        assert tuned.lookup(_problem(), "cuda") is None


def test_corrupted_file_falls_back_with_one_warning(tmp_path):
    (tmp_path / _key().filename()).write_text('{"format": "verify_attn.tuned_configs", "buck')
    tuned.set_config_file(tmp_path)
    _lookup_warns("cannot read JSON")


@pytest.mark.parametrize("mutate,match", [
    (lambda d: d.update(format="something-else"), "format"),
    (lambda d: d.update(version=99), "version"),
    (lambda d: d["buckets"][0]["config"].update(block_m=24), "power of two"),
    (lambda d: d["buckets"][0]["config"].update(tile="x"), "unknown KernelConfig fields"),
    (lambda d: d["buckets"].clear(), "non-empty"),
    (lambda d: d["key"].update(hq=16), "not what the file name says"),   # contents contradict the name
])
def test_malformed_file_falls_back_with_a_warning(tmp_path, mutate, match):
    path = export_table(tmp_path, _key(), [_result(1000, 1, KernelConfig(3, 16, 16, 4, 2))])
    doc = json.loads(path.read_text())
    mutate(doc)
    path.write_text(json.dumps(doc))
    tuned.set_config_file(path)
    _lookup_warns(match)


def test_foreign_user_file_falls_back_with_a_warning(tmp_path):
    path = export_table(tmp_path, _key(device_name="NVIDIA RTX PRO 6000 Blackwell"),
                        [_result(1000, 1, KernelConfig(3, 16, 16, 4, 2))])
    tuned.set_config_file(path)
    _lookup_warns("not device_name=NVIDIA_H200")


# --- the tuning loop -------------------------------------------------------------

TILE_A, TILE_B, TILE_C = KernelConfig(0, 16, 16, 4, 2), KernelConfig(0, 32, 16, 4, 2), KernelConfig(0, 16, 32, 8, 2)


def _model_us(cfg: KernelConfig) -> float:
    """Deterministic fake timer: tile B is fastest, and every tile is fastest at 45 splits."""
    base = {TILE_A: 120.0, TILE_B: 100.0, TILE_C: 140.0}[cfg.replace(num_splits=0)]
    s = cfg.num_splits or 188
    return base * (1 + 0.3 * abs(torch.log(torch.tensor(s / 45.0)).item()))


def _tune(wrong=None, timer=None, **kw):
    timed, checked = [], []

    def t(cfg):
        timed.append(cfg)
        return (timer or _model_us)(cfg)

    def check(cfg):
        checked.append(cfg)
        return "max abs err 3.1" if wrong is not None and wrong(cfg) else None

    grid = [1, 2, 4, 8, 16, 32, 64, 128]
    res = tune_bucket([TILE_A, TILE_B, TILE_C], ctx=185_000, tree_nodes=16, splits_for=lambda tile: grid,
                      heuristic_for=lambda tile: 188, timer=t, checker=check, default_config=TILE_A,
                      **kw)
    return res, timed, checked


def test_loop_coarse_to_fine_finds_the_optimum_with_few_timings():
    res, timed, checked = _tune(refine_rounds=3)
    assert res.best.replace(num_splits=0) == TILE_B
    assert 40 <= res.best.num_splits <= 51      # refined between the coarse 32 and 64
    assert len(timed) == len(set(timed))          # no config timed twice
    # within the planned budget, far below every (tile, split count in 1..128) pair
    assert len(timed) <= estimate_trials(3, 8, top_tiles=2, refine_rounds=3) < 3 * 128
    assert checked == timed                      # every timed config was checked first
    assert res.default_us == pytest.approx(_model_us(TILE_A))
    assert res.gain > 1


def test_loop_never_picks_a_wrong_config_and_reports_it():
    bad = TILE_B.replace(num_splits=45)          # the fastest config of the model, but wrong
    res, timed, _ = _tune(wrong=lambda c: c == bad or c.replace(num_splits=0) == TILE_C, refine_rounds=4)
    assert res.best is not None and res.best != bad
    assert bad not in timed and all(c.replace(num_splits=0) != TILE_C for c in timed)   # wrong: never timed
    wrong = {t.config for t in res.wrong}
    assert TILE_C.replace(num_splits=188) in wrong
    assert all("wrong output" in t.error for t in res.wrong)
    d = res.to_dict()
    assert d["wrong_configs"] and d["config"] != bad.to_dict()
    assert BucketResult.from_dict(json.loads(json.dumps(d))).best == res.best


def test_loop_survives_a_failing_launch():
    def flaky(cfg):
        if cfg.num_splits == 8:
            raise RuntimeError("too many resources requested for launch")
        return _model_us(cfg)

    res, _, _ = _tune(timer=flaky)
    assert res.best is not None
    assert any(t.error and "too many resources" in t.error for t in res.trials)


def test_loop_with_every_config_wrong_has_no_winner():
    res, timed, _ = _tune(wrong=lambda c: True)
    assert res.best is None and timed == [] and res.gain is None


# --- the command ----------------------------------------------------------------

def test_dry_run_sm120_fits_99kb(tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = autotune_main(["--dry-run", "--backend", "cuda", "--arch", "sm_120a", "--ctx", "4k,185k",
                        "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["arch"] == "sm_120a"
    cands = doc["candidates"]
    assert cands and all(c["smem_bytes"] <= 101376 for c in cands)
    for ctx in (4000, 185_000):
        for tree in (1, 8, 16, 32, 64):
            mine = [c for c in cands if c["ctx"] == ctx and c["tree_nodes"] == tree]
            assert len(mine) >= 4, (ctx, tree)
            assert len({json.dumps(c["config"], sort_keys=True) for c in mine}) == len(mine)
    assert "185,000" in capsys.readouterr().out


def test_dry_run_paged_triton_and_argument_errors(tmp_path, capsys):
    assert autotune_main(["--dry-run", "--backend", "triton", "--arch", "sm_90a", "--layout", "paged",
                          "--ctx", "1k", "--tree", "16", "--shape", "qwen3-8b"]) == 0
    assert autotune_main(["--dry-run", "--arch", "sm_75"]) == 2
    assert autotune_main(["--dry-run", "--arch", "sm_90a", "--page-size", "16"]) == 2   # page size needs paged
    assert autotune_main(["--dry-run", "--arch", "sm_90a", "--ctx", "0"]) == 2
    if not torch.cuda.is_available():
        assert autotune_main(["--dry-run"]) == 2          # no GPU and no --arch: say so
        assert autotune_main(["--arch", "sm_90a", "--ctx", "1k", "--tree", "1",
                              "--cache", str(tmp_path / "c.json"), "--no-export"]) == 2
    assert "error" in capsys.readouterr().err


def test_refine_walks_out_from_the_grid_edge():
    # optimum at 45 splits but the coarse grid stops at 8: each round doubles outward
    grid = [1, 2, 4, 8]
    res = tune_bucket([TILE_B], ctx=185_000, tree_nodes=16, splits_for=lambda t: grid, heuristic_for=lambda t: 4,
                      cap_for=lambda t: 64, timer=_model_us, checker=lambda c: None, refine_rounds=4)
    assert 40 <= res.best.num_splits <= 51                             # walked out to 16, 32, 64, then refined
    assert max(t.config.num_splits for t in res.trials) <= 64          # never past the cap
    assert splits.refine_points([1, 2, 4, 8], 8, {1, 2, 4, 8}, hi=8) == [6]   # at the cap: midpoint only


def test_cuda_plan_uses_only_compiled_tiles():
    from verify_attn.backends import get_backend
    b = get_backend("cuda")
    if b.config_space is None:
        pytest.skip("the cuda backend has no config_space hook here")
    compiled = set(b.config_space(KIMI, "sm_120a"))
    plan = make_plan("cuda", KIMI, arch_name="sm_120a", ctxs=[4000], trees=[16])
    assert "cuda backend config_space" in plan.origin
    tiles = {t.candidate.config for t in plan.buckets[0].tiles}
    assert tiles and tiles <= {c.replace(num_splits=0) for c in compiled}


# --- the tuning run, with a fake harness (the GPU one is autotune.harness.BucketHarness) ----------

class FakeHarness:
    """Deterministic times from _model_us-like costs; one fast config is wrong."""

    def __init__(self, b, wrong_splits: int):
        self.b, self.wrong_splits, self.trees, self.floor_us = b, wrong_splits, [[-1]], 10.0

    def default_config(self):
        return self.b.tiles[0].candidate.config   # num_splits 0: the heuristic

    def check(self, cfg):
        return "max abs err 0.5" if cfg.num_splits == self.wrong_splits else None

    def time(self, cfg):
        s = cfg.num_splits or 1
        return 20.0 + cfg.block_n * 0.1 + abs(s - 40) * 0.5 - (5.0 if s == self.wrong_splits else 0.0)


def _args(tmp_path, **kw):
    from autotune.__main__ import build_parser
    a = build_parser().parse_args(["--arch", "sm_90a", "--ctx", "4k,185k", "--tree", "1,16",
                                   "--cache", str(tmp_path / "cache.json"), "--export", str(tmp_path / "out")])
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def test_run_tuning_caches_exports_and_resumes(tmp_path):
    from autotune.run import run_tuning
    plan = make_plan("cuda", KIMI, arch_name="sm_90a", ctxs=[4000, 185_000], trees=[1, 16], use_hooks=False)
    made = []

    def make(b):
        made.append((b.ctx, b.tree_nodes))
        return FakeHarness(b, wrong_splits=b.tiles[0].heuristic)

    assert run_tuning(plan, _args(tmp_path), make_harness=make, device_name=H200) == 0
    assert sorted(made) == [(4000, 1), (4000, 16), (185_000, 1), (185_000, 16)]
    entries = TuneCache(tmp_path / "cache.json").load()
    assert len(entries) == 4
    for e in entries.values():
        r = e["result"]
        assert r["wrong_configs"] and r["config"]["num_splits"] not in {w["config"]["num_splits"]
                                                                          for w in r["wrong_configs"]}
    [f] = list((tmp_path / "out").glob("*.json"))
    t = tuned.load_table(f)
    assert set(t.entries) == {(4000, 1), (4000, 16), (185_000, 1), (185_000, 16)}
    assert "versions" in t.meta and "date" in t.meta
    # resume: nothing is rebuilt or re-timed
    made.clear()
    assert run_tuning(plan, _args(tmp_path, resume=True), make_harness=make, device_name=H200) == 0
    assert made == []


def test_run_tuning_with_no_correct_config_exits_nonzero(tmp_path):
    from autotune.run import run_tuning
    plan = make_plan("cuda", KIMI, arch_name="sm_90a", ctxs=[4000], trees=[16], use_hooks=False)

    class AllWrong(FakeHarness):
        def check(self, cfg):
            return "NaN in out"

    assert run_tuning(plan, _args(tmp_path), make_harness=lambda b: AllWrong(b, 0), device_name=H200) == 1
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.json"))


def test_harness_check_rejects_a_wrong_backend_on_cpu():
    """The GPU harness's reference check, run on the CPU with the reference backend and a broken copy of it."""
    from autotune.harness import BucketHarness
    from verify_attn.backends import get_backend
    ref = get_backend("reference")
    shape = get_shape("gqa-d64")

    def broken(p, cfg, out, lse):
        ref.run(p, cfg, out, lse)
        out[-1, 0, 0] += 1.0            # one element off: must be caught

    kw = dict(ctx=37, tree_nodes=5, tree_kind="ddtree", batch=2, page_size=1, dtype=torch.float32,
              l2_bytes=1 << 20, reps=2, max_seconds=0.5, device="cpu")
    good = BucketHarness(ref, shape, **kw)
    assert good.check(KernelConfig(1)) is None
    assert good.time(KernelConfig(1)) > 0
    bad = BucketHarness(Backend("broken", run=broken), shape, **kw)
    assert "1 outputs off" in bad.check(KernelConfig(1))


def test_harness_judges_e4m3_mma_configs_by_their_own_contract():
    """On an e4m3 cache the tuner's check judges the e4m3-MMA tiles (Q and P rounded to e4m3) against the reference
    with q rounded as they round it (tolerances.check_e4m3_mma), the f16 tile by the 16-bit tolerance: before, every
    e4m3-MMA candidate failed the 16-bit check (5-11% of max |ref| on Kimi's logits) and the tuner never offered the
    H200's e4m3 default. A wrong scale still fails."""
    from autotune.harness import BucketHarness
    from verify_attn.backends import cuda, cuda_emu, get_backend
    ok, why = cuda_emu.available()
    if not ok:
        pytest.skip(f"cuda-emu: {why}")
    h = BucketHarness(get_backend("cuda-emu"), get_shape("kimi-k2-tp8"), ctx=150, tree_nodes=5, tree_kind="ddtree",
                      batch=1, page_size=1, dtype=torch.bfloat16, l2_bytes=1 << 20, reps=1, max_seconds=0.5,
                      device="cpu", kv_dtype="fp8_e4m3")
    v2, f16 = cuda.version_config(h.problem, "v2"), cuda.version_config(h.problem, "m32n32w8s3")
    assert cuda.runs_e4m3_mma(h.problem, v2) and not cuda.runs_e4m3_mma(h.problem, f16)
    assert h.check(v2) is None and h.check(f16) is None
    h.problem = h.problem.__class__(**{**h.problem.__dict__, "k_scale": h.problem.k_scale * 1.05})
    assert "lse" in h.check(v2)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_tune_export_and_lookup_through_tree_verify(tmp_path, backend, monkeypatch):
    """A tiny real tuning run, then tree_verify(config=None) picks the exported config and stays correct."""
    from verify_attn.backends import get_backend
    if not get_backend(backend).available()[0]:
        pytest.skip(f"backend {backend} unavailable: {get_backend(backend).available()[1]}")
    tuned._device_names.clear()      # the real GPU's name, not the fixture's
    monkeypatch.setattr(tuned, "_usable", REAL_USABLE)
    out = tmp_path / "out"
    rc = autotune_main(["--backend", backend, "--ctx", "4k", "--tree", "16", "--reps", "5", "--max-seconds", "0.5",
                        "--refine-rounds", "1", "--cache", str(tmp_path / "c.json"), "--export", str(out)])
    assert rc == 0
    [f] = list(out.glob("*.json"))
    table = tuned.load_table(f)
    tuned.set_config_file(out)
    from tests.cases import CaseSpec, check_against_reference, make_case
    case = make_case(CaseSpec(prefix_lens=(4000,), tree_sizes=(16,), dtype=torch.bfloat16), device="cuda")
    p = case.problem()
    assert tuned.lookup(p, backend) == table.entries[(4000, 16)]
    import verify_attn
    o, lse = verify_attn.tree_verify(**case.kwargs, backend=backend, return_lse=True)
    check_against_reference(o, lse, case)


def test_triton_backend_takes_the_tuners_configs_on_cpu():
    """The real triton backend (Triton interpreter on CPU, fp16) runs and passes the check for planned configs."""
    from autotune.harness import BucketHarness
    from verify_attn.backends import get_backend
    b = get_backend("triton")
    if not b.available()[0] or b.config_space is None:
        pytest.skip(f"triton backend unavailable here: {b.available()[1]}")
    shape = get_shape("gqa-d64")
    plan = make_plan("triton", shape, arch_name="sm_90a", ctxs=[40], trees=[4], dtype="fp16")
    [bp] = plan.buckets
    assert bp.tiles and "triton backend config_space" in plan.origin
    h = BucketHarness(b, shape, ctx=40, tree_nodes=4, tree_kind="ddtree", batch=1, page_size=1, dtype=torch.float16,
                      l2_bytes=1 << 20, reps=1, max_seconds=0.1, device="cpu")
    res = tune_bucket([bp.tiles[0].candidate.config], ctx=40, tree_nodes=4, splits_for=lambda t: [1, 2],
                      heuristic_for=lambda t: 1, timer=h.time, checker=h.check, refine_rounds=0)
    assert [t.error for t in res.trials] == [None, None] and res.best is not None


def test_run_tuning_goes_on_when_a_bucket_cannot_be_built(tmp_path):
    from autotune.run import run_tuning
    plan = make_plan("cuda", KIMI, arch_name="sm_90a", ctxs=[4000, 185_000], trees=[16], use_hooks=False)

    def make(b):
        if b.ctx == 185_000:
            raise RuntimeError("CUDA out of memory")
        return FakeHarness(b, wrong_splits=-1)

    assert run_tuning(plan, _args(tmp_path), make_harness=make, device_name=H200) == 1   # one bucket missing
    [f] = list((tmp_path / "out").glob("*.json"))
    assert set(tuned.load_table(f).entries) == {(4000, 16)}                              # the other is exported


# --- configs chosen by the model (--cost model) and the lookup order measured > model > heuristic ---------

def test_lookup_order_measured_then_model_then_heuristic(tmp_path, monkeypatch, capsys):
    bundled = tmp_path / "bundled"
    model_path = export_table(bundled, _key(), [_result(1000, 1, KernelConfig(7, 16, 16, 4, 2))], source="model",
                              meta={"model_version": "bench.model@test"})
    assert model_path.name.endswith(",layout=page1,source=model.json")
    assert json.loads(model_path.read_text())["source"] == "model"
    monkeypatch.setattr(tuned, "BUNDLED_DIR", bundled)
    assert tuned.lookup(_problem(), "cuda") == KernelConfig(7, 16, 16, 4, 2)           # model > heuristic
    ex = tuned.explain(_key(), 185_000, 16)
    assert ex["source"] == "model" and ex["model_version"] == "bench.model@test"
    measured = export_table(bundled, _key(), [_result(1000, 1, KernelConfig(3, 16, 16, 4, 2))])
    assert json.loads(measured.read_text())["source"] == "measured"
    tuned.clear()
    tuned._device_names[0] = H200
    assert tuned.lookup(_problem(), "cuda") == KernelConfig(3, 16, 16, 4, 2)           # measured > model
    assert tuned.explain(_key(), 185_000, 16)["source"] == "measured"
    assert tuned.explain(_key(hq=16), 185_000, 16)["source"] == "heuristic"
    # `python -m autotune show` says the same
    assert autotune_main(["show", "--ctx", "185k", "--tree", "16", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["source"] == "measured" and rows[0]["file"] == str(measured)
    measured.unlink()
    tuned.clear()
    assert autotune_main(["show", "--ctx", "185k"]) == 0
    assert "model (bench.model@test)" in capsys.readouterr().out


def test_show_says_when_a_model_table_was_chosen_by_other_model_sources(tmp_path, monkeypatch, capsys):
    """A model-sourced table records the bench.model sources that chose it and the kernel versions it was chosen over;
    `show` says both, and when this checkout's model sources differ (and how to re-derive; nothing when only the
    commit differs)."""
    from autotune.model_cost import model_sources
    bundled = tmp_path / "bundled"
    monkeypatch.setattr(tuned, "BUNDLED_DIR", bundled)
    now = model_sources()
    assert now.startswith("bench.model@") and len(now) == len("bench.model@") + 10
    for ver, stale in (("bench.model@0123456789+abc1234", True), (f"{now}+abc1234", False)):
        export_table(bundled, _key(), [_result(1000, 1, KernelConfig(7, 16, 16, 4, 2))], source="model",
                     meta={"model_version": ver, "arch": "sm_120a", "kernel_versions": [0, 1]})
        tuned.clear()
        assert autotune_main(["show", "--ctx", "185k"]) == 0
        out = capsys.readouterr().out
        assert ("not this checkout's " + now in out and "--arch sm_120a" in out) is stale, out
        assert f"model ({ver}; over kernels v0, v1)" in out
        assert autotune_main(["show", "--ctx", "185k", "--json"]) == 0
        row = json.loads(capsys.readouterr().out)[0]
        assert row["arch"] == "sm_120a" and row["kernel_versions"] == [0, 1] and ("stale" in row) is stale


def test_model_table_under_a_measured_name_is_refused(tmp_path):
    path = export_table(tmp_path, _key(), [_result(1000, 1, KernelConfig(7, 16, 16, 4, 2))], source="model")
    wrong = tmp_path / _key().filename()
    path.rename(wrong)
    with pytest.raises(tuned.TableError, match="not what the file name says"):
        tuned.load_table(wrong)


def test_model_tie_rule_keeps_the_fewest_splits():
    """A candidate with fewer splits ties when the band of its difference with the fastest reaches zero: a
    constant moving both the same way does not make a tie, one that reverses their order does."""
    from autotune.model_cost import choose
    from bench.model.bands import Band
    a, b, c = KernelConfig(66, 32, 64, 8, 3), KernelConfig(33, 32, 32, 8, 4), KernelConfig(16, 32, 32, 8, 4)
    trials = [(a, 100.0), (b, 109.0), (c, 130.0)]
    fast = Band(100.0, 80.0, 130.0, "lat", {"lat": (80.0, 130.0), "bw": (95.0, 105.0)})
    together = Band(109.0, 87.0, 141.0, "lat", {"lat": (87.0, 141.0), "bw": (104.0, 114.0)})   # b stays ~9 slower
    crossing = Band(109.0, 90.0, 125.0, "lat", {"lat": (75.0, 125.0), "bw": (104.0, 114.0)})   # b wins at lat's low end
    asked = []

    def band_of(x, bands):
        asked.append(x[0])
        return bands[x[0]]
    kept, ties, kb = choose(trials, trials[0], fast, lambda x: band_of(x, {b: together, c: together}))
    assert kept[0] == a and kb is fast and asked == [b]          # c (outside the window) is never banded
    kept, ties, kb = choose(trials, trials[0], fast, lambda x: band_of(x, {b: crossing, c: crossing}))
    assert kept[0] == b and kb is crossing and [t[0] for t in ties] == [a, b]


def test_cuda_plan_keeps_every_compiled_tile_both_archs():
    """The CUDA backend's compiled tiles are all candidates (v1's warp layout is not v0's: the v0 divisibility
    rule once refused v1 m32 n16 w8, the sm_120a default tile)."""
    from verify_attn import build as vb
    for arch in ("sm_90a", "sm_120a"):
        plan = make_plan("cuda", KIMI, arch_name=arch, ctxs=[185_000], trees=[16])
        tiles = {(t.candidate.config.block_m, t.candidate.config.block_n, t.candidate.config.num_warps,
                  t.candidate.config.num_stages) for t in plan.buckets[0].tiles}
        d = vb.default_tile("mla576", arch)
        assert (d.block_m, d.block_n, d.num_warps, d.num_stages) in tiles and not plan.rejected


@pytest.mark.parametrize("arch", ["sm_120a", pytest.param("sm_90a", marks=pytest.mark.slow)])
def test_cost_model_tunes_and_exports_on_a_cpu(tmp_path, arch):
    """One bucket on each arch, chosen by bench.model (needs the CUDA toolkit to read the kernels' SASS)."""
    from bench.model import call, devices, predict
    from autotune.model_cost import DEVICES, _kernels, tune_with_model
    if predict(DEVICES[arch], ctx=4000, tree_nodes=16, band=False) is None:
        pytest.skip("the model cannot read the kernels here (no CUDA toolkit / SASS tools)")
    plan = make_plan("cuda", KIMI, arch_name=arch, ctxs=[4000], trees=[16])
    results, extra, notes = tune_with_model(plan)
    (r,) = results
    note = extra[(4000, 16)]
    assert r.best is not None and note["band_us"][0] <= r.best_us <= note["band_us"][1]
    # the kept config's time is the model's prediction of that config, and nothing tied is faster by more
    dev = devices.get_device(DEVICES[arch])
    _, ks = _kernels(plan, dev)
    km = next(k for k in ks if (k.tile.block_m, k.tile.block_n, k.tile.num_warps, k.tile.num_stages)
              == (r.best.block_m, r.best.block_n, r.best.num_warps, r.best.num_stages) and k.tile.targets(dev.arch))
    case = call.Case(KIMI, 4000, 16, 1, "page1", 1, kv_dtype="bf16")
    assert call.predict(km, dev, case, r.best.num_splits).total_us == pytest.approx(r.best_us)
    fastest = min(t.time_us for t in r.trials)
    assert r.best_us == fastest or ("tie" in note and r.best.num_splits < min(
        t.config.num_splits for t in r.trials if t.time_us == fastest))
    assert 0 < len(r.trials) <= plan.buckets[0].num_candidates   # tiles the model has no kernel of: in notes
    rc = autotune_main(["--cost", "model", "--arch", arch, "--ctx", "4k", "--tree", "16", "--export",
                        str(tmp_path)])
    assert rc == 0
    (f,) = tmp_path.glob("*,source=model.json")
    t = tuned.load_table(f)
    assert tuned.table_source(t) == "model" and t.meta["model_version"].startswith("bench.model@")
    assert autotune_main(["--cost", "model", "--ctx", "4k"]) == 2          # needs --arch


def test_shipped_model_tables_say_which_kernels_they_chose_from():
    """Every model-sourced table in autotune/configs/ records the kernel versions it was chosen over
    (`autotune --versions`), and each bucket's kernel (bench.model's name: 'v1 m32 ...'; v0's tiles carry no version)
    is one of them."""
    from autotune.export import DEFAULT_EXPORT_DIR   # (the autouse fixture points tuned.BUNDLED_DIR elsewhere)
    from verify_attn.build import LABEL_RE
    files = sorted(DEFAULT_EXPORT_DIR.glob("*,source=model.json"))
    assert files
    for f in files:
        doc = json.loads(f.read_text())
        versions = doc.get("kernel_versions")
        assert versions, f"{f.name}: no kernel_versions (re-derive with --versions)"
        for b in doc["buckets"]:
            m = LABEL_RE.search(b["kernel"])
            assert m and int(m.group(1) or 0) in versions, (f.name, b["ctx"], b["tree_nodes"], b["kernel"])
