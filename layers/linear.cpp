// Linear: y = x @ weight^T + bias for any leading dims, through normcore::linear (core/linear.cpp:
// the weight used through a transposed view, the bias added inside the product).
#include <cmath>

#include "normcore/autocast.h"
#include "normcore/nn.h"
#include "normcore/ops.h"

namespace normcore {
namespace nn {

namespace {

// Uniform on [-bound, bound).
Tensor uniform(const Shape& shape, double bound, Generator* gen) {
  return sub(mul(rand(shape, DType::F32, gen), 2.0 * bound), bound);
}

int64_t checked_features(const char* name, int64_t n) {
  NC_CHECK(n >= 0, ValueError, "Linear: ", name, " must be non-negative, got ", n);
  return n;
}

}  // namespace

Linear::Linear(int64_t in, int64_t out, bool with_bias, Generator* gen)
    : in_features(checked_features("in_features", in)), out_features(checked_features("out_features", out)) {
  // PyTorch's kaiming_uniform_(a = sqrt(5)) on [out, in] reduces to this bound, and the
  // bias uses the same one (0 when there are no inputs).
  double bound = in > 0 ? 1.0 / std::sqrt(static_cast<double>(in)) : 0.0;
  weight = register_parameter("weight", uniform({out, in}, bound, gen));
  if (with_bias) bias = register_parameter("bias", uniform({out}, bound, gen));
}

Tensor Linear::forward(const Tensor& x) {
  const char* op = "Linear";
  NC_CHECK(x.defined(), ValueError, op, ": input is an undefined tensor");
  NC_CHECK(x.dim() >= 1 && x.size(-1) == in_features, ShapeError, op,
           ": input's last dim must be in_features = ", in_features, ", got input ", describe(x), " (weight is ",
           describe(weight), ")");
  NC_CHECK(x.dtype() == weight.dtype() || autocast::is_enabled(), DTypeError, op, ": input is ", describe(x),
           " but weight is ", describe(weight), " (convert the input, or the module with to(dtype))");
  NC_CHECK(x.device() == weight.device(), DeviceError, op, ": input is on ", x.device(), " but weight is on ",
           weight.device(), " (move the module with to(device))");
  return normcore::linear(x, weight, bias);
}

}  // namespace nn
}  // namespace normcore
