// Element types: the DType enum, its sizes and names, PyTorch's type promotion, and the
// host-side 16-bit float types (Half, BFloat16) that store IEEE fp16 and bfloat16 bits.
// Half and BFloat16 convert to float exactly and from float with round-to-nearest-even.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {

enum class DType : uint8_t { F32, F64, F16, BF16, I32, I64, U8, Bool };

constexpr int kNumDTypes = 8;

size_t dtype_size(DType dtype);
// "f32", "f64", "f16", "bf16", "i32", "i64", "u8", "bool".
const char* dtype_name(DType dtype);
// Parses the names above; throws DTypeError on anything else.
DType dtype_from_name(const std::string& name);
bool is_floating(DType dtype);
// The dtype of a + b for tensors of these dtypes (PyTorch's promotion lattice:
// bool < u8 < i32 < i64 < f16, bf16 < f32 < f64; f16 with bf16 gives f32).
DType promote_types(DType a, DType b);

std::ostream& operator<<(std::ostream& os, DType dtype);

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

uint16_t float_to_half_bits(float f);
float half_bits_to_float(uint16_t h);

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                                      // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_bits_to_float(uint16_t b) { return bits_to_float(static_cast<uint32_t>(b) << 16); }

// IEEE 754 binary16, layout-compatible with CUDA's __half.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f) : bits(float_to_half_bits(f)) {}
  operator float() const { return half_bits_to_float(bits); }
  static Half from_bits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};

// bfloat16 (the top half of a float32), layout-compatible with CUDA's __nv_bfloat16.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(float_to_bf16_bits(f)) {}
  operator float() const { return bf16_bits_to_float(bits); }
  static BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

// C++ type <-> DType on the host.
template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::F32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::F64;
};
template <>
struct dtype_of<Half> {
  static constexpr DType value = DType::F16;
};
template <>
struct dtype_of<BFloat16> {
  static constexpr DType value = DType::BF16;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::I32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::I64;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::U8;
};
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::Bool;
};

}  // namespace normcore

#pragma GCC visibility pop
