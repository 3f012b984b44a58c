// Benchmark: one training epoch of a Fashion-MNIST classifier (the plain "mlp" by default,
// or any model of `normcore train`, e.g. cnn-gn, with its default optimizer, smoothing and
// clipping), then its test accuracy. Prints a table line and a JSON line;
// bench/mlp_epoch_torch.py runs the same model in PyTorch. --precision as `normcore train`'s:
// fp32 (the default), tf32, bf16 or fp16 (autocast; fp16 with a GradScaler). --cuda-graph
// on (the default on CUDA) replays each step as one CUDA graph (GraphedStep). Started by
// `normcore launch --nproc N` (WORLD_SIZE set) it trains data-parallel on cuda:LOCAL_RANK
// (DistributedDataParallel, each rank a 1/N share of every epoch, batch B per rank, no CUDA
// graph) and rank 0 reports the epoch of all ranks; bench/mlp_epoch_torch.py under torchrun
// is the PyTorch DDP peer.
//   mlp_epoch [--model NAME] [--device cpu|cuda] [--epochs N] [--data DIR] [--batch-size B] [--precision P]
//             [--cuda-graph on|off] [--loader batch|sample]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "normcore/data.h"
#include "normcore/distributed.h"
#include "normcore/models.h"
#include "normcore/normcore.h"

namespace nc = normcore;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void wait_for(nc::Device device) {
  if (device.is_cuda()) nc::cuda::synchronize(device.index);
}

}  // namespace

