"""Host checks of csrc/host (the __host__ __device__ arithmetic the kernels use),
through the pybind11 module verify_attn._host_math (a g++ build, ~1 min the first
time, cached after). Expected values come from independent encodings: the PTX
ISA fragment tables written out here, plain Python partitions, float64 softmax.
"""
from __future__ import annotations

import math
import random
import shutil

import pytest
import torch

from verify_attn import build as vb
from verify_attn import tree as vtree

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                reason="no C++ compiler for the host module")


@pytest.fixture(scope="module")
def hm():
    return vb.load_host_math()


# ---------------------------------------------------------------- fragments ----
# PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type", written
# out as tables: (row, col) of each element of each register.

def _ptx_a(lane, reg, half):
    g, t = lane // 4, lane % 4
    return [(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)][reg][0], \
        [(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)][reg][1] + half


def _ptx_b(lane, reg, half):
    g, t = lane // 4, lane % 4
    return (2 * t + half + (8 if reg else 0), g)


def _ptx_c(lane, idx):
    g, t = lane // 4, lane % 4
    return (g + (8 if idx >= 2 else 0), 2 * t + idx % 2)


def test_mma_fragment_maps_match_ptx(hm):
    for lane in range(32):
        for reg in range(4):
            for half in range(2):
                assert hm.mma_a_rc(lane, reg, half) == _ptx_a(lane, reg, half)
        for reg in range(2):
            for half in range(2):
                assert hm.mma_b_rc(lane, reg, half) == _ptx_b(lane, reg, half)
        for idx in range(4):
            assert hm.mma_c_rc(lane, idx) == _ptx_c(lane, idx)


def test_mma_maps_are_bijections(hm):
    a = {hm.mma_a_rc(l, r, h) for l in range(32) for r in range(4) for h in range(2)}
    b = {hm.mma_b_rc(l, r, h) for l in range(32) for r in range(2) for h in range(2)}
    c = {hm.mma_c_rc(l, i) for l in range(32) for i in range(4)}
    assert a == {(r, c_) for r in range(16) for c_ in range(16)}
    assert b == {(k, n) for k in range(16) for n in range(8)}
    assert c == {(r, c_) for r in range(16) for c_ in range(8)}


