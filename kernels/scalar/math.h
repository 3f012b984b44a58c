// The math the element-wise ops and the optimizer updates need, for float and double, on
// the host and on the device: the C library's functions (CUDA's device versions in device
// code), integer arithmetic that wraps like two's complement hardware, and operations
// rounded on their own, never fused into an FMA, for code whose bits must not depend on
// the compiler or the backend.
#pragma once

#include <math.h>

#include <cstdint>
#include <type_traits>

#include "base/host_device.h"

namespace normcore {
namespace math {

NC_HOST_DEVICE float exp(float x) { return ::expf(x); }
NC_HOST_DEVICE double exp(double x) { return ::exp(x); }
NC_HOST_DEVICE float log(float x) { return ::logf(x); }
NC_HOST_DEVICE double log(double x) { return ::log(x); }
NC_HOST_DEVICE float sqrt(float x) { return ::sqrtf(x); }
NC_HOST_DEVICE double sqrt(double x) { return ::sqrt(x); }
NC_HOST_DEVICE float sin(float x) { return ::sinf(x); }
NC_HOST_DEVICE double sin(double x) { return ::sin(x); }
NC_HOST_DEVICE float cos(float x) { return ::cosf(x); }
NC_HOST_DEVICE double cos(double x) { return ::cos(x); }
// On the host, tanhf of the C library takes ~16 ns an element (a GPT-2's GELUs: 94 ms of a
// 450 ms CPU forward); this takes ~3: x + x^3 P(x^2) below 0.55 (P a degree-4 fit of
// (tanh(x) / x - 1) / x^2 there, within 1.3e-8), 1 - 2 / (e^(2|x|) + 1) with x's sign above,
// within 1.5 ulp of the exact value (tests/ops/test_unary_math.cpp sweeps it). NaN stays NaN;
// beyond |x| = 9 it is +-1. The device keeps CUDA's tanhf.
NC_HOST_DEVICE float tanh(float x) {
#if defined(__CUDA_ARCH__)
  return ::tanhf(x);
#else
  const float a = ::fabsf(x);
  if (!(a > 0.0f)) return x;  // +-0 keeps its sign, NaN stays
  if (a < 0.55f) {
    const float z = x * x;
    const float p = (((-0.00661022783111f * z + 0.0213093886644f) * z - 0.0539094288275f) * z + 0.13333113729f) * z -
                    0.33333332008f;
    return x + x * z * p;
  }
  const float r = 1.0f - 2.0f / (::expf(2.0f * a) + 1.0f);
  return ::copysignf(r, x);
#endif
}
NC_HOST_DEVICE double tanh(double x) { return ::tanh(x); }
NC_HOST_DEVICE float erf(float x) { return ::erff(x); }
NC_HOST_DEVICE double erf(double x) { return ::erf(x); }
NC_HOST_DEVICE float floor(float x) { return ::floorf(x); }
NC_HOST_DEVICE double floor(double x) { return ::floor(x); }
NC_HOST_DEVICE float ceil(float x) { return ::ceilf(x); }
NC_HOST_DEVICE double ceil(double x) { return ::ceil(x); }
// To the nearest integer, halves to even (the default rounding mode, which normcore never changes).
NC_HOST_DEVICE float rint(float x) { return ::rintf(x); }
NC_HOST_DEVICE double rint(double x) { return ::rint(x); }
NC_HOST_DEVICE float fabs(float x) { return ::fabsf(x); }
NC_HOST_DEVICE double fabs(double x) { return ::fabs(x); }
NC_HOST_DEVICE float pow(float x, float y) { return ::powf(x, y); }
NC_HOST_DEVICE double pow(double x, double y) { return ::pow(x, y); }

template <class T>
NC_HOST_DEVICE bool is_nan(T x) {
  if constexpr (std::is_floating_point_v<T>) return x != x;
  return false;
}

// a + b, a - b, a * b for integers, wrapping around (signed overflow is undefined in C++);
// for bool, add is or and mul is and; floating types as they are.
template <class T>
constexpr bool kWraps = std::is_integral_v<T> && !std::is_same_v<T, bool>;

template <class T>
NC_HOST_DEVICE T wrapping_add(T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    return a || b;
  } else if constexpr (kWraps<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <class T>
NC_HOST_DEVICE T wrapping_sub(T a, T b) {
  if constexpr (kWraps<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
  } else {
    return a - b;
  }
}
template <class T>
NC_HOST_DEVICE T wrapping_mul(T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    return a && b;
  } else if constexpr (kWraps<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

// Exact integer power by squaring, wrapping on overflow; negative exponents truncate toward
// zero: 1 and -1 stay +-1, every other base gives 0.
template <class T>
NC_HOST_DEVICE T int_pow(T base, T exponent) {
  using U = std::make_unsigned_t<T>;
  if constexpr (std::is_signed_v<T>) {
    if (exponent < 0) return base == 1 ? T(1) : base == -1 ? ((exponent & 1) ? T(-1) : T(1)) : T(0);
  }
  U result = 1, b = static_cast<U>(base);
  for (U e = static_cast<U>(exponent); e; e >>= 1) {
    if (e & 1) result = static_cast<U>(result * b);
    b = static_cast<U>(b * b);
  }
  return static_cast<T>(result);
}

// Correctly rounded operations that no compiler fuses into an FMA, whatever its flags: on
// the device the _rn intrinsics, on the host plain operators (the library's C++ is built
// with -ffp-contract=off).
NC_HOST_DEVICE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
NC_HOST_DEVICE double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
NC_HOST_DEVICE float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
NC_HOST_DEVICE double add_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
NC_HOST_DEVICE float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
NC_HOST_DEVICE double sub_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
NC_HOST_DEVICE float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
NC_HOST_DEVICE double div_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
NC_HOST_DEVICE float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return ::sqrtf(a);
#endif
}
NC_HOST_DEVICE double sqrt_rn(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return ::sqrt(a);
#endif
}

}  // namespace math
}  // namespace normcore
