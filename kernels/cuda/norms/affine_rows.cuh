// The kernels of layer norm's layout (rows of row_len elements, one channel per column):
// rows kept in registers, and for rows too long for that, passes along columns. Also the
// column reduction of the parameter gradients, for every layout with one channel per column
// (layer norm, group norm over [N, C]). Launched by affine.cu. RMS norm runs the same kernels
// with no mean (a null mean pointer): no centering, and no mean(w * dy) term backward.
#pragma once

#include "kernels/cuda/norms/norms.cuh"

namespace normcore {
namespace cuda {

// ---------------------------------------------------------------- rows kept in registers
// Layer norm over rows of up to 16384 elements: a team of threads (a warp, 64 or 128 threads
// of a 256-thread block, or a block of 256 to 1024; plan.h picks the smallest whose registers
// hold the row) holds a whole row in registers, kVecs (3 or 4) 16-byte vectors per thread, so
// x is read once forward and x and dy once backward. Statistics are two-pass over the
// registers. Rows must start 16-byte aligned (row_len a multiple of the vector width); other
// rows take the column passes below.
template <int kTeam>
constexpr int team_block() {
  return kTeam < kThreads ? kThreads : kTeam;
}

// team_reduce for the teams of these kernels, which may also be 64 or 128 threads sharing a
// 256-thread block: every warp reduces, then each team combines its own warps' results in
// warp order (the same tree as team_reduce, so the same bits for a team of the block).
template <int kTeam, class R, class Combine>
__device__ __forceinline__ R rows_team_reduce(R r, const Combine& combine) {
  if constexpr (kTeam <= 32 || kTeam == team_block<kTeam>()) {
    return team_reduce<kTeam>(r, combine);
  } else {
    constexpr int kWarps = kTeam / 32, kBlockWarps = team_block<kTeam>() / 32;
    r = warp_reduce<32>(r, combine);
    __shared__ R warp_results[kBlockWarps];
    __syncthreads();  // an earlier call may still be reading
    if (threadIdx.x % 32 == 0) warp_results[threadIdx.x / 32] = r;
    __syncthreads();
    const int first = static_cast<int>(threadIdx.x) / kTeam * kWarps;
    r = warp_results[first];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) r = combine(r, warp_results[first + w]);
    return r;
  }
}

// The team's row in registers as loaded, vector j = lane + k * kTeam of the row, k < kVecs:
// 16-bit elements stay packed, half the registers of widened ones, and are widened where
// used (at() converts).
template <class T, int V, int kVecs>
struct RowSlice {
  using A = compute_t<T>;
  Vec<T, V> raw[kVecs];
  __device__ __forceinline__ void load(const T* row, int64_t vecs, int lane, int team_size) {
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t j = lane + static_cast<int64_t>(k) * team_size;
      if (j < vecs) {
        raw[k] = load_vec<T, V>(row, j);
      } else {
        const uint4 zero = {0, 0, 0, 0};  // 0.0 in every floating type
        memcpy(&raw[k], &zero, sizeof(raw[k]));
      }
    }
  }
  __device__ __forceinline__ A at(int k, int e) const { return convert<A>(raw[k].v[e]); }
};

