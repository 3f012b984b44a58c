// Every CUDA kernel of the generic families (kernels/elementwise.h, generate.h, reduce.h,
// index.h, matmul.h) against the CPU reference on the same data, at sizes and layouts that
// reach each code path (empty, one element, odd sizes, vector tails, misaligned, strided,
// transposed, broadcast, short and long rows), for
// every dtype, with dtype-scaled tolerances; then the caching allocator, streams and
// transfers. Without a GPU every test skips.
#include <gtest/gtest.h>

#ifdef NORMCORE_HAS_CUDA

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/generate.h"
#include "kernels/index.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"
#include "normcore/cuda.h"
#include "normcore/nn.h"
#include "normcore/ops.h"
#include "normcore/random.h"
#include "normcore/tensor.h"

namespace nc = normcore;
using nc::Device;
using nc::DType;
using nc::Shape;
using nc::Tensor;

namespace {

const std::vector<DType> kAllDTypes = {DType::F32, DType::F64, DType::F16, DType::BF16,
                                       DType::I32, DType::I64, DType::U8,  DType::Bool};
const std::vector<DType> kFloatDTypes = {DType::F32, DType::F64, DType::F16, DType::BF16};

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// Relative difference allowed between a CUDA and a CPU result of one op in dtype: the
// math functions differ by a few float ulps, and 16-bit results may round one ulp apart.
double dtype_tolerance(DType d) {
  switch (d) {
    case DType::F32: return 1e-5;
    case DType::F64: return 1e-12;
    case DType::F16: return 2e-3;
    case DType::BF16: return 1.6e-2;
    default: return 0.0;  // integers and bool: exact
  }
}

// Error per unit of sum |x| of a reduction accumulated in float (f16/bf16/f32) or double.
double accumulation_tolerance(DType d) { return d == DType::F64 ? 1e-12 : 1e-5; }

int64_t numel_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string describe_case(const std::string& what, DType dtype, const Shape& shape) {
  std::ostringstream s;
  s << what << " " << nc::dtype_name(dtype) << " " << nc::shape_str(shape);
  return s.str();
}

// Uniform values in [lo, hi) as dtype; whole numbers for integer and bool dtypes, and for
// floating ones too when `whole` (so that ties and exact sums occur).
Tensor random_cpu(const Shape& shape, DType dtype, double lo, double hi, uint32_t seed, bool whole = false) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> values(static_cast<size_t>(numel_of(shape)));
  for (double& v : values) {
    v = dist(gen);
    if (whole || !nc::is_floating(dtype)) v = std::floor(v);
  }
  return nc::from_vector(values, shape).to(dtype);
}

struct Range {
  double lo, hi;
};

// A range every dtype holds exactly after rounding, with negatives where the dtype has them.
Range default_range(DType d) {
  if (d == DType::Bool) return {0, 2};
  if (d == DType::U8) return {0, 200};
  if (nc::is_floating(d)) return {-3, 3};
  return {-50, 50};
}

enum class Layout { Contiguous, Misaligned, Transposed, Strided, Broadcast };

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::Contiguous: return "contiguous";
    case Layout::Misaligned: return "misaligned";
    case Layout::Transposed: return "transposed";
    case Layout::Strided: return "strided";
    case Layout::Broadcast: return "broadcast";
  }
  return "?";
}

struct Pair {
  Tensor cpu, cuda;
};

