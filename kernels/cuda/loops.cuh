// Building blocks shared by the CUDA kernels: the dtype visitor with device types, and the
// element-wise launcher. The launcher runs a functor `Out f(In...)` over tensors of one
// shape: a vectorized loop when every operand is contiguous and 16-byte aligned, otherwise a
// strided loop over the coalesced dims (any strides, 0 for broadcast dims), with 32-bit
// index math whenever every offset fits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cuda/std/tuple>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/vec.cuh"
#include "kernels/scalar/dtype.h"
#include "normcore/error.h"
#include "normcore/tensor.h"

namespace normcore {
namespace cuda {

// The dtype visitors with the device's element types (kernels/scalar/dtype.h).
template <class F>
void visit(DType dtype, const char* op, F&& f) {
  visit_dtype<DeviceTypes>(dtype, op, std::forward<F>(f));
}
template <class F>
void visit_float(DType dtype, const char* op, F&& f) {
  visit_floating<DeviceTypes>(dtype, op, std::forward<F>(f));
}

// ---------------------------------------------------------------- index loops
template <class Index, class F>
__global__ void index_kernel(Index count, F f) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) f(i);
}

// Runs f(i) for every i < count on the device, i of type Index: for element-wise passes
// whose element math needs its index, and for small per-row or per-channel loops.
template <class Index = int64_t, class F>
void for_each_index(const Launcher& launch, int64_t count, F f) {
  if (count == 0) return;
  launch(index_kernel<Index, F>, launch.grid_for(count), kThreads, 0, static_cast<Index>(count), f);
}

// Calls run(Index{}) with uint32_t when every index below count fits 31 bits, else int64_t.
template <class Run>
void with_index_type(int64_t count, Run run) {
  if (count <= std::numeric_limits<int32_t>::max()) run(uint32_t{});
  else run(int64_t{});
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
  return f(::cuda::std::get<I>(loaded).v[j]...);
}

// All operands contiguous and aligned to N elements; the last n % N elements are the tail.
template <int N, class F, class Out, class... In>
__global__ void elementwise_vectorized(int64_t n, F f, Out* __restrict__ out, const In* __restrict__... in) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t vectors = n / N;
  for (int64_t v = first; v < vectors; v += stride) {
    ::cuda::std::tuple<Vec<In, N>...> loaded{reinterpret_cast<const Vec<In, N>*>(in)[v]...};
    Vec<Out, N> result;
#pragma unroll
    for (int j = 0; j < N; ++j) result.v[j] = apply_at(f, loaded, j, std::index_sequence_for<In...>{});
    reinterpret_cast<Vec<Out, N>*>(out)[v] = result;
  }
  for (int64_t i = vectors * N + first; i < n; i += stride) out[i] = f(in[i]...);
}

template <class F, class Index, class Out, class... In, size_t... I>
__device__ __forceinline__ void apply_strided(const F& f, const Index (&offsets)[sizeof...(In) + 1], Out* out,
                                              std::index_sequence<I...>, const In*... in) {
  out[offsets[0]] = f(in[offsets[I + 1]]...);
}

template <class Index, class F, class Out, class... In>
__global__ void elementwise_strided(Index n, OffsetCalculator<sizeof...(In) + 1, Index> calc, F f, Out* out,
                                    const In*... in) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    Index offsets[sizeof...(In) + 1];
    calc.get(i, offsets);
    apply_strided(f, offsets, out, std::index_sequence_for<In...>{}, in...);
  }
}

template <class F, class Out, class... In>
void launch_strided(const Launcher& launch, const Geometry<sizeof...(In) + 1>& g, int outer_dim, F f, Out* out,
                    const In*... in);

// One slice of the outermost dim: every pointer moved to index i of that dim.
template <class F, class Out, class... In, size_t... I>
void launch_strided_slice(const Launcher& launch, const Geometry<sizeof...(In) + 1>& g, int outer_dim, F f,
                          const std::array<int64_t, sizeof...(In) + 1>& st, int64_t i, std::index_sequence<I...>,
                          Out* out, const In*... in) {
  launch_strided(launch, g, outer_dim, f, out + i * st[0], (in + i * st[I + 1])...);
}

// Launches the strided kernel over the innermost `outer_dim` dims of g; beyond kMaxDims
// it loops on the host over the outer dims (only tensors of more than 8 dims that do not
// merge get there).
template <class F, class Out, class... In>
void launch_strided(const Launcher& launch, const Geometry<sizeof...(In) + 1>& g, int outer_dim, F f, Out* out,
                    const In*... in) {
  constexpr int NARGS = sizeof...(In) + 1;
  if (outer_dim > kMaxDims) {
    const auto& st = g.strides[outer_dim - 1];
    for (int64_t i = 0; i < g.sizes[outer_dim - 1]; ++i) {
      launch_strided_slice(launch, g, outer_dim - 1, f, st, i, std::index_sequence_for<In...>{}, out, in...);
    }
    return;
  }
  int64_t n = 1;
  for (int d = 0; d < outer_dim; ++d) n *= g.sizes[d];
  const unsigned grid = launch.grid_for(n);
  // Kernels with a parameter pack are launched directly: their instantiations cannot be named
  // as function pointers for the launcher without spelling out their parameters.
  if (g.fits_32bit()) {
    const OffsetCalculator<NARGS, uint32_t> calc(g, 0, outer_dim);
    elementwise_strided<uint32_t>
        <<<grid, kThreads, 0, launch.stream()>>>(static_cast<uint32_t>(n), calc, f, out, in...);
  } else {
    const OffsetCalculator<NARGS, int64_t> calc(g, 0, outer_dim);
    elementwise_strided<int64_t><<<grid, kThreads, 0, launch.stream()>>>(n, calc, f, out, in...);
  }
  launch.check();
}

// out[i] = f(in[i]...) for every element of out's shape; the inputs are already expanded
// to it. Out and In are the device types of the tensors' dtypes.
template <class Out, class... In, class F>
void elementwise(const char* op, F f, const Tensor& out, const std::conditional_t<true, Tensor, In>&... in) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const Launcher launch(op, out);
  Out* out_ptr = data_as<Out>(out);

  constexpr int N = vec_width<Out, In...>();
  const bool contiguous = out.is_contiguous() && (in.is_contiguous() && ...);
  const bool aligned = is_aligned(out_ptr, sizeof(Out) * N) && (is_aligned(in.data_ptr(), sizeof(In) * N) && ...);
  if (contiguous && aligned) {
    elementwise_vectorized<N>
        <<<launch.grid_for(ceil_div(n, N)), kThreads, 0, launch.stream()>>>(n, f, out_ptr, data_as<const In>(in)...);
    launch.check();
    return;
  }
  const Geometry<sizeof...(In) + 1> g(out.shape(), {&out.strides(), &in.strides()...});
  launch_strided(launch, g, g.ndim(), f, out_ptr, data_as<const In>(in)...);
}

}  // namespace cuda
}  // namespace normcore
