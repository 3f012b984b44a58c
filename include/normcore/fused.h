// Fused ops: a chain of layers computed as few recorded ops, with the same values and
// gradients as the composition (up to rounding) but fewer passes over memory and saved
// tensors. Floating dtypes; f16/bf16 compute in f32.
#pragma once

#include <cstdint>

#include "normcore/tensor.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {

// y = x @ weight^T + linear_bias; z = group_norm(y, num_groups, gn_weight, gn_bias, eps);
// m = min(z, dim 1, keepdim); out = m + bias with NumPy broadcasting:
// x [B, IN], weight [OUT, IN], linear_bias, gn_weight, gn_bias [OUT] (each optional:
// undefined), bias [1, OUT, 1, 1] -> out [1, OUT, B, 1]. OUT > 0 and divisible by
// num_groups. The GEMM is a matmul; the Linear bias and the rest are one op that saves only
// the group statistics and each row's argmin. The gradient of the min goes to its first
// index.
Tensor gemm_group_norm_min_bias(const Tensor& x, const Tensor& weight, const Tensor& linear_bias,
                                const Tensor& gn_weight, const Tensor& gn_bias, const Tensor& bias, int64_t num_groups,
                                double eps = 1e-5);

}  // namespace normcore

#pragma GCC visibility pop
