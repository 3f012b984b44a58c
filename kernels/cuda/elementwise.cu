// Element-wise ops: unary (out = f(x)), binary (out = a op b, comparisons give bool) and
// where (out = cond ? a : b). Inputs are expanded to out's shape with any strides; out is
// contiguous and written (=). f16/bf16 compute in float; NaN propagates through
// Maximum/Minimum, Clamp, Relu and Sign as in PyTorch.
#include <cmath>

#include "kernels/cuda/loops.cuh"

namespace normcore {
namespace cuda_kernels {
namespace {

// Float and double overloads of the math functions the ops need.
namespace dmath {
__device__ __forceinline__ float exp(float x) { return expf(x); }
__device__ __forceinline__ double exp(double x) { return ::exp(x); }
__device__ __forceinline__ float log(float x) { return logf(x); }
__device__ __forceinline__ double log(double x) { return ::log(x); }
__device__ __forceinline__ float sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double sqrt(double x) { return ::sqrt(x); }
__device__ __forceinline__ float sin(float x) { return sinf(x); }
__device__ __forceinline__ double sin(double x) { return ::sin(x); }
__device__ __forceinline__ float cos(float x) { return cosf(x); }
__device__ __forceinline__ double cos(double x) { return ::cos(x); }
__device__ __forceinline__ float tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double tanh(double x) { return ::tanh(x); }
__device__ __forceinline__ float erf(float x) { return erff(x); }
__device__ __forceinline__ double erf(double x) { return ::erf(x); }
__device__ __forceinline__ float fabs(float x) { return fabsf(x); }
__device__ __forceinline__ double fabs(double x) { return ::fabs(x); }
__device__ __forceinline__ float pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double pow(double x, double y) { return ::pow(x, y); }
}  // namespace dmath

template <class C>
__device__ __forceinline__ bool is_nan(C x) {
  return x != x;
}

template <class T, UnaryOp OP>
struct UnaryFunctor {
  using C = compute_t<T>;
  C a, b;

  __device__ __forceinline__ T operator()(T in) const {
    const C x = convert<C>(in);
    if constexpr (OP == UnaryOp::Neg) {
      return convert<T>(-x);  // u8 wraps modulo 256
    } else if constexpr (OP == UnaryOp::Abs) {
      if constexpr (is_floating_v<T>) return convert<T>(dmath::fabs(x));  // -0 -> +0
      else if constexpr (std::is_unsigned_v<C>) return in;
      else return convert<T>(x < C(0) ? C(-x) : x);
    } else if constexpr (OP == UnaryOp::Sign) {
      if constexpr (std::is_unsigned_v<C>) return convert<T>(x > C(0) ? C(1) : C(0));
      else return convert<T>(x > C(0) ? C(1) : (x < C(0) ? C(-1) : x));  // 0 stays 0, NaN stays NaN
    } else if constexpr (OP == UnaryOp::Relu) {
      return convert<T>(x > C(0) || is_nan(x) ? x : C(0));
    } else if constexpr (OP == UnaryOp::Exp) {
      return convert<T>(dmath::exp(x));
    } else if constexpr (OP == UnaryOp::Log) {
      return convert<T>(dmath::log(x));
    } else if constexpr (OP == UnaryOp::Sqrt) {
      return convert<T>(dmath::sqrt(x));
    } else if constexpr (OP == UnaryOp::Rsqrt) {
      return convert<T>(C(1) / dmath::sqrt(x));
    } else if constexpr (OP == UnaryOp::Sin) {
      return convert<T>(dmath::sin(x));
    } else if constexpr (OP == UnaryOp::Cos) {
      return convert<T>(dmath::cos(x));
    } else if constexpr (OP == UnaryOp::Tanh) {
      return convert<T>(dmath::tanh(x));
    } else if constexpr (OP == UnaryOp::Sigmoid) {
      // exp of a non-positive argument only, so neither branch overflows.
      if (x >= C(0)) return convert<T>(C(1) / (C(1) + dmath::exp(-x)));
      const C e = dmath::exp(x);
      return convert<T>(e / (C(1) + e));
    } else if constexpr (OP == UnaryOp::Gelu) {
      return convert<T>(C(0.5) * x * (C(1) + dmath::erf(x * C(0.70710678118654752440))));
    } else if constexpr (OP == UnaryOp::GeluTanh) {
      const C inner = C(0.79788456080286535588) * (x + C(0.044715) * x * x * x);
      return convert<T>(C(0.5) * x * (C(1) + dmath::tanh(inner)));
    } else if constexpr (OP == UnaryOp::Clamp) {
      // Comparisons with NaN are false, so NaN passes through both.
      C r = x < a ? a : x;
      return convert<T>(r > b ? b : r);
    } else {
      static_assert(OP == UnaryOp::PowScalar, "unhandled unary op");
      return convert<T>(dmath::pow(x, a));
    }
  }
};

constexpr bool is_float_only(UnaryOp op) { return op != UnaryOp::Neg && op != UnaryOp::Abs && op != UnaryOp::Sign && op != UnaryOp::Relu; }

// Exact integer power by squaring (wrapping on overflow, as the CPU does); negative
// exponents truncate toward zero: 1 and -1 stay +-1, everything else gives 0.
template <class T>
__device__ __forceinline__ T int_pow(T base, T exp) {
  using U = std::make_unsigned_t<T>;
  if constexpr (std::is_signed_v<T>) {
    if (exp < 0) return base == 1 ? T(1) : base == -1 ? ((exp & 1) ? T(-1) : T(1)) : T(0);
  }
  U result = 1, b = static_cast<U>(base);
  for (U e = static_cast<U>(exp); e; e >>= 1) {
    if (e & 1) result *= b;
    b *= b;
  }
  return static_cast<T>(result);
}

template <class T, BinaryOp OP>
struct BinaryFunctor {
  using C = compute_t<T>;
  static constexpr bool kComparison = OP >= BinaryOp::Eq;
  using Out = std::conditional_t<kComparison, bool, T>;

