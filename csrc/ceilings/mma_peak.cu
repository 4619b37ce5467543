// The mma.sync-class tensor rate of the GPU at hand: the ceiling the roofline floor
// uses for kernels built on warp-level mma.sync (sm_120 has nothing faster; on sm_90
// cuBLAS uses wgmma and reaches more, so a cuBLAS GEMM would overstate what our
// kernels can reach). Register-resident: no memory traffic in the loop.
//
// Each warp runs `iters` rounds of kChains independent m16n8k16 MMAs (independent
// accumulators hide the MMA latency); FLOPs = blocks * warps * iters * kChains * 4096.
#include <stdexcept>
#include <string>

#include "arch/arch.cuh"
#include "ceilings/mma_peak.h"

namespace va::ceil {

constexpr int kChains = 8;
constexpr int kThreads = 256;

template <class T>
__global__ void __launch_bounds__(kThreads) mma_peak_kernel(int iters, float* __restrict__ out) {
  // Operands from the thread id, so nothing folds at compile time: 0x3c00 is 1.0 in
  // fp16 and 2^-7 in bf16, small enough that the fp32 sums stay finite.
  const uint32_t one = 0x3c003c00u ^ (threadIdx.x & 1u);
  const uint32_t a[4] = {one, one, one, one};
  const uint32_t b[2] = {one, one};
  float acc[kChains][4] = {};
  for (int it = 0; it < iters; ++it) {  // sass-model: tile-loop
#pragma unroll
    for (int j = 0; j < kChains; ++j) arch::mma_m16n8k16<T>(acc[j], a, b, acc[j]);
  }
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kChains; ++j) sum += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
  arch::st_global(out + blockIdx.x * kThreads + threadIdx.x, sum);  // keeps the loop alive
}

// HMMA.16816 latency: one warp, one dependent accumulate chain, timed with the SM clock.
// out[0] = cycles per MMA (the model's hmma_latency constant).
__global__ void __launch_bounds__(32) mma_latency_kernel(int iters, float* __restrict__ out) {
  const uint32_t one = 0x3c003c00u ^ (threadIdx.x & 1u);
  const uint32_t a[4] = {one, one, one, one};
  const uint32_t b[2] = {one, one};
  float acc[4] = {};
  for (int it = 0; it < 16; ++it) arch::mma_m16n8k16<__nv_bfloat16>(acc, a, b, acc);  // warm up
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) arch::mma_m16n8k16<__nv_bfloat16>(acc, a, b, acc);
  const long long t1 = clock64();
  if (threadIdx.x == 0) arch::st_global(out, static_cast<float>(t1 - t0) / iters);
  if (acc[0] == 12345.f) arch::st_global(out + 1, acc[1]);  // keeps the chain alive
}

// Read bandwidth: the grid sweeps `buf` (n float4) `repeats` times, grid-stride. A buffer that
// fits in L2 measures L2 -> SM bandwidth (the model's l2_gbs); one far larger than L2 measures a
// DRAM read stream (dram_gbs x dram_efficiency). Bytes read = 16 * n * repeats.
__global__ void __launch_bounds__(256) read_bw_kernel(const float4* __restrict__ buf, long long n, int repeats,
                                                      float* __restrict__ out) {
  float acc = 0.f;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (int r = 0; r < repeats; ++r)
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
      const float4 v = buf[i];
      acc += v.x + v.y + v.z + v.w;
    }
  if (acc == 12345.f) arch::st_global(out + blockIdx.x, acc);  // keeps the loads; never true for a zero buffer
}

// ---------------------------------------------------------------------------------------------
// wgmma (sm_90a): the warpgroup MMA rate and its completion latency.
//
// Each warpgroup of the block runs `iters` rounds of one commit group: kWgKSteps dependent
// wgmma_rs<bf16, kWgN, false> (m64n256k16, A from registers, B from a K-major shared-memory tile
// of kWgN x kWgBK written once, the k steps cycling through its kWgBK / 16 slices), committed and
// waited with wgmma_wait<1>, so one group runs while the next is issued. FLOPs =
// blocks * warpgroups * iters * kWgKSteps * (2 * 64 * kWgN * 16). Shared-memory operand bytes per
// wgmma: kWgN * 16 * 2 (B; A is in registers). The loop is marked for the SASS model
// (bench/model/probes.py), which predicts this kernel's rate without a GPU.
//
// Built for another arch (sm_120a: VA_HAS_WGMMA is 0), the kernels compile to nothing: `out` is left
// as the caller filled it (bench/ceilings.py fills it with NaN and refuses a non-finite result).
constexpr int kWgN = 256;
constexpr int kWgKSteps = 8;
constexpr int kWgBK = 64;                     // K extent of the B tile in shared memory
constexpr int kWgThreads = 256;               // two warpgroups
constexpr int kWgSmemBytes = kWgN * kWgBK * 2;  // 32 KB

