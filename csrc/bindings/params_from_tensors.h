// Fill va::tv::Params from torch tensors (torch side; included only by binding
// .cpp files: torch_ops.cpp for CUDA and emu_binding.cpp for the CPU emulator).
//
// Checks in the fixed house order: dtype, device, last-dim contiguity, shapes.
// verify_attn.api has already validated values; these checks guard direct op calls.
#pragma once

#include <torch/types.h>

#include <optional>

#include "tree_verify/params.h"

namespace va::tv {

inline Params params_from_tensors(const at::Tensor& q,            // [total_q, Hq, Dqk]
                                  const at::Tensor& k_cache,      // [slots, Hkv, Dqk] or [pages, P, Hkv, Dqk]
                                  const at::Tensor& v_cache,      // same leading dims, last Dv
                                  const at::Tensor& qo_indptr,    // [B+1] int32 or int64
                                  const at::Tensor& kv_indptr,    // [B+1] int32 or int64
                                  const at::Tensor& kv_indices,   // [nnz] int32 or int64
                                  const at::Tensor& kv_lens,      // [B] int32
                                  const std::optional<at::Tensor>& tree_mask,  // [total_q, W] int32; none: prefix-only
                                  const at::Tensor& out,          // [total_q, Hq, Dv], q's dtype
                                  const std::optional<at::Tensor>& lse,        // [total_q, Hq] float32
                                  const std::optional<at::Tensor>& workspace,  // uint8 bytes >= workspace_bytes
                                  double sm_scale, int64_t page_size, int64_t max_tree_nodes,
                                  const std::optional<at::Tensor>& errors = std::nullopt,  // [1] int32 error bits
                                  // e4m3 caches: dequantization scales, a 1-element float32 tensor on q's
                                  // device (read by the kernel) or the value
                                  const std::optional<at::Tensor>& k_scale_t = std::nullopt, double k_scale = 1.0,
                                  const std::optional<at::Tensor>& v_scale_t = std::nullopt, double v_scale = 1.0) {
  // -- dtype --
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf,
              "tree_verify: q must be bfloat16 or float16, got ", q.scalar_type());
  TORCH_CHECK(out.scalar_type() == q.scalar_type(), "tree_verify: out must have q's dtype ", q.scalar_type(),
              ", got ", out.scalar_type());
  // cache format: q's 16-bit type; float8_e4m3fn (per-tensor scales); uint8 656-byte MLA rows (FlashMLA's)
  const bool mla656 = k_cache.scalar_type() == at::kByte;
  const bool kv_fp8 = mla656 || k_cache.scalar_type() == at::kFloat8_e4m3fn;
  for (const at::Tensor* t : {&k_cache, &v_cache})
    TORCH_CHECK(t->scalar_type() == (kv_fp8 ? k_cache.scalar_type() : q.scalar_type()),
                "tree_verify: k_cache and v_cache must both have q's dtype ", q.scalar_type(),
                ", both be float8_e4m3fn, or both be the same uint8 656-byte rows; got ", k_cache.scalar_type(),
                " and ", v_cache.scalar_type());
  if (mla656)
    TORCH_CHECK(k_cache.size(-1) == 656 && k_cache.size(-2) == 1 && v_cache.data_ptr() == k_cache.data_ptr() &&
                    q.size(-1) == 576 && out.size(-1) == 512,
                "tree_verify: uint8 caches are 656-byte MLA rows [..., 1, 656] (v_cache = k_cache, Dqk 576, Dv 512)");
  for (const std::optional<at::Tensor>* t : {&k_scale_t, &v_scale_t})
    if (*t) TORCH_CHECK((*t)->scalar_type() == at::kFloat && (*t)->numel() == 1 && (*t)->device() == q.device(),
                        "tree_verify: k_scale / v_scale tensors must be float32 with one element on q's device");
  for (const at::Tensor* t : {&qo_indptr, &kv_indptr, &kv_indices})
    TORCH_CHECK(t->scalar_type() == at::kInt || t->scalar_type() == at::kLong,
                "tree_verify: qo_indptr, kv_indptr and kv_indices must be int32 or int64, got ", t->scalar_type());
  TORCH_CHECK(kv_lens.scalar_type() == at::kInt, "tree_verify: kv_lens must be int32, got ", kv_lens.scalar_type());
  if (tree_mask)
    TORCH_CHECK(tree_mask->scalar_type() == at::kInt, "tree_verify: tree_mask must be int32, got ",
                tree_mask->scalar_type());
  if (errors) TORCH_CHECK(errors->scalar_type() == at::kInt && errors->numel() >= 1, "tree_verify: errors must be int32 [1]");
  if (lse) TORCH_CHECK(lse->scalar_type() == at::kFloat, "tree_verify: lse must be float32");
  // -- device --
  for (const at::Tensor* t : {&k_cache, &v_cache, &qo_indptr, &kv_indptr, &kv_indices, &kv_lens, &out})
    TORCH_CHECK(t->device() == q.device(), "tree_verify: every tensor must be on q's device ", q.device(), ", got ",
                t->device());
  if (tree_mask) TORCH_CHECK(tree_mask->device() == q.device(), "tree_verify: tree_mask must be on q's device");
  if (errors) TORCH_CHECK(errors->device() == q.device(), "tree_verify: errors must be on q's device");
  if (lse) TORCH_CHECK(lse->device() == q.device(), "tree_verify: lse must be on q's device");
  if (workspace) TORCH_CHECK(workspace->device() == q.device(), "tree_verify: workspace must be on q's device");
  // -- contiguity of the last dim (and of the index tensors) --
  for (const at::Tensor* t : {&q, &k_cache, &v_cache, &out})
    TORCH_CHECK(t->stride(-1) == 1, "tree_verify: q, caches and out must be contiguous in the last dim");
  for (const at::Tensor* t : {&qo_indptr, &kv_indptr, &kv_indices, &kv_lens})
    TORCH_CHECK(t->is_contiguous(), "tree_verify: index tensors and tree_mask must be contiguous");
  if (tree_mask) TORCH_CHECK(tree_mask->is_contiguous(), "tree_verify: index tensors and tree_mask must be contiguous");
  if (lse) TORCH_CHECK(lse->stride(-1) == 1, "tree_verify: lse must be contiguous in the last dim");
  if (workspace) TORCH_CHECK(workspace->is_contiguous(), "tree_verify: workspace must be contiguous");
  // -- shapes --
  TORCH_CHECK(page_size >= 1, "tree_verify: page_size must be >= 1");
  const int64_t cache_dim = page_size == 1 ? 3 : 4;
  TORCH_CHECK(q.dim() == 3 && out.dim() == 3 && (!tree_mask || tree_mask->dim() == 2),
              "tree_verify: q/out must be 3-D, tree_mask 2-D");
  TORCH_CHECK(k_cache.dim() == cache_dim && v_cache.dim() == cache_dim, "tree_verify: caches must be ", cache_dim,
              "-D for page_size ", page_size);
  if (page_size > 1) TORCH_CHECK(k_cache.size(1) == page_size, "tree_verify: k_cache.size(1) must be page_size");
  const int64_t total_q = q.size(0), hq = q.size(1), dqk = q.size(2);
  const int64_t hkv = k_cache.size(-2), dv = mla656 ? 512 : v_cache.size(-1);
  TORCH_CHECK(mla656 || k_cache.size(-1) == dqk, "tree_verify: k_cache head dim must equal q's");
  TORCH_CHECK(hkv >= 1 && hq % hkv == 0, "tree_verify: Hq must be a multiple of Hkv");
  TORCH_CHECK(out.size(0) == total_q && out.size(1) == hq && out.size(2) == dv, "tree_verify: out must be [total_q, Hq, Dv]");
  const int64_t batch = qo_indptr.numel() - 1;
  TORCH_CHECK(batch >= 1 && kv_indptr.numel() == batch + 1 && kv_lens.numel() == batch,
              "tree_verify: qo_indptr/kv_indptr need B+1 entries and kv_lens B");
  if (tree_mask) TORCH_CHECK(tree_mask->size(0) == total_q, "tree_verify: tree_mask needs total_q rows");
  if (lse) TORCH_CHECK(lse->dim() == 2 && lse->size(0) == total_q && lse->size(1) == hq, "tree_verify: lse must be [total_q, Hq]");

