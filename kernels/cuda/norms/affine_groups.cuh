// The kernels of group norm's layouts (plan.h, GroupLayout), launched by affine.cu: the
// element-wise passes, the pipeline phases of the planned multi-kernel paths, and the
// kernels that hold a whole group in one block's shared memory or across a thread-block
// cluster's. Layer norm's rows are affine_rows.cuh. Included by affine.cu alone (its
// helpers stay in an unnamed namespace, as they were in that file).
#pragma once

#include "kernels/cuda/norms/norms.cuh"

namespace normcore {
namespace cuda {
namespace {
// ---------------------------------------------------------------- element-wise passes
// y = (x - mean) * rstd * weight + bias.
template <class Index, class T, class A>
struct AffineApply {
  ElementPlace<Index> place;
  const T* x;
  const T* weight;
  const T* bias;
  const A* mean;
  const A* rstd;
  T* y;
  __device__ __forceinline__ void operator()(Index e) const {
    Index row, channel;
    place.locate(e, row, channel);
    A v = (load<T, A>(x, e) - (mean ? mean[row] : A(0))) * rstd[row];
    if (weight) v *= load<T, A>(weight, channel);
    if (bias) v += load<T, A>(bias, channel);
    y[e] = convert<T>(v);
  }
};

// grad_x = rstd * (w * dy - coef[row].0 - xhat * coef[row].1).
template <class Index, class T, class A>
struct AffineGradInput {
  ElementPlace<Index> place;
  const T* grad_y;
  const T* x;
  const T* weight;
  const A* mean;
  const A* rstd;
  const A* coef;
  T* grad_x;
  __device__ __forceinline__ void operator()(Index e) const {
    Index row, channel;
    place.locate(e, row, channel);
    const A r = rstd[row];
    const A xhat = (load<T, A>(x, e) - (mean ? mean[row] : A(0))) * r;
    const A w = weight ? load<T, A>(weight, channel) : A(1);
    grad_x[e] = convert<T>(r * (w * load<T, A>(grad_y, e) - coef[2 * row] - xhat * coef[2 * row + 1]));
  }
};

// ---------------------------------------------------------------- pipeline phases
// Forward statistics: Welford over x.
template <class A>
struct StatsReduce {
  __device__ NoContext context(int64_t, int64_t) const { return {}; }
  __device__ A operator()(NoContext, int64_t, A x, A) const { return x; }
};

// The row's {mean, rstd} from its Welford state; with no mean stored (RMS norm) the mean is 0
// and rstd comes from mean(x * x) = var + mean^2.
template <class A>
__device__ __forceinline__ RowInfo<A, 2> finish_statistics(int64_t row, const Welford<A>& w, A eps, A* mean, A* rstd) {
  const A var = w.count > A(0) ? w.m2 / w.count : A(0);
  const A center = mean ? w.mean : A(0);
  const A r = A(1) / sqrt(mean ? var + eps : var + w.mean * w.mean + eps);
  if (mean) mean[row] = center;
  rstd[row] = r;
  return {{center, r}};
}

// Stores mean and rstd for backward; the row info is {mean, rstd}.
template <class A>
struct StatsFinish {
  A* mean;
  A* rstd;
  A eps;
  __device__ RowInfo<A, 2> operator()(int64_t row, const Welford<A>& w) const {
    return finish_statistics(row, w, eps, mean, rstd);
  }
};

// y = (x - mean) * rstd * w + b, the channel per element (spatial == 1) or per chunk.
template <class T, class A>
struct AffineApplyPhase {
  const T* weight;
  const T* bias;
  int64_t groups, group_channels, spatial;
  struct Context {
    A mean, rstd, scale, shift;
    int64_t first_channel;
  };
  __device__ Context context(int64_t row, int64_t begin, const RowInfo<A, 2>& info) const {
    Context c{info.v[0], info.v[1], info.v[1], A(0), (row % groups) * group_channels};
    if (spatial > 1) {
      const int64_t channel = c.first_channel + begin / spatial;
      if (weight) c.scale *= load<T, A>(weight, channel);
      if (bias) c.shift = load<T, A>(bias, channel);
    }
    return c;
  }
  __device__ A operator()(const Context& c, int64_t i, A x, A) const {
    if (spatial > 1) return (x - c.mean) * c.scale + c.shift;
    A v = (x - c.mean) * c.rstd;
    if (weight) v *= load<T, A>(weight, c.first_channel + i);
    if (bias) v += load<T, A>(bias, c.first_channel + i);
    return v;
  }
};

// Backward sums over (x, dy): {w * dy, w * dy * (x - mean), dy, dy * (x - mean)}; the last
// two (per chunk, so per plane) give group norm's parameter gradients.
template <class T, class A, int N>
struct GradReduce {
  const T* weight;
  const A* mean;
  int64_t groups, group_channels, spatial;
  struct Context {
    A mean, w;
    int64_t first_channel;
  };
  __device__ Context context(int64_t row, int64_t begin) const {
    Context c{mean ? mean[row] : A(0), A(1), (row % groups) * group_channels};
    if (spatial > 1 && weight) c.w = load<T, A>(weight, c.first_channel + begin / spatial);
    return c;
  }
  __device__ Sums<A, N> operator()(const Context& c, int64_t i, A x, A dy) const {
    A w = c.w;
    if (spatial == 1 && weight) w = load<T, A>(weight, c.first_channel + i);
    const A xc = x - c.mean;
    Sums<A, N> s;
    s.v[0] = w * dy;
    s.v[1] = w * dy * xc;
    if constexpr (N == 4) {
      s.v[2] = dy;
      s.v[3] = dy * xc;
    }
    return s;
  }
};

// Row info {mean, rstd, mean(w * dy), mean(w * dy * xhat)}.
template <class A, int N>
struct GradFinish {
  const A* mean;
  const A* rstd;
  A inv_len;
  __device__ RowInfo<A, 4> operator()(int64_t row, const Sums<A, N>& s) const {
    const A r = rstd[row];
    return {{mean ? mean[row] : A(0), r, mean ? s.v[0] * inv_len : A(0), s.v[1] * r * inv_len}};
  }
};

// grad_x = rstd * (w * dy - mean(w * dy) - xhat * mean(w * dy * xhat)).
template <class T, class A>
struct GradApply {
  const T* weight;
  int64_t groups, group_channels, spatial;
  struct Context {
    RowInfo<A, 4> info;
    A w;
    int64_t first_channel;
  };
  __device__ Context context(int64_t row, int64_t begin, const RowInfo<A, 4>& info) const {
    Context c{info, A(1), (row % groups) * group_channels};
    if (spatial > 1 && weight) c.w = load<T, A>(weight, c.first_channel + begin / spatial);
    return c;
  }
  __device__ A operator()(const Context& c, int64_t i, A x, A dy) const {
    A w = c.w;
    if (spatial == 1 && weight) w = load<T, A>(weight, c.first_channel + i);
    const A r = c.info.v[1];
    return r * (w * dy - c.info.v[2] - (x - c.info.v[0]) * r * c.info.v[3]);
  }
};

// ---------------------------------------------------------------- groups in shared memory
// Group norm over groups of kSharedGroupMinRow elements or more that fit in one block's
// shared memory (about 227 KB; backward holds x and dy): a block per group (blocks of 256
// threads, 1024 for groups of 16384 elements or more; several blocks per SM overlap one
// group's loads with another's stores) copies the group in once (cp.async), reduces there
// and writes its output, so x (and dy) cross device memory once, with no cross-block
// synchronization. spatial is a multiple of V, so a vector lies within one channel. The
// forward's threads own their vectors (norms.cuh); the backward reduces plane by plane, so
// its threads read each other's and a barrier follows the copies.

// The group's V-element vectors copied into tile.
template <int kBlock, int V, class T>
__device__ __forceinline__ void copy_group(const T* src, int64_t vecs, Vec<T, V>* tile) {
  for (int64_t j = threadIdx.x; j < vecs; j += kBlock) copy_async<sizeof(Vec<T, V>)>(tile + j, src + j * V);
}

// The thread's sum of (x - mean)^2 over its own vectors of the tile.
template <int kBlock, class T, int V>
__device__ __forceinline__ compute_t<T> own_squares(const Ownership<kBlock>& own, const Vec<T, V>* tile,
                                                    compute_t<T> mean) {
  using A = compute_t<T>;
  A squares = 0;
  for (int64_t k = 0; k < own.count; ++k) {
    const Vec<T, V> v = tile_at(tile, own.vector(k));
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const A d = convert<A>(v.v[e]) - mean;
      squares += d * d;
    }
  }
  return squares;
}

// {sum(dy), sum(dy * (x - m))} over tile vectors [lo, hi), reduced by the block (every
// thread gets it).
template <int kBlock, class T, int V>
__device__ __forceinline__ Sums<compute_t<T>, 2> tile_plane_sums(const Vec<T, V>* x_tile, const Vec<T, V>* dy_tile,
                                                                 int64_t lo, int64_t hi, compute_t<T> m) {
  using A = compute_t<T>;
  Sums<A, 2> s = Sums<A, 2>::identity();
  for (int64_t j = lo + threadIdx.x; j < hi; j += kBlock) {
    const Vec<T, V> xv = tile_at(x_tile, j), dv = tile_at(dy_tile, j);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const A d = convert<A>(dv.v[e]);
      s.v[0] += d;
      s.v[1] += d * (convert<A>(xv.v[e]) - m);
    }
  }
  return team_reduce<kBlock>(s, Merge{});
}

// y = (x - mean) * scale + shift for one vector.
template <class T, int V>
__device__ __forceinline__ Vec<T, V> affine_vector(const Vec<T, V>& v, compute_t<T> mean, compute_t<T> scale,
                                                   compute_t<T> shift) {
  using A = compute_t<T>;
  Vec<T, V> out;
#pragma unroll
  for (int e = 0; e < V; ++e) out.v[e] = convert<T>((convert<A>(v.v[e]) - mean) * scale + shift);
  return out;
}

// grad_x = r * (w * dy - mean_g - (x - m) * slope) for one vector.
template <class T, int V>
__device__ __forceinline__ Vec<T, V> grad_x_vector(const Vec<T, V>& xv, const Vec<T, V>& dv, compute_t<T> m,
                                                   compute_t<T> r, compute_t<T> w, compute_t<T> mean_g,
                                                   compute_t<T> slope) {
  using A = compute_t<T>;
  Vec<T, V> out;
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const A d = convert<A>(dv.v[e]), xc = convert<A>(xv.v[e]) - m;
    out.v[e] = convert<T>(r * (w * d - mean_g - xc * slope));
  }
  return out;
}

