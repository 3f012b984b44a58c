// Normalization ops (normcore/norms.h) and their layers: values against a plain
// double-precision reference written here, awkward inputs (large mean, zero rows, empty,
// non-contiguous), float64 gradchecks and argument errors. test_norms_cuda.cpp checks the
// CUDA kernels against the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "normcore/normcore.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;

namespace {

Tensor random(const nc::Shape& shape, uint64_t seed, DType dtype = DType::F64) {
  nc::Generator gen(seed);
  return nc::randn(shape, DType::F64, &gen).to(dtype);
}

std::vector<double> values(const Tensor& t) { return t.to(DType::F64).to_vector<double>(); }

int64_t numel(const nc::Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// Group norm in double: x [batch, groups * group_channels, spatial]; layer norm is the
// case groups = 1, spatial = 1 with channels = row_len.
std::vector<double> reference_group_norm(const std::vector<double>& x, int64_t batch, int64_t groups, int64_t channels,
                                         int64_t spatial, const std::vector<double>& weight,
                                         const std::vector<double>& bias, double eps) {
  std::vector<double> y(x.size());
  const int64_t group_len = channels / groups * spatial;
  for (int64_t r = 0; r < batch * groups; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < group_len; ++i) mean += x[r * group_len + i];
    mean /= static_cast<double>(group_len);
    for (int64_t i = 0; i < group_len; ++i) var += (x[r * group_len + i] - mean) * (x[r * group_len + i] - mean);
    var /= static_cast<double>(group_len);
    for (int64_t i = 0; i < group_len; ++i) {
      int64_t c = (r % groups) * (channels / groups) + i / spatial;
      double v = (x[r * group_len + i] - mean) / std::sqrt(var + eps);
      y[r * group_len + i] = v * (weight.empty() ? 1.0 : weight[c]) + (bias.empty() ? 0.0 : bias[c]);
    }
  }
  return y;
}

// RMS norm in double over rows of row_len: x / sqrt(mean(x^2) + eps) * weight.
std::vector<double> reference_rms_norm(const std::vector<double>& x, int64_t row_len, const std::vector<double>& weight,
                                       double eps) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r * row_len < x.size(); ++r) {
    double squares = 0;
    for (int64_t i = 0; i < row_len; ++i) squares += x[r * row_len + i] * x[r * row_len + i];
    const double rstd = 1 / std::sqrt(squares / static_cast<double>(row_len) + eps);
    for (int64_t i = 0; i < row_len; ++i) {
      y[r * row_len + i] = x[r * row_len + i] * rstd * (weight.empty() ? 1.0 : weight[i]);
    }
  }
  return y;
}

std::vector<double> reference_l1_norm(const std::vector<double>& x, int64_t outer, int64_t size, int64_t inner,
                                      double eps) {
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < inner; ++j) {
      double total = 0;
      for (int64_t k = 0; k < size; ++k) total += std::fabs(x[(o * size + k) * inner + j]);
      double denom = std::max(total / static_cast<double>(size), eps);
      for (int64_t k = 0; k < size; ++k) y[(o * size + k) * inner + j] = x[(o * size + k) * inner + j] / denom;
    }
  }
  return y;
}

void expect_close(const std::vector<double>& actual, const std::vector<double>& expected, double tol,
                  const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], tol * (1 + std::fabs(expected[i]))) << what << " at " << i;
  }
}

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::F64: return 1e-12;
    case DType::F32: return 1e-5;
    default: return 2e-2;
  }
}

const DType kFloatDTypes[] = {DType::F64, DType::F32, DType::F16, DType::BF16};

struct LayerCase {
  nc::Shape shape;
  nc::Shape normalized_shape;
  bool affine;
};

