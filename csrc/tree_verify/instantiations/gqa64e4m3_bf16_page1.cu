// bf16 q and out, e4m3 KV cache (per-tensor scales), GQA 64/64, page1 layout: TilesForFp8<HeadG64> (config.h).
#include "../launch_shape.cuh"
VA_TV_INSTANTIATE_FP8(__nv_bfloat16, HeadG64, Page1Layout)
