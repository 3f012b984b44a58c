// The CUDA status check lives with the runtime, in runtime/cuda/check.h. This header forwards
// to it for the files that still include the old path (kernels/cuda/attention/); it goes once
// they include runtime/cuda/check.h themselves.
#pragma once

#include "runtime/cuda/check.h"
