// L1 norm on CUDA: y = x / max(mean(|x|, dim), eps) over [outer, size, inner] along size,
// and its backward grad_x = dy / max(norm, eps) - sign(x) * dot(dy, x) / (size * norm^2)
// (the second term 0 where the clamp is active). plan_l1_forward / plan_l1_backward pick
// the kernels: a thread per column when the dim is not the last, rows split over a
// thread-block cluster's shared memory, whole rows read twice through L2, the pipelined pass,
// or a reduction and an element-wise pass.
#include "kernels/cuda/norms/norms.cuh"

namespace normcore {
namespace cuda {
namespace {

// ---------------------------------------------------------------- columns
// L1 norm with inner > 1: one thread per (outer, inner) column walks the normalized dim;
// neighbouring threads read neighbouring addresses.
template <class T, class A>
__global__ void l1_columns_forward_kernel(const T* x, int64_t outer, int64_t size, int64_t inner, A eps, T* y,
                                          A* norm) {
  const int64_t column = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= outer * inner) return;
  const int64_t o = column / inner, j = column % inner;
  const int64_t base = o * size * inner + j;
  A sum = 0;
  for (int64_t k = 0; k < size; ++k) sum += abs(load<T, A>(x, base + k * inner));
  const A n = size > 0 ? sum / static_cast<A>(size) : A(0);
  norm[column] = n;
  const A inv = A(1) / clamped(n, eps);
  for (int64_t k = 0; k < size; ++k) y[base + k * inner] = convert<T>(load<T, A>(x, base + k * inner) * inv);
}

template <class T, class A>
__global__ void l1_columns_backward_kernel(const T* grad_y, const T* x, const A* norm, int64_t outer, int64_t size,
                                           int64_t inner, A eps, T* grad_x) {
  const int64_t column = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= outer * inner) return;
  const int64_t o = column / inner, j = column % inner;
  const int64_t base = o * size * inner + j;
  const A n = norm[column], d = clamped(n, eps);
  A through = 0;
  if (n >= eps) {
    A dot = 0;
    for (int64_t k = 0; k < size; ++k) dot += load<T, A>(grad_y, base + k * inner) * load<T, A>(x, base + k * inner);
    through = dot / (static_cast<A>(size) * n * n);
  }
  for (int64_t k = 0; k < size; ++k) {
    const int64_t i = base + k * inner;
    grad_x[i] = convert<T>(load<T, A>(grad_y, i) / d - sign_of(load<T, A>(x, i)) * through);
  }
}

// y = x / max(norm[row], eps) for rows of row_len.
template <class Index, class T, class A>
struct RowScale {
  IntDivider<Index> row_of;
  const T* x;
  const A* norm;
  A eps;
  T* y;
  __device__ __forceinline__ void operator()(Index e) const {
    y[e] = convert<T>(load<T, A>(x, e) / clamped(norm[row_of.div(e)], eps));
  }
};

// grad_x = dy / max(norm, eps) - sign(x) * through[row].
template <class Index, class T, class A>
struct L1GradInput {
  IntDivider<Index> row_of;
  const T* grad_y;
  const T* x;
  const A* norm;
  const A* through;
  A eps;
  T* grad_x;
  __device__ __forceinline__ void operator()(Index e) const {
    const Index row = row_of.div(e);
    grad_x[e] = convert<T>(load<T, A>(grad_y, e) / clamped(norm[row], eps) - sign_of(load<T, A>(x, e)) * through[row]);
  }
};

// ---------------------------------------------------------------- rows over a cluster
// An L1 row whose input fits in a cluster's shared memory (ClusterRows, plan.h): block
// `rank` of the row's cluster copies slice `rank` of its 16-byte vectors into shared memory,
// summing as the copies land, so x (backward: x and dy) crosses device memory once. The
// elements before the row's first 16-byte boundary (head) and after its last whole vector
// (tail) stay in registers: thread i of rank 0 holds head element i, thread 32 + i of the
// last rank tail element i. The slices' sums combine through distributed shared memory in
// rank order (the same bits in every block); each block then writes its own slice. Every
// pointer starts 16-byte aligned, so a row's layout is the same in each of them.

// Where a row's elements lie: `head` elements before its first 16-byte boundary, `vecs`
// whole vectors, then `tail` elements.
template <class T>
struct RowVectors {
  static constexpr int V = 16 / sizeof(T);
  int64_t head, vecs, tail;
  __device__ __forceinline__ RowVectors(const T* row, int64_t size) {
    const auto misaligned = static_cast<int64_t>((reinterpret_cast<uintptr_t>(row) & 15) / sizeof(T));
    head = min(size, misaligned > 0 ? V - misaligned : int64_t(0));
    vecs = (size - head) / V;
    tail = size - head - vecs * V;
  }
  // The head or tail element this thread holds, or -1.
  __device__ __forceinline__ int64_t edge(unsigned rank, unsigned blocks) const {
    const int64_t t = threadIdx.x;
    if (rank == 0 && t < head) return t;
    if (rank == blocks - 1 && t >= 32 && t - 32 < tail) return head + vecs * V + t - 32;
    return -1;
  }
};

// The row's total of every block's `mine`, added in rank order. The caller waits on the
// cluster barrier (__cluster_barrier_wait) before it exits: the others may still be reading
// its slot.
template <int kBlock, class A>
__device__ __forceinline__ A cluster_total(A mine, A* slot, A* total) {
  mine = team_reduce<kBlock>(mine, Plus{});
  if (threadIdx.x == 0) *slot = mine;
  __cluster_barrier_arrive();
  __cluster_barrier_wait();  // every block's slot is in
  if (threadIdx.x == 0) {
    A sum = 0;
    for (unsigned r = 0; r < __clusterSizeInBlocks(); ++r)
      sum += *static_cast<const A*>(__cluster_map_shared_rank(slot, r));
    *total = sum;
  }
  __cluster_barrier_arrive();  // done with the other blocks' shared memory
  __syncthreads();
  return *total;
}

template <class T, int kBlock>
__global__ void __launch_bounds__(kBlock)
    l1_cluster_forward_kernel(int64_t size, const T* __restrict__ x, T* __restrict__ y, compute_t<T>* __restrict__ norm,
                              compute_t<T> eps) {
#if NC_CLUSTER_KERNELS
  using A = compute_t<T>;
  constexpr int V = 16 / sizeof(T);
  extern __shared__ __align__(16) unsigned char row_tile[];
  auto* tile = reinterpret_cast<Vec<T, V>*>(row_tile);
  __shared__ A slot, total;
  const unsigned rank = __clusterRelativeBlockRank(), blocks = __clusterSizeInBlocks();
  const int64_t row = blockIdx.x / blocks;
  const T* xr = x + row * size;
  const RowVectors<T> layout(xr, size);
  const ClusterSlice slice(layout.vecs, blocks, rank);
  const Ownership<kBlock> own(slice.size());
  const int64_t first = layout.head + slice.begin * V;
  A sum = 0;
  copy_and_land(own, xr + first, tile, [&](int64_t j) {
    const Vec<T, V> v = tile_at(tile, j);
#pragma unroll
    for (int e = 0; e < V; ++e) sum += abs(convert<A>(v.v[e]));
  });
  const int64_t edge = layout.edge(rank, blocks);
  const A edge_x = edge >= 0 ? load<T, A>(xr, edge) : A(0);
  const A n = cluster_total<kBlock>(sum + abs(edge_x), &slot, &total) / static_cast<A>(size);
  if (rank == 0 && threadIdx.x == 0) norm[row] = n;
  const A inv = A(1) / clamped(n, eps);
  T* yr = y + row * size;
  for (int64_t k = 0; k < own.count; ++k) {
    const int64_t j = own.vector(k);
    Vec<T, V> v = tile_at(tile, j);
#pragma unroll
    for (int e = 0; e < V; ++e) v.v[e] = convert<T>(convert<A>(v.v[e]) * inv);
    store_result(yr + first, j, v);
  }
  if (edge >= 0) yr[edge] = convert<T>(edge_x * inv);
  __cluster_barrier_wait();  // the others have read slot
#endif
}

// grad_x = dy / max(norm, eps) - sign(x) * dot(dy, x) / (size * norm^2), the dot over the
// cluster as the forward's sum.
template <class T, int kBlock>
__global__ void __launch_bounds__(kBlock)
    l1_cluster_backward_kernel(int64_t size, int64_t slice_vecs, const T* __restrict__ grad_y, const T* __restrict__ x,
                               const compute_t<T>* __restrict__ norm, compute_t<T> eps, T* __restrict__ grad_x) {
#if NC_CLUSTER_KERNELS
  using A = compute_t<T>;
  constexpr int V = 16 / sizeof(T);
  extern __shared__ __align__(16) unsigned char row_tile[];
  auto* x_tile = reinterpret_cast<Vec<T, V>*>(row_tile);
  Vec<T, V>* dy_tile = x_tile + slice_vecs;
  __shared__ A slot, total;
  const unsigned rank = __clusterRelativeBlockRank(), blocks = __clusterSizeInBlocks();
  const int64_t row = blockIdx.x / blocks;
  const int64_t offset = row * size;
  const RowVectors<T> layout(x + offset, size);
  const ClusterSlice slice(layout.vecs, blocks, rank);
  const Ownership<kBlock> own(slice.size());
  const int64_t first = layout.head + slice.begin * V;
  A dot = 0;
  copy_pair_and_land(own, x + offset + first, x_tile, grad_y + offset + first, dy_tile, [&](int64_t j) {
    const Vec<T, V> xv = tile_at(x_tile, j), dv = tile_at(dy_tile, j);
#pragma unroll
    for (int e = 0; e < V; ++e) dot += convert<A>(xv.v[e]) * convert<A>(dv.v[e]);
  });
  const int64_t edge = layout.edge(rank, blocks);
  const A edge_x = edge >= 0 ? load<T, A>(x, offset + edge) : A(0);
  const A edge_dy = edge >= 0 ? load<T, A>(grad_y, offset + edge) : A(0);
  const A row_dot = cluster_total<kBlock>(dot + edge_x * edge_dy, &slot, &total);
  const A n = norm[row];
  const A through = n >= eps ? row_dot / (static_cast<A>(size) * n * n) : A(0);
  const A inv = A(1) / clamped(n, eps);
  T* gx = grad_x + offset;
  for (int64_t k = 0; k < own.count; ++k) {
    const int64_t j = own.vector(k);
    const Vec<T, V> xv = tile_at(x_tile, j), dv = tile_at(dy_tile, j);
    Vec<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e)
      out.v[e] = convert<T>(convert<A>(dv.v[e]) * inv - sign_of(convert<A>(xv.v[e])) * through);
    store_result(gx + first, j, out);
  }
  if (edge >= 0) gx[edge] = convert<T>(edge_dy * inv - sign_of(edge_x) * through);
  __cluster_barrier_wait();  // the others have read slot
#endif
}

