// Shared by the kernelbench programs: options, the run (forward and forward+backward timed
// as the median over iterations, the device synchronized around each), the bandwidth of a
// device copy of the input measured in the same run, and the check of the last run
// against a float64 CPU reference on a slice. A program describes its model as a
// Benchmark and returns run(...) from main: 0 on PASS, 1 on FAIL, 2 on bad options.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "normcore/normcore.h"

namespace kernelbench {

namespace nc = normcore;
using nc::DType;
using nc::Tensor;

struct Options {
  nc::Device device = nc::best_device();
  int64_t scale = 1;  // the leading (batch) dim is divided by it, rounding up
  DType dtype = DType::F32;
  int iters = 10;
  int warmup = 2;
  int64_t features = 0;  // the model's feature width, where it has one (0: the full width)
  bool tf32 = false;     // float32 matmuls on TF32 tensor cores (CUDA)
};

inline void print_usage(const char* program, const char* what) {
  std::printf("%s: %s\n"
              "usage: %s [--device cpu|cuda|cuda:N] [--scale S] [--dtype f32|f16|bf16] [--tf32 on|off] [--iters N]\n"
              "          [--warmup N] [--features N]\n"
              "  --device  where to run (default: cuda when available, else cpu)\n"
              "  --scale   divide the batch dim by S, rounding up (default 1: the full size)\n"
              "  --dtype   the dtype the model runs in (default f32)\n"
              "  --tf32    on: float32 matmuls use TF32 tensor cores on CUDA (default off)\n"
              "  --iters   timed iterations, the median is reported (default 10)\n"
              "  --warmup  untimed iterations first (default 2)\n"
              "  --features  the model's feature width, for models that have one (gemm_gn_min: 8192)\n",
              program, what, program);
}

// Returns false (after printing why) on a bad option; exits 0 after --help.
inline bool parse_options(int argc, char** argv, const char* what, Options* options) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      print_usage(argv[0], what);
      std::exit(0);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: %s needs a value (see --help)\n", argv[0], arg.c_str());
      return false;
    }
    const std::string value = argv[++i];
    try {
      if (arg == "--device") {
        options->device = nc::Device(value);
      } else if (arg == "--dtype") {
        options->dtype = nc::dtype_from_name(value);
        if (options->dtype != DType::F32 && options->dtype != DType::F16 && options->dtype != DType::BF16)
          throw nc::ValueError("--dtype must be f32, f16 or bf16, got " + value);
      } else if (arg == "--tf32") {
        if (value != "on" && value != "off") throw nc::ValueError("--tf32 must be on or off, got " + value);
        options->tf32 = value == "on";
      } else if (arg == "--scale" || arg == "--iters" || arg == "--warmup" || arg == "--features") {
        const long long n = std::stoll(value);
        const long long least = arg == "--warmup" ? 0 : 1;
        if (n < least) throw nc::ValueError(arg + " must be at least " + std::to_string(least) + ", got " + value);
        if (arg == "--scale") options->scale = n;
        else if (arg == "--iters") options->iters = static_cast<int>(n);
        else if (arg == "--features") options->features = n;
        else options->warmup = static_cast<int>(n);
      } else {
        std::fprintf(stderr, "%s: unknown option %s (see --help)\n", argv[0], arg.c_str());
        return false;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: bad value for %s: %s\n", argv[0], arg.c_str(), e.what());
      return false;
    }
  }
  if (options->device.is_cuda() && options->device.index >= nc::cuda_device_count()) {
    std::fprintf(stderr, "%s: %s is not available (%d CUDA devices)\n", argv[0], options->device.str().c_str(),
                 nc::cuda_device_count());
    return false;
  }
  return true;
}

inline int64_t scaled(int64_t size, const Options& options) { return (size + options.scale - 1) / options.scale; }

inline void synchronize(const nc::Device& device) {
  if (device.is_cuda()) nc::cuda::synchronize(device.index);
}

