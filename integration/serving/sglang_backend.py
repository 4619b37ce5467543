"""An SGLang attention backend whose target verify is one verify_attn launch per layer.

`TreeVerifyAttnBackend` wraps the backend SGLang would have used (its Triton backend, say) and
takes over one case, target verify (`forward_batch.forward_mode.is_target_verify()`): the metadata
call plans the step once (verify_step.from_req_to_token: SGLang's req_to_token, seq_lens,
out_cache_loc and the EAGLE verify input's custom_mask), and each layer's forward_extend writes
the layer's K/V at out_cache_loc (as every SGLang backend does) and makes one tree_verify launch
over the pool. Every other call (prefill, decode, draft extend, and any verify call with an option
we do not serve: logit cap, sliding window, sinks, score_mod, cross attention, a scaled 16-bit
pool) goes to the wrapped backend unchanged, as does every attribute we do not define.

Enabling it (checked against sglang 0.5.23's attention_registry.py: the registry maps a name to a
factory of the model runner): before the server builds its model runner, in the same process,

    from integration.serving.sglang_backend import install
    install()                      # wraps the "triton" entry: --attention-backend triton now verifies with us
    install(name="tree_verify")    # or adds its own entry (if your SGLang's server args accept the name)

then launch SGLang as usual (e.g. `sglang.launch_server` from Python, --attention-backend triton,
EAGLE or another tree speculative algorithm). `install(backend="cuda")` picks the verify_attn
backend (default "auto": cuda on a GPU).

CUDA graphs: `init_cuda_graph_state(max_bs, max_num_tokens)` allocates fixed plan buffers for the
largest batch and context, and the per-step metadata hooks (`init_forward_metadata` eager,
`init_forward_metadata_out_graph` before capture and each replay) plan into them, outside the graph:
the captured layers read the same addresses every replay. Planning hint: eager steps plan for the
real longest context when `forward_batch.seq_lens_cpu` is on the host; graph steps for the capacity.

What this file reads of SGLang, by name (tests/test_sglang_backend.py checks every name against
SGLang's source): ForwardBatch.{forward_mode, req_pool_indices, seq_lens, seq_lens_cpu,
out_cache_loc, spec_info}; the verify input's {custom_mask, draft_token_num, num_tokens_per_req};
RadixAttention's {layer_id, tp_q_head_num, tp_k_head_num, qk_head_dim, v_head_dim, scaling, k_scale,
v_scale, k_scale_float, v_scale_float, logit_cap, sliding_window_size, is_cross_attention}; the KV
pool's {get_key_buffer, get_value_buffer, set_kv_buffer}; the model runner's {req_to_token_pool,
token_to_kv_pool, page_size, model_config}; KVWriteLoc.for_batch where it exists.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional

import torch

from .verify_step import StepBuffers, VerifyStep, from_req_to_token, verify_layer

_log = logging.getLogger(__name__)

# the base class SGLang's model runner expects, where SGLang imports; a plain object otherwise (tests)
try:  # pragma: no cover - needs SGLang and its GPU stack
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend as _Base
except Exception:  # noqa: BLE001 - absent, or present without its runtime
    _Base = object


def _write_loc(forward_batch):
    """What the pool's set_kv_buffer takes as the location: SGLang >= 0.5.2x wraps out_cache_loc in a
    KVWriteLoc (with its physical mark); older releases take the tensor."""
    try:  # pragma: no cover - needs SGLang
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc
    except Exception:  # noqa: BLE001
        return forward_batch.out_cache_loc
    return KVWriteLoc.for_batch(forward_batch)


def _unsupported(layer, kwargs: dict) -> Optional[str]:
    """Why one launch cannot serve this layer's verify call (the wrapped backend then does), or None."""
    for name in ("sinks", "score_mod", "aux_tensors"):
        if kwargs.get(name) is not None:
            return name
    if getattr(layer, "is_cross_attention", False):
        return "cross attention"
    if (getattr(layer, "logit_cap", 0) or 0) > 0:
        return f"logit_cap={layer.logit_cap}"
    sw = getattr(layer, "sliding_window_size", -1)
    if sw is not None and sw > -1:
        return f"sliding_window_size={sw}"
    return None


