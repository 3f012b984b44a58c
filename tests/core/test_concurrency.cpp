// One trained model shared by many threads: predictions made at once from 8 threads are
// those one thread makes, to the bit, on the CPU and on the GPU; separate models used by
// separate threads at once, for inference and for training. Also through the C API; and
// the DataLoader's worker threads.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "normcore/models.h"
#include "normcore/normcore.h"
#include "normcore/normcore_c.h"
#include "tests/test_support.h"

namespace nc = normcore;
using nc::Tensor;

namespace {

class Concurrency : public normcore_test::TempDirTest {
 protected:
  // A checkpoint of `model` with random weights (seeded), in eval mode.
  std::string checkpoint(const std::string& model, uint64_t seed) {
    nc::Generator gen(seed);
    auto m = nc::models::make_classifier(model, &gen);
    const std::string path = (dir_ / (model + std::to_string(seed) + ".safetensors")).string();
    nc::models::save_checkpoint(path, model, *m, 0, {}, {}, {});
    return path;
  }
};

// images [count, 784] in [0, 1].
Tensor images(int64_t count, uint64_t seed) {
  nc::Generator gen(seed);
  return nc::rand({count, 784}, {}, &gen);
}

// Each of `threads` threads makes `per_thread` one-image predictions, cycling through the
// images from its own starting point, and compares each with `expected` bitwise; returns
// the number of predictions that differ.
int64_t shared_predictions(const nc::models::Classifier& classifier, const Tensor& batch,
                           const std::vector<std::vector<float>>& expected, int threads, int per_thread) {
  std::atomic<int64_t> wrong{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      nc::autograd::NoGradGuard no_grad;  // per thread, as a serving thread would set it
      for (int k = 0; k < per_thread; ++k) {
        const int64_t i = (t * 7 + k) % batch.size(0);
        const Tensor p = classifier.probabilities(batch.select(0, i).reshape({1, 784}));
        if (p.to(nc::Device::cpu()).to_vector<float>() != expected[i]) ++wrong;
      }
    });
  }
  for (auto& thread : pool) thread.join();
  return wrong.load();
}

void shared_model_case(const std::string& path, nc::Device device, int per_thread) {
  const nc::models::Classifier classifier(path, device);
  const Tensor batch = images(32, 5);
  std::vector<std::vector<float>> expected;
  for (int64_t i = 0; i < batch.size(0); ++i) {
    expected.push_back(
        classifier.probabilities(batch.select(0, i).reshape({1, 784})).to(nc::Device::cpu()).to_vector<float>());
  }
  EXPECT_EQ(shared_predictions(classifier, batch, expected, 8, per_thread), 0) << path << " on " << device;
}

}  // namespace

TEST_F(Concurrency, EightThreadsShareOneMlpOnTheCpu) {
  shared_model_case(checkpoint("mlp-layernorm", 1), nc::Device::cpu(), 1000);
}

TEST_F(Concurrency, EightThreadsShareOneCnnOnTheCpu) {
  shared_model_case(checkpoint("cnn-gn", 2), nc::Device::cpu(), 100);
}

TEST_F(Concurrency, EightThreadsShareOneMlpOnTheGpu) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  shared_model_case(checkpoint("mlp-layernorm", 3), nc::Device::cuda(), 1000);
}

TEST_F(Concurrency, EightThreadsShareOneCnnOnTheGpu) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  shared_model_case(checkpoint("cnn-bn", 4), nc::Device::cuda(), 1000);
}

// Two threads with two models of their own, at once, agree with the same models run alone.
TEST_F(Concurrency, SeparateModelsInSeparateThreads) {
  const std::vector<std::string> paths = {checkpoint("mlp", 5), checkpoint("mlp-groupnorm", 6)};
  const Tensor batch = images(16, 7);
  std::vector<std::vector<float>> alone;
  for (const std::string& path : paths) {
    alone.push_back(nc::models::Classifier(path).probabilities(batch).to_vector<float>());
  }
  std::vector<std::vector<float>> together(paths.size());
  std::vector<std::thread> pool;
  for (size_t m = 0; m < paths.size(); ++m) {
    pool.emplace_back([&, m] {
      const nc::models::Classifier classifier(paths[m]);
      for (int round = 0; round < 50; ++round) together[m] = classifier.probabilities(batch).to_vector<float>();
    });
  }
  for (auto& thread : pool) thread.join();
  EXPECT_EQ(together, alone);
}

