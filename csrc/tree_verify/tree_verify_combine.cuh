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
#include "request.cuh"
#include "tree_verify_kernel.cuh"

namespace va::tv {

inline constexpr int kCombineWarps = 4;  // (row, head) pairs per CTA

// Request that owns q row `qrow`: the last b with qo_indptr[b] <= qrow (binary search).
VA_DEVICE int request_of_row(const Params& p, int qrow) {
  int lo = 0, hi = p.batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (ld_index(p.qo_indptr, mid, p.qo_indptr_i64) <= qrow) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// A request the split kernel refused (T_b > 32 * mask_words): NaN out and lse for (qrow, head).
template <class T>
VA_DEVICE void combine_poison(const Params& p, int qrow, int head, int lane) {
  uint16_t* out = reinterpret_cast<uint16_t*>(static_cast<T*>(p.out) + qrow * p.o_stride_tok + head * p.o_stride_head);
  for (int c = lane; c < p.head_dim_v; c += 32) va::arch::st_global(out + c, nan_bits<T>());
  if (p.lse != nullptr && lane == 0)
    va::arch::st_global(p.lse + qrow * p.lse_stride_tok + head * p.lse_stride_head, __builtin_nanf(""));
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
  const int b = request_of_row(p, qrow);
  if (request_too_wide(p, b)) {
    combine_poison<T>(p, qrow, head, lane);
    return;
  }
  const int ns = h::num_nonempty_splits(arch::ld_global(p.kv_lens + b), num_splits, block_n);

  const float* ws_o = ws_partial_o(p);
  const float* ws_lse = ws_partial_lse(p, num_splits);
  float acc[kChunks][2];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) acc[c][0] = acc[c][1] = 0.f;
  h::MergeState st = h::merge_init();
  // split s's partial row is row0 + s * stride: pointers advance, no per-split index math
  const int64_t row0 = static_cast<int64_t>(qrow) * p.num_q_heads + head;
  const int64_t stride = static_cast<int64_t>(p.total_q) * p.num_q_heads;
  const float* lse_s = ws_lse + row0;
  const float* o_s = ws_o + row0 * DV + 2 * lane;
  for (int s = 0; s < ns; ++s, lse_s += stride, o_s += stride * DV) {  // sass-model: split-loop
    float so, sn;
    h::lse_merge(st, arch::ld_global(lse_s), so, sn, Exp2Fast{});
    if (sn == 0.f) continue;  // nothing visible in this split (its O is 0 and never needed)
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const float2 o = arch::ld_global(reinterpret_cast<const float2*>(o_s + c * 64));
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

// Combine v1: the LSEs first, then every split's O loads independently.
// v0 reads each split's lse, then (depending on it) its O: two dependent L2 round
// trips per split, ~2 x splits round trips per row. Here a CTA of kCombineV1Warps warps
// owns 128 columns of one (row, head). Each warp first takes the max of the row's lse2
// over all splits (lanes stride the splits), then streams its own share of the splits
// (warp w: w, w + kCombineV1Warps, ...) kUnroll at a time: each lane recomputes the
// split's weight from the same (cached) lse2 word while its O loads are already in
// flight. The warps' sums meet in shared memory and warp 0 adds them in warp order (the
// result does not depend on timing). A row costs about two round trips plus
// splits / (kCombineV1Warps x kUnroll) more: 66 splits are 3 groups a warp, not 9 (the
// chain bench.model charged the combine with). Splitting the columns over DV / 128 CTAs
// and the splits over the CTA's warps gives a 16-node MLA tree (128 rows) 2,048 warps,
// 4x the 512 of one warp per (row, 128 columns) before. Launched with programmatic dependent launch:
// grid_dependency_wait() before the first read of the split kernel's workspace.
inline constexpr int kCombineV1Warps = 4;   // warps of a CTA, each a share of the splits
inline constexpr int kCombineV1Cols = 128;  // columns per CTA: 4 per lane
template <int DV>
inline constexpr int kCombineV1CtasPerRow = DV / kCombineV1Cols;
// dynamic shared memory of the v1 combine: each warp's 4 sums a lane, then its weight sums
inline constexpr size_t kCombineV1Smem = (kCombineV1Warps * 32 * 4 + kCombineV1Warps) * sizeof(float);

template <class T, int DV>
__global__ void __launch_bounds__(32 * kCombineV1Warps, 1) tree_verify_combine_kernel_v1(const Params p,
                                                                                      const int num_splits,
                                                                                      const int block_n) {
  namespace arch = va::arch;
  namespace h = va::host;
  static_assert(DV % kCombineV1Cols == 0, "combine v1: each CTA owns 128 columns, 4 per lane");
  constexpr int kCpr = kCombineV1CtasPerRow<DV>;
  constexpr int kUnroll = 8;  // splits whose O loads are in flight together in one warp

  const int pair = blockIdx.x / kCpr;  // (q row, head): the CTA's, so every exit below is the whole CTA's
  const int chunk = blockIdx.x - pair * kCpr;
  const int warp = arch::warp_id();
  const int lane = arch::lane_id();
  const int col0 = chunk * kCombineV1Cols + 4 * lane;
  const bool active = pair < p.total_q * p.num_q_heads;
  const int qrow = active ? pair / p.num_q_heads : 0;
  const int head = active ? pair % p.num_q_heads : 0;
  const int b = request_of_row(p, qrow);
  const bool too_wide = request_too_wide(p, b);
  const int ns = h::num_nonempty_splits(arch::ld_global(p.kv_lens + b), num_splits, block_n);
  arch::grid_dependency_wait();  // the split kernel's partials are complete and visible
  if (!active) return;
  if (too_wide) {
    if (chunk == 0 && warp == 0) combine_poison<T>(p, qrow, head, lane);  // one warp of the row poisons it
    return;
  }

  const float* ws_o = ws_partial_o(p);
  const float* ws_lse = ws_partial_lse(p, num_splits);
  auto prow = [&](int s) { return (static_cast<int64_t>(s) * p.total_q + qrow) * p.num_q_heads + head; };

  // pass 1: max lse2 over the splits (lanes stride them; -inf where a split saw nothing), in every warp
  float m = h::neg_inf();
  for (int s = lane; s < ns; s += 32) m = arch::max_f(m, arch::ld_global(ws_lse + prow(s)));
#pragma unroll
  for (int x = 16; x > 0; x >>= 1) m = arch::max_f(m, arch::shfl_xor(m, x));
  const float mref = h::softmax_ref_max(m);

  // pass 2: this warp's splits, sum_s w_s O_s with w_s = exp2(lse2_s - m); O loads do not wait on the weights
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  float l = 0.f;
  constexpr int kStep = kCombineV1Warps * kUnroll;  // splits of one group of every warp
  for (int s0 = warp; s0 < ns; s0 += kStep) {  // sass-model: split-loop splits=8 warps=4
    float4 o[kUnroll];
    float w[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int su = s0 + u * kCombineV1Warps;
      const int s = su < ns ? su : s0;  // a tail slot re-reads split s0 with weight 0
      o[u] = arch::ld_global(reinterpret_cast<const float4*>(ws_o + prow(s) * DV + col0));
      const float lse2 = arch::ld_global(ws_lse + prow(s));
      w[u] = su < ns && lse2 != h::neg_inf() ? arch::exp2_approx(lse2 - mref) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      // an empty split's O may be anything when its lse2 is -inf: selected away, not multiplied by 0
      // (branch-free, so the compiler keeps every load of the group in flight before the first use)
      const bool use = w[u] != 0.f;
      l += w[u];
      acc[0] += w[u] * (use ? o[u].x : 0.f);
      acc[1] += w[u] * (use ? o[u].y : 0.f);
      acc[2] += w[u] * (use ? o[u].z : 0.f);
      acc[3] += w[u] * (use ? o[u].w : 0.f);
    }
  }

  // the warps' sums meet: warps 1 .. store theirs, warp 0 adds them in warp order
  float* sm = arch::smem_dynamic<float>();
  float* sl = sm + kCombineV1Warps * 32 * 4;
  if (warp > 0) {
    *reinterpret_cast<float4*>(sm + (warp * 32 + lane) * 4) = make_float4(acc[0], acc[1], acc[2], acc[3]);
    if (lane == 0) sl[warp] = l;
  }
  arch::block_sync();
  if (warp > 0) return;
#pragma unroll
  for (int w = 1; w < kCombineV1Warps; ++w) {
    const float4 a = *reinterpret_cast<const float4*>(sm + (w * 32 + lane) * 4);
    acc[0] += a.x, acc[1] += a.y, acc[2] += a.z, acc[3] += a.w;
    l += sl[w];
  }
  const float inv = h::row_inv_l(l);
  T* out = static_cast<T*>(p.out) + qrow * p.o_stride_tok + head * p.o_stride_head;
  arch::st_global(reinterpret_cast<uint2*>(out + col0),
                  make_uint2(arch::pack2<T>(acc[0] * inv, acc[1] * inv), arch::pack2<T>(acc[2] * inv, acc[3] * inv)));
  if (p.lse != nullptr && col0 == 0)
    arch::st_global(p.lse + qrow * p.lse_stride_tok + head * p.lse_stride_head,
                    h::row_lse2(mref, l, Log2{}) * h::kLn2);
}

}  // namespace va::tv
