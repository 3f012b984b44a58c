// What the op tests share (test_ops.cpp, test_layouts_reductions.cpp, test_matmul_joining.cpp):
// the dtype lists, tensors from values, tolerances by dtype and the element-by-element check.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "normcore/normcore.h"

namespace ops_test {

namespace nc = normcore;
using nc::DType;
using nc::Shape;
using nc::Tensor;

inline const std::vector<DType> kFloat = {DType::F32, DType::F64, DType::F16, DType::BF16};
inline const std::vector<DType> kSigned = {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64};
inline const std::vector<DType> kNumeric = {DType::F32, DType::F64, DType::F16, DType::BF16,
                                            DType::I32, DType::I64, DType::U8};

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

inline Tensor make(const std::vector<double>& v, const Shape& shape, DType dtype = DType::F32) {
  return nc::from_vector<double>(v, shape).to(dtype);
}

inline Tensor make_bool(const std::vector<bool>& v, const Shape& shape) { return nc::from_vector<bool>(v, shape); }

// Relative tolerance for results rounded to dtype (a few units in the last place).
inline double tol_for(DType dtype) {
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
inline void expect_values(const Tensor& t, const std::vector<double>& expected, double tol = 0) {
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

inline std::string trace(const char* name, DType dtype) { return std::string(name) + " " + nc::dtype_name(dtype); }

}  // namespace ops_test
