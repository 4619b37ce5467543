// What every kernel of the family reads about request b first: its q rows, KV length,
// prefix, first kv_indices entry, and whether its tree fits the mask rows; plus the
// index reads (int32 arrays, or int64 ones through their low words) and the rows a
// CTA fills when the request has nothing to attend to or is malformed.
#pragma once

#include <type_traits>

#include "arch/arch.cuh"
#include "../host/host_math.h"
#include "params.h"

#ifndef VA_TV_KNOCKOUT
#define VA_TV_KNOCKOUT 0
#endif

namespace va::tv {

// Timing experiments only (bench/knockout.py builds them with -DVA_TV_KNOCKOUT=bits; their results are wrong
// by design and they never ship): what a split kernel's tile costs without one of its parts.
//   kKoNoLoad:     the main loop issues no KV copies (the stages keep stale rows)
//   kKoNoIndex:    row ids are the token positions (page_size 1), no kv_indices read in the main loop
//   kKoNoExchange: kernel v2's warpgroups exchange no partial scores (the softmax sees constant scores)
//   kKoNoPrefetch: kernel v2 issues no L2 prefetches (its results stay right: the A/B of the prefetch)
//   kKoHalfRows:   kernel v3 (sm90, 16-bit) gathers, indexes and prefetches only rows 0-31 of each block (the
//                  other rows keep whatever the stage held): a 2-CTA cluster's gather without its DSMEM forward
constexpr int kKnockout = VA_TV_KNOCKOUT;
constexpr int kKoNoLoad = 1, kKoNoIndex = 2, kKoNoExchange = 4, kKoNoPrefetch = 8, kKoHalfRows = 16;

// Entry i of an int32 index array, or the low 32-bit word of entry i of an int64 one.
VA_DEVICE const int32_t* index_at(const int32_t* a, int64_t i, int32_t is64) { return a + (i << is64); }
VA_DEVICE int32_t ld_index(const int32_t* a, int64_t i, int32_t is64) {
  return va::arch::ld_global(index_at(a, i, is64));
}

struct RequestInfo {
  int qo_begin;  // first q row
  int tb;        // q rows (T_b)
  int kv_len;    // KV entries (L_b + T_b; the prefix alone in a prefix-only call)
  int prefix;    // entries every row sees unmasked: L_b, or kv_len in a prefix-only call
  int kv_base;   // first kv_indices entry
  bool too_wide; // T_b > 32 * mask_words: the mask rows cannot describe the tree (value checks were off)
};

// A request whose tree has more nodes than its mask rows describe (value checks were off).
VA_DEVICE bool tree_too_wide(const Params& p, int tb) { return p.tree_mask != nullptr && tb > 32 * p.mask_words; }

VA_DEVICE RequestInfo read_request(const Params& p, int b) {
  RequestInfo r;
  r.qo_begin = ld_index(p.qo_indptr, b, p.qo_indptr_i64);
  r.tb = ld_index(p.qo_indptr, b + 1, p.qo_indptr_i64) - r.qo_begin;
  r.kv_len = va::arch::ld_global(p.kv_lens + b);
  const bool masked = p.tree_mask != nullptr;
  r.prefix = masked ? r.kv_len - r.tb : r.kv_len;
  r.kv_base = ld_index(p.kv_indptr, b, p.kv_indptr_i64);
  r.too_wide = tree_too_wide(p, r.tb);
  return r;
}

// The combine's half of read_request: only whether request b's tree is wider than its mask rows.
VA_DEVICE bool request_too_wide(const Params& p, int b) {
  return p.tree_mask != nullptr &&
         tree_too_wide(p, ld_index(p.qo_indptr, b + 1, p.qo_indptr_i64) - ld_index(p.qo_indptr, b, p.qo_indptr_i64));
}

// The quiet-NaN bit pattern of a 16-bit element type (no conversion call on the device).
template <class T>
VA_DEVICE uint16_t nan_bits() { return sizeof(T) == 2 && std::is_same_v<T, __half> ? 0x7E00u : 0x7FC0u; }

// Writes 0 or NaN (`nan`) to out[q row, head, :] and `lse_value` to lse for the CTA's folded rows
// [row0, row_end) of KV head kvh (row = node * group + head in group): a request that sees no
// KV entry (0 and -inf) or one the kernel refuses (NaN, with the error bit set).
template <class T>
VA_DEVICE void fill_rows(const Params& p, const RequestInfo& r, int kvh, int row0, int row_end, bool nan,
                         float lse_value) {
  const int n = (row_end - row0) * p.head_dim_v;
  const uint16_t bits = nan ? nan_bits<T>() : uint16_t(0);  // 0 or NaN: no float conversion needed
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int grow = row0 + i / p.head_dim_v, c = i % p.head_dim_v;
    const int qrow = r.qo_begin + grow / p.group, head = kvh * p.group + grow % p.group;
    va::arch::st_global(reinterpret_cast<uint16_t*>(static_cast<T*>(p.out) + qrow * p.o_stride_tok +
                                                    head * p.o_stride_head + c), bits);
    if (c == 0 && p.lse != nullptr)
      va::arch::st_global(p.lse + qrow * p.lse_stride_tok + head * p.lse_stride_head, lse_value);
  }
}

