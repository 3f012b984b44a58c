// CPU reference: unary, binary and where kernels. 16-bit floats compute in float;
// integer add/sub/mul wrap around like two's complement hardware does.
#include <cmath>
#include <limits>

#include "kernels/backend.h"
#include "kernels/cpu/loops.h"

namespace normcore {
namespace cpu {

namespace {

template <class A>
A wrap_add(A a, A b) {
  if constexpr (std::is_integral<A>::value && !std::is_same<A, bool>::value) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <class A>
A wrap_sub(A a, A b) {
  if constexpr (std::is_integral<A>::value && !std::is_same<A, bool>::value) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(a) - static_cast<U>(b));
  } else {
    return a - b;
  }
}
template <class A>
A wrap_mul(A a, A b) {
  if constexpr (std::is_integral<A>::value && !std::is_same<A, bool>::value) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

// Exact integer power by squaring (wrapping on overflow); negative exponents truncate
// toward zero: 1 and -1 stay +-1, everything else gives 0.
template <class A>
A int_pow(A base, A exp) {
  if constexpr (std::is_signed<A>::value) {
    if (exp < 0) {
      if (base == 1) return 1;
      if (base == -1) return (exp & 1) ? A(-1) : A(1);
      return 0;
    }
  }
  A result = 1;
  while (exp) {
    if (exp & 1) result = wrap_mul(result, base);
    base = wrap_mul(base, base);
    exp = static_cast<A>(exp >> 1);
  }
  return result;
}

template <class A>
bool is_nan(A v) {
  if constexpr (std::is_floating_point<A>::value) return std::isnan(v);
  return false;
}

template <class T>
void unary_typed(UnaryOp op, const Tensor& out, const Tensor& x, double a, double b) {
  using A = acc_t<T>;
  auto run = [&](auto f) { map<T, T>(out, [f](T v) { return cast<T>(f(cast<A>(v))); }, x); };
  switch (op) {
    case UnaryOp::Neg:
      run([](A v) { return wrap_sub(A(0), v); });
      return;
    case UnaryOp::Abs:
      run([](A v) {
        if constexpr (std::is_floating_point<A>::value) return std::fabs(v);
        else if constexpr (std::is_unsigned<A>::value) return v;
        else return v < 0 ? wrap_sub(A(0), v) : v;
      });
      return;
    case UnaryOp::Sign:
      run([](A v) { return v > A(0) ? A(1) : (v < A(0) ? static_cast<A>(-1) : v); });
      return;
    case UnaryOp::Relu:
      run([](A v) { return v < A(0) ? A(0) : v; });
      return;
    default: break;
  }
  if constexpr (std::is_floating_point<A>::value) {
    switch (op) {
      case UnaryOp::Exp: run([](A v) { return std::exp(v); }); return;
      case UnaryOp::Log: run([](A v) { return std::log(v); }); return;
      case UnaryOp::Sqrt: run([](A v) { return std::sqrt(v); }); return;
      case UnaryOp::Rsqrt: run([](A v) { return A(1) / std::sqrt(v); }); return;
      case UnaryOp::Sin: run([](A v) { return std::sin(v); }); return;
      case UnaryOp::Cos: run([](A v) { return std::cos(v); }); return;
      case UnaryOp::Tanh: run([](A v) { return std::tanh(v); }); return;
      case UnaryOp::Sigmoid: run([](A v) { return A(1) / (A(1) + std::exp(-v)); }); return;
      case UnaryOp::Gelu:
        run([](A v) { return A(0.5) * v * (A(1) + std::erf(v * A(0.70710678118654752440))); });
        return;
      case UnaryOp::GeluTanh:
        run([](A v) {
          const A k = A(0.79788456080286535588);  // sqrt(2 / pi)
          return A(0.5) * v * (A(1) + std::tanh(k * (v + A(0.044715) * v * v * v)));
        });
        return;
      case UnaryOp::Clamp: {
        A lo = static_cast<A>(a), hi = static_cast<A>(b);
        run([lo, hi](A v) { return std::isnan(v) ? v : std::min(std::max(v, lo), hi); });
        return;
      }
      case UnaryOp::PowScalar: {
        A e = static_cast<A>(a);
        run([e](A v) { return std::pow(v, e); });
        return;
      }
      default: break;
    }
  }
  throw DTypeError(std::string("unary: op not supported for dtype ") + dtype_name(x.dtype()));
}

template <class T>
void binary_typed(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  using A = acc_t<T>;
  auto arith = [&](auto f) {
    map<T, T, T>(out, [f](T x, T y) { return cast<T>(f(cast<A>(x), cast<A>(y))); }, a, b);
  };
  auto compare = [&](auto f) { map<bool, T, T>(out, [f](T x, T y) { return f(cast<A>(x), cast<A>(y)); }, a, b); };
  switch (op) {
    case BinaryOp::Add:
      if constexpr (std::is_same<A, bool>::value) arith([](A x, A y) { return x || y; });
      else arith([](A x, A y) { return wrap_add(x, y); });
      return;
    case BinaryOp::Sub: arith([](A x, A y) { return wrap_sub(x, y); }); return;
    case BinaryOp::Mul:
      if constexpr (std::is_same<A, bool>::value) arith([](A x, A y) { return x && y; });
      else arith([](A x, A y) { return wrap_mul(x, y); });
      return;
    case BinaryOp::Div: arith([](A x, A y) { return x / y; }); return;
    case BinaryOp::Maximum:
      arith([](A x, A y) { return is_nan(x) ? x : is_nan(y) ? y : (x > y ? x : y); });
      return;
    case BinaryOp::Minimum:
      arith([](A x, A y) { return is_nan(x) ? x : is_nan(y) ? y : (x < y ? x : y); });
      return;
    case BinaryOp::Pow:
      if constexpr (std::is_floating_point<A>::value) {
        arith([](A x, A y) { return std::pow(x, y); });
        return;
      } else if constexpr (!std::is_same<A, bool>::value) {
        arith([](A x, A y) { return int_pow(x, y); });
        return;
      }
      break;
    case BinaryOp::Eq: compare([](A x, A y) { return x == y; }); return;
    case BinaryOp::Ne: compare([](A x, A y) { return x != y; }); return;
    case BinaryOp::Lt: compare([](A x, A y) { return x < y; }); return;
    case BinaryOp::Le: compare([](A x, A y) { return x <= y; }); return;
    case BinaryOp::Gt: compare([](A x, A y) { return x > y; }); return;
    case BinaryOp::Ge: compare([](A x, A y) { return x >= y; }); return;
  }
  throw DTypeError(std::string("binary: op not supported for dtype ") + dtype_name(a.dtype()));
}

}  // namespace

void unary(UnaryOp op, const Tensor& out, const Tensor& x, double a, double b) {
  dispatch(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same<T, bool>::value) {
      throw DTypeError("unary: bool tensors are not supported");
    } else {
      unary_typed<T>(op, out, x, a, b);
    }
  });
}

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  dispatch(a.dtype(), [&](auto tag) { binary_typed<decltype(tag)>(op, out, a, b); });
}

void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  dispatch(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    map<T, bool, T, T>(out, [](bool c, T x, T y) { return c ? x : y; }, cond, a, b);
  });
}

}  // namespace cpu
}  // namespace normcore