// Normalizes row `row` from its tile, given the sum of the thread's own values of it.
template <class T, int V, int kBlock>
__device__ __forceinline__ void normalize_group(const Ownership<kBlock>& own, const Vec<T, V>* tile, int64_t row,
                                                int64_t row_len, compute_t<T> sum, int64_t groups,
                                                int64_t group_channels, int64_t spatial, const T* weight, const T* bias,
                                                compute_t<T> eps, T* y, compute_t<T>* mean_out,
                                                compute_t<T>* rstd_out) {
  using A = compute_t<T>;
  const A inv_len = A(1) / static_cast<A>(row_len);
  const A mean = team_reduce<kBlock>(sum, Plus{}) * inv_len;
  const A rstd = A(1) / sqrt(team_reduce<kBlock>(own_squares(own, tile, mean), Plus{}) * inv_len + eps);
  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
  const int64_t first_channel = (row % groups) * group_channels;
  T* yr = y + row * row_len;
  for (int64_t k = 0; k < own.count; ++k) {
    const int64_t j = own.vector(k), channel = first_channel + j * V / spatial;
    const A scale = weight ? rstd * convert<A>(weight[channel]) : rstd;
    const A shift = bias ? convert<A>(bias[channel]) : A(0);
    store_result(yr, j, affine_vector(tile_at(tile, j), mean, scale, shift));
  }
}

