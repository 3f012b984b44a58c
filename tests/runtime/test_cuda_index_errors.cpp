// Index errors found on the GPU, reported after the fact: an embedding index or a class
// target out of range raises IndexError, in the op's own words, at the host's next wait for
// the device (item(), a copy to the host, cuda::synchronize, cuda::check_errors, a graph's
// replay or synchronize), once; later work runs as usual. A training step whose values are
// good makes the host wait for nothing (cuda::host_waits). The CPU raises at the call. The
// CUDA tests skip without a GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "kernels/index.h"
#include "normcore/models.h"
#include "normcore/normcore.h"
#include "tests/test_support.h"

namespace nc = normcore;
namespace nn = normcore::nn;
using nc::DType;
using nc::Tensor;
using normcore_test::throws;

namespace {

const nc::Device kCuda = nc::Device::cuda(0);

#define REQUIRE_CUDA() \
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device"

Tensor i64(const std::vector<int64_t>& values, nc::Device device) {
  return nc::from_vector(values, {static_cast<int64_t>(values.size())}, device);
}

std::vector<float> host(const Tensor& t) { return t.to(nc::Device::cpu()).contiguous().to_vector<float>(); }

Tensor on_gpu(const std::vector<float>& values, const nc::Shape& shape) {
  return nc::from_vector(values, shape, kCuda);
}

// A call with bad values on `device` and the message its IndexError carries.
struct BadCall {
  const char* name;
  std::function<Tensor(nc::Device)> call;
  std::string message;
};

std::vector<BadCall> bad_calls() {
  return {
      {"embedding, index too large",
       [](nc::Device d) {
         return nc::embedding(nc::ones({10, 3}).to(d), i64({1, 10, 2}, d));
       },
       "embedding: index 10 is out of range for 10 embeddings"},
      {"embedding, negative i32 index",
       [](nc::Device d) {
         return nc::embedding(nc::ones({10, 3}).to(d), nc::from_vector<int32_t>({-2}, {1}, d));
       },
       "embedding: index -2 is out of range for 10 embeddings"},
      {"cross_entropy, target too large",
       [](nc::Device d) {
         return nc::cross_entropy(nc::zeros({3, 4}).to(d), i64({0, 7, 1}, d));
       },
       "cross_entropy: target value 7 is out of range for 4 classes"},
      {"cross_entropy, negative target beside ignored rows",
       [](nc::Device d) {
         return nc::cross_entropy(nc::zeros({3, 4}).to(d), i64({-100, -1, -100}, d));
       },
       "cross_entropy: target value -1 is out of range for 4 classes"},
      {"cross_entropy, ignore_index a class, another target too large",
       [](nc::Device d) {
         return nc::cross_entropy(nc::zeros({2, 4}).to(d), i64({2, 4}, d), nc::Reduction::Sum, 0.0, 2);
       },
       "cross_entropy: target value 4 is out of range for 4 classes"},
      {"nll_loss, target too large",
       [](nc::Device d) {
         return nc::nll_loss(nc::zeros({2, 3}).to(d), i64({3, 0}, d));
       },
       "nll_loss: target value 3 is out of range for 3 classes"},
      {"index_select",
       [](nc::Device d) {
         return nc::index_select(nc::ones({4, 2}).to(d), 0, i64({0, 4}, d));
       },
       "index_select: index 4 is out of range for dim 0 of size 4"},
      {"gather",
       [](nc::Device d) {
         return nc::gather(nc::ones({2, 3}).to(d), 1, i64({5}, d).view({1, 1}));
       },
       "gather: index 5 is out of range for dim 1 of size 3"},
  };
}

// check_errors raises once the work that found the error has finished; it does not wait
// for work that found none, so the test gives the kernel time.
void check_errors_until_raised() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    nc::cuda::check_errors(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// The host waits that report a recorded error.
struct Reporter {
  const char* name;
  std::function<void()> wait;
};

std::vector<Reporter> reporters() {
  return {
      {"item", [] { nc::ones({1}, nc::TensorOptions(DType::F32, kCuda)).item<float>(); }},
      {"to(cpu)", [] { nc::zeros({3}, nc::TensorOptions(DType::F32, kCuda)).to(nc::Device::cpu()); }},
      {"synchronize", [] { nc::cuda::synchronize(0); }},
      {"check_errors", [] { check_errors_until_raised(); }},
  };
}

#ifdef NORMCORE_HAS_CUDA
// The kernels themselves: the launcher returns without waiting; the IndexError naming the
// value comes at the next wait, once. The bad elements are skipped: index_select and gather
// write 0 there, scatter_add adds the others.
TEST(CudaIndexErrors, IndexKernelsSkipABadIndexAndReportItAtTheNextWait) {
  REQUIRE_CUDA();
  nc::cuda::synchronize(0);
  const std::vector<float> xs = host(nc::randn({4, 5}));
  const Tensor x = on_gpu(xs, {4, 5});
  const Tensor bad = i64({0, 7, 1}, kCuda);
  const Tensor bad_negative = i64({-1, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0}, kCuda).view({4, 3});
  const auto& kernels = nc::cuda::index_kernels();
  Tensor selected = nc::empty({4, 3}, nc::TensorOptions(DType::F32, kCuda));
  kernels.index_select(selected, x, 1, bad);
  throws<nc::IndexError>([] { nc::cuda::synchronize(0); },
                         {"index_select: index 7 is out of range for dim 1 of size 5"})();
  EXPECT_NO_THROW(nc::cuda::synchronize(0));
  const std::vector<float> picked = host(selected);
  for (int row = 0; row < 4; ++row) {
    EXPECT_EQ(picked[row * 3 + 0], xs[row * 5 + 0]);
    EXPECT_EQ(picked[row * 3 + 1], 0.0f) << "the element of the bad index is 0";
    EXPECT_EQ(picked[row * 3 + 2], xs[row * 5 + 1]);
  }
  Tensor gathered = nc::empty({4, 3}, nc::TensorOptions(DType::F32, kCuda));
  kernels.gather(gathered, x, 1, bad_negative);
  throws<nc::IndexError>([] { nc::cuda::synchronize(0); }, {"gather: index -1 is out of range for dim 1 of size 5"})();
  EXPECT_EQ(host(gathered)[0], 0.0f);
  EXPECT_EQ(host(gathered)[1], xs[0]) << "gathered[0, 1] is x[0, index 0]";
  Tensor out = nc::zeros({4, 5}, nc::TensorOptions(DType::F32, kCuda));
  kernels.scatter_add(out, 1, bad_negative, nc::ones({4, 3}, nc::TensorOptions(DType::F32, kCuda)));
  throws<nc::IndexError>([&] { host(out); }, {"scatter_add: index -1 is out of range for dim 1 of size 5"})();
  double total = 0;
  for (float v : host(out)) total += v;
  EXPECT_EQ(total, 11.0);
  // check_range: ignore_index passes, anything else out of range is recorded.
  kernels.check_range(i64({-100, 2, -100}, kCuda), 3, -100, {"cross_entropy", "target value", "classes"});
  EXPECT_NO_THROW(nc::cuda::synchronize(0));
  kernels.check_range(i64({-100, 3}, kCuda), 3, -100, {"cross_entropy", "target value", "classes"});
  throws<nc::IndexError>([] { nc::cuda::synchronize(0); },
                         {"cross_entropy: target value 3 is out of range for 3 classes"})();
}
#endif  // NORMCORE_HAS_CUDA

TEST(CudaIndexErrors, TheCpuRaisesAtTheCall) {
  for (const BadCall& c : bad_calls()) {
    SCOPED_TRACE(c.name);
    throws<nc::IndexError>([&] { c.call(nc::Device::cpu()); }, {c.message})();
  }
}

// Each bad call returns; the next wait of each kind raises its message, the one after it
// nothing, and the same op with good values then gives the CPU's values.
TEST(CudaIndexErrors, ABadValueIsRaisedAtTheNextWaitOnce) {
  REQUIRE_CUDA();
  nc::cuda::synchronize(0);
  for (const BadCall& c : bad_calls()) {
    for (const Reporter& r : reporters()) {
      SCOPED_TRACE(std::string(c.name) + ", reported by " + r.name);
      EXPECT_NO_THROW(c.call(kCuda));
      throws<nc::IndexError>(r.wait, {c.message})();
      EXPECT_NO_THROW(nc::cuda::synchronize(0));
      EXPECT_NO_THROW(nc::cuda::check_errors(0));
    }
  }
  const Tensor weight = nc::randn({10, 3});
  const Tensor index = i64({9, 0, 3, 3}, nc::Device::cpu());
  EXPECT_EQ(host(nc::embedding(weight.to(kCuda), index.to(kCuda))), host(nc::embedding(weight, index)));
  const Tensor logits = nc::randn({3, 4});
  const Tensor target = i64({3, -100, 0}, nc::Device::cpu());
  EXPECT_NEAR(nc::cross_entropy(logits.to(kCuda), target.to(kCuda)).item<double>(),
              nc::cross_entropy(logits, target).item<double>(), 1e-6);
}

// The first error stays recorded through later steps that wait for nothing, good or bad;
// the first wait raises it (not a later one's), and the next waits raise nothing.
TEST(CudaIndexErrors, AnErrorIsKeptUntilAWaitRaisesIt) {
  REQUIRE_CUDA();
  nc::cuda::synchronize(0);
  const Tensor weight = nc::randn({8, 4}).to(kCuda).requires_grad_();
  const Tensor good = i64({1, 2, 3}, kCuda);
  Tensor total;
  for (int step = 0; step < 6; ++step) {
    const Tensor index = step == 1 ? i64({1, 11, 3}, kCuda) : step == 4 ? i64({-5}, kCuda) : good;
    total = nc::sum(nc::embedding(weight, index));
    total.backward();
  }
  throws<nc::IndexError>([&] { total.item<float>(); }, {"embedding: index 11 is out of range for 8 embeddings"})();
  EXPECT_NO_THROW(total.item<float>());
  EXPECT_NO_THROW(nc::cuda::synchronize(0));
}

// A backward through a bad target or index skips it: the step runs to its end, the error is
// raised once, and the gradients of a good step after it are the CPU's.
TEST(CudaIndexErrors, BackwardThroughABadValueSkipsIt) {
  REQUIRE_CUDA();
  nc::cuda::synchronize(0);
  const Tensor logits = nc::randn({4, 5});
  const Tensor weight = nc::randn({6, 5});
  auto step = [&](nc::Device d, const std::vector<int64_t>& tokens, const std::vector<int64_t>& targets) {
    const Tensor w = weight.to(d).detach().requires_grad_(), x = logits.to(d).detach().requires_grad_();
    const Tensor scores = nc::add(x, nc::embedding(w, i64(tokens, d)));
    nc::cross_entropy(scores, i64(targets, d), nc::Reduction::Mean, 0.1).backward();
    return std::vector<Tensor>{w.grad(), x.grad()};
  };
  step(kCuda, {0, 6, 1, 2}, {1, 1, 9, -100});
  throws<nc::IndexError>([] { nc::cuda::synchronize(0); }, {"embedding: index 6 is out of range for 6 embeddings"})();
  EXPECT_NO_THROW(nc::cuda::synchronize(0));
  const std::vector<Tensor> on_gpu = step(kCuda, {0, 5, 1, 1}, {1, -100, 4, 0});
  const std::vector<Tensor> on_cpu = step(nc::Device::cpu(), {0, 5, 1, 1}, {1, -100, 4, 0});
  for (size_t i = 0; i < on_cpu.size(); ++i) {
    const std::vector<float> got = host(on_gpu[i]), want = host(on_cpu[i]);
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < want.size(); ++k) EXPECT_NEAR(got[k], want[k], 1e-5) << "gradient " << i << "[" << k << "]";
  }
}

// GPT training steps (embeddings, the loss with ignored targets, backward, clipping, AdamW)
// after the warm-up make the host wait for nothing; reading the loss waits once.
TEST(CudaIndexErrors, ATrainingStepMakesTheHostWaitForNothing) {
  REQUIRE_CUDA();
  nc::models::GPTConfig config;  // one layer of width 32, the default vocabulary of 256
  config.layers = 1;
  config.heads = 2;
  config.embed = 32;
  config.context = 16;
  nc::Generator gen(3), data(5);
  nc::models::GPT model(config, &gen);
  model.to(kCuda);
  nc::optim::AdamW optimizer(model.parameters(), {});
  const Tensor tokens = nc::randint(0, 256, {4, 17}, DType::I64, &data).to(kCuda);
  const Tensor inputs = tokens.narrow(1, 0, 16).contiguous();
  Tensor targets = tokens.narrow(1, 1, 16).contiguous();
  targets.narrow(1, 12, 4).fill_(-100);  // the end of each row is ignored
  auto step = [&] {
    Tensor loss = nc::models::lm_loss(model, inputs, targets);
    optimizer.zero_grad();
    loss.backward();
    nc::optim::clip_grad_norm_async(optimizer.params(), 1.0);
    optimizer.step();
    return loss;
  };
  for (int i = 0; i < 2; ++i) step();  // the optimizer's state is made on its first step
  nc::cuda::synchronize(0);
  const uint64_t before = nc::cuda::host_waits(0);
  Tensor loss;
  for (int i = 0; i < 3; ++i) loss = step();
  EXPECT_EQ(nc::cuda::host_waits(0), before) << "a training step waited for the device";
  const double value = loss.item<double>();
  EXPECT_GT(nc::cuda::host_waits(0), before);
  EXPECT_TRUE(std::isfinite(value));
}

// Inside a CUDA graph the range checks are captured: a replay with a bad token or target is
// reported in the op's words, saying that a replay found it, once; later replays are valid.
TEST(CudaIndexErrors, AGraphReplayReportsTheOpsOwnMessageOnce) {
  REQUIRE_CUDA();
  nc::cuda::synchronize(0);
  const Tensor weight = nc::randn({16, 8}).to(kCuda).requires_grad_();
  Tensor tokens = i64({1, 2, 3, 4}, kCuda);
  Tensor targets = i64({0, 5, -100, 7}, kCuda);
  Tensor loss;
  auto step = [&] {
    loss = nc::cross_entropy(nc::embedding(weight, tokens), targets);
    loss.backward();
  };
  step();  // a direct step first: the gradient exists before the capture
  nc::cuda::Graph graph;
  graph.capture(0, step);
  graph.replay();
  graph.synchronize();
  const float good = host(loss)[0];
  tokens.fill_(16);
  graph.replay();
  throws<nc::IndexError>([&] { graph.synchronize(); },
                         {"embedding: index 16 is out of range for 16 embeddings", "replay of a CUDA graph"})();
  EXPECT_NO_THROW(graph.synchronize());
  tokens.copy_(i64({1, 2, 3, 4}, kCuda));
  targets.narrow(0, 3, 1).fill_(8);
  graph.replay();
  throws<nc::IndexError>([&] { nc::cuda::synchronize(0); },
                         {"cross_entropy: target value 8 is out of range for 8 classes", "replay"})();
  targets.narrow(0, 3, 1).fill_(7);
  graph.replay();
  graph.synchronize();
  EXPECT_EQ(host(loss)[0], good);
}

TEST(CudaIndexErrors, TheChecksNeedAGpu) {
  if (nc::cuda_is_available()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_THROW(nc::cuda::check_errors(), nc::DeviceError);
  EXPECT_THROW(nc::cuda::host_waits(), nc::DeviceError);
}

}  // namespace
