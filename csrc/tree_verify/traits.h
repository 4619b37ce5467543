// Kernel traits: element type, head shape, layout policy and tile config of one
// instantiation, with its shared memory plan.
//
// Design notes (v0) and prediction -- analysis, not a measurement:
// * MLA on sm_120 (99 KB/block): Q stays in smem (a 16-row x 576 A fragment set
//   would take 144 registers/thread) and is re-read with ldmatrix every KV tile;
//   each KV row is loaded once into smem and used for both S (all 576 columns)
//   and O (its first 512). Default tile: 32 rows x 16 tokens x 3 stages (95.5 KB)
//   with 2x2 warps: each warp does S for 16 rows x 8 tokens and O for 16 rows x
//   256 Dv columns (128 fp32 registers; ptxas: 186-200 registers, no spills).
//   Row max and P cross the two warps of a row pair through smem (3 barriers per tile).
// * GQA: one warp per 16 rows owns all of Dv; P stays in registers (the m16n8
//   C fragments are the m16n8k16 A fragment), one barrier per tile.
// * Kimi K2 at 185k, 16 nodes x 8 heads = 128 rows = 4 M tiles of 32: with one
//   wave of CTAs (H200: 33 splits x 4), every KV tile is read once from DRAM
//   (213 MB, ~50 us at 4.3 TB/s) and 4x from L2 (~850 MB, ~6.5 MB per SM); the MMA
//   work is ~1.1 MFLOP per 16-token tile, 52 GFLOP in all. With one 4-warp CTA per SM
//   the pipeline has little latency slack, so v0 is expected at 2-4x the floor
//   (~100-200 us on an H200); the first levers are more warps per row tile (WN=4
//   with BN=32) and Q fragments kept across tiles where registers allow.
//
// Shared memory rows are padded by 16 bytes: a 576-wide row is 1152 B = 9 x 128 B,
// so unpadded rows would put the 8 rows an ldmatrix reads on the same banks
// (8-way conflicts); +16 B shifts each row by 4 banks, conflict-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../host/common.h"
#include "config.h"

namespace va::tv {

// Byte offsets of the regions of the CTA's dynamic shared memory.
template <int BM, int BN, int WN, int STAGES, int DQK, int DV, bool kSharedKV>
struct SharedMemoryPlan {
  static constexpr int kElem = 2;                      // bf16 / fp16
  static constexpr int kPad = 8;                       // elements of padding per row (16 B)
  static constexpr int kQPitch = DQK + kPad;           // elements per Q row in smem
  static constexpr int kKPitch = DQK + kPad;           // elements per K row
  static constexpr int kVPitch = kSharedKV ? kKPitch : DV + kPad;  // V rows: the K rows themselves for MLA
  static constexpr int kPPitch = BN + kPad;            // elements per P row (only when WN > 1)

  static constexpr size_t kQBytes = size_t(BM) * kQPitch * kElem;          // (BM, Dqk) Q tile
  static constexpr size_t kKStageBytes = size_t(BN) * kKPitch * kElem;     // (BN, Dqk) K tile per stage
  static constexpr size_t kVStageBytes = kSharedKV ? 0 : size_t(BN) * kVPitch * kElem;  // (BN, Dv) V tile per stage
  static constexpr size_t kPBytes = WN > 1 ? size_t(BM) * kPPitch * kElem : 0;        // (BM, BN) P tile
  static constexpr size_t kRedBytes = WN > 1 ? size_t(2) * WN * BM * sizeof(float) : 0;  // row max + row sum per warp column

  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + kQBytes;
  static constexpr size_t kV = kK + STAGES * kKStageBytes;
  static constexpr size_t kP = kV + STAGES * kVStageBytes;
  static constexpr size_t kRedMax = kP + kPBytes;
  static constexpr size_t kRedSum = kRedMax + (WN > 1 ? size_t(WN) * BM * sizeof(float) : 0);
  static constexpr size_t kTotal = kP + kPBytes + kRedBytes;

  static_assert(kQBytes % 16 == 0 && kKStageBytes % 16 == 0 && kVStageBytes % 16 == 0 && kPBytes % 16 == 0,
                "regions must stay 16-byte aligned for cp.async and ldmatrix");
};

// Shared memory per block that every config must fit: sm_120's 99 KB (sm_90 allows 227 KB).
inline constexpr size_t kSmemLimitSm120 = 99 * 1024;

template <class Elem_, class Head, class Layout_, class Tile>
struct KernelTraits {
  using Elem = Elem_;                       // __nv_bfloat16 or __half
  using Layout = Layout_;                   // va::host::Page1Layout or PagedLayout
  static constexpr int DQK = Head::DQK;
  static constexpr int DV = Head::DV;
  static constexpr bool kSharedKV = Head::kSharedKV;
  static constexpr int BM = Tile::BM, BN = Tile::BN, WM = Tile::WM, WN = Tile::WN, STAGES = Tile::STAGES;
  static constexpr int kWarps = Tile::kWarps;
  static constexpr int kThreads = Tile::kThreads;
  static constexpr int kBlockThreads = kThreads;  // the launch's block (no producer warp)

