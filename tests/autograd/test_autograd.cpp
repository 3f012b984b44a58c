// Autograd: the engine (accumulation, retain_graph, no-grad mode, views, errors) and a
// float64 gradcheck of every differentiable op, on random inputs and on awkward ones
// (broadcast shapes, transposed and strided views). One table row per op.
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

Tensor leaf(const nc::Shape& shape, uint64_t seed, double lo = -1.5, double hi = 1.5) {
  nc::Generator gen(seed);
  Tensor t = nc::rand(shape, DType::F64, &gen) * (hi - lo) + lo;
  return t.requires_grad_();
}

// Values kept away from 0 and from each other (for abs, sign-sensitive ops and max ties).
Tensor spread_leaf(const nc::Shape& shape, uint64_t seed) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  nc::Generator gen(seed);
  Tensor perm = nc::randint(0, 1000000, {n}, DType::I64, &gen);
  std::vector<double> v(static_cast<size_t>(n));
  std::vector<int64_t> keys = perm.to_vector<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    v[i] = (i % 2 ? 1.0 : -1.0) * (0.3 + 0.1 * static_cast<double>(i)) + 1e-7 * static_cast<double>(keys[i] % 7);
  return nc::from_vector(v, shape).requires_grad_();
}

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

struct GradCase {
  std::string name;
  Fn fn;
  std::vector<Tensor> inputs;
};

