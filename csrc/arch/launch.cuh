// Kernel launch: the real <<<>>> launch, or the CPU emulator running the grid.
#pragma once

#include <stdexcept>
#include <string>

#include "defs.cuh"
#if VA_EMULATION
#include "../emu/launch.h"
#else
#include <cuda_runtime.h>
#endif

namespace va::arch {

#if !VA_EMULATION
namespace detail {
// Raises `kernel`'s dynamic shared memory limit when it needs more than the default 48 KB (`who`: the launcher, for
// the error).
template <class Kernel>
void allow_dynamic_smem(Kernel kernel, size_t dyn_smem_bytes, const char* who) {
  if (dyn_smem_bytes <= 48 * 1024) return;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dyn_smem_bytes));
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("va::arch::") + who + ": cudaFuncSetAttribute(" +
                             std::to_string(dyn_smem_bytes) + " B dynamic smem) failed: " + cudaGetErrorString(e));
  }
}
// cudaLaunchKernelEx with launch attributes (up to 2: the cluster shape, programmatic dependent launch) after raising
// the kernel's dynamic shared memory limit; `what` describes the launch in the error (CUDA-graph safe: no sync).
template <class Kernel, class... Args>
void launch_ex(Kernel kernel, dim3 grid, dim3 block, size_t dyn_smem_bytes, cudaStream_t stream,
               const cudaLaunchAttribute* attrs, unsigned num_attrs, const std::string& what, Args... args) {
  allow_dynamic_smem(kernel, dyn_smem_bytes, "launch");
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = dyn_smem_bytes;
  cfg.stream = stream;
  cudaLaunchAttribute list[2] = {};
  for (unsigned i = 0; i < num_attrs && i < 2; ++i) list[i] = attrs[i];
  cfg.attrs = list;
  cfg.numAttrs = num_attrs;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
  if (e != cudaSuccess) throw std::runtime_error(what + " failed: " + cudaGetErrorString(e));
}
inline cudaLaunchAttribute cluster_dimension(dim3 cluster) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster.x;
  attr.val.clusterDim.y = cluster.y;
  attr.val.clusterDim.z = cluster.z;
  return attr;
}
inline cudaLaunchAttribute programmatic_serialization() {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  return attr;
}
}  // namespace detail
#endif

// Launches kernel<<<grid, block, dyn_smem_bytes, stream>>>(args...).
// Real: raises the kernel's dynamic shared memory limit when it needs more
// than the default 48 KB, launches, and throws std::runtime_error with the CUDA
// error string on failure (no device sync, so it is CUDA-graph safe).
// Emulation: runs the whole grid on the CPU before returning and throws
// std::runtime_error for any error found (block, thread, address).
// Both modes: a grid with a zero dimension launches nothing.
template <class Kernel, class... Args>
void launch(Kernel kernel, dim3 grid, dim3 block, size_t dyn_smem_bytes, cudaStream_t stream,
            Args... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
#if VA_EMULATION
  (void)stream;
  ::va::emu::run_grid(grid, block, dyn_smem_bytes, [&]() { kernel(args...); });
#else
  detail::allow_dynamic_smem(kernel, dyn_smem_bytes, "launch");
  kernel<<<grid, block, dyn_smem_bytes, stream>>>(args...);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("va::arch::launch: kernel launch (grid ") +
                             std::to_string(grid.x) + "x" + std::to_string(grid.y) + "x" +
                             std::to_string(grid.z) + ", block " + std::to_string(block.x) +
                             ", smem " + std::to_string(dyn_smem_bytes) +
                             " B) failed: " + cudaGetErrorString(e));
  }
#endif
}