  static constexpr int kNS = BN / WN;        // KV tokens of a tile per warp in S = Q K^T
  static constexpr int kSTiles = kNS / 8;     // n8 tiles of S per warp
  static constexpr int kDVW = DV / WN;       // Dv columns per warp in O
  static constexpr int kOTiles = kDVW / 8;    // n8 tiles of O per warp
  static constexpr int kKSteps = DQK / 16;   // k16 steps of Q K^T
  static constexpr int kPSteps = BN / 16;    // k16 steps of P V
  static constexpr int kQChunks = DQK / 8;   // 16-byte chunks per Q/K row
  static constexpr int kVChunks = DV / 8;    // 16-byte chunks per V row
  static constexpr int kThreadsPerRow = kThreads / BN;  // KV loader: threads per tile row (one row per thread)

  using Smem = SharedMemoryPlan<BM, BN, WN, STAGES, DQK, DV, kSharedKV>;
  static constexpr size_t smem_bytes() { return Smem::kTotal; }

  static_assert(sizeof(Elem) == 2, "16-bit element types only");
  static_assert(kDVW % 16 == 0, "each warp's Dv slice must be whole n16 pairs (ldmatrix x4 .trans)");
  static_assert(kOTiles * 4 <= 128, "O accumulator per thread must stay <= 128 fp32 registers");
  static_assert(Smem::kTotal <= kSmemLimitSm120, "shared memory must fit sm_120's 99 KB per block");
};

// Shared memory of the v1 kernel: STAGES x (K rows [+ V rows]), the KSPLIT fp32
// partial score tiles (PARTS sets: 2 with one barrier per tile, tile i+1's read while
// i+2's are written; 2 on the math-roles tile, whose S warps store tile i+1's after the
// softmax of i read tile i's), P and alpha (PARTS buffers: with one barrier per tile PV(i) reads
// tile i's while the softmax of i+1 writes; with two, PV(i) loads P(i) and alpha(i) into
// registers before the second barrier and the softmax of i+1 writes after it, so one
// buffer), 1/l and lse2. Q is staged once in the last pipeline stages before their tiles
// are issued and then lives in registers.
template <int BM, int BN, int STAGES, int KSPLIT, int DQK, int DV, bool kSharedKV, int KVB = 2, int PB = KVB,
          int KROW = DQK, int KPADB = 16, int PARTS = 1, int PGROUPS = 1, int MASKW = 4, int PBUFS = PARTS,
          bool PSWZ64 = false>
struct SharedMemoryPlanV1 {
  // KROW: K row elements in the cache (DQK; 656 bytes for the 656-byte MLA rows), KPADB: its pad in bytes
  // KVB: bytes per K / V element (2: the 16-bit type of q; 1: e4m3); PB: per P element. Q is staged 16-bit.
  // PGROUPS: P copies side by side in a row (4: the 656-byte rows, P times each 128-column block's per-token
  // scale). PSWZ64: P rows of 64 bytes with no pad (the 656-byte rows on the math-roles tile: one f16 P of 32
  // tokens, its k positions XORed with 20 on rows with bit 1 set; tree_verify_kernel_v1.cuh's p_at).
  static constexpr int kQElem = 2;
  static constexpr int kKvElem = KVB;
  static constexpr int kPad = 16 / KVB;                            // elements per K/V/P row (16 B): conflict-free ldmatrix
  static constexpr int kQPitch = DQK + 8;                          // 16-bit elements per staged Q row
  static constexpr int kKPitch = KROW + KPADB / KVB;
  static constexpr int kVPitch = kSharedKV ? kKPitch : DV + kPad;
  static constexpr int kStageElems = BN * kKPitch + (kSharedKV ? 0 : BN * kVPitch);  // one stage: K rows, V rows
  static constexpr size_t kStageBytes = size_t(kStageElems) * KVB;
  // floats per partial-score row: BN + 8 keeps the float2 stores conflict-free; the one-barrier tiles take
  // BN + 4 (2-way conflicts on those stores) to fit their two sets in sm_120's 99 KB
  static constexpr int kSPitch = BN + (PARTS == 2 ? 4 : 8);
  static constexpr int kPBufs = PBUFS;          // P / alpha buffers (above; 2 for v3's math roles: P(i + 1) is
                                                // written while the PV warps read P(i))
  // elements per P row: a 16-byte pad puts the 8 rows an ldmatrix reads on distinct banks; the 4-block rows
  // (128 bytes) instead swizzle their 16-byte chunks (chunk ^ row % 8, kPSwizzle)
  static constexpr bool kPSwizzle = PGROUPS > 1;
  static constexpr int kPPitch = PGROUPS * BN + (kPSwizzle || PSWZ64 ? 0 : 16 / PB);
  static_assert(!PSWZ64 || (PGROUPS == 1 && BN * PB == 64), "the 64-byte P rows: one 32-token f16 P");
  static constexpr int kQStages = int((size_t(BM) * kQPitch * kQElem + kStageBytes - 1) / kStageBytes);  // stages Q borrows

