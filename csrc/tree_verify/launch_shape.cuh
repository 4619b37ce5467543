// Host side of one (dtype, head shape, layout): pick the tile config, launch the
// split kernel and the combine. Included only by instantiations/*.cu.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "arch/arch.cuh"
#include "../host/host_math.h"
#include "api.h"
#include "config.h"
#include "registry.h"
#include "traits.h"
#include "tree_verify_combine.cuh"
#include "tree_verify_kernel.cuh"
#include "tree_verify_kernel_v1.cuh"
#include "tree_verify_kernel_v2.cuh"
#include "sm90/tree_verify_kernel_v3.cuh"

namespace va::tv {

template <class Tile>
bool tile_matches(const LaunchConfig& c) {
  return c.block_m == Tile::BM && c.block_n == Tile::BN && c.num_warps == Tile::kLaunchWarps &&
         c.num_stages == Tile::STAGES;
}

// The traits and split kernel of a tile config: v0 (TileConfig), v1 (TileConfigV1) or v2 (TileConfigV2). kFmt: the cache
// format, 0 (q's 16-bit type), 1 (e4m3, per-tensor scales), 2 (656-byte MLA rows); fp8 needs v1 or v2 (e4m3).
template <class T, class Head, class Layout, class Tile, int kFmt = 0, int V = Tile::kVersion>
struct KernelOf {
  static_assert(kFmt == 0, "fp8 caches: kernel v1 or v2 tiles only");
  using Tr = KernelTraits<T, Head, Layout, Tile>;
  static constexpr auto kernel = tree_verify_split_kernel<Tr>;
};
template <class T, class Head, class Layout, class Tile, int kFmt>
struct KernelOf<T, Head, Layout, Tile, kFmt, 1> {
  using Tr = KernelTraitsV1<T, Head, Layout, Tile, kFmt != 0, kFmt == 2>;
  static constexpr auto kernel = tree_verify_split_kernel_v1<Tr>;
};
template <class T, class Head, class Layout, class Tile, int kFmt>
struct KernelOf<T, Head, Layout, Tile, kFmt, 2> {
  static_assert(kFmt != 2, "kernel v2: 16-bit or e4m3 caches (the 656-byte rows take v1)");
  using Tr = KernelTraitsV2<T, Head, Layout, Tile, kFmt == 1>;
  static constexpr auto kernel = tree_verify_split_kernel_v2<Tr>;
};

template <class T, class Head, class Layout, class Tile, int kFmt>
struct KernelOf<T, Head, Layout, Tile, kFmt, 3> {  // kernel v3 for Hopper (sm90/): 16-bit or e4m3 caches
  static_assert(kFmt != 2, "kernel v3 (sm90): 16-bit or e4m3 caches (the 656-byte rows take v1)");
  using Tr = KernelTraitsV3<T, Head, Layout, Tile, kFmt == 1>;
  static constexpr auto kernel = tree_verify_split_kernel_v3<Tr>;
};

// CTAs of a thread-block cluster a tile launches in (TileConfigV3's kCluster; 1: no cluster). A cluster tile's BM
// rows are its CTAs' together: grid y counts CTAs (each BM / kCluster rows), the cluster spans them in y.
template <class Tile, class = void>
struct TileCluster {
  static constexpr int value = 1;
};
template <class Tile>
struct TileCluster<Tile, std::void_t<decltype(Tile::kCluster)>> {
  static constexpr int value = Tile::kCluster;
};

template <class T, class Head, class Layout, class Tile, int kFmt>
void launch_one(const Params& p, const LaunchConfig& cfg, cudaStream_t stream) {
  using K = KernelOf<T, Head, Layout, Tile, kFmt>;
  using Tr = typename K::Tr;
  constexpr int kCluster = TileCluster<Tile>::value;
  // static: no qo_indptr read (a cluster tile: its CTAs, kCluster a BM rows)
  const int m_tiles = va::host::ceil_div(p.max_tree_nodes * p.group, Tile::BM) * kCluster;
  if (static_cast<int64_t>(m_tiles) * p.num_kv_heads > 65535 || p.batch > 65535)
    throw std::invalid_argument("tree_verify: grid too large (M tiles x Hkv = " +
                                std::to_string(static_cast<int64_t>(m_tiles) * p.num_kv_heads) +
                                ", batch = " + std::to_string(p.batch) + "; each must be <= 65535)");
  if (kCluster > 1 && p.num_kv_heads != 1)  // (the cluster pairs grid y's neighbours: M tiles of one KV head)
    throw std::invalid_argument("tree_verify: a cluster tile (block_m=" + std::to_string(Tile::BM) +
                                ") needs one KV head (MLA), got num_kv_heads=" + std::to_string(p.num_kv_heads));
  if constexpr (Tile::kVersion >= 1) {
    // v1 and v2 address a row as a 32-bit index times a 32-bit stride (the Python API checks this first)
    for (const int64_t s : {p.k_stride_block, p.k_stride_tok, p.v_stride_block, p.v_stride_tok})
      if (s < 0 || s > INT32_MAX)
        throw std::invalid_argument("tree_verify: cache page / row strides must be in [0, 2**31) elements, got " +
                                    std::to_string(s));
    for (const int64_t s : {p.k_stride_tok, p.v_stride_tok})
      if (static_cast<int64_t>(p.page_size - 1) * s > INT32_MAX)
        throw std::invalid_argument("tree_verify: (page_size - 1) x the cache's row stride must be below 2**31 "
                                    "elements, got " + std::to_string(static_cast<int64_t>(p.page_size - 1) * s));
  }
  const dim3 grid(cfg.num_splits, m_tiles * p.num_kv_heads, p.batch);
  // programmatic dependent launch (the kernel waits for the previous one before touching global memory, so only its
  // launch overlaps that kernel's end); VERIFY_ATTN_NO_PDL=1 in the environment launches it plainly (an A/B)
  static const bool pdl = [] {
    const char* v = std::getenv("VERIFY_ATTN_NO_PDL");
    return v == nullptr || v[0] == '\0' || v[0] == '0';
  }();
  if constexpr (kCluster > 1) {
    if (pdl)
      va::arch::launch_cluster_dependent(K::kernel, grid, dim3(Tr::kBlockThreads), Tr::smem_bytes(), stream,
                                         dim3(1, kCluster, 1), p, cfg.num_splits);
    else
      va::arch::launch_cluster(K::kernel, grid, dim3(Tr::kBlockThreads), Tr::smem_bytes(), stream,
                               dim3(1, kCluster, 1), p, cfg.num_splits);
  } else if (pdl) {
    va::arch::launch_dependent(K::kernel, grid, dim3(Tr::kBlockThreads), Tr::smem_bytes(), stream, p, cfg.num_splits);
  } else {
    va::arch::launch(K::kernel, grid, dim3(Tr::kBlockThreads), Tr::smem_bytes(), stream, p, cfg.num_splits);
  }
  if (cfg.num_splits > 1) {
    const int pairs = p.total_q * p.num_q_heads;
    // v1 / v2 / v3 tiles: the v1 combine (a CTA of 4 warps per 128 columns of a row, programmatic dependent
    // launch); a head narrower than that (GQA 64 with e4m3 caches) takes the v0 combine, which reads the same
    // workspace
    if constexpr (Tile::kVersion >= 1 && Head::DV % kCombineV1Cols == 0) {
      va::arch::launch_dependent(tree_verify_combine_kernel_v1<T, Head::DV>,
                                 dim3(pairs * kCombineV1CtasPerRow<Head::DV>), dim3(32 * kCombineV1Warps),
                                 kCombineV1Smem, stream, p, cfg.num_splits, Tile::BN);
    } else {
      va::arch::launch(tree_verify_combine_kernel<T, Head::DV>, dim3(va::host::ceil_div(pairs, kCombineWarps)),
                       dim3(32 * kCombineWarps), 0, stream, p, cfg.num_splits, Tile::BN);
    }
  }
}

inline std::string tile_str(const LaunchConfig& c) {
  return "block_m=" + std::to_string(c.block_m) + " block_n=" + std::to_string(c.block_n) +
         " num_warps=" + std::to_string(c.num_warps) + " num_stages=" + std::to_string(c.num_stages);
}

template <class T, class Head, class Layout, int kFmt, class... Tiles>
struct ShapeLauncher;

template <class T, class Head, class Layout, int kFmt, class... Tiles>
struct ShapeLauncher<T, Head, Layout, kFmt, TileList<Tiles...>> {
  static void launch(const Params& p, const LaunchConfig& cfg, cudaStream_t stream) {
    bool done = false;
    ((!done && tile_matches<Tiles>(cfg) ? (launch_one<T, Head, Layout, Tiles, kFmt>(p, cfg, stream), done = true)
                                        : false),
     ...);
    if (!done) {
      std::string have;
      ((have += "[" + tile_str(LaunchConfig{0, Tiles::BN, Tiles::BM, Tiles::kLaunchWarps, Tiles::STAGES}) + "] "), ...);
      throw std::invalid_argument("tree_verify: unsupported tile config (" + tile_str(cfg) + ") for Dqk=" +
                                  std::to_string(Head::DQK) + " Dv=" + std::to_string(Head::DV) +
                                  "; compiled: " + have);
    }
  }
  static size_t smem(const LaunchConfig& cfg) {
    size_t bytes = 0;
    ((bytes = (bytes == 0 && tile_matches<Tiles>(cfg)) ? KernelOf<T, Head, Layout, Tiles, kFmt>::Tr::smem_bytes()
                                                       : bytes),
     ...);
    return bytes;
  }
  static std::vector<LaunchConfig> tiles() {
    return {LaunchConfig{0, Tiles::BN, Tiles::BM, Tiles::kLaunchWarps, Tiles::STAGES}...};
  }
};

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<__nv_bfloat16>() { return DType::kBF16; }
template <> constexpr DType dtype_of<__half>() { return DType::kFP16; }
template <class T> const char* dtype_name() { return std::is_same_v<T, __half> ? "fp16" : "bf16"; }

// Registers the (T, Head, Layout, cache format) entry with all its tile configs.
template <class T, class Head, class Layout, int kFmt = 0>
bool register_shape() {
  using Tiles = std::conditional_t<kFmt == 2, typename TilesFor656<Head>::type,
                                   std::conditional_t<kFmt == 1, typename TilesForFp8<Head>::type,
                                                      typename TilesFor<Head>::type>>;
  using SL = ShapeLauncher<T, Head, Layout, kFmt, Tiles>;
  return register_kernel(KernelEntry{
      KernelKey{dtype_of<T>(), Head::DQK, Head::DV, Head::kSharedKV, Layout::kPaged, kFmt},
      std::string(dtype_name<T>()) + (kFmt == 2 ? "q-656kv-" : kFmt == 1 ? "q-e4m3kv-" : "-") +
          std::to_string(Head::DQK) + "x" + std::to_string(Head::DV) + "-" + Layout::kName,
      SL::tiles(), &SL::launch, &SL::smem});
}

}  // namespace va::tv

