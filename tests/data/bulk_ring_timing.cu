// A check of bench.model's bulk-copy mechanism on a GPU (not run by the tests): times tests/data/bulk_copy_loop.cu's
// kernels, 132 CTAs x 256 threads, 2,000 tiles of 32 random 1,152-byte rows each from a 1.2 GB buffer (each CTA its
// own rows); cycles per tile = kernel time x SM clock / tiles (the clock from a clock64 spin).
//   cd tests/data && nvcc -arch=sm_90a -O3 -o bulk_ring_timing bulk_ring_timing.cu && ./bulk_ring_timing
// The model's reading of the same kernels (sm_90a, 2 warps per scheduler, warp 0's 32 lanes copying, the H200's
// DRAM share of one SM, the constants of 2026-12-04), predicted before any run: bulk_ring<4, 32> 3,558 cycles per
// tile (its index LDG's round trip, then the 32 copies' issue; the copies' landing hidden 3 tiles deep),
// bulk_simple 5,782 (the LDG, one copy's issue, the rows' stream, their landing: waited in the same iteration).
#include "bulk_copy_loop.cu"
#include <cstdio>
#include <vector>
#include <random>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)
__global__ void spin(long long cycles, long long* out) {
  long long t0 = clock64(); while (clock64() - t0 < cycles) {} if (threadIdx.x == 0) out[blockIdx.x] = clock64() - t0;
}
int main() {
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int n = 2000, rows_total = 1 << 20;
  char* src; CK(cudaMalloc(&src, (size_t)rows_total * 1152)); CK(cudaMemset(src, 1, (size_t)rows_total * 1152));
  std::vector<int> h((size_t)n * 32 * sms);
  std::mt19937 g(1); for (auto& x : h) x = g() % rows_total;
  int* idx; CK(cudaMalloc(&idx, h.size() * 4));
  float* out; CK(cudaMalloc(&out, sms * 256 * 4));
  long long* sp; CK(cudaMalloc(&sp, sms * 8));
  // clock: a 20M-cycle spin on every SM
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  spin<<<sms, 32>>>(1000000, sp); CK(cudaDeviceSynchronize());
  cudaEventRecord(a); spin<<<sms, 32>>>(20000000, sp); cudaEventRecord(b); CK(cudaEventSynchronize(b));
  float ms; cudaEventElapsedTime(&ms, a, b); double ghz = 20e6 / (ms * 1e6);
  size_t smem_ring = 128 + 4 * 32 * 1168, smem_simple = 128 + 32 * 1168;
  CK(cudaFuncSetAttribute(bulk_ring<4, 32>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_ring));
  CK(cudaFuncSetAttribute(bulk_simple, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_simple));
  printf("{\"sms\": %d, \"spin_clock_ghz\": %.4f, \"tiles\": %d, \"rows\": [\n", sms, ghz, n);
  for (int k = 0; k < 2; ++k) {
    float best = 1e30;
    for (int rep = 0; rep < 6; ++rep) {
      // each CTA its own index range (idx + blockIdx-independent: use the same idx, different rows via offset? keep one)
      cudaEventRecord(a);
      if (k == 0) bulk_ring<4, 32><<<sms, 256, smem_ring>>>(idx, src, out, n, 1152);
      else bulk_simple<<<sms, 256, smem_simple>>>(idx, src, out, n);
      cudaEventRecord(b); CK(cudaEventSynchronize(b)); CK(cudaGetLastError());
      cudaEventElapsedTime(&ms, a, b); if (rep) best = std::min(best, ms);
    }
    printf("{\"kernel\": \"%s\", \"ms\": %.4f, \"us_per_tile\": %.4f, \"cycles_per_tile\": %.1f}%s\n",
           k == 0 ? "bulk_ring<4,32>" : "bulk_simple", best, best * 1e3 / n, best * 1e6 / n * ghz, k == 0 ? "," : "");
  }
  printf("]}\n");
}
