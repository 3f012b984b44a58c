// The CUDA kernels of the generic families (kernels/elementwise.h, generate.h, reduce.h,
// matmul.h) against the CPU reference on the same data: copy and fill, element-wise ops,
// reductions and matmul, at sizes and layouts that reach each code path (empty, one element,
// odd sizes, vector tails, misaligned, strided, transposed, broadcast, short and long rows),
// for every dtype, with dtype-scaled tolerances. test_cuda_indexing_runtime.cpp holds the
// rest. Without a GPU every test skips.
#include <gtest/gtest.h>

#ifdef NORMCORE_HAS_CUDA

#include "tests/kernels/cuda_backend_support.h"

using namespace cuda_backend_test;  // nc, Device, DType, Shape, Tensor and the helpers

namespace {

// ---------------------------------------------------------------- copy and fill
const std::vector<Shape> kElementwiseShapes = {
    {},         {0},         {1},
    {7},        {4, 33},     {3, 5, 17},
    {67, 1031}, {65536 + 3}, {2, 3, 2, 2, 2, 2, 2, 2, 2, 3},  // more than 8 dims that do not merge when transposed
};

TEST(CudaBackend, CopyConvertsEveryDTypePairAtEveryLayout) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Layout src_layouts[] = {Layout::Contiguous, Layout::Misaligned, Layout::Transposed, Layout::Strided,
                                Layout::Broadcast};
  const Layout dst_layouts[] = {Layout::Contiguous, Layout::Transposed, Layout::Strided};
  uint32_t seed = 1;
  for (DType dst_dtype : kAllDTypes) {
    for (DType src_dtype : kAllDTypes) {
      // Non-negative values: converting a negative float to u8 is undefined in C++.
      const Range range = src_dtype == DType::Bool ? Range{0, 2} : Range{0, 100};
      for (const Shape& shape : kElementwiseShapes) {
        for (Layout src_layout : src_layouts) {
          for (Layout dst_layout : dst_layouts) {
            Pair src = make_input(shape, src_dtype, src_layout, ++seed, range);
            Pair dst = make_input(shape, dst_dtype, dst_layout, ++seed, Range{0, 2});
            nc::cpu::elementwise_kernels().copy(dst.cpu, src.cpu);
            nc::cuda::elementwise_kernels().copy(dst.cuda, src.cuda);
            expect_equal(dst.cuda, dst.cpu,
                         describe_case(std::string("copy from ") + nc::dtype_name(src_dtype) + " " +
                                           layout_name(src_layout) + " to " + layout_name(dst_layout),
                                       dst_dtype, shape));
          }
        }
      }
    }
  }
}

TEST(CudaBackend, FillWritesEveryElementOfAnyLayout) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<nc::Scalar> values = {0, 1, -2, 2.5, -0.0, true, int64_t{1} << 40 | 1};
  const Layout layouts[] = {Layout::Contiguous, Layout::Misaligned, Layout::Transposed, Layout::Strided};
  uint32_t seed = 100;
  for (DType dtype : kAllDTypes) {
    for (const nc::Scalar& value : values) {
      for (const Shape& shape : kElementwiseShapes) {
        for (Layout layout : layouts) {
          Pair dst = make_input(shape, dtype, layout, ++seed);
          nc::cpu::elementwise_kernels().fill(dst.cpu, value);
          nc::cuda::elementwise_kernels().fill(dst.cuda, value);
          std::ostringstream what;
          what << "fill " << value << " " << layout_name(layout);
          expect_equal(dst.cuda, dst.cpu, describe_case(what.str(), dtype, shape));
        }
      }
    }
  }
}

// ---------------------------------------------------------------- element-wise
struct UnaryCase {
  nc::UnaryOp op;
  const char* name;
  double a, b;
  Range range;  // for floating inputs
  bool float_only;
};

