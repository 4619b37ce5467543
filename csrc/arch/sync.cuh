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
#else
VA_DEVICE void block_sync() { __syncthreads(); }
VA_DEVICE void threadfence() { __threadfence(); }
// atomicAdd on a global int; returns the old value.
VA_DEVICE int atomic_add(int* p, int v) { return atomicAdd(p, v); }
#endif

}  // namespace va::arch
