// Building blocks shared by the CUDA kernels: dtype dispatch to device types, conversions,
// 16-byte vectors, and the element-wise launcher. The launcher runs a functor
// `Out f(In...)` over tensors of one shape: a vectorized loop when every operand is
// contiguous and 16-byte aligned, otherwise a strided loop over the coalesced dims (any
// strides, 0 for broadcast dims), with 32-bit index math whenever every offset fits.
#pragma once

#include <cuda/std/tuple>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/runtime.h"
#include "normcore/error.h"
#include "normcore/tensor.h"

namespace normcore {
namespace cuda_kernels {

// ---------------------------------------------------------------- dtype dispatch
template <class T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with the device type of dtype: float, double, __half,
// __nv_bfloat16, int32_t, int64_t, uint8_t, bool.
template <class F>
void dispatch_all(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::F32: return f(TypeTag<float>{});
    case DType::F64: return f(TypeTag<double>{});
    case DType::F16: return f(TypeTag<__half>{});
    case DType::BF16: return f(TypeTag<__nv_bfloat16>{});
    case DType::I32: return f(TypeTag<int32_t>{});
    case DType::I64: return f(TypeTag<int64_t>{});
    case DType::U8: return f(TypeTag<uint8_t>{});
    case DType::Bool: return f(TypeTag<bool>{});
  }
  throw DTypeError(detail::cat_str(op, ": unknown dtype ", static_cast<int>(dtype)));
}

template <class F>
void dispatch_floating(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::F32: return f(TypeTag<float>{});
    case DType::F64: return f(TypeTag<double>{});
    case DType::F16: return f(TypeTag<__half>{});
    case DType::BF16: return f(TypeTag<__nv_bfloat16>{});
    default: break;
  }
  throw DTypeError(detail::cat_str(op, ": expected a floating dtype, got ", dtype_name(dtype)));
}

template <class T>
constexpr bool is_reduced_float_v = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;
template <class T>
constexpr bool is_floating_v = std::is_floating_point_v<T> || is_reduced_float_v<T>;

// The type arithmetic on T happens in: f16 and bf16 compute in float.
template <class T>
using compute_t = std::conditional_t<is_reduced_float_v<T>, float, T>;

// Value conversion with the CPU backend's rules: 16-bit floats go through float with
// round-to-nearest-even, anything to bool is "non-zero", the rest is static_cast.
template <class To, class From>
__host__ __device__ __forceinline__ To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (is_reduced_float_v<From>) {
    return convert<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_same_v<To, __half>) {
    return __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

template <class T>
T* data_as(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// A Scalar as a value of T: integers convert from their exact int64 value, as the CPU
// backend converts them (going through double first could round twice).
template <class T>
T scalar_as(Scalar s) {
  return s.is_integral() ? convert<T>(s.to_int()) : convert<T>(s.to_double());
}

// ---------------------------------------------------------------- vectors
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

// ---------------------------------------------------------------- launch sizes
constexpr int kThreads = 256;

// Blocks for a grid-stride loop over `work` items: enough to fill the device several
// times over, never more than the work needs.
inline unsigned grid_for(int64_t work, int device, int threads = kThreads) {
  int64_t needed = (work + threads - 1) / threads;
  int64_t cap = static_cast<int64_t>(cuda_runtime::multiprocessor_count(device)) * 32;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(needed, cap)));
}

// ---------------------------------------------------------------- strided index math
// Division by a fixed divisor as a multiply and shift (valid for n < 2^31), after
// Granlund and Montgomery; the 64-bit index path divides plainly.
template <class Index>
struct IntDivider;

template <>
struct IntDivider<uint32_t> {
  uint32_t divisor = 1, magic = 1, shift = 0;
  IntDivider() = default;
  explicit IntDivider(uint32_t d) : divisor(d) {
    while (shift < 32 && (uint64_t{1} << shift) < d) ++shift;
    magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const { return (__umulhi(n, magic) + n) >> shift; }
};

template <>
struct IntDivider<int64_t> {
  int64_t divisor = 1;
  IntDivider() = default;
  explicit IntDivider(int64_t d) : divisor(d) {}
  __device__ __forceinline__ int64_t div(int64_t n) const { return n / divisor; }
};

constexpr int kMaxDims = 8;

// Sizes and per-operand strides (in elements) of an element-wise problem, innermost dim
// first, with size-1 dims dropped and dims merged where every operand is contiguous
// across them. Operand 0 is the output.
template <int NARGS>
struct Geometry {
  std::vector<int64_t> sizes;
  std::vector<std::array<int64_t, NARGS>> strides;