template <class T, int kTeam, int V, int kVecs>
__global__ void __launch_bounds__(team_block<kTeam>())
    layer_norm_rows_forward(int64_t rows, int64_t row_len, const T* __restrict__ x, const T* __restrict__ weight,
                            const T* __restrict__ bias, compute_t<T> eps, T* __restrict__ y,
                            compute_t<T>* __restrict__ mean_out, compute_t<T>* __restrict__ rstd_out) {
  using A = compute_t<T>;
  constexpr int kTeams = team_block<kTeam>() / kTeam;
  const int lane = threadIdx.x % kTeam;
  const int64_t vecs = row_len / V;
  const A inv_len = A(1) / static_cast<A>(row_len);
  // Every team runs the same number of iterations, so block-wide syncs inside stay matched.
  // The next row's loads are issued before this row's reductions.
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kTeams;
  auto load_row = [&](RowSlice<T, V, kVecs>& slice, int64_t first) {
    const int64_t row = first + threadIdx.x / kTeam;
    const bool active = row < rows;
    slice.load(x + (active ? row : 0) * row_len, active ? vecs : 0, lane, kTeam);
  };
  RowSlice<T, V, kVecs> next;
  load_row(next, static_cast<int64_t>(blockIdx.x) * kTeams);
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kTeams; first < rows; first += stride) {
    const int64_t row = first + threadIdx.x / kTeam;
    const bool active = row < rows;
    const RowSlice<T, V, kVecs> slice = next;
    if (first + stride < rows) load_row(next, first + stride);
    A mean = 0;
    if (mean_out) {  // the same for the whole block, so the team's barriers stay matched
      Sums<A, 1> s{{A(0)}};
#pragma unroll
      for (int k = 0; k < kVecs; ++k)
#pragma unroll
        for (int e = 0; e < V; ++e) s.v[0] += slice.at(k, e);
      mean = rows_team_reduce<kTeam>(s, Merge{}).v[0] * inv_len;
    }
    Sums<A, 1> sq{{A(0)}};
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      if (lane + static_cast<int64_t>(k) * kTeam < vecs) {
#pragma unroll
        for (int e = 0; e < V; ++e) sq.v[0] += (slice.at(k, e) - mean) * (slice.at(k, e) - mean);
      }
    }
    const A rstd = A(1) / sqrt(rows_team_reduce<kTeam>(sq, Merge{}).v[0] * inv_len + eps);
    if (!active) continue;
    if (lane == 0) {
      if (mean_out) mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t j = lane + static_cast<int64_t>(k) * kTeam;
      if (j >= vecs) continue;
      Vec<T, V> w, b, out;
      if (weight) w = load_vec<T, V>(weight, j);
      if (bias) b = load_vec<T, V>(bias, j);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        A v = (slice.at(k, e) - mean) * rstd;
        if (weight) v *= convert<A>(w.v[e]);
        if (bias) v += convert<A>(b.v[e]);
        out.v[e] = convert<T>(v);
      }
      reinterpret_cast<Vec<T, V>*>(y + row * row_len)[j] = out;
    }
  }
}

// grad_x and, with kParams, the parameter gradients in the same pass (Apex's and Liger's
// scheme): every thread keeps the same columns of each row it handles, so it sums dy * xhat
// and dy for its columns in registers over its rows; at the end the teams of a block add
// theirs in team order through shared memory and the block writes one row of partials
// ([gridDim.x, row_len] each), which sum_slices adds in a fixed order. x and dy are read once
// for everything, instead of once more by a column pass. x and dy stay as loaded (packed
// 16-bit) and xhat and w * dy are computed twice, for the sums and for grad_x: registers,
// not arithmetic, limit how many rows an SM has in flight.
// Blocks of 256 threads an SM must hold of a backward row kernel (the registers ptxas may
// use): 16-bit rows of 4 vectors a thread come to about 150 registers unbounded, one block an
// SM, 8 warps to hide each row's loads and reductions; held to two blocks (128 registers, a
// few bytes spilled). f32 rows of 3 vectors fit three blocks without spilling. Measured on
// the H200 (docs/PERFORMANCE.md).
template <class T, int kTeam, int kVecs>
constexpr int rows_backward_min_blocks() {
  if (team_block<kTeam>() != 256) return 1;
  if (sizeof(T) == 2) return 2;
  return sizeof(T) == 4 && kVecs == 3 ? 3 : 1;
}

