// KernelBench Gemm_GroupNorm_Min_BiasAdd: x [1024, 8192] -> Linear(8192, 8192) ->
// GroupNorm(512 groups) -> min over dim 1 (keepdim) -> + bias [1, 8192, 1, 1], giving
// [1, 8192, 1024, 1] (--features N makes the Linear N -> N, N a multiple of 512). Timed as
// the composition of ops ("forward") and as the fused op gemm_group_norm_min_bias
// ("fused"); both are checked on the first eight rows of x against the composition in
// float64 on the CPU, except rows whose min is a near tie at the dtype's precision. The
// GEMM alone (x @ weight^T) is timed first as the yardstick: the model is GEMM-bound, so
// the rest should add little to it. --tf32 on runs the float32 GEMMs on TF32 tensor cores.
#include "common.h"

#include <memory>

namespace kb = kernelbench;
namespace nc = normcore;
using kb::Tensor;

namespace {

constexpr int64_t kFeatures = 8192;
constexpr int64_t kGroups = 512;
constexpr int64_t kRows = 8;  // rows of x checked against the reference

// params: linear weight [out, in], linear bias [out], group norm weight and bias [out],
// bias [1, out, 1, 1].
Tensor composed(const Tensor& x, const std::vector<Tensor>& p) {
  Tensor y = nc::matmul(x, p[0].t()) + p[1];
  y = nc::group_norm(y, kGroups, p[2], p[3]);
  return nc::min(y, 1, /*keepdim=*/true).first + p[4];
}

Tensor gemm_alone(const Tensor& x, const std::vector<Tensor>& p) { return nc::matmul(x, p[0].t()); }

Tensor fused(const Tensor& x, const std::vector<Tensor>& p) {
  return nc::gemm_group_norm_min_bias(x, p[0], p[1], p[2], p[3], p[4], kGroups);
}

// PyTorch's initialization: Linear uniform on +-1/sqrt(in), GroupNorm ones and zeros, the
// added bias standard normal.
std::vector<Tensor> make_params(const kb::Options& o, nc::Generator& gen) {
  const int64_t features = o.features > 0 ? o.features : kFeatures;
  if (features % kGroups != 0)
    throw nc::ValueError("--features must be a multiple of " + std::to_string(kGroups) + ", got " +
                         std::to_string(features));
  const nc::TensorOptions on_device(o.dtype, o.device);
  const double bound = 1.0 / std::sqrt(static_cast<double>(features));
  auto uniform = [&](const nc::Shape& shape) { return ((nc::rand(shape, on_device, &gen) - 0.5) * (2 * bound)); };
  std::vector<Tensor> p = {uniform({features, features}), uniform({features}), nc::ones({features}, on_device),
                           nc::zeros({features}, on_device), nc::randn({1, features, 1, 1}, on_device, &gen)};
  for (Tensor& t : p) t.requires_grad_();
  return p;
}

// TF32 matmuls (on CUDA) keep 11 significant bits of their float32 inputs.
double unit_roundoff(nc::DType dtype, bool tf32) {
  if (tf32 && dtype == nc::DType::F32) return std::ldexp(1.0, -11);
  switch (dtype) {
    case nc::DType::F16: return std::ldexp(1.0, -11);
    case nc::DType::BF16: return std::ldexp(1.0, -8);
    default: return std::ldexp(1.0, -24);
  }
}

// Whether the two smallest group-normalized values of each reference row lie further apart
// than a few roundings of the dtype (unit roundoff u): then the device takes the min, and
// its gradient, at the same column as the reference.
std::vector<bool> clear_minimum(const Tensor& x_ref, const std::vector<Tensor>& p_ref, double u) {
  nc::autograd::NoGradGuard no_grad;
  const Tensor z = nc::group_norm(nc::matmul(x_ref, p_ref[0].t()) + p_ref[1], kGroups, p_ref[2], p_ref[3]);
  const std::vector<double> v = z.to_vector<double>();
  std::vector<bool> clear;
  for (int64_t b = 0; b < z.size(0); ++b) {
    const int64_t features = z.size(1);
    std::vector<double> row(v.begin() + b * features, v.begin() + (b + 1) * features);
    std::partial_sort(row.begin(), row.begin() + 2, row.end());
    clear.push_back(row[1] - row[0] > 8 * u * std::max(std::fabs(row[0]), 1.0));
  }
  return clear;
}

// The float64 reference on the first kRows rows; both forwards see the same inputs, so it
// is computed once (the parameters' float64 copy alone is 512 MB).
struct Reference {
  Tensor out, grad_x;
  std::vector<bool> clear;  // per row: see clear_minimum
};

Reference make_reference(const kb::Run& run) {
  const std::vector<Tensor> p_ref = kb::to_reference(run.params);
  Tensor x_ref = kb::slice_f64(run.x, 0, kRows).requires_grad_();
  Tensor out_ref = composed(x_ref, p_ref);
  out_ref.backward(kb::slice_f64(run.grad_out, 2, kRows));
  return {out_ref.detach(), x_ref.grad(),
          clear_minimum(x_ref.detach(), p_ref,
                        unit_roundoff(run.x.dtype(), run.x.device().is_cuda() && nc::cuda::allow_tf32()))};
}

kb::Check make_check() {
  return [reference = std::make_shared<Reference>()](const kb::Run& run, kb::Checker& checker) {
    if (!reference->out.defined()) *reference = make_reference(run);
    checker.compare(run.label + " out", kb::slice_f64(run.out, 2, kRows), reference->out);
    for (int64_t b = 0; b < reference->grad_x.size(0); ++b) {
      const std::string what = run.label + " grad_x[" + std::to_string(b) + "]";
      if (reference->clear[b]) {
        checker.compare(what, kb::slice_f64(run.grad_x.narrow(0, b, 1), 0, 1), reference->grad_x.narrow(0, b, 1));
      } else {
        std::printf("  check %s skipped: the row's two smallest values are a near tie\n", what.c_str());
      }
    }
  };
}

}  // namespace

int main(int argc, char** argv) {
  return kb::run(argc, argv,
                 {"kernelbench_gemm_gn_min",
                  "Linear(8192, 8192) -> GroupNorm(512) -> min(dim 1) -> + bias on x [1024, 8192]",
                  {1024, kFeatures},
                  make_params,
                  composed,
                  make_check(),
                  {{"fused", fused}},
                  /*feature_dim=*/1,
                  {"gemm alone", gemm_alone}});
}