// The same view of the same random data on the CPU and on cuda:0. Misaligned starts one
// element into its storage; Transposed reverses all dims of a contiguous tensor;
// Strided takes every other element of the last dim; Broadcast expands size-1 dims.
Pair make_input(const Shape& shape, DType dtype, Layout layout, uint32_t seed, Range range, bool whole = false) {
  const int64_t n = numel_of(shape);
  const int64_t nd = static_cast<int64_t>(shape.size());
  if (nd == 0 || (layout == Layout::Transposed && nd < 2)) layout = nd == 0 ? Layout::Contiguous : Layout::Strided;
  Shape base_shape = shape;
  std::function<Tensor(const Tensor&)> view = [](const Tensor& t) { return t; };
  switch (layout) {
    case Layout::Contiguous: break;
    case Layout::Misaligned:
      base_shape = {n + 1};
      view = [=](const Tensor& t) { return t.narrow(0, 1, n).view(shape); };
      break;
    case Layout::Transposed: {
      std::vector<int64_t> order;
      for (int64_t d = nd - 1; d >= 0; --d) order.push_back(d);
      base_shape = Shape(shape.rbegin(), shape.rend());
      view = [=](const Tensor& t) { return t.permute(order); };
      break;
    }
    case Layout::Strided:
      base_shape.back() *= 2;
      view = [=](const Tensor& t) { return t.slice(nd - 1, 0, 2 * shape.back(), 2); };
      break;
    case Layout::Broadcast:
      for (int64_t d = 0; d < nd; d += 2) base_shape[d] = 1;
      view = [=](const Tensor& t) { return t.expand(shape); };
      break;
  }
  Tensor base = random_cpu(base_shape, dtype, range.lo, range.hi, seed, whole);
  return {view(base), view(base.to(Device::cuda()))};
}

Pair make_input(const Shape& shape, DType dtype, Layout layout, uint32_t seed) {
  return make_input(shape, dtype, layout, seed, default_range(dtype));
}

Pair from_values(const std::vector<double>& values, const Shape& shape, DType dtype) {
  Tensor t = nc::from_vector(values, shape).to(dtype);
  return {t, t.to(Device::cuda())};
}

Pair empty_pair(const Shape& shape, DType dtype) {
  return {nc::empty(shape, nc::TensorOptions(dtype)), nc::empty(shape, nc::TensorOptions(dtype, Device::cuda()))};
}

std::vector<double> values_of(const Tensor& t) { return t.to(Device::cpu()).to(DType::F64).to_vector<double>(); }

// got (on the GPU) matches want (on the CPU) element by element within
// rtol * |want| + atol (+ atol_per_element[i]); NaN matches NaN, inf matches itself.
void expect_close(const Tensor& got, const Tensor& want, double rtol, double atol, const std::string& what,
                  const std::vector<double>& atol_per_element = {}) {
  ASSERT_TRUE(got.device().is_cuda()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  const std::vector<double> g = values_of(got), w = values_of(want);
  int64_t mismatches = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    double tol = rtol * std::fabs(w[i]) + atol + (atol_per_element.empty() ? 0.0 : atol_per_element[i]);
    bool ok = g[i] == w[i] || (std::isnan(g[i]) && std::isnan(w[i])) || std::fabs(g[i] - w[i]) <= tol;
    if (!ok && ++mismatches <= 3) {
      ADD_FAILURE() << what << ": element " << i << " is " << g[i] << ", the CPU gives " << w[i];
    }
  }
  EXPECT_EQ(mismatches, 0) << what;
}

void expect_equal(const Tensor& got, const Tensor& want, const std::string& what) {
  expect_close(got, want, 0.0, 0.0, what);
}

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

// ---------------------------------------------------------------- indexing
struct IndexCase {
  Shape x_shape;
  int64_t dim;
  Shape index_shape;  // gather/scatter_add; index_select uses index_shape[dim] indices
};

const std::vector<IndexCase> kIndexCases = {
    {{5}, 0, {3}},
    {{0, 4}, 1, {0, 2}},
    {{7, 9}, 0, {11, 9}},
    {{7, 9}, 1, {7, 20}},
    {{4, 6, 5}, 1, {3, 4, 5}},
    {{4, 6, 5}, 2, {4, 6, 3}},
    {{3, 1000, 17}, 1, {2, 513, 17}},
};

// Indices in [0, size).
Pair make_indices(const Shape& shape, int64_t size, uint32_t seed) {
  return make_input(shape, DType::I64, Layout::Contiguous, seed, Range{0.0, static_cast<double>(size)});
}

