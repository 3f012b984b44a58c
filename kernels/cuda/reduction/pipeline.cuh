// The pipelined pass over rows too long for one block to keep on chip: one persistent kernel
// reduces each row (S items, over chunks) and then applies the row's result to it (A items),
// trailing the reductions closely enough that a chunk it reads again is still in L2. Also
// the chunk visitors (16-byte loads with cache hints, scalar head and tail) that the
// normalization kernels use for their own row passes. The split is plan_pipeline
// (reduction/plan.h).
#pragma once

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/reduction/combine.cuh"
#include "kernels/cuda/reduction/plan.h"
#include "kernels/cuda/vec.cuh"
#include "kernels/scalar/dtype.h"

namespace normcore {
namespace cuda {

// Rows too long for one block to keep on chip run as one persistent kernel with two kinds
// of work item over chunks of rows: S items reduce a chunk to a partial, and the last S
// item of a row combines the row's partials (in chunk order) into its row info; A items
// apply the row info to a chunk. Blocks take items from an atomic counter in a fixed
// order where a row's A items follow all of its S items and trail the S stream by `lag`
// items, so a chunk read again by its A item is still in L2. An A item waits for its row;
// the S items it waits for were taken before it by blocks that are running and never
// wait themselves, so the scheme cannot deadlock whatever the number of resident blocks.
// Every resident block holds an item, so a chunk read by an S item is read again about
// (lag + resident items) chunks later: small chunks keep that within L2's 50 MB. That
// only works for rows of at most a few MB; longer rows (group norm's 8 MB groups, a whole
// tensor for Frobenius) run the two phases one after the other with large chunks and
// plain loads, which measured faster than any lag on the H100.
template <class A, int K>
struct RowInfo {
  A v[K];
};

// Position p in the item order -> whether it is an S item, and its chunk index k.
__device__ __forceinline__ bool decode_item(int64_t p, const PipelineShape& s, int64_t& k) {
  const int64_t n = s.items, d = s.lag;
  if (p < d) {
    k = p;
    return true;
  }
  if (p < 2 * n - d) {
    const int64_t q = p - d;
    k = q % 2 == 0 ? q / 2 : d + q / 2;
    return q % 2 != 0;
  }
  k = p - n;
  return false;
}

template <class A>
__device__ __forceinline__ Welford<A> load_cg(const Welford<A>* p) {
  return {__ldcg(&p->count), __ldcg(&p->mean), __ldcg(&p->m2)};
}
template <class A, int N>
__device__ __forceinline__ Sums<A, N> load_cg(const Sums<A, N>* p) {
  Sums<A, N> s;
#pragma unroll
  for (int k = 0; k < N; ++k) s.v[k] = __ldcg(&p->v[k]);
  return s;
}

// Loads each thread has in flight before it uses any, in the chunk visitors below.
constexpr int kVisitUnroll = 4;

// The block visits elements [g0, g1) of the flat inputs, 16 bytes at a time between a
// scalar head and tail: f(g, in0[g], in1[g]) for each head and tail element, and
// fv(g, in0[g .. g + V), in1[g .. g + V)) for each vector (in1 only when kInputs == 2).
// hinted: the vector loads are marked evict-last (the data is read again soon).
template <int kInputs, int kBlockThreads = kThreads, class T, class F, class FV>
__device__ __forceinline__ void visit_chunk(int64_t g0, int64_t g1, const T* __restrict__ in0,
                                            const T* __restrict__ in1, bool hinted, F&& f, FV&& fv) {
  using A = compute_t<T>;
  constexpr int V = 16 / sizeof(T);
  const int64_t body0 = min(g1, (g0 + V - 1) / V * V);
  const int64_t body1 = max(body0, g1 / V * V);
  auto scalar = [&](int64_t g) { f(g, convert<A>(in0[g]), kInputs == 2 ? convert<A>(in1[g]) : A(0)); };
  for (int64_t g = g0 + threadIdx.x; g < body0; g += kBlockThreads) scalar(g);
  // kVisitUnroll loads in flight per thread before any is used.
  const int64_t v_end = body1 / V;
  for (int64_t first = body0 / V + threadIdx.x; first < v_end; first += kBlockThreads * kVisitUnroll) {
    Vec<T, V> a[kVisitUnroll], b[kVisitUnroll];
#pragma unroll
    for (int u = 0; u < kVisitUnroll; ++u) {
      const int64_t v = first + u * kBlockThreads;
      if (v < v_end) {
        a[u] = hinted ? load_keep<T, V>(in0, v) : load_vec<T, V>(in0, v);
        if constexpr (kInputs == 2) b[u] = hinted ? load_keep<T, V>(in1, v) : load_vec<T, V>(in1, v);
      }
    }
#pragma unroll
    for (int u = 0; u < kVisitUnroll; ++u) {
      const int64_t v = first + u * kBlockThreads;
      if (v >= v_end) break;
      A x0[V], x1[V];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        x0[j] = convert<A>(a[u].v[j]);
        x1[j] = kInputs == 2 ? convert<A>(b[u].v[j]) : A(0);
      }
      fv(v * V, x0, x1);
    }
  }
  for (int64_t g = body1 + threadIdx.x; g < g1; g += kBlockThreads) scalar(g);
}

// The same, storing out[g] = f(g, in0[g], in1[g]); hinted: the inputs are read for the last
// time and out is not read again soon, so both are marked evict-first.
template <int kInputs, int kBlockThreads = kThreads, class T, class F>
__device__ __forceinline__ void apply_chunk(int64_t g0, int64_t g1, const T* __restrict__ in0,
                                            const T* __restrict__ in1, T* __restrict__ out, bool hinted, F&& f) {
  using A = compute_t<T>;
  constexpr int V = 16 / sizeof(T);
  const int64_t body0 = min(g1, (g0 + V - 1) / V * V);
  const int64_t body1 = max(body0, g1 / V * V);
  auto scalar = [&](int64_t g) {
    out[g] = convert<T>(f(g, convert<A>(in0[g]), kInputs == 2 ? convert<A>(in1[g]) : A(0)));
  };
  for (int64_t g = g0 + threadIdx.x; g < body0; g += kBlockThreads) scalar(g);
  const int64_t v_end = body1 / V;
  for (int64_t first = body0 / V + threadIdx.x; first < v_end; first += kBlockThreads * kVisitUnroll) {
    Vec<T, V> a[kVisitUnroll], b[kVisitUnroll];
#pragma unroll
    for (int u = 0; u < kVisitUnroll; ++u) {
      const int64_t v = first + u * kBlockThreads;
      if (v < v_end) {
        a[u] = hinted ? load_last_use<T, V>(in0, v) : load_vec<T, V>(in0, v);
        if constexpr (kInputs == 2) b[u] = hinted ? load_last_use<T, V>(in1, v) : load_vec<T, V>(in1, v);
      }
    }
#pragma unroll
    for (int u = 0; u < kVisitUnroll; ++u) {
      const int64_t v = first + u * kBlockThreads;
      if (v >= v_end) break;
      Vec<T, V> r;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        r.v[j] = convert<T>(f(v * V + j, convert<A>(a[u].v[j]), kInputs == 2 ? convert<A>(b[u].v[j]) : A(0)));
      }
      if (hinted) {
        store_streaming<T, V>(out, v, r);
      } else {
        reinterpret_cast<Vec<T, V>*>(out)[v] = r;
      }
    }
  }
  for (int64_t g = body1 + threadIdx.x; g < g1; g += kBlockThreads) scalar(g);
}

