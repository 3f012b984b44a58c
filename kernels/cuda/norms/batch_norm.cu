// Batch norm on CUDA (contract: kernels/norms.h). x [batch, channels, spatial]: a channel's
// statistics run over its `batch` planes of `spatial` contiguous elements, channels * spatial
// apart. plan_batch_norm (plan.h) picks the layout of the passes:
//   Planes   planes of kBatchNormMinPlane elements or more: the reduction runs blocks per
//            channel (one wave of the device in all), each over a contiguous range of the
//            channel's vectors (a vector lies within one plane); the element pass sweeps the
//            tensor in memory order, as a copy does, finding each vector's channel;
//   Columns  shorter planes (BatchNorm1d's [N, C]): threads across the channels * spatial
//            columns of a sample, blocks across slices of the batch, in both passes.
// Each direction is a reduction writing per-block (Planes) or per-column-and-slice (Columns)
// partials, Welford forward and sums backward; a finish kernel in which one warp per channel
// combines that channel's partials in a fixed order (deterministic statistics and parameter
// gradients, no atomics); and an element pass with per-channel coefficients:
//   forward:  y = (x - mean) * (rstd * w) + b; the running statistics are updated in the finish
//   backward: grad_x = w * rstd * (dy - mean(dy) - (x - mean) * rstd^2 * mean(dy * (x - mean)))
//             in training, w * rstd * dy in evaluation; grad_weight = sum(dy * (x - mean)) *
//             rstd, grad_bias = sum(dy).
// Welford/Chan statistics stay exact when |mean| >> std. Accumulation in A = compute_t<T>.
// A single kernel per direction that keeps a channel in a cluster's shared memory was
// measured slower than these passes (docs/PERFORMANCE.md) and is not used.
#include <algorithm>
#include <initializer_list>
#include <optional>
#include <type_traits>

#include "kernels/cuda/norms/norms.cuh"