const std::vector<UnaryCase> kUnaryCases = {
    {nc::UnaryOp::Neg, "neg", 0, 0, {-3, 3}, false},
    {nc::UnaryOp::Abs, "abs", 0, 0, {-3, 3}, false},
    {nc::UnaryOp::Sign, "sign", 0, 0, {-3, 3}, false},
    {nc::UnaryOp::Relu, "relu", 0, 0, {-3, 3}, false},
    {nc::UnaryOp::Exp, "exp", 0, 0, {-5, 5}, true},
    {nc::UnaryOp::Log, "log", 0, 0, {0.01, 10}, true},
    {nc::UnaryOp::Sqrt, "sqrt", 0, 0, {0, 10}, true},
    {nc::UnaryOp::Rsqrt, "rsqrt", 0, 0, {0.01, 10}, true},
    {nc::UnaryOp::Sin, "sin", 0, 0, {-6, 6}, true},
    {nc::UnaryOp::Cos, "cos", 0, 0, {-6, 6}, true},
    {nc::UnaryOp::Tanh, "tanh", 0, 0, {-5, 5}, true},
    {nc::UnaryOp::Sigmoid, "sigmoid", 0, 0, {-20, 20}, true},
    {nc::UnaryOp::Gelu, "gelu", 0, 0, {-5, 5}, true},
    {nc::UnaryOp::GeluTanh, "gelu_tanh", 0, 0, {-5, 5}, true},
    {nc::UnaryOp::Clamp, "clamp", -0.5, 0.75, {-2, 2}, true},
    {nc::UnaryOp::Clamp, "clamp_min_only", -0.5, kInf, {-2, 2}, true},
    {nc::UnaryOp::PowScalar, "pow 2", 2.0, 0, {-3, 3}, true},
    {nc::UnaryOp::PowScalar, "pow 0.5", 0.5, 0, {0, 9}, true},
    {nc::UnaryOp::PowScalar, "pow -1.5", -1.5, 0, {0.1, 4}, true},
};

const Layout kInputLayouts[] = {Layout::Contiguous, Layout::Misaligned, Layout::Transposed, Layout::Strided,
                                Layout::Broadcast};

TEST(CudaBackend, UnaryMatchesCpuForEveryOpDTypeAndLayout) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 1000;
  for (const UnaryCase& c : kUnaryCases) {
    for (DType dtype : kAllDTypes) {
      if (dtype == DType::Bool || (c.float_only && !nc::is_floating(dtype))) continue;
      const Range range = nc::is_floating(dtype) ? c.range : default_range(dtype);
      const double tol = dtype_tolerance(dtype);
      for (const Shape& shape : kElementwiseShapes) {
        for (Layout layout : kInputLayouts) {
          Pair x = make_input(shape, dtype, layout, ++seed, range);
          Pair out = empty_pair(shape, dtype);
          nc::cpu::elementwise_kernels().unary(c.op, out.cpu, x.cpu, c.a, c.b);
          nc::cuda::elementwise_kernels().unary(c.op, out.cuda, x.cuda, c.a, c.b);
          expect_close(out.cuda, out.cpu, tol, tol,
                       describe_case(std::string(c.name) + " " + layout_name(layout), dtype, shape));
        }
      }
    }
  }
}

TEST(CudaBackend, UnaryHandlesNanInfinityAndSignedZero) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<double> specials = {kNaN, kInf, -kInf, 0.0, -0.0, 1.0, -1.0, 1e-30, -40.0, 40.0};
  const Shape shape = {static_cast<int64_t>(specials.size())};
  for (const UnaryCase& c : kUnaryCases) {
    for (DType dtype : kFloatDTypes) {
      Pair x = from_values(specials, shape, dtype);
      Pair out = empty_pair(shape, dtype);
      nc::cpu::elementwise_kernels().unary(c.op, out.cpu, x.cpu, c.a, c.b);
      nc::cuda::elementwise_kernels().unary(c.op, out.cuda, x.cuda, c.a, c.b);
      const double tol = dtype_tolerance(dtype);
      expect_close(out.cuda, out.cpu, tol, tol, describe_case(std::string(c.name) + " specials", dtype, shape));
    }
  }
}

struct BinaryCase {
  nc::BinaryOp op;
  const char* name;
  Range range_a, range_b;
  bool whole;  // whole-number floats, so that comparisons see ties
  bool float_only;
};

