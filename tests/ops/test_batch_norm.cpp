// batch_norm (normcore/norms.h) and the BatchNorm1d / BatchNorm2d layers: values computed by
// hand and against a double-precision reference written here, large means, the running
// statistics (momentum, the cumulative average, in-place writes with their version counters,
// evaluation, no tracking), PyTorch's state_dict names, float64 gradchecks in training and in
// evaluation, and bad inputs. Where a GPU is present, the CUDA kernels against the CPU
// reference (values, running statistics, every gradient) in f64, f32, f16 and bf16 on both
// layouts: planes of 32 elements or more (split across blocks when a channel is long;
// 16-byte, narrower or scalar loads), and shorter planes or [N, C] as columns (one or many
// slices of the batch), plus unaligned inputs, empty ones, and determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "normcore/normcore.h"
#include "tests/test_support.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;
using normcore_test::throws;

namespace {

Tensor random(const nc::Shape& shape, uint64_t seed, DType dtype = DType::F64) {
  nc::Generator gen(seed);
  return nc::randn(shape, DType::F64, &gen).to(dtype);
}

// Positive values in [0.5, 1.5): running variances.
Tensor positive(const nc::Shape& shape, uint64_t seed, DType dtype = DType::F64) {
  nc::Generator gen(seed);
  return (nc::rand(shape, DType::F64, &gen) + 0.5).to(dtype);
}

std::vector<double> values(const Tensor& t) { return t.to(nc::Device::cpu(), DType::F64).to_vector<double>(); }

void expect_close(const std::vector<double>& actual, const std::vector<double>& expected, double tol,
                  const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], tol * (1 + std::fabs(expected[i]))) << what << " at " << i;
  }
}

const DType kFloatDTypes[] = {DType::F64, DType::F32, DType::F16, DType::BF16};

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::F64: return 1e-12;
    case DType::F32: return 1e-5;
    default: return 2e-2;
  }
}

// ---------------------------------------------------------------- reference
struct Reference {
  std::vector<double> y, running_mean, running_var;
};

// Batch norm in double over x [batch, channels, spatial]. Training: two-pass batch
// statistics, and the running ones moved toward them (the unbiased variance); evaluation:
// the running statistics.
Reference reference_batch_norm(const std::vector<double>& x, int64_t batch, int64_t channels, int64_t spatial,
                               const std::vector<double>& weight, const std::vector<double>& bias,
                               std::vector<double> running_mean, std::vector<double> running_var, bool training,
                               double momentum, double eps) {
  Reference out{std::vector<double>(x.size()), {}, {}};
  const auto at = [&](int64_t n, int64_t c, int64_t s) { return (n * channels + c) * spatial + s; };
  const double count = static_cast<double>(batch * spatial);
  for (int64_t c = 0; c < channels; ++c) {
    double mean = 0, var = 0;
    if (training) {
      for (int64_t n = 0; n < batch; ++n)
        for (int64_t s = 0; s < spatial; ++s) mean += x[at(n, c, s)];
      mean /= count;
      double sq = 0;
      for (int64_t n = 0; n < batch; ++n)
        for (int64_t s = 0; s < spatial; ++s) sq += (x[at(n, c, s)] - mean) * (x[at(n, c, s)] - mean);
      var = sq / count;
      if (!running_mean.empty()) running_mean[c] = (1 - momentum) * running_mean[c] + momentum * mean;
      if (!running_var.empty()) running_var[c] = (1 - momentum) * running_var[c] + momentum * sq / (count - 1);
    } else {
      mean = running_mean[c];
      var = running_var[c];
    }
    const double w = weight.empty() ? 1.0 : weight[c], b = bias.empty() ? 0.0 : bias[c];
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t s = 0; s < spatial; ++s) out.y[at(n, c, s)] = (x[at(n, c, s)] - mean) / std::sqrt(var + eps) * w + b;
  }
  out.running_mean = std::move(running_mean);
  out.running_var = std::move(running_var);
  return out;
}

int64_t spatial_of(const nc::Shape& shape) {
  int64_t s = 1;
  for (size_t d = 2; d < shape.size(); ++d) s *= shape[d];
  return s;
}