namespace normcore {
namespace cuda {
namespace {

// ---------------------------------------------------------------- plan
// The plan is plan.h's plan_batch_norm; these are what its launchers add.
constexpr int kUnroll = kBatchNormUnroll;
constexpr int64_t kPlaneMinBlockVecs = 1024;  // a Planes block reads at least this many vectors
static_assert(kThreads == 256, "plan_batch_norm plans blocks of 256 threads");

// The Planes reduction's blocks: `splits` per channel of per_block vectors each.
struct PlaneSplit {
  int64_t splits, per_block;
};

// The widest load (a power of two of elements, at most 16 bytes) that every pointer is
// aligned to; null pointers (absent operands) do not count.
int aligned_vector(int element_bytes, std::initializer_list<const void*> pointers) {
  int v = 16 / element_bytes;
  for (const void* p : pointers) {
    while (v > 1 && p != nullptr && !is_aligned(p, static_cast<size_t>(v) * element_bytes)) v /= 2;
  }
  return v;
}

// As many blocks as the device holds at once (`resident`), whole splits per channel, none of
// fewer than kPlaneMinBlockVecs vectors: the blocks do equal work, so one wave finishes
// together.
PlaneSplit plan_plane_split(int64_t vecs, int64_t channels, int64_t resident) {
  const int64_t splits =
      std::clamp<int64_t>(resident / channels, 1, std::max<int64_t>(1, ceil_div(vecs, kPlaneMinBlockVecs)));
  const int64_t per_block = ceil_div(vecs, splits);
  return {ceil_div(vecs, per_block), per_block};
}

// Calls f(std::integral_constant<int, V>{}) for a plan's vector (at most 16 bytes of T).
template <class T, class F>
void with_load_vector(int vector, F&& f) {
  if constexpr (sizeof(T) <= 2) {
    if (vector == 8) return f(std::integral_constant<int, 8>{});
  }
  if constexpr (sizeof(T) <= 4) {
    if (vector == 4) return f(std::integral_constant<int, 4>{});
  }
  if (vector == 2) return f(std::integral_constant<int, 2>{});
  return f(std::integral_constant<int, 1>{});
}

// ---------------------------------------------------------------- geometry
// Planes reduction: vector j of a channel (j < vecs) is vector j % plane_vecs of plane
// j / plane_vecs.
template <class Index>
struct PlaneGrid {
  IntDivider<Index> plane_vecs;
  Index vecs, per_block;
  int64_t splits, spatial, plane_stride;  // plane_stride = channels * spatial
  template <int V>
  __device__ __forceinline__ int64_t offset(int64_t channel, Index j) const {
    const Index plane = plane_vecs.div(j);
    const Index within = j - plane * plane_vecs.divisor;
    return static_cast<int64_t>(plane) * plane_stride + channel * spatial + static_cast<int64_t>(within) * V;
  }
};

template <class Index>
PlaneGrid<Index> plane_grid(const BatchLayout& l, int vector, const PlaneSplit& split) {
  return {IntDivider<Index>(static_cast<Index>(l.spatial / vector)),
          static_cast<Index>(l.count() / vector),
          static_cast<Index>(split.per_block),
          split.splits,
          l.spatial,
          l.channels * l.spatial};
}

// Planes element pass: the tensor's vectors in memory order; vector e lies in plane
// e / plane_vecs, of channel plane % channels.
template <class Index>
struct PlaneSweep {
  IntDivider<Index> plane_vecs, channels;
  Index vecs;  // in the tensor
  __device__ __forceinline__ int64_t channel(Index e) const {
    const Index plane = plane_vecs.div(e);
    return plane - channels.div(plane) * channels.divisor;
  }
};

template <class Index>
PlaneSweep<Index> plane_sweep(const BatchLayout& l, int vector) {
  return {IntDivider<Index>(static_cast<Index>(l.spatial / vector)), IntDivider<Index>(static_cast<Index>(l.channels)),
          static_cast<Index>(l.batch * l.channels * l.spatial / vector)};
}

// Columns: a sample is a row of `columns` = channels * spatial elements; thread (tx, ty) of a
// block takes vector column blockIdx.x * column_threads + tx and the rows ty, ty + row_threads,
// ... of slice blockIdx.y.
struct ColumnGrid {
  int64_t rows, columns, spatial, column_vecs, rows_per_slice;
  int column_threads;
  __device__ __forceinline__ int tx() const { return threadIdx.x % column_threads; }
  __device__ __forceinline__ int ty() const { return threadIdx.x / column_threads; }
  __device__ __forceinline__ int row_threads() const { return kThreads / column_threads; }
  __device__ __forceinline__ int64_t column_vec() const {
    return static_cast<int64_t>(blockIdx.x) * column_threads + tx();
  }
  __device__ __forceinline__ int64_t first_row() const { return static_cast<int64_t>(blockIdx.y) * rows_per_slice; }
  __device__ __forceinline__ int64_t end_row() const { return min(first_row() + rows_per_slice, rows); }
};

ColumnGrid column_grid(const BatchLayout& l, const BatchNormPlan& plan) {
  const int64_t columns = l.channels * l.spatial;
  return {l.batch, columns, l.spatial, columns / plan.vector, plan.rows_per_slice, plan.column_threads};
}

// Where channel c's partials are: k < count, at (k / span) * stride + c * span + k % span
// (Planes: c * splits + k; Columns: slice * columns + c * spatial + s).
struct PartialLayout {
  int64_t count, span, stride;
  __device__ __forceinline__ int64_t at(int64_t channel, int64_t k) const {
    return (k / span) * stride + channel * span + k % span;
  }
};

// ---------------------------------------------------------------- phases
// A reduction phase: Acc per thread, a per-channel context, add(acc, context, x[N], dy[N]).
// Forward statistics: Welford over x.
template <class A>
struct StatsReduce {
  using Acc = Welford<A>;
  static constexpr bool kReadsGrad = false;
  __device__ NoContext context(int64_t) const { return {}; }
  template <int N>
  __device__ __forceinline__ void add(Acc& acc, NoContext, const A (&x)[N], const A (&)[N]) const {
    acc.add_many(x);
  }
};

// Backward sums {dy, dy * (x - mean)}.
template <class A>
struct GradReduce {
  using Acc = Sums<A, 2>;
  static constexpr bool kReadsGrad = true;
  const A* mean;
  __device__ A context(int64_t channel) const { return mean[channel]; }
  template <int N>
  __device__ __forceinline__ void add(Acc& acc, A m, const A (&x)[N], const A (&dy)[N]) const {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      acc.v[0] += dy[i];
      acc.v[1] += dy[i] * (x[i] - m);
    }
  }
};

// Stores mean and rstd, and updates the running statistics (each when given).
template <class T, class A>
struct StatsFinish {
  A* mean;
  A* rstd;
  T* running_mean;
  T* running_var;
  A eps, momentum, inv_count, inv_count_less_one;
  __device__ void operator()(int64_t c, const Welford<A>& w) const {
    mean[c] = w.mean;
    rstd[c] = A(1) / sqrt(w.m2 * inv_count + eps);
    if (running_mean) running_mean[c] = convert<T>((A(1) - momentum) * convert<A>(running_mean[c]) + momentum * w.mean);
    if (running_var) {
      const A unbiased = w.m2 * inv_count_less_one;
      running_var[c] = convert<T>((A(1) - momentum) * convert<A>(running_var[c]) + momentum * unbiased);
    }
  }
};

// The parameter gradients, and in training coef[c] = {mean(dy), rstd^2 * mean(dy * (x - mean))}.
template <class T, class A>
struct GradFinish {
  const A* rstd;
  A* coef;
  T* grad_weight;
  T* grad_bias;
  A inv_count;
  __device__ void operator()(int64_t c, const Sums<A, 2>& s) const {
    const A r = rstd[c];
    if (grad_weight) grad_weight[c] = convert<T>(s.v[1] * r);
    if (grad_bias) grad_bias[c] = convert<T>(s.v[0]);
    if (coef) {
      coef[2 * c] = s.v[0] * inv_count;
      coef[2 * c + 1] = s.v[1] * r * r * inv_count;
    }
  }
};

// An element phase: which inputs it reads, a per-channel context, out = f(context, x, dy).
// y = (x - mean) * scale + shift, scale = rstd * w, shift = b.
template <class T, class A>
struct NormalizeApply {
  static constexpr bool kReadsX = true, kReadsGrad = false;
  const A* mean;
  const A* rstd;
  const T* weight;
  const T* bias;
  struct Context {
    A mean, scale, shift;
  };
  __device__ Context context(int64_t c) const {
    const A r = rstd[c];
    return {mean[c], weight ? r * convert<A>(weight[c]) : r, bias ? convert<A>(bias[c]) : A(0)};
  }
  __device__ __forceinline__ A operator()(const Context& k, A x, A) const { return (x - k.mean) * k.scale + k.shift; }
};

// Training: grad_x = scale * (dy - mean(dy) - (x - mean) * slope), scale = w * rstd.
template <class T, class A>
struct GradApply {
  static constexpr bool kReadsX = true, kReadsGrad = true;
  const A* mean;
  const A* rstd;
  const T* weight;
  const A* coef;
  struct Context {
    A mean, scale, mean_dy, slope;
  };
  __device__ Context context(int64_t c) const {
    const A r = rstd[c];
    return {mean[c], weight ? r * convert<A>(weight[c]) : r, coef[2 * c], coef[2 * c + 1]};
  }
  __device__ __forceinline__ A operator()(const Context& k, A x, A dy) const {
    return k.scale * (dy - k.mean_dy - (x - k.mean) * k.slope);
  }
};

// Evaluation: grad_x = w * rstd * dy.
template <class T, class A>
struct EvalGradApply {
  static constexpr bool kReadsX = false, kReadsGrad = true;
  const A* rstd;
  const T* weight;
  __device__ A context(int64_t c) const { return weight ? rstd[c] * convert<A>(weight[c]) : rstd[c]; }
  __device__ __forceinline__ A operator()(A scale, A, A dy) const { return scale * dy; }
};

// ---------------------------------------------------------------- kernels
template <class T, int V>
__device__ __forceinline__ void to_compute(const Vec<T, V>& v, compute_t<T>* out) {
#pragma unroll
  for (int e = 0; e < V; ++e) out[e] = convert<compute_t<T>>(v.v[e]);
}

// U vectors of the channel, kThreads apart from vector j, loaded before any is added.
template <int U, int V, class Index, class T, class Reduce, class Context>
__device__ __forceinline__ void plane_reduce_step(const PlaneGrid<Index>& g, int64_t channel, Index j, const T* x,
                                                  const T* dy, const Reduce& reduce, const Context& context,
                                                  typename Reduce::Acc& acc) {
  using A = compute_t<T>;
  Vec<T, V> xv[U], gv[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t o = g.template offset<V>(channel, j + static_cast<Index>(u * kThreads));
    xv[u] = load_vec<T, V>(x + o, 0);
    if constexpr (Reduce::kReadsGrad) gv[u] = load_vec<T, V>(dy + o, 0);
  }
  A xs[U * V], ds[U * V] = {};
#pragma unroll
  for (int u = 0; u < U; ++u) {
    to_compute(xv[u], xs + u * V);
    if constexpr (Reduce::kReadsGrad) to_compute(gv[u], ds + u * V);
  }
  reduce.add(acc, context, xs, ds);
}

// Block (channel, split) reduces its range of the channel to partials[blockIdx.x].
template <class Index, class T, int V, class Reduce>
__global__ void __launch_bounds__(kThreads)
    plane_reduce_kernel(PlaneGrid<Index> g, const T* __restrict__ x, const T* __restrict__ dy, Reduce reduce,
                        typename Reduce::Acc* __restrict__ partials) {
  using R = typename Reduce::Acc;
  const int64_t channel = blockIdx.x / g.splits;
  const Index begin = static_cast<Index>(blockIdx.x - channel * g.splits) * g.per_block;
  const Index end = min(static_cast<Index>(begin + g.per_block), g.vecs);
  const auto context = reduce.context(channel);
  R acc = R::identity();
  Index j = begin + threadIdx.x;
  for (; j + (kUnroll - 1) * kThreads < end; j += kUnroll * kThreads) {
    plane_reduce_step<kUnroll, V>(g, channel, j, x, dy, reduce, context, acc);
  }
  for (; j < end; j += kThreads) plane_reduce_step<1, V>(g, channel, j, x, dy, reduce, context, acc);
  acc = team_reduce<kThreads>(acc, Merge{});
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// U vectors, `stride` apart from vector e, loaded before any is written.
template <int U, int V, class Index, class T, class Apply>
__device__ __forceinline__ void plane_apply_step(const PlaneSweep<Index>& g, Index e, Index stride, const T* x,
                                                 const T* dy, const Apply& apply, T* out) {
  using A = compute_t<T>;
  Vec<T, V> xv[U] = {}, gv[U] = {};
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if constexpr (Apply::kReadsX) xv[u] = load_vec<T, V>(x, e + u * stride);
    if constexpr (Apply::kReadsGrad) gv[u] = load_vec<T, V>(dy, e + u * stride);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const auto context = apply.context(g.channel(e + u * stride));
    Vec<T, V> result;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      result.v[k] = convert<T>(apply(context, convert<A>(xv[u].v[k]), convert<A>(gv[u].v[k])));
    }
    store_vec<T, V>(out, e + u * stride, result);
  }
}

// A grid-stride sweep over the tensor's vectors, kUnroll of them in flight per thread.
template <class Index, class T, int V, class Apply>
__global__ void __launch_bounds__(kThreads)
    plane_apply_kernel(PlaneSweep<Index> g, const T* __restrict__ x, const T* __restrict__ dy, Apply apply,
                       T* __restrict__ out) {
  const Index stride = static_cast<Index>(gridDim.x) * kThreads;
  Index e = static_cast<Index>(blockIdx.x) * kThreads + threadIdx.x;
  for (; e + (kUnroll - 1) * stride < g.vecs; e += kUnroll * stride) {
    plane_apply_step<kUnroll, V>(g, e, stride, x, dy, apply, out);
  }
  for (; e < g.vecs; e += stride) plane_apply_step<1, V>(g, e, stride, x, dy, apply, out);
}

// U rows, row_threads apart from row r, of one vector column, loaded before any is added;
// each of the V columns has its own accumulator.
template <int U, int V, class T, class Reduce, class Context>
__device__ __forceinline__ void column_reduce_step(const ColumnGrid& g, int64_t r, int64_t offset, const T* x,
                                                   const T* dy, const Reduce& reduce, const Context (&context)[V],
                                                   typename Reduce::Acc (&acc)[V]) {
  using A = compute_t<T>;
  Vec<T, V> xv[U], gv[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t o = (r + static_cast<int64_t>(u) * g.row_threads()) * g.columns + offset;
    xv[u] = load_vec<T, V>(x + o, 0);
    if constexpr (Reduce::kReadsGrad) gv[u] = load_vec<T, V>(dy + o, 0);
  }
#pragma unroll
  for (int e = 0; e < V; ++e) {
    A xs[U], ds[U] = {};
#pragma unroll
    for (int u = 0; u < U; ++u) {
      xs[u] = convert<A>(xv[u].v[e]);
      if constexpr (Reduce::kReadsGrad) ds[u] = convert<A>(gv[u].v[e]);
    }
    reduce.add(acc[e], context[e], xs, ds);
  }
}

// Block (column tile, slice): each thread reduces its vector column over its rows of the
// slice, the block's rows of threads combine in a fixed tree, and row 0 writes
// partials[slice * columns + column].
template <class T, int V, class Reduce>
__global__ void __launch_bounds__(kThreads)
    column_reduce_kernel(ColumnGrid g, const T* __restrict__ x, const T* __restrict__ dy, Reduce reduce,
                         typename Reduce::Acc* __restrict__ partials) {
  using R = typename Reduce::Acc;
  using Context = decltype(reduce.context(0));
  __shared__ R tile[kThreads][V];
  const int64_t j = g.column_vec();
  const bool active = j < g.column_vecs;
  R acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = R::identity();
  if (active) {
    Context context[V];
#pragma unroll
    for (int e = 0; e < V; ++e) context[e] = reduce.context((j * V + e) / g.spatial);
    const int64_t end = g.end_row(), stride = g.row_threads();
    int64_t r = g.first_row() + g.ty();
    for (; r + (kUnroll - 1) * stride < end; r += kUnroll * stride) {
      column_reduce_step<kUnroll, V>(g, r, j * V, x, dy, reduce, context, acc);
    }
    for (; r < end; r += stride) column_reduce_step<1, V>(g, r, j * V, x, dy, reduce, context, acc);
  }
#pragma unroll
  for (int e = 0; e < V; ++e) tile[threadIdx.x][e] = acc[e];
  for (int half = g.row_threads() / 2; half > 0; half /= 2) {
    __syncthreads();
    if (g.ty() < half) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        acc[e] = combine(acc[e], tile[threadIdx.x + half * g.column_threads][e]);
        tile[threadIdx.x][e] = acc[e];
      }
    }
  }
  if (g.ty() != 0 || !active) return;