class TreeVerifyAttnBackend(_Base):
    """Target verify on verify_attn (one launch per layer); everything else on `inner`."""

    def __init__(self, inner, *, req_to_token: torch.Tensor, token_to_kv_pool, page_size: int = 1,
                 max_context_len: Optional[int] = None, backend: str = "auto", config=None, use_mla: bool = False):
        self.inner = inner
        self.req_to_token = req_to_token
        self.token_to_kv_pool = token_to_kv_pool
        self.page_size = int(page_size or 1)
        self.max_context_len = int(max_context_len or req_to_token.shape[1])
        self.backend = backend
        self.config = config
        self.use_mla = use_mla
        self.step: Optional[VerifyStep] = None
        self.graph_buffers: Optional[StepBuffers] = None
        self._warned: set[str] = set()

    @classmethod
    def from_runner(cls, runner, inner, **kw) -> "TreeVerifyAttnBackend":
        return cls(inner, req_to_token=runner.req_to_token_pool.req_to_token, token_to_kv_pool=runner.token_to_kv_pool,
                   page_size=getattr(runner, "page_size", 1) or 1,
                   max_context_len=getattr(getattr(runner, "model_config", None), "context_len", None),
                   use_mla=bool(getattr(runner, "use_mla_backend", False)), **kw)

    def __getattr__(self, name: str) -> Any:
        # only reached for names this object lacks: the wrapped backend's attributes and methods
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    # -- per-step metadata ----------------------------------------------------------------------

    def _plan(self, fb, buffers: Optional[StepBuffers]) -> None:
        self.step = None
        if not fb.forward_mode.is_target_verify():
            return
        spec = fb.spec_info
        t = getattr(spec, "num_tokens_per_req", -1)
        t = t if t is not None and t > 0 else spec.draft_token_num
        bs = fb.req_pool_indices.numel()
        qo_indptr = torch.arange(0, (bs + 1) * t, t, dtype=torch.int32, device=fb.seq_lens.device)
        mask_indptr = torch.zeros(bs + 1, dtype=torch.int64, device=fb.seq_lens.device)
        mask_indptr[1:] = torch.cumsum(t * (fb.seq_lens[:bs].to(torch.int64) + t), 0)
        hint = None
        if buffers is None and getattr(fb, "seq_lens_cpu", None) is not None:
            hint = int(fb.seq_lens_cpu[:bs].max()) + t            # a host tensor: no device sync
        self.step = from_req_to_token(req_to_token=self.req_to_token, req_pool_indices=fb.req_pool_indices,
                                      seq_lens=fb.seq_lens[:bs], out_cache_loc=fb.out_cache_loc, qo_indptr=qo_indptr,
                                      custom_mask=spec.custom_mask, mask_indptr=mask_indptr, max_tree=t,
                                      max_kv_len=self.max_context_len, page_size=self.page_size, buffers=buffers,
                                      plan_kv_len=hint)

    def init_forward_metadata(self, forward_batch) -> None:
        self.inner.init_forward_metadata(forward_batch)
        self._plan(forward_batch, None)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False) -> None:
        self.inner.init_forward_metadata_out_graph(forward_batch, in_capture)
        self._plan(forward_batch, self.graph_buffers)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.inner.init_cuda_graph_state(max_bs, max_num_tokens)
        max_tree = max(1, max_num_tokens // max(1, max_bs))
        self.graph_buffers = StepBuffers.allocate(max_bs=max_bs, max_tokens=max_num_tokens,
                                                  max_kv_len=self.max_context_len, max_tree=max_tree,
                                                  page_size=self.page_size, device=self.req_to_token.device)

    # -- per layer ------------------------------------------------------------------------------

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True, **kwargs):
        why = None if self.step is not None else "no verify plan for this forward"
        if why is None and not forward_batch.forward_mode.is_target_verify():
            why = "not target verify"
        why = why or _unsupported(layer, kwargs)
        pool = self.token_to_kv_pool
        if why is None:
            k_buf, v_buf = pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)
            fp8 = k_buf.dtype == torch.float8_e4m3fn
            scaled = getattr(layer, "k_scale", None) is not None
            if scaled and not fp8 and (layer.k_scale_float, layer.v_scale_float) != (1.0, 1.0):
                why = f"k_scale {layer.k_scale_float} on a {k_buf.dtype} pool"
        if why is not None:
            if why not in ("not target verify", "no verify plan for this forward") and why not in self._warned:
                self._warned.add(why)
                _log.warning("verify_attn: target verify on the wrapped backend: %s", why)
            return self.inner.forward_extend(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kwargs)

        if save_kv_cache and k is not None and v is not None:   # what every SGLang backend writes
            loc = _write_loc(forward_batch)
            if not scaled:
                pool.set_kv_buffer(layer, loc, k, v)
            elif self.use_mla:   # SGLang's MLA pool takes pre-scaled K (its Triton backend does the same)
                pool.set_kv_buffer(layer, loc, k.clone().div_(layer.k_scale), v)
            else:
                pool.set_kv_buffer(layer, loc, k, v, layer.k_scale, layer.v_scale)
        hq, dqk, dv = layer.tp_q_head_num, layer.qk_head_dim, layer.v_head_dim
        o = q.new_empty((q.shape[0], hq * dv))
        ks = layer.k_scale_float if scaled else None
        vs = layer.v_scale_float if scaled else None
        verify_layer(q.view(-1, hq, dqk), k_buf, v_buf, self.step, sm_scale=layer.scaling, out=o.view(-1, hq, dv),
                     k_scale=ks, v_scale=vs if not self.use_mla else None, backend=self.backend, config=self.config)
        return o

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True, **kwargs):
        return self.inner.forward_decode(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kwargs)

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True, **kwargs):
        if forward_batch.forward_mode.is_target_verify():
            return self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kwargs)
        return self.inner.forward(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kwargs)


def install(*, name: str = "triton", wrap: Optional[str] = None, backend: str = "auto", config=None,
            registry: Optional[dict] = None) -> Callable:
    """Register a factory in SGLang's ATTENTION_BACKENDS that builds `wrap`'s backend (default: the
    entry `name` had) and wraps it in TreeVerifyAttnBackend. Returns the factory. `registry`: the
    mapping to use (default: SGLang's own; tests pass a dict)."""
    if registry is None:
        try:
            from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS as registry  # noqa: N811
        except ImportError as e:
            raise RuntimeError(f"install() needs SGLang importable in this process ({e}); pass registry= to "
                               "register into another mapping") from None
    base_name = wrap or name
    if base_name not in registry:
        raise ValueError(f"SGLang has no attention backend {base_name!r} to wrap; known: {', '.join(sorted(registry))}")
    make_inner = registry[base_name]
    if getattr(make_inner, "_verify_attn_wrapped", False):   # already ours: do not wrap twice
        registry[name] = make_inner
        return make_inner

    def create(runner):
        return TreeVerifyAttnBackend.from_runner(runner, make_inner(runner), backend=backend, config=config)

    create._verify_attn_wrapped = True
    registry[name] = create
    return create


__all__ = ["TreeVerifyAttnBackend", "install"]