TEST(NormLayerNorm, MatchesReference) {
  const std::vector<LayerCase> cases = {
      {{4, 1}, {1}, true},       {{3, 7}, {7}, true},       {{2, 3, 65}, {65}, false},
      {{2, 1000}, {1000}, true}, {{2, 5, 3}, {5, 3}, true}, {{7}, {7}, false},
  };
  for (const LayerCase& c : cases) {
    for (DType dtype : kFloatDTypes) {
      const std::string what = nc::shape_str(c.shape) + " " + nc::dtype_name(dtype);
      Tensor x = random(c.shape, 1, dtype);
      Tensor weight = c.affine ? random(c.normalized_shape, 2, dtype) : Tensor();
      Tensor bias = c.affine ? random(c.normalized_shape, 3, dtype) : Tensor();
      Tensor y = nc::layer_norm(x, c.normalized_shape, weight, bias, 1e-5);
      ASSERT_EQ(y.shape(), c.shape) << what;
      ASSERT_EQ(y.dtype(), dtype) << what;
      int64_t row_len = numel(c.normalized_shape);
      auto expected = reference_group_norm(values(x), numel(c.shape) / row_len, 1, row_len, 1,
                                           c.affine ? values(weight) : std::vector<double>(),
                                           c.affine ? values(bias) : std::vector<double>(), 1e-5);
      expect_close(values(y), expected, tolerance(dtype), what);
    }
  }
}

TEST(NormRMSNorm, MatchesReference) {
  const std::vector<LayerCase> cases = {
      {{4, 1}, {1}, true},       {{3, 7}, {7}, true},       {{2, 3, 65}, {65}, false},
      {{2, 1000}, {1000}, true}, {{2, 5, 3}, {5, 3}, true}, {{7}, {7}, false},
  };
  for (const LayerCase& c : cases) {
    for (DType dtype : kFloatDTypes) {
      const std::string what = nc::shape_str(c.shape) + " " + nc::dtype_name(dtype);
      Tensor x = random(c.shape, 4, dtype) + 3.0;  // a mean far from 0: nothing is centered
      Tensor weight = c.affine ? random(c.normalized_shape, 5, dtype) : Tensor();
      Tensor y = nc::rms_norm(x, c.normalized_shape, weight, 1e-6);
      ASSERT_EQ(y.shape(), c.shape) << what;
      ASSERT_EQ(y.dtype(), dtype) << what;
      auto expected = reference_rms_norm(values(x), numel(c.normalized_shape),
                                         c.affine ? values(weight) : std::vector<double>(), 1e-6);
      expect_close(values(y), expected, tolerance(dtype), what);
    }
  }
  // A zero row: rstd = 1 / sqrt(eps), y = 0, and a finite gradient.
  Tensor zero = nc::zeros({2, 8}, DType::F64).requires_grad_();
  Tensor y = nc::rms_norm(zero, {8}, Tensor(), 1e-6);
  EXPECT_EQ(values(y), std::vector<double>(16, 0.0));
  y.backward(nc::ones_like(y));
  for (double g : values(zero.grad())) EXPECT_DOUBLE_EQ(g, 1e3);  // rstd = 1 / sqrt(1e-6)
}

struct GroupCase {
  nc::Shape shape;
  int64_t groups;
  bool affine;
};

TEST(NormGroupNorm, MatchesReference) {
  const std::vector<GroupCase> cases = {
      {{2, 6, 5}, 3, true}, {{2, 4, 3, 3}, 2, true}, {{3, 4}, 4, true}, {{2, 6, 4}, 1, false}, {{1, 8, 2, 5}, 8, false},
  };
  for (const GroupCase& c : cases) {
    for (DType dtype : kFloatDTypes) {
      const std::string what =
          nc::shape_str(c.shape) + " groups " + std::to_string(c.groups) + " " + nc::dtype_name(dtype);
      Tensor x = random(c.shape, 4, dtype);
      Tensor weight = c.affine ? random({c.shape[1]}, 5, dtype) : Tensor();
      Tensor bias = c.affine ? random({c.shape[1]}, 6, dtype) : Tensor();
      Tensor y = nc::group_norm(x, c.groups, weight, bias, 1e-5);
      ASSERT_EQ(y.shape(), c.shape) << what;
      int64_t spatial = numel(c.shape) / (c.shape[0] * c.shape[1]);
      auto expected = reference_group_norm(values(x), c.shape[0], c.groups, c.shape[1], spatial,
                                           c.affine ? values(weight) : std::vector<double>(),
                                           c.affine ? values(bias) : std::vector<double>(), 1e-5);
      expect_close(values(y), expected, tolerance(dtype), what);
    }
  }
}

