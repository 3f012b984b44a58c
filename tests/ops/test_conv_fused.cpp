// conv2d_fused (inference: the bias, a residual and ReLU in the convolution's epilogue, NCHW
// or NHWC) against conv2d, add and relu on the CPU and CUDA in every floating dtype;
// nn::fold_batch_norm against Conv2d then BatchNorm2d in eval mode; the errors; and
// models::fuse_resnet against the module it came from.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "normcore/models.h"
#include "normcore/normcore.h"
#include "tests/test_support.h"

namespace nc = normcore;
using nc::ConvLayout;
using nc::DType;
using nc::Size2;
using nc::Tensor;
using normcore_test::relative_error;

namespace {

Tensor random(const nc::Shape& shape, uint64_t seed, DType dtype = DType::F32) {
  nc::Generator gen(seed);
  return nc::randn(shape, DType::F64, &gen).to(dtype);
}

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::F64: return 1e-12;
    case DType::F32: return 1e-5;
    default: return 2e-2;  // f16, bf16: one rounding of y before the epilogue on CUDA
  }
}

Tensor nhwc(const Tensor& t) { return t.permute({0, 2, 3, 1}).contiguous(); }
Tensor nchw(const Tensor& t) { return t.permute({0, 3, 1, 2}).contiguous(); }

struct Case {
  std::string name;
  nc::Shape x, weight;
  Size2 stride, padding;
  int64_t groups;
  bool bias, residual, relu;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"3x3, bias, residual, relu", {2, 8, 7, 6}, {16, 8, 3, 3}, 1, 1, 1, true, true, true},
      {"1x1 stride 2, bias only", {3, 16, 9, 9}, {8, 16, 1, 1}, 2, 0, 1, true, false, false},
      {"relu without bias", {2, 8, 5, 5}, {8, 8, 3, 3}, 1, 1, 1, false, false, true},
      {"groups 2, residual", {2, 8, 6, 6}, {8, 4, 3, 3}, 1, 1, 2, true, true, true},
      {"odd channels", {2, 3, 8, 8}, {5, 3, 3, 3}, 2, 1, 1, true, true, true},
      // The CPU's im2col columns made in pieces of output rows (37 and 11 here).
      {"7x7 stride 2, columns in pieces", {2, 3, 96, 96}, {16, 3, 7, 7}, 2, 3, 1, true, true, true},
      // One sample: the pieces are the thread pool's ranges.
      {"7x7 stride 2, one sample's pieces", {1, 3, 96, 96}, {16, 3, 7, 7}, 2, 3, 1, true, true, true},
  };
  return c;
}

// The fused op on device in dtype and layout against conv2d, add and relu in f64 on the CPU.
void expect_matches_unfused(const Case& c, nc::Device device, DType dtype, ConvLayout layout, uint64_t seed) {
  SCOPED_TRACE(c.name + " on " + device.str() + " in " + nc::dtype_name(dtype) +
               (layout == ConvLayout::NHWC ? " NHWC" : " NCHW"));
  nc::autograd::NoGradGuard no_grad;
  const Tensor x = random(c.x, seed, dtype), w = random(c.weight, seed + 1, dtype);
  const Tensor b = c.bias ? random({c.weight[0]}, seed + 2, dtype) : Tensor();
  Tensor want = nc::conv2d(x.to(DType::F64), w.to(DType::F64), b.defined() ? b.to(DType::F64) : b, c.stride, c.padding,
                           1, c.groups);
  const Tensor r = c.residual ? random(want.shape(), seed + 3, dtype) : Tensor();
  if (r.defined()) want = nc::add(want, r.to(DType::F64));
  if (c.relu) want = nc::relu(want);
  const bool last = layout == ConvLayout::NHWC;
  const auto on = [&](const Tensor& t) { return t.defined() ? (last ? nhwc(t) : t).to(device) : t; };
  Tensor got = nc::conv2d_fused(on(x), on(w), b.defined() ? b.to(device) : b, on(r), c.relu, c.stride, c.padding, 1,
                                c.groups, layout);
  if (last) got = nchw(got.to(nc::Device::cpu()));
  EXPECT_EQ(got.dtype(), dtype);
  EXPECT_LT(relative_error(got, want), tolerance(dtype));
}

}  // namespace

