// Warpgroup-level asynchronous MMA (sm_90a): wgmma.mma_async and its fences.
//
// PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions":
// https://docs.nvidia.com/cuda/parallel-thread-execution/#asynchronous-warpgroup-level-matrix-instructions
//
// A warpgroup is 4 consecutive warps (warp w of the block is warp w % 4 of warpgroup w / 4); all 128
// threads execute every wgmma instruction below (.sync.aligned). One wgmma_rs / wgmma_ss computes
// D (64 x N, fp32) = A (64 x 16) B (16 x N) + (accumulate ? D : 0) with 16-bit A and B (T bf16 or f16), or
// A (64 x 32) B (32 x N) with e4m3 A and B (T = uint8_t, the codes; k32, at twice the 16-bit rate): a 16-byte
// core-matrix row then holds 16 elements, the A fragment is mma.m16n8k32's (byte i of a[r]: row g + 8 (r % 2),
// k 4t + i + 16 (r / 2)) and B is K-major only (the PTX ISA transposes 16-bit operands only):
//   * A from registers (wgmma_rs): warp q of the warpgroup holds rows 16q .. 16q+15 as the A fragment of
//     mma.m16n8k16 (csrc/arch/mma.cuh); or from shared memory through a matrix descriptor (wgmma_ss, K-major).
//   * B from shared memory through a matrix descriptor: K-major (kTransB = false: B stored N x 16 with k
//     contiguous, like the K rows of a KV cache for S = Q K^T) or MN-major (kTransB = true: stored 16 x N
//     with n contiguous, like V rows for O = P V).
//   * D: N / 2 floats per thread. Warp q, lane (g = lane / 4, t = lane % 4): d[i] is row 16q + g + 8 ((i % 4) / 2),
//     column 8 (i / 4) + 2t + (i % 2): the mma.m16n8k16 C fragment of each n8 block in turn.
// The instruction is asynchronous: its operands may be read and D written at any time until the
// wgmma_wait that retires its commit group. Rules the caller keeps (the emulator checks the first four):
//   1. wgmma_fence() before the first wgmma, and again after any register that a wgmma reads (A, D)
//      was touched by other instructions (this API requires it after every wgmma_wait);
//   2. D is not read or written, and the smem operands are not overwritten, until the wgmma_wait that
//      retires the wgmma (a chain of wgmmas of one shape may accumulate into the same D meanwhile);
//   3. shared memory written through the generic proxy (st.shared: st_shared, cp.async) is made visible to the
//      wgmma's async proxy by fence_proxy_async() in the writing thread, then a barrier;
//   4. the 4 warps of a warpgroup issue the same wgmma sequence (same shapes and descriptors);
//   5. A registers of wgmma_rs stay unchanged until the wait (the emulator reads them at issue).
//
// Matrix descriptors (wgmma_desc, no swizzle): the operand is made of 8 x 16-byte core matrices, each
// 128 contiguous bytes (8 rows of 8 16-bit elements). In elements (PTX ISA "Shared Memory Matrix Layout",
// canonical layouts, no swizzling):
//   K-major  (row r of M / N, k):  (r % 8) * 8 + (r / 8) * SBO + (k % 8) + (k / 8) * LBO
//   MN-major (n, k):               (n % 8)     + (n / 8) * SBO + (k % 8) * 8 + (k / 8) * LBO
// LBO ("leading dimension byte offset") steps between core matrices along K, SBO ("stride dimension")
// along M / N; both in bytes, multiples of 16, below 2^18.
#pragma once

#include <type_traits>

#include "defs.cuh"
#if VA_EMULATION
#include <source_location>

#include "../emu/device.h"
#else
#include "wgmma_ptx.inc"
#endif

