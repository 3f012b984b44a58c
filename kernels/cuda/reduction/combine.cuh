// How threads combine partial results: the accumulators (Welford statistics, plain sums,
// the best value and its index) and the warp and team reductions over them. Every
// reduction here has a fixed combination order, so results are deterministic for a given
// launch shape. Used by the reduce family, the normalization kernels and the fused ones.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

namespace normcore {
namespace cuda {

constexpr unsigned kFullMask = 0xffffffffu;

// ---------------------------------------------------------------- shuffles
template <class V>
__device__ __forceinline__ V shfl_xor(V v, int mask) {
  return static_cast<V>(__shfl_xor_sync(kFullMask, v, mask));
}

// ---------------------------------------------------------------- warp and team reductions
// Butterfly over groups of G consecutive lanes (G a power of two, at most 32): every lane
// ends with a combination of its group's values. Lane 0 of a group gets
// combine(combine(v0, v_{G/2}), ...) in a fixed tree; for a commutative combine (sums, a
// total order) every lane of the group gets the same bits.
template <int G, class R, class Combine>
__device__ __forceinline__ R warp_reduce(R r, const Combine& combine) {
#pragma unroll
  for (int offset = G / 2; offset > 0; offset /= 2) r = combine(r, shfl_xor(r, offset));
  return r;
}

// As warp_reduce over segments of `width` lanes chosen at run time.
template <class R, class Combine>
__device__ __forceinline__ R segment_reduce(R r, const Combine& combine, int width) {
  for (int offset = width / 2; offset > 0; offset /= 2) r = combine(r, shfl_xor(r, offset));
  return r;
}

// The kTeam threads of a team combine their values: a warp (kTeam <= 32, several teams per
// block) or the whole block (kTeam = blockDim.x, up to 1024). Warps reduce, then every
// thread combines the warps' results in warp order, so every thread gets the team's result
// (for a team of one warp, lane 0's; every lane's for a commutative combine). A chain of
// shared-memory reads is shorter than another butterfly for the up to 32 warp results,
// which matters to the kernels that reduce between their loads. Every thread of the team
// must call it.
template <int kTeam, class R, class Combine>
__device__ __forceinline__ R team_reduce(R r, const Combine& combine) {
  static_assert(kTeam <= 32 || kTeam % 32 == 0, "a team is part of a warp or whole warps");
  r = warp_reduce<(kTeam < 32 ? kTeam : 32)>(r, combine);
  if constexpr (kTeam > 32) {
    constexpr int kWarps = kTeam / 32;
    __shared__ R warp_results[kWarps];
    __syncthreads();  // an earlier call may still be reading
    if (threadIdx.x % 32 == 0) warp_results[threadIdx.x / 32] = r;
    __syncthreads();
    r = warp_results[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) r = combine(r, warp_results[w]);
  }
  return r;
}

// ---------------------------------------------------------------- accumulators
// Count, mean and sum of squared deviations of a set of values (Welford); two sets combine
// with Chan et al.'s formula, so the variance stays accurate when |mean| >> std.
template <class A>
struct Welford {
  A count, mean, m2;
  __host__ __device__ static Welford identity() { return {A(0), A(0), A(0)}; }
  __device__ __forceinline__ void add(A v) {
    count += A(1);
    const A delta = v - mean;
    mean += delta / count;
    m2 += delta * (v - mean);
  }
  // N values at once: their own two-pass mean and m2, then one Chan step (one division).
  template <int N>
  __device__ __forceinline__ void add_many(const A (&v)[N]) {
    A sum = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) sum += v[j];
    const A local_mean = sum * (A(1) / A(N));
    A local_m2 = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) local_m2 += (v[j] - local_mean) * (v[j] - local_mean);
    const A total = count + A(N);
    const A delta = local_mean - mean;
    const A share = A(N) / total;
    mean += delta * share;
    m2 += local_m2 + delta * delta * count * share;
    count = total;
  }
};

