"""FP8 KV caches (issue 17): e4m3 with per-tensor scales (SGLang's) and FlashMLA's 656-byte MLA row.

- the e4m3 decoders (the kernels' integer one, and the reference's) against torch's float8
  conversion on all 256 codes;
- the 656-byte row: byte layout, exact dequantization, quantizer round trip;
- the float64 reference reads the dequantized values exactly;
- both Triton backends (interpreted, fp16 q) against the float64 reference ON THE DEQUANTIZED
  CACHE within tolerances.FP8_TOL, random trees, page_size 1 and paged, both formats, with
  NaN codes in every slot the call must not read and a NaN-poisoned out;
- validation of every bad combination, and backends that do not read a format refuse it.
"""
from __future__ import annotations

import dataclasses
import os
import struct

import pytest
import torch

from cases import CaseSpec, check_against_reference, make_case, poisoned_out
import verify_attn
from verify_attn import KernelConfig, fp8, tree_verify
from verify_attn.backends import Backend
from verify_attn.reference import kv_rows, reference_verify

HAS_GPU = torch.cuda.is_available()
DEVICE = "cuda" if HAS_GPU else "cpu"
BACKENDS = ("triton-serial", "triton")
SMALL = KernelConfig(num_splits=3, block_n=16, block_m=16, num_warps=4, num_stages=1)
ALL_CODES = torch.arange(256, dtype=torch.uint8)


# ------------------------------------------------------------------------------ e4m3 codes

def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN at the same codes, and the sign of zero kept."""
    nan = torch.isnan(a)
    if not torch.equal(nan, torch.isnan(b)):
        return False
    a, b = a[~nan].double(), b[~nan].double()
    return torch.equal(a, b) and torch.equal(torch.signbit(a), torch.signbit(b))


def test_reference_decoder_matches_torch_on_all_256_codes():
    want = ALL_CODES.view(torch.float8_e4m3fn).to(torch.float64)
    got = fp8.e4m3_decode_reference(ALL_CODES)
    assert _same(got, want)
    assert int(torch.isnan(want).sum()) == 2 and float(want[0x7E]) == fp8.E4M3_MAX and float(want[1]) == 2.0 ** -9


if HAS_GPU or os.environ.get("TRITON_INTERPRET") == "1":
    import triton
    import triton.language as tl

    from verify_attn.backends import triton_common as tc

    @triton.jit
    def _decode_all(X, Y):
        o = tl.arange(0, 256)
        tl.store(Y + o, tc.e4m3_to_f32(tl.load(X + o)))


@pytest.mark.skipif(not (HAS_GPU or os.environ.get("TRITON_INTERPRET") == "1"), reason="needs Triton")
def test_kernel_decoder_matches_torch_on_all_256_codes():
    """The Triton kernels' integer decoder (what runs under the interpreter): sign, exponent bias 7,
    subnormals, 0x7F/0xFF NaN, -0.0 for 0x80."""
    x = ALL_CODES.to(DEVICE)
    y = torch.empty(256, dtype=torch.float32, device=DEVICE)
    _decode_all[(1,)](x, y)
    assert _same(y.cpu(), ALL_CODES.view(torch.float8_e4m3fn).to(torch.float32))


def test_quantize_e4m3_saturates_keeps_nan_and_rounds_to_nearest():
    x = torch.tensor([0.0, 1.0, -3.0, 1000.0, -1000.0, float("nan"), 1.0625, 1.1875])
    q, s = fp8.quantize_e4m3(x, scale=1.0)
    d = fp8.dequantize_e4m3(q, s)
    assert d[:5].tolist() == [0.0, 1.0, -3.0, 448.0, -448.0] and torch.isnan(d[5])
    assert d[6:].tolist() == [1.0, 1.25]            # ties to even: 1.0625 -> 1.0, 1.1875 -> 1.25
    q2, s2 = fp8.quantize_e4m3(torch.tensor([0.5, -2.0, float("nan")]))
    assert s2 == 2.0 / 448 and float(fp8.dequantize_e4m3(q2, s2)[1]) == pytest.approx(-2.0, rel=1e-12)
    with pytest.raises(ValueError, match="scale"):
        fp8.quantize_e4m3(x, scale=0.0)


# ------------------------------------------------------------------------------ the 656-byte row

def test_mla656_byte_layout():
    """Bytes 0..511 e4m3 codes, 512..527 four little-endian fp32 scales (one per 128 values),
    528..655 64 little-endian bf16 RoPE values (FlashMLA README, "FP8 KV Cache")."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 1, 576, generator=g)
    x[0, 0, 128:256] *= 100          # block 1 of row 0 has a larger range: its own scale
    x[2, 0, :128] = 0                # an all-zero block: scale 1
    rows = fp8.quantize_mla656(x)
    assert rows.dtype == torch.uint8 and rows.shape == (3, 1, 656)
    b = bytes(rows[0, 0].tolist())
    scales = struct.unpack("<4f", b[512:528])
    for i in range(4):
        amax = float(x[0, 0, 128 * i: 128 * (i + 1)].abs().max())
        assert scales[i] >= amax / 448 and scales[i] < 2 * amax / 448            # amax/448 rounded up to 2^k
        assert scales[i] == 2.0 ** round(torch.log2(torch.tensor(scales[i])).item())
    assert scales[1] > 50 * scales[0]
    assert struct.unpack("<4f", bytes(rows[2, 0].tolist())[512:528])[0] == 1.0
    rope = struct.unpack("<64H", b[528:656])
    want = x[0, 0, 512:].to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    assert list(rope) == want.tolist()
    codes = torch.tensor(list(b[:512]), dtype=torch.uint8)
    deq = fp8.e4m3_decode_reference(codes).view(4, 128) * torch.tensor(scales, dtype=torch.float64)[:, None]
    full = fp8.dequantize_mla656(rows)[0, 0]
    assert torch.equal(full[:512], deq.reshape(512))
    assert torch.equal(full[512:], x[0, 0, 512:].to(torch.bfloat16).double())
    # round trip: each value within half an e4m3 step of its block (3 mantissa bits: 2^-4 relative)
    err = (full[:512] - x[0, 0, :512].double()).abs()
    assert float((err / torch.tensor(scales, dtype=torch.float64).repeat_interleave(128)).max()) <= 16


