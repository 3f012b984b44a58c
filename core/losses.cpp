// Loss functions. cross_entropy and binary_cross_entropy_with_logits are fused: the
// forward runs with recording off and one node holds the closed-form gradient, which is
// both cheaper and exact where a composition would not be (the kink of |x| at x = 0).
// nll_loss, mse_loss and l1_loss compose recorded ops. No loss reads a value on the host:
// class targets are range-checked by check_index_range (on CUDA the error comes at the
// host's next wait), and cross_entropy selects its ignored rows on the device.
#include <optional>

#include "autograd/graph.h"
#include "core/internal.h"
#include "normcore/autocast.h"
#include "normcore/losses.h"
#include "normcore/ops.h"

namespace normcore {

using namespace detail;

namespace {

bool is_half(DType d) { return d == DType::F16 || d == DType::BF16; }
DType compute_dtype(DType d) { return is_half(d) ? DType::F32 : d; }

Tensor reduce(const Tensor& per_element, Reduction reduction) {
  switch (reduction) {
    case Reduction::Mean: return mean(per_element);
    case Reduction::Sum: return sum(per_element);
    case Reduction::None: break;
  }
  return per_element;
}

// The gradient of each reduced element, given the gradient of the reduction's result.
Tensor spread_grad(const Tensor& grad, Reduction reduction, const Shape& shape) {
  if (reduction == Reduction::None) return grad.reshape(shape);
  int64_t n = checked_numel(shape, "backward");
  Tensor g = reduction == Reduction::Mean ? div(grad, static_cast<double>(n)) : grad;
  return g.reshape(Shape(shape.size(), 1)).expand(shape);
}

// Dim order that moves the class dim (1) of an ndim-dim input to the end, and its inverse.
std::vector<int64_t> class_last_order(int64_t ndim) {
  std::vector<int64_t> order{0};
  for (int64_t d = 2; d < ndim; ++d) order.push_back(d);
  order.push_back(1);
  return order;
}
std::vector<int64_t> class_back_order(int64_t ndim) {
  std::vector<int64_t> order{0, ndim - 1};
  for (int64_t d = 1; d < ndim - 1; ++d) order.push_back(d);
  return order;
}

// A class-scored input seen as rows [M, C] with one i64 target per row.
struct ClassRows {
  Tensor rows;       // [M, C]
  Tensor target;     // [M] i64
  Shape loss_shape;  // the per-element loss shape (target's shape)
  int64_t classes = 0;
};

// Checks input ([C], [N, C] or [N, C, d1, ...], floating) against target (i64, input's
// shape without the class dim, values in [0, C) or, when given, ignore_index: checked by
// check_index_range) and lays both out as rows.
ClassRows class_rows(const char* op, const char* input_name, const Tensor& input, const Tensor& target,
                     std::optional<int64_t> ignore_index = std::nullopt) {
  check_defined(op, input_name, input);
  check_defined(op, "target", target);
  check_same_device(op, input_name, input, "target", target);
  NC_CHECK(is_floating(input.dtype()), DTypeError, op, ": ", input_name, " must be floating, got ", describe(input));
  NC_CHECK(target.dtype() == DType::I64, DTypeError, op, ": target must hold i64 class indices, got ",
           describe(target));
  NC_CHECK(input.dim() >= 1, ShapeError, op, ": ", input_name, " must be [C], [N, C] or [N, C, d1, ...], got ",
           describe(input));
  int64_t class_dim = input.dim() == 1 ? 0 : 1;
  Shape expected = input.shape();
  expected.erase(expected.begin() + class_dim);
  NC_CHECK(target.shape() == expected, ShapeError, op, ": target has shape ", target.shape(), " but ", input_name, " ",
           input.shape(), " needs a target of shape ", expected);
  ClassRows out;
  out.classes = input.size(class_dim);
  out.loss_shape = expected;
  int64_t rows = target.numel();
  out.target = target.contiguous().reshape({rows});
  check_index_range(out.target, out.classes, ignore_index, op, "target value", "classes");
  Tensor moved = input.dim() > 2 ? input.permute(class_last_order(input.dim())) : input;
  out.rows = moved.reshape({rows, out.classes});
  return out;
}

// Rows [M, C] back to the layout of an input of shape input_shape (inverse of class_rows).
Tensor from_class_rows(const Tensor& rows, const Shape& input_shape) {
  int64_t ndim = static_cast<int64_t>(input_shape.size());
  if (ndim <= 2) return rows.reshape(input_shape);
  Shape class_last(input_shape);
  class_last.erase(class_last.begin() + 1);
  class_last.push_back(input_shape[1]);
  return rows.reshape(class_last).permute(class_back_order(ndim));
}

// input and target of one shape, both floating, on one device.
void check_elementwise_pair(const char* op, const char* input_name, const Tensor& input, const Tensor& target) {
  check_defined(op, input_name, input);
  check_defined(op, "target", target);
  check_same_device(op, input_name, input, "target", target);
  NC_CHECK(input.shape() == target.shape(), ShapeError, op, ": ", input_name, " has shape ", input.shape(),
           " but target has shape ", target.shape(), " (they must match)");
  NC_CHECK(is_floating(input.dtype()), DTypeError, op, ": ", input_name, " must be floating, got ", describe(input));
  NC_CHECK(is_floating(target.dtype()), DTypeError, op, ": target must be floating, got ", describe(target));
}

}  // namespace

Tensor cross_entropy(const Tensor& logits_arg, const Tensor& target, Reduction reduction, double label_smoothing,
                     int64_t ignore_index) {
  const OpScope op("cross_entropy");
  const Tensor logits = autocast::to_float(logits_arg);
  NC_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, ValueError, op,
           ": label_smoothing must be in [0, 1], got ", label_smoothing);
  Tensor loss, log_probs, rows_target, keep;
  int64_t classes = 0;
  {
    autograd::NoGradGuard no_grad;
    ClassRows cr = class_rows(op, "logits", logits, target, ignore_index);
    classes = cr.classes;
    // Rows whose target is ignore_index contribute nothing, to the loss or to the gradient,
    // whatever their logits hold (a NaN there stays there); class 0 stands in for the target.
    // Every call takes this path: asking whether any row is ignored would be a host read.
    keep = ne(cr.target, Scalar(ignore_index));
    rows_target = where(keep, cr.target, Scalar(int64_t{0}));
    log_probs = log_softmax(cr.rows.to(compute_dtype(logits.dtype())), 1);
    Tensor picked = gather(log_probs, 1, rows_target.unsqueeze(1)).reshape({rows_target.numel()});
    Tensor per_row = mul(picked, -(1.0 - label_smoothing));
    if (label_smoothing > 0 && classes > 0)
      per_row = sub(per_row, mul(sum(log_probs, {1}), label_smoothing / static_cast<double>(classes)));
    // The mean is over the rows that count (NaN when none does, as in PyTorch).
    per_row = where(keep, per_row, Scalar(0.0)).reshape(cr.loss_shape);
    loss = reduction == Reduction::Mean ? div(sum(per_row), sum(keep.to(per_row.dtype()))) : reduce(per_row, reduction);
    loss = loss.to(logits.dtype());
  }
  if (!autograd::needs_grad(logits)) return loss;
  autograd::record(
      op, loss, {logits},
      [lps = autograd::saved(log_probs), ts = autograd::saved(rows_target), ks = autograd::saved(keep), classes,
       reduction, label_smoothing, shape = logits.shape(), dtype = logits.dtype()](const Tensor& grad) {
        // (softmax - q) * g_row, with q = (1 - s) onehot + s / C: subtract s / C everywhere,
        // then 1 - s more at each row's target class; ignored rows get zeros (selected, not
        // multiplied: their logits may hold NaN or infinity).
        const Tensor& lp = lps.get();
        const Tensor& t = ts.get();
        const Tensor& k = ks.get();
        int64_t rows = t.numel();
        Tensor g = grad.to(lp.dtype());
        // Over the kept rows; with none kept the gradient is zero (the loss is NaN).
        if (reduction == Reduction::Mean) g = div(g, maximum(sum(k.to(lp.dtype())), Scalar(1.0)));
        Tensor g_row =
            where(k, spread_grad(g, reduction == Reduction::Mean ? Reduction::Sum : reduction, {rows}), Scalar(0.0))
                .reshape({rows, 1});
        double uniform = classes > 0 ? label_smoothing / static_cast<double>(classes) : 0.0;
        Tensor grad_rows = mul(sub(exp(lp), uniform), g_row);
        grad_rows = scatter_add(grad_rows, 1, t.unsqueeze(1), mul(g_row, -(1.0 - label_smoothing)));
        grad_rows = where(k.unsqueeze(1), grad_rows, Scalar(0.0));
        return std::vector<Tensor>{from_class_rows(grad_rows, shape).to(dtype)};
      });
  return loss;
}