std::vector<GradCase> cases() {
  using V = const std::vector<Tensor>&;
  std::vector<GradCase> c;
  auto unary = [&](const std::string& name, std::function<Tensor(const Tensor&)> f, Tensor x) {
    c.push_back({name, [f](V v) { return f(v[0]); }, {x}});
  };
  Tensor positive = leaf({3, 4}, 1, 0.2, 2.0);
  unary(
      "neg", [](const Tensor& x) { return nc::neg(x); }, leaf({3, 4}, 2));
  unary(
      "abs", [](const Tensor& x) { return nc::abs(x); }, spread_leaf({3, 4}, 3));
  unary(
      "exp", [](const Tensor& x) { return nc::exp(x); }, leaf({3, 4}, 4));
  unary(
      "log", [](const Tensor& x) { return nc::log(x); }, positive);
  unary(
      "sqrt", [](const Tensor& x) { return nc::sqrt(x); }, positive);
  unary(
      "rsqrt", [](const Tensor& x) { return nc::rsqrt(x); }, positive);
  unary(
      "sin", [](const Tensor& x) { return nc::sin(x); }, leaf({3, 4}, 5));
  unary(
      "cos", [](const Tensor& x) { return nc::cos(x); }, leaf({3, 4}, 6));
  unary(
      "tanh", [](const Tensor& x) { return nc::tanh(x); }, leaf({3, 4}, 7));
  unary(
      "sigmoid", [](const Tensor& x) { return nc::sigmoid(x); }, leaf({3, 4}, 8));
  unary(
      "relu", [](const Tensor& x) { return nc::relu(x); }, spread_leaf({3, 4}, 9));
  unary(
      "gelu", [](const Tensor& x) { return nc::gelu(x); }, leaf({3, 4}, 10, -3, 3));
  unary(
      "gelu_tanh", [](const Tensor& x) { return nc::gelu(x, true); }, leaf({3, 4}, 11, -3, 3));
  unary(
      "clamp", [](const Tensor& x) { return nc::clamp(x, -0.45, 0.75); }, spread_leaf({3, 4}, 12));
  unary(
      "clamp_min", [](const Tensor& x) { return nc::clamp(x, -0.45, std::nullopt); }, spread_leaf({3, 4}, 13));
  unary(
      "pow_scalar", [](const Tensor& x) { return nc::pow(x, 3); }, leaf({3, 4}, 14));
  unary(
      "pow_fraction", [](const Tensor& x) { return nc::pow(x, 1.5); }, positive);
  unary(
      "sign", [](const Tensor& x) { return nc::sign(x) * x; }, spread_leaf({3, 4}, 15));

  auto binary = [&](const std::string& name, std::function<Tensor(const Tensor&, const Tensor&)> f, Tensor a,
                    Tensor b) {
    c.push_back({name, [f](V v) { return f(v[0], v[1]); }, {a, b}});
  };
  binary(
      "add_broadcast", [](const Tensor& a, const Tensor& b) { return a + b; }, leaf({2, 1, 3}, 20), leaf({4, 1}, 21));
  binary(
      "sub_broadcast", [](const Tensor& a, const Tensor& b) { return a - b; }, leaf({3}, 22), leaf({2, 3}, 23));
  binary(
      "mul_broadcast", [](const Tensor& a, const Tensor& b) { return a * b; }, leaf({2, 3}, 24), leaf({3}, 25));
  binary(
      "div_broadcast", [](const Tensor& a, const Tensor& b) { return a / b; }, leaf({2, 3}, 26),
      leaf({2, 1}, 27, 0.5, 2));
  binary(
      "maximum", [](const Tensor& a, const Tensor& b) { return nc::maximum(a, b); }, spread_leaf({2, 3}, 28),
      leaf({3}, 29));
  binary(
      "minimum", [](const Tensor& a, const Tensor& b) { return nc::minimum(a, b); }, spread_leaf({2, 3}, 30),
      leaf({3}, 31));
  binary(
      "pow", [](const Tensor& a, const Tensor& b) { return nc::pow(a, b); }, leaf({2, 3}, 32, 0.5, 2),
      leaf({2, 3}, 33));
  binary(
      "where", [](const Tensor& a, const Tensor& b) { return nc::where(nc::gt(a, 0), a, b); }, spread_leaf({2, 3}, 34),
      leaf({3}, 35));
  binary(
      "scalar_ops", [](const Tensor& a, const Tensor& b) { return (2.0 - a) * 3.0 / (b + 4.0) + 1.0 / (b + 5.0); },
      leaf({2, 3}, 36), leaf({2, 3}, 37));
  binary(
      "matmul", [](const Tensor& a, const Tensor& b) { return nc::matmul(a, b); }, leaf({3, 4}, 38), leaf({4, 2}, 39));
  binary(
      "matmul_batched_broadcast", [](const Tensor& a, const Tensor& b) { return nc::matmul(a, b); },
      leaf({2, 1, 3, 4}, 40), leaf({5, 4, 2}, 41));
  binary(
      "matmul_vectors", [](const Tensor& a, const Tensor& b) { return nc::matmul(a, b); }, leaf({4}, 42),
      leaf({4, 3}, 43));
  binary(
      "matmul_transposed", [](const Tensor& a, const Tensor& b) { return nc::matmul(a.t(), b.t()); }, leaf({4, 3}, 44),
      leaf({2, 4}, 45));
  // N-D @ 2-D folds into one GEMM: a contiguous input, a transposed one (folded through a
  // copy), and a transposed weight as nn::Linear passes it.
  binary(
      "matmul_folded", [](const Tensor& a, const Tensor& b) { return nc::matmul(a, b.t()); }, leaf({2, 3, 5, 4}, 46),
      leaf({2, 4}, 47));
  binary(
      "matmul_folded_transposed", [](const Tensor& a, const Tensor& b) { return nc::matmul(a.transpose(1, 2), b); },
      leaf({2, 4, 3}, 48), leaf({4, 2}, 49));

  auto reduction = [&](const std::string& name, std::function<Tensor(const Tensor&)> f, Tensor x) {
    unary(name, f, x);
  };
  reduction(
      "sum_all", [](const Tensor& x) { return nc::sum(x); }, leaf({2, 3, 4}, 50));
  reduction(
      "sum_dims_keepdim",
      [](const Tensor& x) {
        return nc::sum(x, {0, 2}, true);
      },
      leaf({2, 3, 4}, 51));
  reduction(
      "mean_dim", [](const Tensor& x) { return nc::mean(x, {-1}); }, leaf({2, 3, 4}, 52));
  reduction(
      "var_unbiased", [](const Tensor& x) { return nc::var(x, {1}); }, leaf({2, 3, 4}, 53));
  reduction(
      "var_biased_all", [](const Tensor& x) { return nc::var(x, {}, false); }, leaf({2, 3, 4}, 54));
  reduction(
      "prod_dim", [](const Tensor& x) { return nc::prod(x, {1}); }, leaf({2, 3, 4}, 55));
  reduction(
      "prod_with_zero", [](const Tensor& x) { return nc::prod(nc::where(nc::lt(nc::abs(x), 0.2), 0.0, x), {1}); },
      spread_leaf({3, 4}, 56));
  reduction(
      "norm2", [](const Tensor& x) { return nc::norm(x, 2, {1}); }, leaf({3, 4}, 57));
  reduction(
      "norm1", [](const Tensor& x) { return nc::norm(x, 1); }, spread_leaf({3, 4}, 58));
  reduction(
      "norm3", [](const Tensor& x) { return nc::norm(x, 3, {0}, true); }, spread_leaf({3, 4}, 59));
  reduction(
      "norm_inf", [](const Tensor& x) { return nc::norm(x, INFINITY, {1}); }, spread_leaf({3, 4}, 60));
  reduction(
      "max_all", [](const Tensor& x) { return nc::max(x); }, spread_leaf({3, 4}, 61));
  reduction(
      "min_dim", [](const Tensor& x) { return nc::min(x, 1).first; }, spread_leaf({3, 4}, 62));
  reduction(
      "max_dim_keepdim", [](const Tensor& x) { return nc::max(x, 0, true).first; }, spread_leaf({3, 4}, 63));

  auto view = [&](const std::string& name, std::function<Tensor(const Tensor&)> f, Tensor x) { unary(name, f, x); };
  view(
      "view_reshape",
      [](const Tensor& x) {
        return x.view({4, 3}).reshape({2, 6}) * 2.0;
      },
      leaf({3, 4}, 70));
  view(
      "permute_transpose",
      [](const Tensor& x) {
        return x.permute({2, 0, 1}).transpose(0, 2) * 1.0;
      },
      leaf({2, 3, 4}, 71));
  view(
      "narrow_slice_select", [](const Tensor& x) { return x.narrow(0, 1, 2).slice(1, 0, 4, 2).select(1, 1) * 3.0; },
      leaf({3, 4}, 72));
  view(
      "squeeze_unsqueeze_expand",
      [](const Tensor& x) {
        return x.unsqueeze(0).expand({3, 2, 1, 4}).squeeze(2) * 1.0;
      },
      leaf({2, 1, 4}, 73));
  view(
      "flatten_contiguous", [](const Tensor& x) { return x.t().contiguous().flatten() * 1.0; }, leaf({3, 4}, 74));
  view(
      "clone_to_f32_and_back", [](const Tensor& x) { return x.clone().to(DType::F64) * 1.0; }, leaf({3, 4}, 75));
  view(
      "strided_input", [](const Tensor& x) { return nc::exp(x.slice(0, 0, 4, 2).t()); }, leaf({4, 3}, 76));

  auto index = nc::from_vector<int64_t>({2, 0, 2}, {3});
  view(
      "index_select", [index](const Tensor& x) { return nc::index_select(x, 1, index); }, leaf({2, 3}, 80));
  auto gidx = nc::from_vector<int64_t>({0, 2, 1, 1}, {2, 2});
  view(
      "gather", [gidx](const Tensor& x) { return nc::gather(x, 1, gidx); }, leaf({2, 3}, 81));
  binary(
      "scatter_add", [gidx](const Tensor& x, const Tensor& src) { return nc::scatter_add(x, 1, gidx, src); },
      leaf({2, 3}, 82), leaf({2, 3}, 83));
  binary(
      "cat_stack",
      [](const Tensor& a, const Tensor& b) {
        return nc::cat({a, nc::sum(nc::stack({b, b}, 0), {0})}, 1);
      },
      leaf({2, 3}, 84), leaf({2, 2}, 85));
  view(
      "split",
      [](const Tensor& x) {
        auto p = nc::split(x, 2, 1);
        return p[0] * p[1];
      },
      leaf({3, 4}, 86));
  view(
      "masked_fill", [](const Tensor& x) { return nc::masked_fill(x, nc::gt(x, 0.5), 0.0) * x; },
      spread_leaf({3, 4}, 87));
  return c;
}

}  // namespace

