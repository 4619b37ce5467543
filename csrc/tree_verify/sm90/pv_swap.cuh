// P V with its operands swapped, for e4m3 caches on wgmma: Hopper's v3 on e4m3 (sm90/tree_verify_kernel_v3.cuh, pv_swap;
// NOTES.md, "Hopper's v3 on e4m3: P V with the operands swapped").
//
// wgmma takes e4m3 B operands K-major only, so O (rows x dims) = P V needs V with its tokens contiguous per dim, and
// Hopper's v3 transposed each block's V into a V^T buffer (32 KB read and 32 KB written a block) until 2026-12-07. Swapped:
// O^T (dims x rows) = V^T (dims x tokens) P^T (tokens x rows). V^T is then the A operand, which wgmma may take from
// registers, and P^T the B operand, K-major: P's rows with their tokens contiguous, a 4 KB e4m3 tile a block.
//
// vt_a_fragment_e4m3 builds the A fragment of V^T (wgmma's e4m3 A, mma.m16n8k32's: byte i of a[r] is row g + 8 (r % 2),
// k 4t + i + 16 (r / 2), g = lane / 4, t = lane % 4) for 16 dims x 32 tokens straight from token-major rows: one
// ldmatrix .trans .b16 x4 (matrix m: tokens 8m .. 8m + 7; lane l passes the address of token l's 16 bytes of the 16
// dims) and four byte permutes, the join sm_120's P V already does for its B fragments. The fragment's order is not
// the natural one:
//   * row rho is dim vt_dim_of_row(rho) of the 16: 2 rho for rho < 8, 2 (rho - 8) + 1 above; so O^T's accumulator row
//     rho of a warp's 16 is that dim;
//   * k position kappa is token fp8_pv_token_of_k(kappa) of the 32 (csrc/host/fp8.h); so P^T's rows must hold their
//     tokens in that order (byte fp8_pv_k_of_token(t) of a 32-token step holds token t).
#pragma once

#include <cstdint>

#include "arch/arch.cuh"
#include "../../host/fp8.h"

namespace va::tv {

// Dim (0..15) of a 16-dim chunk at row `rho` (0..15) of vt_a_fragment_e4m3's fragment.
VA_HD constexpr int vt_dim_of_row(int rho) { return rho < 8 ? 2 * rho : 2 * (rho - 8) + 1; }

// a: the A fragment of V^T for the 16 dims and 32 tokens whose rows `row_of_lane` addresses (lane l: token l's 16
// bytes at the 16 dims; any layout whose 16-byte rows are contiguous, such as the stages' core-matrix layout).
VA_DEVICE void vt_a_fragment_e4m3(uint32_t (&a)[4], const void* row_of_lane) {
  uint32_t r[4];
  arch::ldmatrix_x4_trans(r, row_of_lane);  // r[m]: tokens 8m + 2t, +1 of the dim pair (2g, 2g + 1)
  a[0] = arch::prmt(r[0], r[1], host::kPrmtEvenBytes);  // row g (dim 2g), tokens 2t, 2t+1, 2t+8, 2t+9
  a[1] = arch::prmt(r[0], r[1], host::kPrmtOddBytes);   // row g + 8 (dim 2g + 1), the same tokens
  a[2] = arch::prmt(r[2], r[3], host::kPrmtEvenBytes);  // row g, tokens 16 + those
  a[3] = arch::prmt(r[2], r[3], host::kPrmtOddBytes);   // row g + 8, tokens 16 + those
}

}  // namespace va::tv
