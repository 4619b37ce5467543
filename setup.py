"""verify_attn: tree-verify attention workbench.

`pip install -e .` builds no CUDA: the CUDA extension is JIT-built on first use
(`backend="cuda"`), or ahead of time with VERIFY_ATTN_BUILD_CUDA=1 (needs nvcc;
see verify_attn/build.py). The CPU emulation (`backend="cuda-emu"`) is JIT-built
with the host compiler on first use.

`pip install .` and `pip wheel .` ship the CUDA sources: csrc/ is copied next to
the packages (<site-packages>/csrc), where verify_attn/build.py and
verify_attn/backends/cuda_emu.py look for it (their REPO is the folder above the
package), so the JIT builds work from an installed copy in any folder.
`VERIFY_ATTN_BUILD_CUDA=1 pip wheel --no-build-isolation .` also compiles every
kernel for sm_90a + sm_120a into verify_attn._C (needs torch and nvcc at build
time, hence no build isolation; tens of minutes on 2 cores).
"""
import os
import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
CSRC_SUFFIXES = {".h", ".cuh", ".cu", ".cpp", ".inc", ".md", ".sh", ".txt"}


class build_py_with_csrc(build_py):
    """build_py, plus csrc/ copied into the build tree as a top-level data folder."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):   # an editable install uses the checkout's csrc/
            return
        for f in sorted((HERE / "csrc").rglob("*")):
            if f.is_file() and f.suffix in CSRC_SUFFIXES:
                dst = Path(self.build_lib) / f.relative_to(HERE)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, dst)


ext_modules, cmdclass = [], {"build_py": build_py_with_csrc}
if os.environ.get("VERIFY_ATTN_BUILD_CUDA") == "1":
    import sys

    from torch.utils.cpp_extension import BuildExtension

    sys.path.insert(0, str(HERE))   # this source tree's verify_attn (PEP 517 hooks do not put it on the path)
    from verify_attn.build import aot_extensions

    ext_modules = aot_extensions()
    cmdclass["build_ext"] = BuildExtension.with_options(use_ninja=True)

# Every third-party module the package, its tools and its tests import is declared here
# (tests/test_dependencies.py checks the imports against these lists).
INSTALL_REQUIRES = [
    "torch>=2.11",
    "triton>=3.6; platform_system == 'Linux'",
    "numpy",
    "ninja",          # torch.utils.cpp_extension JIT builds
    "pybind11",       # host-only modules (index arithmetic, emulator)
    "cuda-python",    # device properties and occupancy in bench/autotune
    "nvtx",           # ranges in the decode loop
    "rich",           # tables
    "tqdm",           # progress bars
    "matplotlib",     # plots
    # SASS tools for the performance model (bench.model): not in the toolkit on every machine
    "nvidia-cuda-nvdisasm; platform_system == 'Linux'",
    "nvidia-cuda-cuobjdump; platform_system == 'Linux'",
]
EXTRAS_REQUIRE = {"test": ["pytest>=8", "hypothesis", "scipy"]}   # scipy: the sampler's chi-square test

setup(
    name="verify_attn",
    version="0.1.0",
    description="Kernel workbench for tree-verify attention (speculative decoding) at long context",
    packages=find_packages(include=["verify_attn*", "autotune*", "bench*", "integration*"]),
    package_data={"autotune": ["configs/*.json", "configs/*.md"]},
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