TEST(Gradcheck, EveryDifferentiableOp) {
  for (const GradCase& gc : cases()) {
    SCOPED_TRACE(gc.name);
    std::string report;
    EXPECT_TRUE(nc::gradcheck(gc.fn, gc.inputs, {}, &report)) << report;
  }
}

TEST(Gradcheck, DetectsAWrongGradient) {
  // x * x.detach() computes x^2 but back-propagates only x: gradcheck must notice.
  auto broken = [](const std::vector<Tensor>& v) { return v[0] * v[0].detach(); };
  std::string report;
  EXPECT_FALSE(nc::gradcheck(broken, {leaf({3}, 90)}, {}, &report));
  EXPECT_NE(report.find("input 0"), std::string::npos) << report;
}

TEST(Gradcheck, RejectsNonF64Inputs) {
  Tensor x = nc::ones({2}).requires_grad_();
  EXPECT_THROW(nc::gradcheck([](const std::vector<Tensor>& v) { return v[0] * 2.0; }, {x}), nc::DTypeError);
}

TEST(Autograd, LeafGradientsAccumulateAcrossBackwardCalls) {
  Tensor x = nc::from_vector<float>({1, 2, 3}, {3}).requires_grad_();
  nc::sum(x * x).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{2, 4, 6}));
  nc::sum(x * 3.0).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{5, 7, 9}));
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, DiamondGraphSumsBothPaths) {
  Tensor x = nc::from_vector<double>({2.0}, {1}).requires_grad_();
  Tensor y = nc::exp(x);
  Tensor z = y * y + y;  // dz/dx = (2y + 1) * y
  z.backward(nc::ones({1}, DType::F64));
  double e2 = std::exp(2.0);
  EXPECT_NEAR(x.grad().item<double>(), (2 * e2 + 1) * e2, 1e-9);
}

