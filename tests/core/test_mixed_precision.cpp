// Mixed precision: the autocast scope (normcore/autocast.h) gives each listed op its dtype
// on every device, the casts carry gradients back to f32 parameters in f32, backward does
// not depend on the caller's autocast state, and the f16 loss scaler (optim::GradScaler)
// skips steps with inf/NaN gradients, backs off and grows as specified, and saves its state.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "normcore/normcore.h"
#include "tests/test_support.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;
using normcore_test::throws;

namespace {

std::vector<nc::Device> devices() {
  std::vector<nc::Device> out{nc::Device::cpu()};
  if (nc::cuda_is_available()) out.push_back(nc::Device::cuda());
  return out;
}

Tensor random(const nc::Shape& shape, uint64_t seed, nc::Device device, DType dtype = DType::F32) {
  nc::Generator gen(seed);
  return nc::randn(shape, DType::F32, &gen).to(device, dtype);
}

std::vector<double> values(const Tensor& t) {
  return t.to(nc::Device::cpu()).to(DType::F64).contiguous().to_vector<double>();
}

// The largest |a - b| over the largest |b|.
double relative_error(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = values(a), y = values(b);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    worst = std::max(worst, std::fabs(x[i] - y[i]));
    scale = std::max(scale, std::fabs(y[i]));
  }
  return worst / std::max(scale, 1e-30);
}

}  // namespace

TEST(Autocast, GuardSetsAndRestoresTheThreadState) {
  EXPECT_FALSE(nc::autocast::is_enabled());
  {
    nc::autocast::Guard guard(DType::F16);
    EXPECT_TRUE(nc::autocast::is_enabled());
    EXPECT_EQ(nc::autocast::dtype(), DType::F16);
    {
      nc::autocast::Guard off(DType::BF16, false);
      EXPECT_FALSE(nc::autocast::is_enabled());
      const Tensor x = nc::ones({2, 3});
      EXPECT_EQ(nc::matmul(x, x.t()).dtype(), DType::F32);
    }
    EXPECT_TRUE(nc::autocast::is_enabled());
    EXPECT_EQ(nc::autocast::dtype(), DType::F16);
    bool other_thread_enabled = true;
    std::thread([&] { other_thread_enabled = nc::autocast::is_enabled(); }).join();
    EXPECT_FALSE(other_thread_enabled);
  }
  EXPECT_FALSE(nc::autocast::is_enabled());
  throws<nc::DTypeError>([] { nc::autocast::Guard guard(DType::F32); }, {"autocast::Guard", "bf16 or f16", "f32"})();
  EXPECT_FALSE(nc::autocast::is_enabled());
}

