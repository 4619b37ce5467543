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

template <class Elem_, class Head, class Layout_, class Tile, bool kFp8_ = false>
struct KernelTraitsV3 {
  using Elem = Elem_;       // q and out: bf16 or fp16; the cache too, unless kFp8
  static constexpr bool kFp8 = kFp8_;  // e4m3 cache codes (per-tensor scales): both products on wgmma .e4m3 (below)
  using KvElem = std::conditional_t<kFp8, uint8_t, Elem_>;
  using Layout = Layout_;
  static constexpr int DQK = Head::DQK, DV = Head::DV;
  // BM: the CTA's rows (a 2-CTA cluster tile's 128 rows are two CTAs of 64); kCluster: CTAs sharing each block's
  // gather (sm90/tile_v3.h)
  static constexpr int BM = Tile::BM / Tile::kCluster, BN = Tile::BN, STAGES = Tile::STAGES;
  static constexpr int kCluster = Tile::kCluster;
  static constexpr int kWarps = Tile::kWarps;          // consumer warps (8)
  static constexpr int kThreads = Tile::kThreads;      // consumer threads (256): named barriers count these
  static constexpr int kBlockThreads = 32 * Tile::kLaunchWarps;  // + the producer warpgroup: 384
  static constexpr int kProducerThreads = 128;
  // setmaxnreg: 384 threads launch at 168 registers; the producer warpgroup returns (168 - 64) x 128, the consumers
  // take (216 - 168) x 256 of them (64 x 128 + 216 x 256 = 62 K of the launch's 63 K pool, 168 x 384). 64, not
  // FlashMLA's 40: the producer holds both blocks' row ids of a pair (it copies the early halves of both before the
  // late ones), the next pair's row id for its L2 prefetch, and its token cursors (a paged layout's positions without
  // a division a row);
  // at 56 the 16-bit paged producer spilled 16 B with them (at 48, 8 B without them). The consumers fit 216 with no
  // spill, 16-bit and e4m3
  static constexpr int kProducerRegs = 64, kMathRegs = 216;

  static constexpr int kDimBlock = 64;                 // dims per 128-byte line
  static constexpr int kDimBlocks = DQK / kDimBlock;   // 9
  static constexpr int kBlockBytes = BN * 128;         // one dim block of a 64-row operand: 8 KB
  static constexpr int kAtomBytes = 1024;              // 8 rows x 128 bytes: the swizzle atom, SBO
  static constexpr int kODV = DV / 2;                  // Dv columns per consumer warpgroup: 256 (the P V wgmma's N)
  static constexpr int kSAccN = BN / 2;                // 32 S accumulator floats a thread
  static constexpr int kOAccN = kODV / 2;              // 128 O accumulator floats a thread
  static constexpr int kPBlock = DV / kDimBlock;       // the RoPE dim block: P lives there (8; 16-bit caches)
  static constexpr int kMaskStage = 8;                 // tree-mask words staged per row (trees up to 256 nodes)
  static constexpr int kKStep = kFp8 ? 32 : 16;        // k of one wgmma (e4m3: 32, at twice the 16-bit rate)
  static constexpr int kSKSteps = DQK / kKStep;        // 36 k16 (18 k32) wgmma steps of S
  static constexpr int kPKSteps = BN / kKStep;         // 4 k16 (2 k32) steps of P V
  // a stage's two halves: dims 0-255 (L: dim blocks 0-3) and dims 256-575 (R: 4-7, with the RoPE block 8), or, for
  // stage 1, R alone and L with RoPE; each half has a FULL and an EMPTY mbarrier (16-bit; e4m3 has them per stage)
  static constexpr int kHalves = 2;
  static constexpr int kHalfBlocks = kODV / kDimBlock;   // 4 dim blocks in a 256-dim half
  // the half of `stage` dim block b belongs to: 0 the early one (stage 0's L, stage 1's R), 1 the late (the rest)
  static constexpr int half_of(int stage, int b) {
    return b >= kPBlock ? 1 : ((b < kHalfBlocks) == (stage == 0) ? 0 : 1);
  }
  // producer: 8 threads per 128-byte line (a token's dim block), 16 tokens per pass, kRowsPerThread passes
  // (e4m3: 8 tokens x 4 consecutive 16-byte chunks a warp instruction, 2 tokens a thread, below)
  static constexpr int kRowsPerThread = kFp8 ? 2 : BN / (kProducerThreads / 8);  // 4 (e4m3: 2)

