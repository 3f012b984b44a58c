// ops.h on the CPU against hand-computed values: non-contiguous, many-dimensional and empty
// inputs, and the reductions (values over dtypes, variance with a large mean, ties and NaN
// in max/min/argmax/argmin).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "normcore/normcore.h"
#include "tests/ops/ops_support.h"

namespace nc = normcore;
using nc::DType;
using nc::Scalar;
using nc::Shape;
using nc::Tensor;
using namespace ops_test;

// ---------------------------------------------------------------- layouts
TEST(Layouts, NonContiguousInputs) {
  // x = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
  const Tensor x = nc::arange(12, DType::F32).view({3, 4});
  const Tensor xt = x.t();                     // [4, 3], strides [1, 4]
  const Tensor stepped = x.slice(1, 0, 4, 2);  // [[0, 2], [4, 6], [8, 10]]
  const Tensor column = make({1, 2, 3}, {3, 1});
  const Tensor expanded = column.expand({3, 4});  // stride 0 along dim 1
  struct Row {
    const char* name;
    std::function<Tensor()> fn;
    Shape shape;
    std::vector<double> expected;
  };
  const Row rows[] = {
      {"neg transposed", [&] { return nc::neg(xt); }, {4, 3}, {0, -4, -8, -1, -5, -9, -2, -6, -10, -3, -7, -11}},
      {"relu(transposed - 5)", [&] { return nc::relu(xt - 5); }, {4, 3}, {0, 0, 3, 0, 0, 4, 0, 1, 5, 0, 2, 6}},
      {"sqrt stepped", [&] { return nc::sqrt(stepped * stepped); }, {3, 2}, {0, 2, 4, 6, 8, 10}},
      {"exp expanded", [&] { return nc::exp(expanded - expanded); }, {3, 4}, std::vector<double>(12, 1.0)},
      {"transposed + transposed expanded",
       [&] { return xt + expanded.t(); },
       {4, 3},
       {1, 6, 11, 2, 7, 12, 3, 8, 13, 4, 9, 14}},
      {"stepped + narrowed expanded", [&] { return stepped + expanded.narrow(1, 0, 2); }, {3, 2}, {1, 3, 6, 8, 11, 13}},
      {"x * expanded", [&] { return x * expanded; }, {3, 4}, {0, 1, 2, 3, 8, 10, 12, 14, 24, 27, 30, 33}},
      {"gt on transposed", [&] { return nc::gt(xt, 5); }, {4, 3}, {0, 0, 1, 0, 0, 1, 0, 1, 1, 0, 1, 1}},
      {"where with transposed cond",
       [&] { return nc::where(nc::gt(xt, 5), xt, expanded.t()); },
       {4, 3},
       {1, 2, 8, 1, 2, 9, 1, 6, 10, 1, 7, 11}},
      {"sum transposed dim 0", [&] { return nc::sum(xt, {0}); }, {3}, {6, 22, 38}},
      {"sum transposed dim 1", [&] { return nc::sum(xt, {1}); }, {4}, {12, 15, 18, 21}},
      {"sum stepped", [&] { return nc::sum(stepped); }, {}, {30}},
      {"prod stepped dim 1", [&] { return nc::prod(stepped, {1}); }, {3}, {0, 24, 80}},
      {"sum expanded", [&] { return nc::sum(expanded); }, {}, {24}},
      {"mean expanded dim 1", [&] { return nc::mean(expanded, {1}); }, {3}, {1, 2, 3}},
      {"var expanded dim 1", [&] { return nc::var(expanded, {1}); }, {3}, {0, 0, 0}},
      {"norm stepped p=1", [&] { return nc::norm(stepped, 1); }, {}, {30}},
      {"max transposed dim 1", [&] { return nc::max(xt, 1).first; }, {4}, {8, 9, 10, 11}},
      {"argmin transposed dim 0", [&] { return nc::argmin(xt, 0); }, {3}, {0, 0, 0}},
      {"matmul stepped @ vector",
       [&] {
         return nc::matmul(stepped, make({1, 1}, {2}));
       },
       {3},
       {2, 10, 18}},
      {"matmul expanded @ transposed",
       [&] { return nc::matmul(expanded, xt); },
       {3, 3},
       {6, 22, 38, 12, 44, 76, 18, 66, 114}},
      {"cat of transposed",
       [&] {
         return nc::cat({xt.narrow(0, 0, 1), xt.narrow(0, 3, 1)}, 0);
       },
       {2, 3},
       {0, 4, 8, 3, 7, 11}},
      {"index_select of transposed",
       [&] { return nc::index_select(xt, 1, make({2}, {1}, DType::I64)); },
       {4, 1},
       {8, 9, 10, 11}},
      {"gather of stepped",
       [&] {
         return nc::gather(stepped, 1, make({1, 0, 1}, {3, 1}, DType::I64));
       },
       {3, 1},
       {2, 4, 10}},
      {"masked_fill of transposed",
       [&] { return nc::masked_fill(xt, nc::lt(xt, 2), -1); },
       {4, 3},
       {-1, 4, 8, -1, 5, 9, 2, 6, 10, 3, 7, 11}},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    Tensor out = r.fn();
    EXPECT_EQ(out.shape(), r.shape);
    expect_values(out, r.expected, 1e-6);
  }
}

