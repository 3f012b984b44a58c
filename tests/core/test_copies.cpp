// Copies and element access on the CPU: contiguous copies and clones, conversions between
// every pair of dtypes and their rules, broadcasting copies, fills, and reading and writing
// single elements. Expected values are written out by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "normcore/normcore.h"
#include "tests/test_support.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;
using normcore_test::kAllDTypes;

namespace {

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

// [[0, 1, 2], [3, 4, 5]] as i64, a view of arange(6).
Tensor base23() { return nc::arange(6).view({2, 3}); }

}  // namespace

// ---------------------------------------------------------------- copies and conversions
TEST(Copies, ContiguousAndCloneAreIndependent) {
  Tensor x = base23();
  EXPECT_TRUE(x.contiguous().is_same(x));
  Tensor c = x.t().contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.strides(), (nc::Shape{2, 1}));
  EXPECT_NE(c.storage(), x.storage());
  EXPECT_EQ(values(c), (std::vector<double>{0, 3, 1, 4, 2, 5}));

  Tensor k = x.clone();
  EXPECT_NE(k.storage(), x.storage());
  k.fill_(1);
  EXPECT_EQ(values(x), (std::vector<double>{0, 1, 2, 3, 4, 5}));
  Tensor kt = x.t().clone();
  EXPECT_TRUE(kt.is_contiguous());
  EXPECT_EQ(values(kt), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  x.fill_(8);
  EXPECT_EQ(values(c), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(values(kt), (std::vector<double>{0, 3, 1, 4, 2, 5}));
}

TEST(Copies, ToEveryDTypePair) {
  // Values every dtype holds exactly; bool keeps only "non-zero".
  const std::vector<double> input = {0, 1, 2, 100};
  const std::vector<double> as_bool = {0, 1, 1, 1};
  for (DType from : kAllDTypes)
    for (DType to : kAllDTypes) {
      SCOPED_TRACE(std::string(nc::dtype_name(from)) + " -> " + nc::dtype_name(to));
      Tensor src = nc::from_vector<double>(input, {2, 2}).to(from);
      ASSERT_EQ(src.dtype(), from);
      Tensor dst = src.to(to);
      EXPECT_EQ(dst.dtype(), to);
      EXPECT_EQ(dst.shape(), (nc::Shape{2, 2}));
      bool through_bool = from == DType::Bool || to == DType::Bool;
      EXPECT_EQ(values(dst), through_bool ? as_bool : input);
      if (from == to) {
        EXPECT_TRUE(dst.is_same(src));
      }
    }
}

TEST(Copies, ConversionRules) {
  struct Row {
    const char* what;
    Tensor src;
    DType to;
    std::vector<double> expected;
  };
  const Row rows[] = {
      {"f32 -> i32 truncates toward zero",
       nc::from_vector<float>({2.7f, -2.7f, 0.5f, -0.5f}, {4}),
       DType::I32,
       {2, -2, 0, 0}},
      {"f64 -> i64 truncates toward zero", nc::from_vector<double>({1e10 + 0.9, -3.99}, {2}), DType::I64, {1e10, -3}},
      {"f32 -> u8 truncates", nc::from_vector<float>({0.9f, 254.6f}, {2}), DType::U8, {0, 254}},
      {"f32 -> bool", nc::from_vector<float>({0.0f, -0.0f, 0.25f, NAN, -3.0f}, {5}), DType::Bool, {0, 0, 1, 1, 1}},
      {"i64 -> bool", nc::from_vector<int64_t>({0, -1, 7}, {3}), DType::Bool, {0, 1, 1}},
      {"i64 -> u8 wraps", nc::from_vector<int64_t>({300, -1}, {2}), DType::U8, {44, 255}},
      {"i64 -> i32 wraps", nc::from_vector<int64_t>({(int64_t{1} << 32) + 5}, {1}), DType::I32, {5}},
      {"i64 -> f32 rounds", nc::from_vector<int64_t>({16777217}, {1}), DType::F32, {16777216}},
      {"f32 -> f16 rounds to nearest even",
       nc::from_vector<float>({1.00048828125f, 0.1f, 70000.0f}, {3}),
       DType::F16,
       {1.0, 0.0999755859375, INFINITY}},
      {"f32 -> bf16 rounds", nc::from_vector<float>({1.00390625f, 0.1f}, {2}), DType::BF16, {1.0, 0.10009765625}},
      {"f16 -> bf16", nc::from_vector<float>({0.333251953125f}, {1}).to(DType::F16), DType::BF16, {0.333984375}},
      {"bool -> f32", nc::from_vector<bool>({true, false}, {2}), DType::F32, {1, 0}},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.what);
    Tensor out = r.src.to(r.to);
    EXPECT_EQ(out.dtype(), r.to);
    EXPECT_EQ(values(out), r.expected);
  }
  EXPECT_EQ(nc::ones({2}).to(nc::Device::cpu()).dtype(), DType::F32);
  Tensor x = nc::ones({2});
  EXPECT_TRUE(x.to(nc::Device::cpu()).is_same(x));
  EXPECT_EQ(x.to(nc::Device::cpu(), DType::I32).dtype(), DType::I32);
}

