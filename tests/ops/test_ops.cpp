// The element-wise ops of ops.h on the CPU against hand-computed values: unary and binary
// ops over all numeric dtypes, broadcasting and PyTorch's promotion rules (0-dim tensors and
// Scalars), NaN propagation. Tolerances scale with the dtype. test_layouts_reductions.cpp
// and test_matmul_joining.cpp hold the rest of ops.h.
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

// ---------------------------------------------------------------- unary
TEST(Unary, ValuesOverDTypes) {
  struct Row {
    const char* name;
    std::function<Tensor(const Tensor&)> fn;
    std::vector<double> input;
    std::vector<double> expected;
    std::vector<DType> dtypes;
    bool float_only;  // integer inputs compute (and return) f32
  };
  using std::nullopt;
  const Row rows[] = {
      {"neg", [](const Tensor& x) { return nc::neg(x); }, {-3, 0, 2, 5}, {3, 0, -2, -5}, kSigned, false},
      {"neg u8 wraps", [](const Tensor& x) { return nc::neg(x); }, {0, 1, 255}, {0, 255, 1}, {DType::U8}, false},
      {"neg fraction", [](const Tensor& x) { return -x; }, {-1.5, 0.25}, {1.5, -0.25}, kFloat, false},
      {"abs", [](const Tensor& x) { return nc::abs(x); }, {-3, 0, 2}, {3, 0, 2}, kSigned, false},
      {"abs u8", [](const Tensor& x) { return nc::abs(x); }, {0, 7, 255}, {0, 7, 255}, {DType::U8}, false},
      {"abs fraction",
       [](const Tensor& x) { return nc::abs(x); },
       {-1.5, 0.25, -kInf},
       {1.5, 0.25, kInf},
       kFloat,
       false},
      {"sign", [](const Tensor& x) { return nc::sign(x); }, {-3, 0, 2}, {-1, 0, 1}, kSigned, false},
      {"sign u8", [](const Tensor& x) { return nc::sign(x); }, {0, 9}, {0, 1}, {DType::U8}, false},
      {"sign fraction", [](const Tensor& x) { return nc::sign(x); }, {-0.5, 0.25, kInf}, {-1, 1, 1}, kFloat, false},
      {"relu", [](const Tensor& x) { return nc::relu(x); }, {-3, 0, 2}, {0, 0, 2}, kSigned, false},
      {"relu u8", [](const Tensor& x) { return nc::relu(x); }, {0, 200}, {0, 200}, {DType::U8}, false},
      {"exp",
       [](const Tensor& x) { return nc::exp(x); },
       {0, 1, 2},
       {1, 2.718281828459045, 7.38905609893065},
       kNumeric,
       true},
      {"exp limits", [](const Tensor& x) { return nc::exp(x); }, {-kInf, kInf, kNaN}, {0, kInf, kNaN}, kFloat, true},
      {"log",
       [](const Tensor& x) { return nc::log(x); },
       {1, 2, 8, 0},
       {0, 0.6931471805599453, 2.0794415416798357, -kInf},
       kNumeric,
       true},
      {"log negative", [](const Tensor& x) { return nc::log(x); }, {-1}, {kNaN}, kFloat, true},
      {"sqrt", [](const Tensor& x) { return nc::sqrt(x); }, {0, 1, 4, 9}, {0, 1, 2, 3}, kNumeric, true},
      {"sqrt fraction", [](const Tensor& x) { return nc::sqrt(x); }, {2.25, -1}, {1.5, kNaN}, kFloat, true},
      {"rsqrt", [](const Tensor& x) { return nc::rsqrt(x); }, {1, 4, 16, 0}, {1, 0.5, 0.25, kInf}, kNumeric, true},
      {"sin",
       [](const Tensor& x) { return nc::sin(x); },
       {0, 1, 2},
       {0, 0.8414709848078965, 0.9092974268256817},
       kNumeric,
       true},
      {"cos",
       [](const Tensor& x) { return nc::cos(x); },
       {0, 1, 2},
       {1, 0.5403023058681398, -0.4161468365471424},
       kNumeric,
       true},
      {"tanh",
       [](const Tensor& x) { return nc::tanh(x); },
       {-1, 0, 2},
       {-0.7615941559557649, 0, 0.9640275800758169},
       kSigned,
       true},
      {"sigmoid",
       [](const Tensor& x) { return nc::sigmoid(x); },
       {-2, 0, 2},
       {0.11920292202211755, 0.5, 0.8807970779778823},
       kSigned,
       true},
      {"gelu",
       [](const Tensor& x) { return nc::gelu(x); },
       {-1, 0, 1, 2},
       {-0.15865525393145707, 0, 0.8413447460685429, 1.9544997361036416},
       kSigned,
       true},
      {"gelu tanh",
       [](const Tensor& x) { return nc::gelu(x, true); },
       {-1, 0, 1, 2},
       {-0.15880800939172324, 0, 0.8411919906082768, 1.954597694087775},
       kSigned,
       true},
      {"clamp", [](const Tensor& x) { return nc::clamp(x, -1, 2); }, {-3, -1, 0.5, 3}, {-1, -1, 0.5, 2}, kFloat, false},
      {"clamp int",
       [](const Tensor& x) { return nc::clamp(x, -1, 2); },
       {-3, -1, 0, 3},
       {-1, -1, 0, 2},
       {DType::I32, DType::I64},
       false},
      {"clamp u8", [](const Tensor& x) { return nc::clamp(x, 3, 100); }, {0, 5, 200}, {3, 5, 100}, {DType::U8}, false},
      {"clamp min only", [](const Tensor& x) { return nc::clamp(x, 0, nullopt); }, {-2, 3}, {0, 3}, kSigned, false},
      {"clamp max only", [](const Tensor& x) { return nc::clamp(x, nullopt, 1); }, {-2, 3}, {-2, 1}, kSigned, false},
      {"pow 2", [](const Tensor& x) { return nc::pow(x, 2); }, {-2, 3, 0.5}, {4, 9, 0.25}, kFloat, true},
      {"pow 0.5", [](const Tensor& x) { return nc::pow(x, 0.5); }, {4, 9}, {2, 3}, kNumeric, true},
      {"pow -1", [](const Tensor& x) { return nc::pow(x, -1); }, {2, 4, 0}, {0.5, 0.25, kInf}, kFloat, true},
  };
  for (const Row& r : rows)
    for (DType dtype : r.dtypes) {
      SCOPED_TRACE(trace(r.name, dtype));
      Tensor x = make(r.input, {static_cast<int64_t>(r.input.size())}, dtype);
      Tensor out = r.fn(x);
      DType expected_dtype = r.float_only && !nc::is_floating(dtype) ? DType::F32 : dtype;
      EXPECT_EQ(out.dtype(), expected_dtype);
      EXPECT_EQ(out.shape(), x.shape());
      expect_values(out, r.expected, tol_for(expected_dtype));
    }
}