TEST(CudaBackend, IndexSelectGatherAndScatterAddMatchCpu) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 70000;
  for (const IndexCase& c : kIndexCases) {
    const int64_t size = c.x_shape[c.dim];
    for (DType dtype : kAllDTypes) {
      const std::string what = describe_case("dim " + std::to_string(c.dim), dtype, c.x_shape);
      Pair x = make_input(c.x_shape, dtype, Layout::Contiguous, ++seed);

      const int64_t count = c.index_shape[c.dim];
      Pair select_index = make_indices({count}, size, ++seed);
      Shape select_shape = c.x_shape;
      select_shape[c.dim] = count;
      Pair selected = empty_pair(select_shape, dtype);
      if (size > 0 || count == 0) {
        nc::cpu::index_kernels().index_select(selected.cpu, x.cpu, c.dim, select_index.cpu);
        nc::cuda::index_kernels().index_select(selected.cuda, x.cuda, c.dim, select_index.cuda);
        expect_equal(selected.cuda, selected.cpu, "index_select " + what);
      }

      Pair index = make_indices(c.index_shape, size, ++seed);
      Pair gathered = empty_pair(c.index_shape, dtype);
      nc::cpu::index_kernels().gather(gathered.cpu, x.cpu, c.dim, index.cpu);
      nc::cuda::index_kernels().gather(gathered.cuda, x.cuda, c.dim, index.cuda);
      expect_equal(gathered.cuda, gathered.cpu, "gather " + what);

      if (dtype == DType::Bool || dtype == DType::U8) continue;
      // Whole numbers, so that the atomics' order of additions cannot change the sums.
      Pair src = make_input(c.index_shape, dtype, Layout::Contiguous, ++seed, Range{-8, 8}, true);
      Pair out = make_input(c.x_shape, dtype, Layout::Contiguous, ++seed, Range{-8, 8}, true);
      nc::cpu::index_kernels().scatter_add(out.cpu, c.dim, index.cpu, src.cpu);
      nc::cuda::index_kernels().scatter_add(out.cuda, c.dim, index.cuda, src.cuda);
      expect_equal(out.cuda, out.cpu, "scatter_add " + what);
    }
  }
}

// index_add_rows (index_select's backward along dim 0): the same bits on every run, and the
// f64 reference's values, for rows repeated across many sort chunks, runs that end exactly
// at chunk boundaries, a single row for everything, and unrepeated rows; widths 1 and 300.
TEST(CudaBackend, IndexAddRowsIsDeterministicAndMatchesTheReference) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 gen(4);
  struct Case {
    std::string name;
    int64_t rows;
    std::vector<double> index;
  };
  std::vector<Case> cases(4);
  cases[0].name = "skewed";
  cases[0].rows = 37;
  for (int i = 0; i < 5000; ++i) cases[0].index.push_back(gen() % 10 < 6 ? 3 : static_cast<double>(gen() % 37));
  cases[1].name = "runs of 64";
  cases[1].rows = 9;
  for (int i = 0; i < 64 * 9; ++i) cases[1].index.push_back(static_cast<double>((i / 64 * 5) % 9));
  cases[2].name = "one row";
  cases[2].rows = 3;
  cases[2].index.assign(1000, 2.0);
  cases[3].name = "distinct";
  cases[3].rows = 300;
  for (int i = 0; i < 300; ++i) cases[3].index.push_back(static_cast<double>((i * 7) % 300));
  for (const Case& c : cases) {
    for (int64_t width : {int64_t{1}, int64_t{300}}) {
      for (DType dtype : {DType::F32, DType::BF16, DType::F64}) {
        const std::string what = c.name + " width " + std::to_string(width) + " " + nc::dtype_name(dtype);
        const int64_t n = static_cast<int64_t>(c.index.size());
        const Pair index = from_values(c.index, {n}, DType::I64);
        const Tensor src64 = random_cpu({n, width}, DType::F64, -1, 1, 7);
        const Tensor src = src64.to(dtype);
        Tensor reference = nc::zeros({c.rows, width}, DType::F64), magnitude = nc::zeros({c.rows, width}, DType::F64);
        nc::cpu::index_kernels().index_add_rows(reference, index.cpu, src.to(DType::F64));
        nc::cpu::index_kernels().index_add_rows(magnitude, index.cpu, nc::abs(src.to(DType::F64)));
        std::vector<std::vector<double>> runs;
        for (int run = 0; run < 2; ++run) {
          Tensor out = nc::zeros({c.rows, width}, nc::TensorOptions(dtype, nc::Device::cuda()));
          nc::cuda::index_kernels().index_add_rows(out, index.cuda, src.to(nc::Device::cuda()));
          runs.push_back(values_of(out));
        }
        EXPECT_EQ(runs[0], runs[1]) << what << ": two runs differ";
        // Sums of at most 64 terms in order, then of the chunks' partials: an error below
        // 1e-5 of the sum of magnitudes in f32 (1e-12 in f64), then one rounding to dtype.
        const std::vector<double> expected = values_of(reference), sum_abs = values_of(magnitude);
        const double accumulation = dtype == DType::F64 ? 1e-12 : 1e-5;
        const double rounding = dtype == DType::BF16 ? 4e-3 : (dtype == DType::F32 ? 1.2e-7 : 0.0);
        for (size_t i = 0; i < expected.size(); ++i) {
          const double bound = accumulation * sum_abs[i] + rounding * std::fabs(expected[i]) + 1e-30;
          if (std::fabs(runs[0][i] - expected[i]) > bound) {
            ADD_FAILURE() << what << ": element " << i << " is " << runs[0][i] << ", expected " << expected[i]
                          << " (sum of magnitudes " << sum_abs[i] << ")";
            break;
          }
        }
      }
    }
  }
  // Through autograd: an embedding's weight gradient, twice.
  nc::Generator g(2);
  const Tensor weight = nc::randn({256, 64}, DType::F32, &g).to(nc::Device::cuda());
  const Tensor tokens = nc::randint(0, 8, {4096}, nc::TensorOptions(DType::I64), &g).to(nc::Device::cuda());
  const Tensor grad = nc::randn({4096, 64}, DType::F32, &g).to(nc::Device::cuda());
  std::vector<std::vector<double>> grads;
  for (int run = 0; run < 2; ++run) {
    Tensor w = weight.detach();
    w.requires_grad_();
    nc::embedding(w, tokens).backward(grad);
    grads.push_back(values_of(w.grad()));
  }
  EXPECT_EQ(grads[0], grads[1]);
}

