// Split-KV tree-verify attention, kernel v2 (sm_90a): the split kernel on wgmma.
//
// Same contract, grid, workspace and combine as v1 (tree_verify_kernel_v1.cuh); MLA rows, 16-bit.
// Why: on the H200, v1's mma.sync tile is held by its shared-memory term (every warp reads its K / V
// fragments through ldmatrix, once per 32 rows; NOTES.md). A wgmma reads its B operand from shared
// memory once for the 64 rows of a warpgroup, at the tensor core's own rate.
//   * BM = 64 rows (tree nodes x group heads); WG warpgroups; warpgroup g computes S over dims
//     [g Dqk / WG, (g + 1) Dqk / WG) and O over Dv columns [g Dv / WG, (g + 1) Dv / WG).
//   * S = Q K^T: Dqk / WG / 16 chained wgmma m64nBNk16, both operands from shared memory (Q staged once in
//     the core-matrix layout: its 72 fragment registers do not fit next to O's 128), one commit group.
//     The WG partial score sets meet in shared memory (double-buffered): every thread sums the values of
//     its own fragment positions in warpgroup order (the positions coincide across warpgroups), so every
//     warpgroup holds the same full S of all 64 rows and runs the same softmax.
//   * Softmax in registers: a thread holds rows g and g + 8 of its warp's 16 (g = lane / 4), BN / 4
//     columns of each; row max and sum over the 4 lanes of a quad. The lazy max of v1 (O rescaled only
//     when a tile beats the reference max by more than 2^8). P becomes the A fragments of P V directly
//     (the m64nN accumulator of two n8 blocks is the k16 A fragment).
//   * O += P V: BN / 16 wgmma m64n(Dv / WG)k16 (A = P from registers, V from the same stage, MN-major).
//   * One CTA barrier per tile: iteration it issues S(it + 1) right after it, so the tensor cores work on
//     it while the warps run the softmax of it; then P V(it) queues behind S(it + 1); the warp retires
//     S(it + 1) (stores its partial scores for the next barrier) and P V(it) before the next barrier, so
//     the stage of it - 1 is free to refill right after that barrier. STAGES >= 3: tile it + 1 is read
//     while it + 2 lands.
//   * Loader: 8 tokens x (threads / BN) chunk lanes per group of threads, every copy 16 bytes at a constant
//     offset from one row pointer, writes conflict-free (a warp fills 4 whole 128-byte core-matrix rows);
//     each thread's kv_indices entry for the next tile is loaded one tile ahead into a register.
//   * Masked tiles (the tree, the ragged end) read the first kMaskStage mask words of their rows from shared
//     memory (staged with Q), wider trees' further words from global memory.
#pragma once

#include <type_traits>

#include "arch/arch.cuh"
#include "../host/host_math.h"
#include "params.h"
#include "request.cuh"
#include "traits.h"
#include "tree_verify_kernel.cuh"
#include "tree_verify_kernel_v1.cuh"

