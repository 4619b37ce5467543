#!/usr/bin/env bash
# Build FlashAttention-2's forward kernel (hdim 128, bf16) for sm_90a as a cubin, for the model's P-12 reading
# (bench/model/foreign.py; python -m bench.model --validate picks it up from the cache).
#   bash bench/model/build_fa2.sh FA2_DIR CUTLASS_DIR [OUT.cubin]
# FA2_DIR: a checkout of Dao-AILab/flash-attention (read here at 0251105a); CUTLASS_DIR: the CUTLASS it pins as
# csrc/cutlass (7127592). Needs nvcc (CUDA_HOME) and torch's headers (FA2's launch templates include c10); no
# GPU. About 7 minutes on 2 cores. Nothing of FA2 is copied into this project: the cubin stays in the cache.
set -euo pipefail
fa2=${1:?FA2_DIR (a flash-attention checkout)}
cutlass=${2:?CUTLASS_DIR (its pinned cutlass)}
out=${3:-$(python -c "from verify_attn.utils import cache_dir; print(cache_dir() / 'foreign' / 'fa2_fwd_hdim128_bf16_sm90a.cubin')")}
src="$fa2/csrc/flash_attn/src/flash_fwd_hdim128_bf16_sm80.cu"
[ -f "$src" ] || { echo "no $src: is $fa2 a flash-attention checkout?" >&2; exit 2; }
[ -d "$cutlass/include/cute" ] || { echo "no $cutlass/include/cute: is $cutlass a CUTLASS checkout?" >&2; exit 2; }
nvcc=${CUDA_HOME:+$CUDA_HOME/bin/}nvcc   # $CUDA_HOME/bin/nvcc, else the one on PATH
torch_inc=$(python -c "from torch.utils.cpp_extension import include_paths; print(' '.join('-I' + p for p in include_paths()))")
mkdir -p "$(dirname "$out")"
# FA2's own flags (its setup.py), one arch, line info for the model's source mapping
# shellcheck disable=SC2086
"$nvcc" -cubin -arch=sm_90a -O3 -std=c++17 -lineinfo --use_fast_math --expt-relaxed-constexpr --expt-extended-lambda \
  -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__ -U__CUDA_NO_HALF2_OPERATORS__ \
  -U__CUDA_NO_BFLOAT16_CONVERSIONS__ -DNDEBUG \
  -I"$fa2/csrc/flash_attn" -I"$fa2/csrc/flash_attn/src" -I"$cutlass/include" $torch_inc \
  -o "$out" "$src"
echo "built $out"
