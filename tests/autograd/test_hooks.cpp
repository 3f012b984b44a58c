// Gradient hooks (autograd::register_hook) and module forward hooks: what a hook sees, what
// replacing a gradient does, the order hooks run in, removal through the handle, and the
// errors. Values are small enough to work out by hand.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "normcore/normcore.h"

namespace nc = normcore;
using nc::Tensor;

namespace {

Tensor f64(const std::vector<double>& values, const nc::Shape& shape) { return nc::from_vector(values, shape); }

std::vector<double> values(const Tensor& t) { return t.to(nc::Device::cpu()).contiguous().to_vector<double>(); }

TEST(GradHook, SeesTheGradientOfAnIntermediateTensor) {
  Tensor x = f64({1, 2, 3}, {3}).requires_grad_();
  Tensor y = x * 2.0;
  std::vector<double> seen;
  nc::autograd::register_hook(y, [&](const Tensor& g) {
    seen = values(g);
    return Tensor();  // keep it
  });
  nc::sum(y * y).backward();  // d/dy = 2y = 4x
  EXPECT_EQ(seen, (std::vector<double>{4, 8, 12}));
  EXPECT_EQ(values(x.grad()), (std::vector<double>{8, 16, 24}));
}

TEST(GradHook, AReplacementFlowsOnToTheInputs) {
  Tensor x = f64({1, 2, 3}, {3}).requires_grad_();
  Tensor y = x * 3.0;
  nc::autograd::register_hook(y, [](const Tensor& g) { return g * 10.0; });
  nc::sum(y).backward();
  EXPECT_EQ(values(x.grad()), (std::vector<double>{30, 30, 30}));
}

TEST(GradHook, HooksRunInOrderEachOnThePreviousResult) {
  Tensor x = f64({1, 2}, {2}).requires_grad_();
  Tensor y = x * 1.0;
  std::vector<std::vector<double>> seen;
  nc::autograd::register_hook(y, [&](const Tensor& g) {
    seen.push_back(values(g));
    return g + 1.0;
  });
  nc::autograd::register_hook(y, [&](const Tensor& g) {
    seen.push_back(values(g));
    return g * 2.0;
  });
  nc::sum(y * f64({5, 7}, {2})).backward();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], (std::vector<double>{5, 7}));
  EXPECT_EQ(seen[1], (std::vector<double>{6, 8}));
  EXPECT_EQ(values(x.grad()), (std::vector<double>{12, 16}));
}

TEST(GradHook, ALeafsHookSeesThisBackwardsSumBeforeAccumulation) {
  Tensor x = f64({1, 2}, {2}).requires_grad_();
  int calls = 0;
  std::vector<double> seen;
  nc::autograd::register_hook(x, [&](const Tensor& g) {
    ++calls;
    seen = values(g);
    return g * 0.5;
  });
  // x reaches the loss along two paths: the hook runs once, on their sum 3 + 2x.
  nc::sum(x * 3.0 + x * x).backward();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, (std::vector<double>{5, 7}));
  EXPECT_EQ(values(x.grad()), (std::vector<double>{2.5, 3.5}));
  // A second backward: the hook sees only this backward's gradient, grad() accumulates.
  nc::sum(x * 4.0).backward();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(seen, (std::vector<double>{4, 4}));
  EXPECT_EQ(values(x.grad()), (std::vector<double>{4.5, 5.5}));
}

TEST(GradHook, ALeafRootAndReadyHooksAfterGradientHooks) {
  Tensor x = f64({3}, {1}).requires_grad_();
  nc::autograd::register_hook(x, [](const Tensor& g) { return g * 7.0; });
  std::vector<double> at_ready;
  nc::autograd::add_grad_ready_hook(x, [&] { at_ready = values(x.grad()); });
  x.backward();  // the root is the leaf itself
  EXPECT_EQ(values(x.grad()), (std::vector<double>{7}));
  EXPECT_EQ(at_ready, (std::vector<double>{7}));
}

TEST(GradHook, RemovedThroughItsHandle) {
  Tensor x = f64({1, 2}, {2}).requires_grad_();
  Tensor y = x * 1.0;
  int leaf_calls = 0, inner_calls = 0;
  nc::HookHandle on_leaf = nc::autograd::register_hook(x, [&](const Tensor&) {
    ++leaf_calls;
    return Tensor();
  });
  nc::HookHandle on_y = nc::autograd::register_hook(y, [&](const Tensor& g) {
    ++inner_calls;
    return g * 100.0;
  });
  EXPECT_TRUE(on_leaf.active());
  on_leaf.remove();
  on_y.remove();
  EXPECT_FALSE(on_leaf.active());
  on_leaf.remove();  // twice: nothing
  nc::sum(y).backward();
  EXPECT_EQ(leaf_calls, 0);
  EXPECT_EQ(inner_calls, 0);
  EXPECT_EQ(values(x.grad()), (std::vector<double>{1, 1}));
  // After the tensor is gone, remove() does nothing.
  nc::HookHandle orphan;
  {
    Tensor z = f64({1}, {1}).requires_grad_();
    orphan = nc::autograd::register_hook(z, [](const Tensor& g) { return g; });
  }
  orphan.remove();
  EXPECT_FALSE(orphan.active());
}