// buffers = 1: each group is copied in stages and summed as it lands. buffers = 2 (groups
// small enough for two tiles): the next group's copies are issued before the current one is
// reduced, so a block always has a group in flight. Either way a thread's copies overwrite
// only vectors it has itself finished with.
template <class T, int V, int kBlock>
__global__ void __launch_bounds__(kBlock)
    group_norm_shared_forward(int64_t rows, int64_t row_len, int64_t groups, int64_t group_channels, int64_t spatial,
                              int buffers, const T* __restrict__ x, const T* __restrict__ weight,
                              const T* __restrict__ bias, compute_t<T> eps, T* __restrict__ y,
                              compute_t<T>* __restrict__ mean_out, compute_t<T>* __restrict__ rstd_out) {
  using A = compute_t<T>;
  extern __shared__ __align__(16) unsigned char group_tile[];
  auto* tiles = reinterpret_cast<Vec<T, V>*>(group_tile);
  const int64_t vecs = row_len / V;
  const Ownership<kBlock> own(vecs);
  auto sum_of = [&](const Vec<T, V>* tile, int64_t j) {
    const Vec<T, V> v = tile_at(tile, j);
    A s = 0;
#pragma unroll
    for (int e = 0; e < V; ++e) s += convert<A>(v.v[e]);
    return s;
  };
  if (buffers == 1) {
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
      A sum = 0;
      copy_and_land(own, x + row * row_len, tiles, [&](int64_t j) { sum += sum_of(tiles, j); });
      normalize_group(own, tiles, row, row_len, sum, groups, group_channels, spatial, weight, bias, eps, y, mean_out,
                      rstd_out);
    }
    return;
  }
  auto issue = [&](int64_t row, Vec<T, V>* tile) {
    copy_group<kBlock>(x + row * row_len, vecs, tile);  // the thread's own vectors
    commit_copies();
  };
  if (blockIdx.x < rows) issue(blockIdx.x, tiles);
  int64_t turn = 0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x, ++turn) {
    Vec<T, V>* tile = tiles + (turn % 2) * vecs;
    const int64_t next = row + gridDim.x;
    if (next < rows) {
      issue(next, tiles + ((turn + 1) % 2) * vecs);
      wait_copies(1);
    } else {
      wait_copies(0);
    }
    A sum = 0;
    for (int64_t k = 0; k < own.count; ++k) sum += sum_of(tile, own.vector(k));
    normalize_group(own, tile, row, row_len, sum, groups, group_channels, spatial, weight, bias, eps, y, mean_out,
                    rstd_out);
  }
}

