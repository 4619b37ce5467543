// Split-KV tree-verify attention, kernel v1: the split kernel.
//
// Same contract, grid and workspace as v0 (tree_verify_kernel.cuh); a different
// CTA shape and schedule, chosen from v0's SASS (NOTES.md, `python -m bench.model`):
//   * Q lives in registers, split over the warps by head dim: warp (ws_m, ws_n,
//     ws_k) keeps the A fragments of its m tiles for Dqk / KSPLIT dims, so Q is
//     read from shared memory once per CTA, not once per KV tile.
//   * S = Q K^T: each warp multiplies its dims by its BN / SN tokens with
//     kSMT x kSN8 independent accumulators (two sets over even / odd k steps when
//     that alone gives fewer than 4), chains Dqk / KSPLIT / 16 deep at most
//     (MLA, KSPLIT 4: depth 9 instead of v0's 36). The KSPLIT partial scores meet
//     in shared memory (fp32).
//   * Softmax on whole rows: each warp sums the partials of BM / W rows, masks
//     (only tiles that reach the tree or the ragged end), takes the row max and
//     sum with shuffles, writes P (16-bit) and each row's rescale factor alpha.
//   * O += P V: every warp owns Dv / W columns of all rows (V fragments reused
//     across the m tiles); P and V fragments are loaded before the barrier that
//     publishes the next tile's scores. The running max is lazy: it moves only when
//     a tile beats it by more than 2^8, so O is rescaled on a few tiles per split.
//   * Software pipeline, one barrier per tile (BARS = 1): between two barriers
//     iteration i computes S(i+2), the softmax of tile i+1 and PV(i), three
//     independent streams, PV last so a warp reaches the barrier with its MMAs in
//     flight; the partial scores are double-buffered and STAGES >= 4 (tiles i .. i+2
//     are read while i+3 loads: one tile in flight at 4 stages). Two barriers per tile
//     (BARS = 2, sm_120's tiles): iteration i computes S(i+1), then after a second
//     barrier PV(i) with the softmax of i+1; STAGES >= 3, tiles i and i+1 are read
//     while STAGES - 2 load (two in flight at 4 stages, in sm_120's 99 KB).
//     P and alpha are double-buffered in both.
//   * Loader: one kv_indices entry per tile row, copied into an smem ring ahead of its
//     KV copy and read before the barrier; one row offset per tile (32-bit products);
//     fully unrolled 16-byte cp.async at constant offsets; running counters, no division
//     or modulo per tile. Paged layouts advance (page, row) incrementally.
//   * Masked tiles read the first tree-mask words of their rows from smem (staged with Q).
//   * Bulk loader (Tile::LOADER 1): BN threads (BN / W lanes of every warp) each copy one whole KV row with one
//     cp.async.bulk (the TMA unit), completing on the stage's mbarrier; every thread waits on the phase
//     of the tile its S reads before the barrier that publishes it. A row past the range's end is
//     zero-filled by its thread with st.shared (it only arrives). The index ring and Q stay on cp.async.
//   * Kernel v3 (Tile::LOADER 2, issue 39): warp roles. W math warps run the math above (its functions unchanged)
//     one tile at a time: S(it), barrier, softmax(it), barrier, PV(it), so they hold one stage and the other
//     STAGES - 1 are in flight (the copies overlap the math, not S with PV as in v1's two-tile loop; that loop's
//     second held stage and its live S + PV fragments do not fit sm_120's 99 KB and 168 registers with 9 warps:
//     config.h). One producer warp after them (warp W) issues every KV copy: its lane r reads the index of row r
//     of each tile from global memory (a tile ahead, under its wait) and copies the 1,152-byte row with one
//     cp.async.bulk on the stage's FULL mbarrier. The math warps wait on FULL themselves, release a stage on its
//     EMPTY mbarrier (one lane per warp after __syncwarp) as soon as PV has its V fragments in registers, and meet
//     on named barrier 1 (32 W threads) where v1 has block_sync; the producer waits on EMPTY before it refills a
//     stage. The only CTA-wide barrier is the one after the mbarriers' init. Q is staged by the math warps in the
//     last kQStages stages (as v1); they free those stages for the producer with bar.arrive on named barrier 2
//     (all 32 W + 32 threads), which the producer syncs on before its first copy into them.
//     With a producer warpgroup (LOADER 3 and 4) all four of its warps issue copies, a quarter of each tile's rows.
//     With math roles (LOADER 4: 16 math warps and the producer warpgroup, 20 warps; the launch gives 96 registers a
//     thread, the producer drops to 32 and the math warps rise to 112) warps 0-7 run S and the softmax and warps 8-15
//     P V, P double-buffered between them on named barriers (the loop below), so the softmax of a tile runs under the
//     P V MMAs of the one before instead of between two barriers with the tensor pipe idle.
//     Why a mode of v1 and not a separate kernel: the math (Q in registers split by head dim, the KSPLIT partial
//     scores, whole-row softmax, PV by Dv columns, lazy rescale, the epilogue) is v1's line for line; only the
//     copy issue, the barriers and the loop differ, so one source keeps them from drifting apart.
#pragma once

#include <type_traits>

#include "arch/arch.cuh"
#include "../host/host_math.h"
#include "params.h"
#include "request.cuh"
#include "traits.h"
#include "tree_verify_kernel.cuh"

namespace va::tv {

// Token -> (kv_indices position, row within the page) cursor of one loader
// thread. Advances by one KV tile per call with additions only; the division
// happens once, at construction.
template <class L>
struct TokenCursor {
  int pos;        // kv_indices entry (relative to the request's first) holding the token: page (paged) or token
  int off;        // the token's row in its page (paged); 0 for page1
  int step_pos;   // BN / P (paged) or BN (page1)
  int step_off;   // BN % P (paged)
  int page_size;

  VA_DEVICE TokenCursor(int t, int block_n, int p_size) : page_size(p_size) {
    if constexpr (L::kPaged) {
      pos = t / p_size;
      off = t - pos * p_size;
      step_pos = block_n / p_size;
      step_off = block_n - step_pos * p_size;
    } else {
      pos = t;
      off = 0;
      step_pos = block_n;
      step_off = 0;
    }
  }
  // this cursor's token, advancing by `by`'s step instead (a block's cursor walking that block's rows)
  VA_DEVICE TokenCursor stepping_as(const TokenCursor& by) const {
    TokenCursor r = *this;
    r.step_pos = by.step_pos, r.step_off = by.step_off;
    return r;
  }
  VA_DEVICE void advance() {
    pos += step_pos;
    if constexpr (L::kPaged) {
      off += step_off;
      if (off >= page_size) {
        off -= page_size;
        pos += 1;
      }
    }
  }
  // element offset of the token's row, for the block id read from kv_indices[pos]: 32-bit strides, and the
  // row's offset in its page, (page_size - 1) x stride_tok, below 2**31 (the launch refuses the rest)
  VA_DEVICE int64_t row_offset(int32_t id, int32_t stride_block, int32_t stride_tok) const {
    return static_cast<int64_t>(id) * stride_block + (L::kPaged ? static_cast<int64_t>(off * stride_tok) : 0);
  }
};

// N consecutive floats of shared memory (N = 1, 2, 4, 8; 8-byte aligned for N >= 2).
template <int N>
VA_DEVICE void lds_vec(const float* src, float (&v)[N]) {
  if constexpr (N == 1) {
    v[0] = src[0];
  } else if constexpr (N == 2) {
    const float2 a = *reinterpret_cast<const float2*>(src);
    v[0] = a.x, v[1] = a.y;
  } else {
#pragma unroll
    for (int k = 0; k < N; k += 4) {
      const float4 a = *reinterpret_cast<const float4*>(src + k);
      v[k] = a.x, v[k + 1] = a.y, v[k + 2] = a.z, v[k + 3] = a.w;
    }
  }
}

// N values (N = 2, 4, 8) as 16-bit T to shared memory in one store.
template <class T, int N>
VA_DEVICE void sts_pack(T* dst, const float (&v)[N]) {
  if constexpr (N == 2) {
    *reinterpret_cast<uint32_t*>(dst) = va::arch::pack2<T>(v[0], v[1]);
  } else if constexpr (N == 4) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(va::arch::pack2<T>(v[0], v[1]), va::arch::pack2<T>(v[2], v[3]));
  } else {
    *reinterpret_cast<uint4*>(dst) = make_uint4(va::arch::pack2<T>(v[0], v[1]), va::arch::pack2<T>(v[2], v[3]),
                                                va::arch::pack2<T>(v[4], v[5]), va::arch::pack2<T>(v[6], v[7]));
  }
}

// Named barriers of the producer-warp tiles (v3): the math warps' exchange, and the producer's wait for the Q
// staging stages (0 is block_sync's).
inline constexpr int kMathBarrier = 1, kQFreeBarrier = 2;
// v3 with math roles: the S warps' own barrier; P(t) published to the PV warps (id kPFullBarrier + t % 2: the S warps
// bar.arrive, the PV warps bar.sync) and its buffer free again (kPEmptyBarrier + t % 2: the other way round)
inline constexpr int kSBarrier = 3, kPFullBarrier = 4, kPEmptyBarrier = 6;