// Pins the accumulators in place for the compiler (no instruction): without it nvcc may move the
// reads of d after the loop above the wgmma_wait that retires them, and ptxas then serializes every
// wgmma (C7514). CUTLASS's warpgroup_fence_operand does the same.
template <int M>
__device__ __forceinline__ void pin_accumulators(float (&d)[M]) {
#pragma unroll
  for (int j = 0; j < M; ++j) asm volatile("" : "+f"(d[j])::"memory");
}

// The first `words` bf16 of dynamic shared memory set to 0x3c00 (2^-7), fenced for the wgmma's async proxy and
// published to the block: the probes' operand tiles.
__device__ __forceinline__ uint16_t* fill_operand_tiles(int words) {
  uint16_t* sm = arch::smem_dynamic<uint16_t>();
  for (int i = threadIdx.x; i < words; i += blockDim.x) sm[i] = 0x3c00;
  arch::fence_proxy_async();  // generic-proxy stores -> the wgmma's async-proxy reads
  arch::block_sync();
  return sm;
}
// An operand tile of rows x kWgBK bf16, K-major, no swizzle: core matrices of 8 rows x 16 B; LBO 128 B between the
// core matrices along K, SBO (kWgBK / 8) * 128 B between groups of 8 rows.
__device__ __forceinline__ uint64_t operand_desc(const uint16_t* tile) {
  return arch::wgmma_desc(tile, 128, (kWgBK / 8) * 128);
}
// B (kWgN x kWgBK) of the peak and latency kernels.
__device__ __forceinline__ uint64_t wgmma_peak_fill_b() { return operand_desc(fill_operand_tiles(kWgN * kWgBK)); }

__global__ void __launch_bounds__(kWgThreads) wgmma_peak_kernel(int iters, float* __restrict__ out) {
#if VA_HAS_WGMMA  // csrc/arch/wgmma.cuh: sm_90a device code
  const uint64_t desc = wgmma_peak_fill_b();
  const uint32_t one = 0x3c003c00u ^ (threadIdx.x & 1u);  // from the thread id: nothing folds
  const uint32_t a[4] = {one, one ^ 2u, one ^ 4u, one ^ 6u};  // distinct: one register each, no copies
  float d[kWgN / 2] = {};
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {  // sass-model: tile-loop
    arch::wgmma_fence();
#pragma unroll
    for (int k = 0; k < kWgKSteps; ++k)  // k step k reads B's k slice k % (kWgBK / 16): 2 core matrices on
      arch::wgmma_rs<__nv_bfloat16, kWgN, false>(d, a, arch::wgmma_desc_advance(desc, (k % (kWgBK / 16)) * 256),
                                                 true);
    arch::wgmma_commit();
    arch::wgmma_wait<1>();
  }
  arch::wgmma_wait<0>();
  pin_accumulators(d);
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kWgN / 2; ++j) sum += d[j];
  arch::st_global(out + blockIdx.x * kWgThreads + threadIdx.x, sum);
#endif
}

// wgmma completion latency: one warpgroup, each round one m64nNk16 wgmma then wgmma_wait<0> (nothing
// in flight), timed with the SM clock. out[0] = cycles per round: the model's HGMMA pipe time (N / 2
// cycles at 4096 FLOP/clk/SM) plus its hgmma_latency plus the round's few instructions. out[1] keeps the
// chain alive (never written for finite sums).
template <int N>
__global__ void __launch_bounds__(128) wgmma_latency_kernel(int iters, float* __restrict__ out) {
#if VA_HAS_WGMMA  // csrc/arch/wgmma.cuh: sm_90a device code
  const uint64_t desc = wgmma_peak_fill_b();
  const uint32_t one = 0x3c003c00u ^ (threadIdx.x & 1u);
  const uint32_t a[4] = {one, one ^ 2u, one ^ 4u, one ^ 6u};
  float d[N / 2] = {};
#pragma unroll 1
  for (int it = 0; it < 4; ++it) {  // warm up
    arch::wgmma_fence();
    arch::wgmma_rs<__nv_bfloat16, N, false>(d, a, desc, true);
    arch::wgmma_commit();
    arch::wgmma_wait<0>();
  }
  const long long t0 = clock64();
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {  // sass-model: tile-loop
    arch::wgmma_fence();
    arch::wgmma_rs<__nv_bfloat16, N, false>(d, a, desc, true);
    arch::wgmma_commit();
    arch::wgmma_wait<0>();
  }
  const long long t1 = clock64();
  pin_accumulators(d);
  if (threadIdx.x == 0) arch::st_global(out, static_cast<float>(t1 - t0) / iters);
  if (d[0] == 12345.f) arch::st_global(out + 1, d[1]);  // keeps the chain alive
#endif
}

