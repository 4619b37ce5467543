// Split-KV tree-verify attention: the split kernel (one template for every
// dtype / head shape / layout / tile config).
//
// Grid (num_splits, m_tiles * Hkv, batch); block 32 * WM * WN threads.
// A CTA owns BM folded rows (row = node * group + head-in-group, so the group's
// query heads share one KV read) of one KV head of one request, and one split
// of that request's KV. It loads its Q tile once (cp.async to smem), streams the
// split's KV tiles through a STAGES-deep cp.async pipeline and, per tile:
//   S = Q K^T (mma.sync m16n8k16, fp32), masked only in tiles that reach into the
//   tree block or past the end; online softmax in base 2 (sm_scale*log2e folded);
//   O += P V with V from the same smem rows (MLA) or a separate V tile (GQA).
// The WN warps sharing 16 rows split the tile's tokens for S and Dv for O: their
// row maxima and P meet in shared memory. Finally the CTA writes O / l and
// log2-sum-exp2 per row: to `out`/`lse` directly when num_splits == 1, else to
// the fp32 workspace for the combine kernel (tree_verify_combine.cuh).
// CTAs whose split is empty or whose rows all lie past T_b * group exit at once:
// the grid comes from static shapes (CUDA-graph safe), the real sizes from the device.
#pragma once

#include "arch/arch.cuh"
#include "../host/host_math.h"
#include "params.h"
#include "request.cuh"
#include "traits.h"

