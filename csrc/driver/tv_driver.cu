// tv_driver: launch one tree-verify configuration on synthetic data (no torch),
// for ncu / nsys and quick timing; --check compares with a CPU fp64 reference.
//
//   tv_driver --head mla576|gqa64|gqa128|gqa256 --dtype bf16|fp16 --batch 1 --ctx 185000
//             --tree 16 --hq 8 --hkv 1 --page-size 1 --splits 132 --tile 0 --iters 20 [--check]
//
// Data: random q/KV in [-1, 1), KV rows scattered over a shuffled slot/page pool,
// a binary tree (parent of node i is (i-1)/2) as the tree mask.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "tree_verify/api.h"
#include "tree_verify/registry.h"

namespace {

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) throw std::runtime_error(std::string(#x) + ": " + cudaGetErrorString(e_)); \
  } while (0)

struct Args {
  std::string head = "mla576", dtype = "bf16";
  int batch = 1, ctx = 4096, tree = 16, hq = 8, hkv = 1, page_size = 1, splits = 0, tile = 0, iters = 20;
  bool check = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument("missing value for " + k);
      return argv[++i];
    };
    if (k == "--head") a.head = next();
    else if (k == "--dtype") a.dtype = next();
    else if (k == "--batch") a.batch = std::stoi(next());
    else if (k == "--ctx") a.ctx = std::stoi(next());
    else if (k == "--tree") a.tree = std::stoi(next());
    else if (k == "--hq") a.hq = std::stoi(next());
    else if (k == "--hkv") a.hkv = std::stoi(next());
    else if (k == "--page-size") a.page_size = std::stoi(next());
    else if (k == "--splits") a.splits = std::stoi(next());
    else if (k == "--tile") a.tile = std::stoi(next());
    else if (k == "--iters") a.iters = std::stoi(next());
    else if (k == "--check") a.check = true;
    else throw std::invalid_argument("unknown argument " + k);
  }
  return a;
}

struct Lcg {  // deterministic data without curand
  uint64_t s;
  explicit Lcg(uint64_t seed) : s(seed * 6364136223846793005ull + 1442695040888963407ull) {}
  uint32_t next() { s = s * 6364136223846793005ull + 1442695040888963407ull; return static_cast<uint32_t>(s >> 33); }
  float uniform() { return (next() & 0xFFFFFF) / float(1 << 23) - 1.0f; }
};

uint16_t to_bits(float x, bool bf16) {
  uint16_t r;
  if (bf16) { __nv_bfloat16 h = __float2bfloat16_rn(x); std::memcpy(&r, &h, 2); }
  else { __half h = __float2half_rn(x); std::memcpy(&r, &h, 2); }
  return r;
}
float from_bits(uint16_t r, bool bf16) {
  if (bf16) { __nv_bfloat16 h; std::memcpy(&h, &r, 2); return __bfloat162float(h); }
  __half h; std::memcpy(&h, &r, 2); return __half2float(h);
}

