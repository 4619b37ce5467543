// Tile configurations and head shapes of the kernel family (compile-time).
//
// A tile config fixes the CTA's work split:
//   BM rows (tree nodes x group heads of one KV head) = 16 * WM warps along M;
//   BN KV tokens per mainloop tile; the WN warps that share 16 rows split the
//   tile's tokens for S = Q K^T and the Dv columns for O += P V (so a 512-wide
//   fp32 accumulator is spread over WN warps);
//   STAGES cp.async pipeline stages.
// The kernels' sizes must match verify_attn/backends/cuda.py TILES (tests compare
// them through the host module).
#pragma once

#include "../host/common.h"
#include "sm90/tile_v3.h"  // kernel v3 for Hopper (issue 40): TileConfigV3

namespace va::tv {

template <int BM_, int BN_, int WM_, int WN_, int STAGES_>
struct TileConfig {
  static constexpr int BM = BM_;          // rows per CTA
  static constexpr int BN = BN_;          // KV tokens per tile
  static constexpr int WM = WM_;          // warps along M (16 rows each)
  static constexpr int WN = WN_;          // warps sharing the same 16 rows
  static constexpr int STAGES = STAGES_;  // cp.async stages
  static constexpr int kWarps = WM * WN;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kLaunchWarps = kWarps;

  static constexpr int kVersion = 0;       // the v0 kernel (tree_verify_kernel.cuh)
  static_assert(BM == 16 * WM, "BM must be 16 rows per M warp");
  static_assert(BN % (8 * WN) == 0, "each of the WN warps needs whole n8 tiles of the KV tile");
  static_assert(BN % 16 == 0, "BN is the K dim of P V: multiple of 16");
  static_assert(STAGES >= 2 && STAGES <= 8, "2..8 pipeline stages");
  static_assert(kThreads % BN == 0, "the KV loader gives each tile row kThreads / BN threads");
};

// Tile of the v1 kernel (tree_verify_kernel_v1.cuh): BM rows (16 per m tile), BN
// KV tokens per tile, W warps, STAGES cp.async stages (>= 3: the pipeline reads
// tiles i and i+1 while later ones load), and the warp grid of S = Q K^T:
// KSPLIT warps split Dqk (each keeps Q for its dims in registers), SN warps split
// the tile's tokens, W / (KSPLIT * SN) warps split the m tiles. For O += P V
// every warp owns Dv / W columns of all rows.
// FP8_MMA (e4m3 caches only): 1, S and P.V on e4m3 MMAs (Q and P rounded to e4m3); 0, K and V
// converted to f16 in registers and both products on f16 MMAs (Q and P exact up to f16).
// BARS: CTA barriers per KV tile. 2: iteration i computes S(i+1), then PV(i) with the softmax of
// i+1 after a second barrier. 1: iteration i runs S(i+2), the softmax of i+1 and PV(i) between
// the same two barriers (the partial scores double-buffered, STAGES >= 4: tiles i .. i+2 are read
// while i+3 loads), so the tensor pipe drains once per tile instead of twice.
// LOADER: 0, every loader thread copies its 16-byte chunks of a row with cp.async (72 LSU requests per
// 1,152-byte MLA row); 1, one thread per row issues one bulk copy (cp.async.bulk, the TMA unit) of the
// whole row completing on the stage's mbarrier (sm_90 and sm_120; the H200's KV stream probe found the
// warps paying ~0.45 SM cycles per 16-byte cp.async, NOTES.md); 2, kernel v3 (issue 39): warp roles, as
// FlashInfer's sm_120 sparse-MLA decode. W math warps and one producer warp (32 W + 32 threads): the producer's
// lane r issues one cp.async.bulk per tile for KV row r on the stage's FULL mbarrier (BN arrivals + the bytes);
// each math warp frees a stage on its EMPTY mbarrier (W arrivals, one elected lane per warp) once it has read it;
// the math warps exchange partial scores and P on named barrier 1 (32 W threads), never a CTA-wide barrier in
// the main loop, and issue no copy there. Its loop takes one tile at a time (S, softmax, PV between two named
// barriers: BARS 2), so the math warps hold one stage and STAGES - 1 tiles are in flight: 9 warps cap every
// thread at 168 registers (3 warps on one of the SM's 4 schedulers). MLA rows (16-bit, e4m3, 656-byte). The tile
// is selected by its block's warps, kLaunchWarps = W + 1 (m32n16w9s4: 8 math warps and the producer).
// 3, kernel v3 with a producer warpgroup: the same roles, but the producer is a whole warpgroup (warps W .. W + 3;
// each of its four warps issues the copies of a quarter of every tile's rows) that lowers its registers with
// setmaxnreg.dec (kProducerRegs) so the math warpgroups can raise theirs (setmaxnreg.inc, kMathRegs: 232 at 384
// threads, sm_90a and sm_120a). With 232 registers the math warps run v1's two-tile loop: S(i+1) under PV(i), Q for
// two m tiles (Dqk split 4 x tokens 2), two held stages and STAGES - 2 in flight. kLaunchWarps = W + 4 (m32n16w12s4).
// 4, kernel v3 with a producer warpgroup and math roles: W = 16 math warps, warps 0-7 run S and the softmax (KSPLIT x SN
// = 8: each both m tiles, as LOADER 3's), warps 8-15 run P V (each Dv / 8 columns of all rows), P double-buffered
// between them on named barriers, so the softmax of tile i runs while P V of i - 1 keeps the tensor pipe busy.
// 20 warps: setmaxnreg moves the launch's 96 registers to 32 (producer) and 112 (math). kLaunchWarps = W + 4.
template <int BM_, int BN_, int W_, int STAGES_, int KSPLIT_, int SN_, int FP8_MMA_ = 1, int BARS_ = 2,
          int LOADER_ = 0>
struct TileConfigV1 {
  static constexpr int FP8_MMA = FP8_MMA_;
  static constexpr int BARS = BARS_;
  static constexpr int LOADER = LOADER_;
  static constexpr int BM = BM_;
  static constexpr int BN = BN_;
  static constexpr int STAGES = STAGES_;
  static constexpr int KSPLIT = KSPLIT_;
  static constexpr int SN = SN_;
  static constexpr int kWarps = W_;
  static constexpr int kThreads = 32 * kWarps;
  // the block: + the producer warp (LOADER 2), or + the producer warpgroup (LOADER 3)
  static constexpr int kLaunchWarps = kWarps + (LOADER_ == 2 ? 1 : LOADER_ >= 3 ? 4 : 0);
  static constexpr int kVersion = 1;
  // the tile as the host-side tables spell it: WM x WN warps = (W / KSPLIT) x KSPLIT
  static constexpr int WM = W_ / KSPLIT_;
  static constexpr int WN = KSPLIT_;

