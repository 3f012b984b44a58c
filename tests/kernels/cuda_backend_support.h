// What the CUDA backend tests share (test_cuda_backend.cpp, test_cuda_indexing_runtime.cpp):
// the dtype lists and tolerances, random CPU inputs in every layout with their CUDA copies,
// and the comparisons of a CUDA result with the CPU reference. Built with CUDA only.
#pragma once

#include <gtest/gtest.h>

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

namespace cuda_backend_test {

namespace nc = normcore;
using nc::Device;
using nc::DType;
using nc::Shape;
using nc::Tensor;

inline const std::vector<DType> kAllDTypes = {DType::F32, DType::F64, DType::F16, DType::BF16,
                                              DType::I32, DType::I64, DType::U8,  DType::Bool};
inline const std::vector<DType> kFloatDTypes = {DType::F32, DType::F64, DType::F16, DType::BF16};

inline const double kNaN = std::numeric_limits<double>::quiet_NaN();
inline const double kInf = std::numeric_limits<double>::infinity();

// Relative difference allowed between a CUDA and a CPU result of one op in dtype: the
// math functions differ by a few float ulps, and 16-bit results may round one ulp apart.
inline double dtype_tolerance(DType d) {
  switch (d) {
    case DType::F32: return 1e-5;
    case DType::F64: return 1e-12;
    case DType::F16: return 2e-3;
    case DType::BF16: return 1.6e-2;
    default: return 0.0;  // integers and bool: exact
  }
}

// Error per unit of sum |x| of a reduction accumulated in float (f16/bf16/f32) or double.
inline double accumulation_tolerance(DType d) { return d == DType::F64 ? 1e-12 : 1e-5; }

inline int64_t numel_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

inline std::string describe_case(const std::string& what, DType dtype, const Shape& shape) {
  std::ostringstream s;
  s << what << " " << nc::dtype_name(dtype) << " " << nc::shape_str(shape);
  return s.str();
}

// Uniform values in [lo, hi) as dtype; whole numbers for integer and bool dtypes, and for
// floating ones too when `whole` (so that ties and exact sums occur).
inline Tensor random_cpu(const Shape& shape, DType dtype, double lo, double hi, uint32_t seed, bool whole = false) {
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
inline Range default_range(DType d) {
  if (d == DType::Bool) return {0, 2};
  if (d == DType::U8) return {0, 200};
  if (nc::is_floating(d)) return {-3, 3};
  return {-50, 50};
}

enum class Layout { Contiguous, Misaligned, Transposed, Strided, Broadcast };

inline const char* layout_name(Layout l) {
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
inline Pair make_input(const Shape& shape, DType dtype, Layout layout, uint32_t seed, Range range, bool whole = false) {
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

inline Pair make_input(const Shape& shape, DType dtype, Layout layout, uint32_t seed) {
  return make_input(shape, dtype, layout, seed, default_range(dtype));
}

inline Pair from_values(const std::vector<double>& values, const Shape& shape, DType dtype) {
  Tensor t = nc::from_vector(values, shape).to(dtype);
  return {t, t.to(Device::cuda())};
}

inline Pair empty_pair(const Shape& shape, DType dtype) {
  return {nc::empty(shape, nc::TensorOptions(dtype)), nc::empty(shape, nc::TensorOptions(dtype, Device::cuda()))};
}

inline std::vector<double> values_of(const Tensor& t) { return t.to(Device::cpu()).to(DType::F64).to_vector<double>(); }

// got (on the GPU) matches want (on the CPU) element by element within
// rtol * |want| + atol (+ atol_per_element[i]); NaN matches NaN, inf matches itself.
inline void expect_close(const Tensor& got, const Tensor& want, double rtol, double atol, const std::string& what,
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

inline void expect_equal(const Tensor& got, const Tensor& want, const std::string& what) {
  expect_close(got, want, 0.0, 0.0, what);
}

}  // namespace cuda_backend_test
