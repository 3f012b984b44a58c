// Normalization layers: each holds its hyper-parameters and (for LayerNorm and GroupNorm)
// its affine parameters, and calls the functional op of normcore/norms.h, which checks
// the input against them and records the backward.
#include <cmath>

#include "normcore/nn.h"
#include "normcore/norms.h"

namespace normcore {
namespace nn {
namespace {

// The layers check eps when they are made, not at their first forward.
void check_eps(const char* layer, double eps) {
  NC_CHECK(eps > 0 && std::isfinite(eps), ValueError, layer, ": eps must be positive and finite, got ", eps);
}

}  // namespace

LayerNorm::LayerNorm(std::vector<int64_t> shape, double eps, bool elementwise_affine, bool with_bias)
    : normalized_shape(std::move(shape)), eps(eps) {
  check_eps("LayerNorm", eps);
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
  check_eps("GroupNorm", eps);
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

L1Norm::L1Norm(int64_t dim, double eps) : dim(dim), eps(eps) { check_eps("L1Norm", eps); }

Tensor L1Norm::forward(const Tensor& x) { return l1_norm(x, dim, eps); }

FrobeniusNorm::FrobeniusNorm(double eps) : eps(eps) { check_eps("FrobeniusNorm", eps); }

Tensor FrobeniusNorm::forward(const Tensor& x) { return frobenius_norm(x, eps); }

}  // namespace nn
}  // namespace normcore
