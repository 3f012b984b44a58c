// Modules, losses and softmax: PyTorch's parameter naming and state_dict order, layer
// values checked by hand, in-place conversion, safetensors round trips, a small fit by
// gradient descent, float64 gradchecks of every loss and of softmax/log_softmax, and the
// error each invalid argument raises (one table row per case).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "normcore/normcore.h"

namespace nc = normcore;
namespace nn = normcore::nn;
using nc::DType;
using nc::Tensor;

namespace {

Tensor f32(const std::vector<float>& v, const nc::Shape& shape) { return nc::from_vector(v, shape); }
Tensor f64(const std::vector<double>& v, const nc::Shape& shape) { return nc::from_vector(v, shape); }
Tensor i64(const std::vector<int64_t>& v, const nc::Shape& shape) { return nc::from_vector(v, shape); }

std::vector<double> values_of(const Tensor& t) {
  return t.to(nc::Device::cpu()).to(DType::F64).contiguous().to_vector<double>();
}

void expect_near(const Tensor& t, const std::vector<double>& expected, double tol) {
  std::vector<double> got = t.to_vector<double>();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], tol) << "element " << i;
}

std::vector<std::string> names_of(const nn::NamedTensors& entries) {
  std::vector<std::string> out;
  for (const auto& e : entries) out.push_back(e.first);
  return out;
}

Tensor leaf(const nc::Shape& shape, uint64_t seed, double lo = -2.0, double hi = 2.0) {
  nc::Generator gen(seed);
  return (nc::rand(shape, DType::F64, &gen) * (hi - lo) + lo).requires_grad_();
}

// Sets a module's parameter to values without recording.
void assign(const Tensor& param, const Tensor& values) {
  nc::autograd::NoGradGuard no_grad;
  Tensor(param).copy_(values);
}

// A model with its own parameter, a buffer and children, in the style of a PyTorch nn.Module.
struct Net : nn::Module {
  std::shared_ptr<nn::Linear> fc1;
  std::shared_ptr<nn::Sequential> body;
  std::shared_ptr<nn::Linear> fc2;
  Tensor scale, steps;

  explicit Net(uint64_t seed) {
    nc::Generator gen(seed);
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(4, 8, true, &gen));
    // Registered after a child, but listed before the children's, as in PyTorch.
    scale = register_parameter("scale", nc::ones({3}));
    steps = register_buffer("steps", nc::zeros({1}, DType::I64));
    body = register_module("body", std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
                                       std::make_shared<nn::Linear>(8, 8, true, &gen), std::make_shared<nn::GELU>()}));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(8, 3, false, &gen));
    body->register_buffer("calls", nc::zeros({2}));
  }
  Tensor forward(const Tensor& x) override { return (*fc2)((*body)((*fc1)(x))) * scale; }
};

}  // namespace

// ---------------------------------------------------------------- softmax
TEST(Softmax, ValuesAreStableAndNormalized) {
  expect_near(nc::softmax(f32({1, 2, 3}, {3}), 0), {0.090030573, 0.244728471, 0.665240956}, 1e-6);
  expect_near(nc::log_softmax(f32({1, 2, 3}, {3}), -1),
              {std::log(0.090030573), std::log(0.244728471), std::log(0.665240956)}, 1e-6);
  // exp(1000) overflows; subtracting the row maximum first keeps every value finite.
  expect_near(nc::softmax(f32({1000, 1001}, {2}), 0), {0.268941421, 1 - 0.268941421}, 1e-6);
  expect_near(nc::log_softmax(f32({1000, 1000, -1000}, {3}), 0),
              {-std::log(2.0), -std::log(2.0), -2000 - std::log(2.0)}, 1e-3);
  // Along dim 0 of a matrix: each column sums to 1.
  Tensor by_column = nc::softmax(f64({1, 5, 1, 5}, {2, 2}), 0);
  expect_near(by_column, {0.5, 0.5, 0.5, 0.5}, 1e-12);
  expect_near(nc::sum(nc::softmax(f64({0.3, -2, 7, 1, 1, 1}, {3, 2}), 1), {1}), {1, 1, 1}, 1e-12);
  // A 0-dim tensor is a row of one.
  EXPECT_EQ(nc::softmax(nc::full({}, 3.0), 0).item<float>(), 1.0f);
  // f16 is computed in f32 and keeps its dtype.
  Tensor half = nc::softmax(f32({1, 2, 3}, {3}).to(DType::F16), 0);
  EXPECT_EQ(half.dtype(), DType::F16);
  expect_near(half, {0.090030573, 0.244728471, 0.665240956}, 1e-3);
}

TEST(Softmax, RecordsOneNode) {
  Tensor x = f64({1, 2, 3}, {3}).requires_grad_();
  Tensor y = nc::softmax(x, 0);
  Tensor z = nc::log_softmax(x, 0);
  EXPECT_EQ(y.grad_fn_name(), "softmax");
  EXPECT_EQ(z.grad_fn_name(), "log_softmax");
  // d softmax_2 / d x = y_2 * (e_2 - y): the closed form, by hand.
  Tensor pick_last = f64({0, 0, 1}, {3});
  nc::sum(y * pick_last).backward();
  double y0 = 0.090030573, y1 = 0.244728471, y2 = 0.665240956;
  expect_near(x.grad(), {-y2 * y0, -y2 * y1, y2 * (1 - y2)}, 1e-8);
}

// ---------------------------------------------------------------- gradchecks
namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

struct GradCase {
  std::string name;
  Fn fn;
  std::vector<Tensor> inputs;
};

std::vector<GradCase> softmax_cases() {
  using V = const std::vector<Tensor>&;
  return {
      {"softmax_last", [](V v) { return nc::softmax(v[0], -1); }, {leaf({3, 4}, 1)}},
      {"softmax_dim0", [](V v) { return nc::softmax(v[0], 0); }, {leaf({3, 4}, 2)}},
      {"softmax_middle_of_3d", [](V v) { return nc::softmax(v[0], 1); }, {leaf({2, 3, 4}, 3)}},
      {"softmax_transposed_input", [](V v) { return nc::softmax(v[0].t(), 1); }, {leaf({4, 3}, 4)}},
      {"log_softmax_last", [](V v) { return nc::log_softmax(v[0], -1); }, {leaf({3, 4}, 5)}},
      {"log_softmax_middle_of_3d", [](V v) { return nc::log_softmax(v[0], 1); }, {leaf({2, 3, 4}, 6)}},
      {"log_softmax_large_values", [](V v) { return nc::log_softmax(v[0] * 100.0, 1); }, {leaf({2, 3}, 7)}},
  };
}

