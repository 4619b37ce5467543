// A small warp-specialized loop for the model's role reading (tests/test_model_roles.py; never launched):
// 384 threads, warpgroup 2 the producer (setmaxnreg.dec, 16-byte cp.async per lane into two stages, each stage's
// "full" mbarrier signalled by cp.async.mbarrier.arrive.noinc), warpgroups 0 and 1 the math warps (setmaxnreg.inc,
// wait on "full", mma.sync on the stage, release it on "empty", a named barrier between the two warpgroups once a
// stage). The loop handles both stages in one iteration, as FlashMLA's does, so every barrier has a fixed address.
#include <cstdint>

namespace {

__device__ __forceinline__ uint32_t smem(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(uint64_t* b, int count) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(smem(b)), "r"(count));
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
    asm volatile("mbarrier.arrive.shared.b64 _, [%0];" ::"r"(smem(b)) : "memory");
}
__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t* b) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" ::"r"(smem(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t parity) {
    asm volatile("{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared.b64 p, [%0], %1;\n @!p bra WAIT_%=;\n}"
                 ::"r"(smem(b)), "r"(parity) : "memory");
}
__device__ __forceinline__ void cp16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void named_sync_math() {   // named barrier 1: the two math warpgroups' 256 threads
    asm volatile("bar.sync 1, 256;" ::: "memory");
}

constexpr int kRowsPerStage = 64;              // 64 rows x 128 bytes: 8 KB a stage
constexpr int kChunks = kRowsPerStage * 8;     // 16-byte chunks a stage

template <int S>
__device__ __forceinline__ void produce(uint4 (*buf)[kChunks], uint64_t* full, uint64_t* empty, const uint4* src,
                                        int tile, uint32_t parity, int t) {
    mbar_wait(&empty[S], parity ^ 1);
#pragma unroll
    for (int k = 0; k < kChunks / 128; ++k) cp16(&buf[S][t + 128 * k], src + tile * kChunks + t + 128 * k);
    cp_async_arrive_noinc(&full[S]);
}

template <int S>
__device__ __forceinline__ void consume(uint4 (*buf)[kChunks], uint64_t* full, uint64_t* empty, float* acc,
                                        uint32_t parity, int lane) {
    mbar_wait(&full[S], parity);
    const uint32_t base = smem(&buf[S][0]);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        uint32_t a0, a1, a2, a3, b0, b1;
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"(base + lane * 128 + k * 32));
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"
                     : "=r"(b0), "=r"(b1) : "r"(base + 4096 + (lane % 16) * 128 + k * 32));
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    mbar_arrive(&empty[S]);
    named_sync_math();
}

}  // namespace

extern "C" __global__ void __launch_bounds__(384, 1) warp_roles_kernel(const uint4* __restrict__ src,
                                                                       float* __restrict__ out, int pairs) {
    __shared__ alignas(128) uint4 buf[2][kChunks];
    __shared__ struct alignas(8) { uint64_t full[2], empty[2]; } bars;   // one base: fixed offsets in the SASS
    uint64_t* full = bars.full;
    uint64_t* empty = bars.empty;
    const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
    if (threadIdx.x == 0) {
        for (int s = 0; s < 2; ++s) {
            mbar_init(&full[s], 128);     // the producer warpgroup's threads, each once its copies landed
            mbar_init(&empty[s], 256);    // the two math warpgroups' threads
        }
    }
    __syncthreads();
    if (wg == 2) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        const int t = threadIdx.x - 256;
        for (int p = 0; p < pairs; ++p) {
            produce<0>(buf, full, empty, src, 2 * p, p & 1, t);
            produce<1>(buf, full, empty, src, 2 * p + 1, p & 1, t);
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (int p = 0; p < pairs; ++p) {
            consume<0>(buf, full, empty, acc, p & 1, threadIdx.x % 32);
            consume<1>(buf, full, empty, acc, p & 1, threadIdx.x % 32);
        }
        for (int i = 0; i < 4; ++i) out[threadIdx.x * 4 + i] = acc[i];
    }
}
