// fp16, gqa256, paged layout: every tile config of TilesFor<HeadG256> (config.h).
#include "../launch_shape.cuh"
VA_TV_INSTANTIATE(__half, HeadG256, PagedLayout)