// ---------------------------------------------------------------- sequences and random
TEST(CudaBackend, ArangeAndLinspaceMatchCpuExactly) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dtype : kAllDTypes) {
    // Non-negative starts where negative values would not convert (u8, bool).
    const bool non_negative = dtype == DType::U8 || dtype == DType::Bool;
    for (int64_t n : {0, 1, 2, 7, 85, 1000, 65537}) {
      if (dtype == DType::U8 && n > 85) continue;  // 3 * n would not fit: undefined conversion
      Pair out = empty_pair({n}, dtype);
      const double start = non_negative ? 0.0 : -3.5, step = nc::is_floating(dtype) ? 0.1 : 3.0;
      nc::cpu::generate_kernels().arange(out.cpu, start, step);
      nc::cuda::generate_kernels().arange(out.cuda, start, step);
      expect_equal(out.cuda, out.cpu, describe_case("arange", dtype, {n}));
      if (n < 2) continue;
      const double lo = non_negative ? 0.0 : -1.0, hi = nc::is_floating(dtype) ? 1.0 : 100.0;
      nc::cpu::generate_kernels().linspace(out.cpu, lo, hi);
      nc::cuda::generate_kernels().linspace(out.cuda, lo, hi);
      expect_equal(out.cuda, out.cpu, describe_case("linspace", dtype, {n}));
    }
  }
}

