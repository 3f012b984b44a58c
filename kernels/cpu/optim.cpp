// CPU reference for the fused optimizer updates (sgd_step, adam_step; the math is in
// kernels/backend.h). One pass over contiguous param, grad and state, all updated in place.
// Param type T, state type S (f32 for f16/bf16 params, T otherwise), math in acc_t<T>:
// float, or double for f64. The host scalars are rounded to that type once per call. Each
// product gets its own statement so that no compiler fuses it into an FMA: the CUDA kernels
// round every operation separately too, and the two backends agree bit for bit.
#include <cmath>
#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cpu/loops.h"

namespace normcore {
namespace cpu {

namespace {

// PyTorch's lerp, start + weight*(end - start), in its form that is exact at weight 1.
template <class C>
C lerp(C start, C end, C weight) {
  const C diff = end - start;
  if (weight < C(0.5)) {
    const C step = weight * diff;
    return start + step;
  }
  const C step = diff * (C(1) - weight);
  return end - step;
}

template <class T>
void sgd_typed(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, double lr,
               double momentum, double dampening, double weight_decay, bool nesterov,
               bool first_step) {
  using C = acc_t<T>;
  using S = C;
  const int64_t n = param.numel();
  T* p = static_cast<T*>(param.data_ptr());
  const T* g = static_cast<const T*>(grad.data_ptr());
  S* buf = momentum != 0.0 ? static_cast<S*>(momentum_buf.data_ptr()) : nullptr;
  const C lr_c = static_cast<C>(lr);
  const C momentum_c = static_cast<C>(momentum);
  const C keep_c = static_cast<C>(1.0 - dampening);
  const C wd_c = static_cast<C>(weight_decay);
  for (int64_t i = 0; i < n; ++i) {
    const C value = cast<C>(p[i]);
    C d = cast<C>(g[i]);
    if (weight_decay != 0.0) {
      const C decay = wd_c * value;
      d = d + decay;
    }
    if (buf) {
      C b = d;
      if (!first_step) {
        const C kept = momentum_c * buf[i];
        const C added = keep_c * d;
        b = kept + added;
      }
      buf[i] = b;
      if (nesterov) {
        const C look_ahead = momentum_c * b;
        d = d + look_ahead;
      } else {
        d = b;
      }
    }
    const C update = lr_c * d;
    p[i] = cast<T>(value - update);
  }
}

template <class T>
void adam_typed(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, double lr, double beta1, double beta2, double eps,
                double weight_decay, bool decoupled, int64_t step) {
  using C = acc_t<T>;
  using S = C;
  const int64_t n = param.numel();
  T* p = static_cast<T*>(param.data_ptr());
  const T* g = static_cast<const T*>(grad.data_ptr());
  S* m = static_cast<S*>(exp_avg.data_ptr());
  S* v = static_cast<S*>(exp_avg_sq.data_ptr());
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  const C neg_step_size = static_cast<C>(-(lr / bias_correction1));
  const C bc2_sqrt = static_cast<C>(std::sqrt(bias_correction2));
  const C decay = static_cast<C>(1.0 - lr * weight_decay);
  const C wd_c = static_cast<C>(weight_decay);
  const C avg_weight = static_cast<C>(1.0 - beta1);
  const C beta2_c = static_cast<C>(beta2);
  const C sq_weight = static_cast<C>(1.0 - beta2);
  const C eps_c = static_cast<C>(eps);
  const bool decay_param = weight_decay != 0.0 && decoupled;
  const bool decay_grad = weight_decay != 0.0 && !decoupled;
  for (int64_t i = 0; i < n; ++i) {
    C value = cast<C>(p[i]);
    C d = cast<C>(g[i]);
    if (decay_param) value = value * decay;
    if (decay_grad) {
      const C decay_term = wd_c * value;
      d = d + decay_term;
    }
    const C avg = lerp<C>(m[i], d, avg_weight);
    const C kept = beta2_c * v[i];
    const C square = d * d;
    const C added = sq_weight * square;
    const C avg_sq = kept + added;
    m[i] = avg;
    v[i] = avg_sq;
    const C scaled_root = std::sqrt(avg_sq) / bc2_sqrt;
    const C denom = scaled_root + eps_c;
    const C ratio = avg / denom;
    const C update = neg_step_size * ratio;
    p[i] = cast<T>(value + update);
  }
}

}  // namespace

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, double lr,
              double momentum, double dampening, double weight_decay, bool nesterov,
              bool first_step) {
  dispatch_floating(param.dtype(), [&](auto tag) {
    sgd_typed<decltype(tag)>(param, grad, momentum_buf, lr, momentum, dampening, weight_decay,
                             nesterov, first_step);
  });
}

void adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
               const Tensor& exp_avg_sq, double lr, double beta1, double beta2, double eps,
               double weight_decay, bool decoupled, int64_t step) {
  dispatch_floating(param.dtype(), [&](auto tag) {
    adam_typed<decltype(tag)>(param, grad, exp_avg, exp_avg_sq, lr, beta1, beta2, eps,
                              weight_decay, decoupled, step);
  });
}

}  // namespace cpu
}  // namespace normcore