template <class A>
__device__ __forceinline__ Welford<A> combine(const Welford<A>& a, const Welford<A>& b) {
  const A count = a.count + b.count;
  if (count == A(0)) return a;
  const A delta = b.mean - a.mean;
  const A b_share = b.count / count;
  return {count, a.mean + delta * b_share, a.m2 + b.m2 + delta * delta * a.count * b_share};
}

template <class A>
__device__ __forceinline__ Welford<A> shfl_xor(const Welford<A>& w, int mask) {
  return {shfl_xor(w.count, mask), shfl_xor(w.mean, mask), shfl_xor(w.m2, mask)};
}

// N running sums.
template <class A, int N>
struct Sums {
  A v[N];
  __host__ __device__ static Sums identity() {
    Sums s;
    for (int k = 0; k < N; ++k) s.v[k] = A(0);
    return s;
  }
  __device__ __forceinline__ void add(const Sums& o) {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] += o.v[k];
  }
  template <int M>
  __device__ __forceinline__ void add_many(const Sums (&o)[M]) {
#pragma unroll
    for (int j = 0; j < M; ++j) add(o[j]);
  }
};

template <class A, int N>
__device__ __forceinline__ Sums<A, N> combine(Sums<A, N> a, const Sums<A, N>& b) {
  a.add(b);
  return a;
}

template <class A, int N>
__device__ __forceinline__ Sums<A, N> shfl_xor(Sums<A, N> s, int mask) {
#pragma unroll
  for (int k = 0; k < N; ++k) s.v[k] = shfl_xor(s.v[k], mask);
  return s;
}

// a + b, for plain sums.
struct Plus {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return a + b;
  }
};

// The larger and the smaller of two values (as a > b ? a : b: a NaN in `a` loses).
struct Max {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return a > b ? a : b;
  }
};
struct Min {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return a < b ? a : b;
  }
};

// The combine of an accumulator (Welford, Sums) as a functor, for the reductions above.
struct Merge {
  template <class R>
  __device__ __forceinline__ R operator()(const R& a, const R& b) const {
    return combine(a, b);
  }
};

// The best value seen and its index (argmax, argmin, the fused op's row minimum).
template <class C>
struct ArgBest {
  C value;
  int64_t index;
};

template <class C>
__device__ __forceinline__ ArgBest<C> shfl_xor(const ArgBest<C>& a, int mask) {
  return {shfl_xor(a.value, mask), shfl_xor(a.index, mask)};
}

// The better of two candidates: a NaN beats any number, then the larger (IS_MAX) or smaller
// value, then the lower index. That is a total order, so the result does not depend on the
// order candidates are combined in.
template <class C, bool IS_MAX>
struct ArgCombine {
  __device__ __forceinline__ ArgBest<C> operator()(const ArgBest<C>& a, const ArgBest<C>& b) const {
    const bool a_nan = a.value != a.value, b_nan = b.value != b.value;
    if (a_nan || b_nan) {
      if (a_nan && b_nan) return a.index < b.index ? a : b;
      return a_nan ? a : b;
    }
    if (a.value == b.value) return a.index < b.index ? a : b;
    return (IS_MAX ? a.value > b.value : a.value < b.value) ? a : b;
  }
};

template <class C>
__host__ __device__ constexpr C lowest_value() {
  if constexpr (std::numeric_limits<C>::has_infinity) return -std::numeric_limits<C>::infinity();
  else return std::numeric_limits<C>::lowest();
}
template <class C>
__host__ __device__ constexpr C highest_value() {
  if constexpr (std::numeric_limits<C>::has_infinity) return std::numeric_limits<C>::infinity();
  else return std::numeric_limits<C>::max();
}

// The candidate every element beats: the worst value, an index past any column.
template <class C, bool IS_MAX>
__host__ __device__ constexpr ArgBest<C> no_candidate() {
  return {IS_MAX ? lowest_value<C>() : highest_value<C>(), std::numeric_limits<int64_t>::max()};
}

}  // namespace cuda
}  // namespace normcore