// Backward: per plane, {sum(dy), sum(dy * (x - mean))} reduced by the block in channel order
// and stored in plane_sums (the parameter gradients' terms); the group's coefficients from
// them; then grad_x = rstd * (w * dy - mean(w * dy) - xhat * mean(w * dy * xhat)).
template <class T, int V, int kBlock>
__global__ void __launch_bounds__(kBlock)
    group_norm_shared_backward(int64_t rows, int64_t row_len, int64_t groups, int64_t group_channels, int64_t spatial,
                               const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ weight,
                               const compute_t<T>* __restrict__ mean, const compute_t<T>* __restrict__ rstd,
                               T* __restrict__ grad_x, Sums<compute_t<T>, 2>* __restrict__ plane_sums) {
  using A = compute_t<T>;
  extern __shared__ __align__(16) unsigned char group_tile[];
  const int64_t vecs = row_len / V, plane_vecs = spatial / V;
  auto* x_tile = reinterpret_cast<Vec<T, V>*>(group_tile);
  Vec<T, V>* dy_tile = x_tile + vecs;
  const A inv_len = A(1) / static_cast<A>(row_len);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    copy_group<kBlock>(x + row * row_len, vecs, x_tile);
    copy_group<kBlock>(grad_y + row * row_len, vecs, dy_tile);
    copies_landed();
    __syncthreads();
    const A m = mean[row], r = rstd[row];
    const int64_t first_channel = (row % groups) * group_channels;
    A sum_g = 0, sum_g_xc = 0;  // sum(w * dy), sum(w * dy * (x - mean)) over the group
    for (int64_t c = 0; c < group_channels; ++c) {
      const Sums<A, 2> s = tile_plane_sums<kBlock>(x_tile, dy_tile, c * plane_vecs, (c + 1) * plane_vecs, m);
      if (threadIdx.x == 0) plane_sums[row * group_channels + c] = s;
      const A w = weight ? convert<A>(weight[first_channel + c]) : A(1);
      sum_g += w * s.v[0];
      sum_g_xc += w * s.v[1];
    }
    const A mean_g = sum_g * inv_len, slope = sum_g_xc * r * r * inv_len;
    T* gx = grad_x + row * row_len;
    for (int64_t j = threadIdx.x; j < vecs; j += kBlock) {
      const A w = weight ? convert<A>(weight[first_channel + j / plane_vecs]) : A(1);
      store_result(gx, j, grad_x_vector(tile_at(x_tile, j), tile_at(dy_tile, j), m, r, w, mean_g, slope));
    }
    __syncthreads();  // the next group overwrites the tiles
  }
}

