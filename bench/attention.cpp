// Benchmark: scaled_dot_product_attention on the GPU, forward and forward+backward, bf16 and
// f16, causal and not, at the transformer shapes of the performance targets (and smaller ones
// that place Auto's switch), on each CUDA engine in the same run: cuDNN's fused attention
// (cuda::set_attention_engine) and the native engine four times: with the Hopper kernels
// where they apply ("native", the backward's fast form), the same with the deterministic
// backward ("determ", cuda::set_deterministic), the forward's serial form ("serial") and the
// mma.sync kernels alone ("mma"). Times are CUDA-event medians after a warm-up (which builds cuDNN's plans); each
// row reports ms and TFLOP/s on the attention's matrix products (forward 4 * B * H * L * S *
// D, backward 2.5 times that, causal halved), the fraction of the dense bf16 tensor-core peak
// given with --peak (TFLOP/s), the kernels that ran the forward and the backward (wgmma,
// mma.sync or cudnn: a pass cuDNN does not take runs on the native kernels), and the
// peak of allocated device memory over the forward+backward runs; a last line per case says
// what Auto picks. One JSON line per case and engine with --json. Head dim 256 has a Hopper
// forward but no tensor-core backward (the row kernels run it, in f32): where a variant's
// backward runs on them, its forward+backward is timed over 3 runs.
//   attention [--filter SUBSTRING] [--reps N] [--peak TFLOPS] [--json FILE]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_timing.h"
#include "kernels/attention.h"
#include "normcore/normcore.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;

namespace {

struct Case {
  int64_t batch, heads, L, D;
};

// What a row times: an engine, and for the native one whether the Hopper kernels may run
// and whether the backward must be deterministic.
struct Variant {
  const char* name;
  nc::cuda::AttentionEngine engine;
  nc::kernels::HopperAttention hopper;
  bool deterministic = false;
};
// What ran the last pass: the native kernels by name (wgmma, mma.sync, simt), or "cudnn".
const char* ran(nc::cuda::AttentionPass pass) {
  const nc::cuda::AttentionEngine engine = nc::cuda::last_attention_engine(pass);
  return engine == nc::cuda::AttentionEngine::Native ? nc::kernels::last_native_attention_kernels(pass)
                                                     : nc::cuda::attention_engine_name(engine);
}

const Variant variants[] = {{"native", nc::cuda::AttentionEngine::Native, nc::kernels::HopperAttention::Pipelined},
                            {"determ", nc::cuda::AttentionEngine::Native, nc::kernels::HopperAttention::Pipelined,
                             true},
                            {"serial", nc::cuda::AttentionEngine::Native, nc::kernels::HopperAttention::Serial},
                            {"mma", nc::cuda::AttentionEngine::Native, nc::kernels::HopperAttention::Off},
                            {"cudnn", nc::cuda::AttentionEngine::Cudnn, nc::kernels::HopperAttention::Pipelined}};

}  // namespace

