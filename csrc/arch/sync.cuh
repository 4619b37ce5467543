// Block barrier, named barriers, warpgroup register reallocation, memory fence, global atomics.
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
// The emulator runs kernels one after the other; in a grid launched with launch_dependent it reports a thread's
// global memory access before that thread's grid_dependency_wait.
VA_DEVICE void grid_dependency_wait(std::source_location loc = std::source_location::current()) {
  ::va::emu::grid_dependency_wait(loc);
}
VA_DEVICE void launch_dependents() {}
VA_DEVICE void named_barrier_sync(int id, int count, std::source_location loc = std::source_location::current()) {
  ::va::emu::named_barrier(id, count, true, loc);
}
VA_DEVICE void named_barrier_arrive(int id, int count, std::source_location loc = std::source_location::current()) {
  ::va::emu::named_barrier(id, count, false, loc);
}
template <int kRegs>
VA_DEVICE void setmaxnreg_inc(std::source_location loc = std::source_location::current()) {
  ::va::emu::setmaxnreg(kRegs, true, loc);
}
template <int kRegs>
VA_DEVICE void setmaxnreg_dec(std::source_location loc = std::source_location::current()) {
  ::va::emu::setmaxnreg(kRegs, false, loc);
}
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
// Named barriers (bar.sync / bar.arrive id, count): https://docs.nvidia.com/cuda/parallel-thread-execution/#parallel-synchronization-and-communication-instructions-bar
// The barrier `id` (1..15; 0 is block_sync's) completes when `count` threads (a multiple of 32, whole warps) have
// arrived; named_barrier_sync waits for it, named_barrier_arrive only counts the caller (a producer signalling
// consumers). Warps that exchange data among themselves sync on their own id and leave the other warps running.
VA_DEVICE void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
VA_DEVICE void named_barrier_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// setmaxnreg (sm_90a / sm_100a / sm_120a, warpgroup-wide): a producer warpgroup gives registers back (dec), the
// math warpgroups take them (inc); ptxas allocates the code after an inc up to its count (a kernel launched with 384
// threads is capped at 168, its math warps' region at the inc's value).
// https://docs.nvidia.com/cuda/parallel-thread-execution/#miscellaneous-instructions-setmaxnreg
// Elsewhere a no-op: the launch's register count stands (and ptxas spills what does not fit, which the build
// report fails).
template <int kRegs>
VA_DEVICE void setmaxnreg_inc() {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg: a multiple of 8 in 24..256");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM120_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
VA_DEVICE void setmaxnreg_dec() {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg: a multiple of 8 in 24..256");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM120_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
VA_DEVICE void threadfence() { __threadfence(); }
// atomicAdd on a global int; returns the old value.
VA_DEVICE int atomic_add(int* p, int v) { return atomicAdd(p, v); }
#endif

}  // namespace va::arch
