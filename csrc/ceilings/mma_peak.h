// Host entry of the ceiling probes (csrc/ceilings/mma_peak.cu): mma.sync and wgmma rates, latencies, read bandwidth.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t (this header is also seen by the host-only binding)

#include <cstdint>

namespace va::ceil {
// FLOPs one launch performs.
double mma_peak_flops(int blocks, int iters);
int mma_peak_threads();
// out: [blocks * mma_peak_threads()] fp32, written once per thread.
void launch_mma_peak(bool bf16, int blocks, int iters, float* out, cudaStream_t stream);
// out[0] = SM cycles per dependent m16n8k16 bf16 MMA (one warp, one chain).
void launch_mma_latency(int iters, float* out, cudaStream_t stream);
// Each of `blocks` blocks reads ~n_float4 / blocks float4 of buf, `repeats` times (bytes = 16 * n_float4 * repeats).
void launch_read_bw(const void* buf, long long n_float4, int blocks, int repeats, float* out, cudaStream_t stream);
// wgmma (sm_90a only; on other archs the kernels do nothing and leave out unwritten):
// FLOPs one wgmma_peak launch performs; out: [blocks * wgmma_peak_threads()] fp32, written once per thread.
double wgmma_peak_flops(int blocks, int iters);
int wgmma_peak_threads();
void launch_wgmma_peak(int blocks, int iters, float* out, cudaStream_t stream);
// out[0] / out[2] = SM cycles per (m64n64k16 / m64n256k16 bf16 wgmma + wait_group 0), one warpgroup;
// out: [4] fp32 (out[1], out[3] only keep the chains alive).
void launch_wgmma_latency(int iters, float* out, cudaStream_t stream);
// The wgmma operand probe (sm_90a only, like the two above): m64nNk16 bf16, N = 16, 32, 64 or 256, A from shared memory
// (ss) or registers, `iters` rounds in each of 2 warpgroups, while a third lands copy_rounds x
// wgmma_operand_copy_bytes() from src (blocks x wgmma_operand_src_bytes(), each block its own slice) into shared
// memory; one block an SM. out: [blocks * wgmma_peak_threads()] fp32, written once per wgmma thread. Throws
// std::invalid_argument for another N.
void launch_wgmma_operands(int n, bool ss, int blocks, int iters, int copy_rounds, const void* src, float* out,
                           cudaStream_t stream);
double wgmma_operand_flops(int blocks, int iters, int n);
int wgmma_operand_copy_bytes();
int wgmma_operand_src_bytes();
// The KV stream probe (csrc/ceilings/kv_stream.cu): `blocks` CTAs stream their shares of ntok rows of
// row_bytes (pool[indices[t]], or pool[t] with idx_mode 0) through a `stages`-deep cp.async ring of bn-row
// tiles; across: the lanes' layout over the rows (0: along a row, 1: across 8 rows); delay: SM cycles of
// stand-in math per tile. out: [blocks] fp32 (written only to keep the reads alive). Throws
// std::invalid_argument for a stage count without an instantiation (2, 3, 4, 6, 8).
int kv_stream_threads();
void launch_kv_stream(int blocks, const void* pool, const int32_t* indices, int ntok, int row_bytes, int bn,
                      int stages, int across, int idx_mode, int delay, float* out, cudaStream_t stream);
// Clusters of `cluster_size` CTAs (x), each `threads` threads and `smem_bytes` of dynamic shared memory, the GPU holds at
// once (cudaOccupancyMaxActiveClusters; csrc/ceilings/clusters.cu). Throws std::invalid_argument / runtime_error.
int max_active_clusters(int threads, int smem_bytes, int cluster_size);
}  // namespace va::ceil