namespace va::tv {

struct Exp2Fast {
  VA_DEVICE float operator()(float x) const { return va::arch::exp2_approx(x); }
};
struct Log2 {
  VA_DEVICE float operator()(float x) const { return log2f(x); }
};

// Workspace views: partial O [num_splits, total_q, Hq, Dv] fp32, then lse2 [num_splits, total_q, Hq].
VA_HOST_DEVICE float* ws_partial_o(const Params& p) { return static_cast<float*>(p.workspace); }
VA_HOST_DEVICE float* ws_partial_lse(const Params& p, int num_splits) {
  return static_cast<float*>(p.workspace) +
         static_cast<int64_t>(num_splits) * p.total_q * p.num_q_heads * p.head_dim_v;
}

// The global address of 16-byte chunk c of q for CTA row grow (tree node grow / group, head kvh * group + grow % group),
// every kernel's Q staging; `valid` false for rows past T_b * group (zero-filled, never written out), whose address
// is q itself (in bounds, never read).
template <class T>
VA_DEVICE const T* q_chunk_src(const Params& p, const T* q, int grow, int nrows, int group, int qo_begin, int kvh,
                               int c, bool& valid) {
  valid = grow < nrows;
  if (!valid) return q;
  const int node = grow / group, hh = grow % group;
  return q + (qo_begin + node) * p.q_stride_tok + (kvh * group + hh) * p.q_stride_head + c * 8;
}

// The tree mask over a wgmma m64 accumulator's scores (kernels v2 and Hopper's v3): this thread's kSAccN scores of the
// tile starting at token tok0 (its rows qg and qg + 8 of its warp, hf = (e % 4) / 2; token tok0 + 8 (e / 4) + 2 qt +
// (e & 1)) set to -inf where the row's node does not see the token. Each row's visibility over the tile is built once
// as 64 bits (va::host::block_visible_bits, from at most three mask words: the first kMaskStage words of each row
// from shared memory (my_mask), wider trees' further words from global memory); each score is then a bit test at a
// compile-time position. (Until 2026-12-06 each score found its own word and ran token_visible: ~866 instructions a
// warp on Hopper v3's cold pair by the SASS, now ~205.) smask_row: the row's q row, -1 for padding rows, which see
// every real token (keeps them finite; they are never written).
template <int kSAccN, int kMaskStage>
VA_DEVICE void mask_m64_scores(const Params& p, float (&s)[kSAccN], int tok0, int qt, int prefix, int end,
                               const int (&smask_row)[2], const uint32_t* const (&my_mask)[2]) {
  namespace arch = va::arch;
  namespace h = va::host;
  static_assert(kSAccN % 4 == 0 && kSAccN <= 32, "a tile of at most 64 tokens: its visibility fits 64 bits");
  const int first = h::mask_window_first_word(tok0, prefix);
  uint64_t vis[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    uint32_t w[3] = {0u, 0u, 0u};
    if (smask_row[hf] >= 0) {
#pragma unroll
      for (int k = 0; k < 3; ++k) {
        const int wi = first + k;
        if (h::mask_window_word_needed(wi, prefix, end)) {
          if (wi < kMaskStage) {
            w[k] = my_mask[hf][wi];
          } else {  // sass-model: rare
            w[k] = static_cast<uint32_t>(
                arch::ld_global(p.tree_mask + static_cast<int64_t>(smask_row[hf]) * p.mask_words + wi));
          }
        }
      }
      vis[hf] = h::block_visible_bits(tok0, prefix, end, w[0], w[1], w[2]) >> (2 * qt);
    } else {  // padding: every token before the end
      vis[hf] = h::block_visible_bits(tok0, end, end, 0u, 0u, 0u) >> (2 * qt);
    }
  }
#pragma unroll
  for (int e = 0; e < kSAccN; ++e) {
    const int bit = 8 * (e / 4) + (e & 1);  // token tok0 + 2 qt + bit
    if (!((vis[(e % 4) >> 1] >> bit) & 1u)) s[e] = h::neg_inf();
  }
}

// The epilogue of a wgmma m64 accumulator (kernels v2 and Hopper's v3): this thread's two rows (warp wq's 16 rows,
// fragment row qg and qg + 8) and its columns col0 + 8 j, +1 of O (oacc, kOAccN floats: 4 per n8 block), divided by
// the row's l and times `scale`; with one split straight to out (and the lse, by `lse_lane`), else into the split's
// workspace rows for the combine. kStoreO false: the lse alone (O stored by store_m64_cols).
template <class T, int kOAccN, bool kStoreO = true>
VA_DEVICE void store_m64_rows(const Params& p, int num_splits, int split, int row0, int nrows, int qo_begin, int kvh,
                              int wq, int qg, int col0, bool lse_lane, const float (&oacc)[kOAccN],
                              const float (&m_run)[2], const float (&l_run)[2], float scale) {
  namespace arch = va::arch;
  namespace h = va::host;
  const int group = p.group;
  const bool direct = num_splits == 1;
  float* ws_o = direct ? nullptr : ws_partial_o(p);
  float* ws_lse = direct ? nullptr : ws_partial_lse(p, num_splits);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int grow = row0 + wq * 16 + qg + 8 * hf;
    if (grow >= nrows) continue;
    const int qrow = qo_begin + grow / group;
    const int head = kvh * group + grow % group;
    const float inv = h::row_inv_l(l_run[hf]) * scale;
    const float lse2 = h::row_lse2(m_run[hf], l_run[hf], Log2{});
    if (direct) {
      T* o = static_cast<T*>(p.out) + qrow * p.o_stride_tok + head * p.o_stride_head + col0;
#pragma unroll
      for (int j = 0; j < (kStoreO ? kOAccN / 4 : 0); ++j)
        arch::st_global(reinterpret_cast<uint32_t*>(o + 8 * j),
                        arch::pack2<T>(oacc[4 * j + 2 * hf] * inv, oacc[4 * j + 2 * hf + 1] * inv));
      if (p.lse != nullptr && lse_lane)
        arch::st_global(p.lse + qrow * p.lse_stride_tok + head * p.lse_stride_head, lse2 * h::kLn2);
    } else {
      const int64_t prow = (static_cast<int64_t>(split) * p.total_q + qrow) * p.num_q_heads + head;
      float* o = ws_o + prow * p.head_dim_v + col0;
#pragma unroll
      for (int j = 0; j < (kStoreO ? kOAccN / 4 : 0); ++j)
        arch::st_global(reinterpret_cast<float2*>(o + 8 * j),
                        make_float2(oacc[4 * j + 2 * hf] * inv, oacc[4 * j + 2 * hf + 1] * inv));
      if (lse_lane) arch::st_global(ws_lse + prow, lse2);
    }
  }
}

