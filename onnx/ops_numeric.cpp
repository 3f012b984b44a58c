// The ONNX ops of onnx/ops.cpp's table that round, test, take remainders, pad and sum along an
// axis (Erf, Floor, Ceil, Round, IsNaN, IsInf, Mod, CastLike, Pad, CumSum), and the
// trigonometric and hyperbolic functions normcore has no kernel for (Tan, Sinh, Cosh, Asinh,
// Acosh, Atanh: from exp, log, sin and cos in f64, so that the cancellations near 0 cost
// nothing in f32), Celu, Shrink, MeanVarianceNormalization and LRN, on normcore's ops.
#include <cmath>
#include <limits>

#include "onnx/proto.h"

namespace normcore {
namespace onnx {

namespace {

using Outputs = std::vector<Tensor>;

Tensor either(const Tensor& a, const Tensor& b) { return where(a, a, b); }  // a or b, for bool tensors

// x with its fraction dropped (toward zero).
Tensor trunc(const Tensor& x) { return where(lt(x, 0), ceil(x), floor(x)); }

// Mod: a - trunc(a / b) * b with fmod (C's fmod: the dividend's sign), else a - floor(a / b) * b
// (Python's %: the divisor's sign, integers only in ONNX). Integers compute in f64 (exact below
// 2^53) and a zero divisor gives 0.
Tensor mod(const NodeRun& n) {
  const Tensor &a = n.input(0), &b = n.input(1);
  const bool fmod = n.int_attribute("fmod", 0) != 0;
  NC_CHECK(a.dtype() == b.dtype(), DTypeError, n.where, ": A is ", describe(a), " but B is ", describe(b));
  NC_CHECK(fmod || !is_floating(a.dtype()), ValueError, n.where, ": fmod = 0 is for integers (", describe(a),
           "); floats need fmod = 1");
  const bool integer = !is_floating(a.dtype());
  const Tensor x = integer ? a.to(DType::F64) : a, y = integer ? b.to(DType::F64) : b;
  const Tensor q = div(x, y);
  Tensor r = sub(x, mul(fmod ? trunc(q) : floor(q), y));
  if (!integer) return r;
  return where(eq(y, 0), zeros_like(r), r).to(a.dtype());
}

Tensor is_inf(const NodeRun& n) {
  const Tensor& x = n.input(0);
  const bool positive = n.int_attribute("detect_positive", 1) != 0,
             negative = n.int_attribute("detect_negative", 1) != 0;
  Tensor out = zeros(x.shape(), TensorOptions(DType::Bool, x.device()));
  if (!is_floating(x.dtype())) return out;
  if (positive) out = either(out, eq(x, Scalar(std::numeric_limits<double>::infinity())));
  if (negative) out = either(out, eq(x, Scalar(-std::numeric_limits<double>::infinity())));
  return out;
}

// The source index of each output position along an axis of length `length` padded by
// `before` and `after` (either may be negative: a crop, made first, so that edge and reflect
// repeat the cropped axis's ends, as onnxruntime does); -1 where constant mode fills in.
std::vector<int64_t> pad_indices(int64_t length, int64_t before, int64_t after, const std::string& mode,
                                 const NodeRun& n, int64_t axis) {
  const int64_t out_length = length + before + after;
  NC_CHECK(out_length >= 0, ShapeError, n.where, ": pads ", before, " and ", after, " on axis ", axis,
           " leave a negative length from ", length);
  const int64_t first = std::max<int64_t>(0, -before);  // the crop's first kept index
  const int64_t kept = std::max<int64_t>(0, length - first - std::max<int64_t>(0, -after));
  NC_CHECK(mode == "constant" || kept > 0 || out_length == 0, ValueError, n.where, ": mode ", mode, " cannot pad axis ",
           axis, ", which is empty", kept < length ? " once cropped" : "");
  before = std::max<int64_t>(0, before);
  length = kept;
  std::vector<int64_t> index(static_cast<size_t>(out_length));
  for (int64_t i = 0; i < out_length; ++i) {
    int64_t p = i - before;
    if (mode == "edge") {
      p = std::min(std::max<int64_t>(p, 0), length - 1);
    } else if (mode == "reflect") {
      const int64_t period = 2 * (length - 1);
      if (period == 0) {
        p = 0;
      } else {
        p = ((p % period) + period) % period;
        if (p >= length) p = period - p;
      }
    } else if (p < 0 || p >= length) {
      p = -1;
    }
    index[static_cast<size_t>(i)] = p < 0 ? p : p + first;
  }
  return index;
}

// Pad: pads [begin_0, begin_1, ..., end_0, end_1, ...] from the attribute (before opset 11)
// or the second input, modes constant (value from the attribute or the third input), edge and
// reflect; negative pads crop.
Tensor pad(const NodeRun& n) {
  const Tensor& x = n.input(0);
  const std::string mode = n.attribute("mode") ? n.attribute("mode")->s() : "constant";
  NC_CHECK(mode == "constant" || mode == "edge" || mode == "reflect", ValueError, n.where, ": mode '", mode,
           "' is not supported (constant, edge, reflect)");
  const std::vector<int64_t> pads = n.opset >= 11 ? n.int_values(1) : n.ints_attribute("pads");
  const int64_t rank = x.dim();
  NC_CHECK(static_cast<int64_t>(pads.size()) == 2 * rank, ShapeError, n.where, ": pads has ", pads.size(),
           " values; x ", describe(x), " needs ", 2 * rank);
  double value = 0;
  if (n.opset >= 11) {
    if (n.has_input(2)) value = n.host_input(2).to(DType::F64).reshape({}).item<double>();
  } else {
    value = n.float_attribute("value", 0.0f);
  }
  Tensor y = x, inside;
  for (int64_t a = 0; a < rank; ++a) {
    const int64_t before = pads[static_cast<size_t>(a)], after = pads[static_cast<size_t>(a + rank)];
    if (before == 0 && after == 0) continue;
    std::vector<int64_t> index = pad_indices(x.size(a), before, after, mode, n, a);
    std::vector<int64_t> clamped(index.size());
    std::vector<uint8_t> valid(index.size());
    for (size_t i = 0; i < index.size(); ++i) clamped[i] = std::max<int64_t>(index[i], 0), valid[i] = index[i] >= 0;
    if (y.size(a) == 0) {  // nothing to gather from: every position is the constant
      Shape shape = y.shape();
      shape[static_cast<size_t>(a)] = static_cast<int64_t>(index.size());
      y = full(shape, value, TensorOptions(x.dtype(), x.device()));
      continue;
    }
    y = index_select(y, a, index_vector(clamped, x.device()));
    if (mode != "constant") continue;
    Shape mask_shape(static_cast<size_t>(rank), 1);
    mask_shape[static_cast<size_t>(a)] = static_cast<int64_t>(valid.size());
    const Tensor mask = from_vector(valid, mask_shape).to(x.device(), DType::Bool);
    inside = inside.defined() ? where(inside, mask, inside) : mask;  // and
  }
  return inside.defined() ? where(inside, y, Scalar(value)) : y;
}

// CumSum along the axis (a scalar input): the running sums as a product with a triangular
// matrix of ones (O(length^2) work per row; exact for integers below 2^53, which compute in
// f64; f16 and bf16 in f32), exclusive and reverse as ONNX defines them.
Tensor cumsum(const NodeRun& n) {
  const Tensor& x = n.input(0);
  NC_CHECK(n.input(1).numel() == 1, ShapeError, n.where, ": axis must hold one value, got ", describe(n.input(1)));
  const int64_t rank = x.dim();
  int64_t axis = n.int_values(1)[0];
  NC_CHECK(axis >= -rank && axis < rank, ValueError, n.where, ": axis ", axis, " is out of range for ", describe(x));
  if (axis < 0) axis += rank;
  const bool exclusive = n.int_attribute("exclusive", 0) != 0, reverse = n.int_attribute("reverse", 0) != 0;
  const DType compute = x.dtype() == DType::F64 || !is_floating(x.dtype()) ? DType::F64 : DType::F32;
  const int64_t length = x.size(axis);
  std::vector<double> ones(static_cast<size_t>(length * length), 0.0);
  for (int64_t i = 0; i < length; ++i)
    for (int64_t j = 0; j < length; ++j) {
      const bool take = reverse ? (exclusive ? i > j : i >= j) : (exclusive ? i < j : i <= j);
      ones[static_cast<size_t>(i * length + j)] = take ? 1.0 : 0.0;
    }
  const Tensor tri = from_vector(ones, {length, length}).to(x.device(), compute);
  const Tensor moved = x.transpose(axis, rank - 1).to(compute);
  return matmul(moved, tri).transpose(axis, rank - 1).to(x.dtype()).contiguous();
}

// f of x computed in f64 and returned in x's dtype.
Tensor in_f64(const Tensor& x, Tensor (*f)(const Tensor&)) { return f(x.to(DType::F64)).to(x.dtype()); }
Tensor tan_f64(const Tensor& x) { return div(sin(x), cos(x)); }
Tensor sinh_f64(const Tensor& x) { return mul(sub(exp(x), exp(neg(x))), 0.5); }
Tensor cosh_f64(const Tensor& x) { return mul(add(exp(x), exp(neg(x))), 0.5); }
// asinh is odd: log(|x| + sqrt(x^2 + 1)) with x's sign (no cancellation for negative x).
Tensor asinh_f64(const Tensor& x) {
  const Tensor a = abs(x);
  return mul(sign(x), log(add(a, sqrt(add(mul(a, a), 1.0)))));
}
Tensor acosh_f64(const Tensor& x) { return log(add(x, sqrt(sub(mul(x, x), 1.0)))); }
Tensor atanh_f64(const Tensor& x) { return mul(log(div(add(x, 1.0), neg(sub(x, 1.0)))), 0.5); }

// Celu: max(0, x) + min(0, alpha (exp(x / alpha) - 1)).
Tensor celu(const NodeRun& n) {
  const Tensor& x = n.input(0);
  const double alpha = n.float_attribute("alpha", 1.0f);
  NC_CHECK(alpha != 0, ValueError, n.where, ": alpha must not be 0");
  return add(maximum(x, Scalar(0.0)), minimum(mul(sub(exp(div(x, alpha)), 1.0), alpha), Scalar(0.0)));
}

// Shrink: x + bias below -lambd, x - bias above lambd, 0 between.
Tensor shrink(const NodeRun& n) {
  const Tensor& x = n.input(0);
  const double bias = n.float_attribute("bias", 0.0f), lambd = n.float_attribute("lambd", 0.5f);
  const Tensor zero = zeros_like(x);
  return where(lt(x, -lambd), add(x, bias).to(x.dtype()), where(gt(x, lambd), sub(x, bias).to(x.dtype()), zero));
}

// MeanVarianceNormalization: (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9) over axes (0, 2, 3 by
// default), as ONNX's function body computes it.
Tensor mean_variance_normalization(const NodeRun& n) {
  const Tensor& x = n.input(0);
  std::vector<int64_t> axes = n.attribute("axes") ? n.ints_attribute("axes") : std::vector<int64_t>{0, 2, 3};
  for (int64_t& a : axes) a = axis_of(a, x.dim(), n);
  const Tensor mean_x = mean(x, axes, /*keepdim=*/true);
  const Tensor variance = sub(mean(mul(x, x), axes, /*keepdim=*/true), mul(mean_x, mean_x));
  return div(sub(x, mean_x), add(sqrt(variance), 1e-9));
}

// LRN over channels (dim 1): x / (bias + alpha / size * the sum of x^2 over the channels from
// c - floor((size - 1) / 2) to c + ceil((size - 1) / 2))^beta.
Tensor local_response_normalization(const NodeRun& n) {
  const Tensor& x = n.input(0);
  NC_CHECK(x.dim() >= 3, ShapeError, n.where, ": X must be [N, C, d1, ...], got ", describe(x));
  const int64_t size = n.int_attribute("size", 0);
  NC_CHECK(size >= 1, ValueError, n.where, ": size must be positive, got ", size);
  const double alpha = n.float_attribute("alpha", 1e-4f), beta = n.float_attribute("beta", 0.75f),
               bias = n.float_attribute("bias", 1.0f);
  const int64_t before = (size - 1) / 2, after = size - 1 - before, channels = x.size(1);
  Shape pad_before = x.shape(), pad_after = x.shape();
  pad_before[1] = before;
  pad_after[1] = after;
  const Tensor squares = cat({zeros(pad_before, TensorOptions(x.dtype(), x.device())), mul(x, x),
                              zeros(pad_after, TensorOptions(x.dtype(), x.device()))},
                             1);
  Tensor window = squares.narrow(1, 0, channels);
  for (int64_t i = 1; i < size; ++i) window = add(window, squares.narrow(1, i, channels));
  return div(x, pow(add(mul(window, alpha / static_cast<double>(size)), bias), beta));
}

}  // namespace

void add_numeric_ops(std::map<std::string, OpSpec>& t) {
  t["Erf"] = single_output([](const NodeRun& n) { return erf(n.input(0)).to(n.input(0).dtype()); });
  t["Floor"] = single_output([](const NodeRun& n) { return floor(n.input(0)); });
  t["Ceil"] = single_output([](const NodeRun& n) { return ceil(n.input(0)); });
  t["Round"] = single_output([](const NodeRun& n) { return round(n.input(0)); });
  t["IsNaN"] = single_output([](const NodeRun& n) { return ne(n.input(0), n.input(0)); });
  t["IsInf"] = single_output(is_inf, {"detect_negative", "detect_positive"});
  t["Mod"] = single_output(mod, {"fmod"});
  t["CastLike"] = single_output([](const NodeRun& n) { return n.input(0).to(n.input(1).dtype()); });
  t["Pad"] = single_output(pad, {"mode", "pads", "value"});
  t["CumSum"] = single_output(cumsum, {"exclusive", "reverse"});
  t["Tan"] = single_output([](const NodeRun& n) { return in_f64(n.input(0), tan_f64); });
  t["Sinh"] = single_output([](const NodeRun& n) { return in_f64(n.input(0), sinh_f64); });
  t["Cosh"] = single_output([](const NodeRun& n) { return in_f64(n.input(0), cosh_f64); });
  t["Asinh"] = single_output([](const NodeRun& n) { return in_f64(n.input(0), asinh_f64); });
  t["Acosh"] = single_output([](const NodeRun& n) { return in_f64(n.input(0), acosh_f64); });
  t["Atanh"] = single_output([](const NodeRun& n) { return in_f64(n.input(0), atanh_f64); });
  t["Celu"] = single_output(celu, {"alpha"});
  t["MeanVarianceNormalization"] = single_output(mean_variance_normalization, {"axes"});
  t["LRN"] = single_output(local_response_normalization, {"alpha", "beta", "bias", "size"});
  t["Shrink"] = single_output(shrink, {"bias", "lambd"});
  t["GlobalMaxPool"] = single_output([](const NodeRun& n) {
    const Tensor& x = n.input(0);
    NC_CHECK(x.dim() >= 3, ShapeError, n.where, ": X must be [N, C, d1, ...], got ", describe(x));
    std::vector<int64_t> axes;
    for (int64_t d = 2; d < x.dim(); ++d) axes.push_back(d);
    Tensor out = x;
    for (auto it = axes.rbegin(); it != axes.rend(); ++it) out = max(out, *it, /*keepdim=*/true).first;
    return out;
  });
}

}  // namespace onnx
}  // namespace normcore
