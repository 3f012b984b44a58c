// Normalization layers: each holds its hyper-parameters and (for LayerNorm, RMSNorm, GroupNorm
// and BatchNorm) its affine parameters, and calls the functional op of normcore/norms.h, which
// checks the input against them and records the backward. BatchNorm also keeps its running
// statistics as buffers, which the op updates in training.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "normcore/autograd.h"
#include "normcore/nn.h"
#include "normcore/norms.h"
#include "normcore/ops.h"

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
    NC_CHECK(size >= 0, ValueError, "LayerNorm: normalized_shape must have non-negative sizes, got ", normalized_shape);
  }
  if (!elementwise_affine) return;
  weight = register_parameter("weight", ones(normalized_shape));
  if (with_bias) bias = register_parameter("bias", zeros(normalized_shape));
}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, normalized_shape, weight, bias, eps); }

RMSNorm::RMSNorm(std::vector<int64_t> shape, double eps, bool elementwise_affine)
    : normalized_shape(std::move(shape)), eps(eps) {
  check_eps("RMSNorm", eps);
  for (int64_t size : normalized_shape) {
    NC_CHECK(size >= 0, ValueError, "RMSNorm: normalized_shape must have non-negative sizes, got ", normalized_shape);
  }
  if (elementwise_affine) weight = register_parameter("weight", ones(normalized_shape));
}

Tensor RMSNorm::forward(const Tensor& x) { return rms_norm(x, normalized_shape, weight, eps); }

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

BatchNorm::BatchNorm(const char* layer, std::vector<int64_t> ranks, int64_t num_features, double eps,
                     std::optional<double> momentum, bool affine, bool track_running_stats)
    : num_features(num_features), eps(eps), momentum(momentum), track_running_stats(track_running_stats), layer_(layer),
      ranks_(std::move(ranks)) {
  check_eps(layer, eps);
  NC_CHECK(num_features >= 0, ValueError, layer, ": num_features must be non-negative, got ", num_features);
  if (affine) {
    weight = register_parameter("weight", ones({num_features}));
    bias = register_parameter("bias", zeros({num_features}));
  }
  if (track_running_stats) {
    running_mean = register_buffer("running_mean", zeros({num_features}));
    running_var = register_buffer("running_var", ones({num_features}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, DType::I64));
  }
}

// PyTorch's _BatchNorm.forward: batch statistics in training and whenever there are no
// running ones; the running statistics are updated in training (with momentum, or the
// cumulative average 1 / num_batches_tracked when momentum is not given).
Tensor BatchNorm::forward(const Tensor& x) {
  if (x.defined()) {
    const bool rank_ok = std::find(ranks_.begin(), ranks_.end(), x.dim()) != ranks_.end();
    std::ostringstream ranks;
    for (size_t i = 0; i < ranks_.size(); ++i) ranks << (i == 0 ? "" : " or ") << ranks_[i];
    NC_CHECK(rank_ok && x.size(1) == num_features, ShapeError, layer_, ": input must be ", ranks.str(),
             "-D [N, num_features = ", num_features, ", *], got ", describe(x));
  }
  const bool update = is_training() && track_running_stats;
  double factor = momentum.value_or(0.0);
  if (update && !momentum) factor = 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>() + 1);
  const bool batch_stats = is_training() || !track_running_stats;
  Tensor out = batch_norm(x, running_mean, running_var, weight, bias, batch_stats, factor, eps);
  if (update) {
    autograd::NoGradGuard no_grad;
    num_batches_tracked.copy_(add(num_batches_tracked, 1));
  }
  return out;
}

BatchNorm1d::BatchNorm1d(int64_t num_features, double eps, std::optional<double> momentum, bool affine,
                         bool track_running_stats)
    : BatchNorm("BatchNorm1d", {2, 3}, num_features, eps, momentum, affine, track_running_stats) {}

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, std::optional<double> momentum, bool affine,
                         bool track_running_stats)
    : BatchNorm("BatchNorm2d", {4}, num_features, eps, momentum, affine, track_running_stats) {}

}  // namespace nn
}  // namespace normcore