  static constexpr size_t kK = 0;
  static constexpr size_t kV = size_t(BN) * kKPitch * KVB;         // V rows of a stage follow its K rows (GQA)
  static constexpr size_t kPart = size_t(STAGES) * kStageBytes;
  static constexpr int kPartFloats = KSPLIT * BM * kSPitch;  // one set of partial scores
  static constexpr int kParts = PARTS;
  static constexpr size_t kP = kPart + size_t(PARTS) * kPartFloats * sizeof(float);
  static constexpr size_t kStats = kP + size_t(kPBufs) * BM * kPPitch * PB;
  // kPBufs x alpha, 1/l, lse2 per row; with e4m3 operands also each Q row's quantization scale
  static constexpr int kStatsPerRow = kPBufs + 2 + (KVB == 1 ? 1 : 0);
  // with PGROUPS blocks: the tile's per-token block scales, (PGROUPS, BN) floats, written by the S warps for the
  // softmax (a softmax lane's 4 tokens of one block are then one conflict-free 16-byte load)
  static constexpr size_t kScl = kStats + size_t(kStatsPerRow) * BM * sizeof(float);
  static constexpr size_t kIdx = kScl + (PGROUPS > 1 ? size_t(PGROUPS) * BN * sizeof(float) : 0);
  // kv_indices ring, a slot per loader thread (kRingThreads of the traits): the index of tile T is copied in
  // iteration T - kRingAhead and read at the top of iteration T - STAGES + 1 (tree_verify_kernel_v1.cuh), so
  // STAGES - 2 (two barriers per tile) or STAGES - 3 (one) copies are in flight when it is read, and the copy
  // that reuses its slot is issued later in that iteration, after the KV copy whose address needs the read
  // value (a register dependency orders them). STAGES - 2 slots for both.
  static constexpr int kIdxSlots = STAGES - 2;
  // tree-mask words staged per row after the ring (the first kMaskStage of each row: trees up to
  // 32 * kMaskStage = 128 nodes; the further words of wider trees are read from global memory). 4, not 8:
  // the 4-way-split one-barrier tile fills sm_120's 99 KB to the byte with 4. The producer-warp tile stages 8
  // (trees up to 256 nodes: its math warps load nothing from global memory in the main loop below that).
  static constexpr int kMaskStage = MASKW;
  template <int kRingThreads>
  static constexpr size_t mask_offset() { return kIdx + size_t(kIdxSlots) * kRingThreads * sizeof(int32_t); }
  template <int kRingThreads>
  static constexpr size_t total() { return mask_offset<kRingThreads>() + size_t(BM) * kMaskStage * sizeof(uint32_t); }

