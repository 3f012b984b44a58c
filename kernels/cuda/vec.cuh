// 16-byte vectors and the loads and stores that move them, with and without cache hints:
// what every bandwidth-bound kernel here reads and writes with.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace normcore {
namespace cuda {

// N elements loaded or stored with one instruction (N * sizeof(T) <= 16 bytes).
template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// Elements of the widest operand that fit in 16 bytes.
template <class... T>
constexpr int vec_width() {
  constexpr size_t widest = std::max({sizeof(T)...});
  return static_cast<int>(16 / widest);
}

inline bool is_aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// The integer type of a vector's width: a Vec moves through it, so that it takes one load or
// store instruction wherever the address comes from (through the Vec type itself the
// compiler has split stores to computed addresses into one per element).
template <int Bytes>
struct RawBits;
template <>
struct RawBits<1> {
  using type = unsigned char;
};
template <>
struct RawBits<2> {
  using type = unsigned short;
};
template <>
struct RawBits<4> {
  using type = unsigned;
};
template <>
struct RawBits<8> {
  using type = uint2;
};
template <>
struct RawBits<16> {
  using type = uint4;
};

// Vector j of V elements from p.
template <class T, int V>
__device__ __forceinline__ Vec<T, V> load_vec(const T* p, int64_t j) {
  using Raw = typename RawBits<sizeof(Vec<T, V>)>::type;
  const Raw raw = reinterpret_cast<const Raw*>(p)[j];
  Vec<T, V> out;
  memcpy(&out, &raw, sizeof(out));
  return out;
}

template <class T, int V>
__device__ __forceinline__ void store_vec(T* p, int64_t j, const Vec<T, V>& value) {
  using Raw = typename RawBits<sizeof(Vec<T, V>)>::type;
  Raw raw;
  memcpy(&raw, &value, sizeof(raw));
  reinterpret_cast<Raw*>(p)[j] = raw;
}

// Data read for the last time: marked evict-first, leaving L2 to data that is read again.
template <class T, int V>
__device__ __forceinline__ Vec<T, V> load_last_use(const T* p, int64_t v) {
  static_assert(sizeof(Vec<T, V>) == 16, "16-byte vectors only");
  const uint4 raw = __ldcs(reinterpret_cast<const uint4*>(p) + v);
  Vec<T, V> out;
  memcpy(&out, &raw, 16);
  return out;
}

// Data that will be read again soon: marked evict-last, so that it stays in L2.
template <class T, int V>
__device__ __forceinline__ Vec<T, V> load_keep(const T* p, int64_t v) {
  static_assert(sizeof(Vec<T, V>) == 16, "16-byte vectors only");
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  uint4 raw;
  asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(raw.x), "=r"(raw.y), "=r"(raw.z), "=r"(raw.w)
               : "l"(reinterpret_cast<const uint4*>(p) + v), "l"(policy));
  Vec<T, V> out;
  memcpy(&out, &raw, 16);
  return out;
}

// A result that is not read again soon: written evict-first.
template <class T, int V>
__device__ __forceinline__ void store_streaming(T* p, int64_t v, const Vec<T, V>& value) {
  uint4 raw;
  memcpy(&raw, &value, 16);
  __stcs(reinterpret_cast<uint4*>(p) + v, raw);
}

// A 4-, 8- or 16-byte copy from device to shared memory that does not pass through registers
// (cp.async); copies_landed() waits for all of the thread's.
template <int Bytes>
__device__ __forceinline__ void copy_async(void* shared, const void* global) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async copies 4, 8 or 16 bytes");
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  if constexpr (Bytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(global));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(address), "l"(global), "n"(Bytes));
  }
}

// Closes the thread's copies issued since the last call into one group, to wait on as a unit.
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

__device__ __forceinline__ void copies_landed() {
  commit_copies();
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

}  // namespace cuda
}  // namespace normcore
