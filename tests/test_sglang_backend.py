"""integration/serving/sglang_backend.py: the SGLang attention backend class, at its interface.

SGLang's ForwardBatch, RadixAttention, KV pool and model runner need its GPU stack to import, so
the tests drive the class with stand-ins that carry exactly the fields it reads; a test parses
SGLang's own source (fetched by tests/fetch_sglang_ref.sh) and checks that every one of those
names exists there. The draft tokens' K/V reach the pool only through the backend's own
set_kv_buffer call (their slots start NaN), so a correct output shows the write and the read.
"""
from __future__ import annotations

import ast
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cases import CaseSpec, CountOps, check_against_reference
from integration.serving.sglang_backend import TreeVerifyAttnBackend, install
from test_sglang_one_launch import GQA, MLA_SMALL, serving_inputs
from verify_attn.backends import get_backend

SGLANG_SRC = Path(__file__).parent / "sglang_ref" / "sglang" / "srt"


# --- stand-ins: the fields the backend reads, nothing else ----------------------------------

class Mode:
    def __init__(self, verify: bool):
        self.verify = verify

    def is_target_verify(self) -> bool:
        return self.verify


class Pool:
    """A KV pool per layer: [num_slots, Hkv, D] K and V (V a view of K for MLA)."""

    def __init__(self, k_layers, v_layers):
        self.k, self.v, self.writes = k_layers, v_layers, []

    def get_key_buffer(self, layer_id):
        return self.k[layer_id]

    def get_value_buffer(self, layer_id):
        return self.v[layer_id]

    def set_kv_buffer(self, layer, loc, cache_k, cache_v, k_scale=None, v_scale=None):
        loc = getattr(loc, "loc", loc)
        self.writes.append(layer.layer_id)
        self.k[layer.layer_id][loc] = cache_k.to(self.k[layer.layer_id].dtype)
        if self.v[layer.layer_id].data_ptr() != self.k[layer.layer_id].data_ptr():
            self.v[layer.layer_id][loc] = cache_v.to(self.v[layer.layer_id].dtype)


class Inner:
    """The wrapped backend: records what reached it."""

    def __init__(self):
        self.calls = []
        self.something = "inner's attribute"

    def init_forward_metadata(self, fb):
        self.calls.append("init_forward_metadata")

    def init_forward_metadata_out_graph(self, fb, in_capture=False):
        self.calls.append("init_forward_metadata_out_graph")

    def init_cuda_graph_state(self, max_bs, max_num_tokens):
        self.calls.append("init_cuda_graph_state")

    def forward_extend(self, q, k, v, layer, fb, save_kv_cache=True, **kw):
        self.calls.append("forward_extend")
        return "inner"

    def forward_decode(self, q, k, v, layer, fb, save_kv_cache=True, **kw):
        self.calls.append("forward_decode")
        return "inner"


def layer_of(spec: CaseSpec, layer_id: int, sm_scale: float, **over):
    base = dict(layer_id=layer_id, tp_q_head_num=spec.hq, tp_k_head_num=spec.hkv, qk_head_dim=spec.dqk,
                v_head_dim=spec.dv, scaling=sm_scale, k_scale=None, v_scale=None, k_scale_float=None,
                v_scale_float=None, logit_cap=0.0, sliding_window_size=-1, is_cross_attention=False)
    base.update(over)
    return SimpleNamespace(**base)


def setup(spec: CaseSpec, page_size: int, layers: int = 2):
    """(backend, forward batch, layers, the per-layer k/v of the draft tokens, cases per layer)."""
    sgl, case = serving_inputs(spec, page_size)
    ext = sgl["out_cache_loc"]
    k_layers, v_layers, kv_new, cases = [], [], [], []
    for i in range(layers):
        k = sgl["k_buffer"] * (1 + i)                       # each layer its own pool values
        v = k[..., : spec.dv] if spec.mla else sgl["v_buffer"] - i
        new_k, new_v = k[ext].clone(), v[ext].clone()
        k[ext] = float("nan")                                # the draft rows arrive by set_kv_buffer
        if not spec.mla:
            v[ext] = float("nan")
        k_layers.append(k)
        v_layers.append(v)
        kv_new.append((new_k, new_v))
        c = serving_inputs(spec, page_size)[1]
        c.kwargs["k_cache"] = case.kwargs["k_cache"] * (1 + i)
        c.kwargs["v_cache"] = c.kwargs["k_cache"][..., : spec.dv] if spec.mla else case.kwargs["v_cache"] - i
        cases.append(c)
    pool = Pool(k_layers, v_layers)
    runner = SimpleNamespace(req_to_token_pool=SimpleNamespace(req_to_token=sgl["req_to_token"]),
                             token_to_kv_pool=pool, page_size=page_size,
                             model_config=SimpleNamespace(context_len=sgl["req_to_token"].shape[1]),
                             use_mla_backend=spec.mla)
    be = TreeVerifyAttnBackend.from_runner(runner, Inner(), backend="reference")
    spec_info = SimpleNamespace(custom_mask=sgl["custom_mask"], draft_token_num=max(spec.tree_sizes),
                                num_tokens_per_req=-1)
    fb = SimpleNamespace(forward_mode=Mode(True), req_pool_indices=sgl["req_pool_indices"],
                         seq_lens=sgl["seq_lens"], seq_lens_cpu=sgl["seq_lens"].clone(),
                         out_cache_loc=ext, spec_info=spec_info)
    lays = [layer_of(spec, i, sgl["sm_scale"]) for i in range(layers)]
    return be, fb, lays, kv_new, cases, sgl


