// Reductions: the reduced dims are moved to the end and the input is seen as a
// contiguous [outer, inner] matrix (a copy only when the layout needs one); the backend
// reduces each row.
#include <cmath>
#include <numeric>

#include "autograd/graph.h"
#include "core/internal.h"
#include "kernels/reduce.h"
#include "normcore/ops.h"

namespace normcore {

using namespace detail;

namespace {

struct ReducePlan {
  Tensor rows;      // contiguous [outer, inner]
  Shape out_shape;  // with or without the kept size-1 dims
};

ReducePlan plan_reduce(const char* op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  check_defined(op, "x", x);
  autograd::NoGradGuard no_grad;  // the reduction records itself, not its reshuffling
  std::vector<int64_t> reduced = normalize_dims(dims, x.dim(), op);
  std::vector<bool> is_reduced(x.dim(), false);
  for (int64_t d : reduced) is_reduced[d] = true;
  std::vector<int64_t> order;
  Shape out_shape;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (is_reduced[d]) {
      if (keepdim) out_shape.push_back(1);
      inner *= x.size(d);
    } else {
      order.push_back(d);
      out_shape.push_back(x.size(d));
      outer *= x.size(d);
    }
  }
  order.insert(order.end(), reduced.begin(), reduced.end());
  Tensor permuted = x.dim() > 0 ? x.permute(order) : x;
  return ReducePlan{permuted.contiguous().view({outer, inner}), out_shape};
}

DType sum_dtype(DType d) { return is_floating(d) ? d : DType::I64; }

void require_floating(const char* op, const Tensor& x) {
  NC_CHECK(is_floating(x.dtype()), DTypeError, op, ": expects a floating tensor, got ", describe(x),
           " (convert with .to(DType::F32))");
}

// grad of a reduction's result seen with x's shape: reduced dims put back, then broadcast.
Tensor expand_back(const Tensor& grad, const Shape& x_shape, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor g = grad;
  if (!keepdim)
    for (int64_t d : normalize_dims(dims, static_cast<int64_t>(x_shape.size()), "backward")) g = g.unsqueeze(d);
  return g.expand(x_shape);
}

// Number of elements each result element reduces over.
int64_t reduced_count(const Tensor& x, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : normalize_dims(dims, x.dim(), "backward")) n *= x.size(d);
  return n;
}

Tensor run_reduce(const char* op, ReduceOp kind, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim,
                  DType out_dtype, double arg = 0) {
  OpScope scope(op);
  ReducePlan plan = plan_reduce(op, x, dims, keepdim);
  Tensor out = new_tensor({plan.rows.size(0)}, out_dtype, x.device());
  if (out.numel() > 0) kernels::reduce(x.device()).reduce(kind, out, plan.rows, arg);
  return out.view(plan.out_shape);
}

std::pair<Tensor, Tensor> run_arg_reduce(const char* op, bool is_max, const Tensor& x, int64_t dim, bool keepdim) {
  OpScope scope(op);
  check_defined(op, "x", x);
  NC_CHECK(x.dtype() != DType::Bool, DTypeError, op, ": bool tensors are not supported (x is ", describe(x), ")");
  int64_t d = normalize_dim(dim, x.dim(), op);
  NC_CHECK(x.dim() == 0 || x.size(d) > 0, ShapeError, op, ": cannot reduce dim ", dim, " of size 0 (x is ", describe(x),
           ")");
  ReducePlan plan = plan_reduce(op, x, {dim}, keepdim);
  Tensor values = new_tensor({plan.rows.size(0)}, x.dtype(), x.device());
  Tensor indices = new_tensor({plan.rows.size(0)}, DType::I64, x.device());
  if (values.numel() > 0) kernels::reduce(x.device()).arg_reduce(is_max, values, indices, plan.rows);
  return {values.view(plan.out_shape), indices.view(plan.out_shape)};
}