TEST(GradHook, AHookMayRemoveItself) {
  Tensor x = f64({1}, {1}).requires_grad_();
  int calls = 0;
  auto handle = std::make_shared<nc::HookHandle>();
  *handle = nc::autograd::register_hook(x, [&calls, handle](const Tensor&) {
    ++calls;
    handle->remove();
    return Tensor();
  });
  nc::sum(x * 2.0).backward();
  nc::sum(x * 2.0).backward();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(values(x.grad()), (std::vector<double>{4}));
}

TEST(GradHook, Errors) {
  Tensor plain = f64({1, 2}, {2});
  EXPECT_THROW(nc::autograd::register_hook(plain, [](const Tensor& g) { return g; }), nc::ValueError);
  Tensor x = f64({1, 2}, {2}).requires_grad_();
  EXPECT_THROW(nc::autograd::register_hook(x, nullptr), nc::ValueError);
  Tensor y = x * 2.0;
  nc::autograd::register_hook(y, [](const Tensor&) { return nc::zeros({3}, nc::DType::F64); });
  try {
    nc::sum(y).backward();
    FAIL() << "a replacement of the wrong shape was accepted";
  } catch (const nc::ShapeError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("register_hook"), std::string::npos) << message;
    EXPECT_NE(message.find("[3]"), std::string::npos) << message;
    EXPECT_NE(message.find("[2]"), std::string::npos) << message;
  }
  Tensor w = f64({1, 2}, {2}).requires_grad_();
  nc::autograd::register_hook(w, [](const Tensor& g) { return g.to(nc::DType::F32); });
  EXPECT_THROW(nc::sum(w * 2.0).backward(), nc::DTypeError);
}

TEST(GradHook, OnTheGpu) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  Tensor x = f64({1, 2, 3}, {3}).to(nc::Device::cuda(0)).requires_grad_();
  Tensor y = nc::relu(x - 1.5);
  std::vector<double> seen;
  nc::autograd::register_hook(y, [&](const Tensor& g) {
    seen = values(g);
    return g * 3.0;
  });
  nc::autograd::register_hook(x, [](const Tensor& g) { return g + 1.0; });
  nc::sum(y * y).backward();  // dy = 2y = {0, 1, 3}; relu passes x > 1.5
  EXPECT_EQ(seen, (std::vector<double>{0, 1, 3}));
  EXPECT_EQ(values(x.grad()), (std::vector<double>{1, 4, 10}));
}

TEST(ForwardHook, SeesEveryLayersInputAndOutputInsideAModel) {
  nc::Generator gen(3);
  auto first = std::make_shared<nc::nn::Linear>(4, 3, true, &gen);
  auto relu = std::make_shared<nc::nn::ReLU>();
  auto second = std::make_shared<nc::nn::Linear>(3, 2, true, &gen);
  auto model = std::make_shared<nc::nn::Sequential>(std::vector<std::shared_ptr<nc::nn::Module>>{first, relu, second});
  Tensor x = nc::randn({5, 4}, nc::DType::F64, &gen);
  first->to(nc::DType::F64);
  second->to(nc::DType::F64);

  std::vector<double> relu_in, relu_out, model_out;
  nc::nn::Module* called_on = nullptr;
  nc::HookHandle on_relu = relu->register_forward_hook([&](nc::nn::Module& m, const Tensor& in, const Tensor& out) {
    called_on = &m;
    relu_in = values(in);
    relu_out = values(out);
  });
  int model_calls = 0;
  model->register_forward_hook([&](nc::nn::Module&, const Tensor&, const Tensor& out) {
    ++model_calls;
    model_out = values(out);
  });
  const Tensor y = (*model)(x);
  EXPECT_EQ(called_on, relu.get());
  EXPECT_EQ(relu_in, values((*first)(x)));
  EXPECT_EQ(relu_out, values(nc::relu((*first)(x))));
  EXPECT_EQ(model_calls, 1);
  EXPECT_EQ(model_out, values(y));

  // Removed: the ReLU's hook no longer runs; forward() called directly runs none.
  on_relu.remove();
  relu_in.clear();
  (*model)(x);
  EXPECT_TRUE(relu_in.empty());
  EXPECT_EQ(model_calls, 2);
  model->forward(x);
  EXPECT_EQ(model_calls, 2);
  EXPECT_THROW(model->register_forward_hook(nullptr), nc::ValueError);
}

TEST(ForwardHook, RunsInsideATransformerBlock) {
  nc::Generator gen(5);
  auto block = std::make_shared<nc::nn::TransformerBlock>(8, 2, "layernorm", true, 0.0, &gen);
  std::vector<int64_t> attn_out_shape;
  block->attn->register_forward_hook(
      [&](nc::nn::Module&, const Tensor&, const Tensor& out) { attn_out_shape = out.shape(); });
  (*block)(nc::randn({2, 3, 8}, {}, &gen));
  EXPECT_EQ(attn_out_shape, (std::vector<int64_t>{2, 3, 8}));
}

}  // namespace
