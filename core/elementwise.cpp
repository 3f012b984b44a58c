// Element-wise ops: checks, broadcasting, dtype promotion, then the backend's unary,
// binary and where kernels. Scalars become 0-dim tensors in the result dtype.
#include <cmath>

#include "core/internal.h"
#include "normcore/ops.h"

namespace normcore {

using namespace detail;

namespace {

enum Category { kBoolCategory = 0, kIntCategory = 1, kFloatCategory = 2 };

Category category(DType d) {
  if (d == DType::Bool) return kBoolCategory;
  return is_floating(d) ? kFloatCategory : kIntCategory;
}

Tensor unary_op(const char* name, UnaryOp op, const Tensor& x, bool float_only, double a = 0,
                double b = 0) {
  check_defined(name, "x", x);
  Tensor input = x;
  if (float_only && !is_floating(x.dtype())) input = x.to(DType::F32);
  NC_CHECK(input.dtype() != DType::Bool, DTypeError, name, ": bool tensors are not supported (x is ",
           describe(x), ")");
  Tensor out = new_tensor(input.shape(), input.dtype(), input.device());
  if (out.numel() > 0) NC_BACKEND(out.device(), unary, op, out, input, a, b);
  return out;
}

bool is_comparison(BinaryOp op) {
  return op == BinaryOp::Eq || op == BinaryOp::Ne || op == BinaryOp::Lt || op == BinaryOp::Le ||
         op == BinaryOp::Gt || op == BinaryOp::Ge;
}

Tensor binary_op(const char* name, BinaryOp op, const Tensor& a, const Tensor& b) {
  check_defined(name, "a", a);
  check_defined(name, "b", b);
  check_same_device(name, "a", a, "b", b);
  Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  DType compute = result_type(a, b);
  if (op == BinaryOp::Div && !is_floating(compute)) compute = DType::F32;
  NC_CHECK(!(compute == DType::Bool && (op == BinaryOp::Sub || op == BinaryOp::Maximum ||
                                         op == BinaryOp::Minimum || op == BinaryOp::Pow)),
           DTypeError, name, ": not supported for bool tensors (a is ", describe(a), ", b is ",
           describe(b), ")");
  Tensor out = new_tensor(shape, is_comparison(op) ? DType::Bool : compute, a.device());
  if (out.numel() > 0)
    NC_BACKEND(out.device(), binary, op, out, a.to(compute).expand(shape), b.to(compute).expand(shape));
  return out;
}

// A 0-dim tensor holding s in the dtype that op(t, s) computes in; arg names t in errors.
Tensor wrap_scalar(const char* name, const char* arg, const Tensor& t, Scalar s) {
  check_defined(name, arg, t);
  return full({}, s, TensorOptions(result_type(t, s), t.device()));
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
Tensor neg(const Tensor& x) { return unary_op("neg", UnaryOp::Neg, x, false); }
Tensor abs(const Tensor& x) { return unary_op("abs", UnaryOp::Abs, x, false); }
Tensor sign(const Tensor& x) {
  check_defined("sign", "x", x);
  if (x.dtype() == DType::Bool) return x.clone();
  return unary_op("sign", UnaryOp::Sign, x, false);
}
Tensor relu(const Tensor& x) { return unary_op("relu", UnaryOp::Relu, x, false); }
Tensor exp(const Tensor& x) { return unary_op("exp", UnaryOp::Exp, x, true); }
Tensor log(const Tensor& x) { return unary_op("log", UnaryOp::Log, x, true); }
Tensor sqrt(const Tensor& x) { return unary_op("sqrt", UnaryOp::Sqrt, x, true); }
Tensor rsqrt(const Tensor& x) { return unary_op("rsqrt", UnaryOp::Rsqrt, x, true); }
Tensor sin(const Tensor& x) { return unary_op("sin", UnaryOp::Sin, x, true); }
Tensor cos(const Tensor& x) { return unary_op("cos", UnaryOp::Cos, x, true); }
Tensor tanh(const Tensor& x) { return unary_op("tanh", UnaryOp::Tanh, x, true); }
Tensor sigmoid(const Tensor& x) { return unary_op("sigmoid", UnaryOp::Sigmoid, x, true); }
Tensor gelu(const Tensor& x, bool approximate) {
  return unary_op("gelu", approximate ? UnaryOp::GeluTanh : UnaryOp::Gelu, x, true);
}

Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max) {
  check_defined("clamp", "x", x);
  NC_CHECK(min || max, ValueError, "clamp: at least one of min and max must be given");
  NC_CHECK(!min || !std::isnan(min->to_double()), ValueError, "clamp: min is NaN");
  NC_CHECK(!max || !std::isnan(max->to_double()), ValueError, "clamp: max is NaN");
  DType dtype = x.dtype();
  if (min) dtype = promote_types(dtype, result_type(x, *min));
  if (max) dtype = promote_types(dtype, result_type(x, *max));
  if (is_floating(dtype)) {
    return unary_op("clamp", UnaryOp::Clamp, x.to(dtype), true, min ? min->to_double() : -INFINITY,
                    max ? max->to_double() : INFINITY);
  }
  Tensor out = x;
  if (min) out = maximum(out, *min);
  if (max) out = minimum(out, *max);
  return out.is_same(x) ? x.clone() : out;
}

Tensor pow(const Tensor& x, Scalar exponent) {
  check_defined("pow", "x", x);
  NC_CHECK(!std::isnan(exponent.to_double()), ValueError, "pow: exponent is NaN");
  DType dtype = result_type(x, exponent);
  if (!is_floating(dtype)) {
    // Integer powers stay integers, as in PyTorch; they have no negative exponents.
    NC_CHECK(exponent.to_int() >= 0, ValueError, "pow: integer tensor ", describe(x),
             " cannot be raised to the negative integer power ", exponent);
    return binary_op("pow", BinaryOp::Pow, x, wrap_scalar("pow", "x", x, exponent));
  }
  return unary_op("pow", UnaryOp::PowScalar, x.to(dtype), true, exponent.to_double());
}

// ---------------------------------------------------------------- binary
Tensor add(const Tensor& a, const Tensor& b) { return binary_op("add", BinaryOp::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_op("sub", BinaryOp::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_op("mul", BinaryOp::Mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_op("div", BinaryOp::Div, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary_op("maximum", BinaryOp::Maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary_op("minimum", BinaryOp::Minimum, a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary_op("pow", BinaryOp::Pow, a, b); }
Tensor eq(const Tensor& a, const Tensor& b) { return binary_op("eq", BinaryOp::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary_op("ne", BinaryOp::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary_op("lt", BinaryOp::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary_op("le", BinaryOp::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary_op("gt", BinaryOp::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary_op("ge", BinaryOp::Ge, a, b); }

#define NC_SCALAR_BINARY(fn, op)                                             \
  Tensor fn(const Tensor& a, Scalar b) {                                     \
    return binary_op(#fn, BinaryOp::op, a, wrap_scalar(#fn, "a", a, b));     \
  }
NC_SCALAR_BINARY(add, Add)
NC_SCALAR_BINARY(sub, Sub)
NC_SCALAR_BINARY(mul, Mul)
NC_SCALAR_BINARY(div, Div)
NC_SCALAR_BINARY(maximum, Maximum)
NC_SCALAR_BINARY(minimum, Minimum)
NC_SCALAR_BINARY(eq, Eq)
NC_SCALAR_BINARY(ne, Ne)
NC_SCALAR_BINARY(lt, Lt)
NC_SCALAR_BINARY(le, Le)
NC_SCALAR_BINARY(gt, Gt)
NC_SCALAR_BINARY(ge, Ge)
#undef NC_SCALAR_BINARY

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  const char* op = "where";
  check_defined(op, "cond", cond);
  check_defined(op, "a", a);
  check_defined(op, "b", b);
  check_same_device(op, "cond", cond, "a", a);
  check_same_device(op, "a", a, "b", b);
  NC_CHECK(cond.dtype() == DType::Bool, DTypeError, op, ": cond must be bool, got ", describe(cond));
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), op), b.shape(), op);
  DType dtype = result_type(a, b);
  Tensor out = new_tensor(shape, dtype, a.device());
  if (out.numel() > 0)
    NC_BACKEND(out.device(), where, out, cond.expand(shape), a.to(dtype).expand(shape),
               b.to(dtype).expand(shape));
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, Scalar b) {
  return where(cond, a, wrap_scalar("where", "a", a, b));
}
Tensor where(const Tensor& cond, Scalar a, const Tensor& b) {
  return where(cond, wrap_scalar("where", "b", b, a), b);
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
Tensor operator-(Scalar a, const Tensor& b) { return sub(wrap_scalar("sub", "b", b, a), b); }
Tensor operator*(Scalar a, const Tensor& b) { return mul(b, a); }
Tensor operator/(Scalar a, const Tensor& b) { return div(wrap_scalar("div", "b", b, a), b); }

}  // namespace normcore