TEST(Autocast, EachListedOpRunsInItsDType) {
  for (const nc::Device& device : devices()) {
    for (DType lower : {DType::BF16, DType::F16}) {
      SCOPED_TRACE(device.str() + " " + nc::dtype_name(lower));
      nc::Generator gen(7);
      const Tensor x = random({4, 8}, 1, device), w = random({6, 8}, 2, device);
      const Tensor labels = nc::from_vector(std::vector<int64_t>{0, 5, 2, 3}, {4}).to(device);
      nc::nn::Linear linear(8, 6, true, &gen);
      linear.to(device);
      nc::nn::Conv2d conv(2, 3, 3, 1, 1, 1, 1, true, &gen);
      conv.to(device);
      nc::autocast::Guard guard(lower);
      // 16-bit list.
      const Tensor product = nc::matmul(x, w.t());
      EXPECT_EQ(product.dtype(), lower);
      EXPECT_EQ(linear(x).dtype(), lower);
      EXPECT_EQ(conv(random({1, 2, 5, 5}, 3, device)).dtype(), lower);
      const Tensor q = random({1, 2, 5, 8}, 4, device);
      EXPECT_EQ(nc::scaled_dot_product_attention(q, q, q, true).dtype(), lower);
      // f32 list, fed the 16-bit product.
      EXPECT_EQ(nc::softmax(product, 1).dtype(), DType::F32);
      EXPECT_EQ(nc::log_softmax(product, 1).dtype(), DType::F32);
      EXPECT_EQ(nc::cross_entropy(product, labels).dtype(), DType::F32);
      EXPECT_EQ(nc::mse_loss(product, nc::zeros_like(product)).dtype(), DType::F32);
      EXPECT_EQ(nc::layer_norm(product, {6}, Tensor(), Tensor(), 1e-5).dtype(), DType::F32);
      EXPECT_EQ(nc::rms_norm(product, {6}, Tensor(), 1e-6).dtype(), DType::F32);
      EXPECT_EQ(nc::group_norm(product, 2, Tensor(), Tensor(), 1e-5).dtype(), DType::F32);
      EXPECT_EQ(nc::batch_norm(product, Tensor(), Tensor(), Tensor(), Tensor(), true).dtype(), DType::F32);
      // Others keep their inputs' dtype, promoted as usual.
      EXPECT_EQ(nc::relu(product).dtype(), lower);
      EXPECT_EQ(nc::add(product, nc::ones({6}, nc::TensorOptions(DType::F32, device))).dtype(), DType::F32);
      // f64 is left alone.
      const Tensor x64 = x.to(DType::F64);
      EXPECT_EQ(nc::matmul(x64, x64.t()).dtype(), DType::F64);
      // The 16-bit product is the f32 one rounded: close to it.
      nc::autocast::Guard off(lower, false);
      EXPECT_LT(relative_error(product, nc::matmul(x, w.t())), 1e-2);
    }
  }
}

TEST(Autocast, GradientsReachF32ParametersInF32) {
  for (const nc::Device& device : devices()) {
    for (DType lower : {DType::BF16, DType::F16}) {
      SCOPED_TRACE(device.str() + " " + nc::dtype_name(lower));
      nc::Generator gen(3);
      nc::nn::Sequential net;
      net.push_back(std::make_shared<nc::nn::Linear>(16, 32, true, &gen));
      net.push_back(std::make_shared<nc::nn::LayerNorm>(std::vector<int64_t>{32}));
      net.push_back(std::make_shared<nc::nn::ReLU>());
      net.push_back(std::make_shared<nc::nn::Linear>(32, 10, true, &gen));
      net.to(device);
      const Tensor x = random({64, 16}, 11, device);
      std::vector<int64_t> label_values(64);
      for (size_t i = 0; i < label_values.size(); ++i) label_values[i] = static_cast<int64_t>(i % 10);
      const Tensor labels = nc::from_vector(label_values, {64}).to(device);

      nc::cross_entropy(net(x), labels).backward();
      std::vector<Tensor> reference;
      for (const Tensor& p : net.parameters()) reference.push_back(p.grad().clone());
      for (const Tensor& p : net.parameters()) p.zero_grad();

      Tensor loss;
      {
        nc::autocast::Guard guard(lower);
        loss = nc::cross_entropy(net(x), labels);
      }
      EXPECT_EQ(loss.dtype(), DType::F32);
      // Scaled as GradScaler would, so that no f16 gradient falls below f16's normal range.
      (loss * 1024).backward();
      const std::vector<Tensor> params = net.parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        ASSERT_TRUE(params[i].grad().defined()) << "parameter " << i;
        EXPECT_EQ(params[i].grad().dtype(), DType::F32) << "parameter " << i;
        // 8 (bf16) or 11 (f16) significant bits in the products and their gradients; layer
        // norm's backward subtracts row means, and the cancellation magnifies the rounding
        // (measured: up to 5.5e-2 in bf16 and 2.9e-2 in f16 for the first layer).
        EXPECT_LT(relative_error(params[i].grad() / 1024, reference[i]), lower == DType::BF16 ? 1e-1 : 5e-2)
            << "parameter " << i;
      }
    }
  }
}

