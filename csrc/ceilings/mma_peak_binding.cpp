// torch binding of the ceiling probes (mma.sync and wgmma rates, latencies, read bandwidth):
// the only file here that sees torch.
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "ceilings/mma_peak.h"

namespace {
void mma_peak(torch::Tensor out, int64_t blocks, int64_t iters, bool bf16) {
  TORCH_CHECK(out.is_cuda() && out.scalar_type() == torch::kFloat32 && out.is_contiguous(),
              "out must be a contiguous float32 CUDA tensor");
  TORCH_CHECK(blocks >= 1 && iters >= 1, "blocks and iters must be >= 1");
  TORCH_CHECK(out.numel() >= blocks * va::ceil::mma_peak_threads(), "out needs blocks * ",
              va::ceil::mma_peak_threads(), " elements");
  va::ceil::launch_mma_peak(bf16, static_cast<int>(blocks), static_cast<int>(iters), out.data_ptr<float>(),
                            c10::cuda::getCurrentCUDAStream(out.get_device()).stream());
}

void mma_latency(torch::Tensor out, int64_t iters) {
  TORCH_CHECK(out.is_cuda() && out.scalar_type() == torch::kFloat32 && out.numel() >= 2, "out: float32 CUDA [2]");
  va::ceil::launch_mma_latency(static_cast<int>(iters), out.data_ptr<float>(),
                               c10::cuda::getCurrentCUDAStream(out.get_device()).stream());
}

// The wgmma probes exist on compute capability 9.0 only (sm_90a code): elsewhere say so, launch nothing.
void require_sm90(const torch::Tensor& out) {
  int major = 0, minor = 0;
  TORCH_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, out.get_device()) == cudaSuccess &&
                  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, out.get_device()) == cudaSuccess,
              "cudaDeviceGetAttribute failed");
  TORCH_CHECK(major == 9 && minor == 0, "the wgmma probes need a compute capability 9.0 GPU (sm_90a), this is ",
              major, ".", minor);
}

void wgmma_peak(torch::Tensor out, int64_t blocks, int64_t iters) {
  TORCH_CHECK(out.is_cuda() && out.scalar_type() == torch::kFloat32 && out.is_contiguous(),
              "out must be a contiguous float32 CUDA tensor");
  TORCH_CHECK(blocks >= 1 && iters >= 1, "blocks and iters must be >= 1");
  TORCH_CHECK(out.numel() >= blocks * va::ceil::wgmma_peak_threads(), "out needs blocks * ",
              va::ceil::wgmma_peak_threads(), " elements");
  require_sm90(out);
  va::ceil::launch_wgmma_peak(static_cast<int>(blocks), static_cast<int>(iters), out.data_ptr<float>(),
                              c10::cuda::getCurrentCUDAStream(out.get_device()).stream());
}

void wgmma_latency(torch::Tensor out, int64_t iters) {
  TORCH_CHECK(out.is_cuda() && out.scalar_type() == torch::kFloat32 && out.numel() >= 4, "out: float32 CUDA [4]");
  TORCH_CHECK(iters >= 1, "iters must be >= 1");
  require_sm90(out);
  va::ceil::launch_wgmma_latency(static_cast<int>(iters), out.data_ptr<float>(),
                                 c10::cuda::getCurrentCUDAStream(out.get_device()).stream());
}

