// Reductions: the reduced dims are moved to the end and the input is seen as a
// contiguous [outer, inner] matrix (a copy only when the layout needs one); the backend
// reduces each row.
#include <cmath>
#include <numeric>

#include "core/internal.h"
#include "normcore/ops.h"

namespace normcore {

using namespace detail;

namespace {

struct ReducePlan {
  Tensor rows;     // contiguous [outer, inner]
  Shape out_shape;  // with or without the kept size-1 dims
};

ReducePlan plan_reduce(const char* op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  check_defined(op, "x", x);
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

Tensor run_reduce(const char* op, ReduceOp kind, const Tensor& x, const std::vector<int64_t>& dims,
                  bool keepdim, DType out_dtype, double arg = 0) {
  ReducePlan plan = plan_reduce(op, x, dims, keepdim);
  Tensor out = new_tensor({plan.rows.size(0)}, out_dtype, x.device());
  if (out.numel() > 0) NC_BACKEND(x.device(), reduce, kind, out, plan.rows, arg);
  return out.view(plan.out_shape);
}

std::pair<Tensor, Tensor> run_arg_reduce(const char* op, bool is_max, const Tensor& x, int64_t dim,
                                         bool keepdim) {
  check_defined(op, "x", x);
  NC_CHECK(x.dtype() != DType::Bool, DTypeError, op, ": bool tensors are not supported (x is ",
           describe(x), ")");
  int64_t d = normalize_dim(dim, x.dim(), op);
  NC_CHECK(x.dim() == 0 || x.size(d) > 0, ShapeError, op, ": cannot reduce dim ", dim,
           " of size 0 (x is ", describe(x), ")");
  ReducePlan plan = plan_reduce(op, x, {dim}, keepdim);
  Tensor values = new_tensor({plan.rows.size(0)}, x.dtype(), x.device());
  Tensor indices = new_tensor({plan.rows.size(0)}, DType::I64, x.device());
  if (values.numel() > 0) NC_BACKEND(x.device(), arg_reduce, is_max, values, indices, plan.rows);
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
  check_defined("sum", "x", x);
  return run_reduce("sum", ReduceOp::Sum, x, dims, keepdim, sum_dtype(x.dtype()));
}

Tensor prod(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  check_defined("prod", "x", x);
  return run_reduce("prod", ReduceOp::Prod, x, dims, keepdim, sum_dtype(x.dtype()));
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  check_defined("mean", "x", x);
  require_floating("mean", x);
  return run_reduce("mean", ReduceOp::Mean, x, dims, keepdim, x.dtype());
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, bool unbiased, bool keepdim) {
  check_defined("var", "x", x);
  require_floating("var", x);
  return run_reduce("var", ReduceOp::Var, x, dims, keepdim, x.dtype(), unbiased ? 1.0 : 0.0);
}

Tensor norm(const Tensor& x, double p, const std::vector<int64_t>& dims, bool keepdim) {
  check_defined("norm", "x", x);
  require_floating("norm", x);
  NC_CHECK(p > 0, ValueError, "norm: p must be positive (or infinity), got ", p);
  return run_reduce("norm", ReduceOp::Norm, x, dims, keepdim, x.dtype(), p);
}

Tensor all(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return run_reduce("all", ReduceOp::All, x, dims, keepdim, DType::Bool);
}

Tensor any(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return run_reduce("any", ReduceOp::Any, x, dims, keepdim, DType::Bool);
}

Tensor max(const Tensor& x) { return reduce_all_extreme("max", ReduceOp::Max, x); }
Tensor min(const Tensor& x) { return reduce_all_extreme("min", ReduceOp::Min, x); }

std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  return run_arg_reduce("max", true, x, dim, keepdim);
}

std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim) {
  return run_arg_reduce("min", false, x, dim, keepdim);
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  return run_arg_reduce("argmax", true, x, dim, keepdim).second;
}

Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) {
  return run_arg_reduce("argmin", false, x, dim, keepdim).second;
}

Tensor argmax(const Tensor& x) {
  check_defined("argmax", "x", x);
  NC_CHECK(x.numel() > 0, ShapeError, "argmax: cannot reduce an empty tensor (x is ", describe(x), ")");
  return run_arg_reduce("argmax", true, x.reshape({x.numel()}), 0, false).second;
}

}  // namespace normcore