const std::vector<BinaryCase> kBinaryCases = {
    {nc::BinaryOp::Add, "add", {-3, 3}, {-3, 3}, false, false},
    {nc::BinaryOp::Sub, "sub", {-3, 3}, {-3, 3}, false, false},
    {nc::BinaryOp::Mul, "mul", {-3, 3}, {-3, 3}, false, false},
    {nc::BinaryOp::Div, "div", {-3, 3}, {-3, 3}, false, true},
    {nc::BinaryOp::Div, "div by whole numbers and zero", {-3, 3}, {-2, 2}, true, true},
    {nc::BinaryOp::Maximum, "maximum", {-4, 4}, {-4, 4}, true, false},
    {nc::BinaryOp::Minimum, "minimum", {-4, 4}, {-4, 4}, true, false},
    {nc::BinaryOp::Pow, "pow", {0.1, 3}, {-2, 2}, false, true},
    {nc::BinaryOp::GeluGrad, "gelu_grad", {-3, 3}, {-5, 5}, false, true},
    {nc::BinaryOp::GeluTanhGrad, "gelu_tanh_grad", {-3, 3}, {-5, 5}, false, true},
    {nc::BinaryOp::Eq, "eq", {-4, 4}, {-4, 4}, true, false},
    {nc::BinaryOp::Ne, "ne", {-4, 4}, {-4, 4}, true, false},
    {nc::BinaryOp::Lt, "lt", {-4, 4}, {-4, 4}, true, false},
    {nc::BinaryOp::Le, "le", {-4, 4}, {-4, 4}, true, false},
    {nc::BinaryOp::Gt, "gt", {-4, 4}, {-4, 4}, true, false},
    {nc::BinaryOp::Ge, "ge", {-4, 4}, {-4, 4}, true, false},
};

bool is_comparison(nc::BinaryOp op) { return op >= nc::BinaryOp::Eq; }

const std::pair<Layout, Layout> kBinaryLayouts[] = {
    {Layout::Contiguous, Layout::Contiguous}, {Layout::Misaligned, Layout::Contiguous},
    {Layout::Broadcast, Layout::Contiguous},  {Layout::Contiguous, Layout::Broadcast},
    {Layout::Transposed, Layout::Strided},
};

TEST(CudaBackend, BinaryMatchesCpuForEveryOpDTypeAndLayout) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 5000;
  for (const BinaryCase& c : kBinaryCases) {
    for (DType dtype : kAllDTypes) {
      if (c.float_only && !nc::is_floating(dtype)) continue;
      const bool floating = nc::is_floating(dtype);
      const DType out_dtype = is_comparison(c.op) ? DType::Bool : dtype;
      const double tol = dtype_tolerance(out_dtype);
      for (const Shape& shape : kElementwiseShapes) {
        for (const auto& [layout_a, layout_b] : kBinaryLayouts) {
          Pair a = make_input(shape, dtype, layout_a, ++seed, floating ? c.range_a : default_range(dtype), c.whole);
          Pair b = make_input(shape, dtype, layout_b, ++seed, floating ? c.range_b : default_range(dtype), c.whole);
          Pair out = empty_pair(shape, out_dtype);
          nc::cpu::elementwise_kernels().binary(c.op, out.cpu, a.cpu, b.cpu);
          nc::cuda::elementwise_kernels().binary(c.op, out.cuda, a.cuda, b.cuda);
          expect_close(out.cuda, out.cpu, tol, tol,
                       describe_case(std::string(c.name) + " " + layout_name(layout_a) + "/" + layout_name(layout_b),
                                     dtype, shape));
        }
      }
    }
  }
}

TEST(CudaBackend, BinaryPropagatesNanThroughMaximumAndMinimum) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<double> a = {kNaN, 1.0, kNaN, -kInf, 0.0, 2.0};
  const std::vector<double> b = {1.0, kNaN, kNaN, kInf, -0.0, 2.0};
  const Shape shape = {static_cast<int64_t>(a.size())};
  for (const BinaryCase& c : kBinaryCases) {
    for (DType dtype : kFloatDTypes) {
      Pair pa = from_values(a, shape, dtype), pb = from_values(b, shape, dtype);
      Pair out = empty_pair(shape, is_comparison(c.op) ? DType::Bool : dtype);
      nc::cpu::elementwise_kernels().binary(c.op, out.cpu, pa.cpu, pb.cpu);
      nc::cuda::elementwise_kernels().binary(c.op, out.cuda, pa.cuda, pb.cuda);
      expect_equal(out.cuda, out.cpu, describe_case(std::string(c.name) + " specials", dtype, shape));
    }
  }
  // Spelled out once, beyond agreeing with the CPU: NaN wins in either position.
  Pair pa = from_values(a, shape, DType::F32), pb = from_values(b, shape, DType::F32);
  Pair out = empty_pair(shape, DType::F32);
  nc::cuda::elementwise_kernels().binary(nc::BinaryOp::Maximum, out.cuda, pa.cuda, pb.cuda);
  const std::vector<double> got = values_of(out.cuda);
  EXPECT_TRUE(std::isnan(got[0]) && std::isnan(got[1]) && std::isnan(got[2]));
  EXPECT_EQ(got[3], kInf);
  EXPECT_EQ(got[5], 2.0);
}

