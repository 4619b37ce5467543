// bf16, mla576, page1 layout: every tile config of TilesFor<HeadMLA> (config.h).
#include "../launch_shape.cuh"
VA_TV_INSTANTIATE(__nv_bfloat16, HeadMLA, Page1Layout)
