// Shared-memory fragment loads, asynchronous global->shared copies, global
// loads/stores, shared-memory stores and the block's dynamic shared memory.
// st_shared(p, v): a plain (generic-proxy) store of 4/8/16 bytes to shared memory;
// a wgmma reading it needs fence_proxy_async in the writer first (emulator-checked).
#pragma once

#include "defs.cuh"
#include "warp.cuh"
#if VA_EMULATION
#include <cstring>
#include <source_location>

#include "../emu/device.h"
#else
#include <cuda_runtime.h>
#endif

namespace va::arch {

#if !VA_EMULATION
namespace detail {
VA_DEVICE uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
}  // namespace detail
#endif

// ldmatrix: https://docs.nvidia.com/cuda/parallel-thread-execution/#warp-level-matrix-instructions-ldmatrix
// .m8n8 .b16: matrix j (0..3) is 8 rows of 8 16-bit values, row i at the
// 16-byte aligned shared address given by lane 8*j + i. Lane l receives in
// r[j] the elements (row l/4, cols 2*(l%4), 2*(l%4)+1) of matrix j (low half
// first); with .trans it receives (rows 2*(l%4), 2*(l%4)+1, col l/4), i.e. the
// same fragment of the transposed matrix. Every lane passes its own row
// pointer; lanes past the ones a variant uses (8 for x1, 16 for x2) are ignored.
#if VA_EMULATION
VA_DEVICE void ldmatrix_x1(uint32_t& r, const void* smem_row,
                           std::source_location loc = std::source_location::current()) {
  ::va::emu::ldmatrix(1, false, &r, smem_row, loc);
}
VA_DEVICE void ldmatrix_x2(uint32_t (&r)[2], const void* smem_row,
                           std::source_location loc = std::source_location::current()) {
  ::va::emu::ldmatrix(2, false, r, smem_row, loc);
}
VA_DEVICE void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row,
                           std::source_location loc = std::source_location::current()) {
  ::va::emu::ldmatrix(4, false, r, smem_row, loc);
}
VA_DEVICE void ldmatrix_x1_trans(uint32_t& r, const void* smem_row,
                                 std::source_location loc = std::source_location::current()) {
  ::va::emu::ldmatrix(1, true, &r, smem_row, loc);
}
VA_DEVICE void ldmatrix_x2_trans(uint32_t (&r)[2], const void* smem_row,
                                 std::source_location loc = std::source_location::current()) {
  ::va::emu::ldmatrix(2, true, r, smem_row, loc);
}
VA_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row,
                                 std::source_location loc = std::source_location::current()) {
  ::va::emu::ldmatrix(4, true, r, smem_row, loc);
}
#else
VA_DEVICE void ldmatrix_x1(uint32_t& r, const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
               : "=r"(r)
               : "r"(detail::smem_u32(smem_row))
               : "memory");
}
VA_DEVICE void ldmatrix_x2(uint32_t (&r)[2], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(detail::smem_u32(smem_row))
               : "memory");
}
VA_DEVICE void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(detail::smem_u32(smem_row))
               : "memory");
}
VA_DEVICE void ldmatrix_x1_trans(uint32_t& r, const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
               : "=r"(r)
               : "r"(detail::smem_u32(smem_row))
               : "memory");
}
VA_DEVICE void ldmatrix_x2_trans(uint32_t (&r)[2], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(detail::smem_u32(smem_row))
               : "memory");
}
VA_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(detail::smem_u32(smem_row))
               : "memory");
}
#endif