std::vector<GradCase> loss_cases() {
  using V = const std::vector<Tensor>&;
  Tensor t2 = i64({2, 0, 1}, {3});
  Tensor t3 = i64({0, 2, 1, 1, 0, 2}, {2, 3});  // for logits [2, 4, 3]: classes along dim 1
  Tensor t0 = i64({3}, {});
  Tensor rows = nc::from_vector<int64_t>({1, 3}, {2});
  Tensor probs = leaf({3, 4}, 30, 0.0, 1.0);
  std::vector<GradCase> c = {
      {"cross_entropy_mean", [t2](V v) { return nc::cross_entropy(v[0], t2); }, {leaf({3, 4}, 10)}},
      {"cross_entropy_sum", [t2](V v) { return nc::cross_entropy(v[0], t2, nc::Reduction::Sum); }, {leaf({3, 4}, 11)}},
      {"cross_entropy_none",
       [t2](V v) { return nc::cross_entropy(v[0], t2, nc::Reduction::None); },
       {leaf({3, 4}, 12)}},
      {"cross_entropy_smoothing",
       [t2](V v) { return nc::cross_entropy(v[0], t2, nc::Reduction::Mean, 0.2); },
       {leaf({3, 4}, 13)}},
      {"cross_entropy_smoothing_none",
       [t2](V v) { return nc::cross_entropy(v[0], t2, nc::Reduction::None, 0.3); },
       {leaf({3, 4}, 14)}},
      {"cross_entropy_per_position",
       [t3](V v) { return nc::cross_entropy(v[0], t3, nc::Reduction::Mean, 0.1); },
       {leaf({2, 4, 3}, 15)}},
      {"cross_entropy_per_position_none",
       [t3](V v) { return nc::cross_entropy(v[0], t3, nc::Reduction::None); },
       {leaf({2, 4, 3}, 16)}},
      {"cross_entropy_single_sample", [t0](V v) { return nc::cross_entropy(v[0], t0); }, {leaf({5}, 17)}},
      {"cross_entropy_ignore_index",
       [](V v) {
         return nc::cross_entropy(v[0], i64({2, -100, 1}, {3}), nc::Reduction::Mean, 0.1);
       },
       {leaf({3, 4}, 27)}},
      {"cross_entropy_ignore_index_class_none",
       [t2](V v) { return nc::cross_entropy(v[0], t2, nc::Reduction::None, 0.0, 0); },
       {leaf({3, 4}, 28)}},
      {"nll_loss_mean", [t2](V v) { return nc::nll_loss(nc::log_softmax(v[0], 1), t2); }, {leaf({3, 4}, 18)}},
      {"nll_loss_none", [t2](V v) { return nc::nll_loss(v[0], t2, nc::Reduction::None); }, {leaf({3, 4}, 19)}},
      {"nll_loss_per_position_sum",
       [t3](V v) { return nc::nll_loss(v[0], t3, nc::Reduction::Sum); },
       {leaf({2, 4, 3}, 20)}},
      {"mse_loss_mean", [](V v) { return nc::mse_loss(v[0], v[1]); }, {leaf({3, 4}, 21), leaf({3, 4}, 22)}},
      {"mse_loss_none",
       [](V v) { return nc::mse_loss(v[0], v[1], nc::Reduction::None); },
       {leaf({3, 4}, 23), leaf({3, 4}, 24)}},
      // l1's kink at input == target is avoided by keeping the two ranges apart.
      {"l1_loss_sum",
       [](V v) { return nc::l1_loss(v[0], v[1], nc::Reduction::Sum); },
       {leaf({3, 4}, 25, 1.0, 2.0), leaf({3, 4}, 26, -1.0, 0.5)}},
      {"l1_loss_mean_mixed_signs",
       [](V v) { return nc::l1_loss(v[0], v[1]); },
       {leaf({2, 3}, 27, -2.0, -1.0),
        nc::cat({leaf({1, 3}, 28, 0.0, 1.0), leaf({1, 3}, 29, -4.0, -3.0)}, 0).detach().requires_grad_()}},
      {"bce_with_logits_mean",
       [](V v) { return nc::binary_cross_entropy_with_logits(v[0], v[1]); },
       {leaf({3, 4}, 31, -4.0, 4.0), probs}},
      {"bce_with_logits_none",
       [](V v) { return nc::binary_cross_entropy_with_logits(v[0], v[1], nc::Reduction::None); },
       {leaf({3, 4}, 32, -4.0, 4.0), leaf({3, 4}, 33, 0.0, 1.0)}},
      {"bce_with_logits_sum_logits_only",
       [](V v) { return nc::binary_cross_entropy_with_logits(v[0], v[1], nc::Reduction::Sum); },
       {leaf({5}, 34, -30.0, 30.0), leaf({5}, 35, 0.0, 1.0).detach()}},
      {"linear_then_cross_entropy",
       [rows](V v) { return nc::cross_entropy(nc::matmul(v[0], v[1].t()) + v[2], rows); },
       {leaf({2, 3}, 36), leaf({4, 3}, 37), leaf({4}, 38)}},
  };
  return c;
}

void run_gradchecks(const std::vector<GradCase>& cases) {
  for (const GradCase& gc : cases) {
    SCOPED_TRACE(gc.name);
    std::string report;
    EXPECT_TRUE(nc::gradcheck(gc.fn, gc.inputs, {}, &report)) << report;
  }
}

}  // namespace

TEST(Softmax, Gradcheck) { run_gradchecks(softmax_cases()); }

TEST(Loss, Gradcheck) { run_gradchecks(loss_cases()); }