TEST(Autograd, ExplicitGradientForNonScalars) {
  Tensor x = nc::from_vector<float>({1, 2}, {2}).requires_grad_();
  Tensor y = x * 2.0;
  EXPECT_THROW(y.backward(), nc::ShapeError);
  EXPECT_THROW(y.backward(nc::ones({3})), nc::ShapeError);
  y.backward(nc::from_vector<float>({1, 10}, {2}));
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{2, 20}));
}

TEST(Autograd, SecondBackwardThroughFreedGraphThrows) {
  Tensor x = nc::from_vector<float>({1, 2}, {2}).requires_grad_();
  Tensor loss = nc::sum(nc::exp(x));
  loss.backward();
  try {
    loss.backward();
    FAIL() << "expected an error";
  } catch (const nc::Error& e) {
    EXPECT_NE(std::string(e.what()).find("retain_graph"), std::string::npos) << e.what();
  }
}

TEST(Autograd, RetainGraphAllowsASecondBackward) {
  Tensor x = nc::from_vector<float>({1, 2}, {2}).requires_grad_();
  Tensor loss = nc::sum(x * x);
  loss.backward({}, /*retain_graph=*/true);
  loss.backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{4, 8}));
}

TEST(Autograd, NoGradGuardRecordsNothing) {
  Tensor x = nc::ones({2}).requires_grad_();
  {
    nc::autograd::NoGradGuard guard;
    EXPECT_FALSE(nc::autograd::is_grad_enabled());
    Tensor y = x * 2.0;
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(y.is_leaf());
  }
  EXPECT_TRUE(nc::autograd::is_grad_enabled());
  EXPECT_TRUE((x * 2.0).requires_grad());
}

