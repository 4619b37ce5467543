#!/usr/bin/env bash
# Build FlashMLA's two warp-specialized sm_90 kernels as cubins, for the model's P-15 readings (bench/model/roles.py,
# bench/model/foreign.py; python -m bench.model --validate picks them up from the cache):
#   - the sparse prefill (csrc/sm90/prefill/sparse, d_qk 576): a producer warpgroup gathering rows by cp.async, two
#     math warpgroups;
#   - the dense decode (csrc/sm90/decode/dense, bf16): two math warpgroups on TMA boxes, the "seesaw".
#   bash bench/model/build_flashmla.sh FLASHMLA_DIR CUTLASS_DIR [OUT_DIR]
# FLASHMLA_DIR: a checkout of deepseek-ai/FlashMLA (read here at 9241ae3); CUTLASS_DIR: the CUTLASS it pins as
# csrc/cutlass (147f567). Needs nvcc (CUDA_HOME); no torch headers, no GPU. About 2 minutes on 2 cores (dense 78 s,
# sparse 17 s here). Nothing of FlashMLA is copied into this project: the cubins stay in the cache.
set -euo pipefail
mla=${1:?FLASHMLA_DIR (a FlashMLA checkout)}
cutlass=${2:?CUTLASS_DIR (its pinned cutlass)}
out=${3:-$(python -c "from verify_attn.utils import cache_dir; print(cache_dir() / 'foreign')")}
for f in sm90/decode/dense/instantiations/bf16.cu sm90/prefill/sparse/instantiations/phase1_k576.cu; do
  [ -f "$mla/csrc/$f" ] || { echo "no $mla/csrc/$f: is $mla a FlashMLA checkout?" >&2; exit 2; }
done
[ -d "$cutlass/include/cute" ] || { echo "no $cutlass/include/cute: is $cutlass a CUTLASS checkout?" >&2; exit 2; }
nvcc=${CUDA_HOME:+$CUDA_HOME/bin/}nvcc   # $CUDA_HOME/bin/nvcc, else the one on PATH
mkdir -p "$out"
# FlashMLA's own flags (its setup.py), one arch, line info for the model's source mapping
flags=(-cubin -arch=sm_90a -O3 -std=c++20 -lineinfo -DNDEBUG -DFLASH_MLA_DISABLE_FP16 -D_USE_MATH_DEFINES
       -Wno-deprecated-declarations -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__
       -U__CUDA_NO_HALF2_OPERATORS__ -U__CUDA_NO_BFLOAT16_CONVERSIONS__ --expt-relaxed-constexpr
       --expt-extended-lambda --use_fast_math -I"$mla/csrc" -I"$mla/csrc/kerutils/include" -I"$mla/csrc/sm90"
       -I"$cutlass/include")
"$nvcc" "${flags[@]}" -o "$out/flashmla_dense_bf16_sm90a.cubin" "$mla/csrc/sm90/decode/dense/instantiations/bf16.cu"
"$nvcc" "${flags[@]}" -o "$out/flashmla_sparse_prefill_k576_sm90a.cubin" \
  "$mla/csrc/sm90/prefill/sparse/instantiations/phase1_k576.cu"
echo "built $out/flashmla_dense_bf16_sm90a.cubin $out/flashmla_sparse_prefill_k576_sm90a.cubin"
