"""Where the Hopper peers' kernels come from (bench/benchmark/peers.py runs them), and the bundle that carries them.

Each kernel is found in its own package where a user has one (`sglang-kernel`'s `sgl_kernel.flash_attn`;
`sgl-flash-mla`'s or FlashMLA's `flash_mla`), else in the carried bundle that
shared/tools/peers/build_peers.sh builds ($VERIFY_ATTN_PEERS, default .carry/peers:
`fa3/flash_attn_interface.py`, `flash_mla_dense.so`). Absent: the backend's row says why.

    python -m bench.peer_bundle --stage PEERS_OUT   # build_peers.sh's output -> .carry/peers + manifest
    python -m bench.peer_bundle                                 # which peers are found here, or why not
"""
from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import re
import sys
from pathlib import Path
from typing import Callable, Collection, Optional

from bench.benchmark.peers import MLA_DV, Fa3Fn, MlaFn, fa3_mla_prepare, flashmla_prepare

REPO = Path(__file__).resolve().parents[2]
BUNDLE_ENV = "VERIFY_ATTN_PEERS"              # the carried bundle folder (build_peers.sh's $OUT)
DEFAULT_BUNDLE = REPO / ".carry" / "peers"
MANIFEST = "manifest.json"                     # written by `python -m bench.peer_bundle --stage`


# ------------------------------------------------------------------ finding the kernels

def bundle_dir() -> Optional[Path]:
    """The carried bundle ($VERIFY_ATTN_PEERS, else .carry/peers), if it is there."""
    env = os.environ.get(BUNDLE_ENV)
    b = Path(env) if env else DEFAULT_BUNDLE
    return b if b.is_dir() else None


