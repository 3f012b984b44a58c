// CUDA kernels of the fused GroupNorm + min + bias step (contracts in
// kernels/cpu/gemm_group_norm_min_bias.h, the reference, and kernels/cuda/gemm_group_norm_min_bias.h).
// Storage type T, math type C (float for f32/f16/bf16, double for f64).
// Forward: one warp per row b, kRowsPerBlock rows per block. The warp splits into segments
// of `width` lanes (the power of two covering the group length, at most 32), one group per
// segment at a time: two-pass statistics (corrected two-pass, so a large mean costs no
// accuracy), then the affine-normalized values' min and first argmin; y is read from global
// memory once, the later passes hit the cache. The block then writes out[o, b] for its rows,
// so consecutive threads write consecutive b.
// Backward: (1) partial column sums of grad_out [OUT, B] over chunks of o; (2) one block per
// row finishes g_b and writes grad_y (zero outside the argmin's group); (3) one warp per
// channel o sums grad_bias[o] over b and the rows whose argmin is o for grad_weight and
// grad_gn_bias. Every sum has a fixed order and no atomics: results are deterministic.
#include "kernels/cuda/gemm_group_norm_min_bias.h"

#include <algorithm>

#include "kernels/cuda/loops.cuh"

namespace normcore {
namespace cuda_kernels {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 16;
constexpr unsigned kFullMask = 0xffffffffu;

// Sum over aligned segments of `width` lanes; every lane of a segment gets the same bits
// (each step adds the same two values on both partners).
template <class C>
__device__ __forceinline__ C segment_sum(C v, int width) {
  for (int offset = width / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// A candidate for the min: index < 0 is no candidate. A NaN beats any number, then the
// smaller value, then the lower index: a total order, so any combination order agrees.
template <class C>
struct MinAt {
  C value;
  int64_t index;
};

template <class C>
__device__ __forceinline__ MinAt<C> better(MinAt<C> a, MinAt<C> b) {
  if (a.index < 0) return b;
  if (b.index < 0) return a;
  const bool a_nan = a.value != a.value, b_nan = b.value != b.value;
  if (a_nan != b_nan) return a_nan ? a : b;
  if (!a_nan && a.value != b.value) return a.value < b.value ? a : b;
  return a.index < b.index ? a : b;
}

template <class T, class C>
__global__ void __launch_bounds__(kRowsPerBlock * kWarp)
    forward_kernel(const T* __restrict__ y, const T* __restrict__ weight, const T* __restrict__ gn_bias,
                   const T* __restrict__ bias, int64_t rows, int64_t channels, int64_t groups, int width, C eps,
                   T* __restrict__ out, C* __restrict__ mean_out, C* __restrict__ rstd_out,
                   int64_t* __restrict__ argmin) {
  __shared__ C row_min[kRowsPerBlock];
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  const int64_t row = first_row + warp;
  if (row < rows) {  // uniform per warp, so the shuffles below see every lane
    const T* yr = y + row * channels;
    const int64_t group_len = channels / groups;
    const int segments = kWarp / width, segment = lane / width, seg_lane = lane % width;
    const C inv_len = C(1) / static_cast<C>(group_len);
    MinAt<C> best{C(0), -1};
    for (int64_t first_group = 0; first_group < groups; first_group += segments) {
      const int64_t g = first_group + segment;
      const bool active = g < groups;
      const T* yg = yr + g * group_len;
      C sum = 0;
      if (active)
        for (int64_t i = seg_lane; i < group_len; i += width) sum += convert<C>(yg[i]);
      const C mean = segment_sum(sum, width) * inv_len;
      C dev = 0, dev_sq = 0;
      if (active)
        for (int64_t i = seg_lane; i < group_len; i += width) {
          const C d = convert<C>(yg[i]) - mean;
          dev += d;
          dev_sq += d * d;
        }
      dev = segment_sum(dev, width);
      dev_sq = segment_sum(dev_sq, width);
      // The mean's rounding error e adds len * e^2 to dev_sq; dev = len * e takes it back out.
      const C var = max((dev_sq - dev * dev * inv_len) * inv_len, C(0));
      const C rstd = C(1) / sqrt(var + eps);
      if (!active) continue;
      if (seg_lane == 0) {
        mean_out[row * groups + g] = mean;
        rstd_out[row * groups + g] = rstd;
      }
      for (int64_t i = seg_lane; i < group_len; i += width) {
        const int64_t c = g * group_len + i;
        C z = (convert<C>(yg[i]) - mean) * rstd;
        if (weight) z *= convert<C>(weight[c]);
        if (gn_bias) z += convert<C>(gn_bias[c]);
        best = better(best, MinAt<C>{z, c});
      }
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      MinAt<C> other{__shfl_xor_sync(kFullMask, best.value, offset),
                     __shfl_xor_sync(kFullMask, best.index, offset)};
      best = better(best, other);
    }
    if (lane == 0) {
      row_min[warp] = best.value;
      argmin[row] = best.index;
    }
  }
  __syncthreads();
  const int block_rows = static_cast<int>(rows - first_row < kRowsPerBlock ? rows - first_row : kRowsPerBlock);
  const int64_t total = channels * block_rows;
  for (int64_t t = threadIdx.x; t < total; t += blockDim.x) {
    const int64_t o = t / block_rows;
    const int j = static_cast<int>(t - o * block_rows);
    out[o * rows + first_row + j] = convert<T>(row_min[j] + convert<C>(bias[o]));
  }
}

// Backward (1): partial[chunk, b] = sum of grad_out[o, b] over the chunk's o, in order.
// Block (32 lanes over b) x (8 over o); grid (b tiles, o chunks).
constexpr int kColLanes = 32, kColRows = 8;

template <class T, class C>
__global__ void column_partials_kernel(const T* __restrict__ grad_out, int64_t rows, int64_t channels,
                                       int64_t chunk_len, C* __restrict__ partials) {
  __shared__ C sums[kColRows][kColLanes];
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kColLanes + threadIdx.x;
  const int64_t first_o = static_cast<int64_t>(blockIdx.y) * chunk_len;
  const int64_t last_o = min(channels, first_o + chunk_len);
  C sum = 0;
  if (b < rows)
    for (int64_t o = first_o + threadIdx.y; o < last_o; o += kColRows) sum += convert<C>(grad_out[o * rows + b]);
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || b >= rows) return;
  C total = 0;
  for (int k = 0; k < kColRows; ++k) total += sums[k][threadIdx.x];
  partials[blockIdx.y * rows + b] = total;
}

// Backward (2): one block per row. row_grad[b] = g_b and row_grad_xhat[b] = g_b * xhat at
// the argmin, for step (3); grad_y[b, :] written whole.
template <class T, class C>
__global__ void grad_y_kernel(const T* __restrict__ y, const T* __restrict__ weight, const C* __restrict__ mean,
                              const C* __restrict__ rstd, const int64_t* __restrict__ argmin,
                              const C* __restrict__ partials, int64_t chunks, int64_t rows, int64_t channels,
                              int64_t groups, T* __restrict__ grad_y, C* __restrict__ row_grad,
                              C* __restrict__ row_grad_xhat) {
  __shared__ C shared[4];  // rstd, w * g, mean(w * dz), mean(w * dz * xhat)
  const int64_t b = blockIdx.x;
  const int64_t group_len = channels / groups;
  const int64_t a = argmin[b];
  const int64_t g = a / group_len;
  const T* yr = y + b * channels;
  const C mu = mean[b * groups + g];
  if (threadIdx.x == 0) {
    C dz = 0;
    for (int64_t k = 0; k < chunks; ++k) dz += partials[k * rows + b];
    const C r = rstd[b * groups + g];
    const C xhat_a = (convert<C>(yr[a]) - mu) * r;
    const C w_dz = (weight ? convert<C>(weight[a]) : C(1)) * dz;
    row_grad[b] = dz;
    row_grad_xhat[b] = dz * xhat_a;
    shared[0] = r;
    shared[1] = w_dz;
    shared[2] = w_dz / static_cast<C>(group_len);
    shared[3] = w_dz * xhat_a / static_cast<C>(group_len);
  }
  __syncthreads();
  const C r = shared[0], w_dz = shared[1], mean_w_dz = shared[2], mean_w_dz_xhat = shared[3];
  const int64_t group_begin = g * group_len, group_end = group_begin + group_len;
  T* gyr = grad_y + b * channels;
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
    C value = 0;
    if (c >= group_begin && c < group_end) {
      const C xhat = (convert<C>(yr[c]) - mu) * r;
      value = r * ((c == a ? w_dz : C(0)) - mean_w_dz - xhat * mean_w_dz_xhat);
    }
    gyr[c] = convert<T>(value);
  }
}

// Backward (3): one warp per channel o; lanes stride over b, then a fixed shuffle tree.
template <class T, class C>
__global__ void param_grad_kernel(const T* __restrict__ grad_out, const int64_t* __restrict__ argmin,
                                  const C* __restrict__ row_grad, const C* __restrict__ row_grad_xhat,
                                  int64_t rows, int64_t channels, T* __restrict__ grad_weight,
                                  T* __restrict__ grad_gn_bias, T* __restrict__ grad_bias) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t o = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  if (o >= channels) return;  // uniform per warp
  const bool affine = grad_weight || grad_gn_bias;
  C bias_sum = 0, weight_sum = 0, gn_bias_sum = 0;
  for (int64_t b = lane; b < rows; b += kWarp) {
    bias_sum += convert<C>(grad_out[o * rows + b]);
    if (affine && argmin[b] == o) {
      weight_sum += row_grad_xhat[b];
      gn_bias_sum += row_grad[b];
    }
  }
  bias_sum = segment_sum(bias_sum, kWarp);
  weight_sum = segment_sum(weight_sum, kWarp);
  gn_bias_sum = segment_sum(gn_bias_sum, kWarp);
  if (lane != 0) return;
  grad_bias[o] = convert<T>(bias_sum);
  if (grad_weight) grad_weight[o] = convert<T>(weight_sum);
  if (grad_gn_bias) grad_gn_bias[o] = convert<T>(gn_bias_sum);
}

template <class T>
const T* maybe_data(const Tensor& t) {
  return t.defined() ? data_as<const T>(t) : nullptr;
}
template <class T>
T* maybe_mutable_data(const Tensor& t) {
  return t.defined() ? data_as<T>(t) : nullptr;
}

int segment_width(int64_t group_len) {
  int width = 1;
  while (width < kWarp && width < group_len) width *= 2;
  return width;
}

// Calls launch(TypeTag<T>{}, stream, device) for y's dtype, with y's device current and
// its current stream.
template <class F>
void launch_on(const Tensor& y, const char* op, F&& launch) {
  const int device = y.device().index;
  cuda_runtime::DeviceGuard guard(device);
  cudaStream_t stream = cuda_runtime::stream(device);
  dispatch_floating(y.dtype(), op, [&](auto tag) { launch(tag, stream, device); });
}

}  // namespace

