"""Tree-verify attention workbench: public API.

    out = verify_attn.tree_verify(q, k_cache, v_cache, qo_indptr, kv_indptr,
                                  kv_indices, kv_lens, tree_mask, sm_scale=s)
"""
from .api import set_validation, tree_verify
from .backends import available_backends, known_backends
from .config import KernelConfig

__all__ = ["tree_verify", "set_validation", "available_backends", "known_backends", "KernelConfig", "kernel_errors"]


def kernel_errors(device="cuda") -> list:
    """Errors the CUDA kernels (cuda, cuda-emu) flagged on `device` since the last read, as messages,
    and clears them. A host read (it synchronizes): call it outside graph capture, e.g. after a replay
    in shapes-only validation mode, where a malformed request is not caught before the launch."""
    import torch

    from .backends import cuda
    return cuda.read_errors(torch.device(device))
__version__ = "0.1.0"
