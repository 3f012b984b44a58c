// Benchmark: inference of a Fashion-MNIST classifier (any model of `normcore train`, random
// weights, eval mode, under an inference-mode guard): the forward of a batch (throughput),
// and the latency of one image through models::Classifier, the path an application or the
// C API takes (normalization, forward, softmax, and on CUDA the copy back to the host).
// Prints a table line and a JSON line; bench/infer_torch.py is the PyTorch peer.
// --threads sets the CPU backend's threads (default: NORMCORE_NUM_THREADS or the cores).
//   infer [--model NAME] [--device cpu|cuda] [--batch B] [--reps N] [--threads T]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "normcore/models.h"
#include "normcore/normcore.h"

namespace nc = normcore;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_name = "cnn-bn", device_spec = "cpu";
  int64_t batch = 128;
  int reps = 20, threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) model_name = argv[i + 1];
    else if (!std::strcmp(argv[i], "--device")) device_spec = argv[i + 1];
    else if (!std::strcmp(argv[i], "--batch")) batch = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--model NAME] [--device cpu|cuda] [--batch B] [--reps N] [--threads T]\n",
                   argv[0]);
      return 2;
    }
  }
  if (argc % 2 == 0 || batch < 1 || reps < 1) {
    std::fprintf(stderr, "infer: options come in pairs; --batch and --reps must be positive\n");
    return 2;
  }
  if (threads > 0) nc::set_num_threads(threads);
  const nc::Device device(device_spec);
  auto sync = [&] {
    if (device.is_cuda()) nc::cuda::synchronize(device.index);
  };

  // A checkpoint of the model with random weights, loaded as an application would.
  nc::Generator gen(0);
  auto model = nc::models::make_classifier(model_name, &gen);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("normcore-infer-" + std::to_string(::getpid()) + ".safetensors"))
          .string();
  nc::models::save_checkpoint(path, model_name, *model, 0, {}, {}, {});
  const nc::models::Classifier classifier(path, device);
  std::filesystem::remove(path);
  model->to(device);
  model->eval();

  const nc::Tensor images = nc::rand({batch, 1, 28, 28}, {}, &gen).to(device);
  const nc::Tensor one = nc::rand({1, 1, 28, 28}, {}, &gen);  // on the host, as an application's

  // Batch forward, best of reps after warm-up.
  double best = 1e30;
  {
    nc::autograd::InferenceModeGuard inference;
    for (int i = 0; i < 3; ++i) (*model)(images);
    sync();
    for (int r = 0; r < reps; ++r) {
      const double start = now();
      (*model)(images);
      sync();
      best = std::min(best, now() - start);
    }
  }
  // One image through the classifier: the median of many.
  for (int i = 0; i < 20; ++i) classifier.probabilities(one).to(nc::Device::cpu());
  std::vector<double> latencies;
  for (int r = 0; r < std::max(reps * 10, 100); ++r) {
    const double start = now();
    const nc::Tensor p = classifier.probabilities(one).to(nc::Device::cpu());
    latencies.push_back(now() - start);
  }
  const double latency = median(latencies);
  const int used = device.is_cuda() ? 0 : nc::num_threads();
  std::printf("normcore %s inference on %s (%d CPU threads): batch %lld forward %.3f ms (%.0f images/s), "
              "one image %.1f us\n",
              model_name.c_str(), device.str().c_str(), used, static_cast<long long>(batch), best * 1e3,
              static_cast<double>(batch) / best, latency * 1e6);
  std::printf("{\"impl\": \"normcore\", \"model\": \"%s\", \"device\": \"%s\", \"threads\": %d, \"batch\": %lld, "
              "\"batch_forward_ms\": %.4f, \"images_per_s\": %.0f, \"one_image_us\": %.2f}\n",
              model_name.c_str(), device.str().c_str(), used, static_cast<long long>(batch), best * 1e3,
              static_cast<double>(batch) / best, latency * 1e6);
  return 0;
}
