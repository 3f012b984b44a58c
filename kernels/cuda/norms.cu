// CUDA normalization kernels: layer norm, group norm, L1 norm and Frobenius norm, forward
// and backward (contracts in kernels/backend.h). Every op is built from three parts:
//   1. a chunked row reduction: a team of threads (one warp for short rows, a block for
//      long ones) reduces one chunk of one row to a partial (Welford statistics or sums);
//   2. a finalize step: one warp per row combines the row's chunk partials in a fixed
//      order and writes the row's statistics or coefficients;
//   3. an element-wise pass that applies them.
// Statistics are Welford per thread and Chan-combined, so the variance stays accurate when
// |mean| >> std. f16/bf16/f32 accumulate in float, f64 in double; the saved statistics are
// in that accumulation type. Parameter gradients are reduced in a fixed order (per-slice
// partials, then one sum per column), so results are deterministic for a given device.
#include "kernels/cuda/loops.cuh"

namespace normcore {
namespace cuda_kernels {
namespace {

constexpr int kBlock = 256;             // threads per block in every kernel here
constexpr int kWarps = kBlock / 32;
constexpr int64_t kWarpRowMax = 1024;   // rows up to this length are reduced by one warp
constexpr int64_t kMinChunk = 4096;     // a block reduces at least this many elements

// ---------------------------------------------------------------- partials
// Count, mean and sum of squared deviations of a set of values.
template <class A>
struct Welford {
  A count, mean, m2;
  __device__ __forceinline__ static Welford identity() { return {A(0), A(0), A(0)}; }
  __device__ __forceinline__ void add(A v) {
    count += A(1);
    const A delta = v - mean;
    mean += delta / count;
    m2 += delta * (v - mean);
  }
};

// Chan et al.: the statistics of the union of two sets.
template <class A>
__device__ __forceinline__ Welford<A> combine(const Welford<A>& a, const Welford<A>& b) {
  const A count = a.count + b.count;
  if (count == A(0)) return a;
  const A delta = b.mean - a.mean;
  const A b_share = b.count / count;
  return {count, a.mean + delta * b_share, a.m2 + b.m2 + delta * delta * a.count * b_share};
}

template <class A>
__device__ __forceinline__ Welford<A> shfl_down(const Welford<A>& w, int offset) {
  return {__shfl_down_sync(0xffffffffu, w.count, offset), __shfl_down_sync(0xffffffffu, w.mean, offset),
          __shfl_down_sync(0xffffffffu, w.m2, offset)};
}

// N running sums.
template <class A, int N>
struct Sums {
  A v[N];
  __device__ __forceinline__ static Sums identity() {
    Sums s;
#pragma unroll
    for (int k = 0; k < N; ++k) s.v[k] = A(0);
    return s;
  }
  __device__ __forceinline__ void add(const Sums& o) {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] += o.v[k];
  }
};

template <class A, int N>
__device__ __forceinline__ Sums<A, N> combine(Sums<A, N> a, const Sums<A, N>& b) {
  a.add(b);
  return a;
}

template <class A, int N>
__device__ __forceinline__ Sums<A, N> shfl_down(Sums<A, N> s, int offset) {
#pragma unroll
  for (int k = 0; k < N; ++k) s.v[k] = __shfl_down_sync(0xffffffffu, s.v[k], offset);
  return s;
}

// Lane 0 of the warp gets the combination of the 32 lanes' partials, in a fixed order.
template <class R>
__device__ __forceinline__ R warp_combine(R r) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) r = combine(r, shfl_down(r, offset));
  return r;
}

// Thread 0 of the block gets the combination of every thread's partial. Every thread of
// the block must call it.
template <class R>
__device__ __forceinline__ R block_combine(R r) {
  __shared__ R warp_partials[kWarps];
  r = warp_combine(r);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // the buffer may still be read by an earlier call
  if (lane == 0) warp_partials[warp] = r;
  __syncthreads();
  if (warp == 0) {
    r = lane < kWarps ? warp_partials[lane] : R::identity();
    r = warp_combine(r);
  }
  return r;
}

