"""The SASS model's reading of sm_90a wgmma (HGMMA): parser, classes, operand bytes, the asynchronous
tensor pipe and commit-group waits of the simulator, and the ceiling probe's real HGMMA loop.

Synthetic SASS checks each mechanism on a known answer computed from the device constants; the probe
kernels of csrc/ceilings/mma_peak.cu are read where nvcc and the SASS tools exist (skipped otherwise).
"""
from __future__ import annotations

import pytest

from bench.model import analysis, devices, sass, sim
from test_model import _sass, _tools_or_skip

H200 = devices.get_device("h200")


def _instrs(body: str) -> list[sass.Instr]:
    return sass.parse(_sass(body, "/x.cuh"))["_Z6kernelv"].instrs


def _one(text: str) -> sass.Instr:
    return _instrs(f"1|{text}")[0]


def _per_iter(body: str, warps: int = 1, dev=H200) -> sim.SimResult:
    return sim.simulate(_instrs(body), dev, warps=warps, warps_per_barrier_group=1, iters=8)


def test_hgmma_operands_shape_and_classes():
    rs = _one("HGMMA.64x256x16.F32.BF16 R24, R152, gdesc[UR4].tnspB, R24, UP1, gsb0")
    ss = _one("HGMMA.64x32x16.F32 R24, gdesc[UR8], R24")
    f16acc = _one("HGMMA.64x8x16.F16 RZ, gdesc[URZ], RZ, !UPT, gsb0")
    assert sass.hgmma_shape(rs.opcode) == (64, 256, 16) and sass.hgmma_shape(ss.opcode) == (64, 32, 16)
    # D / C: N / 2 fp32 registers per thread; A (RS): 4 registers; the descriptor quad UR4..UR7
    assert rs.dsts == [("R24", 128)]
    assert rs.srcs == [("R152", 4), ("UR4", 4), ("R24", 128), ("UP1", 1)]
    assert ss.dsts == [("R24", 16)] and ss.srcs == [("UR8", 4), ("R24", 16)]
    assert f16acc.dsts == [] and f16acc.srcs == []
    assert not analysis.hgmma_a_from_smem(rs) and analysis.hgmma_a_from_smem(ss)
    kinds = {analysis.classify(_one(t)) for t in ("WARPGROUP.ARRIVE", "WARPGROUP.DEPBAR.LE gsb0, 0x1",
                                                   "FENCE.VIEW.ASYNC.S")}
    assert analysis.classify(rs) == "hgmma" and kinds == {"wg_arrive", "wg_depbar", "fence_async"}
    assert sim.wgmma_wait_depth(_one("WARPGROUP.DEPBAR.LE gsb0, 0x1")) == 1
    assert sim.wgmma_wait_depth(_one("WARPGROUP.ARRIVE")) is None
    with pytest.raises(ValueError, match="gsb0, K"):
        sim.wgmma_wait_depth(_one("WARPGROUP.DEPBAR.LE 0x1"))
    with pytest.raises(ValueError, match="MxNxK"):
        sass.hgmma_shape("HMMA.16816.F32.BF16")


