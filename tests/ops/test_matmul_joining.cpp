// ops.h on the CPU against hand-computed values: matmul (shapes, batches, transposed
// operands, against an f64 reference for f16/bf16) and the joining and indexing ops.
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
