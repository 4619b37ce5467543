"""Tree-verify attention workbench: public API.

    out = verify_attn.tree_verify(q, k_cache, v_cache, qo_indptr, kv_indptr,
                                  kv_indices, kv_lens, tree_mask, sm_scale=s)
"""
from .api import set_validation, tree_verify
from .backends import available_backends, known_backends
from .config import KernelConfig

__all__ = ["tree_verify", "set_validation", "available_backends", "known_backends", "KernelConfig"]
__version__ = "0.1.0"