TEST(NormL1Norm, MatchesReferenceAlongEachDim) {
  const nc::Shape shape = {3, 4, 5};
  struct DimCase {
    int64_t dim;
    int64_t outer, size, inner;
  };
  const std::vector<DimCase> cases = {{0, 1, 3, 20}, {1, 3, 4, 5}, {-1, 12, 5, 1}, {2, 12, 5, 1}};
  for (const DimCase& c : cases) {
    for (DType dtype : kFloatDTypes) {
      Tensor x = random(shape, 7, dtype);
      Tensor y = nc::l1_norm(x, c.dim);
      auto expected = reference_l1_norm(values(x), c.outer, c.size, c.inner, 1e-12);
      expect_close(values(y), expected, tolerance(dtype), "dim " + std::to_string(c.dim) + " " + nc::dtype_name(dtype));
    }
  }
  Tensor vec = random({65}, 8);
  expect_close(values(nc::l1_norm(vec, 0)), reference_l1_norm(values(vec), 1, 65, 1, 1e-12), 1e-12, "1-D");
}

TEST(NormFrobeniusNorm, MatchesReference) {
  for (const nc::Shape& shape : std::vector<nc::Shape>{{1}, {7}, {3, 65}, {2, 10, 50}}) {
    for (DType dtype : kFloatDTypes) {
      Tensor x = random(shape, 9, dtype);
      std::vector<double> xv = values(x), expected(xv.size());
      double squares = 0;
      for (double v : xv) squares += v * v;
      for (size_t i = 0; i < xv.size(); ++i) expected[i] = xv[i] / std::sqrt(squares);
      expect_close(values(nc::frobenius_norm(x)), expected, tolerance(dtype), nc::shape_str(shape));
    }
  }
}

// With |mean| >> std, E[x^2] - E[x]^2 in f32 would lose every digit of the variance.
TEST(NormLayerNorm, LargeMeanKeepsVarianceAccurate) {
  Tensor x = (random({4, 1000}, 10) * 0.01 + 1e4).to(DType::F32);
  Tensor y = nc::layer_norm(x, {1000}, Tensor(), Tensor(), 1e-5);
  expect_close(values(y), reference_group_norm(values(x), 4, 1, 1000, 1, {}, {}, 1e-5), 1e-4, "layer_norm");
  Tensor images = (random({2, 4, 8, 8}, 11) * 0.01 + 1e4).to(DType::F32);
  Tensor z = nc::group_norm(images, 2, Tensor(), Tensor(), 1e-5);
  expect_close(values(z), reference_group_norm(values(images), 2, 2, 4, 64, {}, {}, 1e-5), 1e-4, "group_norm");
}

