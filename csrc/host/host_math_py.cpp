// pybind11 module `verify_attn._host_math`: the __host__ __device__ arithmetic of
// csrc/host/ and the kernel family's tile table, callable from host tests.
// Host-only (no CUDA, no torch headers); built by verify_attn.build.load_host_math().
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "host/host_math.h"
#include "tree_verify/config.h"
#include "tree_verify/traits.h"
#include "tree_verify/sm90/traits_v3.h"

namespace py = pybind11;
using namespace va::host;

namespace {

struct HostExp2 {
  float operator()(float x) const { return std::exp2(x); }
};
struct HostLog2 {
  float operator()(float x) const { return std::log2(x); }
};

std::tuple<int, int> rc(RowCol x) { return {x.row, x.col}; }

template <class Head, class Tile, int kFmt = 0>
py::dict tile_dict(const char* head) {
  using Tr = std::conditional_t<
      Tile::kVersion == 3, va::tv::KernelTraitsV3<uint16_t, Head, Page1Layout, Tile, kFmt == 1>,
      std::conditional_t<
      Tile::kVersion == 2, va::tv::KernelTraitsV2<uint16_t, Head, Page1Layout, Tile, kFmt == 1>,
      std::conditional_t<Tile::kVersion == 1,
                         va::tv::KernelTraitsV1<uint16_t, Head, Page1Layout, Tile, kFmt != 0, kFmt == 2>,
                         va::tv::KernelTraits<uint16_t, Head, Page1Layout, Tile>>>>;
  py::dict d;
  d["head"] = head;
  d["dqk"] = Head::DQK;
  d["dv"] = Head::DV;
  d["shared_kv"] = Head::kSharedKV;
  d["block_m"] = Tile::BM;
  d["block_n"] = Tile::BN;
  d["warps_m"] = Tile::WM;
  d["warps_n"] = Tile::WN;
  d["num_warps"] = Tile::kLaunchWarps;
  d["num_stages"] = Tile::STAGES;
  d["version"] = Tile::kVersion;
  if constexpr (Tile::kVersion == 1) d["sn"] = Tile::SN; else d["sn"] = 1;
  if constexpr (Tile::kVersion == 1) d["fp8_mma"] = Tile::FP8_MMA; else d["fp8_mma"] = 1;
  if constexpr (Tile::kVersion == 1) d["bars"] = Tile::BARS; else d["bars"] = 2;
  if constexpr (Tile::kVersion == 1) d["loader"] = Tile::LOADER; else d["loader"] = 0;
  d["smem_bytes"] = Tr::smem_bytes();
  return d;
}

template <class Head, int kFmt = 0, class... Tiles>
void add_tiles(py::list& out, const char* head, va::tv::TileList<Tiles...>) {
  (out.append(tile_dict<Head, Tiles, kFmt>(head)), ...);
}

py::list tile_configs() {
  py::list out;
  add_tiles<va::tv::HeadMLA>(out, "mla576", va::tv::TilesFor<va::tv::HeadMLA>::type{});
  add_tiles<va::tv::HeadG64>(out, "gqa64", va::tv::TilesFor<va::tv::HeadG64>::type{});
  add_tiles<va::tv::HeadG128>(out, "gqa128", va::tv::TilesFor<va::tv::HeadG128>::type{});
  add_tiles<va::tv::HeadG256>(out, "gqa256", va::tv::TilesFor<va::tv::HeadG256>::type{});
  add_tiles<va::tv::HeadMLA, 1>(out, "mla576e4m3", va::tv::TilesForFp8<va::tv::HeadMLA>::type{});
  add_tiles<va::tv::HeadMLA, 2>(out, "mla576x656", va::tv::TilesFor656<va::tv::HeadMLA>::type{});
  add_tiles<va::tv::HeadG128, 1>(out, "gqa128e4m3", va::tv::TilesForFp8<va::tv::HeadG128>::type{});
  add_tiles<va::tv::HeadG64, 1>(out, "gqa64e4m3", va::tv::TilesForFp8<va::tv::HeadG64>::type{});
  add_tiles<va::tv::HeadG256, 1>(out, "gqa256e4m3", va::tv::TilesForFp8<va::tv::HeadG256>::type{});
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "host checks of csrc/host (layout rows, splits, masks, fragments, softmax, LSE merge)";
  // fragments (PTX ISA maps and the kernel's ldmatrix addressing)
  m.def("mma_a_rc", [](int lane, int reg, int half) { return rc(mma_a_rc(lane, reg, half)); });
  m.def("mma_b_rc", [](int lane, int reg, int half) { return rc(mma_b_rc(lane, reg, half)); });
  m.def("mma_c_rc", [](int lane, int idx) { return rc(mma_c_rc(lane, idx)); });
  m.def("ldmatrix_rc", [](int lane, int half, bool trans) { return rc(ldmatrix_rc(lane, half, trans)); });
  m.def("ldsm_a_addr", [](int lane) { return rc(ldsm_a_addr(lane)); });
  m.def("ldsm_b_addr", [](int lane) { return rc(ldsm_b_addr(lane)); });
  m.def("ldsm_bt_addr", [](int lane) { return rc(ldsm_bt_addr(lane)); });
  m.def("ldsm_a_holds", [](int lane, int reg, int half) { return rc(ldsm_a_holds(lane, reg, half)); });
  m.def("ldsm_b_holds", [](int lane, int reg, int half) { return rc(ldsm_b_holds(lane, reg, half)); });
  m.def("ldsm_bt_holds", [](int lane, int reg, int half) { return rc(ldsm_bt_holds(lane, reg, half)); });
  // layouts
  m.def("row_offset", [](bool paged, int32_t id, int t, int page_size, int64_t stride_block, int64_t stride_tok) {
    return paged ? PagedLayout::row_offset(id, t, page_size, stride_block, stride_tok)
                 : Page1Layout::row_offset(id, t, page_size, stride_block, stride_tok);
  });
  m.def("index_pos", [](bool paged, int t, int page_size) {
    return paged ? PagedLayout::index_pos(t, page_size) : Page1Layout::index_pos(t, page_size);
  });
  // splits
  m.def("split_chunk", &split_chunk);
  m.def("split_range", [](int kv_len, int num_splits, int block_n, int split) {
    const SplitRange r = split_range(kv_len, num_splits, block_n, split);
    return std::tuple<int, int>{r.begin, r.end};
  });
  m.def("num_nonempty_splits", &num_nonempty_splits);
  m.def("num_tiles", [](int begin, int end, int block_n) { return num_tiles(SplitRange{begin, end}, block_n); });
  // mask
  m.def("mask_word_index", &mask_word_index);
  m.def("mask_bit", [](int64_t word, int j) { return mask_bit(static_cast<uint32_t>(word), j); });
  m.def("token_visible", [](int t, int prefix_len, int end, int64_t word) {
    return token_visible(t, prefix_len, end, static_cast<uint32_t>(word));
  });
  m.def("needs_mask_word", &needs_mask_word);
  m.def("tile_needs_mask", &tile_needs_mask);
  m.def("mask_window_first_word", &mask_window_first_word);
  m.def("mask_window_word_needed", &mask_window_word_needed);
  m.def("block_visible_bits", [](int tile_begin, int prefix_len, int end, int64_t w0, int64_t w1, int64_t w2) {
    return block_visible_bits(tile_begin, prefix_len, end, static_cast<uint32_t>(w0), static_cast<uint32_t>(w1),
                              static_cast<uint32_t>(w2));
  });
  // softmax (fp32, as in the kernel; exp2/log2 from libm instead of ex2.approx)
  m.def("online_softmax_update", [](float m, float tile_max) {
    const float alpha = online_softmax_update(m, tile_max, HostExp2{});
    return std::tuple<float, float>{m, alpha};
  });
  m.def("softmax_ref_max", &softmax_ref_max);
  m.def("lazy_softmax_update", [](float m, float tile_max, float slack) {
    const float alpha = lazy_softmax_update(m, tile_max, slack, HostExp2{});
    return std::make_tuple(m, alpha);
  });
  m.def("row_lse2", [](float m, float l) { return row_lse2(m, l, HostLog2{}); });
  m.def("row_inv_l", &row_inv_l);
  m.def("lse_merge", [](float m, float l, float lse2_s) {
    MergeState st{m, l};
    float so = 0.f, sn = 0.f;
    lse_merge(st, lse2_s, so, sn, HostExp2{});
    return std::tuple<float, float, float, float>{st.m, st.l, so, sn};
  });
  m.def("tile_configs", &tile_configs);
  m.def("e4m3_to_float", [](int code) { return e4m3_to_float(static_cast<uint8_t>(code)); });
  m.def("float_to_e4m3", [](float f) { return static_cast<int>(float_to_e4m3(f)); });
  m.def("fp8_pv_token_of_k", &fp8_pv_token_of_k);
  m.def("e4m3_to_f16_bits", [](int code) { return static_cast<int>(e4m3_to_f16_bits(static_cast<uint8_t>(code))); });
  m.def("f16_row_scale", &f16_row_scale);
  m.def("fp8_pv_k_of_token", &fp8_pv_k_of_token);
  m.def("prmt_bytes", [](uint32_t a, uint32_t b, uint32_t sel) { return prmt_bytes(a, b, sel); });
  m.attr("PRMT_EVEN_BYTES") = kPrmtEvenBytes;
  m.attr("PRMT_ODD_BYTES") = kPrmtOddBytes;
  m.attr("smem_limit_sm120") = va::tv::kSmemLimitSm120;
}