// ---------------------------------------------------------------- 1. chunked reduction
// A problem of `rows` rows of row_len elements, each split into `chunks` chunks of
// chunk_len. A team of kTeam threads (32 or kBlock) reduces one (row, chunk) to
// partials[row * chunks + chunk], accumulating map(row, i) for each element i of the chunk.
template <int kTeam, class R, class Map>
__global__ void chunk_reduce_kernel(int64_t rows, int64_t row_len, int64_t chunk_len, int64_t chunks, Map map,
                                    R* partials) {
  constexpr int kTeams = kBlock / kTeam;
  const int64_t team = static_cast<int64_t>(blockIdx.x) * kTeams + threadIdx.x / kTeam;
  const int lane = threadIdx.x % kTeam;
  R acc = R::identity();
  const bool active = team < rows * chunks;
  if (active) {
    const int64_t row = team / chunks, chunk = team % chunks;
    const int64_t begin = chunk * chunk_len, end = min(begin + chunk_len, row_len);
    for (int64_t i = begin + lane; i < end; i += kTeam) acc.add(map(row, i));
  }
  if constexpr (kTeam == 32) {
    acc = warp_combine(acc);
  } else {
    acc = block_combine(acc);
  }
  if (active && lane == 0) partials[team] = acc;
}

// How a row reduction is split.
struct ChunkPlan {
  int64_t chunk_len = 0;
  int64_t chunks = 1;
  bool warp_teams = false;
};

ChunkPlan plan_chunks(int64_t rows, int64_t row_len, int device) {
  ChunkPlan plan;
  plan.chunk_len = std::max<int64_t>(row_len, 1);
  if (row_len <= kWarpRowMax) {
    plan.warp_teams = true;
    return plan;
  }
  // Enough blocks to fill the device a few times, none with less than kMinChunk elements.
  const int64_t target_blocks = 4 * static_cast<int64_t>(cuda_runtime::multiprocessor_count(device));
  const int64_t by_size = (row_len + kMinChunk - 1) / kMinChunk;
  plan.chunks = std::max<int64_t>(1, std::min((target_blocks + rows - 1) / rows, by_size));
  plan.chunk_len = (row_len + plan.chunks - 1) / plan.chunks;
  plan.chunks = (row_len + plan.chunk_len - 1) / plan.chunk_len;
  return plan;
}

template <class R, class Map>
void launch_chunk_reduce(const char* op, const ChunkPlan& plan, int64_t rows, int64_t row_len, Map map, R* partials,
                         cudaStream_t stream) {
  const int64_t teams = rows * plan.chunks;
  if (teams == 0) return;
  if (plan.warp_teams) {
    const auto grid = static_cast<unsigned>((teams + kWarps - 1) / kWarps);
    chunk_reduce_kernel<32><<<grid, kBlock, 0, stream>>>(rows, row_len, plan.chunk_len, plan.chunks, map, partials);
  } else {
    chunk_reduce_kernel<kBlock><<<static_cast<unsigned>(teams), kBlock, 0, stream>>>(rows, row_len, plan.chunk_len,
                                                                                      plan.chunks, map, partials);
  }
  NC_CUDA_KERNEL_CHECK(op);
}

// ---------------------------------------------------------------- 2. finalize
// One warp per row: combines partials[row * chunks ...] in a fixed order, then calls
// finish(row, combined) on lane 0.
template <class R, class Finish>
__global__ void finalize_kernel(int64_t rows, int64_t chunks, const R* partials, Finish finish) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // whole warps leave together
  R acc = R::identity();
  for (int64_t k = lane; k < chunks; k += 32) acc = combine(acc, partials[row * chunks + k]);
  acc = warp_combine(acc);
  if (lane == 0) finish(row, acc);
}

template <class R, class Finish>
void launch_finalize(const char* op, int64_t rows, int64_t chunks, const R* partials, Finish finish,
                     cudaStream_t stream) {
  if (rows == 0) return;
  const auto grid = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  finalize_kernel<<<grid, kBlock, 0, stream>>>(rows, chunks, partials, finish);
  NC_CUDA_KERNEL_CHECK(op);
}

