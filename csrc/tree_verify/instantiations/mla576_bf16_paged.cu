// bf16, mla576, paged layout: every tile config of TilesFor<HeadMLA> (config.h).
#include "../launch_shape.cuh"
VA_TV_INSTANTIATE(__nv_bfloat16, HeadMLA, PagedLayout)