TEST(Autocast, BackwardDoesNotDependOnTheCallersState) {
  for (const nc::Device& device : devices()) {
    SCOPED_TRACE(device.str());
    const Tensor w = random({8, 8}, 5, device).requires_grad_();
    const Tensor x = random({4, 8}, 6, device);
    auto gradient = [&](bool backward_inside) {
      w.zero_grad();
      nc::autocast::Guard guard(DType::BF16);
      const Tensor loss = nc::sum(nc::softmax(nc::matmul(x, w), 1) * nc::arange(8, DType::F32).to(device));
      if (backward_inside) {
        loss.backward();
      } else {
        nc::autocast::Guard off(DType::BF16, false);
        loss.backward();
      }
      return values(w.grad());
    };
    EXPECT_EQ(gradient(true), gradient(false));
  }
}

TEST(GradScaler, ScalesUnscalesAndFindsNonFiniteGradients) {
  nc::optim::GradScaler scaler(nc::optim::GradScalerOptions{1024.0, 2.0, 0.5, 2});
  const Tensor w = nc::from_vector(std::vector<float>{1, 2, 3}, {3}).requires_grad_();
  const Tensor scaled = scaler.scale(nc::sum(w * w));
  EXPECT_DOUBLE_EQ(scaled.item<double>(), 1024.0 * 14);
  scaled.backward();
  EXPECT_EQ(values(w.grad()), (std::vector<double>{2048, 4096, 6144}));
  EXPECT_TRUE(scaler.unscale({w}));
  EXPECT_EQ(values(w.grad()), (std::vector<double>{2, 4, 6}));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  EXPECT_EQ(scaler.growth_tracker(), 1);

  // The second clean step reaches growth_interval = 2: the scale doubles.
  w.set_grad(nc::ones({3}));
  EXPECT_TRUE(scaler.unscale({w}));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 2048.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);

  // An inf, or a NaN, anywhere: the step is to be skipped and the scale halves.
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    const double before = scaler.get_scale();
    const Tensor clean = nc::ones({2}).requires_grad_();
    clean.set_grad(nc::ones({2}));
    w.set_grad(nc::from_vector(std::vector<float>{1, bad, 1}, {3}));
    EXPECT_FALSE(scaler.unscale({clean, w, nc::ones({1})}));  // a parameter without a grad is skipped
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), before / 2);
    EXPECT_EQ(scaler.growth_tracker(), 0);
  }
  EXPECT_EQ(scaler.skipped_steps(), 3);
}

TEST(GradScaler, StateRoundTripsAndBadUseIsRefused) {
  nc::optim::GradScaler scaler(nc::optim::GradScalerOptions{8.0, 2.0, 0.5, 3});
  const Tensor w = nc::ones({2}).requires_grad_();
  w.set_grad(nc::ones({2}));
  ASSERT_TRUE(scaler.unscale({w}));
  scaler.update();
  nc::optim::GradScaler restored(nc::optim::GradScalerOptions{1.0, 2.0, 0.5, 3});
  restored.load_state_dict(scaler.state_dict());
  EXPECT_EQ(restored.get_scale(), 8.0);
  EXPECT_EQ(restored.growth_tracker(), 1);

  using Options = nc::optim::GradScalerOptions;
  throws<nc::ValueError>([] { nc::optim::GradScaler s(Options{0.0, 2.0, 0.5, 10}); }, {"init_scale", "> 0"})();
  throws<nc::ValueError>([] { nc::optim::GradScaler s(Options{1.0, 1.0, 0.5, 10}); }, {"growth_factor", "> 1"})();
  throws<nc::ValueError>([] { nc::optim::GradScaler s(Options{1.0, 2.0, 1.0, 10}); }, {"backoff_factor"})();
  throws<nc::ValueError>([] { nc::optim::GradScaler s(Options{1.0, 2.0, 0.5, 0}); }, {"growth_interval", ">= 1"})();
  throws<nc::ValueError>([&] { scaler.update(); }, {"GradScaler::update", "unscale"})();
  nc::optim::SGD sgd({w}, nc::optim::SGDOptions{0.1});
  throws<nc::ValueError>([&] { scaler.step(sgd); }, {"GradScaler::step", "unscale"})();
  throws<nc::ValueError>([&] { scaler.found_inf(); }, {"GradScaler::found_inf", "unscale"})();
  throws<nc::ValueError>([&] { sgd.step_unless(nc::ones({2})); }, {"SGD.step_unless", "one floating value"})();
  throws<nc::ValueError>(
      [&] {
        scaler.unscale({w});
        scaler.unscale({w});
      },
      {"GradScaler::unscale", "already called"})();
  scaler.update();
  throws<nc::ValueError>(
      [&] {
        restored.load_state_dict({{"scale", nc::full({}, 2.0, DType::F64)}});
      },
      {"missing entry 'growth_tracker'"})();
  throws<nc::ValueError>(
      [&] {
        restored.load_state_dict(
            {{"scale", nc::full({}, -1.0, DType::F64)}, {"growth_tracker", nc::full({}, int64_t{0}, DType::I64)}});
      },
      {"scale", "> 0"})();
  throws<nc::ValueError>(
      [&] {
        restored.load_state_dict({{"bogus", nc::full({}, 1.0, DType::F64)}});
      },
      {"unknown entry 'bogus'"})();
  throws<nc::DTypeError>([&] { scaler.scale(nc::ones({1}, DType::I64)); }, {"GradScaler::scale", "floating"})();
  EXPECT_EQ(restored.get_scale(), 8.0);  // the refused loads changed nothing
}

