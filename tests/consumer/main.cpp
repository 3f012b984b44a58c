// Built against the installed package: trains a small classifier for a few steps on
// synthetic images, saves a checkpoint, loads it back as a Classifier and checks that its
// predictions are those of the trained model. Prints PASS and exits 0, or says what differs.
#include <cstdio>
#include <string>

#include "normcore/models.h"
#include "normcore/normcore.h"

namespace nc = normcore;

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "consumer.safetensors";
  try {
    nc::Generator gen(7);
    auto model = nc::models::make_classifier("mlp-layernorm", &gen);
    nc::optim::AdamW optimizer(model->parameters());
    const nc::Tensor images = nc::rand({32, 1, 28, 28}, {}, &gen);
    const nc::Tensor labels = nc::randint(0, 10, {32}, {}, &gen);
    double first = 0, last = 0;
    for (int step = 0; step < 20; ++step) {
      optimizer.zero_grad();
      nc::Tensor loss = nc::cross_entropy((*model)(images), labels);
      loss.backward();
      optimizer.step();
      (step == 0 ? first : last) = loss.item<double>();
    }
    std::printf("loss %.4f -> %.4f\n", first, last);
    if (!(last < first)) {
      std::printf("FAIL: the loss did not fall\n");
      return 1;
    }
    model->eval();
    nc::models::save_checkpoint(path, "mlp-layernorm", *model, 1, {}, {}, {{"mean", "0"}, {"std", "1"}});
    const nc::models::Classifier classifier(path);
    nc::autograd::NoGradGuard no_grad;
    const nc::Tensor expected = nc::argmax((*model)(images), 1);
    for (int64_t i = 0; i < 8; ++i) {
      const int64_t want = expected.select(0, i).item<int64_t>();
      const auto got = classifier.predict(images.select(0, i));
      if (got.label != want) {
        std::printf("FAIL: image %lld: the loaded model says %lld, the trained one %lld\n", static_cast<long long>(i),
                    static_cast<long long>(got.label), static_cast<long long>(want));
        return 1;
      }
    }
    std::printf("PASS: trained, saved, loaded and predicted 8 images alike\n");
    return 0;
  } catch (const nc::Error& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}
