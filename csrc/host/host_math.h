// Everything under csrc/host/: one include for kernels and host tests.
#pragma once

#include "common.h"
#include "fp8.h"
#include "fragments.h"
#include "layout.h"
#include "mask.h"
#include "softmax.h"
#include "split.h"