// f16 training of a least-squares fit from a scale so large that the first gradients
// overflow f16: the scaler skips those steps (parameters untouched), backs off, and then
// trains to the loss that f32 training reaches. The skip decided on the device
// (unscale_async, step) gives the same weights, bit for bit, as the host branch.
TEST(GradScaler, F16TrainingRecoversFromOverflowAndConverges) {
  for (const nc::Device& device : devices()) {
    SCOPED_TRACE(device.str());
    const Tensor x = random({128, 16}, 21, device);
    const Tensor true_w = random({1, 16}, 22, device);
    const Tensor y = nc::matmul(x, true_w.t());
    auto train = [&](bool f16, bool on_device, int64_t* skipped, std::vector<double>* weight) {
      nc::Generator gen(1);
      nc::nn::Linear model(16, 1, true, &gen);
      model.to(device);
      nc::optim::SGD sgd(model.parameters(), nc::optim::SGDOptions{0.1, 0.9});
      nc::optim::GradScaler scaler(nc::optim::GradScalerOptions{std::ldexp(1.0, 40), 2.0, 0.5, 50});
      Tensor loss;
      for (int step = 0; step < 150; ++step) {
        {
          nc::autocast::Guard guard(DType::F16, f16);
          loss = nc::mse_loss(model(x), y);
        }
        sgd.zero_grad();
        if (!f16) {
          loss.backward();
          sgd.step();
          continue;
        }
        const std::vector<double> before = values(model.weight);
        scaler.scale(loss).backward();
        bool finite = true;
        if (on_device) {
          scaler.unscale_async(model.parameters());
          finite = scaler.found_inf().item<double>() == 0.0;
          scaler.step(sgd);
        } else {
          finite = scaler.unscale(model.parameters());
          if (finite) sgd.step();
        }
        scaler.update();
        if (!finite) EXPECT_EQ(values(model.weight), before) << "a skipped step changed the weight";
      }
      *skipped = scaler.skipped_steps();
      *weight = values(model.weight);
      return loss.item<double>();
    };
    int64_t skipped_f32 = 0, skipped_f16 = 0, skipped_device = 0;
    std::vector<double> w32, w16, w_device;
    const double f32_loss = train(false, false, &skipped_f32, &w32);
    const double f16_loss = train(true, false, &skipped_f16, &w16);
    train(true, true, &skipped_device, &w_device);
    EXPECT_EQ(skipped_device, skipped_f16);
    EXPECT_EQ(w_device, w16);
    // 2^40 * loss overflows f16 (65504) until the scale is near 2^16 / loss.
    EXPECT_GE(skipped_f16, 10);
    EXPECT_LT(skipped_f16, 60);
    EXPECT_LT(f32_loss, 1e-4);
    EXPECT_LT(f16_loss, 1e-3);
  }
}
