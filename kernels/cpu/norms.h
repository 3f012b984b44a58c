// CPU reference kernels for the normalization ops (core/norms.cpp ties them to autograd).
// Every tensor argument is contiguous; x, y, grad_y and grad_x share one floating dtype,
// weight/bias/grad_weight/grad_bias share it too. Statistics (mean, rstd, norm) are f64.
// Sums accumulate in double; outputs are written (=), never accumulated.
// The CUDA counterparts are not written yet, so these are not in NORMCORE_BACKEND_FUNCTIONS.
#pragma once

#include <cstdint>

#include "normcore/tensor.h"

namespace normcore {
namespace cpu {

// x [rows, row_len] -> y [rows, row_len], mean and rstd [rows];
// y = (x - mean) * rstd * weight + bias, weight and bias [row_len] or undefined.
void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t rows,
                        int64_t row_len, double eps, const Tensor& y, const Tensor& mean, const Tensor& rstd);
// grad_x [rows, row_len]; grad_weight, grad_bias [row_len] (skipped when undefined).
void layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, int64_t rows, int64_t row_len, const Tensor& grad_x,
                         const Tensor& grad_weight, const Tensor& grad_bias);

// x [batch, channels, spatial] with channels = groups * (channels / groups) -> y (same
// shape), mean and rstd [batch * groups]; weight and bias [channels] or undefined.
void group_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t batch,
                        int64_t groups, int64_t channels, int64_t spatial, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd);
void group_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, int64_t batch, int64_t groups, int64_t channels, int64_t spatial,
                         const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias);

// x [outer, size, inner] -> y = x / max(mean(|x|, dim 1), eps); norm [outer, inner] holds
// mean(|x|) before the clamp.
void l1_norm_forward(const Tensor& x, int64_t outer, int64_t size, int64_t inner, double eps, const Tensor& y,
                     const Tensor& norm);
void l1_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& norm, int64_t outer, int64_t size,
                      int64_t inner, double eps, const Tensor& grad_x);

// y = x / max(sqrt(sum(x * x)), eps) over all elements; norm [] holds sqrt(sum(x * x)).
void frobenius_norm_forward(const Tensor& x, double eps, const Tensor& y, const Tensor& norm);
void frobenius_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& norm, double eps,
                             const Tensor& grad_x);

}  // namespace cpu
}  // namespace normcore
