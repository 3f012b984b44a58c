// Every op in ops.h on the CPU against hand-computed values: element-wise ops over all
// numeric dtypes, broadcasting and PyTorch's promotion rules (0-dim tensors and Scalars),
// NaN propagation, non-contiguous and empty inputs, reductions, matmul (against an f64
// reference for f16/bf16) and the joining/indexing ops. Tolerances scale with the dtype.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "normcore/normcore.h"

namespace nc = normcore;
using nc::DType;
using nc::Scalar;
using nc::Shape;
using nc::Tensor;

namespace {

const std::vector<DType> kFloat = {DType::F32, DType::F64, DType::F16, DType::BF16};
const std::vector<DType> kSigned = {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64};
const std::vector<DType> kNumeric = {DType::F32, DType::F64, DType::F16, DType::BF16,
                                     DType::I32, DType::I64, DType::U8};

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor make(const std::vector<double>& v, const Shape& shape, DType dtype = DType::F32) {
  return nc::from_vector<double>(v, shape).to(dtype);
}

Tensor make_bool(const std::vector<bool>& v, const Shape& shape) { return nc::from_vector<bool>(v, shape); }

// Relative tolerance for results rounded to dtype (a few units in the last place).
double tol_for(DType dtype) {
  switch (dtype) {
    case DType::F64: return 1e-12;
    case DType::F32: return 2e-6;
    case DType::F16: return 1e-3;
    case DType::BF16: return 8e-3;
    default: return 0;
  }
}

// |actual - expected| <= tol * max(1, |expected|) element by element; a NaN expects a
// NaN and an infinity expects the same infinity.
void expect_values(const Tensor& t, const std::vector<double>& expected, double tol = 0) {
  std::vector<double> actual = t.to_vector<double>();
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    double a = actual[i], e = expected[i];
    if (std::isnan(e)) {
      EXPECT_TRUE(std::isnan(a)) << "element " << i << ": got " << a << ", expected nan";
    } else if (std::isinf(e)) {
      EXPECT_EQ(a, e) << "element " << i;
    } else {
      EXPECT_LE(std::fabs(a - e), tol * std::max(1.0, std::fabs(e)))
          << "element " << i << ": got " << a << ", expected " << e;
    }
  }
}

std::string trace(const char* name, DType dtype) { return std::string(name) + " " + nc::dtype_name(dtype); }

}  // namespace

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

// ---------------------------------------------------------------- matmul
namespace {

// out[b] = a[b] @ bm[b] for contiguous row-major [batch, rows, inner] and [batch, inner, cols].
std::vector<double> reference_matmul(const std::vector<double>& a, const std::vector<double>& bm, int64_t batch,
                                     int64_t rows, int64_t inner, int64_t cols) {
  std::vector<double> out(static_cast<size_t>(batch * rows * cols), 0.0);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        double acc = 0;
        for (int64_t k = 0; k < inner; ++k) acc += a[(b * rows + r) * inner + k] * bm[(b * inner + k) * cols + c];
        out[(b * rows + r) * cols + c] = acc;
      }
  return out;
}

// Small integers (exact in every float dtype): i % 7 - 3.
std::vector<double> pattern(int64_t n, int64_t shift = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<double>((i + shift) % 7 - 3);
  return v;
}

}  // namespace

