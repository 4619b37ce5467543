// Emulator interface seen by the device API's emulated side (csrc/arch/*.cuh
// with VA_EMULATION=1). Kernel sources never include this directly.
//
// Model: one OS thread runs a block; the block's CUDA threads are fibers that
// run until they reach a sync point (block_sync or a warp collective) and then
// yield. A warp collective completes when every lane of the warp has arrived:
// each lane deposits pointers to its operands and results, and the last lane
// to arrive computes the results of all lanes. The current fiber's identity
// lives in a thread-local pointer that the scheduler sets before each switch,
// which is what threadIdx, blockIdx, blockDim and gridDim read.
#pragma once

#if !VA_EMULATION
#error "csrc/emu/device.h is only for the VA_EMULATION=1 host build"
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <source_location>

#include <vector_types.h>

namespace va::emu {

// What CUDA exposes to a running thread, plus its warp coordinates.
struct ThreadCtx {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
  int linear_tid;  // threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)
  int lane;        // linear_tid % 32
  int warp;        // linear_tid / 32
  unsigned char* smem;  // this block's dynamic shared memory
  void* fiber;          // the emulator's per-thread state
};

// Set by the scheduler for the fiber it is about to run (per OS thread).
extern thread_local ThreadCtx* tls_cur;
inline const ThreadCtx& cur() { return *tls_cur; }

// ---- block-level -------------------------------------------------------------
void block_sync(std::source_location loc);
void threadfence();
int atomic_add(int* p, int v, std::source_location loc);
// griddepcontrol.wait: the calling thread may touch global memory from here on in a grid launched with programmatic
// dependent launch (the emulator runs kernels one after the other; it checks the order, there is nothing to wait for)
void grid_dependency_wait(std::source_location loc);
inline void* smem_base() { return tls_cur->smem; }

// ---- global memory (bounds- and alignment-checked against registered tensors)
void ld_global(void* dst, const void* src, size_t bytes, std::source_location loc);
void st_global(void* dst, const void* src, size_t bytes, std::source_location loc);

// ---- st.shared (4, 8 or 16 bytes, size-aligned): a generic-proxy write, marked per 4-byte word with the thread and
// its fence_proxy_async count; a wgmma reading the bytes before that thread's next fence_proxy_async is an error
void st_shared(void* dst, const void* src, size_t bytes, std::source_location loc);

// ---- cp.async: the source is read at issue, the bytes land in shared memory
// only when a wait_group covering their commit group is executed -------------
void cp_async(void* smem_dst, const void* gmem_src, int bytes, bool valid, std::source_location loc);
void cp_async_16(void* smem_dst, const void* gmem_src, bool valid, std::source_location loc);
// prefetch.global.L2: checked against the registered tensors, counted, its 128-byte line remembered per block
void prefetch_l2(const void* gmem, std::source_location loc);
void cp_async_commit();
void cp_async_wait(int n, std::source_location loc);

// ---- mbarrier and bulk copies (csrc/arch/copy.cuh): a phase completes when its arrivals and its
// transaction bytes are in; a bulk copy reads its source at issue and lands when a thread first waits on
// the completed phase (the latest legal moment), or at issue with set_cp_async_landing("issue") ----------
void mbarrier_init(void* bar, int count, std::source_location loc);
void mbarrier_arrive(void* bar, std::source_location loc);
void mbarrier_arrive_expect_tx(void* bar, uint32_t bytes, std::source_location loc);
void mbarrier_wait(void* bar, unsigned parity, std::source_location loc);
void bulk_copy_g2s(void* smem_dst, const void* gmem_src, uint32_t bytes, void* bar, std::source_location loc);
// cp.async.mbarrier.arrive.noinc: the thread's cp.asyncs so far are tied to the barrier's current phase (they land
// with its bulk copies, when a thread first waits on the completed phase) and the thread counts as one arrival
void cp_async_mbarrier_arrive_noinc(void* bar, std::source_location loc);

// ---- thread-block clusters (csrc/arch/cluster.cuh): a cluster's CTAs run together in one scheduler. A
// shared::cluster address is (1 << 31) | (rank << 24) | offset. Checked: a remote barrier used before a cluster_sync
// followed its init (and the initialising thread's fence_mbarrier_init_cluster), an access to a CTA of the cluster
// that has exited, a cluster_sync some thread never reaches (deadlock), a bulk copy's source written through the
// generic proxy without the writer's fence_proxy_async, addresses out of the target CTA's shared memory ----------
int cluster_ctarank();
void cluster_sync(std::source_location loc);
void fence_mbarrier_init_cluster(std::source_location loc);
uint32_t map_shared_rank(const void* p, int rank, std::source_location loc);
void mbarrier_arrive_cluster(uint32_t bar, std::source_location loc);
void bulk_copy_s2cluster(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar, std::source_location loc);

// ---- named barriers (bar.sync / bar.arrive id, count) and warpgroup register reallocation (setmaxnreg) ----
// A named barrier completes when `count` threads arrived (bar.sync waits for it, bar.arrive does not); every
// arrival of one generation must give the same count; ids 1..15 (0 is block_sync's), counts multiples of 32.
void named_barrier(int id, int count, bool wait, std::source_location loc);
// setmaxnreg: checked only (24..256, a multiple of 8; whole warpgroups, each of whose threads gives the same value)
void setmaxnreg(int regs, bool inc, std::source_location loc);

// ---- warp collectives (full warp) --------------------------------------------
void mma_m16n8k16(bool bf16, float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                  const float (&c)[4], std::source_location loc);
void mma_m16n8k32_e4m3(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4],
                       std::source_location loc);
