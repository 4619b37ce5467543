// Cluster residency: how many thread-block clusters of a given shape the GPU holds at once
// (cudaOccupancyMaxActiveClusters), for a CTA of `threads` threads and `smem_bytes` of dynamic shared memory.
// Hopper's v3 as a 2-CTA cluster (csrc/tree_verify/sm90/) launches 66 clusters of two 224 KB CTAs at 185k / 16 nodes
// and bench.model reads them as one wave: this says whether the H200 can hold them all at once. The probe kernel
// stands in for the real one: at 224 KB a CTA, shared memory allows one CTA an SM either way, so its registers do not
// change the answer.
#include <stdexcept>
#include <string>

#include "arch/launch.cuh"
#include "ceilings/mma_peak.h"

namespace va::ceil {

__global__ void cluster_residency_kernel(int* out) {
  extern __shared__ __align__(128) unsigned char smem[];
  if (out != nullptr && threadIdx.x == 0) out[blockIdx.x] = smem[0];
}

int max_active_clusters(int threads, int smem_bytes, int cluster_size) {
  if (threads < 1 || threads > 1024 || smem_bytes < 0 || cluster_size < 1 || cluster_size > 8)
    throw std::invalid_argument("max_active_clusters: threads in 1..1024, smem_bytes >= 0, cluster_size in 1..8");
  arch::detail::allow_dynamic_smem(cluster_residency_kernel, static_cast<size_t>(smem_bytes), "max_active_clusters");
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(cluster_size, 1, 1);
  cfg.blockDim = dim3(threads, 1, 1);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  cudaLaunchAttribute attr = arch::detail::cluster_dimension(dim3(cluster_size, 1, 1));
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int n = 0;
  const cudaError_t e = cudaOccupancyMaxActiveClusters(&n, cluster_residency_kernel, &cfg);
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("max_active_clusters: cudaOccupancyMaxActiveClusters: ") +
                             cudaGetErrorString(e));
  return n;
}

}  // namespace va::ceil