TEST(Unary, ClampPromotesLikeAScalarOperand) {
  // A float bound makes an integer tensor f32; a float16 tensor stays f16.
  Tensor i = make({1, 5}, {2}, DType::I32);
  Tensor c = nc::clamp(i, 1.5, std::nullopt);
  EXPECT_EQ(c.dtype(), DType::F32);
  expect_values(c, {1.5, 5});
  Tensor h = nc::clamp(make({-1, 0.5, 3}, {3}, DType::F16), 0, 1);
  EXPECT_EQ(h.dtype(), DType::F16);
  expect_values(h, {0, 0.5, 1});
  // clamp returns a new tensor even when nothing changes.
  Tensor same = nc::clamp(i, 0, 10);
  EXPECT_NE(same.storage(), i.storage());
  expect_values(same, {1, 5});
}

TEST(Unary, BoolInputs) {
  Tensor b = make_bool({true, false}, {2});
  Tensor s = nc::sign(b);
  EXPECT_EQ(s.dtype(), DType::Bool);
  expect_values(s, {1, 0});
  Tensor e = nc::exp(b);
  EXPECT_EQ(e.dtype(), DType::F32);
  expect_values(e, {2.718281828459045, 1}, 1e-6);
  EXPECT_THROW(nc::neg(b), nc::DTypeError);
}