TEST(Autograd, InferenceModeRecordsNothingAndRefusesBackward) {
  Tensor w = nc::ones({3, 2}).requires_grad_();
  Tensor loss = nc::sum(nc::matmul(nc::ones({4, 3}), w));  // recorded before the guard
  EXPECT_FALSE(nc::autograd::is_inference_mode());
  {
    nc::autograd::InferenceModeGuard guard;
    EXPECT_TRUE(nc::autograd::is_inference_mode());
    EXPECT_FALSE(nc::autograd::is_grad_enabled());
    Tensor y = nc::relu(nc::matmul(nc::ones({4, 3}), w));
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(y.is_leaf());
    EXPECT_EQ(y.to_vector<float>(), std::vector<float>(8, 3.0f));
    try {
      loss.backward();
      ADD_FAILURE() << "backward ran inside an inference-mode guard";
    } catch (const nc::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("inference-mode"), std::string::npos) << e.what();
    }
    {
      nc::autograd::InferenceModeGuard off(false);  // a disabled guard changes nothing
      EXPECT_TRUE(nc::autograd::is_inference_mode());
    }
  }
  EXPECT_FALSE(nc::autograd::is_inference_mode());
  EXPECT_TRUE(nc::autograd::is_grad_enabled());
  loss.backward();  // the graph made before the guard is intact
  EXPECT_EQ(w.grad().to_vector<float>(), std::vector<float>(6, 4.0f));
}

TEST(Autograd, DetachCutsTheHistoryButSharesData) {
  Tensor x = nc::ones({2}).requires_grad_();
  Tensor y = x * 2.0;
  Tensor d = y.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.data_ptr(), y.data_ptr());
  EXPECT_EQ(y.grad_fn_name(), "mul");
}

TEST(Autograd, ViewsPropagateToTheirBase) {
  Tensor base = nc::zeros({2, 3}).requires_grad_();
  Tensor v = base.t().narrow(0, 1, 2);  // [2, 2] view of columns 1..2
  nc::sum(v * nc::from_vector<float>({1, 2, 3, 4}, {2, 2})).backward();
  EXPECT_EQ(base.grad().to_vector<float>(), (std::vector<float>{0, 1, 3, 0, 2, 4}));
}

// A leaf's gradient is its own memory: never shared with another leaf's gradient, the
// caller's output gradient, or a view of either, and always contiguous.
TEST(Autograd, LeafGradientsOwnTheirMemory) {
  Tensor a = nc::from_vector<float>({1, 2}, {2}).requires_grad_();
  Tensor b = nc::from_vector<float>({3, 4}, {2}).requires_grad_();
  (a + b).backward(nc::from_vector<float>({5, 6}, {2}));  // both get the same gradient tensor
  EXPECT_NE(a.grad().data_ptr(), b.grad().data_ptr());
  a.grad().fill_(0.0);
  EXPECT_EQ(b.grad().to_vector<float>(), (std::vector<float>{5, 6}));

  Tensor x = nc::from_vector<float>({1, 2, 3, 4}, {4}).requires_grad_();
  Tensor g = nc::from_vector<float>({1, 1, 1, 1}, {2, 2});
  x.view({2, 2}).backward(g);  // the view's backward hands back a view of g
  g.fill_(9.0);
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{1, 1, 1, 1}));

  Tensor leaf = nc::from_vector<float>({1, 2}, {2}).requires_grad_();
  Tensor root_grad = nc::from_vector<float>({3, 4}, {2});
  leaf.backward(root_grad);  // a leaf as the root: its gradient is the caller's tensor
  root_grad.fill_(0.0);
  EXPECT_EQ(leaf.grad().to_vector<float>(), (std::vector<float>{3, 4}));

  Tensor w = nc::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}).requires_grad_();
  nc::sum(nc::matmul(nc::ones({4, 3}), w.t())).backward();  // w's gradient arrives transposed
  EXPECT_TRUE(w.grad().is_contiguous());
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{4, 4, 4, 4, 4, 4}));
}

