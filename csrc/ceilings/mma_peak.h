// Host entry of the mma.sync peak-rate kernel (csrc/ceilings/mma_peak.cu).
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t (this header is also seen by the host-only binding)

namespace va::ceil {
// FLOPs one launch performs.
double mma_peak_flops(int blocks, int iters);
int mma_peak_threads();
// out: [blocks * mma_peak_threads()] fp32, written once per thread.
void launch_mma_peak(bool bf16, int blocks, int iters, float* out, cudaStream_t stream);
// out[0] = SM cycles per dependent m16n8k16 bf16 MMA (one warp, one chain).
void launch_mma_latency(int iters, float* out, cudaStream_t stream);
// Each of `blocks` blocks reads ~n_float4 / blocks float4 of buf, `repeats` times (bytes = 16 * n_float4 * repeats).
void launch_read_bw(const void* buf, long long n_float4, int blocks, int repeats, float* out, cudaStream_t stream);
}  // namespace va::ceil
