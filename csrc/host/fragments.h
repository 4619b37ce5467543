// Fragment-to-(row, col) maps of mma.sync.m16n8k16 and ldmatrix, as the PTX ISA
// defines them, plus the per-lane smem addresses the kernel hands ldmatrix.
//
// PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type":
//   https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#warp-level-matrix-fragment-mma-16816-float
// PTX ISA, "ldmatrix":
//   https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#warp-level-matrix-instructions-ldmatrix
// groupID = lane >> 2, threadID_in_group = lane % 4. Each 32-bit register holds
// two 16-bit elements; `half` 0 is the low half (the even column / row).
// The kernel computes its ldmatrix addresses with the ldsm_* functions below,
// and the host tests check that ldmatrix(ldsm_*) lands exactly on the mma
// fragment maps: the composition is what the kernel relies on.
#pragma once

#include "common.h"

namespace va::host {

struct RowCol {
  int row;
  int col;
};

// A (16 x 16, row-major operand): registers a0..a3, two elements each.
//   a0: (g, 2t+h)  a1: (g+8, 2t+h)  a2: (g, 2t+8+h)  a3: (g+8, 2t+8+h)
VA_HD RowCol mma_a_rc(int lane, int reg, int half) {
  const int g = lane >> 2, t = lane & 3;
  return {g + 8 * (reg & 1), 2 * t + half + 8 * (reg >> 1)};
}

// B (16 x 8, "col" operand): registers b0, b1; (row = k, col = n).
//   b0: (2t+h, g)  b1: (2t+8+h, g)
VA_HD RowCol mma_b_rc(int lane, int reg, int half) {
  const int g = lane >> 2, t = lane & 3;
  return {2 * t + half + 8 * reg, g};
}

// C/D (16 x 8, f32): elements c0..c3.  c0,c1: (g, 2t+{0,1})  c2,c3: (g+8, 2t+{0,1})
VA_HD RowCol mma_c_rc(int lane, int idx) {
  const int g = lane >> 2, t = lane & 3;
  return {g + 8 * (idx >> 1), 2 * t + (idx & 1)};
}

// ldmatrix .m8n8 .b16: element `half` of the register a lane receives from one
// 8x8 matrix whose row r lives at the address supplied by lane 8*m + r.
//   non-trans: (row lane/4, col 2*(lane%4)+half);  .trans: the transpose.
VA_HD RowCol ldmatrix_rc(int lane, int half, bool trans) {
  const RowCol rc{lane >> 2, 2 * (lane & 3) + half};
  return trans ? RowCol{rc.col, rc.row} : rc;
}

// ---- the kernel's ldmatrix addressing (offsets inside a 16x16 block) -------

// x4 load of an A fragment from a row-major [16 rows][16 cols] block:
// matrices 0..3 = (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15)
// = registers a0..a3. Lane l supplies row (l % 8) of matrix l / 8.
VA_HD RowCol ldsm_a_addr(int lane) { return {(lane & 7) + 8 * ((lane >> 3) & 1), 8 * (lane >> 4)}; }

// x4 (non-trans) load of the B fragments of two adjacent n8 tiles from a
// [n][k] block (K rows: token-major, head dim contiguous): matrices 0..3 =
// (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
// = b0, b1 of n-tile 0, then b0, b1 of n-tile 1. Returns {n, k}.
// The x2 form (one n8 tile) uses lanes 0-15 of the same map.
VA_HD RowCol ldsm_b_addr(int lane) { return {(lane & 7) + 8 * (lane >> 4), 8 * ((lane >> 3) & 1)}; }

// x4 .trans load of the B fragments of two adjacent n8 tiles from a [k][n]
// block (V rows: token-major, head dim contiguous): matrices 0..3 =
// (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15). Returns {k, n}.
VA_HD RowCol ldsm_bt_addr(int lane) { return {(lane & 7) + 8 * ((lane >> 3) & 1), 8 * (lane >> 4)}; }

// The element (row, col) of the 16x16 (A) / 16x16 (B pair) block that lane
// `lane` holds in register `reg`, half `half`, after the kernel's ldmatrix:
// composition of ldmatrix_rc with the address maps above (used by the tests).
VA_HD RowCol ldsm_a_holds(int lane, int reg, int half) {
  const RowCol in = ldmatrix_rc(lane, half, false);        // inside matrix `reg`
  const RowCol base = ldsm_a_addr(8 * reg + in.row);       // the lane that supplied that row
  return {base.row, base.col + in.col};
}
// B pair via x4 non-trans from [n][k] storage: returns {k, n} of the B operand
// (n in 0..15: n-tile = n / 8), register reg in 0..3 (b0,b1 of tile 0, b0,b1 of tile 1).
VA_HD RowCol ldsm_b_holds(int lane, int reg, int half) {
  const RowCol in = ldmatrix_rc(lane, half, false);
  const RowCol base = ldsm_b_addr(8 * reg + in.row);  // {n, k0}
  return {base.col + in.col, base.row};
}
// B pair via x4 .trans from [k][n] storage: returns {k, n}.
VA_HD RowCol ldsm_bt_holds(int lane, int reg, int half) {
  const RowCol in = ldmatrix_rc(lane, half, true);    // (row, col) of the stored 8x8 matrix
  const RowCol base = ldsm_bt_addr(8 * reg + in.row); // {k0 + r, n0}
  return {base.row, base.col + in.col};
}

}  // namespace va::host