template <class T>
T* to_device(const std::vector<T>& v) {
  T* d = nullptr;
  CK(cudaMalloc(&d, std::max<size_t>(1, v.size()) * sizeof(T)));
  if (!v.empty()) CK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  int dqk, dv;
  bool shared;
  if (a.head == "mla576") { dqk = 576; dv = 512; shared = true; }
  else if (a.head == "gqa64") { dqk = dv = 64; shared = false; }
  else if (a.head == "gqa128") { dqk = dv = 128; shared = false; }
  else if (a.head == "gqa256") { dqk = dv = 256; shared = false; }
  else throw std::invalid_argument("--head must be mla576, gqa64, gqa128 or gqa256");
  const bool bf16 = a.dtype == "bf16";
  if (shared && a.hkv != 1) throw std::invalid_argument("mla576 has one KV head (--hkv 1)");
  if (a.hq % a.hkv) throw std::invalid_argument("--hq must be a multiple of --hkv");

  const int B = a.batch, T = a.tree, P = a.page_size, W = (T + 31) / 32;
  const int kv_len = a.ctx + T, total_q = B * T;
  const int blocks_per_req = (kv_len + P - 1) / P;
  const int num_blocks = B * blocks_per_req + 3;
  const int64_t row = static_cast<int64_t>(a.hkv) * dqk, vrow = static_cast<int64_t>(a.hkv) * dv;
  Lcg rng(1234);

  // pool, shuffled block ids, q, tree mask
  std::vector<uint16_t> k_pool(static_cast<size_t>(num_blocks) * P * row), v_pool;
  for (auto& x : k_pool) x = to_bits(rng.uniform(), bf16);
  if (!shared) { v_pool.resize(static_cast<size_t>(num_blocks) * P * vrow); for (auto& x : v_pool) x = to_bits(rng.uniform(), bf16); }
  std::vector<int32_t> perm(num_blocks);
  for (int i = 0; i < num_blocks; ++i) perm[i] = i;
  for (int i = num_blocks - 1; i > 0; --i) std::swap(perm[i], perm[rng.next() % (i + 1)]);
  std::vector<int32_t> kv_indices(static_cast<size_t>(B) * blocks_per_req), kv_indptr(B + 1), qo_indptr(B + 1), kv_lens(B, kv_len);
  for (int b = 0; b <= B; ++b) { kv_indptr[b] = b * blocks_per_req; qo_indptr[b] = b * T; }
  for (size_t i = 0; i < kv_indices.size(); ++i) kv_indices[i] = perm[i];
  std::vector<uint16_t> q(static_cast<size_t>(total_q) * a.hq * dqk);
  for (auto& x : q) x = to_bits(rng.uniform(), bf16);
  std::vector<int32_t> mask(static_cast<size_t>(total_q) * W, 0);
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < T; ++i)
      for (int j = i;; j = (j - 1) / 2) {  // i and its ancestors
        mask[(b * T + i) * W + j / 32] |= static_cast<int32_t>(1u << (j % 32));
        if (j == 0) break;
      }

  va::tv::Params p{};
  void* dk = to_device(k_pool);
  void* dvp = shared ? dk : to_device(v_pool);
  p.q = to_device(q);
  p.k_cache = dk;
  p.v_cache = dvp;
  p.qo_indptr = to_device(qo_indptr);
  p.kv_indptr = to_device(kv_indptr);
  p.kv_indices = to_device(kv_indices);
  p.kv_lens = to_device(kv_lens);
  p.tree_mask = to_device(mask);
  void* out = nullptr;
  float* lse = nullptr;
  CK(cudaMalloc(&out, static_cast<size_t>(total_q) * a.hq * dv * 2));
  CK(cudaMalloc(&lse, static_cast<size_t>(total_q) * a.hq * 4));
  p.out = out;
  p.lse = lse;
  p.q_stride_tok = static_cast<int64_t>(a.hq) * dqk;
  p.q_stride_head = dqk;
  p.k_stride_block = P * row; p.k_stride_tok = P > 1 ? row : 0; p.k_stride_head = dqk;
  p.v_stride_block = shared ? P * row : P * vrow; p.v_stride_tok = P > 1 ? (shared ? row : vrow) : 0;
  p.v_stride_head = shared ? dqk : dv;
  p.o_stride_tok = static_cast<int64_t>(a.hq) * dv; p.o_stride_head = dv;
  p.lse_stride_tok = a.hq; p.lse_stride_head = 1;
  p.batch = B; p.total_q = total_q; p.num_q_heads = a.hq; p.num_kv_heads = a.hkv; p.group = a.hq / a.hkv;
  p.head_dim_qk = dqk; p.head_dim_v = dv; p.page_size = P; p.mask_words = W; p.max_tree_nodes = T;
  p.mla_shared_kv = shared; p.dtype = bf16 ? va::tv::DType::kBF16 : va::tv::DType::kFP16;
  p.sm_scale = 1.0f / std::sqrt(192.0f);

  // tile config: the a.tile-th compiled one for this key
  const va::tv::KernelEntry* entry = nullptr;
  for (const auto& e : va::tv::registered_kernels())
    if (e.key.dqk == dqk && e.key.dv == dv && e.key.paged == (P > 1) && e.key.dtype == p.dtype) entry = &e;
  if (!entry) throw std::invalid_argument("no compiled kernel for this head/dtype/layout");
  if (a.tile < 0 || a.tile >= static_cast<int>(entry->tiles.size())) throw std::invalid_argument("--tile out of range");
  va::tv::LaunchConfig cfg = entry->tiles[a.tile];
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int m_tiles = (T * p.group + cfg.block_m - 1) / cfg.block_m;
  cfg.num_splits = a.splits > 0 ? a.splits
                                : std::max(1, std::min((sms + B * a.hkv * m_tiles - 1) / (B * a.hkv * m_tiles),
                                                       std::max(1, kv_len / 256)));
  void* ws = nullptr;
  const size_t ws_bytes = va::tv::workspace_bytes(p, cfg);
  if (ws_bytes) CK(cudaMalloc(&ws, ws_bytes));
  p.workspace = ws;

  va::tv::run(p, cfg, nullptr);
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0));
  for (int i = 0; i < a.iters; ++i) va::tv::run(p, cfg, nullptr);
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  ms /= std::max(1, a.iters);
  const double kv_bytes = double(B) * kv_len * (row + (shared ? 0 : vrow)) * 2;
  std::printf("%s %s B=%d ctx=%d T=%d hq=%d hkv=%d P=%d tile=m%d n%d w%d s%d splits=%d: %.4f ms, %.1f GB/s of KV\n",
              a.head.c_str(), a.dtype.c_str(), B, a.ctx, T, a.hq, a.hkv, P, cfg.block_m, cfg.block_n, cfg.num_warps,
              cfg.num_stages, cfg.num_splits, ms, kv_bytes / (ms * 1e6));

  int rc = 0;
  if (a.check) {  // fp64 reference on the host, every (node, head)
    std::vector<uint16_t> ho(static_cast<size_t>(total_q) * a.hq * dv);
    std::vector<float> hl(static_cast<size_t>(total_q) * a.hq);
    CK(cudaMemcpy(ho.data(), out, ho.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hl.data(), lse, hl.size() * 4, cudaMemcpyDeviceToHost));
    double max_err = 0, max_lse_err = 0;
    std::vector<double> s(kv_len), o(dv);
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < T; ++i)
        for (int h = 0; h < a.hq; ++h) {
          const int kh = h / p.group, qr = b * T + i;
          double mx = -INFINITY;
          for (int t = 0; t < kv_len; ++t) {
            const int j = t - a.ctx;
            if (j >= 0 && !((static_cast<uint32_t>(mask[qr * W + j / 32]) >> (j % 32)) & 1u)) { s[t] = -INFINITY; continue; }
            const int64_t base = (static_cast<int64_t>(kv_indices[b * blocks_per_req + t / P]) * P + t % P) * row + kh * dqk;
            double acc = 0;
            for (int d = 0; d < dqk; ++d)
              acc += from_bits(q[(static_cast<size_t>(qr) * a.hq + h) * dqk + d], bf16) * from_bits(k_pool[base + d], bf16);
            s[t] = acc * p.sm_scale;
            mx = std::max(mx, s[t]);
          }
          double sum = 0;
          std::fill(o.begin(), o.end(), 0.0);
          for (int t = 0; t < kv_len; ++t) {
            if (s[t] == -INFINITY) continue;
            const double w = std::exp(s[t] - mx);
            sum += w;
            const int64_t blk = kv_indices[b * blocks_per_req + t / P];
            for (int d = 0; d < dv; ++d) {
              const float vv = shared ? from_bits(k_pool[(blk * P + t % P) * row + kh * dqk + d], bf16)
                                      : from_bits(v_pool[(blk * P + t % P) * vrow + kh * dv + d], bf16);
              o[d] += w * vv;
            }
          }
          for (int d = 0; d < dv; ++d)
            max_err = std::max(max_err, std::fabs(o[d] / sum - from_bits(ho[(static_cast<size_t>(qr) * a.hq + h) * dv + d], bf16)));
          max_lse_err = std::max(max_lse_err, std::fabs(mx + std::log(sum) - hl[static_cast<size_t>(qr) * a.hq + h]));
        }
    const double tol = bf16 ? 2e-2 : 4e-3;
    rc = (max_err <= tol && max_lse_err <= 1e-2) ? 0 : 1;
    std::printf("check: max |out - ref| = %.3g, max |lse - ref| = %.3g: %s\n", max_err, max_lse_err, rc ? "FAIL" : "ok");
  }
  return rc;
} catch (const std::exception& e) {
  std::fprintf(stderr, "tv_driver: %s\n", e.what());
  return 2;
}
