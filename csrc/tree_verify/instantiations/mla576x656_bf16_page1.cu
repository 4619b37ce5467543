// bf16 q and out, FlashMLA 656-byte fp8 MLA rows (per-128 scales, bf16 RoPE), page1 layout: TilesFor656<HeadMLA>.
#include "../launch_shape.cuh"
VA_TV_INSTANTIATE_656(__nv_bfloat16, HeadMLA, Page1Layout)