template <class T, int kTeam, int V, int kVecs, bool kParams>
__global__ void __launch_bounds__(team_block<kTeam>(), rows_backward_min_blocks<T, kTeam, kVecs>())
    layer_norm_rows_backward(int64_t rows, int64_t row_len, const T* __restrict__ grad_y, const T* __restrict__ x,
                             const T* __restrict__ weight, const compute_t<T>* __restrict__ mean_in,
                             const compute_t<T>* __restrict__ rstd_in, T* __restrict__ grad_x,
                             compute_t<T>* __restrict__ partial_w, compute_t<T>* __restrict__ partial_b) {
  using A = compute_t<T>;
  constexpr int kTeams = team_block<kTeam>() / kTeam;
  const int lane = threadIdx.x % kTeam;
  const int64_t vecs = row_len / V;
  const A inv_len = A(1) / static_cast<A>(row_len);
  A sum_w[kParams ? kVecs : 1][V], sum_b[kParams ? kVecs : 1][V];
  if constexpr (kParams) {
#pragma unroll
    for (int k = 0; k < kVecs; ++k)
#pragma unroll
      for (int e = 0; e < V; ++e) sum_w[k][e] = sum_b[k][e] = A(0);
  }
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kTeams; first < rows;
       first += static_cast<int64_t>(gridDim.x) * kTeams) {
    const int64_t row = first + threadIdx.x / kTeam;
    const bool active = row < rows;
    const int64_t offset = (active ? row : 0) * row_len;
    RowSlice<T, V, kVecs> xs, gs;
    xs.load(x + offset, active ? vecs : 0, lane, kTeam);
    gs.load(grad_y + offset, active ? vecs : 0, lane, kTeam);
    const A mean = active && mean_in ? mean_in[row] : A(0), rstd = active ? rstd_in[row] : A(0);
    // f(k, j, w) for each vector k the thread holds (vector j of the row; w: j of weight).
    // An inactive row loaded zeros, which add nothing to the parameter sums.
    auto each_vector = [&](auto&& f) {
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        const int64_t j = lane + static_cast<int64_t>(k) * kTeam;
        if (j >= vecs) continue;
        Vec<T, V> w;
        if (weight) w = load_vec<T, V>(weight, j);
        f(k, j, w);
      }
    };
    auto xhat_at = [&](int k, int e) { return (xs.at(k, e) - mean) * rstd; };
    auto g_at = [&](int k, int e, const Vec<T, V>& w) {
      return weight ? gs.at(k, e) * convert<A>(w.v[e]) : gs.at(k, e);
    };
    Sums<A, 2> s{{A(0), A(0)}};  // sums of g = w * dy and g * xhat
    each_vector([&](int k, int64_t, const Vec<T, V>& w) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const A xhat = xhat_at(k, e), g = g_at(k, e, w);
        if constexpr (kParams) {
          sum_w[k][e] += gs.at(k, e) * xhat;
          sum_b[k][e] += gs.at(k, e);
        }
        s.v[0] += g;
        s.v[1] += g * xhat;
      }
    });
    s = rows_team_reduce<kTeam>(s, Merge{});
    if (!active) continue;
    const A mean_g = mean_in ? s.v[0] * inv_len : A(0), mean_g_xhat = s.v[1] * inv_len;
    // The stores go out together after the arithmetic, except in 1024-thread blocks, whose
    // 64 registers a thread have no room for the outputs (they spilled).
    constexpr bool kStoresLast = team_block<kTeam>() < 1024;
    Vec<T, V> out[kStoresLast ? kVecs : 1];
    each_vector([&](int k, int64_t j, const Vec<T, V>& w) {
      Vec<T, V>& o = out[kStoresLast ? k : 0];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        o.v[e] = convert<T>(rstd * (g_at(k, e, w) - mean_g - xhat_at(k, e) * mean_g_xhat));
      }
      if constexpr (!kStoresLast) reinterpret_cast<Vec<T, V>*>(grad_x + offset)[j] = o;
    });
    if constexpr (kStoresLast) {
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        const int64_t j = lane + static_cast<int64_t>(k) * kTeam;
        if (j < vecs) reinterpret_cast<Vec<T, V>*>(grad_x + offset)[j] = out[k];
      }
    }
  }
  if constexpr (kParams) {
    A* out_w = partial_w + static_cast<int64_t>(blockIdx.x) * row_len;
    A* out_b = partial_b + static_cast<int64_t>(blockIdx.x) * row_len;
    // f(column, this thread's sum of dy * xhat, of dy) for each column the thread holds.
    auto each_column = [&](auto&& f) {
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        const int64_t j = lane + static_cast<int64_t>(k) * kTeam;
        if (j >= vecs) continue;
#pragma unroll
        for (int e = 0; e < V; ++e) f(j * V + e, sum_w[k][e], sum_b[k][e]);
      }
    };
    if constexpr (kTeams == 1) {
      each_column([&](int64_t c, A w, A b) {
        out_w[c] = w;
        out_b[c] = b;
      });
    } else {
      // Teams smaller than the block hold rows of at most kTeam * kVecs * V elements.
      constexpr int kMaxLen = kTeam * kVecs * V;
      __shared__ A block_w[kMaxLen], block_b[kMaxLen];
      for (int64_t c = threadIdx.x; c < row_len; c += blockDim.x) block_w[c] = block_b[c] = A(0);
      __syncthreads();
      for (int team = 0; team < kTeams; ++team) {  // in team order: the same bits every run
        if (static_cast<int>(threadIdx.x) / kTeam == team) {
          each_column([&](int64_t c, A w, A b) {
            block_w[c] += w;
            block_b[c] += b;
          });
        }
        __syncthreads();
      }
      for (int64_t c = threadIdx.x; c < row_len; c += blockDim.x) {
        out_w[c] = block_w[c];
        out_b[c] = block_b[c];
      }
    }
  }
}