// Reduces every row to one R and hands it to finish(row, r).
template <class R, class Map, class Finish>
void reduce_rows(const char* op, int64_t rows, int64_t row_len, Map map, Finish finish, int device,
                 cudaStream_t stream) {
  if (rows == 0) return;
  const ChunkPlan plan = plan_chunks(rows, row_len, device);
  cuda_runtime::DeviceBuffer partials(static_cast<size_t>(rows * plan.chunks) * sizeof(R), device);
  launch_chunk_reduce(op, plan, rows, row_len, map, partials.as<R>(), stream);
  launch_finalize(op, rows, plan.chunks, partials.as<const R>(), finish, stream);
}

// ---------------------------------------------------------------- 3. element-wise
template <class Index, class F>
__global__ void elementwise_kernel(Index numel, F f) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index e = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; e < numel; e += stride) f(e);
}

// Runs f(e) for every e < numel; f takes the index type it is instantiated with.
template <class Index, class F>
void launch_elementwise(const char* op, int64_t numel, F f, int device, cudaStream_t stream) {
  if (numel == 0) return;
  elementwise_kernel<<<grid_for(numel, device, kBlock), kBlock, 0, stream>>>(static_cast<Index>(numel), f);
  NC_CUDA_KERNEL_CHECK(op);
}

// Runs f(e) (e an int64_t) for every e < numel: for the small per-row and per-channel loops.
template <class F>
void for_each_index(const char* op, int64_t numel, F f, int device, cudaStream_t stream) {
  launch_elementwise<int64_t>(op, numel, f, device, stream);
}

// Calls run(Index{}) with uint32_t when every index below numel fits 31 bits, else int64_t.
template <class Run>
void with_index_type(int64_t numel, Run run) {
  if (numel <= std::numeric_limits<int32_t>::max()) run(uint32_t{});
  else run(int64_t{});
}

// ---------------------------------------------------------------- group layout
// Layer norm and group norm share one layout: x [batch, groups * group_channels, spatial]
// has rows = batch * groups of row_len = group_channels * spatial elements. Layer norm is
// groups = 1, spatial = 1 (each column its own channel).
struct GroupLayout {
  int64_t batch, groups, group_channels, spatial;
  int64_t rows() const { return batch * groups; }
  int64_t row_len() const { return group_channels * spatial; }
  int64_t channels() const { return groups * group_channels; }
};

// Element index -> (row, channel), by multiply-and-shift division on the 32-bit path.
template <class Index>
struct ElementPlace {
  IntDivider<Index> spatial, group_channels, channels;
  ElementPlace(const GroupLayout& l)
      : spatial(static_cast<Index>(l.spatial)),
        group_channels(static_cast<Index>(l.group_channels)),
        channels(static_cast<Index>(l.channels())) {}
  // e = ((n * channels + c) * spatial + s): plane = n * channels + c, row = plane / gc.
  __device__ __forceinline__ void locate(Index e, Index& row, Index& channel) const {
    const Index plane = spatial.div(e);
    row = group_channels.div(plane);
    channel = plane - channels.div(plane) * static_cast<Index>(channels.divisor);
  }
};

template <class T, class A>
__device__ __forceinline__ A load(const T* p, int64_t i) {
  return convert<A>(p[i]);
}

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
    A v = (load<T, A>(x, e) - mean[row]) * rstd[row];
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
    const A xhat = (load<T, A>(x, e) - mean[row]) * r;
    const A w = weight ? load<T, A>(weight, channel) : A(1);
    grad_x[e] = convert<T>(r * (w * load<T, A>(grad_y, e) - coef[2 * row] - xhat * coef[2 * row + 1]));
  }
};