template <class Tr>
__global__ void __launch_bounds__(Tr::kBlockThreads, 1) tree_verify_split_kernel_v1(const Params p, const int num_splits) {
  // launched with programmatic dependent launch (launch_shape.cuh): nothing below touches global memory before the
  // previous kernel on the stream completed; only this grid's launch and start overlap its end
  va::arch::grid_dependency_wait();
  using T = typename Tr::Elem;
  using KV = typename Tr::KvElem;  // K / V storage: T, or e4m3 codes (Tr::kFp8)
  // 16-bit MMA operand type: T, or f16 when e4m3 K / V are converted in registers (Tr::kFp8Deq)
  using M16 = std::conditional_t<Tr::kFp8Deq, __half, T>;
  // P storage: e4m3 codes; 16-bit (M16); or, for the 656-byte rows on the math-roles tile, f16 (the PV warps scale it)
  using PE = std::conditional_t<Tr::k656Roles, __half, std::conditional_t<Tr::kE4m3Mma, uint8_t, M16>>;
  using L = typename Tr::Layout;
  using Smem = typename Tr::Smem;
  namespace arch = va::arch;
  namespace h = va::host;
  constexpr int BM = Tr::BM, BN = Tr::BN, STAGES = Tr::STAGES, TPL = Tr::kTPL;
  constexpr bool kOneBar = Tr::kOneBarrier;
  // the loop's cp.async wait leaves this many groups pending: the tile whose S the iteration computes
  // (it + 1 with two barriers, it + 2 with one) must have landed
  constexpr int kLoopPending = kOneBar ? STAGES - 4 : STAGES - 3;
  // ring distance: the index of tile it + kRingAhead is copied in iteration it, and read (for its KV
  // copy) in iteration kRingAhead - STAGES + 1 later, whose top wait has landed that group
  constexpr int kRingAhead = STAGES + kLoopPending;

  const int split = blockIdx.x;
  const int kvh = blockIdx.y % p.num_kv_heads;
  const int mtile = blockIdx.y / p.num_kv_heads;
  const int b = blockIdx.z;

  // ---- this CTA's rows and KV range (block-uniform: early exits are safe) ----
  const RequestInfo req = read_request(p, b);
  const int qo_begin = req.qo_begin, tb = req.tb, kv_len = req.kv_len, prefix = req.prefix;
  const int group = p.group;
  const int nrows = tb * group;
  const int row0 = mtile * BM;
  if (row0 >= nrows) return;
  const h::SplitRange range = h::split_range(kv_len, num_splits, BN, split);
  if (cta_exits_early<T>(p, req, kvh, row0, row0 + BM < nrows ? row0 + BM : nrows, num_splits, range)) return;
  const int ntiles = h::num_tiles(range, BN);
  const int kv_base = req.kv_base;

  const int tid = threadIdx.x;
  const int lane = arch::lane_id();
  const int warp = arch::warp_id();
  // where v1 has a CTA-wide barrier among its warps: the math warps' named barrier with a producer warp
  auto math_sync = [] {
    if constexpr (Tr::kProducer) arch::named_barrier_sync(kMathBarrier, Tr::kThreads);
    else arch::block_sync();
  };

  unsigned char* smem = arch::smem_dynamic<unsigned char>();
  KV* sK = reinterpret_cast<KV*>(smem + Smem::kK);                // (STAGES, BN, Dqk) padded rows
  KV* sV = Tr::kSharedKV ? sK : reinterpret_cast<KV*>(smem + Smem::kV);
  float* sPart = reinterpret_cast<float*>(smem + Smem::kPart);   // (PARTS, KSPLIT, BM, BN) partial scores
  // two sets (one barrier per tile; the math-roles tile): tile t's partial scores in set t % 2 (one barrier: the
  // softmax reads t + 1's while S writes t + 2's; math roles: the softmax of t reads t's before S(t + 1) is stored)
  auto part_of = [&](int tile) { return Smem::kParts == 2 ? sPart + (tile & 1) * Smem::kPartFloats : sPart; };
  // P and alpha: kPBufs buffers (2 with one barrier per tile, else 1: traits.h), tile t's in pbuf(t)
  auto pbuf = [](int tile) { return Smem::kPBufs == 2 ? (tile & 1) : 0; };
  PE* sP = reinterpret_cast<PE*>(smem + Smem::kP);                // (kPBufs, BM, kPPitch) probabilities
  // element offset of P's (row, column) in a buffer: 16-byte chunks swizzled by the row on 128-byte rows
  // (64-byte f16 rows of the 656-byte rows' math-roles tile: k position col XORed with 20 on rows with bit 1 set, so
  // the softmax's 4-byte stores (k positions {0, 1, 4, 5, 8, 9, 12, 13} (mod 16) of 4 rows, or the other 8) and the
  // PV warps' 8-byte loads (k positions 0-15 or 16-31 of 4 rows) each fall on 32 distinct banks)
  auto p_at = [](int row, int col) {
    if constexpr (Tr::k656Roles) return row * Smem::kPPitch + (col ^ (((row >> 1) & 1) * 20));
    if constexpr (Smem::kPSwizzle) {
      constexpr int kChunk = 16 / int(sizeof(PE));
      return row * Smem::kPPitch + (((col / kChunk) ^ (row & 7)) * kChunk) + col % kChunk;
    }
    return row * Smem::kPPitch + col;
  };
  float* sAlpha = reinterpret_cast<float*>(smem + Smem::kStats);  // (kPBufs, BM) rescale factor per tile
  float* sFin = sAlpha + Smem::kPBufs * BM;                       // (2, BM) 1/l and log2-sum-exp2 at the end
  float* sQScale = sFin + 2 * BM;                                 // (BM) e4m3 path: each Q row's scale
  float* sScl = reinterpret_cast<float*>(smem + Smem::kScl);      // (4, BN) 656-byte rows: the tile's block scales

  const T* q = static_cast<const T*>(p.q);
  const KV* kc = static_cast<const KV*>(p.k_cache);
  const KV* vc = static_cast<const KV*>(p.v_cache);
  constexpr int CH = Tr::kKvPerChunk;  // K / V elements per 16-byte copy

  // ---- loader: loader thread -> (row of every tile, first 16-byte chunk of that row)
  // (bulk loader: kBulkLanes lanes of every warp, row lane x kWarps + warp)
  // (producer warp: no math thread loads)
  const bool loader = Tr::kProducer ? false
                      : Tr::kBulk   ? lane < Tr::kBulkLanes
                                    : Tr::kLoadThreads == Tr::kThreads || tid < Tr::kLoadThreads;  // compile-time true when all load
  const int ld_row = !loader ? 0 : Tr::kBulk ? lane * Tr::kWarps + warp : tid / Tr::kThreadsPerRow;
  const int ld_chunk = tid % Tr::kThreadsPerRow;
  int32_t* sIdx = reinterpret_cast<int32_t*>(smem + Smem::kIdx);  // (kIdxSlots, kRingThreads) kv_indices ring
  // (BM, kMaskStage) the first tree-mask words of each row's node, staged with Q
  uint32_t* sMask = reinterpret_cast<uint32_t*>(smem + Smem::template mask_offset<Tr::kRingThreads>());
  constexpr int kMaskStage = Smem::kMaskStage;
  // Tiles 0..STAGES-2 (the prologue's) read their index directly; later tiles' indices are copied into
  // the ring by cp.async, kRingAhead - STAGES + 1 iterations before their KV copy, so no register waits
  // on the load.
  TokenCursor<L> direct_at(range.begin + ld_row, BN, p.page_size);
  TokenCursor<L> ring_at(range.begin + (STAGES - 1) * BN + ld_row, BN, p.page_size);
  TokenCursor<L> copy_at = direct_at;
  // running state of the loader: no division or signed modulo per tile
  unsigned ring_tile = STAGES - 1;                        // next tile whose index goes into the ring
  int ring_tok = range.begin + (STAGES - 1) * BN + ld_row;  // ... and this thread's token of it
  auto fetch_direct = [&](int tile) -> int32_t {
    const int t = range.begin + tile * BN + ld_row;
    const int32_t id =
        loader && t < range.end ? ld_index(p.kv_indices, static_cast<int64_t>(kv_base) + direct_at.pos, p.kv_indices_i64)
                                : 0;
    direct_at.advance();
    return id;
  };
  const int32_t* idx_base = index_at(p.kv_indices, kv_base, p.kv_indices_i64);
  auto fetch_ring = [&]() {
    if (loader)
      arch::cp_async_4_zfill(sIdx + (ring_tile % Smem::kIdxSlots) * Tr::kRingThreads + tid,
                             index_at(idx_base, ring_at.pos, p.kv_indices_i64), ring_tok < range.end);
    ring_at.advance();
    ++ring_tile;
    ring_tok += BN;
  };
  // (only loaders have a slot: the others read thread 0's, without a branch, and never use it)
  const int ring_tid = Tr::kRingThreads == Tr::kThreads || tid < Tr::kRingThreads ? tid : 0;
  auto ring_id = [&](int tile) -> int32_t { return sIdx[(unsigned(tile) % Smem::kIdxSlots) * Tr::kRingThreads + ring_tid]; };
  unsigned issued = 0;
  int issue_tok = range.begin + ld_row;  // this thread's token of tile `issued`
  // this thread's first K / V chunk, minus the row, and the 32-bit strides of the row offsets (V: only
  // where it is not the K row)
  const KV* k_row0 = kc + ld_chunk * CH + kvh * p.k_stride_head;
  const KV* v_row0 = vc + ld_chunk * CH + kvh * p.v_stride_head;
  const int32_t k_sb = static_cast<int32_t>(p.k_stride_block), k_st = static_cast<int32_t>(p.k_stride_tok);
  const int32_t v_sb = static_cast<int32_t>(p.v_stride_block), v_st = static_cast<int32_t>(p.v_stride_tok);
  // bulk loader and producer warp: the stages' (FULL) mbarriers; tile t completes phase t / STAGES of barrier
  // t % STAGES. Producer warp: EMPTY mbarriers after them; the math warps' release of tile t completes phase
  // t / STAGES of EMPTY t % STAGES, which the producer awaits before it copies tile t + STAGES.
  uint64_t* sBar = reinterpret_cast<uint64_t*>(smem + Tr::kBarOffset);
  [[maybe_unused]] uint64_t* sEmpty = sBar + STAGES;
  auto wait_tile = [&](int tile) {
    if constexpr (Tr::kBulk || Tr::kProducer)
      arch::mbarrier_wait(sBar + tile % STAGES, static_cast<uint32_t>(tile / STAGES) & 1u);
  };
  // producer warp: this math warp has read tile `tile`'s stage (its ldmatrix results are in registers): the
  // warp's lanes meet, then one of them arrives on the stage's EMPTY barrier
  auto release = [&](int tile) {
    if constexpr (Tr::kProducer) {
      arch::mbarrier_arrive_warp(sEmpty + tile % STAGES);
    }
  };
  auto zero_row = [](KV* dst, uint32_t bytes) {  // st.shared zeros over one smem row
    for (uint32_t o = 0; o < bytes; o += 16)
      *reinterpret_cast<uint4*>(reinterpret_cast<unsigned char*>(dst) + o) = make_uint4(0, 0, 0, 0);
  };
  auto issue_kv = [&](int32_t id) {
    if constexpr (Tr::kBulk) {
      if (loader) {
        const int stage = issued % STAGES;
        uint64_t* bar = sBar + stage;
        KV* dK = sK + stage * Smem::kStageElems + ld_row * Smem::kKPitch;
        KV* dV = sV + stage * Smem::kStageElems + ld_row * Smem::kVPitch;
        if (issue_tok < range.end) {
          arch::mbarrier_arrive_expect_tx(bar, Tr::kKRowBytes + Tr::kVRowBytes);
          arch::bulk_copy_g2s(dK, k_row0 + copy_at.row_offset(id, k_sb, k_st), Tr::kKRowBytes, bar);
          if constexpr (!Tr::kSharedKV)
            arch::bulk_copy_g2s(dV, v_row0 + copy_at.row_offset(id, v_sb, v_st), Tr::kVRowBytes, bar);
        } else {  // sass-model: rare (past the end: zeros, as cp.async's zero-fill; P is 0 there, 0 x NaN would not be)
          zero_row(dK, Tr::kKRowBytes);
          if constexpr (!Tr::kSharedKV) zero_row(dV, Tr::kVRowBytes);
          arch::mbarrier_arrive(bar);
        }
      }
    } else if (loader) {
      const int stage = issued % STAGES;
      const bool valid = issue_tok < range.end;  // past the end: zeros land, no read
      // one row offset per tile; the chunks sit at constant offsets from it. A row past the end has
      // id 0 (its index was zero-filled): an in-bounds address the zero-filling copy never reads.
      const KV* ks = k_row0 + copy_at.row_offset(id, k_sb, k_st);
      KV* dK = sK + stage * Smem::kStageElems + ld_row * Smem::kKPitch + ld_chunk * CH;
#pragma unroll
      for (int j = 0; j < Tr::kChunksK; ++j)
        if (!Tr::kChunksTail || j + 1 < Tr::kChunksK || (j * Tr::kThreadsPerRow + ld_chunk) < Tr::kRowChunks)
          arch::cp_async_16_zfill(dK + j * Tr::kThreadsPerRow * CH, ks + j * Tr::kThreadsPerRow * CH, valid);
      if constexpr (!Tr::kSharedKV) {
        const KV* vs = v_row0 + copy_at.row_offset(id, v_sb, v_st);  // as K's: id 0 past the end
        KV* dV = sV + stage * Smem::kStageElems + ld_row * Smem::kVPitch + ld_chunk * CH;
#pragma unroll
        for (int j = 0; j < Tr::kChunksV; ++j)
          arch::cp_async_16_zfill(dV + j * Tr::kThreadsPerRow * CH, vs + j * Tr::kThreadsPerRow * CH, valid);
      }
    }
    copy_at.advance();
    ++issued;
    issue_tok += BN;
  };

  // ---- producer warp (v3): every KV copy of the CTA -------------------------------
  // Lane r < BN copies row r of each tile (lanes BN .. 31 only wait). Tiles 0 .. kQFirst - 1 go out at once;
  // the stages from kQFirst on hold the staged Q until the math warps arrive on kQFreeBarrier.
  // The rows' kv_indices entries come through a ring in shared memory, kPIdxSlots tiles ahead (a 4-byte cp.async
  // per lane, one commit group a tile): loaded one tile ahead, every tile's copies waited a DRAM round trip for
  // their index (the model's reading of the first v3: the producer's chain bound the tile, NOTES.md).
  constexpr int kQFirst = STAGES - Tr::kQStages;
  constexpr int kLead = Tr::kProducer ? Tr::kPIdxSlots : 1;   // (the lambda is compiled for every tile)
  int32_t* sPIdx = reinterpret_cast<int32_t*>(smem + Tr::kPIdxOffset);  // (kLead, 32): tile t in slot t % kLead
  auto produce = [&]() {
    // this warp's rows: kRowsPerProducer of each tile (a producer warpgroup's four warps share a tile's rows)
    const int row = (warp - Tr::kWarps) * Tr::kRowsPerProducer + lane;
    const bool active = lane < Tr::kRowsPerProducer && row < BN;
    const KV* k_src = kc + kvh * p.k_stride_head;
    TokenCursor<L> at(range.begin + row, BN, p.page_size);        // tile t's row in its page (the copy's offset)
    TokenCursor<L> ahead(range.begin + row, BN, p.page_size);     // the tile whose index is fetched next
    int tok = range.begin + row;    // this lane's token of tile t
    int tok_ahead = tok;            // ... of the tile `ahead` points at
    int fetched = 0;
    // the index of tile `fetched` into its ring slot (zero past the end or for the idle lanes: never copied)
    auto fetch = [&]() {
      if (active)  // (slot `row`: an idle lane's zero fill would land in another warp's row)
        arch::cp_async_4_zfill(sPIdx + (fetched % kLead) * 32 + row, index_at(idx_base, ahead.pos, p.kv_indices_i64),
                               tok_ahead < range.end);
      arch::cp_async_commit();
      ahead.advance();
      tok_ahead += BN;
      ++fetched;
    };
    // knockouts (timing experiments, request.cuh): kKoNoIndex, row ids are the token positions (page size 1) and
    // the ring is never filled; kKoNoLoad, each stage is filled once (tiles 0 .. STAGES - 1), later tiles only
    // arrive on FULL (the stages keep stale rows), the EMPTY waits stay
    constexpr bool kKoIdx = kKnockout & kKoNoIndex, kKoLoad = kKnockout & kKoNoLoad;
    if constexpr (!kKoIdx) {
#pragma unroll
      for (int d = 0; d < kLead; ++d) fetch();
    }
    bool q_free = false;
    for (int t = 0; t < ntiles; ++t) {
      const int stage = t % STAGES;
      int32_t id = tok;                     // (kKoNoIndex: page size 1, the row of token t is t)
      if constexpr (!kKoIdx) {
        arch::cp_async_wait<kLead - 1>();   // this lane's index of tile t landed (kLead - 1 later ones in flight)
        id = active ? sPIdx[(t % kLead) * 32 + row] : 0;
        fetch();                            // tile t + kLead's, into the slot just read (an empty group past the end)
      }
      if (t == kQFirst) {  // sass-model: rare (one tile's)
        arch::named_barrier_sync(kQFreeBarrier, Tr::kQFreeThreads);
        q_free = true;
      }
      // the math warps released tile t - STAGES (phase t / STAGES - 1 of the stage's EMPTY barrier)
      if (t >= STAGES) arch::mbarrier_wait(sEmpty + stage, static_cast<uint32_t>(t / STAGES + 1) & 1u);
      if (active) {
        uint64_t* full = sBar + stage;
        KV* dK = sK + stage * Smem::kStageElems + row * Smem::kKPitch;
        if (tok < range.end && (!kKoLoad || t < STAGES)) {
          arch::mbarrier_arrive_expect_tx(full, Tr::kKRowBytes);
          arch::bulk_copy_g2s(dK, k_src + at.row_offset(id, k_sb, k_st), Tr::kKRowBytes, full);
        } else if (kKoLoad && tok < range.end) {  // (knockout only: no copy, the stage's stale row)
          arch::mbarrier_arrive(full);
        } else {  // sass-model: rare (past the end: zeros, P is 0 there and 0 x NaN would not be)
          zero_row(dK, Tr::kKRowBytes);
          arch::mbarrier_arrive(full);
        }
      }
      at.advance();
      tok += BN;
    }
    arch::cp_async_wait<0>();   // no copy left in flight into the ring at exit
    // a split of kQFirst tiles or fewer never copies into the Q stages: the generation still needs this warp
    if (!q_free) arch::named_barrier_sync(kQFreeBarrier, Tr::kQFreeThreads);
  };

  // ---- prologue: the Q tile is staged in the last kQStages pipeline stages,
  // loaded to registers, then those stages get their KV tiles -------------------
  // (the inits fenced for the bulk copies' complete_tx, which the async proxy performs: fence.mbarrier_init, as
  // CUTLASS's fence_barrier_init, before the barrier that lets any thread copy)
  if constexpr (Tr::kBulk) {
    if (tid == 0) {
      for (int s = 0; s < STAGES; ++s) arch::mbarrier_init(sBar + s, BN);
      arch::fence_mbarrier_init_cluster();
    }
    arch::block_sync();  // initialised before any thread arrives or copies
  }
  if constexpr (Tr::kProducer) {
    if (tid == 0) {
      for (int s = 0; s < STAGES; ++s) {
        arch::mbarrier_init(sBar + s, BN);            // FULL: the producer's BN lanes (and the row bytes)
        arch::mbarrier_init(sEmpty + s, Tr::kWarps);  // EMPTY: one lane per math warp
      }
      arch::fence_mbarrier_init_cluster();
    }
    arch::block_sync();  // initialised before any thread arrives or copies: the CTA's only block-wide barrier
    if constexpr (Tr::kProducerWG) {
      // the producer warpgroup gives registers back, all four produce; the math
      // warpgroups take them (the inc waits until the CTA's pool has them)
      if (warp >= Tr::kWarps) {
        arch::setmaxnreg_dec<Tr::kProducerRegs>();
        produce();  // each of the four warps its share of every tile's rows
        return;
      }
      arch::setmaxnreg_inc<Tr::kMathRegs>();
    } else if (warp == Tr::kWarps) {
      produce();
      return;
    }
  }
  T* sQ = reinterpret_cast<T*>(sK + (STAGES - Tr::kQStages) * Smem::kStageElems);  // (BM, Dqk) padded rows
  for (int i = tid; i < BM * Tr::kQChunks; i += Tr::kThreads) {
    const int r = i / Tr::kQChunks, c = i % Tr::kQChunks;
    const int grow = row0 + r;
    bool valid;  // (rows past T_b * group: zeros, never written out)
    const T* src = q_chunk_src(p, q, grow, nrows, group, qo_begin, kvh, c, valid);
    arch::cp_async_16_zfill(sQ + r * Smem::kQPitch + c * 8, src, valid);
  }
  stage_mask_words<BM, Tr::kThreads, kMaskStage>(p, req, row0, nrows, sMask);
  arch::cp_async_commit();
  // The ring indices of tiles STAGES-1 .. kRingAhead-1 (those the loop's first iterations would copy
  // too late) go with the first KV group; the index of tile j is read in iteration j - STAGES + 1.
  auto ring_prologue = [&]() {
#pragma unroll
    for (int j = STAGES - 1; j < kRingAhead; ++j) fetch_ring();
  };
  // prologue tiles that do not overlap the Q staging (stages STAGES - kQStages .. STAGES - 1)
  constexpr int kFirst = kQFirst;
  if constexpr (!Tr::kProducer) {
#pragma unroll
    for (int s = 0; s < kFirst; ++s) {
      const int32_t id = fetch_direct(s);
      if (s < ntiles) issue_kv(id);
      if (s == 0) ring_prologue();
      arch::cp_async_commit();
    }
  }

  // the warp's Dv columns in P V: every warp's, or with math roles the PV warps' (warps kSWarps ..)
  const int owarp = Tr::kRoles ? warp - Tr::kSWarps : warp;
  const int ws_k = warp % Tr::KSPLIT;
  const int ws_n = (warp / Tr::KSPLIT) % Tr::SN;
  const int ws_m = warp / (Tr::KSPLIT * Tr::SN);
  const h::RowCol a_addr = h::ldsm_a_addr(lane);
  const h::RowCol b_addr = h::ldsm_b_addr(lane);
  const h::RowCol bt_addr = h::ldsm_bt_addr(lane);
  uint32_t qf[Tr::kSMT][Tr::kQFrags][4];  // this warp's Q fragments: its m tiles x its dims
  // 656-byte rows: S warp ws_k takes the 128-column blocks 2 ws_k, 2 ws_k + 1 (steps 0-7 of qf) and
  // the RoPE dims 512 + 32 ws_k .. + 31 (qr: two k16 steps in q's type on K's bf16 RoPE values, Q unscaled:
  // the RoPE scores are multiplied by the rows' 1 / Q scale, qinv, when they join the blocks' sums)
  [[maybe_unused]] uint32_t qr[Tr::kMla656 ? Tr::kSMT : 1][2][4];
  // kLean (v3 with one producer warp: 9 warps leave 168 registers a thread): values v1 holds across the loop are
  // re-derived where they are used, with the same arithmetic (the same bits): qinv from sQScale, the blocks' P factors
  // from sScl and blk_ref. (The producer warpgroup's math warps have 232: they hold them as v1 does.)
  constexpr bool kLean = Tr::kProducer && !Tr::kProducerWG;
  [[maybe_unused]] float qinv[Tr::kMla656 && !kLean ? Tr::kSMT : 1][2];
  // first head dim of this warp's S step kk
  auto s_dim0 = [&](int kk) { return Tr::kMla656 ? 2 * Tr::k656Block * ws_k + 32 * kk : ws_k * Tr::kSDims + kk * 32; };
  arch::cp_async_wait<Tr::kProducer ? 0 : kFirst>();  // Q landed (this thread's copies; v3: its only group)
  math_sync();                                         // ... and everyone's
  if constexpr (Tr::kFp8) {
    // each Q row scaled, the scale multiplying the row's scores later: e4m3 Q by amax / 448; f16 Q
    // (Tr::kFp8Deq) by a power of two that keeps it below f16's range (1 for any usual row)
    for (int r = warp; r < BM; r += Tr::kWarps) {
      float amax = 0.f;
      for (int c = lane; c < Tr::DQK / 2; c += 32) {
        float x, y;
        arch::unpack2<T>(*reinterpret_cast<const uint32_t*>(sQ + r * Smem::kQPitch + 2 * c), x, y);
        amax = arch::max_nan(amax, arch::max_nan(fabsf(x), fabsf(y)));  // a NaN in the row: NaN scale
      }
#pragma unroll
      for (int x = 16; x > 0; x >>= 1) amax = arch::max_nan(amax, arch::shfl_xor(amax, x));
      if (lane == 0) {
        if constexpr (Tr::kFp8Deq) sQScale[r] = h::f16_row_scale(amax);
        else sQScale[r] = h::e4m3_row_scale(amax);  // NaN amax: NaN scale
      }
    }
    math_sync();  // the row scales (v3: the math warps' named barrier; the producer warp has its own loop)
#pragma unroll
    for (int i = 0; i < Tr::kSMT; ++i) {
      if (Tr::kRoles && warp >= Tr::kSWarps) break;  // (math roles: the PV warps hold no Q)
      const int r0 = (ws_m * Tr::kSMT + i) * 16 + (lane >> 2);
      const float inv[2] = {1.f / sQScale[r0], 1.f / sQScale[r0 + 8]};
#pragma unroll
      for (int kk = 0; kk < Tr::kSKSteps; ++kk) {
        if constexpr (Tr::kMla656) {
          if (kk == Tr::kSKSteps - 1) {  // the RoPE dims, in q's type (exact), in their natural k order
#pragma unroll
            for (int hf = 0; hf < 2; ++hf)
#pragma unroll
              for (int rh = 0; rh < 2; ++rh) {
                const T* src = sQ + (r0 + 8 * rh) * Smem::kQPitch + 512 + 32 * ws_k + 16 * hf + 2 * (lane & 3);
                float x0, x1, x2, x3;
                arch::unpack2<T>(*reinterpret_cast<const uint32_t*>(src), x0, x1);
                arch::unpack2<T>(*reinterpret_cast<const uint32_t*>(src + 8), x2, x3);
                qr[i][hf][rh] = arch::pack2<T>(x0, x1);
                qr[i][hf][rh + 2] = arch::pack2<T>(x2, x3);
              }
            if constexpr (!kLean) qinv[i][0] = inv[0], qinv[i][1] = inv[1];
            continue;
          }
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) {  // row r0 + 8 (r & 1), dims 4 (lane % 4) + 16 (r >> 1) .. + 3 of the step
          const T* src = sQ + (r0 + 8 * (r & 1)) * Smem::kQPitch + s_dim0(kk) + 4 * (lane & 3) + 16 * (r >> 1);
          const uint2 w = *reinterpret_cast<const uint2*>(src);
          float x0, x1, x2, x3;
          arch::unpack2<T>(w.x, x0, x1);
          arch::unpack2<T>(w.y, x2, x3);
          const float s = inv[r & 1];
          if constexpr (Tr::kFp8Deq) {
            // k16 step 2 kk + (r >> 1) with its k order permuted like K's (csrc/host/fp8.h): dims
            // (4c, 4c+1) are k (2c, 2c+1) -> a[rh], dims (4c+2, 4c+3) are k (2c+8, 2c+9) -> a[rh + 2]
            uint32_t* a = qf[i][2 * kk + (r >> 1)];
            a[r & 1] = arch::pack2<__half>(x0 * s, x1 * s);
            a[(r & 1) + 2] = arch::pack2<__half>(x2 * s, x3 * s);
          } else {  // a[r]: e4m3 bytes of dims 4c .. 4c + 3 (+16 for r >= 2)
            qf[i][kk][r] = arch::cvt_e4m3x4(x0 * s, x1 * s, x2 * s, x3 * s);
          }
        }
      }
    }
  } else if (!Tr::kRoles || warp < Tr::kSWarps) {  // (math roles: the PV warps hold no Q)
#pragma unroll
    for (int i = 0; i < Tr::kSMT; ++i)
#pragma unroll
      for (int kk = 0; kk < Tr::kSKSteps; ++kk)
        arch::ldmatrix_x4(qf[i][kk], sQ + ((ws_m * Tr::kSMT + i) * 16 + a_addr.row) * Smem::kQPitch +
                                         ws_k * Tr::kSDims + kk * 16 + a_addr.col);
  }
  // Bulk copies (the async proxy) refill the staging stages, over Q's cp.async bytes and the ldmatrix reads above
  // (the generic proxy): each thread's proxy fence before the barrier that frees them (PTX orders accesses through
  // two proxies only by such a fence)
  if constexpr (Tr::kBulk || Tr::kProducer) arch::fence_proxy_async();
  // the staging stages are free again: needed only when a prologue tile refills them here; else
  // the first refill (tile STAGES - 1, in the main loop) comes after the loop's own barriers
  if constexpr (Tr::kProducer) {
    arch::named_barrier_arrive(kQFreeBarrier, Tr::kQFreeThreads);  // v3: the producer may refill them
  } else {
    if constexpr (kFirst < STAGES - 1) arch::block_sync();
#pragma unroll
    for (int s = kFirst; s < STAGES - 1; ++s) {
      const int32_t id = fetch_direct(s);
      if (s < ntiles) issue_kv(id);
      if (s == 0) ring_prologue();
      arch::cp_async_commit();
    }
  }

  // ---- S(t) = Q K^T over this warp's dims -> partial scores in shared memory ---
  using SAcc = float[Tr::kSAcc][Tr::kSMT][Tr::kSN8][4];
  // (e4m3 on sm_90, which lowers the instruction to f16 HMMAs: S as ptxas lowers it, P V in place; arch::E4m3OnSm90)
  auto mma = [](float (&acc)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], auto on_sm90) {
    if constexpr (Tr::kE4m3Mma) arch::mma_m16n8k32_e4m3<decltype(on_sm90)::value>(acc, a, b, acc);
    else arch::mma_m16n8k16<M16>(acc, a, b, acc);
  };
  using SOnSm90 = std::integral_constant<arch::E4m3OnSm90, arch::E4m3OnSm90::kPtxas>;
  using PvOnSm90 = std::integral_constant<arch::E4m3OnSm90, arch::E4m3OnSm90::kF16>;
  // one S k step of this warp's m tiles for the n tiles j (B fragment b0) and j + 1 (b1)
  auto mma_pair = [&](float (&acc)[Tr::kSMT][Tr::kSN8][4], int j, int qstep, const uint32_t (&b0)[2],
                      const uint32_t (&b1)[2]) {
#pragma unroll
    for (int i = 0; i < Tr::kSMT; ++i) {
      mma(acc[i][j], qf[i][qstep], b0, SOnSm90{});
      mma(acc[i][j + 1], qf[i][qstep], b1, SOnSm90{});
    }
  };
  // f16 path: 4 e4m3 codes of K (one token, dims 4c .. 4c + 3 of a 16-dim block) -> the B fragment of
  // one k16 step in the permuted k order: dims (4c, 4c+1) as k (2c, 2c+1), (4c+2, 4c+3) as (2c+8, 2c+9)
  auto k_frag = [](uint32_t codes, uint32_t (&b)[2]) {
    b[0] = arch::e4m3x2_to_f16x2(codes);
    b[1] = arch::e4m3x2_to_f16x2(codes >> 16);
  };
  // one S k step (Q step `step`) for n tiles j, j + 1 from an ldmatrix x4 of K (bb: tile j dims 0-15, 16-31 of
  // the step; tile j + 1 the same): e4m3 / 16-bit operands as loaded, or the codes to f16 (two k16 MMAs)
  auto s_step = [&](float (&acc)[Tr::kSMT][Tr::kSN8][4], int j, int step, const uint32_t (&bb)[4]) {
    if constexpr (Tr::kFp8Deq) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        uint32_t b0[2], b1[2];
        k_frag(bb[hf], b0);
        k_frag(bb[2 + hf], b1);
        mma_pair(acc, j, 2 * step + hf, b0, b1);
      }
    } else {
      const uint32_t b0[2] = {bb[0], bb[1]}, b1[2] = {bb[2], bb[3]};
      mma_pair(acc, j, step, b0, b1);
    }
  };
  // 656-byte rows: the warp's two 128-column blocks, each in its own accumulator set (sacc[0], sacc[1]: four
  // chains of 4 k32 steps; e4m3 MMAs, or two f16 ones per step on the codes converted), then the RoPE dims on
  // MMAs of q's type, summed at the end with each block's sum times the token's scale of the block: in sacc[0].
  [[maybe_unused]] auto s656_mma = [&](int tile, SAcc& sacc, auto&& mid) {
    const KV* sKs = sK + (tile % STAGES) * Smem::kStageElems;
    // (kLean: the lane's K address recomputed each tile from %laneid; held across the loop, ptxas spilled a word of
    // the one-producer-warp tile's 168 registers on sm_90a, where each e4m3 MMA runs as f16 HMMAs)
    const h::RowCol kb_addr = [&] {
      if constexpr (kLean) return h::ldsm_b_addr(arch::lane_id_fresh());
      else return b_addr;
    }();
    const KV* sKw = sKs + (ws_n * Tr::kSTok + kb_addr.row) * Smem::kKPitch + s_dim0(0) + 2 * kb_addr.col;
    float racc[Tr::kSMT][Tr::kSN8][4];
#pragma unroll
    for (int i = 0; i < Tr::kSMT; ++i)
#pragma unroll
      for (int j = 0; j < Tr::kSN8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) racc[i][j][e] = sacc[0][i][j][e] = sacc[1][i][j][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if (kk == 2) mid();
#pragma unroll
      for (int blk = 0; blk < 2; ++blk)
#pragma unroll
        for (int j = 0; j < Tr::kSN8; j += 2) {
          uint32_t bb[4];
          arch::ldmatrix_x4(bb, sKw + j * 8 * Smem::kKPitch + blk * Tr::k656Block + kk * 32);
          s_step(sacc[blk], j, 4 * blk + kk, bb);
        }
    }
#pragma unroll
    for (int j = 0; j < Tr::kSN8; j += 2)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {  // RoPE bytes 528 + 2 (d - 512): this warp's 16-dim half hf
        uint32_t bb[4];
        arch::ldmatrix_x4(bb, sKs + (ws_n * Tr::kSTok + kb_addr.row + j * 8) * Smem::kKPitch + 528 + 64 * ws_k +
                                  32 * hf + 2 * kb_addr.col);
        // K's bf16 values as they are for bf16 q; for fp16 q converted to f16 (exact within f16's range)
        auto kv = [](uint32_t x) { return std::is_same_v<T, __nv_bfloat16> ? x : arch::bf16x2_to_f16x2(x); };
        const uint32_t b0[2] = {kv(bb[0]), kv(bb[1])}, b1[2] = {kv(bb[2]), kv(bb[3])};
#pragma unroll
        for (int i = 0; i < Tr::kSMT; ++i) {
          arch::mma_m16n8k16<T>(racc[i][j], qr[i][hf], b0, racc[i][j]);
          arch::mma_m16n8k16<T>(racc[i][j + 1], qr[i][hf], b1, racc[i][j + 1]);
        }
      }
    // kLean: the rows' 1 / Q scale, as the prologue's inv (the same division)
    float qi[Tr::kSMT][2];
#pragma unroll
    for (int i = 0; i < Tr::kSMT; ++i) {
      if constexpr (kLean) {
        const int r0 = (ws_m * Tr::kSMT + i) * 16 + (lane >> 2);
        qi[i][0] = 1.f / sQScale[r0];
        qi[i][1] = 1.f / sQScale[r0 + 8];
      } else {
        qi[i][0] = qinv[i][0], qi[i][1] = qinv[i][1];
      }
    }
    // the lane's tokens 2c, 2c + 1 of n tile j (c = lane % 4): their scales of blocks 2 ws_k, 2 ws_k + 1
#pragma unroll
    for (int j = 0; j < Tr::kSN8; ++j) {
      const KV* sc = sKs + (ws_n * Tr::kSTok + j * 8 + 2 * (lane & 3)) * Smem::kKPitch + 512 + 8 * ws_k;
      const float2 t0 = *reinterpret_cast<const float2*>(sc);
      const float2 t1 = *reinterpret_cast<const float2*>(sc + Smem::kKPitch);
      // ... and for the softmax, block-major (the 8 lanes of a column pair hold the same: lanes 0-3 store; the
      // math-roles tile's softmax needs none: its PV warps read their block's scales from the stage)
      if (!Tr::k656Roles && lane < 4) {
        float* st = sScl + 2 * ws_k * BN + ws_n * Tr::kSTok + j * 8 + 2 * lane;
        *reinterpret_cast<float2*>(st) = make_float2(t0.x, t1.x);
        *reinterpret_cast<float2*>(st + BN) = make_float2(t0.y, t1.y);
      }
#pragma unroll
      for (int i = 0; i < Tr::kSMT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 t = (e & 1) ? t1 : t0;
          sacc[0][i][j][e] = fmaf(sacc[1][i][j][e], t.y, fmaf(sacc[0][i][j][e], t.x, racc[i][j][e] * qi[i][e >> 1]));
        }
    }
  };
  // `mid()` runs after half of the k steps: work the warp issues while its first MMAs are in the pipe
  auto s_mma = [&](int tile, SAcc& sacc, auto&& mid) {
    if constexpr (Tr::kMla656) {
      s656_mma(tile, sacc, mid);
      return;
    }
    // ldmatrix columns are 16-bit; with e4m3 rows each 16-byte column block holds 16 codes
    constexpr int kColScale = 2 / int(sizeof(KV));
    const KV* sKs = sK + (tile % STAGES) * Smem::kStageElems;
    const KV* sKw = sKs + (ws_n * Tr::kSTok + b_addr.row) * Smem::kKPitch + ws_k * Tr::kSDims + b_addr.col * kColScale;
#pragma unroll
    for (int a = 0; a < Tr::kSAcc; ++a)
#pragma unroll
      for (int i = 0; i < Tr::kSMT; ++i)
#pragma unroll
        for (int j = 0; j < Tr::kSN8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) sacc[a][i][j][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < Tr::kSKSteps; ++kk) {
      const int a = kk % Tr::kSAcc;
      if (kk == Tr::kSKSteps / 2) mid();
#pragma unroll
      for (int j = 0; j + 1 < Tr::kSN8; j += 2) {
        uint32_t bb[4];
        arch::ldmatrix_x4(bb, sKw + j * 8 * Smem::kKPitch + kk * Tr::kKStep);
        s_step(sacc[a], j, kk, bb);
      }
      if constexpr (Tr::kSN8 % 2 == 1) {
        // odd n8 count: x2 for the last tile (lanes 16-31, unused by .x2, repeat lanes 0-15's rows)
        constexpr int j = Tr::kSN8 - 1;
        uint32_t b0[2];
        arch::ldmatrix_x2(b0, sKs + (ws_n * Tr::kSTok + j * 8 + (lane & 7)) * Smem::kKPitch + ws_k * Tr::kSDims +
                                  8 * kColScale * ((lane >> 3) & 1) + kk * Tr::kKStep);
        if constexpr (Tr::kFp8Deq) {
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            uint32_t b[2];
            k_frag(b0[hf], b);
#pragma unroll
            for (int i = 0; i < Tr::kSMT; ++i) mma(sacc[a][i][j], qf[i][2 * kk + hf], b, SOnSm90{});
          }
        } else {
#pragma unroll
          for (int i = 0; i < Tr::kSMT; ++i) mma(sacc[a][i][j], qf[i][kk], b0, SOnSm90{});
        }
      }
    }
  };
  auto s_store = [&](const SAcc& sacc, int tile) {
    float* part = part_of(tile) + ws_k * BM * Smem::kSPitch;
#pragma unroll
    for (int i = 0; i < Tr::kSMT; ++i)
#pragma unroll
      for (int j = 0; j < Tr::kSN8; ++j)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          float x = sacc[0][i][j][2 * hf], y = sacc[0][i][j][2 * hf + 1];
          if constexpr (Tr::kSAcc == 2 && !Tr::kMla656) {  // (656: summed with the block scales)
            x += sacc[1][i][j][2 * hf];
            y += sacc[1][i][j][2 * hf + 1];
          }
          const h::RowCol rc = h::mma_c_rc(lane, 2 * hf);
          *reinterpret_cast<float2*>(part + ((ws_m * Tr::kSMT + i) * 16 + rc.row) * Smem::kSPitch +
                                     ws_n * Tr::kSTok + j * 8 + rc.col) = make_float2(x, y);
        }
  };

  // ---- softmax on whole rows: this lane's row, TPL tokens of it ------------------
  // lazy rescaling: a row's reference max moves only when a tile beats it by more than 2^8 (P <= 256).
  // e4m3 P: the max is exact (P <= 1) and P is stored times 2^8, so the codes keep 3 bits of
  // precision down to P = 2^-14 and reach zero only below 2^-18.
  constexpr float kMaxSlack = Tr::kE4m3Mma ? 0.f : 8.f;
  constexpr float kPScale = 256.f;
  const int srow = Tr::soft_row(warp, lane);
  // scores in log2 units: sm_scale, and with e4m3 operands the Q row's and the K cache's scales
  const float scale_log2 = Tr::kFp8 ? p.sm_scale * h::kLog2e * sQScale[srow] * kv_scale(p.k_scale_ptr, p.k_scale)
                                    : p.sm_scale * h::kLog2e;
  const int scol = Tr::soft_col(lane);
  const int sgrow = row0 + srow;
  const int smask_row = sgrow < nrows ? qo_begin + sgrow / group : -1;  // node's q row; -1: padding row
  float m_run = h::neg_inf(), l_run = 0.f;                              // replicated over the row's lanes
  // 656-byte rows: P of block g is stored as P x kPBlk x (the token's scale of block g) / blk_ref[g], blk_ref[g]
  // the largest |scale| of block g in the tiles so far (the same in every thread: each row's lanes see all of a
  // tile's tokens), so P stays in the range it has without scales (e4m3 codes <= 2^8 x 1, f16 <= 2^8). A
  // reference moves only when a tile's scales pass it; PV then rescales the warp's O by pv_ratio (old / new
  // reference of its block, pv_blk), and the epilogue multiplies by blk_ref[pv_blk] (the block's last reference).
  constexpr float kPBlk = Tr::kE4m3Mma ? kPScale : 1.f;
  [[maybe_unused]] float blk_ref[4] = {0.f, 0.f, 0.f, 0.f}, blk_inv[4] = {0.f, 0.f, 0.f, 0.f};  // (kLean: not held)
  [[maybe_unused]] float pv_ratio = 1.f;
  [[maybe_unused]] const int pv_blk = owarp * Tr::kODV / Tr::k656Block;
  // the lane's tokens' P factor per block: scale x kPBlk / the block's reference (kLean: per block where P is stored,
  // from sScl and pinv, kPBlk / blk_ref[g] or 0 while the reference is 0)
  [[maybe_unused]] float pw[kLean ? 1 : 4][TPL];
  [[maybe_unused]] float pinv[4];
  // the softmax's block-scale work of a tile (sScl, written by its S warps): each block's largest |scale| in the
  // tile (a row's lanes cover the tile's tokens), the references that move (and pv_ratio for PV(tile):
  // rescale_o(tile - 1) ran before, rescale_o(tile) runs before the next), and pw (kLean: pinv)
  [[maybe_unused]] auto blk_prep = [&]() {
    static_assert(!Tr::kMla656 || TPL == 4, "a softmax lane's tokens of one block: one 16-byte load");
    float ts[4][TPL];
    float tmx[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      lds_vec<TPL>(sScl + g * BN + scol, ts[g]);  // written by the S warps of this tile (s656_mma)
#pragma unroll
      for (int e = 0; e < TPL; ++e) tmx[g] = arch::max_f(tmx[g], fabsf(ts[g][e]));
    }
    bool up = false;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
#pragma unroll
      for (int x = 1; x < Tr::kLanesPerRow; x <<= 1) tmx[g] = arch::max_f(tmx[g], arch::shfl_xor(tmx[g], x));
      up |= tmx[g] > blk_ref[g];
    }
    pv_ratio = 1.f;
    if (up) {  // sass-model: cold (a block's scales pass its reference: the first tiles)
#pragma unroll
      for (int g = 0; g < 4; ++g) {
        if (tmx[g] > blk_ref[g]) {  // (> 0: a block whose scales are all 0 keeps 0 codes and reference 0)
          if (g == pv_blk) {
            pv_ratio = blk_ref[g] / tmx[g];
          }
          blk_ref[g] = tmx[g];
          if constexpr (!kLean) blk_inv[g] = kPBlk / tmx[g];
        }
      }
    }
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      if constexpr (kLean) {
        pinv[g] = blk_ref[g] > 0.f ? kPBlk / blk_ref[g] : 0.f;
      } else {
#pragma unroll
        for (int e = 0; e < TPL; ++e) pw[g][e] = ts[g][e] * blk_inv[g];
      }
    }
  };
  // the reference of this warp's own block (a select: pv_blk is warp-uniform, and an indexed register array would
  // go to local memory)
  // (656-byte rows on the math-roles tile: the PV warp's own reference of its block)
  [[maybe_unused]] float own_ref = 0.f;
  [[maybe_unused]] auto pv_ref = [&]() {
    if constexpr (Tr::k656Roles) return own_ref;
    return pv_blk == 0 ? blk_ref[0] : pv_blk == 1 ? blk_ref[1] : pv_blk == 2 ? blk_ref[2] : blk_ref[3];
  };
  auto softmax = [&](int tile, auto masked_tag) {
    constexpr bool kMasked = decltype(masked_tag)::value;
    const int tok0 = range.begin + tile * BN;
    float s[TPL];
    const float* part = part_of(tile);
    lds_vec<TPL>(part + srow * Smem::kSPitch + scol, s);
#pragma unroll
    for (int k = 1; k < Tr::KSPLIT; ++k) {
      float v[TPL];
      lds_vec<TPL>(part + (k * BM + srow) * Smem::kSPitch + scol, v);
#pragma unroll
      for (int e = 0; e < TPL; ++e) s[e] += v[e];
    }
    float tmax = h::neg_inf();
#pragma unroll
    for (int e = 0; e < TPL; ++e) {
      s[e] *= scale_log2;
      if constexpr (kMasked) {
        const int t = tok0 + scol + e;
        uint32_t word = 0;
        if (smask_row >= 0 && h::needs_mask_word(t, prefix, range.end)) {
          const int wi = h::mask_word_index(t - prefix);
          if (wi < kMaskStage) {
            word = sMask[srow * kMaskStage + wi];
          } else {  // sass-model: rare
            word = static_cast<uint32_t>(arch::ld_global(p.tree_mask + static_cast<int64_t>(smask_row) * p.mask_words + wi));
          }
        }
        // padding rows see every real token (keeps them finite; they are never written)
        const bool vis = smask_row >= 0 ? h::token_visible(t, prefix, range.end, word) : t < range.end;
        if (!vis) s[e] = h::neg_inf();
      }
      tmax = arch::max_f(tmax, s[e]);
    }
#pragma unroll
    for (int x = 1; x < Tr::kLanesPerRow; x <<= 1) tmax = arch::max_f(tmax, arch::shfl_xor(tmax, x));
    const float alpha = h::lazy_softmax_update(m_run, tmax, kMaxSlack, Exp2Fast{});
    const float mref = h::softmax_ref_max(m_run);
    float rsum = 0.f;
#pragma unroll
    for (int e = 0; e < TPL; ++e) {
      s[e] = arch::exp2_approx(s[e] - mref);
      rsum += s[e];
    }
#pragma unroll
    for (int x = 1; x < Tr::kLanesPerRow; x <<= 1) rsum += arch::shfl_xor(rsum, x);
    l_run = l_run * alpha + rsum;
    if constexpr (Tr::k656Roles) {  // one unscaled f16 P at the e4m3 MMA's k positions (the PV warps scale it)
#pragma unroll
      for (int e = 0; e < TPL; e += 2)
        *reinterpret_cast<uint32_t*>(sP + pbuf(tile) * BM * Smem::kPPitch + p_at(srow, h::fp8_pv_k_of_token(scol + e))) =
            arch::pack2<__half>(s[e], s[e + 1]);
    } else if constexpr (Tr::kMla656) {  // P of every block, times the lane's tokens' factors (blk_prep)
      blk_prep();  // (after rescale_o(tile - 1), which reads pv_ratio of tile - 1)
      PE* pt = sP + pbuf(tile) * BM * Smem::kPPitch;
#pragma unroll
      for (int g = 0; g < 4; ++g) {
        float pg[TPL];  // block g's P factors
        if constexpr (kLean) {
          lds_vec<TPL>(sScl + g * BN + scol, pg);
#pragma unroll
          for (int e = 0; e < TPL; ++e) pg[e] *= pinv[g];
        } else {
#pragma unroll
          for (int e = 0; e < TPL; ++e) pg[e] = pw[g][e];
        }
        if constexpr (Tr::kE4m3Mma) {  // e4m3 pairs at the MMA's k positions
#pragma unroll
          for (int e = 0; e < TPL; e += 2)
            *reinterpret_cast<uint16_t*>(pt + p_at(srow, g * BN + h::fp8_pv_k_of_token(scol + e))) =
                arch::cvt_e4m3x2(s[e] * pg[e], s[e + 1] * pg[e + 1]);
        } else {  // f16, tokens in their order
          float f[TPL];
#pragma unroll
          for (int e = 0; e < TPL; ++e) f[e] = s[e] * pg[e];
          sts_pack<M16, TPL>(pt + p_at(srow, g * BN + scol), f);
        }
      }
    } else if constexpr (Tr::kE4m3Mma) {
      // e4m3 pairs at the MMA's k positions (tokens t, t + 1 are adjacent there for even t)
      PE* prow = sP + (pbuf(tile) * BM + srow) * Smem::kPPitch;
#pragma unroll
      for (int e = 0; e < TPL; e += 2)
        *reinterpret_cast<uint16_t*>(prow + h::fp8_pv_k_of_token(scol + e)) =
            arch::cvt_e4m3x2(s[e] * kPScale, s[e + 1] * kPScale);
    } else {
      sts_pack<M16, TPL>(sP + (pbuf(tile) * BM + srow) * Smem::kPPitch + scol, s);
    }
    if (scol == 0) sAlpha[pbuf(tile) * BM + srow] = alpha;
  };
  auto tile_masked = [&](int tile) { return h::tile_needs_mask(range.begin + tile * BN, BN, prefix, range.end); };

  // ---- O accumulator: every m tile x this warp's Dv columns --------------------
  float oacc[Tr::MS][Tr::kON8][4];
