// fp16, gqa128, page1 layout: every tile config of TilesFor<HeadG128> (config.h).
#include "../launch_shape.cuh"
VA_TV_INSTANTIATE(__half, HeadG128, Page1Layout)
