// Host entry of the tree-verify kernel family (no torch headers).
//
// run() dispatches dtype / head shape / layout / tile config to the compiled
// instantiations and launches the split kernel and, when num_splits > 1, the
// combine, on `stream` through va::arch::launch (the CPU emulator in
// emulation builds). It never synchronises with the device (CUDA-graph safe).
// Unsupported combinations throw std::invalid_argument naming what is unsupported.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "arch/defs.cuh"
#include "params.h"

namespace va::tv {

struct LaunchConfig {
  int num_splits;  // KV splits per request (>= 1; the Python side resolves 0 = heuristic)
  int block_n;     // KV tokens per tile
  int block_m;     // folded rows (tree nodes x group heads) per CTA
  int num_warps;   // warps per CTA
  int num_stages;  // cp.async pipeline depth
};

// Bytes of fp32 workspace the call needs: num_splits x total_q x Hq x (Dv + 1)
// floats when num_splits > 1 (partial O and log2-sum-exp2), else 0. Depends on
// static sizes only, so a graph-captured call can size it for its maximum split count.
size_t workspace_bytes(const Params& p, const LaunchConfig& cfg);

// Launches the kernels. Throws std::invalid_argument for an unsupported
// combination (dtype, head shape, layout, tile config) or a bad parameter.
void run(const Params& p, const LaunchConfig& cfg, cudaStream_t stream);

// Names of the kernel instantiations linked into this build ("bf16-576x512-page1 [32x16 w4 s3, ...]").
std::vector<std::string> built_kernels();

// Dynamic shared memory the split kernel of this config launches with (bytes),
// or 0 if the combination is not built.
size_t smem_bytes(const Params& p, const LaunchConfig& cfg);

}  // namespace va::tv
