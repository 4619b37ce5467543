// The emulator's grid launcher, used by va::arch::launch in the host build.
#pragma once

#include <cstddef>
#include <functional>

#include <vector_types.h>

#include "host.h"

namespace va::emu {

// Runs body once per CUDA thread of every block of the grid on the CPU, with
// threadIdx/blockIdx/blockDim/gridDim and dyn_smem_bytes of shared memory
// (filled with 0xFF, i.e. NaN, at block start) per block. Returns when the
// whole grid has run; throws std::runtime_error listing the errors found
// (bounds, barriers, collectives), each with block, thread and source line.
void run_grid(dim3 grid, dim3 block, size_t dyn_smem_bytes, const std::function<void()>& body);
// The same with thread-block clusters of shape `cluster` (each grid dimension a multiple of the cluster's, 1 to 8
// CTAs; std::runtime_error otherwise): a cluster's CTAs run together on one worker, interleaved by one scheduler, so
// they can wait on each other (csrc/arch/cluster.cuh); each keeps its own shared memory and end-of-block checks, and a
// deadlock is one of the whole cluster. The overload above is this one with a 1x1x1 cluster. `dependent`: the grid was
// launched with programmatic dependent launch (va::arch::launch_dependent); a global memory access by a thread before
// its grid_dependency_wait is then an error.
void run_grid(dim3 grid, dim3 block, size_t dyn_smem_bytes, const std::function<void()>& body, dim3 cluster,
              bool dependent = false);

}  // namespace va::emu
