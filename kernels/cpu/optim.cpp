// CPU fused optimizer updates (contracts in kernels/optim.h): one pass over contiguous
// param, grad and state, updated in place with the element math of kernels/scalar/optim.h
// that the CUDA kernels run too. Param type T, state and math type C = compute_t<T>.
#include <cstdint>

#include "kernels/cpu/loops.h"
#include "kernels/optim.h"
#include "kernels/scalar/optim.h"

namespace normcore {
namespace cpu {
namespace {

class CpuOptim final : public kernels::OptimKernels {
 public:
  void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, double lr, double momentum,
                double dampening, double weight_decay, bool nesterov, bool first_step) const override {
    visit_float(param.dtype(), "sgd_step", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      const auto s = SgdParams<C>::make(lr, momentum, dampening, weight_decay, nesterov, first_step);
      T* p = data_as<T>(param);
      const T* g = data_as<const T>(grad);
      C* buf = s.use_momentum ? data_as<C>(momentum_buf) : nullptr;
      for (int64_t i = 0, n = param.numel(); i < n; ++i) {
        C value = convert<C>(p[i]);
        sgd_element<C>(value, convert<C>(g[i]), buf ? buf + i : nullptr, s);
        p[i] = convert<T>(value);
      }
    });
  }

  void adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 double lr, double beta1, double beta2, double eps, double weight_decay, bool decoupled,
                 int64_t step) const override {
    visit_float(param.dtype(), "adam_step", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      const auto a = AdamParams<C>::make(lr, beta1, beta2, eps, weight_decay, decoupled, step);
      T* p = data_as<T>(param);
      const T* g = data_as<const T>(grad);
      C* m = data_as<C>(exp_avg);
      C* v = data_as<C>(exp_avg_sq);
      for (int64_t i = 0, n = param.numel(); i < n; ++i) {
        C value = convert<C>(p[i]);
        adam_element<C>(value, convert<C>(g[i]), m[i], v[i], a);
        p[i] = convert<T>(value);
      }
    });
  }
};

}  // namespace

const kernels::OptimKernels& optim_kernels() {
  static const CpuOptim kernels;
  return kernels;
}

}  // namespace cpu
}  // namespace normcore
