// TORCH_LIBRARY bindings of the CUDA tree-verify kernels: the only file of the
// CUDA extension that sees torch headers (the kernels are in torch-free .cu files).
//
// Ops (namespace VA_OP_NAMESPACE: "verify_attn" for the setup.py build, a
// per-variant name for JIT builds so several can load in one process):
//   tree_verify(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_lens, tree_mask?,
//               Tensor(a!) out, Tensor(b!)? lse, Tensor(c!)? workspace, Tensor(d!)? errors,
//               float sm_scale, int page_size, int max_tree_nodes, int num_splits, int block_n,
//               int block_m, int num_warps, int num_stages) -> ()
//   (index tensors int32 or int64; tree_mask None: a prefix-only call; errors: int32 [1] error bits)
//   workspace_bytes(Tensor q, Tensor v_cache, int num_splits) -> int
//   built_kernels() -> str[]
// Fake (meta) implementations are registered from Python (verify_attn/backends/cuda.py).
#include <Python.h>

// c10/cuda headers only: ATen/cuda/CUDAContext.h pulls in cuSPARSE/cuBLAS headers that a
// minimal toolkit lacks.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <stdexcept>

#include "bindings/params_from_tensors.h"
#include "tree_verify/api.h"

#ifndef VA_OP_NAMESPACE
#define VA_OP_NAMESPACE verify_attn
#endif

namespace {

void tree_verify_cuda(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                      const at::Tensor& qo_indptr, const at::Tensor& kv_indptr, const at::Tensor& kv_indices,
                      const at::Tensor& kv_lens, const std::optional<at::Tensor>& tree_mask, at::Tensor& out,
                      const std::optional<at::Tensor>& lse, const std::optional<at::Tensor>& workspace,
                      const std::optional<at::Tensor>& errors,
                      double sm_scale, int64_t page_size, int64_t max_tree_nodes, int64_t num_splits,
                      int64_t block_n, int64_t block_m, int64_t num_warps, int64_t num_stages, double k_scale,
                      double v_scale, const std::optional<at::Tensor>& k_scale_t,
                      const std::optional<at::Tensor>& v_scale_t) {
  TORCH_CHECK(q.is_cuda(), "tree_verify: tensors must be on a CUDA device, got ", q.device());
  va::tv::Params p = va::tv::params_from_tensors(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_lens,
                                                 tree_mask, out, lse, workspace, sm_scale, page_size,
                                                 max_tree_nodes, errors, k_scale_t, k_scale, v_scale_t, v_scale);
  const va::tv::LaunchConfig cfg{static_cast<int>(num_splits), static_cast<int>(block_n), static_cast<int>(block_m),
                                 static_cast<int>(num_warps), static_cast<int>(num_stages)};
  const size_t need = va::tv::workspace_bytes(p, cfg);
  TORCH_CHECK(need == 0 || (workspace && static_cast<size_t>(workspace->numel() * workspace->element_size()) >= need),
              "tree_verify: workspace must hold ", need, " bytes for num_splits=", num_splits);
  const c10::cuda::CUDAGuard guard(q.device());
  try {
    va::tv::run(p, cfg, c10::cuda::getCurrentCUDAStream().stream());
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const std::runtime_error& e) {
    TORCH_CHECK(false, e.what());
  }
}

int64_t workspace_bytes(const at::Tensor& q, const at::Tensor& v_cache, int64_t num_splits) {
  va::tv::Params p{};
  p.total_q = static_cast<int32_t>(q.size(0));
  p.num_q_heads = static_cast<int32_t>(q.size(1));
  p.head_dim_v = static_cast<int32_t>(v_cache.size(-1));
  return static_cast<int64_t>(va::tv::workspace_bytes(p, va::tv::LaunchConfig{static_cast<int>(num_splits), 0, 0, 0, 0}));
}

std::vector<std::string> built_kernels() { return va::tv::built_kernels(); }

}  // namespace

#define VA_TORCH_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define VA_TORCH_LIBRARY_IMPL(ns, k, m) TORCH_LIBRARY_IMPL(ns, k, m)

VA_TORCH_LIBRARY(VA_OP_NAMESPACE, m) {
  m.def(
      "tree_verify(Tensor q, Tensor k_cache, Tensor v_cache, Tensor qo_indptr, Tensor kv_indptr, "
      "Tensor kv_indices, Tensor kv_lens, Tensor? tree_mask, Tensor(a!) out, Tensor(b!)? lse, "
      "Tensor(c!)? workspace, Tensor(d!)? errors, float sm_scale, int page_size, int max_tree_nodes, int num_splits, "
      "int block_n, int block_m, int num_warps, int num_stages, float k_scale=1.0, float v_scale=1.0, "
      "Tensor? k_scale_t=None, Tensor? v_scale_t=None) -> ()");
  m.def("workspace_bytes(Tensor q, Tensor v_cache, int num_splits) -> int");
  m.def("built_kernels() -> str[]", &built_kernels);
}

VA_TORCH_LIBRARY_IMPL(VA_OP_NAMESPACE, CUDA, m) {
  m.impl("tree_verify", &tree_verify_cuda);
}

VA_TORCH_LIBRARY_IMPL(VA_OP_NAMESPACE, CompositeExplicitAutograd, m) {
  m.impl("workspace_bytes", &workspace_bytes);
}

// A module init so the AOT build imports as `verify_attn._C` (the JIT build loads
// the library with torch.ops.load_library); importing registers the ops above.
#ifdef TORCH_EXTENSION_NAME
#define VA_PYINIT_(name) PyInit_##name
#define VA_PYINIT(name) VA_PYINIT_(name)
extern "C" PyMODINIT_FUNC VA_PYINIT(TORCH_EXTENSION_NAME)(void) {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, "tree_verify_ops", "tree-verify CUDA ops (torch.ops)", -1, nullptr};
  return PyModule_Create(&def);
}
#endif
