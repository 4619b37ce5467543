// bf16, gqa64, paged layout: every tile config of TilesFor<HeadG64> (config.h).
#include "../launch_shape.cuh"
VA_TV_INSTANTIATE(__nv_bfloat16, HeadG64, PagedLayout)
