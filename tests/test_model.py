"""The SASS-level performance model (bench.model): parser, loop finding, counts, chains, simulator, CLI.

Synthetic SASS text checks each piece on a known answer; the real v0 cubins are
read where nvcc and the SASS tools exist (skipped cleanly otherwise).
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from bench.model import analysis, devices, sass, sim

HERE = Path(__file__).resolve().parent


def _sass(body: str, src: str) -> str:
    """A one-function nvdisasm -c -gi listing whose instructions map to lines of `src`."""
    out = [".text._Z6kernelv:"]
    addr = 0
    for raw in textwrap.dedent(body).strip().splitlines():
        raw = raw.strip()
        if raw.endswith(":"):
            out.append(raw)
            continue
        line, ins = raw.split("|", 1)
        out.append(f'\t//## File "{src}", line {int(line)}')
        out.append(f"        /*{addr:04x}*/                   {ins.strip()} ;")
        addr += 16
    return "\n".join(out) + "\n"


SRC = textwrap.dedent("""\
    // line 1
    for (int it = 0; it < n; ++it) {  // sass-model: tile-loop
      mma();
      if (masked) {  // sass-model: cold
        mask();
      }
      more();
    }
""")


@pytest.fixture
def src(tmp_path) -> str:
    p = tmp_path / "k.cuh"
    p.write_text(SRC)
    return str(p)


def _loop_body(chains: int, ksteps: int) -> str:
    """An MMA loop: `chains` independent accumulators, each `ksteps` deep, one k-loop per tile."""
    lines = ["2|MOV R200, RZ", ".L_x_1:"]
    for k in range(ksteps):
        lines.append("3|LDSM.16.M88.4 R100, [R200]")
        for c in range(chains):
            acc = 4 * c
            lines.append(f"3|HMMA.16816.F32.BF16 R{acc}, R100, R104, R{acc}")
    lines += ["4|ISETP.NE.AND P1, PT, R9, RZ, PT", "4|@!P1 BRA `(.L_x_2)", "5|LDG.E R50, desc[UR4][R2.64]",
              "5|FSEL R0, R0, -INF , !P0", ".L_x_2:", "7|BAR.SYNC.DEFER_BLOCKING 0x0",
              "2|IADD3 R200, PT, PT, R200, 0x1, RZ", "2|ISETP.NE.AND P0, PT, R200, 0x20, PT", "2|@P0 BRA `(.L_x_1)",
              "8|EXIT"]
    return "\n".join(lines)


def _read(src: str, chains: int, ksteps: int, cold: bool = False):
    f = sass.parse(_sass(_loop_body(chains, ksteps), src))["_Z6kernelv"]
    mk = analysis.read_markers(src)
    lp = analysis.find_loop(f, mk.tile_loop, src)
    return f, lp, analysis.tile_path(f, lp, mk.cold, src, include_cold=cold)


def test_markers_and_block_ranges(src):
    mk = analysis.read_markers(src)
    assert mk.tile_loop == 2 and mk.cold == ((5, 6),) and mk.split_loop is None


def test_parser_registers_and_widths():
    f = sass.parse(_sass("""
        1|HMMA.16816.F32.BF16 R164, R164, R176, R160
        1|LDSM.16.M88.4 R28, [R170+0x20]
        1|LDSM.16.MT88.2 R30, [R171]
        1|ISETP.GE.AND P0, PT, R133, R138, PT
        1|IMAD.WIDE.U32 R2, R9, 0x4, R2
        1|STS.64 [R26+0x10], R4
        1|LDGSTS.E.BYPASS.128 [R20+0x400], desc[UR18][R12.64]
    """, "/x.cuh"))["_Z6kernelv"]
    h, l4, l2, isetp, wide, sts, cp = f.instrs
    assert h.dsts == [("R164", 4)] and h.srcs == [("R164", 4), ("R176", 2), ("R160", 4)]
    assert l4.dsts == [("R28", 4)] and analysis.ldsm_kind(l4) == "x4" and analysis.ldsm_kind(l2) == "x2.trans"
    assert isetp.regs_written() == ["P0"] and set(isetp.regs_read()) == {"R133", "R138"}
    assert wide.regs_written() == ["R2", "R3"] and set(wide.regs_read()) == {"R9", "R2", "R3"}
    assert sts.regs_written() == [] and set(sts.regs_read()) == {"R26", "R4", "R5"}
    assert analysis.smem_bytes(cp) == (0, 512) and analysis.global_bytes(cp) == 512
    assert analysis.smem_bytes(l4) == (512, 0) and analysis.smem_bytes(sts) == (0, 256)


def test_loop_found_from_marker_and_cold_block_excluded(src):
    f, lp, hot = _read(src, chains=1, ksteps=4)
    assert lp.branch.line == 2 and f.instrs[lp.start].label == ".L_x_1"
    ops = [i.op for i in hot.instrs]
    assert "LDG" not in ops and "FSEL" not in ops and hot.excluded == 2
    _, _, cold = _read(src, chains=1, ksteps=4, cold=True)
    assert [i.op for i in cold.instrs].count("LDG") == 1


def test_loop_whose_back_branch_the_compiler_credits_to_the_body(src):
    """The compiler may put the loop's back branch on the body's last line: the loop is still the
    innermost one holding the marker line's own instructions (the induction update and exit test)."""
    body = _loop_body(1, 4).replace("2|@P0 BRA `(.L_x_1)", "7|@P0 BRA `(.L_x_1)")
    f = sass.parse(_sass(body, src))["_Z6kernelv"]
    lp = analysis.find_loop(f, analysis.read_markers(src).tile_loop, src)
    assert lp.branch.line == 7 and f.instrs[lp.start].label == ".L_x_1"
    with pytest.raises(LookupError):  # a marker no instruction of any loop sits on
        analysis.find_loop(f, 9, src)


