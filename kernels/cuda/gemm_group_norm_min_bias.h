// CUDA launchers of the fused GroupNorm + min + bias step of gemm_group_norm_min_bias, with
// the contracts in kernels/cpu/gemm_group_norm_min_bias.h. Launched on the device's current
// stream; parameter gradients are deterministic (no atomics).
#pragma once

#include "kernels/cpu/gemm_group_norm_min_bias.h"

namespace normcore {
namespace cuda_kernels {
NORMCORE_GROUP_NORM_MIN_BIAS_FUNCTIONS
}  // namespace cuda_kernels
}  // namespace normcore
