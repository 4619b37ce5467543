#!/usr/bin/env bash
# One short GPU session check of the CUDA kernels (run from the repo root on a
# machine with a GPU and nvcc): the CMake driver against its fp64 host reference,
# then the marked GPU tests. About 5-8 minutes on 16 cores, most of it compiling.
#   bash csrc/driver/gpu_check.sh [quick]
set -euo pipefail
ARCH=$(python -c "import torch; M,m=torch.cuda.get_device_capability(); print(f'{M}{m}' + ('a' if M in (9,10,12) else ''))")
export VERIFY_ATTN_CUDA_ARCHS="sm_${ARCH}"
export VERIFY_ATTN_JIT_ALL=1   # one parallel JIT build of every instantiation, not 16 serial ones
export CUDA_HOME=${CUDA_HOME:-$(python -c "from verify_attn.build import find_cuda_home; print(find_cuda_home())")}
if command -v cmake >/dev/null; then
  cmake -S . -B build/cmake -DCMAKE_CUDA_ARCHITECTURES="${ARCH}" -DCMAKE_CUDA_COMPILER="${CUDA_HOME}/bin/nvcc" >/dev/null
  cmake --build build/cmake -j"$(nproc)" --target tv_driver 2>&1 | grep -E "error|warning: .*spill" || true
  D=build/cmake/tv_driver
  $D --head mla576 --dtype bf16 --ctx 3000 --tree 16 --hq 8 --check --iters 3
  $D --head mla576 --dtype fp16 --ctx 777 --tree 37 --hq 16 --page-size 16 --tile 1 --splits 5 --check --iters 3
  $D --head gqa128 --dtype bf16 --ctx 2049 --tree 9 --hq 32 --hkv 8 --page-size 32 --check --iters 3
  $D --head gqa64 --dtype fp16 --ctx 100 --tree 1 --hq 4 --hkv 2 --check --iters 3
  $D --head gqa256 --dtype bf16 --ctx 513 --tree 20 --hq 8 --hkv 2 --splits 3 --check --iters 3
  # timing at the story's context (no check: the host reference would take minutes)
  $D --head mla576 --dtype bf16 --ctx 185000 --tree 16 --hq 8 --iters 20
  $D --head mla576 --dtype bf16 --ctx 185000 --tree 16 --hq 8 --tile 1 --iters 20
fi
if [ "${1:-}" = "quick" ]; then
  python -m pytest -q -x tests/test_cuda_gpu.py -k "matrix_small and kimi or graph or deterministic or 185k"
else
  python -m pytest -q -x tests/test_cuda_gpu.py
fi