// The epilogue of O^T (Hopper's v3 on e4m3: O^T = V^T P^T, kOTiles m64 tiles of dims, N = the CTA's 64 rows): this
// thread's columns, rows 8 j + 2 qt + c of the CTA's, at dims dim0 + 64 mt and + 1 (accumulator rows qg and qg + 8 of
// its warp's 16 in each tile, o[32 mt + 4 j + c] and o[32 mt + 4 j + 2 + c]), times inv_of_row[row] (1 / l and the
// scales); with one split to out, else into the split's workspace rows. The lse: store_m64_rows<..., false>.
template <class T, int kOTiles>
VA_DEVICE void store_m64_cols(const Params& p, int num_splits, int split, int row0, int nrows, int qo_begin, int kvh,
                              int qt, int dim0, const float (&o)[kOTiles * 32], const float* inv_of_row) {
  namespace arch = va::arch;
  const int group = p.group;
  const bool direct = num_splits == 1;
  float* ws_o = direct ? nullptr : ws_partial_o(p);
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int n = 8 * j + 2 * qt + c, grow = row0 + n;
      if (grow >= nrows) continue;
      const int qrow = qo_begin + grow / group;
      const int head = kvh * group + grow % group;
      const float inv = inv_of_row[n];
      if (direct) {
        T* out = static_cast<T*>(p.out) + qrow * p.o_stride_tok + head * p.o_stride_head + dim0;
#pragma unroll
        for (int mt = 0; mt < kOTiles; ++mt)
          arch::st_global(reinterpret_cast<uint32_t*>(out + 64 * mt),
                          arch::pack2<T>(o[32 * mt + 4 * j + c] * inv, o[32 * mt + 4 * j + 2 + c] * inv));
      } else {
        const int64_t prow = (static_cast<int64_t>(split) * p.total_q + qrow) * p.num_q_heads + head;
        float* out = ws_o + prow * p.head_dim_v + dim0;
#pragma unroll
        for (int mt = 0; mt < kOTiles; ++mt)
          arch::st_global(reinterpret_cast<float2*>(out + 64 * mt),
                          make_float2(o[32 * mt + 4 * j + c] * inv, o[32 * mt + 4 * j + 2 + c] * inv));
      }
    }
}

// e4m3 caches on wgmma (kernel v2 and Hopper's v3): Q quantized per row (scale amax / 448, like v1's e4m3 tiles; a
// NaN in the row gives a NaN scale) into the no-swizzle core-matrix layout of a KV stage, row r's 16-byte chunk c
// (16 dims) at (r / 8) kGroupBytes + 128 c + 16 (r % 8), and each row's scale into sQScale. Warp w of kWarps takes
// rows w, w + kWarps, ...; lane l the chunks l, l + 32. Generic-proxy stores: the callers fence them
// (fence_proxy_async) before the barrier that hands Q to the S wgmmas.
template <class T, int BM, int kWarps, int kChunks, int kGroupBytes>
VA_DEVICE void stage_q_e4m3(const Params& p, const T* q, int row0, int nrows, int group, int qo_begin, int kvh,
                            int warp, int lane, unsigned char* sQ, float* sQScale) {
  namespace arch = va::arch;
  namespace h = va::host;
  constexpr int kLaneChunks = (kChunks + 31) / 32;
  for (int r = warp; r < BM; r += kWarps) {
    const int grow = row0 + r;
    const bool valid = grow < nrows;  // rows past T_b * group: zeros (never written out)
    const T* src = valid ? q + (qo_begin + grow / group) * p.q_stride_tok + (kvh * group + grow % group) * p.q_stride_head
                         : q;
    float x[kLaneChunks][16];
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < kLaneChunks; ++j) {
      const int c = lane + 32 * j;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        uint4 w = make_uint4(0, 0, 0, 0);
        if (valid && c < kChunks) w = arch::ld_global(reinterpret_cast<const uint4*>(src + 16 * c + 8 * hh));
        const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) arch::unpack2<T>(ws[u], x[j][8 * hh + 2 * u], x[j][8 * hh + 2 * u + 1]);
      }
#pragma unroll
      for (int e = 0; e < 16; ++e) amax = arch::max_nan(amax, fabsf(x[j][e]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = arch::max_nan(amax, arch::shfl_xor(amax, o));
    const float scale = h::e4m3_row_scale(amax);
    const float inv = 1.f / scale;
    if (lane == 0) sQScale[r] = scale;
#pragma unroll
    for (int j = 0; j < kLaneChunks; ++j) {
      const int c = lane + 32 * j;
      if (c >= kChunks) continue;
      uint32_t w[4];
#pragma unroll
      for (int u = 0; u < 4; ++u)
        w[u] = arch::cvt_e4m3x4(x[j][4 * u] * inv, x[j][4 * u + 1] * inv, x[j][4 * u + 2] * inv, x[j][4 * u + 3] * inv);
      arch::st_shared(sQ + (r >> 3) * kGroupBytes + c * 128 + (r & 7) * 16, make_uint4(w[0], w[1], w[2], w[3]));
    }
  }
}