TEST(CudaBackend, IntegerPowIsExactLikeTheCpu) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<double> base = {2, 3, -2, 5, 1, -1, 0, 7, -1};
  const std::vector<double> exponent = {3, 0, 3, -1, -5, -3, 0, 2, 4};
  const std::vector<double> expected = {8, 1, -8, 0, 1, -1, 1, 49, 1};
  const Shape shape = {static_cast<int64_t>(base.size())};
  for (DType dtype : {DType::I32, DType::I64}) {
    Pair a = from_values(base, shape, dtype), b = from_values(exponent, shape, dtype);
    Pair out = empty_pair(shape, dtype);
    nc::cpu::elementwise_kernels().binary(nc::BinaryOp::Pow, out.cpu, a.cpu, b.cpu);
    nc::cuda::elementwise_kernels().binary(nc::BinaryOp::Pow, out.cuda, a.cuda, b.cuda);
    expect_equal(out.cuda, out.cpu, describe_case("integer pow", dtype, shape));
    EXPECT_EQ(values_of(out.cuda), expected);
  }
}

TEST(CudaBackend, WhereSelectsWithBroadcastCondition) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 9000;
  for (DType dtype : kAllDTypes) {
    for (const Shape& shape : kElementwiseShapes) {
      for (Layout cond_layout : {Layout::Contiguous, Layout::Broadcast, Layout::Transposed}) {
        Pair cond = make_input(shape, DType::Bool, cond_layout, ++seed);
        Pair a = make_input(shape, dtype, Layout::Misaligned, ++seed);
        Pair b = make_input(shape, dtype, Layout::Broadcast, ++seed);
        Pair out = empty_pair(shape, dtype);
        nc::cpu::elementwise_kernels().where(out.cpu, cond.cpu, a.cpu, b.cpu);
        nc::cuda::elementwise_kernels().where(out.cuda, cond.cuda, a.cuda, b.cuda);
        expect_equal(out.cuda, out.cpu,
                     describe_case(std::string("where cond ") + layout_name(cond_layout), dtype, shape));
      }
    }
  }
}

// ---------------------------------------------------------------- reductions
struct ReduceShape {
  int64_t rows, row_len;
};

// One thread per row, 8 lanes, a warp, a block per row, two-stage; empty rows and none.
const std::vector<ReduceShape> kReduceShapes = {
    {1, 1},   {2, 1},     {0, 5},    {3, 0},      {7, 5},      {100000, 3},  {1000, 7},
    {13, 63}, {100, 300}, {5, 2049}, {300, 5000}, {3, 100003}, {1, 1 << 21},
};

struct ReduceCase {
  nc::ReduceOp op;
  const char* name;
  double arg;
  bool float_only;
  Range range;          // floating inputs
  int64_t max_row_len;  // longer rows are skipped (products over- or underflow)
};

const std::vector<ReduceCase> kReduceCases = {
    {nc::ReduceOp::Sum, "sum", 0, false, {-3, 3}, 1 << 30},
    {nc::ReduceOp::Prod, "prod", 0, false, {0.9, 1.1}, 5000},
    {nc::ReduceOp::Mean, "mean", 0, true, {-3, 3}, 1 << 30},
    {nc::ReduceOp::Var, "var unbiased, |mean| >> std", 1, true, {995, 1005}, 1 << 30},
    {nc::ReduceOp::Var, "var biased", 0, true, {-3, 3}, 1 << 30},
    {nc::ReduceOp::Norm, "norm 1", 1, true, {-3, 3}, 1 << 30},
    {nc::ReduceOp::Norm, "norm 2", 2, true, {-3, 3}, 1 << 30},
    {nc::ReduceOp::Norm, "norm inf", kInf, true, {-3, 3}, 1 << 30},
    {nc::ReduceOp::Norm, "norm 3", 3, true, {-3, 3}, 1 << 30},
    {nc::ReduceOp::Norm, "norm 0.5", 0.5, true, {-3, 3}, 1 << 30},
    {nc::ReduceOp::Max, "max", 0, false, {-3, 3}, 1 << 30},
    {nc::ReduceOp::Min, "min", 0, false, {-3, 3}, 1 << 30},
    // Floored, so that about one element in 10^4 is zero (all) or non-zero (any): short
    // rows and long rows give both answers.
    {nc::ReduceOp::All, "all", 0, false, {0.99, 100}, 1 << 30},
    {nc::ReduceOp::Any, "any", 0, false, {0, 1.0001}, 1 << 30},
};