// ---------------------------------------------------------------- loss values
TEST(Loss, CrossEntropyValuesByHand) {
  // Row losses are logsumexp(x) - x[target] (plus smoothing); logsumexp([1, 2, 3]) =
  // 3.407605964 and logsumexp([1, 0, -1]) = 1.407605964.
  Tensor logits = f32({1, 2, 3, 1, 0, -1}, {2, 3});
  Tensor target = i64({2, 1}, {2});
  struct Row {
    nc::Reduction reduction;
    double smoothing;
    std::vector<double> expected;
  };
  const std::vector<Row> rows = {
      {nc::Reduction::None, 0.0, {0.407605964, 1.407605964}},
      {nc::Reduction::Mean, 0.0, {0.907605964}},
      {nc::Reduction::Sum, 0.0, {1.815211929}},
      // (1 - s) * nll + s * (logsumexp - mean(x)): row 0 0.9 * 0.4076 + 0.1 * 1.4076.
      {nc::Reduction::None, 0.1, {0.507605964, 1.407605964}},
      {nc::Reduction::Mean, 0.1, {0.957605964}},
      {nc::Reduction::Sum, 0.1, {1.915211929}},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.smoothing);
    Tensor loss = nc::cross_entropy(logits, target, r.reduction, r.smoothing);
    EXPECT_EQ(loss.dtype(), DType::F32);
    EXPECT_EQ(loss.shape(), r.reduction == nc::Reduction::None ? nc::Shape{2} : nc::Shape{});
    expect_near(loss, r.expected, 1e-6);
  }
  // No overflow for huge logits: the loss is the gap, 1000.
  expect_near(nc::cross_entropy(f32({1000, 0}, {1, 2}), i64({1}, {1})), {1000.0}, 1e-3);
  // [C] logits with a 0-dim target: one sample.
  expect_near(nc::cross_entropy(f32({1, 2, 3}, {3}), i64({2}, {})), {0.407605964}, 1e-6);
}

TEST(Loss, CrossEntropyGradientIsSoftmaxMinusSmoothedTarget) {
  Tensor logits = f64({1, 2, 3, 1, 0, -1}, {2, 3}).requires_grad_();
  nc::cross_entropy(logits, i64({2, 1}, {2}), nc::Reduction::Mean, 0.1).backward();
  EXPECT_EQ(logits.grad_fn_name(), "");
  const double a = 0.090030573, b = 0.244728471, c = 0.665240956, off = 0.1 / 3, on = 0.9 + 0.1 / 3;
  // Row 0 softmax [a, b, c] with target 2; row 1 softmax [c, b, a] with target 1; / N = 2.
  expect_near(logits.grad(), {(a - off) / 2, (b - off) / 2, (c - on) / 2, (c - off) / 2, (b - on) / 2, (a - off) / 2},
              1e-8);
  Tensor loss = nc::cross_entropy(logits, i64({2, 1}, {2}));
  EXPECT_EQ(loss.grad_fn_name(), "cross_entropy");
}

// Targets equal to ignore_index add nothing; Mean divides by the others (PyTorch's rule).
TEST(Loss, CrossEntropyIgnoreIndex) {
  Tensor logits = f64({1, 2, 3, 1, 0, -1, 5, 5, 5}, {3, 3}).requires_grad_();
  // Row 0 (target 2): 0.407605964; row 1 ignored; row 2 (target 0): log 3 = 1.098612289.
  Tensor target = i64({2, -100, 0}, {3});
  expect_near(nc::cross_entropy(logits, target), {(0.407605964 + 1.098612289) / 2}, 1e-8);
  expect_near(nc::cross_entropy(logits, target, nc::Reduction::Sum), {0.407605964 + 1.098612289}, 1e-8);
  expect_near(nc::cross_entropy(logits, target, nc::Reduction::None), {0.407605964, 0.0, 1.098612289}, 1e-8);
  // Another ignore_index, inside the class range: class 0 is skipped, -100 is out of range.
  expect_near(nc::cross_entropy(logits, i64({2, 1, 0}, {3}), nc::Reduction::None, 0.0, 0),
              {0.407605964, 1.407605964, 0.0}, 1e-8);
  EXPECT_THROW(nc::cross_entropy(logits, target, nc::Reduction::Mean, 0.0, 0), nc::IndexError);
  nc::cross_entropy(logits, target).backward();
  const std::vector<double> g = logits.grad().to_vector<double>();
  for (int c = 3; c < 6; ++c) EXPECT_EQ(g[c], 0.0) << "the ignored row gets no gradient";
  EXPECT_NEAR(g[0], 0.090030573 / 2, 1e-8);  // softmax / 2 kept rows
  // Every target ignored: the mean is 0 / 0.
  EXPECT_TRUE(std::isnan(nc::cross_entropy(logits, i64({-100, -100, -100}, {3})).item<double>()));
}

TEST(Loss, CrossEntropyPerPositionMatchesRows) {
  // [N, C, d] logits equal the same scores laid out as [N * d, C] rows.
  Tensor logits = leaf({2, 3, 4}, 40).detach();
  Tensor target = i64({0, 1, 2, 0, 2, 2, 1, 0}, {2, 4});
  Tensor rows = logits.permute({0, 2, 1}).reshape({8, 3});
  for (nc::Reduction r : {nc::Reduction::Mean, nc::Reduction::Sum, nc::Reduction::None}) {
    Tensor per_position = nc::cross_entropy(logits, target, r, 0.05);
    Tensor flat = nc::cross_entropy(rows, target.reshape({8}), r, 0.05);
    EXPECT_EQ(per_position.shape(), (r == nc::Reduction::None ? nc::Shape{2, 4} : nc::Shape{}));
    expect_near(per_position, flat.to_vector<double>(), 1e-12);
  }
}

TEST(Loss, OtherLossValuesByHand) {
  struct Row {
    std::string name;
    std::function<Tensor(nc::Reduction)> loss;
    std::vector<double> none;  // per element; Sum and Mean follow from it
  };
  Tensor input = f32({1, 2, 3}, {3});
  Tensor target = f32({0, 2, 5}, {3});
  const std::vector<Row> rows = {
      {"mse", [&](nc::Reduction r) { return nc::mse_loss(input, target, r); }, {1, 0, 4}},
      {"l1", [&](nc::Reduction r) { return nc::l1_loss(input, target, r); }, {1, 0, 2}},
      {"nll",
       [](nc::Reduction r) {
         return nc::nll_loss(f32({-1, -2, -3, -0.5, -1.5, -2.5}, {2, 3}), i64({1, 2}, {2}), r);
       },
       {2, 2.5}},
      // max(x, 0) - x t + log(1 + exp(-|x|)) for (x, t) = (0, 1), (2, 0), (-3, 0.5).
      {"bce_with_logits",
       [](nc::Reduction r) {
         return nc::binary_cross_entropy_with_logits(f32({0, 2, -3}, {3}), f32({1, 0, 0.5}, {3}), r);
       },
       {0.693147181, 2.126928011, 1.548587352}},
      // Saturated logits stay finite: log(1 + exp(-100)) ~ 0, and the wrong side costs 100.
      {"bce_with_logits_saturated",
       [](nc::Reduction r) {
         return nc::binary_cross_entropy_with_logits(f32({100, -100}, {2}), f32({1, 1}, {2}), r);
       },
       {0, 100}},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    double total = 0;
    for (double v : row.none) total += v;
    expect_near(row.loss(nc::Reduction::None), row.none, 1e-5);
    expect_near(row.loss(nc::Reduction::Sum), {total}, 1e-5);
    expect_near(row.loss(nc::Reduction::Mean), {total / static_cast<double>(row.none.size())}, 1e-5);
    EXPECT_EQ(row.loss(nc::Reduction::Mean).dim(), 0);
  }
}

