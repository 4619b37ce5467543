// Split-KV tree-verify attention, kernel v2 (sm_90a): the split kernel on wgmma.
//
// Same contract, grid, workspace and combine as v1 (tree_verify_kernel_v1.cuh); MLA rows, 16-bit or e4m3 (below).
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
//     each thread's kv_indices entries come through a small shared-memory ring, cp.async'd tiles ahead (v1's).
//   * Masked tiles (the tree, the ragged end) read the first kMaskStage mask words of their rows from shared
//     memory (staged with Q), wider trees' further words from global memory.
// e4m3 caches (Tr::kFp8, per-tensor scales): both products on wgmma .e4m3 (k32, twice the 16-bit rate):
//   * Q quantized per row like v1's e4m3 tiles (scale amax / 448, folded into the row's score scale) into the
//     same core-matrix layout; S: Dqk / WG / 32 wgmma m64nBNk32 per warpgroup.
//   * the exact max (no slack: P <= 1), P stored x 2^8 as e4m3 (the epilogue divides by 2^8 and multiplies by
//     the V scale), straight from the S accumulator into the A fragment of one m64n(Dv / WG)k32 wgmma: k
//     position kappa holds token fp8_pv_token_of_k(kappa) (csrc/host/fp8.h), which is where the S fragment has it.
//   * e4m3 B operands are K-major only, so V is transposed: while P V(it) runs, the warps write tile it + 1's
//     V^T (4-byte loads of 4 tokens, byte permutes, 4-byte stores; conflict-free both ways) into the V^T buffer
//     that P V(it - 1) read, published by the next barrier.
//   * a warpgroup's own partial scores stay in registers: only the other warpgroup's are read back.
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
  // launched with programmatic dependent launch (launch_shape.cuh): nothing below touches global memory before the
  // previous kernel on the stream completed; only this grid's launch and start overlap its end
  va::arch::grid_dependency_wait();
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
  const auto* kc = static_cast<const typename Tr::KvElem*>(p.k_cache);

  // ---- Q: 64 rows in the core-matrix layout of a KV stage (rows for tokens), read by the S wgmmas
  // from shared memory (A K-major): 255 registers cannot hold Q's 72 fragment registers next to the
  // 128 of the O accumulator (ptxas spilled) ----
  unsigned char* sQ = smem + Tr::kQ;
  using KV = typename Tr::KvElem;
  constexpr int CE = Tr::kChunkElems;  // elements per 16-byte chunk
  if constexpr (!Tr::kFp8)  // (e4m3: quantized below, after the first KV copies are issued)
  for (int i = tid; i < BM * Tr::kChunks; i += Tr::kThreads) {
    const int r = (i & 7) + 8 * (i / (8 * Tr::kChunks)), c = (i >> 3) % Tr::kChunks;  // 8 rows per 128 B
    const int grow = row0 + r;
    bool valid;  // (rows past T_b * group: zeros, never written out)
    const T* src = q_chunk_src(p, q, grow, nrows, group, qo_begin, kvh, c, valid);
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
  const KV* k_row0 = kc + ld_lane * CE + kvh * p.k_stride_head;
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
    const KV* src = k_row0 + copy_at.row_offset(id, k_sb, k_st);
    unsigned char* dst = smem + Tr::kKV + stage * Tr::kStageBytes + dst0;
#pragma unroll
    for (int j = 0; j < Tr::kChunksPerThread; ++j)
      if ((j + 1) * Tr::kTPR <= Tr::kChunks || ld_lane + j * Tr::kTPR < Tr::kChunks)  // e4m3: 36 chunks over 8 lanes
        arch::cp_async_16_zfill(dst + j * Tr::kTPR * 128, src + j * Tr::kTPR * CE, valid);
    copy_at.advance();
    copy_tok += BN;
  };
  // kv_indices ring (like v1's): tiles 0 .. STAGES - 2 read their index directly; the index of a later tile is
  // copied by cp.async into this thread's slot kRingAhead - STAGES + 1 iterations before its KV copy (iteration it
  // copies tile it + kRingAhead's and reads tile it + STAGES - 1's and it + STAGES - 1 + kPF's, landed by the
  // loop's top wait), so no register waits on a load (a register loaded one tile ahead kept the copies waiting
  // ~400 cycles a tile by the model)
  constexpr int kLoopPending = STAGES - 3;  // the loop's cp.async wait: tile it + 1 landed
  constexpr int kPF = Tr::kPrefetch;        // tiles between a row's L2 prefetch and its cp.async
  constexpr int kRingAhead = STAGES + kLoopPending + kPF;
  // L2 prefetch: the thread's token of a tile kPF tiles past the one being copied, addresses ld_lane, ld_lane +
  // kTPR, ... of its row's kLineLanes (the row's 8 loader threads share its lines). Only rows of this CTA's range
  // (the copies of those lines then hit L2 instead of waiting for DRAM: one tile of copy lead is all 3 stages
  // of 36.9 KB leave beside Q)
  TokenCursor<L> pf_at(range.begin + (STAGES - 1) * BN + ld_tok, BN, p.page_size);
  int pf_tok = range.begin + (STAGES - 1) * BN + ld_tok;
  const unsigned char* kv_head = reinterpret_cast<const unsigned char*>(kc + kvh * p.k_stride_head);
  auto prefetch_kv = [&](int32_t id) {
    if (!(kKnockout & kKoNoPrefetch) && pf_tok < range.end) {
      const unsigned char* row = kv_head + pf_at.row_offset(id, k_sb, k_st) * int64_t(sizeof(KV));
#pragma unroll
      for (int j = 0; j < (Tr::kLineLanes + Tr::kTPR - 1) / Tr::kTPR; ++j) {
        const int line = ld_lane + j * Tr::kTPR, b = 128 * line;  // the row's byte b, or its last byte
        if (line < Tr::kLineLanes) arch::prefetch_l2(row + (b < Tr::kRowBytes ? b : Tr::kRowBytes - 1));
      }
    }
    pf_at.advance();
    pf_tok += BN;
  };
  int32_t* sIdx = reinterpret_cast<int32_t*>(smem + Tr::kIdx);  // (kIdxSlots, kThreads)
  TokenCursor<L> ring_at(range.begin + (STAGES - 1) * BN + ld_tok, BN, p.page_size);
  int ring_tile = STAGES - 1, ring_tok = range.begin + (STAGES - 1) * BN + ld_tok;
  const int32_t* idx_base = index_at(p.kv_indices, kv_base, p.kv_indices_i64);
  auto fetch_ring = [&]() {
    if constexpr (!(kKnockout & kKoNoIndex))
      arch::cp_async_4_zfill(sIdx + (ring_tile % Tr::kIdxSlots) * Tr::kThreads + tid,
                             index_at(idx_base, ring_at.pos, p.kv_indices_i64), ring_tok < range.end);
    ring_at.advance();
    ++ring_tile;
    ring_tok += BN;
  };
  // ... and the L2 prefetch of the indices the ring copies kPF iterations later (a row's loader thread of chunk
  // lane 0 names its token's entry), so that the ring's copies hit L2 too: they share the KV copies' group
  TokenCursor<L> ipf_at(range.begin + kRingAhead * BN + ld_tok, BN, p.page_size);
  int ipf_tok = range.begin + kRingAhead * BN + ld_tok;
  auto prefetch_idx = [&]() {
    if constexpr (!(kKnockout & (kKoNoIndex | kKoNoPrefetch)))
      if (ld_lane == 0 && ipf_tok < range.end) arch::prefetch_l2(index_at(idx_base, ipf_at.pos, p.kv_indices_i64));
    ipf_at.advance();
    ipf_tok += BN;
  };
  auto ring_id = [&](int tile) -> int32_t {
    if constexpr (kKnockout & kKoNoIndex)  // page_size 1: the row of token t is t
      return range.begin + tile * BN + ld_tok;
    return sIdx[(tile % Tr::kIdxSlots) * Tr::kThreads + tid];
  };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    const int32_t id = read_index();
    if (s < ntiles) issue_kv(s, id);
    if (s == 0) {  // the ring indices of tiles STAGES - 1 .. kRingAhead - 1, with tile 0's group
#pragma unroll
      for (int j = STAGES - 1; j < kRingAhead; ++j) fetch_ring();
#pragma unroll
      for (int j = 0; j < kPF; ++j) prefetch_idx();  // those of tiles kRingAhead .. kRingAhead + kPF - 1
    }
    arch::cp_async_commit();
  }

  // ---- e4m3: Q quantized per row (scale amax / 448, like v1's e4m3 tiles) into the core-matrix layout, while
  // the first KV copies fly: warp w takes rows w, w + 8, ...; lane l the 16-dim chunks l, l + 32 ----
  [[maybe_unused]] float* sQScale = reinterpret_cast<float*>(smem + Tr::kQScale);
  if constexpr (Tr::kFp8)
    stage_q_e4m3<T, BM, Tr::kWarps, Tr::kChunks, Tr::kGroupBytes>(p, q, row0, nrows, group, qo_begin, kvh, warp, lane,
                                                                   sQ, sQScale);

  // ---- e4m3: V^T of a landed stage into a V^T buffer (VtTransposer, tree_verify_kernel.cuh): warp w takes the 16-dim
  // chunks w, w + 8, ... of the tile's 32 tokens ----
  [[maybe_unused]] const VtTransposer<Tr::kWarps, Tr::kGroupBytes, Tr::kVtLbo, Tr::kVtSbo> vt(lane, warp);
  auto v_transpose = [&](int stage, int buf) {
    if constexpr (Tr::kFp8)
      vt.template run<Tr::DV / 16 / Tr::kWarps>(smem + Tr::kKV + stage * Tr::kStageBytes,
                                                 smem + Tr::kVt + buf * Tr::kVtBytes);
    else
      (void)stage, (void)buf;
  };

  // ---- descriptors: K-major for S (k steps 128 B apart, 8-token groups kGroupBytes), MN-major for P V
  // (8-token groups kGroupBytes apart along k, 8-dim chunks 128 B along n) ----
  // (e4m3: V^T K-major, kVtLbo along k, kVtSbo between 8-dim groups)
  const uint64_t k_desc0 = arch::wgmma_desc(smem + Tr::kKV, 128, Tr::kGroupBytes);
  const uint64_t v_desc0 = Tr::kFp8 ? arch::wgmma_desc(smem + Tr::kVt, Tr::kVtLbo, Tr::kVtSbo)
                                    : arch::wgmma_desc(smem + Tr::kKV, Tr::kGroupBytes, 128);
  const uint64_t q_desc = arch::wgmma_desc(sQ + wg * (Tr::kSDims / CE) * 128, 128, Tr::kGroupBytes);

  // ---- softmax state: rows qg and qg + 8 of the warp's 16 ----
  float scale_log2[2] = {p.sm_scale * h::kLog2e, p.sm_scale * h::kLog2e};  // e4m3: x the Q row's and K's scales
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
  constexpr float kPScale = 256.f;  // e4m3 P: stored x 2^8 (3 bits of precision down to P = 2^-14)

  // S(tile) over this warpgroup's dims, issued and committed (not waited for)
  float sacc[kSAccN];
  const uint64_t k_desc_wg = arch::wgmma_desc_advance(k_desc0, wg * (Tr::kSDims / CE) * 128);
  const uint64_t v_desc_wg =
      arch::wgmma_desc_advance(v_desc0, wg * (Tr::kODV / 8) * (Tr::kFp8 ? Tr::kVtSbo : 128));
  auto s_issue = [&](int stage) {
    const uint64_t k_desc = arch::wgmma_desc_advance(k_desc_wg, stage * Tr::kStageBytes);
    arch::wgmma_fence_operand(sacc);
    arch::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kSKSteps; ++kk)
      arch::wgmma_ss<KV, BN, false>(sacc, arch::wgmma_desc_advance(q_desc, kk * 256),
                                   arch::wgmma_desc_advance(k_desc, kk * 256), kk > 0);
    arch::wgmma_commit();
    arch::wgmma_fence_operand(sacc);
  };
  // e4m3 (two warpgroups): a warpgroup keeps its own partial scores in registers and reads only the other's from
  // shared memory (16 KB a tile less); own + other is other + own bit for bit, so both still get the same S
  constexpr bool kOwnInRegs = Tr::kFp8 && WG == 2;
  [[maybe_unused]] float own[kSAccN];
  auto s_store = [&](int tile) {
    if constexpr (kKnockout & kKoNoExchange) return;
    float* my = part_at(tile, wg);
#pragma unroll
    for (int e = 0; e < kSAccN; e += 4)
      *reinterpret_cast<float4*>(my + (e / 4) * kPartE4) = make_float4(sacc[e], sacc[e + 1], sacc[e + 2], sacc[e + 3]);
    if constexpr (kOwnInRegs) {
#pragma unroll
      for (int e = 0; e < kSAccN; ++e) own[e] = sacc[e];
    }
  };

  // ---- tile 0's S before the loop ----
  arch::cp_async_wait<STAGES - 2>();  // Q and tile 0 landed (this thread's copies)
  arch::fence_proxy_async();          // ... visible to the wgmma's async proxy
  arch::block_sync();                 // ... everyone's (e4m3: and the quantized Q, the row scales)
  // the L2 prefetches of tiles STAGES - 1 .. STAGES - 2 + kPF, whose ring indices came with tile 0's group