  Geometry(const Shape& shape, const std::array<const Shape*, NARGS>& operand_strides) {
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      if (shape[d] == 1) continue;
      std::array<int64_t, NARGS> st;
      for (int k = 0; k < NARGS; ++k) st[k] = (*operand_strides[k])[d];
      if (!sizes.empty()) {
        bool mergeable = true;
        for (int k = 0; k < NARGS; ++k) mergeable &= st[k] == strides.back()[k] * sizes.back();
        if (mergeable) {
          sizes.back() *= shape[d];
          continue;
        }
      }
      sizes.push_back(shape[d]);
      strides.push_back(st);
    }
  }
  int ndim() const { return static_cast<int>(sizes.size()); }

  // Whether every linear index and offset fits the 32-bit path.
  bool fits_32bit() const {
    int64_t numel = 1;
    std::array<int64_t, NARGS> max_offset{};
    for (int d = 0; d < ndim(); ++d) {
      numel *= sizes[d];
      for (int k = 0; k < NARGS; ++k) {
        if (strides[d][k] < 0) return false;
        max_offset[k] += (sizes[d] - 1) * strides[d][k];
      }
    }
    constexpr int64_t limit = std::numeric_limits<int32_t>::max();
    return numel <= limit && *std::max_element(max_offset.begin(), max_offset.end()) <= limit;
  }
};

// Maps a linear index (row-major over the problem's shape) to each operand's offset.
template <int NARGS, class Index>
struct OffsetCalculator {
  int ndim = 0;
  IntDivider<Index> sizes[kMaxDims];
  Index strides[kMaxDims][NARGS];

  // Uses the innermost `ndim` dims of geometry starting at dim `first`.
  OffsetCalculator(const Geometry<NARGS>& g, int first, int count) : ndim(count) {
    for (int d = 0; d < count; ++d) {
      sizes[d] = IntDivider<Index>(static_cast<Index>(g.sizes[first + d]));
      for (int k = 0; k < NARGS; ++k) strides[d][k] = static_cast<Index>(g.strides[first + d][k]);
    }
  }

  __device__ __forceinline__ void get(Index linear, Index (&offsets)[NARGS]) const {
#pragma unroll
    for (int k = 0; k < NARGS; ++k) offsets[k] = 0;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {
      if (d == ndim) break;
      // The outermost dim needs no division: what is left of the index is its coordinate.
      Index q = d + 1 < ndim ? sizes[d].div(linear) : 0;
      Index coord = linear - q * sizes[d].divisor;
#pragma unroll
      for (int k = 0; k < NARGS; ++k) offsets[k] += coord * strides[d][k];
      linear = q;
    }
  }
};

// ---------------------------------------------------------------- element-wise kernels
template <class F, class Tuple, size_t... I>
__device__ __forceinline__ auto apply_at(const F& f, const Tuple& loaded, int j, std::index_sequence<I...>) {
  return f(cuda::std::get<I>(loaded).v[j]...);
}

// All operands contiguous and aligned to N elements; the last n % N elements are the tail.
template <int N, class F, class Out, class... In>
__global__ void elementwise_vectorized(int64_t n, F f, Out* __restrict__ out, const In* __restrict__... in) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t vectors = n / N;
  for (int64_t v = first; v < vectors; v += stride) {
    cuda::std::tuple<Vec<In, N>...> loaded{reinterpret_cast<const Vec<In, N>*>(in)[v]...};
    Vec<Out, N> result;
#pragma unroll
    for (int j = 0; j < N; ++j) result.v[j] = apply_at(f, loaded, j, std::index_sequence_for<In...>{});
    reinterpret_cast<Vec<Out, N>*>(out)[v] = result;
  }
  for (int64_t i = vectors * N + first; i < n; i += stride) out[i] = f(in[i]...);
}

