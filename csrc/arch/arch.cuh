// The device API (namespace va::arch): the only hardware-specific surface the
// kernels touch. Kernel sources include this header and nothing else from
// csrc/arch; see each header for the PTX it stands for.
#pragma once

#include "defs.cuh"
#include "cluster.cuh"
#include "copy.cuh"
#include "launch.cuh"
#include "math.cuh"
#include "mma.cuh"
#include "sync.cuh"
#include "warp.cuh"
#include "wgmma.cuh"