// ---------------------------------------------------------------- values
// x [2, 2, 2]: channel 0 holds 1, 2, 3, 4 (mean 2.5, variance 1.25, unbiased 5/3), channel 1
// holds 10, 10.5, 11, 12.5 (mean 11, variance 0.875, unbiased 3.5/3).
Tensor hand_x() { return nc::from_vector<double>({1, 2, 10, 10.5, 3, 4, 11, 12.5}, {2, 2, 2}); }

TEST(BatchNorm, HandComputedTraining) {
  const double eps = 1e-5;
  Tensor weight = nc::from_vector<double>({2, -1}, {2});
  Tensor bias = nc::from_vector<double>({0.5, 0}, {2});
  Tensor running_mean = nc::zeros({2}, DType::F64), running_var = nc::ones({2}, DType::F64);
  Tensor y = nc::batch_norm(hand_x(), running_mean, running_var, weight, bias, true, 0.1, eps);
  const double r0 = 1 / std::sqrt(1.25 + eps), r1 = 1 / std::sqrt(0.875 + eps);
  const std::vector<double> expected = {-1.5 * r0 * 2 + 0.5, -0.5 * r0 * 2 + 0.5, 1.0 * r1, 0.5 * r1,
                                        0.5 * r0 * 2 + 0.5,  1.5 * r0 * 2 + 0.5,  0.0,      -1.5 * r1};
  expect_close(values(y), expected, 1e-14, "y");
  expect_close(values(running_mean), {0.25, 1.1}, 1e-15, "running_mean");
  expect_close(values(running_var), {0.9 + 0.1 * 5.0 / 3.0, 0.9 + 0.1 * 3.5 / 3.0}, 1e-15, "running_var");
}

TEST(BatchNorm, HandComputedEvaluation) {
  const double eps = 1e-5;
  Tensor running_mean = nc::from_vector<double>({1, -1}, {2});
  Tensor running_var = nc::from_vector<double>({4, 0.25}, {2});
  Tensor y = nc::batch_norm(hand_x(), running_mean, running_var, Tensor(), nc::from_vector<double>({0, 3}, {2}), false,
                            0.1, eps);
  const double r0 = 1 / std::sqrt(4 + eps), r1 = 1 / std::sqrt(0.25 + eps);
  const std::vector<double> expected = {0 * r0, 1 * r0, 11 * r1 + 3, 11.5 * r1 + 3,
                                        2 * r0, 3 * r0, 12 * r1 + 3, 13.5 * r1 + 3};
  expect_close(values(y), expected, 1e-14, "y");
  EXPECT_EQ(values(running_mean), (std::vector<double>{1, -1}));
  EXPECT_EQ(values(running_var), (std::vector<double>{4, 0.25}));
}

struct ValueCase {
  nc::Shape shape;
  bool affine;
};

TEST(BatchNorm, MatchesReferenceInEveryDTypeAndMode) {
  const std::vector<ValueCase> cases = {
      {{4, 3}, true}, {{3, 2, 5}, true}, {{2, 3, 2, 2}, false}, {{2, 2, 1, 3, 2}, true}, {{5, 1, 40}, true},
  };
  for (const ValueCase& c : cases) {
    for (DType dtype : kFloatDTypes) {
      for (bool training : {true, false}) {
        const std::string what =
            nc::shape_str(c.shape) + " " + nc::dtype_name(dtype) + (training ? " training" : " evaluation");
        const int64_t channels = c.shape[1];
        Tensor x = random(c.shape, 1, dtype);
        Tensor weight = c.affine ? random({channels}, 2, dtype) : Tensor();
        Tensor bias = c.affine ? random({channels}, 3, dtype) : Tensor();
        Tensor running_mean = random({channels}, 4, dtype), running_var = positive({channels}, 5, dtype);
        const Reference expected =
            reference_batch_norm(values(x), c.shape[0], channels, spatial_of(c.shape),
                                 c.affine ? values(weight) : std::vector<double>(),
                                 c.affine ? values(bias) : std::vector<double>(), values(running_mean),
                                 values(running_var), training, 0.25, 1e-5);
        Tensor y = nc::batch_norm(x, running_mean, running_var, weight, bias, training, 0.25, 1e-5);
        ASSERT_EQ(y.shape(), c.shape) << what;
        ASSERT_EQ(y.dtype(), dtype) << what;
        expect_close(values(y), expected.y, tolerance(dtype), what + " y");
        expect_close(values(running_mean), expected.running_mean, tolerance(dtype), what + " running_mean");
        expect_close(values(running_var), expected.running_var, tolerance(dtype), what + " running_var");
      }
    }
  }
}