  // ---- e4m3 (kFp8): wgmma .e4m3 takes K-major operands only, and a 576-byte row is 4.5 128-byte lines, so the rows
  // sit in v2's no-swizzle core-matrix layout (traits.h, KernelTraitsV2): token t's 16-byte chunk c (16 dims) at
  // (t / 8) kGroupBytes + 128 c + 16 (t % 8). S = Q K^T reads Q and a stage K-major (LBO 128, SBO kGroupBytes, a k32
  // step +256). P V runs with its operands swapped, O^T = V^T P^T (sm90/pv_swap.cuh): V^T's A fragments come from the
  // stage's rows by ldmatrix .trans, and P^T, the B operand, is K-major in a P buffer: row n, k position kappa (the
  // block's tokens in fp8_pv_token_of_k order a 32-token step) at (n / 8) kPSbo + (kappa / 16) 128 + 16 (n % 8) +
  // kappa % 16 (LBO 128, a k32 step +256). A P buffer a stage of each slot (the other warpgroup's P V of pair i
  // may still read P0 when warpgroup 0 writes pair i + 1's), Q's row scales, and the softmax's per-row alpha
  // and 1 / l beside them: O^T's columns are rows, so each thread scales 16 rows it did not compute.
  static constexpr int kChunks = DQK * int(sizeof(KvElem)) / 16;        // 16-byte chunks a KV row: 36 (e4m3)
  static constexpr int kRowBytes = DQK * int(sizeof(KvElem));
  // e4m3's L2 prefetch of a row: every 128-byte line it touches at any alignment (traits.h kLineLanes' rule): its
  // bytes 0, 128, ... and its last, 6 lines for 576 bytes
  static constexpr int kRowLines = (kRowBytes + 127) / 128 + 1;
  static constexpr int kGroupBytes = kChunks * 128;                     // 8 tokens x a row's chunks (e4m3)
  static constexpr size_t kPBytes = kFp8 ? size_t(BM) * BN : 0;         // one block's P, e4m3 (e4m3: 4 KB)
  // e4m3: pair i's blocks in slot i % 2 (two stages each), so that the producer copies pair i + 2 once pair i's rows
  // are read (their last readers are the P V's V^T fragments, at the pair's end); 16-bit: one slot
  static constexpr int kSlots = kFp8 ? 2 : 1;
  static constexpr int kPSbo = (BN / 16) * 128;                         // e4m3 P^T: 8 rows x the block's 64 tokens
  static constexpr int kOTiles = kODV / 64;                             // e4m3 O^T: 4 m64 tiles of dims a warpgroup
  // P stored scaled by kPScale (the exact max: P <= 1; v2's choice)
  static constexpr float kPScale = 256.f;

