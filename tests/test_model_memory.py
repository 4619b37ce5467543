"""The model's memory mechanisms (from the first H200 run: the copies' cost is not hidden behind math) and its
bands: cp.async occupies the LSU per 16-byte request and holds its address registers, lands after the loaded
latency (and behind the stream of the scheduler's earlier copies), wait_group waits for it, an LDG after
copies returns after them; every prediction comes with a low-high band and the constant that moves it most.
Synthetic SASS checks each mechanism against its known answer; the real cubins where nvcc and the SASS tools
exist."""
from __future__ import annotations

from dataclasses import replace

import pytest

from bench.model import bands, devices, sim
from test_model import _sass, _tools_or_skip
from bench.model import sass

H200 = devices.get_device("h200")
CHUNK = H200.ldgsts_cycles_per_chunk.value * H200.schedulers * 32   # one warp LDGSTS.128: 32 x 16-byte requests


def _instrs(body: str) -> list[sass.Instr]:
    return sass.parse(_sass(body, "/x.cuh"))["_Z6kernelv"].instrs


def _sim(body: str, **kw) -> sim.SimResult:
    return sim.simulate(_instrs(body), H200, warps=1, warps_per_barrier_group=1, iters=8, **kw)


COPIES = "\n".join(f"1|LDGSTS.E.BYPASS.128 [R3+0x{16 * i:x}], desc[UR4][R4.64+0x{16 * i:x}]" for i in range(4))


def test_a_copy_occupies_the_lsu_and_holds_its_address_registers():
    """Four LDGSTS.128 then a rewrite of their address register R4: the rewrite waits for the LSU to take all
    four (4 x 32 requests at the measured cost); rewriting another register does not wait."""
    held = _sim(COPIES + "\n2|IADD3 R4, R4, 0x480, RZ\n2|BRA `(.L_x_0)")
    free = _sim(COPIES + "\n2|IADD3 R9, R9, 0x480, RZ\n2|BRA `(.L_x_0)")
    assert held.cycles_per_iter == pytest.approx(4 * CHUNK, rel=0.05)
    assert held.pipe_busy["mio"] == pytest.approx(4 * CHUNK)
    # the IADD3 issued only once the LSU took the fourth copy; on another register, right after it issued
    assert held.trace[4][0] - held.trace[0][0] >= 4 * CHUNK - 2
    assert free.trace[4][0] - free.trace[3][0] <= 1


def test_a_copy_shares_the_queue_with_shared_memory_loads():
    """An LDS issued after the copies waits behind them (the ncu finding: v2's exchanged scores sat behind its
    own cp.asyncs)."""
    r = _sim(COPIES + "\n2|LDS.128 R20, [R30]\n2|FADD R21, R20, R20\n2|BRA `(.L_x_0)")
    assert r.trace[4][0] - r.trace[0][0] >= 4 * CHUNK - 2


def test_wait_group_waits_for_the_copies_to_land():
    """Copy, commit, wait for all: each iteration waits out the loaded latency; waiting for all but the newest
    group (two in flight) hides most of it."""
    lat = H200.dram_latency_cycles
    body0 = COPIES + "\n2|LDGDEPBAR\n3|DEPBAR.LE SB0, 0x0\n3|BRA `(.L_x_0)"
    body1 = COPIES + "\n2|LDGDEPBAR\n3|DEPBAR.LE SB0, 0x1\n3|BRA `(.L_x_0)"
    w0, w1 = _sim(body0), _sim(body1)
    assert w0.cycles_per_iter == pytest.approx(4 * CHUNK + lat, rel=0.05)
    assert w1.cycles_per_iter < 0.75 * w0.cycles_per_iter
    # on a narrow stream (bytes per clock for this scheduler) the rows land one after the other
    slow = _sim(body0, cp_bytes_per_clk=4.0)
    assert slow.cycles_per_iter == pytest.approx(4 * 512 / 4.0 + CHUNK + lat, rel=0.05)