// With |mean| >> std, E[x^2] - E[x]^2 in float would lose every digit of the variance; the
// reference takes the float32 values as they are.
TEST(BatchNorm, LargeMeanKeepsVarianceAccurate) {
  Tensor x = (random({8, 3, 50}, 10) * 0.01 + 1e4).to(DType::F32);
  Tensor running_mean = nc::zeros({3}), running_var = nc::ones({3});
  const Reference expected =
      reference_batch_norm(values(x), 8, 3, 50, {}, {}, values(running_mean), values(running_var), true, 0.1, 1e-5);
  Tensor y = nc::batch_norm(x, running_mean, running_var, Tensor(), Tensor(), true, 0.1, 1e-5);
  expect_close(values(y), expected.y, 1e-4, "y");
  expect_close(values(running_var), expected.running_var, 1e-5, "running_var");
  Tensor columns = (random({300, 4}, 11) * 0.01 + 1e4).to(DType::F32);
  const Reference column_expected = reference_batch_norm(values(columns), 300, 4, 1, {}, {}, {}, {}, true, 0.1, 1e-5);
  expect_close(values(nc::batch_norm(columns, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5)),
               column_expected.y, 1e-4, "[N, C]");
}

// The running statistics are written in place, not recorded, with their version counters
// moved; a non-contiguous one is written through; only those given are updated.
TEST(BatchNorm, RunningStatisticsAreWrittenInPlace) {
  Tensor x = random({6, 3, 4}, 20).requires_grad_();
  Tensor running_mean = nc::zeros({3}, DType::F64);
  Tensor var_base = nc::ones({3, 2}, DType::F64);
  Tensor running_var = var_base.select(1, 0);  // stride 2
  ASSERT_FALSE(running_var.is_contiguous());
  const uint64_t mean_version = running_mean.version(), var_version = var_base.version();
  Tensor y = nc::batch_norm(x, running_mean, running_var, Tensor(), Tensor(), true, 0.5, 1e-5);
  EXPECT_GT(running_mean.version(), mean_version);
  EXPECT_GT(var_base.version(), var_version);
  EXPECT_FALSE(running_mean.requires_grad());
  EXPECT_EQ(running_mean.grad_fn_name(), "");
  EXPECT_EQ(y.grad_fn_name(), "batch_norm");
  const Reference expected = reference_batch_norm(values(x), 6, 3, 4, {}, {}, std::vector<double>(3, 0.0),
                                                  std::vector<double>(3, 1.0), true, 0.5, 1e-5);
  expect_close(values(running_mean), expected.running_mean, 1e-14, "running_mean");
  expect_close(values(running_var), expected.running_var, 1e-14, "running_var");
  EXPECT_EQ(values(var_base.select(1, 1)), std::vector<double>(3, 1.0));
  // Backward reads only what the forward saved: the updated statistics do not stale it.
  nc::sum(y * y).backward();
  EXPECT_EQ(x.grad().shape(), (nc::Shape{6, 3, 4}));

  Tensor only_mean = nc::zeros({3}, DType::F64);
  nc::batch_norm(x.detach(), only_mean, Tensor(), Tensor(), Tensor(), true, 1.0, 1e-5);
  expect_close(
      values(only_mean),
      reference_batch_norm(values(x), 6, 3, 4, {}, {}, std::vector<double>(3, 0.0), {}, true, 1.0, 1e-5).running_mean,
      1e-14, "running_mean alone");
}