DType reduce_out_dtype(nc::ReduceOp op, DType x) {
  if (op == nc::ReduceOp::All || op == nc::ReduceOp::Any) return DType::Bool;
  if ((op == nc::ReduceOp::Sum || op == nc::ReduceOp::Prod) && !nc::is_floating(x)) return DType::I64;
  return x;
}

TEST(CudaBackend, ReduceMatchesCpuForShortAndLongRows) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 20000;
  for (const ReduceCase& c : kReduceCases) {
    for (DType dtype : kAllDTypes) {
      if (c.float_only && !nc::is_floating(dtype)) continue;
      const bool floating = nc::is_floating(dtype);
      // All/Any floor their inputs (mostly ones, mostly zeros) in every dtype.
      const bool logical = c.op == nc::ReduceOp::All || c.op == nc::ReduceOp::Any;
      const Range range = floating || logical ? c.range : default_range(dtype);
      const DType out_dtype = reduce_out_dtype(c.op, dtype);
      for (const ReduceShape& s : kReduceShapes) {
        if (s.row_len > c.max_row_len) continue;
        if ((c.op == nc::ReduceOp::Max || c.op == nc::ReduceOp::Min) && s.row_len == 0) continue;
        for (Layout layout : {Layout::Contiguous, Layout::Misaligned}) {
          const Shape shape = {s.rows, s.row_len};
          Pair x = make_input(shape, dtype, layout, ++seed, range, logical);
          Pair out = empty_pair({s.rows}, out_dtype);
          nc::cpu::reduce_kernels().reduce(c.op, out.cpu, x.cpu, c.arg);
          nc::cuda::reduce_kernels().reduce(c.op, out.cuda, x.cuda, c.arg);
          // Sums may differ by the float accumulation error, bounded by sum |x| per row.
          std::vector<double> row_atol;
          double rtol = dtype_tolerance(out_dtype);
          if (floating && (c.op == nc::ReduceOp::Sum || c.op == nc::ReduceOp::Mean)) {
            Tensor x64 = x.cpu.to(DType::F64), l1 = nc::empty({s.rows}, nc::TensorOptions(DType::F64));
            nc::cpu::reduce_kernels().reduce(nc::ReduceOp::Norm, l1, x64, 1.0);
            row_atol = l1.to_vector<double>();
            for (double& a : row_atol) {
              a *= accumulation_tolerance(dtype) / (c.op == nc::ReduceOp::Mean ? std::max<int64_t>(s.row_len, 1) : 1);
            }
          } else if (floating && c.op != nc::ReduceOp::Max && c.op != nc::ReduceOp::Min) {
            rtol +=
                accumulation_tolerance(dtype) * (c.op == nc::ReduceOp::Prod ? static_cast<double>(s.row_len) : 10.0);
          }
          expect_close(out.cuda, out.cpu, rtol, 0.0,
                       describe_case(std::string(c.name) + " " + layout_name(layout), dtype, shape), row_atol);
        }
      }
    }
  }
}