  static_assert(kQStages <= STAGES - 1, "the Q tile must fit in the stages the prologue does not fill first");
  static_assert(kPart % 16 == 0 && kP % 16 == 0 && kStats % 16 == 0 && kIdx % 16 == 0 && kStageBytes % 16 == 0,
                "regions must stay 16-byte aligned");
};

// Largest d <= cap that divides both a and b (the loader's threads per KV row).
constexpr int largest_common_divisor_upto(int a, int b, int cap) {
  for (int d = cap; d > 1; --d)
    if (a % d == 0 && b % d == 0) return d;
  return 1;
}

// kFp8: K / V are e4m3 codes (one scale per tensor); S and P.V use mma.m16n8k32 .e4m3 with Q
// quantized per row and P stored as e4m3 (csrc/host/fp8.h has the fragment permutations).
// kMla656: the caches are FlashMLA's 656-byte MLA rows (512 e4m3 codes, 4 fp32 scales one per 128, 64
// bf16 RoPE values). S over each 128-column block in its own accumulators, times the token's block scale,
// plus the RoPE on MMAs of q's type; P stored once per block, times the token's block scale over the block's
// running largest |scale| (every warp's 64 Dv columns lie in one block). The codes go to e4m3 MMAs as they
// are (k656E4m3), or to f16 ones converted in registers (the f16 tile).
template <class Elem_, class Head, class Layout_, class Tile, bool kFp8_ = false, bool kMla656_ = false>
struct KernelTraitsV1 {
  using Elem = Elem_;
  using Layout = Layout_;
  static constexpr bool kFp8 = kFp8_;
  static constexpr bool kE4m3Mma = kFp8 && Tile::FP8_MMA == 1;  // products on e4m3 MMAs
  static constexpr bool kFp8Deq = kFp8 && Tile::FP8_MMA == 0;   // K / V to f16 in registers, f16 MMAs
  static constexpr bool kMla656 = kMla656_;
  static constexpr bool k656E4m3 = kMla656 && kE4m3Mma;
  static constexpr int k656Block = 128;  // values per scale of a 656-byte row
  using KvElem = std::conditional_t<kFp8, uint8_t, Elem>;  // K / V storage
  // Tile::LOADER 4 (v3 with math roles): warps 0 .. kSWarps - 1 compute S and the softmax, warps kSWarps .. kWarps - 1
  // P V; every other tile's warps do both
  static constexpr bool kRoles = Tile::LOADER == 4;
  // 656-byte rows on the math-roles tile: the S warps hand over one unscaled P in f16 (its e4m3 k positions); each PV
  // warp keeps its own block's reference and scales its P fragments itself (its Dv columns lie in one block), so no
  // block work and no 4-block P pass between the roles
  static constexpr bool k656Roles = kRoles && kMla656;
  // P storage: e4m3, or 16-bit (T; f16 when kFp8Deq or k656Roles)
  static constexpr int kPBytes = kE4m3Mma && !k656Roles ? 1 : 2;
  static constexpr int kKStep = kFp8 ? 32 : 16;             // K elements per S step (one 32-byte ldmatrix pair)
  static constexpr int kMmaPerStep = kFp8Deq ? 2 : 1;       // k16 MMAs per S step
  static constexpr int kKvPerChunk = 16 / int(sizeof(KvElem));  // K / V elements per 16-byte copy
  static constexpr int DQK = Head::DQK;
  static constexpr int DV = Head::DV;
  static constexpr bool kSharedKV = Head::kSharedKV;
  static constexpr int kRowElems = kMla656 ? 656 : DQK;  // K row in the cache (elements of KvElem)
  static constexpr int BM = Tile::BM, BN = Tile::BN, STAGES = Tile::STAGES, KSPLIT = Tile::KSPLIT, SN = Tile::SN;
  static constexpr bool kOneBarrier = Tile::BARS == 1;  // one CTA barrier per KV tile (config.h)
  static constexpr int kWarps = Tile::kWarps;
  static constexpr int kThreads = Tile::kThreads;

