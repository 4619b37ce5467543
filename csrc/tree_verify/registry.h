// Registry of the compiled instantiations.
//
// Each instantiations/*.cu file registers its (dtype, head shape, layout) at
// static-initialisation time, so a build links whichever subset it compiled
// (the JIT build compiles only the shapes asked for) and run() reports a
// missing one by name instead of failing to link.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "api.h"
#include "params.h"

namespace va::tv {

struct KernelKey {
  DType dtype;
  int dqk;
  int dv;
  bool shared_kv;
  bool paged;
  int kv_fp8;  // cache format: 0 q's 16-bit type, 1 e4m3 (per-tensor scales), 2 656-byte MLA rows
};

struct KernelEntry {
  KernelKey key;
  std::string name;                                            // "bf16-576x512-page1"
  std::vector<LaunchConfig> tiles;                             // compiled tile configs (num_splits = 0)
  void (*launch)(const Params&, const LaunchConfig&, cudaStream_t);  // throws for a tile config not in `tiles`
  size_t (*smem)(const LaunchConfig&);                         // dynamic smem of a tile config, 0 if not compiled
};

// Returns true so `static const bool r = register_kernel(...)` runs it at load time.
bool register_kernel(const KernelEntry& e);
const std::vector<KernelEntry>& registered_kernels();

}  // namespace va::tv
