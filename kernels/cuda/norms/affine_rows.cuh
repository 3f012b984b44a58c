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
// hold the row) holds a whole row in registers, kRowVecs 16-byte vectors per
// thread, so x is read once forward and x and dy once backward. Statistics are two-pass
// over the registers. Rows must start 16-byte aligned (row_len a multiple of the vector
// width); other rows take the column passes below.
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

// The team's row in registers: vector j = lane + k * kTeam of the row, k < kRowVecs.
template <class T, int V>
struct RowSlice {
  using A = compute_t<T>;
  A v[kRowVecs][V];
  __device__ __forceinline__ void load(const T* row, int64_t vecs, int lane, int team_size) {
#pragma unroll
    for (int k = 0; k < kRowVecs; ++k) {
      const int64_t j = lane + static_cast<int64_t>(k) * team_size;
      if (j < vecs) {
        const Vec<T, V> raw = reinterpret_cast<const Vec<T, V>*>(row)[j];
#pragma unroll
        for (int e = 0; e < V; ++e) v[k][e] = convert<A>(raw.v[e]);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) v[k][e] = A(0);
      }
    }
  }
};

template <class T, int kTeam, int V>
__global__ void __launch_bounds__(team_block<kTeam>()) layer_norm_rows_forward(
    int64_t rows, int64_t row_len, const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
    compute_t<T> eps, T* __restrict__ y, compute_t<T>* __restrict__ mean_out, compute_t<T>* __restrict__ rstd_out) {
  using A = compute_t<T>;
  constexpr int kTeams = team_block<kTeam>() / kTeam;
  const int lane = threadIdx.x % kTeam;
  const int64_t vecs = row_len / V;
  const A inv_len = A(1) / static_cast<A>(row_len);
  // Every team runs the same number of iterations, so block-wide syncs inside stay matched.
  // Where a slice is at most 16 values (float32), the next row's loads are issued before
  // this row's reductions; twice the registers for 16-bit rows cost more than they gain.
  constexpr bool kPrefetch = kRowVecs * V <= 16;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kTeams;
  auto load_row = [&](RowSlice<T, V>& slice, int64_t first) {
    const int64_t row = first + threadIdx.x / kTeam;
    const bool active = row < rows;
    slice.load(x + (active ? row : 0) * row_len, active ? vecs : 0, lane, kTeam);
  };
  RowSlice<T, V> next;
  if constexpr (kPrefetch) load_row(next, static_cast<int64_t>(blockIdx.x) * kTeams);
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kTeams; first < rows; first += stride) {
    const int64_t row = first + threadIdx.x / kTeam;
    const bool active = row < rows;
    RowSlice<T, V> slice;
    if constexpr (kPrefetch) {
      slice = next;
      if (first + stride < rows) load_row(next, first + stride);
    } else {
      load_row(slice, first);
    }
    A mean = 0;
    if (mean_out) {  // the same for the whole block, so the team's barriers stay matched
      Sums<A, 1> s{{A(0)}};
#pragma unroll
      for (int k = 0; k < kRowVecs; ++k)
#pragma unroll
        for (int e = 0; e < V; ++e) s.v[0] += slice.v[k][e];
      mean = rows_team_reduce<kTeam>(s, Merge{}).v[0] * inv_len;
    }
    Sums<A, 1> sq{{A(0)}};
#pragma unroll
    for (int k = 0; k < kRowVecs; ++k) {
      if (lane + static_cast<int64_t>(k) * kTeam < vecs) {
#pragma unroll
        for (int e = 0; e < V; ++e) sq.v[0] += (slice.v[k][e] - mean) * (slice.v[k][e] - mean);
      }
    }
    const A rstd = A(1) / sqrt(rows_team_reduce<kTeam>(sq, Merge{}).v[0] * inv_len + eps);
    if (!active) continue;
    if (lane == 0) {
      if (mean_out) mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
#pragma unroll
    for (int k = 0; k < kRowVecs; ++k) {
      const int64_t j = lane + static_cast<int64_t>(k) * kTeam;
      if (j >= vecs) continue;
      Vec<T, V> w, b, out;
      if (weight) w = load_vec<T, V>(weight, j);
      if (bias) b = load_vec<T, V>(bias, j);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        A v = (slice.v[k][e] - mean) * rstd;
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
// ([gridDim.x, row_len] each), which sum_slices adds in block order. x and dy are read once
// for everything, instead of once more by a column pass.
template <class T, int kTeam, int V, bool kParams>
__global__ void __launch_bounds__(team_block<kTeam>()) layer_norm_rows_backward(
    int64_t rows, int64_t row_len, const T* __restrict__ grad_y, const T* __restrict__ x,
    const T* __restrict__ weight, const compute_t<T>* __restrict__ mean_in, const compute_t<T>* __restrict__ rstd_in,
    T* __restrict__ grad_x, compute_t<T>* __restrict__ partial_w, compute_t<T>* __restrict__ partial_b) {
  using A = compute_t<T>;
  constexpr int kTeams = team_block<kTeam>() / kTeam;
  const int lane = threadIdx.x % kTeam;
  const int64_t vecs = row_len / V;
  const A inv_len = A(1) / static_cast<A>(row_len);
  A sum_w[kParams ? kRowVecs : 1][V], sum_b[kParams ? kRowVecs : 1][V];
  if constexpr (kParams) {
#pragma unroll
    for (int k = 0; k < kRowVecs; ++k)
#pragma unroll
      for (int e = 0; e < V; ++e) sum_w[k][e] = sum_b[k][e] = A(0);
  }
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kTeams; first < rows;
       first += static_cast<int64_t>(gridDim.x) * kTeams) {
    const int64_t row = first + threadIdx.x / kTeam;
    const bool active = row < rows;
    const int64_t offset = (active ? row : 0) * row_len;
    RowSlice<T, V> xs, gs;
    xs.load(x + offset, active ? vecs : 0, lane, kTeam);
    gs.load(grad_y + offset, active ? vecs : 0, lane, kTeam);
    const A mean = active && mean_in ? mean_in[row] : A(0), rstd = active ? rstd_in[row] : A(0);
    // g = w * dy, kept in gs; sums of g and g * xhat. An inactive row loaded zeros, which add
    // nothing to the parameter sums.
    Sums<A, 2> s{{A(0), A(0)}};
#pragma unroll
    for (int k = 0; k < kRowVecs; ++k) {
      const int64_t j = lane + static_cast<int64_t>(k) * kTeam;
      if (j >= vecs) continue;
      Vec<T, V> w;
      if (weight) w = load_vec<T, V>(weight, j);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        xs.v[k][e] = (xs.v[k][e] - mean) * rstd;
        if constexpr (kParams) {
          sum_w[k][e] += gs.v[k][e] * xs.v[k][e];
          sum_b[k][e] += gs.v[k][e];
        }
        if (weight) gs.v[k][e] *= convert<A>(w.v[e]);
        s.v[0] += gs.v[k][e];
        s.v[1] += gs.v[k][e] * xs.v[k][e];
      }
    }
    s = rows_team_reduce<kTeam>(s, Merge{});
    if (!active) continue;
    const A mean_g = mean_in ? s.v[0] * inv_len : A(0), mean_g_xhat = s.v[1] * inv_len;
#pragma unroll
    for (int k = 0; k < kRowVecs; ++k) {
      const int64_t j = lane + static_cast<int64_t>(k) * kTeam;
      if (j >= vecs) continue;
      Vec<T, V> out;
#pragma unroll
      for (int e = 0; e < V; ++e) out.v[e] = convert<T>(rstd * (gs.v[k][e] - mean_g - xs.v[k][e] * mean_g_xhat));
      reinterpret_cast<Vec<T, V>*>(grad_x + offset)[j] = out;
    }
  }
  if constexpr (kParams) {
    A* out_w = partial_w + static_cast<int64_t>(blockIdx.x) * row_len;
    A* out_b = partial_b + static_cast<int64_t>(blockIdx.x) * row_len;
    // f(column, this thread's sum of dy * xhat, of dy) for each column the thread holds.
    auto each_column = [&](auto&& f) {
#pragma unroll
      for (int k = 0; k < kRowVecs; ++k) {
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
      // Teams smaller than the block hold rows of at most kTeam * kRowVecs * V elements.
      constexpr int kMaxLen = kTeam * kRowVecs * V;
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
                                            compute_t<T>* __restrict__ partial_w, compute_t<T>* __restrict__ partial_b) {
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
  int64_t slices = std::min<int64_t>({std::max<int64_t>(1, (target_threads + vecs - 1) / vecs), std::max<int64_t>(rows, 1), 65535});
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

// out[c] = sum over k < count of partials[k * channels + c], in order of k.
template <class T, class A>
void sum_slices(const Launcher& launch, const A* partials, int64_t count, int64_t channels, T* out) {
  for_each_index(launch, channels, [=] __device__(int64_t c) {
    A total = 0;
    for (int64_t k = 0; k < count; ++k) total += partials[k * channels + c];
    out[c] = convert<T>(total);
  });
}

}  // namespace cuda
}  // namespace normcore