// ---------------------------------------------------------------- rows read twice
// L1 forward along the last dim for rows of up to kL1RowBytes (plan.h): one block of 1024 threads
// per SM takes a row at a time, sums |x|, then reads the row again to write x / norm.
// With one row per SM in flight the second read comes from L2 (132 rows of 256 KB fit in
// its 50 MB), so x crosses device memory about once. (The backward, with two inputs per
// row, measured slower this way than in the pipelined kernel and stays there.)
constexpr int kL1RowThreads = 1024;

template <class T>
__global__ void __launch_bounds__(kL1RowThreads, 1)
    l1_rows_forward_kernel(int64_t rows, int64_t size, const T* __restrict__ x, T* __restrict__ y,
                           compute_t<T>* __restrict__ norm, compute_t<T> eps) {
  using A = compute_t<T>;
  constexpr int V = 16 / sizeof(T);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t g0 = row * size, g1 = g0 + size;
    Sums<A, 1> acc{{A(0)}};
    visit_chunk<1, kL1RowThreads>(
        g0, g1, x, static_cast<const T*>(nullptr), true, [&](int64_t, A v, A) { acc.v[0] += abs(v); },
        [&](int64_t, const A(&v)[V], const A(&)[V]) {
#pragma unroll
          for (int j = 0; j < V; ++j) acc.v[0] += abs(v[j]);
        });
    const A n = team_reduce<kL1RowThreads>(acc, Merge{}).v[0] / static_cast<A>(size);
    if (threadIdx.x == 0) norm[row] = n;
    const A inv = A(1) / clamped(n, eps);
    apply_chunk<1, kL1RowThreads>(g0, g1, x, static_cast<const T*>(nullptr), y, true,
                                  [&](int64_t, A v, A) { return v * inv; });
  }
}

