"""The speculative loop emits exactly what plain greedy decoding emits: both layouts, chain and DDTree
trees, TP 1 and TP 2 (gloo; TP 8 with --runslow), the reference backend and (interpreted, fp32) Triton; a long prompt;
each KV allocator policy. Prompts are repetitive text (integration/loop/texts.py), so the real drafter
gets drafts accepted."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import verify_attn
import verify_attn.tree
from integration.loop.config import get_model_config
from integration.measure.decode import LOGIT_TOL, run_many, run_rank
from integration.loop.texts import repeated_prompt
from integration.loop.drafter import DFlashDrafter
from integration.loop.model import MLATarget
from integration.loop.spec import Engine, first_divergence, greedy_decode, speculative_decode
from integration.loop.tp import TPGroup, launch


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny():
    t = MLATarget(get_model_config("tiny"), TPGroup(), dtype=torch.float32, device="cpu")
    return t, DFlashDrafter(t, capacity=4096)


def prompt_of(target, ctx: int):
    return repeated_prompt(ctx, target.succ, target.cfg.vocab, 0).prompt


def _spec_vs_greedy(target, drafter, ctx: int, steps: int, page_size: int, tree: str, backend: str, budget: int = 12,
                    prefill_chunk: int | None = None, alloc: str = "shuffled"):
    prompt = prompt_of(target, ctx)
    e = Engine(target, backend=backend, page_size=page_size, capacity=ctx + 40 * steps + 64, prefill_chunk=prefill_chunk,
               alloc=alloc)
    toks, metrics = speculative_decode(e, drafter, prompt, steps, tree_kind=tree, budget=budget, check_cache=True)
    assert len(toks) == 1 + sum(m.commit_len for m in metrics)
    # --check: greedy on the reference backend (fp32: exact); 16-bit rounding may flip a near-tie against the
    # float64 reference, so there greedy runs on the same backend and the logits are bounded (LOGIT_TOL)
    same = target.dtype != torch.float32
    ref = greedy_decode(Engine(target, backend=backend if same else "reference", page_size=page_size,
                               capacity=ctx + 40 * steps + 64, alloc=alloc, check_backend="reference" if same else None),
                        prompt, len(toks), logit_errs=(errs := []))
    if same:
        assert max(errs) <= LOGIT_TOL[target.dtype], errs
    assert first_divergence(toks, ref) is None, f"diverges at {first_divergence(toks, ref)}: {toks} vs {ref}"
    return metrics


@pytest.mark.parametrize("page_size", [1, 16, 7])
@pytest.mark.parametrize("tree", ["ddtree", "chain"])
def test_spec_equals_greedy_reference(tiny, page_size: int, tree: str) -> None:
    metrics = _spec_vs_greedy(*tiny, ctx=97, steps=6, page_size=page_size, tree=tree, backend="reference")
    # the synthetic target is predictable enough that drafts get accepted (README: how acceptance arises)
    assert sum(m.accepted_drafts for m in metrics) > 0
    if tree == "ddtree":
        assert all(m.tree_size == 13 for m in metrics)
    else:
        assert all(m.tree_size == tiny[1].block for m in metrics)


@pytest.mark.parametrize("alloc", ["contiguous", "fragmented"])
def test_spec_equals_greedy_alloc(tiny, alloc: str) -> None:
    """The other KV allocator policies (item 6): same tokens, drafts accepted."""
    metrics = _spec_vs_greedy(*tiny, ctx=97, steps=4, page_size=1, tree="ddtree", backend="reference", alloc=alloc)
    assert sum(m.accepted_drafts for m in metrics) > 0


def test_spec_equals_greedy_long_prompt(tiny) -> None:
    """A prompt of several thousand tokens (TP 1): prefill in chunks, sliding-window drafter layers."""
    _spec_vs_greedy(*tiny, ctx=3000, steps=4, page_size=1, tree="ddtree", backend="reference", prefill_chunk=1024)


@pytest.mark.skipif("triton" not in verify_attn.available_backends(), reason="triton backend not available")
@pytest.mark.parametrize("page_size", [1, 16])
def test_spec_equals_greedy_triton(tiny, page_size: int) -> None:
    _spec_vs_greedy(*tiny, ctx=70, steps=3, page_size=page_size, tree="ddtree", backend="triton", budget=8)


def _backend_ok(name: str) -> bool:
    return name in verify_attn.available_backends()


@pytest.mark.parametrize("backend, dtype", [
    ("reference", torch.float32),
    pytest.param("cuda-emu", torch.float16, marks=pytest.mark.skipif(not _backend_ok("cuda-emu"),
                                                                     reason="cuda-emu backend not available")),
])
def test_spec_equals_greedy_kimi_head_shape(backend: str, dtype: torch.dtype) -> None:
    """small-k2: Kimi K2's per-rank attention (8 heads, 576/512 latent rows) with everything else tiny, so
    backends that only build that head family (the CUDA kernel and its CPU emulator) run in the loop."""
    target = MLATarget(get_model_config("small-k2"), TPGroup(), dtype=dtype, device="cpu")
    _spec_vs_greedy(target, DFlashDrafter(target), ctx=100, steps=2, page_size=1, tree="ddtree", backend=backend,
                    budget=8)


@pytest.mark.parametrize("tp", [2, pytest.param(8, marks=pytest.mark.slow)])
def test_tp_gloo_matches_tp1(tp) -> None:
    """2 (and, slow, 8) gloo ranks (one spawn): spec == greedy for page 1 + DDTree and paged + chain, and the
    sharded model emits the same tokens as TP 1."""
    base = dict(model="tiny", device="cpu", dtype="float32", tree="ddtree", budget=8, seed=0, simulate=False)
    jobs = [(dict(base, page_size=1), "reference", 60, 3, True),
            (dict(base, page_size=8, tree="chain"), "reference", 45, 3, True)]
    results = launch(tp, run_many, jobs)
    for (s, backend, ctx, steps, _), res8 in zip(jobs, results):
        assert res8["checked"] and res8["divergence"] is None, s
        res1 = run_rank(TPGroup(), s, backend, ctx, steps, False, False)
        assert res8["tokens"] == res1["tokens"], s


def test_decode_cli_check_exit_code() -> None:
    """The command line runs end to end and exits 0 with --check (TP 1, paged, chain)."""
    r = subprocess.run([sys.executable, "-m", "integration.measure.decode", "--model", "tiny", "--ctx", "80", "--steps", "3",
                        "--layout", "paged", "--page-size", "8", "--tree", "chain", "--check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "commit_len" in r.stdout and "check OK" in r.stdout


def _ignore_tree_mask(p, config, out, lse) -> None:
    """TEST-ONLY broken backend: every node sees the whole tree (siblings and cousins too)."""
    import dataclasses

    from verify_attn.reference import _run as reference_run
    t = p.total_q
    full = verify_attn.tree.pack_mask(torch.ones(t, t, dtype=torch.bool), p.mask_words).to(p.tree_mask.device)
    reference_run(dataclasses.replace(p, tree_mask=full), config, out, lse)


def test_check_catches_a_tree_mask_bug(tiny) -> None:
    """--check is not vacuous: a backend that ignores the tree mask (greedy's one-node trees are
    unaffected) is caught by the per-verify logit criterion, whether or not it flips a token."""
    from cases import temporary_backend
    from verify_attn.backends import Backend
    target, drafter = tiny
    prompt = prompt_of(target, 97)
    for name, expect_bad in (("reference", False), ("test-no-tree-mask", True)):
        e = Engine(target, backend=name, page_size=1, capacity=600, check_backend="reference")
        with temporary_backend(Backend("test-no-tree-mask", _ignore_tree_mask)):
            _, metrics = speculative_decode(e, drafter, prompt, 4, tree_kind="ddtree", budget=12)
        worst = max(m.logit_err for m in metrics)
        assert (worst > LOGIT_TOL[torch.float32]) == expect_bad, (name, worst)