  static_assert(BM % 16 == 0, "BM: whole m16 tiles");
  static constexpr int kSWarps = LOADER_ == 4 ? W_ / 2 : W_;  // the warps that compute S (math roles: half)
  static_assert(kSWarps % (KSPLIT * SN) == 0 && (BM / 16) % (kSWarps / (KSPLIT * SN)) == 0,
                "the S warps / (KSPLIT * SN) along M must split the BM / 16 m tiles evenly");
  static_assert(BN % (8 * SN) == 0, "each S warp's tokens must be whole n8 tiles");
  static_assert((BM * BN) % (32 * kWarps) == 0, "the softmax gives every lane the same number of scores");
  static_assert(STAGES >= 3 && STAGES <= 8, "3..8 pipeline stages");
  static_assert(BARS == 2 || (BARS == 1 && STAGES >= 4), "1 barrier per tile needs >= 4 stages, else 2 barriers");
  static_assert(kThreads % BN == 0, "the KV loader gives each tile row kThreads / BN threads");
  static_assert(LOADER >= 0 && LOADER <= 4,
                "LOADER: 0 (cp.async chunks), 1 (a bulk copy per row), 2 (producer warp), 3 (producer warpgroup), 4 "
                "(producer warpgroup, S and PV warps)");
  static_assert(LOADER < 2 || (BARS == 2 && BN <= 32 && kWarps == (LOADER == 4 ? 16 : 8)),
                "producer warp(group) (v3): 8 math warps (16 with roles: 8 S, 8 PV), two barriers per tile, one "
                "producer lane per KV row of a tile");
};

// Tile of the v2 kernel (tree_verify_kernel_v2.cuh, sm_90a only: wgmma). BM = 64 rows, one wgmma m64
// tile; WG warpgroups split Dqk for S = Q K^T (each reads Q for its Dqk / WG dims from shared memory) and
// Dv for O += P V (each owns Dv / WG columns of all 64 rows); BN tokens per KV tile, STAGES cp.async stages.
template <int BM_, int BN_, int WG_, int STAGES_>
struct TileConfigV2 {
  static constexpr int BM = BM_;
  static constexpr int BN = BN_;
  static constexpr int WG = WG_;
  static constexpr int STAGES = STAGES_;
  static constexpr int kWarps = 4 * WG_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kLaunchWarps = kWarps;
  static constexpr int kVersion = 2;
  // the tile as the host-side tables spell it: WM x WN warps = 4 (rows of a warpgroup) x WG
  static constexpr int WM = 4;
  static constexpr int WN = WG_;