Tensor reduce_all_extreme(const char* op, ReduceOp kind, const Tensor& x) {
  check_defined(op, "x", x);
  NC_CHECK(x.numel() > 0, ShapeError, op, ": cannot reduce an empty tensor (x is ", describe(x),
           "); give a dim to reduce over");
  NC_CHECK(x.dtype() != DType::Bool, DTypeError, op, ": bool tensors are not supported");
  return run_reduce(op, kind, x, {}, false, x.dtype());
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const OpScope op("sum");
  check_defined(op, "x", x);
  Tensor out = run_reduce(op, ReduceOp::Sum, x, dims, keepdim, sum_dtype(x.dtype()));
  autograd::record(op, out, {x}, [shape = x.shape(), dims, keepdim](const Tensor& g) {
    return std::vector<Tensor>{expand_back(g, shape, dims, keepdim)};
  });
  return out;
}

Tensor prod(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const OpScope op("prod");
  check_defined(op, "x", x);
  Tensor out = run_reduce(op, ReduceOp::Prod, x, dims, keepdim, sum_dtype(x.dtype()));
  autograd::record(op, out, {x}, [xs = autograd::saved(x), dims, keepdim](const Tensor& g) {
    // d prod / d x_i is the product of the other elements: out / x_i without zeros; with
    // exactly one zero, the product of the non-zero elements at that zero; else 0.
    const Tensor& x = xs.get();
    Tensor is_zero = eq(x, 0);
    Tensor nonzero = where(is_zero, 1, x);
    Tensor prod_nonzero = expand_back(prod(nonzero, dims, keepdim), x.shape(), dims, keepdim);
    Tensor zero_count = expand_back(sum(is_zero, dims, keepdim), x.shape(), dims, keepdim);
    Tensor gx = expand_back(g, x.shape(), dims, keepdim);
    Tensor no_zero = div(mul(gx, prod_nonzero), nonzero);
    Tensor one_zero = where(is_zero, mul(gx, prod_nonzero), 0);
    return std::vector<Tensor>{where(eq(zero_count, 0), no_zero, where(eq(zero_count, 1), one_zero, 0))};
  });
  return out;
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const OpScope op("mean");
  check_defined(op, "x", x);
  require_floating(op, x);
  Tensor out = run_reduce(op, ReduceOp::Mean, x, dims, keepdim, x.dtype());
  autograd::record(op, out, {x}, [shape = x.shape(), dims, keepdim, n = reduced_count(x, dims)](const Tensor& g) {
    return std::vector<Tensor>{div(expand_back(g, shape, dims, keepdim), static_cast<double>(n))};
  });
  return out;
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, bool unbiased, bool keepdim) {
  const OpScope op("var");
  check_defined(op, "x", x);
  require_floating(op, x);
  Tensor out = run_reduce(op, ReduceOp::Var, x, dims, keepdim, x.dtype(), unbiased ? 1.0 : 0.0);
  double denom = static_cast<double>(reduced_count(x, dims)) - (unbiased ? 1.0 : 0.0);
  autograd::record(op, out, {x}, [xs = autograd::saved(x), dims, keepdim, denom](const Tensor& g) {
    const Tensor& x = xs.get();
    Tensor centered = sub(x, mean(x, dims, /*keepdim=*/true));
    return std::vector<Tensor>{mul(expand_back(g, x.shape(), dims, keepdim), mul(centered, 2.0 / denom))};
  });
  return out;
}

