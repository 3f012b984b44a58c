// What a convolution adds to its output before the next layer reads it (kernels/conv.h's
// ConvEpilogue), in one pass over y: y = relu?(y + bias[channel] + residual), in f32. The
// cuDNN convolution writes y; this pass replaces the separate bias add, residual add and ReLU
// that would each read and write y again. NHWC outputs (channel = the last dim) move eight
// 2-byte or four 4-byte elements at a time when the channels and pointers allow.
#include "kernels/cuda/conv_epilogue.h"

#include <type_traits>

#include "kernels/cuda/loops.cuh"

namespace normcore {
namespace cuda {
namespace {

struct EpilogueArgs {
  int64_t channels, inner;  // channel of element i: (i / inner) % channels
  bool relu;
};

// V elements a thread at a time; with V > 1 they share a channel (NCHW, inner a multiple of
// V) or are V consecutive channels (NHWC, inner 1, channels a multiple of V), so the channel
// is computed once a vector. C: f32, or f64 for f64 tensors.
template <class T, class C, int V>
__global__ void epilogue_kernel(int64_t vectors, T* __restrict__ y, const T* __restrict__ bias,
                                const T* __restrict__ residual, EpilogueArgs a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors; v += stride) {
    Vec<T, V> out = load_vec<T, V>(y, v);
    Vec<T, V> add{};
    if (residual != nullptr) add = load_vec<T, V>(residual, v);
    const int64_t channel = (v * V / a.inner) % a.channels;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      C s = convert<C>(out.v[j]);
      if (bias != nullptr) s += convert<C>(bias[a.inner == 1 ? channel + j : channel]);
      if (residual != nullptr) s += convert<C>(add.v[j]);
      if (a.relu && s < C(0)) s = C(0);  // NaN stays
      out.v[j] = convert<T>(s);
    }
    store_vec<T, V>(y, v, out);
  }
}

template <class T>
void run(const Tensor& y, int64_t channels, int64_t inner, const Tensor& bias, const Tensor& residual, bool relu) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const Launcher launch("conv2d", y);
  T* py = data_as<T>(y);
  const T* pb = bias.defined() ? data_as<const T>(bias) : nullptr;
  const T* pr = residual.defined() ? data_as<const T>(residual) : nullptr;
  const EpilogueArgs args{channels, inner, relu};
  constexpr int V = 16 / sizeof(T);
  const int64_t n = y.numel();
  const bool vectorized = n % V == 0 && (inner == 1 ? channels % V == 0 : inner % V == 0) && is_aligned(py, 16) &&
                          (pr == nullptr || is_aligned(pr, 16));
  if (vectorized) launch(epilogue_kernel<T, C, V>, launch.grid_for(n / V), kThreads, 0, n / V, py, pb, pr, args);
  else launch(epilogue_kernel<T, C, 1>, launch.grid_for(n), kThreads, 0, n, py, pb, pr, args);
}

}  // namespace

void conv_epilogue(const Tensor& y, int64_t channels, int64_t inner, const Tensor& bias, const Tensor& residual,
                   bool relu) {
  if (y.numel() == 0 || (!bias.defined() && !residual.defined() && !relu)) return;
  visit_float(y.dtype(), "conv2d",
              [&](auto tag) { run<typename decltype(tag)::type>(y, channels, inner, bias, residual, relu); });
}

}  // namespace cuda
}  // namespace normcore