def test_mla656_nan_row_stays_nan():
    x = torch.full((2, 1, 576), float("nan"))
    assert torch.isnan(fp8.dequantize_mla656(fp8.quantize_mla656(x))).all()


def test_kv_row_bytes():
    assert fp8.kv_row_bytes("bf16", 576, 512, True) == 1152
    assert fp8.kv_row_bytes("fp8_e4m3", 576, 512, True) == 576
    assert fp8.kv_row_bytes("fp8_mla656", 576, 512, True) == 656
    assert fp8.kv_row_bytes("fp8_e4m3", 128, 128, False) == 256
    with pytest.raises(ValueError, match="fp8_mla656"):
        fp8.kv_row_bytes("fp8_mla656", 128, 128, False)


# ------------------------------------------------------------------------------ the reference

@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_mla656"])
def test_reference_reads_dequantized_values_exactly(kv_dtype):
    case = make_case(CaseSpec(prefix_lens=(20, 3), tree_sizes=(4, 2), dtype=torch.float16, page_size=4,
                              kv_dtype=kv_dtype, seed=2))
    p = case.problem()
    kw = case.kwargs
    if kv_dtype == "fp8_e4m3":
        assert p.k_scale == kw["k_scale"] and p.v_scale == kw["k_scale"] and p.k_scale != 1.0
        whole = kw["k_cache"].to(torch.float64) * kw["k_scale"]
    else:
        whole = fp8.dequantize_mla656(kw["k_cache"])
    idx = p.kv_indices[: int(p.kv_indptr[1])]
    k, v = kv_rows(p, idx, 0, 24)
    t = torch.arange(24)
    want = whole[idx[t // 4].long(), t % 4]
    assert k.dtype == torch.float64 and torch.equal(k, want) and torch.equal(v, want[..., :512])
    # the whole reference equals the float64 computation over the dequantized cache with q in float64
    deq = dataclasses.replace(p, q=p.q.double(), k_cache=whole, v_cache=whole[..., :512], kv_dtype="fp32",
                              k_scale=1.0, v_scale=1.0)
    o1, l1 = reference_verify(p)
    o2, l2 = reference_verify(deq)
    assert torch.equal(o1, o2) and torch.equal(l1, l2)


def test_reference_scale_as_tensor_equals_float():
    case = make_case(CaseSpec(prefix_lens=(9,), tree_sizes=(3,), hq=4, hkv=2, dqk=64, dv=64, mla=False,
                              dtype=torch.float16, kv_dtype="fp8_e4m3", seed=4))
    kw = dict(case.kwargs)
    a = tree_verify(**kw, backend="reference")
    kw.update(k_scale=torch.tensor(kw["k_scale"]), v_scale=torch.tensor(kw["v_scale"]))
    b = tree_verify(**kw, backend="reference")
    assert torch.equal(a, b)


# ------------------------------------------------------------------------------ Triton backends

# (prefix lens, tree sizes, tree kind, page size): page_size 1 and paged (4, and 16 with a tree of
# 37 nodes over two mask words), empty and odd prefixes, mixed batches
FP8_LAYOUTS = [
    ((54,), (5,), "bushy", 1),
    ((0, 33), (7, 3), "deep", 1),
    ((20, 1), (9, 4), "star", 4),
    ((17,), (37,), "bushy", 16),
]
HEADS = {
    "mla": dict(hq=8, hkv=1, dqk=576, dv=512, mla=True),
    "gqa-d64": dict(hq=4, hkv=2, dqk=64, dv=64, mla=False),
}


def _fp8_case(kv_dtype, layout, head="mla", seed=0, dtype=torch.float16):
    prefix, trees, kind, page = layout
    return make_case(CaseSpec(prefix_lens=prefix, tree_sizes=trees, tree_kind=kind, page_size=page, dtype=dtype,
                              seed=seed, kv_dtype=kv_dtype, **HEADS[head]), device=DEVICE)


def _run(case, backend, config=SMALL):
    out = poisoned_out(case)
    return tree_verify(**case.kwargs, backend=backend, config=config, out=out, return_lse=True)


@pytest.mark.parametrize("layout", FP8_LAYOUTS, ids=lambda l: f"L{l[0]}-T{l[1]}-p{l[3]}")
@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_mla656"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_triton_fp8_mla_matches_reference(backend, kv_dtype, layout):
    case = _fp8_case(kv_dtype, layout, seed=len(layout[0]) + layout[3])
    out, lse = _run(case, backend)
    check_against_reference(out, lse, case)


@pytest.mark.parametrize("backend", BACKENDS)
def test_triton_fp8_gqa_separate_v_and_tensor_scales(backend):
    """GQA with separate K and V (distinct per-tensor scales, given as 0-d device tensors)."""
    case = _fp8_case("fp8_e4m3", FP8_LAYOUTS[2], head="gqa-d64", seed=11)
    kw = case.kwargs
    assert kw["k_scale"] != kw["v_scale"]
    kw["k_scale"] = torch.tensor(kw["k_scale"], device=DEVICE)
    kw["v_scale"] = torch.tensor(kw["v_scale"], device=DEVICE)
    out, lse = _run(case, backend)
    check_against_reference(out, lse, case)


def test_triton_fp8_scales_reach_the_kernel():
    """A wrong k_scale or v_scale must change the answer (the tolerance check cannot pass by accident):
    run with both scales doubled and compare against the reference of the original scales."""
    case = _fp8_case("fp8_e4m3", FP8_LAYOUTS[0], head="gqa-d64", seed=12)
    kw = case.kwargs
    for name in ("k_scale", "v_scale"):
        bad = dict(kw, **{name: kw[name] * 2})
        out = poisoned_out(case)
        o, l = tree_verify(**bad, backend="triton", config=SMALL, out=out, return_lse=True)
        with pytest.raises(AssertionError):
            check_against_reference(o, l, case)


def test_triton_fp8_prefix_only_call():
    case = _fp8_case("fp8_mla656", FP8_LAYOUTS[1], seed=13)
    kw = dict(case.kwargs, tree_mask=None)
    out = poisoned_out(case)
    o, l = tree_verify(**kw, backend="triton", config=SMALL, out=out, return_lse=True)
    ro, rl = tree_verify(**kw, backend="reference", return_lse=True)
    atol, rtol = verify_attn.tolerances.FP8_TOL[("fp8_mla656", torch.float16)]
    torch.testing.assert_close(o.double().cpu(), ro.double().cpu(), atol=atol, rtol=rtol)
    torch.testing.assert_close(l.cpu(), rl.cpu(), atol=1e-3, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_mla656"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_triton_fp8_bf16_q_gpu_default_config(backend, kv_dtype):
    case = _fp8_case(kv_dtype, FP8_LAYOUTS[3], seed=14, dtype=torch.bfloat16)
    out, lse = _run(case, backend, config=None)
    check_against_reference(out, lse, case)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_mla656"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_triton_fp8_sweep(backend, kv_dtype, seed):
    for i, layout in enumerate(FP8_LAYOUTS):
        for cfg in (SMALL, KernelConfig(num_splits=1, block_n=32, block_m=16), KernelConfig(7, 16, 32)):
            case = _fp8_case(kv_dtype, layout, seed=100 + 10 * seed + i)
            out, lse = _run(case, backend, cfg)
            check_against_reference(out, lse, case)


# ------------------------------------------------------------------------------ validation

@pytest.fixture
def kw8():
    return dict(make_case(CaseSpec(prefix_lens=(10, 3), tree_sizes=(4, 2), dtype=torch.float16,
                                   kv_dtype="fp8_e4m3")).kwargs)


@pytest.fixture
def kw656():
    return dict(make_case(CaseSpec(prefix_lens=(10, 3), tree_sizes=(4, 2), dtype=torch.float16,
                                   kv_dtype="fp8_mla656")).kwargs)


def _call(kw, **over):
    return tree_verify(**{"backend": "reference", **kw, **over})


BAD_E4M3 = [
    (lambda k: {"q": k["q"].float()}, TypeError, "q must have dtype bfloat16 or float16 with an fp8 KV cache"),
    (lambda k: {"v_cache": k["k_cache"][..., :512].to(torch.float16)}, TypeError,
     "v_cache must have dtype float8_e4m3fn like k_cache"),
    (lambda k: {"k_scale": 0.0}, ValueError, "k_scale must be a finite positive float"),
    (lambda k: {"k_scale": float("inf")}, ValueError, "k_scale must be a finite positive float"),
    (lambda k: {"k_scale": float("nan")}, ValueError, "k_scale must be a finite positive float"),
    (lambda k: {"k_scale": "1"}, TypeError, "k_scale must be a float or a 0-d float32 tensor"),
    (lambda k: {"k_scale": True}, TypeError, "k_scale must be a float or a 0-d float32 tensor"),
    (lambda k: {"k_scale": torch.tensor([0.5])}, ValueError, "k_scale must be a 0-d tensor"),
    (lambda k: {"k_scale": torch.tensor(0.5, dtype=torch.float64)}, TypeError, "0-d float32 tensor, got a float64"),
    (lambda k: {"k_scale": torch.tensor(0.5, device="meta")}, ValueError, "k_scale must be on cpu"),
    (lambda k: {"v_scale": k["k_scale"] * 2}, ValueError, "v_scale must equal k_scale .* aliases"),
    (lambda k: {"k_scale": torch.tensor(0.5), "v_scale": torch.tensor(0.5)}, ValueError, "v_scale must equal k_scale"),
    (lambda k: {"kv_format": "fp8_mla656"}, TypeError, "k_cache must have dtype uint8"),
    (lambda k: {"kv_format": "bf16"}, ValueError, "kv_format='bf16' does not match"),
    (lambda k: {"kv_format": "fp4"}, ValueError, "kv_format must be one of"),
    (lambda k: {"kv_format": 8}, TypeError, "kv_format must be a str"),
]


@pytest.mark.parametrize("mk,exc,msg", BAD_E4M3, ids=[f"e4m3-{i}" for i in range(len(BAD_E4M3))])
def test_bad_fp8_e4m3_argument(kw8, mk, exc, msg):
    with pytest.raises(exc, match=msg):
        _call(kw8, **mk(kw8))


BAD_656 = [
    (lambda k: {"q": k["q"].float()}, TypeError, "q must have dtype bfloat16 or float16"),
    (lambda k: {"kv_format": None}, TypeError, "uint8: that is the 656-byte .* kv_format='fp8_mla656'"),
    (lambda k: {"k_cache": k["k_cache"].view(torch.float8_e4m3fn)}, TypeError, "view\\(torch.uint8\\)"),
    (lambda k: {"v_cache": k["k_cache"][..., :512]}, ValueError, "v_cache must be None"),
    (lambda k: {"k_scale": 1.0}, ValueError, "k_scale must be None: the fp8_mla656 rows carry their own"),
    (lambda k: {"v_scale": 1.0}, ValueError, "v_scale must be None"),
    (lambda k: {"k_cache": k["k_cache"][..., :640]}, ValueError, "k_cache rows must be 656 bytes"),
    (lambda k: {"k_cache": k["k_cache"].expand(-1, 2, -1)}, ValueError, "one latent KV head \\(Hkv=1\\)"),
    (lambda k: {"q": k["q"][..., :512].contiguous()}, ValueError, "Dqk=576"),
    (lambda k: {"k_cache": torch.zeros(k["k_cache"].numel() + 1, dtype=torch.uint8)[1:].view(k["k_cache"].shape)},
     ValueError, "viewable as float32"),
]


@pytest.mark.parametrize("mk,exc,msg", BAD_656, ids=[f"656-{i}" for i in range(len(BAD_656))])
def test_bad_fp8_mla656_argument(kw656, mk, exc, msg):
    with pytest.raises(exc, match=msg):
        _call(kw656, **mk(kw656))


def test_scales_refused_for_16_bit_caches():
    kw = dict(make_case(CaseSpec(prefix_lens=(5,), tree_sizes=(2,), dtype=torch.float16)).kwargs)
    with pytest.raises(ValueError, match="k_scale must be None: the cache is fp16"):
        _call(kw, k_scale=1.0)
    with pytest.raises(TypeError, match="v_cache has dtype float8_e4m3fn but k_cache has float16"):
        _call(kw, v_cache=kw["v_cache"].to(torch.float8_e4m3fn))


def test_mla_v_scale_defaults_to_k_scale(kw8):
    p = verify_attn.api.build_problem(*(kw8[k] for k in ("q", "k_cache", "v_cache", "qo_indptr", "kv_indptr",
                                                          "kv_indices", "kv_lens", "tree_mask", "sm_scale",
                                                          "page_size")), k_scale=0.25)
    assert p.kv_dtype == "fp8_e4m3" and p.k_scale == 0.25 and p.v_scale == 0.25 and p.mla_shared_kv


def test_fp8_656_accepts_v_cache_is_k_cache(kw656):
    a = _call(kw656)
    b = _call(kw656, v_cache=kw656["k_cache"])
    assert torch.equal(a, b) and a.dtype == torch.float16 and a.shape[-1] == 512


def test_backend_without_the_format_refuses_it(kw8):
    """A backend record without fp8 in kv_formats (the default, what cuda/cuda-emu have until their
    kernels read fp8) is refused with a reason naming the format; auto never picks it."""
    from cases import temporary_backend

    def run(*_a):
        raise AssertionError("must not run")

    with temporary_backend(Backend("native-only-test", run)):
        with pytest.raises(ValueError, match="KV cache format 'fp8_e4m3' is not implemented by backend"):
            _call(kw8, backend="native-only-test")
    for name in ("cuda", "cuda-emu"):
        b = verify_attn.backends.get_backend(name)
        if "fp8_e4m3" not in b.kv_formats and b.available()[0]:
            with pytest.raises(ValueError, match="KV cache format 'fp8_e4m3' is not implemented"):
                _call(kw8, backend=name)
    out = tree_verify(**kw8)      # auto on the CPU: the reference
    assert torch.isfinite(out).all()


# ------------------------------------------------------------------------------ bench: bytes, floors, CLI

def test_roofline_counts_fp8_rows():
    from bench.core import roofline as rl
    from verify_attn.shapes import get_shape

    kimi = get_shape("kimi-k2-tp8")
    tree = [[-1] + list(range(15))]
    tokens = 185_000 + 16
    bf16 = rl.count_shape(kimi, [185_000], tree)
    e4m3 = rl.count_shape(kimi, [185_000], tree, kv_dtype="fp8_e4m3")
    m656 = rl.count_shape(kimi, [185_000], tree, kv_dtype="fp8_mla656")
    assert (bf16.kv_bytes, e4m3.kv_bytes, m656.kv_bytes) == (tokens * 1152, tokens * 576, tokens * 656)
    assert e4m3.index_bytes == bf16.index_bytes == tokens * 4 and e4m3.q_bytes == bf16.q_bytes
    assert e4m3.flops == bf16.flops
    rtx = rl.RTX_PRO_6000
    assert rl.floor(bf16, rtx).bound == "memory" and rl.floor(e4m3, rtx).memory_us < 0.55 * rl.floor(bf16, rtx).memory_us
    gqa = get_shape("llama3-70b-tp8")
    assert rl.count_shape(gqa, [100], [[-1]], kv_dtype="fp8_e4m3").kv_bytes == 101 * gqa.num_kv_heads * 256


@pytest.mark.parametrize("kv_dtype,row", [("fp8_e4m3", 576), ("fp8_mla656", 656)])
def test_bench_verify_cli_kv_dtype(tmp_path, capsys, kv_dtype, row):
    from bench.benchmark import verify as bv

    js = tmp_path / "o.json"
    assert bv.main(["--ctx", "185k", "--kv-dtype", kv_dtype, "--json", str(js), "--no-save", "--quiet",
                    "--cpu-ctx-cap", "200", "--reps", "1", "--warmup", "0", "--no-model"]) == 0
    text = capsys.readouterr().out
    assert f"KV {kv_dtype} ({row} B per token per KV head)" in text
    import json
    d = json.loads(js.read_text())
    assert d["kv_dtype"] == kv_dtype and d["kv_row_bytes"] == row
    r = next(r for r in d["results"] if r["ctx"] == 185_000)
    assert r["counts"]["kv_bytes"] == (185_000 + 16) * row and r["kv_dtype"] == kv_dtype
    cpu = next(r for r in d["results"] if r["timed_on"] == "cpu")   # the CPU reference ran on an fp8 cache
    assert cpu["ctx"] == 200 and cpu["median_us"] > 0


@pytest.mark.parametrize("argv,msg", [
    (["--kv-dtype", "fp8_e4m3", "--dtype", "fp32"], "--kv-dtype fp8_e4m3 needs --dtype bf16 or fp16"),
    (["--kv-dtype", "fp8_mla656", "--shape", "llama3-70b-tp8"], "--kv-dtype fp8_mla656 is the MLA 576/512 row"),
    (["--kv-dtype", "fp16"], "--kv-dtype fp16 differs from --dtype bf16"),
])
def test_bench_verify_cli_bad_kv_dtype(capsys, argv, msg):
    from bench.benchmark import verify as bv

    with pytest.raises(SystemExit) as e:
        bv.main(argv + ["--no-save"])
    assert e.value.code == 2 and msg in capsys.readouterr().err


def test_bench_kernel_path_checks_fp8_against_the_reference():
    """sweep()'s GPU path on the CPU with an fp8 cache: triton (interpreted, fp16 q) passes the gate
    against the reference on the dequantized cache; a backend without fp8 is 'unsupported'."""
    from bench.benchmark import verify as bv
    from bench.core.timing import time_cpu
    from cases import temporary_backend

    with temporary_backend(Backend("native-only-bench", lambda p, c, out, lse: None)):
        a = bv.build_parser().parse_args(["--ctx", "40", "--tree", "3", "--dtype", "fp16", "--kv-dtype", "fp8_mla656",
                                          "--backend", "triton,native-only-bench", "--quiet", "--no-model"])
        d = bv.sweep(a, kernel_device="cpu", l2=1 << 12,
                     timer=lambda fns, cold: time_cpu(lambda: [f() for f in fns], reps=1, warmup=0))
    rows = {r["backend"]: r for r in d["results"]}
    assert rows["triton"]["status"] == "ok", rows["triton"]
    assert rows["native-only-bench"]["status"] == "unsupported" and "fp8_mla656" in rows["native-only-bench"]["note"]


# ------------------------------------------------------------------------------ tuned configs, autotune keys

def test_tuned_tables_are_keyed_by_kv_dtype():
    from autotune.cache import entry_key
    from verify_attn.tuned import TableKey

    base = TableKey("NVIDIA H200", "triton", 8, 1, 576, 512, "bf16", 1, True)
    fp = TableKey("NVIDIA H200", "triton", 8, 1, 576, 512, "bf16", 1, True, "fp8_e4m3")
    assert not base.matches(fp) and fp.matches(TableKey.from_dict(fp.to_dict()))
    assert "kv_dtype" not in base.to_dict() and ",kv_dtype=" not in base.filename()   # old files keep their names
    assert ",kv_dtype=fp8_e4m3," in fp.filename()
    with pytest.raises(ValueError, match="kv_dtype"):
        TableKey.from_dict(dict(fp.to_dict(), kv_dtype="fp4"))
    kw = dict(device_name="H200", backend="triton", shape_key="s", mla=True, dtype="bf16", page_size=1, batch=1,
              tree_kind="ddtree", ctx=4000, tree_nodes=16)
    assert entry_key(**kw) != entry_key(**kw, kv_dtype="fp8_mla656") and "|kv=" not in entry_key(**kw)


def test_autotune_plan_for_fp8_uses_fp8_tiles():
    from autotune.plan import make_plan
    from verify_attn.shapes import get_shape

    kimi = get_shape("kimi-k2-tp8")
    p = make_plan("triton", kimi, arch_name="sm_120a", ctxs=[4000], trees=[16], kv_dtype="fp8_mla656")
    assert p.kv_dtype == "fp8_mla656" and p.to_json()["kv_dtype"] == "fp8_mla656"
    stages = {t.candidate.config.num_stages for b in p.buckets for t in b.tiles}
    assert stages == {1}            # fp8_mla656 spills at 2 stages (triton_split.resources)
    with pytest.raises(ValueError, match="fp8_mla656"):
        make_plan("triton", get_shape("llama3-70b-tp8"), arch_name="sm_120a", ctxs=[4000], trees=[16],
                  kv_dtype="fp8_mla656")