Tensor norm(const Tensor& x, double p, const std::vector<int64_t>& dims, bool keepdim) {
  const OpScope op("norm");
  check_defined(op, "x", x);
  require_floating(op, x);
  NC_CHECK(p > 0, ValueError, op, ": p must be positive (or infinity), got ", p);
  if (std::isinf(p)) {
    // The largest magnitude of nothing has no value (as in PyTorch; sums have 0).
    for (int64_t d : normalize_dims(dims, x.dim(), op)) {
      NC_CHECK(x.size(d) > 0, ShapeError, op, ": the infinity norm over dim ", d, " of size 0 has no value (x is ",
               describe(x), ")");
    }
  }
  Tensor out = run_reduce(op, ReduceOp::Norm, x, dims, keepdim, x.dtype(), p);
  autograd::record(op, out, {x},
                   [xs = autograd::saved(x), ys = autograd::saved(out), p, dims, keepdim](const Tensor& g) {
                     const Tensor& x = xs.get();
                     const Shape& shape = x.shape();
                     Tensor gx = expand_back(g, shape, dims, keepdim);
                     Tensor y = expand_back(ys.get(), shape, dims, keepdim);
                     if (p == 1) return std::vector<Tensor>{mul(gx, sign(x))};
                     if (std::isinf(p)) {
                       // The gradient is shared by the elements whose magnitude is the maximum.
                       Tensor at_max = eq(abs(x), y);
                       Tensor count = expand_back(sum(at_max, dims, keepdim), shape, dims, keepdim);
                       return std::vector<Tensor>{where(at_max, div(mul(gx, sign(x)), count), 0)};
                     }
                     // d ||x||_p / d x_i = sign(x_i) |x_i|^(p-1) / ||x||^(p-1); 0 where the norm is 0, and
                     // (as in PyTorch) 0 at zero elements, where |x_i|^(p-1) is infinite for p < 1.
                     Tensor scale = p == 2 ? div(gx, y) : div(gx, pow(y, p - 1));
                     Tensor term = p == 2 ? x : where(eq(x, 0), 0, mul(sign(x), pow(abs(x), p - 1)));
                     return std::vector<Tensor>{where(eq(y, 0), 0, mul(term, scale))};
                   });
  return out;
}

Tensor all(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return run_reduce("all", ReduceOp::All, x, dims, keepdim, DType::Bool);
}

Tensor any(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return run_reduce("any", ReduceOp::Any, x, dims, keepdim, DType::Bool);
}

namespace {

// Gradient of max/min over all elements: shared equally by the elements equal to it (by
// the NaNs when the result is NaN, as in PyTorch).
Tensor extreme_all(const char* op, ReduceOp kind, const Tensor& x) {
  Tensor out = reduce_all_extreme(op, kind, x);
  autograd::record(op, out, {x}, [xs = autograd::saved(x), ys = autograd::saved(out)](const Tensor& g) {
    const Tensor& x = xs.get();
    const Tensor& y = ys.get();
    Tensor hit = where(ne(y, y), ne(x, x), eq(x, y));
    return std::vector<Tensor>{where(hit, div(g, sum(hit)), 0)};
  });
  return out;
}

// Gradient of max/min along dim: goes to the index that was selected.
std::pair<Tensor, Tensor> extreme_dim(const char* op, bool is_max, const Tensor& x, int64_t dim, bool keepdim) {
  auto result = run_arg_reduce(op, is_max, x, dim, keepdim);
  autograd::record(op, result.first, {x},
                   [shape = x.shape(), dtype = x.dtype(), device = x.device(), indices = autograd::saved(result.second),
                    dim, keepdim](const Tensor& g) {
                     if (shape.empty()) return std::vector<Tensor>{g};
                     const Tensor& idx = indices.get();
                     Tensor gk = keepdim ? g : g.unsqueeze(dim);
                     Tensor ik = keepdim ? idx : idx.unsqueeze(dim);
                     return std::vector<Tensor>{scatter_add(zeros(shape, TensorOptions(dtype, device)), dim, ik, gk)};
                   });
  return result;
}

}  // namespace

Tensor max(const Tensor& x) { return extreme_all("max", ReduceOp::Max, x); }
Tensor min(const Tensor& x) { return extreme_all("min", ReduceOp::Min, x); }

std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_dim("max", true, x, dim, keepdim);
}

std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_dim("min", false, x, dim, keepdim);
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  return run_arg_reduce("argmax", true, x, dim, keepdim).second;
}

Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) {
  return run_arg_reduce("argmin", false, x, dim, keepdim).second;
}

Tensor argmax(const Tensor& x) {
  const OpScope op("argmax");
  check_defined(op, "x", x);
  NC_CHECK(x.numel() > 0, ShapeError, op, ": cannot reduce an empty tensor (x is ", describe(x), ")");
  return run_arg_reduce(op, true, x.reshape({x.numel()}), 0, false).second;
}

}  // namespace normcore