// ---------------------------------------------------------------- layer norm over long rows
// Rows too long for registers: the row statistics (or the backward sums) come from the
// chunked reduction, then one pass walks columns: each thread takes one vector of V
// columns for a slice of rows, so weight and bias are read once per slice, not once per
// row, and backward folds the parameter gradients into the same pass (per-slice partials,
// summed in slice order afterwards).
template <class T, int V>
__global__ void layer_norm_columns_forward(int64_t rows, int64_t row_len, int64_t rows_per_slice,
                                           const T* __restrict__ x, const T* __restrict__ weight,
                                           const T* __restrict__ bias, const compute_t<T>* __restrict__ mean,
                                           const compute_t<T>* __restrict__ rstd, T* __restrict__ y) {
  using A = compute_t<T>;
  const int64_t vecs = row_len / V;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= vecs) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_slice, r1 = min(r0 + rows_per_slice, rows);
  Vec<T, V> w, b;
  if (weight) w = load_vec<T, V>(weight, j);
  if (bias) b = load_vec<T, V>(bias, j);
  for (int64_t r = r0; r < r1; ++r) {
    const Vec<T, V> in = load_vec<T, V>(x + r * row_len, j);
    const A m = mean ? mean[r] : A(0), s = rstd[r];
    Vec<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      A v = (convert<A>(in.v[e]) - m) * s;
      if (weight) v *= convert<A>(w.v[e]);
      if (bias) v += convert<A>(b.v[e]);
      out.v[e] = convert<T>(v);
    }
    reinterpret_cast<Vec<T, V>*>(y + r * row_len)[j] = out;
  }
}

