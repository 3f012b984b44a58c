// Two 16-bit floats (f16 or bf16) in one 32-bit register, the form packed loads and stores
// and the packed instructions take: packing two floats, unpacking them, the packed max; and
// the special-function unit's exp2. Shared by the attention kernels and the row kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace normcore {
namespace cuda {

// 2^x by the special-function unit (ex2.approx: relative error about 2^-22, -inf gives 0),
// without the range fix-ups exp2f adds outside fast-math builds.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats as one register of two T (x in the low half), rounded to nearest.
template <class T>
__device__ __forceinline__ uint32_t pack2(float x, float y) {
  uint32_t bits;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 v = __floats2half2_rn(x, y);
    memcpy(&bits, &v, 4);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    memcpy(&bits, &v, 4);
  }
  return bits;
}

// The two T of a register as floats (the low half in x).
template <class T>
__device__ __forceinline__ float2 unpack2(uint32_t bits) {
  if constexpr (std::is_same_v<T, __half>) {
    __half2 v;
    memcpy(&v, &bits, 4);
    return __half22float2(v);
  } else {
    // A bf16 is the top half of the f32 of the same value.
    return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
  }
}

// The larger of each half of a and b in one instruction (sm_80 and later); where one half is
// NaN the other's is taken, as fmaxf does.
template <class T>
__device__ __forceinline__ uint32_t max2(uint32_t a, uint32_t b) {
  uint32_t bits;
  if constexpr (std::is_same_v<T, __half>) {
    __half2 x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    const __half2 m = __hmax2(x, y);
    memcpy(&bits, &m, 4);
  } else {
    __nv_bfloat162 x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    const __nv_bfloat162 m = __hmax2(x, y);
    memcpy(&bits, &m, 4);
  }
  return bits;
}

}  // namespace cuda
}  // namespace normcore