#pragma unroll
  for (int t = STAGES - 1; t < STAGES - 1 + kPF; ++t)
    if (!(kKnockout & kKoNoLoad)) prefetch_kv(t < ntiles ? ring_id(t) : 0);
  s_issue(0);  // stage 0
  if constexpr (Tr::kFp8) {
    const float ks = p.sm_scale * h::kLog2e * kv_scale(p.k_scale_ptr, p.k_scale);
    scale_log2[0] = ks * sQScale[wq * 16 + qg], scale_log2[1] = ks * sQScale[wq * 16 + qg + 8];
  }
  v_transpose(0, 0);  // tile 0's V^T: published by the loop's first barrier (its writers' proxy fences first)
  arch::wgmma_wait<0>();
  arch::wgmma_fence_operand(sacc);
  s_store(0);

  // ---- main loop, one barrier per tile: S(it + 1) runs on the tensor cores while the softmax of it does
  // not; then P V(it). Everything a tile's wgmmas read is retired by the end of its iteration. ----
  // the stages of tiles it - 1, it and it + 1, advanced without a modulo
  int st_prev = STAGES - 1, st_cur = 0, st_next = 1;
  for (int it = 0; it < ntiles; ++it) {  // sass-model: tile-loop
    arch::cp_async_wait<kLoopPending>();  // tile it + 1 landed (this thread's copies; the ring's index too)
    arch::fence_proxy_async();            // ... visible to the wgmma's async proxy
    // tile it + STAGES - 1's index: this thread's own ring slot, read before the barrier (its latency hides there)
    const int32_t next_id = it + STAGES - 1 < ntiles ? ring_id(it + STAGES - 1) : 0;
    const int32_t pf_id = it + STAGES - 1 + kPF < ntiles ? ring_id(it + STAGES - 1 + kPF) : 0;
    // everyone's; the partial scores of it published; every wgmma of iteration it - 1 retired, so stage
    // it - 1 is free
    arch::block_sync();
    // S(it + 1) first, so the tensor cores start right after the barrier (the model: 1,751 -> 1,720 cycles per
    // tile); in the last iteration it reads a stage nothing landed in for it, and its scores are never read:
    // the same instruction stream in every iteration keeps ptxas from serializing the wgmmas
    s_issue(st_next);
    if (!(kKnockout & kKoNoLoad) && it + STAGES - 1 < ntiles) issue_kv(st_prev, next_id);  // tile it + STAGES - 1
                                                                                           // into stage (it - 1)
    if (!(kKnockout & kKoNoLoad)) prefetch_kv(pf_id);  // tile it + STAGES - 1 + kPF's rows into L2
    if (it + kRingAhead < ntiles) fetch_ring();
    prefetch_idx();  // tile it + kRingAhead + kPF's indices
    arch::cp_async_commit();

    // the full scores of tile it at this thread's fragment positions, summed in warpgroup order (every
    // warpgroup gets the same bits); d[e]: row qg + 8 ((e % 4) / 2), column 8 (e / 4) + 2 qt + (e % 2)
    float s[kSAccN];
    if constexpr (kKnockout & kKoNoExchange) {
#pragma unroll
      for (int e = 0; e < kSAccN; ++e) s[e] = 0.f;
    } else if constexpr (kOwnInRegs) {
#pragma unroll
      for (int e = 0; e < kSAccN; e += 4) {
        const float4 v = *reinterpret_cast<const float4*>(part_at(it, 1 - wg) + (e / 4) * kPartE4);
        s[e] = own[e] + v.x, s[e + 1] = own[e + 1] + v.y, s[e + 2] = own[e + 2] + v.z, s[e + 3] = own[e + 3] + v.w;
      }
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
    for (int e = 0; e < kSAccN; ++e) s[e] *= scale_log2[(e % 4) >> 1];
    // the mask, one branch around the tile's scores (per score, the branches stayed in the hot path: 16 BRA and 17
    // LOP3 a tile)
    if (masked) {  // sass-model: cold
      mask_m64_scores<kSAccN, kMaskStage>(p, s, tok0, qt, prefix, range.end, smask_row, my_mask);
    }
#pragma unroll
    for (int e = 0; e < kSAccN; ++e) tmax[(e % 4) >> 1] = arch::max_f(tmax[(e % 4) >> 1], s[e]);
    float alpha[2], mref[2], rsum[2] = {0.f, 0.f};
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      tmax[hf] = arch::max_f(tmax[hf], arch::shfl_xor(tmax[hf], 1));
      tmax[hf] = arch::max_f(tmax[hf], arch::shfl_xor(tmax[hf], 2));
      // e4m3: the exact max (P <= 1, stored x kPScale); 16-bit P: the lazy max (P <= 2^8)
      alpha[hf] = h::lazy_softmax_update(m_run[hf], tmax[hf], Tr::kFp8 ? 0.f : 8.f, Exp2Fast{});
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
    // P as the A fragments of the P V k steps: step kk is n8 blocks 2kk (a0, a1) and 2kk + 1 (a2, a3). e4m3 (one
    // k32 step): a[r] holds rows hf = r % 2, k 4 qt + 16 (r / 2) .. + 3, i.e. tokens 16 (r / 2) + 2 qt + {0, 1, 8,
    // 9}: the S fragment's e = 8 (r / 2) + 2 hf + {0, 1, 4, 5}
    uint32_t pa[kPKSteps][4];
#pragma unroll
    for (int kk = 0; kk < kPKSteps; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        if constexpr (Tr::kFp8) {
          const int e = 8 * (r >> 1) + 2 * (r & 1);
          pa[kk][r] = arch::cvt_e4m3x4(s[e] * kPScale, s[e + 1] * kPScale, s[e + 4] * kPScale, s[e + 5] * kPScale);
        } else {
          pa[kk][r] = arch::pack2<T>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
        }
      }
    // O *= alpha per row; with the lazy max almost never (the branch is warp-uniform). O is not in flight:
    // P V(it - 1) retired at the end of the last iteration.
    if (arch::any(alpha[0] != 1.f || alpha[1] != 1.f)) {  // sass-model: cold
#pragma unroll
      for (int i = 0; i < kOAccN; ++i) oacc[i] *= alpha[(i % 4) >> 1];
    }
    // O += P V(it) over this warpgroup's Dv columns, queued behind S(it + 1)
    arch::wgmma_fence_operand(oacc);
    arch::wgmma_fence();
    if constexpr (Tr::kFp8) {  // V^T of tile it: buffer it % 2, K-major
      arch::wgmma_rs<KV, Tr::kODV, false>(oacc, pa[0], arch::wgmma_desc_advance(v_desc_wg, (it & 1) * Tr::kVtBytes),
                                          true);
    } else {
      const uint64_t v_desc = arch::wgmma_desc_advance(v_desc_wg, st_cur * Tr::kStageBytes);
#pragma unroll
      for (int kk = 0; kk < kPKSteps; ++kk)
        arch::wgmma_rs<T, Tr::kODV, true>(oacc, pa[kk], arch::wgmma_desc_advance(v_desc, kk * 2 * Tr::kGroupBytes),
                                          true);
    }
    arch::wgmma_commit();
    arch::wgmma_fence_operand(oacc);
    // e4m3: tile it + 1's V^T into the buffer P V(it - 1) read (retired before the barrier) while P V(it) runs (off
    // the path from the barrier to P V); in the last iteration a stage nothing landed in, never read
    v_transpose(st_next, (it + 1) & 1);
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

  // ---- epilogue: this thread's rows, its warpgroup's columns 8j + 2 qt, +1 (e4m3: O was summed from P x kPScale
  // on V's codes) ----
  store_m64_rows<T, kOAccN>(p, num_splits, split, row0, nrows, qo_begin, kvh, wq, qg, wg * Tr::kODV + 2 * qt,
                            wg == 0 && qt == 0, oacc, m_run, l_run,
                            Tr::kFp8 ? kv_scale(p.v_scale_ptr, p.v_scale) / kPScale : 1.f);
}

}  // namespace va::tv
