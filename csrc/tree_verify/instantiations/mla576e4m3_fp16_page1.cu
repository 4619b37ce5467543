// fp16 q and out, e4m3 KV cache (per-tensor scales), MLA 576/512, page1 layout: TilesForFp8<HeadMLA> (config.h).
#include "../launch_shape.cuh"
VA_TV_INSTANTIATE_FP8(__half, HeadMLA, Page1Layout)
