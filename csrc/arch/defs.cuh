// Device API: build-mode switch, CUDA keywords and element types.
//
// Kernel sources include "arch/arch.cuh" only and never test VA_EMULATION
// themselves. Two build modes of the same sources:
//   nvcc (sm_90a, sm_120a): every wrapper is the real instruction.
//   host C++ (g++ -std=c++20 -DVA_EMULATION=1, toolkit include dir on the
//   include path): every wrapper is a lane-by-lane software version run by the
//   CPU emulator in csrc/emu/, and this header supplies what CUDA C++ gives a
//   kernel (__global__, threadIdx, dim3, cudaStream_t, ...).
#pragma once

#include <cstddef>
#include <cstdint>

#if !defined(VA_EMULATION)
#define VA_EMULATION 0
#endif

#if VA_EMULATION && defined(__CUDACC__)
#error "VA_EMULATION=1 is the host-compiler build of the kernels; do not compile it with nvcc"
#endif

// The toolkit's element types are usable from host C++ (their conversions are
// __host__ __device__), so both modes share them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_types.h>
#include <vector_functions.h>
#include <driver_types.h>

#if VA_EMULATION

// crt/host_defines.h maps these to GNU attributes g++ does not know; a kernel
// compiled for the host wants them gone.
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __noinline__
#undef __launch_bounds__
#undef __grid_constant__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __grid_constant__

#define VA_DEVICE inline
#define VA_HOST_DEVICE inline

#else  // nvcc

#define VA_DEVICE __device__ __forceinline__
#define VA_HOST_DEVICE __host__ __device__ __forceinline__

#endif

namespace va::arch {
// Threads per warp on every architecture this project targets.
inline constexpr int kWarpSize = 32;
}  // namespace va::arch
