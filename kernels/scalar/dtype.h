// Element types, the type arithmetic happens in, value conversion and the dtype visitor:
// one definition for the CPU backend, the CUDA backend and core's element access, so that
// every part of normcore converts values the same way.
//
// The 16-bit floats have a host type (Half, BFloat16 from normcore/dtype.h) and, in CUDA
// sources, a device type (__half, __nv_bfloat16) with the same bits; a backend names its
// set (HostTypes or DeviceTypes) when it visits a dtype. Both round to nearest even.
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include "base/host_device.h"
#include "normcore/dtype.h"
#include "normcore/error.h"
#include "normcore/scalar.h"

namespace normcore {

template <class T>
struct TypeTag {
  using type = T;
};

// The element type of each dtype, on the host and on the device.
struct HostTypes {
  using F16 = Half;
  using BF16 = BFloat16;
};
#if defined(__CUDACC__)
struct DeviceTypes {
  using F16 = __half;
  using BF16 = __nv_bfloat16;
};
#endif

template <class T>
struct is_reduced_float : std::false_type {};
template <>
struct is_reduced_float<Half> : std::true_type {};
template <>
struct is_reduced_float<BFloat16> : std::true_type {};
#if defined(__CUDACC__)
template <>
struct is_reduced_float<__half> : std::true_type {};
template <>
struct is_reduced_float<__nv_bfloat16> : std::true_type {};
#endif
template <class T>
constexpr bool is_reduced_float_v = is_reduced_float<T>::value;
template <class T>
constexpr bool is_floating_v = std::is_floating_point_v<T> || is_reduced_float_v<T>;

// The type arithmetic on T happens in: float for the 16-bit floats, T otherwise.
template <class T>
using compute_t = std::conditional_t<is_reduced_float_v<T>, float, T>;

// The 16-bit floats to and from float (exact one way, round to nearest even the other).
inline float to_float(Half v) { return static_cast<float>(v); }
inline float to_float(BFloat16 v) { return static_cast<float>(v); }
template <class T>
inline std::enable_if_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, T> from_float(float v) {
  return T(v);
}
#if defined(__CUDACC__)
__host__ __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__host__ __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T>
__host__ __device__ __forceinline__ std::enable_if_t<std::is_same_v<T, __half>, T> from_float(float v) {
  return __float2half_rn(v);
}
template <class T>
__host__ __device__ __forceinline__ std::enable_if_t<std::is_same_v<T, __nv_bfloat16>, T> from_float(float v) {
  return __float2bfloat16_rn(v);
}
#endif

// Value conversion: 16-bit floats go through float, anything to bool is "non-zero",
// floating to u8 goes through int64 (as in PyTorch: -2.7 gives 254 on every device, where a
// direct cast is undefined and saturates to 0 on a GPU), the rest is static_cast (floating
// to integer truncates toward zero).
template <class To, class From>
NC_HOST_DEVICE To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (is_reduced_float_v<From>) {
    return convert<To>(to_float(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (is_reduced_float_v<To>) {
    return from_float<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, uint8_t> && std::is_floating_point_v<From>) {
    return static_cast<uint8_t>(static_cast<int64_t>(v));
  } else {
    return static_cast<To>(v);
  }
}

// A Scalar as a value of T: integers convert from their exact int64 value (going through
// double first could round twice).
template <class T>
T scalar_as(Scalar s) {
  return s.is_integral() ? convert<T>(s.to_int()) : convert<T>(s.to_double());
}

// Calls f(TypeTag<T>{}) with T the element type of dtype in Types (HostTypes or
// DeviceTypes): float, double, F16, BF16, int32_t, int64_t, uint8_t, bool.
template <class Types, class F>
void visit_dtype(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::F32: return f(TypeTag<float>{});
    case DType::F64: return f(TypeTag<double>{});
    case DType::F16: return f(TypeTag<typename Types::F16>{});
    case DType::BF16: return f(TypeTag<typename Types::BF16>{});
    case DType::I32: return f(TypeTag<int32_t>{});
    case DType::I64: return f(TypeTag<int64_t>{});
    case DType::U8: return f(TypeTag<uint8_t>{});
    case DType::Bool: return f(TypeTag<bool>{});
  }
  throw DTypeError(detail::cat_str(op, ": unknown dtype ", static_cast<int>(dtype)));
}

// As visit_dtype, for the floating dtypes; any other throws DTypeError naming op.
template <class Types, class F>
void visit_floating(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::F32: return f(TypeTag<float>{});
    case DType::F64: return f(TypeTag<double>{});
    case DType::F16: return f(TypeTag<typename Types::F16>{});
    case DType::BF16: return f(TypeTag<typename Types::BF16>{});
    default: break;
  }
  throw DTypeError(detail::cat_str(op, ": expected a floating dtype, got ", dtype_name(dtype)));
}

}  // namespace normcore