TEST(CudaBackend, RandomDrawsTheCpuNumbers) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seeds[] = {0, 42, 0xDEADBEEFCAFEull};
  const uint64_t offsets[] = {0, 12345, (uint64_t{1} << 32) - 3};  // crosses a 32-bit counter carry
  for (uint64_t seed : seeds) {
    for (uint64_t offset : offsets) {
      for (int64_t n : {0, 1, 1000, 65537}) {
        for (DType dtype : kFloatDTypes) {
          Pair out = empty_pair({n}, dtype);
          nc::cpu::generate_kernels().random_uniform(out.cpu, seed, offset);
          nc::cuda::generate_kernels().random_uniform(out.cuda, seed, offset);
          expect_equal(out.cuda, out.cpu, describe_case("random_uniform", dtype, {n}));
          for (double v : values_of(out.cuda)) ASSERT_TRUE(v >= 0.0 && v < 1.0) << v;
          nc::cpu::generate_kernels().random_normal(out.cpu, seed, offset);
          nc::cuda::generate_kernels().random_normal(out.cuda, seed, offset);
          // The log and cos of the transform may differ in the last float bits.
          const double tol = std::max(dtype_tolerance(dtype), 1e-6);
          expect_close(out.cuda, out.cpu, tol, tol, describe_case("random_normal", dtype, {n}));
        }
        for (DType dtype : kAllDTypes) {
          Pair out = empty_pair({n}, dtype);
          const bool signed_ok = dtype != DType::U8 && dtype != DType::Bool;
          const int64_t low = signed_ok ? -100 : 0;
          const uint64_t range = dtype == DType::Bool ? 2 : 200;
          nc::cpu::generate_kernels().random_int(out.cpu, seed, offset, low, range);
          nc::cuda::generate_kernels().random_int(out.cuda, seed, offset, low, range);
          expect_equal(out.cuda, out.cpu, describe_case("random_int", dtype, {n}));
        }
      }
    }
  }
}

// Rounds-to-one of 16-bit uniforms are replaced by the largest value below one: seen
// through the public API, values stay in [0, 1) over many draws.
TEST(CudaBackend, SixteenBitUniformsStayBelowOne) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dtype : {DType::F16, DType::BF16}) {
    nc::Generator gen(3);
    Tensor r = nc::rand({1 << 20}, nc::TensorOptions(dtype, Device::cuda()), &gen);
    Tensor max_value = nc::max(r).to(Device::cpu());
    EXPECT_LT(max_value.item<double>(), 1.0) << nc::dtype_name(dtype);
    EXPECT_GT(max_value.item<double>(), 0.99) << nc::dtype_name(dtype);
  }
}

// ---------------------------------------------------------------- 64-bit indexing
// More than 2^31 elements: the strided copy takes its 64-bit path, and a single row that
// long goes through the two-stage reduction.
TEST(CudaBackend, TensorsBeyondTwoToTheThirtyOneElements) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = (int64_t{1} << 31) + 77;
  size_t free_bytes = 0, total_bytes = 0;
  nc::cuda::mem_get_info(0, &free_bytes, &total_bytes);
  if (free_bytes < static_cast<size_t>(3 * n)) GTEST_SKIP() << "needs " << 3 * n << " bytes of GPU memory";
  const nc::TensorOptions u8_cuda(DType::U8, Device::cuda());
  Tensor big = nc::empty({1, n}, u8_cuda);
  Tensor three = nc::full({1, 1}, 3, u8_cuda);
  nc::cuda::elementwise_kernels().copy(big, three.expand({1, n}));  // source stride 0: strided path
  Tensor sum = nc::empty({1}, nc::TensorOptions(DType::I64, Device::cuda()));
  nc::cuda::reduce_kernels().reduce(nc::ReduceOp::Sum, sum, big, 0.0);
  EXPECT_EQ(sum.to(Device::cpu()).item<int64_t>(), 3 * n);
  nc::cuda::elementwise_kernels().fill(big.narrow(1, n - 5, 1), 9);
  Tensor values = nc::empty({1}, u8_cuda), indices = nc::empty({1}, nc::TensorOptions(DType::I64, Device::cuda()));
  nc::cuda::reduce_kernels().arg_reduce(true, values, indices, big);
  EXPECT_EQ(indices.to(Device::cpu()).item<int64_t>(), n - 5);
  EXPECT_EQ(values.to(Device::cpu()).item<int64_t>(), 9);
}

// ---------------------------------------------------------------- public ops on the GPU
struct OpCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
};