TEST(Autograd, GradientsKeepTheInputDType) {
  Tensor h = nc::ones({4}, DType::F16).requires_grad_();
  Tensor f = nc::ones({}, DType::F32).requires_grad_();
  nc::sum(h * f).backward();  // h's dtype wins; f (0-dim) gets an f32 gradient
  EXPECT_EQ(h.grad().dtype(), DType::F16);
  EXPECT_EQ(f.grad().dtype(), DType::F32);
  EXPECT_EQ(f.grad().item<float>(), 4.0f);
}

// A broadcast's gradient summed back over leading dims (a bias over [B, T, C]): in 16-bit
// dtypes a product with a row of ones, elsewhere the reduction; the same sums either way.
TEST(Autograd, BroadcastGradientsSumOverLeadingDims) {
  std::vector<nc::Device> devices{nc::Device::cpu()};
  if (nc::cuda_is_available()) devices.push_back(nc::Device::cuda());
  nc::Generator gen(7);
  const Tensor g64 = nc::randn({3, 37, 5}, DType::F64, &gen);
  for (nc::Device device : devices) {
    for (DType dtype : {DType::BF16, DType::F16, DType::F32, DType::F64}) {
      SCOPED_TRACE(device.str() + " " + nc::dtype_name(dtype));
      const nc::TensorOptions options(dtype, device);
      const Tensor g = g64.to(dtype);
      // The sums of the values the backward sees (g rounded to dtype), in f64.
      const std::vector<double> expected = nc::sum(g.to(DType::F64), {0, 1}).to_vector<double>();
      const Tensor bias = nc::zeros({5}, options).requires_grad_();
      nc::add(nc::zeros({3, 37, 5}, options), bias).backward(g.to(device));
      ASSERT_EQ(bias.grad().dtype(), dtype);
      const std::vector<double> got = bias.grad().to(nc::Device::cpu(), DType::F64).to_vector<double>();
      const double tol = dtype == DType::BF16 ? 1e-2 : dtype == DType::F16 ? 2e-3 : dtype == DType::F32 ? 1e-6 : 1e-12;
      for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(got[i], expected[i], tol * (1 + std::fabs(expected[i])));
      // A middle dim broadcast ([3, 1, 5]) takes the reduction.
      const Tensor middle = nc::zeros({3, 1, 5}, options).requires_grad_();
      nc::add(nc::zeros({3, 37, 5}, options), middle).backward(g.to(device));
      const std::vector<double> sums = nc::sum(g.to(DType::F64), {1}, true).to_vector<double>();
      const std::vector<double> got_middle = middle.grad().to(nc::Device::cpu(), DType::F64).to_vector<double>();
      for (size_t i = 0; i < sums.size(); ++i) EXPECT_NEAR(got_middle[i], sums[i], tol * (1 + std::fabs(sums[i])));
    }
  }
}

TEST(Autograd, Errors) {
  Tensor i = nc::ones({2}, DType::I64);
  EXPECT_THROW(i.requires_grad_(), nc::DTypeError);
  Tensor x = nc::ones({2}).requires_grad_();
  Tensor y = x * 2.0;
  EXPECT_THROW(y.requires_grad_(), nc::ValueError);
  EXPECT_THROW(nc::ones({2}).backward(), nc::ValueError);
  EXPECT_THROW(x.fill_(1), nc::ValueError);
  EXPECT_THROW(x.copy_(nc::zeros({2})), nc::ValueError);
  {
    nc::autograd::NoGradGuard guard;  // optimizers update parameters this way
    x.fill_(3);
  }
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{3, 3}));
  EXPECT_THROW(x.set_grad(nc::ones({3})), nc::ShapeError);
}

TEST(Autograd, PrintingShowsTheHistory) {
  Tensor x = nc::ones({1}).requires_grad_();
  std::ostringstream a, b;
  a << x;
  b << x * 2.0;
  EXPECT_NE(a.str().find("requires_grad=true"), std::string::npos) << a.str();
  EXPECT_NE(b.str().find("grad_fn=mul"), std::string::npos) << b.str();
}

