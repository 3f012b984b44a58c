// Printing a tensor the way PyTorch does: nested brackets, one common number format,
// large tensors summarized with "..." (first and last 3 entries along each dim), then the
// shape, dtype and device.
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "core/internal.h"

namespace normcore {

namespace {

constexpr int64_t kSummarizeAbove = 1000;
constexpr int64_t kEdgeItems = 3;

struct Formatter {
  enum Kind { Bool, Int, IntegralFloat, Fixed, Sci } kind = Fixed;
  int width = 0;

  std::string format(double v) const {
    char buf[64];
    if (kind == Bool) return v != 0 ? "True" : "False";
    if (!std::isfinite(v)) {
      std::snprintf(buf, sizeof(buf), "%s", std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf"));
    } else if (kind == Int) {
      std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(v));
    } else if (kind == IntegralFloat) {
      std::snprintf(buf, sizeof(buf), "%.0f.", v);
    } else if (kind == Fixed) {
      std::snprintf(buf, sizeof(buf), "%.4f", v);
    } else {
      std::snprintf(buf, sizeof(buf), "%.4e", v);
    }
    return buf;
  }
  std::string padded(double v) const {
    std::string s = format(v);
    return std::string(width > static_cast<int>(s.size()) ? width - s.size() : 0, ' ') + s;
  }
};

// Indices shown along a dim of size n.
std::vector<int64_t> shown(int64_t n, bool summarize) {
  std::vector<int64_t> idx;
  if (summarize && n > 2 * kEdgeItems) {
    for (int64_t i = 0; i < kEdgeItems; ++i) idx.push_back(i);
    idx.push_back(-1);  // the "..." marker
    for (int64_t i = n - kEdgeItems; i < n; ++i) idx.push_back(i);
  } else {
    for (int64_t i = 0; i < n; ++i) idx.push_back(i);
  }
  return idx;
}

void collect(const std::vector<double>& v, const Shape& shape, const Shape& strides, size_t d, int64_t base,
             bool summarize, std::vector<double>& out) {
  if (d == shape.size()) {
    out.push_back(v[base]);
    return;
  }
  for (int64_t i : shown(shape[d], summarize))
    if (i >= 0) collect(v, shape, strides, d + 1, base + i * strides[d], summarize, out);
}

void emit(std::ostream& os, const std::vector<double>& v, const Shape& shape, const Shape& strides, size_t d,
          int64_t base, bool summarize, const Formatter& f, int indent) {
  if (d == shape.size()) {
    os << f.padded(v[base]);
    return;
  }
  os << '[';
  auto idx = shown(shape[d], summarize);
  bool last_dim = d + 1 == shape.size();
  for (size_t k = 0; k < idx.size(); ++k) {
    if (k > 0) {
      os << ',';
      if (last_dim) {
        os << ' ';
      } else {
        os << std::string(shape.size() - d - 1, '\n') << std::string(indent + 1, ' ');
      }
    }
    if (idx[k] < 0) os << (last_dim ? " ..." : "...");  // PyTorch pads the marker inside a row
    else emit(os, v, shape, strides, d + 1, base + idx[k] * strides[d], summarize, f, indent + 1);
  }
  os << ']';
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  std::vector<double> values = t.to_vector<double>();
  const Shape& shape = t.shape();
  Shape strides = detail::contiguous_strides(shape);
  bool summarize = t.numel() > kSummarizeAbove;

  std::vector<double> visible;
  collect(values, shape, strides, 0, 0, summarize, visible);
  Formatter f;
  if (t.dtype() == DType::Bool) {
    f.kind = Formatter::Bool;
  } else if (!is_floating(t.dtype())) {
    f.kind = Formatter::Int;
  } else {
    bool integral = true;
    double max_abs = 0, min_abs = INFINITY;
    for (double v : visible) {
      if (!std::isfinite(v)) continue;
      integral = integral && v == std::floor(v);
      max_abs = std::max(max_abs, std::fabs(v));
      if (v != 0) min_abs = std::min(min_abs, std::fabs(v));
    }
    // As PyTorch: a wide range switches integral values to scientific notation too.
    bool wide_range = min_abs != INFINITY && max_abs / min_abs > 1000;
    if (wide_range || max_abs > 1e8 || min_abs < 1e-4) {
      f.kind = Formatter::Sci;
    } else if (integral) {
      f.kind = Formatter::IntegralFloat;
    } else {
      f.kind = Formatter::Fixed;
    }
  }
  // Column width comes from the finite values only; nan and inf are padded to it, as in PyTorch.
  for (double v : visible)
    if (!is_floating(t.dtype()) || std::isfinite(v))
      f.width = std::max<int>(f.width, static_cast<int>(f.format(v).size()));

  os << "tensor(";
  if (shape.empty()) {
    os << f.format(values[0]);
  } else {
    emit(os, values, shape, strides, 0, 0, summarize, f, 7);
  }
  os << ", shape=" << shape_str(shape) << ", dtype=" << dtype_name(t.dtype()) << ", device=" << t.device();
  if (t.requires_grad()) {
    if (t.is_leaf()) os << ", requires_grad=true";
    else os << ", grad_fn=" << t.grad_fn_name();
  }
  os << ')';
  return os;
}

}  // namespace normcore