TEST(Conv2dFused, MatchesConvAddReluOnTheCpu) {
  uint64_t seed = 100;
  for (const Case& c : cases())
    for (DType dtype : {DType::F64, DType::F32, DType::BF16})
      for (ConvLayout layout : {ConvLayout::NCHW, ConvLayout::NHWC})
        expect_matches_unfused(c, nc::Device::cpu(), dtype, layout, seed += 10);
}

TEST(Conv2dFused, ReluKeepsNaNAndBatchlessInput) {
  nc::autograd::NoGradGuard no_grad;
  Tensor x = nc::full({1, 1, 2, 2}, -1.0, DType::F32);
  const Tensor w = nc::ones({1, 1, 1, 1}, DType::F32);
  const Tensor r = nc::from_vector<float>({0.5f, NAN, 2.0f, 0.0f}, {1, 1, 2, 2});
  const std::vector<float> y = nc::conv2d_fused(x, w, Tensor(), r, true).to_vector<float>();
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_TRUE(std::isnan(y[1]));
  EXPECT_EQ(y[2], 1.0f);
  EXPECT_EQ(y[3], 0.0f);
  const Tensor batchless = nc::conv2d_fused(x.squeeze(0), w, Tensor(), r.squeeze(0), true);
  EXPECT_EQ(batchless.shape(), (nc::Shape{1, 2, 2}));
}

TEST(Conv2dFused, Errors) {
  const Tensor x = random({2, 4, 5, 5}, 1), w = random({6, 4, 3, 3}, 2);
  {
    nc::autograd::NoGradGuard no_grad;
    EXPECT_THROW(nc::conv2d_fused(x, w, Tensor(), random({2, 6, 5, 5}, 3), true), nc::ShapeError);  // no padding: 3x3
    EXPECT_THROW(nc::conv2d_fused(x, w, Tensor(), random({2, 6, 3, 3}, 3, DType::F64), true), nc::DTypeError);
    EXPECT_THROW(nc::conv2d_fused(x, w, Tensor(), Tensor(), true, 1, 0, 1, 1, ConvLayout::NHWC), nc::ShapeError);
    try {
      nc::conv2d_fused(x, w, random({5}, 4), Tensor(), false);
      ADD_FAILURE() << "a bias of the wrong width passed";
    } catch (const nc::ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find("conv2d_fused"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("bias"), std::string::npos) << e.what();
    }
  }
  Tensor trained = w.clone();
  trained.requires_grad_(true);
  try {
    nc::conv2d_fused(x, trained, Tensor(), Tensor(), true);
    ADD_FAILURE() << "a weight that requires grad passed";
  } catch (const nc::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("no backward"), std::string::npos) << e.what();
  }
}

TEST(FoldBatchNorm, EqualsConvThenBatchNormInEval) {
  nc::Generator gen(7);
  for (bool conv_bias : {false, true}) {
    for (ConvLayout layout : {ConvLayout::NCHW, ConvLayout::NHWC}) {
      SCOPED_TRACE(std::string(conv_bias ? "with" : "without") + " a conv bias, " +
                   (layout == ConvLayout::NHWC ? "NHWC" : "NCHW"));
      nc::nn::Conv2d conv(4, 6, 3, 1, 1, 1, 1, conv_bias, &gen);
      nc::nn::BatchNorm2d bn(6);
      nc::autograd::NoGradGuard no_grad;
      bn.running_mean.copy_(random({6}, 11));
      bn.running_var.copy_(nc::add(nc::mul(nc::abs(random({6}, 12)), 2.0), 0.1));
      bn.weight.copy_(random({6}, 13));
      bn.bias.copy_(random({6}, 14));
      conv.eval();
      bn.eval();
      const Tensor x = random({2, 4, 5, 5}, 15);
      const Tensor want = bn(conv(x));
      const nc::nn::ConvWeights folded = nc::nn::fold_batch_norm(conv, bn, layout);
      Tensor got;
      if (layout == ConvLayout::NHWC) {
        EXPECT_EQ(folded.weight.shape(), (nc::Shape{6, 3, 3, 4}));
        got = nchw(nc::conv2d_fused(nhwc(x), folded.weight, folded.bias, Tensor(), false, 1, 1, 1, 1, layout));
      } else {
        got = nc::conv2d(x, folded.weight, folded.bias, 1, 1);
      }
      EXPECT_LT(relative_error(got, want), 1e-5);
    }
  }
  nc::nn::Conv2d conv(4, 6, 3);
  nc::nn::BatchNorm2d wider(8), without_stats(6, 1e-5, 0.1, true, false);
  EXPECT_THROW(nc::nn::fold_batch_norm(conv, wider), nc::ShapeError);
  EXPECT_THROW(nc::nn::fold_batch_norm(conv, without_stats), nc::ValueError);
}

