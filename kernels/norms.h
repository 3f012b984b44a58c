// The normalization kernels: layer, RMS, group, batch, L1 and Frobenius norm, forward and backward
// (core/norms.cpp checks arguments and ties them to autograd, feeding backward the
// statistics the forward saved). Every tensor contiguous; x, y, grad_y, grad_x, weight, bias,
// grad_weight, grad_bias and batch norm's running statistics share x's floating dtype; the
// saved statistics (mean, rstd, norm) have dtype stats_dtype(device, dtype). Undefined
// weight/bias mean none; grad_x is always computed, undefined grad_weight/grad_bias are not.
// Parameter gradients are deterministic.
#pragma once

#include <cstdint>

#include "kernels/backend.h"

namespace normcore {
namespace kernels {

// Layer norm and group norm share one layout: x [batch, groups * group_channels, spatial]
// has rows = batch * groups of row_len = group_channels * spatial elements. Layer norm is
// groups = 1, spatial = 1 (each column its own channel); so is a group norm of one group
// over [N, C], which therefore runs layer norm's kernels.
struct GroupLayout {
  int64_t batch, groups, group_channels, spatial;
  int64_t rows() const { return batch * groups; }
  int64_t row_len() const { return group_channels * spatial; }
  int64_t channels() const { return groups * group_channels; }
  bool is_rows() const { return groups == 1 && spatial == 1; }
};

inline GroupLayout layer_layout(int64_t rows, int64_t row_len) { return {rows, 1, row_len, 1}; }
inline GroupLayout group_layout(int64_t batch, int64_t groups, int64_t channels, int64_t spatial) {
  return {batch, groups, groups > 0 ? channels / groups : 0, spatial};
}

class NormKernels {
 public:
  // layer_norm: x [rows, row_len]; mean, rstd [rows]; weight, bias [row_len];
  // y = (x - mean) * rstd * weight + bias, biased variance, rstd = 1 / sqrt(var + eps).
  virtual void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t rows,
                                  int64_t row_len, double eps, const Tensor& y, const Tensor& mean,
                                  const Tensor& rstd) const = 0;
  virtual void layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd, int64_t rows, int64_t row_len, const Tensor& grad_x,
                                   const Tensor& grad_weight, const Tensor& grad_bias) const = 0;
  // rms_norm: layer norm's layout without centering or bias: x [rows, row_len]; rstd [rows];
  // weight [row_len]; y = x * rstd * weight, rstd = 1 / sqrt(mean(x * x) + eps). Backward:
  // grad_x = rstd * (w * dy - xhat * mean(w * dy * xhat)) with xhat = x * rstd,
  // grad_weight = sum(dy * xhat) over rows.
  virtual void rms_norm_forward(const Tensor& x, const Tensor& weight, int64_t rows, int64_t row_len, double eps,
                                const Tensor& y, const Tensor& rstd) const = 0;
  virtual void rms_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                                 int64_t rows, int64_t row_len, const Tensor& grad_x,
                                 const Tensor& grad_weight) const = 0;
  // group_norm: x [batch, channels, spatial], channels = groups * (channels / groups);
  // mean, rstd [batch * groups]; weight, bias [channels].
  virtual void group_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t batch,
                                  int64_t groups, int64_t channels, int64_t spatial, double eps, const Tensor& y,
                                  const Tensor& mean, const Tensor& rstd) const = 0;
  virtual void group_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd, int64_t batch, int64_t groups, int64_t channels,
                                   int64_t spatial, const Tensor& grad_x, const Tensor& grad_weight,
                                   const Tensor& grad_bias) const = 0;
  // batch_norm: x [batch, channels, spatial]; each channel's statistics are over its batch *
  // spatial elements; mean, rstd, weight, bias, running_mean, running_var [channels].
  // training: mean and rstd = 1 / sqrt(var + eps) of the batch (biased variance, two-pass or
  // Welford/Chan), and running_mean and running_var, each when defined, are updated in place
  // to (1 - momentum) * running + momentum * statistic with the unbiased variance (the caller
  // passes them only when batch * spatial >= 2). Evaluation: mean = running_mean and
  // rstd = 1 / sqrt(running_var + eps) (both defined, only read). Both: mean and rstd are
  // saved (=) and y = (x - mean) * rstd * weight + bias.
  virtual void batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                  const Tensor& running_mean, const Tensor& running_var, int64_t batch,
                                  int64_t channels, int64_t spatial, bool training, double momentum, double eps,
                                  const Tensor& y, const Tensor& mean, const Tensor& rstd) const = 0;
  // With xhat = (x - mean) * rstd and per-channel sums over batch * spatial:
  // grad_weight = sum(dy * xhat), grad_bias = sum(dy); grad_x = w * rstd * (dy - mean(dy) -
  // xhat * mean(dy * xhat)) in training (through the batch statistics), w * rstd * dy in
  // evaluation (the running statistics are constants).
  virtual void batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd, int64_t batch, int64_t channels, int64_t spatial,
                                   bool training, const Tensor& grad_x, const Tensor& grad_weight,
                                   const Tensor& grad_bias) const = 0;
  // l1_norm: x [outer, size, inner] -> y = x / max(mean(|x|, dim 1), eps); norm [outer, inner]
  // holds mean(|x|) before the clamp (0 when size == 0).
  virtual void l1_norm_forward(const Tensor& x, int64_t outer, int64_t size, int64_t inner, double eps,
                               const Tensor& y, const Tensor& norm) const = 0;
  virtual void l1_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& norm, int64_t outer,
                                int64_t size, int64_t inner, double eps, const Tensor& grad_x) const = 0;
  // frobenius_norm: y = x / max(sqrt(sum(x * x)), eps) over all elements; norm [] holds
  // sqrt(sum(x * x)). Backward: the norm's gradient is 0 where the clamp is active.
  virtual void frobenius_norm_forward(const Tensor& x, double eps, const Tensor& y, const Tensor& norm) const = 0;
  virtual void frobenius_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& norm, double eps,
                                       const Tensor& grad_x) const = 0;

 protected:
  ~NormKernels() = default;
};

}  // namespace kernels

namespace cpu { const kernels::NormKernels& norm_kernels(); }
namespace cuda { const kernels::NormKernels& norm_kernels(); }

namespace kernels {
inline const NormKernels& norms(Device device) {
  return for_device(device, cpu::norm_kernels, NC_CUDA_KERNELS(norm_kernels), "norms");
}
}  // namespace kernels

}  // namespace normcore