// ---------------------------------------------------------------- groups over a cluster
// A group larger than kClusterMinBytes (plan.h) split over the shared memory of a
// thread-block cluster: block `rank` of the cluster holds vectors [rank * per, (rank + 1) *
// per) of the group, so that an SM runs several small blocks and one's copies overlap
// another's arithmetic, and x (backward: x and dy) is still read once. The blocks combine
// their statistics through distributed shared memory in rank order (the same bits in every
// block), then each normalizes its own slice. A block leaves only when the others have read
// its shared memory (the split cluster barrier: arrive after the reads, wait at the end).
// Built for sm_90 and later (NC_CLUSTER_KERNELS, norms.cuh); plan.h takes this path only
// where the device launches clusters and these kernels were built for it.

template <class T, int V, int kBlock>
__global__ void __launch_bounds__(kBlock)
    group_norm_cluster_forward(int64_t row_len, int64_t groups, int64_t group_channels, int64_t spatial,
                               const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                               compute_t<T> eps, T* __restrict__ y, compute_t<T>* __restrict__ mean_out,
                               compute_t<T>* __restrict__ rstd_out) {
#if NC_CLUSTER_KERNELS
  using A = compute_t<T>;
  extern __shared__ __align__(16) unsigned char group_tile[];
  auto* tile = reinterpret_cast<Vec<T, V>*>(group_tile);
  __shared__ Welford<A> slice_stats;  // read by every block of the cluster
  __shared__ A group_stats[2];        // {mean, rstd}
  const unsigned rank = __clusterRelativeBlockRank(), blocks = __clusterSizeInBlocks();
  const int64_t row = blockIdx.x / blocks;
  const ClusterSlice slice(row_len / V, blocks, rank);
  const Ownership<kBlock> own(slice.size());
  const T* xs = x + row * row_len + slice.begin * V;
  // The slice's own two-pass statistics.
  A sum = 0;
  copy_and_land(own, xs, tile, [&](int64_t j) {
    const Vec<T, V> v = tile_at(tile, j);
#pragma unroll
    for (int e = 0; e < V; ++e) sum += convert<A>(v.v[e]);
  });
  const A count = static_cast<A>(slice.size() * V);
  sum = team_reduce<kBlock>(sum, Plus{});
  const A slice_mean = count > A(0) ? sum / count : A(0);
  const A squares = team_reduce<kBlock>(own_squares(own, tile, slice_mean), Plus{});
  if (threadIdx.x == 0) slice_stats = {count, slice_mean, squares};
  __cluster_barrier_arrive();
  __cluster_barrier_wait();  // every block's slice_stats is in
  if (threadIdx.x == 0) {
    Welford<A> w = Welford<A>::identity();
    for (unsigned r = 0; r < blocks; ++r) {
      w = combine(w, *static_cast<const Welford<A>*>(__cluster_map_shared_rank(&slice_stats, r)));
    }
    group_stats[0] = w.mean;
    group_stats[1] = A(1) / sqrt(w.m2 / w.count + eps);
    if (rank == 0) {
      mean_out[row] = group_stats[0];
      rstd_out[row] = group_stats[1];
    }
  }
  __cluster_barrier_arrive();  // done with the other blocks' shared memory
  __syncthreads();
  const A mean = group_stats[0], rstd = group_stats[1];
  const int64_t first_channel = (row % groups) * group_channels;
  T* ys = y + row * row_len + slice.begin * V;
  for (int64_t k = 0; k < own.count; ++k) {
    const int64_t j = own.vector(k), channel = first_channel + (slice.begin + j) * V / spatial;
    const A scale = weight ? rstd * convert<A>(weight[channel]) : rstd;
    const A shift = bias ? convert<A>(bias[channel]) : A(0);
    store_result(ys, j, affine_vector(tile_at(tile, j), mean, scale, shift));
  }
  __cluster_barrier_wait();  // the others have read slice_stats
#endif
}