  static constexpr int MS = BM / 16;                 // m16 tiles of the CTA
  static constexpr int kSWarps = kRoles ? kWarps / 2 : kWarps;   // S (and softmax) warps
  static constexpr int kPVWarps = kRoles ? kWarps / 2 : kWarps;  // P V warps
  static constexpr int kSWM = kSWarps / (KSPLIT * SN);  // S warps along M
  static constexpr int kSMT = MS / kSWM;             // m tiles per warp in S
  static constexpr int kSTok = BN / SN;              // tokens per warp in S
  static constexpr int kSN8 = kSTok / 8;             // n8 tiles per m tile in S
  static constexpr int kSDims = DQK / KSPLIT;        // head dims per warp in S
  static constexpr int kSKSteps = kSDims / kKStep;   // MMA k steps per S warp
  static constexpr int kQFrags = kSKSteps * kMmaPerStep;  // Q A fragments per m tile
  // accumulator sets over alternate k steps: at least 4 independent MMA chains per warp
  // (656-byte rows: always two, one per 128-column block of the warp's two)
  static constexpr int kSAcc = kMla656 ? 2 : (kSMT * kSN8 >= 4 || kSKSteps < 2) ? 1 : 2;
  static constexpr int kODV = DV / kPVWarps;         // Dv columns per warp in O
  static constexpr int kON8 = kODV / 8;
  static constexpr int kPKSteps = BN / (kE4m3Mma ? 32 : 16);  // MMA k steps of P.V per tile
  static constexpr int kQChunks = DQK / 8;           // 16-byte chunks per Q / K row
  // KV loader: kThreadsPerRow threads per tile row split its 16-byte chunks evenly (the largest such
  // count the block allows), so every copy sits at a constant offset from one row pointer; the
  // kLoadThreads = BN x kThreadsPerRow first threads load, the rest only compute.
  // Bulk loader (Tile::LOADER 1): BN threads each copy one whole row (K, and V where it is not the K row)
  // with one cp.async.bulk on the stage's mbarrier, which counts BN arrivals per phase. The rows are spread
  // over the warps, kBulkLanes lanes each (row = lane x kWarps + warp): nvcc issues a warp's copies one lane
  // after another (~52 cycles each on the H200, bench.model's bulk probe), so the warps share that time.
  static constexpr bool kBulk = Tile::LOADER == 1;
  static constexpr int kBulkLanes = (BN + kWarps - 1) / kWarps;
  // Producer warp (Tile::LOADER 2, kernel v3): kWarps math warps (warps 0 .. kWarps - 1: every kThreads-based
  // layout below is theirs) and one producer warp after them, warp kWarps, whose lane r copies row r of every
  // tile. It reads kv_indices itself (no index ring); each stage has a FULL mbarrier (BN arrivals: the
  // producer's lanes, with the row bytes) and an EMPTY one (kWarps arrivals: one lane per math warp).
  static constexpr bool kProducer = Tile::LOADER >= 2;
  // LOADER 3: the producer is a warpgroup (warps kWarps .. kWarps + 3, each a quarter of the rows), registers moved
  // to the math warpgroups by setmaxnreg: at 384 threads the launch gives 168 a thread; the producer's four warps
  // return (168 - 40) x 128 to the CTA's pool, the math warps' eight take (232 - 168) x 256 of it
  static constexpr bool kProducerWG = Tile::LOADER >= 3;
  // The pool is what the launch allocates: ptxas counts a block in whole warpgroups, so 12 warps get 168 a thread
  // (64,512) and 20 warps 96 (61,440; 17 warps would get 96 too, which is why 16 math warps come with a warpgroup).
  // 8 math warps: the producer 40, the math warps 232; 16 math warps: the producer 32, the math warps 112.
  static constexpr int kBlockThreads = 32 * Tile::kLaunchWarps;  // the launch's block (config.h: + the producer)
  static constexpr int kLaunchRegs = 65536 / (128 * ((Tile::kLaunchWarps + 3) / 4)) / 8 * 8;
  static constexpr int kProducerRegs = kWarps == 8 ? 40 : 32;
  static constexpr int kMathRegs = (kLaunchRegs * kBlockThreads - kProducerRegs * 128) / kThreads / 8 * 8;
  // the warps that issue copies: the producer warp, or all four of a producer warpgroup, each kRowsPerProducer rows of
  // a tile (nvcc walks a warp's bulk copies one lane at a time: ~52 cycles each on the H200, so one warp issuing the 32
  // rows of an e4m3 tile took ~1,660 cycles, the tile's bound by the model)
  static constexpr int kProducerWarps = kProducerWG ? 4 : 1;
  static constexpr int kRowsPerProducer = (BN + kProducerWarps - 1) / kProducerWarps;
  static constexpr int kQFreeThreads = kThreads + 32 * kProducerWarps;  // the Q-stages barrier: math + issuing warps
  static_assert(!kProducerWG || (kProducerRegs * 128 + kMathRegs * kThreads <= kLaunchRegs * kBlockThreads &&
                                 kMathRegs <= 256 && kMathRegs >= kLaunchRegs),
                "the producer warpgroup's registers: 40 x 128 + 232 x 256 (or 32 x 128 + 112 x 512) within the "
                "launch's pool");
  // A K row whose chunk count has no divisor that fits (the 656-byte rows: 41 chunks, a prime) is still spread
  // over kThreads / BN threads: each copies ceil(chunks / threads) chunks, the last one predicated off past the
  // row's end (kChunksTail), instead of one thread per row (warp 0 alone issuing every copy).
  static constexpr int kRowChunks = kRowElems / kKvPerChunk;  // 16-byte chunks per K row
  static constexpr int kTprDivisor = largest_common_divisor_upto(
      kRowChunks, kSharedKV ? kRowChunks : DV / kKvPerChunk, kThreads / BN);
  // (the 656-byte rows on e4m3 MMAs: 4 threads per row, so the index ring of 128 loaders fits sm_120's 99 KB)
  static constexpr int kThreadsPerRow =
      kBulk ? 1 : (kTprDivisor == 1 && kSharedKV ? (k656E4m3 ? 4 : kThreads / BN) : kTprDivisor);
  static constexpr int kLoadThreads = BN * kThreadsPerRow;
  // threads with a kv_indices ring slot: the loaders (the bulk loader's lanes sit in every warp: all threads;
  // the producer warp reads its indices from global memory: none)
  static constexpr int kRingThreads = kProducer ? 0 : kBulk ? kThreads : kLoadThreads;
  static constexpr int kChunksK = (kRowChunks + kThreadsPerRow - 1) / kThreadsPerRow;  // cp.async per loader thread
  static constexpr bool kChunksTail = kRowChunks % kThreadsPerRow != 0;  // the last chunk of some threads is past the row
  static constexpr int kChunksV = kSharedKV ? 0 : DV / kKvPerChunk / kThreadsPerRow;
  // the math-roles tile's S warps issue S(i + 1) before the softmax of i, and store its partial scores after it in a
  // second set. Not with the 656-byte rows: four 20,992-byte stages leave no room for a second 8 KB set in sm_120's
  // 99 KB, and their S warps spill with S(i + 1)'s accumulators held over the softmax (16 B on sm_120a)
  static constexpr bool kSAhead = kRoles && !kMla656;
  // the softmax runs on the S warps, at most 8 (v1's split of a tile's scores: P stored in pairs, the 656-byte rows'
  // 4 tokens of a block per lane); with math roles the PV warps have none
  static constexpr int kSoftThreads = kSWarps * 32 < 256 ? kSWarps * 32 : 256;
  static constexpr int kTPL = BM * BN / kSoftThreads;  // softmax: scores per lane, all in one row
  static constexpr int kLanesPerRow = BN / kTPL;

