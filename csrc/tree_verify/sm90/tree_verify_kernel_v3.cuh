// Split-KV tree-verify attention, kernel v3 for Hopper (sm_90a; issue 40): FlashMLA's warp-specialized "seesaw"
// schedule on this project's contract (tree mask, page-1 and paged caches, splits, the v1 / v2 workspace and combine).
// MLA rows (Dqk 576 = 512 latent + 64 RoPE, V = the first 512 dims of the K row), q / out / cache bf16 or fp16.
//
// The block (TileConfigV3 in sm90/tile_v3.h, traits and layouts in sm90/traits_v3.h): 384 threads.
//   * Warps 8-11, the producer warpgroup (setmaxnreg.dec 64): every KV copy of the CTA. Each 64-token block is
//     gathered by 16-byte cp.async into one stage in the 128-byte-swizzled layout, 8 threads per 128-byte line (a
//     token's 64-dim block): thread p copies chunk p % 8 of tokens p / 8 + 16 j (j < 4) in all 9 dim blocks, 36
//     copies a block. Its loop runs a pair of blocks an iteration; the pair's row ids come from kv_indices before
//     its first wait (registers; 8 a thread), paged or page 1 alike (row = id * stride_block + (token % page) *
//     stride_tok). Each stage is filled in two halves, each with its own FULL and EMPTY mbarrier (FlashMLA's split
//     of a block's barriers): half 0, the early one, is stage 0's dims 0-255 and stage 1's dims 256-511, whose last
//     reader (warpgroup 0's P0 V0L, warpgroup 1's P1 V1R) is done in the middle of a pair; half 1 is the rest with the
//     RoPE block, read to the pair's end. So the producer refills both early halves for pair i + 1 while pair i still
//     runs, then the late ones. Before refilling a half it waits on the half's EMPTY mbarrier (one lane of each warp
//     of the warpgroup that reads it last, once its last wgmma reading it retired); after, each thread signals the
//     half's FULL mbarrier with cp.async.mbarrier.arrive.noinc (128 arrivals, each when that thread's copies have
//     landed). Rows past the split's end land as zeros (zero-fill, no read). Between the early and the late halves
//     each thread prefetches into L2 (prefetch.global.L2) the 9 lines of one row of pair i + 1 (row pt: the pair's
//     128 rows, one a thread), so the DRAM stream runs on while the stages are still read, and the next pair's
//     copies read L2.
//   * Warps 0-7, two consumer warpgroups (setmaxnreg.inc 216). KV blocks go in pairs: warpgroup 0 takes block 2i
//     (stage 0), warpgroup 1 block 2i + 1 (stage 1); an odd count gets a phantom block past the end (zeros, run
//     without wgmma: below). For a pair, in FlashMLA's order:
//       WG0: S0 = Q K0^T (36 wgmma m64n64k16, Q and K0 from shared memory), its row max, the running max updated
//            (lazy: v1's reference max moves only past 2^8), P0 = exp2(S0 - m), its row sums; P0 (in its own A
//            fragment order) into stage 0's RoPE dim block, the row max and row sum beside it; bar.arrive P0;
//            O_L = O_L a0 + P0 V0[:, 0:256] (wgmma m64n256k16, P from registers).
//       WG1: S1 = Q K1^T meanwhile; bar.sync P0; replays WG0's max update with WG0's row max (the same arithmetic,
//            so both warpgroups hold the same running max and sum bit for bit), then its own: P1 at the pair's max;
//            publishes P1, its row max and sum in stage 1's RoPE block; bar.arrive P1;
//            O_R = O_R a0 a1 + P1 V1[:, 256:512] + (P0 a1) V0[:, 256:512].
//       WG0: bar.sync P1; replays WG1's update; O_L = O_L a1 + P1 V1[:, 0:256].
//     Each S waits for its block's early half, issues those k steps, then waits for the late half. Each warpgroup
//     frees a half (EMPTY) once its last wgmma reading it retired: warpgroup 0 stage 0's early half after P0 V0L,
//     stage 1's late half at the end; warpgroup 1 stage 1's early half after P1 V1R, stage 0's late half at the
//     end (its S, and the other warpgroup's S of the halves it frees, retired before the P hand-offs that precede
//     those releases). One warpgroup's softmax
//     runs while the other's S or P V wgmmas keep the tensor cores busy (FlashMLA's argument: O, 64 x 512 fp32,
//     fills half the register file, so two O tiles for FA3's ping-pong do not fit; the two halves of one O do).
//   * Named barriers (0 is block_sync's): 1, the consumers' 256 threads after staging Q; 2 and 3, the P0 / P1
//     hand-offs (bar.arrive by the publishing warpgroup, bar.sync by the other: 256); 4, warpgroup 0's 128 threads
//     before its P overwrites the RoPE dims its S read (a warp's wgmma wait retires its own part only: the
//     emulator's warp-ahead schedule caught warp 0 writing P under warps 1-3's S; warpgroup 1's bar.sync on P0 already
//     orders its warps' S before its P; e4m3, whose P has buffers of its own: after its P0 stores, below);
//     5, warpgroup 1's 128 threads after its P1 stores (e4m3).
//     The only CTA-wide barrier is the one after the mbarriers' init.
//   * A phantom pair (an odd block count's last: block 2i + 1 past the split's end) runs no wgmma on its phantom
//     block: warpgroup 1 waits for the block's (zero) rows to land and issues no S, neither warpgroup hands P1 over
//     (bar.arrive / bar.sync P1 skipped together) or runs a P1 V. The FULL waits stay, and every EMPTY arrival that
//     follows a wait ordering it after the producer's wait on the phase before (not warpgroup 0's on stage 1's late
//     half: below).
//   * Q (64 x 576) is staged once by the consumers (cp.async into the same swizzled layout, proxy fence, named
//     barrier 1) with the first 8 tree-mask words of each row; S reads Q from shared memory (its 144 fragment
//     registers would not fit beside O's 128).
// Proxies: cp.async writes shared memory through the generic proxy and wgmma reads it through the async proxy.
// FlashMLA's sparse prefill hands noinc-tied cp.async rows to wgmma right after the mbarrier wait; here each consumer
// also runs fence.proxy.async after its FULL wait (the conservative reading of the PTX memory model: the wait acquires
// the copies, the fence orders them before this thread's async-proxy reads; one cheap fence a block). The emulator
// treats noinc-tied copies as the barrier's own writes (visible to wgmma once the phase is awaited), so it does not
// check that fence; it checks the one after Q. The 16-bit P exchange is read back into registers (wgmma's A from
// registers), so no generic write is read by the async proxy there; e4m3's P^T is (each writer fences its stores).
// e4m3 caches (Tr::kFp8, per-tensor scales; traits_v3.h): both products on wgmma .e4m3 (k32), the same seesaw.
//   * Q quantized per row (v2's scale amax / 448, stage_q_e4m3) and the stages in v2's no-swizzle core-matrix layout
//     (a 576-byte row is 4.5 lines of 128 bytes); S: 18 k32 wgmma m64n64k32 a block.
//   * P V with its operands swapped (NOTES.md, "Hopper's v3 on e4m3: P V with the operands swapped"): e4m3 B operands
//     are K-major only, so O = P V would need V tokens-contiguous per dim (until 2026-12-07 each block's V was
//     transposed into V^T buffers: 32 KB read and 32 KB written a block). Instead each warpgroup accumulates O^T (its
//     256 dims x the 64 rows: 4 m64 tiles, N = 64, 128 fp32 registers a thread as O) += V^T P^T: A = V^T from
//     registers, built from the stage's rows by ldmatrix .trans and byte permutes (vt_a_fragment_e4m3, sm90/pv_swap.cuh;
//     the k positions are the tokens in fp8_pv_token_of_k order, where P's A fragment has them), B = P^T from a P
//     buffer (K-major: row n's tokens contiguous), which the warpgroup that ran the softmax stores (4-byte words of its
//     A fragments, fenced). 8 wgmma m64n64k32 a block and warpgroup, committed a k32 step, at most two steps in flight.
//   * O^T's columns are rows: each thread scales 16 rows it did not compute. A warpgroup publishes its block's alpha
//     per row beside its row max and sum (warpgroup 0 its a0 before bar.arrive P0, warpgroup 1 its a1 before
//     bar.arrive P1); each thread reads its 16 rows' factors and rescales O^T when any of its warp's differs from 1
//     (the exact max: P <= 1, stored x kPScale, v2's choice). Warpgroup 1's order is O_R a0, P0 V0R, then (only when a1
//     differs from 1, after retiring P0 V0R) O_R a1, then P1 V1R: P0 in shared memory is at block 2i's max, and
//     warpgroup 0 reads it too.
//   * Buffers in two slots (pair i in slot i % 2, two 36 KB stages each; its FULL / EMPTY barriers' phase i / 2): a
//     block's rows are read to the pair's end (the P V's fragments), so the producer copies pair i + 2 into pair i's
//     slot once every consumer warp freed it (EMPTY counts all 8: each after loading its fragments of the block, its S
//     before), and prefetches pair i + 3's rows into L2. The P buffers follow the slots: warpgroup 1's P0 V0R of pair
//     i may still read P0 when warpgroup 0 writes pair i + 1's.
//   * Each warpgroup's own barrier (ids 4 and 5) follows its P store, so that its own P V reads every warp's; the
//     epilogue passes 1 / l per row through shared memory behind the same barriers and stores O^T's columns.
// A 2-CTA cluster (Tr::kCluster 2, TileConfigV3<128, ...>; 16-bit caches; NOTES.md, "Hopper's v3 as a 2-CTA
// cluster"): the two 64-row CTAs of a split's 128 rows share each block's gather. A CTA with no rows of its own still
// runs, as padding, so that both always do.
//   * Rank r's producer copies rows 32 r .. 32 r + 31 of every block (2 a thread), prefetches only those, and its
//     thread 0 (warp 8), the forwarder, sends each stage half to the peer once it landed here (its wait on this CTA's
//     FULL, a proxy fence, one cp.async.bulk.shared::cluster a dim block: 32 swizzled rows are 4 KB in a row, to the
//     same offset of the peer's stage, completing on the peer's FULL_PEER of the half), then arrives on its own
//     FULL_PEER with the bytes the peer sends (expect_tx). It forwards each half after issuing the next one's copies
//     (they have that long to land), the pair's last at once.
//   * The consumers wait on FULL_PEER only: its phase completes with the peer's rows and the forwarder's arrival,
//     which follows the forwarder's wait on FULL, so it covers this CTA's rows too. They free a half in both CTAs
//     (EMPTY counts 4 warps of each: each producer refills its half of both stages). After its late-half FULL_PEER
//     wait, one thread of the warpgroup arrives on the peer's SENT of the stage: the rows that CTA forwarded landed
//     here, so its P may overwrite the RoPE block they were read from (each warpgroup waits on its own SENT before
//     writing P; a bulk copy reads its source until the target's phase completes).
//   * The barriers' init is fenced for the cluster (fence.mbarrier_init) and both CTAs meet at a cluster barrier
//     before any remote arrival or copy; they meet again before either exits (the peer may still arrive on this CTA's
//     barriers). The emulator treats noinc-tied copies as async-proxy writes, so it does not check the forwarder's
//     proxy fence either.
// Not built yet: TMA boxes for paged caches; the cluster on e4m3 caches.
#pragma once