// Phase functors, each with a per-item context computed once per chunk:
//   reduce.context(row, begin) -> SCtx;  reduce(ctx, i, v0, v1) -> what R::add takes
//   finish(row, R) -> RowInfo            (also stores what backward needs)
//   apply.context(row, begin, RowInfo) -> ACtx;  apply(ctx, i, v0, v1) -> A
// where i is the element's index within its row.
template <int kInputs, class T, class R, class Info, class Reduce, class Finish, class Apply>
__global__ void __launch_bounds__(kThreads)
    pipeline_kernel(PipelineShape s, const T* __restrict__ in0, const T* __restrict__ in1, T* __restrict__ out,
                    R* partials, Info* infos, unsigned long long* counters, Reduce reduce, Finish finish, Apply apply) {
  using A = compute_t<T>;
  // counters: [0] the next item, [1 + row] S items done, [1 + rows + row] row ready.
  unsigned long long* next = counters;
  unsigned long long* done = counters + 1;
  unsigned long long* ready = counters + 1 + s.rows;
  __shared__ long long item_slot;
  __shared__ bool last_slot;
  __shared__ Info info_slot;
  if (threadIdx.x == 0) item_slot = static_cast<long long>(atomicAdd(next, 1ull));
  __syncthreads();
  int64_t item = item_slot;
  while (item < 2 * s.items) {
    // Take the next item now; its latency hides behind this one.
    unsigned long long following = 0;
    if (threadIdx.x == 0) following = atomicAdd(next, 1ull);
    int64_t k;
    const bool is_reduce = decode_item(item, s, k);
    const int64_t row = k / s.chunks, chunk = k % s.chunks;
    const int64_t span_begin = (chunk / s.pieces) * s.span;
    const int64_t begin = span_begin + (chunk % s.pieces) * s.chunk_len;
    const int64_t end = min(begin + s.chunk_len, span_begin + s.span);
    const int64_t base = row * s.row_len;
    if (is_reduce) {
      const auto ctx = reduce.context(row, begin);
      R acc = R::identity();
      constexpr int V = 16 / sizeof(T);
      visit_chunk<kInputs>(
          base + begin, base + end, in0, in1, s.reuse,
          [&](int64_t g, A v0, A v1) { acc.add(reduce(ctx, g - base, v0, v1)); },
          [&](int64_t g, const A(&x0)[V], const A(&x1)[V]) {
            decltype(reduce(ctx, 0, A(0), A(0))) c[V];
#pragma unroll
            for (int j = 0; j < V; ++j) c[j] = reduce(ctx, g - base + j, x0[j], x1[j]);
            acc.add_many(c);
          });
      acc = team_reduce<kThreads>(acc, Merge{});
      if (threadIdx.x == 0) {
        partials[k] = acc;
        __threadfence();
        last_slot = atomicAdd(&done[row], 1ull) == static_cast<unsigned long long>(s.chunks - 1);
      }
      __syncthreads();
      if (last_slot) {
        __threadfence();
        R total = R::identity();
        for (int64_t c = threadIdx.x; c < s.chunks; c += kThreads)
          total = combine(total, load_cg(&partials[row * s.chunks + c]));
        total = team_reduce<kThreads>(total, Merge{});
        if (threadIdx.x == 0) {
          infos[row] = finish(row, total);
          __threadfence();
          atomicExch(&ready[row], 1ull);
        }
      }
    } else {
      if (threadIdx.x == 0) {
        while (atomicAdd(&ready[row], 0ull) == 0) __nanosleep(100);
        __threadfence();
        Info info;
#pragma unroll
        for (int j = 0; j < static_cast<int>(sizeof(Info::v) / sizeof(A)); ++j) info.v[j] = __ldcg(&infos[row].v[j]);
        info_slot = info;
      }
      __syncthreads();
      const auto ctx = apply.context(row, begin, info_slot);
      apply_chunk<kInputs>(base + begin, base + end, in0, in1, out, s.reuse,
                           [&](int64_t g, A v0, A v1) { return apply(ctx, g - base, v0, v1); });
    }
    if (threadIdx.x == 0) item_slot = static_cast<long long>(following);
    __syncthreads();
    item = item_slot;
  }
}

template <int kInputs, class T, class R, class Info, class Reduce, class Finish, class Apply>
void run_pipeline(const Launcher& launch, const PipelineShape& s, const T* in0, const T* in1, T* out, R* partials,
                  Reduce reduce, Finish finish, Apply apply) {
  if (s.items == 0) return;
  const DeviceBuffer infos = launch.buffer(static_cast<size_t>(s.rows) * sizeof(Info));
  const size_t counter_bytes = static_cast<size_t>(1 + 2 * s.rows) * sizeof(unsigned long long);
  const DeviceBuffer counters = launch.buffer(counter_bytes);
  NC_CUDA_CHECK(cudaMemsetAsync(counters.as<void>(), 0, counter_bytes, launch.stream()));
  auto kernel = pipeline_kernel<kInputs, T, R, Info, Reduce, Finish, Apply>;
  launch(kernel, launch.resident_grid(kernel, kThreads, 0, 2 * s.items), kThreads, 0, s, in0, in1, out, partials,
         infos.as<Info>(), counters.as<unsigned long long>(), reduce, finish, apply);
}

}  // namespace cuda
}  // namespace normcore