// PyTorch leaves the running statistics alone on an empty batch; one value per channel
// cannot give an unbiased variance and is refused in training only.
TEST(BatchNorm, EmptyBatchAndOneValuePerChannel) {
  Tensor running_mean = nc::full({3}, 2.0, DType::F64), running_var = nc::full({3}, 3.0, DType::F64);
  Tensor weight = nc::ones({3}, DType::F64).requires_grad_();
  Tensor empty = nc::zeros({0, 3, 4}, DType::F64);
  Tensor y = nc::batch_norm(empty, running_mean, running_var, weight, Tensor(), true);
  EXPECT_EQ(y.shape(), (nc::Shape{0, 3, 4}));
  EXPECT_EQ(values(running_mean), std::vector<double>(3, 2.0));
  EXPECT_EQ(values(running_var), std::vector<double>(3, 3.0));
  nc::sum(y).backward();
  EXPECT_EQ(values(weight.grad()), std::vector<double>(3, 0.0));

  Tensor single = nc::from_vector<double>({1, 2, 3}, {1, 3});
  EXPECT_THROW(nc::batch_norm(single, running_mean, running_var, Tensor(), Tensor(), true), nc::ValueError);
  EXPECT_EQ(values(running_mean), std::vector<double>(3, 2.0));
  const double r = 1 / std::sqrt(3.0 + 1e-5);
  expect_close(values(nc::batch_norm(single, running_mean, running_var, Tensor(), Tensor(), false)), {-1 * r, 0, 1 * r},
               1e-14, "evaluation of one sample");
  // A constant channel has zero variance: the output is the bias, not NaN.
  EXPECT_EQ(values(nc::batch_norm(nc::full({4, 2}, 7.0), Tensor(), Tensor(), Tensor(), nc::full({2}, 0.5), true)),
            std::vector<double>(8, 0.5));
}

// ---------------------------------------------------------------- gradients
Tensor leaf(const nc::Shape& shape, uint64_t seed) { return random(shape, seed).requires_grad_(); }

struct GradCase {
  std::string name;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  std::vector<Tensor> inputs;
};

TEST(BatchNormGradcheck, TrainingAndEvaluation) {
  const Tensor none;
  const Tensor running_mean = random({3}, 30), running_var = positive({3}, 31);
  Tensor updated_mean = nc::zeros({3}, DType::F64), updated_var = nc::ones({3}, DType::F64);
  const std::vector<GradCase> cases = {
      {"training affine 3-D",
       [&](const std::vector<Tensor>& in) { return nc::batch_norm(in[0], none, none, in[1], in[2], true); },
       {leaf({4, 3, 2}, 32), leaf({3}, 33), leaf({3}, 34)}},
      {"training [N, C] with running statistics",
       [&](const std::vector<Tensor>& in) {
         return nc::batch_norm(in[0], updated_mean, updated_var, in[1], in[2], true, 0.1, 1e-3);
       },
       {leaf({5, 3}, 35), leaf({3}, 36), leaf({3}, 37)}},
      {"training 4-D, no affine",
       [&](const std::vector<Tensor>& in) { return nc::batch_norm(in[0], none, none, none, none, true); },
       {leaf({2, 3, 2, 2}, 38)}},
      {"training weight only",
       [&](const std::vector<Tensor>& in) { return nc::batch_norm(in[0], none, none, in[1], none, true); },
       {leaf({3, 3, 3}, 39), leaf({3}, 40)}},
      {"evaluation affine",
       [&](const std::vector<Tensor>& in) {
         return nc::batch_norm(in[0], running_mean, running_var, in[1], in[2], false);
       },
       {leaf({4, 3, 2}, 41), leaf({3}, 42), leaf({3}, 43)}},
      {"evaluation [N, C], no affine",
       [&](const std::vector<Tensor>& in) {
         return nc::batch_norm(in[0], running_mean, running_var, none, none, false);
       },
       {leaf({4, 3}, 44)}},
  };
  for (const GradCase& c : cases) {
    std::string report;
    EXPECT_TRUE(nc::gradcheck(c.fn, c.inputs, {}, &report)) << c.name << ": " << report;
  }
}

