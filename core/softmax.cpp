// softmax and log_softmax along one dim, each one recorded node. The forward composes
// ops with recording off (max, subtract, exp, sum); the backward is the closed form:
//   softmax:     grad_x = y * (grad - sum(grad * y, dim))
//   log_softmax: grad_x = grad - exp(y) * sum(grad, dim)
// f16/bf16 inputs are computed in f32 and rounded once at the end, forward and backward.
#include "autograd/graph.h"
#include "core/internal.h"
#include "kernels/fused.h"
#include "normcore/autocast.h"
#include "normcore/ops.h"

namespace normcore {

using namespace detail;

namespace {

bool is_half(DType d) { return d == DType::F16 || d == DType::BF16; }

// The dtype the arithmetic runs in for a tensor of dtype d.
DType compute_dtype(DType d) { return is_half(d) ? DType::F32 : d; }

// softmax or log_softmax of x (valid, at least 1-D, non-empty) along dim d, no recording.
Tensor normalized_exp(const Tensor& x, int64_t d, bool take_log) {
  Tensor shifted = sub(x, max(x, d, /*keepdim=*/true).first);
  Tensor exps = exp(shifted);
  Tensor total = sum(exps, {d}, /*keepdim=*/true);
  return take_log ? sub(shifted, log(total)) : div(exps, total);
}

Tensor softmax_op(const char* op, const Tensor& x_arg, int64_t dim, bool take_log) {
  OpScope scope(op);
  const Tensor x = autocast::to_float(x_arg);
  check_defined(op, "x", x);
  NC_CHECK(is_floating(x.dtype()), DTypeError, op, ": expects a floating tensor, got ", describe(x),
           " (convert with .to(DType::F32))");
  // A 0-dim tensor is one row of length 1 (dim must be 0 or -1, as for any 0-dim op).
  int64_t d = normalize_dim(dim, x.dim(), op);
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    Tensor rows = x.dim() == 0 ? x.reshape({1}) : x;
    // Along the last dim of a contiguous tensor: the back end's kernel of rows, where it has one.
    if (rows.numel() > 0 && d == rows.dim() - 1 && rows.is_contiguous()) {
      const int64_t cols = rows.size(-1);
      Tensor y = empty(rows.shape(), TensorOptions(rows.dtype(), rows.device()));
      if (kernels::fused(rows.device()).softmax_rows(rows, rows.numel() / cols, cols, take_log, y))
        out = y.reshape(x.shape());
    }
    if (!out.defined()) {
      Tensor work = rows.to(compute_dtype(x.dtype()));
      Tensor y = work.numel() == 0 ? empty(work.shape(), TensorOptions(work.dtype(), work.device()))
                                   : normalized_exp(work, d, take_log);
      out = y.to(x.dtype()).reshape(x.shape());
    }
  }
  if (!autograd::needs_grad(x)) return out;
  autograd::record(op, out, {x}, [ys = autograd::saved(out), d, take_log](const Tensor& grad) {
    DType dtype = compute_dtype(grad.dtype());
    Tensor g = grad.dim() == 0 ? grad.reshape({1}).to(dtype) : grad.to(dtype);
    const Tensor& out = ys.get();
    Tensor y = out.dim() == 0 ? out.reshape({1}).to(dtype) : out.to(dtype);
    Tensor grad_x = take_log ? sub(g, mul(exp(y), sum(g, {d}, /*keepdim=*/true)))
                             : mul(y, sub(g, sum(mul(g, y), {d}, /*keepdim=*/true)));
    return std::vector<Tensor>{grad_x.to(grad.dtype()).reshape(grad.shape())};
  });
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_op("softmax", x, dim, false); }

Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_op("log_softmax", x, dim, true); }

}  // namespace normcore