  static_assert(BM == 64, "v2: one wgmma m64 tile of rows per CTA");
  static_assert(BN == 16 || BN == 32 || BN == 64, "v2: BN is the N of the S wgmma (16, 32 or 64)");
  static_assert(STAGES >= 3 && STAGES <= 8, "3..8 pipeline stages (tile it + 1 is read while it + 2 lands)");
};

// Head shape: Dqk, Dv and whether V is read from the K row (MLA absorbed).
template <int DQK_, int DV_, bool SHARED_KV_>
struct HeadConfig {
  static constexpr int DQK = DQK_;
  static constexpr int DV = DV_;
  static constexpr bool kSharedKV = SHARED_KV_;
  static_assert(DQK % 16 == 0 && DV % 16 == 0, "head dims must be multiples of 16 (mma k / n pairs)");
  static_assert(!kSharedKV || DV <= DQK, "a shared V is the first Dv columns of the K row");
};

using HeadMLA = HeadConfig<576, 512, true>;   // Kimi K2 / DeepSeek-V3 absorbed MLA
using HeadG64 = HeadConfig<64, 64, false>;
using HeadG128 = HeadConfig<128, 128, false>;
using HeadG256 = HeadConfig<256, 256, false>;

template <class... Tiles>
struct TileList {};

// The tile configs compiled per head shape. Every one fits 99 KB of shared
// memory (sm_120) with no spills at 255 registers (checked by
// `python -m verify_attn.build --report`); the first is the default.
//  MLA: a 576-wide row is 1152 B (+16 B pad). 32 rows x 16 tokens x 3 stages:
//       Q 36.5 KB + KV 54.8 KB; each warp owns 16 rows x 256 Dv columns (128 fp32 regs).
//       16 rows x 32 tokens x 2 stages: Q 18 KB + KV 73 KB; 4 warps split Dv 4 ways.
//  GQA: one warp per 16 rows owns all of Dv; P stays in registers (WN = 1) except d256.
template <class Head> struct TilesFor;
//  MLA v1, two barriers per tile, sm_120's default: 32 rows x 16 tokens x 4 stages, 8 warps, S warps 4
//       (dims) x 2 (tokens): KV 73 KB + one set of partial scores at a 20-float pitch 10 KB + 2 x P + the
//       index ring (2 KB) and 4 staged mask words per row = 92 KB; Q and O in registers. Tiles i and i+1
//       are read while i+2 and i+3 load: two tiles in flight (the one-barrier loop at 4 stages, which
//       needs 99 KB for its second set of scores, keeps one: the model reads 215.5 against 433.0 us on
//       the RTX PRO 6000 at 185k / 16 nodes, NOTES.md).
//  MLA v1, 3 stages, S warps 4 (dims) x 2 (tokens): each K fragment serves both m tiles, halving
//       the shared-memory reads of S (the H200's limit with mma.sync): 73.3 KB.
//  MLA v1 for sm_90 only (199 KB, over sm_120's 99 KB): 32 tokens x 4 stages, one barrier per tile,
//       S warps 4 x 2 (build.py marks its target archs).
//  MLA v1 with the bulk loader, sm_90a only, one barrier per tile, each KV row one cp.async.bulk on the stage's
//       mbarrier: 32 rows x 16 tokens x 8 stages (5 tiles in flight; 176 KB), S warps 4 (dims) x 2 (tokens);
//       32 rows x 32 tokens x 5 stages (2 tiles in flight; 211 KB), S warps 2 (dims) x 2 (tokens) x 2 (M), the
//       Dqk split halved so two sets of partial scores fit beside 5 stages.
//  MLA v2 for sm_90a only (wgmma): 64 rows x 32 tokens x 3 stages, 2 warpgroups (Dqk halves for S, Dv
//       halves for P V): Q 72 KB + KV 108 KB in the core-matrix layout + 2 x 16 KB of partial scores + 1 KB of
//       staged mask words = 213 KB.
//  MLA v3 (LOADER 2, producer warp; sm_120a's candidate, also built for sm_90a): 8 math warps + 1 producer warp,
//       32 rows x 16 tokens x 4 stages, S warps 4 (dims) x 2 (M), one tile at a time: 3 tiles in flight. KV
//       4 x 18,688 B + one set of partial scores 12,288 B + P 1,536 B + alpha, 1/l, lse2 384 B + 8 mask words per
//       row 1,024 B + 8 mbarriers 64 B = 90,048 B. Registers rule the shape: 9 warps put 3 on one of the SM's 4
//       schedulers, whose 16K registers then allow 168 per thread (one producer warp cannot setmaxnreg: it needs
//       whole warpgroups; LOADER 3 below is the warpgroup form): Q for 144 dims of one m tile (36) + O (64) fit,
//       v1's S split 2 x 2 (Q 72) spilled; and the
//       one-tile loop keeps S's and PV's fragments apart (v1's two-tile loop with 5 stages for 3 in flight would
//       need 105,680 B at this split).
using TileMlaV3 = TileConfigV1<32, 16, 8, 4, 4, 1, 1, 2, 2>;
//  MLA v3 with a producer warpgroup (LOADER 3): v1's sm_120 tile and loop (32 rows x 16 tokens x 4 stages, S warps 4
//       (dims) x 2 (tokens), Q 72 registers, two tiles read while two load) on 8 math warps at 232 registers and a
//       producer warpgroup at 40 (12 warps): KV 4 x 18,688 B + partial scores 12,288 + P 1,536 + stats 384 + 8 mask
//       words per row 1,024 + 64 B of mbarriers + the producer's index ring 512 = 90,560 B.
using TileMlaV3Wg = TileConfigV1<32, 16, 8, 4, 4, 2, 1, 2, 3>;
//  MLA v3 with math roles (LOADER 4, 20 warps: the launch gives 96 registers a thread, setmaxnreg moves them to 32 for
//       the producer warpgroup and 112 for the math warps): 8 S warps, S split 2 (dims) x 2 (tokens) x 2 (M) (Q 72
//       registers: 288 dims of one m tile) and the softmax; 8 PV warps, each 64 Dv columns of O (64). KV 4 x 18,688 B +
//       2 sets of partial scores 10,240 (the S warps issue S(i + 1) before the softmax of i: traits.h, kSAhead) + 2 x P
//       3,072 + 2 x alpha, 1/l, lse2 512 + 8 mask words per row 1,024 + 64 B of mbarriers + the producer's index ring
//       512 = 90,176 B. (The split 4 (dims) x 2 (tokens) over both m tiles, the same Q
//       registers, exchanged twice the partial scores: the model read the RTX PRO 6000 at 1,501 cycles a tile against
//       1,271 with this one; NOTES.md.)
using TileMlaV3Roles = TileConfigV1<32, 16, 16, 4, 2, 2, 1, 2, 4>;
//  MLA v3 for Hopper (sm_90a only; sm90/tile_v3.h): 64 rows x 64-token swizzled blocks x 2 stages, a producer
//       warpgroup + two consumer warpgroups on FlashMLA's seesaw: Q 72 KB + 2 x 72 KB + stats, mask words and
//       8 mbarriers (FULL and EMPTY per stage half) 3 KB = 224,320 B.
using TileMlaV3Sm90 = TileConfigV3<64, 64, 2>;
//  ... as a 2-CTA cluster (sm90/tile_v3.h): the two 64-row CTAs of a split each gather half of every block's rows and
//       forward them to the other through distributed shared memory; + 6 mbarriers (FULL_PEER per stage half, SENT
//       per stage) = 224,368 B a CTA. 16-bit caches only.
using TileMlaV3Sm90Cluster = TileConfigV3<128, 64, 2>;
template <> struct TilesFor<HeadMLA> {
  using type = TileList<TileConfigV1<32, 16, 8, 4, 4, 2>, TileConfigV1<32, 16, 8, 3, 4, 2>,
                        TileConfigV1<32, 32, 8, 4, 4, 2, 1, 1>,
                        TileConfig<32, 16, 2, 2, 3>, TileConfig<16, 32, 1, 4, 2>,
                        TileConfigV2<64, 32, 2, 3>, TileConfigV1<32, 16, 8, 8, 4, 2, 1, 1, 1>,
                        TileConfigV1<32, 32, 8, 5, 2, 2, 1, 1, 1>, TileMlaV3, TileMlaV3Wg, TileMlaV3Roles,
                        TileMlaV3Sm90, TileMlaV3Sm90Cluster>;
};
// e4m3 caches (MLA only): kernel v1 with e4m3 MMAs (m16n8k32) for S and P.V. A 32-token tile is one
// k step of P.V; a 576-byte row (+16 B pad) makes a 32-token stage 18.5 KB, so 4 stages, two barriers
// per tile: one set of 2 x 32 x 36 fp32 partial scores, e4m3 P and 512 B of staged mask words beside
// them, and two tiles in flight (the one-barrier loop's second score set filled 98.1 KB and left one).
// S warps 2 (dims: 288 = 9 k steps) x 2 (tokens) x 2 (M).
template <class Head> struct TilesForFp8 { using type = TileList<>; };
//  The second tile converts K / V to f16 in registers (F2FP on sm_90 and sm_120) and keeps Q and P in
//  f16: the H200's fp8 tile (its mma.sync has no e4m3 rate) and the accurate one on sm_120. 3 stages,
//  75.6 KB.
using TileFp8F16 = TileConfigV1<32, 32, 8, 3, 2, 2, 0>;
//  Kernel v3 on e4m3 rows (issue 39): the e4m3-MMA tile's math (32 tokens, S warps 2 x 2 x 2, Q 36 registers) on 8
//  math warps + 1 producer warp whose lanes copy one 576-byte row each (cp.async.bulk on FULL), one tile at a time:
//  4 x 18,944 B of KV + partial scores 10,240 + P 1,536 + stats and Q scales 512 + 8 mask words per row 1,024 + 64 B
//  of mbarriers + the producer's index ring 512 = 89,664 B, 3 tiles in flight.
using TileMlaV3Fp8 = TileConfigV1<32, 32, 8, 4, 2, 2, 1, 2, 2>;
//  ... and with the producer warpgroup (LOADER 3): v1's e4m3 tile and two-tile loop at 232 registers, 89,664 B.
using TileMlaV3WgFp8 = TileConfigV1<32, 32, 8, 4, 2, 2, 1, 2, 3>;
//  ... and with math roles (LOADER 4): 8 S warps, S split 2 (dims) x 2 (tokens) x 2 (M) as the 8-warp tile's (Q 36
//  registers of e4m3 codes; over both m tiles, Q 72, ptxas spilled at 112), the softmax; 8 PV warps, 64 Dv columns each:
//  89,664 B + a second P and alpha buffer + a second set of partial scores at pitch 36 (kSAhead) = 99,520 B.
using TileMlaV3RolesFp8 = TileConfigV1<32, 32, 16, 4, 2, 2, 1, 2, 4>;
//  ... and Hopper's v3 (TileMlaV3Sm90, sm_90a only) on wgmma .e4m3: Q 36 KB + 2 stages of 36 KB (core-matrix layout) +
//  stats and mask words 3 KB + 2 V^T buffers of 36 KB (the producer transposes each block's V) + 2 e4m3 P buffers of
//  4 KB + Q's row scales + 12 mbarriers = 195,936 B.
template <> struct TilesForFp8<HeadMLA> {
  using type = TileList<TileConfigV1<32, 32, 8, 4, 2, 2>, TileFp8F16, TileConfigV2<64, 32, 2, 4>, TileMlaV3Fp8,
                        TileMlaV3WgFp8, TileMlaV3RolesFp8, TileMlaV3Sm90>;
};
// GQA d128 with e4m3 caches: kernel v1's f16 tile (K / V codes to f16 in registers, Q and P in f16), V rows
// apart from K's: 32 rows x 32 tokens, S split 2 (dims: 64 = 2 steps of 32) x 2 (tokens) x 2 (M), every warp 16
// Dv columns of all rows. A stage is 9 KB, so 6 stages (4 tiles in flight, 75 KB) are the default; the 3-stage
// tile (one in flight) stays compiled.
template <> struct TilesForFp8<HeadG128> { using type = TileList<TileConfigV1<32, 32, 8, 6, 2, 2, 0>, TileFp8F16>; };
// GQA d256 with e4m3 caches: the same tile (S dims per warp: 128 = 4 steps of 32; every warp 32 Dv columns) at 4
// stages (17 KB each; 87 KB, two tiles in flight; 5 would pass sm_120's 99 KB), and at 3.
template <> struct TilesForFp8<HeadG256> { using type = TileList<TileConfigV1<32, 32, 8, 4, 2, 2, 0>, TileFp8F16>; };
// GQA d64 with e4m3 caches: the f16 tile on 4 warps (8 would leave each 8 Dv columns, under an n16 pair): S split
// 2 (dims: 32 = one step) x 2 (tokens), both m tiles per warp; every warp 16 Dv columns of all rows; 6 stages of
// 4.6 KB (49 KB). Its splits merge in the v0 combine (Dv 64 is under the v1 combine's 128 columns per warp).
using TileFp8F16W4 = TileConfigV1<32, 32, 4, 6, 2, 2, 0>;
template <> struct TilesForFp8<HeadG64> { using type = TileList<TileFp8F16W4>; };
// FlashMLA's 656-byte rows (512 e4m3 codes, 4 fp32 scales, 64 bf16 RoPE values). sm_120's tile runs S and P.V
// on e4m3 MMAs (each 128-column block summed apart and times its per-token scale; P stored once per block, times
// the token's block scale; the RoPE on q's type): 32 tokens x 4 stages, two barriers per tile, two in flight.
// 656-byte rows unpadded (41 16-byte units, odd: conflict-free) 82 KB + one set of partial scores 10 KB + P (4
// blocks side by side, one buffer, swizzled) 4 KB + the index ring of 128 loaders (4 threads per row) 1 KB + the
// tile's block scales, alpha, 1/l, lse2, Q scales, mask words 1.5 KB = 100,864 B. The f16 tile (K / V codes times
// their scale in registers, f16 MMAs) is the H200's and the exact one.
template <class Head> struct TilesFor656 { using type = TileList<>; };
// Kernel v3 on 656-byte rows: the same producer-warp tile (one 656-byte bulk copy per row, 16-byte multiples): 4 x
// 20,992 B of KV + partial scores 10,240 + P (4 blocks) 4,096 + stats, Q and block scales 1,024 + mask words 1,024 +
// mbarriers 64 + index ring 512 = 100,928 B, under sm_120's 101,376 by 448.
// With math roles (TileMlaV3RolesFp8): the S warps hand the PV warps one unscaled f16 P (2 KB, double-buffered: 4 KB);
// each PV warp keeps its own 128-column block's reference and scales its P fragments by the stage's scales itself.
// 4 x 20,992 B of KV + partial scores 10,240 + 2 x P 2,048 + stats and Q scales 640 + mask words 1,024 + mbarriers 64 +
// index ring 512 = 100,544 B.
template <> struct TilesFor656<HeadMLA> {
  using type = TileList<TileConfigV1<32, 32, 8, 4, 2, 2>, TileFp8F16, TileMlaV3Fp8, TileMlaV3WgFp8, TileMlaV3RolesFp8>;
};
template <> struct TilesFor<HeadG128> {
  using type = TileList<TileConfig<64, 32, 4, 1, 2>, TileConfig<128, 32, 8, 1, 2>, TileConfigV1<32, 32, 8, 4, 2, 2>>;
};
template <> struct TilesFor<HeadG64> {
  using type = TileList<TileConfig<64, 64, 4, 1, 2>>;
};
template <> struct TilesFor<HeadG256> {
  using type = TileList<TileConfig<32, 32, 2, 2, 2>>;
};

}  // namespace va::tv