TEST(Layouts, ManyDimsThatCannotMerge) {
  // 17 dims of size 2 reversed: no two neighbouring dims merge, so the element loop
  // keeps all 17. y's flat index i holds x's flat index i with its 17 bits reversed.
  const int64_t ndim = 17;
  Tensor x = nc::arange(int64_t{1} << ndim).view(Shape(ndim, 2));
  std::vector<int64_t> reversed;
  for (int64_t d = ndim - 1; d >= 0; --d) reversed.push_back(d);
  Tensor y = x.permute(reversed);
  std::vector<double> expected(size_t{1} << ndim);
  for (int64_t i = 0; i < (int64_t{1} << ndim); ++i) {
    int64_t r = 0;
    for (int64_t bit = 0; bit < ndim; ++bit) r |= ((i >> bit) & 1) << (ndim - 1 - bit);
    expected[static_cast<size_t>(i)] = static_cast<double>(r);
  }
  expect_values(y.clone(), expected);
  std::vector<double> plus_one = expected;
  for (double& v : plus_one) v += 1;
  expect_values(y + 1, plus_one);
}

TEST(Layouts, EmptyTensors) {
  const Tensor e = nc::zeros({0, 3});
  struct Row {
    const char* name;
    std::function<Tensor()> fn;
    Shape shape;
    DType dtype;
    std::vector<double> expected;
  };
  const Row rows[] = {
      {"unary", [&] { return nc::exp(e); }, {0, 3}, DType::F32, {}},
      {"unary int",
       [&] {
         return nc::neg(nc::zeros({2, 0}, DType::I32));
       },
       {2, 0},
       DType::I32,
       {}},
      {"clamp", [&] { return nc::clamp(e, 0, 1); }, {0, 3}, DType::F32, {}},
      {"pow", [&] { return nc::pow(e, 2); }, {0, 3}, DType::F32, {}},
      {"binary broadcast", [&] { return e + nc::ones({3}); }, {0, 3}, DType::F32, {}},
      {"binary [0] with [1]", [&] { return nc::zeros({0}) * nc::ones({1}); }, {0}, DType::F32, {}},
      {"binary [2,0] with [2,1]",
       [&] {
         return nc::zeros({2, 0}) - nc::ones({2, 1});
       },
       {2, 0},
       DType::F32,
       {}},
      {"binary scalar", [&] { return e * 2.5; }, {0, 3}, DType::F32, {}},
      {"comparison", [&] { return nc::eq(e, 0); }, {0, 3}, DType::Bool, {}},
      {"where",
       [&] {
         return nc::where(nc::zeros({0, 1}, DType::Bool), e, 1.0);
       },
       {0, 3},
       DType::F32,
       {}},
      {"sum dim 0", [&] { return nc::sum(e, {0}); }, {3}, DType::F32, {0, 0, 0}},
      {"sum dim 1", [&] { return nc::sum(e, {1}); }, {0}, DType::F32, {}},
      {"sum all", [&] { return nc::sum(e); }, {}, DType::F32, {0}},
      {"sum int", [&] { return nc::sum(nc::zeros({0}, DType::I32)); }, {}, DType::I64, {0}},
      {"prod", [&] { return nc::prod(e); }, {}, DType::F32, {1}},
      {"prod dim 0", [&] { return nc::prod(e, {0}, true); }, {1, 3}, DType::F32, {1, 1, 1}},
      {"mean", [&] { return nc::mean(e); }, {}, DType::F32, {kNaN}},
      {"var", [&] { return nc::var(e, {0}); }, {3}, DType::F32, {kNaN, kNaN, kNaN}},
      {"norm", [&] { return nc::norm(e); }, {}, DType::F32, {0}},
      // The infinity norm over the empty dim has no value (ShapeError, test_errors.cpp).
      {"norm inf over the other dim", [&] { return nc::norm(e, kInf, {1}); }, {0}, DType::F32, {}},
      {"all", [&] { return nc::all(e); }, {}, DType::Bool, {1}},
      {"any", [&] { return nc::any(e); }, {}, DType::Bool, {0}},
      {"max over a non-empty dim", [&] { return nc::max(e, 1).first; }, {0}, DType::F32, {}},
      {"argmin over a non-empty dim", [&] { return nc::argmin(e, 1); }, {0}, DType::I64, {}},
      {"matmul K = 0",
       [&] {
         return nc::matmul(nc::zeros({2, 0}), nc::zeros({0, 3}));
       },
       {2, 3},
       DType::F32,
       {0, 0, 0, 0, 0, 0}},
      {"matmul M = 0",
       [&] {
         return nc::matmul(e, nc::ones({3, 2}));
       },
       {0, 2},
       DType::F32,
       {}},
      {"matmul batch 0",
       [&] {
         return nc::matmul(nc::zeros({0, 2, 3}), nc::ones({3, 4}));
       },
       {0, 2, 4},
       DType::F32,
       {}},
      {"matmul 1-D K = 0", [&] { return nc::matmul(nc::zeros({0}), nc::zeros({0})); }, {}, DType::F32, {0}},
      {"cat",
       [&] {
         return nc::cat({e, nc::ones({2, 3})});
       },
       {2, 3},
       DType::F32,
       {1, 1, 1, 1, 1, 1}},
      {"cat all empty",
       [&] {
         return nc::cat({e, e}, 1);
       },
       {0, 6},
       DType::F32,
       {}},
      {"stack",
       [&] {
         return nc::stack({nc::zeros({0}), nc::zeros({0})});
       },
       {2, 0},
       DType::F32,
       {}},
      {"split", [&] { return nc::split(nc::zeros({0}), 2)[0]; }, {0}, DType::F32, {}},
      {"index_select empty index",
       [&] {
         return nc::index_select(nc::ones({2, 3}), 1, nc::zeros({0}, DType::I64));
       },
       {2, 0},
       DType::F32,
       {}},
      {"index_select from empty",
       [&] { return nc::index_select(e, 1, make({2}, {1}, DType::I64)); },
       {0, 1},
       DType::F32,
       {}},
      {"gather empty index",
       [&] {
         return nc::gather(nc::ones({2, 3}), 1, nc::zeros({2, 0}, DType::I64));
       },
       {2, 0},
       DType::F32,
       {}},
      {"scatter_add empty index",
       [&] { return nc::scatter_add(nc::ones({2}), 0, nc::zeros({0}, DType::I64), nc::zeros({0})); },
       {2},
       DType::F32,
       {1, 1}},
      {"one_hot", [&] { return nc::one_hot(nc::zeros({0}, DType::I64), 3); }, {0, 3}, DType::I64, {}},
      {"masked_fill", [&] { return nc::masked_fill(e, nc::zeros({3}, DType::Bool), 1); }, {0, 3}, DType::F32, {}},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    Tensor out = r.fn();
    EXPECT_EQ(out.shape(), r.shape);
    EXPECT_EQ(out.dtype(), r.dtype);
    expect_values(out, r.expected);
  }
  EXPECT_THROW(nc::max(e), nc::ShapeError);
  EXPECT_THROW(nc::min(e), nc::ShapeError);
  EXPECT_THROW(nc::argmax(e), nc::ShapeError);
  EXPECT_THROW(nc::max(e, 0), nc::ShapeError);
  EXPECT_THROW(nc::argmin(e, 0), nc::ShapeError);
}

