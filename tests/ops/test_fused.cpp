// Fused ops (normcore/fused.h): gemm_group_norm_min_bias against the composition linear ->
// group_norm -> min -> add on the CPU (values and every gradient, ties in the min
// included), float64 gradchecks, argument errors, and the CUDA kernels against the CPU
// ones at sizes that reach every code path.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
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

Tensor leaf(const nc::Shape& shape, uint64_t seed) { return random(shape, seed).requires_grad_(); }

std::vector<double> values(const Tensor& t) { return t.to(nc::Device::cpu(), DType::F64).to_vector<double>(); }

void expect_close(const Tensor& actual, const Tensor& expected, double tol, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what;
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const std::vector<double> a = values(actual), e = values(expected);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], e[i], tol * (1 + std::fabs(e[i]))) << what << " at " << i;
  }
}

// The inputs of one call; undefined optional tensors stay undefined.
struct Inputs {
  Tensor x, weight, linear_bias, gn_weight, gn_bias, bias;
  std::vector<Tensor> all() const { return {x, weight, linear_bias, gn_weight, gn_bias, bias}; }
};

Tensor fused(const Inputs& in, int64_t groups) {
  return nc::gemm_group_norm_min_bias(in.x, in.weight, in.linear_bias, in.gn_weight, in.gn_bias, in.bias, groups);
}

Tensor composed(const Inputs& in, int64_t groups) {
  Tensor y = nc::matmul(in.x, in.weight.t());
  if (in.linear_bias.defined()) y = y + in.linear_bias;
  y = nc::group_norm(y, groups, in.gn_weight, in.gn_bias);
  return nc::min(y, 1, /*keepdim=*/true).first + in.bias;
}

// Fresh leaves with in's values (on device, in dtype), so two runs keep separate gradients.
Inputs leaves_like(const Inputs& in, nc::Device device, DType dtype) {
  auto leaf_copy = [&](const Tensor& t) { return t.defined() ? t.detach().to(device, dtype).requires_grad_() : t; };
  return {leaf_copy(in.x),         leaf_copy(in.weight),  leaf_copy(in.linear_bias),
          leaf_copy(in.gn_weight), leaf_copy(in.gn_bias), leaf_copy(in.bias)};
}

// A case: [rows, in] x, [out, in] weight; which optional inputs are present. With ties,
// y is designed so that each row's min is taken at two columns of one group (or, with one
// channel per group, at every column).
struct Case {
  std::string name;
  int64_t rows, in, out, groups;
  bool linear_bias, gn_weight, gn_bias;
  bool ties = false;
};

// y = rows of +-1 (exact in every dtype): every group alternates +1, -1, except group
// b % groups of row b, which is +1 but for two -1 entries: its normalized -1 entries are
// the row's min (group_len >= 6) and equal, so the first one must win.
Tensor tied_rows(int64_t rows, int64_t channels, int64_t groups) {
  const int64_t len = channels / groups;
  std::vector<double> y(static_cast<size_t>(rows * channels));
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t tie_group = b % groups;
    for (int64_t c = 0; c < channels; ++c) {
      const int64_t g = c / len, i = c % len;
      double v = i % 2 == 0 ? 1.0 : -1.0;
      if (g == tie_group && len > 1) {
        const int64_t first = b % (len / 2), second = len / 2 + (3 * b) % (len - len / 2);
        v = i == first || i == second ? -1.0 : 1.0;
      }
      y[b * channels + c] = v;
    }
  }
  return nc::from_vector<double>(y, {rows, channels});
}

// x = I, weight = y^T: the GEMM is exact in every dtype on every device, so both backends
// normalize the same y and agree on the argmin.
Inputs make_inputs(const Case& c, uint64_t seed) {
  Inputs in;
  const Tensor y = c.ties ? tied_rows(c.rows, c.out, c.groups) : random({c.rows, c.out}, seed);
  if (c.in == c.rows && c.ties) {
    in.x = nc::eye(c.rows, -1, DType::F64);
    in.weight = y.t().contiguous();
  } else {
    in.x = random({c.rows, c.in}, seed + 1);
    in.weight = random({c.out, c.in}, seed + 2);
  }
  if (c.linear_bias) in.linear_bias = random({c.out}, seed + 3);
  if (c.gn_weight) in.gn_weight = random({c.out}, seed + 4);
  if (c.gn_bias) in.gn_bias = random({c.out}, seed + 5);
  in.bias = random({1, c.out, 1, 1}, seed + 6);
  return in;
}