// Rows with NaN at a random place (or none): max/min and argmax/argmin take the NaN, and
// its first index.
TEST(CudaBackend, ReductionsPropagateNan) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 gen(7);
  for (DType dtype : kFloatDTypes) {
    for (const ReduceShape& s : kReduceShapes) {
      if (s.row_len == 0 || s.rows == 0 || s.rows * s.row_len > (1 << 22)) continue;
      const Shape shape = {s.rows, s.row_len};
      std::vector<double> values = random_cpu(shape, DType::F64, -3, 3, 11).to_vector<double>();
      for (int64_t r = 0; r < s.rows; r += 2) {
        const int64_t col = std::uniform_int_distribution<int64_t>(0, s.row_len - 1)(gen);
        values[r * s.row_len + col] = kNaN;
        values[r * s.row_len + (col + s.row_len / 2) % s.row_len] = kNaN;  // a second one
      }
      Pair x = from_values(values, shape, dtype);
      for (nc::ReduceOp op : {nc::ReduceOp::Max, nc::ReduceOp::Min, nc::ReduceOp::Sum, nc::ReduceOp::Norm}) {
        Pair out = empty_pair({s.rows}, dtype);
        nc::cpu::reduce_kernels().reduce(op, out.cpu, x.cpu, kInf);
        nc::cuda::reduce_kernels().reduce(op, out.cuda, x.cuda, kInf);
        const std::vector<double> got = values_of(out.cuda);
        for (int64_t r = 0; r < s.rows; r += 2)
          ASSERT_TRUE(std::isnan(got[r])) << describe_case("nan row", dtype, shape);
        expect_close(out.cuda, out.cpu, 1e-2, 1e-2, describe_case("reduce with nan", dtype, shape));
      }
      for (bool is_max : {true, false}) {
        Pair values_out = empty_pair({s.rows}, dtype), indices = empty_pair({s.rows}, DType::I64);
        nc::cpu::reduce_kernels().arg_reduce(is_max, values_out.cpu, indices.cpu, x.cpu);
        nc::cuda::reduce_kernels().arg_reduce(is_max, values_out.cuda, indices.cuda, x.cuda);
        expect_equal(indices.cuda, indices.cpu, describe_case(is_max ? "argmax nan" : "argmin nan", dtype, shape));
        expect_equal(values_out.cuda, values_out.cpu, describe_case("arg values nan", dtype, shape));
      }
    }
  }
}

TEST(CudaBackend, ArgReduceTakesFirstIndexOfTies) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 40000;
  for (DType dtype : kAllDTypes) {
    for (const ReduceShape& s : kReduceShapes) {
      if (s.row_len == 0) continue;
      for (Layout layout : {Layout::Contiguous, Layout::Misaligned}) {
        const Shape shape = {s.rows, s.row_len};
        // Few distinct values, so that every row has ties for its max and min.
        Pair x = make_input(shape, dtype, layout, ++seed, Range{0, 5}, true);
        for (bool is_max : {true, false}) {
          Pair values = empty_pair({s.rows}, dtype), indices = empty_pair({s.rows}, DType::I64);
          nc::cpu::reduce_kernels().arg_reduce(is_max, values.cpu, indices.cpu, x.cpu);
          nc::cuda::reduce_kernels().arg_reduce(is_max, values.cuda, indices.cuda, x.cuda);
          const std::string what =
              describe_case(std::string(is_max ? "argmax " : "argmin ") + layout_name(layout), dtype, shape);
          expect_equal(indices.cuda, indices.cpu, what);
          expect_equal(values.cuda, values.cpu, what);
        }
      }
    }
  }
}

// ---------------------------------------------------------------- matmul
enum class Operand { RowMajor, ColumnMajor, BatchBroadcast, RowBroadcast };

struct MatmulCase {
  int64_t batch, m, k, n;
  Operand a, b;
};

const std::vector<MatmulCase> kMatmulCases = {
    {1, 1, 1, 1, Operand::RowMajor, Operand::RowMajor},
    {2, 3, 0, 4, Operand::RowMajor, Operand::RowMajor},  // K == 0: zeros
    {1, 17, 33, 9, Operand::RowMajor, Operand::RowMajor},
    {3, 64, 128, 32, Operand::RowMajor, Operand::RowMajor},
    {2, 5, 7, 3, Operand::ColumnMajor, Operand::RowMajor},
    {2, 5, 7, 3, Operand::RowMajor, Operand::ColumnMajor},
    {4, 31, 65, 17, Operand::ColumnMajor, Operand::ColumnMajor},
    {3, 8, 16, 4, Operand::BatchBroadcast, Operand::RowMajor},
    {3, 8, 16, 4, Operand::RowMajor, Operand::BatchBroadcast},
    {2, 6, 5, 4, Operand::RowBroadcast, Operand::RowMajor},    // overlapping rows: packed first
    {2, 1, 9, 1, Operand::ColumnMajor, Operand::ColumnMajor},  // size-1 dims
    {1, 1, 300, 257, Operand::RowMajor, Operand::ColumnMajor},
    {1, 129, 1, 130, Operand::RowMajor, Operand::RowMajor},
};

