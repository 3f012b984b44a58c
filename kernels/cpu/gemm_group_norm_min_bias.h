// Kernels of the fused GroupNorm + min + bias step of gemm_group_norm_min_bias
// (core/gemm_group_norm_min_bias.cpp runs the GEMM and ties these to autograd): the CPU
// reference here, the CUDA launchers in kernels/cuda/gemm_group_norm_min_bias.h, both with
// the contracts below. Every tensor is contiguous; y, weight, gn_bias, bias, out and all
// gradients share y's floating dtype; argmin is i64. Statistics (mean, rstd) are f64 on the
// CPU, and on CUDA f32 for f32/f16/bf16 and f64 for f64 (the accumulation type). Sums run in
// a fixed order; outputs are written (=), never accumulated.
#pragma once

#include <cstdint>

#include "normcore/tensor.h"

// y [rows, channels] with channels = groups * group_len, the GEMM's output before its bias;
// linear_bias, weight, gn_bias [channels] or undefined; bias [channels]. Per row b:
// v = y[b] + linear_bias, z = group_norm(v) * weight + gn_bias, argmin[b] = first index
// of min(z) (a NaN wins), out[o, b] = min(z) + bias[o] with out [channels, rows]; mean and
// rstd (of v) [rows * groups].
// Backward: grad_out [channels, rows] -> grad_y [rows, channels] (non-zero only in the group
// of each row's argmin), grad_linear_bias (grad_y summed over rows), grad_weight,
// grad_gn_bias, grad_bias [channels] (each skipped when undefined).
#define NORMCORE_GROUP_NORM_MIN_BIAS_FUNCTIONS                                                            \
  void group_norm_min_bias_forward(const Tensor& y, const Tensor& linear_bias, const Tensor& weight,      \
                                   const Tensor& gn_bias, const Tensor& bias, int64_t rows, int64_t channels, \
                                   int64_t groups, double eps, const Tensor& out, const Tensor& mean,     \
                                   const Tensor& rstd, const Tensor& argmin);                             \
  void group_norm_min_bias_backward(const Tensor& grad_out, const Tensor& y, const Tensor& linear_bias,   \
                                    const Tensor& weight, const Tensor& mean, const Tensor& rstd,         \
                                    const Tensor& argmin, int64_t rows, int64_t channels, int64_t groups, \
                                    const Tensor& grad_y, const Tensor& grad_linear_bias,                 \
                                    const Tensor& grad_weight, const Tensor& grad_gn_bias, const Tensor& grad_bias);

namespace normcore {
namespace cpu {
NORMCORE_GROUP_NORM_MIN_BIAS_FUNCTIONS
}  // namespace cpu
}  // namespace normcore
