// Fused kernels of composite ops (normcore/fused.h and linear_cross_entropy; core/fused.cpp
// and core/linear_cross_entropy.cpp run the matrix products and tie these to autograd). Every
// tensor contiguous; argmin and targets are i64; every other tensor shares y's (or the
// logits') floating dtype but the statistics (mean, rstd, the rows' losses), which have
// stats_dtype (kernels/backend.h).
// Sums run in a fixed order and outputs are written (=): results are deterministic.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/norms.h"

namespace normcore {
namespace kernels {

class FusedKernels {
 public:
  // The GroupNorm + min + bias step of gemm_group_norm_min_bias, in group norm's layout with
  // l.batch = rows and l.spatial = 1 (kernels/norms.h). y [rows, channels] with channels =
  // l.channels() = l.groups * l.group_channels is the GEMM's output before its bias;
  // linear_bias, weight, gn_bias [channels] or undefined; bias [channels]. Per row b:
  // v = y[b] + linear_bias, z = group_norm(v) * weight + gn_bias, argmin[b] = first index of
  // min(z) (a NaN wins), out[o, b] = min(z) + bias[o] with out [channels, rows]; mean and
  // rstd (of v) [l.rows()] = [rows * groups].
  virtual void group_norm_min_bias_forward(const Tensor& y, const Tensor& linear_bias, const Tensor& weight,
                                           const Tensor& gn_bias, const Tensor& bias, const GroupLayout& l, double eps,
                                           const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                           const Tensor& argmin) const = 0;
  // grad_out [channels, rows] -> grad_y [rows, channels] (non-zero only in the group of each
  // row's argmin), grad_linear_bias (grad_y summed over rows), grad_weight, grad_gn_bias,
  // grad_bias [channels] (each skipped when undefined).
  virtual void group_norm_min_bias_backward(const Tensor& grad_out, const Tensor& y, const Tensor& linear_bias,
                                            const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                            const Tensor& argmin, const GroupLayout& l, const Tensor& grad_y,
                                            const Tensor& grad_linear_bias, const Tensor& grad_weight,
                                            const Tensor& grad_gn_bias, const Tensor& grad_bias) const = 0;

  // The rows of a softmax cross-entropy, loss and gradient in one pass (linear_cross_entropy's
  // step after its matrix product). logits [rows, cols] contiguous, target [rows] i64, loss
  // [rows] and scale (0-dim, or undefined for 1) of stats_dtype; only the first `classes`
  // columns count (0 < classes <= cols). Per row r with t = target[r]: loss[r] = lse_r -
  // logits[r, t], lse_r the log-sum-exp of the row's classes; then logits[r, j] is
  // overwritten (in place) with scale * (exp(logits[r, j] - lse_r) - (j == t)) for j <
  // classes and 0 for the other columns. A row whose target is ignore_index gets loss 0 and
  // a gradient row of 0 whatever its logits hold. Any other target outside [0, classes)
  // raises IndexError naming op (on CUDA at the host's next wait); its row's loss is NaN and
  // its gradient row 0.
  virtual void cross_entropy_rows(const char* op, const Tensor& logits, const Tensor& target, int64_t classes,
                                  int64_t ignore_index, const Tensor& scale, const Tensor& loss) const = 0;

  // A residual add and the LayerNorm after it (add_layer_norm's forward), rows of `cols`:
  // sum = x + y and out = (sum - mean) * rstd * weight + bias per row, mean and rstd the
  // row's statistics (two-pass) as layer_norm_forward gives them. x and sum contiguous of
  // one floating dtype, y contiguous of any floating dtype (converted as it is read), out
  // contiguous of any floating dtype (rounded once), weight [cols] of sum's dtype, bias
  // [cols] or undefined, mean and rstd [rows] of stats_dtype. Returns false, having written
  // nothing, where the back end has no fused kernel for these operands (the caller then
  // composes add and layer_norm).
  virtual bool add_layer_norm_forward(const Tensor& x, const Tensor& y, const Tensor& weight, const Tensor& bias,
                                      int64_t rows, int64_t cols, double eps, const Tensor& sum, const Tensor& out,
                                      const Tensor& mean, const Tensor& rstd) const = 0;

  // softmax (or, with take_log, log_softmax) of each row of x [rows, cols], contiguous and
  // floating, into out (contiguous, x's dtype), in f32 (f64 for f64) rounded once: with m the
  // row's max and s the sum of exp(x - m), exp(x - m) (1 / s) or (x - m) - log(s). A row holding
  // NaN gives NaN throughout and a row of -inf alone NaN, as the composition of max, sub, exp
  // and sum does. One read of the row for m and s (the CUDA kernel merges running maxima and
  // sums) and one more for the output, where the composition makes five passes. Returns
  // false, having written nothing, where the back end has no such kernel.
  virtual bool softmax_rows(const Tensor& x, int64_t rows, int64_t cols, bool take_log, const Tensor& out) const = 0;

 protected:
  ~FusedKernels() = default;
};

}  // namespace kernels

namespace cpu {
const kernels::FusedKernels& fused_kernels();
}
namespace cuda {
const kernels::FusedKernels& fused_kernels();
}

namespace kernels {
inline const FusedKernels& fused(Device device) {
  return for_device(device, cpu::fused_kernels, NC_CUDA_KERNELS(fused_kernels), "fused");
}
}  // namespace kernels

}  // namespace normcore