// ---------------------------------------------------------------- affine norm forward
template <class T>
void affine_norm_forward(const Tensor& x_t, const Tensor& weight_t, const Tensor& bias_t, const GroupLayout& l,
                         double eps, const Tensor& y_t, const Tensor& mean_t, const Tensor& rstd_t, const char* op) {
  using A = compute_t<T>;
  const int device = x_t.device().index;
  cuda_runtime::DeviceGuard guard(device);
  cudaStream_t stream = cuda_runtime::stream(device);
  const T* x = data_as<const T>(x_t);
  const T* weight = weight_t.defined() ? data_as<const T>(weight_t) : nullptr;
  const T* bias = bias_t.defined() ? data_as<const T>(bias_t) : nullptr;
  T* y = data_as<T>(y_t);
  A* mean = data_as<A>(mean_t);
  A* rstd = data_as<A>(rstd_t);
  const int64_t row_len = l.row_len();
  const A eps_a = static_cast<A>(eps);

  reduce_rows<Welford<A>>(
      op, l.rows(), row_len, [=] __device__(int64_t row, int64_t i) { return load<T, A>(x, row * row_len + i); },
      [=] __device__(int64_t row, const Welford<A>& w) {
        const A var = w.count > A(0) ? w.m2 / w.count : A(0);
        mean[row] = w.mean;
        rstd[row] = A(1) / sqrt(var + eps_a);
      },
      device, stream);

  with_index_type(x_t.numel(), [&](auto index_tag) {
    using Index = decltype(index_tag);
    launch_elementwise<Index>(op, x_t.numel(),
                              AffineApply<Index, T, A>{ElementPlace<Index>(l), x, weight, bias, mean, rstd, y},
                              device, stream);
  });
}

// ---------------------------------------------------------------- affine norm backward
// grad_x = rstd * (w * dy - mean(w * dy) - xhat * mean(w * dy * xhat)) per row; the two row
// means are the coefficients [rows, 2].
//
// Parameter gradients, two layouts:
// - spatial == 1 (layer norm, group norm on [N, C]): a column reduction over the batch of
//   dy * xhat and dy, in slices of rows, then one fixed-order sum over the slices;
// - spatial > 1: per-plane (sample, channel) sums of dy and dy * (x - mean) give both the
//   row coefficients and the parameter gradients, so x and dy are read once for them.
constexpr int kColumnTile = 32;
constexpr int kColumnRows = kBlock / kColumnTile;

template <class T, class A>
__global__ void column_grads_kernel(const T* grad_y, const T* x, const A* mean, const A* rstd, int64_t batch,
                                    int64_t channels, int64_t groups, int64_t group_channels,
                                    int64_t rows_per_slice, A* partial_weight, A* partial_bias) {
  __shared__ A tile_w[kColumnRows][kColumnTile + 1];
  __shared__ A tile_b[kColumnRows][kColumnTile + 1];
  const int tx = threadIdx.x % kColumnTile, ty = threadIdx.x / kColumnTile;
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kColumnTile + tx;
  const int64_t slice = blockIdx.y;
  const int64_t begin = slice * rows_per_slice, end = min(begin + rows_per_slice, batch);
  A sum_w = 0, sum_b = 0;
  if (column < channels) {
    const int64_t group = column / group_channels;
    for (int64_t n = begin + ty; n < end; n += kColumnRows) {
      const int64_t row = n * groups + group;
      const A dy = load<T, A>(grad_y, n * channels + column);
      sum_w += dy * (load<T, A>(x, n * channels + column) - mean[row]) * rstd[row];
      sum_b += dy;
    }
  }
  tile_w[ty][tx] = sum_w;
  tile_b[ty][tx] = sum_b;
  __syncthreads();
  if (ty == 0 && column < channels) {
    for (int k = 1; k < kColumnRows; ++k) {
      sum_w += tile_w[k][tx];
      sum_b += tile_b[k][tx];
    }
    partial_weight[slice * channels + column] = sum_w;
    partial_bias[slice * channels + column] = sum_b;
  }
}

// out[c] = sum over k < count of partials[k * channels + c], in order of k.
template <class T, class A>
void sum_slices(const char* op, const A* partials, int64_t count, int64_t channels, T* out, int device,
                cudaStream_t stream) {
  for_each_index(op, channels, [=] __device__(int64_t c) {
    A total = 0;
    for (int64_t k = 0; k < count; ++k) total += partials[k * channels + c];
    out[c] = convert<T>(total);
  }, device, stream);
}