// In evaluation the statistics are constants: grad_x = dy * weight / sqrt(running_var + eps).
TEST(BatchNormGradcheck, EvaluationGradientIsScaledGradient) {
  Tensor x = random({3, 2, 2}, 45).requires_grad_();
  Tensor weight = nc::from_vector<double>({2, -3}, {2}).requires_grad_();
  Tensor running_var = nc::from_vector<double>({4, 9}, {2});
  Tensor y = nc::batch_norm(x, nc::zeros({2}, DType::F64), running_var, weight, Tensor(), false, 0.1, 1e-5);
  y.backward(nc::ones({3, 2, 2}, DType::F64));
  const double a = 2 / std::sqrt(4 + 1e-5), b = -3 / std::sqrt(9 + 1e-5);
  expect_close(values(x.grad()), {a, a, b, b, a, a, b, b, a, a, b, b}, 1e-14, "grad_x");
  // grad_weight = sum(dy * x / sqrt(var + eps)) per channel.
  std::vector<double> xv = values(x), expected(2, 0.0);
  for (int64_t i = 0; i < 12; ++i) expected[(i / 2) % 2] += xv[i] / std::sqrt((i / 2) % 2 == 0 ? 4 + 1e-5 : 9 + 1e-5);
  expect_close(values(weight.grad()), expected, 1e-13, "grad_weight");
}

// ---------------------------------------------------------------- layers
std::vector<std::string> names_of(const nc::nn::NamedTensors& tensors) {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : tensors) names.push_back(name);
  return names;
}

TEST(BatchNormLayers, StateDictNamesShapesAndValues) {
  using Names = std::vector<std::string>;
  nc::nn::BatchNorm2d layer(4);
  const nc::nn::NamedTensors state = layer.state_dict();
  EXPECT_EQ(names_of(state), (Names{"weight", "bias", "running_mean", "running_var", "num_batches_tracked"}));
  EXPECT_EQ(names_of(layer.named_parameters()), (Names{"weight", "bias"}));
  EXPECT_EQ(names_of(layer.named_buffers()), (Names{"running_mean", "running_var", "num_batches_tracked"}));
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(state[i].second.shape(), (nc::Shape{4})) << state[i].first;
  EXPECT_EQ(state[4].second.shape(), nc::Shape{});
  EXPECT_EQ(state[4].second.dtype(), DType::I64);
  EXPECT_EQ(state[4].second.item<int64_t>(), 0);
  EXPECT_EQ(values(layer.weight), std::vector<double>(4, 1.0));
  EXPECT_EQ(values(layer.bias), std::vector<double>(4, 0.0));
  EXPECT_EQ(values(layer.running_mean), std::vector<double>(4, 0.0));
  EXPECT_EQ(values(layer.running_var), std::vector<double>(4, 1.0));
  EXPECT_FALSE(layer.running_mean.requires_grad());

  nc::nn::BatchNorm1d plain(3, 1e-5, 0.1, false);
  EXPECT_TRUE(plain.named_parameters().empty());
  EXPECT_EQ(names_of(plain.state_dict()), (Names{"running_mean", "running_var", "num_batches_tracked"}));
  nc::nn::BatchNorm1d untracked(3, 1e-5, 0.1, true, false);
  EXPECT_EQ(names_of(untracked.state_dict()), (Names{"weight", "bias"}));
  EXPECT_FALSE(untracked.running_mean.defined());

  // Floating buffers follow the module's dtype; the counter stays i64.
  layer.to(DType::F64);
  EXPECT_EQ(layer.running_var.dtype(), DType::F64);
  EXPECT_EQ(layer.num_batches_tracked.dtype(), DType::I64);
}

TEST(BatchNormLayers, TrainingUpdatesBuffersAndEvaluationUsesThem) {
  nc::nn::BatchNorm2d layer(3, 1e-5, 0.2);
  Tensor x = random({4, 3, 2, 2}, 50, DType::F32);
  const std::vector<double> xv = values(x);
  Tensor y = layer(x);
  const Reference expected = reference_batch_norm(xv, 4, 3, 4, {}, {}, std::vector<double>(3, 0.0),
                                                  std::vector<double>(3, 1.0), true, 0.2, 1e-5);
  expect_close(values(y), expected.y, 1e-5, "training y");
  expect_close(values(layer.running_mean), expected.running_mean, 1e-6, "running_mean");
  expect_close(values(layer.running_var), expected.running_var, 1e-6, "running_var");
  EXPECT_EQ(layer.num_batches_tracked.item<int64_t>(), 1);
  nc::sum(y * y).backward();
  EXPECT_EQ(layer.weight.grad().shape(), (nc::Shape{3}));
  EXPECT_EQ(layer.bias.grad().shape(), (nc::Shape{3}));

  layer.eval();
  Tensor z = layer(x);
  const Reference eval_expected =
      reference_batch_norm(xv, 4, 3, 4, {}, {}, expected.running_mean, expected.running_var, false, 0.2, 1e-5);
  expect_close(values(z), eval_expected.y, 1e-5, "evaluation y");
  expect_close(values(layer.running_mean), expected.running_mean, 1e-6, "running_mean after evaluation");
  EXPECT_EQ(layer.num_batches_tracked.item<int64_t>(), 1);
}