// Runs fused on `got` and `reference` on `expected` (leaves with the same values), back-
// propagates the same gradient through both and compares out and every input's gradient.
void expect_matching_runs(const Inputs& got, const Inputs& expected, int64_t groups, double tol,
                          const std::function<Tensor(const Inputs&, int64_t)>& reference) {
  Tensor got_out = fused(got, groups), expected_out = reference(expected, groups);
  expect_close(got_out, expected_out, tol, "out");
  const Tensor grad = random(expected_out.shape(), 200, expected_out.dtype());
  got_out.backward(grad.to(got_out.device()));
  expected_out.backward(grad);
  const std::vector<Tensor> got_inputs = got.all(), expected_inputs = expected.all();
  for (size_t i = 0; i < expected_inputs.size(); ++i) {
    if (!expected_inputs[i].defined()) continue;
    expect_close(got_inputs[i].grad(), expected_inputs[i].grad(), 10 * tol, "grad of input " + std::to_string(i));
  }
}

TEST(FusedGemmGroupNormMinBias, MatchesCompositionOnCpu) {
  const std::vector<Case> cases = {
      {"one channel", 2, 3, 1, 1, true, true, true},
      {"one channel per group", 5, 4, 12, 12, true, true, true},
      {"affine", 7, 6, 24, 4, true, true, true},
      {"no optional inputs", 6, 5, 16, 2, false, false, false},
      {"weight only", 4, 3, 10, 5, false, true, false},
      {"one group", 3, 8, 64, 1, true, false, true},
      {"ties within a group", 9, 9, 24, 3, false, false, false, true},
      {"ties in one-channel groups", 4, 4, 6, 6, false, false, false, true},
      {"designed y, gn_bias", 5, 5, 40, 5, false, false, true, true},
  };
  for (const Case& c : cases) {
    for (DType dtype : {DType::F64, DType::F32}) {
      SCOPED_TRACE(c.name + " " + nc::dtype_name(dtype));
      const Inputs base = make_inputs(c, 100);
      expect_matching_runs(leaves_like(base, nc::Device::cpu(), dtype), leaves_like(base, nc::Device::cpu(), dtype),
                           c.groups, dtype == DType::F64 ? 1e-12 : 1e-5, composed);
    }
  }
}

TEST(FusedGemmGroupNormMinBias, RecordsOneNamedNode) {
  const Inputs in = leaves_like(make_inputs({"", 2, 3, 4, 2, true, true, true}, 150), nc::Device::cpu(), DType::F64);
  EXPECT_EQ(fused(in, 2).grad_fn_name(), "gemm_group_norm_min_bias");
}

TEST(FusedGemmGroupNormMinBias, GradientGoesToTheFirstMinimum) {
  // One row, one group: y = [2, -1, 0, -1]; the min is at columns 1 and 3.
  Inputs in;
  in.x = nc::ones({1, 1}, DType::F64);
  in.weight = nc::from_vector<double>({2, -1, 0, -1}, {4, 1});
  in.gn_bias = nc::zeros({4}, DType::F64).requires_grad_();
  in.bias = nc::zeros({1, 4, 1, 1}, DType::F64);
  fused(in, 1).backward(nc::ones({1, 4, 1, 1}, DType::F64));
  EXPECT_EQ(values(in.gn_bias.grad()), (std::vector<double>{0, 4, 0, 0}));
}

TEST(FusedGemmGroupNormMinBias, EmptyBatch) {
  Inputs in = leaves_like(make_inputs({"", 0, 3, 8, 2, true, true, true}, 300), nc::Device::cpu(), DType::F64);
  Tensor out = fused(in, 2);
  EXPECT_EQ(out.shape(), (nc::Shape{1, 8, 0, 1}));
  out.backward(nc::zeros({1, 8, 0, 1}, DType::F64));
  EXPECT_EQ(values(in.bias.grad()), std::vector<double>(8, 0.0));
  EXPECT_EQ(values(in.gn_weight.grad()), std::vector<double>(8, 0.0));
}