  static constexpr size_t kOperandBytes = kFp8 ? size_t(BM / 8) * kGroupBytes : size_t(kDimBlocks) * kBlockBytes;
  static constexpr size_t kStageBytes = kOperandBytes;  // a stage: one 64-token block (72 KB; e4m3 36 KB)
  static constexpr size_t kQ = 0;
  static constexpr size_t kKV = kOperandBytes;          // Q: 72 KB (e4m3: 36 KB)
  // per-row statistics a warpgroup publishes for the other: its block's row max and row sum, (2 warpgroups, 2, BM)
  static constexpr size_t kStats = kKV + size_t(kSlots * STAGES) * kStageBytes;
  static constexpr size_t kMask = kStats + size_t(2) * 2 * BM * sizeof(float);
  // e4m3: P buffers [slot][stage], then Q's row scales, then (warpgroup, BM) floats twice: the alpha of the block
  // each warpgroup's softmax ran (its rows' rescale), and at the end each row's 1 / l
  static constexpr size_t kP = kMask + size_t(BM) * kMaskStage * sizeof(uint32_t);
  static constexpr size_t kQScale = kP + size_t(kSlots * STAGES) * kPBytes;
  static constexpr size_t kAlpha = kQScale + (kFp8 ? size_t(BM) * sizeof(float) : 0);
  static constexpr size_t kInvL = kAlpha + (kFp8 ? size_t(2) * BM * sizeof(float) : 0);
  // 16-bit: FULL x STAGES x 2 halves, then EMPTY x STAGES x 2 halves (a stage's early and late half, each with its
  // own barriers, so the producer refills one while the other is still read). e4m3: FULL / EMPTY per stage (every
  // reader of the rows: S, and both warpgroups' V^T fragments)
  static constexpr size_t kBars = kInvL + (kFp8 ? size_t(2) * BM * sizeof(float) : 0);
  // (a 2-CTA cluster, 16-bit: + LANDED per stage half, this CTA's own copies of it landed, which its producer
  // forwards to the peer; + SENT per stage, the peer's rows of this CTA's gather landed there, so this CTA may write P
  // over them)
  static constexpr int kNumBars = kFp8 ? 2 * kSlots * STAGES
                                       : 2 * STAGES * kHalves + (kCluster > 1 ? STAGES * kHalves + STAGES : 0);
  static constexpr size_t kTotal = kBars + size_t(kNumBars) * sizeof(uint64_t);
  static constexpr size_t smem_bytes() { return kTotal; }

  static_assert(sizeof(Elem) == 2, "v3 (sm90): 16-bit q and out");
  static_assert(kCluster == 1 || (kCluster == 2 && !kFp8), "v3 (sm90): a 2-CTA cluster on 16-bit caches only");
  static_assert(kCluster == 1 || BN % (8 * kCluster) == 0, "a cluster CTA gathers whole swizzle atoms of each block");
  static_assert(Head::kSharedKV && DQK == 576 && DV == 512, "v3 (sm90): MLA rows, V = K[..., :512], RoPE 64");
  static_assert(DQK - DV == kDimBlock, "P takes the RoPE dim block: exactly one 64-dim block past Dv");
  static_assert(size_t(BM) * BN * 2 <= size_t(kBlockBytes), "P (BM x BN, 16-bit) fits the RoPE dim block");
  static_assert(kKV % 1024 == 0 && kStageBytes % 512 == 0, "operands start on 512-byte (swizzled: 1024) boundaries");
  static_assert(kFp8 || kStageBytes % 1024 == 0, "swizzled operands start on 1024-byte atoms");
  static_assert(!kFp8 || (kP % 16 == 0 && kPBytes % 16 == 0 && kAlpha % 16 == 0), "e4m3 buffers: 16-byte aligned");
  static_assert(!kFp8 || (kODV % 64 == 0 && BM == 64), "e4m3 O^T: m64 tiles of dims, N = the CTA's 64 rows");
  static_assert(kBars % 8 == 0, "mbarriers: 8-byte aligned");
  // the launch's pool is ptxas's count a thread (65536 / 384, in units of 8: 168) x the block, not the SM's 64 K:
  // setmaxnreg.inc waits until the pool has the registers (tests/test_model_roles.py reads the SASS's counts too)
  static_assert(kBlockThreads == 384 && (kProducerRegs * 128 + kMathRegs * 256) <= 65536 / 384 / 8 * 8 * 384,
                "setmaxnreg budget: the launch's register pool (168 x 384)");
  static_assert(kTotal <= 227 * 1024, "shared memory must fit sm_90a's 227 KB per block");
};

}  // namespace va::tv