// momentum nullopt: the running statistics are the cumulative average of the batches'.
TEST(BatchNormLayers, CumulativeAverageWithoutMomentum) {
  nc::nn::BatchNorm1d layer(2, 1e-5, std::nullopt);
  Tensor first = random({5, 2}, 60, DType::F32), second = random({7, 2, 3}, 61, DType::F32);
  layer(first);
  layer(second);
  EXPECT_EQ(layer.num_batches_tracked.item<int64_t>(), 2);
  const Reference a = reference_batch_norm(values(first), 5, 2, 1, {}, {}, {0, 0}, {1, 1}, true, 1.0, 1e-5);
  const Reference b = reference_batch_norm(values(second), 7, 2, 3, {}, {}, {0, 0}, {1, 1}, true, 1.0, 1e-5);
  expect_close(values(layer.running_mean),
               {(a.running_mean[0] + b.running_mean[0]) / 2, (a.running_mean[1] + b.running_mean[1]) / 2}, 1e-6,
               "running_mean");
  expect_close(values(layer.running_var),
               {(a.running_var[0] + b.running_var[0]) / 2, (a.running_var[1] + b.running_var[1]) / 2}, 1e-6,
               "running_var");
}

// Without running statistics, evaluation normalizes with the batch's as training does.
TEST(BatchNormLayers, WithoutRunningStatisticsUsesBatchStatistics) {
  nc::nn::BatchNorm1d layer(3, 1e-5, 0.1, true, false);
  Tensor x = random({6, 3, 5}, 70, DType::F32);
  const Reference expected = reference_batch_norm(values(x), 6, 3, 5, {}, {}, {}, {}, true, 0.1, 1e-5);
  expect_close(values(layer(x)), expected.y, 1e-5, "training");
  layer.eval();
  expect_close(values(layer(x)), expected.y, 1e-5, "evaluation");
}

TEST(BatchNormLayers, RejectWrongRankOrChannels) {
  nc::nn::BatchNorm1d one(3);
  nc::nn::BatchNorm2d two(3);
  throws<nc::ShapeError>([&] { two(nc::zeros({2, 3, 4})); }, {"BatchNorm2d", "4-D", "num_features = 3", "[2, 3, 4]"})();
  throws<nc::ShapeError>([&] { two(nc::zeros({2, 4, 2, 2})); }, {"BatchNorm2d", "num_features = 3", "[2, 4, 2, 2]"})();
  throws<nc::ShapeError>([&] { one(nc::zeros({2, 4})); }, {"BatchNorm1d", "2 or 3-D", "num_features = 3", "[2, 4]"})();
  throws<nc::ShapeError>([&] { one(nc::zeros({2, 3, 1, 1})); }, {"BatchNorm1d", "[2, 3, 1, 1]"})();
  throws<nc::ValueError>([&] { one(Tensor()); }, {"batch_norm", "'x'"})();
  throws<nc::DTypeError>([&] { one(nc::zeros({2, 3}, DType::F64)); }, {"batch_norm", "weight", "f64 [2, 3]"})();
  throws<nc::ValueError>([] { nc::nn::BatchNorm1d(-1); }, {"BatchNorm1d", "num_features", "-1"})();
  throws<nc::ValueError>([] { nc::nn::BatchNorm2d(3, 0.0); }, {"BatchNorm2d", "eps", "0"})();
  // A refused batch leaves the counter where it was.
  throws<nc::ValueError>([&] { one(nc::zeros({1, 3})); }, {"batch_norm", "more than 1 value per channel", "[1, 3]"})();
  EXPECT_EQ(one.num_batches_tracked.item<int64_t>(), 0);
  EXPECT_EQ(values(one(nc::ones({2, 3}))), std::vector<double>(6, 0.0));
}

// ---------------------------------------------------------------- CUDA against the CPU
struct CudaCase {
  std::string name;
  nc::Shape shape;
  bool affine = true;
  double offset = 0;        // added to x: a large mean (f64 and f32 only)
  bool misaligned = false;  // x starts one element past an aligned address on the GPU
};

