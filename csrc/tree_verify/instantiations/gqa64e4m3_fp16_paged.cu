// fp16 q and out, e4m3 KV cache (per-tensor scales), GQA 64/64, paged layout: TilesForFp8<HeadG64> (config.h).
#include "../launch_shape.cuh"
VA_TV_INSTANTIATE_FP8(__half, HeadG64, PagedLayout)