#pragma unroll
  for (int e = 0; e < V; ++e) partials[static_cast<int64_t>(blockIdx.y) * g.columns + j * V + e] = acc[e];
}

template <int U, int V, class T, class Apply, class Context>
__device__ __forceinline__ void column_apply_step(const ColumnGrid& g, int64_t r, int64_t offset, const T* x,
                                                  const T* dy, const Apply& apply, const Context (&context)[V],
                                                  T* out) {
  using A = compute_t<T>;
  int64_t o[U];
  Vec<T, V> xv[U] = {}, gv[U] = {};
#pragma unroll
  for (int u = 0; u < U; ++u) {
    o[u] = (r + static_cast<int64_t>(u) * g.row_threads()) * g.columns + offset;
    if constexpr (Apply::kReadsX) xv[u] = load_vec<T, V>(x + o[u], 0);
    if constexpr (Apply::kReadsGrad) gv[u] = load_vec<T, V>(dy + o[u], 0);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    Vec<T, V> result;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      result.v[e] = convert<T>(apply(context[e], convert<A>(xv[u].v[e]), convert<A>(gv[u].v[e])));
    }
    store_vec<T, V>(out + o[u], 0, result);
  }
}

template <class T, int V, class Apply>
__global__ void __launch_bounds__(kThreads)
    column_apply_kernel(ColumnGrid g, const T* __restrict__ x, const T* __restrict__ dy, Apply apply,
                        T* __restrict__ out) {
  using Context = decltype(apply.context(0));
  const int64_t j = g.column_vec();
  if (j >= g.column_vecs) return;
  Context context[V];
#pragma unroll
  for (int e = 0; e < V; ++e) context[e] = apply.context((j * V + e) / g.spatial);
  const int64_t end = g.end_row(), stride = g.row_threads();
  int64_t r = g.first_row() + g.ty();
  for (; r + (kUnroll - 1) * stride < end; r += kUnroll * stride) {
    column_apply_step<kUnroll, V>(g, r, j * V, x, dy, apply, context, out);
  }
  for (; r < end; r += stride) column_apply_step<1, V>(g, r, j * V, x, dy, apply, context, out);
}

