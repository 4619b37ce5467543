// Tile of kernel v3 for Hopper (sm_90a; csrc/tree_verify/sm90/tree_verify_kernel_v3.cuh, issue 40).
// Included by config.h (the kernel family's tile table); the traits and kernel live beside it in sm90/.
//
// BM = 64 query rows (tree nodes x group heads, one wgmma m64 tile), BN = 64-token KV blocks in 128-byte-swizzled
// shared memory, STAGES KV stages of a whole 576-wide block each (72 KB: Q + 2 stages = 216 KB of sm_90a's 227 KB,
// so 2 stages is the most that fits; FlashMLA's sparse prefill holds the same two). The block: 2 consumer
// warpgroups (warps 0-7: FlashMLA's "seesaw", each computes S of its own block of a pair over all 576 dims and
// accumulates its half of O's 512 columns from both blocks) + 1 producer warpgroup (warps 8-11: every KV copy).
// Selected by (BM, BN, block warps 12, STAGES): "cuda@m64n64w12s2", or "cuda@v3".
// BM = 128: a 2-CTA cluster (kCluster = 2) of two 64-row CTAs that serve the same split. Each CTA's producer gathers
// half of every block's rows (rows 32 r .. 32 r + 31 for cluster rank r) and forwards them to the peer's stage
// through distributed shared memory (one bulk copy per 4 KB half dim block), so each row is read from L2 once per
// split and each producer issues half the cp.asyncs. "cuda@m128n64w12s2", or "cuda@v3-cluster".
#pragma once

namespace va::tv {

template <int BM_, int BN_, int STAGES_>
struct TileConfigV3 {
  static constexpr int BM = BM_;
  static constexpr int BN = BN_;
  static constexpr int STAGES = STAGES_;
  static constexpr int kWarps = 8;                     // the two consumer (math) warpgroups
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kLaunchWarps = kWarps + 4;      // + the producer warpgroup
  static constexpr int kVersion = 3;
  static constexpr int kCluster = BM_ / 64;            // CTAs of a cluster, each 64 rows (1: no cluster)
  // the tile as the host-side tables spell it: WM x WN = 4 (warps of a warpgroup, 16 rows each) x 2 (warpgroups)
  static constexpr int WM = 4;
  static constexpr int WN = 2;

  static_assert(BM == 64 || BM == 128, "v3 (sm90): one wgmma m64 tile of rows per CTA (128: a 2-CTA cluster)");
  static_assert(BN == 64, "v3 (sm90): 64-token blocks (the S wgmma's N, 8 swizzle atoms of 8 tokens)");
  static_assert(STAGES == 2, "v3 (sm90): 2 stages of 72 KB beside Q's 72 KB fill sm_90a's 227 KB");
};

}  // namespace va::tv
