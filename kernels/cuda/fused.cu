// CUDA fused kernels (contracts in kernels/fused.h): the GroupNorm + min + bias step of
// gemm_group_norm_min_bias (below), the row kernels of linear_cross_entropy and softmax
// (softmax_rows.cuh), and residual add + LayerNorm.
// Storage type T, math type C (float for f32/f16/bf16, double for f64).
// Forward, groups of up to 64 channels whose row fits in shared memory: one block per row
// stages the row in shared memory, one thread per group takes its statistics and minimum
// (short_group_forward_kernel), then a broadcast kernel writes out. Otherwise one warp per
// row b, kRowsPerBlock rows per block: the warp splits into segments of `width` lanes (the
// power of two covering the group length, at most 32), one group per segment at a time;
// y is read from global memory once, the later passes hit the cache; the block then writes
// out[o, b] for its rows, so consecutive threads write consecutive b. Both take two-pass
// statistics (corrected two-pass, so a large mean costs no accuracy), then the
// affine-normalized values' min and first argmin.
// Backward: (1) partial column sums of grad_out [OUT, B] over chunks of o; (2) one block per
// row finishes g_b and writes grad_y (zero outside the argmin's group); (3) one warp per
// channel o sums grad_bias[o] over b, the rows whose argmin is o for grad_weight and
// grad_gn_bias, and the rows whose argmin shares o's group for grad_linear_bias. The linear
// bias is added to y as it is read (v = y + linear_bias), in both directions. Every sum has
// a fixed order and no atomics: results are deterministic.
#include <algorithm>
#include <limits>

#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/pairs.cuh"
#include "kernels/cuda/reduction/combine.cuh"
#include "kernels/cuda/vec.cuh"
#include "kernels/fused.h"
#include "runtime/cuda/index_errors.h"

