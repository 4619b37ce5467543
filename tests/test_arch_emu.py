"""The device API's emulated operations against their PTX ISA definitions.

csrc/emu/tests/api_kernels.cu holds small kernels written only against
"arch/arch.cuh" (the same API the tree-verify kernels use); they are built as
host C++ with -DVA_EMULATION=1 into a shared library (no torch headers; cached)
and driven here through ctypes with numpy buffers. The tests of PTX semantics
(mma, ldmatrix, shuffles, votes, ids, atomics, math) also run on a GPU when one
is present (marked gpu): the same file built by nvcc, the same expectations,
which checks the emulator against the hardware. The real side of the API is
compiled by nvcc for sm_90a and sm_120a here too (no GPU needed).

The fragment maps used to build expectations are written out below from the
PTX ISA figures, independently of the emulator's C++ (csrc/emu/runtime.cpp).
Build once ~30 s on 2 cores; the tests then take a few seconds.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from verify_attn.backends import cuda_emu

pytestmark = pytest.mark.skipif(not cuda_emu.toolchain_available()[0],
                                reason=f"emulation toolchain: {cuda_emu.toolchain_available()[1]}")

SRC = Path(cuda_emu.CSRC) / "emu" / "tests" / "api_kernels.cu"
C_API = Path(cuda_emu.CSRC) / "emu" / "c_api.cpp"


# ----------------------------------------------------------------- harness ----

class _Entry:
    """Calls the test library's `va_test_*` entry points; subclasses say how (try_call)."""

    def call(self, fn: str, *args) -> None:
        """Run an entry point; raise RuntimeError with the library's message on failure."""
        err = self.try_call(fn, *args)
        if err is not None:
            raise RuntimeError(err)


class Emu(_Entry):
    """ctypes view of the test library; every call raises on an emulator error."""

    def __init__(self, path: Path):
        self.path = path
        self.lib = cuda_emu.load_emu_library(path)

    def register(self, **arrays: np.ndarray) -> None:
        self.lib.va_emu_clear_globals()
        for name, a in arrays.items():
            self.lib.va_emu_register_global(a.ctypes.data, a.nbytes, name.encode())

    def try_call(self, fn: str, *args):
        f = getattr(self.lib, "va_test_" + fn)
        f.restype = ctypes.c_char_p
        conv = [a.ctypes.data_as(ctypes.c_void_p) if isinstance(a, np.ndarray) else ctypes.c_int(a) for a in args]
        r = f(*conv)
        return None if r is None else r.decode()

    def fault(self, what: str, nth: int) -> None:
        assert self.lib.va_emu_set_fault(what.encode(), nth) is None

    def schedule(self, name: str, seed: int = 0) -> None:
        assert self.lib.va_emu_set_schedule(name.encode(), seed) is None

    def landing(self, when: str) -> None:
        assert self.lib.va_emu_set_cp_async_landing(when.encode()) is None

    def stats(self) -> dict:
        out = (ctypes.c_longlong * 7)()
        self.lib.va_emu_stats(out)
        keys = ("launches", "blocks", "threads", "block_syncs", "warp_collectives", "mma", "cp_async_bytes")
        return dict(zip(keys, list(out)))


class Gpu(_Entry):
    """The same entry points built by nvcc, on device buffers: numpy arrays are
    copied to the GPU before the call and back (in place) after it."""

    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))

    def register(self, **arrays: np.ndarray) -> None:  # the hardware checks nothing
        pass

    def try_call(self, fn: str, *args):
        import torch

        f = getattr(self.lib, "va_test_" + fn)
        f.restype = ctypes.c_char_p
        dev = {i: torch.from_numpy(a.view(np.uint8)).cuda() for i, a in enumerate(args) if isinstance(a, np.ndarray)}
        conv = [ctypes.c_void_p(dev[i].data_ptr()) if i in dev else ctypes.c_int(a) for i, a in enumerate(args)]
        r = f(*conv)
        torch.cuda.synchronize()
        for i, t in dev.items():
            args[i].view(np.uint8)[...] = t.cpu().numpy()
        return None if r is None else r.decode()


def nvcc() -> "str | None":
    from verify_attn.build import find_cuda_home

    root = find_cuda_home()
    return str(Path(root) / "bin" / "nvcc") if root else None


def build_gpu_library() -> Path:
    import hashlib
    import subprocess

    import torch

    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}" + ("a" if major >= 9 else "")
    # (every header under csrc: the test kernels include tree_verify's sm90/pv_swap.cuh and host/fp8.h besides arch/)
    headers = sorted(f for ext in ("*.cuh", "*.h", "*.inc") for f in Path(cuda_emu.CSRC).rglob(ext))
    key = hashlib.sha256(SRC.read_bytes() + b"".join(f.read_bytes() for f in headers) + arch.encode()).hexdigest()[:16]
    lib = cuda_emu.cache_root() / f"gpu-api-tests-{key}" / "libva_api_tests_gpu.so"
    if not lib.exists():
        lib.parent.mkdir(parents=True, exist_ok=True)
        cmd = [nvcc(), "-std=c++20", "-O2", "-shared", "-Xcompiler", "-fPIC", f"-I{cuda_emu.CSRC}",
               f"-gencode=arch=compute_{arch},code=sm_{arch}", "-x", "cu", str(SRC), "-o", str(lib)]
        subprocess.run(cmd, check=True)
    return lib


@pytest.fixture(scope="module", params=["emu", pytest.param("gpu", marks=pytest.mark.gpu)])
def dev(request):
    """Where PTX-semantics tests run: the emulator, and the GPU when present."""
    if request.param == "emu":
        return request.getfixturevalue("emu")
    return Gpu(build_gpu_library())


@pytest.fixture(scope="module")
def emu() -> Emu:
    e = Emu(cuda_emu.build_shared_library("va_api_tests", [SRC, C_API]))
    yield e
    e.lib.va_emu_clear_globals()


@pytest.fixture(autouse=True)
def _reset(emu):
    emu.fault("none", -1)
    emu.schedule("forward")
    emu.landing("wait")
    emu.lib.va_emu_set_num_workers(0)
    yield
    emu.fault("none", -1)
    emu.schedule("forward")
    emu.landing("wait")


RNG = np.random.default_rng(1234)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16 bit patterns (finite inputs)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16)


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, np.uint32) << 16).view(np.float32)


def random_16bit(shape, bf16: bool) -> tuple[np.ndarray, np.ndarray]:
    """(bits uint16, exact value float64) of random representable values."""
    x = RNG.standard_normal(shape).astype(np.float32)
    if bf16:
        bits = f32_to_bf16_bits(x)
        return bits, bf16_bits_to_f32(bits).astype(np.float64)
    h = x.astype(np.float16)
    return h.view(np.uint16), h.astype(np.float64)


