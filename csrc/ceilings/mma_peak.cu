// The mma.sync-class tensor rate of the GPU at hand: the ceiling the roofline floor
// uses for kernels built on warp-level mma.sync (sm_120 has nothing faster; on sm_90
// cuBLAS uses wgmma and reaches more, so a cuBLAS GEMM would overstate what our
// kernels can reach). Register-resident: no memory traffic in the loop.
//
// Each warp runs `iters` rounds of kChains independent m16n8k16 MMAs (independent
// accumulators hide the MMA latency); FLOPs = blocks * warps * iters * kChains * 4096.
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
  for (int it = 0; it < iters; ++it) {
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