Tensor nll_loss(const Tensor& log_probs_arg, const Tensor& target, Reduction reduction) {
  const OpScope op("nll_loss");
  const Tensor log_probs = autocast::to_float(log_probs_arg);
  ClassRows cr = class_rows(op, "log_probs", log_probs, target);
  Tensor picked = gather(cr.rows, 1, cr.target.unsqueeze(1)).reshape(cr.loss_shape);
  return reduce(neg(picked), reduction);
}

Tensor mse_loss(const Tensor& input_arg, const Tensor& target_arg, Reduction reduction) {
  const OpScope op("mse_loss");
  const Tensor input = autocast::to_float(input_arg), target = autocast::to_float(target_arg);
  check_elementwise_pair(op, "input", input, target);
  Tensor diff = sub(input, target);
  return reduce(mul(diff, diff), reduction);
}

Tensor l1_loss(const Tensor& input_arg, const Tensor& target_arg, Reduction reduction) {
  const OpScope op("l1_loss");
  const Tensor input = autocast::to_float(input_arg), target = autocast::to_float(target_arg);
  check_elementwise_pair(op, "input", input, target);
  return reduce(abs(sub(input, target)), reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& logits_arg, const Tensor& target_arg, Reduction reduction) {
  const OpScope op("binary_cross_entropy_with_logits");
  const Tensor logits = autocast::to_float(logits_arg), target = autocast::to_float(target_arg);
  check_elementwise_pair(op, "logits", logits, target);
  DType out_dtype = promote_types(logits.dtype(), target.dtype());
  Tensor loss, x, t;
  {
    autograd::NoGradGuard no_grad;
    x = logits.to(compute_dtype(out_dtype));
    t = target.to(compute_dtype(out_dtype));
    Tensor softplus_neg_abs = log(add(exp(neg(abs(x))), 1.0));
    Tensor per_element = add(sub(relu(x), mul(x, t)), softplus_neg_abs);
    loss = reduce(per_element, reduction).to(out_dtype);
  }
  if (!autograd::needs_grad(logits, target)) return loss;
  autograd::record(op, loss, {logits, target},
                   [xs = autograd::saved(x), ts = autograd::saved(t), reduction, want_logits = logits.requires_grad(),
                    want_target = target.requires_grad(), logits_dtype = logits.dtype(),
                    target_dtype = target.dtype()](const Tensor& grad) {
                     const Tensor& x = xs.get();
                     Tensor g = spread_grad(grad.to(x.dtype()), reduction, x.shape());
                     Tensor grad_logits = want_logits ? mul(sub(sigmoid(x), ts.get()), g).to(logits_dtype) : Tensor();
                     Tensor grad_target = want_target ? mul(neg(x), g).to(target_dtype) : Tensor();
                     return std::vector<Tensor>{grad_logits, grad_target};
                   });
  return loss;
}

}  // namespace normcore
