// Autograd's safety nets: version counters that stop a backward from using values an
// in-place op wrote after the forward (copy_, fill_, zero_, optimizer steps, into a tensor
// or into the base of a view), without flagging writes a gradient does not depend on; and
// graphs of a million nodes that backward and release on a thread with a 1 MB stack.
#include <gtest/gtest.h>
#include <pthread.h>

#include <functional>
#include <string>
#include <vector>

#include "normcore/normcore.h"

namespace nc = normcore;
using nc::Tensor;

namespace {

Tensor leaf(std::vector<float> values) {
  Tensor t = nc::from_vector(values, {static_cast<int64_t>(values.size())});
  t.requires_grad_();
  return t;
}

TEST(VersionCounter, InPlaceWritesBumpTheStorageVersionSharedByItsViews) {
  Tensor x = nc::zeros({4});
  Tensor view = x.narrow(0, 1, 2);
  EXPECT_EQ(x.version(), 0u);
  x.fill_(1);
  EXPECT_EQ(x.version(), 1u);
  view.copy_(nc::ones({2}));
  EXPECT_EQ(x.version(), 2u);
  EXPECT_EQ(view.version(), 2u);
  x.zero_();
  EXPECT_EQ(x.version(), 3u);
  Tensor y = nc::add(x, 1);  // out of place: a new storage
  EXPECT_EQ(y.version(), 0u);
  EXPECT_EQ(x.version(), 3u);
  EXPECT_EQ(nc::ones({2}).version(), 0u) << "a factory's own fill is no in-place write";
  Tensor p = leaf({1, 2});
  nc::optim::SGD sgd({p}, nc::optim::SGDOptions{0.1});
  nc::sum(nc::mul(p, p)).backward();
  sgd.step();
  EXPECT_EQ(p.version(), 1u) << "an optimizer step writes its parameters in place";
}

// One row: a forward that saves a tensor, an in-place write to it, and whether backward
// must refuse (naming the op) or succeed with the given gradient of x.
struct InPlaceCase {
  const char* name;
  std::function<void(Tensor& x, Tensor& w, Tensor& y)> forward_and_write;
  const char* refusing_op;           // nullptr: backward succeeds
  std::vector<float> expected_grad;  // of x, when it succeeds
};

TEST(VersionCounter, BackwardRefusesValuesWrittenAfterTheForward) {
  const std::vector<InPlaceCase> cases = {
      {"mul saves w; w.fill_",
       [](Tensor& x, Tensor& w, Tensor& y) {
         y = nc::sum(nc::mul(x, w));
         w.fill_(0);
       },
       "mul backward",
       {}},
      {"x * x; x.fill_ under no-grad, as an optimizer does",
       [](Tensor& x, Tensor&, Tensor& y) {
         y = nc::sum(nc::mul(x, x));
         nc::autograd::NoGradGuard no_grad;
         x.fill_(10);
       },
       "mul backward",
       {}},
      {"copy_ into the base of a saved view",
       [](Tensor& x, Tensor& w, Tensor& y) {
         Tensor base = w.detach();
         y = nc::sum(nc::mul(x, base.narrow(0, 0, 3)));
         base.copy_(nc::zeros({3}));
       },
       "mul backward",
       {}},
      {"matmul saves both operands; zero_",
       [](Tensor& x, Tensor& w, Tensor& y) {
         y = nc::sum(nc::matmul(x.view({1, 3}), w.view({3, 1})));
         w.detach().zero_();
       },
       "matmul backward",
       {}},
      {"exp saves its output; the output written",
       [](Tensor& x, Tensor&, Tensor& y) {
         Tensor e = nc::exp(x);
         y = nc::sum(e);
         e.detach().fill_(0);
       },
       "exp backward",
       {}},
      {"layer_norm saves x",
       [](Tensor& x, Tensor&, Tensor& y) {
         y = nc::sum(nc::mul(nc::layer_norm(x, {3}, Tensor(), Tensor(), 1e-5), nc::arange(3, nc::DType::F32)));
         nc::autograd::NoGradGuard no_grad;
         x.fill_(1);
       },
       "layer_norm backward",
       {}},
      {"gather saves its index",
       [](Tensor& x, Tensor&, Tensor& y) {
         Tensor index = nc::from_vector<int64_t>({2, 0}, {2});
         y = nc::sum(nc::gather(x, 0, index));
         index.fill_(1);
       },
       "gather backward",
       {}},
      // Writes that the gradient does not read are no error, as in PyTorch.
      {"add saves nothing; w.fill_",
       [](Tensor& x, Tensor& w, Tensor& y) {
         y = nc::sum(nc::add(x, w));
         w.fill_(0);
       },
       nullptr,
       {1, 1, 1}},
      {"exp saves its output, not x",
       [](Tensor& x, Tensor&, Tensor& y) {
         y = nc::sum(nc::exp(x));
         nc::autograd::NoGradGuard no_grad;
         x.fill_(0);
       },
       nullptr,
       {1, 2.7182817f, 7.389056f}},
      {"a write to an unrelated tensor",
       [](Tensor& x, Tensor& w, Tensor& y) {
         y = nc::sum(nc::mul(x, nc::ones({3})));
         w.fill_(0);
       },
       nullptr,
       {1, 1, 1}},
  };
  for (const InPlaceCase& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor x = leaf({0, 1, 2});
    Tensor w = nc::from_vector<float>({3, 4, 5}, {3});
    Tensor y;
    c.forward_and_write(x, w, y);
    if (c.refusing_op == nullptr) {
      y.backward();
      ASSERT_TRUE(x.grad().defined());
      const std::vector<float> grad = x.grad().to_vector<float>();
      ASSERT_EQ(grad.size(), c.expected_grad.size());
      for (size_t i = 0; i < grad.size(); ++i) EXPECT_NEAR(grad[i], c.expected_grad[i], 1e-5) << i;
      continue;
    }
    try {
      y.backward();
      ADD_FAILURE() << "backward used values written after the forward";
    } catch (const nc::Error& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.rfind(std::string(c.refusing_op) + ":", 0), 0u) << message;
      EXPECT_NE(message.find("written in place after the forward"), std::string::npos) << message;
      EXPECT_NE(message.find("version 1, it was saved at version 0"), std::string::npos) << message;
    }
  }
}