void group_norm_min_bias_forward(const Tensor& y, const Tensor& weight, const Tensor& gn_bias,
                                 const Tensor& bias, int64_t rows, int64_t channels, int64_t groups, double eps,
                                 const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                 const Tensor& argmin) {
  const char* op = "gemm_group_norm_min_bias";
  if (rows == 0) return;
  launch_on(y, op, [&](auto tag, cudaStream_t stream, int) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    const unsigned grid = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
    forward_kernel<T, C><<<grid, kRowsPerBlock * kWarp, 0, stream>>>(
        data_as<const T>(y), maybe_data<T>(weight), maybe_data<T>(gn_bias), data_as<const T>(bias), rows, channels,
        groups, segment_width(channels / groups), static_cast<C>(eps), data_as<T>(out), data_as<C>(mean),
        data_as<C>(rstd), data_as<int64_t>(argmin));
    NC_CUDA_KERNEL_CHECK(op);
  });
}

void group_norm_min_bias_backward(const Tensor& grad_out, const Tensor& y, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd, const Tensor& argmin, int64_t rows,
                                  int64_t channels, int64_t groups, const Tensor& grad_y,
                                  const Tensor& grad_weight, const Tensor& grad_gn_bias, const Tensor& grad_bias) {
  const char* op = "gemm_group_norm_min_bias backward";
  launch_on(y, op, [&](auto tag, cudaStream_t stream, int device) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    // Enough o chunks to fill the device with the column sums, each at least 64 rows of o.
    const int64_t b_tiles = (rows + kColLanes - 1) / kColLanes;
    const int64_t wanted_chunks =
        std::max<int64_t>(1, cuda_runtime::multiprocessor_count(device) * 8 / std::max<int64_t>(b_tiles, 1));
    const int64_t chunks = std::min(wanted_chunks, (channels + 63) / 64);
    const int64_t chunk_len = (channels + chunks - 1) / chunks;
    cuda_runtime::DeviceBuffer buffer(sizeof(C) * static_cast<size_t>(rows * (chunks + 2)), device);
    C* partials = buffer.as<C>();
    C* row_grad = partials + rows * chunks;
    C* row_grad_xhat = row_grad + rows;
    if (rows > 0) {
      column_partials_kernel<T, C><<<dim3(static_cast<unsigned>(b_tiles), static_cast<unsigned>(chunks)),
                                     dim3(kColLanes, kColRows), 0, stream>>>(data_as<const T>(grad_out), rows,
                                                                             channels, chunk_len, partials);
      NC_CUDA_KERNEL_CHECK(op);
      grad_y_kernel<T, C><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
          data_as<const T>(y), maybe_data<T>(weight), data_as<const C>(mean), data_as<const C>(rstd),
          data_as<const int64_t>(argmin), partials, chunks, rows, channels, groups, data_as<T>(grad_y), row_grad,
          row_grad_xhat);
      NC_CUDA_KERNEL_CHECK(op);
    }
    const int64_t warps_per_block = kThreads / kWarp;
    const unsigned grid = static_cast<unsigned>((channels + warps_per_block - 1) / warps_per_block);
    param_grad_kernel<T, C><<<grid, kThreads, 0, stream>>>(
        data_as<const T>(grad_out), data_as<const int64_t>(argmin), row_grad, row_grad_xhat, rows, channels,
        maybe_mutable_data<T>(grad_weight), maybe_mutable_data<T>(grad_gn_bias), data_as<T>(grad_bias));
    NC_CUDA_KERNEL_CHECK(op);
  });
}

}  // namespace cuda_kernels
}  // namespace normcore
