// bf16 q and out, e4m3 KV cache (per-tensor scales), GQA 256/256, page1 layout: TilesForFp8<HeadG256> (config.h).
#include "../launch_shape.cuh"
VA_TV_INSTANTIATE_FP8(__nv_bfloat16, HeadG256, Page1Layout)