// One warp per channel combines the channel's partials (lane k takes k, k + 32, ..., then a
// fixed butterfly) and lane 0 calls finish(channel, combined).
template <class R, class Finish>
__global__ void channel_finish_kernel(int64_t channels, PartialLayout layout, const R* __restrict__ partials,
                                      Finish finish) {
  const int64_t channel = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (channel >= channels) return;  // whole warps leave together
  R acc = R::identity();
  for (int64_t k = lane; k < layout.count; k += 32) acc = combine(acc, partials[layout.at(channel, k)]);
  acc = warp_reduce<32>(acc, Merge{});
  if (lane == 0) finish(channel, acc);
}

// ---------------------------------------------------------------- launchers
// Reduces each channel's elements with `reduce` and hands the result to finish(channel, r);
// an empty plan hands every channel the identity.
template <class T, class Reduce, class Finish>
void reduce_channels(const Launcher& launch, const BatchNormPlan& plan, const BatchLayout& l, const T* x, const T* dy,
                     Reduce reduce, Finish finish) {
  using R = typename Reduce::Acc;
  PartialLayout layout{0, 1, 0};
  std::optional<DeviceBuffer> partial_buffer;  // sized once the layout is known
  switch (plan.path) {
    case BatchNormPath::Planes:
      with_load_vector<T>(plan.vector, [&](auto vec) {
        constexpr int V = decltype(vec)::value;
        with_index_type(l.count() / V, [&](auto index_tag) {
          using Index = decltype(index_tag);
          auto kernel = plane_reduce_kernel<Index, T, V, Reduce>;
          const PlaneSplit split =
              plan_plane_split(l.count() / V, l.channels, launch.resident_grid(kernel, kThreads, 0, int64_t{1} << 30));
          layout = {split.splits, split.splits, 0};
          partial_buffer.emplace(static_cast<size_t>(l.channels * split.splits) * sizeof(R), launch.device());
          launch(kernel, static_cast<unsigned>(l.channels * split.splits), kThreads, 0, plane_grid<Index>(l, V, split),
                 x, dy, reduce, partial_buffer->as<R>());
        });
      });
      break;
    case BatchNormPath::Columns:
      with_load_vector<T>(plan.vector, [&](auto vec) {
        constexpr int V = decltype(vec)::value;
        layout = {plan.slices * l.spatial, l.spatial, l.channels * l.spatial};
        partial_buffer.emplace(static_cast<size_t>(plan.slices * l.channels * l.spatial) * sizeof(R), launch.device());
        const dim3 grid(static_cast<unsigned>(plan.column_tiles), static_cast<unsigned>(plan.slices));
        launch(column_reduce_kernel<T, V, Reduce>, grid, kThreads, 0, column_grid(l, plan), x, dy, reduce,
               partial_buffer->as<R>());
      });
      break;
    case BatchNormPath::Empty: break;
  }
  launch(channel_finish_kernel<R, Finish>, static_cast<unsigned>(ceil_div(l.channels, kThreads / 32)), kThreads, 0,
         l.channels, layout, partial_buffer ? partial_buffer->as<const R>() : static_cast<const R*>(nullptr), finish);
}