namespace va::tv {

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1) tree_verify_split_kernel_v2(const Params p, const int num_splits) {
  using T = typename Tr::Elem;
  using L = typename Tr::Layout;
  namespace arch = va::arch;
  namespace h = va::host;
  constexpr int BM = Tr::BM, BN = Tr::BN, STAGES = Tr::STAGES, WG = Tr::WG;
  constexpr int kSKSteps = Tr::kSKSteps, kPKSteps = Tr::kPKSteps, kSAccN = Tr::kSAccN, kOAccN = Tr::kOAccN;

  // ---- this CTA's rows and KV range (block-uniform: early exits are safe) ----
  CtaWork work;
  if (!cta_work<T, BM, BN>(p, num_splits, work)) return;
  const int split = work.split, kvh = work.kvh;
  const RequestInfo& req = work.req;
  const int qo_begin = req.qo_begin, prefix = req.prefix;
  const int group = p.group;
  const int nrows = work.nrows, row0 = work.row0, ntiles = work.ntiles;
  const h::SplitRange range = work.range;
  const int kv_base = req.kv_base;

  const int tid = threadIdx.x;
  const int lane = arch::lane_id();
  const int warp = arch::warp_id();
  // warpgroup (read from lane 0, so the compiler knows it warp-uniform and keeps the descriptors in
  // uniform registers); warp within it (its 16 rows)
  const int wg = arch::shfl(warp / 4, 0), wq = warp % 4;
  const int qg = lane >> 2, qt = lane & 3;  // fragment row group and column pair

  unsigned char* smem = arch::smem_dynamic<unsigned char>();
  float* sPart = reinterpret_cast<float*>(smem + Tr::kPart);  // (2, WG, 128, kSAccN) partial scores
  const T* q = static_cast<const T*>(p.q);
  const T* kc = static_cast<const T*>(p.k_cache);

  // ---- Q: 64 rows in the core-matrix layout of a KV stage (rows for tokens), read by the S wgmmas
  // from shared memory (A K-major): 255 registers cannot hold Q's 72 fragment registers next to the
  // 128 of the O accumulator (ptxas spilled) ----
  unsigned char* sQ = smem + Tr::kQ;
  for (int i = tid; i < BM * Tr::kChunks; i += Tr::kThreads) {
    const int r = (i & 7) + 8 * (i / (8 * Tr::kChunks)), c = (i >> 3) % Tr::kChunks;  // 8 rows per 128 B
    const int grow = row0 + r;
    const bool valid = grow < nrows;  // rows past T_b * group: zeros (never written out)
    const T* src = q;
    if (valid) {
      const int node = grow / group, hh = grow % group;
      src = q + (qo_begin + node) * p.q_stride_tok + (kvh * group + hh) * p.q_stride_head + c * 8;
    }
    arch::cp_async_16_zfill(sQ + (r >> 3) * Tr::kGroupBytes + c * 128 + (r & 7) * 16, src, valid);
  }
  // the first kMaskStage tree-mask words of each row's node, staged with Q: the masked tiles' softmax reads
  // them here instead of a global round trip per score (wider trees read words kMaskStage.. from global memory)
  uint32_t* sMask = reinterpret_cast<uint32_t*>(smem + Tr::kMask);
  constexpr int kMaskStage = Tr::kMaskStage;
  stage_mask_words<BM, Tr::kThreads, kMaskStage>(p, req, row0, nrows, sMask);
  // Q and the mask words are committed with tile 0's copies: the first wait covers them all

  // ---- loader: thread -> (token of every tile, first chunk lane); 8 consecutive threads fill one
  // 128-byte core-matrix row (8 tokens x 16 bytes) ----
  const int ld_tok = (tid & 7) + 8 * (tid / (8 * Tr::kTPR));
  const int ld_lane = (tid >> 3) % Tr::kTPR;
  const int32_t k_sb = static_cast<int32_t>(p.k_stride_block), k_st = static_cast<int32_t>(p.k_stride_tok);
  const T* k_row0 = kc + ld_lane * 8 + kvh * p.k_stride_head;
  const int dst0 = (ld_tok >> 3) * Tr::kGroupBytes + ld_lane * 128 + (ld_tok & 7) * 16;
  TokenCursor<L> idx_at(range.begin + ld_tok, BN, p.page_size);   // the next index to read
  TokenCursor<L> copy_at = idx_at;                                // the next tile to copy
  int idx_tok = range.begin + ld_tok, copy_tok = idx_tok;
  auto read_index = [&]() -> int32_t {
    int32_t id;
    if constexpr (kKnockout & kKoNoIndex)
      id = idx_tok < range.end ? idx_at.pos : 0;
    else
      id = idx_tok < range.end ? ld_index(p.kv_indices, static_cast<int64_t>(kv_base) + idx_at.pos, p.kv_indices_i64)
                               : 0;
    idx_at.advance();
    idx_tok += BN;
    return id;
  };
  auto issue_kv = [&](int stage, int32_t id) {
    const bool valid = copy_tok < range.end;  // past the end: zeros land, no read (id 0 is in bounds)
    const T* src = k_row0 + copy_at.row_offset(id, k_sb, k_st);
    unsigned char* dst = smem + Tr::kKV + stage * Tr::kStageBytes + dst0;
#pragma unroll
    for (int j = 0; j < Tr::kChunksPerThread; ++j)
      arch::cp_async_16_zfill(dst + j * Tr::kTPR * 128, src + j * Tr::kTPR * 8, valid);
    copy_at.advance();
    copy_tok += BN;
  };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    const int32_t id = read_index();
    if (s < ntiles) issue_kv(s, id);
    arch::cp_async_commit();
  }
  int32_t next_id = read_index();  // tile STAGES - 1's, loaded a tile ahead of its copy

  // ---- descriptors: K-major for S (k steps 128 B apart, 8-token groups kGroupBytes), MN-major for P V
  // (8-token groups kGroupBytes apart along k, 8-dim chunks 128 B along n) ----
  const uint64_t k_desc0 = arch::wgmma_desc(smem + Tr::kKV, 128, Tr::kGroupBytes);
  const uint64_t v_desc0 = arch::wgmma_desc(smem + Tr::kKV, Tr::kGroupBytes, 128);
  const uint64_t q_desc = arch::wgmma_desc(sQ + wg * (Tr::kSDims / 8) * 128, 128, Tr::kGroupBytes);

  // ---- softmax state: rows qg and qg + 8 of the warp's 16 ----
  const float scale_log2 = p.sm_scale * h::kLog2e;
  int smask_row[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int grow = row0 + wq * 16 + qg + 8 * hf;
    smask_row[hf] = grow < nrows ? qo_begin + grow / group : -1;  // node's q row; -1: padding row
  }
  const uint32_t* my_mask[2] = {sMask + (wq * 16 + qg) * kMaskStage, sMask + (wq * 16 + qg + 8) * kMaskStage};
  float m_run[2] = {h::neg_inf(), h::neg_inf()}, l_run[2] = {0.f, 0.f};
  float oacc[kOAccN];
