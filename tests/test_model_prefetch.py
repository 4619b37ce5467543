"""bench.model on L2 prefetches (prefetch.global.L2 -> CCTL.E.PF2): the class, the simulator's Prefetch (a copy of a
prefetched line lands the L2 latency after its request, or when the prefetch lands), and kernel v2's reading.
No GPU: the simulator and the build's cubins where the toolkit is here."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.model import analysis, devices, sass, sim
from test_model import _sass, _tools_or_skip

H200 = devices.get_device("h200")
LAT = H200.dram_latency_cycles
ROOT = Path(__file__).resolve().parents[1]

COPIES = "\n".join(f"2|LDGSTS.E.BYPASS.128 [R3+0x{16 * k:x}], desc[UR4][R4.64+0x{16 * k:x}]" for k in range(4))
MATH = "\n".join(f"3|FFMA R{40 + k}, R{40 + k}, 1.5, R{40 + k}" for k in range(40))


def _body(prefetch: bool) -> list[sass.Instr]:
    """One iteration: wait for the copies of the iteration before (cp.async.wait_group 0 after this iteration's
    commit would wait for its own), 4 copies, (prefetch) one prefetch, the commit, some math, a barrier."""
    text = "\n".join(["1|DEPBAR.LE SB0, 0x0", "1|BAR.SYNC.DEFER_BLOCKING 0x0", COPIES,
                      *(["2|CCTL.E.PF2 [R6]"] if prefetch else []), "2|LDGDEPBAR", MATH, "4|BRA `(.L_x_0)"])
    return sass.parse(_sass(text, "/x.cuh"))["_Z6kernelv"].instrs


def _pf(ahead: int, **kw) -> sim.Prefetch:
    return sim.Prefetch(ahead=ahead, share=kw.get("share", 1.0), bytes=kw.get("bytes", 4 * 16 * 32),
                        dram_bytes_per_clk=kw.get("dram", 16.0), l2_latency=kw.get("l2", 265.0))


def test_prefetch_is_classed_and_needs_its_spec():
    body = _body(True)
    pf = next(i for i in body if i.op == "CCTL")
    assert analysis.classify(pf) == "l2_prefetch"
    # a cache-control instruction that is not a prefetch stays ALU work
    inval = sass.parse(_sass("1|CCTL.IVALL\n1|BRA `(.L_x_0)", "/x.cuh"))["_Z6kernelv"].instrs[0]
    assert analysis.classify(inval) != "l2_prefetch"
    with pytest.raises(ValueError, match="sim.Prefetch"):
        sim.simulate(body, H200, warps=2, warps_per_barrier_group=2, cp_bytes_per_clk=4.0)
    with pytest.raises(ValueError, match="ahead"):
        sim.simulate(body, H200, warps=2, warps_per_barrier_group=2, cp_bytes_per_clk=4.0, prefetch=_pf(0))


def test_copies_of_prefetched_lines_land_at_the_l2_latency():
    """Without prefetches each iteration waits for the last one's copies: the loaded DRAM latency a tile. With the
    rows prefetched two iterations ahead the copies come from L2 (265 cycles) and the math binds; prefetched only
    one iteration ahead, the copy waits for the prefetch, which is still in flight: the tile sits in between."""
    run = dict(warps=2, warps_per_barrier_group=2, cp_bytes_per_clk=16.0)
    stream = 2 * 4 * 512 / 16.0     # both warps' copies of an iteration at the scheduler's 16 B/clk
    plain = sim.simulate(_body(False), H200, **run)
    assert plain.cycles_per_iter == pytest.approx(LAT + stream, rel=0.25)   # + the copies' LSU issue
    body = _body(True)
    ahead2 = sim.simulate(body, H200, **run, prefetch=_pf(2))
    # the DRAM latency replaced by the L2's, plus the prefetches' own LSU time (2 x 47 cycles)
    assert ahead2.cycles_per_iter == pytest.approx(plain.cycles_per_iter - LAT + 265, rel=0.2)
    ahead1 = sim.simulate(body, H200, **run, prefetch=_pf(1))
    assert ahead2.cycles_per_iter < ahead1.cycles_per_iter < plain.cycles_per_iter
    # the prefetches' own bytes stream at the DRAM share: too slow a share binds the tile however far ahead
    slow = sim.simulate(body, H200, **run, prefetch=_pf(4, dram=0.5))
    assert slow.cycles_per_iter == pytest.approx(2 * 2048 / 0.5, rel=0.1)
    # each prefetch takes the LSU like 32 cp.async requests (the lane share scales it)
    t = sim.instr_timing(next(i for i in body if i.op == "CCTL"), H200, LAT)
    assert t.pipe == "mio" and t.interval == pytest.approx(32 * H200.ldgsts_cycles_per_chunk.value * 4)


def test_the_prefetch_distance_is_the_traits():
    """bench.model reads kernel v2's prefetch distance from verify_attn.build.V2_PREFETCH; the kernel's is
    KernelTraitsV2::kPrefetch (csrc/tree_verify/traits.h): the two must agree."""
    from verify_attn import build as vb
    traits = (ROOT / "csrc" / "tree_verify" / "traits.h").read_text()
    m = re.search(r"static constexpr int kPrefetch = (\d+);", traits)
    assert m and int(m.group(1)) == vb.V2_PREFETCH


def test_kernel_v2_is_read_with_its_prefetches():
    """The build's v2 tile (sm_90a): its hot loop has the L2 prefetches (rows and indices), the model reads them with
    the traits' distance, and the 185k reading is no longer bound by the DRAM latency: the central reading moves by
    less than 5% across the latency's whole range (it moved ~25% before the prefetches)."""
    _tools_or_skip()
    from dataclasses import replace

    from bench.model import call, kernels
    from verify_attn import build as vb
    from verify_attn.shapes import get_shape
    head = "mla576"
    try:
        ks = kernels.load("sm_90a", head, "bf16", "page1")
    except (RuntimeError, LookupError, FileNotFoundError) as e:
        pytest.skip(f"no sm_90a cubins: {e}")
    km = next(k for k in ks if k.tile == vb.default_tile(head, "sm_90a"))
    assert km.tile.version == 2
    assert sum(analysis.classify(i) == "l2_prefetch" for i in km.hot.instrs) >= 2
    case = call.Case(get_shape("kimi-k2-tp8"), 185000, 16, 1, "page1", 1)
    lat = H200.dram_latency_ns
    lo, hi = (call.predict(km, replace(H200, dram_latency_ns=replace(lat, value=v)), case).total_us
              for v in (lat.lo, lat.hi))
    assert abs(hi - lo) < 0.05 * lo, (lo, hi)
