// The Dropout module; the op, normcore::dropout, is core/dropout.cpp.
#include "normcore/nn.h"

namespace normcore {
namespace nn {

namespace {

double checked_p(const char* op, double p) {
  NC_CHECK(p >= 0.0 && p <= 1.0, ValueError, op, ": p must be in [0, 1], got ", p);
  return p;
}

}  // namespace

Dropout::Dropout(double p, Generator* gen) : p(checked_p("Dropout", p)), gen_(gen) {}

Tensor Dropout::forward(const Tensor& x) { return normcore::dropout(x, p, is_training(), gen_); }

}  // namespace nn
}  // namespace normcore