// e4m3 caches on wgmma: V (the first Dv dims of 32 landed KV rows in the core-matrix layout above) transposed into a
// V^T buffer, the P V wgmma's K-major B operand: dim d, k position kappa at (d / 8) kVtSbo + (kappa / 16) kVtLbo +
// 16 (d % 8) + kappa % 16, where k position kappa holds token fp8_pv_token_of_k(kappa) (csrc/host/fp8.h: where the S
// accumulator, hence P's A fragment, has it). Lane (w = lane % 4, qp = lane / 4 % 4, x = lane / 16) of warp wp takes,
// for each 16-dim chunk c = wp + kWarps i of V, dims 16 c + 4 w .. + 3 and the k word 4 qp of k half x, i.e. tokens
// 16 x + 2 qp + {0, 1, 8, 9}: 4 loads of 4 bytes, read in the order {0, 1, 8, 9} (x = 0) or {1, 0, 9, 8} (x = 1) so
// that the 32 lanes of each load hit 32 banks (token % 8 and w), byte permutes undoing the order, 4 stores of 4
// bytes (banks 16 (w % 2) + 8 (w / 2) + 4 x + qp: all 32 by kVtLbo 144 / kVtSbo 288). The thread's byte offsets are
// loop-invariant, so every access is a base plus an immediate. Generic-proxy stores: the callers fence them before
// the barrier that publishes the buffer to the wgmma.
template <int kWarps, int kGroupBytes, int kVtLbo, int kVtSbo>
struct VtTransposer {
  int ld0, ld1, st;   // loads u = 0, 2 (token parity x) from ld0, u = 1, 3 from ld1 (+ kGroupBytes: 8 tokens on)
  uint32_t lo, hi;    // the permute selectors of lane half x
  VA_DEVICE VtTransposer(int lane, int warp) {
    const int w = lane & 3, qp = (lane >> 2) & 3, x = lane >> 4;
    lo = x ? 0x1504u : 0x5140u, hi = x ? 0x3726u : 0x7362u;
    ld0 = 2 * x * kGroupBytes + 32 * qp + 16 * x + 4 * w + 128 * warp;
    ld1 = ld0 + 16 - 32 * x;
    st = x * kVtLbo + 4 * qp + (w >> 1) * kVtSbo + (w & 1) * 64 + 2 * warp * kVtSbo;
  }
  // kIters chunks c = c0 + warp + kWarps i of the 32 tokens at `src` (a stage's token 32 kk: + 4 kk kGroupBytes,
  // chunk c0: + 128 c0) into `dst` (the V^T of that k32 step; chunk c0: + 2 c0 kVtSbo)
  template <int kIters>
  VA_DEVICE void run(const unsigned char* src, unsigned char* dst) const {
    namespace arch = va::arch;
    const unsigned char* src0 = src + ld0;
    const unsigned char* src1 = src + ld1;
    unsigned char* d = dst + st;
    // every load first: the stores below may alias them as far as the compiler knows, so loads interleaved with them
    // would wait out each store's round trip (a chain of kIters shared-memory latencies)
    uint32_t rr[kIters][4];
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int c_off = i * kWarps * 128;
      rr[i][0] = *reinterpret_cast<const uint32_t*>(src0 + c_off);
      rr[i][1] = *reinterpret_cast<const uint32_t*>(src1 + c_off);
      rr[i][2] = *reinterpret_cast<const uint32_t*>(src0 + c_off + kGroupBytes);
      rr[i][3] = *reinterpret_cast<const uint32_t*>(src1 + c_off + kGroupBytes);
    }
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const uint32_t(&r)[4] = rr[i];
      const uint32_t lo01 = arch::prmt(r[0], r[1], lo), hi01 = arch::prmt(r[0], r[1], hi);
      const uint32_t lo23 = arch::prmt(r[2], r[3], lo), hi23 = arch::prmt(r[2], r[3], hi);
      const uint32_t o[4] = {arch::prmt(lo01, lo23, 0x5410u), arch::prmt(lo01, lo23, 0x7632u),
                             arch::prmt(hi01, hi23, 0x5410u), arch::prmt(hi01, hi23, 0x7632u)};
#pragma unroll
      for (int b = 0; b < 4; ++b)  // dim 16 c + 4 w + b
        arch::st_shared(d + 2 * kWarps * i * kVtSbo + 16 * b, o[b]);
    }
  }
};

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1) tree_verify_split_kernel(const Params p, const int num_splits) {
  // launched with programmatic dependent launch (launch_shape.cuh): nothing below touches global memory before the
  // previous kernel on the stream completed; only this grid's launch and start overlap its end
  va::arch::grid_dependency_wait();
  using T = typename Tr::Elem;
  using L = typename Tr::Layout;
  using Smem = typename Tr::Smem;
  namespace arch = va::arch;
  namespace h = va::host;
  constexpr int BM = Tr::BM, BN = Tr::BN, WN = Tr::WN, STAGES = Tr::STAGES;

  // ---- this CTA's rows and KV range (block-uniform: early exits are safe) ----
  CtaWork work;
  if (!cta_work<T, BM, BN>(p, num_splits, work)) return;
  const int split = work.split, kvh = work.kvh;
  const RequestInfo& req = work.req;
  const int qo_begin = req.qo_begin, prefix = req.prefix;
  const int group = p.group;
  const int nrows = work.nrows, row0 = work.row0, ntiles = work.ntiles;
  const h::SplitRange range = work.range;
  const int kv_base = req.kv_base;

  const int tid = threadIdx.x;
  const int lane = arch::lane_id();
  const int warp = arch::warp_id();
  const int wm = warp / WN;  // which 16 rows
  const int wn = warp % WN;  // which tokens (S) / Dv columns (O) of those rows

  unsigned char* smem = arch::smem_dynamic<unsigned char>();
  T* sQ = reinterpret_cast<T*>(smem + Smem::kQ);  // (BM, Dqk) padded rows
  T* sK = reinterpret_cast<T*>(smem + Smem::kK);  // (STAGES, BN, Dqk)
  T* sV = Tr::kSharedKV ? sK : reinterpret_cast<T*>(smem + Smem::kV);  // (STAGES, BN, Dv) or the K rows
  constexpr int kVStageElems =
      Tr::kSharedKV ? BN * Smem::kKPitch : BN * Smem::kVPitch;  // elements between V stages

  const T* q = static_cast<const T*>(p.q);
  const T* kc = static_cast<const T*>(p.k_cache);
  const T* vc = static_cast<const T*>(p.v_cache);

  // ---- Q tile: rows past T_b * group land as zeros (and are never written) ----
  for (int i = tid; i < BM * Tr::kQChunks; i += Tr::kThreads) {
    const int r = i / Tr::kQChunks, c = i % Tr::kQChunks;
    const int grow = row0 + r;
    bool valid;  // (rows past T_b * group: zeros, never written out)
    const T* src = q_chunk_src(p, q, grow, nrows, group, qo_begin, kvh, c, valid);
    arch::cp_async_16_zfill(sQ + r * Smem::kQPitch + c * 8, src, valid);
  }

  // ---- KV tile loader: each thread owns one token row of the tile (kThreadsPerRow
  // threads per row split its 16-byte chunks). The row's kv_indices entry is
  // loaded one tile ahead (fetch_id) so its latency overlaps a tile of compute
  // instead of stalling the copy issue; issue_kv then only does cp.async.
  const int ld_row = tid / Tr::kThreadsPerRow;    // token row of every tile this thread loads
  const int ld_chunk = tid % Tr::kThreadsPerRow;  // first 16-byte chunk of that row
  auto fetch_id = [&](int tile) -> int32_t {
    const int t = range.begin + tile * BN + ld_row;
    return (tile < ntiles && t < range.end)
               ? ld_index(p.kv_indices, static_cast<int64_t>(kv_base) + L::index_pos(t, p.page_size), p.kv_indices_i64)
               : 0;
  };
  auto issue_kv = [&](int tile, int stage, int32_t id) {
    const int t = range.begin + tile * BN + ld_row;
    const bool valid = t < range.end;  // past the end: zeros land, nothing is read
    int64_t koff = 0, voff = 0;
    if (valid) {
      koff = L::row_offset(id, t, p.page_size, p.k_stride_block, p.k_stride_tok) + kvh * p.k_stride_head;
      voff = L::row_offset(id, t, p.page_size, p.v_stride_block, p.v_stride_tok) + kvh * p.v_stride_head;
    }
    T* dK = sK + stage * BN * Smem::kKPitch + ld_row * Smem::kKPitch;
    for (int c = ld_chunk; c < Tr::kQChunks; c += Tr::kThreadsPerRow)
      arch::cp_async_16_zfill(dK + c * 8, valid ? kc + koff + c * 8 : kc, valid);
    if constexpr (!Tr::kSharedKV) {
      T* dV = sV + stage * kVStageElems + ld_row * Smem::kVPitch;
      for (int c = ld_chunk; c < Tr::kVChunks; c += Tr::kThreadsPerRow)
        arch::cp_async_16_zfill(dV + c * 8, valid ? vc + voff + c * 8 : vc, valid);
    }
  };

  // ---- per-thread row state: rows g and g + 8 of this warp's 16 --------------
  const float scale_log2 = p.sm_scale * h::kLog2e;
  float m_run[2] = {h::neg_inf(), h::neg_inf()};  // running max (log2 units)
  float l_run[2] = {0.f, 0.f};                      // this thread's share of the running sum
  float oacc[Tr::kOTiles][4];                       // (16 rows, kDVW cols) fp32 accumulator, C fragments
#pragma unroll
  for (int j = 0; j < Tr::kOTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) oacc[j][e] = 0.f;

  // Mask rows of this thread's two rows (node ids; -1: a padding row past T_b * group).
  int mask_row[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int grow = row0 + wm * 16 + (lane >> 2) + 8 * i;
    mask_row[i] = grow < nrows ? qo_begin + grow / group : -1;
  }

  const h::RowCol a_addr = h::ldsm_a_addr(lane);
  const h::RowCol b_addr = h::ldsm_b_addr(lane);
  const h::RowCol bt_addr = h::ldsm_bt_addr(lane);
  const T* sQw = sQ + (wm * 16 + a_addr.row) * Smem::kQPitch + a_addr.col;  // this lane's A row in Q

  // ---- pipeline prologue: group 0 = Q + tile 0; groups 1..STAGES-2 = tiles ----
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ntiles) issue_kv(s, s, fetch_id(s));
    arch::cp_async_commit();
  }
  int32_t next_id = fetch_id(STAGES - 1);  // index of the next tile to issue, loaded a tile early

  for (int it = 0; it < ntiles; ++it) {  // sass-model: tile-loop
    arch::cp_async_wait<STAGES - 2>();  // tile `it` (and Q) landed for this thread's copies
    arch::block_sync();                 // ... and everyone's; stage (it-1) % STAGES is free
    if (it + STAGES - 1 < ntiles) issue_kv(it + STAGES - 1, (it + STAGES - 1) % STAGES, next_id);
    arch::cp_async_commit();            // (possibly empty) group keeps the wait count uniform
    next_id = fetch_id(it + STAGES);    // consumed next iteration: the load overlaps this tile's math

    const int stage = it % STAGES;
    const int tok0 = range.begin + it * BN;
    const T* sKs = sK + stage * BN * Smem::kKPitch;
    const T* sVs = sV + stage * kVStageElems;

    // -- S = Q K^T for (16 rows, kNS tokens) -----------------------------------
    float sacc[Tr::kSTiles][4];
#pragma unroll
    for (int j = 0; j < Tr::kSTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) sacc[j][e] = 0.f;
    const T* sKw = sKs + (wn * Tr::kNS + b_addr.row) * Smem::kKPitch + b_addr.col;
#pragma unroll 4
    for (int kk = 0; kk < Tr::kKSteps; ++kk) {
      uint32_t a[4];
      arch::ldmatrix_x4(a, sQw + kk * 16);
#pragma unroll
      for (int j = 0; j + 1 < Tr::kSTiles; j += 2) {
        uint32_t bb[4];
        arch::ldmatrix_x4(bb, sKw + j * 8 * Smem::kKPitch + kk * 16);
        const uint32_t b0[2] = {bb[0], bb[1]}, b1[2] = {bb[2], bb[3]};
        arch::mma_m16n8k16<T>(sacc[j], a, b0, sacc[j]);
        arch::mma_m16n8k16<T>(sacc[j + 1], a, b1, sacc[j + 1]);
      }
      if constexpr (Tr::kSTiles % 2 == 1) {
        // odd n8 tile count: x2 for the last one; lanes 16-31 (unused by .x2) repeat 0-15's in-range rows
        constexpr int j = Tr::kSTiles - 1;
        uint32_t b0[2];
        arch::ldmatrix_x2(b0, sKs + (wn * Tr::kNS + j * 8 + (lane & 7)) * Smem::kKPitch + 8 * ((lane >> 3) & 1) +
                                  kk * 16);
        arch::mma_m16n8k16<T>(sacc[j], a, b0, sacc[j]);
      }
    }

    // -- scale to log2 units, mask, row max --------------------------------------
    const bool masked = h::tile_needs_mask(tok0, BN, prefix, range.end);
    float tmax[2] = {h::neg_inf(), h::neg_inf()};
#pragma unroll
    for (int j = 0; j < Tr::kSTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const h::RowCol rc = h::mma_c_rc(lane, e);
        float s = sacc[j][e] * scale_log2;
        if (masked) {  // sass-model: cold
          const int t = tok0 + wn * Tr::kNS + j * 8 + rc.col;
          const int mr = mask_row[e >> 1];
          uint32_t word = 0;
          if (mr >= 0 && h::needs_mask_word(t, prefix, range.end))
            word = static_cast<uint32_t>(
                arch::ld_global(p.tree_mask + static_cast<int64_t>(mr) * p.mask_words + h::mask_word_index(t - prefix)));
          // padding rows see every real token (keeps them finite; they are never written)
          const bool vis = mr >= 0 ? h::token_visible(t, prefix, range.end, word) : t < range.end;
          if (!vis) s = h::neg_inf();
        }
        sacc[j][e] = s;
        tmax[e >> 1] = arch::max_f(tmax[e >> 1], s);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // the 4 lanes of a quad hold one row
      tmax[i] = arch::max_f(tmax[i], arch::shfl_xor(tmax[i], 1));
      tmax[i] = arch::max_f(tmax[i], arch::shfl_xor(tmax[i], 2));
    }
    if constexpr (WN > 1) {  // rows are split over WN warps: meet in smem
      float* red = reinterpret_cast<float*>(smem + Smem::kRedMax);  // (WN, BM)
      if ((lane & 3) == 0) {
#pragma unroll
        for (int i = 0; i < 2; ++i) red[wn * BM + wm * 16 + (lane >> 2) + 8 * i] = tmax[i];
      }
      arch::block_sync();
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float mx = h::neg_inf();
#pragma unroll
        for (int w = 0; w < WN; ++w) mx = arch::max_f(mx, red[w * BM + wm * 16 + (lane >> 2) + 8 * i]);
        tmax[i] = mx;
      }
    }

    // -- online softmax: P = exp2(S - m), rescale l and O ----------------------
    float mref[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float alpha = h::online_softmax_update(m_run[i], tmax[i], Exp2Fast{});
      mref[i] = h::softmax_ref_max(m_run[i]);
      l_run[i] *= alpha;
#pragma unroll
      for (int j = 0; j < Tr::kOTiles; ++j) {
        oacc[j][2 * i] *= alpha;
        oacc[j][2 * i + 1] *= alpha;
      }
    }
