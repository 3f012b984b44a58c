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

// Batch norm's layout: x [batch, channels, spatial]; a channel's statistics run over its
// `batch` planes of `spatial` contiguous elements, channels * spatial apart.
struct BatchLayout {
  int64_t batch, channels, spatial;
  int64_t count() const { return batch * spatial; }  // values per channel
};

// What batch norm's forward does besides normalizing: with training, it takes the batch's
// statistics and moves the running ones by momentum; without, it reads the running ones.
struct BatchNormMode {
  bool training;
  double momentum, eps;
};

// x seen as [outer, size, inner] around the dim an op reduces over (size: that dim's extent,
// inner: the elements after it): L1 norm's layout.
struct DimLayout {
  int64_t outer, size, inner;
};

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
  // group_norm: x [l.batch, l.channels(), l.spatial]; mean, rstd [l.rows()]; weight, bias
  // [l.channels()].
  virtual void group_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const GroupLayout& l,
                                  double eps, const Tensor& y, const Tensor& mean, const Tensor& rstd) const = 0;
  virtual void group_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd, const GroupLayout& l, const Tensor& grad_x,
                                   const Tensor& grad_weight, const Tensor& grad_bias) const = 0;
  // batch_norm: x [l.batch, l.channels, l.spatial]; each channel's statistics are over its
  // l.count() elements; mean, rstd, weight, bias, running_mean, running_var [l.channels].
  // mode.training: mean and rstd = 1 / sqrt(var + eps) of the batch (biased variance, two-pass or
  // Welford/Chan), and running_mean and running_var, each when defined, are updated in place
  // to (1 - momentum) * running + momentum * statistic with the unbiased variance (the caller
  // passes them only when batch * spatial >= 2). Evaluation: mean = running_mean and
  // rstd = 1 / sqrt(running_var + eps) (both defined, only read). Both: mean and rstd are
  // saved (=) and y = (x - mean) * rstd * weight + bias.
  virtual void batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                                  const Tensor& running_var, const BatchLayout& l, const BatchNormMode& mode,
                                  const Tensor& y, const Tensor& mean, const Tensor& rstd) const = 0;
  // With xhat = (x - mean) * rstd and per-channel sums over batch * spatial:
  // grad_weight = sum(dy * xhat), grad_bias = sum(dy); grad_x = w * rstd * (dy - mean(dy) -
  // xhat * mean(dy * xhat)) in training (through the batch statistics), w * rstd * dy in
  // evaluation (the running statistics are constants).
  virtual void batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd, const BatchLayout& l, bool training, const Tensor& grad_x,
                                   const Tensor& grad_weight, const Tensor& grad_bias) const = 0;
  // l1_norm: x [l.outer, l.size, l.inner] -> y = x / max(mean(|x|, dim 1), eps); norm
  // [l.outer, l.inner] holds mean(|x|) before the clamp (0 when l.size == 0).
  virtual void l1_norm_forward(const Tensor& x, const DimLayout& l, double eps, const Tensor& y,
                               const Tensor& norm) const = 0;
  virtual void l1_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& norm, const DimLayout& l,
                                double eps, const Tensor& grad_x) const = 0;
  // frobenius_norm: y = x / max(sqrt(sum(x * x)), eps) over all elements; norm [] holds
  // sqrt(sum(x * x)). Backward: the norm's gradient is 0 where the clamp is active.
  virtual void frobenius_norm_forward(const Tensor& x, double eps, const Tensor& y, const Tensor& norm) const = 0;
  virtual void frobenius_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& norm, double eps,
                                       const Tensor& grad_x) const = 0;

 protected:
  ~NormKernels() = default;
};

}  // namespace kernels

namespace cpu {
const kernels::NormKernels& norm_kernels();
}
namespace cuda {
const kernels::NormKernels& norm_kernels();
}

namespace kernels {
inline const NormKernels& norms(Device device) {
  return for_device(device, cpu::norm_kernels, NC_CUDA_KERNELS(norm_kernels), "norms");
}
}  // namespace kernels

}  // namespace normcore
