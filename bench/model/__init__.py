"""SASS-level performance model of the CUDA tree-verify kernels (no GPU needed).

`python -m bench.model --help` for the command line; `predict()` below for tools
(the budget planner) that want one number with its provenance.
"""
from __future__ import annotations

from typing import Optional


def predict(device: str, *, ctx: int, tree_nodes: int, shape="kimi-k2-tp8", layout: str = "page1",
            page_size: int = 1, kv_dtype: str = "bf16", batch: int = 1, kernel: str = "default",
            num_splits: Optional[int] = None, band: bool = True) -> Optional[dict]:
    """Predicted time of one CUDA tree_verify call on `device` ("h200" | "rtx-pro-6000").

    Returns {"us", "low_us", "high_us", "sensitive", "bound", "source": "sass-model", "kernel", "num_splits",
    "floor_us"} (the band: bench.model.bands; band=False leaves it out, ~20x faster) or None when the
    model cannot read this kernel (no CUDA toolkit or SASS tools here, no kernel for the shape or KV dtype).
    `shape`: a preset name or a verify_attn.shapes.HeadShape. `kernel`: "default" (the backend's default
    tile) or a substring of a kernel name.
    """
    from verify_attn import build as vb
    from verify_attn.shapes import get_shape

    from . import call, devices, kernels

    dev = devices.get_device(device)
    sh = get_shape(shape) if isinstance(shape, str) else shape
    if kv_dtype not in ("bf16", "fp16", "fp8_e4m3", "fp8_mla656"):
        return None
    head = vb.head_key(sh.head_dim_qk, sh.head_dim_v, sh.mla, kv_dtype if kv_dtype.startswith("fp8") else False)
    if head is None:
        return None
    try:
        ks = kernels.load(dev.arch, head, kv_dtype if kv_dtype in ("bf16", "fp16") else "bf16", layout)
    except (RuntimeError, LookupError, FileNotFoundError):
        return None
    if kernel == "default":
        tile = vb.default_tile(head, dev.arch)
        km = next((k for k in ks if k.tile == tile), None)
    else:
        km = next((k for k in ks if kernel in k.name and k.tile.targets(dev.arch)), None)
    if km is None:
        return None
    case = call.Case(sh, ctx, tree_nodes, batch, layout, page_size, kv_dtype=kv_dtype)
    p = call.predict(km, dev, case, num_splits)
    out = {"us": p.total_us, "bound": p.bound, "source": "sass-model", "kernel": km.name,
           "num_splits": p.num_splits, "floor_us": p.floor_us}
    if band:
        from .bands import band as model_band
        b = model_band(km, dev, case, p.num_splits, central=p)
        out.update(low_us=b.low, high_us=b.high, sensitive=b.sensitive)
    return out
