// The fused optimizer updates (optim/ runs them, one call per parameter). In place, one pass
// over every buffer: param, grad and the state buffers are contiguous with one shape; param
// is floating and grad has its dtype; state is f32 for f16/bf16 params and the param's dtype
// otherwise. The element math is kernels/scalar/optim.h, shared by both backends, which
// therefore give the same bits.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.h"

namespace normcore {
namespace kernels {

// One parameter of a multi-tensor Adam update: its buffers and its step count (0-dim i64
// on its device).
struct AdamTensors {
  Tensor param, grad, exp_avg, exp_avg_sq, step;
};

// SGD's hyperparameters (first_step: the momentum buffer is new and takes g as it is).
struct SgdHyper {
  double momentum, dampening, weight_decay;
  bool nesterov, first_step;
};

struct AdamHyper {
  double beta1, beta2, eps, weight_decay;
  bool decoupled;
};

// The learning rate is a 0-dim f64 tensor on the parameters' device, read when the update
// runs, so that a replayed CUDA graph uses the value set since (as are the step counts).
// skip is undefined or a 0-dim f64 there: when it is nonzero the call changes nothing (the
// loss scaler's skipped step, decided on the device).
class OptimKernels {
 public:
  // g = grad + weight_decay * param; with momentum != 0:
  //   momentum_buf = first_step ? g : momentum * momentum_buf + (1 - dampening) * g,
  //   g = nesterov ? g + momentum * momentum_buf : momentum_buf;
  // param = param - lr * g. momentum_buf is undefined and unused when momentum == 0.
  virtual void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const Tensor& lr,
                        const SgdHyper& hyper, const Tensor& skip) const = 0;
  // For every entry (all on this backend's device; CUDA: one launch per dtype and 32
  // entries, then one for the counts): step += 1, then with that step (PyTorch's Adam,
  // and AdamW when decoupled):
  //   decoupled: param = param * (1 - lr * weight_decay), else g = grad + weight_decay * param;
  //   exp_avg = exp_avg + (1 - beta1) * (g - exp_avg)  (PyTorch's lerp form);
  //   exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * g * g;
  //   denom = sqrt(exp_avg_sq) / sqrt(1 - beta2^step) + eps;
  //   param = param - lr / (1 - beta1^step) * exp_avg / denom.
  virtual void adam_step(const std::vector<AdamTensors>& tensors, const Tensor& lr, const AdamHyper& hyper,
                         const Tensor& skip) const = 0;
  // Gradient clipping by the total 2-norm, without a host read (CUDA: four launches per 32
  // gradients at most). grads: contiguous, floating, on this backend's device, at most
  // kMaxClipTensors. Per gradient n = sqrt(sum of g^2), accumulated in double and rounded to
  // the gradient's dtype; total = sqrt(sum of n^2) in double, written to total (0-dim f64).
  // When total > max_norm every gradient is multiplied in place by max_norm / (total + 1e-6)
  // rounded to its compute type; otherwise (also for a NaN total) none is touched.
  static constexpr size_t kMaxClipTensors = 256;
  virtual void clip_grad_norm(const std::vector<Tensor>& grads, double max_norm, const Tensor& total) const = 0;

 protected:
  ~OptimKernels() = default;
};

}  // namespace kernels

namespace cpu {
const kernels::OptimKernels& optim_kernels();
}
namespace cuda {
const kernels::OptimKernels& optim_kernels();
}

namespace kernels {
inline const OptimKernels& optim(Device device) {
  return for_device(device, cpu::optim_kernels, NC_CUDA_KERNELS(optim_kernels), "optim");
}
}  // namespace kernels

}  // namespace normcore
