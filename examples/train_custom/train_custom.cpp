// A small residual CNN of its own, trained on Fashion-MNIST with normcore's Trainer: on a GPU
// in bf16 with each step replayed as a CUDA graph, on the CPU in f32. Checkpoints resume.
//   train_custom DATA_DIR [STEPS] [CHECKPOINT]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "normcore/models.h"
#include "normcore/normcore.h"
#include "normcore/train.h"

namespace nc = normcore;

// conv-norm-relu-conv-norm, added to its input, then relu.
struct Residual : nc::nn::Module {
  std::shared_ptr<nc::nn::Conv2d> conv1, conv2;
  std::shared_ptr<nc::nn::GroupNorm> norm1, norm2;
  explicit Residual(int64_t channels) {
    conv1 = register_module("conv1", std::make_shared<nc::nn::Conv2d>(channels, channels, 3, 1, 1));
    norm1 = register_module("norm1", std::make_shared<nc::nn::GroupNorm>(4, channels));
    conv2 = register_module("conv2", std::make_shared<nc::nn::Conv2d>(channels, channels, 3, 1, 1));
    norm2 = register_module("norm2", std::make_shared<nc::nn::GroupNorm>(4, channels));
  }
  nc::Tensor forward(const nc::Tensor& x) override {
    const nc::Tensor h = nc::relu((*norm1)((*conv1)(x)));
    return nc::relu(nc::add(x, (*norm2)((*conv2)(h))));
  }
};

// [B, 1, 28, 28] -> stem (16 channels, 14 x 14) -> two residual blocks -> pooled -> 10 logits.
struct ResNetSmall : nc::nn::Module {
  std::shared_ptr<nc::nn::Sequential> body;
  std::shared_ptr<nc::nn::Linear> head;
  ResNetSmall() {
    body =
        register_module("body", std::make_shared<nc::nn::Sequential>(std::vector<std::shared_ptr<nc::nn::Module>>{
                                    std::make_shared<nc::nn::Conv2d>(1, 16, 3, 2, 1), std::make_shared<nc::nn::ReLU>(),
                                    std::make_shared<Residual>(16), std::make_shared<Residual>(16)}));
    head = register_module("head", std::make_shared<nc::nn::Linear>(16, 10));
  }
  nc::Tensor forward(const nc::Tensor& x) override {
    const nc::Tensor pooled = nc::adaptive_avg_pool2d((*body)(x), 1);
    return (*head)(pooled.reshape({pooled.size(0), 16}));
  }
};

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: train_custom DATA_DIR [STEPS] [CHECKPOINT]\n");
    return 2;
  }
  const auto train_set = std::make_shared<nc::data::TensorDataset>(nc::data::load_fashion_mnist(argv[1], true));
  const auto test_set = nc::data::load_fashion_mnist(argv[1], false).head(1000);
  const bool gpu = nc::cuda_is_available();

  nc::train::TrainerOptions options;
  options.device = gpu ? nc::Device::cuda() : nc::Device::cpu();
  options.precision = gpu ? "bf16" : "fp32";  // CUDA graphs: "auto", on for a GPU
  options.steps = argc > 2 ? std::atoll(argv[2]) : 2000;
  options.eval_interval = std::min<int64_t>(options.steps, 500);
  options.clip = 1.0;
  options.checkpoint = argc > 3 ? argv[3] : "train_custom.safetensors";
  options.model_name = "resnet-small";
  nc::train::Trainer trainer(
      std::make_shared<ResNetSmall>(),
      [](const nc::Tensor& logits, const nc::Tensor& labels) { return nc::cross_entropy(logits, labels); },
      nc::train::adamw({3e-3, 0.9, 0.999, 1e-8, 1e-4}), options);
  trainer.set_schedule(nc::train::cosine_schedule(options.steps / 10, 3e-5));
  trainer.set_evaluate([&](nc::nn::Module& model) -> std::vector<std::pair<std::string, double>> {
    return {{"accuracy", nc::models::evaluate(model, test_set, options.device).accuracy}};
  });
  trainer.on_evaluation([&](const nc::train::EvalInfo& e) {
    std::printf("step %lld: train loss %.4f, test accuracy %.1f%% (%.0f images/s%s)\n", static_cast<long long>(e.step),
                e.train_loss, 100 * e.results[0].second, e.rate, trainer.graphed() ? ", CUDA graph" : "");
  });
  nc::data::DataLoaderOptions loader;
  loader.batch_size = 128;
  loader.batch_transforms = {nc::data::transforms::normalize_batch()};
  trainer.fit(train_set, loader);
  std::printf("checkpoint: %s\n", options.checkpoint.c_str());
  return 0;
}
