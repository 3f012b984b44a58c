// CUDA fused optimizer updates (contracts in kernels/optim.h): one pass over contiguous
// param, grad and state, updated in place on the device's current stream with the element
// math of kernels/scalar/optim.h, which the CPU backend runs too. Param type T, state and
// math type C = compute_t<T>. Each thread moves up to 16 bytes per buffer per load when
// every pointer is aligned for it, else one element.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/loops.cuh"
#include "kernels/optim.h"
#include "kernels/scalar/optim.h"

namespace normcore {
namespace cuda {
namespace {

constexpr int kOptimThreads = 256;

// Elements per thread: as many of the widest buffer as fit in 16 bytes.
template <class T, class C>
constexpr int pack_width() {
  return static_cast<int>(16 / std::max(sizeof(T), sizeof(C)));
}

// Thread t of the grid-stride loop takes elements [t*Width, t*Width + Width) of each vector;
// the last n % Width elements go one per thread.
template <class T, class C, int Width>
__global__ void sgd_kernel(T* param, const T* grad, C* buf, int64_t n, SgdParams<C> s) {
  const int64_t packs = n / Width;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t k = first; k < packs; k += stride) {
    Vec<T, Width> p = reinterpret_cast<Vec<T, Width>*>(param)[k];
    const Vec<T, Width> g = reinterpret_cast<const Vec<T, Width>*>(grad)[k];
    Vec<C, Width> b;
    if (s.use_momentum && !s.first_step) b = reinterpret_cast<Vec<C, Width>*>(buf)[k];
#pragma unroll
    for (int j = 0; j < Width; ++j) {
      C value = convert<C>(p.v[j]);
      sgd_element<C>(value, convert<C>(g.v[j]), &b.v[j], s);
      p.v[j] = convert<T>(value);
    }
    reinterpret_cast<Vec<T, Width>*>(param)[k] = p;
    if (s.use_momentum) reinterpret_cast<Vec<C, Width>*>(buf)[k] = b;
  }
  for (int64_t i = packs * Width + first; i < n; i += stride) {
    C value = convert<C>(param[i]);
    C b = s.use_momentum && !s.first_step ? buf[i] : C(0);
    sgd_element<C>(value, convert<C>(grad[i]), &b, s);
    param[i] = convert<T>(value);
    if (s.use_momentum) buf[i] = b;
  }
}

template <class T, class C, int Width>
__global__ void adam_kernel(T* param, const T* grad, C* exp_avg, C* exp_avg_sq, int64_t n, AdamParams<C> a) {
  const int64_t packs = n / Width;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t k = first; k < packs; k += stride) {
    Vec<T, Width> p = reinterpret_cast<Vec<T, Width>*>(param)[k];
    const Vec<T, Width> g = reinterpret_cast<const Vec<T, Width>*>(grad)[k];
    Vec<C, Width> m = reinterpret_cast<Vec<C, Width>*>(exp_avg)[k];
    Vec<C, Width> v = reinterpret_cast<Vec<C, Width>*>(exp_avg_sq)[k];
#pragma unroll
    for (int j = 0; j < Width; ++j) {
      C value = convert<C>(p.v[j]);
      adam_element<C>(value, convert<C>(g.v[j]), m.v[j], v.v[j], a);
      p.v[j] = convert<T>(value);
    }
    reinterpret_cast<Vec<T, Width>*>(param)[k] = p;
    reinterpret_cast<Vec<C, Width>*>(exp_avg)[k] = m;
    reinterpret_cast<Vec<C, Width>*>(exp_avg_sq)[k] = v;
  }
  for (int64_t i = packs * Width + first; i < n; i += stride) {
    C value = convert<C>(param[i]);
    C avg = exp_avg[i];
    C avg_sq = exp_avg_sq[i];
    adam_element<C>(value, convert<C>(grad[i]), avg, avg_sq, a);
    param[i] = convert<T>(value);
    exp_avg[i] = avg;
    exp_avg_sq[i] = avg_sq;
  }
}

// Enough blocks to cover the work, at most a few waves' worth (the loops stride the rest).
unsigned blocks_for(const Launcher& launch, int64_t work) {
  const int64_t cap = static_cast<int64_t>(launch.multiprocessors()) * 16;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(ceil_div(work, kOptimThreads), cap)));
}

class CudaOptim final : public kernels::OptimKernels {
 public:
  void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, double lr, double momentum,
                double dampening, double weight_decay, bool nesterov, bool first_step) const override {
    const int64_t n = param.numel();
    if (n == 0) return;
    visit_float(param.dtype(), "sgd_step", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      constexpr int kWidth = pack_width<T, C>();
      const auto s = SgdParams<C>::make(lr, momentum, dampening, weight_decay, nesterov, first_step);
      T* p = data_as<T>(param);
      const T* g = data_as<const T>(grad);
      C* buf = s.use_momentum ? data_as<C>(momentum_buf) : nullptr;
      const bool aligned = is_aligned(p, sizeof(T) * kWidth) && is_aligned(g, sizeof(T) * kWidth) &&
                           (buf == nullptr || is_aligned(buf, sizeof(C) * kWidth));
      const Launcher launch("sgd_step", param);
      if (aligned) {
        launch(sgd_kernel<T, C, kWidth>, blocks_for(launch, n / kWidth + 1), kOptimThreads, 0, p, g, buf, n, s);
      } else {
        launch(sgd_kernel<T, C, 1>, blocks_for(launch, n), kOptimThreads, 0, p, g, buf, n, s);
      }
    });
  }

  void adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 double lr, double beta1, double beta2, double eps, double weight_decay, bool decoupled,
                 int64_t step) const override {
    const int64_t n = param.numel();
    if (n == 0) return;
    visit_float(param.dtype(), "adam_step", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      constexpr int kWidth = pack_width<T, C>();
      const auto a = AdamParams<C>::make(lr, beta1, beta2, eps, weight_decay, decoupled, step);
      T* p = data_as<T>(param);
      const T* g = data_as<const T>(grad);
      C* m = data_as<C>(exp_avg);
      C* v = data_as<C>(exp_avg_sq);
      const bool aligned = is_aligned(p, sizeof(T) * kWidth) && is_aligned(g, sizeof(T) * kWidth) &&
                           is_aligned(m, sizeof(C) * kWidth) && is_aligned(v, sizeof(C) * kWidth);
      const Launcher launch("adam_step", param);
      if (aligned) {
        launch(adam_kernel<T, C, kWidth>, blocks_for(launch, n / kWidth + 1), kOptimThreads, 0, p, g, m, v, n, a);
      } else {
        launch(adam_kernel<T, C, 1>, blocks_for(launch, n), kOptimThreads, 0, p, g, m, v, n, a);
      }
    });
  }
};

}  // namespace

const kernels::OptimKernels& optim_kernels() {
  static const CudaOptim kernels;
  return kernels;
}

}  // namespace cuda
}  // namespace normcore
