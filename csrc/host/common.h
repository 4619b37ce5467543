// Shared arithmetic for kernels and host tests: qualifiers and small helpers.
//
// Everything under csrc/host/ is plain arithmetic on scalars (no memory
// access, no hardware intrinsics), so one definition serves the nvcc build,
// the CPU emulation build and the pybind11 host module that tests it.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define VA_HD __host__ __device__ __forceinline__
#else
#define VA_HD inline
#endif

namespace va::host {

VA_HD constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }
VA_HD constexpr int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }
VA_HD constexpr int round_up(int a, int b) { return ceil_div(a, b) * b; }
VA_HD constexpr int min_i(int a, int b) { return a < b ? a : b; }
VA_HD constexpr int max_i(int a, int b) { return a > b ? a : b; }

// -inf without <limits> (usable in device code and constexpr contexts).
VA_HD constexpr float neg_inf() { return -__builtin_huge_valf(); }

inline constexpr float kLog2e = 1.4426950408889634f;  // log2(e): exp(x) = exp2(x * log2e)
inline constexpr float kLn2 = 0.6931471805599453f;    // ln(2): ln(x) = log2(x) * ln2

}  // namespace va::host
