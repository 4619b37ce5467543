// fp16 q and out, e4m3 KV cache (per-tensor scales), GQA 128/128, paged layout: TilesForFp8<HeadG128> (config.h).
#include "../launch_shape.cuh"
VA_TV_INSTANTIATE_FP8(__half, HeadG128, PagedLayout)
