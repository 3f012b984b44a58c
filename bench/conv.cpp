// Benchmark: conv2d (cuDNN) and the normalization layers of CNNs on ResNet-like NCHW
// activations, forward and forward+backward, on the GPU. Convolutions report ms and the
// fraction of the H100's dense peak for their dtype (FLOP floor); BatchNorm and GroupNorm
// report ms and the fraction of the device-copy bandwidth on their floor bytes (2 passes
// over x forward, 5 forward+backward), measured in the same run, and the time of one copy
// of x (the forward's floor bytes in one kernel of the same size). CUDA-event medians after a
// warm-up; one JSON line per case. bench/conv_torch.py times the same cases in PyTorch.
//   conv [--filter SUBSTRING] [--reps N] [--benchmark]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cuda_timing.h"
#include "kernels/conv.h"
#include "normcore/normcore.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;

namespace {

using bench::median_ms;

// H100 SXM dense peaks in TFLOP/s: f32 on CUDA cores, TF32 and bf16 on tensor cores.
constexpr double kPeakF32 = 67, kPeakTf32 = 494.7, kPeakBf16 = 989.4;

struct ConvCase {
  std::string name;
  int64_t n, c, hw;
};

enum class Mode { F32, TF32, BF16 };

const char* mode_name(Mode m) { return m == Mode::F32 ? "f32" : m == Mode::TF32 ? "tf32" : "bf16"; }

double peak(Mode m) { return m == Mode::F32 ? kPeakF32 : m == Mode::TF32 ? kPeakTf32 : kPeakBf16; }

int64_t numel(const nc::Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  std::string filter;
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--filter" && i + 1 < argc) filter = argv[++i];
    else if (arg == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (arg == "--benchmark") nc::cuda::set_cudnn_benchmark(true);
    else {
      std::fprintf(stderr, "usage: conv [--filter SUBSTRING] [--reps N] [--benchmark]\n");
      return 2;
    }
  }
  if (!nc::cuda_is_available()) {
    std::fprintf(stderr, "conv: needs a CUDA device\n");
    return 1;
  }
  const nc::Device gpu = nc::Device::cuda(0);
  nc::Generator gen(1);
  auto wanted = [&](const std::string& name) { return filter.empty() || name.find(filter) != std::string::npos; };

  double copy_gbps = 0;
  {
    Tensor src = nc::empty({int64_t{1} << 30}, nc::TensorOptions(DType::F32, gpu));
    src.fill_(1.0);
    Tensor dst = nc::empty_like(src);
    const double ms = median_ms([&] { dst.copy_(src); }, 10);
    copy_gbps = 2.0 * 4.0 * static_cast<double>(src.numel()) / (ms * 1e-3) / 1e9;
    std::printf("device copy of 4 GiB: %.3f ms, %.0f GB/s (read + write); cudnn benchmark %s\n", ms, copy_gbps,
                nc::cuda::cudnn_benchmark() ? "on" : "off");
  }

  const std::vector<ConvCase> shapes = {{"64x64x56x56", 64, 64, 56}, {"64x256x14x14", 64, 256, 14}};

  std::printf("\n%-34s %-5s %9s %6s %10s %6s\n", "case", "mode", "fwd ms", "peak", "fwd+bwd ms", "peak");
  for (const ConvCase& s : shapes) {
    for (Mode mode : {Mode::F32, Mode::TF32, Mode::BF16}) {
      const std::string name = "conv3x3_" + s.name;
      if (!wanted(name)) continue;
      nc::cuda::set_allow_tf32(mode == Mode::TF32);
      const DType dtype = mode == Mode::BF16 ? DType::BF16 : DType::F32;
      Tensor x = nc::randn({s.n, s.c, s.hw, s.hw}, nc::TensorOptions(dtype, gpu), &gen);
      Tensor w = nc::mul(nc::randn({s.c, s.c, 3, 3}, nc::TensorOptions(dtype, gpu), &gen), 0.05);
      const double flop = 2.0 * s.n * s.c * s.c * 9 * s.hw * s.hw;
      const double fwd_ms = median_ms([&] { nc::conv2d(x, w, Tensor(), 1, 1); }, reps);
      Tensor xg = x.detach().requires_grad_(), wg = w.detach().requires_grad_();
      Tensor grad = nc::randn({s.n, s.c, s.hw, s.hw}, nc::TensorOptions(dtype, gpu), &gen);
      const double fwd_bwd_ms = median_ms(
          [&] {
            xg.zero_grad(), wg.zero_grad();
            nc::conv2d(xg, wg, Tensor(), 1, 1).backward(grad);
          },
          reps);
      const double fwd_frac = flop / (fwd_ms * 1e-3) / (peak(mode) * 1e12);
      const double fwd_bwd_frac = 3 * flop / (fwd_bwd_ms * 1e-3) / (peak(mode) * 1e12);
      std::printf("%-34s %-5s %9.4f %5.0f%% %10.4f %5.0f%%\n", name.c_str(), mode_name(mode), fwd_ms, 100 * fwd_frac,
                  fwd_bwd_ms, 100 * fwd_bwd_frac);
      std::string algorithms;
      for (auto d : {nc::kernels::ConvDirection::Forward, nc::kernels::ConvDirection::BackwardData,
                     nc::kernels::ConvDirection::BackwardFilter})
        algorithms += (algorithms.empty() ? "" : "; ") + std::string(nc::kernels::conv_direction_name(d)) + ": " +
                      nc::kernels::last_conv_algorithm(d);
      std::printf("%-34s %s\n", "", algorithms.c_str());
      std::printf("{\"case\": \"%s\", \"mode\": \"%s\", \"impl\": \"normcore\", \"fwd_ms\": %.4f, \"fwd_bwd_ms\": %.4f, "
                  "\"fwd_flop\": %.0f, \"fwd_peak_fraction\": %.4f, \"fwd_bwd_peak_fraction\": %.4f, "
                  "\"algorithms\": \"%s\"}\n",
                  name.c_str(), mode_name(mode), fwd_ms, fwd_bwd_ms, flop, fwd_frac, fwd_bwd_frac, algorithms.c_str());
    }
  }
  nc::cuda::set_allow_tf32(false);

  std::printf("\n%-34s %-5s %9s %6s %10s %6s %9s\n", "case", "dtype", "fwd ms", "copy", "fwd+bwd ms", "copy",
              "x copy ms");
  for (const ConvCase& s : shapes) {
    for (const char* op : {"batchnorm", "groupnorm_g32"}) {
      for (DType dtype : {DType::F32, DType::BF16}) {
        const std::string name = std::string(op) + "_" + s.name;
        if (!wanted(name)) continue;
        const nc::Shape shape = {s.n, s.c, s.hw, s.hw};
        Tensor x = nc::randn(shape, nc::TensorOptions(dtype, gpu), &gen);
        Tensor weight = nc::ones({s.c}, nc::TensorOptions(dtype, gpu));
        Tensor bias = nc::zeros({s.c}, nc::TensorOptions(dtype, gpu));
        Tensor mean = nc::zeros({s.c}, nc::TensorOptions(dtype, gpu));
        Tensor var = nc::ones({s.c}, nc::TensorOptions(dtype, gpu));
        const bool batch = std::strcmp(op, "batchnorm") == 0;
        auto forward = [&](const Tensor& in, const Tensor& w, const Tensor& b) {
          return batch ? nc::batch_norm(in, mean, var, w, b, true, 0.1, 1e-5) : nc::group_norm(in, 32, w, b);
        };
        const double bytes = static_cast<double>(numel(shape)) * static_cast<double>(nc::dtype_size(dtype));
        const double fwd_ms = median_ms([&] { forward(x, weight, bias); }, reps);
        Tensor xg = x.detach().requires_grad_(), wg = weight.detach().requires_grad_();
        Tensor bg = bias.detach().requires_grad_();
        Tensor grad = nc::randn(shape, nc::TensorOptions(dtype, gpu), &gen);
        const double fwd_bwd_ms = median_ms(
            [&] {
              xg.zero_grad(), wg.zero_grad(), bg.zero_grad();
              forward(xg, wg, bg).backward(grad);
            },
            reps);
        const double fwd_frac = 2 * bytes / (fwd_ms * 1e-3) / 1e9 / copy_gbps;
        const double fwd_bwd_frac = 5 * bytes / (fwd_bwd_ms * 1e-3) / 1e9 / copy_gbps;
        // A copy of x alone moves the forward's floor bytes: what one kernel of this size
        // reaches, launch and ramp included.
        Tensor copy = nc::empty_like(x);
        const double copy_ms = median_ms([&] { copy.copy_(x); }, reps);
        std::printf("%-34s %-5s %9.4f %5.0f%% %10.4f %5.0f%% %9.4f\n", name.c_str(), nc::dtype_name(dtype), fwd_ms,
                    100 * fwd_frac, fwd_bwd_ms, 100 * fwd_bwd_frac, copy_ms);
        std::printf("{\"case\": \"%s\", \"dtype\": \"%s\", \"impl\": \"normcore\", \"fwd_ms\": %.4f, "
                    "\"fwd_bwd_ms\": %.4f, \"fwd_copy_fraction\": %.4f, \"fwd_bwd_copy_fraction\": %.4f, "
                    "\"copy_GBps\": %.1f, \"same_size_copy_ms\": %.4f}\n",
                    name.c_str(), nc::dtype_name(dtype), fwd_ms, fwd_bwd_ms, fwd_frac, fwd_bwd_frac, copy_gbps,
                    copy_ms);
      }
    }
  }
  return 0;
}