bool all_finite(const Tensor& t) {
  for (double v : values(t)) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

// A zero row (or tensor) normalizes to zeros; its gradient is the clamp's, grad / eps,
// because the norm's subgradient at 0 is taken as 0.
TEST(NormZeroInput, GivesZerosAndFiniteGradients) {
  Tensor x = nc::from_vector<double>({0, 0, 0, 1, -2, 3}, {2, 3}).requires_grad_();
  Tensor y = nc::l1_norm(x, 1, 1e-3);
  EXPECT_EQ(values(y), (std::vector<double>{0, 0, 0, 0.5, -1, 1.5}));
  y.backward(nc::ones({2, 3}, DType::F64));
  ASSERT_TRUE(all_finite(x.grad()));
  std::vector<double> grad = values(x.grad());
  for (int i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(grad[i], 1e3);

  Tensor zero = nc::zeros({4, 5}, DType::F64).requires_grad_();
  Tensor f = nc::frobenius_norm(zero, 1e-3);
  EXPECT_EQ(values(f), std::vector<double>(20, 0.0));
  f.backward(nc::ones({4, 5}, DType::F64));
  EXPECT_EQ(values(zero.grad()), std::vector<double>(20, 1e3));

  // Constant rows have zero variance: layer norm gives bias, not NaN.
  Tensor constant = nc::full({2, 4}, 3.0, DType::F32);
  EXPECT_EQ(values(nc::layer_norm(constant, {4}, Tensor(), Tensor())), std::vector<double>(8, 0.0));
  EXPECT_TRUE(all_finite(nc::l1_norm(nc::zeros({3, 4}), 0)));
  EXPECT_TRUE(all_finite(nc::frobenius_norm(nc::zeros({3}, DType::BF16))));
}

TEST(NormEmpty, GivesEmptyResults) {
  Tensor w = nc::ones({5}, DType::F64).requires_grad_();
  Tensor x = nc::zeros({0, 5}, DType::F64).requires_grad_();
  Tensor y = nc::layer_norm(x, {5}, w, Tensor());
  EXPECT_EQ(y.shape(), (nc::Shape{0, 5}));
  nc::sum(y).backward();
  EXPECT_EQ(x.grad().shape(), (nc::Shape{0, 5}));
  EXPECT_EQ(values(w.grad()), std::vector<double>(5, 0.0));
  EXPECT_EQ(nc::layer_norm(nc::zeros({3, 0}), {0}, Tensor(), Tensor()).shape(), (nc::Shape{3, 0}));
  EXPECT_EQ(nc::group_norm(nc::zeros({0, 4, 3}), 2, Tensor(), Tensor()).shape(), (nc::Shape{0, 4, 3}));
  EXPECT_EQ(nc::group_norm(nc::zeros({2, 4, 0}), 2, Tensor(), Tensor()).shape(), (nc::Shape{2, 4, 0}));
  EXPECT_EQ(nc::l1_norm(nc::zeros({0, 3}), 1).shape(), (nc::Shape{0, 3}));
  EXPECT_EQ(nc::l1_norm(nc::zeros({3, 0}), 1).shape(), (nc::Shape{3, 0}));
  EXPECT_EQ(nc::frobenius_norm(nc::zeros({0})).shape(), (nc::Shape{0}));
}

TEST(NormNonContiguous, MatchesContiguousInput) {
  Tensor base = random({6, 5, 4}, 12);
  Tensor strided = base.transpose(0, 2);  // [4, 5, 6]
  Tensor packed = strided.contiguous();
  ASSERT_FALSE(strided.is_contiguous());
  Tensor weight = random({6}, 13).slice(0, 0, 6);
  EXPECT_EQ(values(nc::layer_norm(strided, {6}, weight, Tensor())),
            values(nc::layer_norm(packed, {6}, weight, Tensor())));
  Tensor gw = random({12}, 14).slice(0, 0, 12, 2);
  ASSERT_FALSE(gw.is_contiguous());
  EXPECT_EQ(values(nc::group_norm(strided, 5, gw.slice(0, 0, 5), Tensor())),
            values(nc::group_norm(packed, 5, gw.slice(0, 0, 5), Tensor())));
  EXPECT_EQ(values(nc::l1_norm(strided, 1)), values(nc::l1_norm(packed, 1)));
  EXPECT_EQ(values(nc::frobenius_norm(strided)), values(nc::frobenius_norm(packed)));
}

Tensor leaf(const nc::Shape& shape, uint64_t seed) { return random(shape, seed).requires_grad_(); }

struct GradCase {
  std::string name;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  std::vector<Tensor> inputs;
};

TEST(NormGradcheck, EveryOpWithAndWithoutParameters) {
  const std::vector<GradCase> cases = {
      {"layer_norm",
       [](const std::vector<Tensor>& in) { return nc::layer_norm(in[0], {7}, Tensor(), Tensor()); },
       {leaf({3, 7}, 20)}},
      {"layer_norm affine",
       [](const std::vector<Tensor>& in) {
         return nc::layer_norm(in[0], {3, 4}, in[1], in[2]);
       },
       {leaf({2, 3, 4}, 21), leaf({3, 4}, 22), leaf({3, 4}, 23)}},
      {"layer_norm weight only",
       [](const std::vector<Tensor>& in) { return nc::layer_norm(in[0], {5}, in[1], Tensor()); },
       {leaf({4, 5}, 24), leaf({5}, 25)}},
      {"layer_norm row_len 1",
       [](const std::vector<Tensor>& in) { return nc::layer_norm(in[0], {1}, in[1], in[2]); },
       {leaf({3, 1}, 26), leaf({1}, 27), leaf({1}, 28)}},
      {"rms_norm",
       [](const std::vector<Tensor>& in) { return nc::rms_norm(in[0], {7}, Tensor()); },
       {leaf({3, 7}, 90)}},
      {"rms_norm weight, 2 dims",
       [](const std::vector<Tensor>& in) {
         return nc::rms_norm(in[0], {3, 4}, in[1]);
       },
       {leaf({2, 3, 4}, 91), leaf({3, 4}, 92)}},
      {"rms_norm row_len 1",
       [](const std::vector<Tensor>& in) { return nc::rms_norm(in[0], {1}, in[1]); },
       {leaf({3, 1}, 93), leaf({1}, 94)}},
      {"group_norm",
       [](const std::vector<Tensor>& in) { return nc::group_norm(in[0], 2, Tensor(), Tensor()); },
       {leaf({2, 4, 3}, 30)}},
      {"group_norm affine 4-D",
       [](const std::vector<Tensor>& in) { return nc::group_norm(in[0], 3, in[1], in[2]); },
       {leaf({2, 6, 2, 3}, 31), leaf({6}, 32), leaf({6}, 33)}},
      {"group_norm 2-D",
       [](const std::vector<Tensor>& in) { return nc::group_norm(in[0], 2, in[1], in[2]); },
       {leaf({3, 4}, 34), leaf({4}, 35), leaf({4}, 36)}},
      {"l1_norm dim 0", [](const std::vector<Tensor>& in) { return nc::l1_norm(in[0], 0); }, {leaf({3, 4, 2}, 40)}},
      {"l1_norm dim 1", [](const std::vector<Tensor>& in) { return nc::l1_norm(in[0], 1); }, {leaf({3, 4, 2}, 41)}},
      {"l1_norm dim -1", [](const std::vector<Tensor>& in) { return nc::l1_norm(in[0], -1); }, {leaf({3, 4, 2}, 42)}},
      {"frobenius_norm", [](const std::vector<Tensor>& in) { return nc::frobenius_norm(in[0]); }, {leaf({3, 5}, 50)}},
  };
  for (const GradCase& c : cases) {
    std::string report;
    EXPECT_TRUE(nc::gradcheck(c.fn, c.inputs, {}, &report)) << c.name << ": " << report;
  }
}

// Only the parameters need grad: the node is still recorded and reaches them.
TEST(NormGradcheck, ParametersAlone) {
  Tensor x = random({4, 6}, 60);
  auto fn = [x](const std::vector<Tensor>& in) { return nc::layer_norm(x, {6}, in[0], in[1]); };
  std::string report;
  EXPECT_TRUE(nc::gradcheck(fn, {leaf({6}, 61), leaf({6}, 62)}, {}, &report)) << report;
  Tensor images = random({2, 4, 5}, 63);
  auto group_fn = [images](const std::vector<Tensor>& in) { return nc::group_norm(images, 2, in[0], in[1]); };
  EXPECT_TRUE(nc::gradcheck(group_fn, {leaf({4}, 64), leaf({4}, 65)}, {}, &report)) << report;
}

TEST(NormAutograd, RecordsOneNamedNode) {
  Tensor x = leaf({2, 4}, 70);
  EXPECT_EQ(nc::layer_norm(x, {4}, Tensor(), Tensor()).grad_fn_name(), "layer_norm");
  EXPECT_EQ(nc::group_norm(x, 2, Tensor(), Tensor()).grad_fn_name(), "group_norm");
  EXPECT_EQ(nc::rms_norm(x, {4}, Tensor()).grad_fn_name(), "rms_norm");
  EXPECT_EQ(nc::l1_norm(x).grad_fn_name(), "l1_norm");
  EXPECT_EQ(nc::frobenius_norm(x).grad_fn_name(), "frobenius_norm");
  EXPECT_FALSE(nc::layer_norm(x.detach(), {4}, Tensor(), Tensor()).requires_grad());
}

struct BadCall {
  std::string name;
  std::function<void()> call;
  std::function<void(const std::function<void()>&)> expect_type;
  std::vector<std::string> fragments;  // each must appear in the message
};

template <class E>
BadCall bad(std::string name, std::function<void()> call, std::vector<std::string> fragments) {
  return {std::move(name), std::move(call), [](const std::function<void()>& f) { EXPECT_THROW(f(), E); },
          std::move(fragments)};
}

TEST(NormErrors, NameOpArgumentAndShapes) {
  Tensor x = nc::zeros({2, 6, 3});
  Tensor none;
  const std::vector<BadCall> cases = {
      bad<nc::ShapeError>("normalized_shape mismatch", [&] { nc::layer_norm(x, {4}, none, none); },
                          {"layer_norm", "normalized_shape", "[4]", "[2, 6, 3]"}),
      bad<nc::ShapeError>("normalized_shape longer than x",
                          [&] {
                            nc::layer_norm(x, {1, 2, 6, 3}, none, none);
                          },
                          {"layer_norm", "normalized_shape", "[1, 2, 6, 3]"}),
      bad<nc::ShapeError>("empty normalized_shape", [&] { nc::layer_norm(x, {}, none, none); },
                          {"layer_norm", "normalized_shape"}),
      bad<nc::ShapeError>("layer_norm weight shape", [&] { nc::layer_norm(x, {3}, nc::ones({4}), none); },
                          {"layer_norm", "weight", "[3]", "[4]"}),
      bad<nc::ShapeError>("layer_norm bias shape",
                          [&] {
                            nc::layer_norm(x, {6, 3}, none, nc::zeros({3}));
                          },
                          {"layer_norm", "bias", "[6, 3]", "[3]"}),
      bad<nc::DTypeError>("layer_norm weight dtype", [&] { nc::layer_norm(x, {3}, nc::ones({3}, DType::F64), none); },
                          {"layer_norm", "weight", "f64"}),
      bad<nc::DTypeError>("integer x",
                          [&] {
                            nc::layer_norm(nc::zeros({2, 3}, DType::I64), {3}, none, none);
                          },
                          {"layer_norm", "x", "i64"}),
      bad<nc::ValueError>("layer_norm eps", [&] { nc::layer_norm(x, {3}, none, none, 0.0); }, {"layer_norm", "eps"}),
      bad<nc::ShapeError>("rms_norm normalized_shape", [&] { nc::rms_norm(x, {6}, none); },
                          {"rms_norm", "normalized_shape", "[6]", "[2, 6, 3]"}),
      bad<nc::ShapeError>("rms_norm weight shape",
                          [&] {
                            nc::rms_norm(x, {6, 3}, nc::ones({3}));
                          },
                          {"rms_norm", "weight", "[6, 3]", "[3]"}),
      bad<nc::DTypeError>("rms_norm weight dtype", [&] { nc::rms_norm(x, {3}, nc::ones({3}, DType::BF16)); },
                          {"rms_norm", "weight", "bf16"}),
      bad<nc::DTypeError>("rms_norm integer x",
                          [&] {
                            nc::rms_norm(nc::zeros({2, 3}, DType::I32), {3}, none);
                          },
                          {"rms_norm", "x", "i32"}),
      bad<nc::ValueError>("rms_norm eps", [&] { nc::rms_norm(x, {3}, none, 0.0); }, {"rms_norm", "eps"}),
      bad<nc::ShapeError>("group_norm channels", [&] { nc::group_norm(x, 4, none, none); },
                          {"group_norm", "num_groups = 4", "C = 6", "[2, 6, 3]"}),
      bad<nc::ValueError>("group_norm zero groups", [&] { nc::group_norm(x, 0, none, none); },
                          {"group_norm", "num_groups"}),
      bad<nc::ShapeError>("group_norm 1-D", [&] { nc::group_norm(nc::zeros({6}), 2, none, none); },
                          {"group_norm", "x", "[6]"}),
      bad<nc::ShapeError>("group_norm weight", [&] { nc::group_norm(x, 3, nc::ones({3}), none); },
                          {"group_norm", "weight", "[6]", "[3]"}),
      bad<nc::ShapeError>("group_norm bias",
                          [&] {
                            nc::group_norm(x, 3, none, nc::ones({6, 1}));
                          },
                          {"group_norm", "bias", "[6]", "[6, 1]"}),
      bad<nc::ValueError>("group_norm eps", [&] { nc::group_norm(x, 3, none, none, -1.0); }, {"group_norm", "eps"}),
      bad<nc::IndexError>("l1_norm dim", [&] { nc::l1_norm(x, 3); }, {"l1_norm"}),
      bad<nc::DTypeError>("l1_norm dtype", [&] { nc::l1_norm(nc::zeros({3}, DType::I32), 0); }, {"l1_norm", "i32"}),
      bad<nc::ValueError>("l1_norm eps", [&] { nc::l1_norm(x, 1, 0.0); }, {"l1_norm", "eps"}),
      bad<nc::DTypeError>("frobenius_norm dtype", [&] { nc::frobenius_norm(nc::zeros({3}, DType::Bool)); },
                          {"frobenius_norm", "x"}),
      bad<nc::ValueError>("frobenius_norm eps", [&] { nc::frobenius_norm(x, -1e-12); }, {"frobenius_norm", "eps"}),
      bad<nc::Error>("undefined x", [&] { nc::frobenius_norm(none); }, {"frobenius_norm", "x"}),
  };
  for (const BadCall& c : cases) {
    SCOPED_TRACE(c.name);
    c.expect_type(c.call);
    try {
      c.call();
    } catch (const nc::Error& e) {
      const std::string message = e.what();
      for (const std::string& fragment : c.fragments) {
        EXPECT_NE(message.find(fragment), std::string::npos) << "'" << fragment << "' not in: " << message;
      }
    }
  }
}

std::vector<std::string> parameter_names(const nc::nn::Module& m) {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : m.named_parameters()) names.push_back(name);
  return names;
}

TEST(NormLayers, ParametersAndForward) {
  using Names = std::vector<std::string>;
  nc::nn::LayerNorm layer({4, 3});
  EXPECT_EQ(parameter_names(layer), (Names{"weight", "bias"}));
  EXPECT_EQ(values(layer.weight), std::vector<double>(12, 1.0));
  EXPECT_EQ(values(layer.bias), std::vector<double>(12, 0.0));
  EXPECT_EQ(parameter_names(nc::nn::LayerNorm({3}, 1e-5, true, false)), (Names{"weight"}));
  EXPECT_TRUE(parameter_names(nc::nn::LayerNorm({3}, 1e-5, false)).empty());
  nc::nn::RMSNorm rms({4, 3});
  EXPECT_EQ(parameter_names(rms), (Names{"weight"}));
  EXPECT_EQ(values(rms.weight), std::vector<double>(12, 1.0));
  EXPECT_EQ(rms.eps, 1e-6);
  EXPECT_TRUE(parameter_names(nc::nn::RMSNorm({3}, 1e-6, false)).empty());
  EXPECT_THROW(nc::nn::RMSNorm({3}, 0.0), nc::ValueError);
  EXPECT_THROW(nc::nn::RMSNorm({-1}), nc::ValueError);
  nc::nn::GroupNorm group(2, 6);
  EXPECT_EQ(parameter_names(group), (Names{"weight", "bias"}));
  EXPECT_EQ(group.weight.shape(), (nc::Shape{6}));
  EXPECT_TRUE(parameter_names(nc::nn::GroupNorm(2, 6, 1e-5, false)).empty());
  nc::nn::L1Norm l1;
  nc::nn::FrobeniusNorm frobenius;
  EXPECT_TRUE(parameter_names(l1).empty());
  EXPECT_TRUE(parameter_names(frobenius).empty());
  EXPECT_THROW(nc::nn::GroupNorm(4, 6), nc::ValueError);

  Tensor x = random({2, 4, 3}, 80, DType::F32);
  Tensor y = layer(x);
  expect_close(values(y), reference_group_norm(values(x), 2, 1, 12, 1, {}, {}, 1e-5), 1e-5, "LayerNorm");
  nc::sum(nc::mul(y, y)).backward();
  EXPECT_EQ(layer.weight.grad().shape(), (nc::Shape{4, 3}));
  EXPECT_EQ(layer.bias.grad().shape(), (nc::Shape{4, 3}));
  Tensor rms_y = rms(x);
  expect_close(values(rms_y), reference_rms_norm(values(x), 12, {}, 1e-6), 1e-5, "RMSNorm");
  nc::sum(nc::mul(rms_y, rms_y)).backward();
  EXPECT_EQ(rms.weight.grad().shape(), (nc::Shape{4, 3}));
  Tensor images = random({2, 6, 5}, 81, DType::F32);
  expect_close(values(group(images)), reference_group_norm(values(images), 2, 2, 6, 5, {}, {}, 1e-5), 1e-5,
               "GroupNorm");
  EXPECT_THROW(group(random({2, 4, 5}, 82, DType::F32)), nc::ShapeError);
  expect_close(values(l1(x)), values(nc::l1_norm(x, 1)), 0, "L1Norm");
  expect_close(values(frobenius(x)), values(nc::frobenius_norm(x)), 0, "FrobeniusNorm");
}

}  // namespace