const std::vector<OpCase> kPublicOps = {
    {"add broadcast", [](const Tensor& a, const Tensor& b) { return nc::add(a, b.narrow(0, 0, 1)); }},
    {"mul scalar", [](const Tensor& a, const Tensor&) { return nc::mul(a, 2.5); }},
    {"matmul", [](const Tensor& a, const Tensor& b) { return nc::matmul(a, b.t()); }},
    {"sum dim 1", [](const Tensor& a, const Tensor&) { return nc::sum(a, {1}); }},
    {"sum dim 0", [](const Tensor& a, const Tensor&) { return nc::sum(a, {0}); }},
    {"var dim 0", [](const Tensor& a, const Tensor&) { return nc::var(a, {0}); }},
    {"argmax dim 0", [](const Tensor& a, const Tensor&) { return nc::argmax(a, 0); }},
    {"gelu of transpose", [](const Tensor& a, const Tensor&) { return nc::gelu(a.t()); }},
    {"where", [](const Tensor& a, const Tensor& b) { return nc::where(nc::gt(a, b), a, b); }},
};

TEST(CudaBackend, PublicOpsOnCudaTensorsMatchCpu) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (const OpCase& c : kPublicOps) {
    Pair a = make_input({37, 50}, DType::F32, Layout::Contiguous, 1);
    Pair b = make_input({37, 50}, DType::F32, Layout::Contiguous, 2);
    Tensor want = c.op(a.cpu, b.cpu), got = c.op(a.cuda, b.cuda);
    EXPECT_TRUE(got.device().is_cuda()) << c.name;
    expect_close(got, want, 1e-4, 1e-4, c.name);
  }
}

// ---------------------------------------------------------------- runtime and allocator
TEST(CudaRuntime, FreedBlocksAreReusedWithoutCudaMalloc) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  nc::cuda::synchronize();
  nc::cuda::empty_cache();
  const nc::TensorOptions f32_cuda(DType::F32, Device::cuda());
  const nc::cuda::MemoryStats before = nc::cuda::memory_stats(0);
  { Tensor t = nc::empty({1000}, f32_cuda); }  // 4000 bytes -> one 4096-byte block
  const nc::cuda::MemoryStats first = nc::cuda::memory_stats(0);
  EXPECT_EQ(first.num_device_mallocs, before.num_device_mallocs + 1);
  EXPECT_EQ(first.allocated, before.allocated);
  EXPECT_EQ(first.reserved, before.reserved + 4096);
  {
    Tensor t = nc::empty({1000}, f32_cuda);
    EXPECT_EQ(nc::cuda::memory_stats(0).allocated, before.allocated + 4096);
  }
  const nc::cuda::MemoryStats second = nc::cuda::memory_stats(0);
  EXPECT_EQ(second.num_device_mallocs, first.num_device_mallocs);
  EXPECT_EQ(second.num_cache_hits, first.num_cache_hits + 1);
  EXPECT_EQ(second.num_allocs, first.num_allocs + 1);
  // A much larger request does not take the small block, and a tiny one does not take a large block.
  { Tensor t = nc::empty({100000}, f32_cuda); }
  EXPECT_EQ(nc::cuda::memory_stats(0).num_device_mallocs, second.num_device_mallocs + 1);
  { Tensor t = nc::empty({1}, f32_cuda); }
  EXPECT_EQ(nc::cuda::memory_stats(0).num_device_mallocs, second.num_device_mallocs + 2);
  nc::cuda::empty_cache();
  const nc::cuda::MemoryStats emptied = nc::cuda::memory_stats(0);
  EXPECT_EQ(emptied.reserved, emptied.allocated + emptied.split_cached);
}

