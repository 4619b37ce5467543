// Host-only torch extension of the CPU emulator (backend "cuda-emu").
//
// The kernels themselves are a separate shared library built without torch
// (the kernel translation units compiled as C++ with -DVA_EMULATION=1, the
// emulator runtime, and the C interfaces csrc/emu/tv_c_api.cpp and
// csrc/emu/c_api.cpp; see verify_attn/backends/cuda_emu.py). This binding
// loads it by path, so editing a kernel never recompiles the torch headers.
//
// run() fills Params from CPU tensors exactly like the CUDA binding
// (params_from_tensors.h), registers every tensor's bytes for the emulator's
// bounds checks, NaN-fills the split workspace (a partial the combine reads but
// no split wrote shows up as NaN) and calls va::tv::run through the library.
#include <dlfcn.h>
#include <torch/extension.h>

#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

#include "bindings/params_from_tensors.h"
#include "tree_verify/api.h"

namespace {

struct KernelLib {
  void* handle = nullptr;
  std::string path;
  const char* (*run)(const va::tv::Params*, const va::tv::LaunchConfig*) = nullptr;
  size_t (*workspace_bytes)(const va::tv::Params*, const va::tv::LaunchConfig*) = nullptr;
  const char* (*built_kernels)() = nullptr;
  void (*register_global)(const void*, size_t, const char*) = nullptr;
  void (*clear_globals)() = nullptr;
};

KernelLib g_lib;
std::mutex g_mu;  // the emulator runs one launch at a time; keep registration + run atomic

template <class F>
void resolve(void* h, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(h, name));
  if (fn == nullptr) throw std::runtime_error(std::string("cuda-emu: kernel library lacks ") + name);
}

void load_kernels(const std::string& path) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_lib.handle != nullptr && g_lib.path == path) return;
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) throw std::runtime_error(std::string("cuda-emu: cannot load ") + path + ": " + dlerror());
  KernelLib lib;
  lib.handle = h;
  lib.path = path;
  resolve(h, "va_emu_tv_run", lib.run);
  resolve(h, "va_emu_tv_workspace_bytes", lib.workspace_bytes);
  resolve(h, "va_emu_tv_built_kernels", lib.built_kernels);
  resolve(h, "va_emu_register_global", lib.register_global);
  resolve(h, "va_emu_clear_globals", lib.clear_globals);
  size_t (*params_size)() = nullptr;
  size_t (*config_size)() = nullptr;
  resolve(h, "va_emu_tv_params_size", params_size);
  resolve(h, "va_emu_tv_config_size", config_size);
  if (params_size() != sizeof(va::tv::Params) || config_size() != sizeof(va::tv::LaunchConfig)) {
    throw std::runtime_error("cuda-emu: kernel library " + path +
                             " was built against different Params/LaunchConfig headers; rebuild");
  }
  g_lib = lib;
}

const KernelLib& lib() {
  if (g_lib.handle == nullptr) throw std::runtime_error("cuda-emu: load_kernels(path) was not called");
  return g_lib;
}

// Bytes a strided view spans from its first element (strides are >= 0 here).
size_t span_bytes(const at::Tensor& t) {
  if (t.numel() == 0) return 0;
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return static_cast<size_t>(last + 1) * t.element_size();
}

