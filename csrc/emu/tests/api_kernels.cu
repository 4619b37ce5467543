// Small kernels that exercise every device-API operation, written only against
// "arch/arch.cuh" like the real kernels. Built two ways from this one file:
//   host C++ with -DVA_EMULATION=1 into a shared library that
//     tests/test_arch_emu.py drives through ctypes (extern "C" entry points
//     below take host pointers);
//   nvcc for sm_90a/sm_120a to prove the real side of the API compiles (the
//     same entry points then take device pointers).
// Every entry point returns nullptr on success or an error string (owned by a
// static buffer) on failure.
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>

#include "arch/arch.cuh"
#include "tree_verify/sm90/pv_swap.cuh"
#include "emu/c_api.h"

namespace va::emu_tests {

using namespace va::arch;

// ---- mma: one warp; a [32][4], b [32][2], c [32][4] per-lane fragments ------
template <class T>
__global__ void k_mma(const uint32_t* a, const uint32_t* b, const float* c, float* d) {
  const int l = lane_id();
  uint32_t fa[4], fb[2];
  float fc[4], fd[4];
  for (int i = 0; i < 4; ++i) fa[i] = ld_global(a + l * 4 + i);
  for (int i = 0; i < 2; ++i) fb[i] = ld_global(b + l * 2 + i);
  for (int i = 0; i < 4; ++i) fc[i] = ld_global(c + l * 4 + i);
  mma_m16n8k16<T>(fd, fa, fb, fc);
  for (int i = 0; i < 4; ++i) st_global(d + l * 8 + i, fd[i]);
  // d aliasing c must work too: accumulate a second product in place.
  mma_m16n8k16<T>(fd, fa, fb, fd);
  for (int i = 0; i < 4; ++i) st_global(d + l * 8 + 4 + i, fd[i]);
}

// ---- mma m16n8k32 e4m3, fragments per lane as k_mma's: d[l][0..3] the instruction (arch::E4m3OnSm90::kPtxas),
// [4..7] the kF16 form (on sm_90 the f16 MMAs, elsewhere the instruction), [8..11] mma_m16n8k32_e4m3_on_f16 itself
__global__ void k_mma_e4m3(const uint32_t* a, const uint32_t* b, const float* c, float* d) {
  const int l = lane_id();
  uint32_t fa[4], fb[2];
  float fc[4], fd[3][4];
  for (int i = 0; i < 4; ++i) fa[i] = ld_global(a + l * 4 + i);
  for (int i = 0; i < 2; ++i) fb[i] = ld_global(b + l * 2 + i);
  for (int i = 0; i < 4; ++i) fc[i] = ld_global(c + l * 4 + i);
  mma_m16n8k32_e4m3(fd[0], fa, fb, fc);
  mma_m16n8k32_e4m3<E4m3OnSm90::kF16>(fd[1], fa, fb, fc);
  mma_m16n8k32_e4m3_on_f16(fd[2], fa, fb, fc);
  for (int f = 0; f < 3; ++f)
    for (int i = 0; i < 4; ++i) st_global(d + l * 12 + 4 * f + i, fd[f][i]);
}

// ---- ldmatrix: src is an smem image of n16 16-byte chunks; lane l passes
// smem + row_off[l] (bytes); out [32][4] ------------------------------------
__global__ void k_ldmatrix(const uint4* src, int n16, const int* row_off, int variant, int trans,
                           uint32_t* out) {
  uint4* sm = smem_dynamic<uint4>();
  for (int i = threadIdx.x; i < n16; i += blockDim.x) sm[i] = ld_global(src + i);
  block_sync();
  const int l = lane_id();
  const unsigned char* row = smem_dynamic<unsigned char>() + ld_global(row_off + l);
  uint32_t r[4] = {0u, 0u, 0u, 0u};
  if (variant == 1) {
    if (trans) ldmatrix_x1_trans(r[0], row); else ldmatrix_x1(r[0], row);
  } else if (variant == 2) {
    uint32_t r2[2];
    if (trans) ldmatrix_x2_trans(r2, row); else ldmatrix_x2(r2, row);
    r[0] = r2[0];
    r[1] = r2[1];
  } else {
    if (trans) ldmatrix_x4_trans(r, row); else ldmatrix_x4(r, row);
  }
  for (int i = 0; i < 4; ++i) st_global(out + l * 4 + i, r[i]);
}

// ---- warp collectives: mode 0 shfl_xor, 1 shfl, 2 ballot, 3 any, 4 all,
// 5 shfl_xor on floats, 6 lane_id_fresh() x 100 + lane_id(); in/arg/out [blockDim] --
__global__ void k_warp(const int* in, const int* arg, int mode, int* out) {
  const int t = threadIdx.x;
  const int v = ld_global(in + t);
  const int a = ld_global(arg + t);
  int r = 0;
  switch (mode) {
    case 0: r = shfl_xor(v, a); break;
    case 1: r = shfl(v, a); break;
    case 2: r = static_cast<int>(ballot(v != 0)); break;
    case 3: r = any(v != 0) ? 1 : 0; break;
    case 4: r = all(v != 0) ? 1 : 0; break;
    case 5: {
      float f = static_cast<float>(v);
      for (int m = 16; m >= 1; m >>= 1) f += shfl_xor(f, m);
      r = static_cast<int>(f);
      break;
    }
    case 6: r = lane_id_fresh() * 100 + lane_id(); break;
    default: r = -1;
  }
  warp_sync();
  st_global(out + t, r);
}

// ---- cp.async landing: blockDim n; thread t copies src[g*n + t] (g = 0, 1, 2)
// to smem chunk g*n + t; group 1 uses zfill with valid = (t even); group 2 is
// left uncommitted at first. obs [4][3][n] uint4: what thread t sees in its
// three chunks (0) before any wait, (1) after wait_group 1, (2) after
// wait_group 0, (3) after committing group 2 and wait_group 0. -------------
__global__ void k_cp_async(const uint4* src, uint4* obs) {
  const int n = blockDim.x, t = threadIdx.x;
  uint4* sm = smem_dynamic<uint4>();
  cp_async_16(sm + t, src + t);
  cp_async_commit();
  cp_async_16_zfill(sm + n + t, src + n + t, (t % 2) == 0);
  cp_async_commit();
  cp_async_16(sm + 2 * n + t, src + 2 * n + t);
  auto observe = [&](int k) {
    for (int g = 0; g < 3; ++g) st_global(obs + (k * 3 + g) * n + t, sm[g * n + t]);
  };
  observe(0);
  cp_async_wait<1>();
  observe(1);
  cp_async_wait<0>();
  observe(2);
  cp_async_commit();
  cp_async_wait<0>();
  observe(3);
}

// ---- smem at block start: out [blockDim] gets each thread's first word ------
__global__ void k_smem_peek(uint32_t* out) {
  st_global(out + threadIdx.x + blockIdx.x * blockDim.x, smem_dynamic<uint32_t>()[threadIdx.x]);
  // write something so the next block would see it if smem were not refilled
  smem_dynamic<uint32_t>()[threadIdx.x] = 7u;
}

// ---- 16x8x16 GEMM through ldmatrix + mma: A [16][16] row-major; B given as
// bt [8][16] (n-major, trans_b=0) or b [16][8] (k-major, trans_b=1); d [16][8]
template <class T>
__global__ void k_gemm(const uint4* a, const uint4* b, int trans_b, float* d) {
  unsigned char* sm = smem_dynamic<unsigned char>();
  uint4* sa = reinterpret_cast<uint4*>(sm);        // (16, 16) A tile, 512 B
  uint4* sb = reinterpret_cast<uint4*>(sm + 512);  // (8, 16) or (16, 8) B tile, 256 B
  const int l = lane_id();
  for (int i = l; i < 32; i += 32) sa[i] = ld_global(a + i);
  for (int i = l; i < 16; i += 32) sb[i] = ld_global(b + i);
  block_sync();
  uint32_t fa[4], fb[2];
  // A: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
  ldmatrix_x4(fa, sm + (l % 16) * 32 + (l / 16) * 16);
  if (!trans_b) {
    // bt row n, k half (l/8)%2: lanes 0-7 k 0-7, lanes 8-15 k 8-15
    ldmatrix_x2(fb, sm + 512 + (l % 8) * 32 + ((l / 8) % 2) * 16);
  } else {
    // b row k = l%16 (8 values of n)
    ldmatrix_x2_trans(fb, sm + 512 + (l % 16) * 16);
  }
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  mma_m16n8k16<T>(acc, fa, fb, acc);
  const int g = l >> 2, tig = l & 3;
  for (int i = 0; i < 4; ++i) st_global(d + (g + 8 * (i >> 1)) * 8 + 2 * tig + (i & 1), acc[i]);
}

// ---- block reduction (shuffles + smem + barrier): out[blockIdx] = sum(in) --
__global__ void k_block_reduce(const float* in, float* out) {
  float* partial = smem_dynamic<float>();  // (num_warps,) per-warp sums
  float v = ld_global(in + blockIdx.x * blockDim.x + threadIdx.x);
  for (int m = 16; m >= 1; m >>= 1) v += shfl_xor(v, m);
  if (lane_id() == 0) partial[warp_id()] = v;
  block_sync();
  if (warp_id() == 0) {
    const int nw = blockDim.x / 32;
    float s = lane_id() < nw ? partial[lane_id()] : 0.f;
    for (int m = 16; m >= 1; m >>= 1) s += shfl_xor(s, m);
    if (lane_id() == 0) st_global(out + blockIdx.x, s);
  }
}

// ---- two-stage cp.async pipeline: src [ntiles][blockDim] float4; each
// thread adds its right neighbour's chunk of every tile; out [blockDim] float4
__global__ void k_pipeline(const float4* src, int ntiles, float4* out) {
  const int n = blockDim.x, t = threadIdx.x;
  float4* stage = smem_dynamic<float4>();  // (2, n) float4
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  cp_async_16(stage + t, src + t);
  cp_async_commit();
  for (int i = 0; i < ntiles; ++i) {
    if (i + 1 < ntiles) cp_async_16(stage + ((i + 1) % 2) * n + t, src + (i + 1) * n + t);
    cp_async_commit();
    cp_async_wait<1>();
    block_sync();
    const float4 x = stage[(i % 2) * n + (t + 1) % n];
    acc.x += x.x;
    acc.y += x.y;
    acc.z += x.z;
    acc.w += x.w;
    block_sync();
  }
  st_global(out + t, acc);
}

// ---- bulk copies on mbarriers: rows of row_floats floats gathered by idx [ntiles][R] through a ring of
// `stages` stages, one mbarrier per stage counting the R loader threads; every thread waits on the
// stage's phase and sums its right neighbour's row (so the wait must cover every thread's copy):
// out [ntiles][R]. mode 1: expect_tx announces 16 bytes less than the copy delivers; 2: a copy of a size
// that is not a multiple of 16; 3: the barriers are never initialised; 4: no thread waits for the last tile (its
// copies complete their phase, and are still in flight when the block exits) --------------------------------
__global__ void k_bulk_rows(const float* src, const int* idx, int ntiles, int row_floats, int stages, int mode,
                            float* out) {
  const int R = blockDim.x, t = threadIdx.x;
  uint64_t* bars = smem_dynamic<uint64_t>();  // (stages,) in the first 128 bytes
  float* rows = reinterpret_cast<float*>(smem_dynamic<unsigned char>() + 128);  // (stages, R, row_floats)
  const uint32_t bytes = static_cast<uint32_t>(row_floats) * 4;
  if (t == 0 && mode != 3)
    for (int s = 0; s < stages; ++s) mbarrier_init(bars + s, R);
  block_sync();
  auto issue = [&](int tile) {
    uint64_t* bar = bars + tile % stages;
    const float* from = src + static_cast<size_t>(ld_global(idx + tile * R + t)) * row_floats;
    mbarrier_arrive_expect_tx(bar, mode == 1 ? bytes - 16 : bytes);
    bulk_copy_g2s(rows + (static_cast<size_t>(tile % stages) * R + t) * row_floats, from,
                  mode == 2 ? bytes - 8 : bytes, bar);
  };
  for (int i = 0; i < stages - 1 && i < ntiles; ++i) issue(i);
  for (int i = 0; i < ntiles; ++i) {
    if (i + stages - 1 < ntiles) issue(i + stages - 1);  // the stage tile i - 1 used: freed by the last barrier
    if (mode == 4 && i == ntiles - 1) break;
    mbarrier_wait(bars + i % stages, static_cast<uint32_t>(i / stages) & 1u);
    const float* r = rows + (static_cast<size_t>(i % stages) * R + (t + 1) % R) * row_floats;
    float acc = 0.f;
    for (int k = 0; k < row_floats; ++k) acc += r[k];
    st_global(out + i * R + t, acc);
    block_sync();
  }
}

// ---- each thread publishes a value, then reads the next warp's after two warp
// collectives: a missing barrier here is invisible when warps run in lockstep
// (every warp has written before any finishes its second collective) and
// visible when one warp runs ahead. out [blockDim] ---------------------------
// ---- warp roles: warpgroup 2 a producer (setmaxnreg.dec, 16-byte cp.asyncs into a 2-stage ring, each stage's
// "full" barrier signalled by cp.async.mbarrier.arrive.noinc), warpgroups 0 and 1 the math warps (setmaxnreg.inc,
// wait on "full", exchange partial sums through a named barrier of their own 256 threads, free the stage on
// "empty"). A tile is 512 floats of src; out [ntiles][256]: part(t) + part((t + 1) % 256), part(t) the sum of the
// stage's floats 2 ((t + 7) % 256) and the next (so every math thread reads what another producer thread copied).
// mode 1: the math warps skip the "full" wait; 2: the producer skips the "empty" wait; 3: warpgroup 1 gives the
// named barrier 128 threads; 4: named barrier id 0; 5 (emulation): setmaxnreg 250; 6 (emulation): one warp of
// warpgroup 0 asks another register count; 7: the named barrier counts 384 threads, only the 256 math ones come --
constexpr int kRoleTile = 512, kRoleStages = 2;
__global__ void k_roles_ring(const float* src, int ntiles, int mode, float* out) {
  unsigned char* sm = smem_dynamic<unsigned char>();
  uint64_t* full = reinterpret_cast<uint64_t*>(sm);        // [kRoleStages]
  uint64_t* empty = full + kRoleStages;                     // [kRoleStages]
  float* xs = reinterpret_cast<float*>(sm + 64);            // [256] partial sums
  float* stage = reinterpret_cast<float*>(sm + 64 + 1024);  // [kRoleStages][kRoleTile]
  const int t = threadIdx.x, wg = t / 128;
  if (t == 0)
    for (int s = 0; s < kRoleStages; ++s) {
      mbarrier_init(full + s, 128);   // the producer warpgroup's threads, each once its copies landed
      mbarrier_init(empty + s, 256);  // the math threads, each once it read the stage
    }
  block_sync();
  if (wg == 2) {
    setmaxnreg_dec<40>();
    const int p = t - 256;
    for (int i = 0; i < ntiles; ++i) {
      const int s = i % kRoleStages;
      if (mode != 2) mbarrier_wait(empty + s, static_cast<uint32_t>(i / kRoleStages + 1) & 1u);
      cp_async_16(stage + s * kRoleTile + 4 * p, src + static_cast<size_t>(i) * kRoleTile + 4 * p);
      cp_async_mbarrier_arrive_noinc(full + s);
    }
    return;
  }
#if VA_EMULATION
  if (mode == 5) setmaxnreg_inc<250>();
  if (mode == 6 && t / 32 == 1) setmaxnreg_inc<224>();
  else
#endif
  setmaxnreg_inc<232>();
  const int bar_id = mode == 4 ? 0 : 1;
  const int bar_n = mode == 7 ? 384 : (mode == 3 && wg == 1 ? 128 : 256);
  for (int i = 0; i < ntiles; ++i) {
    const int s = i % kRoleStages;
    if (mode != 1) mbarrier_wait(full + s, static_cast<uint32_t>(i / kRoleStages) & 1u);
    const float* r = stage + s * kRoleTile + 2 * ((t + 7) % 256);
    xs[t] = r[0] + r[1];
    mbarrier_arrive(empty + s);
    named_barrier_sync(bar_id, bar_n);   // every partial written
    st_global(out + i * 256 + t, xs[t] + xs[(t + 1) % 256]);
    named_barrier_sync(bar_id, bar_n);   // every partial read before the next tile's
  }
}

__global__ void k_lockstep_race(const float* in, float* out) {
  float* sm = smem_dynamic<float>();  // (blockDim,)
  const int t = threadIdx.x, n = blockDim.x;
  sm[t] = ld_global(in + t);
  block_sync();
  float one = shfl_xor(1.0f, 1);
  one = shfl_xor(one, 2);
  st_global(out + t, sm[(t + 32) % n] * one);
}

// ---- threads >= exit_from return before a barrier the others wait at --------
__global__ void k_early_exit(int exit_from, int* out) {
  if (static_cast<int>(threadIdx.x) >= exit_from) return;
  block_sync();
  st_global(out + threadIdx.x, 1);
}

// ---- out-of-bounds accesses: mode 0 read, 1 write, 2 cp.async source,
// 3 misaligned 16-byte read, 4 ldmatrix row outside smem, 5 L2 prefetch ------
__global__ void k_oob(const int* in, int n, int mode, int* out) {
  if (threadIdx.x != 3) return;
  if (mode == 0) st_global(out, ld_global(in + n));
  if (mode == 1) st_global(out + n, 1);
  if (mode == 2) {
    cp_async_16(smem_dynamic<int>(), in + n);
    cp_async_commit();
    cp_async_wait<0>();
  }
  if (mode == 3) {
    const uint4 v = ld_global(reinterpret_cast<const uint4*>(in + 1));
    st_global(out, static_cast<int>(v.x));
  }
  if (mode == 5) prefetch_l2(in + n);
}
__global__ void k_ldmatrix_oob(int offset_bytes, uint32_t* out) {
  uint32_t r;
  ldmatrix_x1(r, smem_dynamic<unsigned char>() + offset_bytes);
  st_global(out + lane_id(), r);
}

// ---- a raw store through a wild pointer (what st_global exists to prevent) ----
__global__ void k_crash(long long addr) {
  if (threadIdx.x == 5) *reinterpret_cast<volatile int*>(addr) = 1;
}

// ---- smem_base: the dynamic shared memory's shared-window address mod 1024 -------------------------------------
// The 128-byte swizzle XORs address bits 4-6 with bits 7-9, so its pattern repeats every 1024 bytes of the address,
// not of the offset: wgmma's swizzled descriptors (base offset 0) and the copies' sw128 offsets agree only on a
// 1024-aligned base, which smem_dynamic declares. The emulator swizzles offsets, so only a GPU can read this.
__global__ void k_smem_base(int* out) {
#if VA_EMULATION
  if (threadIdx.x == 0) st_global(out, -1);
#else
  if (threadIdx.x == 0) st_global(out, static_cast<int>(__cvta_generic_to_shared(smem_dynamic<unsigned char>()) & 1023u));
#endif
}

// ---- ids: out [grid blocks * block threads][8] ------------------------------
__global__ void k_ids(int* out) {
  const int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int nt = blockDim.x * blockDim.y * blockDim.z;
  const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  int* o = out + (b * nt + t) * 8;
  st_global(o + 0, static_cast<int>(threadIdx.x));
  st_global(o + 1, static_cast<int>(threadIdx.y));
  st_global(o + 2, static_cast<int>(threadIdx.z));
  st_global(o + 3, static_cast<int>(blockIdx.x));
  st_global(o + 4, static_cast<int>(blockIdx.y));
  st_global(o + 5, static_cast<int>(blockIdx.z));
  st_global(o + 6, static_cast<int>(gridDim.x * gridDim.y * gridDim.z));
  st_global(o + 7, nt);
}

// ---- atomics: old values [grid * block]; counter [1] ------------------------
__global__ void k_atomic(int* counter, int* olds) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  st_global(olds + i, atomic_add(counter, 1));
  threadfence();
}