// out = apply(context(channel), x, dy) for every element.
template <class T, class Apply>
void apply_channels(const Launcher& launch, const BatchNormPlan& plan, const BatchLayout& l, const T* x, const T* dy,
                    Apply apply, T* out) {
  switch (plan.path) {
    case BatchNormPath::Planes:
      return with_load_vector<T>(plan.vector, [&](auto vec) {
        constexpr int V = decltype(vec)::value;
        const int64_t vecs = l.batch * l.channels * l.spatial / V;
        with_index_type(vecs, [&](auto index_tag) {
          using Index = decltype(index_tag);
          launch(plane_apply_kernel<Index, T, V, Apply>, launch.grid_for(ceil_div(vecs, kUnroll)), kThreads, 0,
                 plane_sweep<Index>(l, V), x, dy, apply, out);
        });
      });
    case BatchNormPath::Columns:
      return with_load_vector<T>(plan.vector, [&](auto vec) {
        constexpr int V = decltype(vec)::value;
        const dim3 grid(static_cast<unsigned>(plan.column_tiles), static_cast<unsigned>(plan.slices));
        launch(column_apply_kernel<T, V, Apply>, grid, kThreads, 0, column_grid(l, plan), x, dy, apply, out);
      });
    case BatchNormPath::Empty: return;
  }
}

