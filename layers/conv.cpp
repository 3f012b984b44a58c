// Conv2d: conv2d with the layer's hyper-parameters; conv2d records the backward.
#include <cmath>

#include "normcore/autocast.h"
#include "normcore/autograd.h"
#include "normcore/conv.h"
#include "normcore/nn.h"
#include "normcore/ops.h"

namespace normcore {
namespace nn {

namespace {

// Uniform on [-bound, bound).
Tensor uniform(const Shape& shape, double bound, Generator* gen) {
  return sub(mul(rand(shape, DType::F32, gen), 2.0 * bound), bound);
}

int64_t checked_channels(const char* name, int64_t n, int64_t groups) {
  NC_CHECK(groups >= 1, ValueError, "Conv2d: groups must be >= 1, got ", groups);
  NC_CHECK(n >= 1, ValueError, "Conv2d: ", name, " must be positive, got ", n);
  NC_CHECK(n % groups == 0, ValueError, "Conv2d: ", name, " = ", n, " must be divisible by groups = ", groups);
  return n;
}

Size2 checked_pair(const char* name, Size2 v, int64_t min) {
  NC_CHECK(v.h >= min && v.w >= min, ValueError, "Conv2d: ", name, " must be >= ", min, ", got (", v.h, ", ", v.w, ")");
  return v;
}

}  // namespace

Conv2d::Conv2d(int64_t in, int64_t out, Size2 kernel, Size2 stride_, Size2 padding_, Size2 dilation_, int64_t groups_,
               bool with_bias, Generator* gen)
    : in_channels(checked_channels("in_channels", in, groups_)),
      out_channels(checked_channels("out_channels", out, groups_)), kernel_size(checked_pair("kernel_size", kernel, 1)),
      stride(checked_pair("stride", stride_, 1)), padding(checked_pair("padding", padding_, 0)),
      dilation(checked_pair("dilation", dilation_, 1)), groups(groups_) {
  // PyTorch's kaiming_uniform_(a = sqrt(5)) reduces to 1/sqrt(fan_in) for the weight, and
  // the bias uses the same bound.
  const int64_t fan_in = in / groups * kernel.h * kernel.w;
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  weight = register_parameter("weight", uniform({out, in / groups, kernel.h, kernel.w}, bound, gen));
  if (with_bias) bias = register_parameter("bias", uniform({out}, bound, gen));
}

Tensor Conv2d::forward(const Tensor& x) {
  const char* op = "Conv2d";
  NC_CHECK(x.defined(), ValueError, op, ": input is an undefined tensor");
  NC_CHECK((x.dim() == 4 || x.dim() == 3) && x.size(-3) == in_channels, ShapeError, op, ": input must be [N, ",
           in_channels, ", H, W] or [", in_channels, ", H, W] (in_channels), got ", describe(x));
  NC_CHECK(x.dtype() == weight.dtype() || autocast::is_enabled(), DTypeError, op, ": input is ", describe(x),
           " but weight is ", describe(weight), " (convert the input, or the module with to(dtype))");
  NC_CHECK(x.device() == weight.device(), DeviceError, op, ": input is on ", x.device(), " but weight is on ",
           weight.device(), " (move the module with to(device))");
  return conv2d(x, weight, bias, stride, padding, dilation, groups);
}

ConvWeights fold_batch_norm(const Conv2d& conv, const BatchNorm& bn, ConvLayout layout) {
  NC_CHECK(bn.running_mean.defined() && bn.running_var.defined(), ValueError, "fold_batch_norm: the BatchNorm (",
           bn.num_features,
           " features) has no running statistics (track_running_stats = false), so it normalizes with each batch's "
           "own and cannot fold into a convolution");
  NC_CHECK(bn.num_features == conv.out_channels, ShapeError, "fold_batch_norm: the BatchNorm has ", bn.num_features,
           " features but the convolution ", conv.out_channels, " output channels (weight ", describe(conv.weight),
           ")");
  autograd::NoGradGuard no_grad;
  const auto host = [](const Tensor& t) { return t.to(Device::cpu(), DType::F64).contiguous().to_vector<double>(); };
  const int64_t out = conv.out_channels;
  const std::vector<double> mean = host(bn.running_mean), var = host(bn.running_var);
  const std::vector<double> gamma = bn.weight.defined() ? host(bn.weight) : std::vector<double>(out, 1.0);
  const std::vector<double> beta = bn.bias.defined() ? host(bn.bias) : std::vector<double>(out, 0.0);
  const std::vector<double> bias = conv.bias.defined() ? host(conv.bias) : std::vector<double>(out, 0.0);
  std::vector<double> weight = host(conv.weight);
  const int64_t per_channel = conv.weight.numel() / out;
  std::vector<double> folded_bias(out);
  for (int64_t o = 0; o < out; ++o) {
    const double s = gamma[o] / std::sqrt(var[o] + bn.eps);
    for (int64_t i = 0; i < per_channel; ++i) weight[o * per_channel + i] *= s;
    folded_bias[o] = (bias[o] - mean[o]) * s + beta[o];
  }
  Tensor w = from_vector(weight, conv.weight.shape(), Device::cpu());
  if (layout == ConvLayout::NHWC) w = w.permute({0, 2, 3, 1}).contiguous();
  const Device device = conv.weight.device();
  const DType dtype = conv.weight.dtype();
  return {w.to(device, dtype), from_vector(folded_bias, {out}, Device::cpu()).to(device, dtype)};
}

}  // namespace nn
}  // namespace normcore