// ---------------------------------------------------------------- binary
TEST(Binary, BroadcastingOverDTypes) {
  struct Row {
    const char* name;
    std::function<Tensor(const Tensor&, const Tensor&)> fn;
    std::vector<double> a;
    Shape a_shape;
    std::vector<double> b;
    Shape b_shape;
    std::vector<double> expected;
    Shape out_shape;
    enum Kind { kSame, kFloatResult, kBool } kind;
    std::vector<DType> dtypes = kNumeric;
  };
  const std::vector<double> lhs23 = {1, 2, 3, 4, 5, 6};
  const Row rows[] = {
      {"add [2,1,3] + [4,1]",
       [](const Tensor& a, const Tensor& b) { return nc::add(a, b); },
       lhs23,
       {2, 1, 3},
       {10, 20, 30, 40},
       {4, 1},
       {11, 12, 13, 21, 22, 23, 31, 32, 33, 41, 42, 43, 14, 15, 16, 24, 25, 26, 34, 35, 36, 44, 45, 46},
       {2, 4, 3},
       Row::kSame},
      {"add 0-dim",
       [](const Tensor& a, const Tensor& b) { return a + b; },
       {5},
       {},
       {1, 2, 3},
       {3},
       {6, 7, 8},
       {3},
       Row::kSame},
      {"add same shape",
       [](const Tensor& a, const Tensor& b) { return a + b; },
       {1, 2},
       {2},
       {3, 4},
       {2},
       {4, 6},
       {2},
       Row::kSame},
      {"sub [4,1] - [3]",
       [](const Tensor& a, const Tensor& b) { return nc::sub(a, b); },
       {10, 20, 30, 40},
       {4, 1},
       {1, 2, 3},
       {3},
       {9, 8, 7, 19, 18, 17, 29, 28, 27, 39, 38, 37},
       {4, 3},
       Row::kSame},
      {"sub operator",
       [](const Tensor& a, const Tensor& b) { return a - b; },
       {5, 7},
       {2},
       {1},
       {1},
       {4, 6},
       {2},
       Row::kSame},
      {"mul [2,1] * [3]",
       [](const Tensor& a, const Tensor& b) { return nc::mul(a, b); },
       {2, 3},
       {2, 1},
       {1, 2, 4},
       {3},
       {2, 4, 8, 3, 6, 12},
       {2, 3},
       Row::kSame},
      {"mul operator",
       [](const Tensor& a, const Tensor& b) { return a * b; },
       {2, 3},
       {2},
       {4},
       {},
       {8, 12},
       {2},
       Row::kSame},
      {"div [2,1] / [3]",
       [](const Tensor& a, const Tensor& b) { return nc::div(a, b); },
       {2, 3},
       {2, 1},
       {1, 2, 4},
       {3},
       {2, 1, 0.5, 3, 1.5, 0.75},
       {2, 3},
       Row::kFloatResult},
      {"div operator",
       [](const Tensor& a, const Tensor& b) { return a / b; },
       {1, 3},
       {2},
       {2},
       {1},
       {0.5, 1.5},
       {2},
       Row::kFloatResult},
      {"maximum",
       [](const Tensor& a, const Tensor& b) { return nc::maximum(a, b); },
       {1, 5, 3},
       {3},
       {2, 4},
       {2, 1},
       {2, 5, 3, 4, 5, 4},
       {2, 3},
       Row::kSame},
      {"minimum",
       [](const Tensor& a, const Tensor& b) { return nc::minimum(a, b); },
       {1, 5, 3},
       {3},
       {2, 4},
       {2, 1},
       {1, 2, 2, 1, 4, 3},
       {2, 3},
       Row::kSame},
      {"pow",
       [](const Tensor& a, const Tensor& b) { return nc::pow(a, b); },
       {1, 2, 3},
       {3},
       {2, 0},
       {2, 1},
       {1, 4, 9, 1, 1, 1},
       {2, 3},
       Row::kSame,
       kFloat},
      {"eq",
       [](const Tensor& a, const Tensor& b) { return nc::eq(a, b); },
       lhs23,
       {2, 3},
       {1, 5, 6},
       {3},
       {1, 0, 0, 0, 1, 1},
       {2, 3},
       Row::kBool},
      {"ne",
       [](const Tensor& a, const Tensor& b) { return nc::ne(a, b); },
       lhs23,
       {2, 3},
       {1, 5, 6},
       {3},
       {0, 1, 1, 1, 0, 0},
       {2, 3},
       Row::kBool},
      {"lt",
       [](const Tensor& a, const Tensor& b) { return nc::lt(a, b); },
       {1, 2, 3},
       {3},
       {2, 3},
       {2, 1},
       {1, 0, 0, 1, 1, 0},
       {2, 3},
       Row::kBool},
      {"le",
       [](const Tensor& a, const Tensor& b) { return nc::le(a, b); },
       {1, 2, 3},
       {3},
       {2, 3},
       {2, 1},
       {1, 1, 0, 1, 1, 1},
       {2, 3},
       Row::kBool},
      {"gt",
       [](const Tensor& a, const Tensor& b) { return nc::gt(a, b); },
       {1, 2, 3},
       {3},
       {2, 3},
       {2, 1},
       {0, 0, 1, 0, 0, 0},
       {2, 3},
       Row::kBool},
      {"ge",
       [](const Tensor& a, const Tensor& b) { return nc::ge(a, b); },
       {1, 2, 3},
       {3},
       {2, 3},
       {2, 1},
       {0, 1, 1, 0, 0, 1},
       {2, 3},
       Row::kBool},
  };
  for (const Row& r : rows)
    for (DType dtype : r.dtypes) {
      SCOPED_TRACE(trace(r.name, dtype));
      Tensor out = r.fn(make(r.a, r.a_shape, dtype), make(r.b, r.b_shape, dtype));
      DType expected_dtype = r.kind == Row::kBool                                     ? DType::Bool
                             : r.kind == Row::kFloatResult && !nc::is_floating(dtype) ? DType::F32
                                                                                      : dtype;
      EXPECT_EQ(out.dtype(), expected_dtype);
      EXPECT_EQ(out.shape(), r.out_shape);
      expect_values(out, r.expected, tol_for(expected_dtype));
    }
}

