// linear (normcore/nn.h): y = x @ weight^T + bias as one recorded op. With a bias the
// product and the bias are one kernel call (kernels/matmul.h, matmul_epilogue: cuBLASLt's bias
// epilogue on CUDA), so the bias costs no pass of its own over y, where matmul then add
// would read and write y again. Backward is the two products and the bias gradient summed
// over the rows (autograd::sum_to: one product with a row of ones for 16-bit gradients).
// gelu_mlp: a transformer's MLP, linear(gelu_tanh(linear(x))), as one recorded op whose
// GELU lives in the first product's epilogue forward and in the second product's backward
// (matmul_epilogue's BiasGelu and DGelu). With recompute_gelu the GELU's output is not kept
// for the backward: it is made again there from the kept pre-activation (one elementwise
// pass), so a call holds hidden values a row less between forward and backward.
#include "autograd/graph.h"
#include "core/internal.h"
#include "kernels/elementwise.h"
#include "kernels/matmul.h"
#include "normcore/autocast.h"
#include "normcore/nn.h"
#include "normcore/ops.h"

namespace normcore {

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
  NC_CHECK(bias.dtype() == x.dtype(), DTypeError, op, ": bias must have x's dtype, got x ", describe(x), " and bias ",
           describe(bias));
  const int64_t in = weight.size(1), out = weight.size(0);
  NC_CHECK(bias.dim() == 1 && bias.size(0) == out, ShapeError, op, ": bias must be [out] = [", out, "] for weight ",
           describe(weight), ", got ", describe(bias));

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
    if (!kernels::matmul(x.device())
             .matmul_epilogue(kernels::MatmulKernels::Epilogue::Bias, y, x2, weight.t(), b, Tensor()))
      y = add(matmul(x2, weight.t()), b);
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

namespace {

// linear(gelu_tanh(pre), weight, bias) as one recorded op that keeps pre, not the GELU's
// output, for the backward, which makes that output again (one elementwise pass); the GELU's
// input gradient comes from the product's epilogue (GPT-2 124M, B = 16 on an H200: 0.35 ms a
// step less than the product and a pass of its own).
Tensor gelu_linear_recomputed(const OpScope& op, const Tensor& pre, const Tensor& weight, const Tensor& bias) {
  Tensor y;
  {
    autograd::NoGradGuard no_grad;
    y = linear(gelu(pre, /*approximate=*/true), weight, bias);
  }
  if (!autograd::needs_grad(pre, weight, bias)) return y;
  const int64_t hidden = pre.size(-1), out = weight.size(0), rows = hidden > 0 ? pre.numel() / hidden : 0;
  autograd::record(
      op, y, {pre, weight, bias},
      [pres = autograd::saved(pre), ws = autograd::saved(weight), rows, hidden, out](const Tensor& grad) {
        const Tensor p = pres.get().reshape({rows, hidden});
        const Tensor g = grad.reshape({rows, out});
        Tensor grad_pre = new_tensor({rows, hidden}, p.dtype(), p.device());
        // The GELU's input gradient straight from g @ proj_weight (cuBLASLt's DGELU epilogue
        // on CUDA), else the product, then the GELU's gradient as a pass of its own.
        const bool one_dtype = g.dtype() == p.dtype() && ws.get().dtype() == p.dtype();
        if (!one_dtype || !kernels::matmul(p.device())
                               .matmul_epilogue(kernels::MatmulKernels::Epilogue::DGelu, grad_pre, g.contiguous(),
                                                ws.get(), Tensor(), p.contiguous()))
          kernels::elementwise(p.device()).binary(BinaryOp::GeluTanhGrad, grad_pre, matmul(g, ws.get()), p);
        const Tensor h = gelu(p, /*approximate=*/true);
        return std::vector<Tensor>{grad_pre.view(pres.get().shape()), matmul(g.t(), h), autograd::sum_to(g, {out})};
      });
  return y;
}

}  // namespace

Tensor gelu_mlp(const Tensor& x_arg, const Tensor& fc_weight_arg, const Tensor& fc_bias_arg,
                const Tensor& proj_weight_arg, const Tensor& proj_bias_arg, bool recompute_gelu) {
  const OpScope op("gelu_mlp");
  check_defined(op, "x", x_arg);
  check_defined(op, "fc_weight", fc_weight_arg);
  check_defined(op, "proj_weight", proj_weight_arg);
  if (!fc_bias_arg.defined() || !proj_bias_arg.defined())
    return linear(gelu(linear(x_arg, fc_weight_arg, fc_bias_arg), /*approximate=*/true), proj_weight_arg,
                  proj_bias_arg);
  const Tensor x = autocast::to_lower(x_arg), w1 = autocast::to_lower(fc_weight_arg);
  const Tensor b1 = autocast::to_lower(fc_bias_arg), w2 = autocast::to_lower(proj_weight_arg);
  const Tensor b2 = autocast::to_lower(proj_bias_arg);
  for (const Tensor* t : {&w1, &b1, &w2, &b2}) check_same_device(op, "x", x, "a parameter", *t);
  NC_CHECK(is_floating(x.dtype()) && w1.dtype() == x.dtype() && b1.dtype() == x.dtype() && w2.dtype() == x.dtype() &&
               b2.dtype() == x.dtype(),
           DTypeError, op, ": x and the parameters must be floating of one dtype, got x ", describe(x), ", fc_weight ",
           describe(w1), ", fc_bias ", describe(b1), ", proj_weight ", describe(w2), ", proj_bias ", describe(b2));
  const int64_t in = x.dim() >= 1 ? x.size(-1) : -1;
  const int64_t hidden = w1.dim() == 2 ? w1.size(0) : -1, out = w2.dim() == 2 ? w2.size(0) : -1;
  NC_CHECK(in >= 0 && w1.dim() == 2 && w1.size(1) == in && b1.shape() == Shape{hidden} && w2.dim() == 2 &&
               w2.size(1) == hidden && b2.shape() == Shape{out},
           ShapeError, op, ": expected x [..., in], fc_weight [hidden, in], fc_bias [hidden], ",
           "proj_weight [out, hidden] and proj_bias [out], got x ", describe(x), ", fc_weight ", describe(w1),
           ", fc_bias ", describe(b1), ", proj_weight ", describe(w2), ", proj_bias ", describe(b2));
  const Shape leading(x.shape().begin(), x.shape().end() - 1);
  const int64_t rows = checked_numel(leading, op);
  if (rows == 0 || in == 0 || hidden == 0 || out == 0)
    return linear(gelu(linear(x, w1, b1), /*approximate=*/true), w2, b2);

  // Recomputing, the products run without the GELU epilogues, which made a GPT-2 step slower
  // on the H200 than plain products with the GELU as passes of its own (docs/PERFORMANCE.md).
  if (recompute_gelu) return gelu_linear_recomputed(op, linear(x, w1, b1), w2, b2);

  using Epilogue = kernels::MatmulKernels::Epilogue;
  const kernels::MatmulKernels& products = kernels::matmul(x.device());
  const Tensor x2 = x.reshape({rows, in});
  Tensor pre = new_tensor({rows, hidden}, x.dtype(), x.device()), h = new_tensor({rows, hidden}, x.dtype(), x.device());
  Tensor y;
  {
    autograd::NoGradGuard no_grad;
    const Tensor b1c = b1.contiguous(), b2c = b2.contiguous();
    if (!products.matmul_epilogue(Epilogue::BiasGelu, h, x2, w1.t(), b1c, pre)) {
      pre = linear(x2, w1, b1c);
      h = gelu(pre, /*approximate=*/true);
    }
    y = linear(h, w2, b2c);
  }
  Shape out_shape = leading;
  out_shape.push_back(out);
  y = y.view(out_shape);
  if (!autograd::needs_grad(x, w1, b1) && !autograd::needs_grad(w2, b2)) return y;
  autograd::record(
      op, y, {x, w1, b1, w2, b2},
      [xs = autograd::saved(x2), w1s = autograd::saved(w1), w2s = autograd::saved(w2), pres = autograd::saved(pre),
       hs = autograd::saved(h), x_shape = x.shape(), rows, hidden, out](const Tensor& grad) {
        const Tensor g = grad.reshape({rows, out}).contiguous();
        const Tensor& pre = pres.get();
        const Tensor& w2 = w2s.get();
        // The GELU's input gradient (and fc's bias gradient) straight from g @ proj_weight.
        Tensor grad_pre = new_tensor({rows, hidden}, g.dtype(), g.device());
        Tensor grad_b1 = new_tensor({hidden}, g.dtype(), g.device());
        if (!kernels::matmul(g.device()).matmul_epilogue(Epilogue::DGelu, grad_pre, g, w2, grad_b1, pre)) {
          kernels::elementwise(g.device()).binary(BinaryOp::GeluTanhGrad, grad_pre, matmul(g, w2), pre);
          grad_b1 = autograd::sum_to(grad_pre, {hidden});
        }
        return std::vector<Tensor>{matmul(grad_pre, w1s.get()).view(x_shape), matmul(grad_pre.t(), xs.get()), grad_b1,
                                   matmul(g.t(), hs.get()), autograd::sum_to(g, {out})};
      });
  return y;
}

}  // namespace normcore