namespace detail {
template <class Kernel, class... Args>
void launch_cluster_impl(bool dependent, Kernel kernel, dim3 grid, dim3 block, size_t dyn_smem_bytes,
                         cudaStream_t stream, dim3 cluster, Args... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  if (cluster.x == 0 || cluster.y == 0 || cluster.z == 0 || grid.x % cluster.x != 0 || grid.y % cluster.y != 0 ||
      grid.z % cluster.z != 0 || cluster.x * cluster.y * cluster.z > 8) {
    throw std::runtime_error("va::arch::launch_cluster: cluster " + std::to_string(cluster.x) + "x" +
                             std::to_string(cluster.y) + "x" + std::to_string(cluster.z) +
                             " must divide the grid " + std::to_string(grid.x) + "x" + std::to_string(grid.y) + "x" +
                             std::to_string(grid.z) + " and hold 1 to 8 CTAs");
  }
#if VA_EMULATION
  (void)stream;
  ::va::emu::run_grid(grid, block, dyn_smem_bytes, [&]() { kernel(args...); }, cluster, dependent);
#else
  const cudaLaunchAttribute attrs[2] = {cluster_dimension(cluster), programmatic_serialization()};
  launch_ex(kernel, grid, block, dyn_smem_bytes, stream, attrs, dependent ? 2 : 1,
            std::string(dependent ? "va::arch::launch_cluster_dependent" : "va::arch::launch_cluster") +
                ": kernel launch (grid " + std::to_string(grid.x) + "x" + std::to_string(grid.y) + "x" +
                std::to_string(grid.z) + ", cluster " + std::to_string(cluster.x) + "x" + std::to_string(cluster.y) +
                "x" + std::to_string(cluster.z) + ", smem " + std::to_string(dyn_smem_bytes) + " B)",
            args...);
#endif
}
}  // namespace detail

// Launches kernel<<<grid, block, dyn_smem_bytes, stream>>>(args...) in thread-block clusters of shape `cluster`
// (sm_90+; each grid dimension a multiple of the cluster's, at most 8 CTAs a cluster): the CTAs of a cluster run at
// once, on SMs of one GPC, and may use each other's shared memory (cluster.cuh). Errors and CUDA-graph safety as
// launch(). Emulation: a cluster's CTAs run together in one scheduler.
template <class Kernel, class... Args>
void launch_cluster(Kernel kernel, dim3 grid, dim3 block, size_t dyn_smem_bytes, cudaStream_t stream, dim3 cluster,
                    Args... args) {
  detail::launch_cluster_impl(false, kernel, grid, block, dyn_smem_bytes, stream, cluster, args...);
}
// The same with programmatic dependent launch (launch_dependent, below): the kernel calls grid_dependency_wait()
// before its first global memory access.
template <class Kernel, class... Args>
void launch_cluster_dependent(Kernel kernel, dim3 grid, dim3 block, size_t dyn_smem_bytes, cudaStream_t stream,
                              dim3 cluster, Args... args) {
  detail::launch_cluster_impl(true, kernel, grid, block, dyn_smem_bytes, stream, cluster, args...);
}

// Launches a kernel that may start before the previous kernel on the stream has
// finished (programmatic dependent launch, sm_90+): it must call
// grid_dependency_wait() before reading anything the previous kernel wrote, and
// the previous kernel may call launch_dependents() once its CTAs are past the
// point where the dependent's launch can overlap them. CUDA-graph safe (the
// attribute becomes a programmatic edge when captured). Emulation: kernels run one after the other, and a thread's
// global memory access before its grid_dependency_wait() is reported.
template <class Kernel, class... Args>
void launch_dependent(Kernel kernel, dim3 grid, dim3 block, size_t dyn_smem_bytes, cudaStream_t stream,
                      Args... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
#if VA_EMULATION
  (void)stream;
  ::va::emu::run_grid(grid, block, dyn_smem_bytes, [&]() { kernel(args...); }, dim3(1, 1, 1), true);
#else
  const cudaLaunchAttribute attr = detail::programmatic_serialization();
  detail::launch_ex(kernel, grid, block, dyn_smem_bytes, stream, &attr, 1,
                    "va::arch::launch_dependent: kernel launch (grid " + std::to_string(grid.x) + "x" +
                        std::to_string(grid.y) + "x" + std::to_string(grid.z) + ", smem " +
                        std::to_string(dyn_smem_bytes) + " B)",
                    args...);
#endif
}

}  // namespace va::arch