TEST(Binary, IntegerPowKeepsTheIntegerDType) {
  Tensor a = nc::pow(make({2, 3}, {2}, DType::I64), 2);
  EXPECT_EQ(a.dtype(), DType::I64);
  expect_values(a, {4, 9});
  Tensor b = nc::pow(make({2, 3}, {2}, DType::I32), make({3, 2}, {2}, DType::I32));
  EXPECT_EQ(b.dtype(), DType::I32);
  expect_values(b, {8, 9});
  Tensor c = nc::pow(make({2}, {1}, DType::U8), 3);
  EXPECT_EQ(c.dtype(), DType::U8);
  expect_values(c, {8});
  // A float exponent still gives a float result.
  EXPECT_EQ(nc::pow(make({4}, {1}, DType::I32), 0.5).dtype(), DType::F32);
  // Negative integer exponents truncate toward zero; a negative scalar power is refused.
  expect_values(nc::pow(make({2, 1, -1}, {3}, DType::I32), make({-1, -2, -3}, {3}, DType::I32)), {0, 1, -1});
  EXPECT_THROW(nc::pow(make({2}, {1}, DType::I64), -1), nc::ValueError);
}

TEST(Binary, IntegerArithmeticWraps) {
  expect_values(make({250}, {1}, DType::U8) + make({10}, {1}, DType::U8), {4});
  expect_values(make({1}, {1}, DType::U8) - make({2}, {1}, DType::U8), {255});
  Tensor big = nc::full({1}, std::numeric_limits<int32_t>::max(), DType::I32);
  expect_values(big + nc::full({1}, 1, DType::I32), {static_cast<double>(std::numeric_limits<int32_t>::min())});
  expect_values(make({-7, 7}, {2}, DType::I32) / make({2, -2}, {2}, DType::I32), {-3.5, -3.5});
}

