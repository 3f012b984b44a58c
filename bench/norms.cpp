// Benchmark: the normalization kernels on the GPU, forward and forward+backward, for the
// cases of the performance anchors (the benchmark problems, training-style shapes) and a
// sweep of layer-norm row lengths over a fixed 256 MB tensor. Times are CUDA-event medians
// after a warm-up; each case reports ms, GB/s on its floor bytes and the fraction of the
// device-copy bandwidth measured in the same run. Writes one JSON line per case.
// --list prints the case names; --case NAME runs that case alone (bench/norms_fresh.py runs
// each case in a process of its own that way).
//   norms [--filter SUBSTRING | --case NAME] [--reps N] [--no-sweep] [--json FILE] [--list]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cuda_timing.h"
#include "normcore/normcore.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;

namespace {

using bench::median_ms;

enum class Op { LayerNorm, RMSNorm, GroupNorm, BatchNorm, L1Norm, Frobenius };

struct Case {
  std::string name;
  Op op;
  nc::Shape shape;
  DType dtype;
  int64_t param_dims = 0;  // layer and RMS norm: trailing dims normalized; group norm: groups
  // Floor traffic in whole-tensor passes (reads + writes of x-sized tensors), as the
  // anchors count them; parameter traffic is added on top.
  int fwd_passes = 2;
  int fwd_bwd_passes = 5;
  int reps = 20;
};

int64_t numel(const nc::Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

struct Timing {
  double fwd_ms = 0, fwd_bwd_ms = 0;
  double fwd_bytes = 0, fwd_bwd_bytes = 0;
};

Timing run_case(const Case& c) {
  const nc::Device gpu = nc::Device::cuda(0);
  nc::Generator gen(1);
  Tensor x = nc::randn(c.shape, nc::TensorOptions(c.dtype, gpu), &gen);
  Tensor weight, bias;
  std::vector<int64_t> normalized;
  if (c.op == Op::LayerNorm || c.op == Op::RMSNorm) {
    for (int64_t d = static_cast<int64_t>(c.shape.size()) - c.param_dims; d < static_cast<int64_t>(c.shape.size());
         ++d) {
      normalized.push_back(c.shape[d]);
    }
    weight = nc::ones(normalized, nc::TensorOptions(c.dtype, gpu));
    if (c.op == Op::LayerNorm) bias = nc::zeros(normalized, nc::TensorOptions(c.dtype, gpu));
  } else if (c.op == Op::GroupNorm || c.op == Op::BatchNorm) {
    weight = nc::ones({c.shape[1]}, nc::TensorOptions(c.dtype, gpu));
    bias = nc::zeros({c.shape[1]}, nc::TensorOptions(c.dtype, gpu));
  }
  // Batch norm trains: batch statistics, running statistics updated in place.
  Tensor running_mean, running_var;
  if (c.op == Op::BatchNorm) {
    running_mean = nc::zeros({c.shape[1]}, nc::TensorOptions(c.dtype, gpu));
    running_var = nc::ones({c.shape[1]}, nc::TensorOptions(c.dtype, gpu));
  }
  auto forward = [&](const Tensor& in, const Tensor& w, const Tensor& b) {
    switch (c.op) {
      case Op::LayerNorm: return nc::layer_norm(in, normalized, w, b);
      case Op::RMSNorm: return nc::rms_norm(in, normalized, w);
      case Op::GroupNorm: return nc::group_norm(in, c.param_dims, w, b);
      case Op::BatchNorm: return nc::batch_norm(in, running_mean, running_var, w, b, true);
      case Op::L1Norm: return nc::l1_norm(in, 1);
      case Op::Frobenius: return nc::frobenius_norm(in);
    }
    return Tensor();
  };
  Timing t;
  const double element = static_cast<double>(nc::dtype_size(c.dtype));
  const double tensor_bytes = static_cast<double>(numel(c.shape)) * element;
  const double params = (weight.defined() ? 1.0 : 0.0) + (bias.defined() ? 1.0 : 0.0);
  const double param_bytes = weight.defined() ? params * static_cast<double>(weight.numel()) * element : 0.0;
  t.fwd_bytes = c.fwd_passes * tensor_bytes + param_bytes;
  // backward: weight read, a gradient written per parameter.
  const double weight_bytes = weight.defined() ? static_cast<double>(weight.numel()) * element : 0.0;
  t.fwd_bwd_bytes = c.fwd_bwd_passes * tensor_bytes + param_bytes + (1 + params) * weight_bytes;
  t.fwd_ms = median_ms([&] { forward(x, weight, bias); }, c.reps);

  Tensor xg = x.detach().requires_grad_();
  Tensor wg = weight.defined() ? weight.detach().requires_grad_() : Tensor();
  Tensor bg = bias.defined() ? bias.detach().requires_grad_() : Tensor();
  Tensor grad = nc::randn(c.shape, nc::TensorOptions(c.dtype, gpu), &gen);
  t.fwd_bwd_ms = median_ms(
      [&] {
        xg.zero_grad();
        if (wg.defined()) wg.zero_grad();
        if (bg.defined()) bg.zero_grad();
        forward(xg, wg, bg).backward(grad);
      },
      c.reps);
  return t;
}

std::string shape_text(const nc::Shape& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s;
}

// Every case, in the order they run: the anchors' problems, training shapes, then (with
// sweep) the layer-norm row sweep.
std::vector<Case> all_cases(bool sweep) {
  std::vector<Case> cases = {
      {"layernorm_16x(64x256x256)", Op::LayerNorm, {16, 64, 256, 256}, DType::F32, 3},
      {"groupnorm_112x64x512x512_g8", Op::GroupNorm, {112, 64, 512, 512}, DType::F32, 8, 2, 5, 5},
      {"l1norm_32768x65535", Op::L1Norm, {32768, 65535}, DType::F32, 0, 2, 5, 5},
      {"frobenius_112x64x512x512", Op::Frobenius, {112, 64, 512, 512}, DType::F32, 0, 3, 8, 5},
      {"frobenius_16x64x256x256", Op::Frobenius, {16, 64, 256, 256}, DType::F32, 0, 3, 8},
  };
  for (DType dtype : {DType::F32, DType::BF16}) {
    const std::string tag = dtype == DType::F32 ? "f32" : "bf16";
    for (int64_t row_len : {768, 4096}) {
      cases.push_back(
          {"layernorm_" + tag + "_32768x" + std::to_string(row_len), Op::LayerNorm, {32768, row_len}, dtype, 1});
    }
    cases.push_back({"groupnorm_" + tag + "_32x320x64x64_g32", Op::GroupNorm, {32, 320, 64, 64}, dtype, 32});
    // A diffusion U-Net's widest groups: 16 channels of 64x64 (256 KB of f32).
    cases.push_back({"groupnorm_" + tag + "_8x512x64x64_g32", Op::GroupNorm, {8, 512, 64, 64}, dtype, 32});
    // L1 rows of whole 16-byte vectors (read twice forward, once over a cluster backward);
    // 512 KB of f32 forward over a cluster of eight (its backward beyond a cluster).
    cases.push_back({"l1norm_" + tag + "_16384x65536", Op::L1Norm, {16384, 65536}, dtype, 0, 2, 5});
    if (dtype == DType::F32) cases.push_back({"l1norm_f32_4096x131072", Op::L1Norm, {4096, 131072}, dtype, 0, 2, 5});
    // Transformer activations: tokens x hidden.
    for (int64_t hidden : {1024, 4096, 8192}) {
      const std::string shape = "_16384x" + std::to_string(hidden);
      cases.push_back({"rmsnorm_" + tag + shape, Op::RMSNorm, {16384, hidden}, dtype, 1});
      cases.push_back({"layernorm_" + tag + shape, Op::LayerNorm, {16384, hidden}, dtype, 1});
    }
  }
  // Batch norm over NCHW activations of ResNet-50 at batch 32, training mode. A channel's
  // values (N * H * W) do not fit on one SM, so the floor reads x twice forward (statistics,
  // then the output) and x and dy twice backward.
  for (DType dtype : {DType::F32, DType::BF16}) {
    const std::string tag = dtype == DType::F32 ? "f32" : "bf16";
    for (const nc::Shape& shape :
         std::vector<nc::Shape>{{32, 64, 112, 112}, {32, 256, 56, 56}, {32, 512, 28, 28}, {32, 2048, 7, 7}}) {
      cases.push_back({"batchnorm_" + tag + "_" + shape_text(shape), Op::BatchNorm, shape, dtype, 0, 3, 8});
    }
  }
  if (sweep) {
    const int64_t elements = int64_t{1} << 26;  // 256 MB of f32
    for (int64_t row_len = 64; row_len <= (int64_t{1} << 22); row_len *= 4) {
      cases.push_back({"layernorm_sweep_row" + std::to_string(row_len),
                       Op::LayerNorm,
                       {elements / row_len, row_len},
                       DType::F32,
                       1});
    }
  }

  return cases;
}

}  // namespace

int main(int argc, char** argv) {
  std::string filter, only, json_path;
  int reps_override = 0;
  bool sweep = true, list = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "norms: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--filter") filter = value();
    else if (arg == "--case") only = value();
    else if (arg == "--list") list = true;
    else if (arg == "--reps") reps_override = std::atoi(value().c_str());
    else if (arg == "--no-sweep") sweep = false;
    else if (arg == "--json") json_path = value();
    else {
      std::fprintf(stderr,
                   "usage: norms [--filter SUBSTRING | --case NAME] [--reps N] [--no-sweep] [--json FILE] [--list]\n");
      return 2;
    }
  }
  std::vector<Case> cases = all_cases(sweep);
  if (list) {
    for (const Case& c : cases) std::printf("%s\n", c.name.c_str());
    return 0;
  }
  if (!only.empty() && std::none_of(cases.begin(), cases.end(), [&](const Case& c) { return c.name == only; })) {
    std::fprintf(stderr, "norms: no case named '%s' (--list prints them)\n", only.c_str());
    return 2;
  }
  if (!nc::cuda_is_available()) {
    std::fprintf(stderr, "norms: needs a CUDA device\n");
    return 1;
  }
  FILE* json = json_path.empty() ? nullptr : std::fopen(json_path.c_str(), "w");

  // Device copy bandwidth, read + write, of 4 GiB.
  double copy_gbps = 0;
  {
    Tensor src = nc::empty({int64_t{1} << 30}, nc::TensorOptions(DType::F32, nc::Device::cuda(0)));
    src.fill_(1.0);
    Tensor dst = nc::empty_like(src);
    double ms = median_ms([&] { dst.copy_(src); }, 10);
    copy_gbps = 2.0 * 4.0 * static_cast<double>(src.numel()) / (ms * 1e-3) / 1e9;
    std::printf("device copy of 4 GiB: %.3f ms, %.0f GB/s (read + write)\n", ms, copy_gbps);
  }

  std::printf("\n%-34s %-5s %9s %8s %6s %10s %8s %6s\n", "case", "dtype", "fwd ms", "GB/s", "copy", "fwd+bwd ms",
              "GB/s", "copy");
  for (Case& c : cases) {
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    if (!only.empty() && c.name != only) continue;
    if (reps_override > 0) c.reps = reps_override;
    Timing t = run_case(c);
    const double fwd_gbps = t.fwd_bytes / (t.fwd_ms * 1e-3) / 1e9;
    const double fwd_bwd_gbps = t.fwd_bwd_bytes / (t.fwd_bwd_ms * 1e-3) / 1e9;
    std::printf("%-34s %-5s %9.4f %8.0f %5.0f%% %10.4f %8.0f %5.0f%%\n", c.name.c_str(), nc::dtype_name(c.dtype),
                t.fwd_ms, fwd_gbps, 100 * fwd_gbps / copy_gbps, t.fwd_bwd_ms, fwd_bwd_gbps,
                100 * fwd_bwd_gbps / copy_gbps);
    std::fflush(stdout);
    if (json) {
      std::fprintf(json,
                   "{\"case\": \"%s\", \"shape\": \"%s\", \"dtype\": \"%s\", \"fwd_ms\": %.5f, \"fwd_bwd_ms\": %.5f, "
                   "\"fwd_floor_bytes\": %.0f, \"fwd_bwd_floor_bytes\": %.0f, \"fwd_copy_fraction\": %.4f, "
                   "\"fwd_bwd_copy_fraction\": %.4f, \"copy_GBps\": %.1f}\n",
                   c.name.c_str(), shape_text(c.shape).c_str(), nc::dtype_name(c.dtype), t.fwd_ms, t.fwd_bwd_ms,
                   t.fwd_bytes, t.fwd_bwd_bytes, fwd_gbps / copy_gbps, fwd_bwd_gbps / copy_gbps, copy_gbps);
    }
    nc::cuda::empty_cache();
  }
  if (json) std::fclose(json);
  return 0;
}
