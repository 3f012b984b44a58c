// Frobenius norm on CUDA: y = x / max(sqrt(sum(x * x)), eps) over the whole tensor, and its
// backward grad_x = dy / max(norm, eps) - x * dot(dy, x) / norm^3 (the second term 0 where
// the clamp is active). plan_frobenius picks the pipelined pass over the one row of every
// element, or for small tensors a reduction and an element-wise pass.
#include "kernels/cuda/norms/norms.cuh"

namespace normcore {
namespace cuda {
namespace {

template <class T>
void frobenius_forward(const Tensor& x_t, double eps, const Tensor& y_t, const Tensor& norm_t) {
  using A = compute_t<T>;
  const Launcher launch("frobenius_norm", x_t);
  const T* x = data_as<const T>(x_t);
  T* y = data_as<T>(y_t);
  A* norm = data_as<A>(norm_t);
  const A eps_a = static_cast<A>(eps);
  const int64_t numel = x_t.numel();
  switch (plan_frobenius(numel)) {
    case NormPath::Pipeline: {
      const PipelineShape s = plan_pipeline(1, numel, numel, sizeof(T), 1);
      const DeviceBuffer partials = launch.buffer(static_cast<size_t>(s.items) * sizeof(Sums<A, 1>));
      run_pipeline<1, T, Sums<A, 1>, RowInfo<A, 1>>(launch, s, x, static_cast<const T*>(nullptr), y,
                                                    partials.as<Sums<A, 1>>(), NormReduce<A, NormSum::Square>{},
                                                    NormFinish<A, false>{norm, A(0), eps_a}, NormScale<A>{});
      return;
    }
    default:
      reduce_rows<Sums<A, 1>>(
          launch, 1, numel,
          [=] __device__(int64_t, int64_t i) {
            const A v = load<T, A>(x, i);
            return Sums<A, 1>{{v * v}};
          },
          [=] __device__(int64_t, const Sums<A, 1>& s) { *norm = sqrt(s.v[0]); });
      for_each_index(launch, numel, [=] __device__(int64_t e) {
        y[e] = convert<T>(load<T, A>(x, e) * (A(1) / clamped(*norm, eps_a)));
      });
      return;
  }
}

template <class T>
void frobenius_backward(const Tensor& grad_y_t, const Tensor& x_t, const Tensor& norm_t, double eps,
                        const Tensor& grad_x_t) {
  using A = compute_t<T>;
  const Launcher launch("frobenius_norm backward", x_t);
  const T* grad_y = data_as<const T>(grad_y_t);
  const T* x = data_as<const T>(x_t);
  const A* norm = data_as<const A>(norm_t);
  T* grad_x = data_as<T>(grad_x_t);
  const A eps_a = static_cast<A>(eps);
  const int64_t numel = x_t.numel();
  switch (plan_frobenius(numel)) {
    case NormPath::Pipeline: {
      const PipelineShape s = plan_pipeline(1, numel, numel, sizeof(T), 2);
      const DeviceBuffer partials = launch.buffer(static_cast<size_t>(s.items) * sizeof(Sums<A, 1>));
      run_pipeline<2, T, Sums<A, 1>, RowInfo<A, 2>>(launch, s, x, grad_y, grad_x, partials.as<Sums<A, 1>>(),
                                                    NormReduce<A, NormSum::Product>{},
                                                    NormGradFinish<A, false>{norm, A(1), eps_a},
                                                    NormGradApply<A, false>{});
      return;
    }
    default: {
      // through = dot(dy, x) / n^3, 0 where the clamp is active.
      const DeviceBuffer through_buffer = launch.buffer(sizeof(A));
      A* through = through_buffer.as<A>();
      reduce_rows<Sums<A, 1>>(
          launch, 1, numel,
          [=] __device__(int64_t, int64_t i) { return Sums<A, 1>{{load<T, A>(grad_y, i) * load<T, A>(x, i)}}; },
          [=] __device__(int64_t, const Sums<A, 1>& s) {
            const A n = *norm;
            *through = n >= eps_a ? s.v[0] / (n * n * n) : A(0);
          });
      for_each_index(launch, numel, [=] __device__(int64_t e) {
        grad_x[e] = convert<T>(load<T, A>(grad_y, e) / clamped(*norm, eps_a) - load<T, A>(x, e) * *through);
      });
      return;
    }
  }
}

}  // namespace

void CudaNorms::frobenius_norm_forward(const Tensor& x, double eps, const Tensor& y, const Tensor& norm) const {
  visit_float(x.dtype(), "frobenius_norm",
              [&](auto tag) { frobenius_forward<typename decltype(tag)::type>(x, eps, y, norm); });
}

void CudaNorms::frobenius_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& norm, double eps,
                                        const Tensor& grad_x) const {
  visit_float(x.dtype(), "frobenius_norm backward",
              [&](auto tag) { frobenius_backward<typename decltype(tag)::type>(grad_y, x, norm, eps, grad_x); });
}

}  // namespace cuda
}  // namespace normcore