TEST(Loss, BceWithLogitsGradientAtZeroIsExact) {
  // At x = 0 the gradient is sigmoid(0) - t = 0.5 - t; composing max and |x| would give -t.
  Tensor x = f32({0, 0}, {2}).requires_grad_();
  nc::binary_cross_entropy_with_logits(x, f32({1, 0.25}, {2}), nc::Reduction::Sum).backward();
  expect_near(x.grad(), {-0.5, 0.25}, 1e-7);
}

// ---------------------------------------------------------------- errors
namespace {

struct ErrorCase {
  std::string name;
  std::function<void()> call;
  std::string kind;    // the most derived normcore error type expected
  std::string needle;  // text the message must contain
};

// The most derived normcore error type fn throws ("none" when it does not throw).
std::string thrown_kind(const std::function<void()>& fn, std::string* message) {
  try {
    fn();
  } catch (const nc::ShapeError& e) {
    *message = e.what();
    return "ShapeError";
  } catch (const nc::DTypeError& e) {
    *message = e.what();
    return "DTypeError";
  } catch (const nc::DeviceError& e) {
    *message = e.what();
    return "DeviceError";
  } catch (const nc::IndexError& e) {
    *message = e.what();
    return "IndexError";
  } catch (const nc::ValueError& e) {
    *message = e.what();
    return "ValueError";
  } catch (const nc::IOError& e) {
    *message = e.what();
    return "IOError";
  } catch (const nc::Error& e) {
    *message = e.what();
    return "Error";
  }
  return "none";
}

void run_error_cases(const std::vector<ErrorCase>& cases) {
  for (const ErrorCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::string message;
    EXPECT_EQ(thrown_kind(c.call, &message), c.kind) << message;
    EXPECT_NE(message.find(c.needle), std::string::npos) << message;
  }
}

}  // namespace

TEST(Loss, InvalidArgumentsThrow) {
  Tensor logits = f32({1, 2, 3, 1, 0, -1}, {2, 3});
  Tensor x = f32({1, 2, 3}, {3});
  run_error_cases({
      {"target_too_large",
       [&] {
         nc::cross_entropy(logits, i64({0, 5}, {2}));
       },
       "IndexError", "target value 5"},
      {"target_names_classes",
       [&] {
         nc::cross_entropy(logits, i64({0, 5}, {2}));
       },
       "IndexError", "3 classes"},
      {"target_negative",
       [&] {
         nc::cross_entropy(logits, i64({-1, 0}, {2}));
       },
       "IndexError", "target value -1"},
      {"target_float",
       [&] {
         nc::cross_entropy(logits, f32({0, 1}, {2}));
       },
       "DTypeError", "target"},
      {"logits_integer",
       [&] {
         nc::cross_entropy(i64({1, 2}, {1, 2}), i64({0}, {1}));
       },
       "DTypeError", "logits"},
      {"target_shape",
       [&] {
         nc::cross_entropy(logits, i64({0, 1, 2}, {3}));
       },
       "ShapeError", "[2, 3]"},
      {"logits_0dim", [&] { nc::cross_entropy(nc::full({}, 1.0), i64({0}, {})); }, "ShapeError", "logits"},
      {"smoothing_above_1",
       [&] {
         nc::cross_entropy(logits, i64({0, 1}, {2}), nc::Reduction::Mean, 1.5);
       },
       "ValueError", "label_smoothing"},
      {"nll_target_range",
       [&] {
         nc::nll_loss(logits, i64({3, 0}, {2}));
       },
       "IndexError", "nll_loss"},
      {"nll_target_shape", [&] { nc::nll_loss(logits, i64({0}, {1})); }, "ShapeError", "nll_loss"},
      {"mse_shapes",
       [&] {
         nc::mse_loss(x, f32({1, 2}, {2}));
       },
       "ShapeError", "mse_loss"},
      {"mse_integer", [&] { nc::mse_loss(i64({1}, {1}), i64({1}, {1})); }, "DTypeError", "mse_loss"},
      {"l1_shapes",
       [&] {
         nc::l1_loss(x, f32({1, 2, 3}, {1, 3}));
       },
       "ShapeError", "l1_loss"},
      {"bce_shapes", [&] { nc::binary_cross_entropy_with_logits(x, f32({1}, {1})); }, "ShapeError",
       "binary_cross_entropy_with_logits"},
      {"bce_integer_target",
       [&] {
         nc::binary_cross_entropy_with_logits(x, i64({1, 0, 1}, {3}));
       },
       "DTypeError", "target"},
      {"softmax_integer",
       [&] {
         nc::softmax(i64({1, 2}, {2}), 0);
       },
       "DTypeError", "softmax"},
      {"softmax_dim", [&] { nc::softmax(logits, 2); }, "IndexError", "softmax"},
      {"log_softmax_undefined", [&] { nc::log_softmax(Tensor(), 0); }, "ValueError", "log_softmax"},
  });
}