  // the row / first column a lane handles in the softmax
  // (warps past the softmax's get a row of the first ones, so their unused row-indexed reads stay in bounds)
  VA_HD static int soft_row(int warp, int lane) {
    const int w = kSoftThreads == kThreads ? warp : warp % (kSoftThreads / 32);
    return w * (32 / kLanesPerRow) + lane / kLanesPerRow;
  }
  VA_HD static int soft_col(int lane) { return (lane % kLanesPerRow) * kTPL; }

  // 656-byte rows: no pad, the 656-byte pitch is already an odd number (41) of 16-byte units (conflict-free ldmatrix)
  using Smem = SharedMemoryPlanV1<BM, BN, STAGES, KSPLIT, DQK, DV, kSharedKV, int(sizeof(KvElem)), kPBytes, kRowElems,
                                  kMla656 ? 0 : 16, (Tile::BARS == 1 || kSAhead) ? 2 : 1, kMla656 && !k656Roles ? 4 : 1,
                                  kProducer ? 8 : 4, (Tile::BARS == 1 || kRoles) ? 2 : 1, k656Roles>;
  static constexpr int kQStages = Smem::kQStages;
  // the mbarriers (8 bytes each) after the plan's regions: the bulk loader's one per stage; the producer warp's
  // FULL per stage, then EMPTY per stage
  static constexpr size_t kBarOffset = Smem::template total<kRingThreads>();
  // producer warp: its kv_indices ring after the mbarriers, kPIdxSlots tiles x 32 lanes: the index of tile t is
  // copied (cp.async, 4 bytes a lane) kPIdxSlots tiles before its rows, so no tile waits a DRAM round trip for it
  static constexpr int kPIdxSlots = kProducer ? STAGES : 0;
  static constexpr size_t kPIdxOffset = kBarOffset + (kProducer ? size_t(2) * STAGES * 8 : 0);
  static constexpr size_t smem_bytes() {
    return kBulk ? kBarOffset + size_t(STAGES) * 8 : kPIdxOffset + size_t(kPIdxSlots) * 32 * sizeof(int32_t);
  }
  static constexpr uint32_t kKRowBytes = uint32_t(kRowElems) * sizeof(KvElem);  // one bulk copy: a K row
  static constexpr uint32_t kVRowBytes = kSharedKV ? 0u : uint32_t(DV) * sizeof(KvElem);

