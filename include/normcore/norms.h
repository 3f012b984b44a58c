// Normalization ops (functional forms of the LayerNorm, RMSNorm, GroupNorm, L1Norm,
// FrobeniusNorm and BatchNorm layers). Each is one recorded op with its own forward and backward (not a composition of
// generic ops): forward saves what backward needs (mean and rstd, or the norm), backward
// gives grad_x, grad_weight and grad_bias, reducing parameter gradients deterministically.
// Floating dtypes; f16/bf16 compute in f32. Statistics are two-pass or Welford/Chan
// combined, never E[x^2] - E[x]^2, so the variance stays accurate when |mean| >> std.
#pragma once

#include <utility>
#include <vector>

#include "normcore/tensor.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {

// PyTorch's F.layer_norm: statistics over the trailing dims given by normalized_shape
// (biased variance), y = (x - mean) * rstd * weight + bias. weight and bias are optional
// (undefined tensors) and have shape normalized_shape.
// [*, normalized_shape] -> same shape.
Tensor layer_norm(const Tensor& x, const std::vector<int64_t>& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps = 1e-5);

// A residual add and the LayerNorm over the last dim after it, in one pass where the back
// end has a kernel (CUDA: rows of up to 2048 in 4-element vectors): returns {sum, out} with
// sum = x + y (x and y of one shape, sum in their promoted dtype) and out = layer_norm(sum,
// {C}, weight, bias, eps). Under autocast out comes in the autocast dtype, the one the
// Linear after it computes in (layer_norm alone gives f32 there). Gradients flow as through
// add and layer_norm.
std::pair<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& y, const Tensor& weight, const Tensor& bias,
                                         double eps = 1e-5);

// PyTorch's F.rms_norm: y = x / sqrt(mean(x * x over the trailing normalized_shape dims) + eps)
// * weight; weight is optional (undefined) with shape normalized_shape. The saved statistic
// is rstd. [*, normalized_shape] -> same shape.
Tensor rms_norm(const Tensor& x, const std::vector<int64_t>& normalized_shape, const Tensor& weight, double eps = 1e-6);

// PyTorch's F.group_norm: x [N, C, *] (rank >= 2), C divisible by num_groups; statistics per
// sample and group over C / num_groups channels and all trailing dims; weight and bias [C],
// optional. A batch holding one value per group in all (N = 1, C = num_groups, no trailing
// size above 1) is refused, as F.group_norm does. [N, C, *] -> same shape.
Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

// x / max(mean(|x|, dim, keepdim), eps); a zero row gives zeros. [*] -> same shape.
Tensor l1_norm(const Tensor& x, int64_t dim = 1, double eps = 1e-12);

// x / max(sqrt(sum(x * x)), eps) over the whole tensor; a zero tensor gives zeros (the norm's
// subgradient at 0 is 0). [*] -> same shape.
Tensor frobenius_norm(const Tensor& x, double eps = 1e-12);

// PyTorch's F.batch_norm: x [N, C, *] (rank >= 2); statistics per channel over N and all
// trailing dims. Training: y = (x - mean) / sqrt(var + eps) * weight + bias with the batch's
// mean and biased variance, and, when given, running_mean and running_var [C] are updated in
// place to (1 - momentum) * running + momentum * batch statistic, with the batch's unbiased
// variance (N * spatial >= 2 needed then). Evaluation (training false): running_mean and
// running_var (required) normalize and are left unchanged. weight and bias [C], optional.
// running_mean and running_var share x's device; they take no gradient. [N, C, *] -> same.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum = 0.1, double eps = 1e-5);

}  // namespace normcore

#pragma GCC visibility pop