template <class T>
void affine_norm_backward(const Tensor& grad_y_t, const Tensor& x_t, const Tensor& weight_t, const Tensor& mean_t,
                          const Tensor& rstd_t, const GroupLayout& l, const Tensor& grad_x_t,
                          const Tensor& grad_weight_t, const Tensor& grad_bias_t, const char* op) {
  using A = compute_t<T>;
  const int device = x_t.device().index;
  cuda_runtime::DeviceGuard guard(device);
  cudaStream_t stream = cuda_runtime::stream(device);
  const T* grad_y = data_as<const T>(grad_y_t);
  const T* x = data_as<const T>(x_t);
  const T* weight = weight_t.defined() ? data_as<const T>(weight_t) : nullptr;
  const A* mean = data_as<const A>(mean_t);
  const A* rstd = data_as<const A>(rstd_t);
  const int64_t rows = l.rows(), row_len = l.row_len(), channels = l.channels();
  const int64_t batch = l.batch, groups = l.groups, group_channels = l.group_channels, spatial = l.spatial;
  const A inv_len = row_len > 0 ? A(1) / static_cast<A>(row_len) : A(0);

  // coefficients[row] = {mean(w * dy), mean(w * dy * xhat)}
  cuda_runtime::DeviceBuffer coefficients(static_cast<size_t>(std::max<int64_t>(rows, 1)) * 2 * sizeof(A), device);
  A* coef = coefficients.as<A>();

  if (spatial == 1) {
    reduce_rows<Sums<A, 2>>(
        op, rows, row_len,
        [=] __device__(int64_t row, int64_t i) {
          const int64_t e = row * row_len + i;
          const A w = weight ? load<T, A>(weight, (row % groups) * group_channels + i) : A(1);
          const A g = w * load<T, A>(grad_y, e);
          return Sums<A, 2>{{g, g * (load<T, A>(x, e) - mean[row])}};
        },
        [=] __device__(int64_t row, const Sums<A, 2>& s) {
          coef[2 * row] = s.v[0] * inv_len;
          coef[2 * row + 1] = s.v[1] * rstd[row] * inv_len;
        },
        device, stream);
    if (grad_weight_t.defined() || grad_bias_t.defined()) {
      const int64_t column_tiles = (channels + kColumnTile - 1) / kColumnTile;
      const int64_t target_blocks = 4 * static_cast<int64_t>(cuda_runtime::multiprocessor_count(device));
      int64_t slices = std::max<int64_t>(1, std::min<int64_t>((target_blocks + column_tiles - 1) / column_tiles,
                                                              (batch + kColumnRows - 1) / kColumnRows));
      slices = std::min<int64_t>(slices, 65535);
      const int64_t rows_per_slice = std::max<int64_t>(1, (batch + slices - 1) / slices);
      slices = std::max<int64_t>(1, (batch + rows_per_slice - 1) / rows_per_slice);
      cuda_runtime::DeviceBuffer partial_w(static_cast<size_t>(slices * channels) * sizeof(A), device);
      cuda_runtime::DeviceBuffer partial_b(static_cast<size_t>(slices * channels) * sizeof(A), device);
      if (channels > 0) {
        const dim3 grid(static_cast<unsigned>(column_tiles), static_cast<unsigned>(slices));
        column_grads_kernel<T, A><<<grid, kBlock, 0, stream>>>(grad_y, x, mean, rstd, batch, channels, groups,
                                                               group_channels, rows_per_slice, partial_w.as<A>(),
                                                               partial_b.as<A>());
        NC_CUDA_KERNEL_CHECK(op);
      }
      if (grad_weight_t.defined()) {
        sum_slices(op, partial_w.as<const A>(), slices, channels, data_as<T>(grad_weight_t), device, stream);
      }
      if (grad_bias_t.defined()) {
        sum_slices(op, partial_b.as<const A>(), slices, channels, data_as<T>(grad_bias_t), device, stream);
      }
    }
  } else {
    // plane_sums[plane] = {sum(dy), sum(dy * (x - mean))} over the plane's spatial extent.
    const int64_t planes = batch * channels;
    cuda_runtime::DeviceBuffer plane_buffer(static_cast<size_t>(std::max<int64_t>(planes, 1)) * sizeof(Sums<A, 2>),
                                            device);
    Sums<A, 2>* plane_sums = plane_buffer.as<Sums<A, 2>>();
    reduce_rows<Sums<A, 2>>(
        op, planes, spatial,
        [=] __device__(int64_t plane, int64_t s) {
          const int64_t e = plane * spatial + s;
          const A dy = load<T, A>(grad_y, e);
          return Sums<A, 2>{{dy, dy * (load<T, A>(x, e) - mean[plane / group_channels])}};
        },
        [=] __device__(int64_t plane, const Sums<A, 2>& s) { plane_sums[plane] = s; }, device, stream);
    for_each_index(op, rows, [=] __device__(int64_t row) {
      const int64_t first_channel = (row % groups) * group_channels;
      A sum_g = 0, sum_g_xc = 0;
      for (int64_t c = 0; c < group_channels; ++c) {
        const A w = weight ? load<T, A>(weight, first_channel + c) : A(1);
        const Sums<A, 2>& s = plane_sums[row * group_channels + c];
        sum_g += w * s.v[0];
        sum_g_xc += w * s.v[1];
      }
      coef[2 * row] = sum_g * inv_len;
      coef[2 * row + 1] = sum_g_xc * rstd[row] * inv_len;
    }, device, stream);
    T* grad_weight = grad_weight_t.defined() ? data_as<T>(grad_weight_t) : nullptr;
    T* grad_bias = grad_bias_t.defined() ? data_as<T>(grad_bias_t) : nullptr;
    if (grad_weight || grad_bias) {
      for_each_index(op, channels, [=] __device__(int64_t c) {
        const int64_t group = c / group_channels;
        A sum_w = 0, sum_b = 0;
        for (int64_t n = 0; n < batch; ++n) {
          const Sums<A, 2>& s = plane_sums[n * channels + c];
          sum_w += s.v[1] * rstd[n * groups + group];
          sum_b += s.v[0];
        }
        if (grad_weight) grad_weight[c] = convert<T>(sum_w);
        if (grad_bias) grad_bias[c] = convert<T>(sum_b);
      }, device, stream);
    }
  }

  if (!grad_x_t.defined()) return;
  T* grad_x = data_as<T>(grad_x_t);
  with_index_type(x_t.numel(), [&](auto index_tag) {
    using Index = decltype(index_tag);
    launch_elementwise<Index>(
        op, x_t.numel(),
        AffineGradInput<Index, T, A>{ElementPlace<Index>(l), grad_y, x, weight, mean, rstd, coef, grad_x}, device,
        stream);
  });
}