  __device__ __forceinline__ Out operator()(T a_in, T b_in) const {
    const C a = convert<C>(a_in), b = convert<C>(b_in);
    if constexpr (OP == BinaryOp::Add) return convert<T>(a + b);
    else if constexpr (OP == BinaryOp::Sub) return convert<T>(a - b);
    else if constexpr (OP == BinaryOp::Mul) return convert<T>(a * b);
    else if constexpr (OP == BinaryOp::Div) return convert<T>(a / b);
    else if constexpr (OP == BinaryOp::Maximum) return convert<T>(is_nan(a) ? a : (is_nan(b) ? b : (a > b ? a : b)));
    else if constexpr (OP == BinaryOp::Minimum) return convert<T>(is_nan(a) ? a : (is_nan(b) ? b : (a < b ? a : b)));
    else if constexpr (OP == BinaryOp::Pow) {
      if constexpr (is_floating_v<T>) return convert<T>(dmath::pow(a, b));
      else return int_pow(a, b);
    }
    else if constexpr (OP == BinaryOp::Eq) return a == b;
    else if constexpr (OP == BinaryOp::Ne) return a != b;
    else if constexpr (OP == BinaryOp::Lt) return a < b;
    else if constexpr (OP == BinaryOp::Le) return a <= b;
    else if constexpr (OP == BinaryOp::Gt) return a > b;
    else return a >= b;
  }
};

template <class T>
struct WhereFunctor {
  __device__ __forceinline__ T operator()(bool cond, T a, T b) const { return cond ? a : b; }
};

template <UnaryOp OP>
using UnaryTag = std::integral_constant<UnaryOp, OP>;
template <BinaryOp OP>
using BinaryTag = std::integral_constant<BinaryOp, OP>;

// Calls f(UnaryTag<op>{}) so the op becomes a template argument.
template <class F>
void dispatch_unary_op(UnaryOp op, F&& f) {
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
  }
  throw ValueError(detail::cat_str("unary: unknown op ", static_cast<int>(op)));
}

template <class F>
void dispatch_binary_op(BinaryOp op, F&& f) {
  switch (op) {
    case BinaryOp::Add: return f(BinaryTag<BinaryOp::Add>{});
    case BinaryOp::Sub: return f(BinaryTag<BinaryOp::Sub>{});
    case BinaryOp::Mul: return f(BinaryTag<BinaryOp::Mul>{});
    case BinaryOp::Div: return f(BinaryTag<BinaryOp::Div>{});
    case BinaryOp::Maximum: return f(BinaryTag<BinaryOp::Maximum>{});
    case BinaryOp::Minimum: return f(BinaryTag<BinaryOp::Minimum>{});
    case BinaryOp::Pow: return f(BinaryTag<BinaryOp::Pow>{});
    case BinaryOp::Eq: return f(BinaryTag<BinaryOp::Eq>{});
    case BinaryOp::Ne: return f(BinaryTag<BinaryOp::Ne>{});
    case BinaryOp::Lt: return f(BinaryTag<BinaryOp::Lt>{});
    case BinaryOp::Le: return f(BinaryTag<BinaryOp::Le>{});
    case BinaryOp::Gt: return f(BinaryTag<BinaryOp::Gt>{});
    case BinaryOp::Ge: return f(BinaryTag<BinaryOp::Ge>{});
  }
  throw ValueError(detail::cat_str("binary: unknown op ", static_cast<int>(op)));
}

}  // namespace

void unary(UnaryOp op, const Tensor& out, const Tensor& x, double a, double b) {
  if (out.numel() == 0) return;
  dispatch_unary_op(op, [&](auto op_tag) {
    constexpr UnaryOp OP = decltype(op_tag)::value;
    dispatch_all(x.dtype(), "unary", [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_same_v<T, bool> || (is_float_only(OP) && !is_floating_v<T>)) {
        throw DTypeError(detail::cat_str("unary: op ", static_cast<int>(OP), " does not take ",
                                         dtype_name(x.dtype())));
      } else {
        using C = compute_t<T>;
        UnaryFunctor<T, OP> f{static_cast<C>(a), static_cast<C>(b)};
        elementwise<T, T>("unary", f, out, x);
      }
    });
  });
}

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  if (out.numel() == 0) return;
  dispatch_binary_op(op, [&](auto op_tag) {
    constexpr BinaryOp OP = decltype(op_tag)::value;
    dispatch_all(a.dtype(), "binary", [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr ((OP == BinaryOp::Div && !is_floating_v<T>) ||
                    (OP == BinaryOp::Pow && std::is_same_v<T, bool>)) {
        throw DTypeError(detail::cat_str("binary: op ", static_cast<int>(OP), " does not take ",
                                         dtype_name(a.dtype())));
      } else {
        using F = BinaryFunctor<T, OP>;
        elementwise<typename F::Out, T, T>("binary", F{}, out, a, b);
      }
    });
  });
}

void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  if (out.numel() == 0) return;
  dispatch_all(out.dtype(), "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    elementwise<T, bool, T, T>("where", WhereFunctor<T>{}, out, cond, a, b);
  });
}

}  // namespace cuda_kernels
}  // namespace normcore
