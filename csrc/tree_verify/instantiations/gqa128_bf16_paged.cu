// bf16, gqa128, paged layout: every tile config of TilesFor<HeadG128> (config.h).
#include "../launch_shape.cuh"
VA_TV_INSTANTIATE(__nv_bfloat16, HeadG128, PagedLayout)
