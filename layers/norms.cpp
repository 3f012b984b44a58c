// Normalization layers: each holds its hyper-parameters and (for LayerNorm and GroupNorm)
// its affine parameters, and calls the functional op of normcore/norms.h, which checks
// the input against them and records the backward.
#include "normcore/nn.h"
#include "normcore/norms.h"

namespace normcore {
namespace nn {

LayerNorm::LayerNorm(std::vector<int64_t> shape, double eps, bool elementwise_affine, bool with_bias)
    : normalized_shape(std::move(shape)), eps(eps) {
  for (int64_t size : normalized_shape) {
    NC_CHECK(size >= 0, ValueError, "LayerNorm: normalized_shape must have non-negative sizes, got ",
             normalized_shape);
  }
  if (!elementwise_affine) return;
  weight = register_parameter("weight", ones(normalized_shape));
  if (with_bias) bias = register_parameter("bias", zeros(normalized_shape));
}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, normalized_shape, weight, bias, eps); }

GroupNorm::GroupNorm(int64_t groups, int64_t channels, double eps, bool affine)
    : num_groups(groups), num_channels(channels), eps(eps) {
  NC_CHECK(groups > 0, ValueError, "GroupNorm: num_groups must be positive, got ", groups);
  NC_CHECK(channels >= 0 && channels % groups == 0, ValueError, "GroupNorm: num_channels = ", channels,
           " must be divisible by num_groups = ", groups);
  if (!affine) return;
  weight = register_parameter("weight", ones({channels}));
  bias = register_parameter("bias", zeros({channels}));
}

Tensor GroupNorm::forward(const Tensor& x) {
  NC_CHECK(!x.defined() || (x.dim() >= 2 && x.size(1) == num_channels), ShapeError,
           "GroupNorm: input must be [N, num_channels = ", num_channels, ", *], got ", describe(x));
  return group_norm(x, num_groups, weight, bias, eps);
}

Tensor L1Norm::forward(const Tensor& x) { return l1_norm(x, dim, eps); }

Tensor FrobeniusNorm::forward(const Tensor& x) { return frobenius_norm(x, eps); }

}  // namespace nn
}  // namespace normcore