namespace va::arch {

// The 64-bit shared-memory matrix descriptor of an operand that starts at `smem` (16-byte aligned),
// no swizzle: bits 0-13 start address >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4, 49-51 base offset (0),
// 62-63 swizzle mode (0).
VA_DEVICE uint64_t wgmma_desc(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes) {
#if VA_EMULATION
  const uint64_t addr = ::va::emu::smem_offset(smem);
#else
  const uint64_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
#endif
  return ((addr >> 4) & 0x3FFFull) | (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32);
}

// 128-byte-swizzled operands (descriptor swizzle mode 1; CUTLASS's Layout_K_SW128 / Layout_MN_SW128 atoms), the
// layout TMA boxes write and FlashMLA / FA3 read. In 16-byte chunks, from a 1024-byte-aligned start (the atom's
// repeat: the XOR below works on the address bits, so keep dynamic shared memory free of static buffers before it):
//   K-major  (row r, chunk c of its 8 along k; 64 16-bit k a line):  r % 8 lines of 128 B, r / 8 atoms SBO apart;
//   MN-major (n chunk c of 8 along n, k):                             k % 8 lines of 128 B, k / 8 atoms SBO apart,
//                                                                     n / 64 blocks LBO apart (unused for N <= 64);
// then chunk c lands at chunk c ^ (line % 8) of its line (address bits 4-6 ^= bits 7-9). K-major's LBO is unused (the
// op's two k chunks are adjacent): pass 16. The same smem tile serves a KV row block K-major for S = Q K^T and
// MN-major for O = P V. A k16 step advances a K-major descriptor 32 bytes, an MN-major one 2 atoms (2 x SBO).
VA_DEVICE uint64_t wgmma_desc_sw128(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return wgmma_desc(smem, lbo_bytes, sbo_bytes) | (1ull << 62);
}
// Byte offset of a K-major 128B-swizzled operand's chunk `chunk` (0..7) of row `row`: where its cp.async writes.
VA_DEVICE constexpr uint32_t sw128_kmajor_offset(int row, int chunk, uint32_t sbo_bytes) {
  return static_cast<uint32_t>(row / 8) * sbo_bytes + static_cast<uint32_t>(row % 8) * 128 +
         static_cast<uint32_t>((chunk ^ (row % 8)) & 7) * 16;
}
// Byte offset of an MN-major 128B-swizzled operand's n chunk `nchunk` (8 elements) of k row `k`.
VA_DEVICE constexpr uint32_t sw128_mnmajor_offset(int k, int nchunk, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return static_cast<uint32_t>(nchunk / 8) * lbo_bytes + static_cast<uint32_t>(k / 8) * sbo_bytes +
         static_cast<uint32_t>(k % 8) * 128 + static_cast<uint32_t>(((nchunk % 8) ^ (k % 8)) & 7) * 16;
}

// The descriptor of the same layout `bytes` further on (a later k step or n block): the start address
// field advances by bytes >> 4 (bytes a multiple of 16; the address stays below 2^18, so nothing carries
// out of the field). A 32-bit add on the low word: no 64-bit carry chain per wgmma.
VA_DEVICE uint64_t wgmma_desc_advance(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

// Pins an accumulator's registers at this point of the program (an empty asm that reads and writes each):
// placed around a wgmma batch and after its wait, it keeps the compiler from moving other instructions'
// reads of the accumulator into the batch's flight, which makes ptxas serialize every wgmma (C7514).
// CUTLASS's warpgroup_fence_operand does the same. No-op in the emulator.
template <int N>
VA_DEVICE void wgmma_fence_operand(float (&d)[N]) {
#if !VA_EMULATION
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
#else
  (void)d;
#endif
}

// The operand types and shapes the wrappers offer (csrc/arch/gen_wgmma.py generates the same set).
template <class T, int N, bool kTransB>
VA_DEVICE constexpr void wgmma_check_types() {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half> || std::is_same_v<T, uint8_t>,
                "wgmma: T is bf16, f16 or uint8_t (e4m3 codes)");
  static_assert(!std::is_same_v<T, uint8_t> || !kTransB, "wgmma .e4m3: B is K-major only");
  static_assert(N == 8 || N == 16 || N == 32 || N == 64 || N == 128 || N == 256,
                "wgmma: csrc/arch/gen_wgmma.py generates N = 8, 16, 32, 64, 128, 256");
}

#if VA_EMULATION

VA_DEVICE void wgmma_fence(std::source_location loc = std::source_location::current()) {
  ::va::emu::wgmma_fence(loc);
}
VA_DEVICE void wgmma_commit(std::source_location loc = std::source_location::current()) {
  ::va::emu::wgmma_commit(loc);
}
// Wait until at most N committed wgmma groups of this warp are pending; their D registers are then valid.
template <int N>
VA_DEVICE void wgmma_wait(std::source_location loc = std::source_location::current()) {
  static_assert(N >= 0 && N <= 7, "wgmma.wait_group N: 0..7");
  ::va::emu::wgmma_wait(N, loc);
}
// fence.proxy.async.shared::cta: this thread's earlier generic-proxy shared-memory writes (including its
// landed cp.async copies) become visible to later async-proxy reads (wgmma operands) once a barrier follows.
VA_DEVICE void fence_proxy_async() { ::va::emu::fence_proxy_async(); }

template <class T>
constexpr int wgmma_kind() {
  return std::is_same_v<T, uint8_t> ? ::va::emu::kWgmmaE4m3
                                    : std::is_same_v<T, __nv_bfloat16> ? ::va::emu::kWgmmaBf16 : ::va::emu::kWgmmaF16;
}
template <class T, int N, bool kTransB>
VA_DEVICE void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate,
                        std::source_location loc = std::source_location::current()) {
  wgmma_check_types<T, N, kTransB>();
  ::va::emu::wgmma(N, wgmma_kind<T>(), d, a, 0, desc_b, kTransB, accumulate, loc);
}
template <class T, int N, bool kTransB>
VA_DEVICE void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate,
                        std::source_location loc = std::source_location::current()) {
  wgmma_check_types<T, N, kTransB>();
  ::va::emu::wgmma(N, wgmma_kind<T>(), d, nullptr, desc_a, desc_b, kTransB, accumulate, loc);
}

#else  // nvcc

// wgmma exists on sm_90a only; built for another target the wrappers trap (kernels that use them are
// compiled for sm_90a only: build.py's tile archs).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define VA_HAS_WGMMA 1
#else
#define VA_HAS_WGMMA 0
#endif

VA_DEVICE void wgmma_fence() {
#if VA_HAS_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
VA_DEVICE void wgmma_commit() {
#if VA_HAS_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
VA_DEVICE void wgmma_wait() {
  static_assert(N >= 0 && N <= 7, "wgmma.wait_group N: 0..7");
#if VA_HAS_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// (sm_90 and later, not only where wgmma is: sm_120a's bulk copies are async-proxy writes too)
VA_DEVICE void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

template <class T, int N, bool kTransB>
VA_DEVICE void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
  wgmma_check_types<T, N, kTransB>();
#if VA_HAS_WGMMA
  VA_WGMMA_RS_BODY
#else
  __trap();
#endif
}
template <class T, int N, bool kTransB>
VA_DEVICE void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  wgmma_check_types<T, N, kTransB>();
#if VA_HAS_WGMMA
  VA_WGMMA_SS_BODY
#else
  __trap();
#endif
}

#endif  // VA_EMULATION

}  // namespace va::arch