// A request of 1 MiB or more is cut from a larger cached block, and the parts merge back
// when they are freed: no cudaMalloc for either, and the whole block serves the next large
// request.
TEST(CudaRuntime, LargeCachedBlocksAreCutAndMergeBack) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  nc::cuda::synchronize();
  nc::cuda::empty_cache();
  const nc::TensorOptions u8_cuda(DType::U8, Device::cuda());
  constexpr int64_t kMiB = 1 << 20;
  const int64_t big = 97 * kMiB + 512;  // a size no other test asks for
  { Tensor t = nc::empty({big}, u8_cuda); }
  const nc::cuda::MemoryStats cached = nc::cuda::memory_stats(0);
  {
    Tensor a = nc::empty({31 * kMiB}, u8_cuda);
    Tensor b = nc::empty({33 * kMiB}, u8_cuda);
    const nc::cuda::MemoryStats cut = nc::cuda::memory_stats(0);
    EXPECT_EQ(cut.num_device_mallocs, cached.num_device_mallocs);
    EXPECT_EQ(cut.reserved, cached.reserved);
    EXPECT_EQ(static_cast<const char*>(b.data_ptr()) - static_cast<const char*>(a.data_ptr()), 31 * kMiB);
    EXPECT_EQ(cut.split_cached, cached.split_cached + static_cast<size_t>(big - 64 * kMiB));
    // Half a MiB is too small to cut a block for: it gets its own.
    { Tensor small = nc::empty({kMiB / 2}, u8_cuda); }
    EXPECT_EQ(nc::cuda::memory_stats(0).num_device_mallocs, cached.num_device_mallocs + 1);
    // The parts hold what was written to them.
    a.fill_(1);
    b.fill_(2);
    EXPECT_EQ(nc::sum(a.to(DType::F64)).item<double>(), static_cast<double>(31 * kMiB));
    EXPECT_EQ(nc::sum(b.to(DType::F64)).item<double>(), static_cast<double>(2 * 33 * kMiB));
  }
  const nc::cuda::MemoryStats merged = nc::cuda::memory_stats(0);
  EXPECT_EQ(merged.split_cached, cached.split_cached);
  { Tensor whole = nc::empty({big}, u8_cuda); }
  EXPECT_EQ(nc::cuda::memory_stats(0).num_device_mallocs, merged.num_device_mallocs);
  nc::cuda::empty_cache();
  const nc::cuda::MemoryStats emptied = nc::cuda::memory_stats(0);
  EXPECT_EQ(emptied.reserved, emptied.allocated + emptied.split_cached);
}

TEST(CudaRuntime, SteadyLoopMakesNoCudaMalloc) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  Pair x = make_input({64, 128}, DType::F32, Layout::Contiguous, 5);
  Pair w = make_input({128, 32}, DType::F32, Layout::Contiguous, 6);
  auto step = [&] {
    Tensor h = nc::relu(nc::matmul(x.cuda, w.cuda));
    Tensor loss = nc::sum(nc::mul(h, h));
    return loss.to(Device::cpu()).item<double>();
  };
  // Best fit settles within a couple of iterations; from then on every request is a hit.
  const double warm = step();
  for (int i = 0; i < 2; ++i) EXPECT_EQ(step(), warm);
  const uint64_t mallocs = nc::cuda::memory_stats(0).num_device_mallocs;
  for (int i = 0; i < 20; ++i) EXPECT_EQ(step(), warm);
  EXPECT_EQ(nc::cuda::memory_stats(0).num_device_mallocs, mallocs);
}

TEST(CudaRuntime, PeakTracksTheHighWaterMark) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  nc::cuda::reset_peak_memory_stats(0);
  const size_t base = nc::cuda::memory_stats(0).allocated;
  EXPECT_EQ(nc::cuda::memory_stats(0).peak_allocated, base);
  { Tensor t = nc::empty({1 << 20}, nc::TensorOptions(DType::F32, Device::cuda())); }
  const nc::cuda::MemoryStats after = nc::cuda::memory_stats(0);
  EXPECT_EQ(after.allocated, base);
  EXPECT_EQ(after.peak_allocated, base + (size_t{4} << 20));
  nc::cuda::reset_peak_memory_stats(0);
  EXPECT_EQ(nc::cuda::memory_stats(0).peak_allocated, base);
}