TEST(VersionCounter, AnOptimizerStepBetweenForwardAndBackwardIsRefused) {
  Tensor w = leaf({1, 2, 3});
  nc::optim::SGD sgd({w}, nc::optim::SGDOptions{0.1});
  Tensor x = nc::from_vector<float>({1, 1, 1}, {3});
  nc::sum(nc::mul(x, w)).backward();
  Tensor y = nc::sum(nc::mul(nc::mul(x, w), w));  // saves w
  sgd.step();
  EXPECT_THROW(y.backward(), nc::Error);
}

// Runs body on a thread with a stack of stack_bytes; returns false if it threw.
bool run_with_stack(size_t stack_bytes, const std::function<void()>& body) {
  struct Job {
    const std::function<void()>* body;
    std::string error;
  } job{&body, ""};
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, stack_bytes);
  pthread_t thread;
  auto entry = [](void* arg) -> void* {
    auto* j = static_cast<Job*>(arg);
    try {
      (*j->body)();
    } catch (const std::exception& e) {
      j->error = e.what();
    }
    return nullptr;
  };
  const int started = pthread_create(&thread, &attr, entry, &job);
  pthread_attr_destroy(&attr);
  if (started != 0) {
    ADD_FAILURE() << "pthread_create failed";
    return false;
  }
  pthread_join(thread, nullptr);
  EXPECT_EQ(job.error, "");
  return job.error.empty();
}

constexpr int64_t kChainLength = 1000000;

TEST(GraphRelease, AMillionNodeChainBackwardsAndReleasesOnA1MBStack) {
  const bool ok = run_with_stack(1 << 20, [] {
    Tensor x = leaf({2});
    {
      Tensor y = x;
      for (int64_t i = 0; i < kChainLength; ++i) y = nc::neg(y);
      y.backward();  // an even number of negations: the gradient is 1
    }                // y and its graph released here
    ASSERT_TRUE(x.grad().defined());
    EXPECT_EQ(x.grad().item<float>(), 1.0f);
    Tensor z = x;
    for (int64_t i = 0; i < kChainLength; ++i) z = nc::neg(z);
    z = Tensor();  // released without a backward
  });
  EXPECT_TRUE(ok);
}

}  // namespace