namespace normcore {
namespace cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 16;

// The row's minimum so far: a NaN wins, then the smaller value, then the lower index.
template <class C>
using MinAt = ArgBest<C>;
template <class C>
using Better = ArgCombine<C, false>;

template <class T, class C>
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    forward_kernel(const T* __restrict__ y, const T* __restrict__ linear_bias, const T* __restrict__ weight,
                   const T* __restrict__ gn_bias, const T* __restrict__ bias, int64_t rows, int64_t channels,
                   int64_t groups, int width, C eps, T* __restrict__ out, C* __restrict__ mean_out,
                   C* __restrict__ rstd_out, int64_t* __restrict__ argmin) {
  __shared__ C row_min[kRowsPerBlock];
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  const int64_t row = first_row + warp;
  if (row < rows) {  // uniform per warp, so the shuffles below see every lane
    const T* yr = y + row * channels;
    const int64_t group_len = channels / groups;
    // v[c] = y[row, c] + linear_bias[c], the value the statistics and the min see.
    auto v = [&](int64_t c) { return convert<C>(yr[c]) + (linear_bias ? convert<C>(linear_bias[c]) : C(0)); };
    const int segments = kWarp / width, segment = lane / width, seg_lane = lane % width;
    const C inv_len = C(1) / static_cast<C>(group_len);
    MinAt<C> best = no_candidate<C, false>();
    for (int64_t first_group = 0; first_group < groups; first_group += segments) {
      const int64_t g = first_group + segment;
      const bool active = g < groups;
      const int64_t first = g * group_len;
      C sum = 0;
      if (active)
        for (int64_t i = seg_lane; i < group_len; i += width) sum += v(first + i);
      const C mean = segment_reduce(sum, Plus{}, width) * inv_len;
      C dev = 0, dev_sq = 0;
      if (active)
        for (int64_t i = seg_lane; i < group_len; i += width) {
          const C d = v(first + i) - mean;
          dev += d;
          dev_sq += d * d;
        }
      dev = segment_reduce(dev, Plus{}, width);
      dev_sq = segment_reduce(dev_sq, Plus{}, width);
      // The mean's rounding error e adds len * e^2 to dev_sq; dev = len * e takes it back out.
      const C var = max((dev_sq - dev * dev * inv_len) * inv_len, C(0));
      const C rstd = C(1) / sqrt(var + eps);
      if (!active) continue;
      if (seg_lane == 0) {
        mean_out[row * groups + g] = mean;
        rstd_out[row * groups + g] = rstd;
      }
      for (int64_t i = seg_lane; i < group_len; i += width) {
        const int64_t c = first + i;
        C z = (v(c) - mean) * rstd;
        if (weight) z *= convert<C>(weight[c]);
        if (gn_bias) z += convert<C>(gn_bias[c]);
        best = Better<C>{}(best, MinAt<C>{z, c});
      }
    }
    best = warp_reduce<kWarp>(best, Better<C>{});
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

// Forward for short groups (at most kShortGroup channels) of rows that fit in shared
// memory: one block per row. The block copies y[b, :] into shared memory with coalesced
// loads, group g at smem[g * stride], stride = group_len rounded up to odd so that threads
// reading their own groups hit distinct banks. One thread per group then takes its
// statistics (the same corrected two-pass as above) and its normalized minimum from shared
// memory, and the block reduces the row's minimum into row_min[b] and argmin[b]; the
// broadcast kernel below writes out. y crosses device memory once, in full 128-byte lines.
constexpr int kShortGroup = 64;
constexpr int kRowThreads = 256;

template <class T, class C>
__global__ void __launch_bounds__(kRowThreads)
    short_group_forward_kernel(const T* __restrict__ y, const T* __restrict__ linear_bias, const T* __restrict__ weight,
                               const T* __restrict__ gn_bias, int channels, int groups, C eps, C* __restrict__ row_min,
                               C* __restrict__ mean_out, C* __restrict__ rstd_out, int64_t* __restrict__ argmin) {
  extern __shared__ unsigned char smem_bytes[];
  C* row = reinterpret_cast<C*>(smem_bytes);
  const int64_t b = blockIdx.x;
  const int group_len = channels / groups, stride = group_len | 1;
  const T* yr = y + b * channels;
  // kBatch loads in flight per thread before any is stored.
  constexpr int kBatch = 8;
  for (int first = threadIdx.x; first < channels; first += kBatch * kRowThreads) {
    C v[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int c = first + k * kRowThreads;
      if (c < channels) v[k] = convert<C>(yr[c]) + (linear_bias ? convert<C>(linear_bias[c]) : C(0));
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int c = first + k * kRowThreads;
      const int g = c / group_len;
      if (c < channels) row[g * stride + (c - g * group_len)] = v[k];
    }
  }
  __syncthreads();
  const C inv_len = C(1) / static_cast<C>(group_len);
  MinAt<C> best = no_candidate<C, false>();
  for (int g = threadIdx.x; g < groups; g += kRowThreads) {
    const C* v = row + g * stride;
    C sum = 0;
    for (int i = 0; i < group_len; ++i) sum += v[i];
    const C mean = sum * inv_len;
    C dev = 0, dev_sq = 0;
    for (int i = 0; i < group_len; ++i) {
      const C d = v[i] - mean;
      dev += d;
      dev_sq += d * d;
    }
    const C var = max((dev_sq - dev * dev * inv_len) * inv_len, C(0));
    const C rstd = C(1) / sqrt(var + eps);
    mean_out[b * groups + g] = mean;
    rstd_out[b * groups + g] = rstd;
    const int first = g * group_len;
#pragma unroll 8
    for (int i = 0; i < group_len; ++i) {
      C z = (v[i] - mean) * rstd;
      if (weight) z *= convert<C>(weight[first + i]);
      if (gn_bias) z += convert<C>(gn_bias[first + i]);
      best = Better<C>{}(best, MinAt<C>{z, first + i});
    }
  }
  best = team_reduce<kRowThreads>(best, Better<C>{});
  if (threadIdx.x == 0) {
    row_min[b] = best.value;
    argmin[b] = best.index;
  }
}

// out[o, b] = row_min[b] + bias[o], out [OUT, B] contiguous: one block per o (grid-stride),
// consecutive threads write consecutive b.
template <class T, class C>
__global__ void broadcast_min_kernel(const C* __restrict__ row_min, const T* __restrict__ bias, int64_t rows,
                                     int64_t channels, T* __restrict__ out) {
  for (int64_t o = blockIdx.x; o < channels; o += gridDim.x) {
    const C add = convert<C>(bias[o]);
    T* out_o = out + o * rows;
    for (int64_t b = threadIdx.x; b < rows; b += blockDim.x) out_o[b] = convert<T>(row_min[b] + add);
  }
}

// Shared memory the short-group kernel needs for a row, or 0 when it does not apply.
template <class C>
size_t short_group_smem(int64_t channels, int64_t groups, int max_smem) {
  const int64_t group_len = channels / groups;
  if (group_len > kShortGroup) return 0;
  // The row minimum's own buffers and the driver's reserve take a little of it.
  const size_t bytes = static_cast<size_t>(groups * (group_len | 1)) * sizeof(C);
  return static_cast<int64_t>(bytes) <= max_smem - 1024 ? bytes : 0;
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
__global__ void grad_y_kernel(const T* __restrict__ y, const T* __restrict__ linear_bias, const T* __restrict__ weight,
                              const C* __restrict__ mean, const C* __restrict__ rstd,
                              const int64_t* __restrict__ argmin, const C* __restrict__ partials, int64_t chunks,
                              int64_t rows, int64_t channels, int64_t groups, T* __restrict__ grad_y,
                              C* __restrict__ row_grad, C* __restrict__ row_grad_xhat) {
  __shared__ C shared[4];  // rstd, w * g, mean(w * dz), mean(w * dz * xhat)
  const int64_t b = blockIdx.x;
  const int64_t group_len = channels / groups;
  const int64_t a = argmin[b];
  const int64_t g = a / group_len;
  const T* yr = y + b * channels;
  auto v = [&](int64_t c) { return convert<C>(yr[c]) + (linear_bias ? convert<C>(linear_bias[c]) : C(0)); };
  const C mu = mean[b * groups + g];
  if (threadIdx.x == 0) {
    C dz = 0;
    for (int64_t k = 0; k < chunks; ++k) dz += partials[k * rows + b];
    const C r = rstd[b * groups + g];
    const C xhat_a = (v(a) - mu) * r;
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
      const C xhat = (v(c) - mu) * r;
      value = r * ((c == a ? w_dz : C(0)) - mean_w_dz - xhat * mean_w_dz_xhat);
    }
    gyr[c] = convert<T>(value);
  }
}

// Backward (3): one warp per channel o; lanes stride over b, then a fixed shuffle tree.
// grad_linear_bias[o] sums grad_y[b, o] over the rows b whose argmin lies in o's group (the
// only rows where it is not zero), read back from grad_y as step (2) rounded it.
template <class T, class C>
__global__ void param_grad_kernel(const T* __restrict__ grad_out, const int64_t* __restrict__ argmin,
                                  const C* __restrict__ row_grad, const C* __restrict__ row_grad_xhat,
                                  const T* __restrict__ grad_y, int64_t rows, int64_t channels, int64_t group_len,
                                  T* __restrict__ grad_linear_bias, T* __restrict__ grad_weight,
                                  T* __restrict__ grad_gn_bias, T* __restrict__ grad_bias) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t o = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  if (o >= channels) return;  // uniform per warp
  const bool affine = grad_weight || grad_gn_bias;
  const int64_t group = o / group_len;
  C bias_sum = 0, weight_sum = 0, gn_bias_sum = 0, linear_bias_sum = 0;
  for (int64_t b = lane; b < rows; b += kWarp) {
    bias_sum += convert<C>(grad_out[o * rows + b]);
    if (!affine && !grad_linear_bias) continue;
    const int64_t a = argmin[b];
    if (affine && a == o) {
      weight_sum += row_grad_xhat[b];
      gn_bias_sum += row_grad[b];
    }
    if (grad_linear_bias && a / group_len == group) linear_bias_sum += convert<C>(grad_y[b * channels + o]);
  }
  bias_sum = warp_reduce<kWarp>(bias_sum, Plus{});
  linear_bias_sum = warp_reduce<kWarp>(linear_bias_sum, Plus{});
  weight_sum = warp_reduce<kWarp>(weight_sum, Plus{});
  gn_bias_sum = warp_reduce<kWarp>(gn_bias_sum, Plus{});
  if (lane != 0) return;
  grad_bias[o] = convert<T>(bias_sum);
  if (grad_linear_bias) grad_linear_bias[o] = convert<T>(linear_bias_sum);
  if (grad_weight) grad_weight[o] = convert<T>(weight_sum);
  if (grad_gn_bias) grad_gn_bias[o] = convert<T>(gn_bias_sum);
}

int segment_width(int64_t group_len) {
  int width = 1;
  while (width < kWarp && width < group_len) width *= 2;
  return width;
}

#include "kernels/cuda/softmax_rows.cuh"

// ---------------------------------------------------------------- residual add + LayerNorm
// One warp per row, four rows a block: each lane holds its kVecs vectors of 4 elements of
// x + y in registers, writes them to sum as it goes, takes the two-pass statistics (warp sums
// of v, then of (v - mean)^2, in a fixed order) and writes the normalized row in out's dtype.
// x and y are read once and sum and out written once: the composition (y converted, the
// add, the LayerNorm, its output converted for a 16-bit product) passes over the rows about
// five times.
constexpr int kAddNormRowsPerBlock = 4;

template <class TX, class TY, class TO, int kVecs>
__global__ void __launch_bounds__(kAddNormRowsPerBlock * 32)
    add_layer_norm_kernel(const TX* __restrict__ x, const TY* __restrict__ y, const TX* __restrict__ weight,
                          const TX* __restrict__ bias, int64_t rows, int cols, float eps, TX* __restrict__ sum,
                          TO* __restrict__ out, float* __restrict__ mean_out, float* __restrict__ rstd_out) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kAddNormRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;  // whole warps leave together
  const int vectors = cols / 4;
  const int64_t base = row * (cols / 4);
  float v[kVecs][4];
  float total = 0;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int j = lane + i * 32;
    if (j < vectors) {
      const Vec<TX, 4> a = load_vec<TX, 4>(x, base + j);
      const Vec<TY, 4> b = load_vec<TY, 4>(y, base + j);
      Vec<TX, 4> s;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        s.v[k] = convert<TX>(convert<float>(a.v[k]) + convert<float>(b.v[k]));
        v[i][k] = convert<float>(s.v[k]);  // the sum as stored: the statistics are those of sum
        total += v[i][k];
      }
      store_vec<TX, 4>(sum, base + j, s);
    }
  }
  const auto add = [](float p, float q) { return p + q; };
  const float mean = warp_reduce<32>(total, add) / cols;
  float squares = 0;
