// The CUDA runtime lives in runtime/cuda/runtime.h. This header forwards to it for the files
// that still include the old path (kernels/cuda/attention/); it goes once they include
// runtime/cuda/runtime.h themselves.
#pragma once

#include "runtime/cuda/runtime.h"
