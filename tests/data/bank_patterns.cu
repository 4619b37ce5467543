// Shared-memory access patterns with known bank-conflict degrees, for tests/test_model_banks.py (bench.model.banks
// reads their SASS). Each kernel is one warp's worth of lanes; the strides are compile-time constants, like the
// kernels' own layouts.
#include "arch/arch.cuh"

namespace va::bank_tests {

// float4 per lane at STRIDE bytes: 16 conflict-free; 64 the 4-way pattern of kernel v2's first partial-score
// exchange (a lane's 16 floats side by side); 32 two-way
template <int STRIDE>
__global__ void f4_store_load(float* out) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int t = threadIdx.x;
  *reinterpret_cast<float4*>(smem + t * STRIDE) = make_float4(t, t + 1, t + 2, t + 3);
  __syncthreads();
  const float4 r = *reinterpret_cast<const float4*>(smem + (t ^ 1) * STRIDE);
  out[t] = r.x + r.y + r.z + r.w;  // every component: one LDS.128
}

// kernel v2's exchange, first layout and the fixed one: thread t's float4 number e4 of 4
template <bool FIXED>
__global__ void v2_exchange(float* out) {
  extern __shared__ __align__(128) float part[];
  const int t = threadIdx.x % 128;
  float acc = 0.f;
#pragma unroll
  for (int e4 = 0; e4 < 4; ++e4) {
    float* p = FIXED ? part + (e4 * 128 + t) * 4 : part + t * 16 + e4 * 4;
    *reinterpret_cast<float4*>(p) = make_float4(e4, t, 1.f, 2.f);
  }
  __syncthreads();
#pragma unroll
  for (int e4 = 0; e4 < 4; ++e4) {
    const float* p = FIXED ? part + (e4 * 128 + t) * 4 : part + t * 16 + e4 * 4;
    const float4 v = *reinterpret_cast<const float4*>(p);
    acc += v.x * v.y + v.z * v.w;
  }
  out[threadIdx.x] = acc;
}

// ldmatrix x4 of four 8x8 matrices along a row of PITCH-byte rows: 1168 (the kernels' padded 584-element rows)
// conflict-free, 1024 (unpadded 512-element rows) 8-way
template <int PITCH>
__global__ void ldsm_rows(float* out) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x % 32;
  for (int i = threadIdx.x; i < 8 * PITCH / 4; i += blockDim.x) reinterpret_cast<float*>(smem)[i] = i;
  __syncthreads();
  uint32_t r[4];
  va::arch::ldmatrix_x4(r, smem + (lane % 8) * PITCH + (lane / 8) * 16);
  out[threadIdx.x] = __uint_as_float(r[0] ^ r[3]);
}

template __global__ void f4_store_load<16>(float*);
template __global__ void f4_store_load<32>(float*);
template __global__ void f4_store_load<64>(float*);
template __global__ void v2_exchange<false>(float*);
template __global__ void v2_exchange<true>(float*);
template __global__ void ldsm_rows<1168>(float*);
template __global__ void ldsm_rows<1024>(float*);

}  // namespace va::bank_tests