// cp.async: https://docs.nvidia.com/cuda/parallel-thread-execution/#data-movement-and-conversion-instructions-cp-async
// 16 bytes global -> shared, bypassing L1 (.cg). Both addresses 16-byte aligned.
// The copy is complete (visible to this thread) only after a cp.async.wait_group
// that covers its commit group; other threads see it after a following block_sync.
#if VA_EMULATION
VA_DEVICE void cp_async_16(void* smem_dst, const void* gmem_src,
                           std::source_location loc = std::source_location::current()) {
  ::va::emu::cp_async_16(smem_dst, gmem_src, true, loc);
}
// !valid: 16 zero bytes land and the source is not read (src-size 0).
VA_DEVICE void cp_async_16_zfill(void* smem_dst, const void* gmem_src, bool valid,
                                 std::source_location loc = std::source_location::current()) {
  ::va::emu::cp_async_16(smem_dst, gmem_src, valid, loc);
}
// 4 bytes global -> shared through L1 (.ca; cp-size 4 exists only with .ca), both
// addresses 4-byte aligned; !valid: 4 zero bytes land, the source is not read.
VA_DEVICE void cp_async_4_zfill(void* smem_dst, const void* gmem_src, bool valid,
                                std::source_location loc = std::source_location::current()) {
  ::va::emu::cp_async(smem_dst, gmem_src, 4, valid, loc);
}
// prefetch.global.L2: bring the 128-byte line holding `gmem` into L2 (a hint: no register, no completion). The
// kernels prefetch the KV rows of a tile some iterations before their cp.async so that the copies hit L2
// (bench/model/sim.py, Prefetch); the emulator checks the address and counts the lines.
VA_DEVICE void prefetch_l2(const void* gmem, std::source_location loc = std::source_location::current()) {
  ::va::emu::prefetch_l2(gmem, loc);
}
VA_DEVICE void cp_async_commit() { ::va::emu::cp_async_commit(); }
// cp.async.wait_group N: all but the newest N committed groups have landed.
template <int N>
VA_DEVICE void cp_async_wait(std::source_location loc = std::source_location::current()) {
  static_assert(N >= 0 && N <= 7, "cp.async.wait_group N: 0 <= N <= 7");
  ::va::emu::cp_async_wait(N, loc);
}
#else
VA_DEVICE void cp_async_16(void* smem_dst, const void* gmem_src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n"
               :
               : "r"(detail::smem_u32(smem_dst)), "l"(gmem_src)
               : "memory");
}
// !valid: 16 zero bytes land and the source is not read (src-size 0).
VA_DEVICE void cp_async_16_zfill(void* smem_dst, const void* gmem_src, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :
               : "r"(detail::smem_u32(smem_dst)), "l"(gmem_src), "r"(src_size)
               : "memory");
}
// 4 bytes global -> shared through L1 (.ca; cp-size 4 exists only with .ca), both
// addresses 4-byte aligned; !valid: 4 zero bytes land, the source is not read.
VA_DEVICE void cp_async_4_zfill(void* smem_dst, const void* gmem_src, bool valid) {
  const int src_size = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
               :
               : "r"(detail::smem_u32(smem_dst)), "l"(gmem_src), "r"(src_size)
               : "memory");
}
VA_DEVICE void prefetch_l2(const void* gmem) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(gmem)); }
VA_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// cp.async.wait_group N: all but the newest N committed groups have landed.
template <int N>
VA_DEVICE void cp_async_wait() {
  static_assert(N >= 0 && N <= 7, "cp.async.wait_group N: 0 <= N <= 7");
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#endif

// mbarrier and bulk copies (sm_90+): https://docs.nvidia.com/cuda/parallel-thread-execution/#parallel-synchronization-and-communication-instructions-mbarrier
// and #data-movement-and-conversion-instructions-cp-async-bulk. An mbarrier is an 8-byte object in shared
// memory; mbarrier_init(bar, count) (one thread, before any use and a block_sync) sets the arrivals of each
// phase. A phase completes when all `count` arrivals are in and the transaction bytes announced by
// mbarrier_arrive_expect_tx have been delivered by the bulk copies that name the barrier.
// bulk_copy_g2s: `bytes` (a multiple of 16, both addresses 16-byte aligned) global -> shared through the
// TMA unit, one instruction for the whole row; completes on `bar` (complete_tx). mbarrier_wait(bar, parity):
// returns once the phase with that parity has completed, its copies visible to the waiting thread (phase k
// of a barrier has parity k & 1; a fresh barrier is in phase 0).
#if VA_EMULATION
VA_DEVICE void mbarrier_init(uint64_t* bar, int count,
                             std::source_location loc = std::source_location::current()) {
  ::va::emu::mbarrier_init(bar, count, loc);
}
VA_DEVICE void mbarrier_arrive(uint64_t* bar, std::source_location loc = std::source_location::current()) {
  ::va::emu::mbarrier_arrive(bar, loc);
}
VA_DEVICE void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes,
                                         std::source_location loc = std::source_location::current()) {
  ::va::emu::mbarrier_arrive_expect_tx(bar, bytes, loc);
}
VA_DEVICE void mbarrier_wait(uint64_t* bar, uint32_t parity,
                             std::source_location loc = std::source_location::current()) {
  ::va::emu::mbarrier_wait(bar, parity, loc);
}
VA_DEVICE void bulk_copy_g2s(void* smem_dst, const void* gmem_src, uint32_t bytes, uint64_t* bar,
                             std::source_location loc = std::source_location::current()) {
  ::va::emu::bulk_copy_g2s(smem_dst, gmem_src, bytes, bar, loc);
}
VA_DEVICE void cp_async_mbarrier_arrive_noinc(uint64_t* bar,
                                              std::source_location loc = std::source_location::current()) {
  ::va::emu::cp_async_mbarrier_arrive_noinc(bar, loc);
}
#else
VA_DEVICE void mbarrier_init(uint64_t* bar, int count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(detail::smem_u32(bar)), "r"(count) : "memory");
#else
  __trap();
#endif
}
VA_DEVICE void mbarrier_arrive(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(detail::smem_u32(bar)) : "memory");
#else
  __trap();
#endif
}
VA_DEVICE void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(detail::smem_u32(bar)), "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}
VA_DEVICE void mbarrier_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "VA_MBAR_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra VA_MBAR_DONE;\n"
      "bra VA_MBAR_WAIT;\n"
      "VA_MBAR_DONE:\n"
      "}\n" ::"r"(detail::smem_u32(bar)),
      "r"(parity)
      : "memory");