#pragma unroll
  for (int i = 0; i < kOAccN; ++i) oacc[i] = 0.f;
  // partial scores of tile t: set t % 2, warpgroup g, the thread's float4 number e4 at
  // ((set * WG + g) * kSAccN / 4 + e4) * 128 + thread in warpgroup (float4 units) -- the fragment positions of a
  // thread coincide across warpgroups. Consecutive threads hold consecutive float4s, so each quarter warp's
  // 16-byte accesses cover one 128-byte row: no bank conflict (the first layout, a thread's kSAccN floats
  // side by side, put a 64-byte stride between threads: 4-way conflicts on every exchange access, 13.4M
  // conflicts in one 185k call by ncu on the H200, 2026-12-04)
  auto part_at = [&](int tile, int g) { return sPart + ((((tile & 1) * WG + g) * (kSAccN / 4)) * 128 + tid % 128) * 4; };
  constexpr int kPartE4 = 128 * 4;  // floats from one float4 number of a thread to its next
  auto tile_masked = [&](int tile) { return h::tile_needs_mask(range.begin + tile * BN, BN, prefix, range.end); };

  // S(tile) over this warpgroup's dims, issued and committed (not waited for)
  float sacc[kSAccN];
  const uint64_t k_desc_wg = arch::wgmma_desc_advance(k_desc0, wg * (Tr::kSDims / 8) * 128);
  const uint64_t v_desc_wg = arch::wgmma_desc_advance(v_desc0, wg * (Tr::kODV / 8) * 128);
  auto s_issue = [&](int stage) {
    const uint64_t k_desc = arch::wgmma_desc_advance(k_desc_wg, stage * Tr::kStageBytes);
    arch::wgmma_fence_operand(sacc);
    arch::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kSKSteps; ++kk)
      arch::wgmma_ss<T, BN, false>(sacc, arch::wgmma_desc_advance(q_desc, kk * 256),
                                   arch::wgmma_desc_advance(k_desc, kk * 256), kk > 0);
    arch::wgmma_commit();
    arch::wgmma_fence_operand(sacc);
  };
  auto s_store = [&](int tile) {
    if constexpr (kKnockout & kKoNoExchange) return;
    float* my = part_at(tile, wg);
#pragma unroll
    for (int e = 0; e < kSAccN; e += 4)
      *reinterpret_cast<float4*>(my + (e / 4) * kPartE4) = make_float4(sacc[e], sacc[e + 1], sacc[e + 2], sacc[e + 3]);
  };

  // ---- tile 0's S before the loop ----
  arch::cp_async_wait<STAGES - 2>();  // Q and tile 0 landed (this thread's copies)
  arch::fence_proxy_async();          // ... visible to the wgmma's async proxy
  arch::block_sync();                 // ... everyone's
  s_issue(0);  // stage 0
  arch::wgmma_wait<0>();
  arch::wgmma_fence_operand(sacc);
  s_store(0);

  // ---- main loop, one barrier per tile: S(it + 1) runs on the tensor cores while the softmax of it does
  // not; then P V(it). Everything a tile's wgmmas read is retired by the end of its iteration. ----
  // the stages of tiles it - 1, it and it + 1, advanced without a modulo
  int st_prev = STAGES - 1, st_cur = 0, st_next = 1;
  for (int it = 0; it < ntiles; ++it) {  // sass-model: tile-loop
    arch::cp_async_wait<STAGES - 3>();  // tile it + 1 landed (this thread's copies)
    arch::fence_proxy_async();          // ... visible to the wgmma's async proxy
    // everyone's; the partial scores of it published; every wgmma of iteration it - 1 retired, so stage
    // it - 1 is free
    arch::block_sync();
    // S(it + 1) first, so the tensor cores start right after the barrier (the model: 1,751 -> 1,720 cycles per
    // tile); in the last iteration it reads a stage nothing landed in for it, and its scores are never read:
    // the same instruction stream in every iteration keeps ptxas from serializing the wgmmas
    s_issue(st_next);
    if (!(kKnockout & kKoNoLoad) && it + STAGES - 1 < ntiles) issue_kv(st_prev, next_id);  // tile it + STAGES - 1
                                                                                           // into stage (it - 1)
    arch::cp_async_commit();
    if (it + STAGES < ntiles) next_id = read_index();

    // the full scores of tile it at this thread's fragment positions, summed in warpgroup order (every
    // warpgroup gets the same bits); d[e]: row qg + 8 ((e % 4) / 2), column 8 (e / 4) + 2 qt + (e % 2)
    float s[kSAccN];
    if constexpr (kKnockout & kKoNoExchange) {
#pragma unroll
      for (int e = 0; e < kSAccN; ++e) s[e] = 0.f;
    } else {
#pragma unroll
      for (int e = 0; e < kSAccN; e += 4) {
        const float4 v = *reinterpret_cast<const float4*>(part_at(it, 0) + (e / 4) * kPartE4);
        s[e] = v.x, s[e + 1] = v.y, s[e + 2] = v.z, s[e + 3] = v.w;
      }
#pragma unroll
      for (int g = 1; g < WG; ++g)
#pragma unroll
        for (int e = 0; e < kSAccN; e += 4) {
          const float4 v = *reinterpret_cast<const float4*>(part_at(it, g) + (e / 4) * kPartE4);
          s[e] += v.x, s[e + 1] += v.y, s[e + 2] += v.z, s[e + 3] += v.w;
        }
    }
    const bool masked = tile_masked(it);
    const int tok0 = range.begin + it * BN;
    float tmax[2] = {h::neg_inf(), h::neg_inf()};
#pragma unroll
    for (int e = 0; e < kSAccN; ++e) {
      const int hf = (e % 4) >> 1;
      s[e] *= scale_log2;
      if (masked) {  // sass-model: cold
        const int t = tok0 + 8 * (e / 4) + 2 * qt + (e & 1);
        uint32_t word = 0;
        if (smask_row[hf] >= 0 && h::needs_mask_word(t, prefix, range.end)) {
          const int wi = h::mask_word_index(t - prefix);
          if (wi < kMaskStage) {
            word = my_mask[hf][wi];
          } else {  // sass-model: rare
            word = static_cast<uint32_t>(
                arch::ld_global(p.tree_mask + static_cast<int64_t>(smask_row[hf]) * p.mask_words + wi));
          }
        }
        // padding rows see every real token (keeps them finite; they are never written)
        const bool vis = smask_row[hf] >= 0 ? h::token_visible(t, prefix, range.end, word) : t < range.end;
        if (!vis) s[e] = h::neg_inf();
      }
      tmax[hf] = arch::max_f(tmax[hf], s[e]);
    }
    float alpha[2], mref[2], rsum[2] = {0.f, 0.f};
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      tmax[hf] = arch::max_f(tmax[hf], arch::shfl_xor(tmax[hf], 1));
      tmax[hf] = arch::max_f(tmax[hf], arch::shfl_xor(tmax[hf], 2));
      alpha[hf] = h::lazy_softmax_update(m_run[hf], tmax[hf], 8.f, Exp2Fast{});
      mref[hf] = h::softmax_ref_max(m_run[hf]);
    }