def _manifest(b: Path) -> dict:
    try:
        return json.loads((b / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}


def _dist_version(*names: str) -> Optional[tuple[str, str]]:
    for n in names:
        try:
            return n, importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def find_fa3() -> tuple[Optional[Fa3Fn], dict]:
    """(FA3's flash_attn_with_kvcache, {source, version, commit}), or (None, {"why": ...})."""
    try:
        fn = importlib.import_module("sgl_kernel.flash_attn").flash_attn_with_kvcache
        dist = _dist_version("sglang-kernel", "sgl-kernel")
        return fn, {"source": "package " + (dist[0] if dist else "sgl_kernel"),
                    "version": dist[1] if dist else None, "commit": None}
    except Exception as e:  # absent, or present without its CUDA libraries
        why_pkg = f"sgl_kernel.flash_attn: {type(e).__name__}"
    b = bundle_dir()
    if b is None or not (b / "fa3" / "flash_attn_interface.py").is_file():
        return None, {"why": f"FA3 not found ({why_pkg}; no bundle at ${BUNDLE_ENV} or .carry/peers/fa3; "
                             "pip install sglang-kernel, or build shared/tools/peers/build_peers.sh)"}
    try:
        if str(b / "fa3") not in sys.path:
            sys.path.insert(0, str(b / "fa3"))
        fn = importlib.import_module("flash_attn_interface").flash_attn_with_kvcache
    except Exception as e:
        return None, {"why": f"the bundle's FA3 did not load ({type(e).__name__}: {e})"[:300]}
    m = _manifest(b)
    return fn, {"source": f"bundle {b}", "version": "flash-attention hopper (FA3), hdim 64 + qv 512 bf16 only",
                "commit": m.get("flash_attention_commit"), "torch_built_against": m.get("torch")}


def _bundle_dense_decode(mod) -> MlaFn:
    """The bundle's pybind `dense_decode_fwd`, its scheduler metadata kept after the first call (as
    flash_mla_with_kvcache keeps it in FlashMLASchedMeta)."""
    state: dict = {}

    def decode(q, k_cache, block_table, seqlens, scale):
        o, lse, meta, ns = mod.dense_decode_fwd(q, k_cache, MLA_DV, seqlens, block_table, scale, False,
                                                state.get("meta"), state.get("ns"))
        state["meta"], state["ns"] = meta, ns
        return o, lse
    return decode


def _package_dense_decode(mod) -> MlaFn:
    state: dict = {}

    def decode(q, k_cache, block_table, seqlens, scale):
        if "meta" not in state:
            state["meta"] = mod.get_mla_metadata()[0]
        return mod.flash_mla_with_kvcache(q, k_cache, block_table, seqlens, MLA_DV, state["meta"],
                                          softmax_scale=scale, causal=False)[:2]
    return decode


def find_flashmla() -> tuple[Optional[Callable[[], MlaFn]], dict]:
    """(a factory of FlashMLA dense-decode callables, one per input set, {source, version, commit}), or
    (None, {"why": ...})."""
    try:
        mod = importlib.import_module("flash_mla")
        if hasattr(mod, "flash_mla_with_kvcache"):
            dist = _dist_version("sgl-flash-mla", "flash-mla", "flash_mla")
            return (lambda: _package_dense_decode(mod)), {
                "source": "package " + (dist[0] if dist else "flash_mla"), "version": dist[1] if dist else None,
                "commit": None}
        why_pkg = "flash_mla without flash_mla_with_kvcache"
    except Exception as e:
        why_pkg = f"flash_mla: {type(e).__name__}"
    b = bundle_dir()
    if b is None or not (b / "flash_mla_dense.so").is_file():
        return None, {"why": f"FlashMLA not found ({why_pkg}; no bundle at ${BUNDLE_ENV} or .carry/peers; "
                             "pip install sgl-flash-mla, or build shared/tools/peers/build_peers.sh)"}
    try:
        if str(b) not in sys.path:
            sys.path.insert(0, str(b))
        mod = importlib.import_module("flash_mla_dense")
    except Exception as e:
        return None, {"why": f"the bundle's flash_mla_dense did not load ({type(e).__name__}: {e})"[:300]}
    m = _manifest(b)
    return (lambda: _bundle_dense_decode(mod)), {
        "source": f"bundle {b}", "version": "FlashMLA sm90 dense decode, bf16, page 64",
        "commit": m.get("flashmla_commit"), "torch_built_against": m.get("torch")}


def hopper_peers(want: Optional[Collection[str]] = None) -> tuple[dict[str, Callable], dict[str, dict]]:
    """({name: prepare(kw) -> run(out)} for the peers found, {name: where it came from, or why not}), for the
    names in `want` (default: both)."""
    found: dict[str, Callable] = {}
    info: dict[str, dict] = {}
    if want is None or "fa3-mla" in want:
        fa3, i = find_fa3()
        info["fa3-mla"] = i
        if fa3 is not None:
            found["fa3-mla"] = lambda kw, fn=fa3: fa3_mla_prepare(fn, kw)
    if want is None or "flashmla" in want:
        make, i = find_flashmla()
        info["flashmla"] = i
        if make is not None:
            found["flashmla"] = lambda kw, make=make: flashmla_prepare(make(), kw)
    return found, info


# ------------------------------------------------------------------ staging the bundle for the device

REV_RE = re.compile(r"^(FLASHMLA_REV|FA_REV|CUTLASS_MLA|CUTLASS_FA)=([0-9a-f]{40})", re.M)
# the team's build script, in shared/ beside the checkout ($VERIFY_ATTN_PEERS_SCRIPT overrides): its pins go in
# the manifest
BUILD_SCRIPT = Path(os.environ.get("VERIFY_ATTN_PEERS_SCRIPT") or
                    REPO.parent / "shared" / "tools" / "peers" / "build_peers.sh")


def manifest_of(script_text: str, bundle: Path) -> dict:
    """The pins build_peers.sh names, and the bundle's size."""
    revs = dict(REV_RE.findall(script_text))
    fi = re.search(r"flashinfer-python==([\w.]+)", script_text)
    torch_pin = re.search(r"torch==([\w.]+)", script_text)
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    return {"flashmla_commit": revs.get("FLASHMLA_REV"), "flash_attention_commit": revs.get("FA_REV"),
            "cutlass_flashmla_commit": revs.get("CUTLASS_MLA"), "cutlass_fa_commit": revs.get("CUTLASS_FA"),
            "flashinfer": fi.group(1) if fi else None, "torch": (torch_pin.group(1) + "+cu130") if torch_pin else None,
            "bytes": size}


def stage(src: Path, dest: Path = DEFAULT_BUNDLE, script: Path = BUILD_SCRIPT) -> dict:
    """Copy build_peers.sh's $OUT into `dest` (gitignored .carry/peers) with a manifest.json."""
    import shutil
    if not (src / "flash_mla_dense.so").is_file():
        raise ValueError(f"--stage {src}: no flash_mla_dense.so there (not build_peers.sh's $OUT?)")
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest)
    m = manifest_of(script.read_text() if script.is_file() else "", dest)
    (dest / MANIFEST).write_text(json.dumps(m, indent=1))
    return m


def main(argv: Optional[list[str]] = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m bench.peer_bundle", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stage", metavar="OUT", help="copy build_peers.sh's output folder into .carry/peers "
                    "(carry .carry with the device run) and write its manifest")
    a = ap.parse_args(argv)
    if a.stage:
        m = stage(Path(a.stage))
        print(f"staged {a.stage} into {DEFAULT_BUNDLE} ({m['bytes'] / 2**20:.1f} MiB): {json.dumps(m)}")
        return 0
    _, info = hopper_peers()
    for n, i in info.items():
        print(f"{n}: {i.get('why') or i}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