// One line per instantiation file: VA_TV_INSTANTIATE(__nv_bfloat16, HeadMLA, Page1Layout); the fp8
// caches (q and out of type T): VA_TV_INSTANTIATE_FP8 (e4m3, per-tensor scales), VA_TV_INSTANTIATE_656
// (FlashMLA's 656-byte MLA rows).
#define VA_TV_CONCAT_(a, b) a##b
#define VA_TV_CONCAT(a, b) VA_TV_CONCAT_(a, b)
#define VA_TV_INSTANTIATE_FMT(T, HEAD, LAYOUT, FMT)                                          \
  namespace va::tv {                                                                         \
  static const bool VA_TV_CONCAT(kRegistered_, __LINE__) = register_shape<T, HEAD, va::host::LAYOUT, FMT>(); \
  }
#define VA_TV_INSTANTIATE(T, HEAD, LAYOUT) VA_TV_INSTANTIATE_FMT(T, HEAD, LAYOUT, 0)
#define VA_TV_INSTANTIATE_FP8(T, HEAD, LAYOUT) VA_TV_INSTANTIATE_FMT(T, HEAD, LAYOUT, 1)
#define VA_TV_INSTANTIATE_656(T, HEAD, LAYOUT) VA_TV_INSTANTIATE_FMT(T, HEAD, LAYOUT, 2)
