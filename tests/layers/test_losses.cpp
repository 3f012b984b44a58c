// Softmax and the losses: values checked by hand, float64 gradchecks of every loss and of
// softmax/log_softmax, and the error each invalid argument raises (one table row per case).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "normcore/normcore.h"
#include "tests/layers/nn_support.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;
using nn_test::expect_near;
using nn_test::f32;
using nn_test::f64;
using nn_test::i64;
using nn_test::leaf;
using nn_test::run_error_cases;

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
