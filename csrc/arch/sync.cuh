// Block barrier, memory fence, global atomics.
#pragma once

#include "defs.cuh"
#if VA_EMULATION
#include <source_location>

#include "../emu/device.h"
#endif

namespace va::arch {

#if VA_EMULATION
// __syncthreads(): bar.sync 0. Every thread of the block must reach it
// (the emulator reports a barrier that some threads never reach).
VA_DEVICE void block_sync(std::source_location loc = std::source_location::current()) {
  ::va::emu::block_sync(loc);
}
VA_DEVICE void threadfence() { ::va::emu::threadfence(); }
// atomicAdd on a global int; returns the old value.
VA_DEVICE int atomic_add(int* p, int v, std::source_location loc = std::source_location::current()) {
  return ::va::emu::atomic_add(p, v, loc);
}
// Programmatic dependent launch (PTX griddepcontrol, sm_90+):
// https://docs.nvidia.com/cuda/parallel-thread-execution/#parallel-synchronization-and-communication-instructions-griddepcontrol
// grid_dependency_wait: block until the kernel this one depends on has completed and its memory
// is visible (a no-op when the launch had no programmatic dependency).
// launch_dependents: let the dependent kernel's CTAs start launching.
// The emulator runs kernels one after the other, so both are no-ops there.
VA_DEVICE void grid_dependency_wait() {}
VA_DEVICE void launch_dependents() {}
#else
VA_DEVICE void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
VA_DEVICE void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
VA_DEVICE void block_sync() { __syncthreads(); }
VA_DEVICE void threadfence() { __threadfence(); }
// atomicAdd on a global int; returns the old value.
VA_DEVICE int atomic_add(int* p, int v) { return atomicAdd(p, v); }
#endif

}  // namespace va::arch
