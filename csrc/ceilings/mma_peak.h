// Host entry of the ceiling probes (csrc/ceilings/mma_peak.cu): mma.sync and wgmma rates, latencies, read bandwidth.
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
// wgmma (sm_90a only; on other archs the kernels do nothing and leave out unwritten):
// FLOPs one wgmma_peak launch performs; out: [blocks * wgmma_peak_threads()] fp32, written once per thread.
double wgmma_peak_flops(int blocks, int iters);
int wgmma_peak_threads();
void launch_wgmma_peak(int blocks, int iters, float* out, cudaStream_t stream);
// out[0] / out[2] = SM cycles per (m64n64k16 / m64n256k16 bf16 wgmma + wait_group 0), one warpgroup;
// out: [4] fp32 (out[1], out[3] only keep the chains alive).
void launch_wgmma_latency(int iters, float* out, cudaStream_t stream);
}  // namespace va::ceil