// Tolerance for values of magnitude 1: the CPU rounds a double result once, the GPU
// accumulates in float (double for f64) and rounds once.
double gpu_tolerance(DType dtype) {
  switch (dtype) {
    case DType::F64: return 1e-10;
    case DType::F32: return 2e-5;
    case DType::F16: return 4e-3;
    default: return 3e-2;
  }
}

// Sums over many elements carry error relative to the largest term, not the result.
void expect_gpu_close(const Tensor& gpu, const Tensor& cpu, double tol, const std::string& what) {
  ASSERT_TRUE(gpu.defined()) << what;
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  const std::vector<double> got = values(gpu), expected = values(cpu);
  double scale = 1;
  for (double v : expected) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " at " << i;
    ASSERT_NEAR(got[i], expected[i], tol * (1 + std::fabs(expected[i]) + 1e-2 * scale))
        << what << " at " << i << " of " << got.size();
  }
}

// A GPU copy of t, starting one element past the start of its allocation.
Tensor misaligned_copy(const Tensor& t) {
  Tensor buffer = nc::zeros({t.numel() + 1}, nc::TensorOptions(t.dtype(), nc::Device::cuda()));
  Tensor view = buffer.narrow(0, 1, t.numel()).view(t.shape());
  view.copy_(t);
  return view;
}

void run_cuda_case(const CudaCase& c, DType dtype, bool training) {
  if (c.offset != 0 && dtype != DType::F64 && dtype != DType::F32) return;  // f16 cannot hold 1e4 + x
  SCOPED_TRACE(c.name + " " + nc::dtype_name(dtype) + (training ? " training" : " evaluation"));
  const nc::Device gpu = nc::Device::cuda();
  const int64_t channels = c.shape[1];
  Tensor x = random(c.shape, 80, DType::F64);
  if (c.offset != 0) x = x + c.offset;
  x = x.to(dtype);
  Tensor grad = random(c.shape, 81, dtype);
  std::vector<Tensor> cpu_in = {x.clone().requires_grad_()};
  if (c.affine) {
    cpu_in.push_back(random({channels}, 82, dtype).requires_grad_());
    cpu_in.push_back(random({channels}, 83, dtype).requires_grad_());
  }
  std::vector<Tensor> gpu_in = {(c.misaligned ? misaligned_copy(x) : x.to(gpu)).requires_grad_()};
  for (size_t i = 1; i < cpu_in.size(); ++i) gpu_in.push_back(cpu_in[i].detach().to(gpu).requires_grad_());
  Tensor cpu_mean = (random({channels}, 84) + c.offset).to(dtype), cpu_var = positive({channels}, 85, dtype);
  Tensor gpu_mean = cpu_mean.to(gpu), gpu_var = cpu_var.to(gpu);
  auto call = [&](const std::vector<Tensor>& in, const Tensor& mean, const Tensor& var) {
    return nc::batch_norm(in[0], mean, var, in.size() > 1 ? in[1] : Tensor(), in.size() > 2 ? in[2] : Tensor(),
                          training, 0.3, 1e-5);
  };
  Tensor cpu_y = call(cpu_in, cpu_mean, cpu_var), gpu_y = call(gpu_in, gpu_mean, gpu_var);
  EXPECT_TRUE(gpu_y.device().is_cuda());
  // A variance that cancelled (E[x^2] - E[x]^2) would be off by about offset^2 * roundoff.
  const double tol = gpu_tolerance(dtype) + 8 * c.offset * (dtype == DType::F64 ? 0x1p-53 : 0x1p-24);
  expect_gpu_close(gpu_y, cpu_y, tol, "y");
  expect_gpu_close(gpu_mean, cpu_mean, tol, "running_mean");
  expect_gpu_close(gpu_var, cpu_var, tol, "running_var");
  cpu_y.backward(grad);
  gpu_y.backward(grad.to(gpu));
  const char* names[] = {"grad_x", "grad_weight", "grad_bias"};
  for (size_t i = 0; i < cpu_in.size(); ++i) expect_gpu_close(gpu_in[i].grad(), cpu_in[i].grad(), 4 * tol, names[i]);
}