TEST(Binary, BoolOperands) {
  Tensor a = make_bool({true, true, false, false}, {4});
  Tensor b = make_bool({true, false, true, false}, {4});
  Tensor sum = a + b;
  EXPECT_EQ(sum.dtype(), DType::Bool);
  expect_values(sum, {1, 1, 1, 0});
  Tensor product = a * b;
  EXPECT_EQ(product.dtype(), DType::Bool);
  expect_values(product, {1, 0, 0, 0});
  expect_values(nc::eq(a, b), {1, 0, 0, 1});
  expect_values(nc::gt(a, b), {0, 1, 0, 0});
  Tensor quotient = a / make({2}, {1}, DType::I64);
  EXPECT_EQ(quotient.dtype(), DType::F32);
  expect_values(quotient, {0.5, 0.5, 0, 0});
}

TEST(Binary, ScalarOperandsAndOperators) {
  struct Row {
    const char* name;
    std::function<Tensor()> fn;
    DType dtype;
    std::vector<double> expected;
  };
  const Tensor f = make({1, 2, 4}, {3});
  const Tensor i = make({1, 2, 4}, {3}, DType::I32);
  const Tensor u = make({1, 2, 4}, {3}, DType::U8);
  const Tensor h = make({1, 2, 4}, {3}, DType::F16);
  const Tensor b = make_bool({true, false}, {2});
  const Tensor cond = make_bool({true, false, true}, {3});
  const Row rows[] = {
      {"add", [&] { return nc::add(f, 2); }, DType::F32, {3, 4, 6}},
      {"sub", [&] { return nc::sub(f, 0.5); }, DType::F32, {0.5, 1.5, 3.5}},
      {"mul", [&] { return nc::mul(f, -1); }, DType::F32, {-1, -2, -4}},
      {"div", [&] { return nc::div(f, 4); }, DType::F32, {0.25, 0.5, 1}},
      {"maximum", [&] { return nc::maximum(f, 2); }, DType::F32, {2, 2, 4}},
      {"minimum", [&] { return nc::minimum(f, 2); }, DType::F32, {1, 2, 2}},
      {"eq", [&] { return nc::eq(f, 2); }, DType::Bool, {0, 1, 0}},
      {"ne", [&] { return nc::ne(f, 2); }, DType::Bool, {1, 0, 1}},
      {"lt", [&] { return nc::lt(f, 2); }, DType::Bool, {1, 0, 0}},
      {"le", [&] { return nc::le(f, 2); }, DType::Bool, {1, 1, 0}},
      {"gt", [&] { return nc::gt(f, 2); }, DType::Bool, {0, 0, 1}},
      {"ge", [&] { return nc::ge(f, 2.0); }, DType::Bool, {0, 1, 1}},
      {"lt int tensor vs float scalar", [&] { return nc::lt(i, 1.5); }, DType::Bool, {1, 0, 0}},
      {"where tensor, scalar", [&] { return nc::where(cond, f, 0.5); }, DType::F32, {1, 0.5, 4}},
      {"where scalar, tensor", [&] { return nc::where(cond, -1, i); }, DType::I32, {-1, 2, -1}},
      {"where int tensor, float scalar", [&] { return nc::where(cond, i, 0.5); }, DType::F32, {1, 0.5, 4}},
      {"where float scalar, f16 tensor", [&] { return nc::where(cond, 2.5, h); }, DType::F16, {2.5, 2, 2.5}},
      {"-t", [&] { return -f; }, DType::F32, {-1, -2, -4}},
      {"t + t", [&] { return f + f; }, DType::F32, {2, 4, 8}},
      {"t - t", [&] { return f - i; }, DType::F32, {0, 0, 0}},
      {"t * t", [&] { return f * f; }, DType::F32, {1, 4, 16}},
      {"t / t", [&] { return f / f; }, DType::F32, {1, 1, 1}},
      {"t + s", [&] { return f + 1; }, DType::F32, {2, 3, 5}},
      {"t - s", [&] { return f - 1; }, DType::F32, {0, 1, 3}},
      {"t * s", [&] { return f * 3; }, DType::F32, {3, 6, 12}},
      {"t / s", [&] { return f / 2; }, DType::F32, {0.5, 1, 2}},
      {"s + t", [&] { return 1 + f; }, DType::F32, {2, 3, 5}},
      {"s - t", [&] { return 10 - f; }, DType::F32, {9, 8, 6}},
      {"s * t", [&] { return 2 * f; }, DType::F32, {2, 4, 8}},
      {"s / t", [&] { return 8 / f; }, DType::F32, {8, 4, 2}},
      {"i32 + 2.5 is f32", [&] { return i + 2.5; }, DType::F32, {3.5, 4.5, 6.5}},
      {"i32 * 3 stays i32", [&] { return i * 3; }, DType::I32, {3, 6, 12}},
      {"i32 / 2 is f32", [&] { return i / 2; }, DType::F32, {0.5, 1, 2}},
      {"8 / i32 is f32", [&] { return 8 / i; }, DType::F32, {8, 4, 2}},
      {"10 - i32 stays i32", [&] { return 10 - i; }, DType::I32, {9, 8, 6}},
      {"u8 - 2 wraps in u8", [&] { return u - 2; }, DType::U8, {255, 0, 2}},
      {"f16 + 2.5 stays f16", [&] { return h + 2.5; }, DType::F16, {3.5, 4.5, 6.5}},
      {"bool + 1 is i64", [&] { return b + 1; }, DType::I64, {2, 1}},
      {"bool * 2.5 is f32", [&] { return b * 2.5; }, DType::F32, {2.5, 0}},
      {"bool + true stays bool", [&] { return b + true; }, DType::Bool, {1, 1}},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    Tensor out = r.fn();
    EXPECT_EQ(out.dtype(), r.dtype);
    expect_values(out, r.expected, tol_for(r.dtype));
  }
}