TEST(Nn, InvalidArgumentsThrow) {
  auto linear = std::make_shared<nn::Linear>(3, 2);
  auto embedding = std::make_shared<nn::Embedding>(10, 4);
  nn::Module plain;
  run_error_cases({
      {"linear_in_features",
       [&] {
         (*linear)(nc::ones({2, 4}));
       },
       "ShapeError", "in_features = 3"},
      {"linear_dtype",
       [&] {
         (*linear)(nc::ones({2, 3}, DType::F64));
       },
       "DTypeError", "Linear"},
      {"linear_negative", [] { nn::Linear(-1, 2); }, "ValueError", "in_features"},
      {"dropout_negative_p", [] { nn::Dropout(-0.1); }, "ValueError", "p must be in [0, 1]"},
      {"dropout_p_above_1", [] { nn::Dropout(1.5); }, "ValueError", "1.5"},
      {"dropout_integer", [] { nc::dropout(nc::ones({2}, DType::I64), 0.5, true); }, "DTypeError", "dropout"},
      {"embedding_index_range",
       [&] {
         (*embedding)(i64({3, 10}, {2}));
       },
       "IndexError", "index 10"},
      {"embedding_names_size",
       [&] {
         (*embedding)(i64({3, 10}, {2}));
       },
       "IndexError", "10 embeddings"},
      {"embedding_negative", [&] { (*embedding)(i64({-1}, {1})); }, "IndexError", "index -1"},
      {"embedding_float_index", [&] { (*embedding)(f32({1}, {1})); }, "DTypeError", "embedding: index"},
      {"flatten_dims",
       [] {
         nn::Flatten(2, 1)(nc::ones({2, 3, 4}));
       },
       "IndexError", "flatten"},
      {"sequential_index", [] { nn::Sequential()[0]; }, "IndexError", "Sequential"},
      {"base_forward", [&] { plain(nc::ones({1})); }, "Error", "forward"},
      {"duplicate_name",
       [&] {
         plain.register_buffer("a", nc::ones({1}));
         plain.register_parameter("a", nc::ones({1}));
       },
       "ValueError", "\"a\""},
      {"dotted_name", [&] { plain.register_parameter("x.y", nc::ones({1})); }, "ValueError", "x.y"},
      {"integer_parameter", [&] { plain.register_parameter("n", nc::ones({1}, DType::I64)); }, "DTypeError", "\"n\""},
      {"non_leaf_parameter", [&] { plain.register_parameter("p", nc::ones({1}).requires_grad_() * 2.0); }, "ValueError",
       "leaves"},
      {"null_child", [&] { plain.register_module("c", std::shared_ptr<nn::Linear>()); }, "ValueError", "null"},
      {"to_integer_dtype", [&] { linear->to(DType::I64); }, "DTypeError", "floating"},
  });
}

// ---------------------------------------------------------------- naming and traversal
TEST(Nn, SequentialNamesChildrenByPosition) {
  nn::Sequential seq({std::make_shared<nn::Linear>(4, 8), std::make_shared<nn::ReLU>()});
  seq.push_back(std::make_shared<nn::Linear>(8, 2));
  EXPECT_EQ(seq.size(), 3u);
  EXPECT_EQ(names_of(seq.named_parameters()), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_EQ(seq.parameters().size(), 4u);
  EXPECT_EQ(seq.parameters()[2].shape(), (nc::Shape{2, 8}));
  EXPECT_NE(std::dynamic_pointer_cast<nn::ReLU>(seq[1]), nullptr);
  EXPECT_EQ(seq.children().size(), 3u);
  EXPECT_EQ(seq.named_children()[2].first, "2");
  // Nested: a Sequential inside a Sequential gets "1.0.weight".
  nn::Sequential outer(
      {std::make_shared<nn::Tanh>(),
       std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{std::make_shared<nn::Linear>(2, 2)})});
  EXPECT_EQ(names_of(outer.named_parameters()), (std::vector<std::string>{"1.0.weight", "1.0.bias"}));
  // An empty Sequential passes its input through.
  Tensor x = f32({1, 2}, {2});
  EXPECT_TRUE(nn::Sequential()(x).is_same(x));
}

TEST(Nn, CustomModuleNamesFollowPyTorch) {
  Net net(1);
  EXPECT_EQ(names_of(net.named_parameters()), (std::vector<std::string>{"scale", "fc1.weight", "fc1.bias",
                                                                        "body.0.weight", "body.0.bias", "fc2.weight"}));
  EXPECT_EQ(names_of(net.named_buffers()), (std::vector<std::string>{"steps", "body.calls"}));
  // Each module's parameters, then its buffers, then its children's entries.
  EXPECT_EQ(names_of(net.state_dict()),
            (std::vector<std::string>{"scale", "steps", "fc1.weight", "fc1.bias", "body.calls", "body.0.weight",
                                      "body.0.bias", "fc2.weight"}));
  std::vector<std::string> children;
  for (const auto& c : net.named_children()) children.push_back(c.first);
  EXPECT_EQ(children, (std::vector<std::string>{"fc1", "body", "fc2"}));
  int64_t count = 0;
  for (const Tensor& p : net.parameters()) {
    EXPECT_TRUE(p.requires_grad());
    count += p.numel();
  }
  EXPECT_EQ(count, 3 + (4 * 8 + 8) + (8 * 8 + 8) + 8 * 3);
  // The module's member handles are the registered tensors themselves.
  EXPECT_TRUE(net.parameters()[1].is_same(net.fc1->weight));
  EXPECT_FALSE(net.fc2->bias.defined());
  Tensor y = net(nc::ones({5, 4}));
  EXPECT_EQ(y.shape(), (nc::Shape{5, 3}));
  EXPECT_TRUE(y.to_vector<float>() == net.forward(nc::ones({5, 4})).to_vector<float>());
}

TEST(Nn, SharedTensorsAreListedOnceButSavedUnderEveryName) {
  // Weight tying: one Linear reachable as "a" and "b".
  struct Tied : nn::Module {
    Tied() {
      auto shared = std::make_shared<nn::Linear>(2, 2);
      register_module("a", shared);
      register_module("b", shared);
    }
  } tied;
  EXPECT_EQ(names_of(tied.named_parameters()), (std::vector<std::string>{"a.weight", "a.bias"}));
  EXPECT_EQ(tied.children().size(), 1u);
  EXPECT_EQ(names_of(tied.state_dict()), (std::vector<std::string>{"a.weight", "a.bias", "b.weight", "b.bias"}));
}

TEST(Nn, TrainEvalAndZeroGradAreRecursive) {
  Net net(2);
  EXPECT_TRUE(net.is_training());
  net.eval();
  EXPECT_FALSE(net.is_training());
  EXPECT_FALSE(net.body->is_training());
  EXPECT_FALSE((*net.body)[1]->is_training());
  net.train();
  EXPECT_TRUE((*net.body)[1]->is_training());
  nc::sum(net(nc::ones({2, 4}))).backward();
  for (const Tensor& p : net.parameters()) EXPECT_TRUE(p.grad().defined());
  net.zero_grad();
  for (const Tensor& p : net.parameters()) EXPECT_FALSE(p.grad().defined());
}

