// Dropout: a Bernoulli keep-mask drawn with rand() (seeded by the generator), scaled by
// 1 / (1 - p) and multiplied in, so the backward is mul's: the same mask times grad.
#include "normcore/autograd.h"
#include "normcore/nn.h"
#include "normcore/ops.h"

namespace normcore {
namespace nn {

namespace {

double checked_p(const char* op, double p) {
  NC_CHECK(p >= 0.0 && p <= 1.0, ValueError, op, ": p must be in [0, 1], got ", p);
  return p;
}

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  const char* op = "dropout";
  checked_p(op, p);
  NC_CHECK(x.defined(), ValueError, op, ": x is an undefined tensor");
  NC_CHECK(is_floating(x.dtype()), DTypeError, op, ": x must be floating, got ", describe(x));
  if (!training || p == 0.0) return x;
  if (p == 1.0) return mul(x, 0.0);
  Tensor scaled_mask;
  {
    autograd::NoGradGuard no_grad;
    Tensor keep = ge(rand(x.shape(), TensorOptions(DType::F32, x.device()), gen), p);
    scaled_mask = mul(keep.to(x.dtype()), 1.0 / (1.0 - p));
  }
  return mul(x, scaled_mask);
}

Dropout::Dropout(double p, Generator* gen) : p(checked_p("Dropout", p)), gen_(gen) {}

Tensor Dropout::forward(const Tensor& x) { return dropout(x, p, is_training(), gen_); }

}  // namespace nn
}  // namespace normcore
