// Split-KV ranges: which KV tokens of a request split s owns.
//
// Every request is cut into `num_splits` chunks of equal length rounded up to
// a multiple of the KV tile (block_n), so only the request's last tile is
// ragged and tiles never straddle a split boundary. Short requests leave the
// trailing splits empty; the split kernel's CTAs for them exit at once and the
// combine skips them (it recomputes num_nonempty_splits from kv_len), so an
// empty split never needs a partial.
#pragma once

#include "common.h"

namespace va::host {

struct SplitRange {
  int begin;  // first token (inclusive)
  int end;    // last token (exclusive); begin == end: empty split
};

// Tokens per split: ceil(kv_len / num_splits) rounded up to block_n (>= block_n).
VA_HD int split_chunk(int kv_len, int num_splits, int block_n) {
  const int per = ceil_div(max_i(kv_len, 1), num_splits);
  return round_up(per, block_n);
}

VA_HD SplitRange split_range(int kv_len, int num_splits, int block_n, int split) {
  const int64_t chunk = split_chunk(kv_len, num_splits, block_n);
  const int64_t b = chunk * split;
  const int begin = b < kv_len ? static_cast<int>(b) : kv_len;
  const int64_t e = b + chunk;
  const int end = e < kv_len ? static_cast<int>(e) : kv_len;
  return {begin, end};
}

// Splits that own at least one token: exactly the splits 0 .. n-1.
VA_HD int num_nonempty_splits(int kv_len, int num_splits, int block_n) {
  if (kv_len <= 0) return 0;
  return ceil_div(kv_len, split_chunk(kv_len, num_splits, block_n));
}

// Number of KV tiles in a split range.
VA_HD int num_tiles(SplitRange r, int block_n) { return r.end > r.begin ? ceil_div(r.end - r.begin, block_n) : 0; }

}  // namespace va::host