// A ResNet with BatchNorm statistics that are not the identity's, in eval mode.
std::shared_ptr<nc::nn::Module> trained_like_resnet(const std::string& name, uint64_t seed) {
  nc::Generator gen(seed);
  auto model = nc::models::resnet(name, 10, &gen);
  nc::autograd::NoGradGuard no_grad;
  for (auto& [key, t] : model->named_buffers()) {
    if (key.find("running_mean") != std::string::npos) t.copy_(nc::mul(random(t.shape(), ++seed), 0.1));
    if (key.find("running_var") != std::string::npos)
      t.copy_(nc::add(nc::mul(nc::abs(random(t.shape(), ++seed)), 0.5), 0.5));
  }
  model->eval();
  return model;
}

TEST(FuseResNet, MatchesTheModelOnTheCpu) {
  for (const std::string name : {"resnet18", "resnet50"}) {
    const auto model = trained_like_resnet(name, 21);
    const Tensor images = random({2, 3, 40, 40}, 22);
    nc::autograd::InferenceModeGuard inference;
    const Tensor want = (*model)(images);
    for (ConvLayout layout : {ConvLayout::NCHW, ConvLayout::NHWC}) {
      SCOPED_TRACE(name + (layout == ConvLayout::NHWC ? " NHWC" : " NCHW"));
      const auto fused = nc::models::fuse_resnet(*model, layout);
      EXPECT_LT(relative_error((*fused)(images), want), 1e-5);
    }
  }
  auto training = nc::models::resnet("resnet18", 10);
  EXPECT_THROW(nc::models::fuse_resnet(*training), nc::ValueError);
  nc::nn::Linear other(3, 4);
  EXPECT_THROW(nc::models::fuse_resnet(other), nc::ValueError);
}

TEST(Conv2dFusedCuda, MatchesConvAddReluInEveryDtype) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 500;
  for (const Case& c : cases())
    for (DType dtype : {DType::F64, DType::F32, DType::F16, DType::BF16})
      for (ConvLayout layout : {ConvLayout::NCHW, ConvLayout::NHWC})
        expect_matches_unfused(c, nc::Device::cuda(), dtype, layout, seed += 10);
}

TEST(FuseResNetCuda, MatchesTheModelInF32AndBf16) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const auto model = trained_like_resnet("resnet50", 31);
  const Tensor images = random({4, 3, 64, 64}, 32);
  nc::autograd::InferenceModeGuard inference;
  const Tensor want = (*model)(images);
  model->to(nc::Device::cuda());
  for (DType dtype : {DType::F32, DType::BF16}) {
    model->to(dtype);
    for (ConvLayout layout : {ConvLayout::NCHW, ConvLayout::NHWC}) {
      SCOPED_TRACE(std::string(nc::dtype_name(dtype)) + (layout == ConvLayout::NHWC ? " NHWC" : " NCHW"));
      const auto fused = nc::models::fuse_resnet(*model, layout);
      const Tensor got = (*fused)(images.to(nc::Device::cuda(), dtype));
      EXPECT_LT(relative_error(got, want), dtype == DType::F32 ? 1e-4 : 5e-2);
    }
  }
}
