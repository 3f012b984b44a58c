// CUDA fused optimizer updates (sgd_step, adam_step; the math is in kernels/backend.h and
// kernels/cpu/optim.cpp is the reference). One pass over contiguous param, grad and state,
// updated in place on the device's current stream. Param type T, state and math type C
// (float for f32/f16/bf16, double for f64). Every operation is rounded on its own (no FMA),
// in the CPU reference's order, so both backends give the same bits. Each thread moves up
// to 16 bytes per buffer per load when every pointer is aligned for it, else one element.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/backend.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/runtime.h"

namespace normcore {
namespace cuda_kernels {

namespace {

constexpr int kOptimThreads = 256;

template <class T>
struct MathType {
  using type = float;
};
template <>
struct MathType<double> {
  using type = double;
};

template <class C>
__device__ __forceinline__ C to_math(C v) {
  return v;
}
__device__ __forceinline__ float to_math(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_math(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T, class C>
__device__ __forceinline__ T from_math(C v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    return v;
  }
}

// Correctly rounded operations that nvcc never fuses into an FMA (whatever the flags).
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float root(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double root(double a) { return __dsqrt_rn(a); }

// Width elements of one buffer, moved with one load or store.
template <class V, int Width>
struct alignas(sizeof(V) * Width) Pack {
  V v[Width];
};

// Elements per thread: as many of the widest buffer as fit in 16 bytes.
template <class T, class C>
constexpr int pack_width() {
  return static_cast<int>(16 / std::max(sizeof(T), sizeof(C)));
}

inline bool aligned_to(const void* ptr, size_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

template <class C>
struct SgdParams {
  C lr, momentum, keep, weight_decay;
  bool use_momentum, nesterov, first_step, decay;
};

template <class C>
__device__ __forceinline__ void sgd_element(C& value, C grad, C* buf, const SgdParams<C>& s) {
  C d = grad;
  if (s.decay) d = add(d, mul(s.weight_decay, value));
  if (s.use_momentum) {
    const C b = s.first_step ? d : add(mul(s.momentum, *buf), mul(s.keep, d));
    *buf = b;
    d = s.nesterov ? add(d, mul(s.momentum, b)) : b;
  }
  value = sub(value, mul(s.lr, d));
}

template <class C>
struct AdamParams {
  C neg_step_size, bc2_sqrt, decay, weight_decay, avg_weight, beta2, sq_weight, eps;
  bool decay_param, decay_grad;
};

// PyTorch's lerp, start + weight*(end - start), in its form that is exact at weight 1.
template <class C>
__device__ __forceinline__ C lerp(C start, C end, C weight) {
  const C diff = sub(end, start);
  return weight < C(0.5) ? add(start, mul(weight, diff)) : sub(end, mul(diff, sub(C(1), weight)));
}

template <class C>
__device__ __forceinline__ void adam_element(C& value, C grad, C& avg, C& avg_sq,
                                             const AdamParams<C>& a) {
  C d = grad;
  if (a.decay_param) value = mul(value, a.decay);
  if (a.decay_grad) d = add(d, mul(a.weight_decay, value));
  avg = lerp(avg, d, a.avg_weight);
  avg_sq = add(mul(a.beta2, avg_sq), mul(a.sq_weight, mul(d, d)));
  const C denom = add(div(root(avg_sq), a.bc2_sqrt), a.eps);
  value = add(value, mul(a.neg_step_size, div(avg, denom)));
}

// Thread t of the grid-stride loop takes elements [t*Width, t*Width + Width) of each pack;
// the last n % Width elements go one per thread.
template <class T, class C, int Width>
__global__ void sgd_kernel(T* param, const T* grad, C* buf, int64_t n, SgdParams<C> s) {
  const int64_t packs = n / Width;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t k = first; k < packs; k += stride) {
    Pack<T, Width> p = reinterpret_cast<Pack<T, Width>*>(param)[k];
    const Pack<T, Width> g = reinterpret_cast<const Pack<T, Width>*>(grad)[k];
    Pack<C, Width> b;
    if (s.use_momentum && !s.first_step) b = reinterpret_cast<Pack<C, Width>*>(buf)[k];
#pragma unroll
    for (int j = 0; j < Width; ++j) {
      C value = to_math(p.v[j]);
      sgd_element<C>(value, to_math(g.v[j]), &b.v[j], s);
      p.v[j] = from_math<T>(value);
    }
    reinterpret_cast<Pack<T, Width>*>(param)[k] = p;
    if (s.use_momentum) reinterpret_cast<Pack<C, Width>*>(buf)[k] = b;
  }
  for (int64_t i = packs * Width + first; i < n; i += stride) {
    C value = to_math(param[i]);
    C b = s.use_momentum && !s.first_step ? buf[i] : C(0);
    sgd_element<C>(value, to_math(grad[i]), &b, s);
    param[i] = from_math<T>(value);
    if (s.use_momentum) buf[i] = b;
  }
}

template <class T, class C, int Width>
__global__ void adam_kernel(T* param, const T* grad, C* exp_avg, C* exp_avg_sq, int64_t n,
                            AdamParams<C> a) {
  const int64_t packs = n / Width;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t k = first; k < packs; k += stride) {
    Pack<T, Width> p = reinterpret_cast<Pack<T, Width>*>(param)[k];
    const Pack<T, Width> g = reinterpret_cast<const Pack<T, Width>*>(grad)[k];
    Pack<C, Width> m = reinterpret_cast<Pack<C, Width>*>(exp_avg)[k];
    Pack<C, Width> v = reinterpret_cast<Pack<C, Width>*>(exp_avg_sq)[k];
#pragma unroll
    for (int j = 0; j < Width; ++j) {
      C value = to_math(p.v[j]);
      adam_element<C>(value, to_math(g.v[j]), m.v[j], v.v[j], a);
      p.v[j] = from_math<T>(value);
    }
    reinterpret_cast<Pack<T, Width>*>(param)[k] = p;
    reinterpret_cast<Pack<C, Width>*>(exp_avg)[k] = m;
    reinterpret_cast<Pack<C, Width>*>(exp_avg_sq)[k] = v;
  }
  for (int64_t i = packs * Width + first; i < n; i += stride) {
    C value = to_math(param[i]);
    C avg = exp_avg[i];
    C avg_sq = exp_avg_sq[i];
    adam_element<C>(value, to_math(grad[i]), avg, avg_sq, a);
    param[i] = from_math<T>(value);
    exp_avg[i] = avg;
    exp_avg_sq[i] = avg_sq;
  }
}

// Enough blocks to cover the work, at most a few waves' worth (the loops stride the rest).
unsigned blocks_for(int64_t work, int device) {
  const int64_t needed = (work + kOptimThreads - 1) / kOptimThreads;
  const int64_t cap = static_cast<int64_t>(cuda_runtime::multiprocessor_count(device)) * 16;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(needed, cap)));
}

// Calls f(T{}) with the device type of a floating dtype.
template <class F>
void dispatch_param(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::F32: f(float{}); return;
    case DType::F64: f(double{}); return;
    case DType::F16: f(__half{}); return;
    case DType::BF16: f(__nv_bfloat16{}); return;
    default: break;
  }
  throw DTypeError(detail::cat_str(op, ": expected a floating param, got ", dtype_name(dtype)));
}

}  // namespace

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, double lr,
              double momentum, double dampening, double weight_decay, bool nesterov,
              bool first_step) {
  const int64_t n = param.numel();
  if (n == 0) return;
  const int device = param.device().index;
  dispatch_param(param.dtype(), "sgd_step", [&](auto tag) {
    using T = decltype(tag);
    using C = typename MathType<T>::type;
    constexpr int kWidth = pack_width<T, C>();
    SgdParams<C> s;
    s.lr = static_cast<C>(lr);
    s.momentum = static_cast<C>(momentum);
    s.keep = static_cast<C>(1.0 - dampening);
    s.weight_decay = static_cast<C>(weight_decay);
    s.use_momentum = momentum != 0.0;
    s.nesterov = nesterov;
    s.first_step = first_step;
    s.decay = weight_decay != 0.0;
    T* p = static_cast<T*>(param.data_ptr());
    const T* g = static_cast<const T*>(grad.data_ptr());
    C* buf = s.use_momentum ? static_cast<C*>(momentum_buf.data_ptr()) : nullptr;
    const bool aligned = aligned_to(p, sizeof(T) * kWidth) && aligned_to(g, sizeof(T) * kWidth) &&
                         (buf == nullptr || aligned_to(buf, sizeof(C) * kWidth));
    cuda_runtime::DeviceGuard guard(device);
    cudaStream_t stream = cuda_runtime::stream(device);
    if (aligned) {
      sgd_kernel<T, C, kWidth><<<blocks_for(n / kWidth + 1, device), kOptimThreads, 0, stream>>>(
          p, g, buf, n, s);
    } else {
      sgd_kernel<T, C, 1><<<blocks_for(n, device), kOptimThreads, 0, stream>>>(p, g, buf, n, s);
    }
    NC_CUDA_KERNEL_CHECK("sgd_step");
  });
}

void adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
               const Tensor& exp_avg_sq, double lr, double beta1, double beta2, double eps,
               double weight_decay, bool decoupled, int64_t step) {
  const int64_t n = param.numel();
  if (n == 0) return;
  const int device = param.device().index;
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  dispatch_param(param.dtype(), "adam_step", [&](auto tag) {
    using T = decltype(tag);
    using C = typename MathType<T>::type;
    constexpr int kWidth = pack_width<T, C>();
    AdamParams<C> a;
    a.neg_step_size = static_cast<C>(-(lr / bias_correction1));
    a.bc2_sqrt = static_cast<C>(std::sqrt(bias_correction2));
    a.decay = static_cast<C>(1.0 - lr * weight_decay);
    a.weight_decay = static_cast<C>(weight_decay);
    a.avg_weight = static_cast<C>(1.0 - beta1);
    a.beta2 = static_cast<C>(beta2);
    a.sq_weight = static_cast<C>(1.0 - beta2);
    a.eps = static_cast<C>(eps);
    a.decay_param = weight_decay != 0.0 && decoupled;
    a.decay_grad = weight_decay != 0.0 && !decoupled;
    T* p = static_cast<T*>(param.data_ptr());
    const T* g = static_cast<const T*>(grad.data_ptr());
    C* m = static_cast<C*>(exp_avg.data_ptr());
    C* v = static_cast<C*>(exp_avg_sq.data_ptr());
    const bool aligned = aligned_to(p, sizeof(T) * kWidth) && aligned_to(g, sizeof(T) * kWidth) &&
                         aligned_to(m, sizeof(C) * kWidth) && aligned_to(v, sizeof(C) * kWidth);
    cuda_runtime::DeviceGuard guard(device);
    cudaStream_t stream = cuda_runtime::stream(device);
    if (aligned) {
      adam_kernel<T, C, kWidth><<<blocks_for(n / kWidth + 1, device), kOptimThreads, 0, stream>>>(
          p, g, m, v, n, a);
    } else {
      adam_kernel<T, C, 1><<<blocks_for(n, device), kOptimThreads, 0, stream>>>(p, g, m, v, n, a);
    }
    NC_CUDA_KERNEL_CHECK("adam_step");
  });
}

}  // namespace cuda_kernels
}  // namespace normcore
