// Test fixture of bench.model (tests/test_model_bulk.py): cp.async.bulk (TMA 1D) copies completing on an
// mbarrier, read by `mbarrier.try_wait.parity`. Not part of the build.
//   nvcc -arch=sm_90a -cubin -lineinfo -o bulk_copy_loop.cubin bulk_copy_loop.cu
#include <cstdint>

__device__ __forceinline__ void bulk_row(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

__device__ __forceinline__ void wait_parity(uint32_t bar, uint32_t parity) {
  asm volatile("{\n.reg .pred P1;\nLAB_WAIT:\nmbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
               "@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}" :: "r"(bar), "r"(parity) : "memory");
}

// one stage: 32 threads each copy one 1,152-byte row and the CTA waits for it in the same iteration
__global__ void bulk_simple(const int* __restrict__ idx, const char* __restrict__ src, float* out, int n) {
  extern __shared__ __align__(128) unsigned char sm[];
  uint64_t* bar = reinterpret_cast<uint64_t*>(sm);
  unsigned char* buf = sm + 128;
  uint32_t b = (uint32_t)__cvta_generic_to_shared(bar);
  idx += (size_t)blockIdx.x * n * 32;  // each CTA its own rows
  if (threadIdx.x == 0) asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(b), "r"(32));
  __syncthreads();
  float acc = 0.f;
#pragma unroll 1
  for (int it = 0; it < n; ++it) {  // sass-model: tile-loop
    if (threadIdx.x < 32) {
      int row = idx[it * 32 + threadIdx.x];
      bulk_row((uint32_t)__cvta_generic_to_shared(buf + threadIdx.x * 1168), src + (int64_t)row * 1152, 1152, b);
    }
    wait_parity(b, it & 1);
    acc += reinterpret_cast<float*>(buf)[threadIdx.x];
    __syncthreads();
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

// a ring of STAGES stages, one mbarrier each: iteration it issues the rows of tile it + STAGES - 1 and waits
// for tile it's (issued STAGES - 1 iterations earlier); `bytes` is a kernel argument (not an immediate)
template <int STAGES, int BN>
__global__ void bulk_ring(const int* __restrict__ idx, const char* __restrict__ src, float* out, int n,
                          uint32_t bytes) {
  extern __shared__ __align__(128) unsigned char sm[];
  uint64_t* bar = reinterpret_cast<uint64_t*>(sm);
  unsigned char* buf = sm + 128;
  const uint32_t b0 = (uint32_t)__cvta_generic_to_shared(bar);
  idx += (size_t)blockIdx.x * n * BN;  // each CTA its own rows
  if (threadIdx.x < STAGES) asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(b0 + 8 * threadIdx.x),
                                         "r"(BN));
  __syncthreads();
  for (int s = 0; s < STAGES - 1; ++s)
    if (threadIdx.x < BN && s < n)
      bulk_row((uint32_t)__cvta_generic_to_shared(buf + (s * BN + threadIdx.x) * 1168),
               src + (int64_t)idx[s * BN + threadIdx.x] * 1152, bytes, b0 + 8 * s);
  float acc = 0.f;
#pragma unroll 1
  for (int it = 0; it < n; ++it) {  // sass-model: tile-loop
    const int nt = it + STAGES - 1, st = nt % STAGES;
    if (threadIdx.x < BN && nt < n)
      bulk_row((uint32_t)__cvta_generic_to_shared(buf + (st * BN + threadIdx.x) * 1168),
               src + (int64_t)idx[nt * BN + threadIdx.x] * 1152, bytes, b0 + 8 * st);
    wait_parity(b0 + 8 * (it % STAGES), (it / STAGES) & 1);
    const float* row = reinterpret_cast<const float*>(buf + ((it % STAGES) * BN) * 1168);
#pragma unroll
    for (int k = 0; k < 4; ++k) acc += row[threadIdx.x + 32 * k] * 1.5f;
    __syncthreads();
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

template __global__ void bulk_ring<4, 32>(const int*, const char*, float*, int, uint32_t);