TEST(Copies, CopyBroadcastsAndConverts) {
  Tensor dst = nc::zeros({2, 3});
  dst.copy_(nc::from_vector<int32_t>({1, 2, 3}, {3}));
  EXPECT_EQ(values(dst), (std::vector<double>{1, 2, 3, 1, 2, 3}));
  dst.copy_(nc::from_vector<double>({-1.5, 2.5}, {2, 1}));
  EXPECT_EQ(values(dst), (std::vector<double>{-1.5, -1.5, -1.5, 2.5, 2.5, 2.5}));
  dst.copy_(nc::full({}, true));
  EXPECT_EQ(values(dst), (std::vector<double>(6, 1.0)));

  // Into a transposed (non-contiguous) destination, from a transposed source.
  Tensor d2 = nc::zeros({3, 2}, DType::I32);
  d2.t().copy_(base23());
  EXPECT_EQ(values(d2), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  Tensor d3 = nc::zeros({3, 2}, DType::F16);
  d3.copy_(base23().t());
  EXPECT_EQ(values(d3), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  EXPECT_THROW(dst.copy_(nc::zeros({4})), nc::ShapeError);
}

TEST(Copies, Fill) {
  struct Row {
    DType dtype;
    nc::Scalar value;
    double expected;
  };
  const Row rows[] = {
      {DType::F32, 2.5, 2.5}, {DType::F64, -1, -1}, {DType::F16, 0.1, 0.0999755859375},
      {DType::BF16, 3, 3},    {DType::I32, 2.7, 2}, {DType::I64, -9, -9},
      {DType::U8, 255, 255},  {DType::Bool, 2, 1},  {DType::F32, true, 1},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(nc::dtype_name(r.dtype));
    Tensor t = nc::empty({2, 2}, r.dtype);
    t.fill_(r.value);
    EXPECT_EQ(values(t), (std::vector<double>(4, r.expected)));
    t.zero_();
    EXPECT_EQ(values(t), (std::vector<double>(4, 0.0)));
  }
  Tensor e = nc::empty({0});
  e.fill_(1);
  EXPECT_EQ(e.numel(), 0);
}

// ---------------------------------------------------------------- element access
TEST(ElementAccess, ItemAndToVector) {
  EXPECT_EQ(nc::full({}, 2.5).item<float>(), 2.5f);
  EXPECT_EQ(nc::full({1, 1}, 7).item<int64_t>(), 7);
  EXPECT_EQ(nc::full({1}, 7).item<double>(), 7.0);
  EXPECT_EQ(nc::full({}, -2.5, DType::F64).item<int32_t>(), -2);
  EXPECT_EQ(nc::full({}, 0.5, DType::F16).item<nc::Half>().bits, 0x3800);
  EXPECT_EQ(nc::full({}, 0.5, DType::BF16).item<nc::BFloat16>().bits, 0x3f00);
  EXPECT_EQ(nc::full({}, 3, DType::U8).item<uint8_t>(), 3);
  EXPECT_TRUE(nc::full({}, true).item<bool>());
  EXPECT_FALSE(nc::full({}, 0.0).item<bool>());

  nc::Scalar i = nc::full({}, 5).item();
  EXPECT_TRUE(i.is_integral());
  EXPECT_FALSE(i.is_bool());
  EXPECT_EQ(i.to_int(), 5);
  nc::Scalar f = nc::full({}, 0.25, DType::F16).item();
  EXPECT_FALSE(f.is_integral());
  EXPECT_EQ(f.to_double(), 0.25);
  nc::Scalar b = nc::full({}, true).item();
  EXPECT_TRUE(b.is_bool());
  EXPECT_EQ(b.to_int(), 1);
  EXPECT_THROW(nc::zeros({2}).item(), nc::ShapeError);
  EXPECT_THROW(nc::zeros({0}).item<float>(), nc::ShapeError);

  Tensor x = nc::from_vector<int32_t>({1, -2, 3, 40}, {2, 2});
  EXPECT_EQ(x.to_vector<int32_t>(), (std::vector<int32_t>{1, -2, 3, 40}));
  EXPECT_EQ(x.t().to_vector<int64_t>(), (std::vector<int64_t>{1, 3, -2, 40}));
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{1, -2, 3, 40}));
  EXPECT_EQ(x.to_vector<bool>(), (std::vector<bool>{true, true, true, true}));
  EXPECT_EQ(x.to_vector<uint8_t>()[3], 40);
  std::vector<nc::Half> h = x.to_vector<nc::Half>();
  EXPECT_EQ(h[1].bits, 0xc000);
  std::vector<nc::BFloat16> bf = x.to_vector<nc::BFloat16>();
  EXPECT_EQ(bf[0].bits, 0x3f80);
  EXPECT_TRUE(nc::zeros({0, 2}).to_vector<float>().empty());
}