// The message of the ValueError that call throws (empty, with a failure, if it throws none).
std::string value_error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const nc::ValueError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ValueError thrown";
  return "";
}

void expect_contains(const std::string& message, const std::vector<std::string>& parts) {
  for (const std::string& part : parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "\"" << message << "\" lacks \"" << part << "\"";
  }
}

TEST(Autograd, AnomalyModeIsOffByDefault) {
  EXPECT_FALSE(nc::autograd::is_anomaly_enabled());
  Tensor x = nc::from_vector<double>({1, -1}, {2}).requires_grad_();
  Tensor y = nc::log(x);  // log(-1) is NaN, and nothing checks it
  EXPECT_TRUE(std::isnan(y.to_vector<double>()[1]));
  y.backward(nc::ones({2}, DType::F64));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{1, -1}));
}

TEST(Autograd, AnomalyModeNamesTheOpThatProducedANan) {
  nc::autograd::AnomalyModeGuard anomaly;
  Tensor x = nc::from_vector<double>({1, 4, -1}, {3}).requires_grad_();
  EXPECT_EQ((x * 2.0).to_vector<double>(), (std::vector<double>{2, 8, -2}));  // finite: no error
  const std::string message = value_error_of([&] { nc::log(x); });
  expect_contains(message,
                  {"anomaly mode", "'log'", "produced", "from finite inputs", "1 of 3 values", "flat index 2", "nan"});
  // Ops that record nothing are not checked.
  {
    nc::autograd::NoGradGuard no_grad;
    EXPECT_TRUE(std::isnan(nc::log(x).to_vector<double>()[2]));
  }
  EXPECT_TRUE(nc::autograd::is_anomaly_enabled());
}

TEST(Autograd, AnomalyModeNamesTheOpThatReceivedANan) {
  nc::autograd::AnomalyModeGuard anomaly;
  Tensor x = nc::from_vector<double>({1, std::nan(""), INFINITY, 2}, {4}).requires_grad_();
  const std::string message = value_error_of([&] { nc::mul(x, 3.0); });
  expect_contains(message, {"'mul'", "received", "input 0", "2 of 4 values", "flat index 1", "leaf"});
}

TEST(Autograd, AnomalyModeChecksEveryGradientOfBackward) {
  Tensor x = nc::from_vector<double>({4, 0}, {2}).requires_grad_();
  Tensor y;
  {
    nc::autograd::AnomalyModeGuard anomaly;
    y = nc::sum(nc::sqrt(x));  // sqrt(0) = 0 is finite; its derivative there is not
    const std::string message = value_error_of([&] { y.backward(Tensor(), /*retain_graph=*/true); });
    expect_contains(message, {"backward of 'sqrt'", "gradient of input 0", "1 of 2 values", "flat index 1", "inf",
                              "from a finite incoming gradient"});
  }
  EXPECT_FALSE(nc::autograd::is_anomaly_enabled());  // the guard restored it
  x.zero_grad();
  y.backward();  // without anomaly mode the infinity goes through
  EXPECT_TRUE(std::isinf(x.grad().to_vector<double>()[1]));
  EXPECT_DOUBLE_EQ(x.grad().to_vector<double>()[0], 0.25);
}

TEST(Autograd, AnomalyModeChecksCudaTensors) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  nc::autograd::AnomalyModeGuard anomaly;
  Tensor x = nc::from_vector<float>({1, 4, -1, 9}, {4}, nc::Device::cuda()).requires_grad_();
  expect_contains(value_error_of([&] { nc::log(x); }),
                  {"'log'", "produced", "f32 [4] cuda:0", "1 of 4 values", "flat index 2"});
  Tensor z = nc::from_vector<float>({4, 0}, {2}, nc::Device::cuda()).requires_grad_();
  Tensor y = nc::sum(nc::sqrt(z));
  expect_contains(value_error_of([&] { y.backward(); }), {"backward of 'sqrt'", "cuda:0", "flat index 1", "inf"});
}