TEST(Binary, ResultTypeFollowsPyTorch) {
  struct Row {
    const char* name;
    Tensor a;
    std::optional<Tensor> b_tensor;
    std::optional<Scalar> b_scalar;
    DType expected;
  };
  auto t = [](DType d) { return nc::ones({2}, d); };
  auto zero_dim = [](DType d) { return nc::ones({}, d); };
  const Row rows[] = {
      {"i32 tensor + 2.5", t(DType::I32), std::nullopt, 2.5, DType::F32},
      {"i64 tensor + 2.5", t(DType::I64), std::nullopt, 2.5, DType::F32},
      {"f16 tensor + 2.5", t(DType::F16), std::nullopt, 2.5, DType::F16},
      {"bf16 tensor + 2", t(DType::BF16), std::nullopt, 2, DType::BF16},
      {"f64 tensor + 2.5", t(DType::F64), std::nullopt, 2.5, DType::F64},
      {"i32 tensor + 2", t(DType::I32), std::nullopt, 2, DType::I32},
      {"u8 tensor + -1", t(DType::U8), std::nullopt, -1, DType::U8},
      {"u8 tensor + true", t(DType::U8), std::nullopt, true, DType::U8},
      {"bool tensor + 1", t(DType::Bool), std::nullopt, 1, DType::I64},
      {"bool tensor + 1.5", t(DType::Bool), std::nullopt, 1.5, DType::F32},
      {"bool tensor + true", t(DType::Bool), std::nullopt, true, DType::Bool},
      {"0-dim i32 + 2.5", zero_dim(DType::I32), std::nullopt, 2.5, DType::F32},
      {"i32 tensor + 0-dim f64", t(DType::I32), zero_dim(DType::F64), std::nullopt, DType::F64},
      {"0-dim f64 + i32 tensor", zero_dim(DType::F64), t(DType::I32), std::nullopt, DType::F64},
      {"i32 tensor + 0-dim f16", t(DType::I32), zero_dim(DType::F16), std::nullopt, DType::F16},
      {"i32 tensor + 0-dim i64", t(DType::I32), zero_dim(DType::I64), std::nullopt, DType::I32},
      {"u8 tensor + 0-dim i64", t(DType::U8), zero_dim(DType::I64), std::nullopt, DType::U8},
      {"f16 tensor + 0-dim f32", t(DType::F16), zero_dim(DType::F32), std::nullopt, DType::F16},
      {"bool tensor + 0-dim i32", t(DType::Bool), zero_dim(DType::I32), std::nullopt, DType::I32},
      {"i64 tensor + 0-dim bool", t(DType::I64), zero_dim(DType::Bool), std::nullopt, DType::I64},
      {"0-dim f32 + 0-dim f64", zero_dim(DType::F32), zero_dim(DType::F64), std::nullopt, DType::F64},
      {"0-dim i64 + 0-dim f16", zero_dim(DType::I64), zero_dim(DType::F16), std::nullopt, DType::F16},
      {"i32 tensor + i64 tensor", t(DType::I32), t(DType::I64), std::nullopt, DType::I64},
      {"u8 tensor + i32 tensor", t(DType::U8), t(DType::I32), std::nullopt, DType::I32},
      {"f16 tensor + bf16 tensor", t(DType::F16), t(DType::BF16), std::nullopt, DType::F32},
      {"i64 tensor + f16 tensor", t(DType::I64), t(DType::F16), std::nullopt, DType::F16},
      {"f32 tensor + f64 tensor", t(DType::F32), t(DType::F64), std::nullopt, DType::F64},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    if (r.b_tensor) {
      EXPECT_EQ(nc::result_type(r.a, *r.b_tensor), r.expected);
      EXPECT_EQ(nc::add(r.a, *r.b_tensor).dtype(), r.expected);
      EXPECT_EQ(nc::mul(*r.b_tensor, r.a).dtype(), r.expected);
      EXPECT_EQ(nc::eq(r.a, *r.b_tensor).dtype(), DType::Bool);
    } else {
      EXPECT_EQ(nc::result_type(r.a, *r.b_scalar), r.expected);
      EXPECT_EQ(nc::add(r.a, *r.b_scalar).dtype(), r.expected);
      EXPECT_EQ((*r.b_scalar * r.a).dtype(), r.expected);
    }
  }
  // True division of integers gives f32, whatever the operands.
  EXPECT_EQ(nc::div(t(DType::I32), t(DType::I32)).dtype(), DType::F32);
  EXPECT_EQ(nc::div(t(DType::I64), 2).dtype(), DType::F32);
  EXPECT_EQ(nc::div(t(DType::U8), zero_dim(DType::I64)).dtype(), DType::F32);
  EXPECT_EQ(nc::div(t(DType::F16), 2).dtype(), DType::F16);
}

