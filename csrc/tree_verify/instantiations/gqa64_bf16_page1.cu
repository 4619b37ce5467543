// bf16, gqa64, page1 layout: every tile config of TilesFor<HeadG64> (config.h).
#include "../launch_shape.cuh"
VA_TV_INSTANTIATE(__nv_bfloat16, HeadG64, Page1Layout)