// Backward: each block sums {dy, dy * (x - mean)} over the part of each plane in its slice;
// the planes' sums (plane_sums, the parameter gradients' terms) and the group's
// coefficients then come from every block's partials in rank order; grad_x as in the
// shared-memory kernel.
template <class T, int V, int kBlock>
__global__ void __launch_bounds__(kBlock)
    group_norm_cluster_backward(int64_t row_len, int64_t groups, int64_t group_channels, int64_t spatial,
                                int64_t slice_vecs, const T* __restrict__ grad_y, const T* __restrict__ x,
                                const T* __restrict__ weight, const compute_t<T>* __restrict__ mean,
                                const compute_t<T>* __restrict__ rstd, T* __restrict__ grad_x,
                                Sums<compute_t<T>, 2>* __restrict__ plane_sums) {
#if NC_CLUSTER_KERNELS
  using A = compute_t<T>;
  extern __shared__ __align__(16) unsigned char group_tile[];
  auto* x_tile = reinterpret_cast<Vec<T, V>*>(group_tile);
  Vec<T, V>* dy_tile = x_tile + slice_vecs;
  // The slice's partial sums, plane by plane from its first plane (after whole vectors of
  // at least the sums' alignment).
  auto* parts = reinterpret_cast<Sums<A, 2>*>(dy_tile + slice_vecs);
  __shared__ A group_terms[2];  // {sum(w * dy), sum(w * dy * (x - mean))}
  const unsigned rank = __clusterRelativeBlockRank(), blocks = __clusterSizeInBlocks();
  const int64_t row = blockIdx.x / blocks, vecs = row_len / V, plane_vecs = spatial / V;
  const ClusterSlice slice(vecs, blocks, rank);
  const int64_t offset = row * row_len + slice.begin * V;
  for (int64_t j = threadIdx.x; j < slice.size(); j += kBlock) {
    copy_async<sizeof(Vec<T, V>)>(x_tile + j, x + offset + j * V);
    copy_async<sizeof(Vec<T, V>)>(dy_tile + j, grad_y + offset + j * V);
  }
  copies_landed();
  __syncthreads();
  const A m = mean[row], r = rstd[row];
  const int64_t first_plane = slice.begin / plane_vecs;
  const int64_t last_plane = slice.size() > 0 ? (slice.end - 1) / plane_vecs : first_plane - 1;
  for (int64_t c = first_plane; c <= last_plane; ++c) {
    const int64_t lo = max(slice.begin, c * plane_vecs) - slice.begin;
    const int64_t hi = min(slice.end, (c + 1) * plane_vecs) - slice.begin;
    const Sums<A, 2> s = tile_plane_sums<kBlock>(x_tile, dy_tile, lo, hi, m);
    if (threadIdx.x == 0) parts[c - first_plane] = s;
  }
  __cluster_barrier_arrive();
  __cluster_barrier_wait();  // every block's parts are in
  // Thread c % kBlock gathers plane c from the blocks whose slices hold part of it.
  const int64_t first_channel = (row % groups) * group_channels;
  Sums<A, 2> terms = Sums<A, 2>::identity();
  for (int64_t c = threadIdx.x; c < group_channels; c += kBlock) {
    Sums<A, 2> s = Sums<A, 2>::identity();
    const int64_t first_rank = c * plane_vecs / slice.per, last_rank = ((c + 1) * plane_vecs - 1) / slice.per;
    for (int64_t b = first_rank; b <= last_rank; ++b) {
      const auto* theirs = static_cast<const Sums<A, 2>*>(__cluster_map_shared_rank(parts, static_cast<unsigned>(b)));
      s = combine(s, theirs[c - b * slice.per / plane_vecs]);
    }
    if (rank == 0) plane_sums[row * group_channels + c] = s;
    const A w = weight ? convert<A>(weight[first_channel + c]) : A(1);
    terms.v[0] += w * s.v[0];
    terms.v[1] += w * s.v[1];
  }
  __cluster_barrier_arrive();  // done with the other blocks' shared memory
  terms = team_reduce<kBlock>(terms, Merge{});
  const A inv_len = A(1) / static_cast<A>(row_len);
  const A mean_g = terms.v[0] * inv_len, slope = terms.v[1] * r * r * inv_len;
  T* gx = grad_x + offset;
  for (int64_t j = threadIdx.x; j < slice.size(); j += kBlock) {
    const int64_t channel = first_channel + (slice.begin + j) / plane_vecs;
    const A w = weight ? convert<A>(weight[channel]) : A(1);
    store_result(gx, j, grad_x_vector(tile_at(x_tile, j), tile_at(dy_tile, j), m, r, w, mean_g, slope));
  }
  __cluster_barrier_wait();  // the others have read parts
#endif
}

}  // namespace
}  // namespace cuda
}  // namespace normcore