TEST(Matmul, Shapes) {
  struct Row {
    const char* name;
    std::function<Tensor()> fn;
    Shape shape;
    std::vector<double> expected;
  };
  const Tensor m23 = make({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor m32 = make({1, 2, 3, 4, 5, 6}, {3, 2});
  const Tensor b3 = make({1, 0, 0, 1, 1, 1}, {3, 2});
  const Row rows[] = {
      {"1-D . 1-D",
       [&] {
         return nc::matmul(make({1, 2, 3}, {3}), make({4, 5, 6}, {3}));
       },
       {},
       {32}},
      {"1-D @ 2-D",
       [&] {
         return nc::matmul(make({1, 2}, {2}), m23);
       },
       {3},
       {9, 12, 15}},
      {"2-D @ 1-D",
       [&] {
         return nc::matmul(m23, make({1, 0, -1}, {3}));
       },
       {2},
       {-2, -2}},
      {"2-D @ 2-D",
       [&] {
         return nc::matmul(make({1, 2, 3, 4}, {2, 2}), make({5, 6, 7, 8}, {2, 2}));
       },
       {2, 2},
       {19, 22, 43, 50}},
      {"1-D @ 3-D",
       [&] {
         return nc::matmul(make({1, 2}, {2}), make(pattern(12), {2, 2, 3}));
       },
       {2, 3},
       {-3, 0, 3, 1, -3, 0}},
      {"3-D @ 1-D",
       [&] {
         return nc::matmul(make(pattern(12), {2, 2, 3}), make({1, 1, 1}, {3}));
       },
       {2, 2},
       {-6, 3, -2, 0}},
      {"a.t() @ b", [&] { return nc::matmul(m32.t(), b3); }, {2, 2}, {6, 8, 8, 10}},
      {"a @ b.t()", [&] { return nc::matmul(m23, m23.t()); }, {2, 2}, {14, 32, 32, 77}},
      {"a.t() @ b.t()", [&] { return nc::matmul(m32.t(), m23.t()); }, {2, 2}, {22, 49, 28, 64}},
      {"row vector @ column vector",
       [&] {
         return nc::matmul(make({1, 2}, {1, 2}), make({3, 4}, {2, 1}));
       },
       {1, 1},
       {11}},
      {"f64", [&] { return nc::matmul(m23.to(DType::F64), m32.to(DType::F64)); }, {2, 2}, {22, 28, 49, 64}},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    Tensor out = r.fn();
    EXPECT_EQ(out.shape(), r.shape);
    expect_values(out, r.expected);
  }
}

TEST(Matmul, BatchedBroadcastAndTransposedOperands) {
  // [2, 1, 3, 4] @ [5, 4, 2] -> [2, 5, 3, 2]
  std::vector<double> av = pattern(24), bv = pattern(40, 2);
  Tensor a = make(av, {2, 1, 3, 4});
  Tensor b = make(bv, {5, 4, 2});
  Tensor out = nc::matmul(a, b);
  ASSERT_EQ(out.shape(), (Shape{2, 5, 3, 2}));
  std::vector<double> expected;
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 5; ++j) {
      std::vector<double> ai(av.begin() + i * 12, av.begin() + (i + 1) * 12);
      std::vector<double> bj(bv.begin() + j * 8, bv.begin() + (j + 1) * 8);
      std::vector<double> piece = reference_matmul(ai, bj, 1, 3, 4, 2);
      expected.insert(expected.end(), piece.begin(), piece.end());
    }
  expect_values(out, expected);

  // b.transpose(-1, -2) of a contiguous [2, 3, 4] is a column-major batch.
  std::vector<double> cv = pattern(24, 5);
  Tensor c = make(cv, {2, 3, 4});
  Tensor ct = c.transpose(-1, -2);
  Tensor prod = nc::matmul(make(pattern(24), {2, 3, 4}), ct);
  ASSERT_EQ(prod.shape(), (Shape{2, 3, 3}));
  expect_values(prod, reference_matmul(pattern(24), ct.contiguous().to_vector<double>(), 2, 3, 4, 3));

  // A shared (broadcast) right operand that is itself transposed.
  Tensor w = make(pattern(8, 1), {2, 4});
  Tensor shared = nc::matmul(c, w.t());
  ASSERT_EQ(shared.shape(), (Shape{2, 3, 2}));
  std::vector<double> wt = w.t().contiguous().to_vector<double>();
  std::vector<double> shared_expected;
  for (int64_t i = 0; i < 2; ++i) {
    std::vector<double> ci(cv.begin() + i * 12, cv.begin() + (i + 1) * 12);
    std::vector<double> piece = reference_matmul(ci, wt, 1, 3, 4, 2);
    shared_expected.insert(shared_expected.end(), piece.begin(), piece.end());
  }
  expect_values(shared, shared_expected);
}

TEST(Matmul, Tf32SettingLeavesCpuMatmulsInFloat32) {
  struct Restore {
    ~Restore() { nc::cuda::set_allow_tf32(false); }
  } restore;
  nc::cuda::set_allow_tf32(true);
  EXPECT_TRUE(nc::cuda::allow_tf32());
  // 1 + 2^-20 squared is 1 + 2^-19 in float32; TF32 would round it to 1.
  const Tensor x = nc::full({1, 1}, 1.0 + std::ldexp(1.0, -20), DType::F32);
  EXPECT_EQ(nc::matmul(x, x).item<double>(), 1.0 + std::ldexp(1.0, -19));
  nc::cuda::set_allow_tf32(false);
  EXPECT_FALSE(nc::cuda::allow_tf32());
}

TEST(Matmul, HalfPrecisionAgainstF64Reference) {
  const int64_t batch = 2, rows = 7, inner = 33, cols = 5;
  for (DType dtype : {DType::F16, DType::BF16, DType::F32}) {
    SCOPED_TRACE(nc::dtype_name(dtype));
    nc::Generator gen(99);
    Tensor a = nc::randn({batch, rows, inner}, dtype, &gen);
    Tensor b = nc::randn({inner, cols}, dtype, &gen);
    Tensor out = nc::matmul(a, b);
    EXPECT_EQ(out.dtype(), dtype);
    ASSERT_EQ(out.shape(), (Shape{batch, rows, cols}));
    // The reference uses the rounded inputs, so only accumulation and output rounding differ.
    std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
    std::vector<double> bb;
    for (int64_t i = 0; i < batch; ++i) bb.insert(bb.end(), bv.begin(), bv.end());
    std::vector<double> ref = reference_matmul(av, bb, batch, rows, inner, cols);
    std::vector<double> got = out.to_vector<double>();
    double eps = dtype == DType::F16 ? std::ldexp(1.0, -10) : dtype == DType::BF16 ? std::ldexp(1.0, -7) : 1e-6;
    for (int64_t bi = 0; bi < batch; ++bi)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          double magnitude = 0;
          for (int64_t k = 0; k < inner; ++k)
            magnitude += std::fabs(av[(bi * rows + r) * inner + k] * bv[k * cols + c]);
          size_t at = static_cast<size_t>((bi * rows + r) * cols + c);
          EXPECT_NEAR(got[at], ref[at], eps * magnitude) << "at " << at;
        }
  }
}