// ---- math: out [n][5] = exp2_approx(x), max_f(x, y), pack2/unpack2 round trip, rcp_approx(x)
__global__ void k_math(const float* x, const float* y, int n, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float a = ld_global(x + i), b = ld_global(y + i);
  float lo, hi;
  unpack2<__nv_bfloat16>(pack2<__nv_bfloat16>(a, b), lo, hi);
  st_global(out + i * 5 + 0, exp2_approx(a));
  st_global(out + i * 5 + 1, max_f(a, b));
  st_global(out + i * 5 + 2, lo);
  st_global(out + i * 5 + 3, hi);
  st_global(out + i * 5 + 4, rcp_approx(a));
}

// ---- wgmma: each warpgroup of the block computes D (64 x N) = A (64 x 32) B (32 x N) [+ 0.5] in two k16
// steps. A is 64 x 32 16-bit, row-major; B is N x 32 (k contiguous; trans_b = 0, K-major) or 32 x N
// (n contiguous; trans_b = 1, MN-major). Both go to shared memory through cp.async in the no-swizzle
// canonical layout, core matrices `pad` bytes apart beyond the packed stride; A is read from there (ss)
// or from global memory into mma.m16n8k16 A fragments (rs). out: [blockDim.x][N / 2] D fragments.
// mode bits (each a planted misuse the emulator must report): 1 no fence_proxy_async, 2 no wgmma_fence,
// 4 store D before the wait, 8 overwrite a B byte before the wait, 16 warp 1 passes another B descriptor,
// 32 no wgmma_wait; 64 accumulate onto D = 0.5 in the first step. Operand writers: 128 the operands go to shared
// memory by ld_global + st_shared (generic-proxy stores: B as uint4, A as two uint2) instead of cp.async; 256 B's
// chunks are written 4 bytes by cp_async_4_zfill and 12 by st_shared<uint32_t>, and the block meets on an mbarrier
// (each thread's cp_async_mbarrier_arrive_noinc, then mbarrier_wait) instead of cp_async_wait: the fence (unless
// mode 1) goes before the arrive, which alone does not publish the st_shared bytes to the wgmma.
constexpr size_t kWgmmaSmem = 40 * 1024;  // the last 8 bytes: mode 256's mbarrier
template <class T, int N>
__global__ void k_wgmma(const uint16_t* a, const uint16_t* b, int trans_b, int ss, int pad, int mode, float* out) {
  constexpr int K = 32;
  unsigned char* sm = smem_dynamic<unsigned char>();
  uint64_t* bar = reinterpret_cast<uint64_t*>(sm + kWgmmaSmem - 8);
  if (mode & 256) {
    if (threadIdx.x == 0) mbarrier_init(bar, blockDim.x);
    block_sync();
  }
  // one 16-byte chunk of 8 elements from global to shared memory, by the writer the mode says
  auto put = [&](unsigned char* dst, const uint16_t* src, bool is_b) {
    if (!(mode & (128 | 256))) {
      cp_async_16(dst, src);
      return;
    }
    const uint4 v = ld_global(reinterpret_cast<const uint4*>(src));
    if ((mode & 256) && is_b) {
      cp_async_4_zfill(dst, src, true);
      st_shared(dst + 4, v.y);
      st_shared(dst + 8, v.z);
      st_shared(dst + 12, v.w);
    } else if (is_b) {
      st_shared(dst, v);
    } else {
      st_shared(dst, uint2{v.x, v.y});
      st_shared(dst + 8, uint2{v.z, v.w});
    }
  };
  // B: K-major, (n, k) at (n % 8) 16 + (n / 8) sbo + (k / 8) lbo; MN-major, (n, k) at (k % 8) 16 + (n / 8) sbo + (k / 8) lbo
  const int b_lbo = trans_b ? (N / 8) * (128 + pad) + pad : 128 + pad;
  const int b_sbo = trans_b ? 128 + pad : (K / 8) * (128 + pad) + pad;
  const int b_bytes = trans_b ? (K / 8) * b_lbo : (N / 8) * b_sbo;
  unsigned char* sa = sm + ((b_bytes + 127) / 128) * 128;
  const int a_lbo = 128 + pad, a_sbo = (K / 8) * (128 + pad) + pad;
  const int nchunk_b = N * K / 8;
  for (int c = threadIdx.x; c < nchunk_b; c += blockDim.x) {
    int off, src;
    if (!trans_b) {  // chunk (n, kc): 8 k values of row n
      const int n = c / (K / 8), kc = c % (K / 8);
      off = (n % 8) * 16 + (n / 8) * b_sbo + kc * b_lbo;
      src = n * K + 8 * kc;
    } else {  // chunk (k, nc): 8 n values of row k
      const int k = c / (N / 8), nc = c % (N / 8);
      off = (k % 8) * 16 + nc * b_sbo + (k / 8) * b_lbo;
      src = k * N + 8 * nc;
    }
    put(sm + off, b + src, true);
  }
  if (ss) {
    for (int c = threadIdx.x; c < 64 * K / 8; c += blockDim.x) {
      const int m = c / (K / 8), kc = c % (K / 8);
      put(sa + (m % 8) * 16 + (m / 8) * a_sbo + kc * a_lbo, a + m * K + 8 * kc, false);
    }
  }
  if (mode & 256) {
    if (!(mode & 1)) fence_proxy_async();
    cp_async_mbarrier_arrive_noinc(bar);
    mbarrier_wait(bar, 0);
  } else {
    cp_async_commit();
    cp_async_wait<0>();
    if (!(mode & 1)) fence_proxy_async();
  }
  block_sync();
  if (mode & 512) fence_proxy_async();  // (a fence after the barrier that published the stores: too late)

  const int q = (threadIdx.x / 32) % 4, l = lane_id(), g = l >> 2, t = l & 3;
  uint32_t fa[2][4];
  if (!ss) {
    for (int s = 0; s < 2; ++s)
      for (int r = 0; r < 4; ++r) {
        const int row = 16 * q + g + 8 * (r & 1), col = 16 * s + 2 * t + 8 * (r >> 1);
        fa[s][r] = ld_global(reinterpret_cast<const uint32_t*>(a + row * K + col));
      }
  }
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0.5f;
  uint64_t db = wgmma_desc(sm, b_lbo, b_sbo);
  if ((mode & 16) && threadIdx.x / 32 == 1) db = wgmma_desc_advance(db, 16);
  const uint64_t da = wgmma_desc(sa, a_lbo, a_sbo);
  if (!(mode & 2)) wgmma_fence();
  for (int s = 0; s < 2; ++s) {
    const bool acc = s > 0 || (mode & 64);
    const uint64_t dbs = wgmma_desc_advance(db, 2 * s * b_lbo);  // two core matrices along k per step
    if (ss) {
      const uint64_t das = wgmma_desc_advance(da, 2 * s * a_lbo);
      if (trans_b) wgmma_ss<T, N, true>(d, das, dbs, acc); else wgmma_ss<T, N, false>(d, das, dbs, acc);
    } else {
      if (trans_b) wgmma_rs<T, N, true>(d, fa[s], dbs, acc); else wgmma_rs<T, N, false>(d, fa[s], dbs, acc);
    }
  }
  wgmma_commit();
  if (mode & 4) {
    for (int i = 0; i < N / 2; ++i) st_global(out + threadIdx.x * (N / 2) + i, d[i]);
    wgmma_wait<0>();
    return;
  }
  if ((mode & 8) && threadIdx.x == 0) sm[16] ^= 1;
  if (!(mode & 32)) wgmma_wait<0>();
  for (int i = 0; i < N / 2; ++i) st_global(out + threadIdx.x * (N / 2) + i, d[i]);
}

