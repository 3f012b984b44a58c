// Benchmark: a torchvision ResNet (models::resnet, random weights, eval mode, inference mode)
// on the GPU: the forward of a batch of 224 x 224 color images at each batch size (1: the
// latency an application sees; 64: throughput), in TF32 (f32 weights and images, TF32
// tensor cores) and in bf16 and f16 (weights and images converted), each run eagerly and
// as a CUDA graph replay (cuda::Graph), as the module and in its inference form
// (models::fuse_resnet: BatchNorm folded, epilogues fused) in NCHW and NHWC. CUDA-event
// medians of --reps after warm-up. One
// table line and one JSON line per row; bench/resnet_infer_torch.py times torchvision's
// model in the same precisions, eager and under torch.compile.
//   resnet_infer [--model resnet50] [--batch 1,64] [--reps N]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_timing.h"
#include "normcore/models.h"
#include "normcore/normcore.h"

namespace nc = normcore;

int main(int argc, char** argv) {
  std::string model_name = "resnet50", batches = "1,64";
  int reps = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) model_name = argv[i + 1];
    else if (!std::strcmp(argv[i], "--batch")) batches = argv[i + 1];
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--model resnet18|resnet34|resnet50|resnet101] [--batch B,B...] [--reps N]\n",
                   argv[0]);
      return 2;
    }
  }
  if (argc % 2 == 0 || reps < 1) {
    std::fprintf(stderr, "resnet_infer: options come in pairs; --reps must be positive\n");
    return 2;
  }
  if (!nc::cuda_is_available()) {
    std::fprintf(stderr, "resnet_infer: needs a CUDA device\n");
    return 1;
  }
  const nc::Device gpu = nc::Device::cuda(0);
  nc::cuda::set_allow_tf32(true);
  nc::autograd::InferenceModeGuard inference;
  std::printf("%-10s %-5s %6s %-10s %-6s %10s %12s\n", "model", "dtype", "batch", "form", "mode", "ms", "images/s");
  const struct {
    const char* name;
    nc::DType dtype;
  } precisions[] = {{"tf32", nc::DType::F32}, {"bf16", nc::DType::BF16}, {"f16", nc::DType::F16}};
  for (const auto& precision : precisions) {
    nc::Generator gen(0);
    auto model = nc::models::resnet(model_name, 1000, &gen);
    model->to(gpu);
    model->to(precision.dtype);
    model->eval();
    // The module as built, and its inference form (fuse_resnet) in both layouts.
    const std::pair<const char*, std::shared_ptr<nc::nn::Module>> forms[] = {
        {"module", model},
        {"fused-nchw", nc::models::fuse_resnet(*model, nc::ConvLayout::NCHW)},
        {"fused-nhwc", nc::models::fuse_resnet(*model, nc::ConvLayout::NHWC)}};
    std::stringstream list(batches);
    for (std::string item; std::getline(list, item, ',');) {
      const int64_t batch = std::atoll(item.c_str());
      if (batch < 1) {
        std::fprintf(stderr, "resnet_infer: --batch takes positive sizes, got '%s'\n", item.c_str());
        return 2;
      }
      const nc::Tensor images = nc::randn({batch, 3, 224, 224}, {}, &gen).to(gpu).to(precision.dtype);
      nc::Tensor reference;
      for (const auto& [form, net] : forms) {
        nc::Tensor logits;
        const auto forward = [&, net = net] { logits = (*net)(images); };
        const double eager = bench::median_ms(forward, reps);
        nc::cuda::Graph graph;
        graph.capture(0, forward);
        const double graphed = bench::median_ms([&] { graph.replay(); }, reps);
        // The fused forms' logits against the module's (a check that the timed work is the same).
        // Random weights without trained statistics may overflow 16-bit logits: then the
        // count of non-finite ones is printed instead.
        const nc::Tensor got = logits.to(nc::Device::cpu(), nc::DType::F64);
        if (!reference.defined()) reference = got;
        int64_t overflow = 0;
        for (double v : got.to_vector<double>()) overflow += std::isfinite(v) ? 0 : 1;
        const double difference = nc::max(nc::abs(nc::sub(got, reference))).item<double>() /
                                  (1 + nc::max(nc::abs(reference)).item<double>());
        char check[96];
        if (overflow > 0) std::snprintf(check, sizeof(check), "%lld logits not finite", static_cast<long long>(overflow));
        else std::snprintf(check, sizeof(check), "logits vs module %.1e", difference);
        for (const auto& [mode, ms] : {std::pair<const char*, double>{"eager", eager}, {"graph", graphed}}) {
          const double rate = static_cast<double>(batch) / (ms * 1e-3);
          std::printf("%-10s %-5s %6lld %-10s %-6s %10.3f %12.0f   %s\n", model_name.c_str(), precision.name,
                      static_cast<long long>(batch), form, mode, ms, rate, check);
          std::printf("{\"impl\": \"normcore\", \"model\": \"%s\", \"dtype\": \"%s\", \"batch\": %lld, "
                      "\"form\": \"%s\", \"mode\": \"%s\", \"ms\": %.4f, \"images_per_s\": %.0f}\n",
                      model_name.c_str(), precision.name, static_cast<long long>(batch), form, mode, ms, rate);
        }
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