TEST(Binary, ZeroDimOperandValues) {
  Tensor i = make({1, 2}, {2}, DType::I32);
  Tensor sum = i + make({0.5}, {}, DType::F64);
  EXPECT_EQ(sum.dtype(), DType::F64);
  expect_values(sum, {1.5, 2.5});
  Tensor kept = i + make({5}, {}, DType::I64);
  EXPECT_EQ(kept.dtype(), DType::I32);
  expect_values(kept, {6, 7});
}

TEST(Binary, BroadcastShapes) {
  struct Row {
    Shape a, b, expected;
  };
  const Row rows[] = {
      {{2, 1, 3}, {4, 1}, {2, 4, 3}}, {{}, {3}, {3}},  {{3}, {}, {3}}, {{5, 1}, {1, 6}, {5, 6}}, {{0}, {1}, {0}},
      {{2, 0}, {2, 1}, {2, 0}},       {{1}, {1}, {1}}, {{}, {}, {}},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(nc::shape_str(r.a) + " with " + nc::shape_str(r.b));
    EXPECT_EQ(nc::broadcast_shapes(r.a, r.b), r.expected);
  }
  EXPECT_THROW(nc::broadcast_shapes({2, 3}, {4}), nc::ShapeError);
  EXPECT_THROW(nc::broadcast_shapes({0}, {2}), nc::ShapeError);
}