UNIFORM = [   # SGLang's target verify: every request has the same number of draft tokens
    CaseSpec(prefix_lens=(40, 0, 13), tree_sizes=(6, 6, 6), tree_kind="bushy", seed=31, **GQA),
    CaseSpec(prefix_lens=(50, 9), tree_sizes=(8, 8), tree_kind="deep", seed=32, **MLA_SMALL),
]


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("spec", UNIFORM, ids=lambda s: s.id)
def test_target_verify_writes_then_attends(spec, page_size):
    be, fb, lays, kv_new, cases, sgl = setup(spec, page_size)
    be.init_forward_metadata(fb)
    assert be.inner.calls == ["init_forward_metadata"] and be.step is not None
    for i, lay in enumerate(lays):
        k, v = kv_new[i]
        q = sgl["q"].reshape(sgl["q"].shape[0], -1)          # SGLang hands q flat per token
        o = be.forward_extend(q, k, v, lay, fb)
        assert o.shape == (q.shape[0], spec.hq * spec.dv)
        check_against_reference(o.view(-1, spec.hq, spec.dv), None, cases[i])
    assert be.token_to_kv_pool.writes == [0, 1]
    assert be.inner.calls == ["init_forward_metadata"]      # nothing else reached the wrapped backend


def test_other_modes_and_unsupported_layers_go_to_the_wrapped_backend(caplog):
    spec = UNIFORM[0]
    be, fb, lays, kv_new, _, sgl = setup(spec, 1)
    q = sgl["q"].reshape(sgl["q"].shape[0], -1)
    be.init_forward_metadata(SimpleNamespace(**{**fb.__dict__, "forward_mode": Mode(False)}))
    assert be.step is None
    assert be.forward_extend(q, *kv_new[0], lays[0], SimpleNamespace(**{**fb.__dict__, "forward_mode": Mode(False)})) \
        == "inner"
    assert be.forward_decode(q, *kv_new[0], lays[0], fb) == "inner"
    be.init_forward_metadata(fb)
    with caplog.at_level(logging.WARNING):
        assert be.forward_extend(q, *kv_new[0], layer_of(spec, 0, 1.0, logit_cap=30.0), fb) == "inner"
        assert be.forward_extend(q, *kv_new[0], lays[0], fb, sinks=torch.zeros(spec.hq)) == "inner"
    assert "logit_cap=30.0" in caplog.text and "sinks" in caplog.text
    assert be.token_to_kv_pool.writes == []                  # refused before any write
    assert be.something == "inner's attribute"               # attributes we lack are the wrapped backend's


def test_graph_state_plans_into_fixed_buffers():
    spec = UNIFORM[0]
    be, fb, lays, kv_new, cases, sgl = setup(spec, 16)
    be.init_cuda_graph_state(max_bs=4, max_num_tokens=4 * 6)
    assert be.inner.calls == ["init_cuda_graph_state"]
    be.init_forward_metadata_out_graph(fb, in_capture=True)
    first = (be.step.qo_indptr.data_ptr(), be.step.kv_indices.data_ptr(), be.step.tree_mask.data_ptr())
    be.init_forward_metadata_out_graph(fb)
    assert (be.step.qo_indptr.data_ptr(), be.step.kv_indices.data_ptr(), be.step.tree_mask.data_ptr()) == first
    q = sgl["q"].reshape(sgl["q"].shape[0], -1)
    o = be.forward_extend(q, *kv_new[0], lays[0], fb)
    check_against_reference(o.view(-1, spec.hq, spec.dv), None, cases[0])


def test_one_layer_dispatches_the_kv_write_and_one_kernel():
    """Per layer on the CPU kernels (cuda-emu): SGLang's own KV write (what every backend does) and
    exactly one attention op; the plan ran once, at the metadata call."""
    ok, why = get_backend("cuda-emu").available()
    if not ok:
        pytest.skip(f"cuda-emu unavailable: {why}")
    import verify_attn
    spec = CaseSpec(prefix_lens=(30, 7), tree_sizes=(5, 5), seed=33, dtype=torch.bfloat16, **GQA)
    be, fb, lays, kv_new, cases, sgl = setup(spec, 1)
    be.backend = "cuda-emu"
    q = sgl["q"].reshape(sgl["q"].shape[0], -1)
    verify_attn.set_validation("shapes")
    try:
        be.init_forward_metadata(fb)
        be.forward_extend(q, *kv_new[0], lays[0], fb)       # warm: build the emulator, error flags
        for i, lay in enumerate(lays):
            with CountOps() as c:
                o = be.forward_extend(q, *kv_new[i], lay, fb)
            # the stand-in pool stores K and V with one index_put_ each (SGLang's pool: its store kernel)
            assert [n for n, _ in c.kernels()] == ["aten.index_put_"] * 2 + ["verify_attn_emu.tree_verify"], \
                c.kernels()
            check_against_reference(o.view(-1, spec.hq, spec.dv), None, cases[i])
    finally:
        verify_attn.set_validation("full")