// A [batch, rows, cols] operand of the given layout on both devices.
Pair make_operand(int64_t batch, int64_t rows, int64_t cols, DType dtype, Operand layout, uint32_t seed) {
  const Range range{-1, 1};
  switch (layout) {
    case Operand::RowMajor: return make_input({batch, rows, cols}, dtype, Layout::Contiguous, seed, range);
    case Operand::ColumnMajor: {
      Pair p = make_input({batch, cols, rows}, dtype, Layout::Contiguous, seed, range);
      return {p.cpu.transpose(1, 2), p.cuda.transpose(1, 2)};
    }
    case Operand::BatchBroadcast: {
      Pair p = make_input({1, rows, cols}, dtype, Layout::Contiguous, seed, range);
      return {p.cpu.expand({batch, rows, cols}), p.cuda.expand({batch, rows, cols})};
    }
    case Operand::RowBroadcast: {
      Pair p = make_input({batch, 1, cols}, dtype, Layout::Contiguous, seed, range);
      return {p.cpu.expand({batch, rows, cols}), p.cuda.expand({batch, rows, cols})};
    }
  }
  return {};
}

TEST(CudaBackend, MatmulMatchesCpuForEveryOperandLayout) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 60000;
  for (const MatmulCase& c : kMatmulCases) {
    for (DType dtype : kFloatDTypes) {
      Pair a = make_operand(c.batch, c.m, c.k, dtype, c.a, ++seed);
      Pair b = make_operand(c.batch, c.k, c.n, dtype, c.b, ++seed);
      Pair out = make_input({c.batch, c.m, c.n}, dtype, Layout::Contiguous, ++seed);  // garbage to overwrite
      nc::cpu::matmul_kernels().matmul(out.cpu, a.cpu, b.cpu);
      nc::cuda::matmul_kernels().matmul(out.cuda, a.cuda, b.cuda);
      // Each output sums k products of values in [-1, 1]; the error grows with k.
      const double tol = dtype_tolerance(dtype) * std::max<double>(1.0, std::sqrt(static_cast<double>(c.k)));
      expect_close(out.cuda, out.cpu, tol, tol,
                   describe_case("matmul k=" + std::to_string(c.k), dtype, {c.batch, c.m, c.n}));
    }
  }
}

TEST(CudaBackend, MatmulF32DoesNotUseTf32) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  // 1 + 2^-20 squared: TF32 keeps 10 mantissa bits and would give exactly 1.
  const double x = 1.0 + std::ldexp(1.0, -20);
  Pair a = from_values({x}, {1, 1, 1}, DType::F32), b = from_values({x}, {1, 1, 1}, DType::F32);
  Pair out = empty_pair({1, 1, 1}, DType::F32);
  nc::cuda::matmul_kernels().matmul(out.cuda, a.cuda, b.cuda);
  EXPECT_GT(values_of(out.cuda)[0], 1.0);
}

TEST(CudaBackend, AllowTf32RoundsFloat32MatmulInputs) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  // Every entry 1 + 2^-20: in float32 each dot of 64 products is 64 (1 + 2^-19) > 64; TF32
  // rounds each input to 1 first, giving exactly 64. Other dtypes ignore the setting.
  const int64_t n = 64;
  const double x = 1.0 + std::ldexp(1.0, -20);
  const std::vector<double> ones(n * n, x);
  struct Restore {
    ~Restore() { nc::cuda::set_allow_tf32(false); }
  } restore;
  EXPECT_FALSE(nc::cuda::allow_tf32());
  for (bool tf32 : {false, true}) {
    nc::cuda::set_allow_tf32(tf32);
    EXPECT_EQ(nc::cuda::allow_tf32(), tf32);
    for (DType dtype : {DType::F32, DType::F64}) {
      Pair a = from_values(ones, {1, n, n}, dtype), b = from_values(ones, {1, n, n}, dtype);
      Pair out = empty_pair({1, n, n}, dtype);
      nc::cuda::matmul_kernels().matmul(out.cuda, a.cuda, b.cuda);
      const std::vector<double> v = values_of(out.cuda);
      const bool rounded = tf32 && dtype == DType::F32;
      for (double got : {v.front(), v.back()}) {
        if (rounded) EXPECT_EQ(got, 64.0) << "TF32, " << nc::dtype_name(dtype);
        else EXPECT_GT(got, 64.0) << (tf32 ? "TF32 allowed, " : "TF32 off, ") << nc::dtype_name(dtype);
      }
    }
  }
}

}  // namespace

#endif  // NORMCORE_HAS_CUDA
