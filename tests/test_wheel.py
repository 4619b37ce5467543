"""The installable package: a wheel built by `pip wheel .`, installed into a fresh venv, runs
`tree_verify(..., backend="cuda-emu")` from a folder outside the checkout.

That call JIT-builds the CUDA kernel sources with the host compiler, so it proves the wheel
ships csrc/ where verify_attn/build.py and backends/cuda_emu.py look for it
(<site-packages>/csrc). The venv is fresh (no system site packages); it sees the test
environment's own site-packages (torch, numpy, ...) through one .pth line, without that
environment's .pth hooks (so not the checkout's editable install): torch is not installed
again (5.4 GB), and the test checks that the installed copy, not the checkout, is what
imports. (Installing the wheel's dependencies too would download torch in every CI run;
.ci/run's own venv is the check that every dependency is declared, with
tests/test_dependencies.py.) The build cache is a fresh folder, so the
emulator really is compiled from the installed sources: ~1-3 minutes on 2 cores, hence
`slow` (.ci/run runs it explicitly).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Runs in the venv, in a folder outside the checkout.
SCRIPT = r"""
import sys
from pathlib import Path
import torch
import verify_attn
from verify_attn import build, layouts, tree
from verify_attn.backends import cuda_emu

venv, repo = Path(sys.prefix).resolve(), Path(sys.argv[1]).resolve()
for what, path in (("verify_attn", verify_attn.__file__), ("build.CSRC", build.CSRC), ("cuda_emu.CSRC", cuda_emu.CSRC)):
    p = Path(path).resolve()
    assert p.is_relative_to(venv) and not p.is_relative_to(repo), f"{what} is {p}, not in the venv {venv}"
assert (cuda_emu.CSRC / "tree_verify" / "dispatch.cu").exists()

g = torch.Generator().manual_seed(0)
qo_indptr, tree_mask = tree.pack_batch([[-1, 0, 0, 1], [-1, 0]])
kv = layouts.lay_out([torch.randn(37 + 4, 2, 64, generator=g), torch.randn(5 + 2, 2, 64, generator=g)],
                     [torch.randn(37 + 4, 2, 64, generator=g), torch.randn(5 + 2, 2, 64, generator=g)],
                     page_size=1, generator=g, dtype=torch.float16)
q = torch.randn(6, 4, 64, generator=g).half()
args = (q, kv["k_cache"], kv["v_cache"], qo_indptr, kv["kv_indptr"], kv["kv_indices"], kv["kv_lens"], tree_mask)
out = verify_attn.tree_verify(*args, sm_scale=0.125, backend="cuda-emu")
ref = verify_attn.tree_verify(*args, sm_scale=0.125, backend="reference")
err = float((out.float() - ref.float()).abs().max())
assert torch.isfinite(out).all() and err < 2e-2, err
print(f"cuda-emu from the installed wheel: max abs err {err:.2e}; verify_attn at {verify_attn.__file__}")
"""


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r


def _source_tree(dst: Path) -> Path:
    """The checkout's files (tracked, and untracked ones git does not ignore) copied to `dst`: the
    wheel is built from sources only, never from a build/ folder left in the checkout."""
    files = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO).stdout
    for rel in filter(None, files.split("\0")):
        src = REPO / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    return dst


def build_wheel(tmp: Path) -> Path:
    src = _source_tree(tmp / "src")
    # --no-build-isolation: setuptools and wheel are those of this environment (an isolated build
    # would fetch them from an index); --no-deps: torch & co. are already here
    _run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist")],
         cwd=src)
    (wheel,) = (tmp / "dist").glob("verify_attn-*.whl")
    return wheel


def test_wheel_ships_the_cuda_sources(tmp_path):
    """Fast part: every file of csrc/ that a build reads is in the wheel, under csrc/."""
    wheel = build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {f.relative_to(REPO).as_posix() for f in (REPO / "csrc").rglob("*")
            if f.is_file() and f.suffix in (".h", ".cuh", ".cu", ".cpp", ".inc")}
    assert want and not (want - names), sorted(want - names)[:10]
    assert {"verify_attn/__init__.py", "verify_attn/backends/cuda_emu.py", "integration/serving/sglang_compat.py"} <= names


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_runs_cuda_emu_outside_the_checkout(tmp_path):
    wheel = build_wheel(tmp_path)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    import site
    child_site = _run([str(py), "-c", "import site; print(site.getsitepackages()[0])"]).stdout.strip()
    parents = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(child_site) / "zz_test_env.pth").write_text("".join(p + "\n" for p in parents))  # after the venv's own
    _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    env.update(VERIFY_ATTN_CACHE=str(tmp_path / "cache"), PYTHONNOUSERSITE="1")
    r = _run([str(py), "-c", SCRIPT, str(REPO)], cwd=elsewhere, env=env, timeout=1500)
    assert "cuda-emu from the installed wheel" in r.stdout, r.stdout