def test_ldmatrix_element_map(hm):
    # ldmatrix .m8n8 .b16: thread l holds row l/4, elements 2*(l%4) and +1; .trans transposes
    for lane in range(32):
        for half in range(2):
            assert hm.ldmatrix_rc(lane, half, False) == (lane // 4, 2 * (lane % 4) + half)
            assert hm.ldmatrix_rc(lane, half, True) == (2 * (lane % 4) + half, lane // 4)


def test_kernel_ldmatrix_addressing_lands_on_mma_fragments(hm):
    """What the kernel relies on: ldmatrix_x4 with its per-lane addresses gives
    exactly the mma A fragment (Q, P), the B fragments of two n8 tiles from K rows
    ([n][k] storage), and from V rows via .trans ([k][n] storage)."""
    for lane in range(32):
        for reg in range(4):
            for half in range(2):
                assert hm.ldsm_a_holds(lane, reg, half) == hm.mma_a_rc(lane, reg, half)
                ntile, breg = reg // 2, reg % 2
                k, n = hm.mma_b_rc(lane, breg, half)
                assert hm.ldsm_b_holds(lane, reg, half) == (k, n + 8 * ntile)
                assert hm.ldsm_bt_holds(lane, reg, half) == (k, n + 8 * ntile)


def test_ldmatrix_addresses_are_16_byte_rows(hm):
    # every lane's address is a row start + a multiple of 8 elements (16 B), inside the 16x16 block
    for f in (hm.ldsm_a_addr, hm.ldsm_b_addr, hm.ldsm_bt_addr):
        rows = [f(l) for l in range(32)]
        assert all(0 <= r < 16 and c in (0, 8) for r, c in rows)
        assert len(set(rows)) == 32  # each of the 4 matrices x 8 rows supplied once


# ------------------------------------------------------------------ layouts ----

def test_row_offset_page1_and_paged(hm):
    rnd = random.Random(0)
    for _ in range(200):
        sid, t = rnd.randrange(1 << 20), rnd.randrange(1 << 18)
        assert hm.row_offset(False, sid, t, 1, 576, 0) == sid * 576
        assert hm.index_pos(False, t, 1) == t
        p = rnd.choice([2, 16, 32, 64, 128, 7])
        page = rnd.randrange(1 << 16)
        sb, st = p * 2 * 128, 2 * 128  # [pages, P, Hkv=2, 128]
        assert hm.index_pos(True, t, p) == t // p
        assert hm.row_offset(True, page, t, p, sb, st) == page * sb + (t % p) * st
    # int64: offsets past 2^31 elements do not wrap
    assert hm.row_offset(False, 3_000_000, 0, 1, 1152, 0) == 3_000_000 * 1152


def test_paged_rows_match_gather_of_a_torch_pool(hm):
    # a [pages, P, Hkv, D] pool: row of token t via the policy == pool[ids[t // P], t % P]
    P, H, D = 16, 2, 8
    pool = torch.arange(7 * P * H * D).view(7, P, H, D)
    ids = [5, 0, 3]
    flat = pool.reshape(-1)
    for t in range(3 * P):
        off = hm.row_offset(True, ids[hm.index_pos(True, t, P)], t, P, pool.stride(0), pool.stride(1))
        for h in range(H):
            assert torch.equal(flat[off + h * pool.stride(2): off + h * pool.stride(2) + D], pool[ids[t // P], t % P, h])


# ------------------------------------------------------------------- splits ----

@pytest.mark.parametrize("kv_len", [1, 2, 15, 16, 17, 54, 97, 256, 1000, 4097, 185_000])
@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 64, 264])
@pytest.mark.parametrize("block_n", [16, 32, 64])
def test_split_ranges_partition_the_kv(hm, kv_len, num_splits, block_n):
    ranges = [hm.split_range(kv_len, num_splits, block_n, s) for s in range(num_splits)]
    nonempty = hm.num_nonempty_splits(kv_len, num_splits, block_n)
    covered = []
    for s, (b, e) in enumerate(ranges):
        assert 0 <= b <= e <= kv_len
        if s < nonempty:
            assert e > b, "splits below num_nonempty_splits own tokens"
            assert b % block_n == 0, "a split starts on a tile boundary (only the last tile is ragged)"
        else:
            assert b == e, "trailing splits are empty"
        covered.extend(range(b, e))
        assert hm.num_tiles(b, e, block_n) == -(-(e - b) // block_n)
    assert covered == list(range(kv_len))
    assert nonempty <= num_splits
    assert hm.split_chunk(kv_len, num_splits, block_n) % block_n == 0


# --------------------------------------------------------------------- mask ----

def test_mask_bits_match_pack_mask(hm):
    g = torch.Generator().manual_seed(3)
    for kind, t in (("bushy", 70), ("chain", 33), ("star", 40), ("deep", 100)):
        parents = vtree.random_parents(t, kind, g)
        dense = vtree.ancestor_mask(parents)
        packed = vtree.pack_mask(dense)
        prefix, end = 13, 13 + t
        for i in range(t):
            for j in range(t):
                word = int(packed[i, hm.mask_word_index(j)]) & 0xFFFFFFFF
                assert hm.mask_bit(word, j) == bool(dense[i, j])
                assert hm.token_visible(prefix + j, prefix, end, word) == bool(dense[i, j])
        assert hm.token_visible(5, prefix, end, 0)          # prefix: always visible, no word needed
        assert not hm.needs_mask_word(5, prefix, end)
        assert not hm.token_visible(end, prefix, end, -1)   # past the end: never


def test_tile_needs_mask(hm):
    # prefix 100, end 110, tiles of 32: [64,96) is clean, [96,128) reaches the tree and the end
    assert not hm.tile_needs_mask(64, 32, 100, 110)
    assert hm.tile_needs_mask(96, 32, 100, 110)
    assert hm.tile_needs_mask(0, 32, 0, 5)          # L_b = 0: the whole KV is the tree
    assert not hm.tile_needs_mask(0, 32, 32, 33)


def test_block_visible_bits_match_token_visible(hm):
    """The wgmma kernels' block mask (64 bits a row, from at most three mask words) against the per-token rule, over
    trees wider than three words, blocks that start before, at and inside the tree, ragged ends and empty ranges."""
    g = torch.Generator().manual_seed(5)
    rnd = random.Random(5)
    for t in (1, 5, 31, 32, 33, 64, 65, 100, 200):
        packed = vtree.pack_mask(vtree.ancestor_mask(vtree.random_parents(t, "bushy", g)))
        for _ in range(12):
            prefix = rnd.choice((0, 1, 31, 64, 77, 130))
            kv_len = prefix + t
            end = rnd.choice((kv_len, max(0, kv_len - rnd.randrange(0, t + 1)), prefix))
            i = rnd.randrange(t)
            for tile_begin in sorted({0, max(0, prefix - 64), max(0, prefix - 63), max(0, prefix - 1), prefix,
                                      prefix + 1, prefix + 31, prefix + 32, prefix + 63, prefix + 64, prefix + 100,
                                      max(0, end - 1), rnd.randrange(0, kv_len + 64)}):
                first = hm.mask_window_first_word(tile_begin, prefix)
                words = []
                for k in range(3):
                    w = first + k
                    if hm.mask_window_word_needed(w, prefix, end):
                        assert w < packed.shape[1], "a needed word lies inside the row"
                        words.append(int(packed[i, w]) & 0xFFFFFFFF)
                    else:
                        words.append(0)
                bits = hm.block_visible_bits(tile_begin, prefix, end, *words)
                for o in range(64):
                    tok = tile_begin + o
                    j = tok - prefix
                    word = int(packed[i, hm.mask_word_index(j)]) & 0xFFFFFFFF if prefix <= tok < end else 0
                    want = hm.token_visible(tok, prefix, end, word)
                    assert bool((bits >> o) & 1) == want, (t, prefix, end, tile_begin, o)


def test_the_models_split_tiles_follow_the_kernels_split_ranges_and_masks(hm):
    """bench.model's per-split (hot, cold, phantom) tile counts (call.split_tiles, what the call's slowest CTA is read
    from) against the kernels' own split_range, num_tiles and tile_needs_mask, with v3's pairs: a phantom tile cold,
    or with a phantom path (Hopper's v3) the last pair of an odd count in the third count, its real tile's mask
    aside."""
    from bench.model.call import split_tiles
    rnd = random.Random(9)
    for _ in range(300):
        kv_len = rnd.choice((1, 15, 16, 17, 100, 4016, 16016, rnd.randrange(1, 20000)))
        tree = rnd.randrange(1, min(kv_len, 64) + 1)
        prefix = kv_len - tree
        splits, block_n, per_iter = rnd.randrange(1, 140), rnd.choice((16, 32, 64)), rnd.choice((1, 2))
        phantom = rnd.random() < 0.5
        got = split_tiles(kv_len, prefix, splits, block_n, per_iter, phantom=phantom)
        for s, (hot, cold, ph) in enumerate(got):
            b, e = hm.split_range(kv_len, splits, block_n, s)
            real = hm.num_tiles(b, e, block_n)
            n = -(-real // per_iter) * per_iter
            want_ph = per_iter if phantom and n > real else 0
            want_cold = sum(hm.tile_needs_mask(b + t * block_n, block_n, prefix, e) for t in range(n - want_ph))
            assert (hot, cold, ph) == (n - want_ph - want_cold, want_cold, want_ph), \
                (kv_len, prefix, splits, block_n, per_iter, phantom, s)


# ------------------------------------------------------------------ softmax ----

def _direct(scores):
    s = torch.tensor(scores, dtype=torch.float64)
    m = s.max()
    if m == -math.inf:
        return -math.inf
    return float(m + torch.log2(torch.exp2(s - m).sum()))


def test_online_softmax_matches_direct(hm):
    rnd = random.Random(1)
    for trial in range(50):
        tiles = []
        for _ in range(rnd.randrange(1, 8)):
            tile = [rnd.uniform(-30, 30) for _ in range(rnd.randrange(1, 9))]
            if rnd.random() < 0.3:
                tile = [-math.inf] * len(tile)  # a fully masked tile
            tiles.append(tile)
        m, l = -math.inf, 0.0
        for tile in tiles:
            m, alpha = hm.online_softmax_update(m, max(tile))
            ref = hm.softmax_ref_max(m)
            l = l * alpha + sum(math.exp2(x - ref) for x in tile)
            assert not math.isnan(l) and not math.isnan(alpha)
        want = _direct([x for t in tiles for x in t])
        got = hm.row_lse2(m, l)
        if want == -math.inf:
            assert got == -math.inf and l == 0.0 and hm.row_inv_l(l) == 0.0
        else:
            assert abs(got - want) < 1e-5 * max(1.0, abs(want))


def test_lse_merge_matches_direct(hm):
    rnd = random.Random(2)
    for trial in range(50):
        n = rnd.randrange(1, 10)
        lses = [rnd.uniform(-20, 20) if rnd.random() > 0.25 else -math.inf for _ in range(n)]
        if all(x == -math.inf for x in lses):
            lses[0] = 1.5
        vals = [rnd.uniform(-1, 1) for _ in range(n)]  # one Dv column of each normalised partial
        m, l, acc = -math.inf, 0.0, 0.0
        for x, v in zip(lses, vals):
            m, l, so, sn = hm.lse_merge(m, l, x)
            acc = acc * so + v * sn
        fin = [(x, v) for x, v in zip(lses, vals) if x != -math.inf]
        mx = max(x for x, _ in fin)
        w = [math.exp2(x - mx) for x, _ in fin]
        want_out = sum(wi * v for wi, (_, v) in zip(w, fin)) / sum(w)
        want_lse = mx + math.log2(sum(w))
        assert abs(acc / l - want_out) < 1e-5
        assert abs(hm.row_lse2(m, l) - want_lse) < 1e-5 * max(1.0, abs(want_lse))


# -------------------------------------------------------------- tile table ----

def test_python_tile_table_matches_config_h(hm):
    cpp = hm.tile_configs()
    py = []
    for head, tiles in vb.TILES.items():
        dqk, dv, shared = vb.HEADS[head]
        for t in tiles:
            py.append({"head": head, "dqk": dqk, "dv": dv, "shared_kv": shared, "block_m": t.block_m,
                       "block_n": t.block_n, "warps_m": t.warps_m, "warps_n": t.warps_n,
                       "num_warps": t.num_warps, "num_stages": t.num_stages, "version": t.version, "sn": t.sn,
                       "fp8_mma": t.fp8_mma, "bars": t.bars, "loader": t.loader,
                       "smem_bytes": vb.tile_smem(head, t)})
    assert sorted(cpp, key=str) == sorted(py, key=str)
    targets = {(d["head"], d["block_m"], d["block_n"], d["num_warps"], d["num_stages"]): t.targets("sm_120a")
               for head, tiles in vb.TILES.items() for t in tiles
               for d in [{"head": head, "block_m": t.block_m, "block_n": t.block_n, "num_warps": t.num_warps,
                          "num_stages": t.num_stages}]}
    assert all(d["smem_bytes"] <= hm.smem_limit_sm120 for d in cpp
               if targets[(d["head"], d["block_m"], d["block_n"], d["num_warps"], d["num_stages"])])


def test_lazy_softmax_update_is_exact_and_rescales_rarely(hm):
    # v1's lazy running max: alpha is exactly 1 while a tile stays within 2^slack of the reference,
    # and the finished row (sum of exp2(s - m) with rescales, then m + log2 l) equals the exact LSE.
    import random
    rng = random.Random(7)
    for slack in (0.0, 8.0):
        scores = [rng.gauss(0, 3) + (i / 40.0) for i in range(400)]  # a slowly rising max
        m, l, moves = float("-inf"), 0.0, 0
        for t in range(0, len(scores), 16):
            tile = scores[t:t + 16]
            m_old = m
            m, alpha = hm.lazy_softmax_update(m, max(tile), slack)
            if m_old != float("-inf") and max(tile) <= m_old + slack:
                assert alpha == 1.0 and m == m_old
            else:
                moves += 1
            l = l * alpha + sum(2.0 ** (s - m) for s in tile)
            assert max(2.0 ** (s - m) for s in tile) <= 2.0 ** slack * (1 + 1e-6)
        exact = math.log2(sum(2.0 ** s for s in scores))
        assert abs(m + math.log2(l) - exact) < 1e-4 * max(1.0, abs(exact))
        if slack:
            assert moves <= 3  # the reference moves only when the max rises by > 2^8
    m, alpha = hm.lazy_softmax_update(float("-inf"), float("-inf"), 8.0)  # a fully masked tile: nothing to keep
    assert m == float("-inf") and alpha == 0.0


# ---------------------------------------------------------------- fp8 e4m3 ----

def test_e4m3_decode_matches_torch_on_all_256_codes(hm):
    codes = torch.arange(256, dtype=torch.uint8)
    want = codes.view(torch.float8_e4m3fn).float()
    got = torch.tensor([hm.e4m3_to_float(c) for c in range(256)])
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan) and int(nan.sum()) == 2  # 0x7F, 0xFF
    assert torch.equal(got[~nan], want[~nan])


def test_e4m3_encode_rounds_like_torch(hm):
    """float -> e4m3, round to nearest even: every code, every midpoint between neighbours (ties),
    points just off them, random values over the whole range; then saturation past 448."""
    vals = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    fin = vals[torch.isfinite(vals)].unique()
    mids = (fin[1:] + fin[:-1]) / 2
    g = torch.Generator().manual_seed(5)
    rnd = torch.exp(torch.empty(4000).uniform_(-14, 6.1, generator=g)) * torch.sign(torch.randn(4000, generator=g))
    xs = torch.cat([fin, mids, torch.nextafter(mids, fin[1:]), torch.nextafter(mids, fin[:-1]), rnd,
                    torch.tensor([0.0, -0.0, 1e-30, -1e-30])])
    xs = xs[xs.abs() <= 448]
    want = xs.to(torch.float8_e4m3fn).view(torch.uint8)
    got = torch.tensor([hm.float_to_e4m3(float(x)) for x in xs], dtype=torch.uint8)
    bad = torch.nonzero(got != want).flatten()
    assert bad.numel() == 0, [(float(xs[i]), int(got[i]), int(want[i])) for i in bad[:5]]
    # .satfinite: beyond the largest finite value the code saturates (torch gives NaN there)
    for x, code in [(449.0, 0x7E), (464.0, 0x7E), (1e9, 0x7E), (-500.0, 0xFE), (float("inf"), 0x7E)]:
        assert hm.float_to_e4m3(x) == code, x
    assert hm.float_to_e4m3(float("nan")) == 0x7F


def test_fp8_pv_permutation_is_what_ldmatrix_trans_and_prmt_give(hm):
    """The token order of the fp8 P.V MMA (csrc/host/fp8.h), derived from the ldmatrix .trans .b16
    fragment map and the byte permute, agrees with fp8_pv_token_of_k, which is a permutation."""
    assert sorted(hm.fp8_pv_token_of_k(k) for k in range(32)) == list(range(32))
    assert all(hm.fp8_pv_k_of_token(hm.fp8_pv_token_of_k(k)) == k for k in range(32))
    # V tile: 4 matrices of 8 tokens x 16 bytes (8 b16 columns); a lane sees only dims 2g and 2g + 1,
    # so byte (t, d) = 2t + (d - 2g) is distinct over everything it holds
    for lane in range(32):
        g, c = lane // 4, lane % 4

        def byte(t, d):
            return 2 * t + (d - 2 * g)

        regs = []
        for m in range(4):  # .trans: lane gets b16 column g of rows (tokens) 8m + 2c, 8m + 2c + 1
            t0 = 8 * m + 2 * c
            b = [byte(t0, 2 * g), byte(t0, 2 * g + 1), byte(t0 + 1, 2 * g), byte(t0 + 1, 2 * g + 1)]
            regs.append(b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24)
        for sel, dim in ((hm.PRMT_EVEN_BYTES, 2 * g), (hm.PRMT_ODD_BYTES, 2 * g + 1)):
            for r, (ra, rb) in enumerate(((regs[0], regs[1]), (regs[2], regs[3]))):
                w = hm.prmt_bytes(ra, rb, sel)
                for i in range(4):  # B fragment of m16n8k32: register r, byte i holds k = 4c + i + 16r
                    k = 4 * c + i + 16 * r
                    assert (w >> (8 * i)) & 0xFF == byte(hm.fp8_pv_token_of_k(k), dim), (lane, sel, r, i)


def test_e4m3_to_f16_is_exact_on_all_256_codes_and_q_row_scale(hm):
    codes = torch.arange(256, dtype=torch.uint8)
    want = codes.view(torch.float8_e4m3fn).to(torch.float16)
    got = torch.tensor([hm.e4m3_to_f16_bits(c) for c in range(256)], dtype=torch.int32).to(torch.int16)
    got = got.view(torch.float16)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan) and torch.equal(got[~nan], want[~nan])
    # the f16 path's Q row scale: a power of two >= 1 that brings amax below 2^15
    for amax, s in [(0.0, 1.0), (1.0, 1.0), (32767.0, 1.0), (32768.0, 2.0), (1e6, 32.0), (3e38, 2.0 ** 113),
                    (float("inf"), 1.0)]:
        assert hm.f16_row_scale(amax) == s, amax
    assert math.isnan(hm.f16_row_scale(float("nan")))
