// The fused optimizer updates (optim/ runs them, one call per parameter). In place, one pass
// over every buffer: param, grad and the state buffers are contiguous with one shape; param
// is floating and grad has its dtype; state is f32 for f16/bf16 params and the param's dtype
// otherwise. The element math is kernels/scalar/optim.h, shared by both backends, which
// therefore give the same bits.
#pragma once

#include <cstdint>

#include "kernels/backend.h"

namespace normcore {
namespace kernels {

class OptimKernels {
 public:
  // g = grad + weight_decay * param; with momentum != 0:
  //   momentum_buf = first_step ? g : momentum * momentum_buf + (1 - dampening) * g,
  //   g = nesterov ? g + momentum * momentum_buf : momentum_buf;
  // param = param - lr * g. momentum_buf is undefined and unused when momentum == 0.
  virtual void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, double lr,
                        double momentum, double dampening, double weight_decay, bool nesterov,
                        bool first_step) const = 0;
  // step >= 1 (PyTorch's Adam, and AdamW when decoupled):
  //   decoupled: param = param * (1 - lr * weight_decay), else g = grad + weight_decay * param;
  //   exp_avg = exp_avg + (1 - beta1) * (g - exp_avg)  (PyTorch's lerp form);
  //   exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * g * g;
  //   denom = sqrt(exp_avg_sq) / sqrt(1 - beta2^step) + eps;
  //   param = param - lr / (1 - beta1^step) * exp_avg / denom.
  virtual void adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                         double lr, double beta1, double beta2, double eps, double weight_decay, bool decoupled,
                         int64_t step) const = 0;

 protected:
  ~OptimKernels() = default;
};

}  // namespace kernels

namespace cpu { const kernels::OptimKernels& optim_kernels(); }
namespace cuda { const kernels::OptimKernels& optim_kernels(); }

namespace kernels {
inline const OptimKernels& optim(Device device) {
  return for_device(device, cpu::optim_kernels, NC_CUDA_KERNELS(optim_kernels), "optim");
}
}  // namespace kernels

}  // namespace normcore