TEST(CudaRuntime, AllocationLargerThanTheGpuThrowsOutOfMemoryAndAllocatorStillWorks) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  size_t free_bytes = 0, total_bytes = 0;
  nc::cuda::mem_get_info(0, &free_bytes, &total_bytes);
  EXPECT_GT(total_bytes, 0u);
  EXPECT_LE(free_bytes, total_bytes);
  { Tensor cached = nc::empty({1 << 20}, nc::TensorOptions(DType::F32, Device::cuda())); }
  const nc::cuda::MemoryStats before = nc::cuda::memory_stats(0);
  const int64_t too_many = static_cast<int64_t>(total_bytes) * 2;
  try {
    Tensor t = nc::empty({too_many}, nc::TensorOptions(DType::U8, Device::cuda()));
    ADD_FAILURE() << "allocating " << too_many << " bytes did not throw";
  } catch (const nc::OutOfMemoryError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(std::to_string(too_many)), std::string::npos) << message;
    EXPECT_NE(message.find("cuda:0"), std::string::npos) << message;
    EXPECT_NE(message.find("free"), std::string::npos) << message;
  }
  const nc::cuda::MemoryStats after = nc::cuda::memory_stats(0);
  EXPECT_EQ(after.num_ooms, before.num_ooms + 1);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_EQ(after.reserved, after.allocated + after.split_cached);  // the cache was freed before the retry
  Pair x = make_input({1000}, DType::F32, Layout::Contiguous, 9);
  expect_equal(nc::neg(x.cuda), nc::neg(x.cpu), "neg after an out-of-memory error");
}

TEST(CudaRuntime, DeviceIndicesAreValidated) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const int count = nc::cuda_device_count();
  EXPECT_THROW(nc::cuda::memory_stats(count), nc::DeviceError);
  EXPECT_THROW(nc::cuda::set_device(-1), nc::DeviceError);
  EXPECT_THROW(nc::cuda::current_stream(count + 3), nc::DeviceError);
  try {
    nc::cuda::synchronize(count);
    ADD_FAILURE() << "synchronize(" << count << ") did not throw";
  } catch (const nc::DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("cuda::synchronize"), std::string::npos) << e.what();
  }
  nc::cuda::set_device(0);
  EXPECT_EQ(nc::cuda::current_device(), 0);
}

TEST(CudaRuntime, StreamGuardRoutesWorkToAUserStream) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const nc::cuda::StreamHandle own = nc::cuda::current_stream(0);
  ASSERT_NE(own, nullptr);
  nc::cuda::StreamHandle user = nc::cuda::create_stream();
  Pair x = make_input({4096}, DType::F32, Layout::Contiguous, 12);
  {
    nc::cuda::StreamGuard guard(0, user);
    EXPECT_EQ(nc::cuda::current_stream(0), user);
    Tensor y = nc::exp(x.cuda);
    nc::cuda::synchronize(0);
    expect_close(y, nc::exp(x.cpu), 1e-5, 1e-6, "exp on a user stream");
  }
  EXPECT_EQ(nc::cuda::current_stream(0), own);
  EXPECT_THROW(nc::cuda::destroy_stream(own), nc::ValueError);
  nc::cuda::destroy_stream(user);
  expect_close(nc::exp(x.cuda), nc::exp(x.cpu), 1e-5, 1e-6, "exp after the user stream is gone");
}

TEST(CudaRuntime, TransfersRoundTripAtEverySize) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (int64_t n : {0, 1, 3, 1000, (1 << 20) + 1}) {
    Tensor host = random_cpu({n}, DType::F64, -1, 1, 3);
    Tensor back = host.to(Device::cuda()).to(Device::cpu());
    EXPECT_EQ(back.to_vector<double>(), host.to_vector<double>()) << n;
    // Through pinned memory, whose upload is asynchronous; the pinned tensor is freed
    // right away, which must wait for the upload.
    Tensor on_gpu = host.pin_memory().to(Device::cuda());
    EXPECT_EQ(on_gpu.to(Device::cpu()).to_vector<double>(), host.to_vector<double>()) << n;
  }
  if (nc::cuda_device_count() > 1) {
    Tensor host = random_cpu({12345}, DType::F32, -1, 1, 4);
    Tensor peer = host.to(Device::cuda(0)).to(Device::cuda(1));
    EXPECT_EQ(peer.device(), Device::cuda(1));
    EXPECT_EQ(peer.to(Device::cpu()).to_vector<float>(), host.to_vector<float>());
  }
}

}  // namespace

#endif  // NORMCORE_HAS_CUDA
