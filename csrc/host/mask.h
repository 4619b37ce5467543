// Tree-mask visibility of one KV token for one tree node.
//
// The KV of request b has kv_len = L_b + T_b entries; the last T_b are the tree
// nodes. Node i sees every prefix entry (t < L_b) and tree entry j = t - L_b
// iff bit (j % 32) of word (j / 32) of its mask row is set. Tokens at or past
// the end of the range being processed (ragged last tile) are never visible.
#pragma once

#include "common.h"

namespace va::host {

// index of the mask word that holds tree entry j
VA_HD int mask_word_index(int j) { return j >> 5; }

// bit j % 32 of a mask word
VA_HD bool mask_bit(uint32_t word, int j) { return (word >> (j & 31)) & 1u; }

// Whether token t is visible. `word` must be the mask row's word
// mask_word_index(t - prefix_len) when t is a tree entry; it is ignored otherwise
// (the caller loads it only for tree entries: the prefix reads no mask).
VA_HD bool token_visible(int t, int prefix_len, int end, uint32_t word) {
  if (t >= end) return false;
  if (t < prefix_len) return true;
  return mask_bit(word, t - prefix_len);
}

// Whether token t is a tree entry whose visibility needs a mask word.
VA_HD bool needs_mask_word(int t, int prefix_len, int end) { return t >= prefix_len && t < end; }

// Whether a KV tile [tile_begin, tile_begin + block_n) needs masking at all:
// only tiles that reach into the tree block or past the range end do.
VA_HD bool tile_needs_mask(int tile_begin, int block_n, int prefix_len, int end) {
  return tile_begin + block_n > prefix_len || tile_begin + block_n > end;
}

}  // namespace va::host