def test_install_wraps_a_registry_entry():
    made = []
    registry = {"triton": lambda runner: made.append(runner) or Inner()}
    spec = UNIFORM[0]
    be0, *_ = setup(spec, 1)
    runner = SimpleNamespace(req_to_token_pool=SimpleNamespace(req_to_token=be0.req_to_token),
                             token_to_kv_pool=be0.token_to_kv_pool, page_size=1,
                             model_config=SimpleNamespace(context_len=100), use_mla_backend=False)
    create = install(registry=registry, backend="reference")
    assert registry["triton"] is create and install(registry=registry) is create   # idempotent
    be = registry["triton"](runner)
    assert isinstance(be, TreeVerifyAttnBackend) and isinstance(be.inner, Inner) and made == [runner]
    assert be.max_context_len == 100
    install(registry=registry, name="tree_verify", wrap="triton")
    assert "tree_verify" in registry
    with pytest.raises(ValueError, match="no attention backend 'flashinfer'"):
        install(registry=registry, name="x", wrap="flashinfer")
    import importlib.util
    if importlib.util.find_spec("sglang") is None:
        with pytest.raises(RuntimeError, match="needs SGLang importable"):
            install()


# --- the names, against SGLang's source ------------------------------------------------------

def _source(rel: str) -> ast.Module:
    path = SGLANG_SRC / rel
    if not path.is_file():
        pytest.skip(f"SGLang's source not fetched ({path}): bash tests/fetch_sglang_ref.sh")
    return ast.parse(path.read_text())


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"class {name} not found")


def _fields(cls: ast.ClassDef) -> set[str]:
    """Annotated class fields, methods, and self.X assignments anywhere in the class."""
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    names.add(t.attr)
    return names


def test_every_name_the_backend_reads_exists_in_sglang():
    """The stand-ins above carry exactly what sglang_backend.py reads; each name must be SGLang's
    (0.5.23, the release tests/fetch_sglang_ref.sh fetches)."""
    want = {
        ("model_executor/forward_batch_info.py", "ForwardBatch"):
            {"forward_mode", "req_pool_indices", "seq_lens", "seq_lens_cpu", "out_cache_loc", "spec_info"},
        ("model_executor/forward_batch_info.py", "ForwardMode"): {"is_target_verify"},
        ("speculative/eagle_info.py", "EagleVerifyInput"): {"custom_mask", "draft_token_num", "num_tokens_per_req"},
        ("layers/radix_attention.py", "RadixAttention"):
            set(layer_of(UNIFORM[0], 0, 1.0).__dict__),
        ("mem_cache/memory_pool.py", "KVCache"): {"get_key_buffer", "get_value_buffer", "set_kv_buffer"},
        ("mem_cache/memory_pool.py", "ReqToTokenPool"): {"req_to_token"},
        ("mem_cache/memory_pool.py", "KVWriteLoc"): {"for_batch", "loc"},
        ("model_executor/model_runner.py", "ModelRunner"):
            {"req_to_token_pool", "token_to_kv_pool", "page_size", "model_config", "use_mla_backend"},
        ("layers/attention/base_attn_backend.py", "AttentionBackend"):
            {"init_forward_metadata", "init_forward_metadata_out_graph", "init_cuda_graph_state", "forward",
             "forward_extend", "forward_decode"},
    }
    missing = []
    for (rel, cls), names in want.items():
        have = _fields(_class(_source(rel), cls))
        missing += [f"{cls}.{n} ({rel})" for n in sorted(names - have)]
    assert not missing, missing
    # the stand-ins carry no field beyond those checked
    be, fb, *_ = setup(UNIFORM[0], 1)
    assert set(fb.__dict__) <= want[("model_executor/forward_batch_info.py", "ForwardBatch")]
    assert set(fb.spec_info.__dict__) <= want[("speculative/eagle_info.py", "EagleVerifyInput")]
    registry = _source("layers/attention/attention_registry.py")
    assert any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "ATTENTION_BACKENDS" for t in n.targets)
               for n in registry.body), "attention_registry.ATTENTION_BACKENDS not found"
    # the runner's context length, read where SGLang's Triton backend reads it
    assert "model_runner.model_config.context_len" in (SGLANG_SRC / "layers/attention/triton_backend.py").read_text()
