"""Shared-memory bank conflicts derived from the kernels' own address arithmetic (bench.model.banks), and charged
as wavefronts by the simulator.

tests/data/bank_patterns.cu holds access patterns with known degrees, among them kernel v2's first partial-score
exchange (a thread's 16 floats side by side: 4-way, what ncu counted on the H200) and its fixed layout; a
planted unpadded ldmatrix pitch (8-way) against the kernels' padded one. They are compiled for sm_90a and
read like the kernels (needs nvcc and the SASS tools; skipped otherwise)."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.model import banks, devices, sass, sim
from test_model import _sass, _tools_or_skip

HERE = Path(__file__).resolve().parent
H200 = devices.get_device("h200")


@pytest.fixture(scope="module")
def patterns(tmp_path_factory):
    _tools_or_skip()
    import subprocess

    from verify_attn import build as vb
    cubin = tmp_path_factory.mktemp("banks") / "bank_patterns.cubin"
    r = subprocess.run([vb.nvcc_path(), *vb.NVCC_FLAGS, "-cubin", "-arch=sm_90a", f"-I{vb.CSRC}",
                        str(HERE / "data" / "bank_patterns.cu"), "-o", str(cubin)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    funcs = sass.parse(sass.disassemble(cubin))

    def degrees(part: str) -> dict[str, set]:
        (f,) = [fn for n, fn in funcs.items() if part in n]
        out: dict[str, set] = {}
        for a in banks.conflicts(f, warps=4).values():
            assert a.resolved or a.opcode == "STS", (part, a)   # the ldmatrix kernels' fill loop is a runtime stride
            if a.resolved:
                out.setdefault(a.opcode, set()).add(a.degree)
        return out
    return degrees


def test_float4_strides_give_their_degrees(patterns):
    assert patterns("f4_store_loadILi16E") == {"STS.128": {1.0}, "LDS.128": {1.0}}
    assert patterns("f4_store_loadILi32E") == {"STS.128": {2.0}, "LDS.128": {2.0}}
    assert patterns("f4_store_loadILi64E") == {"STS.128": {4.0}, "LDS.128": {4.0}}


def test_v2s_first_exchange_is_caught_at_four_way_and_the_fix_at_none(patterns):
    """The review's finding, and ncu's (13.4M conflicts, ~4 wavefronts per exchange access, H200 2026-12-04)."""
    assert patterns("v2_exchangeILb0E") == {"STS.128": {4.0}, "LDS.128": {4.0}}
    assert patterns("v2_exchangeILb1E") == {"STS.128": {1.0}, "LDS.128": {1.0}}


def test_a_removed_padding_is_caught_at_eight_way(patterns):
    """ldmatrix rows at a 1,024-byte pitch (no padding) put all eight rows of a matrix in the same banks."""
    assert patterns("ldsm_rowsILi1024E")["LDSM.16.M88.4"] == {8.0}
    assert patterns("ldsm_rowsILi1168E")["LDSM.16.M88.4"] == {1.0}


def test_wavefronts_by_phase():
    lanes = tuple(range(32))
    assert banks.wavefronts("LDS", 16, tuple(16 * t for t in lanes)) == (4, 4)      # 4 phases of 8 lanes
    assert banks.wavefronts("LDS", 16, tuple(64 * t for t in lanes)) == (16, 4)     # 4-way in every phase
    assert banks.wavefronts("LDS", 4, tuple(4 * t for t in lanes)) == (1, 1)
    assert banks.wavefronts("LDS", 4, tuple(0 for _ in lanes)) == (1, 1)            # one word: a broadcast
    assert banks.wavefronts("LDS", 4, tuple(128 * t for t in lanes)) == (32, 1)     # one bank, 32 words
    assert banks.wavefronts("LDS", 8, tuple(8 * t for t in lanes)) == (2, 2)        # 2 phases of 16 lanes


def test_the_simulator_charges_wavefronts():
    body = "1|LDS.128 R20, [R30]\n1|LDS.128 R24, [R30+0x10]\n2|BRA `(.L_x_0)"
    ins = sass.parse(_sass(body, "/x.cuh"))["_Z6kernelv"].instrs
    free = sim.simulate(ins, H200, warps=1, warps_per_barrier_group=1)
    four = sim.simulate(ins, H200, warps=1, warps_per_barrier_group=1, bank_degree={ins[0].addr: 4.0})
    assert four.pipe_busy["mio"] == pytest.approx(free.pipe_busy["mio"] * 5 / 2)


def test_the_shipped_kernels_read_as_the_profiler_saw_them():
    """v2's exchange (fixed layout) is conflict-free and every access of its tile resolved; v1's sm_90 score
    stores are 2-way (ncu: 3.3M store conflicts in 6.85M wavefronts on the H200)."""
    _tools_or_skip()
    from bench.model import kernels
    from verify_attn import build as vb
    ks = {k.tile.version: k for k in kernels.load("sm_90a", "mla576", "bf16", "page1")
          if k.tile in (vb.default_tile("mla576", "sm_90a"), vb.VERSION_DEFAULT_TILE[("mla576", "sm_90a", 1)])}
    v2, v1 = ks[2], ks[1]
    hot2 = {i.addr for i in v2.hot.instrs}
    assert not any(a in hot2 for a in v2.bank_degree) and v2.bank_unresolved == 0
    stores = [i for i in v1.hot.instrs if i.op == "STS" and i.addr in v1.bank_degree]
    assert stores and all(v1.bank_degree[i.addr] == 2.0 for i in stores)