// ---------------------------------------------------------------- joining and indexing
TEST(Joining, CatStackSplit) {
  struct Row {
    const char* name;
    std::function<Tensor()> fn;
    Shape shape;
    std::vector<double> expected;
  };
  const Tensor m22 = make({1, 2, 3, 4}, {2, 2});
  const Row rows[] = {
      {"cat dim 0",
       [&] {
         return nc::cat({m22, make({5, 6}, {1, 2})});
       },
       {3, 2},
       {1, 2, 3, 4, 5, 6}},
      {"cat dim -1",
       [&] {
         return nc::cat({make({1, 2}, {2, 1}), make({3, 4, 5, 6}, {2, 2})}, -1);
       },
       {2, 3},
       {1, 3, 4, 2, 5, 6}},
      {"cat three",
       [&] {
         return nc::cat({make({1}, {1}), make({2, 3}, {2}), make({4}, {1})});
       },
       {4},
       {1, 2, 3, 4}},
      {"cat skips 1-D empty",
       [&] {
         return nc::cat({nc::zeros({0}), m22});
       },
       {2, 2},
       {1, 2, 3, 4}},
      {"cat of one", [&] { return nc::cat({m22}, 1); }, {2, 2}, {1, 2, 3, 4}},
      {"cat i64",
       [&] {
         return nc::cat({nc::arange(2), nc::arange(3)});
       },
       {5},
       {0, 1, 0, 1, 2}},
      {"stack dim 0",
       [&] {
         return nc::stack({make({1, 2}, {2}), make({3, 4}, {2})});
       },
       {2, 2},
       {1, 2, 3, 4}},
      {"stack dim 1",
       [&] {
         return nc::stack({make({1, 2}, {2}), make({3, 4}, {2})}, 1);
       },
       {2, 2},
       {1, 3, 2, 4}},
      {"stack dim -1",
       [&] {
         return nc::stack({make({1, 2}, {2}), make({3, 4}, {2})}, -1);
       },
       {2, 2},
       {1, 3, 2, 4}},
      {"stack 0-dim",
       [&] {
         return nc::stack({nc::full({}, 1.0), nc::full({}, 2.0)});
       },
       {2},
       {1, 2}},
      {"stack 2-D dim 1",
       [&] {
         return nc::stack({m22, m22 * 10}, 1);
       },
       {2, 2, 2},
       {1, 2, 10, 20, 3, 4, 30, 40}},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    Tensor out = r.fn();
    EXPECT_EQ(out.shape(), r.shape);
    expect_values(out, r.expected);
  }
  EXPECT_NE(nc::cat({m22}).storage(), m22.storage()) << "cat returns a new tensor";

  Tensor x = nc::arange(5);
  std::vector<Tensor> pieces = nc::split(x, 2);
  ASSERT_EQ(pieces.size(), 3u);
  expect_values(pieces[0], {0, 1});
  expect_values(pieces[1], {2, 3});
  expect_values(pieces[2], {4});
  EXPECT_EQ(pieces[2].storage(), x.storage()) << "split returns views";
  pieces[1].fill_(9);
  expect_values(x, {0, 1, 9, 9, 4});

  std::vector<Tensor> sized = nc::split(nc::arange(5), std::vector<int64_t>{1, 3, 0, 1});
  ASSERT_EQ(sized.size(), 4u);
  expect_values(sized[0], {0});
  expect_values(sized[1], {1, 2, 3});
  EXPECT_EQ(sized[2].shape(), (Shape{0}));
  expect_values(sized[3], {4});

  Tensor m = nc::arange(10).view({2, 5});
  std::vector<Tensor> columns = nc::split(m, 3, 1);
  ASSERT_EQ(columns.size(), 2u);
  EXPECT_EQ(columns[0].shape(), (Shape{2, 3}));
  expect_values(columns[1], {3, 4, 8, 9});
  std::vector<Tensor> by_sizes = nc::split(m, std::vector<int64_t>{4, 1}, -1);
  ASSERT_EQ(by_sizes.size(), 2u);
  expect_values(by_sizes[1], {4, 9});
  std::vector<Tensor> whole = nc::split(m, 7, 0);
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0].shape(), (Shape{2, 5}));
}