#pragma unroll
  for (int i = 0; i < Tr::MS; ++i)
#pragma unroll
    for (int j = 0; j < Tr::kON8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) oacc[i][j][e] = 0.f;

  // O *= alpha(tile) per row; with the lazy max, alpha is 1 for every row on almost every tile, and
  // then the warp skips the FMULs (the branch is warp-uniform).
  auto rescale_o = [&](int tile) {
    const float* al = sAlpha + pbuf(tile) * BM;
    float a[Tr::MS][2];
    bool moved = false;
#pragma unroll
    for (int i = 0; i < Tr::MS; ++i) {
      a[i][0] = al[i * 16 + (lane >> 2)];
      a[i][1] = al[i * 16 + (lane >> 2) + 8];
      moved |= a[i][0] != 1.f || a[i][1] != 1.f;
    }
    if constexpr (Tr::kMla656) moved |= pv_ratio != 1.f;  // the warp's block reference moved (softmax of tile)
    if (arch::any(moved)) {  // sass-model: cold
      if constexpr (Tr::kMla656) {
#pragma unroll
        for (int i = 0; i < Tr::MS; ++i) a[i][0] *= pv_ratio, a[i][1] *= pv_ratio;
      }
#pragma unroll
      for (int i = 0; i < Tr::MS; ++i)
#pragma unroll
        for (int j = 0; j < Tr::kON8; ++j) {
          oacc[i][j][0] *= a[i][0];
          oacc[i][j][1] *= a[i][0];
          oacc[i][j][2] *= a[i][1];
          oacc[i][j][3] *= a[i][1];
        }
    }
  };
  // PV(t) operands: P(t) A fragments and V(t) B fragments, loaded into registers before the barrier
  // that publishes the next tile's partial scores, so the MMAs can issue the moment it opens.
  uint32_t pa[Tr::kPKSteps][Tr::MS][4];
  uint32_t vb[Tr::kPKSteps][Tr::kON8 / 2][4];
  // 656-byte rows on the math-roles tile: this warp's block work (blk_prep's, for one block), before rescale_o(tile)
  // and pv_load(tile). Lane l reads token l's scale of the block from the stage (each row carries its scales), the
  // warp takes the tile's largest |scale|, and the block's reference moves when the tile passes it (pv_ratio: O's
  // rescale in rescale_o(tile)); pv_w is token `lane`'s P factor, its scale x 2^8 / the reference. The reciprocals
  // are rcp.approx (1 ulp): an IEEE division's slow-path call pinned registers, and the PV warps' loop spilled.
  [[maybe_unused]] float pv_w = 0.f;
  [[maybe_unused]] auto pv_blk_work = [&](int tile) {
    const KV* sKs = sK + (tile % STAGES) * Smem::kStageElems;
    const float sc = *reinterpret_cast<const float*>(sKs + lane * Smem::kKPitch + 512 + 4 * pv_blk);
    float tmx = fabsf(sc);
#pragma unroll
    for (int x = 1; x < 32; x <<= 1) tmx = arch::max_f(tmx, arch::shfl_xor(tmx, x));
    pv_ratio = 1.f;
    if (tmx > own_ref) {  // sass-model: cold (the block's scales pass its reference: the first tiles)
      pv_ratio = own_ref * arch::rcp_approx(tmx);
      own_ref = tmx;
    }
    // (> 0: a block whose scales are all 0 keeps factor 0)
    pv_w = own_ref > 0.f ? sc * (kPBlk * arch::rcp_approx(own_ref)) : 0.f;
  };
  // e4m3: V's B fragments come from ldmatrix .trans .b16 over 4 matrices of 8 tokens x 16 dims (lane l
  // gives the row of token l), joined by byte permutes: register pair {0, 1} for the chunk's even dims
  // (n8 accumulator 2c), {2, 3} for its odd dims (2c + 1), tokens in fp8_pv_token_of_k order.
  auto pv_load = [&](int tile) {
    const PE* sPt = sP + pbuf(tile) * BM * Smem::kPPitch;
    if constexpr (Tr::k656Roles) {
      static_assert(Tr::kPKSteps == 1, "656-byte rows: a 32-token tile is one e4m3 k step of P V");
      const float w = pv_w;
      // A register r of m tile i: row 16 i + lane / 4 + 8 (r & 1), k positions 16 (r >> 1) + 4c .. + 3 (c = lane % 4),
      // which hold tokens fp8_pv_token_of_k(k) = 16 (r >> 1) + 2c + (e & 1) + 8 (e >> 1), e = 0 .. 3
      // (P x factor in f16x2 products ran 54 fewer instructions a tile, but ptxas then spilled the S warps' loop at 112
      // registers; the model read 91.4 against 92.9 us, within its uncertainty)
      const int c = lane & 3;
      float wk[2][4];
#pragma unroll
      for (int hk = 0; hk < 2; ++hk)
#pragma unroll
        for (int e = 0; e < 4; ++e) wk[hk][e] = arch::shfl(w, 16 * hk + 2 * c + (e & 1) + 8 * (e >> 1));
#pragma unroll
      for (int i = 0; i < Tr::MS; ++i)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const uint2 v =
              *reinterpret_cast<const uint2*>(sPt + p_at(i * 16 + (lane >> 2) + 8 * (r & 1), 16 * (r >> 1) + 4 * c));
          float x0, x1, x2, x3;
          arch::unpack2<__half>(v.x, x0, x1);
          arch::unpack2<__half>(v.y, x2, x3);
          const float* f = wk[r >> 1];
          pa[0][i][r] = arch::cvt_e4m3x4(x0 * f[0], x1 * f[1], x2 * f[2], x3 * f[3]);
        }
    } else {
      // P's A fragments, every other path alike: an e4m3 P step is 32 tokens, 16 codes per 16-byte column
      constexpr int kPStep = Tr::kE4m3Mma ? 32 : 16, kPCol = Tr::kE4m3Mma ? 2 : 1;
      // (656-byte rows: the copy of P for this warp's 128-column block)
      const int pcol0 = Tr::kMla656 ? pv_blk * BN : 0;
#pragma unroll
      for (int kk = 0; kk < Tr::kPKSteps; ++kk)
#pragma unroll
        for (int i = 0; i < Tr::MS; ++i)
          arch::ldmatrix_x4(pa[kk][i], sPt + p_at(i * 16 + a_addr.row, pcol0 + kk * kPStep + kPCol * a_addr.col));
    }
    if constexpr (Tr::kFp8) {
      // one .trans load per 16-dim chunk covers the 32-token tile (lane l gives the row of token l):
      // register m holds tokens 8m + 2c, +1 of the lane's dim pair (c = lane % 4)
      const KV* sVw = sV + (tile % STAGES) * Smem::kStageElems + lane * Smem::kVPitch + owarp * Tr::kODV;
#pragma unroll
      for (int j = 0; j < Tr::kON8; j += 2) {
        uint32_t r[4];
        arch::ldmatrix_x4_trans(r, sVw + j * 8);
        if constexpr (Tr::kE4m3Mma) {  // the e4m3 B fragments themselves (fp8_pv_token_of_k's token order)
          vb[0][j / 2][0] = arch::prmt(r[0], r[1], h::kPrmtEvenBytes);
          vb[0][j / 2][1] = arch::prmt(r[2], r[3], h::kPrmtEvenBytes);
          vb[0][j / 2][2] = arch::prmt(r[0], r[1], h::kPrmtOddBytes);
          vb[0][j / 2][3] = arch::prmt(r[2], r[3], h::kPrmtOddBytes);
        } else {
          // f16 path, tokens in their natural order: the even (odd) bytes of registers (0, 1) are the
          // step-0 k pairs (2c, 2c+1) and (2c+8, 2c+9) of the even (odd) dim, registers (2, 3) step 1's
#pragma unroll
          for (int kk = 0; kk < 2; ++kk) {
            const uint32_t ev = arch::prmt(r[2 * kk], r[2 * kk + 1], h::kPrmtEvenBytes);
            const uint32_t od = arch::prmt(r[2 * kk], r[2 * kk + 1], h::kPrmtOddBytes);
            vb[kk][j / 2][0] = arch::e4m3x2_to_f16x2(ev);
            vb[kk][j / 2][1] = arch::e4m3x2_to_f16x2(ev >> 16);
            vb[kk][j / 2][2] = arch::e4m3x2_to_f16x2(od);
            vb[kk][j / 2][3] = arch::e4m3x2_to_f16x2(od >> 16);
          }
        }
      }
    } else {
      const KV* sVw = sV + (tile % STAGES) * Smem::kStageElems + bt_addr.row * Smem::kVPitch + owarp * Tr::kODV +
                      bt_addr.col;
#pragma unroll
      for (int kk = 0; kk < Tr::kPKSteps; ++kk)
#pragma unroll
        for (int j = 0; j < Tr::kON8; j += 2)
          arch::ldmatrix_x4_trans(vb[kk][j / 2], sVw + kk * 16 * Smem::kVPitch + j * 8);
    }
  };
  auto pv_mma = [&]() {
    if constexpr (Tr::k656Roles) {
      // m tile by m tile: on sm_90 each product runs as f16 MMAs (PvOnSm90), and this order converts one m tile's P
      // codes at a time; the n-chunk order below held both m tiles' f16 P beside V and O, which spilled at 112
      // registers
#pragma unroll
      for (int i = 0; i < Tr::MS; ++i)
#pragma unroll
        for (int j = 0; j < Tr::kON8; j += 2) {
          const uint32_t b0[2] = {vb[0][j / 2][0], vb[0][j / 2][1]}, b1[2] = {vb[0][j / 2][2], vb[0][j / 2][3]};
          mma(oacc[i][j], pa[0][i], b0, PvOnSm90{});
          mma(oacc[i][j + 1], pa[0][i], b1, PvOnSm90{});
        }
    } else {
#pragma unroll
      for (int kk = 0; kk < Tr::kPKSteps; ++kk)
#pragma unroll
        for (int j = 0; j < Tr::kON8; j += 2) {
          const uint32_t b0[2] = {vb[kk][j / 2][0], vb[kk][j / 2][1]}, b1[2] = {vb[kk][j / 2][2], vb[kk][j / 2][3]};
#pragma unroll
          for (int i = 0; i < Tr::MS; ++i) {
            mma(oacc[i][j], pa[kk][i], b0, PvOnSm90{});
            mma(oacc[i][j + 1], pa[kk][i], b1, PvOnSm90{});
          }
        }
    }
  };

  // the second half of a two-barrier iteration, after the barrier that publishes S(it + 1): PV(it), then the softmax
  // of it + 1 (v1's loop and v3's producer-warpgroup loop)
  auto pv_then_softmax = [&](int it, bool has_next) {
    if (has_next && tile_masked(it + 1)) {  // sass-model: cold
      pv_mma();
      softmax(it + 1, std::true_type{});
    } else if (!has_next) {  // sass-model: cold
      pv_mma();
    } else {  // sass-model: hot
      pv_mma();  // the tensor pipe works on PV(it) while the softmax of it + 1 waits on its latencies
      softmax(it + 1, std::false_type{});
    }
  };
  if constexpr (Tr::kRoles) {
    // ---- v3 with math roles (LOADER 4). The S warps (0 .. kSWarps - 1) run S(it + 1) and the softmax of it; the PV
    // warps (kSWarps ..) run P V(it). P and alpha are double-buffered (buffer it % 2) and handed over on named
    // barriers: the S warps bar.arrive on P_FULL(it % 2) once P(it) is written and the PV warps bar.sync on it; the
    // PV warps bar.arrive on P_EMPTY(it % 2) once P(it) and alpha(it) are in their registers, which the S warps
    // bar.sync on before they write P(it + 2) there. So the softmax of it + 1 runs while P V(it)'s MMAs keep the tensor
    // pipe busy. Each side releases a stage on EMPTY after its own reads of it (16 arrivals); the PV warps read V(it)
    // after P_FULL(it), which the S warps arrive on after their FULL wait of it (the stage's bytes landed before).
    // kSAhead (traits.h): the S warps issue S(it + 1) before the softmax of it and store its partial scores after it,
    // in the other of two sets (part_of), so the softmax's loads and stores run while S(it + 1)'s MMAs are in the
    // pipe. One barrier an iteration publishes the partial scores of it, and orders the softmax of it - 1's reads of
    // set (it + 1) % 2 before S(it + 1)'s stores to it: P_EMPTY(it % 2) from tile 2 on (every S thread syncs on it
    // too), the S barrier before. Else (the 656-byte rows) S(it) runs after the softmax of it - 1, into the one set,
    // after the S barrier that orders the softmax's reads of it first.
    if (warp < Tr::kSWarps) {
      auto s_sync = [] { arch::named_barrier_sync(kSBarrier, Tr::kSWarps * 32); };
      auto s_next = [&](int tile, SAcc& sacc) {
        wait_tile(tile);  // FULL: the tile's rows (every S thread waits itself)
        s_mma(tile, sacc, [] {});
        release(tile);  // K(tile) read: the S warps' part of EMPTY
      };
      if (Tr::kSAhead && ntiles > 0) {
        SAcc sacc;
        s_next(0, sacc);
        s_store(sacc, 0);
      }
      for (int it = 0; it < ntiles; ++it) {  // sass-model: tile-loop
        if constexpr (!Tr::kSAhead) {
          SAcc sacc;
          s_next(it, sacc);
          if (it > 0) s_sync();  // every S warp's softmax of it - 1 read the one set
          s_store(sacc, it);
        }
        if (it >= 2) {
          arch::named_barrier_sync(kPEmptyBarrier + (it & 1), Tr::kThreads);
        } else {  // sass-model: rare (tiles 0 and 1)
          s_sync();
        }
        const bool has_next = it + 1 < ntiles;
        [[maybe_unused]] SAcc sacc;
        if (Tr::kSAhead && has_next) s_next(it + 1, sacc);
        if (tile_masked(it)) {  // sass-model: cold
          softmax(it, std::true_type{});
        } else {  // sass-model: hot
          softmax(it, std::false_type{});
        }
        arch::named_barrier_arrive(kPFullBarrier + (it & 1), Tr::kThreads);  // P(it), alpha(it) published
        if (Tr::kSAhead && has_next) s_store(sacc, it + 1);
      }
      // the S warps' part of the epilogue, here so that their path never holds O: 1/l and lse2 of their rows
      arch::launch_dependents();
      if (scol == 0) {
        sFin[srow] = h::row_inv_l(l_run);
        sFin[BM + srow] = h::row_lse2(m_run, l_run, Log2{});
      }
      math_sync();
      return;
    } else {
      for (int it = 0; it < ntiles; ++it) {  // sass-model: pv-loop
        arch::named_barrier_sync(kPFullBarrier + (it & 1), Tr::kThreads);  // P(it), alpha(it)
        if constexpr (Tr::k656Roles) {  // O's rescale before P's fragments are built (fewer registers live at once)
          pv_blk_work(it);
          rescale_o(it);  // alpha(it) read
          pv_load(it);
        } else {
          pv_load(it);
          rescale_o(it);  // alpha(it) read
        }
        release(it);    // V(it) in registers: the PV warps' part of EMPTY
        if (it + 2 < ntiles) arch::named_barrier_arrive(kPEmptyBarrier + (it & 1), Tr::kThreads);
        pv_mma();
      }
    }
  } else if constexpr (Tr::kProducerWG) {
    // ---- v3 with a producer warpgroup: v1's two-barrier loop. Iteration it: S(it + 1) | PV(it) with the softmax of
    // it + 1. Barrier 1 publishes P(it) and alpha(it) (and orders the softmax's reads of the partial scores of it
    // before S(it + 1) writes them); barrier 2 the partial scores of it + 1 (and orders PV(it)'s reads of P before the
    // softmax of it + 1 writes it). The math warps read tiles it and it + 1; tile it's stage is released once PV has
    // its V fragments, so STAGES - 2 tiles are in flight.
    wait_tile(0);  // FULL: tile 0's rows (the producer's zero rows too: its arrive releases them)
    {
      SAcc sacc;
      s_mma(0, sacc, [] {});
      s_store(sacc, 0);
    }
    math_sync();
    if (tile_masked(0)) softmax(0, std::true_type{}); else softmax(0, std::false_type{});
    for (int it = 0; it < ntiles; ++it) {  // sass-model: tile-loop
      const bool has_next = it + 1 < ntiles;
      if (has_next) wait_tile(it + 1);  // FULL: tile it + 1's rows (every math thread waits itself)
      math_sync();
      SAcc sacc;
      if (has_next) s_mma(it + 1, sacc, [] {});  // the tensor pipe starts right after the barrier
      pv_load(it);    // P(it) was published by the barrier above
      release(it);    // V(it) is in registers: the producer may refill the stage
      rescale_o(it);  // alpha(it) too; the FMULs fill the wait for the S results
      if (has_next) s_store(sacc, it + 1);
      math_sync();    // partial scores of tile it + 1 published
      pv_then_softmax(it, has_next);
    }
  } else if constexpr (Tr::kProducer) {
    // ---- v3: one tile at a time. S(it) -> partial scores | softmax(it) -> P(it), alpha(it) | PV(it). Barrier 1
    // publishes the partial scores (and orders the last PV's reads of P before this softmax writes it), barrier 2
    // P and alpha (and the softmax's reads of the partial scores before the next S writes them). Tile it's stage
    // is released once PV has its V fragments: the producer refills it while the MMAs run.
    for (int it = 0; it < ntiles; ++it) {  // sass-model: tile-loop
      wait_tile(it);  // FULL: tile it's rows landed (every math thread waits itself)
      {
        SAcc sacc;
        s_mma(it, sacc, [] {});
        s_store(sacc, it);
      }
      math_sync();
      if (tile_masked(it)) {  // sass-model: cold
        softmax(it, std::true_type{});
      } else {  // sass-model: hot
        softmax(it, std::false_type{});
      }
      math_sync();
      pv_load(it);
      release(it);
      rescale_o(it);
      pv_mma();
    }
  } else {
    // ---- tile 0: S and softmax before the loop ------------------------------------
    arch::cp_async_wait<STAGES - 2>();  // Q and tile 0 landed
    // bulk loader: each thread waits on tile 0's phase itself, and tile 0's zero-filled rows (a prologue
    // tile) were published by the Q barrier above, so no barrier here
    wait_tile(0);
    if constexpr (!Tr::kBulk) arch::block_sync();
    {
      SAcc sacc;
      s_mma(0, sacc, [] {});
      s_store(sacc, 0);
    }
    if constexpr (kOneBar) {
      // ... and S of tile 1 with it: the loop's iteration it starts with P(it) and the partial scores
      // of it + 1 published
      arch::cp_async_wait<STAGES - 3>();  // tile 1 landed (an empty group when there is none)
      if (ntiles > 1) wait_tile(1);
      arch::block_sync();                 // S(0) published; tile 1 everyone's
      SAcc sacc;
      if (ntiles > 1) s_mma(1, sacc, [] {});
      if (tile_masked(0)) softmax(0, std::true_type{}); else softmax(0, std::false_type{});
      if (ntiles > 1) s_store(sacc, 1);
    } else {
      arch::block_sync();
      if (tile_masked(0)) softmax(0, std::true_type{}); else softmax(0, std::false_type{});
    }

    for (int it = 0; it < ntiles; ++it) {  // sass-model: tile-loop
      arch::cp_async_wait<kLoopPending>();  // the tile this iteration's S reads landed (this thread's copies)
      if constexpr (Tr::kBulk) {  // ... or its bulk copies' phase (the knockout's loop issues none past the prologue's)
        const int s_tile = it + (kOneBar ? 2 : 1);
        if (s_tile < ntiles && (!(kKnockout & kKoNoLoad) || s_tile < STAGES - 1)) wait_tile(s_tile);
      }
      // the index of tile it+STAGES-1: this thread's own ring slot, landed by the wait above, read before
      // the barrier so its latency hides there
      int32_t next_id = it + STAGES - 1 < ntiles ? ring_id(it + STAGES - 1) : 0;
      if constexpr (kKnockout & kKoNoIndex)  // page_size 1: the row of token t is t
        next_id = it + STAGES - 1 < ntiles ? range.begin + (it + STAGES - 1) * BN + ld_row : 0;
      // everyone's; P(it) and alpha(it) published (and with one barrier the partial scores of it + 1);
      // tile it-1's stage free
      arch::block_sync();
      // the copies of tile it+STAGES-1 and the ring copy of a later tile's index issue between the S MMAs
      auto loads = [&] {
        if (!(kKnockout & kKoNoLoad) && it + STAGES - 1 < ntiles) issue_kv(next_id);
        if (!(kKnockout & kKoNoIndex) && it + kRingAhead < ntiles) fetch_ring();
        arch::cp_async_commit();
      };
      SAcc sacc;
      if constexpr (kOneBar) {
        // S(it+2), PV(it) and the softmax of it+1 between the same barriers: three independent streams
        const bool has_s = it + 2 < ntiles;
        if (!has_s || tile_masked(it + 1)) {  // sass-model: cold
          if (has_s) s_mma(it + 2, sacc, loads); else loads();
          pv_load(it);
          rescale_o(it);
          pv_mma();
          if (it + 1 < ntiles) {
            if (tile_masked(it + 1)) softmax(it + 1, std::true_type{}); else softmax(it + 1, std::false_type{});
          }
          if (has_s) s_store(sacc, it + 2);
        } else {  // sass-model: hot
          s_mma(it + 2, sacc, loads);  // the tensor pipe starts right after the barrier
          pv_load(it);                 // P(it), alpha(it) published by the barrier; V(it) landed long ago
          rescale_o(it);
          softmax(it + 1, std::false_type{});  // its latencies under the S MMAs
          s_store(sacc, it + 2);
          // PV last: its results are needed only by the next PV, so the warp reaches the barrier with
          // its MMAs in flight (the model: H200 1,762 -> 1,628 cycles per tile, RTX PRO 6000 unchanged)
          pv_mma();
        }
        continue;
      }
      const bool has_next = it + 1 < ntiles;
      if (has_next) {
        s_mma(it + 1, sacc, loads);  // the tensor pipe starts right after the barrier
      } else {  // sass-model: cold (the last tile: its copies only, no S to compute)
        loads();
      }
      pv_load(it);    // P(it) was published by the barrier above; V(it) landed a tile ago
      rescale_o(it);  // alpha(it) too; the FMULs fill the wait for the S results
      if (has_next) s_store(sacc, it + 1);
      arch::block_sync();  // partial scores of tile it+1 published
      pv_then_softmax(it, has_next);
    }
  }
  arch::cp_async_wait<0>();  // no copy outlives the CTA (only empty groups can be pending here)
  arch::launch_dependents();  // the combine may start launching; it waits for this grid's writes

  // ---- epilogue: the softmax lanes publish 1/l and lse2 of their rows ------------
  if (!Tr::kRoles && scol == 0) {  // (math roles: the S warps published theirs after their loop)
    sFin[srow] = h::row_inv_l(l_run);
    sFin[BM + srow] = h::row_lse2(m_run, l_run, Log2{});
  }
  math_sync();

  const bool direct = num_splits == 1;
  float* ws_o = direct ? nullptr : ws_partial_o(p);
  float* ws_lse = direct ? nullptr : ws_partial_lse(p, num_splits);
