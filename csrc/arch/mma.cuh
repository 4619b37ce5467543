// Warp-level matrix multiply-accumulate.
#pragma once

#include <type_traits>

#include "defs.cuh"
#include "math.cuh"
#if VA_EMULATION
#include <source_location>

#include "../emu/device.h"
#endif

namespace va::arch {

// D = A * B + C for one warp, m16n8k16, A row-major (16x16), B column-major
// (16x8), fp32 accumulate; T = __nv_bfloat16 or __half.
// PTX: mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32
// https://docs.nvidia.com/cuda/parallel-thread-execution/#warp-level-matrix-instructions-mma
// Fragments (https://docs.nvidia.com/cuda/parallel-thread-execution/#mma-1688-a-f16 and
// #mma-16816-a-f16, #mma-16816-b-f16, #mma-16816-c), groupID = lane>>2, tig = lane%4:
//   a[r] holds elements a(2r), a(2r+1) (low half first): row = groupID + 8*(r&1),
//        col = 2*tig + (0|1) + 8*(r>>1)
//   b[r] holds b(2r), b(2r+1): k = 2*tig + (0|1) + 8*r, n = groupID
//   c[i], d[i]: row = groupID + 8*(i>>1), col = 2*tig + (i&1)
// d may alias c.
template <class T>
VA_DEVICE void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                            const float (&c)[4]
#if VA_EMULATION
                            , std::source_location loc = std::source_location::current()
#endif
) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>,
                "mma_m16n8k16: T must be __nv_bfloat16 or __half");
#if VA_EMULATION
  ::va::emu::mma_m16n8k16(std::is_same_v<T, __nv_bfloat16>, d, a, b, c, loc);
#else
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
          "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
          "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  }
#endif
}

// The m16n8k32 e4m3 product on two f16 m16n8k16 MMAs that accumulate in place (every e4m3 code is exact in f16).
// Half h of the k32 step is a[2h], a[2h + 1] and b[h]. Each register's low code pair (k 4t, 4t + 1) goes where an
// f16 fragment holds k 2t, 2t + 1, its high pair (k 4t + 2, 4t + 3) where it holds k 8 + 2t, 8 + 2t + 1: the same
// permutation of k for A and B, so the sum is the same (tests/test_arch_emu.py checks it against the matrix product).
VA_DEVICE void mma_m16n8k32_e4m3_on_f16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                        const float (&c)[4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t fa[4] = {e4m3x2_to_f16x2(a[2 * h]), e4m3x2_to_f16x2(a[2 * h + 1]),
                            e4m3x2_to_f16x2(a[2 * h] >> 16), e4m3x2_to_f16x2(a[2 * h + 1] >> 16)};
    const uint32_t fb[2] = {e4m3x2_to_f16x2(b[h]), e4m3x2_to_f16x2(b[h] >> 16)};
    if (h == 0) mma_m16n8k16<__half>(d, fa, fb, c);
    else mma_m16n8k16<__half>(d, fa, fb, d);
  }
}

// How an e4m3 m16n8k32 runs on sm_90, which has no e4m3 mma.sync unit (on any other arch both are the instruction):
//   kPtxas  the instruction, which ptxas lowers to f16 HMMAs that compute each product into four temporaries and then
//           add them to the accumulators (FADD). It converts an A operand once for all the n tiles that share it:
//           S = Q K^T, whose Q fragments stay e4m3 across the tile loop.
//   kF16    mma_m16n8k32_e4m3_on_f16: no temporaries beyond one half's converted operands. For P V, whose 64
//           accumulators a warp left ptxas's temporaries no room on the math-roles tile (12-112 B of spills on
//           sm_90a before; build.py).
enum class E4m3OnSm90 { kPtxas, kF16 };

// D = A * B + C for one warp, m16n8k32, A and B e4m3 (one byte per element), fp32 accumulate.
// PTX: mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 (sm_89 and later); on sm_90 as kOnSm90 says
// Fragments (https://docs.nvidia.com/cuda/parallel-thread-execution/#mma-16832-a and
// #mma-16832-b), groupID = lane>>2, tig = lane%4, byte i (low first) of each register:
//   a[r]: row = groupID + 8*(r&1), col = 4*tig + i + 16*(r>>1)
//   b[r]: k = 4*tig + i + 16*r, n = groupID
//   c[i], d[i]: as m16n8k16
template <E4m3OnSm90 kOnSm90 = E4m3OnSm90::kPtxas>
VA_DEVICE void mma_m16n8k32_e4m3(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                 const float (&c)[4]
#if VA_EMULATION
                                 , std::source_location loc = std::source_location::current()
#endif
) {
#if VA_EMULATION
  ::va::emu::mma_m16n8k32_e4m3(d, a, b, c, loc);
#else
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
  if constexpr (kOnSm90 == E4m3OnSm90::kF16) {
    mma_m16n8k32_e4m3_on_f16(d, a, b, c);
    return;
  }
#endif
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
        "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#endif
}

}  // namespace va::arch