#pragma unroll
    for (int e = 0; e < kSAccN; ++e) {
      s[e] = arch::exp2_approx(s[e] - mref[(e % 4) >> 1]);
      rsum[(e % 4) >> 1] += s[e];
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      rsum[hf] += arch::shfl_xor(rsum[hf], 1);
      rsum[hf] += arch::shfl_xor(rsum[hf], 2);
      l_run[hf] = l_run[hf] * alpha[hf] + rsum[hf];
    }
    // P as the A fragments of the P V k steps: step kk is n8 blocks 2kk (a0, a1) and 2kk + 1 (a2, a3)
    uint32_t pa[kPKSteps][4];
#pragma unroll
    for (int kk = 0; kk < kPKSteps; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) pa[kk][r] = arch::pack2<T>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
    // O *= alpha per row; with the lazy max almost never (the branch is warp-uniform). O is not in flight:
    // P V(it - 1) retired at the end of the last iteration.
    if (arch::any(alpha[0] != 1.f || alpha[1] != 1.f)) {  // sass-model: cold
#pragma unroll
      for (int i = 0; i < kOAccN; ++i) oacc[i] *= alpha[(i % 4) >> 1];
    }
    // O += P V(it) over this warpgroup's Dv columns, queued behind S(it + 1)
    arch::wgmma_fence_operand(oacc);
    arch::wgmma_fence();
    const uint64_t v_desc = arch::wgmma_desc_advance(v_desc_wg, st_cur * Tr::kStageBytes);
