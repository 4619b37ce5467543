"""The model's bulk copies (cp.async.bulk -> UBLKCP, the TMA unit) and mbarrier waits (SYNCS): read off the SASS
(tests/data/bulk_copy_loop.cu, compiled here for sm_90a and sm_120a), classified, their per-lane waterfall loop
expanded, their size read where the SASS sets it; simulated off the LSU (one TMA request and a hold of the issuing
warp per copy, the bytes streaming and landing like cp.async's) with `SYNCS.PHASECHK...TRYWAIT` holding its warp
until the copies of the tile it waits for landed. The constants come from the bulk-copy probe's H200 run
(tests/data/bulk_issue_probe.cu, tests/data/bulk_issue_probe_h200.json)."""
from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from bench.model import analysis, devices, sass, sim
from test_model import _sass, _tools_or_skip

HERE = Path(__file__).resolve().parent
H200 = devices.get_device("h200")
LAT = H200.dram_latency_cycles
HOLD = H200.bulk_issue_cycles.value
TMA = H200.bulk_copy_cycles.value


@pytest.fixture(scope="module")
def fixture_funcs(tmp_path_factory):
    """{arch: {function name: sass.Function}} of tests/data/bulk_copy_loop.cu."""
    _tools_or_skip()
    from verify_attn import build as vb
    out = {}
    for arch in ("sm_90a", "sm_120a"):
        cubin = tmp_path_factory.mktemp("bulk") / f"bulk_copy_loop_{arch}.cubin"
        r = subprocess.run([vb.nvcc_path(), "-lineinfo", "-cubin", f"-arch={arch}",
                            str(HERE / "data" / "bulk_copy_loop.cu"), "-o", str(cubin)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        out[arch] = sass.parse(sass.disassemble(cubin))
    return out


def _fixture_path(funcs, part: str, lanes: int = 32) -> analysis.TilePath:
    src = str(HERE / "data" / "bulk_copy_loop.cu")
    (f,) = [fn for n, fn in funcs.items() if part in n]
    mk = analysis.read_markers(src)
    return analysis.tile_path(f, analysis.find_loop(f, mk.tile_loops, src), mk.cold, src, bulk_lanes=lanes)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
def test_the_fixture_loops_are_read_and_classified(fixture_funcs, arch):
    """Both kernels' tile loops: the waterfall loop around UBLKCP expanded once per copying lane (32), the try_wait
    retry loop once; UBLKCP a bulk copy, SYNCS.ARRIVE an arrive, SYNCS.PHASECHK...TRYWAIT a wait that writes its
    predicate (the `@!P0 BRA` after it reads it); nothing of them read as ALU work. bulk_simple's size is an
    immediate (`UMOV UR4, 0x48`: 72 x 16 B = 1,152 B), bulk_ring's a kernel argument (the caller's)."""
    funcs = fixture_funcs[arch]
    for part, size in (("bulk_simple", 1152), ("bulk_ring", None)):
        path = _fixture_path(funcs, part)
        r = analysis.read_tile(path)
        assert len(path.waterfalls) == 1 and path.waterfalls[0][2] == 32 and len(path.wait_loops) == 1, part
        assert r.bulk_copies == 32 and r.bulk_lanes == 32 and r.mbar_waits == 1 and r.mbar_arrives == 1, part
        assert list(path.bulk_sizes.values()) == [size], part
        assert r.bulk_size_source() == ("sass" if size else "caller")
        assert sorted(set(path.bulk_lane)) == [-1, *range(32)]
        for ins in path.instrs:
            if ins.op in ("SYNCS", "UBLKCP", "ELECT"):
                assert analysis.classify(ins) not in ("int", "fp32"), ins.opcode
        wait = next(i for i in path.instrs if analysis.classify(i) == "mbar_wait")
        assert "TRYWAIT" in wait.mods and wait.regs_written() == ["P0"]
        copy = next(i for i in path.instrs if i.op == "UBLKCP")
        assert copy.regs_written() == [] and len(copy.regs_read()) == 5   # [URd, URd+1], [URs, URs+1], size
    # mbarrier.init outside the loop: SYNCS.EXCH, an mbarrier operation
    (f,) = [fn for n, fn in funcs.items() if "bulk_simple" in n]
    assert any(analysis.classify(i) == "mbar" and "EXCH" in i.mods for i in f.instrs)


def test_bulk_copy_size_is_read_where_the_sass_sets_it():
    """The size operand counts 16-byte units: an immediate moved to it, or bytes shifted right by 4; a value loaded
    at run time is the caller's (None)."""
    body = """
        1|UMOV UR4, 0x48
        1|UBLKCP.S.G [UR8], [UR6], UR4
        2|IMAD.MOV.U32 R6, RZ, RZ, 0x240
        2|SHF.R.U32.HI R6, RZ, 0x4, R6
        2|R2UR UR5, R6
        2|UPRMT UR5, UR5, 0x5410, URZ
        2|UBLKCP.S.G [UR8], [UR6], UR5
        3|LDC R7, c[0x0][0x22c]
        3|SHF.R.U32.HI R7, RZ, 0x4, R7
        3|R2UR UR9, R7
        3|UBLKCP.S.G [UR8], [UR6], UR9
    """
    f = sass.parse(_sass(body, "/x.cuh"))["_Z6kernelv"]
    idx = [k for k, i in enumerate(f.instrs) if i.op == "UBLKCP"]
    assert [analysis.bulk_copy_size(f, k) for k in idx] == [1152, 576, None]


def _loop(copies: str, math: str = "", wait: bool = True) -> list[sass.Instr]:
    """One loop iteration: `copies`, then `math`, then (wait) a try_wait and its retry branch, then a barrier."""
    tail = ["3|SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR11], R17", "3|@!P0 BRA `(.L_x_9)"] if wait else []
    text = "\n".join(x for x in [copies, math, *tail, "4|BAR.SYNC.DEFER_BLOCKING 0x0", "4|BRA `(.L_x_0)", ".L_x_9:",
                                 "5|EXIT"] if x)
    ins = sass.parse(_sass(text, "/x.cuh"))["_Z6kernelv"].instrs
    return [i for i in ins if i.op != "EXIT"]


def _waterfall(lanes: int, size_units: int = 0x48) -> tuple[list[sass.Instr], list[int]]:
    """nvcc's loop around one UBLKCP per copying lane (the fixture's SASS), expanded `lanes` times, with its lane
    tags (what analysis.tile_path produces)."""
    it = ["2|@P0 ELECT P2, URZ, PT", "2|@P2 R2UR UR8, R8", "2|@P2 R2UR UR9, R9", "2|@P2 R2UR UR10, R18",
          "2|@P2 PLOP3.LUT P0, PT, P2, PT, PT, 0x8, 0x0", "2|PLOP3.LUT P2, PT, PT, PT, PT, 0x8, 0x0",
          "2|UBLKCP.S.G [UR10], [UR8], UR4", "2|@P0 BRA.U.ANY `(.L_x_4)"]
    head = [f"1|UMOV UR4, 0x{size_units:x}", "1|SYNCS.ARRIVE.TRANS64 RZ, [UR11], R6"]
    return "\n".join(head + it * lanes), [-1] * len(head) + [k for k in range(lanes) for _ in it]


def _bulk(body: list[sass.Instr], lane_of: list[int], size: int = 1152, **kw) -> sim.Bulk:
    addrs = {i.addr for i in body if i.op == "UBLKCP"}
    lane_of = lane_of + [-1] * (len(body) - len(lane_of))
    return sim.Bulk(sizes=tuple((a, float(size)) for a in sorted(addrs)), lane_of=tuple(lane_of), **kw)


def test_bulk_copies_take_far_less_lsu_time_than_cp_async():
    """The same 36,864 bytes a tile (32 rows of 1,152 B): 32 UBLKCP (one per row) against 2,304 16-byte cp.async
    (72 LDGSTS.128 warp instructions). The cp.asyncs hold the LSU 2,304 x 0.37 SM cycles; the bulk copies take the
    TMA unit 32 x 3.28 and no LSU time; both land the same bytes in shared memory."""
    copies, lanes = _waterfall(32)
    bulk_body = _loop(copies, wait=False)
    cp_body = _loop("\n".join(f"2|LDGSTS.E.BYPASS.128 [R3+0x{16 * (k % 64):x}], desc[UR4][R4.64+0x{16 * k:x}]"
                              for k in range(72)) + "\n2|LDGDEPBAR", wait=False)
    b = sim.simulate(bulk_body, H200, warps=1, warps_per_barrier_group=1, bulk=_bulk(bulk_body, lanes))
    c = sim.simulate(cp_body, H200, warps=1, warps_per_barrier_group=1)
    lsu_cp = c.pipe_busy["mio"]
    assert lsu_cp == pytest.approx(2304 * H200.ldgsts_cycles_per_chunk.value * H200.schedulers)
    assert b.pipe_busy.get("mio", 0.0) == 0.0
    assert b.pipe_busy["tma"] == pytest.approx(32 * TMA * H200.schedulers)
    assert b.pipe_busy["tma"] < 0.15 * lsu_cp
    assert b.pipe_busy["smem_async"] == pytest.approx(c.pipe_busy["smem_async"])
    # issuing them costs the one warp the measured 52-cycle waterfall iteration per copy: still half the LSU's
    assert b.cycles_per_iter == pytest.approx(32 * 52.0, rel=0.08)
    assert b.cycles_per_iter < 0.6 * c.cycles_per_iter


def test_the_model_reads_the_probe_waterfall_as_measured():
    """devices.bulk_issue_cycles is the probe's 52.0-cycle waterfall iteration less the model's own reading of the
    loop's other instructions; the TMA unit's rate is the probe's 32-warp one: the probe's file says both."""
    probe = json.loads((HERE / "data" / "bulk_issue_probe_h200.json").read_text())
    rows = {(r["ctas"], r["warps"], r["lanes"], r["size"], r["rounds"], r["dram"]): r for r in probe["rows"]}

    def per_copy(ctas, warps, lanes, size, r1, r2, key="issue_cycles", dram=0):
        a, b = rows[(ctas, warps, lanes, size, r1, dram)], rows[(ctas, warps, lanes, size, r2, dram)]
        return (b[key] - a[key]) / (b["copies_per_cta"] - a["copies_per_cta"])

    one_lane = per_copy(1, 1, 1, 16, 64, 128)                 # a round of one copy
    rounds32 = 32 * per_copy(1, 1, 32, 16, 16, 32)           # a round of 32 copies
    iteration = (rounds32 - one_lane) / 31
    assert iteration == pytest.approx(52.0, abs=0.3)
    assert per_copy(1, 1, 32, 1152, 8, 16) == pytest.approx(per_copy(1, 1, 32, 16, 16, 32), rel=0.01)  # any size
    assert per_copy(132, 32, 32, 16, 16, 32, "done_cycles") == pytest.approx(TMA, abs=0.02)
    assert per_copy(1, 32, 32, 16, 16, 32, "done_cycles") == pytest.approx(TMA, abs=0.02)
    # the model's reading of the loop without the hold
    no_hold = replace(H200, bulk_issue_cycles=devices.Const(0.0, "assumed", "test"))

    def model(lanes):
        copies, tags = _waterfall(lanes, 1)
        body = _loop(copies, wait=False)
        return sim.simulate(body, no_hold, warps=1, warps_per_barrier_group=1,
                            bulk=_bulk(body, tags, 16)).cycles_per_iter
    rest = (model(32) - model(1)) / 31
    assert rest == pytest.approx(15.0, abs=0.5)
    assert HOLD == pytest.approx(iteration - rest, abs=0.5)


def test_the_wait_holds_the_warp_until_the_copies_land():
    """16 rows copied by warp 0's lanes 0-15, a few ALU instructions, the try_wait, a barrier; warp 1 of the CTA copies
    nothing and waits on the same phase. Waiting for this iteration's copies (distance 0) costs the issue, the
    rows' stream and the loaded latency every tile: latency-bound, not issue-bound. Waiting for the copies of
    three iterations earlier (a deeper ring) hides most of it."""
    copies, lanes = _waterfall(16)
    math = "\n".join(f"2|FFMA R{40 + k}, R{40 + k}, 1.5, R{40 + k}" for k in range(8))
    body = _loop(copies, math)
    stream = 4.0   # bytes per clock of a scheduler's quarter share of DRAM: the one loader scheduler streams 4x

    def run(d, warps=2, **kw):
        return sim.simulate(body, H200, warps=warps, warps_per_barrier_group=warps, cp_bytes_per_clk=stream,
                            bulk=_bulk(body, lanes, lanes=(16, 0), wait_distance=d, issuing_schedulers=1, **kw))
    issue = 16 * 52.0
    r0 = run(0)
    expect = 52.0 + 16 * 1152 / (4 * stream) + LAT  # the first row's issue, the rows' stream (behind it), the latency
    assert r0.cycles_per_iter == pytest.approx(expect, rel=0.06)
    assert r0.cycles_per_iter > 2 * issue
    # the non-loader warp 1 waited for warp 0's copies: both finish each iteration after the copies landed
    for k in range(1, r0.iters):
        assert r0.per_warp_finish[1][k] - r0.per_warp_finish[0][k] < 50
    r3 = run(3)
    assert r3.cycles_per_iter < 0.5 * r0.cycles_per_iter
    assert r3.cycles_per_iter == pytest.approx(max(issue, 16 * 1152 / (4 * stream), expect / 3), rel=0.15)
    # without the wait the same loop is bound by the copies' issue
    nowait = _loop(copies, math, wait=False)
    free = sim.simulate(nowait, H200, warps=2, warps_per_barrier_group=2, cp_bytes_per_clk=stream,
                        bulk=_bulk(nowait, lanes, lanes=(16, 0), issuing_schedulers=1))
    assert free.cycles_per_iter == pytest.approx(issue, rel=0.08)


def test_bulk_copies_need_their_spec_and_a_sound_wait_distance():
    copies, lanes = _waterfall(2)
    body = _loop(copies)
    with pytest.raises(ValueError, match="sim.Bulk"):
        sim.simulate(body, H200, warps=1, warps_per_barrier_group=1)
    # a wait placed before the copies cannot wait for its own iteration's copies
    waits_first = sass.parse(_sass("\n".join(["3|SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR11], R17", copies,
                                              "4|BAR.SYNC.DEFER_BLOCKING 0x0", "4|BRA `(.L_x_0)"]),
                                   "/x.cuh"))["_Z6kernelv"].instrs
    with pytest.raises(ValueError, match="wait_distance"):
        sim.simulate(waits_first, H200, warps=1, warps_per_barrier_group=1,
                     bulk=_bulk(waits_first, [-1] + lanes, wait_distance=0))
    assert sim.simulate(waits_first, H200, warps=1, warps_per_barrier_group=1,
                        bulk=_bulk(waits_first, [-1] + lanes)).cycles_per_iter > LAT   # default: the previous one
    # TMA operations the model does not time are refused, not read as ALU work: a tensor-map store
    tma = sass.parse(_sass("1|UTMASTG.2D [UR4], [UR8]\n1|BRA `(.L_x_0)", "/x.cuh"))["_Z6kernelv"].instrs
    assert analysis.classify(tma[0]) == "tma_other"
    with pytest.raises(ValueError, match="not modelled"):
        sim.simulate(tma, H200, warps=1, warps_per_barrier_group=1)
    # a tensor-map load (a box) is a bulk copy whose size is in the tensor map, not the SASS: it needs sim.Bulk
    box = sass.parse(_sass("1|UTMALDG.2D [UR8], [UR4]\n1|BRA `(.L_x_0)", "/x.cuh"))["_Z6kernelv"].instrs
    assert analysis.classify(box[0]) == "bulk_copy"
    with pytest.raises(ValueError, match="sim.Bulk"):
        sim.simulate(box, H200, warps=1, warps_per_barrier_group=1)


def test_a_ring_fixture_is_bound_by_its_copies_not_its_math(fixture_funcs):
    """bulk_ring<4, 32> (sm_90a): iteration it loads tile it + 3's row indices (LDG), issues its 32 rows (warp 0's
    lanes) and waits for tile it's, issued 3 iterations earlier; its math is 4 FFMAs. Its tile costs the index
    load's round trip and then the rows' issue by the one loader warp (the copies' source addresses wait for the
    index), far above its instructions' issue; with the wait three tiles behind, the copies' landing is hidden."""
    path = _fixture_path(fixture_funcs["sm_90a"], "bulk_ring")
    sizes = tuple((a, 1152.0) for a in path.bulk_sizes)
    per_sm = H200.dram_bytes_per_clk / H200.sms.value

    def run(d):
        return sim.simulate(path.instrs, H200, warps=2, warps_per_barrier_group=2, cp_bytes_per_clk=per_sm / 4,
                            bulk=sim.Bulk(sizes=sizes, lane_of=tuple(path.bulk_lane), lanes=(32, 0), wait_distance=d,
                                          issuing_schedulers=1))
    r3 = run(3)
    assert r3.cycles_per_iter == pytest.approx(LAT + 32 * 52.0, rel=0.08)
    assert r3.cycles_per_iter > 5 * len(path.instrs)
    # waiting for this iteration's own copies adds their stream and landing
    r0 = run(0)
    assert r0.cycles_per_iter == pytest.approx(LAT + 52.0 + 32 * 1152 / per_sm + LAT, rel=0.08)


def test_paths_without_bulk_copies_simulate_as_before():
    """A cp.async loop simulates to the same cycles with or without an (unused) Bulk spec: the bulk machinery
    changes nothing for kernels without UBLKCP."""
    body = _loop("\n".join(f"2|LDGSTS.E.BYPASS.128 [R3+0x{16 * k:x}], desc[UR4][R4.64+0x{16 * k:x}]"
                           for k in range(4)) + "\n2|LDGDEPBAR\n3|DEPBAR.LE SB0, 0x0", wait=False)
    a = sim.simulate(body, H200, warps=2, warps_per_barrier_group=2, cp_bytes_per_clk=4.0)
    b = sim.simulate(body, H200, warps=2, warps_per_barrier_group=2, cp_bytes_per_clk=4.0,
                     bulk=sim.Bulk(sizes=()))
    assert a.cycles_per_iter == b.cycles_per_iter and a.pipe_busy == b.pipe_busy


def test_a_bulk_loader_tile_of_the_build_is_read():
    """The v1 bulk-loader tiles (label 'bulk', sm_90a), where the build has them: the hot tile's bulk copies are
    read (one per row of the tile, copied by warp 0's first BN lanes, 1,152 B each from the SASS) and predicted."""
    _tools_or_skip()
    from bench.model import call as predict, kernels
    from verify_attn.shapes import get_shape
    try:
        ks = [k for k in kernels.load("sm_90a", "mla576", "bf16", "page1") if "bulk" in k.name]
    except (RuntimeError, LookupError) as e:   # the kernel source mid-edit
        pytest.skip(f"the build does not read: {e}")
    if not ks:
        pytest.skip("no bulk-loader tile in this build")
    case = predict.Case(get_shape("kimi-k2-tp8"), 185_000, 16)
    for km in ks:
        r = km.hot_reading
        assert r.bulk_copies == km.tile.block_n and r.mbar_waits >= 1, km.name
        assert set(r.bulk_sizes.values()) == {1152} and r.bulk_size_source() == "sass", km.name
        p = predict.predict(km, H200, case)
        assert p.total_us > 0 and any(n.startswith("bulk copies") for n in p.notes), km.name
