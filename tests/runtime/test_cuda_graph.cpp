// CUDA graphs (cuda::Graph, GraphedStep): graphed training steps give the parameters, losses
// and generator positions of the same steps run directly, bit for bit (the MLP with dropout,
// the CNN with batch norm, a small GPT); what a capture cannot record throws CaptureError and
// leaves the device usable; an index out of range in a replay is reported once; a graph's memory
// is not handed to other work and returns to the cache when the graph goes. The CUDA tests
// skip without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "normcore/models.h"
#include "normcore/normcore.h"
#include "tests/test_support.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;
using normcore_test::throws;

namespace {

#define REQUIRE_CUDA() \
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device"

const nc::Device kCuda = nc::Device::cuda(0);

std::vector<float> host(const Tensor& t) { return t.to(nc::Device::cpu()).contiguous().to_vector<float>(); }

struct Outcome {
  std::vector<std::vector<float>> params;
  std::vector<double> losses;
  uint64_t generator_offset = 0;
  int64_t replays = 0;
};

// A training step: the loss, backward, clipping to norm 1, the optimizer's update.
nc::GraphedStep::Step training_step(std::function<Tensor(const std::vector<Tensor>&)> loss_of,
                                    nc::optim::Optimizer& optimizer) {
  return [loss_of, &optimizer](const std::vector<Tensor>& in) {
    Tensor loss = loss_of(in);
    optimizer.zero_grad();
    loss.backward();
    nc::optim::clip_grad_norm_async(optimizer.params(), 1.0);
    optimizer.step();
    return loss;
  };
}

// `steps` AdamW steps with clipping and a cosine schedule (so the learning rate changes
// every step) on fixed random batches; the last batch is half the size (a direct step after
// the graph's replays).
Outcome train_classifier(const std::string& model_name, bool graphed, int64_t steps) {
  nc::Generator gen(7);
  auto model = nc::models::make_classifier(model_name, &gen);
  model->to(kCuda);
  model->train();
  nc::optim::AdamW optimizer(model->parameters(), {2e-3, 0.9, 0.999, 1e-8, 1e-4});
  nc::optim::CosineLR schedule(optimizer, 2, steps, 1e-4);
  nc::GraphedStep step(training_step(
                           [&](const std::vector<Tensor>& in) {
                             return nc::cross_entropy((*model)(in[0]), in[1], nc::Reduction::Mean, 0.1);
                           },
                           optimizer),
                       graphed);
  Outcome out;
  nc::Generator data(11);
  for (int64_t i = 0; i < steps; ++i) {
    const int64_t batch = i + 1 == steps ? 16 : 32;
    const Tensor images = nc::randn({batch, 1, 28, 28}, DType::F32, &data).to(kCuda);
    const Tensor labels = nc::randint(0, 10, {batch}, DType::I64, &data).to(kCuda);
    out.losses.push_back(step({images, labels}).item<double>());
    schedule.step();
  }
  for (const Tensor& p : model->parameters()) out.params.push_back(host(p));
  out.generator_offset = gen.offset();
  out.replays = step.replays();
  return out;
}

void expect_same(const Outcome& graphed, const Outcome& direct) {
  ASSERT_EQ(graphed.params.size(), direct.params.size());
  for (size_t i = 0; i < direct.params.size(); ++i) {
    ASSERT_EQ(graphed.params[i].size(), direct.params[i].size());
    size_t differing = 0;
    for (size_t k = 0; k < direct.params[i].size(); ++k) differing += graphed.params[i][k] != direct.params[i][k];
    EXPECT_EQ(differing, 0u) << "parameter " << i;
  }
  EXPECT_EQ(graphed.losses, direct.losses);
  EXPECT_EQ(graphed.generator_offset, direct.generator_offset);
}

TEST(CudaGraph, GraphedMlpStepsMatchDirectStepsBitForBit) {
  REQUIRE_CUDA();
  const Outcome direct = train_classifier("mlp", false, 8);
  const Outcome graphed = train_classifier("mlp", true, 8);
  EXPECT_EQ(direct.replays, 0);
  EXPECT_EQ(graphed.replays, 5);  // 2 warm-up steps, 5 replays, the smaller last batch direct
  expect_same(graphed, direct);
}

TEST(CudaGraph, GraphedCnnWithBatchNormMatchesDirectSteps) {
  REQUIRE_CUDA();
  const Outcome direct = train_classifier("cnn-bn", false, 6);
  const Outcome graphed = train_classifier("cnn-bn", true, 6);
  EXPECT_EQ(graphed.replays, 3);
  expect_same(graphed, direct);
}

// f16 with the loss scaler from 2^24: its first steps overflow and are skipped on the
// device, inside the replays as in the direct run.
TEST(CudaGraph, GraphedF16StepsWithLossScalingMatchDirectSteps) {
  REQUIRE_CUDA();
  auto run = [](bool graphed) {
    nc::Generator gen(9);
    auto model = nc::models::make_classifier("mlp-layernorm", &gen);
    model->to(kCuda);
    model->train();
    nc::optim::AdamW optimizer(model->parameters(), {1e-3, 0.9, 0.999, 1e-8, 1e-4});
    nc::optim::GradScaler scaler(nc::optim::GradScalerOptions{std::ldexp(1.0, 24), 2.0, 0.5, 3});
    nc::GraphedStep step(
        [&](const std::vector<Tensor>& in) {
          Tensor loss;
          {
            nc::autocast::Guard guard(DType::F16);
            loss = nc::cross_entropy((*model)(in[0]), in[1]);
          }
          optimizer.zero_grad();
          scaler.scale(loss).backward();
          scaler.unscale_async(optimizer.params());
          nc::optim::clip_grad_norm_async(optimizer.params(), 1.0);
          scaler.step(optimizer);
          scaler.update();
          return loss;
        },
        graphed);
    Outcome out;
    nc::Generator data(13);
    for (int i = 0; i < 12; ++i) {
      const Tensor images = nc::randn({32, 1, 28, 28}, DType::F32, &data).to(kCuda);
      const Tensor labels = nc::randint(0, 10, {32}, DType::I64, &data).to(kCuda);
      out.losses.push_back(step({images, labels}).item<double>());
    }
    for (const Tensor& p : model->parameters()) out.params.push_back(host(p));
    out.generator_offset = gen.offset();
    out.replays = step.replays();
    out.losses.push_back(scaler.get_scale());
    out.losses.push_back(static_cast<double>(scaler.skipped_steps()));
    return out;
  };
  const Outcome direct = run(false), graphed = run(true);
  EXPECT_EQ(graphed.replays, 10);
  EXPECT_GE(direct.losses.back(), 1.0);  // some steps were skipped
  expect_same(graphed, direct);
}

TEST(CudaGraph, GraphedGptStepsMatchDirectSteps) {
  REQUIRE_CUDA();
  auto run = [](bool graphed) {
    nc::Generator gen(3);
    nc::models::GPTConfig config;
    config.layers = 2;
    config.heads = 2;
    config.embed = 32;
    config.context = 16;
    config.dropout = 0.1;
    nc::models::GPT model(config, &gen);
    model.to(kCuda);
    model.train();
    nc::optim::AdamW optimizer(model.parameters(), {1e-3, 0.9, 0.95, 1e-8, 0.1});
    nc::GraphedStep step(
        training_step([&](const std::vector<Tensor>& in) { return nc::models::lm_loss(model, in[0], in[1]); },
                      optimizer),
        graphed);
    Outcome out;
    nc::Generator data(5);
    for (int i = 0; i < 6; ++i) {
      const Tensor tokens = nc::randint(0, 256, {4, 17}, DType::I64, &data).to(kCuda);
      out.losses.push_back(
          step({tokens.narrow(1, 0, 16).contiguous(), tokens.narrow(1, 1, 16).contiguous()}).item<double>());
    }
    for (const Tensor& p : model.parameters()) out.params.push_back(host(p));
    out.generator_offset = gen.offset();
    out.replays = step.replays();
    return out;
  };
  const Outcome direct = run(false), graphed = run(true);
  EXPECT_EQ(graphed.replays, 4);
  expect_same(graphed, direct);
}

TEST(CudaGraph, ReplaysFollowInputsAndKeepTheirMemoryToThemselves) {
  REQUIRE_CUDA();
  Tensor x = nc::zeros({1000}, nc::TensorOptions(DType::F32, kCuda));
  Tensor y;
  nc::cuda::Graph graph;
  EXPECT_FALSE(graph.captured());
  graph.capture(0, [&] { y = nc::add(nc::mul(x, 2.0), 1.0); });
  EXPECT_TRUE(graph.captured());
  EXPECT_GE(graph.num_nodes(), 1u);
  // Tensors made outside the graph after the capture get none of its memory.
  std::vector<Tensor> others;
  for (int i = 0; i < 8; ++i) others.push_back(nc::full({1000}, 7.0f, nc::TensorOptions(DType::F32, kCuda)));
  for (float v : {1.0f, -3.0f}) {
    x.fill_(v);
    graph.replay();
    graph.synchronize();
    for (float got : host(y)) ASSERT_EQ(got, 2 * v + 1);
  }
  for (const Tensor& t : others)
    for (float got : host(t)) ASSERT_EQ(got, 7.0f);
}

TEST(CudaGraph, AGraphsMemoryReturnsToTheCacheWhenItGoes) {
  REQUIRE_CUDA();
  Tensor x = nc::ones({1 << 16}, nc::TensorOptions(DType::F32, kCuda));
  uint64_t mallocs_after_first = 0;
  for (int round = 0; round < 4; ++round) {
    {
      nc::cuda::Graph graph;
      Tensor y;
      graph.capture(0, [&] { y = nc::exp(nc::mul(x, 0.5)); });
      graph.replay();
      graph.synchronize();
      EXPECT_FLOAT_EQ(host(y)[5], std::exp(0.5f));
    }
    if (round == 0) mallocs_after_first = nc::cuda::memory_stats(0).num_device_mallocs;
  }
  EXPECT_EQ(nc::cuda::memory_stats(0).num_device_mallocs, mallocs_after_first);
}

// An index out of range in a replay is raised once, by the next replay() (when the bad one
// has finished) or synchronize(); replays with good indices after it are valid.
TEST(CudaGraph, AnIndexOutOfRangeInAReplayIsReportedOnce) {
  REQUIRE_CUDA();
  const Tensor weight = nc::randn({10, 4}).to(kCuda);
  Tensor index = nc::zeros({3}, nc::TensorOptions(DType::I64, kCuda));
  Tensor rows;
  nc::cuda::Graph graph;
  graph.capture(0, [&] { rows = nc::index_select(weight, 0, index); });
  graph.replay();
  graph.synchronize();
  index.fill_(12);
  graph.replay();
  throws<nc::IndexError>([&] { graph.synchronize(); }, {"index_select", "index 12", "size 10", "replay"})();
  EXPECT_NO_THROW(graph.synchronize());
  index.fill_(3);
  graph.replay();
  graph.synchronize();
  const std::vector<float> row = host(weight.narrow(0, 3, 1));
  const std::vector<float> got = host(rows);
  for (size_t k = 0; k < got.size(); ++k) EXPECT_EQ(got[k], row[k % row.size()]);
  index.fill_(-1);
  graph.replay();
  int raised = 0;
  for (int i = 0; i < 2; ++i) {
    try {
      i == 0 ? graph.replay() : graph.synchronize();
    } catch (const nc::IndexError& e) {
      EXPECT_NE(std::string(e.what()).find("index -1"), std::string::npos) << e.what();
      ++raised;
    }
  }
  EXPECT_EQ(raised, 1);
}

TEST(CudaGraph, WorkACaptureCannotRecordThrowsCaptureError) {
  REQUIRE_CUDA();
  const Tensor x = nc::ones({4}, nc::TensorOptions(DType::F32, kCuda));
  const char* inside = "cannot run inside a CUDA graph capture";
  {
    nc::cuda::Graph graph;
    throws<nc::CaptureError>([&] { graph.replay(); }, {"nothing has been captured"})();
    throws<nc::CaptureError>([&] { graph.capture(0, [&] { nc::sum(x).item<float>(); }); },
                             {inside, "reads device memory on the host"})();
    EXPECT_FALSE(graph.captured());
    throws<nc::CaptureError>([&] { graph.capture(0, [&] { nc::ones({4}).to(kCuda); }); }, {inside, "host memory"})();
    throws<nc::CaptureError>([&] { graph.capture(0, [&] { nc::rand({4}, nc::TensorOptions(DType::F32, kCuda)); }); },
                             {"rand", inside})();
    throws<nc::CaptureError>([&] { graph.capture(0, [&] { nc::cuda::synchronize(0); }); },
                             {"cuda::synchronize", inside})();
  }
  // An optimizer's first step and a learning-rate change.
  Tensor w = nc::ones({4}, nc::TensorOptions(DType::F32, kCuda));
  w.requires_grad_(true);
  nc::optim::Adam adam({w}, {});
  w.set_grad(nc::ones({4}, nc::TensorOptions(DType::F32, kCuda)));
  {
    nc::cuda::Graph graph;
    throws<nc::CaptureError>([&] { graph.capture(0, [&] { adam.step(); }); }, {"Adam.step", "no optimizer state"})();
  }
  adam.step();
  {
    nc::cuda::Graph graph;
    throws<nc::CaptureError>([&] { graph.capture(0, [&] { adam.set_lr(0.5); }); }, {"set_lr", "between replays"})();
    graph.capture(0, [&] { adam.step(); });  // with state, a step is capturable
    adam.set_lr(0.0);                        // and follows the learning rate set since
    const std::vector<float> before = host(w);
    graph.replay();
    graph.synchronize();
    EXPECT_EQ(host(w), before);
  }
  // The device works as before after the failed captures.
  EXPECT_EQ(host(nc::add(x, 1.0)), std::vector<float>(4, 2.0f));
  nc::cuda::synchronize(0);
}

TEST(CudaGraph, AStepThatCannotBeCapturedRunsDirectlyAfterTheError) {
  REQUIRE_CUDA();
  const Tensor x = nc::ones({4}, nc::TensorOptions(DType::F32, kCuda));
  int calls = 0;
  nc::GraphedStep step([&](const std::vector<Tensor>& in) {
    ++calls;
    const float total = nc::sum(in[0]).item<float>();  // a host read: not capturable
    return nc::full({}, total, nc::TensorOptions(DType::F32, kCuda));
  });
  step({x});
  step({x});
  throws<nc::CaptureError>([&] { step({x}); }, {"cannot run inside a CUDA graph capture"})();
  EXPECT_EQ(host(step({x})), std::vector<float>{4.0f});
  EXPECT_FALSE(step.captured());
  EXPECT_EQ(step.direct_steps(), 3);
  EXPECT_EQ(calls, 4);
}

TEST(GraphedStep, RunsDirectlyOnTheCpuAndChecksItsArguments) {
  const Tensor x = nc::ones({4});
  nc::GraphedStep step([&](const std::vector<Tensor>& in) { return nc::sum(in[0]); });
  for (int i = 0; i < 4; ++i) EXPECT_EQ(step({x}).item<float>(), 4.0f);
  EXPECT_FALSE(step.captured());
  EXPECT_EQ(step.direct_steps(), 4);
  EXPECT_EQ(step.replays(), 0);
  throws<nc::ValueError>([] { nc::GraphedStep bad([](const std::vector<Tensor>&) { return Tensor(); }, true, 0); },
                         {"GraphedStep", "warmup must be >= 1"})();
  throws<nc::ValueError>([] { nc::GraphedStep bad(nullptr); }, {"GraphedStep", "empty"})();
  if (!nc::cuda_is_available()) {
    nc::cuda::Graph graph;
    EXPECT_THROW(graph.capture(0, [] {}), nc::Error);
    EXPECT_THROW(graph.replay(), nc::Error);
  }
}

}  // namespace