void ldmatrix(int num_matrices, bool trans, uint32_t* r, const void* smem_row,
              std::source_location loc);
void shfl(bool xor_mode, uint32_t v, int arg, uint32_t* out, std::source_location loc);
enum class VoteKind { kBallot, kAny, kAll };
uint32_t vote(VoteKind kind, bool p, std::source_location loc);
void warp_sync(std::source_location loc);

// ---- wgmma (warpgroup MMA, csrc/arch/wgmma.cuh): each warp's part is a warp collective; the 4 warps
// of a warpgroup must issue the same sequence. Operands are read at issue; D lands at the wgmma_wait
// that retires the op's commit group (NaN until then); smem operands must be unchanged at that wait
// and, where cp.async wrote them, fenced by fence_proxy_async in the copying thread. kind: the operands'
// type, WgmmaKind (k16 for the 16-bit types, k32 for e4m3; e4m3 has no MN-major B).
enum WgmmaKind { kWgmmaF16 = 0, kWgmmaBf16 = 1, kWgmmaE4m3 = 2 };
uint64_t smem_offset(const void* p);
void wgmma(int n, int kind, float* d, const uint32_t* a, uint64_t desc_a, uint64_t desc_b, bool trans_b,
           bool accumulate, std::source_location loc);
void wgmma_fence(std::source_location loc);
void wgmma_commit(std::source_location loc);
void wgmma_wait(int n, std::source_location loc);
void fence_proxy_async();

}  // namespace va::emu

// CUDA's built-in variables, per emulated thread.
#define threadIdx (::va::emu::cur().thread_idx)
#define blockIdx (::va::emu::cur().block_idx)
#define blockDim (::va::emu::cur().block_dim)
#define gridDim (::va::emu::cur().grid_dim)

// Host versions of the CUDA device intrinsics a kernel may use for plain
// arithmetic (bit casts, integer min/max, fast math). Hardware-specific
// operations go through va::arch instead.
inline float __int_as_float(int v) { float f; std::memcpy(&f, &v, 4); return f; }
inline int __float_as_int(float f) { int v; std::memcpy(&v, &f, 4); return v; }
inline float __uint_as_float(unsigned v) { float f; std::memcpy(&f, &v, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned v; std::memcpy(&v, &f, 4); return v; }
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz(static_cast<unsigned>(v)); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
