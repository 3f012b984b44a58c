// Element-wise ops: checks, broadcasting, dtype promotion, then the backend's unary,
// binary and where kernels. Scalars become 0-dim tensors in the result dtype.
#include <cmath>

#include "autograd/graph.h"
#include "core/internal.h"
#include "kernels/elementwise.h"
#include "normcore/ops.h"

namespace normcore {

using namespace detail;

namespace {

enum Category { kBoolCategory = 0, kIntCategory = 1, kFloatCategory = 2 };

Category category(DType d) {
  if (d == DType::Bool) return kBoolCategory;
  return is_floating(d) ? kFloatCategory : kIntCategory;
}

// What a backward needs of its forward: the input(s), the result, both or neither. Only
// that is saved, so an in-place write to anything else after the forward is no error.
enum Needs : unsigned { kNothing = 0, kInput = 1, kOutput = 2, kInputAndOutput = 3 };

// Gradient of a unary op: x and out are the (detached) input and result (undefined unless
// the op needs them), a and b its scalar arguments.
using UnaryGrad = Tensor (*)(const Tensor& grad, const Tensor& x, const Tensor& out, double a, double b);

Tensor unary_op(const char* name, UnaryOp op, const Tensor& x, bool float_only, Needs needs, UnaryGrad grad_fn,
                double a = 0, double b = 0) {
  OpScope scope(name);
  check_defined(name, "x", x);
  Tensor out;
  Tensor input = x;
  {
    autograd::NoGradGuard no_grad;
    if (float_only && !is_floating(x.dtype())) input = x.to(DType::F32);
    NC_CHECK(input.dtype() != DType::Bool, DTypeError, name, ": bool tensors are not supported (x is ", describe(x),
             ")");
    out = new_tensor(input.shape(), input.dtype(), input.device());
    if (out.numel() > 0) kernels::elementwise(out.device()).unary(op, out, input, a, b);
  }
  if (grad_fn && autograd::needs_grad(x)) {
    autograd::record(name, out, {x},
                     [grad_fn, xs = autograd::saved(needs & kInput ? x : Tensor()),
                      ys = autograd::saved(needs & kOutput ? out : Tensor()), a,
                      b](const Tensor& g) { return std::vector<Tensor>{grad_fn(g, xs.get(), ys.get(), a, b)}; });
  }
  return out;
}

bool is_comparison(BinaryOp op) {
  return op == BinaryOp::Eq || op == BinaryOp::Ne || op == BinaryOp::Lt || op == BinaryOp::Le || op == BinaryOp::Gt ||
         op == BinaryOp::Ge;
}

// Gradients of a binary op for its operands a and b (in the computing dtype, not yet
// broadcast) given the result's gradient and the result.
using BinaryGrad = std::pair<Tensor, Tensor> (*)(const Tensor& grad, const Tensor& a, const Tensor& b,
                                                 const Tensor& out);

// grad reduced to an operand's shape and dtype.
Tensor grad_for(const Tensor& grad, const Shape& shape, DType dtype) {
  if (!grad.defined()) return grad;
  return autograd::sum_to(grad, shape).to(dtype);
}

Tensor binary_op(const char* name, BinaryOp op, const Tensor& a, const Tensor& b, Needs needs = kNothing,
                 BinaryGrad grad_fn = nullptr) {
  OpScope scope(name);
  check_defined(name, "a", a);
  check_defined(name, "b", b);
  check_same_device(name, "a", a, "b", b);
  Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  DType compute = result_type(a, b);
  if (op == BinaryOp::Div && !is_floating(compute)) compute = DType::F32;
  NC_CHECK(!(compute == DType::Bool && op == BinaryOp::Pow), DTypeError, name,
           ": not supported for bool tensors (a is ", describe(a), ", b is ", describe(b), ")");
  NC_CHECK(!(op == BinaryOp::Sub && (a.dtype() == DType::Bool || b.dtype() == DType::Bool)), DTypeError, name,
           ": subtraction with a bool tensor is not supported (a is ", describe(a), ", b is ", describe(b),
           "); to invert a mask use eq(mask, false)");
  Tensor out = new_tensor(shape, is_comparison(op) ? DType::Bool : compute, a.device());
  Tensor ca, cb;
  {
    autograd::NoGradGuard no_grad;
    ca = a.to(compute);
    cb = b.to(compute);
    if (out.numel() > 0) kernels::elementwise(out.device()).binary(op, out, ca.expand(shape), cb.expand(shape));
  }
  if (grad_fn && autograd::needs_grad(a, b)) {
    autograd::record(
        name, out, {a, b},
        [grad_fn, shape_a = a.shape(), dtype_a = a.dtype(), shape_b = b.shape(), dtype_b = b.dtype(),
         sa = autograd::saved(needs & kInput ? ca : Tensor()), sb = autograd::saved(needs & kInput ? cb : Tensor()),
         ys = autograd::saved(needs & kOutput ? out : Tensor())](const Tensor& g) {
          auto grads = grad_fn(g, sa.get(), sb.get(), ys.get());
          return std::vector<Tensor>{grad_for(grads.first, shape_a, dtype_a), grad_for(grads.second, shape_b, dtype_b)};
        });
  }
  return out;
}

// How an op computes with a scalar operand: in the promoted dtype, in a floating one (true
// division: 256 next to a u8 tensor must not wrap to 0 first), refusing a bool scalar
// (subtraction, as PyTorch does), or refusing one the promoted dtype cannot hold (maximum
// and minimum: maximum(u8, 256) is not maximum(u8, 0); PyTorch's clamp refuses it too).
enum class ScalarUse { Promoted, TrueDivision, Subtraction, Exact };

// A 0-dim tensor holding s in the dtype that op(t, s) computes in; arg names t in errors.
// An integer wraps into a narrower integer dtype here, as PyTorch's wrapped numbers do
// (u8 + -1 stays u8); full() and fill_() reject values that do not fit.
Tensor wrap_scalar(const char* name, const char* arg, const Tensor& t, Scalar s, ScalarUse use = ScalarUse::Promoted) {
  OpScope scope(name);
  check_defined(name, arg, t);
  NC_CHECK(!(use == ScalarUse::Subtraction && s.is_bool()), DTypeError, name,
           ": subtraction with a bool is not supported (a bool scalar and ", describe(t),
           "); to invert a mask use eq(mask, false)");
  DType dtype = result_type(t, s);
  if (use == ScalarUse::TrueDivision && !is_floating(dtype)) dtype = DType::F32;
  if (use == ScalarUse::Exact) check_representable(name, "scalar", s, dtype);
  Tensor out = empty({}, TensorOptions(dtype, t.device()));
  kernels::elementwise(out.device()).fill(out, s);
  return out;
}

}  // namespace

// ---------------------------------------------------------------- promotion, broadcasting
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    NC_CHECK(da == db || da == 1 || db == 1, ShapeError, op, ": shapes ", a, " and ", b,
             " cannot be broadcast together (dim ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

DType result_type(const Tensor& a, const Tensor& b) {
  bool a0 = a.dim() == 0, b0 = b.dim() == 0;
  if (a0 == b0) return promote_types(a.dtype(), b.dtype());
  // A 0-dim tensor only changes the result when it is of a higher category.
  const Tensor& dimensioned = a0 ? b : a;
  const Tensor& zero_dim = a0 ? a : b;
  if (category(zero_dim.dtype()) > category(dimensioned.dtype())) return zero_dim.dtype();
  return dimensioned.dtype();
}

DType result_type(const Tensor& a, Scalar b) {
  Category scalar_category = b.is_bool() ? kBoolCategory : b.is_integral() ? kIntCategory : kFloatCategory;
  if (scalar_category <= category(a.dtype())) return a.dtype();
  return scalar_category == kFloatCategory ? DType::F32 : DType::I64;
}

// ---------------------------------------------------------------- unary
namespace {

Tensor zero_grad_like(const Tensor& g, const Tensor&, const Tensor&, double, double) { return zeros_like(g); }

}  // namespace

Tensor neg(const Tensor& x) {
  return unary_op("neg", UnaryOp::Neg, x, false, kNothing,
                  [](const Tensor& g, const Tensor&, const Tensor&, double, double) { return neg(g); });
}
Tensor abs(const Tensor& x) {
  return unary_op("abs", UnaryOp::Abs, x, false, kInput,
                  [](const Tensor& g, const Tensor& x, const Tensor&, double, double) { return mul(g, sign(x)); });
}
Tensor sign(const Tensor& x) {
  const OpScope op("sign");
  check_defined(op, "x", x);
  if (x.dtype() == DType::Bool) return x.clone();
  return unary_op(op, UnaryOp::Sign, x, false, kNothing, zero_grad_like);
}
Tensor relu(const Tensor& x) {
  return unary_op("relu", UnaryOp::Relu, x, false, kOutput,
                  [](const Tensor& g, const Tensor&, const Tensor& y, double, double) {
                    return where(le(y, 0), 0, g);  // a NaN passes the gradient, as in PyTorch
                  });
}
Tensor exp(const Tensor& x) {
  return unary_op("exp", UnaryOp::Exp, x, true, kOutput,
                  [](const Tensor& g, const Tensor&, const Tensor& y, double, double) { return mul(g, y); });
}
Tensor log(const Tensor& x) {
  return unary_op("log", UnaryOp::Log, x, true, kInput,
                  [](const Tensor& g, const Tensor& x, const Tensor&, double, double) { return div(g, x); });
}
Tensor sqrt(const Tensor& x) {
  return unary_op("sqrt", UnaryOp::Sqrt, x, true, kOutput,
                  [](const Tensor& g, const Tensor&, const Tensor& y, double, double) { return div(g, mul(y, 2)); });
}
Tensor rsqrt(const Tensor& x) {
  return unary_op("rsqrt", UnaryOp::Rsqrt, x, true, kOutput,
                  [](const Tensor& g, const Tensor&, const Tensor& y, double, double) {
                    return mul(g, mul(pow(y, 3), -0.5));
                  });
}
Tensor sin(const Tensor& x) {
  return unary_op("sin", UnaryOp::Sin, x, true, kInput,
                  [](const Tensor& g, const Tensor& x, const Tensor&, double, double) { return mul(g, cos(x)); });
}
Tensor cos(const Tensor& x) {
  return unary_op("cos", UnaryOp::Cos, x, true, kInput,
                  [](const Tensor& g, const Tensor& x, const Tensor&, double, double) { return neg(mul(g, sin(x))); });
}
Tensor tanh(const Tensor& x) {
  return unary_op("tanh", UnaryOp::Tanh, x, true, kOutput,
                  [](const Tensor& g, const Tensor&, const Tensor& y, double, double) {
                    return mul(g, 1 - mul(y, y));
                  });
}
Tensor sigmoid(const Tensor& x) {
  return unary_op("sigmoid", UnaryOp::Sigmoid, x, true, kOutput,
                  [](const Tensor& g, const Tensor&, const Tensor& y, double, double) {
                    return mul(g, mul(y, 1 - y));
                  });
}
Tensor erf(const Tensor& x) {
  return unary_op("erf", UnaryOp::Erf, x, true, kInput,
                  [](const Tensor& g, const Tensor& x, const Tensor&, double, double) {
                    return mul(g, mul(exp(neg(mul(x, x))), 1.12837916709551257390));  // 2 / sqrt(pi) e^(-x^2)
                  });
}

namespace {
// floor, ceil and round: integers are already integral.
Tensor rounding(const char* name, UnaryOp op, const Tensor& x) {
  const OpScope scope(name);
  check_defined(scope, "x", x);
  if (!is_floating(x.dtype()) && x.dtype() != DType::Bool) return x.clone();
  return unary_op(scope, op, x, true, kNothing, zero_grad_like);
}
}  // namespace

Tensor floor(const Tensor& x) { return rounding("floor", UnaryOp::Floor, x); }
Tensor ceil(const Tensor& x) { return rounding("ceil", UnaryOp::Ceil, x); }
Tensor round(const Tensor& x) { return rounding("round", UnaryOp::Round, x); }

Tensor gelu(const Tensor& x, bool approximate) {
  const OpScope op("gelu");
  // The backward is one element-wise pass, g * gelu'(x) (kernels/scalar/elementwise.h), in
  // the input's dtype: the derivative is computed in f32 (f64 for f64) per element.
  if (!approximate) {
    return unary_op(op, UnaryOp::Gelu, x, true, kInput,
                    [](const Tensor& g, const Tensor& x, const Tensor&, double, double) {
                      return binary_op("gelu", BinaryOp::GeluGrad, g.to(x.dtype()), x);
                    });
  }
  return unary_op(op, UnaryOp::GeluTanh, x, true, kInput,
                  [](const Tensor& g, const Tensor& x, const Tensor&, double, double) {
                    return binary_op("gelu", BinaryOp::GeluTanhGrad, g.to(x.dtype()), x);
                  });
}

Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max) {
  const OpScope op("clamp");
  check_defined(op, "x", x);
  NC_CHECK(min || max, ValueError, op, ": at least one of min and max must be given");
  NC_CHECK(!min || !std::isnan(min->to_double()), ValueError, op, ": min is NaN");
  NC_CHECK(!max || !std::isnan(max->to_double()), ValueError, op, ": max is NaN");
  NC_CHECK(!min || !max || min->to_double() <= max->to_double(), ValueError, op, ": min ", *min,
           " is greater than max ", *max);
  DType dtype = x.dtype();
  if (min) dtype = promote_types(dtype, result_type(x, *min));
  if (max) dtype = promote_types(dtype, result_type(x, *max));
  // A bound is written where it clamps: it must fit the result's dtype, as in PyTorch.
  if (min) check_representable(op, "min", *min, dtype);
  if (max) check_representable(op, "max", *max, dtype);
  if (is_floating(dtype)) {
    // The gradient passes where min <= x <= max, as in PyTorch (so not at a NaN).
    return unary_op(
        op, UnaryOp::Clamp, x.to(dtype), true, kInput,
        [](const Tensor& g, const Tensor& x, const Tensor&, double lo, double hi) {
          return where(ge(x, lo), where(le(x, hi), g, 0), 0);  // none at a NaN
        },
        min ? min->to_double() : -INFINITY, max ? max->to_double() : INFINITY);
  }
  Tensor out = x;
  if (min) out = maximum(out, *min);
  if (max) out = minimum(out, *max);
  return out.is_same(x) ? x.clone() : out;
}

Tensor pow(const Tensor& x, Scalar exponent) {
  const OpScope op("pow");
  check_defined(op, "x", x);
  NC_CHECK(!std::isnan(exponent.to_double()), ValueError, op, ": exponent is NaN");
  DType dtype = result_type(x, exponent);
  if (!is_floating(dtype)) {
    // Integer powers stay integers, as in PyTorch; they have no negative exponents.
    NC_CHECK(exponent.to_int() >= 0, ValueError, op, ": integer tensor ", describe(x),
             " cannot be raised to the negative integer power ", exponent);
  }
  // The exponent is taken in the result's dtype, as in PyTorch: one it cannot hold (u8 to
  // the power 256) is refused, not wrapped.
  check_representable(op, "exponent", exponent, dtype);
  if (!is_floating(dtype)) return binary_op(op, BinaryOp::Pow, x, wrap_scalar(op, "x", x, exponent));
  return unary_op(
      op, UnaryOp::PowScalar, x.to(dtype), true, kInput,
      [](const Tensor& g, const Tensor& x, const Tensor&, double e, double) {
        if (e == 0) return zeros_like(g);
        return mul(g, mul(pow(x, e - 1), e));
      },
      exponent.to_double());
}

// ---------------------------------------------------------------- binary
namespace {

using GradPair = std::pair<Tensor, Tensor>;

GradPair add_grad(const Tensor& g, const Tensor&, const Tensor&, const Tensor&) { return {g, g}; }
GradPair sub_grad(const Tensor& g, const Tensor&, const Tensor&, const Tensor&) { return {g, neg(g)}; }
GradPair mul_grad(const Tensor& g, const Tensor& a, const Tensor& b, const Tensor&) { return {mul(g, b), mul(g, a)}; }
GradPair div_grad(const Tensor& g, const Tensor& a, const Tensor& b, const Tensor&) {
  Tensor ga = div(g, b);
  return {ga, neg(mul(ga, div(a, b)))};
}
// As in PyTorch: the operand that loses gets nothing, ties share the gradient equally, and
// where a NaN makes the comparison false both operands get all of it.
GradPair extreme_grad(const Tensor& g, const Tensor& a, const Tensor& b, bool is_max) {
  Tensor a_loses = is_max ? lt(a, b) : gt(a, b);
  Tensor b_loses = is_max ? gt(a, b) : lt(a, b);
  Tensor shared = where(eq(a, b), mul(g, 0.5), g);
  return {where(a_loses, 0, shared), where(b_loses, 0, shared)};
}
GradPair maximum_grad(const Tensor& g, const Tensor& a, const Tensor& b, const Tensor&) {
  return extreme_grad(g, a, b, true);
}
GradPair minimum_grad(const Tensor& g, const Tensor& a, const Tensor& b, const Tensor&) {
  return extreme_grad(g, a, b, false);
}
GradPair pow_grad(const Tensor& g, const Tensor& a, const Tensor& b, const Tensor& out) {
  // d/da a^b = b a^(b-1) (0 where b == 0); d/db a^b = a^b log(a) (0 where a == 0 and b >= 0).
  Tensor ga = where(eq(b, 0), 0, mul(g, mul(b, pow(a, sub(b, 1)))));
  Tensor gb = where(eq(a, 0), 0, mul(g, mul(out, log(a))));
  return {ga, gb};
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary_op("add", BinaryOp::Add, a, b, kNothing, add_grad); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_op("sub", BinaryOp::Sub, a, b, kNothing, sub_grad); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_op("mul", BinaryOp::Mul, a, b, kInput, mul_grad); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_op("div", BinaryOp::Div, a, b, kInput, div_grad); }
Tensor maximum(const Tensor& a, const Tensor& b) {
  return binary_op("maximum", BinaryOp::Maximum, a, b, kInput, maximum_grad);
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return binary_op("minimum", BinaryOp::Minimum, a, b, kInput, minimum_grad);
}
Tensor pow(const Tensor& a, const Tensor& b) {
  return binary_op("pow", BinaryOp::Pow, a, b, kInputAndOutput, pow_grad);
}
Tensor eq(const Tensor& a, const Tensor& b) { return binary_op("eq", BinaryOp::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary_op("ne", BinaryOp::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary_op("lt", BinaryOp::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary_op("le", BinaryOp::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary_op("gt", BinaryOp::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary_op("ge", BinaryOp::Ge, a, b); }

#define NC_SCALAR_BINARY(fn) \
  Tensor fn(const Tensor& a, Scalar b) { return fn(a, wrap_scalar(#fn, "a", a, b)); }
NC_SCALAR_BINARY(add)
NC_SCALAR_BINARY(mul)
NC_SCALAR_BINARY(eq)
NC_SCALAR_BINARY(ne)
NC_SCALAR_BINARY(lt)
NC_SCALAR_BINARY(le)
NC_SCALAR_BINARY(gt)
NC_SCALAR_BINARY(ge)
#undef NC_SCALAR_BINARY

Tensor sub(const Tensor& a, Scalar b) { return sub(a, wrap_scalar("sub", "a", a, b, ScalarUse::Subtraction)); }
Tensor div(const Tensor& a, Scalar b) { return div(a, wrap_scalar("div", "a", a, b, ScalarUse::TrueDivision)); }
Tensor maximum(const Tensor& a, Scalar b) { return maximum(a, wrap_scalar("maximum", "a", a, b, ScalarUse::Exact)); }
Tensor minimum(const Tensor& a, Scalar b) { return minimum(a, wrap_scalar("minimum", "a", a, b, ScalarUse::Exact)); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  const OpScope op("where");
  check_defined(op, "cond", cond);
  check_defined(op, "a", a);
  check_defined(op, "b", b);
  check_same_device(op, "cond", cond, "a", a);
  check_same_device(op, "a", a, "b", b);
  NC_CHECK(cond.dtype() == DType::Bool, DTypeError, op, ": cond must be bool, got ", describe(cond));
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), op), b.shape(), op);
  DType dtype = result_type(a, b);
  Tensor out = new_tensor(shape, dtype, a.device());
  {
    autograd::NoGradGuard no_grad;
    if (out.numel() > 0)
      kernels::elementwise(out.device())
          .where(out, cond.expand(shape), a.to(dtype).expand(shape), b.to(dtype).expand(shape));
  }
  if (autograd::needs_grad(a, b)) {
    autograd::record(op, out, {a, b},
                     [c = autograd::saved(cond), shape_a = a.shape(), dtype_a = a.dtype(), shape_b = b.shape(),
                      dtype_b = b.dtype()](const Tensor& g) {
                       const Tensor& cond = c.get();
                       return std::vector<Tensor>{grad_for(where(cond, g, 0), shape_a, dtype_a),
                                                  grad_for(where(cond, 0, g), shape_b, dtype_b)};
                     });
  }
  return out;
}

// The scalar is written into the result: it must fit the result's dtype (docs/ERRORS.md).
Tensor where(const Tensor& cond, const Tensor& a, Scalar b) {
  return where(cond, a, wrap_scalar("where", "a", a, b, ScalarUse::Exact));
}
Tensor where(const Tensor& cond, Scalar a, const Tensor& b) {
  return where(cond, wrap_scalar("where", "b", b, a, ScalarUse::Exact), b);
}

// ---------------------------------------------------------------- operators
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, Scalar b) { return add(a, b); }
Tensor operator-(const Tensor& a, Scalar b) { return sub(a, b); }
Tensor operator*(const Tensor& a, Scalar b) { return mul(a, b); }
Tensor operator/(const Tensor& a, Scalar b) { return div(a, b); }
Tensor operator+(Scalar a, const Tensor& b) { return add(b, a); }
Tensor operator-(Scalar a, const Tensor& b) { return sub(wrap_scalar("sub", "b", b, a, ScalarUse::Subtraction), b); }
Tensor operator*(Scalar a, const Tensor& b) { return mul(b, a); }
Tensor operator/(Scalar a, const Tensor& b) { return div(wrap_scalar("div", "b", b, a, ScalarUse::TrueDivision), b); }

}  // namespace normcore