// ---------------------------------------------------------------- L1 and Frobenius
// x / max(norm, eps); the norm's gradient is 0 where the clamp is active.
template <class A>
__device__ __forceinline__ A clamped(A norm, A eps) {
  return norm < eps ? eps : norm;
}

template <class A>
__device__ __forceinline__ A sign_of(A v) {
  return v > A(0) ? A(1) : v < A(0) ? A(-1) : A(0);
}

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

unsigned column_grid(int64_t columns) { return static_cast<unsigned>((columns + kBlock - 1) / kBlock); }

template <class T>
void l1_forward(const Tensor& x_t, int64_t outer, int64_t size, int64_t inner, double eps, const Tensor& y_t,
                const Tensor& norm_t) {
  using A = compute_t<T>;
  const char* op = "l1_norm";
  const int device = x_t.device().index;
  cuda_runtime::DeviceGuard guard(device);
  cudaStream_t stream = cuda_runtime::stream(device);
  const T* x = data_as<const T>(x_t);
  T* y = data_as<T>(y_t);
  A* norm = data_as<A>(norm_t);
  const A eps_a = static_cast<A>(eps);
  if (inner > 1) {
    if (outer * inner == 0) return;
    l1_columns_forward_kernel<T, A><<<column_grid(outer * inner), kBlock, 0, stream>>>(x, outer, size, inner, eps_a,
                                                                                       y, norm);
    NC_CUDA_KERNEL_CHECK(op);
    return;
  }
  const A inv_size = size > 0 ? A(1) / static_cast<A>(size) : A(0);
  reduce_rows<Sums<A, 1>>(
      op, outer, size, [=] __device__(int64_t row, int64_t i) { return Sums<A, 1>{{abs(load<T, A>(x, row * size + i))}}; },
      [=] __device__(int64_t row, const Sums<A, 1>& s) { norm[row] = s.v[0] * inv_size; }, device, stream);
  with_index_type(x_t.numel(), [&](auto index_tag) {
    using Index = decltype(index_tag);
    launch_elementwise<Index>(
        op, x_t.numel(), RowScale<Index, T, A>{IntDivider<Index>(static_cast<Index>(size)), x, norm, eps_a, y},
        device, stream);
  });
}