// ---- wgmma on 128-byte-swizzled operands: the same product as k_wgmma (A 64 x 32, B 32 x N, two k16 steps), B
// (and A in the SS form) copied by cp.async to their sw128_* offsets and read through wgmma_desc_sw128 descriptors:
// K-major rows use 4 of a 128-byte line's 8 chunks (K = 32), MN-major k rows N / 8 chunks, N / 64 blocks of 4 atoms.
// mode 1: the descriptors say "no swizzle" over the same bytes (a swizzle mismatch: the data is not where they
// read). out: [blockDim.x][N / 2] D fragments.
template <class T, int N>
__global__ void k_wgmma_sw128(const uint16_t* a, const uint16_t* b, int trans_b, int ss, int mode, float* out) {
  constexpr int K = 32;
  constexpr uint32_t kAtom = 1024;  // 8 lines of 128 bytes
  unsigned char* sm = smem_dynamic<unsigned char>();
  const uint32_t b_sbo = kAtom, b_lbo = trans_b ? (K / 8) * kAtom : 16;
  const uint32_t b_bytes = trans_b ? ((N + 63) / 64) * b_lbo : (N / 8) * kAtom;
  unsigned char* sa = sm + b_bytes;  // a multiple of 1024: A's atoms aligned too
  for (int c = threadIdx.x; c < N * K / 8; c += blockDim.x) {
    if (!trans_b) {  // chunk (n, kc): 8 k values of row n
      const int n = c / (K / 8), kc = c % (K / 8);
      cp_async_16(sm + sw128_kmajor_offset(n, kc, b_sbo), b + n * K + 8 * kc);
    } else {  // chunk (k, nc): 8 n values of row k
      const int k = c / (N / 8), nc = c % (N / 8);
      cp_async_16(sm + sw128_mnmajor_offset(k, nc, b_lbo, b_sbo), b + k * N + 8 * nc);
    }
  }
  if (ss) {
    for (int c = threadIdx.x; c < 64 * K / 8; c += blockDim.x) {
      const int m = c / (K / 8), kc = c % (K / 8);
      cp_async_16(sa + sw128_kmajor_offset(m, kc, kAtom), a + m * K + 8 * kc);
    }
  }
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();
  block_sync();
  const int q = (threadIdx.x / 32) % 4, l = lane_id(), g = l >> 2, t = l & 3;
  uint32_t fa[2][4];
  if (!ss) {
    for (int s = 0; s < 2; ++s)
      for (int r = 0; r < 4; ++r)
        fa[s][r] = ld_global(reinterpret_cast<const uint32_t*>(a + (16 * q + g + 8 * (r & 1)) * K + 16 * s + 2 * t +
                                                               8 * (r >> 1)));
  }
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  const uint64_t db = (mode & 1) ? wgmma_desc(sm, b_lbo, b_sbo) : wgmma_desc_sw128(sm, b_lbo, b_sbo);
  const uint64_t da = (mode & 1) ? wgmma_desc(sa, 16, kAtom) : wgmma_desc_sw128(sa, 16, kAtom);
  wgmma_fence();
  for (int s = 0; s < 2; ++s) {
    const uint64_t dbs = wgmma_desc_advance(db, trans_b ? 2 * s * b_sbo : 32 * s);  // k16: 2 atoms / 32 bytes
    if (ss) {
      const uint64_t das = wgmma_desc_advance(da, 32 * s);
      if (trans_b) wgmma_ss<T, N, true>(d, das, dbs, s > 0); else wgmma_ss<T, N, false>(d, das, dbs, s > 0);
    } else {
      if (trans_b) wgmma_rs<T, N, true>(d, fa[s], dbs, s > 0); else wgmma_rs<T, N, false>(d, fa[s], dbs, s > 0);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  for (int i = 0; i < N / 2; ++i) st_global(out + threadIdx.x * (N / 2) + i, d[i]);
}

// ---- wgmma .e4m3: each warpgroup computes D (64 x N) = A (64 x 64) B (64 x N) in two k32 steps. A: 64 x 64 codes,
// row-major; B: N x 64 codes (K-major, k contiguous), in shared memory through cp.async in the no-swizzle layout
// (a core matrix is 8 rows x 16 codes), core matrices `pad` bytes apart beyond the packed stride. A from there
// (ss) or from global memory into mma.m16n8k32 A fragments (rs: byte i of a[r] is row g + 8 (r % 2), k 4t + i
// + 16 (r / 2) of the step). out: [blockDim.x][N / 2] D fragments.
template <int N>
__global__ void k_wgmma_e4m3(const uint8_t* a, const uint8_t* b, int ss, int pad, float* out) {
  constexpr int K = 64;
  unsigned char* sm = smem_dynamic<unsigned char>();
  const int lbo = 128 + pad, sbo = (K / 16) * (128 + pad) + pad;  // the same strides for A and B
  unsigned char* sa = sm + (((N / 8) * sbo + 127) / 128) * 128;
  for (int c = threadIdx.x; c < N * K / 16; c += blockDim.x) {
    const int n = c / (K / 16), kc = c % (K / 16);
    cp_async_16(sm + (n % 8) * 16 + (n / 8) * sbo + kc * lbo, b + n * K + 16 * kc);
  }
  if (ss) {
    for (int c = threadIdx.x; c < 64 * K / 16; c += blockDim.x) {
      const int m = c / (K / 16), kc = c % (K / 16);
      cp_async_16(sa + (m % 8) * 16 + (m / 8) * sbo + kc * lbo, a + m * K + 16 * kc);
    }
  }
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();
  block_sync();
  const int q = (threadIdx.x / 32) % 4, l = lane_id(), g = l >> 2, t = l & 3;
  uint32_t fa[2][4];
  if (!ss) {
    for (int s = 0; s < 2; ++s)
      for (int r = 0; r < 4; ++r)
        fa[s][r] = ld_global(reinterpret_cast<const uint32_t*>(a + (16 * q + g + 8 * (r & 1)) * K + 32 * s + 4 * t +
                                                               16 * (r >> 1)));
  }
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  const uint64_t db = wgmma_desc(sm, lbo, sbo), da = wgmma_desc(sa, lbo, sbo);
  wgmma_fence();
  for (int s = 0; s < 2; ++s) {
    const uint64_t dbs = wgmma_desc_advance(db, 2 * s * lbo);
    if (ss) wgmma_ss<uint8_t, N, false>(d, wgmma_desc_advance(da, 2 * s * lbo), dbs, s > 0);
    else wgmma_rs<uint8_t, N, false>(d, fa[s], dbs, s > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  for (int i = 0; i < N / 2; ++i) st_global(out + threadIdx.x * (N / 2) + i, d[i]);
}


// ---- P V with its operands swapped (csrc/tree_verify/sm90/pv_swap.cuh): one warpgroup computes O^T (64 dims x 64
// rows) = V^T P^T over 64 tokens (two k32 steps) by wgmma .e4m3 m64n64k32, A = V^T from registers by
// vt_a_fragment_e4m3 out of V's token-major rows in the stages' core-matrix layout (token t's 16-byte chunk c at
// (t % 8) 16 + (t / 8) 512 + c 128), B = P^T K-major with each 32-token step's tokens in fp8_pv_token_of_k order.
// v [64 tokens][64 dims], p [64 rows][64 tokens] (e4m3 codes); out [128][32] D fragments (row rho of warp q's 16:
// dim 16 q + vt_dim_of_row(rho)). mode 1: P^T's tokens in their natural order (the mismatch the layout rules out).
__global__ void k_wgmma_vt_swap(const uint8_t* v, const uint8_t* p, int mode, float* out) {
  constexpr int kTok = 64, kDims = 64, kRows = 64, lbo = 128, sbo = (kTok / 16) * 128;
  unsigned char* sm = smem_dynamic<unsigned char>();
  unsigned char* sv = sm;                     // V: 64 tokens x 64 dims, K-major core matrices (k = dims)
  unsigned char* sp = sm + kTok * kDims;      // P^T: n = row, k = kappa
  auto v_chunk = [&](int t, int ch) { return sv + (t % 8) * 16 + (t / 8) * ((kDims / 16) * 128) + ch * lbo; };
  for (int c = threadIdx.x; c < kTok * kDims / 16; c += blockDim.x) {
    const int t = c / (kDims / 16), ch = c % (kDims / 16);
    cp_async_16(v_chunk(t, ch), v + t * kDims + 16 * ch);
  }
  cp_async_commit();
  for (int c = threadIdx.x; c < kRows * kTok / 16; c += blockDim.x) {
    const int n = c / (kTok / 16), kc = c % (kTok / 16);
    uint32_t w[4] = {0u, 0u, 0u, 0u};
    for (int b = 0; b < 16; ++b) {
      const int kappa = 16 * kc + b;
      const int tok = mode & 1 ? kappa : 32 * (kappa / 32) + host::fp8_pv_token_of_k(kappa % 32);
      w[b / 4] |= static_cast<uint32_t>(ld_global(p + n * kTok + tok)) << (8 * (b % 4));
    }
    st_shared(sp + (n % 8) * 16 + (n / 8) * sbo + kc * lbo, uint4{w[0], w[1], w[2], w[3]});
  }
  cp_async_wait<0>();
  fence_proxy_async();
  block_sync();
  const int q = (threadIdx.x / 32) % 4, l = lane_id();
  uint32_t fa[2][4];
  for (int s = 0; s < 2; ++s) {  // lane l: token 32 s + l's chunk of dims 16 q .. 16 q + 15
    va::tv::vt_a_fragment_e4m3(fa[s], v_chunk(32 * s + l, q));
  }
  float d[kRows / 2];
  for (int i = 0; i < kRows / 2; ++i) d[i] = 0.f;
  const uint64_t db = wgmma_desc(sp, lbo, sbo);
  wgmma_fence();
  for (int s = 0; s < 2; ++s) wgmma_rs<uint8_t, kRows, false>(d, fa[s], wgmma_desc_advance(db, 2 * s * lbo), s > 0);
  wgmma_commit();
  wgmma_wait<0>();
  for (int i = 0; i < kRows / 2; ++i) st_global(out + threadIdx.x * (kRows / 2) + i, d[i]);
}

// ---- thread-block clusters: two CTAs (128 threads each) share each tile of `ntiles` (1,024 floats) through a
// 2-stage ring. CTA rank r copies half r of the tile from global memory by cp.async (16 bytes a thread), fences it for
// the async proxy, meets its block at a barrier, and its thread 0 copies the half into the same offset of the peer's
// stage by bulk_copy_s2cluster, completing on the peer's FULL barrier (whose expect_tx the peer's own thread 0 gives).
// Each thread of both CTAs then reads the whole tile after its FULL wait: out [2 clusters][ntiles][128] gets
// sum_k (k + 1) tile[t + 128 k]. Each warp frees the stage on its own and the peer's EMPTY barrier (count: the warps
// of both CTAs) with mbarrier_arrive_cluster; a CTA refills a stage once both CTAs' warps freed it. Thread 0 of each
// CTA initialises the barriers and runs fence_mbarrier_init_cluster; a cluster_sync follows, and another before exit.
// src [clusters][ntiles][1024]. mode (each a misuse the emulator reports): 1 a block_sync instead of the cluster_sync
// after the inits; 2 rank 1 exits after its last tile's reads without the final cluster_sync, while rank 0 comes
// late (4 block_syncs) to its last arrivals on rank 1's EMPTY; 3 no fence_proxy_async after the cp.asyncs; 4 rank 1
// returns (after 4 block_syncs) without the final cluster_sync; 5 no FULL wait; 6 map_shared_rank with rank 2; 7 no
// fence_mbarrier_init_cluster; 8 warp 3 of rank 1 returns before the final cluster_sync ---------------------------
constexpr int kClusterHalf = 512, kClusterTile = 2 * kClusterHalf, kClusterStages = 2, kClusterThreads = 128;
constexpr size_t kClusterSmem = 128 + size_t(kClusterStages) * kClusterTile * 4;
__global__ void k_cluster_swap(const float* src, int ntiles, int mode, float* out) {
  unsigned char* sm = smem_dynamic<unsigned char>();
  uint64_t* full = reinterpret_cast<uint64_t*>(sm);    // [kClusterStages]: this CTA's thread 0 + the peer's bytes
  uint64_t* empty = full + kClusterStages;             // [kClusterStages]: the warps of both CTAs
  float* stage = reinterpret_cast<float*>(sm + 128);   // [kClusterStages][kClusterTile]
  const int t = threadIdx.x, rank = cluster_ctarank(), peer = rank ^ 1;
  const float* tiles = src + static_cast<size_t>(blockIdx.x / 2) * ntiles * kClusterTile;
  constexpr uint32_t kHalfBytes = kClusterHalf * 4;
  if (t == 0) {
    for (int s = 0; s < kClusterStages; ++s) {
      mbarrier_init(full + s, 1);
      mbarrier_init(empty + s, 2 * kClusterThreads / 32);
    }
    if (mode != 7) fence_mbarrier_init_cluster();
  }
  if (mode == 1) block_sync();
  else cluster_sync();
  for (int i = 0; i < ntiles; ++i) {
    const int s = i % kClusterStages;
    float* st = stage + s * kClusterTile;
    float* mine = st + rank * kClusterHalf;
    mbarrier_wait(empty + s, static_cast<uint32_t>(i / kClusterStages + 1) & 1u);  // both CTAs done with tile i - 2
    cp_async_16(mine + 4 * t, tiles + static_cast<size_t>(i) * kClusterTile + rank * kClusterHalf + 4 * t);
    cp_async_commit();
    cp_async_wait<0>();
    if (mode != 3) fence_proxy_async();  // the bulk copy reads these bytes through the async proxy
    block_sync();                        // every thread's part of the half in place
    if (t == 0) {
      mbarrier_arrive_expect_tx(full + s, kHalfBytes);  // the peer's half, into this CTA's stage
      bulk_copy_s2cluster(map_shared_rank(mine, mode == 6 ? 2 : peer), mine, kHalfBytes,
                          map_shared_rank(full + s, peer));
    }
    if (mode != 5) mbarrier_wait(full + s, static_cast<uint32_t>(i / kClusterStages) & 1u);
    float acc = 0.f;
    for (int k = 0; k < 8; ++k) acc += static_cast<float>(k + 1) * st[t + kClusterThreads * k];
    st_global(out + (static_cast<size_t>(blockIdx.x) * ntiles + i) * kClusterThreads + t, acc);
    if (mode == 2 && i == ntiles - 1) {
      if (rank == 1) return;
      for (int k = 0; k < 4; ++k) block_sync();
    }
    mbarrier_arrive_cluster_warp(map_shared_rank(empty + s, peer));
    mbarrier_arrive_cluster_warp(map_shared_rank(empty + s, rank));
  }
  if (mode == 4 && rank == 1) {
    for (int k = 0; k < 4; ++k) block_sync();
    return;
  }
  if (mode == 8 && rank == 1 && t >= 96) return;
  cluster_sync();  // no CTA exits while the other may still arrive on its barriers
}

// ---- one bulk copy between the two CTAs of a cluster (32 threads each): every thread of CTA rank 0 stores a float4
// (t, rank, 1, 2) by st_shared and fences it; rank 0's thread 0 copies the 512 bytes into rank 1's buffer on rank 1's
// barrier, whose expect_tx rank 1's thread 0 gives; rank 1's threads wait and write what landed: out [32][4]. mode
// (misuses): 1 the mbarrier in another CTA than the destination; 2 a size off the 16-byte grain; 3 an address
// without the shared::cluster bit; 4 a destination past the end of the target's shared memory; 5 the target's
// barrier never initialised; 6 the stores not fenced; 7 rank 1 neither expects nor waits for the bytes (the copy is
// still in flight when it exits) --------------------------------------------------------------------------------
constexpr size_t kClusterMisuseSmem = 128 + 32 * 16;
__global__ void k_cluster_misuse(int mode, float* out) {
  unsigned char* sm = smem_dynamic<unsigned char>();
  uint64_t* bar = reinterpret_cast<uint64_t*>(sm);
  float4* buf = reinterpret_cast<float4*>(sm + 128);  // [32]
  const int t = threadIdx.x, rank = cluster_ctarank(), peer = rank ^ 1;
  if (t == 0) {
    if (mode != 5) mbarrier_init(bar, 1);
    fence_mbarrier_init_cluster();
  }
  if (rank == 0) {
    st_shared(buf + t, make_float4(static_cast<float>(t), static_cast<float>(rank), 1.f, 2.f));
    if (mode != 6) fence_proxy_async();
  }
  cluster_sync();
  if (rank == 0 && t == 0) {
    const uint32_t dst = map_shared_rank(buf, peer), pbar = map_shared_rank(bar, peer);
    switch (mode) {
      case 1: bulk_copy_s2cluster(dst, buf, 512, map_shared_rank(bar, rank)); break;
      case 2: bulk_copy_s2cluster(dst, buf, 504, pbar); break;
      case 3: mbarrier_arrive_cluster(pbar & 0x7FFFFFFFu); break;
      case 4: bulk_copy_s2cluster(map_shared_rank(buf + 16, peer), buf, 512, pbar); break;
      case 5: mbarrier_arrive_cluster(pbar); break;
      default: bulk_copy_s2cluster(dst, buf, 512, pbar);
    }
  }
  if (rank == 1 && mode != 7) {
    if (t == 0) mbarrier_arrive_expect_tx(bar, 512);
    mbarrier_wait(bar, 0);
    st_global(reinterpret_cast<float4*>(out) + t, buf[t]);
  }
  cluster_sync();
}

// ---- %cluster_ctarank: out [grid blocks] = the rank of each block (thread 0 writes) ------------------------------
__global__ void k_cluster_ids(int* out) {
  if (threadIdx.x == 0)
    st_global(out + blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), cluster_ctarank());
  cluster_sync();
}

// ---- programmatic dependent launch: a grid launched with launch_dependent may not write global memory, nor read what
// the grid before it wrote, before its threads' grid_dependency_wait (the emulator reports both). k_pdl_writer writes
// a; k_pdl_reader, mode 0: waits, then reads a; 1: reads a before the wait; 2: writes out before the wait; 3: reads b
// (the writer left it alone) before the wait. Each thread then stores what it read.
__global__ void k_pdl_writer(float* a, int n) {
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) st_global(a + i, 1.0f + i);
}
__global__ void k_pdl_reader(const float* a, const float* b, int mode, float* out) {
  const int t = static_cast<int>(threadIdx.x);
  float v = -1.f;
  if (mode == 1) v = ld_global(a + t);
  if (mode == 2) st_global(out + t, 0.f);
  if (mode == 3) v = ld_global(b + t);
  grid_dependency_wait();
  if (mode == 0) v = ld_global(a + t);
  st_global(out + t, v);
}

}  // namespace va::emu_tests

// ---- extern "C" entry points ---------------------------------------------------
using va::emu::guarded;
namespace {
using namespace va::emu_tests;
using va::arch::launch;
using va::arch::launch_cluster;
}  // namespace

// The emulation library is built with -fvisibility=hidden; these are its API.
#define VA_TEST_API __attribute__((visibility("default")))

extern "C" {
VA_TEST_API const char* va_test_mma(int bf16, const uint32_t* a, const uint32_t* b, const float* c, float* d) {
  return guarded([&] {
    if (bf16) launch(k_mma<__nv_bfloat16>, dim3(1), dim3(32), 0, nullptr, a, b, c, d);
    else launch(k_mma<__half>, dim3(1), dim3(32), 0, nullptr, a, b, c, d);
  });
}
VA_TEST_API const char* va_test_mma_e4m3(const uint32_t* a, const uint32_t* b, const float* c, float* d) {
  return guarded([&] { launch(k_mma_e4m3, dim3(1), dim3(32), 0, nullptr, a, b, c, d); });
}
VA_TEST_API const char* va_test_ldmatrix(const uint4* src, int n16, const int* row_off, int variant, int trans,
                             uint32_t* out) {
  return guarded([&] {
    launch(k_ldmatrix, dim3(1), dim3(32), size_t(n16) * 16, nullptr, src, n16, row_off, variant,
           trans, out);
  });
}
VA_TEST_API const char* va_test_warp(const int* in, const int* arg, int mode, int n, int* out) {
  return guarded([&] { launch(k_warp, dim3(1), dim3(n), 0, nullptr, in, arg, mode, out); });
}
VA_TEST_API const char* va_test_cp_async(const uint4* src, int n, uint4* obs) {
  return guarded([&] { launch(k_cp_async, dim3(1), dim3(n), size_t(3) * n * 16, nullptr, src, obs); });
}
VA_TEST_API const char* va_test_smem_peek(int blocks, int n, uint32_t* out) {
  return guarded([&] { launch(k_smem_peek, dim3(blocks), dim3(n), size_t(n) * 4, nullptr, out); });
}
VA_TEST_API const char* va_test_gemm(int bf16, const uint4* a, const uint4* b, int trans_b, float* d) {
  return guarded([&] {
    if (bf16) launch(k_gemm<__nv_bfloat16>, dim3(1), dim3(32), 768, nullptr, a, b, trans_b, d);
    else launch(k_gemm<__half>, dim3(1), dim3(32), 768, nullptr, a, b, trans_b, d);
  });
}
VA_TEST_API const char* va_test_block_reduce(const float* in, int blocks, int n, float* out) {
  return guarded([&] {
    launch(k_block_reduce, dim3(blocks), dim3(n), size_t(n / 32) * 4, nullptr, in, out);
  });
}
VA_TEST_API const char* va_test_pipeline(const float4* src, int ntiles, int n, float4* out) {
  return guarded([&] {
    launch(k_pipeline, dim3(1), dim3(n), size_t(2) * n * 16, nullptr, src, ntiles, out);
  });
}
VA_TEST_API const char* va_test_bulk_rows(const float* src, const int* idx, int ntiles, int row_floats, int stages,
                                          int mode, int n, float* out) {
  return guarded([&] {
    launch(k_bulk_rows, dim3(1), dim3(n), 128 + size_t(stages) * n * row_floats * 4, nullptr, src, idx, ntiles,
           row_floats, stages, mode, out);
  });
}
VA_TEST_API const char* va_test_roles_ring(const float* src, int ntiles, int mode, float* out) {
  return guarded([&] {
    launch(k_roles_ring, dim3(1), dim3(384), 64 + 1024 + size_t(kRoleStages) * kRoleTile * 4, nullptr, src, ntiles,
           mode, out);
  });
}
VA_TEST_API const char* va_test_lockstep_race(const float* in, int n, float* out) {
  return guarded([&] { launch(k_lockstep_race, dim3(1), dim3(n), size_t(n) * 4, nullptr, in, out); });
}
VA_TEST_API const char* va_test_early_exit(int n, int exit_from, int* out) {
  return guarded([&] { launch(k_early_exit, dim3(1), dim3(n), 0, nullptr, exit_from, out); });
}
VA_TEST_API const char* va_test_oob(const int* in, int n, int mode, int* out) {
  return guarded([&] { launch(k_oob, dim3(1), dim3(32), 64, nullptr, in, n, mode, out); });
}
VA_TEST_API const char* va_test_ldmatrix_oob(int smem_bytes, int offset_bytes, uint32_t* out) {
  return guarded([&] {
    launch(k_ldmatrix_oob, dim3(1), dim3(32), size_t(smem_bytes), nullptr, offset_bytes, out);
  });
}
VA_TEST_API const char* va_test_crash(int addr) {
  return guarded([&] { launch(k_crash, dim3(1), dim3(32), 0, nullptr, static_cast<long long>(addr)); });

}
VA_TEST_API const char* va_test_smem_base(int smem_bytes, int* out) {
  return guarded([&] { launch(k_smem_base, dim3(1), dim3(32), size_t(smem_bytes), nullptr, out); });
}
VA_TEST_API const char* va_test_ids(int gx, int gy, int gz, int bx, int by, int bz, int* out) {
  return guarded([&] { launch(k_ids, dim3(gx, gy, gz), dim3(bx, by, bz), 0, nullptr, out); });
}
VA_TEST_API const char* va_test_atomic(int blocks, int n, int* counter, int* olds) {
  return guarded([&] { launch(k_atomic, dim3(blocks), dim3(n), 0, nullptr, counter, olds); });
}
VA_TEST_API const char* va_test_wgmma(int bf16, int n, const uint16_t* a, const uint16_t* b, int trans_b, int ss,
                                      int pad, int mode, int threads, float* out) {
  return guarded([&] {
    const size_t smem = kWgmmaSmem;
    if (n == 32 && bf16) launch(k_wgmma<__nv_bfloat16, 32>, dim3(1), dim3(threads), smem, nullptr, a, b, trans_b, ss, pad, mode, out);
    else if (n == 32) launch(k_wgmma<__half, 32>, dim3(1), dim3(threads), smem, nullptr, a, b, trans_b, ss, pad, mode, out);
    else if (n == 256 && bf16) launch(k_wgmma<__nv_bfloat16, 256>, dim3(1), dim3(threads), smem, nullptr, a, b, trans_b, ss, pad, mode, out);
    else throw std::invalid_argument("va_test_wgmma: n = 32 (bf16, f16) or 256 (bf16)");
  });
}
VA_TEST_API const char* va_test_wgmma_sw128(int n, const uint16_t* a, const uint16_t* b, int trans_b, int ss, int mode,
                                            int threads, float* out) {
  return guarded([&] {
    const size_t smem = 48 * 1024;
    if (n == 32) launch(k_wgmma_sw128<__nv_bfloat16, 32>, dim3(1), dim3(threads), smem, nullptr, a, b, trans_b, ss, mode, out);
    else if (n == 256) launch(k_wgmma_sw128<__nv_bfloat16, 256>, dim3(1), dim3(threads), smem, nullptr, a, b, trans_b, ss, mode, out);
    else throw std::invalid_argument("va_test_wgmma_sw128: n = 32 or 256");
  });
}
VA_TEST_API const char* va_test_wgmma_e4m3(int n, const uint8_t* a, const uint8_t* b, int ss, int pad, int threads,
                                           float* out) {
  return guarded([&] {
    const size_t smem = 48 * 1024;
    if (n == 32) launch(k_wgmma_e4m3<32>, dim3(1), dim3(threads), smem, nullptr, a, b, ss, pad, out);
    else if (n == 256) launch(k_wgmma_e4m3<256>, dim3(1), dim3(threads), smem, nullptr, a, b, ss, pad, out);
    else throw std::invalid_argument("va_test_wgmma_e4m3: n = 32 or 256");
  });
}
VA_TEST_API const char* va_test_wgmma_vt_swap(const uint8_t* v, const uint8_t* p, int mode, float* out) {
  return guarded([&] { launch(k_wgmma_vt_swap, dim3(1), dim3(128), 16 * 1024, nullptr, v, p, mode, out); });
}
VA_TEST_API const char* va_test_cluster_swap(const float* src, int clusters, int ntiles, int mode, float* out) {
  return guarded([&] {
    launch_cluster(k_cluster_swap, dim3(2 * clusters), dim3(kClusterThreads), kClusterSmem, nullptr, dim3(2, 1, 1),
                   src, ntiles, mode, out);
  });
}
VA_TEST_API const char* va_test_cluster_misuse(int mode, float* out) {
  return guarded([&] {
    launch_cluster(k_cluster_misuse, dim3(2), dim3(32), kClusterMisuseSmem, nullptr, dim3(2, 1, 1), mode, out);
  });
}
VA_TEST_API const char* va_test_cluster_ids(int gx, int gy, int gz, int cx, int cy, int cz, int* out) {
  return guarded([&] {
    launch_cluster(k_cluster_ids, dim3(gx, gy, gz), dim3(32), 0, nullptr, dim3(cx, cy, cz), out);
  });
}
VA_TEST_API const char* va_test_pdl(float* a, const float* b, int n, int mode, int dependent, float* out) {
  return guarded([&] {
    launch(k_pdl_writer, dim3(1), dim3(32), 0, nullptr, a, n);
    if (dependent) launch_dependent(k_pdl_reader, dim3(1), dim3(n), 0, nullptr, a, b, mode, out);
    else launch(k_pdl_reader, dim3(1), dim3(n), 0, nullptr, a, b, mode, out);
  });
}
VA_TEST_API const char* va_test_math(const float* x, const float* y, int n, float* out) {
  return guarded([&] { launch(k_math, dim3((n + 63) / 64), dim3(64), 0, nullptr, x, y, n, out); });
}
}  // extern "C"