def test_qgmma_reads_as_hgmma_with_twice_the_flops():
    """wgmma .e4m3 (QGMMA.64xNx32): the same operands, bytes and pipe time per instruction as a 16-bit HGMMA of
    the same N (32 bytes of K per row), twice its FLOPs; it closes a commit group with gsb0 like an HGMMA; and a
    tile built on it is judged at the datasheet's fp8 rate."""
    from bench.model import call

    q = _one("QGMMA.64x256x32.F32.E4M3.E4M3 R24, R168, gdesc[UR8], R24, gsb0")
    h = _one("HGMMA.64x256x16.F32.BF16 R24, R168, gdesc[UR8], R24, gsb0")
    assert sass.hgmma_shape(q.opcode) == (64, 256, 32) and analysis.classify(q) == "hgmma"
    assert q.dsts == h.dsts and q.srcs == h.srcs
    assert analysis.smem_bytes(q) == analysis.smem_bytes(h) and analysis.hgmma_flops(q) == 2 * analysis.hgmma_flops(h)
    ss = _one("QGMMA.64x32x32.F32.E4M3.E4M3 R152, gdesc[UR4], R152")
    assert analysis.hgmma_a_from_smem(ss) and analysis.smem_bytes(ss) == ((32 * 32 + 64 * 32) // 4, 0)
    fp8 = call.tensor_rate_tflops(H200, wgmma=True, qgmma=True)
    assert fp8 == pytest.approx(2 * call.tensor_rate_tflops(H200, wgmma=True))
    sq = _per_iter("1|QGMMA.64x256x32.F32.E4M3.E4M3 R24, R168, gdesc[UR8], R24, gsb0\n2|WARPGROUP.DEPBAR.LE gsb0, 0x0")
    sh = _per_iter("1|HGMMA.64x256x16.F32.BF16 R24, R168, gdesc[UR8], R24, gsb0\n2|WARPGROUP.DEPBAR.LE gsb0, 0x0")
    assert sq.cycles_per_iter == pytest.approx(sh.cycles_per_iter)


@pytest.mark.parametrize("n", [32, 64, 256])
def test_hgmma_smem_bytes_per_warp(n):
    """B is N rows x 32 bytes of K per warpgroup instruction, A (SS form) 64 x 32; each of the 4 warps
    is charged a quarter (the warpgroup reads each operand once)."""
    rs = _one(f"HGMMA.64x{n}x16.F32.BF16 R24, R152, gdesc[UR4], R24, gsb0")
    ss = _one(f"HGMMA.64x{n}x16.F32.BF16 R24, gdesc[UR4], R24, gsb0")
    assert analysis.smem_bytes(rs) == (n * 16 * 2 // 4, 0)
    assert analysis.smem_bytes(ss) == ((n * 16 * 2 + 64 * 16 * 2) // 4, 0)
    assert analysis.hgmma_flops(rs) == 2 * 16 * n * 16


def test_hgmma_pipe_time_from_the_datasheet_rate():
    """One warp's 16 x N x 16 share at a quarter of the SM's datasheet (wgmma) rate: N / 2 cycles on the
    H200 (4096 FLOP/clk/SM); asynchronous, completing hgmma_latency after its pipe time. The RTX PRO 6000
    (sm_120) has no wgmma: an HGMMA there is an error, not a silent guess."""
    rate = H200.datasheet_mma_flop_per_clk_sm.value / H200.schedulers
    for n, cyc in ((32, 16.0), (256, 128.0)):
        tm = sim.instr_timing(_one(f"HGMMA.64x{n}x16.F32.BF16 R24, R152, gdesc[UR4], R24, gsb0"), H200, 0)
        assert tm.interval == pytest.approx(2 * 16 * n * 16 / rate) == pytest.approx(cyc)
        assert tm.wgmma and tm.pipe == "tensor" and tm.latency == H200.hgmma_latency.value
        assert tm.operand_smem == pytest.approx(n * 32 / 4 / (H200.smem_bytes_per_clk_sm.value / H200.schedulers))
    c = H200.constants()["hgmma_latency"]
    assert c["kind"] in ("published", "derived", "measured", "assumed") and len(c["source"]) > 40
    with pytest.raises(ValueError, match="no wgmma"):
        sim.instr_timing(_one("HGMMA.64x64x16.F32.BF16 R24, R152, gdesc[UR4], R24"),
                         devices.get_device("rtx-pro-6000"), 0)


def _chain(k: int, n: int, wait: int, ss: bool = False, commit_each: bool = False) -> str:
    """A loop of k HGMMAs (m64nNk16) into one accumulator: one commit group closed by the last (or every
    HGMMA its own group, each followed by DEPBAR.LE wait), then DEPBAR.LE wait."""
    a = "" if ss else "R200, "
    lines = [".L_x_1:", "2|WARPGROUP.ARRIVE"]
    for j in range(k):
        last = commit_each or j == k - 1
        lines.append(f"3|HGMMA.64x{n}x16.F32.BF16 R24, {a}gdesc[UR4], R24{', gsb0' if last else ''}")
        if commit_each:
            lines.append(f"3|WARPGROUP.DEPBAR.LE gsb0, 0x{wait:x}")
    if not commit_each:
        lines.append(f"4|WARPGROUP.DEPBAR.LE gsb0, 0x{wait:x}")
    lines.append("2|@P0 BRA `(.L_x_1)")
    return "\n".join(lines)


def test_a_chain_in_flight_runs_at_the_tensor_pipe_rate():
    """16 dependent N = 256 HGMMAs per commit group, one group in flight while the next is issued
    (DEPBAR.LE 1): the accumulator is no scoreboard dependency, so the pipe never idles -- one warp per
    scheduler reaches the datasheet rate within a few %."""
    res = _per_iter(_chain(16, 256, wait=1))
    pipe = 16 * H200.hgmma_interval(256)
    assert res.cycles_per_iter == pytest.approx(pipe, rel=0.02)
    assert res.utilization("tensor") > 0.98
    tflops = 16 * 2 * 16 * 256 * 16 * H200.schedulers * H200.sms.value * H200.clock_hz / res.cycles_per_iter / 1e12
    peak = H200.datasheet_mma_flop_per_clk_sm.value * H200.sms.value * H200.clock_hz / 1e12
    assert tflops == pytest.approx(peak, rel=0.03)
    # the warp issued the whole chain at once: HGMMAs of one group issue on consecutive cycles
    hg = [t for t, _, i in res.trace if _instrs(_chain(16, 256, wait=1))[i].op == "HGMMA"]
    assert max(b - a for a, b in zip(hg, hg[1:])) <= 1.0


def test_waiting_on_every_hgmma_is_latency_bound():
    """Each HGMMA its own group followed by DEPBAR.LE 0: every one waits out its pipe time and its
    completion latency before the next issues. One warp: exactly interval + latency + the issue slots
    (ARRIVE, HGMMA, DEPBAR, BRA) per iteration; two warps overlap one's wait with the other's pipe time."""
    iv, lat = H200.hgmma_interval(64), H200.hgmma_latency.value
    one = _per_iter(_chain(1, 64, wait=0))
    assert one.cycles_per_iter == pytest.approx(iv + lat + 3)
    busy = _per_iter(_chain(16, 64, wait=1))
    waits = _per_iter(_chain(16, 64, wait=0, commit_each=True))
    assert waits.cycles_per_iter >= 16 * (iv + lat)
    assert waits.cycles_per_iter > 1.5 * busy.cycles_per_iter
    assert waits.utilization("tensor") < 0.65 < 0.95 < busy.utilization("tensor")
    two = _per_iter(_chain(1, 64, wait=0), warps=2)
    assert two.cycles_per_iter < 2 * one.cycles_per_iter


def test_wait_depth_keeps_k_groups_in_flight():
    """DEPBAR.LE 1 after each single-HGMMA group lets the next group's pipe time cover the previous
    completion latency; DEPBAR.LE 0 does not. (A device whose completion latency is below the N = 64 pipe time,
    20 < 32 cycles, so that one group in flight covers it; the H200's measured 58 needs two.)"""
    from dataclasses import replace
    dev = replace(H200, hgmma_latency=devices.Const(20, "assumed", "a test device: completion below the pipe time"))
    lat = dev.hgmma_latency.value
    w0 = _per_iter(_chain(4, 64, wait=0, commit_each=True), dev=dev)
    w1 = _per_iter(_chain(4, 64, wait=1, commit_each=True), dev=dev)
    assert w0.cycles_per_iter - w1.cycles_per_iter >= 3 * lat
    assert w1.cycles_per_iter == pytest.approx(4 * dev.hgmma_interval(64), rel=0.15)
    # the H200's measured latency (58 > 32): one group in flight no longer hides it, two do
    h1 = _per_iter(_chain(4, 64, wait=1, commit_each=True))
    h2 = _per_iter(_chain(4, 64, wait=2, commit_each=True))
    assert h1.cycles_per_iter > 1.3 * h2.cycles_per_iter


def test_hgmma_operands_stream_through_shared_memory():
    """SS form, N = 32: A + B = (64 + 32) x 32 bytes per warpgroup, a quarter per warp over the scheduler's
    32 B/clk share, longer than the 16-cycle pipe time: the chain runs at the shared-memory rate and the
    call model would name it smem-bound; the RS form (B only) stays at the pipe rate."""
    share = H200.smem_bytes_per_clk_sm.value / H200.schedulers
    ss_cycles = (64 + 32) * 32 / 4 / share
    assert ss_cycles > H200.hgmma_interval(32)
    ss = _per_iter(_chain(16, 32, wait=1, ss=True))
    rs = _per_iter(_chain(16, 32, wait=1))
    assert ss.cycles_per_iter == pytest.approx(16 * ss_cycles, rel=0.05)
    assert rs.cycles_per_iter == pytest.approx(16 * H200.hgmma_interval(32), rel=0.05)
    assert ss.pipe_busy["smem_async"] == pytest.approx(16 * ss_cycles)
    assert ss.pipe_busy["smem_async"] >= 0.9 * ss.cycles_per_iter  # what tile_cost's "smem" term names


def test_mma_sync_paths_do_not_change():
    """HMMA timing is untouched by the wgmma path (the mma.sync kernels' readings stay bit-for-bit)."""
    h = _one("HMMA.16816.F32.BF16 R0, R4, R8, R0")
    tm = sim.instr_timing(h, H200, 0)
    assert (tm.pipe, tm.interval, tm.latency, tm.wgmma) == ("tensor", H200.hmma_interval,
                                                            H200.hmma_latency.value, False)
    assert analysis.classify(h) == "hmma" and analysis.smem_bytes(h) == (0, 0)


# ------------------------------------------------------------------ the real probe loop (nvcc + SASS tools)

def test_wgmma_probe_loop_is_read_and_runs_at_the_datasheet_rate():
    """csrc/ceilings/mma_peak.cu's wgmma_peak_kernel (sm_90a): per loop iteration kWgKSteps HGMMA.64x<kWgN>x16
    (the constants read from the source), one commit group, one DEPBAR, B from shared memory; predicted
    within 3% of 4096 FLOP/clk/SM x 132 SMs x clock. The latency probe (DEPBAR.LE 0 after each) is
    latency-bound: N / 2 + hgmma_latency and a few issue slots per round."""
    _tools_or_skip()
    from bench.model import probes
    k = probes.probe_constants()
    n, steps = k["kWgN"], k["kWgKSteps"]
    loops = probes.read("sm_90a")
    r = probes.find(loops, "wgmma_peak_kernel").reading
    assert r.hgmma == steps and r.hgmma_n == {n: steps} and r.hgmma_groups == 1 and r.wgmma_waits == 1
    assert r.classes.get("wg_arrive") == 1 and r.hmma == 0
    assert r.smem_read_bytes == r.hgmma_smem_bytes == steps * n * 16 * 2 // 4  # B only: A is in registers
    assert r.hgmma_flops == steps * 2 * 16 * n * 16
    preds = {p.name: p for p in probes.predict(H200)}
    peak = H200.datasheet_mma_flop_per_clk_sm.value * H200.sms.value * H200.clock_hz / 1e12
    wg = preds["wgmma_tflops"]
    assert wg.value == pytest.approx(peak, rel=0.03) and wg.value <= peak and wg.bound == "tensor"
    lat = {m: preds[f"wgmma_latency_cycles[N={m}]"] for m in (64, 256)}
    for m, p in lat.items():
        assert p.bound == "latency"
        assert H200.hgmma_interval(m) + H200.hgmma_latency.value < p.value < H200.hgmma_interval(m) + \
            H200.hgmma_latency.value + 16
    assert lat[256].value - lat[64].value == pytest.approx(H200.hgmma_interval(256) - H200.hgmma_interval(64))
    # the mma.sync probe is read too: at the device's mma.sync-class rate
    assert preds["mma_sync_tflops"].value == pytest.approx(H200.mma_tflops, rel=0.03)


def test_wgmma_operand_probe_is_read_shared_memory_bound_below_n64_with_a_from_shared_memory():
    """csrc/ceilings/mma_peak.cu's wgmma_operand_kernel<N, SS>: the SS form's HGMMAs read A through a descriptor and are
    charged A's 2,048 bytes beside B's; with 64 / N accumulators below N = 64 the RS form runs at the tensor rate at
    every N, and the SS form at the shared-memory share of it: N / 2 tensor cycles against (64 + N) / 4 at 128 B/clk,
    0.40 at N = 16, 0.67 at N = 32, the two forms even from N = 64. bench.ceilings measures the same eight kernels."""
    _tools_or_skip()
    from bench.model import probes
    k = probes.probe_constants()
    steps = k["kWgKSteps"]
    loops = probes.read("sm_90a")
    for n in probes.OPERAND_NS:
        chains = 1 if n >= 64 else 64 // n
        for ss in (False, True):
            loop = probes.find(loops, f"wgmma_operand_kernelILi{n}ELb{int(ss)}E")
            r = loop.reading
            assert r.hgmma == steps * chains and r.hgmma_n == {n: steps * chains} and r.hgmma_groups == 1
            hg = [i for i in loop.path.instrs if analysis.classify(i) == "hgmma"]
            assert all(analysis.hgmma_a_from_smem(i) == ss for i in hg)
            assert r.hgmma_smem_bytes == steps * chains * (n * 32 + (2048 if ss else 0)) // 4
    preds = {p.name: p for p in probes.predict(H200)}
    peak = preds["wgmma_tflops"].value
    for n in probes.OPERAND_NS:
        rs, ss = preds[f"wgmma_operand_tflops[RS N={n}]"], preds[f"wgmma_operand_tflops[SS N={n}]"]
        assert rs.bound == "tensor" and rs.value == pytest.approx(peak, rel=0.03)
        expect = min(1.0, (n / 2) / ((64 + n) / 4))
        assert ss.value / rs.value == pytest.approx(expect, abs=0.03)
        assert ss.bound == ("smem" if n < 64 else "tensor")
    # the copies-beside-operands probe by the same constants: SS at N = 64 fills the 128 B/clk, RS half of it
    assert probes.share_ratio(64, True, 0.25, H200) == pytest.approx(1.25)
    assert probes.share_ratio(64, False, 0.25, H200) == pytest.approx(1.0)
    assert probes.share_ratio(64, False, 1.5, H200) == pytest.approx(1.25)  # 64 x 2.5 B/clk on 128
    rates = {p.name.split("[")[1].rstrip("]"): p.value for p in preds.values() if "operand" in p.name}
    share = {"SS N=64": {"both_over_wgmma": 1.26, "operand_bytes": 4096, "copy_bytes": 1024}}
    ops, cps = probes.measured_vs_model({"wgmma_operand_tflops": rates, "smem_share": share}, H200)
    assert "N=16 0.40 (model 0.40)" in ops and "SS N=64 1.26 (model 1.25)" in cps


def test_wgmma_probes_compile_to_nothing_off_sm90(capsys):
    """Built for sm_120a the wgmma kernels hold no HGMMA and no loop: the model reads only the mma.sync
    probe there, and the CLI prints the H200's wgmma readings."""
    _tools_or_skip()
    from bench.model import probes
    from bench.model.__main__ import main
    text = sass.disassemble(probes.probe_cubin("sm_120a"))
    assert "wgmma_peak_kernel" in text and "HGMMA" not in text
    assert not [k for k in probes.read("sm_120a") if "wgmma" in k]
    assert [p.name for p in probes.predict(devices.get_device("rtx-pro-6000"))] == ["mma_sync_tflops"]
    assert main(["--probes", "--arch", "sm_90a"]) == 0
    out = capsys.readouterr().out
    assert "wgmma_tflops" in out and "wgmma_latency_cycles[N=256]" in out


def test_masked_path_honours_the_rare_block_of_a_shared_device_function():
    """v2's and Hopper v3's tree mask is one device function of tree_verify_kernel.cuh (mask_m64_scores), inlined into
    each kernel: the `sass-model: rare` block of its own file (a mask word past the staged ones, from global memory)
    is left out of the masked path, as it was when the loop stood in each kernel's file."""
    from bench.model import kernels
    try:
        ks = kernels.load("sm_90a", "mla576", "bf16", "page1")
    except RuntimeError as e:
        pytest.skip(str(e))
    wg = [k for k in ks if k.tile.version in (2, 3)]
    assert len(wg) == 3   # v2, Hopper's v3 on one CTA and as a 2-CTA cluster
    for k in wg:
        assert not any(i.op == "LDG" for i in k.cold.instrs), k.name
