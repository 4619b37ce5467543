// KV layout policies: the row address of logical token t of a request.
//
// DESIGN.md section 4: "row address of token t" is
//   page_size=1: pool + kv_indices[t] * row_stride
//   paged:       pool + (kv_indices[t / P] * P + t % P) * row_stride
// A policy says which kv_indices entry names token t (index_pos) and how that
// id plus t turn into an element offset (row_offset). The mainloop loads one
// index per KV row of a tile, then issues its 16-byte cp.async copies.
#pragma once

#include "common.h"

namespace va::host {

// page_size = 1 (SGLang style): pool [num_slots, Hkv, D]; kv_indices are slot ids.
struct Page1Layout {
  static constexpr bool kPaged = false;
  static constexpr const char* kName = "page1";
  // which kv_indices entry (relative to the request's first) holds token t
  VA_HD static int index_pos(int t, int /*page_size*/) { return t; }
  // element offset of token t's row (head 0); id = kv_indices[index_pos(t)]
  VA_HD static int64_t row_offset(int32_t id, int /*t*/, int /*page_size*/, int64_t stride_block,
                                  int64_t /*stride_tok*/) {
    return static_cast<int64_t>(id) * stride_block;
  }
};

// paged (FlashInfer style): pool [num_pages, P, Hkv, D]; kv_indices are page ids.
// The page size is a runtime value, so one instantiation serves every P.
struct PagedLayout {
  static constexpr bool kPaged = true;
  static constexpr const char* kName = "paged";
  VA_HD static int index_pos(int t, int page_size) { return t / page_size; }
  VA_HD static int64_t row_offset(int32_t id, int t, int page_size, int64_t stride_block, int64_t stride_tok) {
    return static_cast<int64_t>(id) * stride_block + static_cast<int64_t>(t % page_size) * stride_tok;
  }
};

}  // namespace va::host