TEST(Binary, WhereBroadcastsAndPromotes) {
  Tensor cond = make_bool({true, false}, {2, 1});
  Tensor out = nc::where(cond, make({1, 2, 3}, {3}), make({9}, {}));
  EXPECT_EQ(out.shape(), (Shape{2, 3}));
  EXPECT_EQ(out.dtype(), DType::F32);
  expect_values(out, {1, 2, 3, 9, 9, 9});

  Tensor mixed = nc::where(make_bool({true, false, true}, {3}), make({1, 2, 3}, {3}, DType::I32),
                           make({-1, -2, -3}, {3}, DType::F64));
  EXPECT_EQ(mixed.dtype(), DType::F64);
  expect_values(mixed, {1, -2, 3});

  Tensor zero_dim_cond = nc::where(nc::full({}, false), make({1, 2}, {2}, DType::I64), make({7}, {1}, DType::I64));
  EXPECT_EQ(zero_dim_cond.dtype(), DType::I64);
  expect_values(zero_dim_cond, {7, 7});
}

TEST(Binary, NaNPropagates) {
  Tensor a = make({1, kNaN, 3, kNaN}, {4});
  Tensor b = make({kNaN, 2, 1, kNaN}, {4});
  for (DType dtype : kFloat) {
    SCOPED_TRACE(nc::dtype_name(dtype));
    expect_values(nc::maximum(a.to(dtype), b.to(dtype)), {kNaN, kNaN, 3, kNaN});
    expect_values(nc::minimum(a.to(dtype), b.to(dtype)), {kNaN, kNaN, 1, kNaN});
    expect_values(nc::maximum(a.to(dtype), 2), {2, kNaN, 3, kNaN});
    expect_values(nc::minimum(a.to(dtype), 2), {1, kNaN, 2, kNaN});
    expect_values(nc::clamp(a.to(dtype), 0, 2), {1, kNaN, 2, kNaN});
    expect_values(nc::relu(a.to(dtype)), {1, kNaN, 3, kNaN});
    expect_values(nc::max(a.to(dtype)), {kNaN});
    expect_values(nc::min(a.to(dtype)), {kNaN});
    // NaN compares unequal to everything, itself included.
    expect_values(nc::eq(a.to(dtype), a.to(dtype)), {1, 0, 1, 0});
    expect_values(nc::ne(a.to(dtype), a.to(dtype)), {0, 1, 0, 1});
    expect_values(nc::lt(a.to(dtype), b.to(dtype)), {0, 0, 0, 0});
  }
}