TEST(FusedGemmGroupNormMinBias, Gradcheck) {
  auto with_all = [](const std::vector<Tensor>& v) {
    return nc::gemm_group_norm_min_bias(v[0], v[1], v[2], v[3], v[4], v[5], 3);
  };
  std::string report;
  EXPECT_TRUE(nc::gradcheck(
      with_all, {leaf({4, 5}, 1), leaf({6, 5}, 2), leaf({6}, 3), leaf({6}, 4), leaf({6}, 5), leaf({1, 6, 1, 1}, 6)}, {},
      &report))
      << report;
  auto without_optional = [](const std::vector<Tensor>& v) {
    return nc::gemm_group_norm_min_bias(v[0], v[1], Tensor(), Tensor(), Tensor(), v[2], 2);
  };
  EXPECT_TRUE(nc::gradcheck(without_optional, {leaf({3, 4}, 7), leaf({8, 4}, 8), leaf({1, 8, 1, 1}, 9)}, {}, &report))
      << report;
  // Only the GroupNorm parameters need grad: the node still reaches them.
  const Tensor x = random({5, 3}, 10), weight = random({4, 3}, 11), bias = random({1, 4, 1, 1}, 12);
  auto params_only = [&](const std::vector<Tensor>& v) {
    return nc::gemm_group_norm_min_bias(x, weight, Tensor(), v[0], v[1], bias, 2);
  };
  EXPECT_TRUE(nc::gradcheck(params_only, {leaf({4}, 13), leaf({4}, 14)}, {}, &report)) << report;
}

TEST(FusedGemmGroupNormMinBias, ErrorsNameOpArgumentAndShapes) {
  const Tensor x = nc::zeros({2, 3}), w = nc::zeros({4, 3}), p = nc::zeros({4}), bias = nc::zeros({1, 4, 1, 1});
  const Tensor none;
  auto call = [](const Tensor& x, const Tensor& w, const Tensor& lb, const Tensor& gw, const Tensor& gb,
                 const Tensor& b, int64_t groups,
                 double eps = 1e-5) { nc::gemm_group_norm_min_bias(x, w, lb, gw, gb, b, groups, eps); };
  const std::vector<std::pair<std::string, std::function<void()>>> cases = {
      {"undefined x", throws<nc::Error>([&] { call(none, w, p, p, p, bias, 2); }, {"gemm_group_norm_min_bias", "x"})},
      {"integer x", throws<nc::DTypeError>(
                        [&] {
                          call(nc::zeros({2, 3}, DType::I64), w, p, p, p, bias, 2);
                        },
                        {"gemm_group_norm_min_bias", "x", "i64"})},
      {"1-D x", throws<nc::ShapeError>([&] { call(nc::zeros({3}), w, p, p, p, bias, 2); },
                                       {"gemm_group_norm_min_bias", "x", "[3]"})},
      {"undefined weight",
       throws<nc::Error>([&] { call(x, none, p, p, p, bias, 2); }, {"gemm_group_norm_min_bias", "weight"})},
      {"weight inner size", throws<nc::ShapeError>(
                                [&] {
                                  call(x, nc::zeros({4, 5}), p, p, p, bias, 2);
                                },
                                {"gemm_group_norm_min_bias", "weight", "[4, 5]", "[2, 3]"})},
      {"weight dtype", throws<nc::DTypeError>(
                           [&] {
                             call(x, nc::zeros({4, 3}, DType::F64), p, p, p, bias, 2);
                           },
                           {"gemm_group_norm_min_bias", "weight", "f64", "f32"})},
      {"zero groups",
       throws<nc::ValueError>([&] { call(x, w, p, p, p, bias, 0); }, {"gemm_group_norm_min_bias", "num_groups"})},
      {"OUT not divisible", throws<nc::ShapeError>([&] { call(x, w, p, p, p, bias, 3); },
                                                   {"gemm_group_norm_min_bias", "OUT = 4", "num_groups = 3"})},
      {"empty OUT", throws<nc::ShapeError>(
                        [&] {
                          call(x, nc::zeros({0, 3}), none, none, none, nc::zeros({1, 0, 1, 1}), 1);
                        },
                        {"gemm_group_norm_min_bias", "OUT", "[0, 3]"})},
      {"eps", throws<nc::ValueError>([&] { call(x, w, p, p, p, bias, 2, 0.0); }, {"gemm_group_norm_min_bias", "eps"})},
      {"linear_bias shape", throws<nc::ShapeError>([&] { call(x, w, nc::zeros({3}), p, p, bias, 2); },
                                                   {"gemm_group_norm_min_bias", "linear_bias", "[4]", "[3]"})},
      {"gn_weight shape", throws<nc::ShapeError>(
                              [&] {
                                call(x, w, p, nc::zeros({4, 1}), p, bias, 2);
                              },
                              {"gemm_group_norm_min_bias", "gn_weight", "[4]", "[4, 1]"})},
      {"gn_bias dtype", throws<nc::DTypeError>([&] { call(x, w, p, p, nc::zeros({4}, DType::F16), bias, 2); },
                                               {"gemm_group_norm_min_bias", "gn_bias", "f16"})},
      {"undefined bias",
       throws<nc::Error>([&] { call(x, w, p, p, p, none, 2); }, {"gemm_group_norm_min_bias", "bias"})},
      {"bias not 4-D", throws<nc::ShapeError>([&] { call(x, w, p, p, p, p, 2); },
                                              {"gemm_group_norm_min_bias", "bias", "[1, 4, 1, 1]", "[4]"})},
      {"bias broadcastable but not exact", throws<nc::ShapeError>(
                                               [&] {
                                                 call(x, w, p, p, p, nc::zeros({1, 4, 1}), 2);
                                               },
                                               {"gemm_group_norm_min_bias", "bias", "[1, 4, 1, 1]", "[1, 4, 1]"})},
  };
  for (const auto& [name, check] : cases) {
    SCOPED_TRACE(name);
    check();
  }
}

