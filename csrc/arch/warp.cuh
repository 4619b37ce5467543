// Warp identity and warp collectives (full-warp mask; every lane of the warp
// must call the same collective, as the *_sync intrinsics require).
#pragma once

#include <type_traits>

#include "defs.cuh"
#if VA_EMULATION
#include <cstring>
#include <source_location>

#include "../emu/device.h"
#endif

namespace va::arch {

// Lane and warp of the calling thread in a 1-D block.
VA_DEVICE int lane_id() {
#if VA_EMULATION
  return ::va::emu::cur().lane;
#else
  return static_cast<int>(threadIdx.x) & (kWarpSize - 1);
#endif
}
// lane_id() again, as a read the compiler may neither merge with other reads nor hoist out of a loop (%laneid,
// asm volatile): a lane-derived address computed from it in a loop body is recomputed there each iteration (a few
// integer instructions) instead of being held in a register across the loop, which ptxas, short of registers, spills
// rather than rematerializes.
VA_DEVICE int lane_id_fresh() {
#if VA_EMULATION
  return ::va::emu::cur().lane;
#else
  unsigned r;
  asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(r));
  return static_cast<int>(r);
#endif
}
VA_DEVICE int warp_id() {
#if VA_EMULATION
  return ::va::emu::cur().warp;
#else
  return static_cast<int>(threadIdx.x) / kWarpSize;
#endif
}

namespace detail {
template <class T>
inline constexpr bool kShflType =
    std::is_same_v<T, float> || std::is_same_v<T, int> || std::is_same_v<T, uint32_t>;
}

// __shfl_xor_sync(0xffffffff, v, lane_mask): lane l gets v of lane l ^ lane_mask.
// https://docs.nvidia.com/cuda/cuda-c-programming-guide/#warp-shuffle-functions
#if VA_EMULATION
template <class T>
VA_DEVICE T shfl_xor(T v, int lane_mask, std::source_location loc = std::source_location::current()) {
  static_assert(detail::kShflType<T>, "shfl_xor: T must be float, int or uint32_t");
  uint32_t bits, out;
  std::memcpy(&bits, &v, 4);
  ::va::emu::shfl(true, bits, lane_mask, &out, loc);
  T r;
  std::memcpy(&r, &out, 4);
  return r;
}
// __shfl_sync(0xffffffff, v, src_lane): lane l gets v of lane src_lane % 32.
template <class T>
VA_DEVICE T shfl(T v, int src_lane, std::source_location loc = std::source_location::current()) {
  static_assert(detail::kShflType<T>, "shfl: T must be float, int or uint32_t");
  uint32_t bits, out;
  std::memcpy(&bits, &v, 4);
  ::va::emu::shfl(false, bits, src_lane, &out, loc);
  T r;
  std::memcpy(&r, &out, 4);
  return r;
}
VA_DEVICE uint32_t ballot(bool p, std::source_location loc = std::source_location::current()) {
  return ::va::emu::vote(::va::emu::VoteKind::kBallot, p, loc);
}
VA_DEVICE bool any(bool p, std::source_location loc = std::source_location::current()) {
  return ::va::emu::vote(::va::emu::VoteKind::kAny, p, loc) != 0;
}
VA_DEVICE bool all(bool p, std::source_location loc = std::source_location::current()) {
  return ::va::emu::vote(::va::emu::VoteKind::kAll, p, loc) != 0;
}
// __syncwarp(): every lane of the warp arrives before any leaves.
VA_DEVICE void warp_sync(std::source_location loc = std::source_location::current()) {
  ::va::emu::warp_sync(loc);
}
#else
template <class T>
VA_DEVICE T shfl_xor(T v, int lane_mask) {
  static_assert(detail::kShflType<T>, "shfl_xor: T must be float, int or uint32_t");
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}
// __shfl_sync(0xffffffff, v, src_lane): lane l gets v of lane src_lane % 32.
template <class T>
VA_DEVICE T shfl(T v, int src_lane) {
  static_assert(detail::kShflType<T>, "shfl: T must be float, int or uint32_t");
  return __shfl_sync(0xffffffffu, v, src_lane);
}
VA_DEVICE uint32_t ballot(bool p) { return __ballot_sync(0xffffffffu, p); }
VA_DEVICE bool any(bool p) { return __any_sync(0xffffffffu, p) != 0; }
VA_DEVICE bool all(bool p) { return __all_sync(0xffffffffu, p) != 0; }
// __syncwarp(): every lane of the warp arrives before any leaves.
VA_DEVICE void warp_sync() { __syncwarp(); }
#endif

}  // namespace va::arch
