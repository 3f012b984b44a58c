// CPU fused optimizer updates (contracts in kernels/optim.h): one pass over contiguous
// param, grad and state, updated in place with the element math of kernels/scalar/optim.h
// that the CUDA kernels run too. Param type T, state and math type C = compute_t<T>. The
// element updates and the gradient norm's sums run in ranges on the thread pool.
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/optim.h"
#include "kernels/scalar/optim.h"

namespace normcore {
namespace cpu {
namespace {

class CpuOptim final : public kernels::OptimKernels {
 public:
  void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const Tensor& lr,
                const kernels::SgdHyper& h, const Tensor& skip) const override {
    if (skip.defined() && *data_as<const double>(skip) != 0.0) return;
    const double lr_value = *data_as<const double>(lr);
    visit_float(param.dtype(), "sgd_step", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      const auto s = SgdParams<C>::make(lr_value, h.momentum, h.dampening, h.weight_decay, h.nesterov, h.first_step);
      T* p = data_as<T>(param);
      const T* g = data_as<const T>(grad);
      C* buf = s.use_momentum ? data_as<C>(momentum_buf) : nullptr;
      parallel_for(param.numel(), kLoopGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          C value = convert<C>(p[i]);
          sgd_element<C>(value, convert<C>(g[i]), buf ? buf + i : nullptr, s);
          p[i] = convert<T>(value);
        }
      });
    });
  }

  void adam_step(const std::vector<kernels::AdamTensors>& tensors, const Tensor& lr, const kernels::AdamHyper& h,
                 const Tensor& skip) const override {
    if (skip.defined() && *data_as<const double>(skip) != 0.0) return;
    const double lr_value = *data_as<const double>(lr);
    for (const kernels::AdamTensors& t : tensors) {
      int64_t& step = *data_as<int64_t>(t.step);
      ++step;
      visit_float(t.param.dtype(), "adam_step", [&](auto tag) {
        using T = typename decltype(tag)::type;
        using C = compute_t<T>;
        const auto a = AdamParams<C>::make(lr_value, h.beta1, h.beta2, h.eps, h.weight_decay, h.decoupled, step);
        T* p = data_as<T>(t.param);
        const T* g = data_as<const T>(t.grad);
        C* m = data_as<C>(t.exp_avg);
        C* v = data_as<C>(t.exp_avg_sq);
        parallel_for(t.param.numel(), kLoopGrain, [&](int64_t begin, int64_t end) {
          // The weight-decay flags as constants of a local copy: the loop has no branch
          // left and vectorizes.
          auto run = [&](auto decay_param, auto decay_grad) {
            AdamParams<C> local = a;
            local.decay_param = decltype(decay_param)::value;
            local.decay_grad = decltype(decay_grad)::value;
            for (int64_t i = begin; i < end; ++i) {
              C value = convert<C>(p[i]);
              adam_element<C>(value, convert<C>(g[i]), m[i], v[i], local);
              p[i] = convert<T>(value);
            }
          };
          if (a.decay_param) run(std::true_type{}, std::false_type{});
          else if (a.decay_grad) run(std::false_type{}, std::true_type{});
          else run(std::false_type{}, std::false_type{});
        });
      });
    }
  }

  void clip_grad_norm(const std::vector<Tensor>& grads, double max_norm, const Tensor& total) const override {
    double sum = 0.0;
    for (const Tensor& g : grads) {
      visit_float(g.dtype(), "clip_grad_norm", [&](auto tag) {
        using T = typename decltype(tag)::type;
        using C = compute_t<T>;
        const T* x = data_as<const T>(g);
        // Ranges of kLoopGrain on the pool, each summed into 8 interleaved partials (so the
        // adds need not wait on each other); partials and ranges added in a fixed order.
        const int64_t n = g.numel();
        std::vector<double> range_sums(static_cast<size_t>(range_count(n, kLoopGrain)));
        parallel_for(n, kLoopGrain, [&](int64_t begin, int64_t end) {
          double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          int64_t i = begin;
          for (; i + 8 <= end; i += 8) {
            for (int j = 0; j < 8; ++j) {
              const double v = static_cast<double>(convert<C>(x[i + j]));
              part[j] = math::add_rn(part[j], math::mul_rn(v, v));
            }
          }
          for (int j = 0; i < end; ++i, ++j) {
            const double v = static_cast<double>(convert<C>(x[i]));
            part[j] = math::add_rn(part[j], math::mul_rn(v, v));
          }
          range_sums[static_cast<size_t>(begin / kLoopGrain)] =
              ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
        });
        double squares = 0.0;
        for (double r : range_sums) squares = math::add_rn(squares, r);
        const double norm = static_cast<double>(convert<C>(convert<T>(static_cast<C>(math::sqrt_rn(squares)))));
        sum = math::add_rn(sum, math::mul_rn(norm, norm));
      });
    }
    const double total_norm = math::sqrt_rn(sum);
    *data_as<double>(total) = total_norm;
    const double factor = clip_factor(total_norm, max_norm);
    if (factor == 0.0) return;
    for (const Tensor& g : grads) {
      visit_float(g.dtype(), "clip_grad_norm", [&](auto tag) {
        using T = typename decltype(tag)::type;
        using C = compute_t<T>;
        T* x = data_as<T>(g);
        const C f = static_cast<C>(factor);
        parallel_for(g.numel(), kLoopGrain, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) x[i] = convert<T>(math::mul_rn(convert<C>(x[i]), f));
        });
      });
    }
  }
};

}  // namespace

const kernels::OptimKernels& optim_kernels() {
  static const CpuOptim kernels;
  return kernels;
}

}  // namespace cpu
}  // namespace normcore