  Params p{};
  p.q = q.data_ptr();
  p.k_cache = k_cache.data_ptr();
  p.v_cache = v_cache.data_ptr();
  // int64 index arrays are read through their low words (values < 2^31; little-endian)
  p.qo_indptr = static_cast<const int32_t*>(qo_indptr.data_ptr());
  p.kv_indptr = static_cast<const int32_t*>(kv_indptr.data_ptr());
  p.kv_indices = static_cast<const int32_t*>(kv_indices.data_ptr());
  p.qo_indptr_i64 = qo_indptr.scalar_type() == at::kLong;
  p.kv_indptr_i64 = kv_indptr.scalar_type() == at::kLong;
  p.kv_indices_i64 = kv_indices.scalar_type() == at::kLong;
  p.kv_lens = kv_lens.data_ptr<int32_t>();
  p.tree_mask = tree_mask ? tree_mask->data_ptr<int32_t>() : nullptr;
  p.errors = errors ? errors->data_ptr<int32_t>() : nullptr;
  p.out = out.data_ptr();
  p.lse = lse ? lse->data_ptr<float>() : nullptr;
  p.workspace = workspace && workspace->numel() > 0 ? workspace->data_ptr() : nullptr;
  p.q_stride_tok = q.stride(0);
  p.q_stride_head = q.stride(1);
  const bool paged = page_size > 1;
  p.k_stride_block = k_cache.stride(0);
  p.k_stride_tok = paged ? k_cache.stride(1) : 0;
  p.k_stride_head = k_cache.stride(-2);
  p.v_stride_block = v_cache.stride(0);
  p.v_stride_tok = paged ? v_cache.stride(1) : 0;
  p.v_stride_head = v_cache.stride(-2);
  p.o_stride_tok = out.stride(0);
  p.o_stride_head = out.stride(1);
  p.lse_stride_tok = lse ? lse->stride(0) : 0;
  p.lse_stride_head = lse ? lse->stride(1) : 0;
  p.batch = static_cast<int32_t>(batch);
  p.total_q = static_cast<int32_t>(total_q);
  p.num_q_heads = static_cast<int32_t>(hq);
  p.num_kv_heads = static_cast<int32_t>(hkv);
  p.group = static_cast<int32_t>(hq / hkv);
  p.head_dim_qk = static_cast<int32_t>(dqk);
  p.head_dim_v = static_cast<int32_t>(dv);
  p.page_size = static_cast<int32_t>(page_size);
  p.mask_words = tree_mask ? static_cast<int32_t>(tree_mask->size(1)) : 0;
  p.max_tree_nodes = static_cast<int32_t>(max_tree_nodes);
  // V aliases K (MLA absorbed): same storage start and strides, so each row is loaded once.
  p.mla_shared_kv = v_cache.data_ptr() == k_cache.data_ptr() && v_cache.strides().slice(0, cache_dim - 1) ==
                                                                    k_cache.strides().slice(0, cache_dim - 1);
  p.dtype = q.scalar_type() == at::kBFloat16 ? DType::kBF16 : DType::kFP16;
  p.kv_fp8 = mla656 ? 2 : kv_fp8 ? 1 : 0;
  p.sm_scale = static_cast<float>(sm_scale);
  p.k_scale_ptr = k_scale_t ? k_scale_t->data_ptr<float>() : nullptr;
  p.v_scale_ptr = v_scale_t ? v_scale_t->data_ptr<float>() : nullptr;
  p.k_scale = static_cast<float>(k_scale);
  p.v_scale = static_cast<float>(v_scale);
  return p;
}

}  // namespace va::tv