template <class T>
void l1_backward(const Tensor& grad_y_t, const Tensor& x_t, const Tensor& norm_t, int64_t outer, int64_t size,
                 int64_t inner, double eps, const Tensor& grad_x_t) {
  using A = compute_t<T>;
  const char* op = "l1_norm backward";
  const int device = x_t.device().index;
  cuda_runtime::DeviceGuard guard(device);
  cudaStream_t stream = cuda_runtime::stream(device);
  const T* grad_y = data_as<const T>(grad_y_t);
  const T* x = data_as<const T>(x_t);
  const A* norm = data_as<const A>(norm_t);
  T* grad_x = data_as<T>(grad_x_t);
  const A eps_a = static_cast<A>(eps);
  if (inner > 1) {
    if (outer * inner == 0) return;
    l1_columns_backward_kernel<T, A><<<column_grid(outer * inner), kBlock, 0, stream>>>(grad_y, x, norm, outer, size,
                                                                                        inner, eps_a, grad_x);
    NC_CUDA_KERNEL_CHECK(op);
    return;
  }
  // through[row] = dot(dy, x) / (size * n^2), 0 where the clamp is active.
  cuda_runtime::DeviceBuffer through_buffer(static_cast<size_t>(std::max<int64_t>(outer, 1)) * sizeof(A), device);
  A* through = through_buffer.as<A>();
  const A size_a = static_cast<A>(size);
  reduce_rows<Sums<A, 1>>(
      op, outer, size,
      [=] __device__(int64_t row, int64_t i) {
        const int64_t e = row * size + i;
        return Sums<A, 1>{{load<T, A>(grad_y, e) * load<T, A>(x, e)}};
      },
      [=] __device__(int64_t row, const Sums<A, 1>& s) {
        const A n = norm[row];
        through[row] = n >= eps_a ? s.v[0] / (size_a * n * n) : A(0);
      },
      device, stream);
  with_index_type(x_t.numel(), [&](auto index_tag) {
    using Index = decltype(index_tag);
    launch_elementwise<Index>(op, x_t.numel(),
                              L1GradInput<Index, T, A>{IntDivider<Index>(static_cast<Index>(size)), grad_y, x, norm,
                                                       through, eps_a, grad_x},
                              device, stream);
  });
}

template <class T>
void frobenius_forward(const Tensor& x_t, double eps, const Tensor& y_t, const Tensor& norm_t) {
  using A = compute_t<T>;
  const char* op = "frobenius_norm";
  const int device = x_t.device().index;
  cuda_runtime::DeviceGuard guard(device);
  cudaStream_t stream = cuda_runtime::stream(device);
  const T* x = data_as<const T>(x_t);
  T* y = data_as<T>(y_t);
  A* norm = data_as<A>(norm_t);
  const A eps_a = static_cast<A>(eps);
  reduce_rows<Sums<A, 1>>(
      op, 1, x_t.numel(),
      [=] __device__(int64_t, int64_t i) {
        const A v = load<T, A>(x, i);
        return Sums<A, 1>{{v * v}};
      },
      [=] __device__(int64_t, const Sums<A, 1>& s) { *norm = sqrt(s.v[0]); }, device, stream);
  for_each_index(op, x_t.numel(), [=] __device__(int64_t e) {
    y[e] = convert<T>(load<T, A>(x, e) * (A(1) / clamped(*norm, eps_a)));
  }, device, stream);
}

