"""Outside baselines that join the table when their code is at hand (optional imports).

- "sglang-extend": SGLang's Triton `extend_attention_fwd` with a custom (tree) mask,
  the kernel the seed story measured (serial over the prefix). page_size=1 only.
  The tree nodes' own K/V go in as the contiguous "extend" tensors, the prefix
  through the slot pool, as SGLang's verify step passes them. Found as an installed
  `sglang`, or as SGLang's own `extend_attention.py` (+ `score_mod.py`) under
  $SGLANG_SITE or tests/sglang_ref/ (`bash tests/fetch_sglang_ref.sh` extracts the two
  files from the 0.5.23 wheel), loaded by path with its few sglang imports stubbed
  (`load_sglang_extend`): the GPU machine has no sglang and no network, so that copy is
  what travels there. Its output is checked against the reference like every backend
  before it is timed.
- "flashinfer-mla": FlashInfer's MLA paged-attention wrapper (`flashinfer.mla.BatchMLAPagedAttentionWrapper`,
  the decode path SGLang's FlashInfer MLA backend uses), where FlashInfer is installed (a GPU package).
  It takes a causal mask or none, not a tree, so it is a peer on chains only: a chain of T nodes is the
  causal (bottom-right aligned) mask over the last T positions; `--tree-shape chain` or `--tree 1`. Any
  other tree is "unsupported" with that reason. MLA 576/512, 16-bit caches, pages of any size. Written
  against FlashInfer's documented API; not run here (no FlashInfer on either machine this project has had).
- "fa3-mla" and "flashmla" (issue 42): FA3 along SGLang's Hopper tree-verify path, and FlashMLA's dense decode
  over the prefix plus a torch tree part: bench/benchmark/peers.py (found by bench/benchmark/peer_bundle.py).
Each found peer's prepare function carries `.peer` = {source, version, commit}: bench.verify puts it in the JSON.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import sys
import types
from pathlib import Path
from typing import Callable, Collection, Optional

import torch

from verify_attn.tree import to_sglang_custom_mask

_SGLANG_MODULES = (
    "sglang.srt.layers.attention.triton_ops.extend_attention",
    "sglang.kernels.ops.attention.extend_attention",
)
SGLANG_REF = Path(__file__).resolve().parents[2] / "tests" / "sglang_ref"
_KERNEL_FILES = ("kernels/ops/attention/extend_attention.py", "srt/layers/attention/triton_ops/extend_attention.py")


def sglang_root() -> Optional[Path]:
    """The `sglang` folder to read SGLang's kernel from: $SGLANG_SITE (a pip --target dir or an unzipped
    wheel), then tests/sglang_ref/, then an installed sglang (found without importing it)."""
    for site in (os.environ.get("SGLANG_SITE"), str(SGLANG_REF)):
        if site and (Path(site) / "sglang").is_dir():
            return Path(site) / "sglang"
    try:
        spec = importlib.util.find_spec("sglang")   # does not execute sglang/__init__.py
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return None


def sglang_kernel_file(root: Optional[Path] = None) -> Optional[Path]:
    root = root if root is not None else sglang_root()
    if root is None:
        return None
    return next((root / c for c in _KERNEL_FILES if (root / c).is_file()), None)


def load_sglang_extend(path: Path) -> types.ModuleType:
    """SGLang's extend_attention.py loaded by path, its sglang imports stubbed with what the kernel reads
    (every opt-in env flag off, CUDA iff a GPU is present, the 3-D pool's strides)."""
    def stub(name: str, **attrs) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        return m

    class _Env:   # envs.X.get() -> False: every opt-in flag off, as by default
        def __getattr__(self, _name):
            return types.SimpleNamespace(get=lambda: False)

    def extract_kv_strides(buf, page_size):   # (slot, head, page, token) strides of a 3-D pool
        return buf.stride(0), buf.stride(1), buf.stride(0) * page_size, buf.stride(0)

    score_spec = importlib.util.spec_from_file_location("_sgl_score_mod", path.parent / "score_mod.py")
    score_mod = importlib.util.module_from_spec(score_spec)
    sys.modules["_sgl_score_mod"] = score_mod
    score_spec.loader.exec_module(score_mod)
    on_gpu = torch.cuda.is_available()
    stubs = {
        "sglang": stub("sglang"), "sglang.kernels": stub("sglang.kernels"),
        "sglang.kernels.ops": stub("sglang.kernels.ops"),
        "sglang.kernels.ops.attention": stub("sglang.kernels.ops.attention"),
        "sglang.kernels.ops.attention.decode_attention":
            stub("sglang.kernels.ops.attention.decode_attention", _extract_kv_strides=extract_kv_strides),
        "sglang.kernels.ops.attention.score_mod": score_mod,
        "sglang.srt": stub("sglang.srt"), "sglang.srt.environ": stub("sglang.srt.environ", envs=_Env()),
        "sglang.srt.utils": stub("sglang.srt.utils", is_cuda=lambda: on_gpu, is_hip=lambda: False,
                                 is_gfx95_supported=lambda: False, is_gfx1250_supported=lambda: False),
    }
    saved = {k: sys.modules.get(k) for k in stubs}
    sys.modules.update(stubs)
    try:
        spec = importlib.util.spec_from_file_location("_sgl_extend_attention", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["_sgl_extend_attention"] = mod   # triton.jit reads the source through the module
        spec.loader.exec_module(mod)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return mod


def _find_sglang_extend() -> tuple[Optional[Callable], str]:
    """(SGLang's extend_attention_fwd, where it came from), or (None, why not)."""
    for mod in _SGLANG_MODULES:
        try:
            return getattr(importlib.import_module(mod), "extend_attention_fwd"), f"module {mod}"
        except Exception:  # absent, or present with unmet imports: try the file
            continue
    path = sglang_kernel_file()
    if path is None:
        return None, ("SGLang not found (no sglang package, $SGLANG_SITE or tests/sglang_ref/; "
                      "bash tests/fetch_sglang_ref.sh): its extend_attention baseline is not in the table")
    try:
        return load_sglang_extend(path).extend_attention_fwd, f"file {path}"
    except Exception as e:
        return None, f"SGLang's {path.name} did not load ({type(e).__name__}: {e}): not in the table"


def outside_baselines(want: Optional[Collection[str]] = None) -> tuple[dict[str, Callable], list[str]]:
    """({name: prepare(kw) -> run(out)}, notes about what is absent or where it came from), for the outside
    baselines in `want` (default: all). Only those are looked for: importing FlashInfer or a peer's module
    costs seconds in every benchmark that does not run it."""
    found: dict[str, Callable] = {}
    notes: list[str] = []
    asked = lambda n: want is None or n in want
    if asked("sglang-extend"):
        fn, where = _find_sglang_extend()
        if fn is not None:
            found["sglang-extend"] = lambda kw, fn=fn: sglang_extend_prepare(fn, kw)
            found["sglang-extend"].peer = {"source": where, "version": _sglang_version(), "commit": None}
            notes.append(f"sglang-extend: SGLang's extend_attention_fwd from {where}")
        else:
            notes.append(where)
    if asked("flashinfer-mla"):
        try:
            fi = importlib.import_module("flashinfer")
            found["flashinfer-mla"] = lambda kw: flashinfer_mla_prepare(kw)
            where = Path(fi.__file__).resolve().parent.parent
            found["flashinfer-mla"].peer = {"source": f"package flashinfer-python ({where})",
                                            "version": getattr(fi, "__version__", None), "commit": None}
            notes.append("flashinfer-mla: FlashInfer's MLA wrapper (a causal mask, no tree: chains only)")
        except Exception as e:
            why = f"FlashInfer not installed ({type(e).__name__}; pip install flashinfer-python on a GPU machine)"
            found["flashinfer-mla"] = _unavailable(why)
            notes.append(f"flashinfer-mla: {why}: not in the table")
    from bench.benchmark.peer_bundle import hopper_peers   # issue 42: FA3 along SGLang's Hopper path, FlashMLA
    peers, info = hopper_peers(want)
    for name, i in info.items():
        if name in peers:
            found[name] = peers[name]
            found[name].peer = i
            notes.append(f"{name}: from {i['source']} (version {i.get('version')}, commit {i.get('commit')})")
        else:
            found[name] = _unavailable(i["why"])
            notes.append(f"{name}: {i['why']}: not in the table")
    return found, notes


def _sglang_version() -> Optional[str]:
    """The installed sglang's version, or the release tests/fetch_sglang_ref.sh extracts."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "0.5.23 (tests/sglang_ref, tests/fetch_sglang_ref.sh)" if SGLANG_REF.is_dir() else None


def _unavailable(why: str) -> Callable:
    """A peer asked for but absent: its row says why (status 'unsupported'); not in the default list."""
    def prepare(kw):
        raise LookupError(f"unavailable: {why}")
    prepare.unavailable = why
    return prepare


def _is_chain(kw: dict) -> bool:
    """Every request's tree is a chain (node i's parent is i-1): FlashInfer's causal mask."""
    from verify_attn.tree import pack_batch
    qo = [int(x) for x in kw["qo_indptr"].cpu()]
    chains = [list(range(-1, qo[b + 1] - qo[b] - 1)) for b in range(len(qo) - 1)]
    _, packed = pack_batch(chains, kw["tree_mask"].shape[1])
    return torch.equal(packed, kw["tree_mask"].cpu())


def flashinfer_mla_prepare(kw: dict) -> Callable[[torch.Tensor], None]:
    """Host-side preparation (outside timing: FlashInfer's plan reads the index arrays) -> run(out)."""
    flashinfer = importlib.import_module("flashinfer")   # optional: outside_baselines only offers it when present

    q, k = kw["q"], kw["k_cache"]
    if kw.get("kv_format") or k.dtype not in (torch.bfloat16, torch.float16):
        raise NotImplementedError("flashinfer-mla: 16-bit caches only in this adapter")
    v = kw["v_cache"]
    if not (q.shape[-1] == 576 and v.shape[-1] == 512 and k.shape[-2] == 1):
        raise NotImplementedError("flashinfer-mla: MLA 576/512 with one latent KV head only")
    if not _is_chain(kw):
        raise NotImplementedError("flashinfer-mla: FlashInfer's MLA wrapper takes a causal mask, not a tree; it is "
                                  "compared on chains (--tree-shape chain, or --tree 1)")
    page = kw["page_size"]
    # FlashInfer's MLA caches are [pages, P, 512] and [pages, P, 64]: views of our rows, no copy. A slot pool
    # [slots, 1, 576] is pages of one token (its head dim of 1 stands for P); a paged one is [pages, P, 1, 576].
    lat = k if page == 1 else k[:, :, 0]
    ckv, kpe = lat[..., :512], lat[..., 512:]
    i32 = {n: kw[n].to(torch.int32) for n in ("qo_indptr", "kv_indptr", "kv_indices", "kv_lens")}
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=q.device)
    w = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws)
    w.plan(i32["qo_indptr"], i32["kv_indptr"], i32["kv_indices"], i32["kv_lens"], q.shape[1], 512, 64, page, True,
           kw["sm_scale"], q.dtype, k.dtype)
    q_nope, q_pe = q[..., :512].contiguous(), q[..., 512:].contiguous()

    def run(out: torch.Tensor) -> None:
        w.run(q_nope, q_pe, ckv, kpe, out=out)
    return run