template <class T>
void l1_forward(const Tensor& x_t, int64_t outer, int64_t size, int64_t inner, double eps, const Tensor& y_t,
                const Tensor& norm_t) {
  using A = compute_t<T>;
  const Launcher launch("l1_norm", x_t);
  const T* x = data_as<const T>(x_t);
  T* y = data_as<T>(y_t);
  A* norm = data_as<A>(norm_t);
  const A eps_a = static_cast<A>(eps);
  const A inv_size = size > 0 ? A(1) / static_cast<A>(size) : A(0);
  const L1Plan plan = plan_l1_forward(outer, size, inner, sizeof(T), is_aligned(x, 16) && is_aligned(y, 16),
                                      cluster_limits(launch, l1_cluster_forward_kernel<T, kL1ClusterThreads>));
  switch (plan.path) {
    case NormPath::Columns:
      if (outer * inner == 0) return;
      launch(l1_columns_forward_kernel<T, A>, static_cast<unsigned>(ceil_div(outer * inner, kThreads)), kThreads, 0, x,
             outer, size, inner, eps_a, y, norm);
      return;
    case NormPath::ClusterRows: {
      if (outer == 0) return;
      const auto bytes = static_cast<size_t>(l1_slice_bytes(size, sizeof(T), 1, plan.cluster));
      auto kernel = l1_cluster_forward_kernel<T, kL1ClusterThreads>;
      launch.allow_shared_memory(kernel, bytes);
      launch.clusters(kernel, static_cast<unsigned>(outer * plan.cluster), kL1ClusterThreads, bytes, plan.cluster, size,
                      x, y, norm, eps_a);
      return;
    }
    case NormPath::RowsTwice:
      launch(l1_rows_forward_kernel<T>,
             static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(outer, launch.multiprocessors()))),
             kL1RowThreads, 0, outer, size, x, y, norm, eps_a);
      return;
    case NormPath::Pipeline: {
      const PipelineShape s = plan_pipeline(outer, size, size, sizeof(T), 1);
      const DeviceBuffer partials = launch.buffer(static_cast<size_t>(s.items) * sizeof(Sums<A, 1>));
      run_pipeline<1, T, Sums<A, 1>, RowInfo<A, 1>>(launch, s, x, static_cast<const T*>(nullptr), y,
                                                    partials.as<Sums<A, 1>>(), NormReduce<A, NormSum::Abs>{},
                                                    NormFinish<A, true>{norm, inv_size, eps_a}, NormScale<A>{});
      return;
    }
    case NormPath::Elementwise:
      reduce_rows<Sums<A, 1>>(
          launch, outer, size,
          [=] __device__(int64_t row, int64_t i) { return Sums<A, 1>{{abs(load<T, A>(x, row * size + i))}}; },
          [=] __device__(int64_t row, const Sums<A, 1>& s) { norm[row] = s.v[0] * inv_size; });
      return with_index_type(x_t.numel(), [&](auto index_tag) {
        using Index = decltype(index_tag);
        for_each_index<Index>(launch, x_t.numel(),
                              RowScale<Index, T, A>{IntDivider<Index>(static_cast<Index>(size)), x, norm, eps_a, y});
      });
  }
}

