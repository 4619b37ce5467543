// Plain parameter block of one tree-verify call (no torch, no CUDA headers).
//
// Filled on the host (csrc/bindings/params_from_tensors.h, the driver, or a
// test) and passed by value to the kernels. Strides are in elements. Every
// pointer is device memory (host memory under the CPU emulator).
#pragma once

#include <cstdint>

namespace va::tv {

enum class DType : int32_t { kBF16 = 0, kFP16 = 1 };

struct Params {
  // ---- inputs --------------------------------------------------------------
  const void* __restrict__ q;           // [total_q, Hq, Dqk] dtype; row (token, head) at q_stride_tok/_head
  const void* __restrict__ k_cache;     // page1: [num_slots, Hkv, Dqk]; paged: [num_pages, P, Hkv, Dqk]
  const void* __restrict__ v_cache;     // same leading dims, last dim Dv; MLA: k_cache[..., :Dv] (same pointer)
  // Index arrays are int32, or int64 (the *_i64 flags below) read through their low 32-bit words:
  // every value is below 2^31 (slot / page ids < pool size, indptr entries <= nnz), little-endian.
  const int32_t* __restrict__ qo_indptr;   // [B+1] first q row of each request; T_b = qo[b+1] - qo[b]
  const int32_t* __restrict__ kv_indptr;   // [B+1] first kv_indices entry of each request
  const int32_t* __restrict__ kv_indices;  // [nnz] slot ids (page1) or page ids (paged)
  const int32_t* __restrict__ kv_lens;     // [B] L_b + T_b: KV entries of each request (tree block last)
  // [total_q, mask_words] packed: bit j%32 of word j/32 = node sees tree entry j. nullptr: a prefix-only
  // call, every q row sees all kv_lens[b] entries (kv_lens[b] may be 0: out 0, lse -inf).
  const int32_t* __restrict__ tree_mask;
  // ---- outputs -------------------------------------------------------------
  void* __restrict__ out;               // [total_q, Hq, Dv] dtype
  float* __restrict__ lse;              // [total_q, Hq] float32, natural log; nullptr: not wanted
  void* __restrict__ workspace;         // workspace_bytes(params, cfg) bytes (fp32 split partials); nullptr if 0
  int32_t* __restrict__ errors;         // [1] error bits the kernels set (kErrTreeTooWide); nullptr: not reported
  // ---- strides (elements) -----------------------------------------------------
  int64_t q_stride_tok, q_stride_head;
  int64_t k_stride_block, k_stride_tok, k_stride_head;  // block: slot (page1) or page (paged); tok: row in a page
  int64_t v_stride_block, v_stride_tok, v_stride_head;
  int64_t o_stride_tok, o_stride_head;
  int64_t lse_stride_tok, lse_stride_head;
  // ---- static sizes (from shapes; never read back from the device) ---------
  int32_t batch;           // B
  int32_t total_q;         // sum of T_b
  int32_t num_q_heads;     // Hq
  int32_t num_kv_heads;    // Hkv
  int32_t group;           // Hq / Hkv: query heads folded into the M dimension with the tree rows
  int32_t head_dim_qk;     // Dqk
  int32_t head_dim_v;      // Dv
  int32_t page_size;       // P (1: page1 layout)
  int32_t mask_words;      // W
  int32_t max_tree_nodes;  // static bound on T_b (sets the grid's M tiles): min(32 * W, total_q)
  int32_t mla_shared_kv;   // 1: v_cache is k_cache[..., :Dv] (each KV row is loaded once for both products)
  int32_t qo_indptr_i64;   // 1: qo_indptr is int64 (read by low words)
  int32_t kv_indptr_i64;   // 1: kv_indptr is int64
  int32_t kv_indices_i64;  // 1: kv_indices is int64
  DType dtype;             // element type of q and out (and of the caches unless kv_fp8)
  int32_t kv_fp8;          // 1: the caches hold e4m3 codes (value = code x k_scale / v_scale); 2: FlashMLA's
                           //    656-byte MLA rows (512 codes, 4 fp32 scales, 64 bf16 RoPE; k_cache = v_cache)
  float sm_scale;          // softmax scale (a model parameter)
  // e4m3 caches' dequantization scales: the value, or a device float read by the kernel when the
  // pointer is set (a 0-d tensor: CUDA-graph safe, the caller may change it between replays)
  const float* __restrict__ k_scale_ptr;
  const float* __restrict__ v_scale_ptr;
  float k_scale, v_scale;
};

// Error bits in Params::errors (set on the device, read by the host when it chooses to sync).
inline constexpr int32_t kErrTreeTooWide = 1;  // a request has T_b > 32 * mask_words: its rows are NaN / unwritten

}  // namespace va::tv
