// dropout (normcore/nn.h): one kernel pass draws the keep-mask (the one rand() would draw from the
// generator, kernels/scalar/dropout.h) and scales the kept elements; the node saves only
// the bool mask, and its backward is one pass of the same scaling over the gradient.
#include "autograd/graph.h"
#include "core/internal.h"
#include "kernels/generate.h"
#include "normcore/nn.h"
#include "normcore/ops.h"
#include "normcore/random.h"
#include "runtime/cuda/capture.h"

namespace normcore {

using namespace detail;

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  const OpScope op("dropout");
  NC_CHECK(p >= 0.0 && p <= 1.0, ValueError, op, ": p must be in [0, 1], got ", p);
  check_defined(op, "x", x);
  NC_CHECK(is_floating(x.dtype()), DTypeError, op, ": x must be floating, got ", describe(x));
  if (!training || p == 0.0) return x;
  if (p == 1.0) return mul(x, 0.0);
  const double scale = 1.0 / (1.0 - p);
  Tensor xc;
  {
    autograd::NoGradGuard no_grad;  // a private copy; the node covers it
    xc = x.contiguous();
  }
  Tensor out = new_tensor(x.shape(), x.dtype(), x.device());
  Tensor keep = new_tensor(x.shape(), DType::Bool, x.device());
  Generator& g = gen ? *gen : default_generator();
  const uint64_t n = static_cast<uint64_t>(x.numel());
  const cuda::RandomOffset offset =
      x.device().is_cuda() ? cuda::random_offset(g, n, x.device().index) : cuda::RandomOffset{g.advance(n), nullptr};
  kernels::generate(x.device())
      .dropout(xc, out, keep, g.seed(), offset.offset, offset.base, static_cast<float>(p), scale);
  autograd::record(op, out, {x}, [keep, scale](const Tensor& grad) {
    const Tensor gc = grad.contiguous();
    Tensor grad_x = new_tensor(gc.shape(), gc.dtype(), gc.device());
    kernels::generate(gc.device()).masked_scale(gc, keep, scale, grad_x);
    return std::vector<Tensor>{grad_x};
  });
  return out;
}

}  // namespace normcore