TEST(ElementAccess, FromVectorForEveryHostType) {
  EXPECT_EQ(nc::from_vector<double>({1.5}, {}).dtype(), DType::F64);
  EXPECT_EQ(nc::from_vector<nc::Half>({nc::Half(1.5f)}, {1}).item<float>(), 1.5f);
  EXPECT_EQ(nc::from_vector<nc::BFloat16>({nc::BFloat16(-2.0f)}, {1}).item<float>(), -2.0f);
  EXPECT_EQ(nc::from_vector<uint8_t>({200, 1}, {2}).dtype(), DType::U8);
  EXPECT_EQ(nc::from_vector<bool>({true}, {1, 1}).shape(), (nc::Shape{1, 1}));
  EXPECT_EQ(nc::from_vector<float>({}, {0, 4}).shape(), (nc::Shape{0, 4}));
}

TEST(ElementAccess, ScalarKeepsIntegersExact) {
  nc::Scalar big = int64_t{9007199254740993};  // 2^53 + 1: not a double
  EXPECT_TRUE(big.is_integral());
  EXPECT_EQ(big.to_int(), 9007199254740993);
  EXPECT_EQ(nc::full({}, big).item<int64_t>(), 9007199254740993);
  nc::Scalar d = -2.75;
  EXPECT_FALSE(d.is_integral());
  EXPECT_EQ(d.to_int(), -2);
  EXPECT_EQ(nc::Scalar().to_int(), 0);
  std::ostringstream s;
  s << nc::Scalar(3) << " " << nc::Scalar(0.5) << " " << nc::Scalar(true);
  EXPECT_EQ(s.str(), "3 0.5 1");
}