// Median wall time of step in ms, after warm-up runs; the device is idle before each
// timed step starts and the step's work is finished when its time is taken.
inline double median_ms(const Options& options, const std::function<void()>& step) {
  for (int i = 0; i < options.warmup; ++i) step();
  std::vector<double> times;
  for (int i = 0; i < options.iters; ++i) {
    synchronize(options.device);
    const auto start = std::chrono::steady_clock::now();
    step();
    synchronize(options.device);
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Tolerance against a float64 reference, relative to the compared slice's largest |value|.
// TF32 matmuls round their float32 inputs to 11 significant bits.
inline double tolerance(DType dtype, bool tf32) {
  if (tf32 && dtype == DType::F32) return 3e-3;
  switch (dtype) {
    case DType::F16: return 1e-2;
    case DType::BF16: return 3e-2;
    default: return 1e-4;
  }
}

// Collects comparisons; each prints its worst error and whether it is within tolerance.
class Checker {
 public:
  Checker(DType dtype, bool tf32) : tol_(tolerance(dtype, tf32)) {}

  void compare(const std::string& what, const Tensor& got, const Tensor& expected) {
    const std::vector<double> g = got.to(nc::Device::cpu(), DType::F64).to_vector<double>();
    const std::vector<double> e = expected.to(nc::Device::cpu(), DType::F64).to_vector<double>();
    bool ok = got.shape() == expected.shape();
    double scale = 0, worst = 0;
    for (double v : e) scale = std::max(scale, std::fabs(v));
    for (size_t i = 0; ok && i < g.size(); ++i) {
      const double diff = std::fabs(g[i] - e[i]);
      if (!(diff <= tol_ * scale)) ok = false;  // NaN fails too
      worst = std::max(worst, diff);
    }
    std::printf("  check %-20s max |error| %.3g (tolerance %.3g)  %s\n", what.c_str(), worst, tol_ * scale,
                ok ? "ok" : "MISMATCH");
    pass_ = pass_ && ok;
  }
  void fail(const std::string& why) {
    std::printf("  check failed: %s\n", why.c_str());
    pass_ = false;
  }
  bool pass() const { return pass_; }

 private:
  double tol_;
  bool pass_ = true;
};

// The first rows samples of t along dim, as a float64 CPU tensor without history.
inline Tensor slice_f64(const Tensor& t, int64_t dim, int64_t rows) {
  return t.detach().narrow(dim, 0, std::min(rows, t.size(dim))).to(nc::Device::cpu(), DType::F64);
}

// A float64 CPU copy of each tensor (undefined stays undefined), for references.
inline std::vector<Tensor> to_reference(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> out;
  for (const Tensor& t : tensors) out.push_back(t.defined() ? t.detach().to(nc::Device::cpu(), DType::F64) : t);
  return out;
}

using Model = std::function<Tensor(const Tensor& x, const std::vector<Tensor>& params)>;

// What a check sees: the inputs and the last forward+backward of one forward (label).
struct Run {
  std::string label;
  Tensor x, grad_out, out, grad_x;
  std::vector<Tensor> params;
};
using Check = std::function<void(const Run& run, Checker& checker)>;

struct Benchmark {
  std::string name;
  std::string what;       // one line for --help
  nc::Shape input_shape;  // at full size
  // Built on the device in the run's dtype; each requires grad (the model's trainable state).
  std::function<std::vector<Tensor>(const Options&, nc::Generator&)> make_params;
  Model model;
  Check check;
  // Further timed and checked variants of the forward (a fused op against the composition).
  std::vector<std::pair<std::string, Model>> variants = {};
  // The input dim that --features sets (-1: the model has no feature width to change).
  int64_t feature_dim = -1;
  // Part of the model timed on its own, unchecked, as the yardstick for the others (the
  // GEMM of a GEMM-bound model): each forward's time is also given as a multiple of it.
  std::pair<std::string, Model> yardstick = {};
};

inline std::vector<Tensor> no_params(const Options&, nc::Generator&) { return {}; }

// A check for models that treat each sample (along dim 0 of x, out_dim of out) on its
// own: runs model in float64 on the CPU for the first `rows` samples.
inline Check per_sample_check(Model model, int64_t rows, int64_t out_dim = 0) {
  return [model, rows, out_dim](const Run& run, Checker& checker) {
    Tensor x_ref = slice_f64(run.x, 0, rows).requires_grad_();
    Tensor out_ref = model(x_ref, to_reference(run.params));
    out_ref.backward(slice_f64(run.grad_out, out_dim, rows));
    checker.compare(run.label + " out", slice_f64(run.out, out_dim, rows), out_ref);
    checker.compare(run.label + " grad_x", slice_f64(run.grad_x, 0, rows), x_ref.grad());
  };
}

inline void print_time(const char* what, double ms, double bytes, double yardstick_ms = 0) {
  std::printf("  %-28s %10.3f ms", what, ms);
  if (bytes > 0) std::printf("  %8.1f GB/s", bytes / ms * 1e-6);
  if (yardstick_ms > 0) std::printf("  %6.3fx the yardstick", ms / yardstick_ms);
  std::printf("\n");
}

inline int run(int argc, char** argv, const Benchmark& bench) {
  Options options;
  if (!parse_options(argc, argv, bench.what.c_str(), &options)) return 2;
  nc::Shape shape = bench.input_shape;
  shape[0] = scaled(shape[0], options);
  if (options.features > 0) {
    if (bench.feature_dim < 0) {
      std::fprintf(stderr, "%s: this model has no --features\n", argv[0]);
      return 2;
    }
    shape[bench.feature_dim] = options.features;
  }
  nc::cuda::set_allow_tf32(options.tf32);
  std::printf("%s on %s, %s%s, x %s (scale %lld), %d iterations after %d warm-up\n", bench.name.c_str(),
              options.device.str().c_str(), nc::dtype_name(options.dtype), options.tf32 ? " (TF32 matmuls)" : "",
              nc::shape_str(shape).c_str(), static_cast<long long>(options.scale), options.iters, options.warmup);
  try {
    nc::Generator gen(0);
    const nc::TensorOptions on_device(options.dtype, options.device);
    Tensor x = nc::randn(shape, on_device, &gen).requires_grad_();
    const std::vector<Tensor> params = bench.make_params(options, gen);
    Tensor grad_out;
    {
      nc::autograd::NoGradGuard no_grad;
      grad_out = nc::randn(bench.model(x, params).shape(), on_device, &gen);
    }
    const double x_bytes = static_cast<double>(x.nbytes());
    // A device copy of x reads and writes it once: the bandwidth to compare with.
    print_time("copy of x", median_ms(options, [&] { x.detach().clone(); }), 2 * x_bytes);

    // Forward reads x and writes out (at least); forward+backward also reads x, out's
    // gradient and writes grad_x.
    const double forward_bytes = x_bytes + static_cast<double>(grad_out.nbytes());
    std::vector<std::pair<std::string, Model>> forwards = {{"forward", bench.model}};
    forwards.insert(forwards.end(), bench.variants.begin(), bench.variants.end());
    auto zero_grads = [&] {
      x.zero_grad();
      for (const Tensor& p : params) p.zero_grad();
    };
    Checker checker(options.dtype, options.tf32 && options.device.is_cuda());
    double yardstick_ms = 0, yardstick_step_ms = 0;
    if (bench.yardstick.second) {
      const Model& model = bench.yardstick.second;
      yardstick_ms = median_ms(options, [&] {
        nc::autograd::NoGradGuard no_grad;
        model(x, params);
      });
      print_time((bench.yardstick.first + " (yardstick)").c_str(), yardstick_ms, 0);
      yardstick_step_ms = median_ms(options, [&] {
        zero_grads();
        Tensor out = model(x, params);
        out.backward(nc::ones_like(out));
      });
      print_time((bench.yardstick.first + "+backward").c_str(), yardstick_step_ms, 0);
    }
    for (const auto& [label, model] : forwards) {
      const double forward_ms = median_ms(options, [&, &model = model] {
        nc::autograd::NoGradGuard no_grad;
        model(x, params);
      });
      print_time(label.c_str(), forward_ms, forward_bytes, yardstick_ms);
      // The last iteration's out and gradients stay for the check; each iteration drops
      // the previous ones first, so they never add to the peak memory.
      Tensor out;
      const double step_ms = median_ms(options, [&, &model = model] {
        out = Tensor();
        zero_grads();
        out = model(x, params);
        out.backward(grad_out);
      });
      print_time((label + "+backward").c_str(), step_ms, 2 * forward_bytes + x_bytes, yardstick_step_ms);
      bench.check({label, x, grad_out, out, x.grad(), params}, checker);
    }
    std::printf("%s %s\n", bench.name.c_str(), checker.pass() ? "PASS" : "FAIL");
    return checker.pass() ? 0 : 1;
  } catch (const nc::Error& e) {
    std::printf("%s FAIL: %s\n", bench.name.c_str(), e.what());
    return 1;
  }
}

}  // namespace kernelbench