// ---------------------------------------------------------------- layers
TEST(Nn, LinearInitIsBoundedAndSeeded) {
  nc::Generator gen_a(42), gen_b(42), gen_c(43);
  nn::Linear a(100, 50, true, &gen_a), b(100, 50, true, &gen_b), c(100, 50, true, &gen_c);
  EXPECT_EQ(a.weight.shape(), (nc::Shape{50, 100}));
  EXPECT_EQ(a.bias.shape(), (nc::Shape{50}));
  for (const Tensor& t : {a.weight, a.bias}) {
    EXPECT_LE(nc::max(nc::abs(t)).item<float>(), 0.1f);
    EXPECT_GT(nc::max(nc::abs(t)).item<float>(), 0.09f);  // fills the range
  }
  EXPECT_NEAR(nc::mean(a.weight).item<float>(), 0.0f, 0.005f);
  EXPECT_TRUE(a.weight.to_vector<float>() == b.weight.to_vector<float>());
  EXPECT_TRUE(a.bias.to_vector<float>() == b.bias.to_vector<float>());
  EXPECT_FALSE(a.weight.to_vector<float>() == c.weight.to_vector<float>());
  // Without a generator: the default one, reproducible through manual_seed.
  nc::manual_seed(7);
  nn::Linear d(3, 2);
  nc::manual_seed(7);
  nn::Linear e(3, 2);
  EXPECT_TRUE(d.weight.to_vector<float>() == e.weight.to_vector<float>());
  EXPECT_EQ(names_of(nn::Linear(3, 2, false).named_parameters()), (std::vector<std::string>{"weight"}));
}

TEST(Nn, LinearForwardByHand) {
  nn::Linear layer(2, 3);
  assign(layer.weight, f32({1, 2, 3, 4, 5, 6}, {3, 2}));
  assign(layer.bias, f32({0.5, -1, 0}, {3}));
  Tensor x = f32({1, 1, 2, -1}, {2, 2});
  // [1, 1] -> [3, 7, 11] + bias; [2, -1] -> [0, 2, 4] + bias.
  Tensor y = layer(x);
  expect_near(y, {3.5, 6, 11, 0.5, 1, 4}, 1e-6);
  EXPECT_EQ(layer(x.reshape({2, 1, 2})).shape(), (nc::Shape{2, 1, 3}));
  expect_near(layer(f32({1, 1}, {2})), {3.5, 6, 11}, 1e-6);
  nc::sum(y).backward();
  expect_near(layer.weight.grad(), {3, 0, 3, 0, 3, 0}, 1e-6);  // column sums of x per output
  expect_near(layer.bias.grad(), {2, 2, 2}, 1e-6);
  nn::Linear no_bias(2, 3, false);
  assign(no_bias.weight, f32({1, 2, 3, 4, 5, 6}, {3, 2}));
  expect_near(no_bias(x), {3, 7, 11, 0, 2, 4}, 1e-6);
}

TEST(Nn, ActivationModulesMatchTheirFormulas) {
  Tensor x = f32({-1, 0, 2}, {3});
  struct Row {
    std::string name;
    std::shared_ptr<nn::Module> module;
    std::vector<double> expected;
  };
  const std::vector<Row> rows = {
      {"relu", std::make_shared<nn::ReLU>(), {0, 0, 2}},
      {"tanh", std::make_shared<nn::Tanh>(), {-0.76159416, 0, 0.96402758}},
      {"sigmoid", std::make_shared<nn::Sigmoid>(), {0.26894142, 0.5, 0.88079708}},
      {"gelu", std::make_shared<nn::GELU>(), {-0.15865525, 0, 1.95449974}},
      {"gelu_tanh", std::make_shared<nn::GELU>(true), {-0.15880801, 0, 1.95459769}},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    expect_near((*r.module)(x), r.expected, 1e-6);
    EXPECT_TRUE(r.module->parameters().empty());
  }
}

TEST(Nn, DropoutTrainsAndEvaluates) {
  nc::Generator gen(3);
  nn::Dropout drop(0.3, &gen);
  Tensor x = nc::ones({20000}).requires_grad_();
  Tensor y = drop(x);
  std::vector<float> v = y.to_vector<float>();
  int64_t zeros = 0;
  for (float e : v) {
    if (e == 0) ++zeros;
    else EXPECT_NEAR(e, 1 / 0.7, 1e-6);
  }
  EXPECT_NEAR(static_cast<double>(zeros) / static_cast<double>(v.size()), 0.3, 0.015);
  // The gradient goes through the same scaled mask.
  nc::sum(y).backward();
  EXPECT_TRUE(x.grad().to_vector<float>() == v);
  // The same seed gives the same mask.
  nc::Generator again(3);
  EXPECT_TRUE(nn::Dropout(0.3, &again)(nc::ones({20000})).to_vector<float>() == v);
  drop.eval();
  EXPECT_TRUE(drop(x).is_same(x));
  EXPECT_TRUE(nc::dropout(x, 0.3, /*training=*/false).is_same(x));
  EXPECT_TRUE(nc::dropout(x, 0.0, /*training=*/true).is_same(x));
  expect_near(nc::dropout(f32({1, -2, 3}, {3}), 1.0, true), {0, 0, 0}, 0);
  // Inside a container, eval() reaches it.
  nn::Sequential seq({std::make_shared<nn::Dropout>(0.5)});
  seq.eval();
  expect_near(seq(f32({1, 2}, {2})), {1, 2}, 0);
}

