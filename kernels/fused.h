// Fused kernels of composite ops (normcore/fused.h; core/fused.cpp runs the GEMM and ties
// these to autograd). Every tensor contiguous; argmin is i64; every other tensor shares y's
// floating dtype but the statistics (mean, rstd), which have stats_dtype (kernels/backend.h).
// Sums run in a fixed order and outputs are written (=): results are deterministic.
#pragma once

#include <cstdint>

#include "kernels/backend.h"

namespace normcore {
namespace kernels {

class FusedKernels {
 public:
  // The GroupNorm + min + bias step of gemm_group_norm_min_bias. y [rows, channels] with
  // channels = groups * group_len is the GEMM's output before its bias; linear_bias, weight,
  // gn_bias [channels] or undefined; bias [channels]. Per row b: v = y[b] + linear_bias,
  // z = group_norm(v) * weight + gn_bias, argmin[b] = first index of min(z) (a NaN wins),
  // out[o, b] = min(z) + bias[o] with out [channels, rows]; mean and rstd (of v)
  // [rows * groups].
  virtual void group_norm_min_bias_forward(const Tensor& y, const Tensor& linear_bias, const Tensor& weight,
                                           const Tensor& gn_bias, const Tensor& bias, int64_t rows,
                                           int64_t channels, int64_t groups, double eps, const Tensor& out,
                                           const Tensor& mean, const Tensor& rstd, const Tensor& argmin) const = 0;
  // grad_out [channels, rows] -> grad_y [rows, channels] (non-zero only in the group of each
  // row's argmin), grad_linear_bias (grad_y summed over rows), grad_weight, grad_gn_bias,
  // grad_bias [channels] (each skipped when undefined).
  virtual void group_norm_min_bias_backward(const Tensor& grad_out, const Tensor& y, const Tensor& linear_bias,
                                            const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                            const Tensor& argmin, int64_t rows, int64_t channels, int64_t groups,
                                            const Tensor& grad_y, const Tensor& grad_linear_bias,
                                            const Tensor& grad_weight, const Tensor& grad_gn_bias,
                                            const Tensor& grad_bias) const = 0;

 protected:
  ~FusedKernels() = default;
};

}  // namespace kernels

namespace cpu { const kernels::FusedKernels& fused_kernels(); }
namespace cuda { const kernels::FusedKernels& fused_kernels(); }

namespace kernels {
inline const FusedKernels& fused(Device device) {
  return for_device(device, cpu::fused_kernels, NC_CUDA_KERNELS(fused_kernels), "fused");
}
}  // namespace kernels

}  // namespace normcore