TEST(FusedGemmGroupNormMinBias, DevicesMustMatch) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Tensor x = nc::zeros({2, 3}), w = nc::zeros({4, 3}), bias = nc::zeros({1, 4, 1, 1});
  EXPECT_THROW(nc::gemm_group_norm_min_bias(x, w.to(nc::Device::cuda()), Tensor(), Tensor(), Tensor(), bias, 2),
               nc::DeviceError);
  EXPECT_THROW(nc::gemm_group_norm_min_bias(x, w, Tensor(), Tensor(), Tensor(), bias.to(nc::Device::cuda()), 2),
               nc::DeviceError);
}

// The CUDA kernels against the CPU ones: one channel per group, groups of 2 to 4096
// channels (up to 64 a thread per group from shared memory; longer ones a segment of lanes,
// a warp, a warp looping), rows too long for shared memory, rows that fill part of a block
// or many blocks, column sums over one or many chunks; ties; every dtype.
TEST(FusedGemmGroupNormMinBias, CudaMatchesCpu) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Case> cases = {
      {"one channel", 2, 1, 1, 1, true, true, true},
      {"one channel per group", 5, 5, 12, 12, true, true, true},
      {"pairs", 3, 3, 6, 3, true, true, true},
      {"group of 16, partial block", 37, 37, 64, 4, true, true, true},
      {"group of 32", 17, 17, 96, 3, false, true, true},
      {"group of 100", 40, 40, 200, 2, true, true, false},
      {"one group of 4096", 2, 2, 4096, 1, true, true, true},
      {"many rows", 300, 300, 256, 8, true, true, true},
      {"many chunks", 33, 33, 8192, 512, true, true, true},
      {"ties, one channel per group", 20, 20, 48, 48, false, false, false, true},
      {"ties, group of 6", 19, 19, 36, 6, false, false, false, true},
      {"designed y, group of 64, biases", 45, 45, 512, 8, true, false, true, true},
      {"ties, one group of 2048", 3, 3, 2048, 1, false, false, false, true},
      {"short groups, row beyond shared memory", 2, 2, 65536, 4096, true, true, true},
  };
  for (const Case& c : cases) {
    for (DType dtype : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
      SCOPED_TRACE(c.name + " " + nc::dtype_name(dtype));
      Case exact = c;
      exact.in = c.rows;
      exact.ties = true;  // x = I and weight = y^T below
      Inputs base = make_inputs(exact, 400);
      if (!c.ties) base.weight = random({c.rows, c.out}, 401).t().contiguous();
      // Designed ties make groups of +-1 with two -1 entries: rstd is large and grad_x sums
      // thousands of large terms of both signs, so float rounding shows at about 1e-2.
      const double f32_tol = c.ties ? 1e-2 : 1e-5;
      const double tol = dtype == DType::F64 ? 1e-10 : dtype == DType::F32 ? f32_tol : 2e-2;
      expect_matching_runs(leaves_like(base, nc::Device::cuda(), dtype), leaves_like(base, nc::Device::cpu(), dtype),
                           c.groups, tol, fused);
    }
  }
}

// Parameter gradients use no atomics: two backward passes give the same bits.
TEST(FusedGemmGroupNormMinBias, CudaGradientsAreDeterministic) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Inputs base = make_inputs({"", 257, 64, 1024, 32, true, true, true}, 500);
  std::vector<std::vector<double>> first;
  for (int run = 0; run < 2; ++run) {
    const Inputs in = leaves_like(base, nc::Device::cuda(), DType::F32);
    Tensor out = fused(in, 32);
    out.backward(random(out.shape(), 501, DType::F32).to(nc::Device::cuda()));
    std::vector<std::vector<double>> grads;
    for (const Tensor& t : in.all()) grads.push_back(values(t.grad()));
    if (run == 0) first = grads;
    else EXPECT_EQ(grads, first);
  }
}

}  // namespace
