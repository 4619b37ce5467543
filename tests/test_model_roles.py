"""bench/model/roles.py + sim.RoleSpec: a warp-specialized kernel read without markers.

tests/data/warp_roles.cu (compiled here for sm_90a, never launched) is the structure of FlashMLA's sparse prefill in
small: warpgroup 2 a producer (setmaxnreg.dec 40, 16-byte cp.asyncs, cp.async.mbarrier.arrive.noinc on "full"),
warpgroups 0 and 1 math warps (setmaxnreg.inc 232, try_wait on "full", mma.sync, arrive on "empty", a named barrier
between them). The reader must find the two roles and their warps from the thread-index branch alone, the simulator
must connect them through the barriers (a slow producer makes the math warps wait, and the reading says so), and the
producer's copies must take the LSU apart from the math warps' shared-memory pipe.
"""
from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from bench.model import devices, foreign, kernels, roles, sass, sim, validate
from test_model import _tools_or_skip

HERE = Path(__file__).resolve().parent
H200 = devices.get_device("h200")


@pytest.fixture(scope="module")
def roles_cubin(tmp_path_factory):
    _tools_or_skip()
    from verify_attn import build as vb
    cubin = tmp_path_factory.mktemp("roles") / "warp_roles_sm90a.cubin"
    r = subprocess.run([vb.nvcc_path(), "-lineinfo", "-cubin", "-arch=sm_90a", str(HERE / "data" / "warp_roles.cu"),
                        "-o", str(cubin)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return cubin


def _lsu(cycles: float):
    c = H200.ldgsts_cycles_per_chunk
    return replace(H200, ldgsts_cycles_per_chunk=replace(c, value=cycles, lo=None, hi=None))


def test_roles_are_found_from_the_thread_index_branch(roles_cubin):
    r, found = foreign.read_roles(roles_cubin, "warp_roles_kernel", 384)
    assert [(x.name, x.kind, x.warps, x.maxnreg) for x in found] == [
        ("math 0", "math", tuple(range(8)), 232), ("producer", "producer", (8, 9, 10, 11), 40)]
    math, prod = found
    assert math.copies_per_iter == 0 and math.mma_per_iter > 0
    assert prod.mma_per_iter == 0 and prod.copies_per_iter > 0
    # every copy of a producer iteration fills one of the two stages: 4 chunks a lane a stage
    assert prod.copies_per_iter % 4 == 0
    # the barriers as the SASS names them: full[0], full[1], empty[0], empty[1] of one shared struct
    offs = {roles.barrier_offset(i) for x in found for i in x.path.instrs if i.op in ("SYNCS", "ARRIVES")}
    assert offs == {0, 8, 16, 24}
    assert {roles.named_barrier(i) for i in math.path.instrs if i.op == "BAR"} == {(1, 256, True)}


def test_one_role_without_a_role_branch(roles_cubin):
    """Warps that all reach the same hot loop are one role: read as before (foreign.predict)."""
    f = next(iter(sass.parse(sass.disassemble(roles_cubin)).values()))
    assert len(roles.find_roles(f, 384)) == 2
    # with 256 threads only the two math warpgroups exist: one role, the reading of every warp running one loop
    assert [x.kind for x in roles.find_roles(f, 256)] == ["math"]
    with pytest.raises(ValueError, match="multiple of 32"):
        roles.find_roles(f, 100)


def test_a_slow_producer_makes_the_math_warps_wait(roles_cubin):
    r, found = foreign.read_roles(roles_cubin, "warp_roles_kernel", 384)
    kw = dict(threads=384, grid=132, trips=100, smem=17_000, band=False)
    fast = foreign.predict_roles(r, found, _lsu(0.37), **kw)
    slow = foreign.predict_roles(r, found, _lsu(50.0), **kw)
    (m_fast, p_fast), (m_slow, p_slow) = fast["roles"], slow["roles"]
    assert slow["cycles_per_iter"] > 5 * fast["cycles_per_iter"]
    assert p_slow["bound"] == "lsu"                      # the producer is the limit...
    assert m_slow["bound"] == "waits on the other roles"  # ...and the math warps say they wait for it
    assert m_slow["stall_cycles_per_iter"] > 0.8 * slow["cycles_per_iter"]
    assert p_slow["stall_cycles_per_iter"] < 0.2 * slow["cycles_per_iter"]
    # the scheduler simulated holds CTA warps 0 and 4 (math) and 8 (the producer)
    assert fast["simulated_warps"] == [0, 4, 8]


def test_the_producers_copies_take_the_lsu_not_the_math_warps_shared_memory_pipe(roles_cubin):
    r, found = foreign.read_roles(roles_cubin, "warp_roles_kernel", 384)
    out = foreign.predict_roles(r, found, H200, threads=384, grid=132, trips=100, smem=17_000, band=False)
    math, prod = out["roles"]
    assert prod["pipe_demand"].get("lsu", 0) > 0 and "lsu" not in math["pipe_demand"]
    assert math["pipe_demand"]["mio"] > 0        # the math warps' LDSM
    assert out["pipe_busy"]["lsu"] > 0


def test_role_spec_is_checked():
    body = [sass.Instr(0, "NOP", [], None, None, None)]
    with pytest.raises(ValueError, match="RoleSpec"):
        sim.simulate(body, H200, warps=2, warps_per_barrier_group=2,
                     roles=sim.RoleSpec(((0, 1),), (False,), (0,)))


def test_first_iteration_blocks_are_left_out_of_the_steady_state():
    """FlashMLA's `if (block_idx == 0) { first QK^T }` inside its loop: a branch over a block taken when a counter of
    the loop is not zero runs in the first iteration only."""
    text = """
        .text.k:
        /*0000*/                   MOV R2, RZ ;
.L_x_1:
        /*0010*/                   ISETP.NE.AND P0, PT, R2, RZ, PT ;
        /*0020*/               @P0 BRA `(.L_x_2) ;
        /*0030*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
.L_x_2:
        /*0040*/                   HMMA.16816.F32.BF16 R16, R8, R12, R16 ;
        /*0050*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0060*/                   ISETP.GE.AND P1, PT, R2, R3, PT ;
        /*0070*/              @!P1 BRA `(.L_x_1) ;
        /*0080*/                   EXIT ;
"""
    f = next(iter(sass.parse(text).values()))
    (lp,) = f.loops()
    assert roles.first_iteration_blocks(f, lp) == [(0x30, 0x40)]


def test_validate_lists_flashmla_as_not_reached_without_its_cubins(monkeypatch, tmp_path):
    monkeypatch.setenv("VA_FLASHMLA_DIR", str(tmp_path))
    its = {i.id: i for i in validate._flashmla_items()}
    assert set(its) == {"P-15 FlashMLA sparse", "P-15 FlashMLA dense"}
    for it in its.values():
        assert it.status == "not reached" and "build_flashmla.sh" in it.note and it.observed in (640.0, 660.0)


def test_knockout_bits_are_checked(capsys):
    """`--knockout` reads bench.knockout's timing variants; bits outside 0..31 are refused with the range."""
    from bench.model.__main__ import main
    from verify_attn import build as vb
    with pytest.raises((SystemExit, ValueError)) as e:
        main(["--arch", "sm_90a", "--knockout", "32"])
    msg = str(e.value) + capsys.readouterr().err
    assert "0..31" in msg
    with pytest.raises(ValueError, match="0..31"):
        vb.compile_cubin(vb.instantiation_file("bf16", "mla576", "page1"), "sm_90a", knockout=32)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
def test_our_split_kernels_roles(arch):
    """Every split kernel of the MLA instantiation is one math role with all its warps (read as before), except
    kernel v3: its math warps (loader 4: S warps and PV warps, two roles), then its producer (Tile.loader 2: the last
    warp; loader 3 and 4: the producer warpgroup's four warps, each copying a quarter of the rows, with the
    setmaxnreg counts of each side), found from the SASS alone; Hopper's v3 (Tile.version 3): the two consumer
    warpgroups, then the whole producer warpgroup."""
    from verify_attn import build as vb
    try:
        cubin = vb.compile_cubin(vb.instantiation_file("bf16", "mla576", "page1"), arch)
        funcs = sass.parse(sass.disassemble(cubin))
    except RuntimeError as e:   # no nvcc or SASS tools here
        pytest.skip(str(e))
    seen = 0
    for name, f in funcs.items():
        tile = vb._compiled_tile(name) if "tree_verify_split_kernel" in name else None
        if tile is None or not tile.targets(arch):
            continue
        found = sorted(roles.find_roles(f, tile.num_warps * 32), key=lambda x: x.warps)
        w = tile.warps_m * tile.warps_n   # the math warps
        # (math roles, loader 4: the S warps' loop and the PV warps' loop are two math roles)
        math = ([("math", tuple(range(w // 2))), ("math", tuple(range(w // 2, w)))] if tile.loader == 4
                else [("math", tuple(range(w)))])
        # (a producer warpgroup's four warps each copy a quarter of the rows: one role; Hopper's v3 likewise)
        producer = [("producer", tuple(range(w, w + (4 if tile.loader >= 3 or tile.version == 3 else 1))))]
        want = math + producer if tile.loader >= 2 or tile.version == 3 else math
        assert [(x.kind, x.warps) for x in found] == want, vb._describe(name)[0]
        if tile.loader == 3:   # setmaxnreg.inc 232 on the math side, .dec 40 on the producer's
            assert [x.maxnreg for x in found] == [232, 40], vb._describe(name)[0]
        if tile.loader == 4:   # 20 warps: 112 for both math roles, 32 for the producer
            assert [x.maxnreg for x in found] == [112, 112, 32], vb._describe(name)[0]
        if tile.version == 3:   # kernel v3 for Hopper (sm90/): all four producer warps copy; setmaxnreg 216 / 64
            assert [x.maxnreg for x in found] == [216, 64], vb._describe(name)[0]
        seen += tile.loader >= 2 or tile.version == 3
    # v3's three sm_120 tiles (a producer warp, a producer warpgroup, a producer warpgroup with math roles) and, on
    # sm_90a, Hopper's v3 (two consumer warpgroups and a producer warpgroup), on one CTA and as a 2-CTA cluster
    assert seen == (5 if arch == "sm_90a" else 3)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
@pytest.mark.parametrize("head", ["mla576", "mla576e4m3", "mla576x656"])
def test_setmaxnreg_counts_fit_the_register_pool(arch, head):
    """setmaxnreg.inc waits until the CTA's register pool has the registers: every role's setmaxnreg count (read from
    the SASS) times its threads must fit in what the launch allocated, ptxas's count x the block. Else the math warps
    would wait forever on a GPU; the emulator takes setmaxnreg as a no-op and cannot show it. Every kernel v3 tile
    with a producer warpgroup (LOADER 3 / 4, Hopper's v3) of the MLA heads, on each arch it targets."""
    from verify_attn import build as vb
    try:
        cubin = vb.compile_cubin(vb.instantiation_file("bf16", head, "page1"), arch)
        funcs = sass.parse(sass.disassemble(cubin))
        regs = kernels._resource_usage(cubin)
    except RuntimeError as e:   # no nvcc or SASS tools here
        pytest.skip(str(e))
    seen = 0
    for name, f in funcs.items():
        tile = vb._compiled_tile(name) if "tree_verify_split_kernel" in name else None
        if tile is None or not tile.targets(arch) or not (tile.loader >= 3 or tile.version == 3):
            continue
        found = roles.find_roles(f, tile.num_warps * 32)
        assert found and all(x.maxnreg for x in found), vb._describe(name)[0]
        need = sum(x.maxnreg * 32 * len(x.warps) for x in found)
        assert sum(len(x.warps) for x in found) == tile.num_warps, vb._describe(name)[0]
        assert need <= regs[name] * tile.num_warps * 32, (vb._describe(name)[0], regs[name], need)
        seen += 1
    assert seen == sum(1 for t in vb.TILES[head] if t.targets(arch) and (t.loader >= 3 or t.version == 3))


@pytest.mark.parametrize("loader,math_warps", [(2, 8), (3, 8), (4, 16)], ids=["warp", "warpgroup", "roles"])
@pytest.mark.parametrize("arch,dev", [("sm_120a", "rtx-pro-6000"), ("sm_90a", "h200")])
def test_kernel_v3_is_read_with_its_roles(arch, dev, loader, math_warps):
    """The kernel model reads v3 (Tile.loader 2 and 3) as two roles: its marked tile loop on the math warps, the
    producer warp's loop found from the SASS with one bulk copy per row of the tile (a producer warpgroup: per row of
    its quarter), its rare blocks (a row past the end zero-filled by 72 st.shared) left out; scheduler 0 runs math
    warps 0 and 4 and the producer (warp 8; a producer warpgroup's other warps sit on the other schedulers); with math
    roles (loader 4), S warps 0 and 4, PV warps 8 and 12 (their own loop, marked `pv-loop`) and the producer (warp
    16)."""
    from bench.model import call, kernels
    from verify_attn.shapes import get_shape
    try:
        ks = kernels.load(arch, "mla576", "bf16", "page1")
    except RuntimeError as e:
        pytest.skip(str(e))
    km = next(k for k in ks if k.tile.loader == loader and k.tile.warps_m * k.tile.warps_n == math_warps)
    body, spans, lanes, producer = km.roles_hot
    assert spans[0] == (0, len(km.hot.instrs)) and spans[-1][1] == len(body) and len(spans) == (3 if loader == 4 else 2)
    assert sum(i.op == "UBLKCP" for i in producer.instrs) == km.tile.block_n // kernels.producer_warps(km.tile)
    assert not any(i.op == "STS" for i in producer.instrs)   # the zero-fill is rare
    warps = list(range(0, math_warps + 1, 4))
    assert [call._role_of(km.tile, w, len(spans)) for w in warps] == (
        [0, 0, 1, 1, 2] if loader == 4 else [0] * (len(warps) - 1) + [1])
    assert not any(i.op in ("UBLKCP", "LDGSTS") for i in km.hot.instrs)   # no math warp copies
    case = call.Case(get_shape("kimi-k2-tp8"), 185_000, 16)
    tc = call.tile_cost(km, devices.get_device(dev), path="hot", resident_ctas=1, active_sms=100, dram_sharers=2.0,
                        case=case)
    assert tc.sim.warps == math_warps // 4 + 1 and len(tc.sim.sync_stall) == tc.sim.warps
    assert call.predict(km, devices.get_device(dev), case).total_us > 0


def test_656_rows_on_the_roles_tile_are_read_with_their_roles():
    """The 656-byte rows on the math-roles tile (traits.h k656Roles): the S warps' loop, the PV warps' loop, which now
    does its block's scale work (the tile's largest |scale| by shuffles, P's f16 values to e4m3 fragments), and the
    producer. The model reads it faster than the producer-warpgroup tile that ran these rows before (185k / 16 nodes on
    the RTX PRO 6000: a prediction, as every reading here)."""
    from bench.model import call, kernels
    from verify_attn.shapes import get_shape
    try:
        ks = kernels.load("sm_120a", "mla576x656", "bf16", "page1")
    except RuntimeError as e:
        pytest.skip(str(e))
    roles_km = next(k for k in ks if k.tile.loader == 4)
    wg_km = next(k for k in ks if k.tile.loader == 3)
    body, spans, _, producer = roles_km.roles_hot
    assert len(spans) == 3
    s_path, pv_path = (body[a:b] for a, b in spans[:2])
    assert any(i.op == "SHFL" for i in pv_path) and any(i.op == "F2FP" for i in pv_path)   # the block work, on PV
    assert any(i.op == "QMMA" for i in s_path) and any(i.op == "QMMA" for i in pv_path)
    assert sum(i.op == "UBLKCP" for i in producer.instrs) == 32 // kernels.producer_warps(roles_km.tile)
    case = call.Case(get_shape("kimi-k2-tp8"), 185_000, 16, kv_dtype="fp8_mla656")
    dev = devices.get_device("rtx-pro-6000")
    assert call.predict(roles_km, dev, case).total_us < call.predict(wg_km, dev, case).total_us


def test_kernel_v3_knockout_variants_are_read_with_their_roles():
    """bench.knockout's variants of kernel v3 (its producer honours kKoNoLoad and kKoNoIndex: bits 1 and 2) build, and
    the model still finds both v3 tiles' producer loops in them; without the index ring the producer issues no
    4-byte cp.async, so its loop's copies are the bulk copies alone."""
    from bench.model import kernels
    try:
        ks = kernels.load("sm_120a", "mla576", "bf16", "page1", knockout=3)
    except RuntimeError as e:
        pytest.skip(str(e))
    v3 = [k for k in ks if k.tile.loader >= 2]
    assert sorted(k.tile.loader for k in v3) == [2, 3, 4] and all(k.roles_hot is not None for k in v3)
    for k in v3:
        producer = k.roles_hot[3]
        assert not any(i.op == "LDGSTS" for i in producer.instrs), k.name   # no index ring


def test_the_warp_index_of_a_signed_division_is_evaluated():
    """`tid / 128` of a signed int compiles to SHF.R.S32.HI (the sign), LEA.HI (the rounding term) and SHF.R.S32.HI
    (the shift): Hopper v3's warpgroup index. The role reader evaluates all three for a warp's lane 0 (until
    2026-12-05 it stopped at LEA.HI and read both consumer warpgroups' branches into one path)."""
    env = {}
    def ins(addr, opcode, ops):
        return sass.Instr(addr, opcode, ops, None, None, None, dsts=[(ops[0], 1)])
    prog = [ins(0x0, "S2R", ["R0", "SR_TID.X"]), ins(0x10, "SHF.R.S32.HI", ["R3", "RZ", "0x1f", "R0"]),
            ins(0x20, "LEA.HI", ["R2", "R3", "R0", "RZ", "0x7"]), ins(0x30, "SHF.R.S32.HI", ["R2", "RZ", "0x7", "R2"])]
    for warp, wg in ((0, 0), (3, 0), (4, 1), (7, 1), (11, 2)):
        env = {}
        for ins in prog:
            roles._step(ins, env, warp)
        assert env["R2"] == wg and env["R3"] == 0
    # a negative value: the sign shifted in, and the rounding term of a signed division (-1 / 128 == 0)
    get = roles._getter({"R0": 0xFFFFFFFF, "R3": 0xFFFFFFFF}, 0)
    assert roles._eval(prog[1], get) == 0xFFFFFFFF
    assert roles._eval(prog[2], get) == (0xFFFFFFFF + 127) & 0xFFFFFFFF


def test_hopper_v3_is_read_as_two_warpgroups_and_a_producer():
    """Kernel v3 for Hopper: one tile loop whose body branches on the warpgroup, read as warpgroup 0's part (its S,
    softmax and two P V halves: 36 + 8 wgmma, and the 128-thread named barrier 4 only it uses), warpgroup 1's part
    (36 + 8 wgmma) and the producer warpgroup's loop. Both loops run a pair of blocks an iteration (`tiles=2`): the
    producer refills each stage in two halves, each after its own EMPTY and signalled on its own FULL, so that every
    barrier a consumer waits on is one the producer arrives on, and every one the producer waits on is one a
    warpgroup releases. The per-tile cycles are half the simulated iteration's."""
    from bench.model import call, kernels
    from bench.model.analysis import classify
    from verify_attn.shapes import get_shape
    try:
        ks = kernels.load("sm_90a", "mla576", "bf16", "page1")
    except RuntimeError as e:
        pytest.skip(str(e))
    km = next(k for k in ks if k.tile.version == 3)
    assert km.tiles_per_iter == 2 and kernels.blocks_per_iter(km) == 2
    # the build's Tile (what the backend's split heuristic counts) and the loop's marker (what the model simulates)
    # say the same of every kernel
    assert all(k.tile.blocks_per_iter == kernels.blocks_per_iter(k) for k in ks)
    body, spans, lanes, producer = km.roles_hot
    assert len(spans) == 3 and spans[-1][1] == len(body) and not any(x >= 0 for x in lanes)
    wg0, wg1, prod = (body[lo:hi] for lo, hi in spans)
    gmma = lambda p, n: sum(i.op in sass.GMMA_OPS and f"x{n}x" in i.opcode for i in p)   # noqa: E731
    assert (gmma(wg0, 64), gmma(wg0, 256), gmma(wg1, 64), gmma(wg1, 256)) == (36, 8, 36, 8)
    assert not {i.addr for i in wg0} & {i.addr for i in wg1 if i.op in sass.GMMA_OPS}
    named = lambda p: {roles.named_barrier(i)[:2] for i in p if roles.named_barrier(i)}   # noqa: E731
    assert (4, 128) in named(wg0) and (4, 128) not in named(wg1)
    assert {b for b, _ in named(wg0)} >= {2, 3} and {b for b, _ in named(wg1)} == {2, 3}
    # (a pair: 2 blocks x 36 16-byte copies a thread, 9 dim blocks x 4 tokens)
    assert prod == producer.instrs and sum(i.op == "LDGSTS" for i in prod) == 2 * 36
    assert not any(i.op == "LDGSTS" for i in wg0 + wg1)
    # the L2 prefetch of the next pair: a row a producer thread, its 9 lines; read as 4 producer warps x 9 instructions
    # x 32 lanes naming every line of the pair's 128 rows once, one pair ahead
    assert sum(classify(i) == "l2_prefetch" for i in prod) == 9
    case = call.Case(get_shape("kimi-k2-tp8"), 185_000, 16)
    kv_tile = 64 * 1152 + 4 * 64
    pf = call.prefetch_spec(km, body, case, H200, 35.0, kv_tile)
    assert (pf.ahead, pf.share) == (1, 1.0) and pf.bytes == pytest.approx(2 * kv_tile / (4 * 9))
    offs = lambda p, kind: [roles.barrier_offset(i) for i in p if classify(i) == kind]   # noqa: E731
    full, empty = offs(prod, "mbar_arrive"), offs(prod, "mbar_wait")
    assert len(set(full)) == len(set(empty)) == 4 == len(full) == len(empty)      # 2 stages x 2 halves, once each
    w0, w1 = offs(wg0, "mbar_wait"), offs(wg1, "mbar_wait")
    assert len(w0) == len(w1) == 2 and set(w0) | set(w1) == set(full) and not set(w0) & set(w1)
    r0, r1 = offs(wg0, "mbar_arrive"), offs(wg1, "mbar_arrive")
    assert len(r0) == len(r1) == 2 and set(r0) | set(r1) == set(empty) and not set(r0) & set(r1)
    assert [call._role_of(km.tile, w, 3) for w in (0, 4, 8)] == [0, 1, 2]
    tc = call.tile_cost(km, H200, path="hot", resident_ctas=1, active_sms=132, dram_sharers=2.0, case=case)
    assert tc.sim.warps == 3
    assert tc.terms["simulated"] == pytest.approx(tc.sim.cycles_per_iter / 2)
    assert tc.terms["tensor"] == pytest.approx(tc.sim.pipe_busy["tensor"] / 2)
    # the math warps wait for the copies: a pair takes longer than its tensor work
    assert tc.sim.cycles_per_iter > tc.sim.pipe_busy["tensor"]
    # --trace names each role, its warps and its barrier waits (one simulated warp of each)
    from bench.model.__main__ import role_lines
    lines = role_lines(km, tc.sim, H200.schedulers)
    assert [ln.split(" (")[0].strip() for ln in lines] == [
        "role consumer warpgroup 0", "role consumer warpgroup 1", "role producer"]
    assert "warps 8-11" in lines[2] and all("cycles an iteration at barriers" in ln for ln in lines)
    p = call.predict(km, H200, case)
    assert p.combine_us > 0 and 0 < p.total_us < 1000


def test_barrier_offset_reads_a_register_plus_urz_plus_immediate():
    """`[R2+URZ+0x2fd00]` (a register base, the zero uniform register, an immediate: how ptxas addresses Hopper v3's
    e4m3 consumers' mbarriers) names the barrier at 0x2fd00 like `[UR10+0x2fd00]`; a computed address does not."""
    ins = lambda op: sass.Instr(0, "SYNCS.PHASECHK.TRANS64.TRYWAIT", ["P0", op, "R19"], None, None, None)  # noqa: E731
    assert roles.barrier_offset(ins("[R2+URZ+0x2fd00]")) == 0x2fd00 == roles.barrier_offset(ins("[UR10+0x2fd00]"))
    assert roles.barrier_offset(ins("[R171+URZ]")) is None
    # a register index over a row of barriers (v3 e4m3's producer: its slot) folds onto the row's first
    assert roles.barrier_offset(ins("[R16+UR14+0x32120]")) == 0x32120


def test_hopper_v3_e4m3_is_read_with_its_barriers_and_an_arrive_ahead_producer():
    """Hopper's v3 on e4m3 caches, P V swapped (O^T = V^T P^T): each consumer warpgroup runs its S (18 wgmma
    m64n64k32) and, for both blocks of the pair, 2 k32 steps x 4 m64 tiles of O^T at N = 64 (16 more; no N = 256
    wgmma), V^T's A fragments by ldmatrix .trans and byte permutes (2 blocks x 2 steps x 4 tiles: 16 LDSM and 64 PRMT a
    warpgroup, none in the producer, which no longer transposes). Warpgroup 0 waits on the two blocks' FULL (its S's,
    and block 2i + 1's before its fragments), warpgroup 1 likewise in its real and its phantom pair; both free each
    block (EMPTY) once their fragments are loaded. The producer copies pair i + 2 in iteration i: its noinc FULL
    arrives carry the loop's `arrive-ahead` marker, so the simulation counts them for the consumers' next iteration.
    Every consumer wait names a barrier the producer arrives on, every producer wait one a consumer arrives on (the
    slots' barriers folded onto slot 0's: barrier_offset)."""
    from bench.model import call, kernels
    from bench.model.analysis import classify
    from verify_attn.shapes import get_shape
    try:
        ks = kernels.load("sm_90a", "mla576e4m3", "bf16", "page1")
    except RuntimeError as e:
        pytest.skip(str(e))
    km = next(k for k in ks if k.tile.version == 3)
    body, spans, _, _ = km.roles_hot
    wg0, wg1, prod = (body[lo:hi] for lo, hi in spans)
    qgmma = lambda p, n: sum(i.op in sass.GMMA_OPS and f"x{n}x" in i.opcode for i in p)   # noqa: E731
    assert (qgmma(wg0, 64), qgmma(wg0, 256), qgmma(wg1, 64), qgmma(wg1, 256)) == (34, 0, 34, 0)
    count = lambda p, op: sum(i.op == op for i in p)   # noqa: E731
    assert (count(wg0, "PRMT"), count(wg1, "PRMT"), count(prod, "PRMT")) == (64, 64, 0)
    assert (count(wg0, "LDSM"), count(wg1, "LDSM"), count(prod, "LDSM")) == (16, 16, 0)
    offs = lambda p, kind: [roles.barrier_offset(i) for i in p if classify(i) == kind]   # noqa: E731
    assert None not in offs(body, "mbar_wait") + offs(body, "mbar_arrive")
    noinc = [i for i in prod if i.opcode.startswith("ARRIVES")]
    assert len(noinc) == 2 and {i.line for i in noinc} <= km.arrive_ahead
    full, empty = set(offs(prod, "mbar_arrive")), set(offs(prod, "mbar_wait"))
    assert len(full) == len(empty) == 2 and not full & empty
    assert set(offs(wg0, "mbar_wait")) == set(offs(wg1, "mbar_wait")) == full
    assert set(offs(wg0, "mbar_arrive")) == set(offs(wg1, "mbar_arrive")) == empty
    case = call.Case(get_shape("kimi-k2-tp8"), 185_000, 16, kv_dtype="fp8_e4m3")
    tc = call.tile_cost(km, H200, path="hot", resident_ctas=1, active_sms=132, dram_sharers=2.0, case=case)
    # the copies of pair i + 2 land under pairs i and i + 1: the consumers' FULL waits are a fraction of the pair
    # (they were 3,400 cycles of 6,800 with the arrives counted for the iteration that issued them)
    assert tc.sim.cycles_per_iter < 5500


def test_the_trace_counts_each_roles_shared_memory():
    """`--trace` prints the simulated iteration's shared-memory cycles by kind and by role (sim.SimResult.smem_by_warp):
    the same cycles the tile's "smem" bound adds up. On the bf16 math-roles tile an S warp's ldmatrix of K alone is its
    8 tokens x 288 dims x 2 bytes at the scheduler's quarter of 128 B/clk (144 cycles), a PV warp's is its V slice and
    P (2 KB + 1 KB: 96); the producer's cp.async requests and L2 prefetches are LSU requests, not shared-memory time
    (Hopper's v3: its producer's share is the copies landing, 72 KB a block)."""
    from bench.model import call, kernels
    from bench.model.__main__ import role_lines, smem_line
    from verify_attn.shapes import get_shape
    try:
        ks = kernels.load("sm_90a", "mla576", "bf16", "page1")
    except RuntimeError as e:
        pytest.skip(str(e))
    case = call.Case(get_shape("kimi-k2-tp8"), 185_000, 16)
    km = next(k for k in ks if k.tile.loader == 4)
    tc = call.tile_cost(km, H200, path="hot", resident_ctas=1, active_sms=132, dram_sharers=4.0, case=case)
    s = tc.sim
    issued = sum(d["issued"] for d in s.smem_by_warp)
    landed = sum(d["copies"] + d["operands"] for d in s.smem_by_warp)
    assert issued == pytest.approx(s.pipe_busy["mio"]) and landed == pytest.approx(s.pipe_busy["smem_async"])
    assert tc.terms["smem"] == pytest.approx(issued + landed)
    assert smem_line(s).startswith(f"  shared memory busy {issued + landed:.0f} cycles an iteration")
    sw, pvw, prod = s.smem_by_warp[0], s.smem_by_warp[2], s.smem_by_warp[-1]   # warps 0 (S), 8 (PV), 16 (producer)
    assert sw["issued"] >= 8 * 288 * 2 / 32 and pvw["issued"] >= (2048 + 1024) / 32
    assert sw["copies"] == pvw["copies"] == 0 and prod["copies"] > 0
    assert all("its warps' shared memory" in ln for ln in role_lines(km, s, H200.schedulers))
    v3 = next(k for k in ks if k.tile.version == 3 and k.tile.block_m == 64)
    s3 = call.tile_cost(v3, H200, path="hot", resident_ctas=1, active_sms=132, dram_sharers=2.0, case=case).sim
    prod3 = s3.smem_by_warp[-1]
    assert prod3["issued"] == 0 and prod3["copies"] == pytest.approx(2 * 64 * 1152 / 4 / 32)
    assert s3.pipe_busy["lsu"] > 0 and all(d["operands"] > 0 for d in s3.smem_by_warp[:2])


def test_the_trace_names_the_other_roles_waits():
    """`--trace` lists the stalls of every simulated warp of a warp-role tile, not warp 0's alone (sim.explain_warps,
    from the last iteration's full trace). On Hopper's v3 (bf16) warpgroup 1's warp 4 waits at an mbarrier (its
    stage's FULL halves, refilled after the pair before ended) for a large part of the pair: a limit warp 0's list
    cannot show. Every listed stall is one warp's gap between two of its own issues."""
    from bench.model import call
    from bench.model.__main__ import trace_lines
    from verify_attn.shapes import get_shape
    try:
        ks = kernels.load("sm_90a", "mla576", "bf16", "page1")
    except RuntimeError as e:
        pytest.skip(str(e))
    km = next(k for k in ks if k.tile.version == 3 and k.tile.block_m == 64)
    p = call.predict(km, H200, call.Case(get_shape("kimi-k2-tp8"), 185_000, 16))
    lines = trace_lines(km, H200, p)
    head = lines.index("  the other simulated warps' stalls of 100 cycles or more:")
    others = lines[head + 1:]
    assert others and all(line.startswith("  warp ") for line in others)
    waits4 = [line for line in others if line.startswith("  warp  4 ") and "SYNCS.PHASECHK" in line]
    assert waits4, others
    stall = lambda line: float(line.split("+")[1].split("cyc")[0])   # noqa: E731
    assert max(stall(x) for x in waits4) > 0.1 * p.tile.sim.cycles_per_iter
    # the same gaps the full trace holds: warp 4's stalls sum to less than its simulated iteration
    assert sum(stall(x) for x in others if x.startswith("  warp  4 ")) < p.tile.sim.cycles_per_iter


def test_the_cluster_forward_is_read_as_one_warps_dsmem_copies():
    """Hopper's v3 as a 2-CTA cluster: each CTA's producer copies half of every block's rows and its warp 8 forwards
    them to the peer (18 bulk copies of 4 KB a pair, cp.async.bulk.shared::cluster). The model reads the forward as
    warp 8's alone (one issuing scheduler), landing the SM-to-SM latency (P-08) after it streams, and the peer's rows
    as landing when this CTA's forward does (the two CTAs run the same steps): the shared memory the copies land in is
    the single-CTA kernel's (the same bytes arrive, half by cp.async, half from the peer), the grid has as many CTAs,
    and the pair is shorter, its producer issuing half the cp.asyncs. Before the model knew (2026-12-07) it read the
    forward as all four producer warps' at the DRAM latency: 88.4 and 91.1 us against the single CTA's 81.2."""
    from bench.model import call
    from verify_attn.shapes import get_shape
    try:
        ks = kernels.load("sm_90a", "mla576", "bf16", "page1")
    except RuntimeError as e:
        pytest.skip(str(e))
    single = next(k for k in ks if k.tile.version == 3 and k.tile.cluster == 1)
    pair = next(k for k in ks if k.tile.version == 3 and k.tile.cluster == 2)
    ublk = [i for i in pair.roles_hot[0] if i.op == "UBLKCP"]
    assert len(ublk) == 18 and not any(i.op == "UBLKCP" for i in single.roles_hot[0])
    case = call.Case(get_shape("kimi-k2-tp8"), 185_000, 16)
    ps, pc = call.predict(single, H200, case), call.predict(pair, H200, case)
    assert pc.grid_ctas == ps.grid_ctas and pc.num_splits == ps.num_splits
    copies = lambda p: sum(w["copies"] for w in p.tile.sim.smem_by_warp)   # noqa: E731
    assert copies(pc) == pytest.approx(copies(ps), rel=0.02)
    assert pc.tile.sim.cycles_per_iter < 0.92 * ps.tile.sim.cycles_per_iter


def test_the_steady_state_excludes_the_loops_drain(monkeypatch):
    """The simulated loop's last iterations drain: nothing follows them (a producer `empty_distance` ahead is done, no
    next tile's copies to issue), so they run faster than a tile in the middle of a CTA's 100+. The H200 proxy's
    math-roles tile ran its last iteration in about half a middle one's cycles, and until 2026-12-07 the steady-state
    window ended on it (171.4 us instead of ~186). The window now ends before the drain: the tile's cycles are the
    middle iterations'."""
    _tools_or_skip()
    import statistics

    from bench.model import call, predict
    results = []
    orig = sim.simulate

    def keep(*a, **kw):
        results.append((kw.get("roles"), orig(*a, **kw)))
        return results[-1][1]

    monkeypatch.setattr(sim, "simulate", keep)
    monkeypatch.setattr(call, "_SIM_CACHE", {})
    predict("h200", ctx=185_000, tree_nodes=16, kernel="w20", kv_dtype="bf16", band=False)
    spec, hot = next((r, s) for r, s in results if r is not None)   # the hot path's (the first simulated)
    drain = spec.empty_distance
    ends = [max(f[k] for f in hot.per_warp_finish) for k in range(hot.iters)]
    deltas = [b - a for a, b in zip(ends, ends[1:])]
    middle = deltas[max(1, (hot.iters - drain) // 2) - 1:-drain]   # the window: the later half before the drain
    assert drain >= 2 and deltas[-1] < 0.7 * statistics.median(middle)       # the drain is there, and fast
    assert hot.cycles_per_iter == pytest.approx(statistics.mean(middle), rel=1e-9)
    assert hot.cycles_per_iter > statistics.mean(deltas[len(deltas) // 2:])   # the old window read it short


def _roles_tile_prediction():
    """The bf16 math-roles tile (sm_120's v3, `w20`) as the H200 proxy reads it at 185k / 16 nodes."""
    from bench.model import call
    from verify_attn.shapes import get_shape
    try:
        ks = kernels.load("sm_90a", "mla576", "bf16", "page1")
    except RuntimeError as e:
        pytest.skip(str(e))
    km = next(k for k in ks if k.tile.loader == 4)
    return km, call.predict(km, H200, call.Case(get_shape("kimi-k2-tp8"), 185_000, 16))


def test_a_named_barriers_wait_is_counted_after_it():
    """A named barrier that waits (`bar.sync id, count`) issues at once and holds its warp, so its wait is the gap
    before the warp's next instruction (an mbarrier try-wait issues once its phase completed: the gap before it). The
    roles' barrier waits (`SimResult.sync_stall`, printed by --trace) counted the gap before the barrier, ~1 cycle:
    the math-roles tile's PV warps read "waits 1 cycles an iteration at barriers" while the full trace shows them
    held at P_FULL for a third of the iteration. --trace's stall lines name such a gap by the barrier, not by the
    instruction after it."""
    from bench.model.__main__ import trace_lines
    km, p = _roles_tile_prediction()
    res, body = p.tile.sim, km.roles_hot[0]
    pv = 2   # the simulated warps: 0 and 4 (S), 8 and 12 (PV), 16 (the producer)
    items = [(t, i) for t, x, i in res.full_trace if x == pv]
    after = [items[k + 1][0] - items[k][0] for k in range(len(items) - 1) if sim.holds(body[items[k][1]])]
    assert after and max(after) > 100
    assert res.sync_stall[pv] >= 0.5 * sum(after) and res.sync_stall[pv] > 0.1 * res.cycles_per_iter
    assert not any(sim.holds(i) for i in body if i.op != "BAR")
    assert all(sim.holds(i) == ("ARV" not in i.mods) for i in body if i.op == "BAR")
    lines = trace_lines(km, H200, p)
    pv_stalls = [ln for ln in lines if ln.startswith("  warp  8 +")]
    assert any("BAR.SYNC" in ln for ln in pv_stalls), pv_stalls


def test_the_timeline_splits_each_roles_iteration_by_source_line():
    """--timeline: each simulated warp's last iteration as phases by kernel source line. The phases partition the
    iteration (their cycles add up to the warp's span), a barrier's wait is charged to the barrier's line, each
    phase carries its line's text from this checkout, and a warp whose loop is one call (the producer's `produce()`)
    is split one inline frame further in."""
    from bench.model.__main__ import timeline_lines
    km, p = _roles_tile_prediction()
    lines = timeline_lines(km, H200, p)
    heads = [k for k, ln in enumerate(lines) if ln.startswith("  warp ")]
    assert [lines[k].split(":")[0].strip() for k in heads] == [
        "warp 0 (S warps)", "warp 4 (S warps)", "warp 8 (PV warps)", "warp 12 (PV warps)", "warp 16 (producer)"]
    blocks = [lines[a + 1:b] for a, b in zip(heads, heads[1:] + [len(lines)])]
    for k, block in zip(heads, blocks):
        span = float(lines[k].split("iteration, ")[1].split(" cycles")[0])
        cycles = [float(ln.split("@")[1].split()[1]) for ln in block]
        assert block and sum(cycles) == pytest.approx(span, abs=1.0), lines[k]
        assert all("  | " in ln for ln in block)   # every phase's source line was read
    pv_wait = [ln for ln in blocks[2] if "kPFullBarrier" in ln and "waits BAR.SYNC" in ln]
    assert pv_wait and float(pv_wait[0].split("@")[1].split()[1]) > 100
    producer = blocks[4]
    assert len(producer) > 2 and any("mbarrier_wait(sEmpty" in ln for ln in producer)
    assert any("bulk_copy_g2s" in ln for ln in producer)