  static_assert(sizeof(Elem) == 2, "16-bit element types only");
  static_assert(!kBulk || BN % kWarps == 0, "the bulk loader gives every warp BN / kWarps rows");
  // v3: MLA rows (the producer copies one K row per KV token, V is its first Dv columns): 16-bit, e4m3 (576 bytes)
  // or 656-byte rows, each one bulk copy of kKRowBytes; GQA's separate V rows are not produced
  static_assert(!kProducer || kSharedKV, "producer-warp tiles (v3): MLA rows only (V inside the K row)");
  static_assert(!kProducer || (BN <= 32 && kWarps * 32 <= 992),
                "producer-warp tiles: one producer lane per KV row; the math warps' named barrier below 1024");
  // sm_120 (RTX PRO 6000) is the producer-warp tile's target: 99 KB per block, checked here and not only by the
  // build report (4 x 18,688 B of KV + partial scores 12,288 + P 1,536 + stats 384 + mask words 1,024 + 64 B of
  // mbarriers + 512 B of the producer's index ring = 90,560 B for 32 x 16 x 4 stages, config.h)
  static_assert(!kProducer || smem_bytes() <= kSmemLimitSm120, "producer-warp tiles must fit sm_120's 99 KB");
  static_assert(!kBulk || (kKRowBytes % 16 == 0 && kVRowBytes % 16 == 0 && kBarOffset % 8 == 0),
                "bulk copies move whole rows of 16-byte multiples; the mbarriers are 8-byte aligned");
  static_assert(DQK % (kKStep * KSPLIT) == 0, "each S warp's head dims must be whole MMA k steps");
  static_assert(!kFp8 || (BN == 32 && (kSharedKV || kFp8Deq)),
                "e4m3 tiles: 32 tokens (one e4m3 k step, one .trans load); MLA rows, or V rows apart on the f16 tile");
  static_assert(!k656Roles || kE4m3Mma, "656-byte rows on the math-roles tile: the PV warps make e4m3 P fragments");
  static_assert(!kMla656 || (kFp8 && DQK == 576 && DV == 512 && KSPLIT == 2),
                "656-byte rows: MLA 576/512, S split in two halves of 288 dims (9 steps of 32)");
  static_assert(!kMla656 || (Tile::BARS == 2 && k656Block % kODV == 0 && kSKSteps == 9),
                "656-byte rows: two barriers per tile (the block scales of P(i) are read before the second), every "
                "warp's Dv columns inside one 128-column block, S dims 2 blocks + 32 RoPE per warp");
  static_assert(kODV % 16 == 0, "each warp's Dv slice must be whole n16 pairs (ldmatrix x4 .trans)");
  static_assert(kTPL == 1 || kTPL == 2 || kTPL == 4 || kTPL == 8, "1, 2, 4 or 8 scores per softmax lane");
  static_assert(kLanesPerRow <= 32 && (32 % kLanesPerRow) == 0, "a row's softmax lanes stay inside one warp");
  static_assert(kTPL >= 2, "P is stored as pairs of 16-bit values");
  static_assert(kSMT * kQFrags * 4 + MS * kON8 * 4 + kSAcc * kSMT * kSN8 * 4 <= 176,
                "Q fragments + O and S accumulators must leave registers for the rest");
  // sm_120's 99 KB is checked per tile by the build report for the tiles that target sm_120 (build.py TILES)
  static_assert(smem_bytes() <= 227 * 1024, "shared memory must fit sm_90's 227 KB per block");
};

// Kernel v2 (tree_verify_kernel_v2.cuh, sm_90a): MLA (V = the first Dv columns of the K row), 16-bit or e4m3
// caches (kFp8: per-tensor scales, both products on wgmma .e4m3 at k32).
// A KV stage holds BN rows in wgmma's no-swizzle core-matrix layout: token t, 16-byte chunk c (8 16-bit or 16
// e4m3 dims) at byte (t / 8) kGroupBytes + c 128 + (t % 8) 16. S = Q K^T reads it K-major (LBO 128, SBO
// kGroupBytes); with 16-bit caches O += P V reads it MN-major (LBO kGroupBytes, SBO 128). Q (BM rows) sits
// before the stages in the same layout (e4m3: quantized per row) and is the S wgmma's A operand.
// e4m3 has no MN-major wgmma operand: each tile's V is transposed into a V^T buffer (double-buffered): dim d,
// k position kappa (a permutation of the tile's tokens, fp8_pv_token_of_k) at (d / 8) kVtSbo + (kappa / 16)
// kVtLbo + (d % 8) 16 + kappa % 16, K-major for the P V wgmma; kVtLbo 144 and kVtSbo 288 (not 128, 256) spread a
// warp's 4-byte transposing stores over all 32 banks.
template <class Elem_, class Head, class Layout_, class Tile, bool kFp8_ = false>
struct KernelTraitsV2 {
  using Elem = Elem_;
  using Layout = Layout_;
  static constexpr bool kFp8 = kFp8_;
  using KvElem = std::conditional_t<kFp8, uint8_t, Elem>;  // K / V storage; also the wgmma operand type
  static constexpr int DQK = Head::DQK;
  static constexpr int DV = Head::DV;
  static constexpr int BM = Tile::BM, BN = Tile::BN, STAGES = Tile::STAGES, WG = Tile::WG;
  static constexpr int kWarps = Tile::kWarps;
  static constexpr int kThreads = Tile::kThreads;
  static constexpr int kBlockThreads = kThreads;  // the launch's block (no producer warp)
  static constexpr int kChunkElems = 16 / int(sizeof(KvElem));  // elements per 16-byte chunk
  static constexpr int kKStep = kFp8 ? 32 : 16;  // wgmma k: two chunks
  static constexpr int kSDims = DQK / WG;        // head dims per warpgroup in S
  static constexpr int kSKSteps = kSDims / kKStep;  // wgmma k steps of S per warpgroup
  static constexpr int kODV = DV / WG;           // Dv columns per warpgroup in O (the P V wgmma's N)
  static constexpr int kPKSteps = BN / kKStep;   // k steps of P V
  static constexpr int kChunks = DQK / kChunkElems;             // 16-byte chunks per KV row
  static constexpr int kGroupBytes = kChunks * 128;             // 8 tokens x one row's chunks
  static constexpr size_t kStageBytes = size_t(BN / 8) * kGroupBytes;
  static constexpr int kTPR = kThreads / BN;     // loader threads per KV row
  static constexpr int kChunksPerThread = (kChunks + kTPR - 1) / kTPR;  // the last one guarded where uneven
  static constexpr int kSAccN = BN / 2;          // S accumulator floats per thread
  static constexpr int kOAccN = kODV / 2;        // O accumulator floats per thread
  static constexpr int kVtLbo = 144, kVtSbo = 288;                    // e4m3: the V^T buffers' core-matrix strides
  static constexpr size_t kVtBytes = kFp8 ? size_t(DV / 8) * kVtSbo : 0;  // one V^T buffer

