// Combine of split partials: out = sum_s w_s O_s / sum_s w_s with
// w_s = exp2(lse2_s - max), and lse = ln-sum-exp of all splits.
//
// One warp per (q row, query head); each lane owns 2 adjacent Dv columns per
// 64. The number of splits that hold tokens is recomputed from kv_len with the
// split kernel's own rule (csrc/host/split.h), so empty splits are never read;
// a split whose tokens this row could not see has lse2 = -inf and weight 0.
#pragma once

#include "arch/arch.cuh"
#include "../host/host_math.h"
#include "params.h"
#include "tree_verify_kernel.cuh"

namespace va::tv {

inline constexpr int kCombineWarps = 4;  // (row, head) pairs per CTA

// Request that owns q row `qrow`: the last b with qo_indptr[b] <= qrow (binary search).
VA_DEVICE int request_of_row(const int32_t* qo_indptr, int batch, int qrow) {
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (va::arch::ld_global(qo_indptr + mid) <= qrow) lo = mid; else hi = mid - 1;
  }
  return lo;
}

template <class T, int DV>
__global__ void __launch_bounds__(32 * kCombineWarps) tree_verify_combine_kernel(const Params p, const int num_splits,
                                                                                 const int block_n) {
  namespace arch = va::arch;
  namespace h = va::host;
  static_assert(DV % 64 == 0, "combine: each lane owns 2 columns of every 64");
  constexpr int kChunks = DV / 64;

  const int pair = blockIdx.x * kCombineWarps + arch::warp_id();  // (q row, head)
  if (pair >= p.total_q * p.num_q_heads) return;
  const int qrow = pair / p.num_q_heads;
  const int head = pair % p.num_q_heads;
  const int lane = arch::lane_id();
  const int b = request_of_row(p.qo_indptr, p.batch, qrow);
  const int ns = h::num_nonempty_splits(arch::ld_global(p.kv_lens + b), num_splits, block_n);

  const float* ws_o = ws_partial_o(p);
  const float* ws_lse = ws_partial_lse(p, num_splits);
  float acc[kChunks][2];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) acc[c][0] = acc[c][1] = 0.f;
  h::MergeState st = h::merge_init();
  for (int s = 0; s < ns; ++s) {  // sass-model: split-loop
    const int64_t prow = (static_cast<int64_t>(s) * p.total_q + qrow) * p.num_q_heads + head;
    float so, sn;
    h::lse_merge(st, arch::ld_global(ws_lse + prow), so, sn, Exp2Fast{});
    if (sn == 0.f) continue;  // nothing visible in this split (its O is 0 and never needed)
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const float2 o = arch::ld_global(reinterpret_cast<const float2*>(ws_o + prow * DV + c * 64 + 2 * lane));
      acc[c][0] = acc[c][0] * so + o.x * sn;
      acc[c][1] = acc[c][1] * so + o.y * sn;
    }
  }
  const float inv = h::row_inv_l(st.l);
  T* out = static_cast<T*>(p.out) + qrow * p.o_stride_tok + head * p.o_stride_head;
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
    arch::st_global(reinterpret_cast<uint32_t*>(out + c * 64 + 2 * lane), arch::pack2<T>(acc[c][0] * inv, acc[c][1] * inv));
  if (p.lse != nullptr && lane == 0)
    arch::st_global(p.lse + qrow * p.lse_stride_tok + head * p.lse_stride_head, h::row_lse2(st.m, st.l, Log2{}) * h::kLn2);
}

}  // namespace va::tv