template <class T>
void frobenius_backward(const Tensor& grad_y_t, const Tensor& x_t, const Tensor& norm_t, double eps,
                        const Tensor& grad_x_t) {
  using A = compute_t<T>;
  const char* op = "frobenius_norm backward";
  const int device = x_t.device().index;
  cuda_runtime::DeviceGuard guard(device);
  cudaStream_t stream = cuda_runtime::stream(device);
  const T* grad_y = data_as<const T>(grad_y_t);
  const T* x = data_as<const T>(x_t);
  const A* norm = data_as<const A>(norm_t);
  T* grad_x = data_as<T>(grad_x_t);
  const A eps_a = static_cast<A>(eps);
  // through = dot(dy, x) / n^3, 0 where the clamp is active.
  cuda_runtime::DeviceBuffer through_buffer(sizeof(A), device);
  A* through = through_buffer.as<A>();
  reduce_rows<Sums<A, 1>>(
      op, 1, x_t.numel(),
      [=] __device__(int64_t, int64_t i) { return Sums<A, 1>{{load<T, A>(grad_y, i) * load<T, A>(x, i)}}; },
      [=] __device__(int64_t, const Sums<A, 1>& s) {
        const A n = *norm;
        *through = n >= eps_a ? s.v[0] / (n * n * n) : A(0);
      },
      device, stream);
  for_each_index(op, x_t.numel(), [=] __device__(int64_t e) {
    grad_x[e] = convert<T>(load<T, A>(grad_y, e) / clamped(*norm, eps_a) - load<T, A>(x, e) * *through);
  }, device, stream);
}

GroupLayout layer_layout(int64_t rows, int64_t row_len) { return {rows, 1, row_len, 1}; }
GroupLayout group_layout(int64_t batch, int64_t groups, int64_t channels, int64_t spatial) {
  return {batch, groups, groups > 0 ? channels / groups : 0, spatial};
}

}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t rows, int64_t row_len,
                        double eps, const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  dispatch_floating(x.dtype(), "layer_norm", [&](auto tag) {
    affine_norm_forward<typename decltype(tag)::type>(x, weight, bias, layer_layout(rows, row_len), eps, y, mean,
                                                      rstd, "layer_norm");
  });
}

void layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, int64_t rows, int64_t row_len, const Tensor& grad_x,
                         const Tensor& grad_weight, const Tensor& grad_bias) {
  dispatch_floating(x.dtype(), "layer_norm backward", [&](auto tag) {
    affine_norm_backward<typename decltype(tag)::type>(grad_y, x, weight, mean, rstd, layer_layout(rows, row_len),
                                                       grad_x, grad_weight, grad_bias, "layer_norm backward");
  });
}

void group_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t batch, int64_t groups,
                        int64_t channels, int64_t spatial, double eps, const Tensor& y, const Tensor& mean,
                        const Tensor& rstd) {
  dispatch_floating(x.dtype(), "group_norm", [&](auto tag) {
    affine_norm_forward<typename decltype(tag)::type>(x, weight, bias, group_layout(batch, groups, channels, spatial),
                                                      eps, y, mean, rstd, "group_norm");
  });
}

void group_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, int64_t batch, int64_t groups, int64_t channels, int64_t spatial,
                         const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias) {
  dispatch_floating(x.dtype(), "group_norm backward", [&](auto tag) {
    affine_norm_backward<typename decltype(tag)::type>(grad_y, x, weight, mean, rstd,
                                                       group_layout(batch, groups, channels, spatial), grad_x,
                                                       grad_weight, grad_bias, "group_norm backward");
  });
}

void l1_norm_forward(const Tensor& x, int64_t outer, int64_t size, int64_t inner, double eps, const Tensor& y,
                     const Tensor& norm) {
  dispatch_floating(x.dtype(), "l1_norm", [&](auto tag) {
    l1_forward<typename decltype(tag)::type>(x, outer, size, inner, eps, y, norm);
  });
}

void l1_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& norm, int64_t outer, int64_t size,
                      int64_t inner, double eps, const Tensor& grad_x) {
  dispatch_floating(x.dtype(), "l1_norm backward", [&](auto tag) {
    l1_backward<typename decltype(tag)::type>(grad_y, x, norm, outer, size, inner, eps, grad_x);
  });
}

void frobenius_norm_forward(const Tensor& x, double eps, const Tensor& y, const Tensor& norm) {
  dispatch_floating(x.dtype(), "frobenius_norm", [&](auto tag) {
    frobenius_forward<typename decltype(tag)::type>(x, eps, y, norm);
  });
}

void frobenius_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& norm, double eps,
                             const Tensor& grad_x) {
  dispatch_floating(x.dtype(), "frobenius_norm backward", [&](auto tag) {
    frobenius_backward<typename decltype(tag)::type>(grad_y, x, norm, eps, grad_x);
  });
}

}  // namespace cuda_kernels
}  // namespace normcore