template <class T>
void batch_norm_forward_typed(const Tensor& x_t, const Tensor& weight_t, const Tensor& bias_t,
                              const Tensor& running_mean_t, const Tensor& running_var_t, const BatchLayout& l,
                              bool training, double momentum, double eps, const Tensor& y_t, const Tensor& mean_t,
                              const Tensor& rstd_t) {
  using A = compute_t<T>;
  const Launcher launch("batch_norm", x_t);
  if (l.channels == 0) return;
  const T* x = data_as<const T>(x_t);
  const T* weight = data_or_null<const T>(weight_t);
  const T* bias = data_or_null<const T>(bias_t);
  T* running_mean = data_or_null<T>(running_mean_t);
  T* running_var = data_or_null<T>(running_var_t);
  T* y = data_as<T>(y_t);
  A* mean = data_as<A>(mean_t);
  A* rstd = data_as<A>(rstd_t);
  const A eps_a = static_cast<A>(eps);
  const BatchNormPlan plan = plan_batch_norm(l, aligned_vector(sizeof(T), {x, y}), launch.limits());
  if (training) {
    const double count = static_cast<double>(l.count());
    const A inv_count = static_cast<A>(count > 0 ? 1 / count : 0.0);
    const A inv_count_less_one = static_cast<A>(count > 1 ? 1 / (count - 1) : 0.0);
    reduce_channels(launch, plan, l, x, static_cast<const T*>(nullptr), StatsReduce<A>{},
                    StatsFinish<T, A>{mean, rstd, running_mean, running_var, eps_a, static_cast<A>(momentum), inv_count,
                                      inv_count_less_one});
  } else {
    const T* saved_mean = running_mean;
    const T* saved_var = running_var;
    for_each_index(launch, l.channels, [=] __device__(int64_t c) {
      mean[c] = convert<A>(saved_mean[c]);
      rstd[c] = A(1) / sqrt(convert<A>(saved_var[c]) + eps_a);
    });
  }
  apply_channels(launch, plan, l, x, static_cast<const T*>(nullptr), NormalizeApply<T, A>{mean, rstd, weight, bias}, y);
}