def test_qmma_runs_at_the_devices_fp8_rate():
    """QMMA.16832 (e4m3) does twice an HMMA.16816's FLOPs: at the device's qmma_speedup (2 on sm_120,
    sourced) its pipe time equals one HMMA's; at 1 it is two."""
    q, h = [sass.parse(_sass(f"1|{op}", "/x.cuh"))["_Z6kernelv"].instrs[0]
            for op in ("QMMA.16832.F32.E4M3.E4M3 R0, R4, R8, R0", "HMMA.16816.F32.BF16 R0, R4, R8, R0")]
    rtx, h200 = devices.get_device("rtx-pro-6000"), devices.get_device("h200")
    assert rtx.qmma_speedup.value == 2.0 and rtx.qmma_speedup.kind == "published"
    assert sim.instr_timing(q, rtx, 0).interval == sim.instr_timing(h, rtx, 0).interval
    assert sim.instr_timing(q, h200, 0).interval == 2 * sim.instr_timing(h, h200, 0).interval


def test_counts_and_chain_depth_one_vs_four_accumulators(src):
    _, _, one = _read(src, chains=1, ksteps=8)
    r1 = analysis.read_tile(one)
    assert r1.hmma == 8 and r1.hmma_chain_depth == 8 and r1.hmma_accumulators == 1
    assert r1.ldsm == 8 and r1.barriers == 1 and r1.smem_read_bytes == 8 * 512
    _, _, four = _read(src, chains=4, ksteps=8)
    r4 = analysis.read_tile(four)
    assert r4.hmma == 32 and r4.hmma_chain_depth == 8 and r4.hmma_accumulators == 4
    assert r4.classes["hmma"] == 32 and r4.classes["control"] >= 2


def test_inner_loop_trip_count_expands_the_path(tmp_path):
    src = tmp_path / "k.cuh"
    src.write_text("// 1\nfor (;;) {  // sass-model: tile-loop\n  x;\n  for (k) {\n  }\n}\n")
    text = _sass("""
        2|CS2R R0, SRZ
        .L_x_1:
        3|MOV R9, RZ
        .L_x_5:
        4|HMMA.16816.F32.BF16 R0, R20, R24, R0
        4|IADD3 R9, PT, PT, R9, 0x4, RZ
        4|ISETP.NE.AND P1, PT, R9, 0x24, PT
        4|@P1 BRA `(.L_x_5)
        2|ISETP.NE.AND P0, PT, R30, RZ, PT
        2|@P0 BRA `(.L_x_1)
    """, str(src))
    f = sass.parse(text)["_Z6kernelv"]
    mk = analysis.read_markers(str(src))
    lp = analysis.find_loop(f, mk.tile_loop, str(src))
    path = analysis.tile_path(f, lp, mk.cold, str(src))
    assert path.inner_loops and path.inner_loops[0][2] == 9  # 0x24 / 4
    r = analysis.read_tile(path)
    assert r.hmma == 9 and r.hmma_chain_depth == 9