TEST(Indexing, Values) {
  struct Row {
    const char* name;
    std::function<Tensor()> fn;
    Shape shape;
    DType dtype;
    std::vector<double> expected;
  };
  const Tensor x32 = make({1, 2, 3, 4, 5, 6}, {3, 2});
  const Tensor g = make({1, 2, 3, 4}, {2, 2});
  const Tensor nine = nc::arange(9, DType::F32).view({3, 3});
  auto i64 = [](std::vector<double> v, Shape s) { return make(v, s, DType::I64); };
  auto i32 = [](std::vector<double> v, Shape s) { return make(v, s, DType::I32); };
  const Row rows[] = {
      {"index_select dim 0, i32",
       [&] {
         return nc::index_select(x32, 0, i32({2, 0, 2}, {3}));
       },
       {3, 2},
       DType::F32,
       {5, 6, 1, 2, 5, 6}},
      {"index_select dim 1 repeats",
       [&] {
         return nc::index_select(x32, 1, i64({1, 1, 0}, {3}));
       },
       {3, 3},
       DType::F32,
       {2, 2, 1, 4, 4, 3, 6, 6, 5}},
      {"index_select dim -1", [&] { return nc::index_select(x32, -1, i64({0}, {1})); }, {3, 1}, DType::F32, {1, 3, 5}},
      {"index_select 0-dim index",
       [&] { return nc::index_select(x32, 0, nc::full({}, 1)); },
       {1, 2},
       DType::F32,
       {3, 4}},
      {"index_select i64 data",
       [&] {
         return nc::index_select(nc::arange(5), 0, i64({4, 0}, {2}));
       },
       {2},
       DType::I64,
       {4, 0}},
      {"gather dim 1",
       [&] {
         return nc::gather(g, 1, i64({0, 0, 1, 0}, {2, 2}));
       },
       {2, 2},
       DType::F32,
       {1, 1, 4, 3}},
      {"gather dim 0",
       [&] {
         return nc::gather(g, 0, i64({0, 1, 1, 0}, {2, 2}));
       },
       {2, 2},
       DType::F32,
       {1, 4, 3, 2}},
      {"gather smaller index, i32",
       [&] {
         return nc::gather(nine, 1, i32({2, 0}, {2, 1}));
       },
       {2, 1},
       DType::F32,
       {2, 3}},
      {"gather negative dim",
       [&] {
         return nc::gather(nine, -1, i64({2, 0, 1}, {3, 1}));
       },
       {3, 1},
       DType::F32,
       {2, 3, 7}},
      {"gather dim 0 wider index",
       [&] {
         return nc::gather(nine, 0, i64({2, 1, 0, 0, 0, 0, 2, 2, 2}, {3, 3}));
       },
       {3, 3},
       DType::F32,
       {6, 4, 2, 0, 1, 2, 6, 7, 8}},
      {"scatter_add duplicates accumulate",
       [&] {
         return nc::scatter_add(nc::zeros({5}), 0, i64({0, 1, 0, 4, 0}, {5}), make({1, 2, 3, 4, 5}, {5}));
       },
       {5},
       DType::F32,
       {9, 2, 0, 0, 4}},
      {"scatter_add dim 1",
       [&] {
         return nc::scatter_add(nc::ones({2, 3}), 1, i64({0, 1, 0, 2, 2, 1}, {2, 3}), make({1, 2, 3, 4, 5, 6}, {2, 3}));
       },
       {2, 3},
       DType::F32,
       {5, 3, 1, 1, 7, 10}},
      {"scatter_add dim 0",
       [&] {
         return nc::scatter_add(nc::zeros({3, 2}), 0, i64({0, 1, 0, 0}, {2, 2}), make({1, 2, 3, 4}, {2, 2}));
       },
       {3, 2},
       DType::F32,
       {4, 4, 0, 2, 0, 0}},
      {"scatter_add src larger than index, i32",
       [&] {
         return nc::scatter_add(nc::zeros({2, 2}), 1, i32({1, 1, 0, 1}, {2, 2}), make(pattern(8, 4), {2, 4}));
       },
       {2, 2},
       DType::F32,
       {0, 3, -2, -1}},
      {"scatter_add i64",
       [&] {
         return nc::scatter_add(nc::arange(3), 0, i64({2, 2}, {2}), nc::arange(2));
       },
       {3},
       DType::I64,
       {0, 1, 3}},
      {"scatter_add f16",
       [&] {
         return nc::scatter_add(nc::zeros({2}, DType::F16), 0, i64({1, 1, 1}, {3}),
                                make({0.5, 0.25, 1}, {3}, DType::F16));
       },
       {2},
       DType::F16,
       {0, 1.75}},
      {"one_hot",
       [&] {
         return nc::one_hot(i64({0, 2, 1}, {3}));
       },
       {3, 3},
       DType::I64,
       {1, 0, 0, 0, 0, 1, 0, 1, 0}},
      {"one_hot num_classes",
       [&] {
         return nc::one_hot(i64({3, 0}, {2}), 4);
       },
       {2, 4},
       DType::I64,
       {0, 0, 0, 1, 1, 0, 0, 0}},
      {"one_hot i32 2-D",
       [&] {
         return nc::one_hot(i32({1, 0, 0, 1}, {2, 2}));
       },
       {2, 2, 2},
       DType::I64,
       {0, 1, 1, 0, 1, 0, 0, 1}},
      {"one_hot u8", [&] { return nc::one_hot(make({2}, {1}, DType::U8)); }, {1, 3}, DType::I64, {0, 0, 1}},
      {"one_hot 0-dim", [&] { return nc::one_hot(nc::full({}, 1), 2); }, {2}, DType::I64, {0, 1}},
      {"masked_fill broadcast mask",
       [&] {
         return nc::masked_fill(make({1, 2, 3, 4, 5, 6}, {2, 3}), make_bool({true, false, true}, {3}), -1);
       },
       {2, 3},
       DType::F32,
       {-1, 2, -1, -1, 5, -1}},
      {"masked_fill full mask, i64",
       [&] {
         return nc::masked_fill(nc::arange(4), make_bool({false, true, true, false}, {4}), 7);
       },
       {4},
       DType::I64,
       {0, 7, 7, 3}},
      {"masked_fill float value",
       [&] { return nc::masked_fill(g, nc::gt(g, 2), 0.5); },
       {2, 2},
       DType::F32,
       {1, 2, 0.5, 0.5}},
      {"masked_fill 0-dim mask",
       [&] { return nc::masked_fill(g, nc::full({}, true), kNaN); },
       {2, 2},
       DType::F32,
       {kNaN, kNaN, kNaN, kNaN}},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    Tensor out = r.fn();
    EXPECT_EQ(out.shape(), r.shape);
    EXPECT_EQ(out.dtype(), r.dtype);
    expect_values(out, r.expected, tol_for(r.dtype));
  }
}

TEST(Indexing, InputsAreNotModified) {
  Tensor x = nc::zeros({3});
  Tensor out = nc::scatter_add(x, 0, make({1}, {1}, DType::I64), make({5}, {1}));
  expect_values(out, {0, 5, 0});
  expect_values(x, {0, 0, 0});
  Tensor y = make({1, 2}, {2});
  Tensor filled = nc::masked_fill(y, make_bool({true, true}, {2}), 0);
  expect_values(filled, {0, 0});
  expect_values(y, {1, 2});
}