#else
  __trap();
#endif
}
VA_DEVICE void bulk_copy_g2s(void* smem_dst, const void* gmem_src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // .shared::cta (PTX 8.6): on sm_120a the .shared::cluster form compiles to a CALL.ABS into a driver routine before
  // its UBLKCP (ptxas then also ignores setmaxnreg: "compatibility into 'extern' call"); .shared::cta is the UBLKCP
  // alone there, and the same UBLKCP as before on sm_90a
  asm volatile("cp.async.bulk.shared::cta.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               :
               : "r"(detail::smem_u32(smem_dst)), "l"(gmem_src), "r"(bytes), "r"(detail::smem_u32(bar))
               : "memory");
#else
  __trap();
#endif
}
// cp.async.mbarrier.arrive.noinc (sm_80+): the barrier counts this thread once every cp.async it issued before
// has completed; .noinc: the arrival is one of the `count` mbarrier_init set (a producer warp's threads signal
// a stage's "full" barrier this way, no commit group or wait_group needed).
// https://docs.nvidia.com/cuda/parallel-thread-execution/#data-movement-and-conversion-instructions-cp-async-mbarrier-arrive
VA_DEVICE void cp_async_mbarrier_arrive_noinc(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(detail::smem_u32(bar)) : "memory");
#else
  __trap();
#endif
}
#endif

// One arrival for the calling warp, on an mbarrier whose count is in warps (the warp-specialized kernels' EMPTY
// barriers: "this warp reads the buffer no more"): the warp's lanes converge, then lane 0 arrives.
#if VA_EMULATION
VA_DEVICE void mbarrier_arrive_warp(uint64_t* bar, std::source_location loc = std::source_location::current()) {
  warp_sync(loc);
  if (lane_id() == 0) mbarrier_arrive(bar, loc);
}
#else
VA_DEVICE void mbarrier_arrive_warp(uint64_t* bar) {
  warp_sync();
  if (lane_id() == 0) mbarrier_arrive(bar);
}
#endif

// Every global read outside cp.async goes through ld_global and every global
// write through st_global, so the emulator can bounds-check them. T is a
// trivially copyable type of at most 16 bytes (int, float, uint2, uint4, float4, ...)
// and p is aligned to sizeof(T) as the hardware requires.
#if VA_EMULATION
template <class T>
VA_DEVICE T ld_global(const T* p, std::source_location loc = std::source_location::current()) {
  static_assert(sizeof(T) <= 16, "ld_global: T must be at most 16 bytes");
  T v;
  ::va::emu::ld_global(&v, p, sizeof(T), loc);
  return v;
}
template <class T>
VA_DEVICE void st_global(T* p, const T& v, std::source_location loc = std::source_location::current()) {
  static_assert(sizeof(T) <= 16, "st_global: T must be at most 16 bytes");
  ::va::emu::st_global(p, &v, sizeof(T), loc);
}
#else
template <class T>
VA_DEVICE T ld_global(const T* p) {
  static_assert(sizeof(T) <= 16, "ld_global: T must be at most 16 bytes");
  return *p;
}
template <class T>
VA_DEVICE void st_global(T* p, const T& v) {
  static_assert(sizeof(T) <= 16, "st_global: T must be at most 16 bytes");
  *p = v;
}
#endif

// st.shared through the generic proxy: T of 4, 8 or 16 bytes (uint32_t, uint2, uint4), p size-aligned in shared
// memory. Bytes a wgmma (the async proxy) will read need the writing thread's fence_proxy_async before the barrier
// that publishes them; the emulator checks that (and the address) for every st_shared.
#if VA_EMULATION
template <class T>
VA_DEVICE void st_shared(void* p, const T& v, std::source_location loc = std::source_location::current()) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8 || sizeof(T) == 16, "st_shared: T must be 4, 8 or 16 bytes");
  ::va::emu::st_shared(p, &v, sizeof(T), loc);
}
#else
template <class T>
VA_DEVICE void st_shared(void* p, const T& v) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8 || sizeof(T) == 16, "st_shared: T must be 4, 8 or 16 bytes");
  *static_cast<T*>(p) = v;  // STS where the compiler sees a shared pointer, else a generic ST (both generic proxy)
}
#endif

// Base of the block's dynamic shared memory, 1024-byte aligned in the shared window: the 128-byte swizzle's pattern
// repeats every 1024 bytes of the address (bits 4-6 XOR bits 7-9), and the swizzled wgmma descriptors (base offset
// 0) and copies (sw128_*) work on offsets from this base. Kernels use no static __shared__ variables, so the
// dynamic size passed to launch() is all.
template <class T>
VA_DEVICE T* smem_dynamic() {
#if VA_EMULATION
  return reinterpret_cast<T*>(::va::emu::smem_base());
#else
  extern __shared__ __align__(1024) unsigned char va_dynamic_smem[];
  return reinterpret_cast<T*>(va_dynamic_smem);
#endif
}

}  // namespace va::arch