def test_simulator_latency_vs_throughput(src):
    dev = devices.get_device("rtx-pro-6000")
    _, _, one = _read(src, chains=1, ksteps=16)
    _, _, four = _read(src, chains=4, ksteps=4)
    s1 = sim.simulate(one.instrs, dev, warps=1, warps_per_barrier_group=1)
    s4 = sim.simulate(four.instrs, dev, warps=1, warps_per_barrier_group=1)
    # same 16 HMMAs per tile: one dependent chain waits the latency each step, four chains fill the pipe
    assert s1.cycles_per_iter >= 16 * dev.hmma_latency.value
    assert s4.cycles_per_iter < 0.75 * s1.cycles_per_iter
    assert s4.utilization("tensor") > s1.utilization("tensor")
    # two warps per scheduler overlap one warp's latency with the other's issue
    s1x2 = sim.simulate(one.instrs, dev, warps=2, warps_per_barrier_group=1)
    assert s1x2.cycles_per_iter < 2 * s1.cycles_per_iter


def test_device_constants_all_carry_a_source():
    for d in devices.MODELLED.values():
        for name, c in d.constants().items():
            assert c["kind"] in ("published", "derived", "measured", "assumed"), name
            assert len(c["source"]) > 20, f"{d.key}.{name} needs a real source"
            # every assumed or derived constant states a range, and why
            if c["kind"] in ("assumed", "derived") and name != "qmma_speedup":
                assert c["lo"] is not None and c["hi"] is not None and c["lo"] < c["hi"], f"{d.key}.{name} range"
                assert len(c["why_range"]) > 15, f"{d.key}.{name} needs the range's source"
            if c["kind"] == "measured":   # "measured" means measured by this project, with where
                assert "bench" in c["source"] or "this project" in c["source"], f"{d.key}.{name}"
    assert devices.get_device("rtx-pro-6000").hmma_interval == pytest.approx(16.0)
    h = devices.get_device("h200")
    # the H200's mma.sync rate is the one bench.ceilings measured (578 TFLOP/s at the measured clock), not 2/3 of
    # wgmma's; one HMMA.16816 per 6.7 cycles per scheduler
    assert h.mma_tflops == pytest.approx(578.3, rel=1e-3) and h.hmma_interval == pytest.approx(6.71, rel=1e-2)
    assert h.hmma_latency.value == 25.0 and h.hgmma_latency.value == 58
    with pytest.raises(ValueError, match="outside its range"):
        devices.Const(5.0, "assumed", "x" * 30, lo=1.0, hi=2.0)
    with pytest.raises(ValueError, match="unknown device"):
        devices.get_device("a100")


# ------------------------------------------------------------------ real cubins (nvcc + SASS tools)

def _tools_or_skip():
    from verify_attn import build as vb
    if vb.find_cuda_home() is None or sass.find_tool("nvdisasm") is None or sass.find_tool("cuobjdump") is None:
        pytest.skip("needs nvcc and nvdisasm/cuobjdump (pip install nvidia-cuda-nvdisasm nvidia-cuda-cuobjdump)")


@pytest.mark.parametrize("arch", ["sm_120a", "sm_90a"])
def test_v0_reading_matches_the_hand_reading(arch):
    """v0's default MLA tile (32x16x3, 2x2 warps): 68 HMMA per warp per tile (36 S + 32 PV), the 36 S HMMAs
    one dependent chain, 89 LDSM, 3 barriers, 128 O-rescale FMULs (+4 scalings), ~600-700 instructions."""
    _tools_or_skip()
    from bench.model import kernels
    from verify_attn import build as vb
    km = kernels.find(arch, "mla576", "bf16", "page1", vb.Tile(32, 16, 2, 2, 3))
    r = km.hot_reading
    assert r.hmma == 68 and r.hmma_chain_depth == 36
    assert r.ldsm == 89 and r.barriers == 3
    assert r.fmul_fp32 >= 128
    assert 550 <= r.instructions <= 750
    assert r.smem_read_bytes * 4 / (16 * 1152) > 8  # ~8.9 B of smem reads per DRAM byte (issue 13)


def test_cli_json_schema_and_v0_prediction_ranges(tmp_path):
    _tools_or_skip()
    from bench.model.__main__ import main
    out = tmp_path / "model.json"
    assert main(["--arch", "sm_120a,sm_90a", "--ctx", "185k", "--tree", "16", "--kernel", "m32 n16 w4",
                 "--no-bands", "--json", str(out)]) == 0   # central values (the bands: test_autotune)
    d = json.loads(out.read_text())
    assert d["kind"] == "model" and len(d["kernels"]) == 2
    for e in d["kernels"]:
        for k in ("arch", "kernel", "registers", "smem_bytes", "ctas_per_sm", "warps_per_scheduler", "per_tile",
                  "predicted_us", "floor_us", "frac_of_floor", "bound"):
            assert k in e
        for k in ("hmma", "hmma_chain_depth", "ldsm", "smem_read_bytes", "global_bytes", "barriers", "instructions"):
            assert k in e["per_tile"]
        dev = next(iter(e["predicted_us"]))
        assert e["bound"][dev] in ("latency", "issue", "tensor", "smem", "dram", "l2", "latency_littles_law",
                                   "mufu", "alu", "combine", "prologue", "launch")
        # v0 at the headline shape is latency-bound well short of the floor on both devices (NOTES.md)
        assert 0.05 < e["frac_of_floor"][dev] < 0.6