template <class F, class Index, class Out, class... In, size_t... I>
__device__ __forceinline__ void apply_strided(const F& f, const Index (&offsets)[sizeof...(In) + 1],
                                              Out* out, std::index_sequence<I...>, const In*... in) {
  out[offsets[0]] = f(in[offsets[I + 1]]...);
}

template <class Index, class F, class Out, class... In>
__global__ void elementwise_strided(Index n, OffsetCalculator<sizeof...(In) + 1, Index> calc, F f,
                                    Out* out, const In*... in) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    Index offsets[sizeof...(In) + 1];
    calc.get(i, offsets);
    apply_strided(f, offsets, out, std::index_sequence_for<In...>{}, in...);
  }
}

template <class F, class Out, class... In>
void launch_strided(const char* op, const Geometry<sizeof...(In) + 1>& g, int outer_dim, F f,
                    int device, cudaStream_t stream, Out* out, const In*... in);

// One slice of the outermost dim: every pointer moved to index i of that dim.
template <class F, class Out, class... In, size_t... I>
void launch_strided_slice(const char* op, const Geometry<sizeof...(In) + 1>& g, int outer_dim, F f,
                          int device, cudaStream_t stream, const std::array<int64_t, sizeof...(In) + 1>& st,
                          int64_t i, std::index_sequence<I...>, Out* out, const In*... in) {
  launch_strided(op, g, outer_dim, f, device, stream, out + i * st[0], (in + i * st[I + 1])...);
}

// Launches the strided kernel over the innermost `outer_dim` dims of g; beyond kMaxDims
// it loops on the host over the outer dims (only tensors of more than 8 dims that do not
// merge get there).
template <class F, class Out, class... In>
void launch_strided(const char* op, const Geometry<sizeof...(In) + 1>& g, int outer_dim, F f,
                    int device, cudaStream_t stream, Out* out, const In*... in) {
  constexpr int NARGS = sizeof...(In) + 1;
  if (outer_dim > kMaxDims) {
    const auto& st = g.strides[outer_dim - 1];
    for (int64_t i = 0; i < g.sizes[outer_dim - 1]; ++i) {
      launch_strided_slice(op, g, outer_dim - 1, f, device, stream, st, i,
                           std::index_sequence_for<In...>{}, out, in...);
    }
    return;
  }
  int64_t n = 1;
  for (int d = 0; d < outer_dim; ++d) n *= g.sizes[d];
  unsigned grid = grid_for(n, device);
  if (g.fits_32bit()) {
    OffsetCalculator<NARGS, uint32_t> calc(g, 0, outer_dim);
    elementwise_strided<uint32_t><<<grid, kThreads, 0, stream>>>(static_cast<uint32_t>(n), calc, f, out, in...);
  } else {
    OffsetCalculator<NARGS, int64_t> calc(g, 0, outer_dim);
    elementwise_strided<int64_t><<<grid, kThreads, 0, stream>>>(n, calc, f, out, in...);
  }
  NC_CUDA_KERNEL_CHECK(op);
}

// out[i] = f(in[i]...) for every element of out's shape; the inputs are already expanded
// to it. Out and In are the device types of the tensors' dtypes.
template <class Out, class... In, class F>
void elementwise(const char* op, F f, const Tensor& out, const std::conditional_t<true, Tensor, In>&... in) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const int device = out.device().index;
  cuda_runtime::DeviceGuard guard(device);
  cudaStream_t stream = cuda_runtime::stream(device);
  Out* out_ptr = data_as<Out>(out);

  constexpr int N = vec_width<Out, In...>();
  bool contiguous = out.is_contiguous() && (in.is_contiguous() && ...);
  bool aligned = is_aligned(out_ptr, sizeof(Out) * N) && (is_aligned(in.data_ptr(), sizeof(In) * N) && ...);
  if (contiguous && aligned) {
    elementwise_vectorized<N><<<grid_for((n + N - 1) / N, device), kThreads, 0, stream>>>(
        n, f, out_ptr, data_as<const In>(in)...);
    NC_CUDA_KERNEL_CHECK(op);
    return;
  }
  Geometry<sizeof...(In) + 1> g(out.shape(), {&out.strides(), &in.strides()...});
  launch_strided(op, g, g.ndim(), f, device, stream, out_ptr, data_as<const In>(in)...);
}

}  // namespace cuda_kernels
}  // namespace normcore