#pragma unroll
    for (int j = 0; j < Tr::kSTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pe = arch::exp2_approx(sacc[j][e] - mref[e >> 1]);
        sacc[j][e] = pe;
        l_run[e >> 1] += pe;
      }

    // -- O += P V ----------------------------------------------------------------
    if constexpr (WN == 1) {
      // P stays in registers: the C fragments of n8 tiles 2kk, 2kk+1 are the A fragment of k-step kk.
#pragma unroll
      for (int kk = 0; kk < Tr::kPSteps; ++kk) {
        const uint32_t a[4] = {
            arch::pack2<T>(sacc[2 * kk][0], sacc[2 * kk][1]), arch::pack2<T>(sacc[2 * kk][2], sacc[2 * kk][3]),
            arch::pack2<T>(sacc[2 * kk + 1][0], sacc[2 * kk + 1][1]),
            arch::pack2<T>(sacc[2 * kk + 1][2], sacc[2 * kk + 1][3])};
        const T* sVw = sVs + (kk * 16 + bt_addr.row) * Smem::kVPitch + bt_addr.col;
#pragma unroll
        for (int j = 0; j < Tr::kOTiles; j += 2) {
          uint32_t bb[4];
          arch::ldmatrix_x4_trans(bb, sVw + j * 8);
          const uint32_t b0[2] = {bb[0], bb[1]}, b1[2] = {bb[2], bb[3]};
          arch::mma_m16n8k16<T>(oacc[j], a, b0, oacc[j]);
          arch::mma_m16n8k16<T>(oacc[j + 1], a, b1, oacc[j + 1]);
        }
      }
    } else {
      // P goes through smem so each warp sees all BN tokens of its 16 rows.
      T* sP = reinterpret_cast<T*>(smem + Smem::kP);  // (BM, BN) padded rows
#pragma unroll
      for (int j = 0; j < Tr::kSTiles; ++j)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const h::RowCol rc = h::mma_c_rc(lane, 2 * i);
          *reinterpret_cast<uint32_t*>(sP + (wm * 16 + rc.row) * Smem::kPPitch + wn * Tr::kNS + j * 8 + rc.col) =
              arch::pack2<T>(sacc[j][2 * i], sacc[j][2 * i + 1]);
        }
      arch::block_sync();
      const T* sPw = sP + (wm * 16 + a_addr.row) * Smem::kPPitch + a_addr.col;
      const T* sVw = sVs + bt_addr.row * Smem::kVPitch + wn * Tr::kDVW + bt_addr.col;