def test_an_index_load_after_copies_returns_after_them():
    """The KV stream probe: a kv_indices load issued after a warp's copies costs as much one tile ahead as just
    before use; the model returns it no earlier than the copies land."""
    body = COPIES + "\n2|LDGDEPBAR\n2|LDG.E R12, desc[UR4][R20.64]\n3|IADD3 R13, R12, 0x1, RZ\n3|BRA `(.L_x_0)"
    r = _sim(body)
    assert r.cycles_per_iter >= 4 * CHUNK + H200.dram_latency_cycles


def test_copy_share_scales_a_partial_loader():
    """A loader that uses some threads only (the SASS path is every warp's): copy_share scales the LSU time."""
    full = _sim(COPIES + "\n2|IADD3 R4, R4, 0x480, RZ\n2|BRA `(.L_x_0)")
    part = _sim(COPIES + "\n2|IADD3 R4, R4, 0x480, RZ\n2|BRA `(.L_x_0)", copy_share=0.25)
    assert part.pipe_busy["mio"] == pytest.approx(0.25 * full.pipe_busy["mio"])


def test_bands_and_the_uncertainty_rule():
    b = bands.Band(100.0, 80.0, 130.0, "dram_latency_ns", {})
    assert bands.compare(b, bands.Band(90.0, 70.0, 115.0, "x", {})) == "within model uncertainty"   # 10 < 25
    assert bands.compare(b, bands.Band(70.0, 55.0, 90.0, "x", {})) == "gain"
    assert bands.compare(b, bands.Band(130.0, 100.0, 160.0, "x", {})) == "loss"
    assert b.text() == "100.0 [80-130]"
    ranged = bands.ranged_constants(H200)
    assert "dram_latency_ns" in ranged and "sms" not in ranged        # the SM count is exact
    assert all(c.range[0] <= c.value <= c.range[1] for c in ranged.values())


def test_every_reading_carries_a_band_on_real_cubins():
    """A real call: the band brackets the central value, every ranged constant was moved, and moving the
    most sensitive one alone spans the largest range."""
    _tools_or_skip()
    from bench.model import call as predict, kernels
    from verify_attn import build as vb
    from verify_attn.shapes import get_shape
    km = next(k for k in kernels.load("sm_90a", "mla576", "bf16", "page1") if k.tile == vb.default_tile("mla576",
                                                                                                        "sm_90a"))
    case = predict.Case(get_shape("kimi-k2-tp8"), 185_000, 16)
    b = bands.band(km, H200, case)
    assert b.low < b.central < b.high
    assert set(b.swings) == set(bands.ranged_constants(H200))
    spread = {k: abs(hi - lo) for k, (lo, hi) in b.swings.items()}
    assert b.sensitive == max(spread, key=spread.get)
    # a slower DRAM (the latency at the top of its range) never makes the call faster
    lo, hi = b.swings["dram_latency_ns"]
    assert hi >= lo


def test_the_tile_bound_includes_every_resource(monkeypatch):
    """tile_cost's maximum includes the shared-memory bytes that move off the issue path (cp.async landing,
    wgmma operands): a tile whose smem term exceeds its simulated cycles is smem-bound at that term."""
    from bench.model import call as predict
    fake = sim.SimResult(cycles_per_iter=1000.0, issued_per_iter=100.0,
                         pipe_busy={"mio": 400.0, "smem_async": 900.0, "tensor": 500.0}, warps=2, iters=6)
    monkeypatch.setattr(predict, "_simulate", lambda *a, **k: fake)

    class Tile:
        block_n, num_warps, num_stages, block_m = 32, 8, 3, 64

    class Km:
        tile = Tile()
        hot_reading = type("R", (), {"instructions": 100})()
        hot = type("P", (), {"instrs": []})()

    from verify_attn.shapes import get_shape
    case = predict.Case(get_shape("kimi-k2-tp8"), 185_000, 16)
    tc = predict.tile_cost(Km(), H200, path="hot", resident_ctas=1, active_sms=132, dram_sharers=2.0, case=case)
    assert tc.cycles == pytest.approx(1300.0) and tc.bound == "smem"