#pragma unroll
  for (int i = 0; i < kVecs; ++i)
    if (lane + i * 32 < vectors)
#pragma unroll
      for (int k = 0; k < 4; ++k) squares += (v[i][k] - mean) * (v[i][k] - mean);
  const float rstd = rsqrtf(warp_reduce<32>(squares, add) / cols + eps);
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int j = lane + i * 32;
    if (j < vectors) {
      const Vec<TX, 4> w = load_vec<TX, 4>(weight, j);
      Vec<TX, 4> b;
      if (bias != nullptr) b = load_vec<TX, 4>(bias, j);
      Vec<TO, 4> o;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float shift = bias != nullptr ? convert<float>(b.v[k]) : 0.0f;
        o.v[k] = convert<TO>((v[i][k] - mean) * rstd * convert<float>(w.v[k]) + shift);
      }
      store_vec<TO, 4>(out, base + j, o);
    }
  }
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

template <class TX, class TY, class TO>
void launch_add_layer_norm(const Launcher& launch, const Tensor& x, const Tensor& y, const Tensor& weight,
                           const Tensor& bias, int64_t rows, int cols, float eps, const Tensor& sum, const Tensor& out,
                           const Tensor& mean, const Tensor& rstd) {
  const int vecs_per_lane = (cols / 4 + 31) / 32;
  auto kernel = vecs_per_lane <= 2   ? add_layer_norm_kernel<TX, TY, TO, 2>
                : vecs_per_lane <= 4 ? add_layer_norm_kernel<TX, TY, TO, 4>
                : vecs_per_lane <= 8 ? add_layer_norm_kernel<TX, TY, TO, 8>
                                     : add_layer_norm_kernel<TX, TY, TO, 16>;
  launch(kernel, static_cast<unsigned>(ceil_div(rows, int64_t{kAddNormRowsPerBlock})), kAddNormRowsPerBlock * 32, 0,
         data_as<const TX>(x), data_as<const TY>(y), data_as<const TX>(weight), data_or_null<const TX>(bias), rows,
         cols, eps, data_as<TX>(sum), data_as<TO>(out), data_as<float>(mean), data_as<float>(rstd));
}