#pragma unroll
      for (int kk = 0; kk < Tr::kPSteps; ++kk) {
        uint32_t a[4];
        arch::ldmatrix_x4(a, sPw + kk * 16);
#pragma unroll
        for (int j = 0; j < Tr::kOTiles; j += 2) {
          uint32_t bb[4];
          arch::ldmatrix_x4_trans(bb, sVw + kk * 16 * Smem::kVPitch + j * 8);
          const uint32_t b0[2] = {bb[0], bb[1]}, b1[2] = {bb[2], bb[3]};
          arch::mma_m16n8k16<T>(oacc[j], a, b0, oacc[j]);
          arch::mma_m16n8k16<T>(oacc[j + 1], a, b1, oacc[j + 1]);
        }
      }
    }
  }
  arch::cp_async_wait<0>();  // no copy outlives the CTA (only empty groups can be pending here)

  // ---- epilogue: full row sums, normalise, write --------------------------------
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_run[i] += arch::shfl_xor(l_run[i], 1);
    l_run[i] += arch::shfl_xor(l_run[i], 2);
  }
  if constexpr (WN > 1) {  // each warp summed only its tokens: add the WN partial sums
    float* red = reinterpret_cast<float*>(smem + Smem::kRedSum);  // (WN, BM)
    if ((lane & 3) == 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i) red[wn * BM + wm * 16 + (lane >> 2) + 8 * i] = l_run[i];
    }
    arch::block_sync();
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < WN; ++w) sum += red[w * BM + wm * 16 + (lane >> 2) + 8 * i];
      l_run[i] = sum;
    }
  }

  const bool direct = num_splits == 1;
  float* ws_o = direct ? nullptr : ws_partial_o(p);
  float* ws_lse = direct ? nullptr : ws_partial_lse(p, num_splits);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int grow = row0 + wm * 16 + (lane >> 2) + 8 * i;
    if (grow >= nrows) continue;
    const int qrow = qo_begin + grow / group;
    const int head = kvh * group + grow % group;
    const float inv = h::row_inv_l(l_run[i]);
    const float lse2 = h::row_lse2(m_run[i], l_run[i], Log2{});
    const int col0 = wn * Tr::kDVW + 2 * (lane & 3);
    if (direct) {
      T* o = static_cast<T*>(p.out) + qrow * p.o_stride_tok + head * p.o_stride_head + col0;
#pragma unroll
      for (int j = 0; j < Tr::kOTiles; ++j)
        arch::st_global(reinterpret_cast<uint32_t*>(o + j * 8),
                        arch::pack2<T>(oacc[j][2 * i] * inv, oacc[j][2 * i + 1] * inv));
      if (p.lse != nullptr && wn == 0 && (lane & 3) == 0)
        arch::st_global(p.lse + qrow * p.lse_stride_tok + head * p.lse_stride_head, lse2 * h::kLn2);
    } else {
      const int64_t prow = (static_cast<int64_t>(split) * p.total_q + qrow) * p.num_q_heads + head;
      float* o = ws_o + prow * p.head_dim_v + col0;
#pragma unroll
      for (int j = 0; j < Tr::kOTiles; ++j)
        arch::st_global(reinterpret_cast<float2*>(o + j * 8), make_float2(oacc[j][2 * i] * inv, oacc[j][2 * i + 1] * inv));
      if (wn == 0 && (lane & 3) == 0) arch::st_global(ws_lse + prow, lse2);
    }
  }
}

}  // namespace va::tv