// The fused dropout kernel draws the mask rand() draws and gives the bits of the composed
// x * (ge(rand(shape, f32), p).to(dtype) * (1 / (1 - p))), forward and backward, in every
// floating dtype, on every device, for non-contiguous input too.
TEST(Nn, DropoutIsTheComposedMaskBitForBit) {
  std::vector<nc::Device> devices{nc::Device::cpu()};
  if (nc::cuda_is_available()) devices.push_back(nc::Device::cuda());
  for (const nc::Device& device : devices) {
    for (DType dtype : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
      SCOPED_TRACE(device.str() + " " + nc::dtype_name(dtype));
      nc::Generator data_gen(5);
      const Tensor base = nc::randn({37, 41}, DType::F32, &data_gen).to(device, dtype);
      Tensor x = base.t();  // a non-contiguous leaf
      x.requires_grad_();
      const Tensor g = nc::randn({41, 37}, DType::F32, &data_gen).to(device, dtype);
      for (double p : {0.1, 0.5, 0.9}) {
        nc::Generator fused_gen(11), composed_gen(11);
        const Tensor y = nc::dropout(x, p, true, &fused_gen);
        const Tensor keep = nc::ge(nc::rand(x.shape(), nc::TensorOptions(DType::F32, device), &composed_gen), p);
        const Tensor mask = nc::mul(keep.to(dtype), 1.0 / (1.0 - p));
        EXPECT_EQ(fused_gen.offset(), composed_gen.offset());
        EXPECT_EQ(values_of(y), values_of(nc::mul(x.detach(), mask))) << "p " << p;
        x.zero_grad();
        y.backward(g);
        EXPECT_EQ(values_of(x.grad()), values_of(nc::mul(g, mask))) << "p " << p;
      }
    }
  }
}

TEST(Nn, FlattenShapes) {
  struct Row {
    int64_t start, end;
    nc::Shape expected;
  };
  const std::vector<Row> rows = {
      {1, -1, {2, 60}}, {0, -1, {120}}, {1, 2, {2, 12, 5}}, {-2, -1, {2, 3, 20}}, {2, 2, {2, 3, 4, 5}},
  };
  Tensor x = nc::arange(120, DType::F32).reshape({2, 3, 4, 5});
  for (const Row& r : rows) {
    nn::Flatten flatten(r.start, r.end);
    Tensor y = flatten(x);
    EXPECT_EQ(y.shape(), r.expected) << r.start << ", " << r.end;
    EXPECT_TRUE(y.to_vector<float>() == x.to_vector<float>());
  }
  EXPECT_EQ(nn::Flatten()(nc::ones({7, 2, 2})).shape(), (nc::Shape{7, 4}));
}

TEST(Nn, EmbeddingLooksUpRows) {
  nc::Generator gen(5);
  nn::Embedding table(5, 3, &gen);
  EXPECT_EQ(table.weight.shape(), (nc::Shape{5, 3}));
  std::vector<float> w = table.weight.to_vector<float>();
  Tensor index = i64({0, 4, 4, 2}, {2, 2});
  Tensor y = table(index);
  EXPECT_EQ(y.shape(), (nc::Shape{2, 2, 3}));
  std::vector<float> expected;
  for (int64_t row : {0, 4, 4, 2})
    for (int64_t k = 0; k < 3; ++k) expected.push_back(w[static_cast<size_t>(row * 3 + k)]);
  EXPECT_TRUE(y.to_vector<float>() == expected);
  // i32 indices and a 0-dim index.
  EXPECT_TRUE(table(index.to(DType::I32)).to_vector<float>() == expected);
  EXPECT_EQ(table(i64({1}, {})).shape(), (nc::Shape{3}));
  // Repeated rows accumulate their gradients.
  nc::sum(y).backward();
  expect_near(table.weight.grad(), {1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 2, 2, 2}, 0);
  // N(0, 1) initialisation.
  nn::Embedding big(1000, 16, &gen);
  EXPECT_NEAR(nc::mean(big.weight).item<float>(), 0.0f, 0.03f);
  EXPECT_NEAR(std::sqrt(nc::var(big.weight).item<float>()), 1.0f, 0.03f);
}

// F.embedding's padding_idx: the row is looked up as usual but gets no gradient; a negative
// padding_idx counts from the end.
TEST(Nn, EmbeddingPaddingRowGetsNoGradient) {
  for (int64_t padding_idx : {int64_t{1}, int64_t{-3}}) {
    SCOPED_TRACE(padding_idx);
    Tensor weight = nc::from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2}).requires_grad_();
    Tensor y = nc::embedding(weight, i64({1, 3, 1, 0}, {4}), padding_idx);
    EXPECT_TRUE(y.to_vector<float>() == (std::vector<float>{2, 3, 6, 7, 2, 3, 0, 1}));
    nc::sum(y * 2).backward();
    expect_near(weight.grad(), {2, 2, 0, 0, 0, 0, 2, 2}, 0);
  }
  Tensor weight = nc::zeros({4, 2});
  EXPECT_THROW(nc::embedding(weight, i64({0}, {1}), 4), nc::IndexError);
  EXPECT_THROW(nc::embedding(weight, i64({0}, {1}), -5), nc::IndexError);
  EXPECT_THROW(nc::embedding(nc::zeros({4}), i64({0}, {1})), nc::ShapeError);
}

// ---------------------------------------------------------------- state and conversion
TEST(Nn, StateDictRoundTripsThroughSafetensors) {
  Net source(11), target(12);
  assign(source.steps, i64({9}, {1}));
  Tensor x = leaf({3, 4}, 50).detach().to(DType::F32);
  std::vector<float> expected = source(x).to_vector<float>();
  ASSERT_FALSE(target(x).to_vector<float>() == expected);

  std::string path = ::testing::TempDir() + "normcore_nn_state.safetensors";
  source.save(path);
  nc::safetensors::File file = nc::safetensors::load(path);
  EXPECT_EQ(names_of(file.tensors), names_of(source.state_dict()));
  std::vector<Tensor> handles = target.parameters();
  target.load(path);
  EXPECT_TRUE(target(x).to_vector<float>() == expected);
  EXPECT_EQ(target.steps.to_vector<int64_t>(), (std::vector<int64_t>{9}));
  // Loaded in place: the handles taken before see the new values and still require grad.
  EXPECT_TRUE(handles[1].to_vector<float>() == source.fc1->weight.to_vector<float>());
  EXPECT_TRUE(handles[1].requires_grad());

  // state_dict entries are detached views of the live data.
  nn::NamedTensors state = source.state_dict();
  EXPECT_FALSE(state[2].second.requires_grad());
  EXPECT_EQ(state[2].second.data_ptr(), source.fc1->weight.data_ptr());

  // Entries of another dtype are converted on the way in.
  nn::NamedTensors doubled;
  for (const auto& e : state) doubled.emplace_back(e.first, e.second.to(DType::F64) * 2.0);
  target.load_state_dict(doubled);
  EXPECT_EQ(target.fc1->weight.dtype(), DType::F32);
  expect_near(target.fc1->weight, (source.fc1->weight * 2.0).to_vector<double>(), 1e-6);
}

