// The element math of the element-wise kernels (kernels/elementwise.h), one functor per op
// and element type, run by the CPU loops and the CUDA launcher alike: both backends compute
// the same expression in the same type (compute_t<T>: float for the 16-bit floats). The
// CUDA compiler may still contract a * b + c into an FMA where the CPU rounds twice.
#pragma once

#include <type_traits>

#include "kernels/elementwise.h"
#include "kernels/scalar/dtype.h"
#include "kernels/scalar/math.h"

namespace normcore {

constexpr bool is_float_only(UnaryOp op) {
  return op != UnaryOp::Neg && op != UnaryOp::Abs && op != UnaryOp::Sign && op != UnaryOp::Relu;
}

// Whether the kernels take element type T for op (core never asks for the others).
template <class T>
constexpr bool supports(UnaryOp op) {
  return !std::is_same_v<T, bool> && (is_floating_v<T> || !is_float_only(op));
}
template <class T>
constexpr bool supports(BinaryOp op) {
  const bool float_only = op == BinaryOp::Div || op == BinaryOp::GeluGrad || op == BinaryOp::GeluTanhGrad;
  return !(float_only && !is_floating_v<T>)&&!(op == BinaryOp::Pow && std::is_same_v<T, bool>);
}

// out = op(x), with the op's scalar arguments a and b (Clamp's bounds, PowScalar's exponent).
template <class T, UnaryOp OP>
struct UnaryFunctor {
  using In = T;
  using Out = T;
  using C = compute_t<T>;
  C a, b;

  NC_HOST_DEVICE T operator()(T in) const {
    const C x = convert<C>(in);
    if constexpr (OP == UnaryOp::Neg) {
      if constexpr (is_floating_v<T>) return convert<T>(-x);  // -(+0) is -0
      else return convert<T>(math::wrapping_sub(C(0), x));
    } else if constexpr (OP == UnaryOp::Abs) {
      if constexpr (is_floating_v<T>) return convert<T>(math::fabs(x));  // -0 -> +0
      else if constexpr (std::is_unsigned_v<C>) return in;
      else return convert<T>(x < C(0) ? math::wrapping_sub(C(0), x) : x);
    } else if constexpr (OP == UnaryOp::Sign) {
      // As in PyTorch: (0 < x) - (x < 0), so NaN and -0 give +0.
      if constexpr (std::is_unsigned_v<C>) return convert<T>(x > C(0) ? C(1) : C(0));
      else return convert<T>(x > C(0) ? C(1) : (x < C(0) ? C(-1) : C(0)));
    } else if constexpr (OP == UnaryOp::Relu) {
      if constexpr (std::is_unsigned_v<C>) return in;
      else return convert<T>(x < C(0) ? C(0) : x);  // NaN and -0 pass through, as in PyTorch
    } else if constexpr (OP == UnaryOp::Exp) {
      return convert<T>(math::exp(x));
    } else if constexpr (OP == UnaryOp::Log) {
      return convert<T>(math::log(x));
    } else if constexpr (OP == UnaryOp::Sqrt) {
      return convert<T>(math::sqrt(x));
    } else if constexpr (OP == UnaryOp::Rsqrt) {
      return convert<T>(C(1) / math::sqrt(x));
    } else if constexpr (OP == UnaryOp::Sin) {
      return convert<T>(math::sin(x));
    } else if constexpr (OP == UnaryOp::Cos) {
      return convert<T>(math::cos(x));
    } else if constexpr (OP == UnaryOp::Tanh) {
      return convert<T>(math::tanh(x));
    } else if constexpr (OP == UnaryOp::Sigmoid) {
      // exp of a non-positive argument only, so neither branch overflows.
      if (x >= C(0)) return convert<T>(C(1) / (C(1) + math::exp(-x)));
      const C e = math::exp(x);
      return convert<T>(e / (C(1) + e));
    } else if constexpr (OP == UnaryOp::Gelu) {
      return convert<T>(C(0.5) * x * (C(1) + math::erf(x * C(0.70710678118654752440))));
    } else if constexpr (OP == UnaryOp::GeluTanh) {
      const C inner = C(0.79788456080286535588) * (x + C(0.044715) * x * x * x);  // sqrt(2 / pi) * ...
      return convert<T>(C(0.5) * x * (C(1) + math::tanh(inner)));
    } else if constexpr (OP == UnaryOp::Clamp) {
      // Comparisons with NaN are false, so NaN passes through both.
      const C r = x < a ? a : x;
      return convert<T>(r > b ? b : r);
    } else if constexpr (OP == UnaryOp::PowScalar) {
      return convert<T>(math::pow(x, a));
    } else if constexpr (OP == UnaryOp::Erf) {
      return convert<T>(math::erf(x));
    } else if constexpr (OP == UnaryOp::Floor) {
      return convert<T>(math::floor(x));
    } else if constexpr (OP == UnaryOp::Ceil) {
      return convert<T>(math::ceil(x));
    } else {
      static_assert(OP == UnaryOp::Round, "unhandled unary op");
      return convert<T>(math::rint(x));
    }
  }
};

// out = a op b; comparisons give bool.
template <class T, BinaryOp OP>
struct BinaryFunctor {
  using In = T;
  using C = compute_t<T>;
  static constexpr bool kComparison = OP >= BinaryOp::Eq;
  using Out = std::conditional_t<kComparison, bool, T>;

