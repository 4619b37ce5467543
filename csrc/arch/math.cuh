// Scalar math the kernels need with a defined instruction, and 16-bit packing.
#pragma once

#include <type_traits>

#include "defs.cuh"
#include "../host/fp8.h"
#if VA_EMULATION
#include <cmath>
#include <cstring>
#endif

namespace va::arch {

// 2^x, ex2.approx.ftz.f32 (max relative error 2^-22 on the hardware;
// subnormal inputs and results flush to zero):
// https://docs.nvidia.com/cuda/parallel-thread-execution/#floating-point-instructions-ex2
VA_DEVICE float exp2_approx(float x) {
#if VA_EMULATION
  if (std::fpclassify(x) == FP_SUBNORMAL) x = 0.0f;
  const float r = std::exp2(x);
  return std::fpclassify(r) == FP_SUBNORMAL ? 0.0f : r;
#else
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
#endif
}

// 1 / x, rcp.approx.ftz.f32 (max error 1 ulp on the hardware; subnormal inputs and results flush to zero, so
// 1 / a subnormal is inf). One MUFU.RCP: an IEEE division (x / y, or rcp.rn) adds a slow-path subroutine call,
// and the registers the call pins can push a tight loop into spills. For scale factors, not for results that
// must round correctly. The emulator returns the correctly rounded 1 / x, flushed the same way.
// https://docs.nvidia.com/cuda/parallel-thread-execution/#floating-point-instructions-rcp-approx-ftz-f64
VA_DEVICE float rcp_approx(float x) {
#if VA_EMULATION
  if (std::fpclassify(x) == FP_SUBNORMAL) x = std::signbit(x) ? -0.0f : 0.0f;
  const float r = 1.0f / x;
  return std::fpclassify(r) == FP_SUBNORMAL ? (std::signbit(r) ? -0.0f : 0.0f) : r;
#else
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
#endif
}

// max with fmaxf's NaN rule (a NaN operand loses to a number).
VA_DEVICE float max_f(float a, float b) {
#if VA_EMULATION
  return std::fmax(a, b);
#else
  return fmaxf(a, b);
#endif
}

// Two floats -> two T (round to nearest even) in one 32-bit register, lo in
// the low 16 bits: the operand layout of mma.sync and ldmatrix.
template <class T>
VA_HOST_DEVICE uint32_t pack2(float lo, float hi) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>,
                "pack2: T must be __nv_bfloat16 or __half");
  uint16_t l, h;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    l = __bfloat16_as_ushort(__float2bfloat16_rn(lo));
    h = __bfloat16_as_ushort(__float2bfloat16_rn(hi));
  } else {
    l = __half_as_ushort(__float2half_rn(lo));
    h = __half_as_ushort(__float2half_rn(hi));
  }
  return static_cast<uint32_t>(l) | (static_cast<uint32_t>(h) << 16);
}

// Inverse of pack2: the low 16 bits -> lo, the high 16 bits -> hi.
template <class T>
VA_HOST_DEVICE void unpack2(uint32_t r, float& lo, float& hi) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>,
                "unpack2: T must be __nv_bfloat16 or __half");
  const uint16_t l = static_cast<uint16_t>(r & 0xffffu);
  const uint16_t h = static_cast<uint16_t>(r >> 16);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    lo = __bfloat162float(__ushort_as_bfloat16(l));
    hi = __bfloat162float(__ushort_as_bfloat16(h));
  } else {
    lo = __half2float(__ushort_as_half(l));
    hi = __half2float(__ushort_as_half(h));
  }
}

// max that propagates NaN (max.NaN.f32, sm_80 and later): a NaN operand wins.
VA_DEVICE float max_nan(float a, float b) {
#if VA_EMULATION
  return (a != a || b != b) ? __builtin_nanf("") : std::fmax(a, b);
#else
  float r;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(r) : "f"(a), "f"(b));
  return r;
#endif
}

// Two floats -> two e4m3 codes in 16 bits, lo in the low byte; round to nearest even,
// saturating to +-448. PTX cvt.rn.satfinite.e4m3x2.f32 d, a, b puts a in the upper byte.
// https://docs.nvidia.com/cuda/parallel-thread-execution/#data-movement-and-conversion-instructions-cvt
VA_DEVICE uint16_t cvt_e4m3x2(float lo, float hi) {
#if VA_EMULATION
  return static_cast<uint16_t>(::va::host::float_to_e4m3(lo) | (::va::host::float_to_e4m3(hi) << 8));
#else
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#endif
}

// Four floats -> four e4m3 codes in 32 bits, x0 in the low byte (an mma.m16n8k32 / wgmma .e4m3 fragment register).
VA_DEVICE uint32_t cvt_e4m3x4(float x0, float x1, float x2, float x3) {
  return uint32_t(cvt_e4m3x2(x0, x1)) | (uint32_t(cvt_e4m3x2(x2, x3)) << 16);
}

// Two e4m3 codes (the low 16 bits, low byte first) -> f16x2 (low code in the low half), exact.
// PTX cvt.rn.f16x2.e4m3x2 (sm_89 and later).
VA_DEVICE uint32_t e4m3x2_to_f16x2(uint32_t codes) {
#if VA_EMULATION
  return uint32_t(::va::host::e4m3_to_f16_bits(uint8_t(codes & 0xFF))) |
         (uint32_t(::va::host::e4m3_to_f16_bits(uint8_t((codes >> 8) & 0xFF))) << 16);
#else
  uint32_t r;
  const uint16_t c = static_cast<uint16_t>(codes);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(c));
  return r;
#endif
}

// Byte permute (prmt.b32, default mode): byte i of the result is byte sel[4i+3:4i] of {b:a}.
VA_DEVICE uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
#if VA_EMULATION
  return ::va::host::prmt_bytes(a, b, sel);
#else
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
#endif
}

// bf16x2 -> f16x2, each rounded to nearest (exact for bf16 values in f16's normal range).
VA_DEVICE uint32_t bf16x2_to_f16x2(uint32_t x) {
  float lo, hi;
  unpack2<__nv_bfloat16>(x, lo, hi);
  return pack2<__half>(lo, hi);
}

}  // namespace va::arch