// coef[row] = {mean(w * dy), mean(w * dy * xhat)}; partials [slices, row_len] of
// sum(dy * xhat) and sum(dy).
template <class T, int V>
__global__ void layer_norm_columns_backward(int64_t rows, int64_t row_len, int64_t rows_per_slice,
                                            const T* __restrict__ grad_y, const T* __restrict__ x,
                                            const T* __restrict__ weight, const compute_t<T>* __restrict__ mean,
                                            const compute_t<T>* __restrict__ rstd,
                                            const compute_t<T>* __restrict__ coef, T* __restrict__ grad_x,
                                            compute_t<T>* __restrict__ partial_w,
                                            compute_t<T>* __restrict__ partial_b) {
  using A = compute_t<T>;
  const int64_t vecs = row_len / V;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= vecs) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_slice, r1 = min(r0 + rows_per_slice, rows);
  Vec<T, V> w;
  if (weight) w = load_vec<T, V>(weight, j);
  A sum_w[V], sum_b[V];
#pragma unroll
  for (int e = 0; e < V; ++e) sum_w[e] = sum_b[e] = A(0);
  for (int64_t r = r0; r < r1; ++r) {
    const Vec<T, V> xv = load_vec<T, V>(x + r * row_len, j);
    const Vec<T, V> gv = load_vec<T, V>(grad_y + r * row_len, j);
    const A m = mean ? mean[r] : A(0), s = rstd[r], c0 = coef[2 * r], c1 = coef[2 * r + 1];
    Vec<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const A dy = convert<A>(gv.v[e]);
      const A xhat = (convert<A>(xv.v[e]) - m) * s;
      const A g = weight ? dy * convert<A>(w.v[e]) : dy;
      out.v[e] = convert<T>(s * (g - c0 - xhat * c1));
      sum_w[e] += dy * xhat;
      sum_b[e] += dy;
    }
    reinterpret_cast<Vec<T, V>*>(grad_x + r * row_len)[j] = out;
  }
  const int64_t base = static_cast<int64_t>(blockIdx.y) * row_len + j * V;
#pragma unroll
  for (int e = 0; e < V; ++e) {
    partial_w[base + e] = sum_w[e];
    partial_b[base + e] = sum_b[e];
  }
}

// Grid for a column pass: vector columns across x, slices of rows across y, with enough
// threads in all to fill the device.
struct ColumnGrid {
  dim3 grid;
  int64_t slices, rows_per_slice;
};

inline ColumnGrid column_grid_for(int64_t rows, int64_t vecs, int multiprocessors) {
  const int64_t target_threads = 2048 * static_cast<int64_t>(multiprocessors);
  int64_t slices =
      std::min<int64_t>({std::max<int64_t>(1, (target_threads + vecs - 1) / vecs), std::max<int64_t>(rows, 1), 65535});
  const int64_t rows_per_slice = std::max<int64_t>(1, (rows + slices - 1) / slices);
  slices = std::max<int64_t>(1, (rows + rows_per_slice - 1) / rows_per_slice);
  return {dim3(static_cast<unsigned>((vecs + kThreads - 1) / kThreads), static_cast<unsigned>(slices)), slices,
          rows_per_slice};
}

// ---------------------------------------------------------------- parameter gradients over columns
// grad_weight = sum(dy * xhat), grad_bias = sum(dy) over the batch, for layouts with one
// channel per column: per-slice partials of a tile of columns, then one fixed-order sum
// over the slices.
constexpr int kColumnTile = 32;
constexpr int kColumnRows = kThreads / kColumnTile;

