// CPU loop helpers: the dtype visitor with host element types, and a strided N-operand loop
// that coalesces dims so that contiguous data runs one flat loop, cut into ranges for the
// thread pool when it is large.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/backend.h"
#include "kernels/cpu/parallel.h"
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

// The dims of a loop over N operands after dropping size-1 dims and merging dims that are
// contiguous with the next for every operand; the innermost dim is last.
template <size_t N>
struct LoopDims {
  int nd = 0;
  int64_t total = 1;  // elements; 0 when a dim is empty
  int64_t sizes[kMaxLoopDims];
  int64_t st[N][kMaxLoopDims];

  LoopDims(const Shape& shape, const std::array<const int64_t*, N>& strides) {
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 0) {
        total = 0;
        return;
      }
      if (shape[d] == 1) continue;
      bool merge = nd > 0;
      for (size_t k = 0; k < N && merge; ++k) merge = st[k][nd - 1] == strides[k][d] * shape[d];
      if (merge) {
        sizes[nd - 1] *= shape[d];
        for (size_t k = 0; k < N; ++k) st[k][nd - 1] = strides[k][d];
      } else {
        NC_CHECK(nd < kMaxLoopDims, ShapeError, "cpu kernel: shape ", shape, " has more than ", kMaxLoopDims,
                 " dims that cannot be merged");
        sizes[nd] = shape[d];
        for (size_t k = 0; k < N; ++k) st[k][nd] = strides[k][d];
        ++nd;
      }
      total *= shape[d];
    }
  }

  // Whether operand k visits a distinct element at every position (no stride-0 dim).
  bool distinct(size_t k) const {
    for (int d = 0; d < nd; ++d)
      if (st[k][d] == 0) return false;
    return true;
  }

  // Calls body(offsets, n, inner_strides) for the elements [begin, end) in loop order, as
  // runs along the innermost dim (see strided_loop).
  template <class Body>
  void visit(int64_t begin, int64_t end, Body& body) const {
    std::array<int64_t, N> offsets{};
    std::array<int64_t, N> inner{};
    if (nd == 0) {
      for (size_t k = 0; k < N; ++k) inner[k] = 1;
      if (begin < end) body(offsets, int64_t{1}, inner);
      return;
    }
    for (size_t k = 0; k < N; ++k) inner[k] = st[k][nd - 1];
    const int64_t run = sizes[nd - 1];
    // The position of begin: counters of the outer dims and the start within its run.
    int64_t counter[kMaxLoopDims] = {0};
    int64_t rest = begin / run, first = begin % run;
    for (int d = nd - 2; d >= 0; --d) {
      counter[d] = rest % sizes[d];
      rest /= sizes[d];
      for (size_t k = 0; k < N; ++k) offsets[k] += counter[d] * st[k][d];
    }
    for (int64_t pos = begin; pos < end;) {
      const int64_t n = std::min(run - first, end - pos);
      std::array<int64_t, N> at = offsets;
      for (size_t k = 0; k < N; ++k) at[k] += first * inner[k];
      body(at, n, inner);
      pos += n;
      first = 0;
      for (int d = nd - 2; d >= 0; --d) {
        ++counter[d];
        for (size_t k = 0; k < N; ++k) offsets[k] += st[k][d];
        if (counter[d] < sizes[d]) break;
        for (size_t k = 0; k < N; ++k) offsets[k] -= st[k][d] * sizes[d];
        counter[d] = 0;
      }
    }
  }
};

// Elements a range of an element-wise loop covers: a few hundred KB of operands.
constexpr int64_t kLoopGrain = 32768;

// Visits every element of shape for N operands with the given element strides. Calls
// body(offsets, n, inner_strides): offsets[k] is operand k's element offset of a run of n
// elements along the innermost (coalesced) dim, which advances by inner_strides[k]. Large
// loops whose first operand (the output) has a distinct element at every position run
// their ranges on the thread pool, so body must write only through the first operand.
template <size_t N, class Body>
void strided_loop(const Shape& shape, const std::array<const int64_t*, N>& strides, Body&& body) {
  const LoopDims<N> dims(shape, strides);
  if (dims.total == 0) return;
  if (dims.total < 2 * kLoopGrain || !dims.distinct(0)) {
    dims.visit(0, dims.total, body);
    return;
  }
  parallel_for(dims.total, kLoopGrain, [&](int64_t begin, int64_t end) { dims.visit(begin, end, body); });
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