int main(int argc, char** argv) {
  std::string device_spec = "auto", data = "/usr/share/datasets/fashion-mnist", model_name = "mlp";
  std::string precision = "fp32", graph_option = "auto", loader_path = "batch";
  int64_t epochs = 1, batch_size = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--device")) device_spec = argv[i + 1];
    else if (!std::strcmp(argv[i], "--epochs")) epochs = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--data")) data = argv[i + 1];
    else if (!std::strcmp(argv[i], "--batch-size")) batch_size = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--model")) model_name = argv[i + 1];
    else if (!std::strcmp(argv[i], "--precision")) precision = argv[i + 1];
    else if (!std::strcmp(argv[i], "--cuda-graph")) graph_option = argv[i + 1];
    else if (!std::strcmp(argv[i], "--loader")) loader_path = argv[i + 1];
    else {
      std::fprintf(stderr,
                   "usage: %s [--model NAME] [--device cpu|cuda] [--epochs N] [--data DIR] [--batch-size B] "
                   "[--precision fp32|tf32|bf16|fp16] [--cuda-graph on|off] [--loader batch|sample]\n",
                   argv[0]);
      return 2;
    }
  }
  if (loader_path != "batch" && loader_path != "sample") {
    std::fprintf(stderr, "mlp_epoch: --loader must be batch or sample, got '%s'\n", loader_path.c_str());
    return 2;
  }
  const bool data_parallel = std::getenv("WORLD_SIZE") != nullptr;
  const nc::distributed::Env env = nc::distributed::Env::from_environment();
  nc::Device device = data_parallel ? nc::Device::cuda(env.local_rank)
                      : device_spec == "auto" ? nc::best_device() : nc::Device(device_spec);
  if (precision != "fp32" && precision != "tf32" && precision != "bf16" && precision != "fp16") {
    std::fprintf(stderr, "mlp_epoch: --precision must be fp32, tf32, bf16 or fp16, got '%s'\n", precision.c_str());
    return 2;
  }
  if (device.is_cuda()) nc::cuda::set_allow_tf32(precision == "tf32");
  const bool autocast = precision == "bf16" || precision == "fp16";
  const nc::DType lower = precision == "fp16" ? nc::DType::F16 : nc::DType::BF16;
  nc::optim::GradScaler scaler;
  nc::data::TensorDataset train = nc::data::load_fashion_mnist(data, true);
  nc::data::TensorDataset test = nc::data::load_fashion_mnist(data, false);

  nc::Generator gen(0);
  auto model = nc::models::make_classifier(model_name, &gen);
  model->to(device);
  std::unique_ptr<nc::distributed::ProcessGroup> group;
  std::unique_ptr<nc::distributed::DistributedDataParallel> ddp;
  if (data_parallel) {
    group = std::make_unique<nc::distributed::ProcessGroup>(env, device);
    ddp = std::make_unique<nc::distributed::DistributedDataParallel>(model, *group);
  }
  nc::optim::AdamW optimizer(model->parameters(), {1e-3, 0.9, 0.999, 1e-8, 1e-4});
  nc::data::DataLoaderOptions options;
  options.batch_size = batch_size;
  options.device = device;
  options.num_replicas = env.world_size;
  options.rank = env.rank;
  // batch: each batch gathered and normalized at once; sample: each sample got and
  // normalized on its own, then stacked (the same values).
  if (loader_path == "sample") options.transforms = {nc::data::transforms::normalize()};
  else options.batch_transforms = {nc::data::transforms::normalize_batch()};
  nc::data::DataLoader loader(train, options);

  const bool graphed = device.is_cuda() && graph_option != "off" && !data_parallel;
  nc::GraphedStep graph_step(
      [&](const std::vector<nc::Tensor>& in) {
        nc::Tensor loss;
        {
          nc::autocast::Guard guard(lower, autocast);
          loss = nc::cross_entropy(ddp ? (*ddp)(in[0]) : (*model)(in[0]), in[1], nc::Reduction::Mean, 0.1);
        }
        optimizer.zero_grad();
        if (precision != "fp16") {
          loss.backward();
          nc::optim::clip_grad_norm_async(optimizer.params(), 5.0);
          optimizer.step();
          return loss;
        }
        scaler.scale(loss).backward();
        scaler.unscale_async(optimizer.params());
        nc::optim::clip_grad_norm_async(optimizer.params(), 5.0);
        scaler.step(optimizer);
        scaler.update();
        return loss;
      },
      graphed);
  auto step = [&](const nc::data::Batch& batch) { graph_step({batch.inputs, batch.targets}); };

  // Warm-up: allocator cache, cuBLAS handles, the loader's thread.
  loader.begin_epoch(1000);
  nc::data::Batch batch;
  for (int i = 0; i < 20 && loader.next(batch); ++i) step(batch);
  wait_for(device);

  double best = 1e30;
  for (int64_t e = 0; e < epochs; ++e) {
    loader.begin_epoch(static_cast<uint64_t>(e));
    double start = now();
    while (loader.next(batch)) step(batch);
    wait_for(device);
    best = std::min(best, now() - start);
  }

  if (group) group->barrier();
  if (env.rank != 0) return 0;
  double accuracy = nc::models::evaluate(*model, test, device).accuracy;
  double rate = static_cast<double>(train.size()) / best;
  const std::string where = data_parallel ? std::to_string(env.world_size) + " GPU(s) (" + group->backend() + ")"
                                          : device.str();
  std::printf("normcore %s %s epoch on %s%s: %.3f s (%.0f samples/s), test accuracy %.2f%% after %lld epoch(s)\n",
              model_name.c_str(), precision.c_str(), where.c_str(),
              graphed ? " with a CUDA graph" : "", best, rate, 100 * accuracy, static_cast<long long>(epochs));
  if (graphed) {
    std::printf("graph: %zu nodes, %lld replays, %lld direct steps\n", graph_step.graph_nodes(),
                static_cast<long long>(graph_step.replays()), static_cast<long long>(graph_step.direct_steps()));
  }
  std::printf("{\"impl\": \"normcore\", \"model\": \"%s\", \"precision\": \"%s\", \"device\": \"%s\", "
              "\"cuda_graph\": %s, \"world_size\": %d, \"batch_size\": %lld, \"epoch_s\": %.4f, \"samples_per_s\": %.0f, \"test_accuracy\": %.4f, "
              "\"epochs\": %lld}\n",
              model_name.c_str(), precision.c_str(), device.str().c_str(), graphed ? "true" : "false",
              env.world_size, static_cast<long long>(batch_size), best, rate, accuracy,
              static_cast<long long>(epochs));
  return 0;
}
