// A differentiable op normcore does not have, added from outside it: the soft clip
// y = a * tanh(x / a), which leaves small values alone and bounds large ones by a. Its
// forward and backward are written by hand: a loop over the data on the CPU and, when built
// with CUDA, two kernels launched on normcore's current stream (soft_clip.cu). gradcheck
// compares the backward with central differences on each device, and on a GPU the kernels
// must agree with the CPU loop. Exits 1 when a check fails.
//   custom_op [cpu|cuda]   (default: the CPU, and the GPU when there is one)
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <normcore/cuda.h>
#include <normcore/function.h>
#include <normcore/normcore.h>

#ifdef CUSTOM_OP_HAS_CUDA
#include "soft_clip.h"
#endif

namespace nc = normcore;
using nc::Tensor;

namespace {

template <class T>
void soft_clip_forward_cpu(const T* x, T* y, int64_t n, double a) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(a * std::tanh(x[i] / a));
}

template <class T>
void soft_clip_backward_cpu(const T* x, const T* g, T* dx, int64_t n, double a) {
  for (int64_t i = 0; i < n; ++i) {
    const double t = std::tanh(x[i] / a);
    dx[i] = static_cast<T>(g[i] * (1.0 - t * t));
  }
}

// Runs fn<float> or fn<double> for t's dtype; the op takes no other.
template <class Fn>
void on_dtype(const Tensor& t, Fn&& fn) {
  if (t.dtype() == nc::DType::F32) fn(float());
  else if (t.dtype() == nc::DType::F64) fn(double());
  else throw nc::DTypeError("soft_clip: x must be f32 or f64, got " + nc::describe(t));
}

struct SoftClip {
  static constexpr const char* name = "soft_clip";

  static std::vector<Tensor> forward(nc::autograd::FunctionContext& ctx, const std::vector<Tensor>& in, double a) {
    if (!(a > 0)) throw nc::ValueError("soft_clip: a must be positive, got " + std::to_string(a));
    const Tensor x = in[0].contiguous();
    Tensor y = nc::empty_like(x);
    on_dtype(x, [&](auto zero) {
      using T = decltype(zero);
      if (x.device().is_cuda()) {
#ifdef CUSTOM_OP_HAS_CUDA
        soft_clip_forward_cuda<T>(x.data<T>(), y.data<T>(), x.numel(), a, nc::cuda::current_stream(x.device().index));
#else
        throw nc::DeviceError("soft_clip: this build has no CUDA kernel");
#endif
      } else {
        soft_clip_forward_cpu<T>(x.data<T>(), y.data<T>(), x.numel(), a);
      }
    });
    ctx.save_for_backward({x});
    ctx.saved_data["a"] = a;
    return {y};
  }

  static std::vector<Tensor> backward(nc::autograd::FunctionContext& ctx, const std::vector<Tensor>& grad) {
    const Tensor x = ctx.saved()[0];
    const Tensor g = grad[0].contiguous();
    const double a = std::any_cast<double>(ctx.saved_data.at("a"));
    Tensor dx = nc::empty_like(x);
    on_dtype(x, [&](auto zero) {
      using T = decltype(zero);
      if (x.device().is_cuda()) {
#ifdef CUSTOM_OP_HAS_CUDA
        soft_clip_backward_cuda<T>(x.data<T>(), g.data<T>(), dx.data<T>(), x.numel(), a,
                                   nc::cuda::current_stream(x.device().index));
#endif
      } else {
        soft_clip_backward_cpu<T>(x.data<T>(), g.data<T>(), dx.data<T>(), x.numel(), a);
      }
    });
    return {dx};
  }
};

Tensor soft_clip(const Tensor& x, double a) { return nc::autograd::Function<SoftClip>::apply({x}, a)[0]; }

double max_abs_diff(const Tensor& a, const Tensor& b) {
  return nc::max(nc::abs(nc::sub(a.to(nc::Device::cpu()), b.to(nc::Device::cpu())))).item<double>();
}

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  if (!ok) ++failures;
}

void run_on(nc::Device device) {
  const std::string on = " on " + device.str();
  nc::Generator gen(5);
  const Tensor x0 = nc::mul(nc::randn({4, 33}, nc::DType::F64, &gen), 3.0).to(device);

  // The values against the same formula in normcore's ops.
  const double a = 2.0;
  check(max_abs_diff(soft_clip(x0, a), nc::mul(nc::tanh(nc::mul(x0, 1.0 / a)), a)) < 1e-12, "forward values" + on);

  // The backward against central differences, in float64.
  std::string report;
  const bool ok = nc::gradcheck([&](const std::vector<Tensor>& in) { return soft_clip(in[0], a); },
                                {x0.detach().requires_grad_()}, {}, &report);
  check(ok, "gradcheck" + on + (ok ? "" : ": " + report));

  // Through a small model: the op between two Linear layers trains like a built-in one.
  nc::nn::Linear first(8, 16, true, &gen), second(16, 1, true, &gen);
  first.to(device);
  second.to(device);
  nc::optim::SGDOptions options;
  options.lr = 0.05;
  std::vector<Tensor> parameters = first.parameters();
  for (const Tensor& p : second.parameters()) parameters.push_back(p);
  nc::optim::SGD sgd(parameters, options);
  const Tensor inputs = nc::randn({64, 8}, {}, &gen).to(device);
  const Tensor targets = nc::sum(nc::mul(inputs, 0.5), {1}, true);
  double first_loss = 0, last_loss = 0;
  for (int step = 0; step < 200; ++step) {
    sgd.zero_grad();
    const Tensor loss = nc::mse_loss(second(soft_clip(first(inputs), 1.5)), targets);
    loss.backward();
    sgd.step();
    if (step == 0) first_loss = loss.item<double>();
    last_loss = loss.item<double>();
  }
  std::printf("     loss %.4f -> %.4f%s\n", first_loss, last_loss, on.c_str());
  check(last_loss < 0.2 * first_loss, "a model with the op trains" + on);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  try {
    if (only.empty() || only == "cpu") run_on(nc::Device::cpu());
    if (only == "cuda" || (only.empty() && nc::cuda_is_available())) {
#ifdef CUSTOM_OP_HAS_CUDA
      run_on(nc::Device::cuda(0));
      // The CUDA kernels against the CPU loop, forward and backward, f32 and f64.
      for (nc::DType dtype : {nc::DType::F32, nc::DType::F64}) {
        nc::Generator gen(9);
        const Tensor x = nc::mul(nc::randn({1000}, dtype, &gen), 4.0);
        Tensor xc = x.detach().requires_grad_(), xg = x.to(nc::Device::cuda(0)).requires_grad_();
        const Tensor yc = soft_clip(xc, 3.0), yg = soft_clip(xg, 3.0);
        nc::sum(nc::mul(yc, yc)).backward();
        nc::sum(nc::mul(yg, yg)).backward();
        const double tolerance = dtype == nc::DType::F32 ? 1e-5 : 1e-12;
        check(max_abs_diff(yc, yg) < tolerance && max_abs_diff(xc.grad(), xg.grad()) < tolerance,
              std::string("the CUDA kernels agree with the CPU loop in ") + nc::dtype_name(dtype));
      }
#else
      check(false, "this build has no CUDA kernel for the op");
#endif
    }
  } catch (const std::exception& e) {  // normcore's errors, and a failed kernel launch
    std::printf("FAIL %s\n", e.what());
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