void wgmma_operands(torch::Tensor src, torch::Tensor out, int64_t blocks, int64_t iters, int64_t copy_rounds,
                    int64_t n, bool ss) {
  TORCH_CHECK(out.is_cuda() && out.scalar_type() == torch::kFloat32 && out.is_contiguous(),
              "out must be a contiguous float32 CUDA tensor");
  TORCH_CHECK(src.is_cuda() && src.is_contiguous() && src.numel() * src.element_size() >=
                  blocks * va::ceil::wgmma_operand_src_bytes(),
              "src: a contiguous CUDA tensor of at least blocks x ", va::ceil::wgmma_operand_src_bytes(), " bytes");
  TORCH_CHECK(blocks >= 1 && iters >= 0 && copy_rounds >= 0, "blocks must be >= 1, iters and copy_rounds >= 0");
  TORCH_CHECK(out.numel() >= blocks * va::ceil::wgmma_peak_threads(), "out needs blocks * ",
              va::ceil::wgmma_peak_threads(), " elements");
  require_sm90(out);
  try {
    va::ceil::launch_wgmma_operands(static_cast<int>(n), ss, static_cast<int>(blocks), static_cast<int>(iters),
                                    static_cast<int>(copy_rounds), src.data_ptr(), out.data_ptr<float>(),
                                    c10::cuda::getCurrentCUDAStream(out.get_device()).stream());
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

void read_bw(torch::Tensor buf, torch::Tensor out, int64_t blocks, int64_t repeats) {
  TORCH_CHECK(buf.is_cuda() && buf.is_contiguous() && buf.numel() * buf.element_size() % 16 == 0,
              "buf: a contiguous CUDA tensor of whole 16-byte units");
  TORCH_CHECK(out.is_cuda() && out.scalar_type() == torch::kFloat32 && out.numel() >= blocks, "out: float32 [blocks]");
  va::ceil::launch_read_bw(buf.data_ptr(), buf.numel() * buf.element_size() / 16, static_cast<int>(blocks),
                           static_cast<int>(repeats), out.data_ptr<float>(),
                           c10::cuda::getCurrentCUDAStream(out.get_device()).stream());
}
void kv_stream(torch::Tensor pool, torch::Tensor indices, torch::Tensor out, int64_t row_bytes, int64_t bn,
               int64_t stages, int64_t across, int64_t idx_mode, int64_t delay, int64_t blocks) {
  TORCH_CHECK(pool.is_cuda() && pool.is_contiguous() && pool.scalar_type() == torch::kUInt8,
              "pool: a contiguous uint8 CUDA tensor [rows * row_bytes]");
  TORCH_CHECK(indices.is_cuda() && indices.is_contiguous() && indices.scalar_type() == torch::kInt32,
              "indices: a contiguous int32 CUDA tensor [ntok]");
  TORCH_CHECK(out.is_cuda() && out.scalar_type() == torch::kFloat32 && out.numel() >= blocks, "out: float32 [blocks]");
  TORCH_CHECK(row_bytes >= 16 && row_bytes % 16 == 0, "row_bytes: a multiple of 16");
  TORCH_CHECK(bn >= 8 && bn % 8 == 0 && va::ceil::kv_stream_threads() % bn == 0, "bn: a multiple of 8 dividing ",
              va::ceil::kv_stream_threads());
  TORCH_CHECK(idx_mode >= 0 && idx_mode <= 2 && (across == 0 || across == 1) && delay >= 0 && blocks >= 1,
              "idx_mode 0..2, across 0/1, delay >= 0, blocks >= 1");
  TORCH_CHECK(stages * bn * row_bytes <= 227 * 1024, "stages x bn x row_bytes must fit 227 KB of shared memory");
  TORCH_CHECK(pool.numel() >= indices.numel() * row_bytes, "pool must hold one row per index position");
  try {
    va::ceil::launch_kv_stream(static_cast<int>(blocks), pool.data_ptr(), indices.data_ptr<int32_t>(),
                               static_cast<int>(indices.numel()), static_cast<int>(row_bytes), static_cast<int>(bn),
                               static_cast<int>(stages), static_cast<int>(across), static_cast<int>(idx_mode),
                               static_cast<int>(delay), out.data_ptr<float>(),
                               c10::cuda::getCurrentCUDAStream(out.get_device()).stream());
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("mma_peak", &mma_peak, "run the mma.sync peak-rate kernel (out, blocks, iters, bf16)");
  m.def("flops", &va::ceil::mma_peak_flops, "FLOPs of one launch (blocks, iters)");
  m.def("threads", &va::ceil::mma_peak_threads, "threads per block");
  m.def("mma_latency", &mma_latency, "cycles per dependent bf16 m16n8k16 MMA into out[0] (out, iters)");
  m.def("wgmma_peak", &wgmma_peak, "run the wgmma (m64n256k16 bf16) peak-rate kernel, sm_90a (out, blocks, iters)");
  m.def("wgmma_flops", &va::ceil::wgmma_peak_flops, "FLOPs of one wgmma_peak launch (blocks, iters)");
  m.def("wgmma_threads", &va::ceil::wgmma_peak_threads, "threads per wgmma_peak block");
  m.def("wgmma_latency", &wgmma_latency,
        "cycles per (wgmma + wait_group 0) round, N = 64 into out[0], N = 256 into out[2] (out, iters)");
  m.def("wgmma_operands", &wgmma_operands,
        "run the wgmma operand probe, m64nNk16 bf16 with A from shared memory (ss) or registers, while a warpgroup "
        "lands copy_rounds rounds of copies, sm_90a (src, out, blocks, iters, copy_rounds, n, ss)");
  m.def("wgmma_operand_flops", &va::ceil::wgmma_operand_flops, "FLOPs of one wgmma_operands launch (blocks, iters, n)");
  m.def("wgmma_operand_copy_bytes", &va::ceil::wgmma_operand_copy_bytes, "bytes one block lands a copy round");
  m.def("wgmma_operand_src_bytes", &va::ceil::wgmma_operand_src_bytes, "bytes of src a block copies from");
  m.def("kv_stream", &kv_stream, "the KV stream probe (pool, indices, out, row_bytes, bn, stages, across, "
        "idx_mode, delay, blocks)");
  m.def("read_bw", &read_bw, "every block reads its share of buf, repeats times (buf, out, blocks, repeats)");
  m.def("max_active_clusters", &va::ceil::max_active_clusters,
        "clusters of cluster_size CTAs of threads threads and smem_bytes of dynamic shared memory held at once "
        "(threads, smem_bytes, cluster_size)");
}