template <class T>
void batch_norm_backward_typed(const Tensor& grad_y_t, const Tensor& x_t, const Tensor& weight_t, const Tensor& mean_t,
                               const Tensor& rstd_t, const BatchLayout& l, bool training, const Tensor& grad_x_t,
                               const Tensor& grad_weight_t, const Tensor& grad_bias_t) {
  using A = compute_t<T>;
  const Launcher launch("batch_norm backward", x_t);
  if (l.channels == 0) return;
  const T* grad_y = data_as<const T>(grad_y_t);
  const T* x = data_as<const T>(x_t);
  const T* weight = data_or_null<const T>(weight_t);
  const A* mean = data_as<const A>(mean_t);
  const A* rstd = data_as<const A>(rstd_t);
  T* grad_x = data_as<T>(grad_x_t);
  T* grad_weight = data_or_null<T>(grad_weight_t);
  T* grad_bias = data_or_null<T>(grad_bias_t);
  const A inv_count = static_cast<A>(l.count() > 0 ? 1 / static_cast<double>(l.count()) : 0.0);
  const BatchNormPlan plan = plan_batch_norm(l, aligned_vector(sizeof(T), {grad_y, x, grad_x}), launch.limits());
  if (training) {
    const DeviceBuffer coef_buffer = launch.buffer(static_cast<size_t>(l.channels) * 2 * sizeof(A));
    A* coef = coef_buffer.as<A>();
    reduce_channels(launch, plan, l, x, grad_y, GradReduce<A>{mean},
                    GradFinish<T, A>{rstd, coef, grad_weight, grad_bias, inv_count});
    apply_channels(launch, plan, l, x, grad_y, GradApply<T, A>{mean, rstd, weight, coef}, grad_x);
    return;
  }
  if (grad_weight || grad_bias) {
    reduce_channels(launch, plan, l, x, grad_y, GradReduce<A>{mean},
                    GradFinish<T, A>{rstd, nullptr, grad_weight, grad_bias, inv_count});
  }
  apply_channels(launch, plan, l, x, grad_y, EvalGradApply<T, A>{rstd, weight}, grad_x);
}

}  // namespace

void CudaNorms::batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                   const Tensor& running_mean, const Tensor& running_var, const BatchLayout& l,
                                   const kernels::BatchNormMode& mode, const Tensor& y, const Tensor& mean,
                                   const Tensor& rstd) const {
  visit_float(x.dtype(), "batch_norm", [&](auto tag) {
    batch_norm_forward_typed<typename decltype(tag)::type>(x, weight, bias, running_mean, running_var, l, mode.training,
                                                           mode.momentum, mode.eps, y, mean, rstd);
  });
}

void CudaNorms::batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                    const Tensor& rstd, const BatchLayout& l, bool training, const Tensor& grad_x,
                                    const Tensor& grad_weight, const Tensor& grad_bias) const {
  visit_float(x.dtype(), "batch_norm backward", [&](auto tag) {
    batch_norm_backward_typed<typename decltype(tag)::type>(grad_y, x, weight, mean, rstd, l, training, grad_x,
                                                            grad_weight, grad_bias);
  });
}

}  // namespace cuda
}  // namespace normcore