// ---------------------------------------------------------------------------------------------
// wgmma operand bandwidth (sm_90a): whether a wgmma that reads A from shared memory (SS, as Hopper v3's
// S = Q K^T reads Q) is bound by shared memory where the same wgmma with A in registers (RS) is not, and
// whether copies landing in shared memory take the same bandwidth.
//
// Warpgroups 0 and 1 of the block each run `iters` rounds of kWgKSteps k steps (cycling through the tiles'
// kWgBK / 16 slices), each step one wgmma m64nNk16 into each of op_chains(N) accumulators (64 / N below
// N = 64: enough independent wgmmas that the RS form is bound by the tensor pipe, not by one accumulator's
// chain), one commit group a round, wait_group 1, as wgmma_peak_kernel does. B is a K-major N x kWgBK tile
// of the warpgroup's own; A (SS) a K-major 64 x kWgBK tile both warpgroups read (Q is one tile that both of
// v3's consumer warpgroups read), or (RS) registers. Operand bytes per wgmma: N * 32 (B) plus 2,048 (A,
// SS). bench.model charges them at 128 B/clk per SM against the tensor pipe's 4,096 FLOP/clk per SM: a
// wgmma needs N / 2 tensor cycles and (64 + N) / 4 (SS) or N / 4 (RS) shared-memory cycles, so SS is bound
// by shared memory below N = 64 (at N = 16: 20 against 8 cycles), and the two forms meet at N = 64, where
// v3's S runs. FLOPs = blocks * 2 * iters * kWgKSteps * op_chains(N) * (2 * 64 * N * 16).
//
// Warpgroup 2, the copier, meanwhile lands `copy_rounds` rounds of 16 KB (8 16-byte cp.async a thread, at
// most 3 rounds in flight) from the block's own 64 KB of `src` (L2-resident after the first round) into a
// 64 KB ring, as v3's producer lands KV rows while its consumers' wgmmas read; with copy_rounds 0 it exits
// at once. bench.model adds copies landing and operand reads on one 128 B/clk budget (Hopper v3's pair:
// copies 1,152 of its 4,800 shared-memory cycles); timing copies alone, wgmmas alone and both together
// tells whether they share it. kOpSmemBytes of dynamic shared memory keeps one block an SM.
constexpr int kOpThreads = 384;
constexpr int kOpRingBytes = 64 * 1024;
constexpr int kOpCopyRoundBytes = 128 * 8 * 16;
constexpr int kOpSmemBytes = 160 * 1024;  // > half of 227 KB: one block an SM, whatever N's registers allow
__host__ __device__ constexpr int op_chains(int n) { return n >= 64 ? 1 : 64 / n; }

template <int N, bool kSS>
__global__ void __launch_bounds__(kOpThreads) wgmma_operand_kernel(int iters, int copy_rounds,
                                                                   const uint4* __restrict__ src,
                                                                   float* __restrict__ out) {
#if VA_HAS_WGMMA
  constexpr int kTileWords = (64 + 2 * N) * kWgBK;
  static_assert(kTileWords * 2 + kOpRingBytes <= kOpSmemBytes, "A, both B tiles and the ring fit");
  uint16_t* sm = fill_operand_tiles(kTileWords);
  if (threadIdx.x >= 256) {  // the copier
    uint8_t* ring = reinterpret_cast<uint8_t*>(sm + kTileWords);
    const uint4* mine = src + static_cast<size_t>(blockIdx.x) * (kOpRingBytes / 16);
    const int p = threadIdx.x - 256;
#pragma unroll 1
    for (int r = 0; r < copy_rounds; ++r) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int chunk = ((r * 8 + j) * 128 + p) % (kOpRingBytes / 16);
        arch::cp_async_16(ring + chunk * 16, mine + chunk);
      }
      arch::cp_async_commit();
      arch::cp_async_wait<2>();
    }
    arch::cp_async_wait<0>();
    return;
  }
  const int wg = threadIdx.x / 128;
  const uint64_t desc_a = operand_desc(sm), desc_b = operand_desc(sm + (64 + wg * N) * kWgBK);
  const uint32_t one = 0x3c003c00u ^ (threadIdx.x & 1u);  // RS: from the thread id, so nothing folds
  const uint32_t a[4] = {one, one ^ 2u, one ^ 4u, one ^ 6u};
  constexpr int kChains = op_chains(N);
  float d[kChains][N / 2] = {};
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {  // sass-model: tile-loop
    arch::wgmma_fence();
#pragma unroll
    for (int k = 0; k < kWgKSteps; ++k) {
      const uint32_t off = (k % (kWgBK / 16)) * 256;  // k step k: 2 core matrices on along K
#pragma unroll
      for (int c = 0; c < kChains; ++c) {
        if constexpr (kSS)
          arch::wgmma_ss<__nv_bfloat16, N, false>(d[c], arch::wgmma_desc_advance(desc_a, off),
                                                  arch::wgmma_desc_advance(desc_b, off), true);
        else
          arch::wgmma_rs<__nv_bfloat16, N, false>(d[c], a, arch::wgmma_desc_advance(desc_b, off), true);
      }
    }
    arch::wgmma_commit();
    arch::wgmma_wait<1>();
  }
  arch::wgmma_wait<0>();
  float sum = 0.f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) {
    pin_accumulators(d[c]);
#pragma unroll
    for (int j = 0; j < N / 2; ++j) sum += d[c][j];
  }
  arch::st_global(out + blockIdx.x * kWgThreads + threadIdx.x, sum);
