// The KV stream probe: how fast a split kernel's loader alone can bring scattered KV rows into shared memory,
// as a function of the bytes it keeps in flight, the way a warp's lanes cover the rows, and where the row ids
// come from. The memory half of a split kernel with the math taken out (bench/ceilings.py `kv_stream`; the
// SASS model's memory term is judged against it).
//
// One CTA of 256 threads per SM streams its share of `ntok` token positions in tiles of BN rows of
// `row_bytes` (the MLA row: 1152 B) through a STAGES-deep cp.async ring, exactly like the split kernels:
// tile it + STAGES - 1 is issued after the barrier of iteration it, tile it waited for at its top (the
// prefetch distance is STAGES - 1 tiles). Per tile every thread reads one 16-byte word of the landed
// stage (so the copies cannot be dropped) and, if `delay` > 0, spins `delay` SM cycles (the math a real
// tile would do). Row ids:
//   idx 0: row = token position (a sorted, contiguous pool; no index read)
//   idx 1: row = indices[token], loaded right before the copy that needs it (a dependent round trip)
//   idx 2: row = indices[token], loaded one tile ahead into a register (kernel v2's loader)
// Lane layout: across 0, consecutive threads cover one row's consecutive 16-byte chunks (256 / BN threads
// per row; kernel v1's loader); across 1, consecutive threads cover 8 rows' first chunks, then the next 8
// (kernel v2's loader: 8 rows x 64 bytes per warp instruction).
#include <stdexcept>

#include "arch/arch.cuh"
#include "ceilings/mma_peak.h"

namespace va::ceil {

constexpr int kStreamThreads = 256;

template <int STAGES>
__global__ void __launch_bounds__(kStreamThreads, 1)
    kv_stream_kernel(const unsigned char* __restrict__ pool, const int32_t* __restrict__ indices, int ntok,
                     int row_bytes, int bn, int across, int idx_mode, int delay, float* __restrict__ out) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x;
  const int per_cta = (ntok + gridDim.x - 1) / gridDim.x;
  const int begin = blockIdx.x * per_cta;
  const int end = begin + per_cta < ntok ? begin + per_cta : ntok;
  const int ntiles = end > begin ? (end - begin + bn - 1) / bn : 0;
  const int chunks = row_bytes / 16;        // 16-byte chunks per row
  const int tpr = kStreamThreads / bn;      // threads per row
  int row, lane;                            // this thread's row of every tile, and its first chunk
  if (across) {
    row = (tid & 7) + 8 * (tid / (8 * tpr));
    lane = (tid >> 3) % tpr;
  } else {
    row = tid / tpr;
    lane = tid % tpr;
  }
  const int stage_bytes = bn * row_bytes;
  auto row_id = [&](int tok) -> int32_t { return idx_mode == 0 ? tok : arch::ld_global(indices + tok); };
  auto issue = [&](int tile, int32_t id) {
    const int tok = begin + tile * bn + row;
    const bool valid = tok < end;
    const unsigned char* src = pool + static_cast<int64_t>(valid ? id : 0) * row_bytes;
    unsigned char* dst = smem + (tile % STAGES) * stage_bytes + row * row_bytes;
    for (int c = lane; c < chunks; c += tpr) arch::cp_async_16_zfill(dst + c * 16, src + c * 16, valid);
  };
  auto id_of = [&](int tile) -> int32_t {
    const int tok = begin + tile * bn + row;
    return tok < end ? row_id(tok) : 0;
  };
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ntiles) issue(s, id_of(s));
    arch::cp_async_commit();
  }
  int32_t next_id = idx_mode == 2 && STAGES - 1 < ntiles ? id_of(STAGES - 1) : 0;
  float acc = 0.f;
  for (int it = 0; it < ntiles; ++it) {
    arch::cp_async_wait<STAGES - 2>();  // tile it landed (this thread's copies)
    arch::block_sync();                 // everyone's; the stage of it - 1 is free
    const int t = it + STAGES - 1;
    if (t < ntiles) {
      int32_t id;
      if (idx_mode == 2) {
        id = next_id;
        next_id = t + 1 < ntiles ? id_of(t + 1) : 0;
      } else {
        id = id_of(t);
      }
      issue(t, id);
    }
    arch::cp_async_commit();
    acc += reinterpret_cast<const float*>(smem + (it % STAGES) * stage_bytes)[tid];
    if (delay > 0) {
      const long long t0 = clock64();
      while (clock64() - t0 < delay) {
      }
    }
  }
  arch::cp_async_wait<0>();
  if (acc == 12345.f) arch::st_global(out + blockIdx.x, acc);  // keeps the reads
}

template <int S>
static void launch_stages(int blocks, const void* pool, const int32_t* indices, int ntok, int row_bytes, int bn,
                          int across, int idx_mode, int delay, float* out, cudaStream_t stream) {
  const size_t smem = size_t(S) * bn * row_bytes;
  arch::launch(kv_stream_kernel<S>, dim3(blocks), dim3(kStreamThreads), smem, stream,
               static_cast<const unsigned char*>(pool), indices, ntok, row_bytes, bn, across, idx_mode, delay, out);
}

int kv_stream_threads() { return kStreamThreads; }

void launch_kv_stream(int blocks, const void* pool, const int32_t* indices, int ntok, int row_bytes, int bn,
                      int stages, int across, int idx_mode, int delay, float* out, cudaStream_t stream) {
  switch (stages) {
    case 2: return launch_stages<2>(blocks, pool, indices, ntok, row_bytes, bn, across, idx_mode, delay, out, stream);
    case 3: return launch_stages<3>(blocks, pool, indices, ntok, row_bytes, bn, across, idx_mode, delay, out, stream);
    case 4: return launch_stages<4>(blocks, pool, indices, ntok, row_bytes, bn, across, idx_mode, delay, out, stream);
    case 6: return launch_stages<6>(blocks, pool, indices, ntok, row_bytes, bn, across, idx_mode, delay, out, stream);
    case 8: return launch_stages<8>(blocks, pool, indices, ntok, row_bytes, bn, across, idx_mode, delay, out, stream);
    default: throw std::invalid_argument("kv_stream: stages must be 2, 3, 4, 6 or 8");
  }
}

}  // namespace va::ceil
