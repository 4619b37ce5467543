// va::tv::run: validation and dispatch to the registered instantiations.
// Host code only (no kernels here); no torch headers.
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "api.h"
#include "registry.h"

namespace va::tv {

namespace {
std::vector<KernelEntry>& registry() {
  static std::vector<KernelEntry> r;  // function-local: safe from static-init order
  return r;
}

const char* dtype_str(DType d) { return d == DType::kBF16 ? "bf16" : d == DType::kFP16 ? "fp16" : "?"; }

bool key_matches(const KernelKey& k, const Params& p) {
  return k.dtype == p.dtype && k.dqk == p.head_dim_qk && k.dv == p.head_dim_v &&
         k.shared_kv == (p.mla_shared_kv != 0) && k.paged == (p.page_size > 1) && k.kv_fp8 == p.kv_fp8;
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("tree_verify: " + what);
}

const KernelEntry& find_entry(const Params& p) {
  for (const KernelEntry& e : registry())
    if (key_matches(e.key, p)) return e;
  std::ostringstream os;
  os << "unsupported combination: dtype " << dtype_str(p.dtype)
     << (p.kv_fp8 == 2 ? " (656-byte fp8 MLA rows)" : p.kv_fp8 ? " (e4m3 caches)" : "") << ", Dqk "
     << p.head_dim_qk << ", Dv "
     << p.head_dim_v << (p.mla_shared_kv ? " (V aliases K)" : " (separate V)") << ", "
     << (p.page_size > 1 ? "paged" : "page1") << " layout; compiled here:";
  for (const KernelEntry& e : registry()) os << ' ' << e.name;
  if (registry().empty()) os << " none";
  os << " (supported: bf16/fp16 x {576x512 with V = K[..., :512], 64, 128, 256} x {page1, paged}; fp8 caches: "
        "576x512, and 64, 128, 256 with e4m3 caches)";
  throw std::invalid_argument(os.str());
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }
}  // namespace

bool register_kernel(const KernelEntry& e) {
  registry().push_back(e);
  return true;
}

const std::vector<KernelEntry>& registered_kernels() { return registry(); }

std::vector<std::string> built_kernels() {
  std::vector<std::string> out;
  for (const KernelEntry& e : registry()) {
    std::string s = e.name + " [";
    for (size_t i = 0; i < e.tiles.size(); ++i) {
      const LaunchConfig& t = e.tiles[i];
      s += (i ? ", " : "") + std::to_string(t.block_m) + "x" + std::to_string(t.block_n) + " w" +
           std::to_string(t.num_warps) + " s" + std::to_string(t.num_stages);
    }
    out.push_back(s + "]");
  }
  return out;
}

size_t workspace_bytes(const Params& p, const LaunchConfig& cfg) {
  if (cfg.num_splits <= 1) return 0;
  return static_cast<size_t>(cfg.num_splits) * p.total_q * p.num_q_heads * (p.head_dim_v + 1) * sizeof(float);
}

size_t smem_bytes(const Params& p, const LaunchConfig& cfg) {
  for (const KernelEntry& e : registry()) {
    if (key_matches(e.key, p)) return e.smem(cfg);
  }
  return 0;
}

void run(const Params& p, const LaunchConfig& cfg, cudaStream_t stream) {
  // Order: config, sizes, pointers/alignment, then the kernel lookup.
  check(cfg.num_splits >= 1, "num_splits must be >= 1 (resolve 0 = heuristic before run), got " +
                                 std::to_string(cfg.num_splits));
  check(p.batch >= 1 && p.total_q >= 1, "batch and total_q must be >= 1");
  check(p.num_kv_heads >= 1 && p.num_q_heads == p.group * p.num_kv_heads,
        "num_q_heads must equal group * num_kv_heads");
  check(p.page_size >= 1, "page_size must be >= 1");
  if (p.tree_mask != nullptr)
    check(p.mask_words >= 1 && p.max_tree_nodes >= 1 && p.max_tree_nodes <= 32 * p.mask_words,
          "max_tree_nodes must be in [1, 32 * mask_words]");
  else
    check(p.max_tree_nodes >= 1, "max_tree_nodes must be >= 1 (a prefix-only call: the most q rows of a request)");
  check(p.q && p.k_cache && p.v_cache && p.qo_indptr && p.kv_indptr && p.kv_indices && p.kv_lens && p.out,
        "a required pointer is null");
  check(!p.mla_shared_kv || p.v_cache == p.k_cache, "mla_shared_kv needs v_cache == k_cache");
  // 16-byte cp.async of every row chunk: bases and row strides must keep 16-byte alignment.
  check(aligned16(p.q) && aligned16(p.k_cache) && aligned16(p.v_cache),
        "q, k_cache and v_cache must be 16-byte aligned");
  check(p.q_stride_tok % 8 == 0 && p.q_stride_head % 8 == 0, "q strides must be multiples of 8 elements (16 bytes)");
  const int64_t kv16 = p.kv_fp8 ? 16 : 8;  // cache elements per 16 bytes
  for (int64_t s : {p.k_stride_block, p.k_stride_head, p.v_stride_block, p.v_stride_head})
    check(s % kv16 == 0, "cache strides must be multiples of 16 bytes (" + std::to_string(kv16) + " elements), got " +
                             std::to_string(s));
  if (p.page_size > 1)
    check(p.k_stride_tok % kv16 == 0 && p.v_stride_tok % kv16 == 0,
          "paged cache token strides must be multiples of 16 bytes");
  check(p.o_stride_head % 2 == 0 && p.o_stride_tok % 2 == 0, "out strides must be even (paired stores)");
  check(cfg.num_splits == 1 || p.workspace != nullptr, "num_splits > 1 needs a workspace of workspace_bytes()");
  const KernelEntry& e = find_entry(p);
  e.launch(p, cfg, stream);
}

}  // namespace va::tv