void run(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& qo_indptr,
         const at::Tensor& kv_indptr, const at::Tensor& kv_indices, const at::Tensor& kv_lens,
         const std::optional<at::Tensor>& tree_mask, const at::Tensor& out, const std::optional<at::Tensor>& lse,
         double sm_scale, int64_t page_size, int64_t max_tree_nodes, int64_t num_splits, int64_t block_n,
         int64_t block_m, int64_t num_warps, int64_t num_stages, const std::optional<at::Tensor>& errors,
         double k_scale, double v_scale, const std::optional<at::Tensor>& k_scale_t,
         const std::optional<at::Tensor>& v_scale_t) {
  const KernelLib& L = lib();
  TORCH_CHECK(q.device().is_cpu(), "cuda-emu: tensors must be on the CPU, got ", q.device());
  TORCH_CHECK(num_splits >= 1, "cuda-emu: num_splits must be >= 1 (0 = heuristic is resolved in Python), got ",
              num_splits);
  const va::tv::LaunchConfig cfg{static_cast<int>(num_splits), static_cast<int>(block_n),
                                 static_cast<int>(block_m), static_cast<int>(num_warps),
                                 static_cast<int>(num_stages)};
  // Sizes first (workspace_bytes reads static sizes only), then the real params.
  const va::tv::Params sizes = va::tv::params_from_tensors(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices,
                                                           kv_lens, tree_mask, out, lse, std::nullopt, sm_scale,
                                                           page_size, max_tree_nodes);
  const size_t ws_bytes = L.workspace_bytes(&sizes, &cfg);
  std::optional<at::Tensor> ws;
  if (ws_bytes > 0) ws = at::full({static_cast<int64_t>(ws_bytes)}, 255, q.options().dtype(at::kByte));
  const va::tv::Params p = va::tv::params_from_tensors(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices,
                                                       kv_lens, tree_mask, out, lse, ws, sm_scale, page_size,
                                                       max_tree_nodes, errors, k_scale_t, k_scale, v_scale_t,
                                                       v_scale);
  const char* err = nullptr;
  {
    pybind11::gil_scoped_release no_gil;
    std::lock_guard<std::mutex> lk(g_mu);
    L.clear_globals();
    const std::pair<const at::Tensor*, const char*> tensors[] = {
        {&q, "q"}, {&k_cache, "k_cache"}, {&v_cache, "v_cache"}, {&qo_indptr, "qo_indptr"},
        {&kv_indptr, "kv_indptr"}, {&kv_indices, "kv_indices"}, {&kv_lens, "kv_lens"}, {&out, "out"}};
    for (const auto& [t, name] : tensors) {
      if (const size_t n = span_bytes(*t)) L.register_global(t->data_ptr(), n, name);
    }
    if (tree_mask && span_bytes(*tree_mask)) L.register_global(tree_mask->data_ptr(), span_bytes(*tree_mask), "tree_mask");
    if (errors && span_bytes(*errors)) L.register_global(errors->data_ptr(), span_bytes(*errors), "errors");
    if (k_scale_t) L.register_global(k_scale_t->data_ptr(), 4, "k_scale");
    if (v_scale_t) L.register_global(v_scale_t->data_ptr(), 4, "v_scale");
    if (lse && span_bytes(*lse)) L.register_global(lse->data_ptr(), span_bytes(*lse), "lse");
    if (ws) L.register_global(ws->data_ptr(), ws_bytes, "workspace");
    err = L.run(&p, &cfg);
    L.clear_globals();
  }
  if (err != nullptr) {
    if (err[0] == 'V') throw std::invalid_argument(err + 1);
    throw std::runtime_error(err + 1);
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "tree-verify kernels run by the CPU SIMT emulator (backend 'cuda-emu')";
  m.def("load_kernels", &load_kernels, "Load the emulation build of the kernels (a shared library path)");
  m.def("run", &run, "Run va::tv::run under the emulator on CPU tensors", pybind11::arg("q"),
        pybind11::arg("k_cache"), pybind11::arg("v_cache"), pybind11::arg("qo_indptr"), pybind11::arg("kv_indptr"),
        pybind11::arg("kv_indices"), pybind11::arg("kv_lens"), pybind11::arg("tree_mask"), pybind11::arg("out"),
        pybind11::arg("lse"), pybind11::arg("sm_scale"), pybind11::arg("page_size"),
        pybind11::arg("max_tree_nodes"), pybind11::arg("num_splits"), pybind11::arg("block_n"),
        pybind11::arg("block_m"), pybind11::arg("num_warps"), pybind11::arg("num_stages"),
        pybind11::arg("errors") = pybind11::none(), pybind11::arg("k_scale") = 1.0, pybind11::arg("v_scale") = 1.0,
        pybind11::arg("k_scale_t") = pybind11::none(), pybind11::arg("v_scale_t") = pybind11::none());
}
