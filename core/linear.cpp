// nn::linear (normcore/nn.h): y = x @ weight^T + bias as one recorded op. With a bias the
// product and the bias are one kernel call (kernels/matmul.h, matmul_bias: cuBLASLt's bias
// epilogue on CUDA), so the bias costs no pass of its own over y, where matmul then add
// would read and write y again. Backward is the two products and the bias gradient summed
// over the rows (autograd::sum_to: one product with a row of ones for 16-bit gradients).
#include "autograd/graph.h"
#include "core/internal.h"
#include "kernels/matmul.h"
#include "normcore/autocast.h"
#include "normcore/nn.h"
#include "normcore/ops.h"

namespace normcore {
namespace nn {

using namespace detail;

Tensor linear(const Tensor& x_arg, const Tensor& weight_arg, const Tensor& bias_arg) {
  const OpScope op("linear");
  check_defined(op, "x", x_arg);
  check_defined(op, "weight", weight_arg);
  // Under autocast the weight is cast before it is transposed (a straight copy), and the
  // bias joins the 16-bit product in its dtype.
  const Tensor x = autocast::to_lower(x_arg), weight = autocast::to_lower(weight_arg);
  check_same_device(op, "x", x, "weight", weight);
  NC_CHECK(is_floating(x.dtype()) && x.dtype() == weight.dtype(), DTypeError, op,
           ": x and weight must be floating of one dtype, got x ", describe(x), " and weight ", describe(weight));
  NC_CHECK(x.dim() >= 1 && weight.dim() == 2 && weight.size(1) == x.size(-1), ShapeError, op,
           ": x must be [..., in] and weight [out, in], got x ", describe(x), " and weight ", describe(weight));
  if (!bias_arg.defined()) return matmul(x, weight.t());
  const Tensor bias = autocast::to_lower(bias_arg);
  check_same_device(op, "x", x, "bias", bias);
  NC_CHECK(bias.dtype() == x.dtype(), DTypeError, op, ": bias must have x's dtype, got x ", describe(x),
           " and bias ", describe(bias));
  const int64_t in = weight.size(1), out = weight.size(0);
  NC_CHECK(bias.dim() == 1 && bias.size(0) == out, ShapeError, op, ": bias must be [out] = [", out,
           "] for weight ", describe(weight), ", got ", describe(bias));

  const Shape leading(x.shape().begin(), x.shape().end() - 1);
  Shape out_shape = leading;
  out_shape.push_back(out);
  const int64_t rows = checked_numel(leading, op);
  if (rows == 0 || in == 0 || out == 0) return add(matmul(x, weight.t()), bias);
  const Tensor x2 = x.reshape({rows, in});
  const Tensor b = bias.contiguous();
  Tensor y = new_tensor({rows, out}, x.dtype(), x.device());
  {
    autograd::NoGradGuard no_grad;
    if (!kernels::matmul(x.device()).matmul_bias(y, x2, weight.t(), b)) y = add(matmul(x2, weight.t()), b);
  }
  y = y.view(out_shape);
  if (!autograd::needs_grad(x, weight, bias)) return y;
  autograd::record(op, y, {x, weight, bias},
                   [xs = autograd::saved(x2), ws = autograd::saved(weight), x_shape = x.shape(), out,
                    want_x = x.requires_grad(), want_weight = weight.requires_grad(),
                    want_bias = bias.requires_grad()](const Tensor& grad) {
                     const Tensor g = grad.reshape({xs.get().size(0), out});
                     Tensor grad_x = want_x ? matmul(g, ws.get()).view(x_shape) : Tensor();
                     Tensor grad_weight = want_weight ? matmul(g.t(), xs.get()) : Tensor();
                     Tensor grad_bias = want_bias ? autograd::sum_to(g, {out}) : Tensor();
                     return std::vector<Tensor>{grad_x, grad_weight, grad_bias};
                   });
  return y;
}

}  // namespace nn
}  // namespace normcore