class CudaFused final : public kernels::FusedKernels {
 public:
  bool softmax_rows(const Tensor& x, int64_t rows, int64_t cols, bool take_log, const Tensor& out) const override {
    const char* op = take_log ? "log_softmax" : "softmax";
    if (rows == 0 || cols == 0) return true;
    if (rows > (int64_t{1} << 31) - 1) return false;  // the composition takes them
    const Launcher launch(op, x);
    visit_float(x.dtype(), op, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      if (cols <= 8 * 128) launch_softmax_rows<T, C, 128>(launch, x, rows, cols, take_log, out);
      else launch_softmax_rows<T, C, 512>(launch, x, rows, cols, take_log, out);
    });
    return true;
  }

  void cross_entropy_rows(const char* op, const Tensor& logits, const Tensor& target, int64_t classes,
                          int64_t ignore_index, const Tensor& scale, const Tensor& loss) const override {
    const int64_t rows = target.numel();
    if (rows == 0) return;
    const int64_t cols = logits.numel() / rows;
    NC_CHECK(rows <= int64_t{1} << 31, ValueError, op, ": at most 2^31 rows on CUDA, got ", rows);
    const Launcher launch(op, logits);
    // A bad target is recorded on the device and raised at the host's next wait.
    const IndexErrorSlot bad =
        index_error_slot(launch.device(), std::string(op) + ": target value ", " is out of range for ", " classes");
    visit_float(logits.dtype(), op, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      if (cols <= 8 * 128)
        launch_cross_entropy_rows<T, C, 128>(launch, logits, target, rows, cols, classes, ignore_index, scale, loss,
                                             bad);
      else
        launch_cross_entropy_rows<T, C, 512>(launch, logits, target, rows, cols, classes, ignore_index, scale, loss,
                                             bad);
    });
  }

  void group_norm_min_bias_forward(const Tensor& y, const Tensor& linear_bias, const Tensor& weight,
                                   const Tensor& gn_bias, const Tensor& bias, const kernels::GroupLayout& l, double eps,
                                   const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& argmin) const override {
    const char* op = "gemm_group_norm_min_bias";
    const int64_t rows = l.batch, channels = l.channels(), groups = l.groups;
    if (rows == 0) return;
    const Launcher launch(op, y);
    visit_float(y.dtype(), op, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      const T* y_ptr = data_as<const T>(y);
      const T* linear_bias_ptr = data_or_null<const T>(linear_bias);
      const T* weight_ptr = data_or_null<const T>(weight);
      const T* gn_bias_ptr = data_or_null<const T>(gn_bias);
      if (const size_t smem = short_group_smem<C>(channels, groups, launch.shared_memory_per_block())) {
        auto kernel = short_group_forward_kernel<T, C>;
        launch.allow_shared_memory(kernel, smem);
        const DeviceBuffer row_min = launch.buffer(sizeof(C) * static_cast<size_t>(rows));
        launch(kernel, static_cast<unsigned>(rows), kRowThreads, smem, y_ptr, linear_bias_ptr, weight_ptr, gn_bias_ptr,
               static_cast<int>(channels), static_cast<int>(groups), static_cast<C>(eps), row_min.as<C>(),
               data_as<C>(mean), data_as<C>(rstd), data_as<int64_t>(argmin));
        launch(broadcast_min_kernel<T, C>, static_cast<unsigned>(std::min<int64_t>(channels, int64_t{1} << 20)),
               kThreads, 0, row_min.as<const C>(), data_as<const T>(bias), rows, channels, data_as<T>(out));
        return;
      }
      launch(forward_kernel<T, C>, static_cast<unsigned>(ceil_div(rows, kRowsPerBlock)), kRowsPerBlock * kWarp, 0,
             y_ptr, linear_bias_ptr, weight_ptr, gn_bias_ptr, data_as<const T>(bias), rows, channels, groups,
             segment_width(channels / groups), static_cast<C>(eps), data_as<T>(out), data_as<C>(mean), data_as<C>(rstd),
             data_as<int64_t>(argmin));
    });
  }

  void group_norm_min_bias_backward(const Tensor& grad_out, const Tensor& y, const Tensor& linear_bias,
                                    const Tensor& weight, const Tensor& mean, const Tensor& rstd, const Tensor& argmin,
                                    const kernels::GroupLayout& l, const Tensor& grad_y, const Tensor& grad_linear_bias,
                                    const Tensor& grad_weight, const Tensor& grad_gn_bias,
                                    const Tensor& grad_bias) const override {
    const char* op = "gemm_group_norm_min_bias backward";
    const int64_t rows = l.batch, channels = l.channels(), groups = l.groups;
    const Launcher launch(op, y);
    visit_float(y.dtype(), op, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      // Enough o chunks to fill the device with the column sums, each at least 64 rows of o.
      const int64_t b_tiles = ceil_div(rows, kColLanes);
      const int64_t wanted_chunks = std::max<int64_t>(1, launch.multiprocessors() * 8 / std::max<int64_t>(b_tiles, 1));
      const int64_t chunks = std::min(wanted_chunks, ceil_div(channels, 64));
      const int64_t chunk_len = ceil_div(channels, chunks);
      const DeviceBuffer buffer = launch.buffer(sizeof(C) * static_cast<size_t>(rows * (chunks + 2)));
      C* partials = buffer.as<C>();
      C* row_grad = partials + rows * chunks;
      C* row_grad_xhat = row_grad + rows;
      if (rows > 0) {
        launch(column_partials_kernel<T, C>, dim3(static_cast<unsigned>(b_tiles), static_cast<unsigned>(chunks)),
               dim3(kColLanes, kColRows), 0, data_as<const T>(grad_out), rows, channels, chunk_len, partials);
        launch(grad_y_kernel<T, C>, static_cast<unsigned>(rows), kThreads, 0, data_as<const T>(y),
               data_or_null<const T>(linear_bias), data_or_null<const T>(weight), data_as<const C>(mean),
               data_as<const C>(rstd), data_as<const int64_t>(argmin), partials, chunks, rows, channels, groups,
               data_as<T>(grad_y), row_grad, row_grad_xhat);
      }
      const int64_t warps_per_block = kThreads / kWarp;
      launch(param_grad_kernel<T, C>, static_cast<unsigned>(ceil_div(channels, warps_per_block)), kThreads, 0,
             data_as<const T>(grad_out), data_as<const int64_t>(argmin), row_grad, row_grad_xhat,
             data_as<const T>(grad_y), rows, channels, channels / groups, data_or_null<T>(grad_linear_bias),
             data_or_null<T>(grad_weight), data_or_null<T>(grad_gn_bias), data_as<T>(grad_bias));
    });
  }

  bool add_layer_norm_forward(const Tensor& x, const Tensor& y, const Tensor& weight, const Tensor& bias, int64_t rows,
                              int64_t cols, double eps, const Tensor& sum, const Tensor& out, const Tensor& mean,
                              const Tensor& rstd) const override {
    // Rows of up to 2048 in 4-element vectors, f32 statistics; f64 and wider rows compose.
    if (cols % 4 != 0 || cols > 2048 || mean.dtype() != DType::F32 || rows > (int64_t{1} << 33)) return false;
    for (const Tensor* t : {&x, &y, &weight, &bias, &sum, &out})
      if (t->defined() && !is_aligned(t->data_ptr(), 4 * dtype_size(t->dtype()))) return false;
    const Launcher launch("add_layer_norm", x);
    const DType tx = x.dtype(), ty = y.dtype(), to = out.dtype();
    const int c = static_cast<int>(cols);
    const float e = static_cast<float>(eps);
    auto run = [&](auto x_tag, auto y_tag, auto out_tag) {
      using TX = typename decltype(x_tag)::type;
      using TY = typename decltype(y_tag)::type;
      using TO = typename decltype(out_tag)::type;
      launch_add_layer_norm<TX, TY, TO>(launch, x, y, weight, bias, rows, c, e, sum, out, mean, rstd);
      return true;
    };
    using F32 = TypeTag<float>;
    using BF16 = TypeTag<DeviceTypes::BF16>;
    using F16 = TypeTag<DeviceTypes::F16>;
    // The f32 stream of autocast with a 16-bit branch and output, and one dtype throughout.
    if (tx == DType::F32 && ty == DType::BF16 && to == DType::BF16) return run(F32{}, BF16{}, BF16{});
    if (tx == DType::F32 && ty == DType::F16 && to == DType::F16) return run(F32{}, F16{}, F16{});
    if (tx == DType::F32 && ty == DType::F32 && to == DType::F32) return run(F32{}, F32{}, F32{});
    if (tx == DType::F32 && ty == DType::F32 && to == DType::BF16) return run(F32{}, F32{}, BF16{});
    if (tx == DType::F32 && ty == DType::BF16 && to == DType::F32) return run(F32{}, BF16{}, F32{});
    if (tx == DType::BF16 && ty == DType::BF16 && to == DType::BF16) return run(BF16{}, BF16{}, BF16{});
    if (tx == DType::F16 && ty == DType::F16 && to == DType::F16) return run(F16{}, F16{}, F16{});
    return false;
  }
};

}  // namespace

const kernels::FusedKernels& fused_kernels() {
  static const CudaFused kernels;
  return kernels;
}

}  // namespace cuda
}  // namespace normcore
