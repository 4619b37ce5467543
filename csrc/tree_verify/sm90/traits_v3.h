// Traits and shared-memory plan of kernel v3 for Hopper (tree_verify_kernel_v3.cuh). Host-safe: the host module's
// tile table (csrc/host/host_math_py.cpp) reads smem_bytes() from here.
//
// Layout of a 64-row operand (Q, or a stage's 64 KV tokens) in 128-byte-swizzled shared memory (CUTLASS's
// Layout_K_SW128 atom, what TMA boxes write and FlashMLA reads): the 576 dims are 9 dim blocks of 64 (128 bytes a
// row), block j at j * kBlockBytes; in a block, row r's line at (r / 8) * 1024 + (r % 8) * 128 and its 16-byte chunk
// c at chunk c ^ (r % 8) (csrc/arch/wgmma.cuh, sw128_kmajor_offset). The same bytes are
//   * K-major for S = Q K^T (A = Q and B = K; SBO 1024 between 8-row groups; a k16 step is +32 bytes inside a
//     block's line, a new block +kBlockBytes);
//   * MN-major for O += P V (B = V: n = dims, 64 a block, LBO kBlockBytes between blocks; k = tokens, SBO 1024
//     between 8-token groups; a k16 step is +2048 bytes).
// Dim block 8 holds the RoPE dims 512..575, which only S reads: once a block's S has retired, its P (64 rows x 64
// tokens, 16-bit, 8 KB) is written there for the other warpgroup (FlashMLA overlaps its P buffer with the RoPE part
// the same way), so the P exchange costs no shared memory of its own and is freed with the stage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../config.h"

namespace va::tv {

template <class Elem_, class Head, class Layout_, class Tile>
struct KernelTraitsV3 {
  using Elem = Elem_;       // q, out and the cache: bf16 or fp16
  using KvElem = Elem_;
  using Layout = Layout_;
  static constexpr int DQK = Head::DQK, DV = Head::DV;
  static constexpr int BM = Tile::BM, BN = Tile::BN, STAGES = Tile::STAGES;
  static constexpr int kWarps = Tile::kWarps;          // consumer warps (8)
  static constexpr int kThreads = Tile::kThreads;      // consumer threads (256): named barriers count these
  static constexpr int kBlockThreads = 32 * Tile::kLaunchWarps;  // + the producer warpgroup: 384
  static constexpr int kProducerThreads = 128;
  // setmaxnreg: 384 threads launch at 168 registers; the producer warpgroup returns (168 - 56) x 128, the consumers
  // take (224 - 168) x 256 of them (56 x 128 + 224 x 256 = 63 K of the SM's 64 K). 56, not FlashMLA's 40: the
  // producer holds both blocks' row ids of a pair (it copies the early halves of both before the late ones) and
  // the next pair's row id for its L2 prefetch; at 48 the paged layout's row offsets spilled 8 B. The consumers fit
  // 224 with no spill
  static constexpr int kProducerRegs = 56, kMathRegs = 224;

  static constexpr int kDimBlock = 64;                 // dims per 128-byte line
  static constexpr int kDimBlocks = DQK / kDimBlock;   // 9
  static constexpr int kBlockBytes = BN * 128;         // one dim block of a 64-row operand: 8 KB
  static constexpr int kAtomBytes = 1024;              // 8 rows x 128 bytes: the swizzle atom, SBO
  static constexpr size_t kStageBytes = size_t(kDimBlocks) * kBlockBytes;  // 72 KB
  static constexpr int kSKSteps = DQK / 16;            // 36 k16 wgmma steps of S
  static constexpr int kODV = DV / 2;                  // Dv columns per consumer warpgroup: 256 (the P V wgmma's N)
  static constexpr int kPKSteps = BN / 16;             // 4 k16 steps of P V
  static constexpr int kSAccN = BN / 2;                // 32 S accumulator floats a thread
  static constexpr int kOAccN = kODV / 2;              // 128 O accumulator floats a thread
  static constexpr int kPBlock = DV / kDimBlock;       // the RoPE dim block: P lives there (8)
  static constexpr int kMaskStage = 8;                 // tree-mask words staged per row (trees up to 256 nodes)
  // a stage's two halves: dims 0-255 (L: dim blocks 0-3) and dims 256-575 (R: 4-7, with the RoPE block 8), or, for
  // stage 1, R alone and L with RoPE; each half has a FULL and an EMPTY mbarrier
  static constexpr int kHalves = 2;
  static constexpr int kHalfBlocks = kODV / kDimBlock;   // 4 dim blocks in a 256-dim half
  // the half of `stage` dim block b belongs to: 0 the early one (stage 0's L, stage 1's R), 1 the late (the rest)
  static constexpr int half_of(int stage, int b) {
    return b >= kPBlock ? 1 : ((b < kHalfBlocks) == (stage == 0) ? 0 : 1);
  }
  // producer: 8 threads per 128-byte line (a token's dim block), 16 tokens per pass, kRowsPerThread passes
  static constexpr int kRowsPerThread = BN / (kProducerThreads / 8);  // 4

  static constexpr size_t kQ = 0;
  static constexpr size_t kKV = size_t(kDimBlocks) * (BM / 8) * kAtomBytes;  // Q: 72 KB
  // per-row statistics a warpgroup publishes for the other: its block's row max and row sum, (2 warpgroups, 2, BM)
  static constexpr size_t kStats = kKV + size_t(STAGES) * kStageBytes;
  static constexpr size_t kMask = kStats + size_t(2) * 2 * BM * sizeof(float);
  // FULL x STAGES x 2 halves, then EMPTY x STAGES x 2 halves (sm90/tree_verify_kernel_v3.cuh: a stage's early and
  // late half, each with its own barriers, so the producer refills one while the other is still read)
  static constexpr size_t kBars = kMask + size_t(BM) * kMaskStage * sizeof(uint32_t);
  static constexpr size_t kTotal = kBars + size_t(2) * STAGES * kHalves * sizeof(uint64_t);
  static constexpr size_t smem_bytes() { return kTotal; }

  static_assert(sizeof(Elem) == 2, "v3 (sm90): 16-bit q, out and cache (e4m3 is the next step)");
  static_assert(Head::kSharedKV && DQK == 576 && DV == 512, "v3 (sm90): MLA rows, V = K[..., :512], RoPE 64");
  static_assert(DQK - DV == kDimBlock, "P takes the RoPE dim block: exactly one 64-dim block past Dv");
  static_assert(size_t(BM) * BN * 2 <= size_t(kBlockBytes), "P (BM x BN, 16-bit) fits the RoPE dim block");
  static_assert(kKV % 1024 == 0 && kStageBytes % 1024 == 0, "swizzled operands start on 1024-byte atoms");
  static_assert(kBlockThreads == 384 && (kProducerRegs * 128 + kMathRegs * 256) <= 65536, "setmaxnreg budget");
  static_assert(kTotal <= 227 * 1024, "shared memory must fit sm_90a's 227 KB per block");
};

}  // namespace va::tv
