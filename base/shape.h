// Shape arithmetic that core, the kernels and data loading share: row-major strides and the
// checked element count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "normcore/error.h"

namespace normcore {
namespace detail {

// Row-major strides for shape.
inline std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

// A checked shape can be laid out contiguously with every offset, in elements or in bytes
// of any dtype, inside int64: the product of its sizes (a 0 counted as 1) is at most 2^59.
constexpr int64_t kMaxSpan = int64_t{1} << 59;

// Product of sizes; throws ShapeError (naming op) on a negative size or overflow.
inline int64_t checked_numel(const std::vector<int64_t>& shape, const char* op) {
  int64_t n = 1, span = 1;
  for (int64_t s : shape) {
    NC_CHECK(s >= 0, ShapeError, op, ": negative size in shape ", shape);
    const int64_t extent = std::max<int64_t>(s, 1);
    if (extent > kMaxSpan / span) {
      throw ShapeError(cat_str(op, ": shape ", shape, " has too many elements (the limit is 2^59)"));
    }
    span *= extent;
    n = s == 0 ? 0 : n * s;
  }
  return n;
}

}  // namespace detail
}  // namespace normcore