int main(int argc, char** argv) {
  std::string filter, json_path;
  int reps = 20;
  double peak = 989;  // H100 SXM dense bf16
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: attention [--filter SUBSTRING] [--reps N] [--peak TFLOPS] [--json FILE]\n");
      return 2;
    }
    const std::string value = argv[++i];
    if (arg == "--filter") filter = value;
    else if (arg == "--reps") reps = std::atoi(value.c_str());
    else if (arg == "--peak") peak = std::atof(value.c_str());
    else if (arg == "--json") json_path = value;
    else {
      std::fprintf(stderr, "attention: unknown option %s\n", arg.c_str());
      return 2;
    }
  }
  if (!nc::cuda_is_available()) {
    std::fprintf(stderr, "attention: needs a CUDA device\n");
    return 1;
  }
  FILE* json = json_path.empty() ? nullptr : std::fopen(json_path.c_str(), "w");
  const nc::Device gpu = nc::Device::cuda(0);
  const std::vector<Case> cases = {{8, 16, 2048, 64},  {4, 32, 4096, 128}, {16, 12, 1024, 64}, {16, 12, 512, 64},
                                   {32, 12, 256, 64},  {64, 12, 128, 64},  {8, 12, 64, 64},    {2, 4, 16, 64},
                                   {16, 12, 1024, 32}, {4, 16, 4096, 256}, {16, 8, 1024, 256}};
  std::printf("%-34s %-6s %9s %7s %6s %11s %7s %6s %9s  %s\n", "case", "engine", "fwd ms", "TFLOP/s", "peak",
              "fwd+bwd ms", "TFLOP/s", "peak", "mem MiB", "ran fwd/bwd");
  for (const Case& c : cases) {
    for (DType dtype : {DType::BF16, DType::F16}) {
      for (bool causal : {false, true}) {
        const std::string name = "sdpa_" + std::string(nc::dtype_name(dtype)) + "_" + std::to_string(c.batch) + "x" +
                                 std::to_string(c.heads) + "x" + std::to_string(c.L) + "x" + std::to_string(c.D) +
                                 (causal ? "_causal" : "");
        if (!filter.empty() && name.find(filter) == std::string::npos) continue;
        nc::Generator gen(1);
        const nc::Shape shape{c.batch, c.heads, c.L, c.D};
        const nc::TensorOptions options(dtype, gpu);
        Tensor q = nc::randn(shape, options, &gen), k = nc::randn(shape, options, &gen);
        Tensor v = nc::randn(shape, options, &gen), grad = nc::randn(shape, options, &gen);
        Tensor qg = q.detach().requires_grad_(), kg = k.detach().requires_grad_(), vg = v.detach().requires_grad_();
        auto forward = [&] { nc::scaled_dot_product_attention(q, k, v, causal); };
        auto forward_backward = [&] {
          qg.zero_grad();
          kg.zero_grad();
          vg.zero_grad();
          nc::scaled_dot_product_attention(qg, kg, vg, causal).backward(grad);
        };
        const double fwd_flops = 4.0 * static_cast<double>(c.batch * c.heads) * static_cast<double>(c.L) *
                                 static_cast<double>(c.L) * static_cast<double>(c.D) * (causal ? 0.5 : 1.0);
        for (const Variant& variant : variants) {
          nc::cuda::set_attention_engine(variant.engine);
          nc::kernels::set_hopper_attention(variant.hopper);
          nc::cuda::set_deterministic(variant.deterministic);
          const double fwd_ms = bench::median_ms(forward, reps);
          nc::cuda::reset_peak_memory_stats(0);
          forward_backward();
          const bool row_kernels = std::string(ran(nc::cuda::AttentionPass::Backward)) == "simt";
          const double fwd_bwd_ms = bench::median_ms(forward_backward, row_kernels ? 3 : reps);
          const double peak_mib = static_cast<double>(nc::cuda::memory_stats(0).peak_allocated) / (1 << 20);
          const char* ran_fwd = ran(nc::cuda::AttentionPass::Forward);
          const char* ran_bwd = ran(nc::cuda::AttentionPass::Backward);
          const double fwd_tflops = fwd_flops / (fwd_ms * 1e-3) / 1e12;
          const double fwd_bwd_tflops = 3.5 * fwd_flops / (fwd_bwd_ms * 1e-3) / 1e12;
          const char* engine_name = variant.name;
          std::printf("%-34s %-6s %9.3f %7.1f %5.0f%% %11.3f %7.1f %5.0f%% %9.0f  %s/%s\n", name.c_str(), engine_name,
                      fwd_ms, fwd_tflops, 100 * fwd_tflops / peak, fwd_bwd_ms, fwd_bwd_tflops,
                      100 * fwd_bwd_tflops / peak, peak_mib, ran_fwd, ran_bwd);
          std::fflush(stdout);
          if (json) {
            std::fprintf(json,
                         "{\"case\": \"%s\", \"impl\": \"normcore %s\", \"ran\": \"%s/%s\", \"fwd_ms\": %.4f, "
                         "\"fwd_bwd_ms\": %.4f, \"fwd_tflops\": %.1f, \"fwd_bwd_tflops\": %.1f, \"peak_mib\": %.0f}\n",
                         name.c_str(), engine_name, ran_fwd, ran_bwd, fwd_ms, fwd_bwd_ms, fwd_tflops, fwd_bwd_tflops,
                         peak_mib);
          }
        }
        nc::cuda::set_attention_engine(nc::cuda::AttentionEngine::Auto);
        nc::kernels::set_hopper_attention(nc::kernels::HopperAttention::Pipelined);
        nc::cuda::set_deterministic(false);
        forward_backward();
        const nc::cuda::AttentionEngine auto_backward =
            nc::cuda::last_attention_engine(nc::cuda::AttentionPass::Backward);
        std::printf("%-34s auto picks %s/%s\n", name.c_str(),
                    nc::cuda::attention_engine_name(nc::cuda::last_attention_engine()),
                    nc::cuda::attention_engine_name(auto_backward));
        nc::cuda::empty_cache();
      }
    }
  }
  if (json) std::fclose(json);
  return 0;
}
