// CPU loop helpers: the dtype visitor with host element types, and a strided N-operand loop
// that coalesces dims so that contiguous data runs one flat loop.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/backend.h"
#include "kernels/scalar/dtype.h"
#include "normcore/tensor.h"

namespace normcore {
namespace cpu {

// The dtype visitors with the host's element types (kernels/scalar/dtype.h).
template <class F>
void visit(DType dtype, const char* op, F&& f) {
  visit_dtype<HostTypes>(dtype, op, std::forward<F>(f));
}
template <class F>
void visit_float(DType dtype, const char* op, F&& f) {
  visit_floating<HostTypes>(dtype, op, std::forward<F>(f));
}

// Dims left after merging (each of size >= 2) must fit the loop's fixed arrays; 64 such
// dims would already mean 2^64 elements.
constexpr int kMaxLoopDims = 64;

// Visits every element of shape for N operands with the given element strides. Calls
// body(offsets, n, inner_strides): offsets[k] is operand k's element offset of a run of n
// elements along the innermost (coalesced) dim, which advances by inner_strides[k].
template <size_t N, class Body>
void strided_loop(const Shape& shape, const std::array<const int64_t*, N>& strides, Body&& body) {
  int64_t sizes[kMaxLoopDims];
  int64_t st[N][kMaxLoopDims];
  int nd = 0;
  // Drop size-1 dims and merge dims that are contiguous with the next for every operand.
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return;
    if (shape[d] == 1) continue;
    bool merge = nd > 0;
    for (size_t k = 0; k < N && merge; ++k) merge = st[k][nd - 1] == strides[k][d] * shape[d];
    if (merge) {
      sizes[nd - 1] *= shape[d];
      for (size_t k = 0; k < N; ++k) st[k][nd - 1] = strides[k][d];
    } else {
      NC_CHECK(nd < kMaxLoopDims, ShapeError, "cpu kernel: shape ", shape, " has more than ",
               kMaxLoopDims, " dims that cannot be merged");
      sizes[nd] = shape[d];
      for (size_t k = 0; k < N; ++k) st[k][nd] = strides[k][d];
      ++nd;
    }
  }
  std::array<int64_t, N> offsets{};
  std::array<int64_t, N> inner{};
  if (nd == 0) {
    for (size_t k = 0; k < N; ++k) inner[k] = 1;
    body(offsets, int64_t{1}, inner);
    return;
  }
  for (size_t k = 0; k < N; ++k) inner[k] = st[k][nd - 1];
  int64_t run = sizes[nd - 1];
  int64_t counter[kMaxLoopDims] = {0};
  while (true) {
    body(offsets, run, inner);
    int d = nd - 2;
    for (; d >= 0; --d) {
      ++counter[d];
      for (size_t k = 0; k < N; ++k) offsets[k] += st[k][d];
      if (counter[d] < sizes[d]) break;
      for (size_t k = 0; k < N; ++k) offsets[k] -= st[k][d] * sizes[d];
      counter[d] = 0;
    }
    if (d < 0) return;
  }
}

template <class Out, class... In, class F, class... Ts, size_t... I>
void map_impl(std::index_sequence<I...>, const Tensor& out, F& f, const Ts&... in) {
  constexpr size_t N = 1 + sizeof...(In);
  std::array<const int64_t*, N> strides{out.strides().data(), in.strides().data()...};
  Out* o = static_cast<Out*>(out.data_ptr());
  std::tuple<const In*...> ptrs{static_cast<const In*>(in.data_ptr())...};
  strided_loop<N>(out.shape(), strides,
                  [&](const std::array<int64_t, N>& off, int64_t n, const std::array<int64_t, N>& inc) {
                    Out* op = o + off[0];
                    bool contiguous = ((inc[I + 1] == 1) && ... && (inc[0] == 1));
                    if (contiguous) {
                      for (int64_t i = 0; i < n; ++i) op[i] = f(std::get<I>(ptrs)[off[I + 1] + i]...);
                    } else {
                      for (int64_t i = 0; i < n; ++i)
                        op[i * inc[0]] = f(std::get<I>(ptrs)[off[I + 1] + i * inc[I + 1]]...);
                    }
                  });
}

// Applies out[i] = f(in[i]...) over tensors of one shape (out may be strided too).
template <class Out, class... In, class F, class... Ts>
void map(const Tensor& out, F&& f, const Ts&... in) {
  static_assert(sizeof...(In) == sizeof...(Ts), "map: one element type per input tensor");
  map_impl<Out, In...>(std::index_sequence_for<In...>{}, out, f, in...);
}

}  // namespace cpu
}  // namespace normcore