#endif
}

void launch_wgmma_operands(int n, bool ss, int blocks, int iters, int copy_rounds, const void* src, float* out,
                           cudaStream_t stream) {
  const auto go = [&](auto kernel) {
    arch::launch(kernel, dim3(blocks), dim3(kOpThreads), kOpSmemBytes, stream, iters, copy_rounds,
                 static_cast<const uint4*>(src), out);
  };
  switch (n * 2 + (ss ? 1 : 0)) {
    case 16 * 2: go(wgmma_operand_kernel<16, false>); break;
    case 16 * 2 + 1: go(wgmma_operand_kernel<16, true>); break;
    case 32 * 2: go(wgmma_operand_kernel<32, false>); break;
    case 32 * 2 + 1: go(wgmma_operand_kernel<32, true>); break;
    case 64 * 2: go(wgmma_operand_kernel<64, false>); break;
    case 64 * 2 + 1: go(wgmma_operand_kernel<64, true>); break;
    case 256 * 2: go(wgmma_operand_kernel<256, false>); break;
    case 256 * 2 + 1: go(wgmma_operand_kernel<256, true>); break;
    default: throw std::invalid_argument("wgmma_operands: N must be 16, 32, 64 or 256, not " + std::to_string(n));
  }
}

double wgmma_operand_flops(int blocks, int iters, int n) {
  return double(blocks) * (kWgThreads / 128) * iters * kWgKSteps * op_chains(n) * (2.0 * 64 * n * 16);
}

int wgmma_operand_copy_bytes() { return kOpCopyRoundBytes; }
int wgmma_operand_src_bytes() { return kOpRingBytes; }

void launch_wgmma_peak(int blocks, int iters, float* out, cudaStream_t stream) {
  arch::launch(wgmma_peak_kernel, dim3(blocks), dim3(kWgThreads), kWgSmemBytes, stream, iters, out);
}

void launch_wgmma_latency(int iters, float* out, cudaStream_t stream) {
  arch::launch(wgmma_latency_kernel<64>, dim3(1), dim3(128), kWgSmemBytes, stream, iters, out);
  arch::launch(wgmma_latency_kernel<256>, dim3(1), dim3(128), kWgSmemBytes, stream, iters, out + 2);
}

double wgmma_peak_flops(int blocks, int iters) {
  return double(blocks) * (kWgThreads / 128) * iters * kWgKSteps * (2.0 * 64 * kWgN * 16);
}

int wgmma_peak_threads() { return kWgThreads; }

void launch_mma_latency(int iters, float* out, cudaStream_t stream) {
  arch::launch(mma_latency_kernel, dim3(1), dim3(32), 0, stream, iters, out);
}

void launch_read_bw(const void* buf, long long n_float4, int blocks, int repeats, float* out, cudaStream_t stream) {
  arch::launch(read_bw_kernel, dim3(blocks), dim3(256), 0, stream, static_cast<const float4*>(buf), n_float4,
               repeats, out);
}

double mma_peak_flops(int blocks, int iters) {
  return double(blocks) * (kThreads / 32) * iters * kChains * (2.0 * 16 * 8 * 16);
}

int mma_peak_threads() { return kThreads; }

void launch_mma_peak(bool bf16, int blocks, int iters, float* out, cudaStream_t stream) {
  if (bf16) arch::launch(mma_peak_kernel<__nv_bfloat16>, dim3(blocks), dim3(kThreads), 0, stream, iters, out);
  else arch::launch(mma_peak_kernel<__half>, dim3(blocks), dim3(kThreads), 0, stream, iters, out);
}

}  // namespace va::ceil