#pragma unroll
  for (int i = 0; i < Tr::MS; ++i)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = i * 16 + (lane >> 2) + 8 * hf;
      const int grow = row0 + r;
      if (grow >= nrows) continue;
      const int qrow = qo_begin + grow / group;
      const int head = kvh * group + grow % group;
      // e4m3: P was stored times 2^8 and V's codes carry v_scale
      // (656-byte rows: P also carried its block's scale over the block's reference, blk_ref[pv_blk])
      const float inv = Tr::kMla656 ? sFin[r] * (pv_ref() / kPBlk)
                        : Tr::kE4m3Mma ? sFin[r] * (kv_scale(p.v_scale_ptr, p.v_scale) / kPScale)
                        : Tr::kFp8 ? sFin[r] * kv_scale(p.v_scale_ptr, p.v_scale) : sFin[r];
      const float lse2 = sFin[BM + r];
      // this lane's columns: 16-bit caches, dims 8j + 2c, +1 of n8 tile j; e4m3 caches, the chunk's
      // even-dim (j) and odd-dim (j + 1) accumulators hold dims 16 (j / 2) + 4c .. + 3 (c = lane % 4)
      const int col0 = owarp * Tr::kODV + (Tr::kFp8 ? 4 : 2) * (lane & 3);
      if (direct) {
        T* o = static_cast<T*>(p.out) + qrow * p.o_stride_tok + head * p.o_stride_head + col0;
        if constexpr (Tr::kFp8) {
#pragma unroll
          for (int j = 0; j < Tr::kON8; j += 2)
            arch::st_global(reinterpret_cast<uint2*>(o + j * 8),
                            make_uint2(arch::pack2<T>(oacc[i][j][2 * hf] * inv, oacc[i][j + 1][2 * hf] * inv),
                                       arch::pack2<T>(oacc[i][j][2 * hf + 1] * inv, oacc[i][j + 1][2 * hf + 1] * inv)));
        } else {
#pragma unroll
          for (int j = 0; j < Tr::kON8; ++j)
            arch::st_global(reinterpret_cast<uint32_t*>(o + j * 8),
                            arch::pack2<T>(oacc[i][j][2 * hf] * inv, oacc[i][j][2 * hf + 1] * inv));
        }
        if (p.lse != nullptr && owarp == 0 && (lane & 3) == 0)
          arch::st_global(p.lse + qrow * p.lse_stride_tok + head * p.lse_stride_head, lse2 * h::kLn2);
      } else {
        const int64_t prow = (static_cast<int64_t>(split) * p.total_q + qrow) * p.num_q_heads + head;
        float* o = ws_o + prow * p.head_dim_v + col0;
        if constexpr (Tr::kFp8) {
#pragma unroll
          for (int j = 0; j < Tr::kON8; j += 2)
            arch::st_global(reinterpret_cast<float4*>(o + j * 8),
                            make_float4(oacc[i][j][2 * hf] * inv, oacc[i][j + 1][2 * hf] * inv,
                                        oacc[i][j][2 * hf + 1] * inv, oacc[i][j + 1][2 * hf + 1] * inv));
        } else {
#pragma unroll
          for (int j = 0; j < Tr::kON8; ++j)
            arch::st_global(reinterpret_cast<float2*>(o + j * 8),
                            make_float2(oacc[i][j][2 * hf] * inv, oacc[i][j][2 * hf + 1] * inv));
        }
        if (owarp == 0 && (lane & 3) == 0) arch::st_global(ws_lse + prow, lse2);
      }
    }
}

}  // namespace va::tv