std::vector<CudaCase> cuda_cases() {
  return {
      {"planes 56x56, channels split across blocks", {16, 64, 56, 56}},
      {"planes 14x14, 8-byte loads in 16 bits", {16, 64, 14, 14}},
      {"planes of odd length, scalar loads", {5, 6, 7, 7}},
      {"planes, one block per channel", {2, 3, 40}},
      {"planes, many channels", {3, 700, 36}},
      {"planes, unaligned x", {4, 8, 64}, true, 0, true},
      {"planes, large mean", {6, 4, 500}, true, 1e4},
      {"planes, no affine", {3, 5, 9, 9}, false},
      {"columns [N, C], one slice", {64, 48}},
      {"columns [N, C], many slices", {8192, 24}},
      {"columns [N, C], wide rows", {40, 1000}},
      {"columns [N, C], odd", {33, 7}},
      {"columns [N, C, L]", {20, 6, 5}},
      {"columns 5x5 planes", {64, 32, 5, 5}},
      {"columns, unaligned x", {50, 12}, true, 0, true},
      {"columns, large mean", {300, 5, 3}, true, 1e4},
      {"columns, no affine", {100, 16}, false},
      {"empty batch", {0, 4, 5}},
      {"empty planes", {3, 4, 0}},
      {"no channels", {3, 0, 5}},
  };
}

TEST(BatchNormCuda, MatchesCpuOnEveryPath) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (const CudaCase& c : cuda_cases()) {
    for (DType dtype : kFloatDTypes) {
      for (bool training : {true, false}) run_cuda_case(c, dtype, training);
    }
  }
}

// Statistics and parameter gradients are reduced in a fixed order: two runs give the same bits.
TEST(BatchNormCuda, ResultsAreDeterministic) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const nc::Device gpu = nc::Device::cuda();
  for (const nc::Shape& shape : std::vector<nc::Shape>{{32, 64, 28, 28}, {4096, 96}}) {
    Tensor x = random(shape, 90, DType::F32).to(gpu);
    Tensor grad = random(shape, 91, DType::F32).to(gpu);
    auto run = [&]() {
      Tensor w = nc::ones({shape[1]}, gpu).requires_grad_();
      Tensor b = nc::zeros({shape[1]}, gpu).requires_grad_();
      Tensor running_mean = nc::zeros({shape[1]}, gpu), running_var = nc::ones({shape[1]}, gpu);
      Tensor xl = x.detach().requires_grad_();
      Tensor y = nc::batch_norm(xl, running_mean, running_var, w, b, true);
      y.backward(grad);
      return std::vector<Tensor>{y, running_mean, running_var, xl.grad(), w.grad(), b.grad()};
    };
    const std::vector<Tensor> first = run(), second = run();
    for (size_t i = 0; i < first.size(); ++i) {
      EXPECT_EQ(first[i].to(nc::Device::cpu()).to_vector<float>(), second[i].to(nc::Device::cpu()).to_vector<float>())
          << nc::shape_str(shape) << " result " << i;
    }
  }
}

// The layer on the GPU keeps its buffers there and matches the CPU layer step by step.
TEST(BatchNormCuda, LayerMatchesCpu) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  nc::nn::BatchNorm2d cpu_layer(5, 1e-5, std::nullopt), gpu_layer(5, 1e-5, std::nullopt);
  gpu_layer.to(nc::Device::cuda());
  for (uint64_t step = 0; step < 3; ++step) {
    if (step == 2) {
      cpu_layer.eval();
      gpu_layer.eval();
    }
    Tensor x = random({4, 5, 6, 6}, 100 + step, DType::F32);
    expect_gpu_close(gpu_layer(x.to(nc::Device::cuda())), cpu_layer(x), 2e-5, "y");
    expect_gpu_close(gpu_layer.running_mean, cpu_layer.running_mean, 2e-5, "running_mean");
    expect_gpu_close(gpu_layer.running_var, cpu_layer.running_var, 2e-5, "running_var");
    EXPECT_EQ(gpu_layer.num_batches_tracked.item<int64_t>(), cpu_layer.num_batches_tracked.item<int64_t>());
  }
  EXPECT_TRUE(gpu_layer.running_mean.device().is_cuda());
}

}  // namespace