#pragma unroll
    for (int kk = 0; kk < kPKSteps; ++kk)
      arch::wgmma_rs<T, Tr::kODV, true>(oacc, pa[kk], arch::wgmma_desc_advance(v_desc, kk * 2 * Tr::kGroupBytes), true);
    arch::wgmma_commit();
    arch::wgmma_fence_operand(oacc);
    arch::wgmma_wait<1>();  // S(it + 1) retired (P V(it) may still run): its partial scores out for the next barrier
    arch::wgmma_fence_operand(sacc);
    s_store(it + 1);
    arch::wgmma_wait<0>();  // P V(it) retired: stage it is free after the next barrier
    arch::wgmma_fence_operand(oacc);
    st_prev = st_cur;
    st_cur = st_next;
    st_next = st_next + 1 == STAGES ? 0 : st_next + 1;
  }
  arch::cp_async_wait<0>();  // no copy outlives the CTA (only empty groups can be pending here)
  arch::launch_dependents();  // the combine may start launching; it waits for this grid's writes

  // ---- epilogue: this thread's rows, its warpgroup's columns 8j + 2 qt, +1 ----
  const bool direct = num_splits == 1;
  float* ws_o = direct ? nullptr : ws_partial_o(p);
  float* ws_lse = direct ? nullptr : ws_partial_lse(p, num_splits);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int grow = row0 + wq * 16 + qg + 8 * hf;
    if (grow >= nrows) continue;
    const int qrow = qo_begin + grow / group;
    const int head = kvh * group + grow % group;
    const float inv = h::row_inv_l(l_run[hf]);
    const float lse2 = h::row_lse2(m_run[hf], l_run[hf], Log2{});
    const int col0 = wg * Tr::kODV + 2 * qt;
    if (direct) {
      T* o = static_cast<T*>(p.out) + qrow * p.o_stride_tok + head * p.o_stride_head + col0;
#pragma unroll
      for (int j = 0; j < kOAccN / 4; ++j)
        arch::st_global(reinterpret_cast<uint32_t*>(o + 8 * j),
                        arch::pack2<T>(oacc[4 * j + 2 * hf] * inv, oacc[4 * j + 2 * hf + 1] * inv));
      if (p.lse != nullptr && wg == 0 && qt == 0)
        arch::st_global(p.lse + qrow * p.lse_stride_tok + head * p.lse_stride_head, lse2 * h::kLn2);
    } else {
      const int64_t prow = (static_cast<int64_t>(split) * p.total_q + qrow) * p.num_q_heads + head;
      float* o = ws_o + prow * p.head_dim_v + col0;
#pragma unroll
      for (int j = 0; j < kOAccN / 4; ++j)
        arch::st_global(reinterpret_cast<float2*>(o + 8 * j),
                        make_float2(oacc[4 * j + 2 * hf] * inv, oacc[4 * j + 2 * hf + 1] * inv));
      if (wg == 0 && qt == 0) arch::st_global(ws_lse + prow, lse2);
    }
  }
}

}  // namespace va::tv
