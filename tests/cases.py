"""Test cases shared by every backend's tests: fresh seeded random inputs, shuffled
slots/pages, NaN in everything a call must not read, and the float64 reference."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from verify_attn import tree as vtree
from verify_attn.api import build_problem
from verify_attn.layouts import lay_out
from verify_attn.reference import reference_verify

from verify_attn.fp8 import quantize_kwargs
from verify_attn.tolerances import FP8_LSE_ATOL, FP8_TOL, LSE_ATOL, TOL  # one table for tests, bench, autotune


@dataclass(frozen=True)
class CaseSpec:
    prefix_lens: tuple[int, ...] = (54,)
    tree_sizes: tuple[int, ...] = (5,)
    tree_kind: str = "bushy"
    hq: int = 8
    hkv: int = 1
    dqk: int = 576
    dv: int = 512
    mla: bool = True
    dtype: torch.dtype = torch.float32
    page_size: int = 1
    seed: int = 0
    sm_scale: float | None = None
    words: int | None = None          # tree_mask words (default: just enough)
    kv_dtype: str = ""                # "" (the cache in q's dtype), "fp8_e4m3" or "fp8_mla656" (verify_attn.fp8)
    extra: tuple = field(default=())  # free-form tag for ids

    @property
    def id(self) -> str:
        dt = str(self.dtype).replace("torch.", "")
        head = "mla" if self.mla else f"gqa{self.hq}x{self.hkv}"
        kv = f"-{self.kv_dtype}" if self.kv_dtype else ""
        return (f"{head}-d{self.dqk}-{dt}{kv}-p{self.page_size}-L{'_'.join(map(str, self.prefix_lens))}"
                f"-T{'_'.join(map(str, self.tree_sizes))}-{self.tree_kind}-s{self.seed}")


@dataclass
class Case:
    spec: CaseSpec
    kwargs: dict
    parents: list
    pool: object

    def problem(self):
        kw = dict(self.kwargs)
        return build_problem(kw.pop("q"), kw.pop("k_cache"), kw.pop("v_cache"), kw.pop("qo_indptr"),
                             kw.pop("kv_indptr"), kw.pop("kv_indices"), kw.pop("kv_lens"), kw.pop("tree_mask"),
                             kw.pop("sm_scale"), kw.pop("page_size"), **kw)


def make_case(spec: CaseSpec, device: str | torch.device = "cpu") -> Case:
    if len(spec.prefix_lens) != len(spec.tree_sizes):
        raise ValueError("prefix_lens and tree_sizes need one entry per request")
    g = torch.Generator().manual_seed(1000 + spec.seed)
    parents = [vtree.random_parents(t, spec.tree_kind, g) for t in spec.tree_sizes]
    qo_indptr, tree_mask = vtree.pack_batch(parents, spec.words)
    total_q = int(qo_indptr[-1])
    q = torch.randn(total_q, spec.hq, spec.dqk, generator=g)
    seqs_k, seqs_v = [], []
    for lb, tb in zip(spec.prefix_lens, spec.tree_sizes):
        seqs_k.append(torch.randn(lb + tb, spec.hkv, spec.dqk, generator=g))
        seqs_v.append(torch.randn(lb + tb, spec.hkv, spec.dv, generator=g))
    lay = lay_out(seqs_k, None if spec.mla else seqs_v, spec.page_size, mla_dv=spec.dv if spec.mla else None,
                  generator=g, dtype=spec.dtype)
    scale = spec.sm_scale if spec.sm_scale is not None else spec.dqk ** -0.5
    kwargs = dict(q=q.to(spec.dtype), k_cache=lay["k_cache"], v_cache=lay["v_cache"], qo_indptr=qo_indptr,
                  kv_indptr=lay["kv_indptr"], kv_indices=lay["kv_indices"], kv_lens=lay["kv_lens"],
                  tree_mask=tree_mask, sm_scale=scale, page_size=spec.page_size)
    if spec.kv_dtype:   # the fp8 cache made from this one (NaN slots stay NaN codes)
        kwargs = quantize_kwargs(kwargs, spec.kv_dtype, mla_dv=spec.dv if spec.mla else None)
    case = Case(spec, kwargs, parents, lay["pool"])
    if device != "cpu":
        case.kwargs = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
        if spec.mla and case.kwargs["v_cache"] is not None:  # keep V a view of K on the device
            case.kwargs["v_cache"] = case.kwargs["k_cache"][..., : spec.dv]
    return case


def case_tol(spec: CaseSpec) -> tuple[float, float, float]:
    """(atol, rtol, lse_atol) of a case: tolerances.TOL / LSE_ATOL, or FP8_TOL / FP8_LSE_ATOL for fp8 caches."""
    if spec.kv_dtype:
        return (*FP8_TOL[(spec.kv_dtype, spec.dtype)], FP8_LSE_ATOL[(spec.kv_dtype, spec.dtype)])
    return (*TOL[spec.dtype], LSE_ATOL[spec.dtype])


def poisoned_out(case: Case) -> torch.Tensor:
    q = case.kwargs["q"]
    return torch.full((q.shape[0], q.shape[1], case.spec.dv), float("nan"), dtype=q.dtype, device=q.device)


def check_against_reference(out: torch.Tensor, lse: torch.Tensor | None, case: Case,
                            atol: float | None = None, rtol: float | None = None) -> dict:
    """Assert out (and lse) match the float64 reference; returns the error stats."""
    d_atol, d_rtol, lse_atol = case_tol(case.spec)
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    ref_out, ref_lse = reference_verify(case.problem())
    o = out.double().cpu()
    r = ref_out.cpu()
    assert torch.isfinite(o).all(), f"{case.spec.id}: out has {int((~torch.isfinite(o)).sum())} non-finite values"
    err = (o - r).abs()
    bound = atol + rtol * r.abs()
    stats = {"max_abs_err": float(err.max()), "max_rel_err": float((err / r.abs().clamp_min(1e-3)).max())}
    if (err > bound).any():
        i = torch.nonzero(err > bound)[0].tolist()
        raise AssertionError(f"{case.spec.id}: out mismatch at {i}: got {float(o[tuple(i)])}, "
                             f"want {float(r[tuple(i)])} (atol {atol}, rtol {rtol}); {stats}")
    if lse is not None:
        l = lse.double().cpu()
        assert torch.isfinite(l).all(), f"{case.spec.id}: lse has non-finite values"
        lerr = float((l - ref_lse.cpu()).abs().max())
        stats["lse_max_abs_err"] = lerr
        assert lerr <= lse_atol, f"{case.spec.id}: lse max abs err {lerr} > {lse_atol} (tolerances)"
    return stats


def fp8_errors(case: Case, out: torch.Tensor, lse: torch.Tensor) -> tuple[float, float]:
    """(max |out - ref| / max |ref|, max |lse - ref|) against the float64 reference on the dequantized cache; out and
    lse must be finite."""
    ref, ref_lse = reference_verify(case.problem())
    o, l = out.double().cpu(), lse.double().cpu()
    assert torch.isfinite(o).all() and torch.isfinite(l).all(), case.spec.id
    rel = float((o - ref.cpu()).abs().max() / ref.abs().max())
    return rel, float((l - ref_lse.cpu()).abs().max())


def check_e4m3_mma_against_reference(out: torch.Tensor, lse: torch.Tensor, case: Case) -> tuple[float, float]:
    """The e4m3-MMA tiles' check (Q and P rounded to e4m3), two ways: against the exact reference, fp8_errors within
    tolerances.FP8_MMA_* (the format's documented cost); and against the reference with q rounded as the kernel
    rounds it, tolerances.check_e4m3_mma (from the emulator, CPU tensors: the LSE within the 16-bit bound, the
    scores being the kernel's own to fp32 rounding, which a wrong score fails long before the loose bound above; from
    a GPU, whose FP8 tensor cores accumulate with fewer bits, FP8_MMA_LSE_ATOL). Returns the first pair."""
    from verify_attn.reference import reference_e4m3_mma
    from verify_attn.tolerances import FP8_MMA_LSE_ATOL, FP8_MMA_REL_TOL, check_e4m3_mma

    rel, lse_err = fp8_errors(case, out, lse)
    assert rel <= FP8_MMA_REL_TOL and lse_err <= FP8_MMA_LSE_ATOL, (case.spec.id, rel, lse_err)
    ref_q, ref_q_lse = reference_e4m3_mma(case.problem())
    why = check_e4m3_mma(out.cpu(), ref_q.cpu(), case.spec.dtype, lse.cpu(), ref_q_lse.cpu(),
                         emulated=out.device.type == "cpu")
    assert why is None, (case.spec.id, why)
    return rel, lse_err


@contextlib.contextmanager
def temporary_backend(backend):
    """Register a test-only backend for the duration of a test only (other test modules list
    available_backends() and must not see it)."""
    from verify_attn.backends import _REGISTRY, register

    register(backend)
    try:
        yield backend
    finally:
        _REGISTRY.pop(backend.name, None)


class CountOps:
    """Every aten op dispatched inside the block, with the elements it touches: its tensor
    inputs and outputs; a view touches none, a gather (index) only what it reads (its
    output and its index tensors, not the whole source)."""

    VIEWS = {"aten.slice", "aten.unsqueeze", "aten.view", "aten.select", "aten.expand", "aten.empty",
             "aten.new_empty", "aten.alias", "aten.detach", "aten.reshape", "aten._reshape_alias", "aten.as_strided"}
    GATHERS = {"aten.index", "aten.gather", "aten.index_select", "aten.take"}

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils import _pytree as pytree
        ops = self.ops = []
        views, gathers = self.VIEWS, self.GATHERS

        def numel(tree):
            return sum(t.numel() for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor))

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                name = str(func.overloadpacket)
                if name in views:
                    n = 0
                elif name in gathers:
                    n = numel(out) + numel((args[1:], kwargs))
                else:
                    n = numel((args, kwargs, out))
                ops.append((name, n))
                return out
        self.mode = Mode()

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)

    def kernels(self) -> list:
        """Ops that launch device work (views and allocations (empty, new_empty) excluded)."""
        return [o for o in self.ops if o[0] not in self.VIEWS]
