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

// The tree-mask words a row needs for the 64 tokens tile_begin .. tile_begin + 63 (block_visible_bits): up to three
// consecutive words from the first returned here. Word first + k is needed only when it holds a tree entry before
// `end` (mask_window_word_needed); the others are passed as 0 and never read from memory.
VA_HD int mask_window_first_word(int tile_begin, int prefix_len) {
  return tile_begin > prefix_len ? mask_word_index(tile_begin - prefix_len) : 0;
}
VA_HD bool mask_window_word_needed(int word, int prefix_len, int end) { return word * 32 < end - prefix_len; }

// The visibility of the 64 tokens tile_begin + o (o < 64) for one mask row, as bits (bit o: token tile_begin + o), by
// token_visible's rules: prefix entries visible, tree entries by the row's mask bits, nothing at or past `end`.
// w0, w1, w2: the row's mask words mask_window_first_word(tile_begin, prefix_len) + 0, 1, 2 (0 where not needed).
// The kernels build it once a row a block and test a bit a score (one shift of a 96-bit window instead of a word
// load and three compares a score).
VA_HD uint64_t block_visible_bits(int tile_begin, int prefix_len, int end, uint32_t w0, uint32_t w1, uint32_t w2) {
  const int n_end = end - tile_begin, n_pre = prefix_len - tile_begin;
  const uint64_t all = ~static_cast<uint64_t>(0);
  const uint64_t in_range = n_end <= 0 ? 0 : n_end >= 64 ? all : (static_cast<uint64_t>(1) << n_end) - 1;
  const uint64_t prefix = n_pre <= 0 ? 0 : n_pre >= 64 ? all : (static_cast<uint64_t>(1) << n_pre) - 1;
  const uint64_t lo = static_cast<uint64_t>(w0) | (static_cast<uint64_t>(w1) << 32);
  uint64_t tree = 0;
  if (n_pre <= 0) {  // the block starts at tree entry j0 = -n_pre: bits j0 .. j0 + 63 of the row, from word j0 / 32
    const int sh = (-n_pre) & 31;
    tree = sh == 0 ? lo : (lo >> sh) | (static_cast<uint64_t>(w2) << (64 - sh));
  } else if (n_pre < 64) {  // the tree starts inside the block, at bit n_pre
    tree = lo << n_pre;
  }
  return in_range & (prefix | tree);
}

}  // namespace va::host