template <class T, class A>
__global__ void column_grads_kernel(const T* grad_y, const T* x, const A* mean, const A* rstd, int64_t batch,
                                    int64_t channels, int64_t groups, int64_t group_channels, int64_t rows_per_slice,
                                    A* partial_weight, A* partial_bias) {
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
      sum_w += dy * (load<T, A>(x, n * channels + column) - (mean ? mean[row] : A(0))) * rstd[row];
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

// grad_weight[c] and grad_bias[c] = the sums over k < count of partial_w[k * channels + c]
// and partial_b[...] (either output may be null), in a fixed order, so the same bits every
// run. Many slices (a row kernel's blocks: hundreds) take two steps: blocks of kColumnTile
// columns by kColumnRows thread rows, `groups` of them along the slices, sum a run of
// slices each (every thread row a strided part, then the rows in order) into a row of group
// sums; then a thread per column adds its groups in order. With one thread per column
// summing 264 slices in a chain, each output took 34 us on the H100 (ncu); with only the
// column tiles (24 blocks for 768 columns), 22-32 us: too few loads in flight.
template <class Out, class A>
__global__ void sum_slice_groups_kernel(const A* __restrict__ partial_w, const A* __restrict__ partial_b, int64_t count,
                                        int64_t channels, int64_t per_group, bool want_w, bool want_b,
                                        Out* __restrict__ out_w, Out* __restrict__ out_b) {
  __shared__ A tile_w[kColumnRows][kColumnTile + 1];
  __shared__ A tile_b[kColumnRows][kColumnTile + 1];
  const int tx = threadIdx.x % kColumnTile, ty = threadIdx.x / kColumnTile;
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kColumnTile + tx;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * per_group, end = min(first + per_group, count);
  A sum_w = 0, sum_b = 0;
  if (column < channels) {
#pragma unroll 4
    for (int64_t k = first + ty; k < end; k += kColumnRows) {
      if (want_w) sum_w += partial_w[k * channels + column];
      if (want_b) sum_b += partial_b[k * channels + column];
    }
  }
  tile_w[ty][tx] = sum_w;
  tile_b[ty][tx] = sum_b;
  __syncthreads();
  if (ty != 0 || column >= channels) return;
  for (int r = 1; r < kColumnRows; ++r) {
    sum_w += tile_w[r][tx];
    sum_b += tile_b[r][tx];
  }
  const int64_t at = static_cast<int64_t>(blockIdx.y) * channels + column;
  if (want_w) out_w[at] = convert<Out>(sum_w);
  if (want_b) out_b[at] = convert<Out>(sum_b);
}

template <class T, class A>
void sum_slices(const Launcher& launch, const A* partial_w, const A* partial_b, int64_t count, int64_t channels,
                T* grad_w, T* grad_b) {
  if ((!grad_w && !grad_b) || channels == 0) return;
  auto sum_in_order = [&](const A* part_w, const A* part_b, int64_t parts) {
    for_each_index(launch, channels, [=] __device__(int64_t c) {
      A sum_w = 0, sum_b = 0;
      for (int64_t k = 0; k < parts; ++k) {
        if (grad_w) sum_w += part_w[k * channels + c];
        if (grad_b) sum_b += part_b[k * channels + c];
      }
      if (grad_w) grad_w[c] = convert<T>(sum_w);
      if (grad_b) grad_b[c] = convert<T>(sum_b);
    });
  };
  if (count <= 2 * kColumnRows) return sum_in_order(partial_w, partial_b, count);
  // Enough groups for about two blocks an SM, each with a slice or more per thread row.
  const int64_t tiles = ceil_div(channels, kColumnTile);
  const int64_t wanted =
      std::min(ceil_div(2 * static_cast<int64_t>(launch.multiprocessors()), tiles), count / kColumnRows);
  const int64_t per_group = ceil_div(count, std::max<int64_t>(wanted, 1));
  const int64_t groups = ceil_div(count, per_group);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(groups));
  if (groups == 1) {
    return launch(sum_slice_groups_kernel<T, A>, grid, kThreads, 0, partial_w, partial_b, count, channels, per_group,
                  grad_w != nullptr, grad_b != nullptr, grad_w, grad_b);
  }
  const DeviceBuffer group_sums = launch.buffer(2 * static_cast<size_t>(groups * channels) * sizeof(A));
  A* group_w = group_sums.as<A>();
  A* group_b = group_w + groups * channels;
  launch(sum_slice_groups_kernel<A, A>, grid, kThreads, 0, partial_w, partial_b, count, channels, per_group,
         grad_w != nullptr, grad_b != nullptr, group_w, group_b);
  sum_in_order(group_w, group_b, groups);
}

}  // namespace cuda
}  // namespace normcore
