// Benchmark: the Linear + GroupNorm + min + bias model (x [1024, 8192], Linear 8192 ->
// 8192, 512 groups) on the GPU against its own GEMM. For each matmul mode (float32,
// float32 with TF32 tensor cores, bfloat16) it times, forward and forward+backward:
// the GEMM alone (x @ weight^T), the model as a composition of ops, and the fused op
// gemm_group_norm_min_bias; each model time is also given as a multiple of the GEMM's.
// CUDA-event medians after warm-up. bench/gemm_gn_min_torch.py measures PyTorch the same way.
//   gemm_gn_min [--reps N] [--modes f32,tf32,bf16] [--json FILE]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_timing.h"
#include "normcore/normcore.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;

namespace {

constexpr int64_t kBatch = 1024, kFeatures = 8192, kGroups = 512;

struct Mode {
  std::string name;
  DType dtype;
  bool tf32;
};

struct Params {
  Tensor weight, linear_bias, gn_weight, gn_bias, bias;
  void zero_grad() {
    for (Tensor* p : {&weight, &linear_bias, &gn_weight, &gn_bias, &bias}) p->zero_grad();
  }
};

// PyTorch's initialization: Linear uniform on +-1/sqrt(in), GroupNorm ones and zeros, the
// added bias standard normal.
Params make_params(const nc::TensorOptions& on, nc::Generator& gen) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(kFeatures));
  auto uniform = [&](const nc::Shape& shape) { return (nc::rand(shape, on, &gen) - 0.5) * (2 * bound); };
  Params p{uniform({kFeatures, kFeatures}), uniform({kFeatures}), nc::ones({kFeatures}, on),
           nc::zeros({kFeatures}, on), nc::randn({1, kFeatures, 1, 1}, on, &gen)};
  for (Tensor* t : {&p.weight, &p.linear_bias, &p.gn_weight, &p.gn_bias, &p.bias}) t->requires_grad_();
  return p;
}

Tensor gemm(const Tensor& x, const Params& p) { return nc::matmul(x, p.weight.t()); }

Tensor composed(const Tensor& x, const Params& p) {
  Tensor y = nc::group_norm(nc::matmul(x, p.weight.t()) + p.linear_bias, kGroups, p.gn_weight, p.gn_bias);
  return nc::min(y, 1, /*keepdim=*/true).first + p.bias;
}

Tensor fused(const Tensor& x, const Params& p) {
  return nc::gemm_group_norm_min_bias(x, p.weight, p.linear_bias, p.gn_weight, p.gn_bias, p.bias, kGroups);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  std::string modes_arg = "f32,tf32,bf16", json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc || (arg != "--reps" && arg != "--modes" && arg != "--json")) {
      std::fprintf(stderr, "usage: gemm_gn_min [--reps N] [--modes f32,tf32,bf16] [--json FILE]\n");
      return 2;
    }
    const std::string value = argv[++i];
    if (arg == "--reps") reps = std::max(1, std::atoi(value.c_str()));
    else if (arg == "--modes") modes_arg = value;
    else json_path = value;
  }
  if (!nc::cuda_is_available()) {
    std::fprintf(stderr, "gemm_gn_min: needs a CUDA device\n");
    return 1;
  }
  std::vector<Mode> modes;
  for (const Mode& m : {Mode{"f32", DType::F32, false}, Mode{"tf32", DType::F32, true}, Mode{"bf16", DType::BF16, false}})
    if (("," + modes_arg + ",").find("," + m.name + ",") != std::string::npos) modes.push_back(m);
  if (modes.empty()) {
    std::fprintf(stderr, "gemm_gn_min: --modes names none of f32, tf32, bf16: %s\n", modes_arg.c_str());
    return 2;
  }
  FILE* json = json_path.empty() ? nullptr : std::fopen(json_path.c_str(), "w");

  std::printf("Linear(%lld, %lld) + GroupNorm(%lld) + min + bias, x [%lld, %lld]; CUDA-event medians of %d\n",
              static_cast<long long>(kFeatures), static_cast<long long>(kFeatures), static_cast<long long>(kGroups),
              static_cast<long long>(kBatch), static_cast<long long>(kFeatures), reps);
  std::printf("%-5s %-10s %9s %8s %12s %8s\n", "mode", "what", "fwd ms", "x gemm", "fwd+bwd ms", "x gemm");
  using Model = Tensor (*)(const Tensor&, const Params&);
  const std::pair<const char*, Model> models[] = {{"gemm", gemm}, {"composed", composed}, {"fused", fused}};
  for (const Mode& mode : modes) {
    nc::cuda::set_allow_tf32(mode.tf32);
    nc::Generator gen(0);
    const nc::TensorOptions on(mode.dtype, nc::Device::cuda(0));
    Tensor x = nc::randn({kBatch, kFeatures}, on, &gen).requires_grad_();
    Params p = make_params(on, gen);
    double gemm_fwd = 0, gemm_step = 0;
    for (const auto& [what, model] : models) {
      const double fwd = bench::median_ms(
          [&, model = model] {
            nc::autograd::NoGradGuard no_grad;
            model(x, p);
          },
          reps);
      Tensor grad_out;
      {
        nc::autograd::NoGradGuard no_grad;
        grad_out = nc::randn(model(x, p).shape(), on, &gen);
      }
      const double step = bench::median_ms(
          [&, model = model] {
            x.zero_grad();
            p.zero_grad();
            model(x, p).backward(grad_out);
          },
          reps);
      if (model == gemm) gemm_fwd = fwd, gemm_step = step;
      std::printf("%-5s %-10s %9.4f %7.3fx %12.4f %7.3fx\n", mode.name.c_str(), what, fwd, fwd / gemm_fwd, step,
                  step / gemm_step);
      std::fflush(stdout);
      if (json)
        std::fprintf(json,
                     "{\"case\": \"gemm_gn_min_1024x8192x8192\", \"mode\": \"%s\", \"what\": \"%s\", \"fwd_ms\": %.5f, "
                     "\"fwd_bwd_ms\": %.5f, \"fwd_vs_gemm\": %.4f, \"fwd_bwd_vs_gemm\": %.4f}\n",
                     mode.name.c_str(), what, fwd, step, fwd / gemm_fwd, step / gemm_step);
    }
  }
  nc::cuda::set_allow_tf32(false);
  if (json) std::fclose(json);
  return 0;
}