def pack(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return (np.asarray(lo, np.uint32) | (np.asarray(hi, np.uint32) << 16)).astype(np.uint32)


# ------------------------------------------------- PTX fragment tables ----
# mma.m16n8k16 .f16/.bf16 (PTX ISA "Matrix Fragments for mma.m16n8k16 with
# floating point type"): groupID = laneid >> 2, threadID_in_group = laneid % 4.
#   A: a0,a1:(g, 2t+{0,1})  a2,a3:(g+8, 2t+{0,1})  a4,a5:(g, 2t+8+{0,1})  a6,a7:(g+8, 2t+8+{0,1})
#   B: b0,b1:(k=2t+{0,1}, n=g)  b2,b3:(k=2t+8+{0,1}, n=g)
#   C/D: c0,c1:(g, 2t+{0,1})  c2,c3:(g+8, 2t+{0,1})
def a_elem(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    row = g + (8 if i in (2, 3, 6, 7) else 0)
    col = 2 * t + (i % 2) + (8 if i >= 4 else 0)
    return row, col


def b_elem(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    return 2 * t + (i % 2) + (8 if i >= 2 else 0), g


def c_elem(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    return g + (8 if i >= 2 else 0), 2 * t + (i % 2)


@pytest.mark.parametrize("bf16", [True, False], ids=["bf16", "fp16"])
def test_mma_matches_matrix_product_of_fragments(dev, bf16):
    a_bits, A = random_16bit((16, 16), bf16)
    b_bits, B = random_16bit((16, 8), bf16)
    C = RNG.standard_normal((16, 8)).astype(np.float32)
    a = np.zeros((32, 4), np.uint32)
    b = np.zeros((32, 2), np.uint32)
    c = np.zeros((32, 4), np.float32)
    for lane in range(32):
        for r in range(4):
            a[lane, r] = pack(a_bits[a_elem(lane, 2 * r)], a_bits[a_elem(lane, 2 * r + 1)])
        for r in range(2):
            b[lane, r] = pack(b_bits[b_elem(lane, 2 * r)], b_bits[b_elem(lane, 2 * r + 1)])
        for i in range(4):
            c[lane, i] = C[c_elem(lane, i)]
    d = np.full((32, 8), np.nan, np.float32)
    dev.register(a=a, b=b, c=c, d=d)
    dev.call("mma", int(bf16), a, b, c, d)
    D1 = np.zeros((16, 8))
    D2 = np.zeros((16, 8))
    for lane in range(32):
        for i in range(4):
            D1[c_elem(lane, i)] = d[lane, i]
            D2[c_elem(lane, i)] = d[lane, 4 + i]  # second mma accumulated in place (d aliases c)
    want = A @ B + C
    # the emulator rounds the exact sum once; the hardware's fp32 accumulation
    # order is unspecified, so it gets a little more room
    tol = dict(rtol=1e-6, atol=1e-5) if isinstance(dev, Emu) else dict(rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(D1, want, **tol)
    np.testing.assert_allclose(D2, A @ B + want, **tol)


def e4m3_codes(shape, nan_to: int = 0x38) -> tuple[np.ndarray, np.ndarray]:
    """Random e4m3 codes of `shape` (NaN codes replaced by `nan_to`, 0x38 = 1.0) and their values in float64."""
    import torch

    c = RNG.integers(0, 256, size=shape, dtype=np.uint8)
    c[(c & 0x7F) == 0x7F] = nan_to
    return c, torch.from_numpy(c).view(torch.float8_e4m3fn).double().numpy()


def test_mma_e4m3_and_its_f16_form_match_the_matrix_product(dev):
    """mma.m16n8k32 .e4m3 from its fragments (PTX ISA #mma-16832-a / -b: byte i of a[r] is row g + 8 (r % 2), k 4t
    + i + 16 (r / 2); of b[r], k 4t + i + 16 r, n g), in all three forms of csrc/arch/mma.cuh: the instruction, the
    kF16 one (on sm_90 the f16 MMAs) and mma_m16n8k32_e4m3_on_f16 itself, whose f16 fragments permute k the same way
    for A and B. Random codes (NaN codes left out) and a random C: within fp32 rounding of the sums' magnitude."""
    a_codes, A = e4m3_codes((16, 32), nan_to=0xB8)  # NaN codes -> -1.0
    b_codes, B = e4m3_codes((32, 8), nan_to=0xB8)  # [k][n]
    C = RNG.standard_normal((16, 8)).astype(np.float32)
    a = np.zeros((32, 4), np.uint32)
    b = np.zeros((32, 2), np.uint32)
    c = np.zeros((32, 4), np.float32)
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        for r in range(4):
            a[lane, r] = sum(int(a_codes[g + 8 * (r & 1), 4 * t + i + 16 * (r >> 1)]) << (8 * i) for i in range(4))
        for r in range(2):
            b[lane, r] = sum(int(b_codes[4 * t + i + 16 * r, g]) << (8 * i) for i in range(4))
        for i in range(4):
            c[lane, i] = C[c_elem(lane, i)]
    d = np.full((32, 12), np.nan, np.float32)
    dev.register(a=a, b=b, c=c, d=d)
    dev.call("mma_e4m3", a, b, c, d)
    want, mag = A @ B + C, np.abs(A) @ np.abs(B) + np.abs(C)
    for form in range(3):
        got = np.zeros((16, 8))
        for lane in range(32):
            for i in range(4):
                got[c_elem(lane, i)] = d[lane, 4 * form + i]
        # (a GPU: on sm_90 every form is f16 MMAs, whose tensor cores align and truncate inside each fp32 sum (Fasi
        # et al., "Numerical behavior of NVIDIA tensor cores", 2021), a few ulps of the magnitude; where form 0 is a
        # native e4m3 MMA (sm_89, sm_120) its sums may keep as few bits as Hopper's FP8 cores do (~14), so
        # wgmma_e4m3_tol's bound; a wrong fragment errs by ~0.2 of the magnitude)
        tol = 4e-7 if isinstance(dev, Emu) else 2.0 ** -17 if form or _capability() == (9, 0) else 2.0 ** -7
        assert (np.abs(got - want) <= tol * mag + 1e-30).all(), (form, np.max(np.abs(got - want) / mag))


# ldmatrix .m8n8 .b16 (PTX ISA "ldmatrix"): lanes 8j..8j+7 give the row
# addresses of matrix j; lane l receives (row l//4, cols 2(l%4), 2(l%4)+1) of
# each matrix, or with .trans (rows 2(l%4), 2(l%4)+1, col l//4).
@pytest.mark.parametrize("variant", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True], ids=["plain", "trans"])
def test_ldmatrix_thread_to_row_map(dev, variant, trans):
    n16 = 64
    src = np.arange(n16 * 8, dtype=np.uint16)  # element value = its index: every element distinct
    chunks = RNG.permutation(n16)[:32]
    row_off = (chunks * 16).astype(np.int32)
    # lanes past the variant's 8*variant must be ignored: give them addresses far outside smem
    row_off[8 * variant:] = 1 << 20
    out = np.zeros((32, 4), np.uint32)
    dev.register(src=src, row_off=row_off, out=out)
    dev.call("ldmatrix", src, n16, row_off, variant, int(trans), out)
    mats = src.reshape(n16, 8)[chunks[:8 * variant]].reshape(variant, 8, 8)  # [matrix, row, col]
    for lane in range(32):
        for j in range(variant):
            q, p = lane // 4, 2 * (lane % 4)
            lo, hi = (mats[j, p, q], mats[j, p + 1, q]) if trans else (mats[j, q, p], mats[j, q, p + 1])
            assert out[lane, j] == pack(lo, hi), (lane, j)
        for j in range(variant, 4):
            assert out[lane, j] == 0


@pytest.mark.parametrize("bf16", [True, False], ids=["bf16", "fp16"])
@pytest.mark.parametrize("trans_b", [0, 1], ids=["bt", "b_trans"])
def test_gemm_16x8x16_via_ldmatrix_and_mma(dev, bf16, trans_b):
    a_bits, A = random_16bit((16, 16), bf16)
    b_bits, B = random_16bit((16, 8), bf16)
    bsrc = np.ascontiguousarray(b_bits if trans_b else b_bits.T)  # [k][n] or [n][k]
    d = np.full((16, 8), np.nan, np.float32)
    dev.register(a=a_bits, b=bsrc, d=d)
    dev.call("gemm", int(bf16), a_bits, bsrc, trans_b, d)
    tol = dict(rtol=1e-6, atol=1e-5) if isinstance(dev, Emu) else dict(rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(d, A @ B, **tol)


def test_warp_shuffles_and_votes(dev):
    n = 64
    v = RNG.integers(-1000, 1000, n).astype(np.int32)
    out = np.zeros(n, np.int32)
    lanes = np.arange(n) % 32
    base = (np.arange(n) // 32) * 32
    for mask in (1, 2, 7, 16, 31, 37):  # 37: only bits [4:0] count (PTX shfl b[4:0])
        arg = np.full(n, mask, np.int32)
        dev.register(v=v, arg=arg, out=out)
        dev.call("warp", v, arg, 0, n, out)
        np.testing.assert_array_equal(out, v[base + (lanes ^ (mask & 31))])
    arg = RNG.integers(0, 64, n).astype(np.int32)  # per-lane source lanes, taken mod 32
    dev.register(v=v, arg=arg, out=out)
    dev.call("warp", v, arg, 1, n, out)
    np.testing.assert_array_equal(out, v[base + (arg % 32)])
    p = (RNG.random(n) < 0.5).astype(np.int32)
    p[32:] = 1  # warp 1: all true
    dev.register(p=p, arg=arg, out=out)
    dev.call("warp", p, arg, 2, n, out)
    ballot0 = sum(1 << i for i in range(32) if p[i])
    assert (out[:32].view(np.uint32) == ballot0).all() and (out[32:].view(np.uint32) == 0xFFFFFFFF).all()
    dev.call("warp", p, arg, 3, n, out)
    assert (out == 1).all()
    dev.call("warp", p, arg, 4, n, out)
    assert (out[:32] == int(p[:32].all())).all() and (out[32:] == 1).all()
    dev.register(v=v, arg=arg, out=out)
    dev.call("warp", v, arg, 5, n, out)  # butterfly all-reduce on floats
    assert (out[:32] == v[:32].sum()).all() and (out[32:] == v[32:].sum()).all()
    dev.call("warp", v, arg, 6, n, out)  # lane_id_fresh (%laneid) and lane_id agree
    np.testing.assert_array_equal(out, lanes * 101)


NAN16 = np.full(4, 0xFFFFFFFF, np.uint32)


def test_cp_async_lands_only_at_wait_group(emu):
    n = 32
    src = RNG.integers(0, 2**31, (3, n, 4)).astype(np.uint32)
    obs = np.zeros((4, 3, n, 4), np.uint32)
    emu.register(src=src, obs=obs)
    emu.call("cp_async", src, n, obs)
    zfill = np.where((np.arange(n) % 2 == 0)[:, None], src[1], 0)  # odd threads: src-size 0 -> zeros
    landed = [src[0], zfill, src[2]]
    # (0) before any wait: nothing landed; shared memory still holds its NaN fill
    for g in range(3):
        assert (obs[0, g] == NAN16).all(), g
    # (1) wait_group 1: group 0 landed, group 1 (newest committed) and the uncommitted copy not
    np.testing.assert_array_equal(obs[1, 0], landed[0])
    assert (obs[1, 1] == NAN16).all() and (obs[1, 2] == NAN16).all()
    # (2) wait_group 0: both committed groups landed; the uncommitted copy still not
    np.testing.assert_array_equal(obs[2, 1], landed[1])
    assert (obs[2, 2] == NAN16).all()
    # (3) after committing it and wait_group 0: everything
    for g in range(3):
        np.testing.assert_array_equal(obs[3, g], landed[g])


def test_cp_async_issue_landing_mode_lands_at_once(emu):
    n = 32
    src = RNG.integers(0, 2**31, (3, n, 4)).astype(np.uint32)
    obs = np.zeros((4, 3, n, 4), np.uint32)
    emu.register(src=src, obs=obs)
    emu.landing("issue")
    emu.call("cp_async", src, n, obs)
    zfill = np.where((np.arange(n) % 2 == 0)[:, None], src[1], 0)
    for k in range(4):  # every observation, even before any wait, sees all three copies
        for g, want in enumerate([src[0], zfill, src[2]]):
            np.testing.assert_array_equal(obs[k, g], want)


def test_shared_memory_is_nan_filled_at_every_block_start(emu):
    blocks, n = 3, 64
    out = np.zeros(blocks * n, np.uint32)
    emu.register(out=out)
    emu.lib.va_emu_set_num_workers(1)  # blocks one after another on one worker: smem buffer reused
    emu.call("smem_peek", blocks, n, out)
    assert (out == 0xFFFFFFFF).all()


@pytest.mark.parametrize("smem_bytes", [0, 48 * 1024])
def test_dynamic_smem_base_is_1024_aligned(dev, smem_bytes):
    """arch::smem_dynamic's base in the shared window is 1024-byte aligned: the 128-byte swizzle repeats every 1024
    bytes of the address, and the swizzled wgmma descriptors and copies (Hopper's v3) work on offsets from this base.
    Only a GPU has shared-window addresses."""
    if isinstance(dev, Emu):
        pytest.skip("the emulator's swizzles work on offsets: only a GPU has a shared-window address to check")
    out = np.full(1, -2, np.int32)
    dev.call("smem_base", smem_bytes, out)
    assert out[0] == 0, f"dynamic shared memory starts at {out[0]} mod 1024"


def test_ids_grid_and_block_dims(dev):
    g, b = (3, 2, 2), (8, 2, 2)
    nb, nt = int(np.prod(g)), int(np.prod(b))
    out = np.full((nb * nt, 8), -1, np.int32)
    dev.register(out=out)
    dev.call("ids", *g, *b, out)
    for bz in range(g[2]):
        for by in range(g[1]):
            for bx in range(g[0]):
                for tz in range(b[2]):
                    for ty in range(b[1]):
                        for tx in range(b[0]):
                            blk = bx + g[0] * (by + g[1] * bz)
                            t = tx + b[0] * (ty + b[1] * tz)
                            assert list(out[blk * nt + t]) == [tx, ty, tz, bx, by, bz, nb, nt]


def test_atomic_add_across_blocks(dev):
    blocks, n = 6, 64
    counter = np.zeros(1, np.int32)
    olds = np.full(blocks * n, -1, np.int32)
    dev.register(counter=counter, olds=olds)
    dev.call("atomic", blocks, n, counter, olds)
    assert counter[0] == blocks * n
    assert sorted(olds.tolist()) == list(range(blocks * n))


def test_math_exp2_max_pack_rcp(dev):
    n = 200
    x = (RNG.standard_normal(n) * 20).astype(np.float32)
    x[:4] = [-200.0, 0.0, 1.0, -126.5]  # -126.5: 2^x is subnormal -> flushed to zero (ftz)
    # rcp_approx: 1 / 3e38 is subnormal -> 0; a subnormal input is 0 -> inf (ftz); powers of two exact
    x[6:10] = [3e38, -1e-40, 0.25, -1024.0]
    y = RNG.standard_normal(n).astype(np.float32)
    y[5] = np.nan
    out = np.zeros((n, 5), np.float32)
    dev.register(x=x, y=y, out=out)
    dev.call("math", x, y, n, out)
    want = np.exp2(x.astype(np.float64))
    want[want < np.finfo(np.float32).tiny] = 0.0
    # ex2.approx: max relative error 2^-22 on the hardware; the emulator uses exp2
    np.testing.assert_allclose(out[:, 0], want, rtol=2e-7 if isinstance(dev, Emu) else 1e-6)
    np.testing.assert_array_equal(out[:, 1], np.fmax(x, y))
    np.testing.assert_array_equal(out[:, 2], bf16_bits_to_f32(f32_to_bf16_bits(x)))
    ok = ~np.isnan(y)
    np.testing.assert_array_equal(out[ok, 3], bf16_bits_to_f32(f32_to_bf16_bits(y[ok])))
    assert np.isnan(out[5, 3])
    with np.errstate(divide="ignore"):
        xf = np.where(np.abs(x) < np.finfo(np.float32).tiny, np.copysign(0.0, x), x).astype(np.float64)
        want = 1.0 / xf
    want[np.abs(want) < np.finfo(np.float32).tiny] = 0.0
    # rcp.approx.ftz: max error 1 ulp on the hardware; the emulator rounds 1 / x correctly
    np.testing.assert_allclose(out[:, 4], want, rtol=1.2e-7 if isinstance(dev, Emu) else 2.4e-7)
    assert out[1, 4] == np.inf and out[7, 4] == -np.inf and out[6, 4] == 0.0
    if isinstance(dev, Emu):   # (exact here; PTX promises a GPU 1 ulp, which the bound above holds it to)
        assert out[8, 4] == 4.0 and out[9, 4] == -1.0 / 1024


def test_block_reduce_and_pipeline_correct(dev):
    blocks, n = 4, 256
    x = RNG.integers(-50, 50, blocks * n).astype(np.float32)  # integer values: exact sums
    out = np.zeros(blocks, np.float32)
    dev.register(x=x, out=out)
    dev.call("block_reduce", x, blocks, n, out)
    np.testing.assert_array_equal(out, x.reshape(blocks, n).sum(1))
    if isinstance(dev, Emu):
        st = dev.stats()
        assert st["block_syncs"] >= blocks and st["warp_collectives"] > 0

    ntiles, n = 5, 64
    src = RNG.integers(-9, 9, (ntiles, n, 4)).astype(np.float32)
    res = np.zeros((n, 4), np.float32)
    dev.register(src=src, res=res)
    dev.call("pipeline", src, ntiles, n, res)
    np.testing.assert_array_equal(res, np.roll(src, -1, axis=1).sum(0))


# --------------------------------------------------------- strict checks ----

@pytest.mark.parametrize("mode,needle", [
    (0, "ld_global of 4 bytes"), (1, "st_global of 4 bytes"), (2, "cp.async source"),
    (3, "not 16-byte aligned"), (5, "prefetch.global.L2 of 1 bytes"),
])
def test_out_of_bounds_global_access_is_reported(emu, mode, needle):
    n = 16
    src = np.arange(n, dtype=np.int32)
    out = np.zeros(n, np.int32)
    emu.register(src=src, out=out)
    err = emu.try_call("oob", src, n, mode, out)
    assert err is not None, "the emulator accepted an out-of-bounds access"
    assert needle in err and "block (0,0,0) thread (3,0,0)" in err and "api_kernels.cu:" in err, err
    if mode != 3:
        assert "outside every registered tensor" in err and "byte offset 64" in err, err


def test_ldmatrix_row_outside_shared_memory_is_reported(emu):
    out = np.zeros(32, np.uint32)
    emu.register(out=out)
    assert emu.try_call("ldmatrix_oob", 256, 0, out) is None
    err = emu.try_call("ldmatrix_oob", 256, 256, out)
    assert err is not None and "ldmatrix row" in err and "outside the block's 256 bytes" in err, err


def test_barrier_some_threads_never_reach_is_reported(emu):
    out = np.zeros(64, np.int32)
    emu.register(out=out)
    assert emu.try_call("early_exit", 64, 64, out) is None  # nobody exits early: fine
    err = emu.try_call("early_exit", 64, 40, out)
    assert err is not None and "deadlock" in err and "24 of 64 thread(s) exited" in err, err
    assert "block_sync at csrc/emu/tests/api_kernels.cu:" in err, err


def test_wild_pointer_crash_names_the_emulated_thread(emu, tmp_path):
    # A crash cannot be caught in-process: run it in a child and read its stderr.
    import subprocess
    import sys

    script = tmp_path / "crash.py"
    script.write_text(f"import ctypes\nlib = ctypes.CDLL({str(emu.path)!r})\nlib.va_test_crash(16)\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "va::emu: SIGSEGV in an emulated kernel at address 0x10: block (0,0,0) thread (5,0,0)" in r.stderr, r.stderr


# ------------------------------------------------------- fault injection ----

def test_skipped_block_sync_is_caught(emu):
    blocks, n = 2, 256
    x = RNG.integers(-50, 50, blocks * n).astype(np.float32)
    out = np.zeros(blocks, np.float32)
    emu.register(x=x, out=out)
    emu.fault("skip_block_sync", 0)
    err = emu.try_call("block_reduce", x, blocks, n, out)
    assert emu.lib.va_emu_fault_hits() > 0
    # warp 0 reads partials other warps have not written yet: NaN from the smem fill
    assert err is not None or not np.array_equal(out, x.reshape(blocks, n).sum(1))
    assert np.isnan(out).any()


@pytest.mark.parametrize("fault,nth", [("skip_cp_async_wait", -1), ("skip_cp_async_wait", 2),
                                       ("skip_block_sync", 0), ("skip_block_sync", -1)])
def test_pipeline_fault_is_caught(emu, fault, nth):
    ntiles, n = 5, 64
    src = RNG.integers(-9, 9, (ntiles, n, 4)).astype(np.float32)
    res = np.zeros((n, 4), np.float32)
    emu.register(src=src, res=res)
    emu.fault(fault, nth)
    err = emu.try_call("pipeline", src, ntiles, n, res)
    assert emu.lib.va_emu_fault_hits() > 0
    assert err is not None or not np.array_equal(res, np.roll(src, -1, axis=1).sum(0))


def _bulk_case(ntiles=7, n=32, row_floats=288, nsrc=97):
    src = RNG.integers(-9, 9, (nsrc, row_floats)).astype(np.float32)  # integer values: exact sums
    idx = RNG.permutation(nsrc)[: ntiles * n % nsrc].tolist()
    idx = np.array((idx + RNG.integers(0, nsrc, ntiles * n).tolist())[: ntiles * n], np.int32)
    out = np.full((ntiles, n), np.nan, np.float32)
    want = np.roll(src[idx].reshape(ntiles, n, row_floats).sum(2), -1, axis=1)
    return src, idx, out, want


@pytest.mark.parametrize("stages,row_floats", [(2, 288), (3, 288), (4, 164)])
def test_bulk_copies_on_mbarriers(dev, stages, row_floats):
    """cp.async.bulk rows gathered by index through an mbarrier ring (the v1 bulk loader's protocol): every
    thread reads another thread's row after its wait; 1,152- and 656-byte rows, 2-4 stages, phases
    wrapping their parity several times."""
    ntiles, n = 7, 32
    src, idx, out, want = _bulk_case(ntiles, n, row_floats)
    dev.register(src=src, idx=idx, out=out)
    dev.call("bulk_rows", src, idx, ntiles, row_floats, stages, 0, n, out)
    np.testing.assert_array_equal(out, want)


def test_bulk_copy_lands_only_at_the_wait(emu):
    """Without the mbarrier wait the rows have not landed: the sums read the poisoned (NaN) stage, and the copies are
    still in flight when the block exits (the exit check reports them)."""
    src, idx, out, want = _bulk_case()
    emu.register(src=src, idx=idx, out=out)
    emu.fault("skip_mbarrier_wait", -1)
    err = emu.try_call("bulk_rows", src, idx, 7, 288, 3, 0, 32, out)
    assert emu.lib.va_emu_fault_hits() > 0
    assert np.isnan(out).any()
    assert err is not None and "no thread waited for" in err, err
    emu.fault("none", -1)
    emu.landing("issue")  # the earliest legal landing: the same bits with the wait in place
    try:
        emu.call("bulk_rows", src, idx, 7, 288, 3, 0, 32, out)
    finally:
        emu.landing("wait")
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("mode,needle", [(1, "deadlock"), (2, "size must be a non-zero multiple of 16"),
                                         (3, "no mbarrier_init")])
def test_bulk_copy_misuse_is_reported(emu, mode, needle):
    """expect_tx short of the bytes copied (the phase never completes: its waiters deadlock, and the exit
    check names the barrier), a copy size off the 16-byte grain, a barrier used uninitialised."""
    src, idx, out, _ = _bulk_case()
    emu.register(src=src, idx=idx, out=out)
    err = emu.try_call("bulk_rows", src, idx, 7, 288, 3, mode, 32, out)
    assert err is not None and needle in err, err
    if mode == 1:
        assert "mbarrier_wait" in err, err


def test_a_block_exiting_before_its_copies_landed_is_reported(emu):
    """No thread waits for the last tile's phase: its copies complete the phase but have not landed (landing "wait"
    lands them at the first wait), so they are still in flight into shared memory the CTA gives up when it exits. The
    exit check names the barrier. (Hopper v3's phantom pair: warpgroup 1's FULL waits on the phantom block's zeros are
    the only waits on them; tests/test_cuda_emu.py skips them.)"""
    src, idx, out, _ = _bulk_case()
    emu.register(src=src, idx=idx, out=out)
    err = emu.try_call("bulk_rows", src, idx, 7, 288, 3, 4, 32, out)
    assert err is not None and "no thread waited for" in err and "mbarrier at smem offset" in err, err


@pytest.mark.parametrize("sched,caught", [("forward", False), ("reverse", False), ("warp-ahead", True),
                                          ("warp-ahead-reverse", True)])
def test_warp_ahead_schedules_expose_a_race_lockstep_hides(emu, sched, caught):
    n = 128
    x = RNG.integers(1, 50, n).astype(np.float32)
    out = np.zeros(n, np.float32)
    emu.register(x=x, out=out)
    emu.schedule(sched)
    emu.call("lockstep_race", x, n, out)  # correct kernel: right under every schedule
    np.testing.assert_array_equal(out, np.roll(x, -32))
    emu.fault("skip_block_sync", 0)
    emu.call("lockstep_race", x, n, out)
    assert emu.lib.va_emu_fault_hits() == n
    assert bool(np.isnan(out).any()) == caught


@pytest.mark.parametrize("landing,caught", [("wait", False), ("issue", True)])
def test_stage_reused_without_barrier_found_with_issue_landing(emu, landing, caught):
    # k_pipeline's second barrier keeps a stage from being refilled while the
    # neighbour still reads it (write-after-read). Bytes landing at the wait hide
    # the race; landing at issue, with the last warp running ahead, exposes it.
    ntiles, n = 5, 64
    src = RNG.integers(1, 9, (ntiles, n, 4)).astype(np.float32)
    res = np.zeros((n, 4), np.float32)
    emu.register(src=src, res=res)
    emu.schedule("warp-ahead-reverse")
    emu.landing(landing)
    emu.call("pipeline", src, ntiles, n, res)
    np.testing.assert_array_equal(res, np.roll(src, -1, axis=1).sum(0))  # unbroken: right either way
    emu.fault("skip_block_sync", 1)
    emu.call("pipeline", src, ntiles, n, res)
    assert emu.lib.va_emu_fault_hits() == n
    assert (not np.array_equal(res, np.roll(src, -1, axis=1).sum(0))) == caught


@pytest.mark.parametrize("sched", ["reverse", "random", "warp-ahead", "warp-ahead-reverse", "lagging", "lagging-mid",
                                   "lagging-tail", "starve-last", "lagging-head", "stalled-mid",
                                   "stalled-head", "stalled-peer", "stalled-peer-mid"])
def test_other_schedules_give_same_results(emu, sched):
    emu.schedule(sched, seed=7)
    ntiles, n = 4, 128
    src = RNG.integers(-9, 9, (ntiles, n, 4)).astype(np.float32)
    res = np.zeros((n, 4), np.float32)
    emu.register(src=src, res=res)
    emu.call("pipeline", src, ntiles, n, res)
    np.testing.assert_array_equal(res, np.roll(src, -1, axis=1).sum(0))


# ----------------------------------------------------------------- wgmma ----
# wgmma.mma_async m64nNk16, D fragments (PTX ISA, "Register Fragments and Shared Memory Matrix
# Layouts", the m64nNk16 accumulator figure): thread tid of a warpgroup, q = tid // 32 (warp in the
# warpgroup), g = lane >> 2, t = lane % 4; d[i] is row 16q + g + 8 ((i % 4) // 2), column
# 8 (i // 4) + 2t + (i % 2).
def wgmma_d_elem(tid: int, i: int) -> tuple[int, int]:
    q, lane = (tid % 128) // 32, tid % 32
    g, t = lane >> 2, lane % 4
    return 16 * q + g + 8 * ((i % 4) // 2), 8 * (i // 4) + 2 * t + (i % 2)


def _wgmma_case(dev, bf16: bool, n: int, trans_b: bool, ss: bool, pad: int = 16, mode: int = 0, threads: int = 128):
    a_bits, A = random_16bit((64, 32), bf16)
    b_bits, B = random_16bit((32, n), bf16)  # B[k][n]
    b_src = np.ascontiguousarray(b_bits if trans_b else b_bits.T)  # MN-major: k rows of n; K-major: n rows of k
    out = np.full((threads, n // 2), -1.0, np.float32)
    dev.register(a=a_bits, b=b_src, out=out)
    err = dev.try_call("wgmma", int(bf16), n, a_bits, b_src, int(trans_b), int(ss), pad, mode, threads, out)
    want = A @ B + (0.5 if mode & 64 else 0.0)
    return err, out, want


def _wgmma_expect(out: np.ndarray, want: np.ndarray) -> None:
    threads, nd = out.shape
    got = np.empty((threads // 128, 64, 2 * nd))
    for tid in range(threads):
        for i in range(nd):
            r, c = wgmma_d_elem(tid, i)
            got[tid // 128, r, c] = out[tid, i]
    for wg in range(threads // 128):  # every warpgroup computes the same product
        np.testing.assert_allclose(got[wg], want, rtol=1e-6, atol=1e-5)


@pytest.fixture
def wgmma_dev(dev):
    if isinstance(dev, Gpu):
        import torch

        if torch.cuda.get_device_capability() != (9, 0):
            pytest.skip("wgmma runs on sm_90a only")
    return dev


@pytest.mark.parametrize("bf16,n", [(True, 32), (False, 32), (True, 256)], ids=["bf16-n32", "f16-n32", "bf16-n256"])
@pytest.mark.parametrize("trans_b", [False, True], ids=["b-kmajor", "b-mnmajor"])
@pytest.mark.parametrize("ss", [False, True], ids=["a-regs", "a-smem"])
def test_wgmma_matches_matrix_product(wgmma_dev, bf16, n, trans_b, ss):
    """Two accumulating k16 steps, A from registers or shared memory, B K- or MN-major through no-swizzle
    descriptors with padded strides; two warpgroups each compute the product."""
    err, out, want = _wgmma_case(wgmma_dev, bf16, n, trans_b, ss, threads=256)
    assert err is None, err
    _wgmma_expect(out, want)


def _wgmma_sw128_case(dev, n: int, trans_b: bool, ss: bool, mode: int = 0, threads: int = 128):
    a_bits, A = random_16bit((64, 32), True)
    b_bits, B = random_16bit((32, n), True)  # B[k][n]
    b_src = np.ascontiguousarray(b_bits if trans_b else b_bits.T)
    out = np.full((threads, n // 2), -1.0, np.float32)
    dev.register(a=a_bits, b=b_src, out=out)
    err = dev.try_call("wgmma_sw128", n, a_bits, b_src, int(trans_b), int(ss), mode, threads, out)
    return err, out, A @ B


@pytest.mark.parametrize("n", [32, 256])
@pytest.mark.parametrize("trans_b", [False, True], ids=["b-kmajor", "b-mnmajor"])
@pytest.mark.parametrize("ss", [False, True], ids=["a-regs", "a-smem"])
def test_wgmma_reads_128_byte_swizzled_operands(wgmma_dev, n, trans_b, ss):
    """B (and A from shared memory) written by cp.async at the 128-byte-swizzle offsets (wgmma.cuh sw128_*) and
    read through swizzled descriptors: K-major advanced 32 bytes a k16 step, MN-major two atoms; N = 256 spans four
    64-wide n blocks LBO apart. On an H200 the same test checks the layout against the hardware."""
    err, out, want = _wgmma_sw128_case(wgmma_dev, n, trans_b, ss, threads=256)
    assert err is None, err
    _wgmma_expect(out, want)


@pytest.mark.parametrize("trans_b", [False, True], ids=["b-kmajor", "b-mnmajor"])
def test_swizzle_mismatch_is_caught(emu, trans_b):
    """Operands written swizzled but described as unswizzled: the wgmma reads other bytes, the product is wrong."""
    err, out, want = _wgmma_sw128_case(emu, 32, trans_b, True, mode=1)
    assert err is None, err
    with pytest.raises(AssertionError):
        _wgmma_expect(out, want)


def test_wgmma_accumulates_onto_registers(wgmma_dev):
    err, out, want = _wgmma_case(wgmma_dev, True, 32, False, False, pad=0, mode=64)
    assert err is None, err
    _wgmma_expect(out, want)


def test_wgmma_result_is_nan_until_the_wait(emu):
    err, out, _ = _wgmma_case(emu, True, 32, False, False, mode=4)
    assert err is None, err
    assert np.isnan(out).all()


@pytest.mark.parametrize("mode,needle", [
    (1, "has not executed fence_proxy_async"),
    (2, "without a wgmma_fence"),
    (8, "was overwritten before the wgmma_wait"),
    (16, "differs (shape, A source, descriptors or scale-d)"),
    (32, "still in flight when its threads exited"),
], ids=["no-proxy-fence", "no-wgmma-fence", "operand-overwritten", "warpgroup-diverges", "no-wait"])
def test_wgmma_misuse_is_reported(emu, mode, needle):
    err, _, _ = _wgmma_case(emu, True, 32, False, False, mode=mode)
    assert err is not None and needle in err, err


ST_SHARED, NOINC_RING = 128, 256  # k_wgmma's operand writers (api_kernels.cu)


@pytest.mark.parametrize("writer", [ST_SHARED, NOINC_RING], ids=["st-shared", "st-shared-noinc-mbarrier"])
@pytest.mark.parametrize("ss", [False, True], ids=["a-regs", "a-smem"])
def test_wgmma_reads_st_shared_operands_after_proxy_fence(wgmma_dev, writer, ss):
    """Operands written by plain st_shared stores (uint4 / uint2; with the noinc mbarrier, 4 bytes of each B chunk by
    cp.async and 12 by uint32_t stores), then fence_proxy_async and a barrier: the wgmma reads them, product exact."""
    err, out, want = _wgmma_case(wgmma_dev, True, 32, False, ss, mode=writer, threads=256)
    assert err is None, err
    _wgmma_expect(out, want)


@pytest.mark.parametrize("landing", ["wait", "issue"])
@pytest.mark.parametrize("writer", [ST_SHARED, NOINC_RING], ids=["st-shared", "st-shared-noinc-mbarrier"])
@pytest.mark.parametrize("ss", [False, True], ids=["a-regs", "a-smem"])
def test_st_shared_without_proxy_fence_is_caught(emu, writer, ss, landing):
    """The same without fence_proxy_async: the generic-proxy stores are not visible to the wgmma's async proxy.
    With the noinc mbarrier the arrive ties the thread's cp.asyncs to the barrier (their chunk marks cleared) but
    must not clear the st_shared marks, whichever moment the cp.asyncs land."""
    emu.landing(landing)
    err, _, _ = _wgmma_case(emu, True, 32, False, ss, mode=writer | 1, threads=256)
    assert err is not None and "written by st.shared of thread" in err and "fence_proxy_async" in err, err


@pytest.mark.parametrize("writer", [ST_SHARED, NOINC_RING], ids=["st-shared", "st-shared-noinc-mbarrier"])
def test_st_shared_fenced_only_after_the_barrier_is_caught(emu, writer):
    """The fence must come before the release (block_sync, an mbarrier arrive) that publishes the stores: a reader
    acquiring through it may run its wgmma before a later fence. The writers fence only after the barrier here."""
    err, _, _ = _wgmma_case(emu, True, 32, False, True, mode=writer | 1 | 512, threads=256)
    assert err is not None and "published by a barrier or mbarrier arrive before its fence_proxy_async" in err, err


def test_skipped_proxy_fence_after_st_shared_is_caught(emu):
    """Fault injection reaches the new check too: skip_fence_proxy_async on the st_shared writers."""
    emu.fault("skip_fence_proxy_async", -1)
    err, _, _ = _wgmma_case(emu, True, 32, False, True, mode=ST_SHARED)
    assert err is not None and "written by st.shared of thread" in err, err


def test_wgmma_ptx_include_is_generated_from_its_script():
    """csrc/arch/wgmma_ptx.inc is what csrc/arch/gen_wgmma.py writes (rerun the script after editing it)."""
    import importlib.util

    gen = Path(cuda_emu.CSRC) / "arch" / "gen_wgmma.py"
    spec = importlib.util.spec_from_file_location("gen_wgmma", gen)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert (gen.with_name("wgmma_ptx.inc")).read_text() == mod.render()


def _capability() -> tuple[int, int]:
    import torch

    return torch.cuda.get_device_capability()


def wgmma_e4m3_tol(dev) -> float:
    """The e4m3 wgmma tests' bound on |got - want| / (sum |a||b|). The emulator sums in float64 and rounds once, so
    fp32 rounding (4e-7). Hopper's FP8 tensor cores keep only ~14 bits while they accumulate (DeepSeek-V3's report,
    sec. 3.3.2; tolerances.FP8_MMA_LSE_ATOL says the same of the kernels): a truncation of up to 2^-13 of the sums'
    magnitude at each of a k32 step's 32 adds, over the tests' two steps, is at most 64 x 2^-13 = 2^-7. A wrong
    fragment layout pairs the wrong products, an error of the order of the sums themselves (~0.2 of the magnitude
    for random codes), which either bound fails."""
    return 2.0 ** -7 if isinstance(dev, Gpu) else 4e-7


@pytest.mark.parametrize("n", [32, 256], ids=["n32", "n256"])
@pytest.mark.parametrize("ss", [False, True], ids=["a-regs", "a-smem"])
def test_wgmma_e4m3_matches_matrix_product(wgmma_dev, n, ss):
    """wgmma .e4m3 (k32): two accumulating steps on random codes (NaN codes left out), A from mma.m16n8k32
    fragments or shared memory, B K-major with padded strides; each of two warpgroups computes the product
    (fp32 accumulation: within fp32 rounding of the sums' magnitude)."""
    a, A = e4m3_codes((64, 64))
    b, B = e4m3_codes((n, 64))  # K-major: n rows of k
    out = np.full((256, n // 2), -1.0, np.float32)
    wgmma_dev.register(a=a, b=b, out=out)
    err = wgmma_dev.try_call("wgmma_e4m3", n, a, b, int(ss), 16, 256, out)
    assert err is None, err
    want, mag = A @ B.T, np.abs(A) @ np.abs(B).T
    got = np.empty((2, 64, n))
    for tid in range(256):
        for i in range(n // 2):
            r, c = wgmma_d_elem(tid, i)
            got[tid // 128, r, c] = out[tid, i]
    for wg in range(2):
        assert (np.abs(got[wg] - want) <= wgmma_e4m3_tol(wgmma_dev) * mag + 1e-30).all(), \
            np.max(np.abs(got[wg] - want) / (mag + 1e-30))


def test_pv_with_swapped_operands_v_transposed_in_registers(wgmma_dev):
    """P V swapped for e4m3 (csrc/tree_verify/sm90/pv_swap.cuh, a building block for Hopper's v3): O^T = V^T P^T by
    wgmma .e4m3 with V^T's A fragments from V's token-major rows (ldmatrix .trans and byte permutes, no transposed
    copy) and P^T K-major with its tokens in fp8_pv_token_of_k order. O^T's rows come out as vt_dim_of_row says. With
    P^T's tokens in their natural order instead (mode 1) the product is wrong: the two operands must permute k alike."""
    v, V = e4m3_codes((64, 64))  # [tokens][dims]
    p, P = e4m3_codes((64, 64))  # [rows][tokens]
    want, mag = V.T @ P.T, np.abs(V).T @ np.abs(P).T  # O^T [dims][rows]
    dim_of_row = [2 * r if r < 8 else 2 * (r - 8) + 1 for r in range(16)]
    for mode in (0, 1):
        out = np.full((128, 32), np.nan, np.float32)
        wgmma_dev.register(v=v, p=p, out=out)
        err = wgmma_dev.try_call("wgmma_vt_swap", v, p, mode, out)
        assert err is None, err
        got = np.full((64, 64), np.nan)
        for tid in range(128):
            for i in range(32):
                r, c = wgmma_d_elem(tid, i)
                got[16 * (r // 16) + dim_of_row[r % 16], c] = out[tid, i]
        ok = (np.abs(got - want) <= wgmma_e4m3_tol(wgmma_dev) * mag + 1e-30).all()
        assert ok == (mode == 0), (mode, np.nanmax(np.abs(got - want) / (mag + 1e-30)))


def test_wgmma_needs_whole_warpgroups(emu):
    err, _, _ = _wgmma_case(emu, True, 32, False, False, threads=96)
    assert err is not None and "whole warpgroups" in err, err


# ------------------------------------------------------------ real side ----

@pytest.mark.skipif(nvcc() is None, reason="no CUDA toolkit (nvcc)")
def test_real_side_compiles_for_sm90a_and_sm120a(tmp_path):
    """nvcc builds every device-API wrapper (inline PTX: mma.sync, ldmatrix,
    cp.async, ex2.approx) for both targets, without spills; no GPU needed."""
    import subprocess

    cmd = [nvcc(), "-std=c++20", "-O2", f"-I{cuda_emu.CSRC}", "-Xptxas=-v",
           "-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_120a,code=sm_120a",
           "-c", str(SRC), "-o", str(tmp_path / "api_kernels.o")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "spill stores" in r.stderr  # the ptxas report is there...
    assert all(" 0 bytes spill stores" in line for line in r.stderr.splitlines() if "spill stores" in line)


# ------------------------------------------------- warp roles: named barriers, noinc arrives, setmaxnreg ----

def _roles_case(ntiles: int = 5):
    src = RNG.integers(1, 9, (ntiles, 512)).astype(np.float32)
    part = src[:, 2 * ((np.arange(256) + 7) % 256)] + src[:, 2 * ((np.arange(256) + 7) % 256) + 1]
    want = part + np.roll(part, -1, axis=1)
    return src, np.full((ntiles, 256), np.nan, np.float32), want


@pytest.mark.parametrize("sched", ["forward", "reverse", "warp-ahead", "warp-ahead-reverse"])
def test_producer_and_math_warpgroups_on_full_empty_and_named_barriers(dev, sched):
    """k_roles_ring: a producer warpgroup's cp.asyncs signal each stage's "full" barrier by
    cp.async.mbarrier.arrive.noinc, the math warpgroups free it on "empty" and exchange partial sums through a named
    barrier of their own 256 threads; 5 tiles through 2 stages wrap every barrier's parity twice."""
    src, out, want = _roles_case()
    dev.register(src=src, out=out)
    if isinstance(dev, Emu):
        dev.schedule(sched)
    elif sched != "forward":
        pytest.skip("schedules are the emulator's")
    dev.call("roles_ring", src, 5, 0, out)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("landing", ["wait", "issue"])
def test_math_warps_reading_a_stage_before_its_full_barrier_are_caught(emu, landing):
    """Without the "full" wait the stage has not landed (its copies land when the phase is waited for): the math
    warps read the poisoned stage. With copies landing at issue the same bug reads the wrong tile or NaN."""
    src, out, want = _roles_case()
    emu.register(src=src, out=out)
    emu.schedule("warp-ahead")
    emu.landing(landing)
    try:
        err = emu.try_call("roles_ring", src, 5, 1, out)
    finally:
        emu.landing("wait")
    assert err is None or "deadlock" in err, err
    assert not np.array_equal(out, want)


def test_producer_overwriting_a_stage_before_its_empty_barrier_is_caught(emu):
    """Without the "empty" wait the producer refills a stage the math warps still read: landing at issue (the
    earliest the hardware may write) exposes it; the correct kernel is right under the same schedule."""
    src, out, want = _roles_case()
    emu.register(src=src, out=out)
    emu.schedule("reverse")
    emu.landing("issue")
    try:
        emu.call("roles_ring", src, 5, 0, out)
        np.testing.assert_array_equal(out, want)
        out[:] = np.nan
        err = emu.try_call("roles_ring", src, 5, 2, out)
    finally:
        emu.landing("wait")
    assert err is not None or not np.array_equal(out, want), "the early refill went unnoticed"


@pytest.mark.parametrize("nth", [0, 1, -1])
def test_a_removed_named_barrier_is_caught(emu, nth):
    """Fault skip_named_barrier: every thread skips its nth named barrier call (k_roles_ring's math threads meet
    twice a tile: 0, partial sums written; 1, read before the next tile's). Removed, a math warp running ahead reads
    partial sums the others have not written yet (or overwrites ones they still read)."""
    src, out, want = _roles_case()
    emu.register(src=src, out=out)
    caught = False
    for sched in ("warp-ahead", "warp-ahead-reverse"):
        emu.schedule(sched)
        emu.fault("skip_named_barrier", nth)
        try:
            out[:] = np.nan
            err = emu.try_call("roles_ring", src, 5, 0, out)
        finally:
            emu.fault("none", -1)
        caught = caught or err is not None or not np.array_equal(out, want)
    assert caught, f"named barrier call {nth} removed went unnoticed"


@pytest.mark.parametrize("mode,needle", [
    (3, "named barrier 1: this thread arrives for 128 threads, the"),
    (4, "named barrier 0 with 256 threads: the id must be 1..15"),
    (5, "setmaxnreg.inc 250: the count must be a multiple of 8 in 24..256"),
    (6, "setmaxnreg.inc 224: warpgroup 0's threads disagree"),
    (7, "named barrier 1 (256 of 384 threads arrived)"),
])
def test_named_barrier_and_setmaxnreg_misuse_is_reported(emu, mode, needle):
    """A named barrier with the wrong thread count (mismatched, or more than ever arrive: a deadlock naming the
    barrier), the block barrier's id, an illegal or warpgroup-divergent setmaxnreg."""
    src, out, _ = _roles_case()
    emu.register(src=src, out=out)
    err = emu.try_call("roles_ring", src, 5, mode, out)
    assert err is not None and needle in err, err
    assert "api_kernels.cu:" in err, err


# ------------------------------------------------- thread-block clusters (csrc/arch/cluster.cuh) ----

@pytest.fixture
def cluster_dev(dev):
    if isinstance(dev, Gpu):
        import torch

        if torch.cuda.get_device_capability()[0] < 9:
            pytest.skip("thread-block clusters need sm_90+")
    return dev


@pytest.mark.parametrize("grid,cluster", [((4, 1, 1), (2, 1, 1)), ((4, 2, 1), (2, 2, 1)), ((2, 2, 2), (1, 2, 2)),
                                          ((6, 1, 1), (1, 1, 1))], ids=["2x1x1", "2x2x1", "1x2x2", "1x1x1"])
def test_cluster_ctarank_is_x_fastest_within_the_cluster(cluster_dev, grid, cluster):
    """%cluster_ctarank = x + cx (y + cy z), (x, y, z) = blockIdx % cluster dims; every CTA then meets the others of
    its cluster at a cluster_sync."""
    nb = int(np.prod(grid))
    out = np.full(nb, -1, np.int32)
    cluster_dev.register(out=out)
    cluster_dev.call("cluster_ids", *grid, *cluster, out)
    bz, by, bx = np.meshgrid(*(np.arange(g) for g in grid[::-1]), indexing="ij")
    want = (bx % cluster[0]) + cluster[0] * ((by % cluster[1]) + cluster[1] * (bz % cluster[2]))
    np.testing.assert_array_equal(out, want.reshape(-1))


def test_a_cluster_that_does_not_divide_the_grid_is_refused(emu):
    out = np.zeros(6, np.int32)
    emu.register(out=out)
    err = emu.try_call("cluster_ids", 6, 1, 1, 4, 1, 1, out)
    assert err is not None and "must divide the grid" in err, err


def _cluster_case(clusters: int = 1, ntiles: int = 5):
    """k_cluster_swap's tiles and what each CTA's thread t writes per tile: sum_k (k + 1) tile[t + 128 k] (both CTAs
    of a cluster read the same whole tile, half of it copied from the other CTA)."""
    src = RNG.integers(-9, 9, (clusters, ntiles, 1024)).astype(np.float32)  # integer values: exact sums
    idx = np.arange(128)[None, :] + 128 * np.arange(8)[:, None]  # [k][t]
    per = (src[:, :, idx] * np.arange(1, 9)[:, None]).sum(2)  # [cluster][tile][t]
    out = np.full((2 * clusters, ntiles, 128), np.nan, np.float32)
    return src, out, np.repeat(per, 2, axis=0)


@pytest.mark.parametrize("landing", ["wait", "issue"])
@pytest.mark.parametrize("sched", ["forward", "reverse", "random", "warp-ahead", "warp-ahead-reverse", "lagging",
                                   "stalled-mid", "starve-last", "lagging-head"])
@pytest.mark.parametrize("clusters", [1, 2])
def test_two_ctas_swap_halves_through_distributed_shared_memory(cluster_dev, clusters, sched, landing):
    """k_cluster_swap: each CTA of a 2-CTA cluster stages its half of every tile by cp.async and bulk-copies it into
    the other CTA's shared memory on that CTA's FULL barrier; each warp frees the stage on both CTAs' EMPTY barriers
    by remote arrives. 5 tiles through 2 stages wrap every barrier's parity twice; grid 4 runs two clusters."""
    src, out, want = _cluster_case(clusters)
    cluster_dev.register(src=src, out=out)
    if isinstance(cluster_dev, Emu):
        cluster_dev.schedule(sched, seed=11)
        cluster_dev.landing(landing)
    elif sched != "forward" or landing != "wait":
        pytest.skip("schedules and landing modes are the emulator's")
    cluster_dev.call("cluster_swap", src, clusters, 5, 0, out)
    np.testing.assert_array_equal(out, want)
    if isinstance(cluster_dev, Emu):
        st = cluster_dev.stats()
        assert st["blocks"] >= 2 * clusters


@pytest.mark.parametrize("mode,needles", [
    (1, ["cp.async.bulk.shared::cluster: mbarrier at smem offset 0 of CTA rank 1 used before a cluster_sync made "
         "thread 0's mbarrier_init at",
         "no cluster_sync completed since that thread's fence_mbarrier_init_cluster"]),
    (7, ["used before a cluster_sync made thread 0's mbarrier_init at",
         "that thread has run no fence_mbarrier_init_cluster since the init"]),
    (2, ["mbarrier_arrive_cluster: CTA rank 1 of the cluster has exited: its shared memory is gone "
         "(a cluster_sync before exit?)", "block (0,0,0)"]),
    (3, ["cp.async.bulk.shared::cluster source at shared offset 128 was written by a cp.async of thread 0 that has "
         "not executed fence_proxy_async since it landed (the bulk copy's async proxy may not see it)"]),
    (4, ["deadlock: no thread of the cluster's 2 CTAs can run", "wait at cluster_sync (128 of 256 threads of the "
         "cluster arrived)", "CTA rank 1 (block (1,0,0)): 128 of 128 thread(s) exited"]),
    (8, ["deadlock: no thread of the cluster's 2 CTAs can run", "96 thread(s) wait at cluster_sync (224 of 256 "
         "threads of the cluster arrived)", "32 of 128 thread(s) exited"]),
    (6, ["map_shared_rank: rank 2 is outside the cluster's 2 CTA(s)"]),
], ids=["no-cluster-sync-after-init", "no-init-fence", "peer-exited", "no-proxy-fence", "rank1-skips-last-sync",
        "warp-skips-last-sync", "rank-out-of-range"])
@pytest.mark.parametrize("sched", ["forward", "reverse", "random", "warp-ahead"])
def test_cluster_misuse_is_reported(emu, mode, needles, sched):
    """A remote barrier used before a cluster_sync made its init visible (no cluster_sync, or no
    fence_mbarrier_init_cluster), an arrival on a CTA that exited without the final cluster_sync, a bulk copy's
    source written by cp.async without fence_proxy_async, a cluster_sync some threads never reach (a whole CTA, or one
    warp, returned early), a rank outside the cluster. Built so that every schedule reports the same error (mode 2:
    rank 0's 4 extra block_syncs keep its last arrivals on rank 1 behind rank 1's exit)."""
    src, out, _ = _cluster_case()
    emu.register(src=src, out=out)
    emu.schedule(sched, seed=5)
    err = emu.try_call("cluster_swap", src, 1, 5, mode, out)
    assert err is not None, f"mode {mode} went unreported"
    for needle in needles:
        assert needle in err, err
    if mode not in (4, 8):
        assert "api_kernels.cu:" in err, err


@pytest.mark.parametrize("mode,needle", [
    (0, None),
    (3, None),
    (1, "ld_global of 4 bytes at 0x"),
    (2, "st_global of 4 bytes at 0x"),
], ids=["read-after-wait", "read-of-untouched-before-wait", "read-of-written-before-wait", "write-before-wait"])
def test_programmatic_dependent_launch_order_is_checked(emu, mode, needle):
    """A grid launched with launch_dependent: until a thread's grid_dependency_wait the grid before it may still run,
    so the thread may not write global memory (mode 2) nor read what that grid wrote (mode 1); reading what it left
    alone (mode 3) is fine, and anything after the wait (mode 0). The same kernel launched plainly: no rule."""
    n = 32
    a, b, out = np.zeros(n, np.float32), np.full(n, 7.0, np.float32), np.zeros(n, np.float32)
    emu.register(a=a, b=b, out=out)
    err = emu.try_call("pdl", a, b, n, mode, 1, out)
    if needle is None:
        assert err is None, err
        np.testing.assert_array_equal(out, 1.0 + np.arange(n) if mode == 0 else np.full(n, 7.0))
    else:
        assert err is not None and needle in err and "before grid_dependency_wait in a kernel launched with " \
            "programmatic dependent launch" in err and "api_kernels.cu:" in err, err
        assert ("the previous kernel wrote these bytes" if mode == 1 else "may still read or write") in err, err
    assert emu.try_call("pdl", a, b, n, mode, 0, out) is None


def test_one_bulk_copy_between_ctas(cluster_dev):
    """k_cluster_misuse, mode 0: rank 0's st_shared stores (fenced before the cluster_sync) copied into rank 1."""
    out = np.full((32, 4), np.nan, np.float32)
    cluster_dev.register(out=out)
    cluster_dev.call("cluster_misuse", 0, out)
    np.testing.assert_array_equal(out, np.stack([np.arange(32), np.zeros(32), np.ones(32), np.full(32, 2)], 1))


@pytest.mark.parametrize("mode,needle", [
    (1, "cp.async.bulk.shared::cluster: the destination is in CTA rank 1, the mbarrier in CTA rank 0 (they must be in "
        "the same CTA)"),
    (2, "cp.async.bulk.shared::cluster of 504 bytes from 0x"),
    (3, "mbarrier_arrive_cluster: 0x01000000 is not a shared::cluster address"),
    (4, "cp.async.bulk.shared::cluster destination: shared::cluster address 0x81000180 (CTA rank 1, offset 384, +512 "
        "bytes) is outside the CTA's 640 bytes of dynamic shared memory"),
    (5, "mbarrier_arrive_cluster: no mbarrier_init at smem offset 0 of CTA rank 1 before its use"),
    (6, "were written by st.shared of thread 0 and published by a barrier or mbarrier arrive before its "
        "fence_proxy_async (a generic-proxy write the bulk copy's async proxy may not see)"),
    (7, "block (1,0,0): mbarrier at smem offset 0 (initialised at"),
], ids=["bar-in-other-cta", "size", "not-a-cluster-address", "past-target-smem", "uninitialised", "st-shared-unfenced",
        "in-flight-at-exit"])
def test_bulk_copy_to_another_cta_misuse_is_reported(emu, mode, needle):
    """Checked per copy: mbarrier and destination in one CTA, the 16-byte grain, a shared::cluster address, the
    target's bounds, an initialised barrier, st_shared source bytes fenced before the release that published them;
    and at the target's exit, a copy from another CTA still in flight on its barrier (check_bulk_drained)."""
    out = np.full((32, 4), np.nan, np.float32)
    emu.register(out=out)
    err = emu.try_call("cluster_misuse", mode, out)
    assert err is not None and needle in err, err
    if mode == 7:
        assert "has a phase that never completed when the block exited: 1 arrival(s) and -512 transaction byte(s) " \
            "still due, 1 bulk copy(ies) in flight" in err, err


@pytest.mark.parametrize("landing", ["wait", "issue"])
def test_cluster_proxy_fence_is_checked_in_both_landing_modes(emu, landing):
    """The bulk copy's source check does not depend on when the cp.asyncs landed; fault injection reaches it too."""
    src, out, want = _cluster_case()
    emu.register(src=src, out=out)
    emu.landing(landing)
    err = emu.try_call("cluster_swap", src, 1, 5, 3, out)
    assert err is not None and "the bulk copy's async proxy may not see it" in err, err
    emu.fault("skip_fence_proxy_async", -1)
    out[:] = np.nan
    err = emu.try_call("cluster_swap", src, 1, 5, 0, out)
    assert emu.lib.va_emu_fault_hits() > 0
    assert err is not None and "the bulk copy's async proxy may not see it" in err, err


@pytest.mark.parametrize("landing", ["wait", "issue"])
def test_reading_the_peers_half_before_the_full_wait_is_caught(emu, landing):
    """Without the FULL wait the peer's half has not landed (landing "wait": a copy from another CTA completes, and
    lands, at the first wait on its phase, which never comes: the reads see the NaN fill, the next tile's arrivals
    overrun the phase, and the exit check finds the copies still in flight); landing at issue, the reads race the
    peer's copy."""
    src, out, want = _cluster_case()
    emu.register(src=src, out=out)
    emu.landing(landing)
    err = emu.try_call("cluster_swap", src, 1, 5, 5, out)
    assert err is not None or not np.array_equal(out, want), "the missing FULL wait went unnoticed"
    if landing == "wait":
        assert np.isnan(out).any()
        assert err is not None and "never completed when the block exited" in err, err