  NC_HOST_DEVICE Out operator()(T a_in, T b_in) const {
    const C a = convert<C>(a_in), b = convert<C>(b_in);
    if constexpr (OP == BinaryOp::Add) return convert<T>(math::wrapping_add(a, b));
    else if constexpr (OP == BinaryOp::Sub) return convert<T>(math::wrapping_sub(a, b));
    else if constexpr (OP == BinaryOp::Mul) return convert<T>(math::wrapping_mul(a, b));
    else if constexpr (OP == BinaryOp::Div) return convert<T>(a / b);
    else if constexpr (OP == BinaryOp::Maximum)
      return convert<T>(math::is_nan(a) ? a : (math::is_nan(b) ? b : (a > b ? a : b)));
    else if constexpr (OP == BinaryOp::Minimum)
      return convert<T>(math::is_nan(a) ? a : (math::is_nan(b) ? b : (a < b ? a : b)));
    else if constexpr (OP == BinaryOp::Pow) {
      if constexpr (is_floating_v<T>) return convert<T>(math::pow(a, b));
      else return math::int_pow(a, b);
    } else if constexpr (OP == BinaryOp::GeluGrad) {
      // d/dx x * cdf(x) = cdf(x) + x * pdf(x), with the standard normal's cdf and pdf.
      const C cdf = C(0.5) * (C(1) + math::erf(b * C(0.70710678118654752440)));
      const C pdf = math::exp(C(-0.5) * b * b) * C(0.39894228040143267794);
      return convert<T>(a * (cdf + b * pdf));
    } else if constexpr (OP == BinaryOp::GeluTanhGrad) {
      // t = tanh(k (x + c x^3)): d/dx 0.5 x (1 + t) = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2).
      const C k = C(0.79788456080286535588), c = C(0.044715);
      const C x2 = b * b;
      const C t = math::tanh(k * (b + c * x2 * b));
      return convert<T>(a * (C(0.5) * (C(1) + t) + C(0.5) * b * (C(1) - t * t) * k * (C(1) + C(3) * c * x2)));
    } else if constexpr (OP == BinaryOp::Eq) return a == b;
    else if constexpr (OP == BinaryOp::Ne) return a != b;
    else if constexpr (OP == BinaryOp::Lt) return a < b;
    else if constexpr (OP == BinaryOp::Le) return a <= b;
    else if constexpr (OP == BinaryOp::Gt) return a > b;
    else return a >= b;
  }
};

template <class T>
struct WhereFunctor {
  NC_HOST_DEVICE T operator()(bool cond, T a, T b) const { return cond ? a : b; }
};

template <class To, class From>
struct ConvertFunctor {
  NC_HOST_DEVICE To operator()(From x) const { return convert<To>(x); }
};

template <class T>
struct FillFunctor {
  T value;
  NC_HOST_DEVICE T operator()() const { return value; }
};

template <UnaryOp OP>
using UnaryTag = std::integral_constant<UnaryOp, OP>;
template <BinaryOp OP>
using BinaryTag = std::integral_constant<BinaryOp, OP>;

// Calls f(UnaryTag<op>{}) so that the op becomes a template argument.
template <class F>
void visit_op(UnaryOp op, F&& f) {
  switch (op) {
    case UnaryOp::Neg: return f(UnaryTag<UnaryOp::Neg>{});
    case UnaryOp::Abs: return f(UnaryTag<UnaryOp::Abs>{});
    case UnaryOp::Sign: return f(UnaryTag<UnaryOp::Sign>{});
    case UnaryOp::Relu: return f(UnaryTag<UnaryOp::Relu>{});
    case UnaryOp::Exp: return f(UnaryTag<UnaryOp::Exp>{});
    case UnaryOp::Log: return f(UnaryTag<UnaryOp::Log>{});
    case UnaryOp::Sqrt: return f(UnaryTag<UnaryOp::Sqrt>{});
    case UnaryOp::Rsqrt: return f(UnaryTag<UnaryOp::Rsqrt>{});
    case UnaryOp::Sin: return f(UnaryTag<UnaryOp::Sin>{});
    case UnaryOp::Cos: return f(UnaryTag<UnaryOp::Cos>{});
    case UnaryOp::Tanh: return f(UnaryTag<UnaryOp::Tanh>{});
    case UnaryOp::Sigmoid: return f(UnaryTag<UnaryOp::Sigmoid>{});
    case UnaryOp::Gelu: return f(UnaryTag<UnaryOp::Gelu>{});
    case UnaryOp::GeluTanh: return f(UnaryTag<UnaryOp::GeluTanh>{});
    case UnaryOp::Clamp: return f(UnaryTag<UnaryOp::Clamp>{});
    case UnaryOp::PowScalar: return f(UnaryTag<UnaryOp::PowScalar>{});
    case UnaryOp::Erf: return f(UnaryTag<UnaryOp::Erf>{});
    case UnaryOp::Floor: return f(UnaryTag<UnaryOp::Floor>{});
    case UnaryOp::Ceil: return f(UnaryTag<UnaryOp::Ceil>{});
    case UnaryOp::Round: return f(UnaryTag<UnaryOp::Round>{});
  }
  throw ValueError(detail::cat_str("unary: unknown op ", static_cast<int>(op)));
}

template <class F>
void visit_op(BinaryOp op, F&& f) {
  switch (op) {
    case BinaryOp::Add: return f(BinaryTag<BinaryOp::Add>{});
    case BinaryOp::Sub: return f(BinaryTag<BinaryOp::Sub>{});
    case BinaryOp::Mul: return f(BinaryTag<BinaryOp::Mul>{});
    case BinaryOp::Div: return f(BinaryTag<BinaryOp::Div>{});
    case BinaryOp::Maximum: return f(BinaryTag<BinaryOp::Maximum>{});
    case BinaryOp::Minimum: return f(BinaryTag<BinaryOp::Minimum>{});
    case BinaryOp::Pow: return f(BinaryTag<BinaryOp::Pow>{});
    case BinaryOp::GeluGrad: return f(BinaryTag<BinaryOp::GeluGrad>{});
    case BinaryOp::GeluTanhGrad: return f(BinaryTag<BinaryOp::GeluTanhGrad>{});
    case BinaryOp::Eq: return f(BinaryTag<BinaryOp::Eq>{});
    case BinaryOp::Ne: return f(BinaryTag<BinaryOp::Ne>{});
    case BinaryOp::Lt: return f(BinaryTag<BinaryOp::Lt>{});
    case BinaryOp::Le: return f(BinaryTag<BinaryOp::Le>{});
    case BinaryOp::Gt: return f(BinaryTag<BinaryOp::Gt>{});
    case BinaryOp::Ge: return f(BinaryTag<BinaryOp::Ge>{});
  }
  throw ValueError(detail::cat_str("binary: unknown op ", static_cast<int>(op)));
}

// Calls f(functor) with the UnaryFunctor of op for the element type of dtype in Types
// (HostTypes or DeviceTypes); throws DTypeError for a dtype the op does not take.
template <class Types, class F>
void with_unary_functor(UnaryOp op, DType dtype, double a, double b, F&& f) {
  visit_op(op, [&](auto op_tag) {
    constexpr UnaryOp OP = decltype(op_tag)::value;
    visit_dtype<Types>(dtype, "unary", [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (!supports<T>(OP)) {
        throw DTypeError(detail::cat_str("unary: op ", static_cast<int>(OP), " does not take ", dtype_name(dtype)));
      } else {
        using C = compute_t<T>;
        f(UnaryFunctor<T, OP>{static_cast<C>(a), static_cast<C>(b)});
      }
    });
  });
}

// The same for BinaryFunctor.
template <class Types, class F>
void with_binary_functor(BinaryOp op, DType dtype, F&& f) {
  visit_op(op, [&](auto op_tag) {
    constexpr BinaryOp OP = decltype(op_tag)::value;
    visit_dtype<Types>(dtype, "binary", [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (!supports<T>(OP)) {
        throw DTypeError(detail::cat_str("binary: op ", static_cast<int>(OP), " does not take ", dtype_name(dtype)));
      } else {
        f(BinaryFunctor<T, OP>{});
      }
    });
  });
}

}  // namespace normcore