// ---------------------------------------------------------------- reductions
TEST(Reductions, Values) {
  const Tensor x = make({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor x3 = nc::arange(24, DType::F32).view({2, 3, 4});
  const Tensor y = make({-3, 4, 0, -1}, {2, 2});
  const Tensor flags = make_bool({true, false, true, true}, {2, 2});
  struct Row {
    const char* name;
    std::function<Tensor()> fn;
    Shape shape;
    DType dtype;
    std::vector<double> expected;
  };
  const Row rows[] = {
      {"sum all", [&] { return nc::sum(x); }, {}, DType::F32, {21}},
      {"sum dim 0", [&] { return nc::sum(x, {0}); }, {3}, DType::F32, {5, 7, 9}},
      {"sum dim 1", [&] { return nc::sum(x, {1}); }, {2}, DType::F32, {6, 15}},
      {"sum dim -1 keepdim", [&] { return nc::sum(x, {-1}, true); }, {2, 1}, DType::F32, {6, 15}},
      {"sum dims 0,1",
       [&] {
         return nc::sum(x, {0, 1});
       },
       {},
       DType::F32,
       {21}},
      {"sum dims 0,1 keepdim",
       [&] {
         return nc::sum(x, {1, 0}, true);
       },
       {1, 1},
       DType::F32,
       {21}},
      {"sum 3-D dims 0,2",
       [&] {
         return nc::sum(x3, {0, 2});
       },
       {3},
       DType::F32,
       {60, 92, 124}},
      {"sum 3-D dims -1,0",
       [&] {
         return nc::sum(x3, {-1, 0});
       },
       {3},
       DType::F32,
       {60, 92, 124}},
      {"sum 3-D dim 1 keepdim",
       [&] { return nc::sum(x3, {1}, true); },
       {2, 1, 4},
       DType::F32,
       {12, 15, 18, 21, 48, 51, 54, 57}},
      {"sum 0-dim", [&] { return nc::sum(nc::full({}, 2.5)); }, {}, DType::F32, {2.5}},
      {"sum i32 is i64",
       [&] {
         return nc::sum(make({1, 2, 3}, {3}, DType::I32));
       },
       {},
       DType::I64,
       {6}},
      {"sum bool is i64",
       [&] {
         return nc::sum(make_bool({true, true, false}, {3}));
       },
       {},
       DType::I64,
       {2}},
      {"sum u8 does not wrap",
       [&] {
         return nc::sum(make({200, 100}, {2}, DType::U8));
       },
       {},
       DType::I64,
       {300}},
      {"sum f16 accumulates wide", [&] { return nc::sum(nc::ones({4096}, DType::F16)); }, {}, DType::F16, {4096}},
      {"sum bf16 accumulates wide", [&] { return nc::sum(nc::ones({1024}, DType::BF16)); }, {}, DType::BF16, {1024}},
      {"mean all", [&] { return nc::mean(x); }, {}, DType::F32, {3.5}},
      {"mean dim 1", [&] { return nc::mean(x, {1}); }, {2}, DType::F32, {2, 5}},
      {"mean 3-D dims 0,2",
       [&] {
         return nc::mean(x3, {0, 2});
       },
       {3},
       DType::F32,
       {7.5, 11.5, 15.5}},
      {"mean f64 keepdim", [&] { return nc::mean(x.to(DType::F64), {0}, true); }, {1, 3}, DType::F64, {2.5, 3.5, 4.5}},
      {"mean f16", [&] { return nc::mean(x.to(DType::F16)); }, {}, DType::F16, {3.5}},
      {"var unbiased", [&] { return nc::var(x); }, {}, DType::F32, {3.5}},
      {"var biased", [&] { return nc::var(x, {}, false); }, {}, DType::F32, {17.5 / 6}},
      {"var dim 1", [&] { return nc::var(x, {1}); }, {2}, DType::F32, {1, 1}},
      {"var dim 0 biased keepdim",
       [&] { return nc::var(x, {0}, false, true); },
       {1, 3},
       DType::F32,
       {2.25, 2.25, 2.25}},
      {"var of one element, unbiased", [&] { return nc::var(nc::full({1}, 3.0)); }, {}, DType::F32, {kNaN}},
      {"var of one element, biased", [&] { return nc::var(nc::full({1}, 3.0), {}, false); }, {}, DType::F32, {0}},
      {"prod all", [&] { return nc::prod(x); }, {}, DType::F32, {720}},
      {"prod dim 0", [&] { return nc::prod(x, {0}); }, {3}, DType::F32, {4, 10, 18}},
      {"prod i32 is i64",
       [&] {
         return nc::prod(make({2, 3, 4}, {3}, DType::I32));
       },
       {},
       DType::I64,
       {24}},
      {"prod u8 does not wrap",
       [&] {
         return nc::prod(make({16, 16}, {2}, DType::U8));
       },
       {},
       DType::I64,
       {256}},
      {"norm p=1", [&] { return nc::norm(y, 1); }, {}, DType::F32, {8}},
      {"norm p=2", [&] { return nc::norm(y); }, {}, DType::F32, {std::sqrt(26.0)}},
      {"norm p=3", [&] { return nc::norm(y, 3); }, {}, DType::F32, {std::cbrt(92.0)}},
      {"norm p=inf", [&] { return nc::norm(y, kInf); }, {}, DType::F32, {4}},
      {"norm p=0.5",
       [&] {
         return nc::norm(make({1, 4}, {2}), 0.5);
       },
       {},
       DType::F32,
       {9}},
      {"norm p=2 dim 1", [&] { return nc::norm(y, 2, {1}); }, {2}, DType::F32, {5, 1}},
      {"norm p=inf dim 0", [&] { return nc::norm(y, kInf, {0}); }, {2}, DType::F32, {3, 4}},
      {"norm p=1 dim -1 keepdim", [&] { return nc::norm(y, 1, {-1}, true); }, {2, 1}, DType::F32, {7, 1}},
      {"norm f64", [&] { return nc::norm(y.to(DType::F64), 2, {0}); }, {2}, DType::F64, {3, std::sqrt(17.0)}},
      {"all", [&] { return nc::all(flags); }, {}, DType::Bool, {0}},
      {"all dim 1", [&] { return nc::all(flags, {1}); }, {2}, DType::Bool, {0, 1}},
      {"all dim 0 keepdim", [&] { return nc::all(flags, {0}, true); }, {1, 2}, DType::Bool, {1, 0}},
      {"all of non-zero ints",
       [&] {
         return nc::all(make({2, -3}, {2}, DType::I32));
       },
       {},
       DType::Bool,
       {1}},
      {"any", [&] { return nc::any(flags); }, {}, DType::Bool, {1}},
      {"any dim 1", [&] { return nc::any(flags, {1}); }, {2}, DType::Bool, {1, 1}},
      {"any of floats dim 1",
       [&] {
         return nc::any(make({0, 0, 0, 1.5}, {2, 2}), {1});
       },
       {2},
       DType::Bool,
       {0, 1}},
      {"any of nan",
       [&] {
         return nc::any(make({0, kNaN}, {2}));
       },
       {},
       DType::Bool,
       {1}},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    Tensor out = r.fn();
    EXPECT_EQ(out.shape(), r.shape);
    EXPECT_EQ(out.dtype(), r.dtype);
    expect_values(out, r.expected, std::max(tol_for(r.dtype), 1e-6));
  }
}

TEST(Reductions, VarianceIsAccurateWhenTheMeanIsLarge) {
  // 1e6 + unit noise in f32: a one-pass E[x^2] - E[x]^2 in float would lose every digit.
  nc::Generator gen(17);
  Tensor x = nc::randn({4, 5000}, {}, &gen) + 1e6;
  ASSERT_EQ(x.dtype(), DType::F32);
  std::vector<double> v = x.to_vector<double>();
  auto reference = [&](size_t begin, size_t end, double correction) {
    double sum = 0;
    for (size_t i = begin; i < end; ++i) sum += v[i];
    double mean = sum / static_cast<double>(end - begin);
    double sq = 0;
    for (size_t i = begin; i < end; ++i) sq += (v[i] - mean) * (v[i] - mean);
    return sq / (static_cast<double>(end - begin) - correction);
  };
  double all_unbiased = reference(0, v.size(), 1);
  EXPECT_GT(all_unbiased, 0.9);
  EXPECT_LT(all_unbiased, 1.1);
  EXPECT_NEAR(nc::var(x).item<double>(), all_unbiased, 1e-5 * all_unbiased);
  EXPECT_NEAR(nc::var(x, {}, false).item<double>(), reference(0, v.size(), 0), 1e-5 * all_unbiased);
  std::vector<double> rows = nc::var(x, {1}).to_vector<double>();
  ASSERT_EQ(rows.size(), 4u);
  for (size_t r = 0; r < 4; ++r) EXPECT_NEAR(rows[r], reference(r * 5000, (r + 1) * 5000, 1), 1e-5);
  EXPECT_NEAR(nc::mean(x).item<double>(), 1e6, 0.1);
}

TEST(Reductions, MaxMinArgWithTies) {
  // Ties resolve to the first index.
  const std::vector<double> data = {3, 1, 3, 3, 2, 0};  // [[3, 1, 3], [3, 2, 0]]
  for (DType dtype : kNumeric) {
    SCOPED_TRACE(nc::dtype_name(dtype));
    Tensor x = make(data, {2, 3}, dtype);
    Tensor mx = nc::max(x);
    EXPECT_EQ(mx.dtype(), dtype);
    EXPECT_EQ(mx.shape(), Shape{});
    expect_values(mx, {3});
    expect_values(nc::min(x), {0});

    auto [max1, imax1] = nc::max(x, 1);
    EXPECT_EQ(max1.dtype(), dtype);
    EXPECT_EQ(imax1.dtype(), DType::I64);
    expect_values(max1, {3, 3});
    expect_values(imax1, {0, 0});
    auto [min1, imin1] = nc::min(x, 1);
    expect_values(min1, {1, 0});
    expect_values(imin1, {1, 2});
    auto [max0, imax0] = nc::max(x, 0);
    expect_values(max0, {3, 2, 3});
    expect_values(imax0, {0, 1, 0});
    auto [min0, imin0] = nc::min(x, -2);
    expect_values(min0, {3, 1, 0});
    expect_values(imin0, {0, 0, 1});
    auto [maxk, imaxk] = nc::max(x, -1, true);
    EXPECT_EQ(maxk.shape(), (Shape{2, 1}));
    EXPECT_EQ(imaxk.shape(), (Shape{2, 1}));
    auto [mink, imink] = nc::min(x, 0, true);
    EXPECT_EQ(mink.shape(), (Shape{1, 3}));
    expect_values(imink, {0, 0, 1});

    expect_values(nc::argmax(x, 1), {0, 0});
    expect_values(nc::argmax(x, 0, true), {0, 1, 0});
    EXPECT_EQ(nc::argmax(x, 0, true).shape(), (Shape{1, 3}));
    expect_values(nc::argmin(x, 1), {1, 2});
    expect_values(nc::argmin(x, 0), {0, 0, 1});
    EXPECT_EQ(nc::argmin(x, -1, true).shape(), (Shape{2, 1}));
    Tensor flat = nc::argmax(x);
    EXPECT_EQ(flat.dtype(), DType::I64);
    EXPECT_EQ(flat.shape(), Shape{});
    expect_values(flat, {0});
    expect_values(nc::argmax(make({1, 4, 4, 2}, {2, 2}, dtype)), {1});
  }
  // A 0-dim tensor reduces over its only element.
  auto [v, i] = nc::max(nc::full({}, 2.0), 0);
  EXPECT_EQ(v.shape(), Shape{});
  expect_values(v, {2});
  expect_values(i, {0});
  expect_values(nc::argmax(nc::full({}, 2.0)), {0});
}

TEST(Reductions, MaxMinWithNaN) {
  for (DType dtype : kFloat) {
    SCOPED_TRACE(nc::dtype_name(dtype));
    Tensor x = make({1, kNaN, 3, kNaN}, {4}, dtype);
    expect_values(nc::max(x), {kNaN});
    expect_values(nc::min(x), {kNaN});
    auto [maxv, maxi] = nc::max(x, 0);
    expect_values(maxv, {kNaN});
    expect_values(maxi, {1});
    auto [minv, mini] = nc::min(x, 0);
    expect_values(minv, {kNaN});
    expect_values(mini, {1});
    expect_values(nc::argmax(x), {1});
    expect_values(nc::argmin(x, 0), {1});
    Tensor rows = make({kNaN, 5, 2, 7}, {2, 2}, dtype);
    expect_values(nc::argmax(rows, 1), {0, 1});
    expect_values(nc::argmin(rows, 1), {0, 0});
    expect_values(nc::max(rows, 1).first, {kNaN, 7});
  }
}