template <class T>
void l1_backward(const Tensor& grad_y_t, const Tensor& x_t, const Tensor& norm_t, int64_t outer, int64_t size,
                 int64_t inner, double eps, const Tensor& grad_x_t) {
  using A = compute_t<T>;
  const Launcher launch("l1_norm backward", x_t);
  const T* grad_y = data_as<const T>(grad_y_t);
  const T* x = data_as<const T>(x_t);
  const A* norm = data_as<const A>(norm_t);
  T* grad_x = data_as<T>(grad_x_t);
  const A eps_a = static_cast<A>(eps);
  const bool aligned = is_aligned(grad_y, 16) && is_aligned(x, 16) && is_aligned(grad_x, 16);
  const L1Plan plan = plan_l1_backward(outer, size, inner, sizeof(T), aligned,
                                       cluster_limits(launch, l1_cluster_forward_kernel<T, kL1ClusterThreads>));
  switch (plan.path) {
    case NormPath::Columns:
      if (outer * inner == 0) return;
      launch(l1_columns_backward_kernel<T, A>, static_cast<unsigned>(ceil_div(outer * inner, kThreads)), kThreads, 0,
             grad_y, x, norm, outer, size, inner, eps_a, grad_x);
      return;
    case NormPath::ClusterRows: {
      if (outer == 0) return;
      const int64_t slice = l1_slice_bytes(size, sizeof(T), 1, plan.cluster);
      auto kernel = l1_cluster_backward_kernel<T, kL1ClusterThreads>;
      launch.allow_shared_memory(kernel, static_cast<size_t>(2 * slice));
      launch.clusters(kernel, static_cast<unsigned>(outer * plan.cluster), kL1ClusterThreads,
                      static_cast<size_t>(2 * slice), plan.cluster, size, slice / 16, grad_y, x, norm, eps_a, grad_x);
      return;
    }
    case NormPath::Pipeline: {
      const PipelineShape s = plan_pipeline(outer, size, size, sizeof(T), 2);
      const DeviceBuffer partials = launch.buffer(static_cast<size_t>(s.items) * sizeof(Sums<A, 1>));
      run_pipeline<2, T, Sums<A, 1>, RowInfo<A, 2>>(launch, s, x, grad_y, grad_x, partials.as<Sums<A, 1>>(),
                                                    NormReduce<A, NormSum::Product>{},
                                                    NormGradFinish<A, true>{norm, static_cast<A>(size), eps_a},
                                                    NormGradApply<A, true>{});
      return;
    }
    case NormPath::RowsTwice:  // a forward path only
    case NormPath::Elementwise: {
      // through[row] = dot(dy, x) / (size * n^2), 0 where the clamp is active.
      const DeviceBuffer through_buffer = launch.buffer(static_cast<size_t>(std::max<int64_t>(outer, 1)) * sizeof(A));
      A* through = through_buffer.as<A>();
      const A size_a = static_cast<A>(size);
      reduce_rows<Sums<A, 1>>(
          launch, outer, size,
          [=] __device__(int64_t row, int64_t i) {
            const int64_t e = row * size + i;
            return Sums<A, 1>{{load<T, A>(grad_y, e) * load<T, A>(x, e)}};
          },
          [=] __device__(int64_t row, const Sums<A, 1>& s) {
            const A n = norm[row];
            through[row] = n >= eps_a ? s.v[0] / (size_a * n * n) : A(0);
          });
      return with_index_type(x_t.numel(), [&](auto index_tag) {
        using Index = decltype(index_tag);
        for_each_index<Index>(launch, x_t.numel(),
                              L1GradInput<Index, T, A>{IntDivider<Index>(static_cast<Index>(size)), grad_y, x, norm,
                                                       through, eps_a, grad_x});
      });
    }
  }
}

}  // namespace

void CudaNorms::l1_norm_forward(const Tensor& x, const kernels::DimLayout& l, double eps, const Tensor& y,
                                const Tensor& norm) const {
  visit_float(x.dtype(), "l1_norm",
              [&](auto tag) { l1_forward<typename decltype(tag)::type>(x, l.outer, l.size, l.inner, eps, y, norm); });
}

void CudaNorms::l1_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& norm, const kernels::DimLayout& l,
                                 double eps, const Tensor& grad_x) const {
  visit_float(x.dtype(), "l1_norm backward", [&](auto tag) {
    l1_backward<typename decltype(tag)::type>(grad_y, x, norm, l.outer, l.size, l.inner, eps, grad_x);
  });
}

}  // namespace cuda
}  // namespace normcore
