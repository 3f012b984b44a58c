// gemm_group_norm_min_bias (normcore/fused.h): checks every argument, runs the GEMM as a
// recorded matmul, then linear bias + GroupNorm + min + bias as one recorded node whose
// forward and backward kernels are the fused family of kernels/fused.h (the
// linear bias is added as y is read, so y + bias never goes through memory). The node saves
// y, the per-(row, group) mean and rstd and each row's argmin; backward passes the min's
// gradient to the argmin's group only.
#include "normcore/fused.h"

#include "autograd/graph.h"
#include "core/internal.h"
#include "kernels/fused.h"
#include "kernels/norms.h"
#include "normcore/ops.h"

namespace normcore {

using namespace detail;

namespace {

constexpr const char* kOp = "gemm_group_norm_min_bias";

// Undefined, or of shape expected with x's dtype and device.
void check_operand(const char* name, const Tensor& t, const Tensor& x, const Shape& expected, bool required) {
  if (required) check_defined(kOp, name, t);
  if (!t.defined()) return;
  NC_CHECK(t.shape() == expected, ShapeError, kOp, ": ", name, " must have shape ", expected, ", got ", describe(t),
           " (x is ", describe(x), ")");
  NC_CHECK(t.dtype() == x.dtype(), DTypeError, kOp, ": ", name, " is ", describe(t), " but x is ", describe(x),
           " (they must share a dtype)");
  check_same_device(kOp, "x", x, name, t);
}

Tensor contiguous_or_undefined(const Tensor& t) { return t.defined() ? t.contiguous() : t; }

// y [B, OUT] -> [1, OUT, B, 1]: z = group_norm(y + linear_bias) * gn_weight + gn_bias,
// out = min(z, 1) + bias.
Tensor group_norm_min_bias(const Tensor& y, const Tensor& linear_bias, const Tensor& gn_weight, const Tensor& gn_bias,
                           const Tensor& bias, int64_t groups, double eps) {
  const int64_t rows = y.size(0), channels = y.size(1);
  Tensor yc, lb, w, gb, bc;
  {
    autograd::NoGradGuard no_grad;  // the copies are private to this op; its node covers them
    yc = y.contiguous();
    lb = contiguous_or_undefined(linear_bias);
    w = contiguous_or_undefined(gn_weight);
    gb = contiguous_or_undefined(gn_bias);
    bc = bias.contiguous();
  }
  const Device device = y.device();
  Tensor out = new_tensor({1, channels, rows, 1}, y.dtype(), device);
  Tensor mean = new_tensor({rows * groups}, kernels::stats_dtype(device, y.dtype()), device);
  Tensor rstd = new_tensor({rows * groups}, kernels::stats_dtype(device, y.dtype()), device);
  Tensor argmin = new_tensor({rows}, DType::I64, device);
  const kernels::GroupLayout layout = kernels::group_layout(rows, groups, channels, 1);
  if (rows > 0) {
    kernels::fused(device).group_norm_min_bias_forward(yc, lb, w, gb, bc, layout, eps, out, mean, rstd, argmin);
  }
  if (!autograd::needs_grad(y, linear_bias, gn_weight, gn_bias, bias)) return out;
  autograd::record(kOp, out, {y, linear_bias, gn_weight, gn_bias, bias},
                   [ys = autograd::saved(yc), lbs = autograd::saved(lb), ws = autograd::saved(w),
                    has_gn_bias = gb.defined(), mean, rstd, argmin, rows, channels, layout](const Tensor& grad) {
                     const Tensor& y = ys.get();
                     const Tensor& lb = lbs.get();
                     const Tensor& w = ws.get();
                     const DType dtype = y.dtype();
                     const Device device = y.device();
                     Tensor grad_out = grad.to(dtype).contiguous();
                     Tensor grad_y = new_tensor({rows, channels}, dtype, device);
                     Tensor grad_linear_bias = lb.defined() ? new_tensor({channels}, dtype, device) : Tensor();
                     Tensor grad_weight = w.defined() ? new_tensor({channels}, dtype, device) : Tensor();
                     Tensor grad_gn_bias = has_gn_bias ? new_tensor({channels}, dtype, device) : Tensor();
                     Tensor grad_bias = new_tensor({1, channels, 1, 1}, dtype, device);
                     kernels::fused(device).group_norm_min_bias_backward(grad_out, y, lb, w, mean, rstd, argmin, layout,
                                                                         grad_y, grad_linear_bias, grad_weight,
                                                                         grad_gn_bias, grad_bias);
                     return std::vector<Tensor>{grad_y, grad_linear_bias, grad_weight, grad_gn_bias, grad_bias};
                   });
  return out;
}

}  // namespace

Tensor gemm_group_norm_min_bias(const Tensor& x, const Tensor& weight, const Tensor& linear_bias,
                                const Tensor& gn_weight, const Tensor& gn_bias, const Tensor& bias, int64_t num_groups,
                                double eps) {
  const OpScope scope(kOp);
  check_defined(kOp, "x", x);
  NC_CHECK(is_floating(x.dtype()), DTypeError, kOp, ": x must be a floating tensor, got ", describe(x),
           " (convert with .to(DType::F32))");
  NC_CHECK(x.dim() == 2, ShapeError, kOp, ": x must be [B, IN], got ", describe(x));
  check_defined(kOp, "weight", weight);
  NC_CHECK(weight.dim() == 2 && weight.size(1) == x.size(1), ShapeError, kOp, ": weight must be [OUT, ", x.size(1),
           "] (IN from x), got ", describe(weight), " (x is ", describe(x), ")");
  const int64_t channels = weight.size(0);
  check_operand("weight", weight, x, weight.shape(), true);
  NC_CHECK(channels > 0, ShapeError, kOp, ": OUT (weight's first dim) must be positive, got ", describe(weight));
  NC_CHECK(num_groups > 0, ValueError, kOp, ": num_groups must be positive, got ", num_groups);
  NC_CHECK(channels % num_groups == 0, ShapeError, kOp, ": OUT = ", channels, " (from weight ", describe(weight),
           ") must be divisible by num_groups = ", num_groups);
  NC_CHECK(eps > 0, ValueError, kOp, ": eps must be positive, got ", eps);
  // group_norm's rule (F.group_norm's): one value per group in the whole batch is refused.
  NC_CHECK(x.size(0) * (channels / num_groups) != 1, ValueError, kOp,
           ": expected more than 1 value per group, got B = ", x.size(0), " rows of OUT = ", channels, " with ",
           num_groups, " groups");
  check_operand("linear_bias", linear_bias, x, {channels}, false);
  check_operand("gn_weight", gn_weight, x, {channels}, false);
  check_operand("gn_bias", gn_bias, x, {channels}, false);
  check_operand("bias", bias, x, {1, channels, 1, 1}, true);

  return group_norm_min_bias(matmul(x, weight.t()), linear_bias, gn_weight, gn_bias, bias, num_groups, eps);
}

}  // namespace normcore