  static constexpr size_t kQ = 0;                                     // (BM rows) Q, core-matrix layout
  static constexpr size_t kKV = size_t(BM / 8) * kGroupBytes;         // STAGES KV tiles
  static constexpr size_t kPart = kKV + size_t(STAGES) * kStageBytes;  // (2, WG, kSAccN / 4, 128 threads, 4) partial scores
  static constexpr size_t kMask = kPart + size_t(2) * WG * 128 * kSAccN * sizeof(float);
  static constexpr int kMaskStage = 4;  // tree-mask words staged per row (trees up to 128 nodes)
  static constexpr size_t kVt = kMask + size_t(BM) * kMaskStage * sizeof(uint32_t);  // e4m3: 2 V^T buffers
  static constexpr size_t kQScale = kVt + 2 * kVtBytes;                 // e4m3: each Q row's scale (BM floats)
  // prefetch.global.L2 of each tile's KV rows kPrefetch iterations before its cp.asyncs (the copies then hit L2;
  // bench.model reads the distance from verify_attn/build.py V2_PREFETCH, which a test keeps equal); its index
  // comes from the same ring, so the ring runs kPrefetch tiles further ahead and holds kPrefetch more slots
  static constexpr int kPrefetch = 2;
  // kv_indices ring: slots per thread (tree_verify_kernel_v2.cuh), STAGES - 2 + kPrefetch rounded up to a power of
  // two (a slot number is then a mask of the tile number, not a division)
  static constexpr int pow2_ceil(int n) { return n <= 1 ? 1 : 2 * pow2_ceil((n + 1) / 2); }
  static constexpr int kIdxSlots = pow2_ceil(STAGES - 2 + kPrefetch);
  // L2 prefetch addresses per KV row: row + 128 j, the last one the row's last byte, so that every 128-byte line
  // the row touches is named whatever the row's alignment (576-byte e4m3 rows sit 64 bytes off every other row)
  static constexpr int kRowBytes = DQK * int(sizeof(KvElem));
  static constexpr int kLineLanes = (kRowBytes + 127) / 128 + 1;
  static constexpr size_t kIdx = kQScale + (kFp8 ? size_t(BM) * sizeof(float) : 0);
  static constexpr size_t kTotal = kIdx + size_t(kIdxSlots) * kThreads * sizeof(int32_t);
  static constexpr size_t smem_bytes() { return kTotal; }

  static_assert(sizeof(Elem) == 2, "q and out: 16-bit element types only");
  static_assert(Head::kSharedKV && DV <= DQK, "v2: MLA rows, V = K[..., :Dv]");
  static_assert(DQK % WG == 0 && kSDims % kKStep == 0, "each warpgroup's dims: whole k steps");
  static_assert(kODV == 64 || kODV == 128 || kODV == 256, "the P V wgmma's N (csrc/arch/gen_wgmma.py)");
  static_assert(kThreads % BN == 0 && BN % 8 == 0 && kThreads / (8 * kTPR) == BN / 8,
                "loader: 8 tokens x kTPR chunk lanes per 8 * kTPR threads");
  static_assert(!kFp8 || (BN == 32 && DV % 16 == 0 && kThreads == 256 && (DV / 16) % kWarps == 0),
                "e4m3: 32 tokens (one k32 step of P V; the V^T transposition's lanes), whole chunks of V per warp");
  static_assert(BM % 8 == 0, "Q: whole 8-row core-matrix groups");
  static_assert(kOAccN + kSAccN <= 176, "O and S accumulators per thread");
  static_assert(smem_bytes() <= 227 * 1024, "shared memory must fit sm_90's 227 KB per block (and the 14-bit "
                "descriptor address field's 256 KB)");
};

}  // namespace va::tv
