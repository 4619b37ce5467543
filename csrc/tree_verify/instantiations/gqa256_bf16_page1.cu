// bf16, gqa256, page1 layout: every tile config of TilesFor<HeadG256> (config.h).
#include "../launch_shape.cuh"
VA_TV_INSTANTIATE(__nv_bfloat16, HeadG256, Page1Layout)
