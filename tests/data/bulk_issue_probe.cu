// bench.model probe: what one cp.async.bulk (UBLKCP) costs the SM (devices.bulk_copy_cycles, bulk_issue_cycles).
// One CTA (or one per SM) of W warps; `lanes` lanes of each warp issue `rounds` bulk copies of `size` bytes each,
// global -> shared, each announced with mbarrier.expect_tx on one mbarrier; then every thread arrives and waits.
// Per warp: clock64 cycles to issue its copies (nvcc's per-lane waterfall loop around UBLKCP) and to the
// barrier's completion. Each reading is the difference of two copy counts (the loop's fixed costs cancel).
//   nvcc -arch=sm_90a -O3 -lineinfo -o bulk_issue_probe bulk_issue_probe.cu && ./bulk_issue_probe > out.json
// Results on this project's H200: tests/data/bulk_issue_probe_h200.json.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)
constexpr int kSmem = 64 * 1024;

__global__ void probe(const char* __restrict__ src, uint32_t nrows_mask, int size, int rounds, int lanes, long long* out) {
  extern __shared__ __align__(128) unsigned char sm[];
  __shared__ __align__(8) uint64_t bar;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  const uint32_t b = (uint32_t)__cvta_generic_to_shared(&bar);
  if (tid == 0) asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(b), "r"((int)blockDim.x) : "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  const uint32_t slot_mask = (kSmem / size >= 1024 ? 1024 : kSmem / size) - 1;  // power of two for 16/64/1024...
  const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(sm);
  long long t0 = clock64();
  if (lane < lanes) {
    uint32_t k = tid + 7919u * blockIdx.x;
    for (int r = 0; r < rounds; ++r, k += blockDim.x) {
      const uint32_t dst = sbase + (k & slot_mask) * size;
      const char* s = src + (size_t)((k * 2654435761u) & nrows_mask) * size;
      asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" :: "r"(b), "r"(size) : "memory");
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                   :: "r"(dst), "l"(s), "r"(size), "r"(b) : "memory");
    }
  }
  long long t1 = clock64();
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(b) : "memory");
  asm volatile("{\n.reg .pred P1;\nW:\nmbarrier.try_wait.parity.shared::cta.b64 P1, [%0], 0;\n@P1 bra D;\nbra W;\nD:\n}"
               :: "r"(b) : "memory");
  long long t2 = clock64();
  if (lane == 0) { out[(blockIdx.x * nw + warp) * 2] = t1 - t0; out[(blockIdx.x * nw + warp) * 2 + 1] = t2 - t0; }
}

static double median(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

int main() {
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  char* src; const size_t big = 1ull << 30; CK(cudaMalloc(&src, big)); CK(cudaMemset(src, 1, big));
  long long* out; CK(cudaMalloc(&out, sms * 32 * 2 * sizeof(long long)));
  CK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  struct Cfg { int ctas, warps, lanes, size, rounds; int dram; };
  std::vector<Cfg> cfgs;
  for (int ctas : {1, sms}) {
    for (int warps : {1, 2, 4, 8, 16, 32}) { cfgs.push_back({ctas, warps, 32, 16, 16, 0}); cfgs.push_back({ctas, warps, 32, 16, 32, 0}); }
    for (int warps : {1, 8, 32}) { cfgs.push_back({ctas, warps, 1, 16, 64, 0}); cfgs.push_back({ctas, warps, 1, 16, 128, 0}); }
    cfgs.push_back({ctas, 1, 32, 1152, 8, 0}); cfgs.push_back({ctas, 1, 32, 1152, 16, 0});
    cfgs.push_back({ctas, 8, 32, 1152, 1, 1}); cfgs.push_back({ctas, 8, 32, 1152, 3, 1});
    cfgs.push_back({ctas, 1, 32, 1152, 4, 1}); cfgs.push_back({ctas, 1, 32, 1152, 8, 1});
  }
  printf("{\"sms\": %d, \"rows\": [\n", sms);
  for (size_t i = 0; i < cfgs.size(); ++i) {
    const Cfg& c = cfgs[i];
    uint32_t mask = c.dram ? (uint32_t)(big / c.size / 2) - 1 : (uint32_t)((8u << 20) / c.size) - 1;
    // round masks to powers of two
    uint32_t p = 1; while (p * 2 - 1 <= mask) p *= 2; mask = p - 1;
    std::vector<long long> h(c.ctas * c.warps * 2);
    double bi = 1e30, bd = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      probe<<<c.ctas, 32 * c.warps, kSmem>>>(src, mask, c.size, c.rounds, c.lanes, out);
      CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(h.data(), out, h.size() * sizeof(long long), cudaMemcpyDeviceToHost));
      std::vector<double> a, d;
      for (int j = 0; j < c.ctas * c.warps; ++j) { a.push_back(h[2 * j]); d.push_back(h[2 * j + 1]); }
      if (rep) { bi = std::min(bi, median(a)); bd = std::min(bd, median(d)); }
    }
    printf("{\"ctas\": %d, \"warps\": %d, \"lanes\": %d, \"size\": %d, \"rounds\": %d, \"dram\": %d, \"copies_per_warp\": %d, "
           "\"copies_per_cta\": %d, \"issue_cycles\": %.0f, \"done_cycles\": %.0f}%s\n", c.ctas, c.warps, c.lanes, c.size,
           c.rounds, c.dram, c.lanes * c.rounds, c.warps * c.lanes * c.rounds, bi, bd, i + 1 < cfgs.size() ? "," : "");
  }
  printf("]}\n");
}