TEST(Nn, StrictLoadNamesTheOffendingKeys) {
  Net net(13);
  nn::NamedTensors good = Net(14).state_dict();
  std::vector<float> before = net.fc1->weight.to_vector<float>();

  nn::NamedTensors missing(good.begin(), good.end() - 1);  // no "fc2.weight"
  nn::NamedTensors unexpected = good;
  unexpected.emplace_back("head.weight", nc::ones({2}));
  nn::NamedTensors misshaped = good;
  misshaped[3].second = nc::ones({7});  // "fc1.bias"
  nn::NamedTensors duplicated = good;
  duplicated.push_back(good[0]);
  run_error_cases({
      {"missing", [&] { net.load_state_dict(missing); }, "ValueError", "missing keys: \"fc2.weight\""},
      {"unexpected", [&] { net.load_state_dict(unexpected); }, "ValueError", "unexpected keys: \"head.weight\""},
      {"misshaped", [&] { net.load_state_dict(misshaped); }, "ShapeError", "fc1.bias"},
      {"misshaped_lenient", [&] { net.load_state_dict(misshaped, false); }, "ShapeError", "[7]"},
      {"duplicated", [&] { net.load_state_dict(duplicated); }, "ValueError", "more than once"},
      {"missing_file", [&] { net.load(::testing::TempDir() + "no_such_file.safetensors"); }, "IOError", "no_such_file"},
  });
  // Nothing was copied by the failed loads.
  EXPECT_TRUE(net.fc1->weight.to_vector<float>() == before);

  // Not strict: the keys both sides have are loaded, the rest ignored.
  net.load_state_dict(missing, /*strict=*/false);
  EXPECT_TRUE(net.fc1->weight.to_vector<float>() == good[2].second.to_vector<float>());
  net.load_state_dict(unexpected, /*strict=*/false);
}

TEST(Nn, ToDTypeConvertsInPlace) {
  Net net(15);
  std::vector<Tensor> params = net.parameters();
  std::vector<float> weight = net.fc1->weight.to_vector<float>();
  nc::sum(net(nc::ones({2, 4}))).backward();

  net.to(DType::F64);
  for (const Tensor& p : params) {
    EXPECT_EQ(p.dtype(), DType::F64);
    EXPECT_TRUE(p.requires_grad());
    EXPECT_TRUE(p.is_leaf());
    EXPECT_EQ(p.grad().dtype(), DType::F64);  // the accumulated gradient came along
  }
  EXPECT_EQ(net.steps.dtype(), DType::I64);  // integer buffers keep their dtype
  std::vector<double> widened = params[1].to_vector<double>();
  for (size_t i = 0; i < weight.size(); ++i) EXPECT_EQ(widened[i], static_cast<double>(weight[i]));

  // Training keeps working through the old handles.
  net.zero_grad();
  Tensor y = net(nc::ones({2, 4}, DType::F64));
  EXPECT_EQ(y.dtype(), DType::F64);
  nc::sum(y).backward();
  EXPECT_EQ(params[1].grad().dtype(), DType::F64);

  // Same device: nothing moves.
  void* data = params[1].data_ptr();
  net.to(nc::Device::cpu());
  EXPECT_EQ(params[1].data_ptr(), data);
}

// ---------------------------------------------------------------- end to end
TEST(Nn, FitsALineWithGradientDescent) {
  nc::Generator gen(21);
  nn::Linear model(1, 1, true, &gen);
  Tensor x = nc::linspace(-1, 1, 32).reshape({32, 1});
  Tensor y = x * 2.0 + 1.0;
  const double lr = 0.5;
  double first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    Tensor loss = nc::mse_loss(model(x), y);
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
    model.zero_grad();
    loss.backward();
    nc::autograd::NoGradGuard no_grad;
    for (Tensor& p : model.parameters()) p.copy_(p - p.grad() * lr);
  }
  EXPECT_GT(first, 0.1);
  EXPECT_LT(last, 1e-6);
  EXPECT_NEAR(model.weight.item<float>(), 2.0f, 1e-3f);
  EXPECT_NEAR(model.bias.item<float>(), 1.0f, 1e-3f);
}

TEST(Nn, ClassifierLearnsWithCrossEntropy) {
  // Two separable blobs; a Linear-ReLU-Linear net gets them all right.
  nc::Generator gen(22);
  Tensor x =
      nc::cat({nc::randn({32, 2}, DType::F32, &gen) * 0.3 + 1.0, nc::randn({32, 2}, DType::F32, &gen) * 0.3 - 1.0}, 0);
  Tensor labels = nc::cat({nc::zeros({32}, DType::I64), nc::ones({32}, DType::I64)}, 0);
  nn::Sequential model({std::make_shared<nn::Linear>(2, 16, true, &gen), std::make_shared<nn::ReLU>(),
                        std::make_shared<nn::Linear>(16, 2, true, &gen)});
  for (int step = 0; step < 100; ++step) {
    Tensor loss = nc::cross_entropy(model(x), labels, nc::Reduction::Mean, 0.05);
    model.zero_grad();
    loss.backward();
    nc::autograd::NoGradGuard no_grad;
    for (Tensor& p : model.parameters()) p.copy_(p - p.grad() * 0.5);
  }
  Tensor predicted = nc::argmax(model(x), 1);
  EXPECT_EQ(nc::sum(nc::eq(predicted, labels)).item<int64_t>(), 64);
}

TEST(Nn, CudaForwardMatchesCpu) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  Net net(30);
  Tensor x = leaf({5, 4}, 60).detach().to(DType::F32);
  std::vector<float> expected = net(x).to_vector<float>();
  std::vector<Tensor> params = net.parameters();
  net.to(nc::Device::cuda());
  EXPECT_TRUE(params[0].device().is_cuda());
  EXPECT_TRUE(net.steps.device().is_cuda());
  Tensor y = net(x.to(nc::Device::cuda()));
  expect_near(y.to(nc::Device::cpu()), std::vector<double>(expected.begin(), expected.end()), 1e-5);
  nc::sum(y).backward();
  EXPECT_TRUE(params[1].grad().device().is_cuda());
}
