// The functional ops' former names in nn (the losses, linear, gelu_mlp, dropout, embedding and
// nn::Reduction), kept as deprecated forwarders until a later release removes them: each gives
// the bits of the normcore:: op it forwards to, with every argument passed through.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "normcore/normcore.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;

namespace {

void expect_same(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.shape(), want.shape());
  ASSERT_EQ(got.dtype(), want.dtype());
  EXPECT_EQ(got.to(DType::F64).to_vector<double>(), want.to(DType::F64).to_vector<double>());
}

// The forwarders are what this file tests, so their deprecation warnings are expected here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

TEST(DeprecatedNnNames, LossesForward) {
  nc::Generator gen(7);
  const Tensor logits = nc::randn({4, 5}, DType::F32, &gen);
  const Tensor target = nc::from_vector<int64_t>({0, 4, 2, -1}, {4});
  const Tensor other = nc::randn({4, 5}, DType::F32, &gen);
  const Tensor probs = nc::rand({4, 5}, DType::F32, &gen);
  expect_same(nc::nn::cross_entropy(logits, target, nc::nn::Reduction::Sum, 0.1, -1),
              nc::cross_entropy(logits, target, nc::Reduction::Sum, 0.1, -1));
  const Tensor kept = nc::from_vector<int64_t>({0, 4, 2, 1}, {4});
  expect_same(nc::nn::nll_loss(nc::log_softmax(logits, 1), kept, nc::Reduction::None),
              nc::nll_loss(nc::log_softmax(logits, 1), kept, nc::Reduction::None));
  expect_same(nc::nn::mse_loss(logits, other), nc::mse_loss(logits, other));
  expect_same(nc::nn::l1_loss(logits, other, nc::Reduction::Sum), nc::l1_loss(logits, other, nc::Reduction::Sum));
  expect_same(nc::nn::binary_cross_entropy_with_logits(logits, probs),
              nc::binary_cross_entropy_with_logits(logits, probs));
  const Tensor x = nc::randn({4, 3}, DType::F32, &gen), weight = nc::randn({6, 3}, DType::F32, &gen);
  const Tensor classes = nc::from_vector<int64_t>({0, 4, 2, 4}, {4});
  expect_same(nc::nn::linear_cross_entropy(x, weight, classes, 5, 4),
              nc::linear_cross_entropy(x, weight, classes, 5, 4));
}

TEST(DeprecatedNnNames, LayerOpsForward) {
  nc::Generator gen(11);
  const Tensor x = nc::randn({2, 4}, DType::F32, &gen);
  const Tensor w1 = nc::randn({8, 4}, DType::F32, &gen), b1 = nc::randn({8}, DType::F32, &gen);
  const Tensor w2 = nc::randn({3, 8}, DType::F32, &gen), b2 = nc::randn({3}, DType::F32, &gen);
  expect_same(nc::nn::linear(x, w1, b1), nc::linear(x, w1, b1));
  expect_same(nc::nn::gelu_mlp(x, w1, b1, w2, b2, true), nc::gelu_mlp(x, w1, b1, w2, b2, true));
  nc::Generator first(3), second(3);
  expect_same(nc::nn::dropout(x, 0.5, true, &first), nc::dropout(x, 0.5, true, &second));
  const Tensor index = nc::from_vector<int64_t>({1, 0, 3}, {3});
  expect_same(nc::nn::embedding(w1, index, 0), nc::embedding(w1, index, 0));
}

#pragma GCC diagnostic pop

}  // namespace
