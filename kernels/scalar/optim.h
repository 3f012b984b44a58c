// The element update of the fused optimizer kernels (contracts in kernels/optim.h), shared
// by the CPU and CUDA backends: each operation is rounded on its own (math::*_rn), in one
// order, so both give the same bits. C is the math type: float for f32/f16/bf16 params,
// double for f64. The step's scalars are rounded to C once per step, here.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/scalar/math.h"

namespace normcore {

template <class C>
struct SgdParams {
  C lr, momentum, keep, weight_decay;
  bool use_momentum, nesterov, first_step, decay;

  NC_HOST_DEVICE static SgdParams make(double lr, double momentum, double dampening, double weight_decay, bool nesterov,
                                       bool first_step) {
    return {static_cast<C>(lr),
            static_cast<C>(momentum),
            static_cast<C>(math::sub_rn(1.0, dampening)),
            static_cast<C>(weight_decay),
            momentum != 0.0,
            nesterov,
            first_step,
            weight_decay != 0.0};
  }
};

// buf is read only after the first step and written only with momentum.
template <class C>
NC_HOST_DEVICE void sgd_element(C& value, C grad, C* buf, const SgdParams<C>& s) {
  C d = grad;
  if (s.decay) d = math::add_rn(d, math::mul_rn(s.weight_decay, value));
  if (s.use_momentum) {
    const C b = s.first_step ? d : math::add_rn(math::mul_rn(s.momentum, *buf), math::mul_rn(s.keep, d));
    *buf = b;
    d = s.nesterov ? math::add_rn(d, math::mul_rn(s.momentum, b)) : b;
  }
  value = math::sub_rn(value, math::mul_rn(s.lr, d));
}

// base^n for n >= 0 by repeated squaring, each product rounded on its own: the same bits
// on the host and the device (std::pow's may differ between them in the last place).
NC_HOST_DEVICE double pow_count(double base, int64_t n) {
  double result = 1.0;
  while (n > 0) {
    if (n & 1) result = math::mul_rn(result, base);
    base = math::mul_rn(base, base);
    n >>= 1;
  }
  return result;
}

// The per-step scalars of an update at step count step >= 1, computed in double from the
// hyperparameters and rounded to C once: on the host for the CPU backend, in each CUDA
// block from the learning rate and count in device memory; the same bits either way.
template <class C>
struct AdamParams {
  C neg_step_size, bc2_sqrt, decay, weight_decay, avg_weight, beta2, sq_weight, eps;
  bool decay_param, decay_grad;

  NC_HOST_DEVICE static AdamParams make(double lr, double beta1, double beta2, double eps, double weight_decay,
                                        bool decoupled, int64_t step) {
    const double bias_correction1 = math::sub_rn(1.0, pow_count(beta1, step));
    const double bias_correction2 = math::sub_rn(1.0, pow_count(beta2, step));
    AdamParams a;
    a.neg_step_size = static_cast<C>(-math::div_rn(lr, bias_correction1));
    a.bc2_sqrt = static_cast<C>(math::sqrt_rn(bias_correction2));
    a.decay = static_cast<C>(math::sub_rn(1.0, math::mul_rn(lr, weight_decay)));
    a.weight_decay = static_cast<C>(weight_decay);
    a.avg_weight = static_cast<C>(math::sub_rn(1.0, beta1));
    a.beta2 = static_cast<C>(beta2);
    a.sq_weight = static_cast<C>(math::sub_rn(1.0, beta2));
    a.eps = static_cast<C>(eps);
    a.decay_param = weight_decay != 0.0 && decoupled;
    a.decay_grad = weight_decay != 0.0 && !decoupled;
    return a;
  }
};

// PyTorch's lerp, start + weight * (end - start), in its form that is exact at weight 1.
template <class C>
NC_HOST_DEVICE C lerp_rn(C start, C end, C weight) {
  const C diff = math::sub_rn(end, start);
  return weight < C(0.5) ? math::add_rn(start, math::mul_rn(weight, diff))
                         : math::sub_rn(end, math::mul_rn(diff, math::sub_rn(C(1), weight)));
}

template <class C>
NC_HOST_DEVICE void adam_element(C& value, C grad, C& avg, C& avg_sq, const AdamParams<C>& a) {
  C d = grad;
  if (a.decay_param) value = math::mul_rn(value, a.decay);
  if (a.decay_grad) d = math::add_rn(d, math::mul_rn(a.weight_decay, value));
  avg = lerp_rn(avg, d, a.avg_weight);
  avg_sq = math::add_rn(math::mul_rn(a.beta2, avg_sq), math::mul_rn(a.sq_weight, math::mul_rn(d, d)));
  const C denom = math::add_rn(math::div_rn(math::sqrt_rn(avg_sq), a.bc2_sqrt), a.eps);
  value = math::add_rn(value, math::mul_rn(a.neg_step_size, math::div_rn(avg, denom)));
}

// The clip factor of clip_grad_norm, or 0 for none (total <= max_norm, or NaN).
NC_HOST_DEVICE double clip_factor(double total, double max_norm) {
  return total > max_norm ? math::div_rn(max_norm, math::add_rn(total, 1e-6)) : 0.0;
}

}  // namespace normcore
