// The normalization ops of normcore/norms.h. Each public function checks its arguments,
// runs the forward kernel of its device (kernels/norms.h) and
// records one node whose backward is the matching backward kernel, fed the statistics the
// forward saved (not recomputed). batch_norm's kernel also updates the running statistics
// in place, unrecorded, bumping their version counters.
#include "normcore/norms.h"

#include "autograd/graph.h"
#include "core/internal.h"
#include "kernels/fused.h"
#include "kernels/norms.h"
#include "normcore/autocast.h"
#include "normcore/ops.h"

namespace normcore {

using namespace detail;

namespace {

// Statistics tensors in the backend's accumulation dtype, on x's device.
Tensor stats_like(const Shape& shape, const Tensor& x) {
  return new_tensor(shape, kernels::stats_dtype(x.device(), x.dtype()), x.device());
}

void check_input(const char* op, const Tensor& x, double eps) {
  check_defined(op, "x", x);
  NC_CHECK(is_floating(x.dtype()), DTypeError, op, ": x must be a floating tensor, got ", describe(x),
           " (convert with .to(DType::F32))");
  NC_CHECK(eps > 0, ValueError, op, ": eps must be positive, got ", eps);
}

// weight or bias: undefined, or shape expected, x's dtype and device.
void check_param(const char* op, const char* name, const Tensor& param, const Tensor& x, const Shape& expected) {
  if (!param.defined()) return;
  NC_CHECK(param.shape() == expected, ShapeError, op, ": ", name, " must have shape ", expected, ", got ",
           describe(param), " (x is ", describe(x), ")");
  NC_CHECK(param.dtype() == x.dtype(), DTypeError, op, ": ", name, " is ", describe(param), " but x is ", describe(x),
           " (they must share a dtype)");
  check_same_device(op, "x", x, name, param);
}

// The gradient as a contiguous tensor of x's dtype.
Tensor grad_like(const Tensor& grad, const Tensor& x) { return grad.to(x.dtype()).contiguous(); }

Tensor new_like(const Tensor& x) { return new_tensor(x.shape(), x.dtype(), x.device()); }

// A running statistic that batch_norm's kernel updated as `written` (the statistic itself
// when contiguous, else a contiguous copy): an in-place write either way, so its version
// moves, and the copy goes back.
void finish_running_update(Tensor running, const Tensor& written) {
  if (!running.defined()) return;
  autograd::NoGradGuard no_grad;
  if (running.is_contiguous()) running.bump_version();
  else running.copy_(written);
}

}  // namespace

// x as [rows, row_len] rows of the trailing normalized_shape dims (layer_norm, rms_norm).
struct Rows {
  int64_t rows, row_len;
};

Rows check_normalized_shape(const char* op, const Tensor& x, const std::vector<int64_t>& normalized_shape) {
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  NC_CHECK(k >= 1, ShapeError, op, ": normalized_shape must have at least one dim, got [] (x is ", describe(x), ")");
  bool trailing = k <= x.dim();
  for (int64_t i = 0; trailing && i < k; ++i) trailing = x.size(x.dim() - k + i) == normalized_shape[i];
  NC_CHECK(trailing, ShapeError, op, ": normalized_shape ", normalized_shape, " must match the trailing dims of x ",
           describe(x));
  const int64_t row_len = checked_numel(normalized_shape, op);
  const int64_t rows =
      row_len > 0 ? x.numel() / row_len : checked_numel(Shape(x.shape().begin(), x.shape().end() - k), op);
  return {rows, row_len};
}

Tensor layer_norm(const Tensor& x_arg, const std::vector<int64_t>& normalized_shape, const Tensor& weight_arg,
                  const Tensor& bias_arg, double eps) {
  const OpScope op("layer_norm");
  const Tensor x = autocast::to_float(x_arg), weight = autocast::to_float(weight_arg);
  const Tensor bias = autocast::to_float(bias_arg);
  check_input(op, x, eps);
  const Rows layout = check_normalized_shape(op, x, normalized_shape);
  const int64_t rows = layout.rows, row_len = layout.row_len;
  check_param(op, "weight", weight, x, normalized_shape);
  check_param(op, "bias", bias, x, normalized_shape);

  Tensor xc, w, b;
  {
    autograd::NoGradGuard no_grad;  // the copies are private to this op; its node covers them
    xc = x.contiguous();
    w = weight.defined() ? weight.contiguous() : weight;
    b = bias.defined() ? bias.contiguous() : bias;
  }
  Tensor out = new_like(x), mean = stats_like({rows}, x), rstd = stats_like({rows}, x);
  kernels::norms(x.device()).layer_norm_forward(xc, w, b, rows, row_len, eps, out, mean, rstd);
  if (!autograd::needs_grad(x, weight, bias)) return out;
  autograd::record(op, out, {x, weight, bias},
                   [xs = autograd::saved(xc), ws = autograd::saved(w), has_bias = b.defined(), mean, rstd, rows,
                    row_len, normalized_shape](const Tensor& grad) {
                     const Tensor& x = xs.get();
                     const Tensor& w = ws.get();
                     Tensor grad_x = new_like(x);
                     Tensor grad_weight = w.defined() ? new_like(w) : Tensor();
                     Tensor grad_bias = has_bias ? new_tensor(normalized_shape, x.dtype(), x.device()) : Tensor();
                     kernels::norms(x.device())
                         .layer_norm_backward(grad_like(grad, x), x, w, mean, rstd, rows, row_len, grad_x, grad_weight,
                                              grad_bias);
                     return std::vector<Tensor>{grad_x, grad_weight, grad_bias};
                   });
  return out;
}

std::pair<Tensor, Tensor> add_layer_norm(const Tensor& x_arg, const Tensor& y_arg, const Tensor& weight_arg,
                                         const Tensor& bias_arg, double eps) {
  const OpScope op("add_layer_norm");
  check_defined(op, "x", x_arg);
  check_defined(op, "y", y_arg);
  check_same_device(op, "x", x_arg, "y", y_arg);
  NC_CHECK(is_floating(x_arg.dtype()) && is_floating(y_arg.dtype()), DTypeError, op,
           ": x and y must be floating tensors, got x ", describe(x_arg), " and y ", describe(y_arg));
  NC_CHECK(x_arg.shape() == y_arg.shape() && x_arg.dim() >= 1, ShapeError, op,
           ": x and y must have one shape of at least one dim, got x ", describe(x_arg), " and y ", describe(y_arg));
  check_input(op, x_arg, eps);
  const DType stream = promote_types(x_arg.dtype(), y_arg.dtype());
  const Tensor x = x_arg.to(stream);
  const int64_t cols = x.size(-1);
  const Tensor weight = weight_arg.defined() ? weight_arg.to(stream) : weight_arg;
  const Tensor bias = bias_arg.defined() ? bias_arg.to(stream) : bias_arg;
  check_param(op, "weight", weight, x, {cols});
  check_param(op, "bias", bias, x, {cols});
  NC_CHECK(weight.defined(), ValueError, op, ": weight must be defined (use add and layer_norm without one)");
  const int64_t rows = cols > 0 ? x.numel() / cols : 0;
  const DType out_dtype = autocast::is_enabled() ? autocast::dtype() : stream;

  Tensor sum = new_like(x), out = new_tensor(x.shape(), out_dtype, x.device());
  Tensor mean = stats_like({rows}, x), rstd = stats_like({rows}, x);
  Tensor w, b;
  {
    autograd::NoGradGuard no_grad;
    w = weight.contiguous();
    b = bias.defined() ? bias.contiguous() : bias;
    const Tensor xc = x.contiguous(), yc = y_arg.contiguous();
    const bool fused =
        rows > 0 && cols > 0 &&
        kernels::fused(x.device()).add_layer_norm_forward(xc, yc, w, b, rows, cols, eps, sum, out, mean, rstd);
    if (!fused) {
      sum = add(xc, yc.to(stream)).contiguous();
      Tensor normed = out_dtype == stream ? out : new_like(sum);
      if (rows > 0 && cols > 0)
        kernels::norms(x.device()).layer_norm_forward(sum, w, b, rows, cols, eps, normed, mean, rstd);
      if (out_dtype != stream) out = normed.to(out_dtype);
    }
  }
  // Two nodes, as add then layer_norm: sum's gradient (from out's node and from sum's other
  // uses) goes to x and y in their dtypes.
  if (autograd::needs_grad(x_arg, y_arg))
    autograd::record(op, sum, {x_arg, y_arg}, [x_dtype = x_arg.dtype(), y_dtype = y_arg.dtype()](const Tensor& grad) {
      return std::vector<Tensor>{grad.to(x_dtype), grad.to(y_dtype)};
    });
  if (autograd::needs_grad(sum, weight, bias))
    autograd::record(op, out, {sum, weight, bias},
                     [sums = autograd::saved(sum), ws = autograd::saved(w), has_bias = b.defined(), mean, rstd, rows,
                      cols](const Tensor& grad) {
                       const Tensor& s = sums.get();
                       const Tensor& w = ws.get();
                       Tensor grad_x = new_like(s), grad_weight = new_like(w);
                       Tensor grad_bias = has_bias ? new_like(w) : Tensor();
                       kernels::norms(s.device())
                           .layer_norm_backward(grad_like(grad, s), s, w, mean, rstd, rows, cols, grad_x, grad_weight,
                                                grad_bias);
                       return std::vector<Tensor>{grad_x, grad_weight, grad_bias};
                     });
  return {sum, out};
}

Tensor rms_norm(const Tensor& x_arg, const std::vector<int64_t>& normalized_shape, const Tensor& weight_arg,
                double eps) {
  const OpScope op("rms_norm");
  const Tensor x = autocast::to_float(x_arg), weight = autocast::to_float(weight_arg);
  check_input(op, x, eps);
  const Rows layout = check_normalized_shape(op, x, normalized_shape);
  const int64_t rows = layout.rows, row_len = layout.row_len;
  check_param(op, "weight", weight, x, normalized_shape);

  Tensor xc, w;
  {
    autograd::NoGradGuard no_grad;  // the copies are private to this op; its node covers them
    xc = x.contiguous();
    w = weight.defined() ? weight.contiguous() : weight;
  }
  Tensor out = new_like(x), rstd = stats_like({rows}, x);
  kernels::norms(x.device()).rms_norm_forward(xc, w, rows, row_len, eps, out, rstd);
  if (!autograd::needs_grad(x, weight)) return out;
  autograd::record(op, out, {x, weight},
                   [xs = autograd::saved(xc), ws = autograd::saved(w), rstd, rows, row_len](const Tensor& grad) {
                     const Tensor& x = xs.get();
                     const Tensor& w = ws.get();
                     Tensor grad_x = new_like(x);
                     Tensor grad_weight = w.defined() ? new_like(w) : Tensor();
                     kernels::norms(x.device())
                         .rms_norm_backward(grad_like(grad, x), x, w, rstd, rows, row_len, grad_x, grad_weight);
                     return std::vector<Tensor>{grad_x, grad_weight};
                   });
  return out;
}

Tensor group_norm(const Tensor& x_arg, int64_t num_groups, const Tensor& weight_arg, const Tensor& bias_arg,
                  double eps) {
  const OpScope op("group_norm");
  const Tensor x = autocast::to_float(x_arg), weight = autocast::to_float(weight_arg);
  const Tensor bias = autocast::to_float(bias_arg);
  check_input(op, x, eps);
  NC_CHECK(x.dim() >= 2, ShapeError, op, ": x must be [N, C, *] (at least 2-D), got ", describe(x));
  NC_CHECK(num_groups > 0, ValueError, op, ": num_groups must be positive, got ", num_groups);
  const int64_t batch = x.size(0), channels = x.size(1);
  NC_CHECK(channels % num_groups == 0, ShapeError, op, ": the channel count C = ", channels,
           " must be divisible by num_groups = ", num_groups, " (x is ", describe(x), ")");
  check_param(op, "weight", weight, x, {channels});
  check_param(op, "bias", bias, x, {channels});

  const int64_t spatial = checked_numel(Shape(x.shape().begin() + 2, x.shape().end()), op);
  // PyTorch's rule (F.group_norm): refused when the whole batch holds one value per group,
  // which normalizes to 0 whatever it is.
  NC_CHECK(batch * (channels / num_groups) * spatial != 1, ValueError, op,
           ": expected more than 1 value per group, got x ", describe(x), " with ", num_groups, " groups");
  Tensor xc, w, b;
  {
    autograd::NoGradGuard no_grad;  // the copies are private to this op; its node covers them
    xc = x.contiguous();
    w = weight.defined() ? weight.contiguous() : weight;
    b = bias.defined() ? bias.contiguous() : bias;
  }
  Tensor out = new_like(x), mean = stats_like({batch * num_groups}, x), rstd = stats_like({batch * num_groups}, x);
  const kernels::GroupLayout layout = kernels::group_layout(batch, num_groups, channels, spatial);
  kernels::norms(x.device()).group_norm_forward(xc, w, b, layout, eps, out, mean, rstd);
  if (!autograd::needs_grad(x, weight, bias)) return out;
  autograd::record(op, out, {x, weight, bias},
                   [xs = autograd::saved(xc), ws = autograd::saved(w), has_bias = b.defined(), mean, rstd,
                    layout](const Tensor& grad) {
                     const Tensor& x = xs.get();
                     const Tensor& w = ws.get();
                     Tensor grad_x = new_like(x);
                     Tensor grad_weight = w.defined() ? new_like(w) : Tensor();
                     Tensor grad_bias = has_bias ? new_tensor({layout.channels()}, x.dtype(), x.device()) : Tensor();
                     kernels::norms(x.device())
                         .group_norm_backward(grad_like(grad, x), x, w, mean, rstd, layout, grad_x, grad_weight,
                                              grad_bias);
                     return std::vector<Tensor>{grad_x, grad_weight, grad_bias};
                   });
  return out;
}

Tensor batch_norm(const Tensor& x_arg, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight_arg,
                  const Tensor& bias_arg, bool training, double momentum, double eps) {
  const OpScope op("batch_norm");
  // The running statistics are updated in place: autocast leaves them as they are.
  const Tensor x = autocast::to_float(x_arg), weight = autocast::to_float(weight_arg);
  const Tensor bias = autocast::to_float(bias_arg);
  check_input(op, x, eps);
  NC_CHECK(x.dim() >= 2, ShapeError, op, ": x must be [N, C, *] (at least 2-D), got ", describe(x));
  const int64_t batch = x.size(0), channels = x.size(1);
  check_param(op, "weight", weight, x, {channels});
  check_param(op, "bias", bias, x, {channels});
  check_param(op, "running_mean", running_mean, x, {channels});
  check_param(op, "running_var", running_var, x, {channels});
  NC_CHECK(training || running_mean.defined(), ValueError, op,
           ": running_mean is undefined, but evaluation (training = false) normalizes with it (x is ", describe(x),
           ")");
  NC_CHECK(training || running_var.defined(), ValueError, op,
           ": running_var is undefined, but evaluation (training = false) normalizes with it (x is ", describe(x), ")");
  const int64_t spatial = checked_numel(Shape(x.shape().begin() + 2, x.shape().end()), op);
  const int64_t count = batch * spatial;  // values per channel
  NC_CHECK(!training || count != 1, ValueError, op, ": expected more than 1 value per channel when training, got x ",
           describe(x));

  // Training on an empty batch leaves the running statistics alone, as PyTorch does.
  const bool update = training && count > 0;
  Tensor xc, w, b, rm, rv;
  {
    autograd::NoGradGuard no_grad;  // the copies are private to this op; its node covers them
    xc = x.contiguous();
    w = weight.defined() ? weight.contiguous() : weight;
    b = bias.defined() ? bias.contiguous() : bias;
    if (update || !training) {
      // Written through a contiguous copy when they are not contiguous, then copied back.
      rm = running_mean.defined() ? running_mean.contiguous() : running_mean;
      rv = running_var.defined() ? running_var.contiguous() : running_var;
    }
  }
  Tensor out = new_like(x), mean = stats_like({channels}, x), rstd = stats_like({channels}, x);
  const kernels::BatchLayout layout{batch, channels, spatial};
  kernels::norms(x.device()).batch_norm_forward(xc, w, b, rm, rv, layout, {training, momentum, eps}, out, mean, rstd);
  if (update) {
    finish_running_update(running_mean, rm);
    finish_running_update(running_var, rv);
  }
  if (!autograd::needs_grad(x, weight, bias)) return out;
  autograd::record(op, out, {x, weight, bias},
                   [xs = autograd::saved(xc), ws = autograd::saved(w), has_bias = b.defined(), mean, rstd, layout,
                    training](const Tensor& grad) {
                     const Tensor& x = xs.get();
                     const Tensor& w = ws.get();
                     Tensor grad_x = new_like(x);
                     Tensor grad_weight = w.defined() ? new_like(w) : Tensor();
                     Tensor grad_bias = has_bias ? new_tensor({layout.channels}, x.dtype(), x.device()) : Tensor();
                     kernels::norms(x.device())
                         .batch_norm_backward(grad_like(grad, x), x, w, mean, rstd, layout, training, grad_x,
                                              grad_weight, grad_bias);
                     return std::vector<Tensor>{grad_x, grad_weight, grad_bias};
                   });
  return out;
}

Tensor l1_norm(const Tensor& x_arg, int64_t dim, double eps) {
  const OpScope op("l1_norm");
  const Tensor x = autocast::to_float(x_arg);
  check_input(op, x, eps);
  // A 0-dim tensor is one row of length 1, as for the reductions.
  const int64_t d = normalize_dim(dim, x.dim(), op);
  const Shape& shape = x.dim() == 0 ? Shape{1} : x.shape();
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= shape[i];
  for (size_t i = static_cast<size_t>(d) + 1; i < shape.size(); ++i) inner *= shape[i];
  Tensor xc = x.contiguous().detach();
  Tensor out = new_like(x), norm = stats_like({outer, inner}, x);
  const kernels::DimLayout layout{outer, shape[d], inner};
  kernels::norms(x.device()).l1_norm_forward(xc, layout, eps, out, norm);
  if (!autograd::needs_grad(x)) return out;
  autograd::record(op, out, {x}, [xs = autograd::saved(xc), norm, layout, eps](const Tensor& grad) {
    const Tensor& x = xs.get();
    Tensor grad_x = new_like(x);
    kernels::norms(x.device()).l1_norm_backward(grad_like(grad, x), x, norm, layout, eps, grad_x);
    return std::vector<Tensor>{grad_x};
  });
  return out;
}

Tensor frobenius_norm(const Tensor& x_arg, double eps) {
  const OpScope op("frobenius_norm");
  const Tensor x = autocast::to_float(x_arg);
  check_input(op, x, eps);
  Tensor xc = x.contiguous().detach();
  Tensor out = new_like(x), norm = stats_like({}, x);
  kernels::norms(x.device()).frobenius_norm_forward(xc, eps, out, norm);
  if (!autograd::needs_grad(x)) return out;
  autograd::record(op, out, {x}, [xs = autograd::saved(xc), norm, eps](const Tensor& grad) {
    const Tensor& x = xs.get();
    Tensor grad_x = new_like(x);
    kernels::norms(x.device()).frobenius_norm_backward(grad_like(grad, x), x, norm, eps, grad_x);
    return std::vector<Tensor>{grad_x};
  });
  return out;
}

}  // namespace normcore
