// Host entry of the mma.sync peak-rate kernel (csrc/ceilings/mma_peak.cu).
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t (this header is also seen by the host-only binding)

namespace va::ceil {
// FLOPs one launch performs.
double mma_peak_flops(int blocks, int iters);
int mma_peak_threads();
// out: [blocks * mma_peak_threads()] fp32, written once per thread.
void launch_mma_peak(bool bf16, int blocks, int iters, float* out, cudaStream_t stream);
}  // namespace va::ceil
