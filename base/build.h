// What this build of normcore has: kHasCuda, and the error for CUDA asked of a CPU-only build.
#pragma once

#include "normcore/error.h"

namespace normcore {
namespace detail {

#ifdef NORMCORE_HAS_CUDA
constexpr bool kHasCuda = true;
#else
constexpr bool kHasCuda = false;
#endif

[[noreturn]] inline void throw_no_cuda(const char* what) {
  throw DeviceError(cat_str(what, ": normcore was built without CUDA; use Device::cpu()"));
}

}  // namespace detail
}  // namespace normcore