#include "arch/arch.cuh"
#include "../../host/host_math.h"
#include "../params.h"
#include "../request.cuh"
#include "../tree_verify_kernel.cuh"
#include "../tree_verify_kernel_v1.cuh"  // TokenCursor
#include "pv_swap.cuh"
#include "traits_v3.h"

namespace va::tv {

// Named barriers of kernel v3 (sm90): Q staged by the consumers, the seesaw's two hand-offs, warpgroup 0's own
// barrier before P0 overwrites the RoPE dims its S read (e4m3: after its P0 stores, before its P0 V0L reads them), and
// (e4m3) warpgroup 1's after its P1 stores
inline constexpr int kV3QBarrier = 1, kV3P0Barrier = 2, kV3P1Barrier = 3, kV3WgBarrier = 4, kV3Wg1Barrier = 5;

template <class Tr>
__global__ void __launch_bounds__(Tr::kBlockThreads, 1) tree_verify_split_kernel_v3(const Params p, const int num_splits) {
  // launched with programmatic dependent launch (launch_shape.cuh): nothing below touches global memory before the
  // previous kernel on the stream completed; only this grid's launch and start overlap its end
  va::arch::grid_dependency_wait();
  using T = typename Tr::Elem;
  using KvT = typename Tr::KvElem;  // the cache's element: T, or e4m3 codes (uint8_t), also the wgmma operand type
  using L = typename Tr::Layout;
  namespace arch = va::arch;
  namespace h = va::host;
  constexpr int BM = Tr::BM, BN = Tr::BN, STAGES = Tr::STAGES;
  constexpr int kSAccN = Tr::kSAccN, kOAccN = Tr::kOAccN, kPKSteps = Tr::kPKSteps;
  constexpr int kBlockBytes = Tr::kBlockBytes, kAtom = Tr::kAtomBytes;

  // a 2-CTA cluster (Tr::kCluster, 16-bit): the two CTAs of a split's two 64-row M tiles each gather half of every
  // block's rows and forward them to the other (below: "the cluster")
  constexpr bool kPair = Tr::kCluster == 2;

  // ---- this CTA's rows and KV range (block-uniform: early exits are safe; in a cluster, both CTAs leave together:
  // a request's and a split's exits are the same for both, and a CTA with no rows of its own still runs, as padding)
  CtaWork work;
  if (!cta_work<T, BM, BN>(p, num_splits, work, kPair)) return;
  const int split = work.split, kvh = work.kvh;
  const RequestInfo& req = work.req;
  const int qo_begin = req.qo_begin, prefix = req.prefix;
  const int group = p.group;
  const int nrows = work.nrows, row0 = work.row0, ntiles = work.ntiles;
  const h::SplitRange range = work.range;
  const int kv_base = req.kv_base;
  const int npairs = (ntiles + 1) / 2;  // an odd count: a phantom block past the end (zeros, fully masked)

  const int tid = threadIdx.x;
  const int lane = arch::lane_id();
  const int warp = arch::warp_id();
  unsigned char* smem = arch::smem_dynamic<unsigned char>();
  // 16-bit: FULL (stage, half) at sFull[2 stage + half], EMPTY likewise at sEmpty; pair i is phase i of each. e4m3:
  // FULL / EMPTY per buffer (slot, stage) at [2 slot + stage]; pair i (slot i % 2) is phase i / 2 of its slot's
  constexpr int kRowBars = Tr::kFp8 ? Tr::kSlots * STAGES : STAGES * Tr::kHalves;
  uint64_t* sFull = reinterpret_cast<uint64_t*>(smem + Tr::kBars);
  uint64_t* sEmpty = sFull + kRowBars;
  // the cluster: FULL_PEER (stage, half) at sFullPeer[2 stage + half], the peer's rows of the half landed here (one
  // arrival, this CTA's producer announcing their bytes); SENT (stage), the rows this CTA forwarded of the stage's
  // late half landed in the peer (one arrival, from the peer), so that P may overwrite the RoPE block they came from
  [[maybe_unused]] uint64_t* sFullPeer = sEmpty + kRowBars;
  [[maybe_unused]] uint64_t* sSent = sFullPeer + kRowBars;
  unsigned char* sKV = smem + Tr::kKV;
  // the cluster: this CTA's rank, and the peer's shared::cluster address of a byte of this CTA's shared memory (the
  // same offset in the peer, whose layout is this one's)
  [[maybe_unused]] const int rank = kPair ? arch::cluster_ctarank() : 0;
  [[maybe_unused]] const uint32_t peer_smem = kPair ? arch::map_shared_rank(smem, rank ^ 1) : 0u;
  [[maybe_unused]] auto at_peer = [&](const void* q) {
    return peer_smem + static_cast<uint32_t>(static_cast<const unsigned char*>(q) - smem);
  };

  if (tid == 0) {
    for (int b = 0; b < kRowBars; ++b) {
      arch::mbarrier_init(sFull + b, Tr::kProducerThreads);  // every producer thread, once its copies landed
      // 16-bit: one lane of each warp of the warpgroup reading it last (the cluster: in both CTAs, since this CTA's
      // producer refills the peer's half too). e4m3: of every consumer warp, each once it loaded its V^T fragments of
      // the stage (its S, if the stage is its warpgroup's, came before)
      arch::mbarrier_init(sEmpty + b, Tr::kFp8 ? Tr::kWarps : Tr::kCluster * Tr::kWarps / 2);
      if constexpr (kPair) arch::mbarrier_init(sFullPeer + b, 1);  // this CTA's producer thread 0 (expect_tx)
    }
    if constexpr (kPair) {
      for (int s = 0; s < STAGES; ++s) arch::mbarrier_init(sSent + s, 1);  // one lane of the peer's reader
      arch::fence_mbarrier_init_cluster();  // ... visible to the peer at the cluster barrier below
    }
  }
  // initialised before any arrival: the CTA's only block-wide barrier (the cluster: both CTAs', before either
  // arrives on or copies into the other's barriers)
  if constexpr (kPair)
    arch::cluster_sync();
  else
    arch::block_sync();

  // ======================= producer warpgroup: every KV copy =======================
  if (warp >= Tr::kWarps) {
    arch::setmaxnreg_dec<Tr::kProducerRegs>();
    const int pt = tid - Tr::kThreads;      // 0 .. 127
    using KV = typename Tr::KvElem;
    const KV* kv_head = static_cast<const KV*>(p.k_cache) + kvh * p.k_stride_head;
    // row strides as 32-bit (launch_one refuses larger ones for every kernel version >= 1)
    const int32_t k_sb32 = static_cast<int32_t>(p.k_stride_block), k_st32 = static_cast<int32_t>(p.k_stride_tok);
    // a token's kv_indices position and row in its page, moved a pair (2 BN tokens) on at a time with additions only
    // (TokenCursor: a paged layout's division once, at construction; a division a row and pair cost the paged
    // producers ~200 instructions a pair)
    auto cursor = [&](int tok) { return TokenCursor<L>(tok, STAGES * BN, p.page_size); };
    // Pages that hold whole blocks (page_size a multiple of BN: FlashMLA's 64, 128, ...): a block's rows share one
    // kv_indices entry and a thread's rows of it follow each other in that page, so it reads one id a block and adds
    // rows (at page 64 the 16-bit producer ran 469 instructions a pair against page 1's 348, mostly the cursor walk and
    // an id a row). Pages that split a block walk the cursor row by row (`row_walk`); page 1 reads an id a row.
    const bool row_walk = L::kPaged && p.page_size % BN != 0;
    // the kv_indices entry at index position pos, or for a position past the range's last token that token's (an
    // in-bounds row whose copy zero-fills): no branch around the load, so the ids of a block load straight-line
    const int last_pos = L::kPaged ? (range.end - 1) / p.page_size : range.end - 1;
    auto id_clamped = [&](int pos) -> int32_t {
      if constexpr (kKnockout & kKoNoIndex)
        return pos < last_pos ? pos : last_pos;
      else
        return ld_index(p.kv_indices, static_cast<int64_t>(kv_base) + (pos < last_pos ? pos : last_pos),
                        p.kv_indices_i64);
    };
    // (each role's base holds the thread's chunk: the copies' addresses are then one add each; with the chunk added
    // after the row, the 16-bit producer ran 619 instructions a pair instead of 343)
    if constexpr (!Tr::kFp8) {
      constexpr int RJ = Tr::kRowsPerThread;
      // rows r0 + 16 j for j < RJC copied: all 64 of a block; the cluster: this rank's 32 (rows 32 rank .. + 31);
      // kKoHalfRows: rows 0-31 only (a rank 0's gather without its forward)
      constexpr int RJC = (kPair || (kKnockout & kKoHalfRows)) ? RJ / 2 : RJ;
      // chunk of a 128-byte line; first token (then + 16 j)
      const int sub = pt & 7, r0 = (pt >> 3) + (kPair ? rank * (BN / 2) : 0);
      const KV* kbase = kv_head + sub * 8;
      // its tokens' cursors: block 2i + s's first (token r0) at cur[s]; its tokens r0 + 16 j from it, 16 tokens a step
      // (a cursor a token spilled at 56 registers)
      auto tok_of = [&](int t, int j) { return range.begin + t * BN + r0 + 16 * j; };
      TokenCursor<L> cur[2] = {cursor(tok_of(0, 0)), cursor(tok_of(1, 0))};
      const TokenCursor<L> by16(0, 16, p.page_size);
      const int64_t rows16 = 16 * static_cast<int64_t>(k_st32);  // 16 rows of a page (whole pages)
      TokenCursor<L> pf_cur = cursor(range.begin + 2 * BN + pt);  // row pt of pair i + 1 (iteration i)
      // the ids of this thread's tokens of block t: r0 + 16 j
      auto load_ids = [&](int t, int32_t (&ids)[RJ]) {
        if (row_walk) {  // sass-model: rare (pages that split a block; the model's paged readings are at page 64)
          TokenCursor<L> c = cur[t % 2].stepping_as(by16);
#pragma unroll
          for (int j = 0; j < RJC; ++j, c.advance()) ids[j] = id_clamped(c.pos);
        } else {  // page 1: an id a row; whole pages: the block's one id (ids[0]; the others unread, set to 0 so that
                  // no copy of the load's register waits for it here)
#pragma unroll
          for (int j = 0; j < RJC; ++j) ids[j] = L::kPaged && j > 0 ? 0 : id_clamped(cur[t % 2].pos + 16 * j);
        }
      };
      static_assert(STAGES == 2, "v3 (sm90): a pair of blocks in two stages, block 2i + s in stage s");
      static_assert(STAGES * BN == Tr::kProducerThreads, "the L2 prefetch: one row of the next pair a producer thread");
      // the cluster: the bytes of a stage half this CTA forwards (and receives): half the rows of each of its dim blocks
      [[maybe_unused]] auto half_bytes = [](int stage, int half) {
        uint32_t n = 0;
        for (int b = 0; b < Tr::kDimBlocks; ++b) n += Tr::half_of(stage, b) == half ? 1u : 0u;
        return n * (BN / 2) * 128u;
      };
      // the cluster (producer thread 0): this CTA's rows of (stage, half) of pair i, once they landed here, into the
      // same place of the peer's stage: one bulk copy per dim block (32 rows of a swizzled 8 KB block are 4 KB in a
      // row), completing on the peer's FULL_PEER of the half. Then this CTA's FULL_PEER of the half, phase i, is told
      // the peer's rows it awaits (its one arrival): after this CTA's own forward, so that bench.model, which
      // simulates one CTA, reads the peer's rows as landing when this CTA's forward does (the two CTAs run the same
      // steps); on the GPU the phase completes with the peer's bytes whichever comes first (a tx count may go below
      // zero before its expect_tx)
      [[maybe_unused]] auto forward = [&](int stage, int half, int i) {
        arch::mbarrier_wait(sFull + Tr::kHalves * stage + half, static_cast<uint32_t>(i) & 1u);
        arch::fence_proxy_async();  // the landed cp.async (generic-proxy) bytes before the bulk copies' reads
        const uint32_t bar = at_peer(sFullPeer + Tr::kHalves * stage + half);
        const unsigned char* src = sKV + stage * Tr::kStageBytes + rank * (BN / 2) * 128;
#pragma unroll
        for (int b = 0; b < Tr::kDimBlocks; ++b)
          if (Tr::half_of(stage, b) == half)
            arch::bulk_copy_s2cluster(at_peer(src + b * kBlockBytes), src + b * kBlockBytes, (BN / 2) * 128, bar);
        arch::mbarrier_arrive_expect_tx(sFullPeer + Tr::kHalves * stage + half, half_bytes(stage, half));
      };
      for (int i = 0; i < npairs; ++i) {
        // the pair's row ids, loaded before the EMPTY waits: their latency hides under them
        int32_t ids[STAGES][RJ];
        load_ids(2 * i, ids[0]);
        load_ids(2 * i + 1, ids[1]);
        // row pt of pair i + 1, and its id (read here: the EMPTY waits that follow hide the load)
        const int pf_tok = range.begin + (2 * i + 2) * BN + pt;
        // (the cluster, and kKoHalfRows: the rows of this CTA's gather only)
        const int pf_half = pt % BN / (BN / 2);
        const bool prefetch = i + 1 < npairs && pf_tok < range.end && !(kKnockout & kKoNoLoad) &&
                              (!(kKnockout & kKoHalfRows) || pf_half == 0) && (!kPair || pf_half == rank);
        const int32_t pf_id = prefetch ? id_clamped(pf_cur.pos) : 0;  // (pf_tok < range.end: never clamped)
        // the early halves first (stage 0's L, stage 1's R: freed in the middle of the previous pair), then the late
#pragma unroll
        for (int step = 0; step < STAGES * Tr::kHalves; ++step) {
          const int half = step / STAGES, stage = step % STAGES, t = 2 * i + stage;
          if (step == STAGES && prefetch) {
            // before the late halves' waits (freed at the end of pair i - 1): this thread's row of pair i + 1, its 9
            // lines, into L2, so that the next pair's copies, issued once their halves are free, read L2 while DRAM
            // streams on
            const KV* row = kv_head + pf_cur.row_offset(pf_id, k_sb32, k_st32);   // (the row's start: its line 0)
#pragma unroll
            for (int b = 0; b < Tr::kDimBlocks; ++b) arch::prefetch_l2(row + b * Tr::kDimBlock);
          }
          // the warpgroup reading this half last released it in pair i - 1 (its phase i - 1)
          if (i > 0) arch::mbarrier_wait(sEmpty + Tr::kHalves * stage + half, static_cast<uint32_t>(i - 1) & 1u);
          unsigned char* dst0 = sKV + stage * Tr::kStageBytes;
          if (!(kKnockout & kKoNoLoad) || i == 0) {
            // row r0 + 16 j of the block from `src`: this half's dim blocks
            auto copy_row = [&](int j, const KV* src) {
              const int r = r0 + 16 * j;
              const bool valid = range.begin + t * BN + r < range.end;  // past the end: zeros land (P is 0 there)
              unsigned char* dst = dst0 + arch::sw128_kmajor_offset(r, sub, kAtom);
#pragma unroll
              for (int b = 0; b < Tr::kDimBlocks; ++b)
                if (Tr::half_of(stage, b) == half)
                  arch::cp_async_16_zfill(dst + b * kBlockBytes, src + b * Tr::kDimBlock, valid);
            };
            if (row_walk) {  // sass-model: rare (pages that split a block; the model's paged readings are at page 64)
              TokenCursor<L> c = cur[stage].stepping_as(by16);
#pragma unroll
              for (int j = 0; j < RJC; ++j, c.advance()) copy_row(j, kbase + c.row_offset(ids[stage][j], k_sb32, k_st32));
            } else {  // page 1: a row an id; whole pages: row 0 of the block's page, then 16 rows apart
              const KV* src0 = kbase + cur[stage].row_offset(ids[stage][0], k_sb32, k_st32);
#pragma unroll
              for (int j = 0; j < RJC; ++j)
                copy_row(j, L::kPaged ? src0 + j * rows16 : kbase + cur[stage].row_offset(ids[stage][j], k_sb32, k_st32));
            }
          }
          // FULL of this half: counts this thread once its copies (all it issued so far) landed
          arch::cp_async_mbarrier_arrive_noinc(sFull + Tr::kHalves * stage + half);
          // the cluster: thread 0 forwards the half before this one (its copies had this step's issue time to land),
          // and at the pair's last step this one too (the peer's S waits for it before it frees anything)
          if constexpr (kPair) {
            if (pt == 0) {  // (warp 8, which bench.model simulates as the producer of its scheduler)
              if (step > 0) forward((step - 1) % STAGES, (step - 1) / STAGES, i);
              if (step == STAGES * Tr::kHalves - 1) forward(stage, half, i);
            }
          }
        }
        cur[0].advance(), cur[1].advance(), pf_cur.advance();
      }
    } else {
      // e4m3: warp pw's lane (tok8 = lane % 8, cl = lane / 8) copies chunks 4 m + cl (m < 9: a row's 36) of tokens
      // 16 pw + 8 j + tok8 (j < 2): one warp instruction is 8 tokens x 4 consecutive chunks (64 bytes of each row:
      // whole sectors), landing as 4 whole 128-byte core-matrix rows (no bank conflict)
      const int pw = warp - Tr::kWarps, tok8 = lane & 7, cl = lane >> 3;
      const KV* kbase = kv_head + cl * 16;
      constexpr int RJ = Tr::kRowsPerThread, kRowChunkIters = Tr::kChunks / 4;
      static_assert(Tr::kChunks % 4 == 0 && RJ * 8 * 4 == BN, "e4m3 producer: 4 warps x 2 x 8 tokens, 4 chunk lanes");
      auto tok_of = [&](int t, int j) { return range.begin + t * BN + 16 * pw + 8 * j + tok8; };
      // its tokens' cursors, as the 16-bit producer's: the first (token 16 pw + tok8) of the block stage s copies next
      // at cur[s], its tokens 8 apart from it
      TokenCursor<L> cur[STAGES] = {cursor(tok_of(0, 0)), cursor(tok_of(1, 0))};
      const TokenCursor<L> by8(0, 8, p.page_size);
      // block t's row ids (its stage's cursor names its tokens; a row past the end reads the last token's entry). Not
      // the 16-bit producer's whole-page shortcut: here the model read it 65.8 -> 75.8 us, its linear walk of the
      // shortcut's branch and the row walk's giving the id loads a false register dependency (two rows a block, so
      // the shortcut saves one id load a block)
      // (next: the block a pair after the one its stage's cursor names)
      auto load_ids = [&](int t, int32_t (&ids)[RJ], bool next = false) {
        TokenCursor<L> at = cur[t % STAGES];
        if (next) at.advance();
        TokenCursor<L> c = at.stepping_as(by8);
#pragma unroll
        for (int j = 0; j < RJ; ++j, c.advance()) ids[j] = id_clamped(c.pos);
      };
      // block t's rows into `stage` of its pair's slot (t / 2 % 2), then this thread's arrival on that buffer's FULL
      // once they landed; the stage's cursors move on to the next pair
      auto copy_block = [&](int t, int stage, const int32_t (&ids)[RJ]) {
        const int buf = (t / STAGES) % Tr::kSlots * STAGES + stage;
        if (!(kKnockout & kKoNoLoad) || t < Tr::kSlots * STAGES) {
          TokenCursor<L> c = cur[stage].stepping_as(by8);
#pragma unroll
          for (int j = 0; j < RJ; ++j, c.advance()) {
            const bool valid = tok_of(t, j) < range.end;  // past the end: zeros land (P is 0 there; 0 x NaN would not be)
            const KV* src = kbase + c.row_offset(ids[j], k_sb32, k_st32);
            unsigned char* dst = sKV + buf * Tr::kStageBytes + (2 * pw + j) * Tr::kGroupBytes + cl * 128 + tok8 * 16;
#pragma unroll
            for (int m = 0; m < kRowChunkIters; ++m) arch::cp_async_16_zfill(dst + m * 512, src + m * 64, valid);
          }
        }
        cur[stage].advance();
        arch::cp_async_mbarrier_arrive_noinc(sFull + buf);
      };
      // pairs 0 and 1 (one a slot) before the loop, pair i + 2 in iteration i, into pair i's slot once it is free
      // (unrolled: bench.model takes a role's loop for its steady state). Row ids a pair ahead of their copies: pair i
      // + 3's load in iteration i, so that no copy waits on its id's load (the model read the producer's loop at 1,645
      // cycles an iteration stalled on them when pair i + 2's were loaded in iteration i, with only the EMPTY waits,
      // which pass at once in the steady state, between load and use)
      static_assert(Tr::kSlots == 2, "e4m3 producer: pair i + 2 into pair i's slot");
      int32_t ids[STAGES][RJ];
#pragma unroll
      for (int pair = 0; pair < Tr::kSlots; ++pair) {
        if (pair < npairs) {
#pragma unroll
          for (int st = 0; st < STAGES; ++st) load_ids(STAGES * pair + st, ids[st]);
#pragma unroll
          for (int st = 0; st < STAGES; ++st) copy_block(STAGES * pair + st, st, ids[st]);
        }
      }
      if (Tr::kSlots < npairs) {  // pair 2's ids, for iteration 0
#pragma unroll
        for (int st = 0; st < STAGES; ++st) load_ids(STAGES * Tr::kSlots + st, ids[st]);
      }
      TokenCursor<L> pf_cur = cursor(range.begin + 3 * STAGES * BN + pt);  // row pt of pair i + 3 (iteration i)
      for (int i = 0; i + 2 < npairs; ++i) {
        const uint32_t parity = static_cast<uint32_t>(i >> 1) & 1u;  // pair i's phase of its slot's barriers
        const int slot = i % Tr::kSlots;
        // pair i + 2's row ids (loaded an iteration ago), and pair i + 3's for the next
        int32_t cur_ids[STAGES][RJ];
#pragma unroll
        for (int st = 0; st < STAGES; ++st)
#pragma unroll
          for (int j = 0; j < RJ; ++j) cur_ids[st][j] = ids[st][j];
        if (i + 3 < npairs) {
#pragma unroll
          for (int st = 0; st < STAGES; ++st) load_ids(2 * i + 6 + st, ids[st], true);  // (cursors: pair i + 2)
        }
        // row pt of pair i + 3 (prefetched below, so that its copies, issued in iteration i + 1, read L2)
        const int pf_tok = range.begin + (2 * i + 6) * BN + pt;
        const bool prefetch = i + 3 < npairs && pf_tok < range.end && !(kKnockout & kKoNoLoad);
        const int32_t pf_id = prefetch ? id_clamped(pf_cur.pos) : 0;  // (pf_tok < range.end: never clamped)
        // each of pair i + 2's blocks into its stage of the slot once every consumer warp loaded its V^T fragments of
        // pair i's block there (EMPTY, pair i's phase; S came before them)
#pragma unroll
        for (int stage = 0; stage < STAGES; ++stage) {
          if (stage == 1 && prefetch) {  // the row's lines (a 576-byte row spans 5 or 6)
            const KV* row = kv_head + pf_cur.row_offset(pf_id, k_sb32, k_st32);
#pragma unroll
            for (int b = 0; b < Tr::kRowLines; ++b)
              arch::prefetch_l2(row + (128 * b < Tr::kRowBytes ? 128 * b : Tr::kRowBytes - 1));
          }
          arch::mbarrier_wait(sEmpty + slot * STAGES + stage, parity);
          copy_block(2 * i + 4 + stage, stage, cur_ids[stage]);  // sass-model: arrive-ahead (FULL: pair i + 2's)
        }
        pf_cur.advance();
      }
    }
    if constexpr (kPair) arch::cluster_sync();  // (the consumers' last: below)
    return;
  }

  // ======================= consumer warpgroups =======================
  arch::setmaxnreg_inc<Tr::kMathRegs>();
  // warpgroup (read from lane 0: warp-uniform, so the descriptors stay in uniform registers); warp within it
  const int wg = arch::shfl(warp / 4, 0), wq = warp % 4;
  const int tw = tid & 127;                  // thread within the warpgroup
  const int qg = lane >> 2, qt = lane & 3;   // fragment row group and column pair
  const T* q = static_cast<const T*>(p.q);

  // ---- Q (64 rows x 576) into the swizzled layout (e4m3: quantized per row into the core-matrix layout), and the
  // first 8 tree-mask words of each row ----
  [[maybe_unused]] float* sQScale = reinterpret_cast<float*>(smem + Tr::kQScale);
  if constexpr (Tr::kFp8) {
    stage_q_e4m3<T, BM, Tr::kWarps, Tr::kChunks, Tr::kGroupBytes>(p, q, row0, nrows, group, qo_begin, kvh, warp, lane,
                                                                   smem + Tr::kQ, sQScale);
  } else {
    constexpr int kQChunks = Tr::DQK / 8;  // 72 16-byte chunks a row
    for (int i = tid; i < BM * kQChunks; i += Tr::kThreads) {
      const int r = i / kQChunks, c = i % kQChunks;
      const int grow = row0 + r;
      bool valid;  // (rows past T_b * group: zeros, never written out)
      const T* src = q_chunk_src(p, q, grow, nrows, group, qo_begin, kvh, c, valid);
      arch::cp_async_16_zfill(smem + Tr::kQ + (c / 8) * kBlockBytes + arch::sw128_kmajor_offset(r, c % 8, kAtom), src,
                              valid);
    }
  }
  uint32_t* sMask = reinterpret_cast<uint32_t*>(smem + Tr::kMask);
  constexpr int kMaskStage = Tr::kMaskStage;
  stage_mask_words<BM, Tr::kThreads, kMaskStage>(p, req, row0, nrows, sMask);
  arch::cp_async_commit();
  arch::cp_async_wait<0>();
  arch::fence_proxy_async();                                 // Q visible to the wgmma's async proxy
  arch::named_barrier_sync(kV3QBarrier, Tr::kThreads);       // ... everyone's (and the mask words)

  // ---- descriptors (sm90/traits_v3.h): K-major for S (Q and K), MN-major for P V (this warpgroup's 256 dims); e4m3:
  // the core-matrix layout for S (LBO 128, SBO kGroupBytes), and P^T's (K-major, the B operand of O^T = V^T P^T) ----
  const uint64_t q_desc = Tr::kFp8 ? arch::wgmma_desc(smem + Tr::kQ, 128, Tr::kGroupBytes)
                                   : arch::wgmma_desc_sw128(smem + Tr::kQ, 16, kAtom);
  const uint64_t k_desc0 = Tr::kFp8 ? arch::wgmma_desc(sKV, 128, Tr::kGroupBytes) : arch::wgmma_desc_sw128(sKV, 16, kAtom);
  const uint64_t pvb_desc0 =  // P V's B operand: V (16-bit), P^T (e4m3)
      Tr::kFp8 ? arch::wgmma_desc(smem + Tr::kP, 128, Tr::kPSbo)
               : arch::wgmma_desc_sw128(sKV + wg * (Tr::kODV / Tr::kDimBlock) * kBlockBytes, kBlockBytes, kAtom);

  // ---- softmax state: rows qg and qg + 8 of the warp's 16, the same in both warpgroups ----
  // (e4m3: x K's scale and the Q row's)
  float scale_log2[2] = {p.sm_scale * h::kLog2e, p.sm_scale * h::kLog2e};
  if constexpr (Tr::kFp8) {
    const float ks = p.sm_scale * h::kLog2e * kv_scale(p.k_scale_ptr, p.k_scale);
    scale_log2[0] = ks * sQScale[wq * 16 + qg], scale_log2[1] = ks * sQScale[wq * 16 + qg + 8];
  }
  int smask_row[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int grow = row0 + wq * 16 + qg + 8 * hf;
    smask_row[hf] = grow < nrows ? qo_begin + grow / group : -1;  // node's q row; -1: padding row
  }
  const uint32_t* my_mask[2] = {sMask + (wq * 16 + qg) * kMaskStage, sMask + (wq * 16 + qg + 8) * kMaskStage};
  float m_run[2] = {h::neg_inf(), h::neg_inf()}, l_run[2] = {0.f, 0.f};
  float oacc[kOAccN];  // e4m3: O^T, m64 tile mt (dims 64 mt ..) at o_tile(mt)
#pragma unroll
  for (int i = 0; i < kOAccN; ++i) oacc[i] = 0.f;
  [[maybe_unused]] auto o_tile = [&](int mt) -> float (&)[BM / 2] {
    return *reinterpret_cast<float (*)[BM / 2]>(oacc + mt * (BM / 2));
  };
  float sacc[kSAccN];

  // per-row statistics a warpgroup publishes: (warpgroup, {row max, row sum}, row)
  float* sStat = reinterpret_cast<float*>(smem + Tr::kStats);
  auto stat_at = [&](int g, int kind, int hf) { return sStat + (g * 2 + kind) * BM + wq * 16 + qg + 8 * hf; };
  // 16-bit: P of the block in `stage`, in A-fragment order, in the stage's RoPE dim block: k step kk, thread tw's 4
  // registers as one 16-byte word
  auto p_at = [&](int stage) {
    return reinterpret_cast<uint4*>(sKV + stage * Tr::kStageBytes + Tr::kPBlock * kBlockBytes) + tw;
  };

  // S of the block in `stage` over all 576 dims (Q and K from shared memory): the k steps of the stage's early half
  // once it landed, then the late half's once that landed; committed and retired. e4m3: the 18 k32 steps once the
  // block landed (`stage`: the buffer, slot and stage)
  auto s_gemm = [&](int stage, uint32_t parity) {
    const uint64_t kd = arch::wgmma_desc_advance(k_desc0, stage * Tr::kStageBytes);
    arch::wgmma_fence_operand(sacc);
    if constexpr (Tr::kFp8) {
      arch::mbarrier_wait(sFull + stage, parity);  // FULL: the block landed
      arch::fence_proxy_async();  // ... its generic-proxy (cp.async) bytes ordered before the wgmma's reads
      arch::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < Tr::kSKSteps; ++kk)  // a k32 step: 2 chunks of 128 bytes apart
        arch::wgmma_ss<KvT, BN, false>(sacc, arch::wgmma_desc_advance(q_desc, kk * 256),
                                       arch::wgmma_desc_advance(kd, kk * 256), kk > 0);
    } else {
#pragma unroll
      for (int half = 0; half < Tr::kHalves; ++half) {
        if constexpr (kPair) {
          // the cluster: FULL_PEER, the peer's rows of this half landed. It covers this CTA's own rows too: its phase
          // completes with the forwarder's arrival, which follows the forwarder's wait on FULL (those rows landed).
          // Once the late half's peer rows landed, the peer may write its P over the RoPE block they came from: one
          // thread tells it (SENT)
          arch::mbarrier_wait(sFullPeer + Tr::kHalves * stage + half, parity);
          if (half == Tr::kHalves - 1 && tw == 0) arch::mbarrier_arrive_cluster(at_peer(sSent + stage));
        } else {
          arch::mbarrier_wait(sFull + Tr::kHalves * stage + half, parity);  // FULL: this half of the block landed
        }
        arch::fence_proxy_async();  // ... its generic-proxy (cp.async) bytes ordered before the wgmma's reads
        arch::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < Tr::kSKSteps; ++kk) {
          if (Tr::half_of(stage, kk / 4) != half) continue;
          const uint32_t off = (kk / 4) * kBlockBytes + (kk % 4) * 32;  // dim block, then 16 dims (32 bytes) in its line
          // (the first k step issued zeroes the accumulator: dims 0-15 for stage 0, 256-271 for stage 1)
          const bool first = half == 0 && kk == (stage == 0 ? 0 : Tr::kHalfBlocks * 4);
          arch::wgmma_ss<T, BN, false>(sacc, arch::wgmma_desc_advance(q_desc, off), arch::wgmma_desc_advance(kd, off),
                                       !first);
        }
      }
    }
    arch::wgmma_commit();
    arch::wgmma_wait<0>();
    arch::wgmma_fence_operand(sacc);
  };
  // O += P V over this warpgroup's 256 dims of the block in `stage` (A = P from registers), issued, not committed.
  // fence: a wgmma_fence first (the first P V after register writes)
  auto pv_issue = [&](int stage, const uint32_t (&pa)[kPKSteps][4], bool fence) {
    if (fence) arch::wgmma_fence();
    const uint64_t vd = arch::wgmma_desc_advance(pvb_desc0, stage * Tr::kStageBytes);
#pragma unroll
    for (int kk = 0; kk < kPKSteps; ++kk)
      arch::wgmma_rs<T, Tr::kODV, true>(oacc, pa[kk], arch::wgmma_desc_advance(vd, kk * 2 * kAtom), true);
  };
  // e4m3: O^T += V^T P^T over this warpgroup's 256 dims of the block in buffer `buf` (sm90/pv_swap.cuh): each k32
  // step, warp wq's A fragments of its 16 dims of each m64 tile (dims 256 wg + 64 mt + 16 wq ..., lane l passing token
  // 32 kk + l's chunk) from the stage's rows, then 4 wgmma m64n64k32 (B: P^T of the buffer), committed a step. At most
  // two steps in flight (wgmma_wait<1> before a step's fragments): their A registers stay live until retired, and four
  // steps' (64) beside O^T's 128 left ptxas too few (it serialized the wgmmas and spilled)
  auto pv_swap = [&](int buf) {
    const unsigned char* rows = sKV + buf * Tr::kStageBytes + (wg * Tr::kODV / 16 + wq) * 128 + (lane & 7) * 16;
    const uint64_t pd = arch::wgmma_desc_advance(pvb_desc0, buf * Tr::kPBytes);
#pragma unroll
    for (int kk = 0; kk < kPKSteps; ++kk) {
      arch::wgmma_wait<1>();
      uint32_t a[Tr::kOTiles][4];
      const unsigned char* tok = rows + ((Tr::kKStep * kk + lane) >> 3) * Tr::kGroupBytes;
#pragma unroll
      for (int mt = 0; mt < Tr::kOTiles; ++mt) vt_a_fragment_e4m3(a[mt], tok + mt * (64 / 16) * 128);
      arch::wgmma_fence();
#pragma unroll
      for (int mt = 0; mt < Tr::kOTiles; ++mt)
        arch::wgmma_rs<KvT, BM, false>(o_tile(mt), a[mt], arch::wgmma_desc_advance(pd, kk * 256), true);
      arch::wgmma_commit();
    }
  };
  // the scores of block `blk` (from sacc) in log2 units, masked; and their row maxima over the quad
  auto scores = [&](int blk, float (&s)[kSAccN], float (&tmax)[2]) {
#pragma unroll
    for (int e = 0; e < kSAccN; ++e) s[e] = sacc[e] * scale_log2[(e % 4) >> 1];
    const int tok0 = range.begin + blk * BN;
    if (h::tile_needs_mask(tok0, BN, prefix, range.end)) {  // sass-model: cold
      mask_m64_scores<kSAccN, kMaskStage>(p, s, tok0, qt, prefix, range.end, smask_row, my_mask);
    }
    tmax[0] = tmax[1] = h::neg_inf();
#pragma unroll
    for (int e = 0; e < kSAccN; ++e) tmax[(e % 4) >> 1] = arch::max_f(tmax[(e % 4) >> 1], s[e]);
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      tmax[hf] = arch::max_f(tmax[hf], arch::shfl_xor(tmax[hf], 1));
      tmax[hf] = arch::max_f(tmax[hf], arch::shfl_xor(tmax[hf], 2));
    }
  };
  // P = exp2(s - the reference max) as A fragments (step kk: n8 blocks 2kk, 2kk + 1), and its row sums
  auto probs = [&](float (&s)[kSAccN], uint32_t (&pa)[kPKSteps][4], float (&rsum)[2]) {
    float mref[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) mref[hf] = h::softmax_ref_max(m_run[hf]);
    rsum[0] = rsum[1] = 0.f;
#pragma unroll
    for (int e = 0; e < kSAccN; ++e) {
      s[e] = arch::exp2_approx(s[e] - mref[(e % 4) >> 1]);
      rsum[(e % 4) >> 1] += s[e];
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      rsum[hf] += arch::shfl_xor(rsum[hf], 1);
      rsum[hf] += arch::shfl_xor(rsum[hf], 2);
    }
    // e4m3 (k32 steps): a[r] of step kk holds row half r % 2, k 4 qt + 16 (r / 2) .. + 3, i.e. tokens 32 kk + 16 (r / 2)
    // + 2 qt + {0, 1, 8, 9} (fp8_pv_token_of_k, where V^T has them): the scores e = 16 kk + 8 (r / 2) + 2 (r % 2) + {0,
    // 1, 4, 5}, x kPScale (P <= 1 by the exact max)
#pragma unroll
    for (int kk = 0; kk < kPKSteps; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        if constexpr (Tr::kFp8) {
          const int e = 16 * kk + 8 * (r >> 1) + 2 * (r & 1);
          constexpr float ps = Tr::kPScale;
          pa[kk][r] = arch::cvt_e4m3x4(s[e] * ps, s[e + 1] * ps, s[e + 4] * ps, s[e + 5] * ps);
        } else {
          pa[kk][r] = arch::pack2<T>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
        }
      }
  };
  // one block's step of the running max and sum (both warpgroups run the same steps in the same order). 16-bit P:
  // the lazy max (P <= 2^8); e4m3: the exact max (P <= 1, stored x kPScale; v2's choice)
  auto update = [&](const float (&tmax)[2], float (&alpha)[2]) {
    constexpr float kSlack = Tr::kFp8 ? 0.f : 8.f;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) alpha[hf] = h::lazy_softmax_update(m_run[hf], tmax[hf], kSlack, Exp2Fast{});
  };
  auto add_sum = [&](const float (&rsum)[2], const float (&alpha)[2]) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) l_run[hf] = l_run[hf] * alpha[hf] + rsum[hf];
  };
  auto rescale_o = [&](const float (&alpha)[2]) {
    // sass-model: cold (16-bit, the lazy max: almost never; e4m3, the exact max: when a block raises a row's max, ~ln n
    // times in n blocks of i.i.d. scores)
    if (arch::any(alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int i = 0; i < kOAccN; ++i) oacc[i] *= alpha[(i % 4) >> 1];
    }
  };
  auto publish_stats = [&](const float (&tmax)[2], const float (&rsum)[2]) {
    if (qt == 0) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) *stat_at(wg, 0, hf) = tmax[hf], *stat_at(wg, 1, hf) = rsum[hf];
    }
  };
  auto fetch_stats = [&](float (&tmax)[2], float (&rsum)[2]) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) tmax[hf] = *stat_at(1 - wg, 0, hf), rsum[hf] = *stat_at(1 - wg, 1, hf);
  };
  // 16-bit: P in A-fragment order into the stage's RoPE block (p_at), its row max and sum beside it
  auto publish = [&](int stage, const uint32_t (&pa)[kPKSteps][4], const float (&tmax)[2], const float (&rsum)[2]) {
    uint4* dst = p_at(stage);
#pragma unroll
    for (int kk = 0; kk < kPKSteps; ++kk)
      arch::st_shared(dst + kk * 128, make_uint4(pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3]));
    // the cluster: the peer's bulk copy (the async proxy) refills this RoPE block once the other warpgroup releases
    // it, so this thread's proxy fence before the hand-off that leads there, or these generic stores may land after
    // the copy's (this CTA's own producer refills by cp.async, the generic proxy, which needs none). The knockouts
    // that leave rows uncopied (kKoNoLoad, kKoHalfRows): the next S's wgmma reads these bytes as K, so the same fence
    if constexpr (kPair || (kKnockout & (kKoNoLoad | kKoHalfRows))) arch::fence_proxy_async();
    publish_stats(tmax, rsum);
  };
  // 16-bit: the other warpgroup's P from `stage` (after its hand-off)
  auto fetch_p = [&](int stage, uint32_t (&pb)[kPKSteps][4]) {
    const uint4* src = p_at(stage);
#pragma unroll
    for (int kk = 0; kk < kPKSteps; ++kk) {
      const uint4 v = src[kk * 128];
      pb[kk][0] = v.x, pb[kk][1] = v.y, pb[kk][2] = v.z, pb[kk][3] = v.w;
    }
  };
  // e4m3: P as P^T, the B operand, into buffer `buf`'s P (traits_v3.h: row n, k position kappa at (n / 8) kPSbo +
  // (kappa / 16) 128 + 16 (n % 8) + kappa % 16): A register r of step kk is row wq 16 + qg + 8 (r % 2), k 32 kk + 16
  // (r / 2) + 4 qt .. + 3, one 4-byte word (a warp's store: 8 rows x 16 bytes, 128 bytes in a row); its row max and
  // sum, and the block's alpha of its rows, beside it; then this thread's proxy fence (the stores, generic proxy,
  // before the wgmma's async-proxy reads that a later barrier orders)
  [[maybe_unused]] float* sAlpha = reinterpret_cast<float*>(smem + Tr::kAlpha);
  auto publish_pt = [&](int buf, const uint32_t (&pa)[kPKSteps][4], const float (&tmax)[2], const float (&rsum)[2],
                        const float (&alpha)[2]) {
    unsigned char* dst = smem + Tr::kP + buf * Tr::kPBytes + ((wq * 16 + qg) >> 3) * Tr::kPSbo + (qg & 7) * 16 + 4 * qt;
#pragma unroll
    for (int kk = 0; kk < kPKSteps; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r)
        arch::st_shared(dst + (r & 1) * Tr::kPSbo + (2 * kk + (r >> 1)) * 128, pa[kk][r]);
    publish_stats(tmax, rsum);
    if (qt == 0) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) sAlpha[wg * BM + wq * 16 + qg + 8 * hf] = alpha[hf];
    }
    arch::fence_proxy_async();
  };
  // e4m3: O^T's columns (rows 8 j + 2 qt, + 1 of this thread) times the factors f[row] (BM floats: a warpgroup's
  // alphas, published by the row's softmax), when any the warp reads differs from 1 (its lanes read all 64 rows; the
  // exact max: a block that raised a row's max). wait: retire this warp's P V first (it is in flight only then)
  auto scale_cols = [&](const float* f, bool wait) {
    float c[BM / 8][2];
    bool one = true;
#pragma unroll
    for (int j = 0; j < BM / 8; ++j) {
      const float2 v = *reinterpret_cast<const float2*>(f + 8 * j + 2 * qt);
      c[j][0] = v.x, c[j][1] = v.y;
      one = one && v.x == 1.f && v.y == 1.f;
    }
    // (cold for the model, yet taken when a block raises the max of any of the CTA's 64 rows: most of a split's
    // blocks, ~64 ln n of n for i.i.d. scores. Read as always taken, the model gives the same time: shared memory binds)
    if (arch::any(!one)) {  // sass-model: cold
      if (wait) {
        arch::wgmma_wait<0>();
        arch::wgmma_fence_operand(oacc);
      }
#pragma unroll
      for (int i = 0; i < kOAccN; ++i) oacc[i] *= c[(i % (BM / 2)) / 4][i & 1];
    }
  };
  // the other warpgroup's block (bar.sync on its hand-off: P0 or P1), its step of the running max and sum replayed
  // (16-bit: its P then from fetch_p)
  auto take_stats = [&](int bar, float (&a)[2]) {
    float otmax[2], orsum[2];
    arch::named_barrier_sync(bar, Tr::kThreads);
    fetch_stats(otmax, orsum);
    update(otmax, a);
    add_sum(orsum, a);
  };
  // this warp has no wgmma left that reads this half of the stage: one lane frees it for the producer
  auto release = [&](int stage, int half) {
    arch::mbarrier_arrive_warp(sEmpty + Tr::kHalves * stage + half);
    // the cluster: the peer's producer refills its half of this CTA's stage too
    if constexpr (kPair) arch::mbarrier_arrive_cluster_warp(at_peer(sEmpty + Tr::kHalves * stage + half));
  };
  // the cluster: before this warpgroup's P overwrites the RoPE block of `stage`, the rows this CTA forwarded from it
  // have landed in the peer (SENT; every thread waits, each writes P)
  [[maybe_unused]] auto wait_sent = [&](int stage, uint32_t parity) {
    if constexpr (kPair) arch::mbarrier_wait(sSent + stage, parity);
  };

  if constexpr (Tr::kFp8) {
    // ---- e4m3 main loop: one pair of blocks an iteration, pair i in slot i % 2 (WG0: block 2i in buffer b0, WG1:
    // 2i + 1 in b1), its barriers' phase i / 2. P V swapped (pv_swap): each warpgroup's O^T += V^T P^T, V^T from the
    // stage's rows (ldmatrix), P^T from the P buffers ----
    for (int i = 0; i < npairs; ++i) {  // sass-model: tile-loop tiles=2
      const uint32_t parity = static_cast<uint32_t>(i >> 1) & 1u;
      const int b0 = i % Tr::kSlots * STAGES, b1 = b0 + 1;
      float s[kSAccN], tmax[2], rsum[2], a0[2], a1[2];
      uint32_t pa[kPKSteps][4];
      // (as the 16-bit loop's: the pair's second block past the split's end, run without a wgmma or a hand-off)
      const bool phantom = 2 * i + 1 >= ntiles;
      if (wg == 0) {
        s_gemm(b0, parity);  // block 2i (its FULL wait)
        scores(2 * i, s, tmax);
        update(tmax, a0);
        probs(s, pa, rsum);
        add_sum(rsum, a0);
        // P0^T, its max, sums and alphas (fenced) for both warpgroups: WG1 (bar.arrive P0), and this warpgroup's own
        // P0 V0L (its own barrier: every warp's stores in). The P buffer was last read by pair i - 2's P V, retired
        // before the hand-offs of pair i - 1
        publish_pt(b0, pa, tmax, rsum, a0);
        arch::named_barrier_arrive(kV3P0Barrier, Tr::kThreads);
        arch::named_barrier_sync(kV3WgBarrier, 128);
        scale_cols(sAlpha, false);  // O_L a0 (its P V of pair i - 1 retired)
        arch::wgmma_fence_operand(oacc);
        pv_swap(b0);  // O_L^T += V0L^T P0^T
        arch::mbarrier_arrive_warp(sEmpty + b0);  // block 2i's rows: this warp's S retired, its fragments loaded
        if (!phantom) {  // sass-model: real
          arch::mbarrier_wait(sFull + b1, parity);  // block 2i + 1 landed (before this warp reads its rows)
          take_stats(kV3P1Barrier, a1);             // WG1's P1, max and sums
          scale_cols(sAlpha + BM, true);            // O_L a1 (WG1's alphas: the same running max), P0 V0L retired
          pv_swap(b1);  // O_L^T += V1L^T P1^T
          arch::mbarrier_arrive_warp(sEmpty + b1);
        }
        arch::wgmma_wait<0>();
        arch::wgmma_fence_operand(oacc);
      } else if (phantom) {  // sass-model: phantom
        // no S1, no P1 (nor its hand-off), no P1 V1R: P0 V0R alone. The block's zero rows still must have landed (no
        // copy into the stage outlives the block), and with them block 2i's (as below)
        arch::mbarrier_wait(sFull + b1, parity);
        take_stats(kV3P0Barrier, a0);  // WG0's P0, max, sums and alphas
        scale_cols(sAlpha, false);     // O_R a0
        arch::mbarrier_wait(sFull + b0, parity);
        arch::wgmma_fence_operand(oacc);
        pv_swap(b0);  // O_R^T += V0R^T P0^T
        arch::mbarrier_arrive_warp(sEmpty + b0);
        arch::wgmma_wait<0>();
        arch::wgmma_fence_operand(oacc);
      } else {  // sass-model: real
        s_gemm(b1, parity);  // block 2i + 1
        scores(2 * i + 1, s, tmax);
        take_stats(kV3P0Barrier, a0);  // WG0's P0, max, sums and alphas
        update(tmax, a1);
        probs(s, pa, rsum);
        add_sum(rsum, a1);
        // O_R a0 (its P V of pair i - 1 retired): WG0's alphas, read before bar.arrive P1 (WG0 rewrites them after its
        // bar.sync on P1), and once the scores are P (32 registers fewer beside O)
        scale_cols(sAlpha, false);
        // P1^T, max, sums and alphas out for WG0 (bar.arrive P1) and this warpgroup's own P1 V1R (its barrier)
        publish_pt(b1, pa, tmax, rsum, a1);
        arch::named_barrier_arrive(kV3P1Barrier, Tr::kThreads);
        arch::named_barrier_sync(kV3Wg1Barrier, 128);
        arch::mbarrier_wait(sFull + b0, parity);  // block 2i landed (implied by b1's: each producer thread copies a
                                                  // pair's first block before its second; kept explicit)
        arch::wgmma_fence_operand(oacc);
        pv_swap(b0);  // O_R^T += V0R^T P0^T, at the max of block 2i
        arch::mbarrier_arrive_warp(sEmpty + b0);
        scale_cols(sAlpha + BM, true);  // O_R a1 (its own alphas), P0 V0R retired first
        pv_swap(b1);  // O_R^T += V1R^T P1^T
        arch::mbarrier_arrive_warp(sEmpty + b1);
        arch::wgmma_wait<0>();
        arch::wgmma_fence_operand(oacc);
      }
    }
  } else {
    // ---- main loop: one pair of blocks an iteration (WG0: block 2i in stage 0, WG1: 2i + 1 in stage 1) ----
    for (int i = 0; i < npairs; ++i) {  // sass-model: tile-loop tiles=2
      const uint32_t parity = static_cast<uint32_t>(i) & 1u;
      float s[kSAccN], tmax[2], rsum[2], a0[2], a1[2];
      uint32_t pa[kPKSteps][4], pb[kPKSteps][4];
      // the pair's second block lies past the split's end (an odd block count): warpgroup 1's block is zeros with every
      // score masked, so its P is 0 and its max -inf. Neither warpgroup runs a wgmma on it nor hands its P over; the
      // FULL waits stay as in any pair, the EMPTY arrivals as far as they are safe (block-uniform)
      const bool phantom = 2 * i + 1 >= ntiles;
      if (wg == 0) {
        s_gemm(0, parity);  // block 2i: stage 0's L half (dims 0-255), then its R half and RoPE
        scores(2 * i, s, tmax);
        update(tmax, a0);
        probs(s, pa, rsum);
        add_sum(rsum, a0);
        // every warp of this warpgroup has retired its S, which read the RoPE dims P0 is about to overwrite (a warp's
        // wgmma wait covers its own part of the warpgroup's wgmma only). Warpgroup 1 needs no such barrier: its bar.sync
        // on P0 below already waits for all of its warps, each past its S
        arch::named_barrier_sync(kV3WgBarrier, 128);
        wait_sent(0, parity);
        publish(0, pa, tmax, rsum);
        arch::named_barrier_arrive(kV3P0Barrier, Tr::kThreads);  // P0, its max and sums out for WG1
        rescale_o(a0);
        arch::wgmma_fence_operand(oacc);
        pv_issue(0, pa, true);  // O_L = O_L a0 + P0 V0L (stage 0's early half)
        arch::wgmma_commit();
        arch::wgmma_fence_operand(oacc);
        if (phantom) {  // sass-model: phantom
          // (no block 2i + 1: no P1 to take, nor P1 V1L). Stage 1's late half is not released: no refill follows the
          // last pair, and with no wait on that half's FULL before it, this warpgroup could
          // complete the half's EMPTY phase of this pair before the producer's wait on the phase before it, which would
          // then wait for a parity the barrier has moved past (the emulator's warp-ahead schedules deadlocked so)
          arch::wgmma_wait<0>();  // P0 V0L retired
          arch::wgmma_fence_operand(oacc);
          release(0, 0);
        } else {  // sass-model: real
          take_stats(kV3P1Barrier, a1);  // WG1's P1, max and sums
          fetch_p(1, pb);
          arch::wgmma_wait<0>();  // P0 V0L retired: O may be rescaled, stage 0's L half is read no more
          arch::wgmma_fence_operand(oacc);
          release(0, 0);  // (only this warpgroup reads stage 0's L half: the producer refills it for pair i + 1)
          rescale_o(a1);
          pv_issue(1, pb, true);  // O_L = O_L a1 + P1 V1L (stage 1's late half)
          arch::wgmma_commit();
          arch::wgmma_wait<0>();
          arch::wgmma_fence_operand(oacc);
          // stage 1's L half and RoPE: its last reader (warpgroup 1's S1 and P1 came before P1 out)
          release(1, 1);
        }
      } else if (phantom) {  // sass-model: phantom
        // the pair's second block lies past the split's end: no S1, no P1 (nor its hand-off: warpgroup 0 skips its
        // bar.sync), no P1 V1R; only P0 V0R. The block's (zero) rows still must have landed, so that no copy into the
        // stage outlives its readers, and with them (each producer thread copies a pair's stage 0 before its stage 1)
        // stage 0's rows, which this warpgroup reads (P0 V0R)
#pragma unroll
        // (the cluster: FULL_PEER, which covers both CTAs' rows, as in s_gemm; no SENT: no P1)
        for (int half = 0; half < Tr::kHalves; ++half)
          arch::mbarrier_wait((kPair ? sFullPeer : sFull) + Tr::kHalves * 1 + half, parity);
        arch::fence_proxy_async();  // (as s_gemm's: the landed rows ordered before this warpgroup's wgmma reads)
        take_stats(kV3P0Barrier, a0);  // WG0's P0, max and sums
        fetch_p(0, pb);
        rescale_o(a0);
        arch::wgmma_fence_operand(oacc);
        pv_issue(0, pb, true);  // O_R += P0 V0R (stage 0's late half)
        arch::wgmma_commit();
        arch::wgmma_wait<0>();
        arch::wgmma_fence_operand(oacc);
        release(1, 0), release(0, 1);  // (as in any pair)
      } else {  // sass-model: real
        s_gemm(1, parity);  // block 2i + 1: stage 1's R half, then its L half and RoPE
        scores(2 * i + 1, s, tmax);
        take_stats(kV3P0Barrier, a0);  // WG0's P0, max and sums
        fetch_p(0, pb);
        update(tmax, a1);    // this block's
        probs(s, pa, rsum);
        add_sum(rsum, a1);
        wait_sent(1, parity);
        publish(1, pa, tmax, rsum);
        arch::named_barrier_arrive(kV3P1Barrier, Tr::kThreads);  // P1, its max and sums out for WG0
        float a01[2] = {a0[0] * a1[0], a0[1] * a1[1]};
        rescale_o(a01);
        if (arch::any(a1[0] != 1.f || a1[1] != 1.f)) {  // sass-model: cold (P0 to the pair's max)
#pragma unroll
          for (int kk = 0; kk < kPKSteps; ++kk)
#pragma unroll
            for (int r = 0; r < 4; ++r) {  // A register r: row half r % 2
              float lo, hi;
              arch::unpack2<T>(pb[kk][r], lo, hi);
              pb[kk][r] = arch::pack2<T>(lo * a1[r & 1], hi * a1[r & 1]);
            }
        }
        arch::wgmma_fence_operand(oacc);
        pv_issue(1, pa, true);  // O_R += P1 V1R (stage 1's early half)
        arch::wgmma_commit();
        pv_issue(0, pb, false);  // O_R += P0 V0R (stage 0's late half)
        arch::wgmma_commit();
        arch::wgmma_wait<1>();  // P1 V1R retired: stage 1's R half is read no more
        release(1, 0);
        arch::wgmma_wait<0>();
        arch::wgmma_fence_operand(oacc);
        release(0, 1);  // stage 0's R half and RoPE (P0 fetched before, S0 retired before P0 out)
      }
    }
  }
  arch::launch_dependents();  // the combine may start launching; it waits for this grid's writes

  // ---- epilogue: this thread's rows, its warpgroup's columns 8j + 2 qt, +1. e4m3: O^T, summed from P x kPScale on
  // V's codes: each row's 1 / l (times the scales) from the row's softmax thread through shared memory (the
  // warpgroup's own barrier), then this thread's columns (rows 8 j + 2 qt, + 1) at dims 2 qg, + 1 of its 16 in each
  // m64 tile (vt_dim_of_row), and the lse from the rows' threads ----
  if constexpr (Tr::kFp8) {
    float* inv = reinterpret_cast<float*>(smem + Tr::kInvL) + wg * BM;
    const float vscale = kv_scale(p.v_scale_ptr, p.v_scale) / Tr::kPScale;
    if (qt == 0) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) inv[wq * 16 + qg + 8 * hf] = h::row_inv_l(l_run[hf]) * vscale;
    }
    if (wg == 0)
      arch::named_barrier_sync(kV3WgBarrier, 128);
    else
      arch::named_barrier_sync(kV3Wg1Barrier, 128);
    static_assert(vt_dim_of_row(8) == 1 && vt_dim_of_row(1) == 2, "O^T rows qg, qg + 8: dims 2 qg, 2 qg + 1");
    store_m64_cols<T, Tr::kOTiles>(p, num_splits, split, row0, nrows, qo_begin, kvh, qt, wg * Tr::kODV + wq * 16 + 2 * qg,
                                   oacc, inv);
    store_m64_rows<T, kOAccN, false>(p, num_splits, split, row0, nrows, qo_begin, kvh, wq, qg, 0, wg == 0 && qt == 0,
                                     oacc, m_run, l_run, 1.f);
  } else {
    store_m64_rows<T, kOAccN>(p, num_splits, split, row0, nrows, qo_begin, kvh, wq, qg, wg * Tr::kODV + 2 * qt,
                              wg == 0 && qt == 0, oacc, m_run, l_run, 1.f);
  }
  // the cluster: neither CTA leaves while the other may still arrive on its barriers (its last releases, SENT)
  if constexpr (kPair) arch::cluster_sync();
}

}  // namespace va::tv
