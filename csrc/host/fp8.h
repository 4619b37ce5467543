// e4m3 ("fn" variant: no infinities, 0x7F / 0xFF NaN, largest finite 448) codec and the
// fragment permutations of the fp8 MMA path of kernel v1.
//
// The codec is the CPU emulator's model of the hardware conversions
// (cvt.rn.satfinite.e4m3x2.f32 and the e4m3 operands of mma.sync .e4m3) and is
// checked against torch's float8_e4m3fn on all 256 codes (tests/test_host_math.py).
#pragma once

#include <cstdint>

#include "common.h"

namespace va::host {

inline constexpr float kE4m3Max = 448.0f;

// 2^e for an integer e in [-126, 127], without libm.
VA_HD float exp2_int(int e) {
  const uint32_t bits = static_cast<uint32_t>(e + 127) << 23;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// Value of an e4m3 code: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal.
VA_HD float e4m3_to_float(uint8_t x) {
  const int e = (x >> 3) & 0xF, m = x & 7;
  if (e == 0xF && m == 7) return __builtin_nanf("");
  const float v = e == 0 ? static_cast<float>(m) * exp2_int(-9) : static_cast<float>(8 + m) * exp2_int(e - 10);
  return (x & 0x80) ? -v : v;
}

// Round half to even of a non-negative float below 2^23 (exact in fp32 arithmetic).
VA_HD float rint_even(float a) {
  const float big = 8388608.0f;  // 2^23: adding and subtracting it rounds to an integer, ties to even
  return (a + big) - big;
}

// float -> e4m3 code, round to nearest even, saturating to +-448 (the .satfinite conversion); NaN -> 0x7F.
VA_HD uint8_t float_to_e4m3(float f) {
  if (f != f) return 0x7F;
  const uint8_t sign = f < 0.0f || (f == 0.0f && 1.0f / f < 0.0f) ? 0x80 : 0x00;
  float a = f < 0.0f ? -f : f;
  if (a >= kE4m3Max) return sign | 0x7E;
  if (a < exp2_int(-6)) {  // subnormal range: a multiple of 2^-9 (8 * 2^-9 = 2^-6 rounds up into code 8)
    const int q = static_cast<int>(rint_even(a * exp2_int(9)));
    return sign | static_cast<uint8_t>(q);
  }
  int e = 0;  // a = mant * 2^e, mant in [1, 2), e in [-6, 8]
  while (a >= exp2_int(e + 1)) ++e;
  while (a < exp2_int(e)) --e;
  int q = static_cast<int>(rint_even((a * exp2_int(-e) - 1.0f) * 8.0f));  // 3 mantissa bits, may round to 8
  if (q == 8) {
    q = 0;
    ++e;
  }
  if (e > 8 || (e == 8 && q == 7)) return sign | 0x7E;  // rounded past 448: saturate
  return sign | static_cast<uint8_t>(((e + 7) << 3) | q);
}

// The power of two a row of 16-bit Q is divided by before it is rounded to f16 (the f16-MMA path for
// e4m3 caches): the smallest 2^e >= 1 with amax / 2^e < 2^15, so f16 neither overflows nor, for
// typical rows (amax < 2^15: 2^e = 1), changes a bf16 value that f16 holds. inf amax: 1 (the inf
// stays inf); NaN amax: NaN (the row's scores become NaN, as the reference's do).
VA_HD float f16_row_scale(float amax) {
  if (amax != amax) return amax;
  if (!(amax - amax == 0.0f)) return 1.0f;  // inf
  int e = 0;
  while (e < 113 && amax >= exp2_int(e + 15)) ++e;  // 2^(113 + 15) = inf ends it
  return exp2_int(e);
}

// The per-row scale of a row quantized to e4m3 (the e4m3-MMA kernels' Q): amax / 448, so the row's largest |x|
// becomes the largest code; 1 for an all-zero row; NaN amax: NaN (the row's scores become NaN, as the reference's
// do); inf amax: inf (the row's finite values round to 0).
VA_HD float e4m3_row_scale(float amax) { return amax > 0.0f ? amax / kE4m3Max : (amax == 0.0f ? 1.0f : amax); }

// f16 bits of an e4m3 code (exact: every e4m3 value is an f16 value; NaN -> f16 NaN 0x7E00).
VA_HD uint16_t e4m3_to_f16_bits(uint8_t x) {
  const int e = (x >> 3) & 0xF, m = x & 7;
  const uint16_t sign = static_cast<uint16_t>((x & 0x80) << 8);
  if (e == 0xF && m == 7) return sign | 0x7E00;
  if (e == 0) {  // m * 2^-9 = m * 2^-9: f16 normal for m >= 1 (2^-9 >= 2^-14)
    if (m == 0) return sign;
    int k = 2;  // m = 1.f * 2^k, k = floor(log2 m)
    while (!(m >> k)) --k;
    const uint16_t frac = static_cast<uint16_t>((m - (1 << k)) << (10 - k));
    return sign | static_cast<uint16_t>(((k - 9 + 15) << 10) | frac);
  }
  return sign | static_cast<uint16_t>(((e - 7 + 15) << 10) | (m << 7));
}

// ---- fragment permutations of the fp8 MMA path (mma.m16n8k32 .e4m3) --------------------------
//
// P . V with P (rows x tokens) and V (tokens x dims) both e4m3 needs V's B fragment with 4
// consecutive k (token) bytes per register. V sits in shared memory token-major, so the kernel
// loads it with ldmatrix .trans .b16 over 4 matrices of 8 tokens x 16 bytes and joins pairs of
// registers with a byte permute. A lane then holds, for its dim pair (2g, 2g+1), the tokens
// {2c, 2c+1, 2c+8, 2c+9} (+16 for the second register), c = lane % 4: the MMA's k order is a
// permutation of the tile's tokens, and P's A fragment must use the same one. The MMA's n8
// columns are the even dims (one MMA) and the odd dims (another) of a 16-dim chunk.

// Token (0..31) of a 32-token tile at MMA k position `k` (0..31).
VA_HD constexpr int fp8_pv_token_of_k(int k) {
  const int c = (k & 15) >> 2, i = k & 3;
  return (k & 16) + 2 * c + (i & 1) + 8 * (i >> 1);
}

// k position of token t: the byte at which P's row stores it (inverse of fp8_pv_token_of_k).
VA_HD constexpr int fp8_pv_k_of_token(int t) {
  const int u = t & 15;
  return (t & 16) + 4 * ((u & 7) >> 1) + (u & 1) + 2 * (u >> 3);
}

// Byte-permute selectors that join two ldmatrix .trans .b16 registers (tokens 2c, 2c+1 of one
// matrix, then of the matrix 8 tokens later) into one B register: even dim, odd dim.
inline constexpr uint32_t kPrmtEvenBytes = 0x6420;
inline constexpr uint32_t kPrmtOddBytes = 0x7531;

// prmt.b32 (default mode) on the host: byte i of the result is byte sel[i] of {b:a} (a = bytes 0-3).
VA_HD uint32_t prmt_bytes(uint32_t a, uint32_t b, uint32_t sel) {
  const uint64_t x = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t s = (sel >> (4 * i)) & 0xF;
    uint32_t byte = static_cast<uint32_t>(x >> (8 * (s & 7))) & 0xFF;
    if (s & 8) byte = (byte & 0x80) ? 0xFF : 0x00;  // sign-replicate mode of the selector's high bit
    r |= byte << (8 * i);
  }
  return r;
}

}  // namespace va::host
