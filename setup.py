"""verify_attn: tree-verify attention workbench.

`pip install -e .` builds no CUDA: the CUDA extension is JIT-built on first use
(`backend="cuda"`), or ahead of time with VERIFY_ATTN_BUILD_CUDA=1 (needs nvcc;
see verify_attn/build.py). The CPU emulation (`backend="cuda-emu"`) is JIT-built
with the host compiler on first use.
"""
import os

from setuptools import find_packages, setup

ext_modules, cmdclass = [], {}
if os.environ.get("VERIFY_ATTN_BUILD_CUDA") == "1":
    from torch.utils.cpp_extension import BuildExtension

    from verify_attn.build import aot_extensions

    ext_modules = aot_extensions()
    cmdclass = {"build_ext": BuildExtension.with_options(use_ninja=True)}

setup(
    name="verify_attn",
    version="0.1.0",
    description="Kernel workbench for tree-verify attention (speculative decoding) at long context",
    packages=find_packages(include=["verify_attn*", "autotune*", "bench*", "integration*"]),
    package_data={"autotune": ["configs/*.json", "configs/*.md"]},
    python_requires=">=3.10",
    install_requires=[
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
    ],
    extras_require={"test": ["pytest>=8", "hypothesis"]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