def sglang_extend_prepare(fn: Callable, kw: dict) -> Callable[[torch.Tensor], None]:
    """Host-side preparation (outside timing) -> run(out) launching SGLang's kernel once."""
    if kw["page_size"] != 1:
        raise NotImplementedError("sglang-extend runs on the page_size=1 slot pool only")
    qo = kw["qo_indptr"].tolist()
    kvp = kw["kv_indptr"].tolist()
    lens = kw["kv_lens"].tolist()
    idx = kw["kv_indices"]
    prefix_idx, tree_idx, prefix_lens = [], [], []
    for b in range(len(qo) - 1):
        t = qo[b + 1] - qo[b]
        ids = idx[kvp[b]: kvp[b] + lens[b]]
        prefix_idx.append(ids[: lens[b] - t])
        tree_idx.append(ids[lens[b] - t:])
        prefix_lens.append(lens[b] - t)
    dev = kw["q"].device
    p_indices = torch.cat(prefix_idx).to(torch.int32)
    p_indptr = torch.tensor([0] + torch.tensor(prefix_lens).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    t_ids = torch.cat(tree_idx).long()
    k_ext = kw["k_cache"][t_ids].contiguous()                   # [total_q, Hkv, Dqk]
    v_ext = kw["v_cache"][t_ids].contiguous()                   # [total_q, Hkv, Dv]
    custom_mask, mask_indptr = to_sglang_custom_mask(kw["tree_mask"], kw["qo_indptr"], prefix_lens)
    custom_mask, mask_indptr = custom_mask.to(dev), mask_indptr.to(dev)
    max_t = max(qo[b + 1] - qo[b] for b in range(len(qo) - 1))

    try:   # SGLang 0.5.23 takes k_scale / v_scale after max_len_extend; older releases do not
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    scales = {k: 1.0 for k in ("k_scale", "v_scale") if k in params}

    def run(out: torch.Tensor) -> None:
        fn(kw["q"], k_ext, v_ext, out, kw["k_cache"], kw["v_cache"], kw["qo_indptr"], p_indptr, p_indices,
           custom_mask, False, mask_indptr, max_t, sm_scale=kw["sm_scale"], **scales)
    return run