// Training in several threads at once, each its own model, optimizer and generator (dropout
// masks, initialization): every thread's weights after 20 AdamW steps with clipping are those
// of the same training run alone, to the bit. Gradient mode, the allocator, the op scope and
// the CPU thread pool are shared; the models share nothing.
std::vector<float> train_steps(const std::string& name, uint64_t seed, const Tensor& x, const Tensor& y) {
  nc::Generator gen(seed);
  auto model = nc::models::make_classifier(name, &gen);
  model->train();
  nc::optim::AdamW optimizer(model->parameters(), {1e-3, 0.9, 0.999, 1e-8, 1e-4});
  for (int step = 0; step < 20; ++step) {
    const Tensor loss = nc::cross_entropy((*model)(x), y, nc::Reduction::Mean, 0.1);
    optimizer.zero_grad();
    loss.backward();
    nc::optim::clip_grad_norm(optimizer.params(), 1.0);
    optimizer.step();
  }
  std::vector<float> weights;
  for (const Tensor& p : model->parameters()) {
    const std::vector<float> v = p.contiguous().to_vector<float>();
    weights.insert(weights.end(), v.begin(), v.end());
  }
  return weights;
}

TEST_F(Concurrency, SeparateTrainingInSeparateThreads) {
  const std::vector<std::string> names = {"mlp", "mlp-layernorm", "mlp", "mlp-groupnorm"};
  const Tensor x = images(32, 9);
  nc::Generator label_gen(10);
  const Tensor y = nc::randint(0, 10, {32}, {nc::DType::I64}, &label_gen);
  std::vector<std::vector<float>> alone;
  for (size_t m = 0; m < names.size(); ++m) alone.push_back(train_steps(names[m], 100 + m, x, y));
  std::vector<std::vector<float>> together(names.size());
  std::vector<std::thread> pool;
  for (size_t m = 0; m < names.size(); ++m) {
    pool.emplace_back([&, m] { together[m] = train_steps(names[m], 100 + m, x, y); });
  }
  for (auto& thread : pool) thread.join();
  for (size_t m = 0; m < names.size(); ++m) {
    ASSERT_EQ(together[m].size(), alone[m].size());
    EXPECT_TRUE(together[m] == alone[m]) << "model " << m << " (" << names[m] << ") trained differently in a thread";
  }
  EXPECT_NE(alone[0], alone[2]);  // the seeds matter: the comparison can fail
}

// The C API's per-thread error: a failure in one thread leaves another thread's message and
// the handles it uses alone.
TEST_F(Concurrency, CApiErrorsArePerThread) {
  const std::string path = checkpoint("mlp", 8);
  nc_classifier* classifier = nullptr;
  ASSERT_EQ(nc_classifier_load(path.c_str(), "cpu", &classifier), NC_OK);
  std::vector<float> pixels(784, 0.5f);
  std::atomic<int> bad{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < 4; ++t) {
    pool.emplace_back([&, t] {
      for (int k = 0; k < 100; ++k) {
        if (t % 2 == 0) {
          int64_t label = -1;
          if (nc_classifier_predict(classifier, pixels.data(), 1, &label, nullptr) != NC_OK || label < 0) ++bad;
          if (std::string(nc_last_error()) != "") ++bad;  // no failure on this thread
        } else {
          nc_classifier* none = nullptr;
          if (nc_classifier_load("/nonexistent/c.safetensors", "cpu", &none) != NC_ERROR_IO) ++bad;
          if (std::string(nc_last_error()).find("/nonexistent/c.safetensors") == std::string::npos) ++bad;
        }
      }
    });
  }
  for (auto& thread : pool) thread.join();
  nc_classifier_free(classifier);
  EXPECT_EQ(bad.load(), 0);
}

// The DataLoader's workers: four of them, transforms drawing random numbers, epochs
// abandoned half-way and loaders destroyed with workers busy, give the batches the loader
// makes on the calling thread alone (workers = 0), to the byte.
TEST(ConcurrencyData, FourWorkersGiveTheBatchesOfNone) {
  namespace data = nc::data;
  nc::Generator gen(3);
  const data::TensorDataset dataset(nc::randint(0, 256, {300, 1, 10, 10}, nc::DType::U8, &gen), nc::arange(300));
  const auto options = [](int workers) {
    data::DataLoaderOptions o;
    o.batch_size = 8;
    o.seed = 11;
    o.workers = workers;
    o.transforms = {data::transforms::random_crop(8, 8, 1), data::transforms::random_horizontal_flip(),
                    data::transforms::normalize()};
    return o;
  };
  const auto epoch = [](data::DataLoader& loader, uint64_t e, int64_t stop_after) {
    loader.begin_epoch(e);
    std::vector<std::vector<float>> batches;
    for (data::Batch batch;
         (stop_after < 0 || static_cast<int64_t>(batches.size()) < stop_after) && loader.next(batch);)
      batches.push_back(batch.inputs.to_vector<float>());
    return batches;
  };
  data::DataLoader none(dataset, options(0));
  data::DataLoader four(dataset, options(4));
  for (uint64_t e : {0, 1}) {
    EXPECT_EQ(epoch(four, e, 5).size(), 5u);  // abandoned with workers ahead
    EXPECT_EQ(epoch(four, e, -1), epoch(none, e, -1)) << "epoch " << e;
  }
  for (int k = 0; k < 4; ++k) {  // destroyed at once and after a few batches
    data::DataLoader loader(dataset, options(4));
    epoch(loader, static_cast<uint64_t>(k), k);
  }
}