// A dequantization scale of the e4m3 caches: read from the device when given as a tensor.
VA_DEVICE float kv_scale(const float* ptr, float value) { return ptr != nullptr ? va::arch::ld_global(ptr) : value; }

VA_DEVICE void report_error(const Params& p, int32_t bits) {
  if (p.errors != nullptr && threadIdx.x == 0) va::arch::st_global(p.errors, bits);  // same value from every CTA
}

// The split kernels' early exits after their rows [row0, row_end) and split range are known (block-
// uniform, so returning is safe): true when the CTA has no tile to run. A tree wider than its mask rows
// gets NaN rows and the error bit (with splits the combine writes the NaN rows); an empty split is
// skipped by the combine; a request with no KV at all (a prefix-only call) gets out 0, lse -inf.
template <class T>
VA_DEVICE bool cta_exits_early(const Params& p, const RequestInfo& r, int kvh, int row0, int row_end,
                               int num_splits, const va::host::SplitRange& range) {
  if (r.too_wide) {
    report_error(p, kErrTreeTooWide);
    if (num_splits == 1) fill_rows<T>(p, r, kvh, row0, row_end, true, __builtin_nanf(""));
    return true;
  }
  if (range.begin >= range.end) {
    if (r.kv_len == 0 && num_splits == 1) fill_rows<T>(p, r, kvh, row0, row_end, false, va::host::neg_inf());
    return true;
  }
  return false;
}

// What one CTA of a split kernel works on (grid: x = split, y = M tile x KV head, z = request): its
// request, folded rows [row0, row0 + BM) of nrows, and KV range. cta_work() returns false when the CTA
// has nothing to run (rows past the tree, an empty split, a refused or KV-less request: cta_exits_early
// writes what such a request's rows need); the result is block-uniform, so returning is safe.
struct CtaWork {
  int split, kvh, b;
  RequestInfo req;
  int nrows, row0, ntiles;
  va::host::SplitRange range;
};

// padding_runs: a CTA whose rows all lie past the tree still runs (a 2-CTA cluster's second CTA shares its peer's
// gather whether or not it has rows of its own; it writes nothing: every row it holds is padding)
template <class T, int BM, int BN>
VA_DEVICE bool cta_work(const Params& p, int num_splits, CtaWork& w, bool padding_runs = false) {
  w.split = blockIdx.x;
  w.kvh = blockIdx.y % p.num_kv_heads;
  const int mtile = blockIdx.y / p.num_kv_heads;
  w.b = blockIdx.z;
  w.req = read_request(p, w.b);
  w.nrows = w.req.tb * p.group;
  w.row0 = mtile * BM;
  if (w.row0 >= w.nrows && !padding_runs) return false;  // rows past T_b * group: nothing to do, nothing to write
  w.range = va::host::split_range(w.req.kv_len, num_splits, BN, w.split);
  if (cta_exits_early<T>(p, w.req, w.kvh, w.row0, w.row0 + BM < w.nrows ? w.row0 + BM : w.nrows, num_splits,
                         w.range))
    return false;
  w.ntiles = va::host::num_tiles(w.range, BN);
  return true;
}

// Stages the first kStageWords tree-mask words of each of a CTA's BM rows (folded row row0 + r: node
// (row0 + r) / group) into smem, sMask[r * kStageWords + w], by cp.async (the caller commits): the masked
// tiles' softmax reads them there instead of a global round trip per tile. Rows past nrows (padding) get
// zeros and are never read; nothing is staged for a prefix-only call (no tree mask).
template <int BM, int kThreads, int kStageWords>
VA_DEVICE void stage_mask_words(const Params& p, const RequestInfo& r, int row0, int nrows, uint32_t* sMask) {
  if (p.tree_mask == nullptr) return;
  const int words = p.mask_words < kStageWords ? p.mask_words : kStageWords;
  for (int i = threadIdx.x; i < BM * words; i += kThreads) {
    const int row = i / words, w = i - row * words;
    const int grow = row0 + row;
    const bool valid = grow < nrows;
    const int32_t* src =
        valid ? p.tree_mask + static_cast<int64_t>(r.qo_begin + grow / p.group) * p.mask_words + w : p.tree_mask;
    va::arch::cp_async_4_zfill(sMask + row * kStageWords + w, src, valid);
  }
}

}  // namespace va::tv