def test_the_h100_is_the_h200s_die_with_its_own_hbm():
    """The device tool lends H100s (nvidia-h100-x1) as well as H200s: the H100's model is the H200's (one GH100 die,
    its measured constants) except the datasheet DRAM bandwidth; the streaming fraction is the H200's, as an
    assumption with the H200's range. CUDA's names pick the model a run's rows are compared with."""
    h100, h200 = devices.get_device("h100"), devices.get_device("h200")
    assert devices.get_device("h100-sxm") is h100 and h100.arch == "sm_90a" and "h100" not in devices.DEVICES
    differ = {k for k, c in h100.constants().items() if c != h200.constants()[k]}
    assert differ == {"dram_gbs", "dram_efficiency"}
    assert h100.dram_gbs.value == 3350 and h100.dram_efficiency.kind == "assumed"
    assert h100.dram_efficiency.value == h200.dram_efficiency.value
    assert h100.dram_efficiency.range == h200.dram_efficiency.range
    for name, key in (("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                      ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000"),
                      ("NVIDIA H100 PCIe", None), ("NVIDIA H100 NVL", None), ("NVIDIA A100-SXM4-80GB", None),
                      (None, None)):
        d = devices.device_for_gpu(name)
        assert (d.key if d else None) == key, name


def test_cli_reads_the_arch_on_a_named_device(tmp_path):
    """`--arch h100` reads the sm_90a cubins on the H100's model: the same kernel's tile as on the H200, its DRAM
    term longer (3.35 against 4.8 TB/s), and no H200 goal judged from it."""
    _tools_or_skip()
    from bench.model.__main__ import main
    out = tmp_path / "model.json"
    assert main(["--arch", "h200,h100", "--ctx", "185k", "--tree", "16", "--kernel", "cluster2", "--no-bands",
                 "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert set(d["devices"]) == {"h200", "h100"} and {e["arch"] for e in d["kernels"]} == {"sm_90a"}
    us = {next(iter(e["predicted_us"])): e for e in d["kernels"]}
    assert us["h100"]["per_tile"] == us["h200"]["per_tile"]
    assert us["h100"]["predicted_us"]["h100"] > us["h200"]["predicted_us"]["h200"]
    assert us["h100"]["floor_us"]["h100"] > us["h200"]["floor_us"]["h200"]


def test_cli_rejects_bad_flags(capsys):
    from bench.model.__main__ import main
    for argv, flag in ((["--splits", "0"], "--splits"), (["--layout", "nope"], "--layout"),
                       (["--arch", "sm_80"], "--arch")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        assert flag in capsys.readouterr().err


def test_calibrate_joins_measured_rows_with_predictions(tmp_path, capsys):
    _tools_or_skip()
    from bench.model import calibrate
    from verify_attn.shapes import get_shape
    payload = {"device": "NVIDIA H200", "shape": get_shape("kimi-k2-tp8").to_dict(), "dtype": "bf16", "batch": 1,
               "tree_shape": "ddtree", "results": [
                   {"backend": "cuda", "status": "ok", "median_us": 400.0, "ctx": 185000, "tree_nodes": 16,
                    "layout": "page1", "page_size": 1,
                    "config": {"num_splits": 66, "block_m": 32, "block_n": 16, "num_warps": 4, "num_stages": 3}},
                   {"backend": "triton", "status": "ok", "median_us": 900.0, "ctx": 185000, "tree_nodes": 16,
                    "layout": "page1", "page_size": 1, "config": {"num_splits": 8}}]}
    f = tmp_path / "run.json"
    f.write_text(json.dumps(payload))
    rows = calibrate.rows([f])
    assert len(rows) == 1 and rows[0]["device"] == "h200" and rows[0]["num_splits"] == 66
    assert rows[0]["ratio"] == pytest.approx(400.0 / rows[0]["predicted_us"])
    assert calibrate.calibrate([f]) == 0
    assert "meas/model" in capsys.readouterr().out
    # a run that launched the split kernel with programmatic dependent launch says so (bench.verify's split_pdl): its
    # rows are read with the PDL launch, one plain launch gap less; a run without the field predates it
    f.write_text(json.dumps(dict(payload, split_pdl=True)))
    dev = devices.get_device("h200")
    assert rows[0]["predicted_us"] - calibrate.rows([f])[0]["predicted_us"] == pytest.approx(
        dev.launch_us.value - dev.pdl_launch_us.value)


def test_fp8_kernel_predicted_at_least_1_6x_over_bf16_on_sm120():
    """Issue 17's bar, kept: at 185k / 16 nodes / page_size 1 the e4m3-cache kernel (e4m3 MMAs) is
    predicted at least 1.6x faster than the bf16 one on the RTX PRO 6000; on the H200 the fp8 default is kernel v2 on
    wgmma .e4m3 (mma.sync has no e4m3 rate there), predicted at least 1.3x faster than the bf16 default (issue 27's
    goal is 1.5x; the reading and its band are in NOTES.md)."""
    _tools_or_skip()
    from bench.model import predict

    bf16 = predict("rtx-pro-6000", ctx=185_000, tree_nodes=16, band=False)   # central values are the bar
    fp8 = predict("rtx-pro-6000", ctx=185_000, tree_nodes=16, kv_dtype="fp8_e4m3", band=False)
    assert bf16 and fp8 and bf16["us"] / fp8["us"] >= 1.6, (bf16, fp8)
    h = predict("h200", ctx=185_000, tree_nodes=16, kv_dtype="fp8_e4m3", band=False)
    h_bf16 = predict("h200", ctx=185_000, tree_nodes=16, band=False)
    assert h and " v2 " in h["kernel"] and "wgmma" in h["kernel"], h
    assert h_bf16["us"] / h["us"] >= 1.3, (h_bf16, h)


def test_split_heuristic_fills_whole_waves():
    """heuristic_num_splits compares 1..MAX_WAVES full waves: the 16-node headline keeps one wave
    (47 x 4 M tiles = 188 CTAs on 188 SMs), the 64-node tree (16 M tiles) takes three (35 x 16 = 560
    CTAs, 4 idle slots) over one that leaves 12 SMs idle; a grid one CTA over a wave is never chosen."""
    from verify_attn.config import heuristic_num_splits

    def h(m_tiles, sms=188, ctx=185_000, bn=16):
        return heuristic_num_splits(batch=1, num_kv_heads=1, m_tiles=m_tiles, avg_kv_len=ctx, num_sms=sms,
                                    block_n=bn)
    assert h(4) == 47
    assert h(16) == 35
    assert heuristic_num_splits(batch=1, num_kv_heads=1, m_tiles=16, avg_kv_len=185_000, num_sms=188, block_n=16,
                                max_waves=1) == 11
    for m in (1, 3, 4, 7, 16, 33, 64):
        s = h(m)
        assert (s * m) % 188 == 0 or (s * m) % 188 > 188 // 2 or s * m < 188, (m, s)  # no nearly empty wave
    # short contexts: two KV tiles a split cap it, ceil(len / 2 tiles) splits (each but the last owns two tiles once
    # its share is rounded up to whole tiles: 7 splits of 32 tokens and one of 8 at 200)
    assert h(4, ctx=200) == -(-200 // (2 * 16))
    # Hopper's v3 at 4k (64-token blocks in pairs, 2 M tiles, 132 SMs): 32 splits own one pair each; the floor's 31
    # owned 192 tokens, three blocks, run as two pairs
    assert h(2, sms=132, ctx=4_016, bn=64) == 32
    assert h(4, ctx=2_000) == 47             # ... but not a 2k context (the 256-token floor gave 7 splits)
    from bench.model.split_study import old_rule   # the rule before, as the split study reads it beside this one
    assert old_rule(batch=1, num_kv_heads=1, m_tiles=4, avg_kv_len=2_000, num_sms=188, block_n=16) == 2_000 // 256
    assert old_rule(batch=1, num_kv_heads=1, m_tiles=4, avg_kv_len=185_000, num_sms=188, block_n=16) == 47
    assert h(1, ctx=16_000) == 94            # one node: half a wave, the combine's split loop weighs the whole one
    with pytest.raises(ValueError):
        heuristic_num_splits(batch=1, num_kv_heads=1, m_tiles=4, avg_kv_len=100, num_sms=188, max_waves=0)


def _hopper_v3_on_h200():
    """Hopper's v3 (bf16, page 1) as the model reads it, and the H200; skips where its cubin cannot be read."""
    from bench.model import kernels
    try:
        ks = kernels.load("sm_90a", "mla576", "bf16", "page1")
    except RuntimeError as e:
        pytest.skip(str(e))
    return next(k for k in ks if k.tile.version == 3), devices.get_device("h200")


def test_hopper_v3_splits_and_the_model_count_whole_pairs():
    """Hopper's v3 runs its 64-token blocks in pairs (an odd count runs a phantom block): the heuristic takes the pair
    as its tile (at least one a split: the same 128 tokens as two blocks), and the model rounds a split's blocks up to
    whole pairs (at 10k / 16 nodes, 66 splits own three blocks each: two pairs)."""
    from verify_attn import build as vb
    from verify_attn.config import tile_split_args
    assert vb.V3_SM90_TILE.blocks_per_iter == 2 and vb.V3_ROLES_TILE.blocks_per_iter == 1
    assert tile_split_args(64, 2) == {"block_n": 128, "min_tiles_per_split": 1}
    assert tile_split_args(32, 1) == {"block_n": 32, "min_tiles_per_split": 2}
    with pytest.raises(ValueError, match="blocks_per_iter"):
        tile_split_args(64, 0)
    from bench.model import call
    from verify_attn.shapes import get_shape
    v3, dev = _hopper_v3_on_h200()
    p = call.predict(v3, dev, call.Case(get_shape("kimi-k2-tp8"), 10_000, 16))
    assert p.num_splits == 66 and p.tiles_per_cta == 4, (p.num_splits, p.tiles_per_cta)


def test_best_splits_is_never_slower_than_the_heuristics():
    """`--splits best` takes the heuristic's own count among its candidates: at 4k / 16 nodes on Hopper's v3 every
    wave-filling count passes the 2-tiles-a-split cap, and the list fell back to one split (112 us against auto's
    12.5)."""
    from bench.model import call
    from bench.model.__main__ import best_splits, split_candidates
    from verify_attn.shapes import get_shape
    v3, dev = _hopper_v3_on_h200()
    for ctx in (4_000, 185_000):
        case = call.Case(get_shape("kimi-k2-tp8"), ctx, 16)
        auto = call.predict(v3, dev, case)
        assert auto.num_splits in split_candidates(v3, dev, case)
        best = best_splits(v3, dev, case)
        assert best.total_us <= auto.total_us, (ctx, best.num_splits, best.total_us, auto.total_us)
        assert best.num_splits > 1


def test_split_heuristic_choice_is_the_models_faster_one():
    """The 64-node choice (35 splits, 3 waves) against one wave (11): the SASS model predicts the
    heuristic's pick faster on the RTX PRO 6000 (wave quantization: 176 of 188 SMs busy in one wave)."""
    _tools_or_skip()
    from bench.model import predict

    auto = predict("rtx-pro-6000", ctx=185_000, tree_nodes=64, band=False)
    one_wave = predict("rtx-pro-6000", ctx=185_000, tree_nodes=64, num_splits=11, band=False)
    assert auto and one_wave and auto["num_splits"] == 35, auto
    assert auto["us"] < one_wave["us"], (auto, one_wave)


def test_split_heuristic_short_context_choice_is_the_models_faster_one():
    """At 4k / 16 nodes the heuristic fills a wave (two KV tiles a split or more) instead of stopping at the old
    256-token floor (15 splits: 30-60 CTAs on 132 SMs, each running 5-9 tiles in a row); the SASS model reads the
    heuristic's pick faster on both devices."""
    _tools_or_skip()
    from bench.model import predict

    for dev in ("h200", "rtx-pro-6000"):
        auto = predict(dev, ctx=4_000, tree_nodes=16, band=False)
        floor256 = predict(dev, ctx=4_000, tree_nodes=16, num_splits=4_000 // 256, band=False)
        assert auto and floor256 and auto["num_splits"] > floor256["num_splits"], (auto, floor256)
        assert auto["us"] < floor256["us"], (auto, floor256)


def test_cli_trace_reads_the_simulated_tile(capsys):
    """--trace prints, per kernel and device, the simulated hot tile's cycles and tensor-pipe share (the
    same simulation the prediction uses) and where it waits, with source lines of the kernel."""
    _tools_or_skip()
    import re

    from bench.model.__main__ import main
    assert main(["--arch", "sm_120a", "--ctx", "185k", "--tree", "16", "--kernel", "default", "--trace"]) == 0
    out = capsys.readouterr().out
    m = re.search(r"rtx-pro-6000 .* (\d+) cycles/tile simulated, tensor pipe busy (\d+) \((\d+)%\)", out)
    assert m, out
    cycles, busy = int(m.group(1)), int(m.group(2))
    assert 0 < busy <= cycles and int(m.group(3)) == round(100 * busy / cycles)
    assert re.search(r"\+ +\d+ cyc @ +\d+ +line +\d+", out), out  # warp 0's stalls name their source lines


@pytest.mark.parametrize("arch,head", [("sm_120a", "mla576"), ("sm_120a", "mla576e4m3"), ("sm_90a", "mla576e4m3")])
def test_hot_path_commits_one_copy_group_per_tile(arch, head):
    """Every cp.async tile's hot path issues one tile's copies and commits them once: the two-barrier loop's
    `else loads();` (the last tile, no S) is a cold block. Read as hot, it doubled the path's copies and commits,
    so `DEPBAR.LE SB0, N` waited on the group issued in the same iteration (sm_120's two-barrier 4-stage tile read
    3,356 instead of 1,968 cycles)."""
    _tools_or_skip()
    from bench.model import kernels
    checked = 0
    for km in kernels.load(arch, head, "bf16", "page1"):
        if km.tile.version != 1 or km.tile.loader:
            continue
        ops = [i.op for i in km.hot.instrs]
        assert ops.count("LDGDEPBAR") == 1, (km.name, ops.count("LDGDEPBAR"))
        assert ops.count("DEPBAR") == 1, km.name   # the loop's one cp.async.wait_group
        checked += 1
    assert checked >= 1


@pytest.mark.parametrize("head", ["mla576", "mla576e4m3"])
def test_wgmma_tree_mask_costs_a_bit_test_a_score(head):
    """The wgmma kernels' tree mask (mask_m64_scores: v2, Hopper's v3) builds a row's visibility over the block once
    (64 bits) and tests a bit a score. Built per score (its word, from shared or global memory, then token_visible),
    it cost ~866 instructions a warp on v3's masked pair (v2's tile ~429), and with the O rescale the pair ran 3x the
    hot one's instructions; now ~205 (v2 ~169). The cold path minus the hot one, less its FMULs (the O / P rescale,
    also a cold branch), stays under 320 a warp on both sm_90a wgmma kernels (the per-score code fails it)."""
    _tools_or_skip()
    from collections import Counter
    from bench.model import kernels
    checked = 0
    for km in kernels.load("sm_90a", head, "bf16", "page1"):
        if km.tile.version not in (2, 3) or km.tile.block_m != 64:
            continue
        if getattr(km, "roles_hot", None) is not None:   # Hopper's v3: warpgroup 0's warp (warp 0), one pair
            (hb, hs, *_), (cb, cs, *_) = km.roles_hot, km.roles_cold
            hot, cold = hb[hs[0][0]:hs[0][1]], cb[cs[0][0]:cs[0][1]]
        else:
            hot, cold = km.hot.instrs, km.cold.instrs
        h, c = Counter(i.op for i in hot), Counter(i.op for i in cold)
        extra = sum(c.values()) - sum(h.values()) - (c["FMUL"] - h["FMUL"])
        assert 0 < extra < 320, (km.name, extra)
        checked += 1
    assert checked == 2, checked   # v2 and v3


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
def test_hopper_v3s_phantom_pair_runs_warpgroup_0s_block_alone(kv_dtype):
    """Hopper's v3 runs a pair whose second block lies past the split's end (an odd block count's last pair) without
    a wgmma on that block: the model's phantom path (`sass-model: phantom` / `real` blocks) holds warpgroup 0's S and
    both warpgroups' P0 V, i.e. warpgroup 1 issues no S and neither warpgroup a P1 V. Per pair on the hot path:
    warpgroup 0 S (36 k16 steps; e4m3 18 k32) and 8 P V (4 + 4; e4m3, swapped, 2 k32 steps x 4 m64 tiles of O^T
    each: 8 + 8), warpgroup 1 the same; on the phantom path warpgroup 0 S and 4 P V (e4m3 8), warpgroup 1 4 P V
    (e4m3 8) and no S. The hot and masked paths leave the phantom blocks out."""
    _tools_or_skip()
    from bench.model import kernels, sass
    km = next(k for k in kernels.load("sm_90a", "mla576e4m3" if kv_dtype != "bf16" else "mla576", "bf16", "page1")
              if k.tile.version == 3)
    s_steps, pv_steps = (18, 8) if kv_dtype != "bf16" else (36, 4)

    def gmmas(roles):
        body, spans, *_ = roles
        return [sum(1 for i in body[a:b] if i.op in sass.GMMA_OPS) for a, b in spans[:2]]

    assert gmmas(km.roles_hot) == [s_steps + 2 * pv_steps] * 2, gmmas(km.roles_hot)
    assert gmmas(km.roles_cold) == [s_steps + 2 * pv_steps] * 2, gmmas(km.roles_cold)
    assert gmmas(km.roles_phantom) == [s_steps + pv_steps, pv_steps], gmmas(km.roles_phantom)
    assert km.phantom_reading.instructions < km.hot_reading.instructions


def test_a_file_with_unreadable_kernels_still_gives_the_readable_ones():
    """GQA 128 bf16: the v0 tiles' copy loop has a thread-dependent trip count (the model cannot read it); the v1
    tile beside them is read, on both archs (its tile fields equal sm_120's e4m3-MMA tile's: the head decides its
    archs), and the left-out kernels are listed with the reason."""
    _tools_or_skip()
    from bench.model import kernels
    for arch in ("sm_120a", "sm_90a"):
        ks = kernels.load(arch, "gqa128", "bf16", "page1")
        v1 = [k for k in ks if k.tile.version == 1]
        assert len(v1) == 1 and v1[0].tile.targets(arch), [k.name for k in ks]
        left = kernels.unreadable(arch, "gqa128", "bf16", "page1")
        assert any("m64 n32 w4 s2" in n for n, _ in left), left     # v0's default tile, on both archs
        assert all(" v1 " not in n and "trip count" in why for n, why in left), left


def test_the_model_reads_the_combine_each_launch_uses():
    """v1 / v2 tiles launch the v1 combine with programmatic dependent launch, except a Dv under its 128 columns per
    warp (GQA 64 with e4m3 caches), which launches v0's (csrc/tree_verify/launch_shape.cuh): the model reads that
    one, and charges its launch without PDL."""
    _tools_or_skip()
    from bench.model import kernels
    d64 = kernels.load("sm_120a", "gqa64e4m3", "bf16", "page1")
    assert d64 and all(k.combine is not None and not k.combine_pdl for k in d64), [k.name for k in d64]
    mla = [k for k in kernels.load("sm_120a", "mla576", "bf16", "page1") if k.tile.version == 1]
    assert mla and all(k.combine is not None and k.combine_pdl for k in mla)


def test_the_model_reads_the_split_kernels_programmatic_launch():
    """Every split kernel waits for the kernel before it first (griddepcontrol.wait, SASS ACQBULK) and is launched with
    programmatic dependent launch (launch_shape.cuh): the model finds the wait in each kernel's SASS and charges its
    launch pdl_launch_us, not launch_us; a kernel without the wait is charged the plain gap."""
    _tools_or_skip()
    from dataclasses import replace
    from bench.model import call, kernels
    from verify_attn.shapes import get_shape
    for arch in ("sm_90a", "sm_120a"):
        ks = kernels.load(arch, "mla576", "bf16", "page1")
        assert ks and all(k.split_pdl for k in ks), [k.name for k in ks if not k.split_pdl]
    km, dev = kernels.load("sm_90a", "mla576", "bf16", "page1")[0], devices.get_device("h200")
    case = call.Case(get_shape("kimi-k2-tp8"), 4_000, 16)
    pdl, plain = call.predict(km, dev, case), call.predict(replace(km, split_pdl=False), dev, case)
    assert plain.launch_us - pdl.launch_us == pytest.approx(dev.launch_us.value - dev.pdl_launch_us.value)
    assert plain.total_us - pdl.total_us == pytest.approx(dev.launch_us.value - dev.pdl_launch_us.value)


def test_the_v1_combine_shares_a_rows_splits_over_four_warps(tmp_path):
    """The v1 combine gives each (row, 128 columns) a CTA of 4 warps, each streaming its share of the splits 8 at a
    time (`sass-model: split-loop splits=8 warps=4`): the model reads the marker and charges each warp's share, not
    the row's, plus the barrier where the warps' sums meet. v0's combine keeps one warp a row. An unknown marker
    field is refused."""
    _tools_or_skip()
    from dataclasses import replace
    from bench.model import call, kernels
    from verify_attn.shapes import get_shape
    mla = [k for k in kernels.load("sm_90a", "mla576", "bf16", "page1") if k.tile.version == 1]
    assert mla and all((k.combine_split_warps, k.combine_splits_per_iter) == (4, 8) for k in mla)
    d64 = kernels.load("sm_120a", "gqa64e4m3", "bf16", "page1")
    assert all(k.combine_split_warps == 1 for k in d64)
    km, dev = mla[0], devices.get_device("h200")
    case = call.Case(get_shape("kimi-k2-tp8"), 185_000, 16)
    four, one = call.combine_us(km, dev, case, 66), call.combine_us(replace(km, combine_split_warps=1), dev, case, 66)
    assert four < 0.75 * one   # 3 groups a warp, not 9
    assert call.combine_us(km, dev, case, 1) == 0.0
    src = tmp_path / "k.cuh"
    src.write_text("for (;;) {  // sass-model: split-loop splits=8 lanes=4\n}\n")
    with pytest.raises(ValueError, match="unknown sass-model marker field 'lanes'"):
        analysis.read_markers(str(src))
