// Thread-block clusters (sm_90+): the CTA's rank, the cluster barrier, distributed shared memory addresses, mbarrier
// arrivals on another CTA's barrier and bulk copies from this CTA's shared memory into another's.
// https://docs.nvidia.com/cuda/parallel-thread-execution/#cluster-of-cooperative-thread-arrays
//
// A shared::cluster address (a 32-bit `uint32_t` from map_shared_rank) names a byte of one CTA's shared memory from
// any CTA of the cluster. Before a CTA touches another's barriers, their mbarrier_init must be visible cluster-wide:
// the initialising thread runs fence_mbarrier_init_cluster, then every thread of the cluster cluster_sync. A CTA
// must not exit while another may still arrive on its barriers or copy into its shared memory: a last cluster_sync
// of every thread orders those before either exits. The emulator (csrc/emu) runs a cluster's CTAs together and
// checks each rule: a remote barrier used before a cluster_sync followed its init, an access to a CTA that exited,
// a cluster_sync some thread never reaches, a bulk copy's source written by this CTA's generic proxy (st_shared,
// or cp.async that no mbarrier phase tied) without fence_proxy_async.
// Host side: launch_cluster (launch.cuh) gives the cluster's shape; the grid must be a whole number of clusters.
#pragma once

#include "defs.cuh"
#if VA_EMULATION
#include <source_location>

#include "../emu/device.h"
#endif
#include "copy.cuh"  // detail::smem_u32
#include "warp.cuh"

namespace va::arch {

#if VA_EMULATION
// %cluster_ctarank: this CTA's rank in its cluster, x fastest (0 in a launch without clusters)
VA_DEVICE int cluster_ctarank() { return ::va::emu::cluster_ctarank(); }
// barrier.cluster.arrive.release + barrier.cluster.wait.acquire: every thread of every CTA of the cluster
VA_DEVICE void cluster_sync(std::source_location loc = std::source_location::current()) {
  ::va::emu::cluster_sync(loc);
}
// fence.mbarrier_init.release.cluster: this thread's mbarrier_inits, visible cluster-wide at the next cluster_sync
VA_DEVICE void fence_mbarrier_init_cluster(std::source_location loc = std::source_location::current()) {
  ::va::emu::fence_mbarrier_init_cluster(loc);
}
// mapa.shared::cluster: the shared::cluster address of `p` (in this CTA's shared memory) in CTA `rank`'s
VA_DEVICE uint32_t map_shared_rank(const void* p, int rank,
                                   std::source_location loc = std::source_location::current()) {
  return ::va::emu::map_shared_rank(p, rank, loc);
}
// mbarrier.arrive.shared::cluster (.release at CTA scope, the default, as CUTLASS's ClusterBarrier::arrive(cta_id):
// the .release.cluster form costs a MEMBAR.ALL.GPU before every arrival): one arrival on the barrier at a
// shared::cluster address
VA_DEVICE void mbarrier_arrive_cluster(uint32_t bar, std::source_location loc = std::source_location::current()) {
  ::va::emu::mbarrier_arrive_cluster(bar, loc);
}
// cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes: `bytes` (a multiple of 16, both addresses
// 16-byte aligned) of this CTA's shared memory at src into dst, completing `bytes` transactions on bar; dst and bar
// are shared::cluster addresses of one CTA. The source is read through the async proxy: bytes this CTA's threads
// wrote through the generic proxy need their fence_proxy_async first
VA_DEVICE void bulk_copy_s2cluster(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                   std::source_location loc = std::source_location::current()) {
  ::va::emu::bulk_copy_s2cluster(dst, src, bytes, bar, loc);
}
// One arrival for the calling warp on a shared::cluster barrier whose count is in warps (lane 0 arrives)
VA_DEVICE void mbarrier_arrive_cluster_warp(uint32_t bar,
                                            std::source_location loc = std::source_location::current()) {
  warp_sync(loc);
  if (lane_id() == 0) ::va::emu::mbarrier_arrive_cluster(bar, loc);
}
#else
VA_DEVICE int cluster_ctarank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return static_cast<int>(r);
#else
  return 0;
#endif
}
VA_DEVICE void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
#else
  __trap();
#endif
}
VA_DEVICE void fence_mbarrier_init_cluster() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
  __trap();
#endif
}
VA_DEVICE uint32_t map_shared_rank(const void* p, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(r)
               : "r"(detail::smem_u32(p)), "r"(rank));
  return r;
#else
  __trap();
  return 0;
#endif
}
VA_DEVICE void mbarrier_arrive_cluster(uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
#else
  __trap();
#endif
}
VA_DEVICE void bulk_copy_s2cluster(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               :
               : "r"(dst), "r"(detail::smem_u32(src)), "r"(bytes), "r"(bar)
               : "memory");
#else
  __trap();
#endif
}
VA_DEVICE void mbarrier_arrive_cluster_warp(uint32_t bar) {
  warp_sync();
  if (lane_id() == 0) mbarrier_arrive_cluster(bar);
}
#endif

}  // namespace va::arch
