// The ONNX ops onnx::Model runs (op_table), each on normcore's ops with ONNX's semantics at
// opsets up to 17: NumPy broadcasting, negative axes counted from the end, attribute
// defaults, axes as an attribute or (newer opsets) an input. Shape-valued inputs are read
// on the host.
#include <algorithm>
#include <limits>
#include <numeric>

#include "core/conv_panels.h"
#include "onnx/proto.h"

namespace normcore {
namespace onnx {

int64_t axis_of(int64_t axis, int64_t rank, const NodeRun& n) {
  const int64_t a = axis < 0 ? axis + rank : axis;
  NC_CHECK(a >= 0 && a < std::max<int64_t>(rank, 1), ValueError, n.where, ": axis ", axis, " is out of range for rank ",
           rank);
  return a;
}

double scalar_input(const NodeRun& n, size_t i) {
  const Tensor& t = n.input(i);
  NC_CHECK(t.numel() == 1, ShapeError, n.where, ": input ", i, " must hold one value, got ", describe(t));
  return n.host_input(i).to(DType::F64).reshape({}).item<double>();
}

Tensor pad_dim(Tensor x, int64_t dim, int64_t before, int64_t after, double value) {
  for (const bool start : {true, false}) {
    const int64_t amount = start ? before : after, size = x.size(dim);
    if (amount < 0) {
      x = x.narrow(dim, start ? -amount : 0, size + amount);
    } else if (amount > 0) {
      Shape shape = x.shape();
      shape[static_cast<size_t>(dim)] = amount;
      const Tensor fill = full(shape, value, TensorOptions(x.dtype(), x.device()));
      x = start ? cat({fill, x}, dim) : cat({x, fill}, dim);
    }
  }
  return x;
}

Tensor index_vector(const std::vector<int64_t>& v, Device device) {
  return from_vector(v, {static_cast<int64_t>(v.size())}).to(device);
}

OpSpec single_output(Tensor (*f)(const NodeRun&), std::vector<std::string> attributes) {
  return OpSpec{[f](const NodeRun& n) { return std::vector<Tensor>{f(n)}; }, std::move(attributes)};
}

namespace {

using Outputs = std::vector<Tensor>;

// Axes from the attribute before opset 13, from the second input from then on.
std::vector<int64_t> axes_of(const NodeRun& n) {
  return n.opset >= 13 ? (n.has_input(1) ? n.int_values(1) : std::vector<int64_t>{}) : n.ints_attribute("axes");
}

OpSpec unary(Tensor (*f)(const Tensor&)) {
  return {[f](const NodeRun& n) { return Outputs{f(n.input(0))}; }, {}};
}

OpSpec binary(Tensor (*f)(const Tensor&, const Tensor&)) {
  return {[f](const NodeRun& n) { return Outputs{f(n.input(0), n.input(1))}; }, {}};
}

// Min, Max, Sum, Mean: any number of inputs, broadcast.
OpSpec variadic(Tensor (*f)(const Tensor&, const Tensor&), bool mean = false) {
  return {[f, mean](const NodeRun& n) {
            Tensor out = n.input(0);
            for (size_t i = 1; i < n.inputs.size(); ++i) out = f(out, n.input(i));
            if (mean) out = div(out, static_cast<double>(n.inputs.size()));
            return Outputs{out};
          },
          {}};
}

// Reduce*: axes from the attribute (or, for ReduceSum from opset 13, the second input);
// none means all unless noop_with_empty_axes.
OpSpec reduce(Tensor (*f)(const Tensor&, const std::vector<int64_t>&, bool), bool axes_input_from_13) {
  return {[f, axes_input_from_13](const NodeRun& n) {
            const Tensor& x = n.input(0);
            std::vector<int64_t> axes = axes_input_from_13 ? axes_of(n) : n.ints_attribute("axes");
            const bool keep = n.int_attribute("keepdims", 1) != 0;
            if (axes.empty()) {
              if (n.int_attribute("noop_with_empty_axes", 0)) return Outputs{x};
              axes.resize(static_cast<size_t>(x.dim()));
              std::iota(axes.begin(), axes.end(), 0);
            }
            for (int64_t& a : axes) a = axis_of(a, x.dim(), n);
            return Outputs{f(x, axes, keep)};
          },
          {"axes", "keepdims", "noop_with_empty_axes"}};
}

// out without the (size-1) axes a reduction kept.
Tensor squeeze_axes(Tensor out, std::vector<int64_t> axes) {
  std::sort(axes.rbegin(), axes.rend());
  for (int64_t a : axes) out = out.squeeze(a);
  return out;
}

// Max or min over several axes, one at a time.
Tensor reduce_extreme(const Tensor& x, const std::vector<int64_t>& axes, bool keep, bool maximum) {
  std::vector<int64_t> sorted = axes;
  std::sort(sorted.rbegin(), sorted.rend());
  Tensor out = x;
  for (int64_t a : sorted) out = (maximum ? max(out, a, /*keepdim=*/true) : min(out, a, /*keepdim=*/true)).first;
  return keep ? out : squeeze_axes(out, axes);
}
Tensor reduce_max(const Tensor& x, const std::vector<int64_t>& axes, bool keep) {
  return reduce_extreme(x, axes, keep, true);
}
Tensor reduce_min(const Tensor& x, const std::vector<int64_t>& axes, bool keep) {
  return reduce_extreme(x, axes, keep, false);
}

// Softmax and LogSoftmax: from opset 13 along axis (default -1); before, over the dims from
// axis (default 1) on, flattened.
OpSpec softmax_op(Tensor (*f)(const Tensor&, int64_t)) {
  return {[f](const NodeRun& n) {
            const Tensor& x = n.input(0);
            if (n.opset >= 13) return Outputs{f(x, axis_of(n.int_attribute("axis", -1), x.dim(), n))};
            const int64_t axis = axis_of(n.int_attribute("axis", 1), x.dim(), n);
            int64_t outer = 1;
            for (int64_t d = 0; d < axis; ++d) outer *= x.size(d);
            return Outputs{f(x.reshape({outer, x.numel() / std::max<int64_t>(outer, 1)}), 1).reshape(x.shape())};
          },
          {"axis"}};
}

Tensor gemm(const NodeRun& n) {
  Tensor a = n.input(0), b = n.input(1);
  if (n.int_attribute("transA", 0)) a = a.t();
  if (n.int_attribute("transB", 0)) b = b.t();
  Tensor y = mul(matmul(a, b), static_cast<double>(n.float_attribute("alpha", 1.0f)));
  if (n.has_input(2)) y = add(y, mul(n.input(2), static_cast<double>(n.float_attribute("beta", 1.0f))));
  return y;
}

Tensor reshape(const NodeRun& n) {
  const Tensor& x = n.input(0);
  std::vector<int64_t> shape = n.int_values(1);
  const bool allow_zero = n.int_attribute("allowzero", 0) != 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0 && !allow_zero) {
      NC_CHECK(static_cast<int64_t>(i) < x.dim(), ShapeError, n.where, ": shape entry ", i, " is 0 (copy) past ",
               describe(x), "'s dims");
      shape[i] = x.size(static_cast<int64_t>(i));
    }
  }
  return x.reshape(shape);
}

Tensor transpose(const NodeRun& n) {
  const Tensor& x = n.input(0);
  std::vector<int64_t> perm = n.ints_attribute("perm");
  if (perm.empty()) {
    for (int64_t d = x.dim() - 1; d >= 0; --d) perm.push_back(d);
  }
  return x.permute(perm).contiguous();
}

Tensor unsqueeze(const NodeRun& n) {
  Tensor x = n.input(0);
  std::vector<int64_t> axes = axes_of(n);
  const int64_t rank = x.dim() + static_cast<int64_t>(axes.size());
  for (int64_t& a : axes) a = axis_of(a, rank, n);
  std::sort(axes.begin(), axes.end());
  for (int64_t a : axes) x = x.unsqueeze(a);
  return x;
}

Tensor squeeze(const NodeRun& n) {
  Tensor x = n.input(0);
  std::vector<int64_t> axes = axes_of(n);
  if (axes.empty()) return x.squeeze();
  for (int64_t& a : axes) a = axis_of(a, x.dim(), n);
  std::sort(axes.rbegin(), axes.rend());
  for (int64_t a : axes) {
    NC_CHECK(x.size(a) == 1, ShapeError, n.where, ": axis ", a, " of ", describe(x), " is not 1");
    x = x.squeeze(a);
  }
  return x;
}

Tensor flatten(const NodeRun& n) {
  const Tensor& x = n.input(0);
  const int64_t axis = n.int_attribute("axis", 1);
  const int64_t a = axis < 0 ? axis + x.dim() : axis;
  NC_CHECK(a >= 0 && a <= x.dim(), ValueError, n.where, ": axis ", axis, " is out of range for ", describe(x));
  int64_t outer = 1;
  for (int64_t d = 0; d < a; ++d) outer *= x.size(d);
  return x.reshape({outer, outer ? x.numel() / outer : 0});
}

Tensor shape(const NodeRun& n) {
  const Tensor& x = n.input(0);
  const int64_t rank = x.dim();
  int64_t start = n.int_attribute("start", 0), end = n.int_attribute("end", rank);
  start = std::clamp<int64_t>(start < 0 ? start + rank : start, 0, rank);
  end = std::clamp<int64_t>(end < 0 ? end + rank : end, 0, rank);
  std::vector<int64_t> dims;
  for (int64_t d = start; d < end; ++d) dims.push_back(x.size(d));
  return index_vector(dims, x.device());
}

Tensor constant(const NodeRun& n) {
  if (const auto* a = n.attribute("value")) return from_proto(a->t(), n.where + ": value");
  if (const auto* a = n.attribute("value_float")) return full({}, static_cast<double>(a->f()), DType::F32);
  if (const auto* a = n.attribute("value_int")) return full({}, a->i(), DType::I64);
  if (const auto* a = n.attribute("value_floats")) {
    const std::vector<float> v(a->floats().begin(), a->floats().end());
    return from_vector(v, {static_cast<int64_t>(v.size())});
  }
  if (const auto* a = n.attribute("value_ints")) {
    const std::vector<int64_t> v(a->ints().begin(), a->ints().end());
    return from_vector(v, {static_cast<int64_t>(v.size())});
  }
  throw ValueError(n.where + ": Constant has none of value, value_float(s), value_int(s)");
}

Tensor cast(const NodeRun& n) {
  return n.input(0).to(dtype_of(static_cast<int>(n.int_attribute("to", 0)), n.where + ": attribute 'to'"));
}

Tensor clip(const NodeRun& n) {
  const Tensor& x = n.input(0);
  std::optional<Scalar> lo, hi;
  if (n.opset >= 11) {
    if (n.has_input(1)) lo = scalar_input(n, 1);
    if (n.has_input(2)) hi = scalar_input(n, 2);
  } else {
    if (n.attribute("min")) lo = static_cast<double>(n.float_attribute("min", 0));
    if (n.attribute("max")) hi = static_cast<double>(n.float_attribute("max", 0));
  }
  if (!lo && !hi) return x;
  return clamp(x, lo, hi);
}

Tensor leaky_relu(const NodeRun& n) {
  const Tensor& x = n.input(0);
  return where(ge(x, 0), x, mul(x, static_cast<double>(n.float_attribute("alpha", 0.01f))));
}

Tensor concat(const NodeRun& n) {
  std::vector<Tensor> parts;
  for (const Tensor& t : n.inputs)
    if (t.defined()) parts.push_back(t);
  NC_CHECK(!parts.empty(), ValueError, n.where, ": no inputs");
  return cat(parts, axis_of(n.int_attribute("axis", 0), parts.front().dim(), n));
}

Tensor gather_op(const NodeRun& n) {
  const Tensor& x = n.input(0);
  const int64_t axis = axis_of(n.int_attribute("axis", 0), x.dim(), n);
  Tensor index = n.input(1).to(DType::I64);
  index = where(lt(index, 0), add(index, x.size(axis)), index);  // negative indices count from the end
  Tensor picked = index_select(x, axis, index.reshape({index.numel()}));
  Shape shape(x.shape().begin(), x.shape().begin() + axis);
  for (int64_t d : index.shape()) shape.push_back(d);
  shape.insert(shape.end(), x.shape().begin() + axis + 1, x.shape().end());
  return picked.reshape(shape);
}

// Pads of a 2-D conv or pool over spatial extents (h, w) with kernel, stride and dilation:
// [top, left, bottom, right] from the pads attribute (NOTSET), zeros (VALID), or what makes
// the output ceil(in / stride) (SAME_UPPER puts the odd pad at the end, SAME_LOWER at the
// start).
struct Pads {
  int64_t top = 0, left = 0, bottom = 0, right = 0;
  bool symmetric() const { return top == bottom && left == right; }
};
Pads pads_2d(const NodeRun& n, int64_t h, int64_t w, Size2 kernel, Size2 stride, Size2 dilation) {
  const std::string auto_pad = n.attribute("auto_pad") ? n.attribute("auto_pad")->s() : "NOTSET";
  NC_CHECK(auto_pad == "NOTSET" || auto_pad == "VALID" || auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER",
           ValueError, n.where, ": auto_pad ", auto_pad, " is not supported");
  Pads p;
  if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    const auto total = [](int64_t in, int64_t k, int64_t s, int64_t d) {
      const int64_t out = (in + s - 1) / s;
      return std::max<int64_t>(0, (out - 1) * s + d * (k - 1) + 1 - in);
    };
    const int64_t th = total(h, kernel.h, stride.h, dilation.h), tw = total(w, kernel.w, stride.w, dilation.w);
    const bool upper = auto_pad == "SAME_UPPER";
    p.top = upper ? th / 2 : th - th / 2, p.bottom = th - p.top;
    p.left = upper ? tw / 2 : tw - tw / 2, p.right = tw - p.left;
    return p;
  }
  const std::vector<int64_t> pads = n.ints_attribute("pads");
  if (pads.empty() || auto_pad == "VALID") return p;
  NC_CHECK(pads.size() == 4, ValueError, n.where, ": attribute 'pads' must have 4 values for 2-D, got ", pads.size());
  for (int64_t v : pads) NC_CHECK(v >= 0, ValueError, n.where, ": negative pads are not supported, got ", v);
  p.top = pads[0], p.left = pads[1], p.bottom = pads[2], p.right = pads[3];
  return p;
}

// x with its two spatial dims (from dim h_dim on) padded by p with value.
Tensor pad_spatial(const Tensor& x, const Pads& p, double value, int64_t h_dim) {
  return pad_dim(pad_dim(x, h_dim, p.top, p.bottom, value), h_dim + 1, p.left, p.right, value);
}

Size2 pair_attribute(const NodeRun& n, const char* name, int64_t fallback) {
  const std::vector<int64_t> v = n.ints_attribute(name);
  if (v.empty()) return Size2(fallback);
  NC_CHECK(v.size() == 2, ValueError, n.where, ": attribute '", name, "' must have 2 values (2-D), got ", v.size());
  return Size2(v[0], v[1]);
}

void check_2d(const NodeRun& n, const Tensor& x) {
  NC_CHECK(x.dim() == 4, ShapeError, n.where, ": 2-D (NCHW) inputs are supported, got ", describe(x));
}

// With an epilogue (NodeRun::residual, relu), relu?(conv + residual) in one pass where the
// residual has the output's shape, dtype and device (conv2d_fused), else in three.
Tensor conv_padded(const NodeRun& n, const Tensor& x, const Tensor& w, Size2 stride, Size2 pad, Size2 dilation,
                   int64_t groups);

Tensor conv(const NodeRun& n) {
  const Tensor& x = n.input(0);
  const Tensor& w = n.input(1);
  check_2d(n, x);
  const Size2 stride = pair_attribute(n, "strides", 1), dilation = pair_attribute(n, "dilations", 1);
  const int64_t groups = n.int_attribute("group", 1);
  NC_CHECK(w.dim() == 4, ShapeError, n.where, ": weight must be 4-D, got ", describe(w));
  const int64_t h_dim = n.channels_last ? 1 : 2, k_dim = n.channels_last ? 1 : 2;
  const Pads pads =
      pads_2d(n, x.size(h_dim), x.size(h_dim + 1), Size2(w.size(k_dim), w.size(k_dim + 1)), stride, dilation);
  // Asymmetric pads (SAME's odd one) pad the input first; the convolution then pads nothing.
  const Tensor padded = pads.symmetric() ? x : pad_spatial(x, pads, 0.0, h_dim);
  const Size2 pad = pads.symmetric() ? Size2(pads.top, pads.left) : Size2(0);
  return conv_padded(n, padded, w, stride, pad, dilation, groups);
}

// conv's product once its pads are symmetric.
Tensor conv_padded(const NodeRun& n, const Tensor& x, const Tensor& w, Size2 stride, Size2 pad, Size2 dilation,
                   int64_t groups) {
  const Tensor b = n.has_input(2) ? n.input(2) : Tensor();
  const Tensor& r = n.residual;
  const auto extent = [&](int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
    return in + 2 * p >= d * (k - 1) + 1 ? (in + 2 * p - d * (k - 1) - 1) / s + 1 : 0;
  };
  if (n.channels_last) {  // x [N, H, W, C], w [O, kh, kw, C], r and the output [N, Ho, Wo, O]
    const bool fits =
        !r.defined() || (r.dtype() == x.dtype() && r.device() == x.device() &&
                         r.shape() == Shape{x.size(0), extent(x.size(1), w.size(1), stride.h, pad.h, dilation.h),
                                            extent(x.size(2), w.size(2), stride.w, pad.w, dilation.w), w.size(0)});
    const auto fused = [&](const Tensor& residual, bool relu_too) {
      if (n.weight_panels.defined()) {
        return detail::conv2d_nhwc_panels(x, w, n.weight_panels, b, residual, relu_too, stride, pad, dilation);
      }
      return conv2d_fused(x, w, b, residual, relu_too, stride, pad, dilation, groups, ConvLayout::NHWC);
    };
    if (fits) return fused(r, n.relu);
    const Tensor y = add(fused(Tensor(), false), r);
    return n.relu ? relu(y) : y;
  }
  if (!n.relu && !r.defined()) return conv2d(x, w, b, stride, pad, dilation, groups);
  const bool fits = !r.defined() ||
                    (w.dim() == 4 && r.dtype() == x.dtype() && r.device() == x.device() &&
                     r.shape() == Shape{x.size(0), w.size(0), extent(x.size(2), w.size(2), stride.h, pad.h, dilation.h),
                                        extent(x.size(3), w.size(3), stride.w, pad.w, dilation.w)});
  if (fits) return conv2d_fused(x, w, b, r, n.relu, stride, pad, dilation, groups);
  const Tensor y = add(conv2d(x, w, b, stride, pad, dilation, groups), r);
  return n.relu ? relu(y) : y;
}

Tensor max_pool(const NodeRun& n) {
  const Tensor& x = n.input(0);
  check_2d(n, x);
  NC_CHECK(n.node.output_size() < 2 || n.node.output(1).empty(), ValueError, n.where,
           ": the Indices output is not supported");
  NC_CHECK(n.int_attribute("storage_order", 0) == 0, ValueError, n.where, ": storage_order 1 is not supported");
  const Size2 kernel = pair_attribute(n, "kernel_shape", 1), stride = pair_attribute(n, "strides", 1),
              dilation = pair_attribute(n, "dilations", 1);
  const Pads pads = pads_2d(n, x.size(2), x.size(3), kernel, stride, dilation);
  const bool ceil_mode = n.int_attribute("ceil_mode", 0) != 0;
  // Pads max_pool2d does not take (asymmetric, or past half the window) as -inf around the input.
  if (pads.symmetric() && 2 * pads.top <= kernel.h && 2 * pads.left <= kernel.w)
    return max_pool2d(x, kernel, stride, Size2(pads.top, pads.left), dilation, ceil_mode);
  return max_pool2d(pad_spatial(x, pads, -std::numeric_limits<double>::infinity(), 2), kernel, stride, 0, dilation,
                    ceil_mode);
}

Tensor average_pool(const NodeRun& n) {
  const Tensor& x = n.input(0);
  check_2d(n, x);
  const Size2 kernel = pair_attribute(n, "kernel_shape", 1), stride = pair_attribute(n, "strides", 1);
  const Pads pads = pads_2d(n, x.size(2), x.size(3), kernel, stride, Size2(1));
  const bool ceil_mode = n.int_attribute("ceil_mode", 0) != 0,
             include_pad = n.int_attribute("count_include_pad", 0) != 0;
  if (pads.symmetric() && 2 * pads.top <= kernel.h && 2 * pads.left <= kernel.w)
    return avg_pool2d(x, kernel, stride, Size2(pads.top, pads.left), ceil_mode, include_pad);
  // Other pads: zeros around the input; without count_include_pad each window's mean is over
  // its elements inside the input (the mean of the padded input over that of a padded mask).
  const Tensor sums = avg_pool2d(pad_spatial(x, pads, 0.0, 2), kernel, stride, 0, ceil_mode, true);
  if (include_pad) return sums;
  const Tensor inside = ones({1, 1, x.size(2), x.size(3)}, TensorOptions(x.dtype(), x.device()));
  return div(sums, avg_pool2d(pad_spatial(inside, pads, 0.0, 2), kernel, stride, 0, ceil_mode, true));
}

Tensor batch_normalization(const NodeRun& n) {
  NC_CHECK(n.int_attribute("training_mode", 0) == 0, ValueError, n.where, ": training_mode is not supported");
  return batch_norm(n.input(0), n.input(3), n.input(4), n.input(1), n.input(2), /*training=*/false, 0.1,
                    n.float_attribute("epsilon", 1e-5f));
}

// Integers divide with truncation, as ONNX's Div does.
Tensor div_op(const Tensor& a, const Tensor& b) {
  const Tensor q = div(a, b);
  return is_floating(a.dtype()) ? q : q.to(a.dtype());
}

Tensor range(const NodeRun& n) {
  const DType dtype = n.input(0).dtype();
  return arange(scalar_input(n, 0), scalar_input(n, 1), scalar_input(n, 2), TensorOptions(dtype, n.input(0).device()));
}

Tensor constant_of_shape(const NodeRun& n) {
  const std::vector<int64_t> dims = n.int_values(0);
  const Tensor value =
      n.attribute("value") ? from_proto(n.attribute("value")->t(), n.where + ": value") : zeros({1}, DType::F32);
  NC_CHECK(value.numel() == 1, ShapeError, n.where, ": value must hold one element, got ", describe(value));
  return value.reshape({}).expand(Shape(dims.begin(), dims.end())).contiguous().to(n.input(0).device());
}

// Expand: the shape broadcast with the input's, both ways (NumPy's rule).
Tensor expand_op(const NodeRun& n) {
  const Tensor& x = n.input(0);
  std::vector<int64_t> dims = n.int_values(1);
  const int64_t rank = std::max<int64_t>(x.dim(), static_cast<int64_t>(dims.size()));
  Shape out(static_cast<size_t>(rank), 1);
  for (int64_t i = 0; i < rank; ++i) {
    const int64_t xi = i - (rank - x.dim()), di = i - (rank - static_cast<int64_t>(dims.size()));
    const int64_t a = xi >= 0 ? x.size(xi) : 1, b = di >= 0 ? dims[di] : 1;
    NC_CHECK(a == b || a == 1 || b == 1, ShapeError, n.where, ": shape ", shape_str(Shape(dims.begin(), dims.end())),
             " does not broadcast with ", describe(x));
    out[i] = a == 1 ? b : a;
  }
  return x
      .reshape([&] {
        Shape padded(static_cast<size_t>(rank - x.dim()), 1);
        padded.insert(padded.end(), x.shape().begin(), x.shape().end());
        return padded;
      }())
      .expand(out)
      .contiguous();
}

// Slice with steps of 1 (other steps are refused).
Tensor slice(const NodeRun& n) {
  Tensor x = n.input(0);
  std::vector<int64_t> starts, ends, axes, steps;
  if (n.opset >= 10) {
    starts = n.int_values(1);
    ends = n.int_values(2);
    if (n.has_input(3)) axes = n.int_values(3);
    if (n.has_input(4)) steps = n.int_values(4);
  } else {
    starts = n.ints_attribute("starts");
    ends = n.ints_attribute("ends");
    axes = n.ints_attribute("axes");
  }
  NC_CHECK(starts.size() == ends.size(), ValueError, n.where, ": starts and ends differ in length");
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t axis = axis_of(axes.empty() ? static_cast<int64_t>(i) : axes[i], x.dim(), n);
    const int64_t step = steps.empty() ? 1 : steps[i], size = x.size(axis);
    NC_CHECK(step != 0, ValueError, n.where, ": a step of 0 along axis ", axis);
    // Negative starts and ends count from the end; then clamped to [0, size] going forward
    // and to [-1, size - 1] going backward (ONNX's rule).
    const auto clamp_index = [&](int64_t v, int64_t lo, int64_t hi) {
      if (v < 0) v = v < -size ? -1 : v + size;
      return std::clamp<int64_t>(v, lo, hi);
    };
    const int64_t begin = step > 0 ? clamp_index(starts[i], 0, size) : clamp_index(starts[i], -1, size - 1);
    const int64_t end = step > 0 ? clamp_index(ends[i], 0, size) : clamp_index(ends[i], -1, size - 1);
    if (step == 1) {
      x = x.narrow(axis, begin, std::max<int64_t>(0, end - begin));
      continue;
    }
    const int64_t count = step > 0 ? std::max<int64_t>(0, (end - begin + step - 1) / step)
                                   : std::max<int64_t>(0, (begin - end + (-step) - 1) / (-step));
    x = count == 0
            ? x.narrow(axis, 0, 0)
            : index_select(x, axis, arange(begin, begin + count * step, step, TensorOptions(DType::I64, x.device())));
  }
  return x.contiguous();
}

Outputs split(const NodeRun& n) {
  const Tensor& x = n.input(0);
  const int64_t axis = axis_of(n.int_attribute("axis", 0), x.dim(), n);
  std::vector<int64_t> sizes =
      n.opset >= 13 ? (n.has_input(1) ? n.int_values(1) : std::vector<int64_t>{}) : n.ints_attribute("split");
  const int64_t parts = n.node.output_size();
  if (sizes.empty()) {
    NC_CHECK(parts > 0 && x.size(axis) % parts == 0, ShapeError, n.where, ": ", describe(x), " does not split into ",
             parts, " equal parts along axis ", axis);
    sizes.assign(static_cast<size_t>(parts), x.size(axis) / parts);
  }
  Outputs out;
  int64_t start = 0;
  for (int64_t size : sizes) {
    NC_CHECK(size >= 0 && start + size <= x.size(axis), ShapeError, n.where, ": split sizes pass axis ", axis, " of ",
             describe(x));
    out.push_back(x.narrow(axis, start, size).contiguous());
    start += size;
  }
  return out;
}

// LayerNormalization over the dims from axis on; its Mean and InvStdDev outputs when asked.
Outputs layer_normalization(const NodeRun& n) {
  const Tensor& x = n.input(0);
  const int64_t axis = axis_of(n.int_attribute("axis", -1), x.dim(), n);
  NC_CHECK(n.int_attribute("stash_type", 1) == 1, ValueError, n.where, ": stash_type other than float");
  const double eps = n.float_attribute("epsilon", 1e-5f);
  const std::vector<int64_t> normalized(x.shape().begin() + axis, x.shape().end());
  Outputs out{layer_norm(x, normalized, n.input(1), n.has_input(2) ? n.input(2) : Tensor(), eps)};
  if (n.node.output_size() > 1) {
    std::vector<int64_t> dims;
    for (int64_t d = axis; d < x.dim(); ++d) dims.push_back(d);
    const Tensor xf = x.to(DType::F32);
    out.push_back(mean(xf, dims, /*keepdim=*/true));
    out.push_back(rsqrt(add(var(xf, dims, /*unbiased=*/false, /*keepdim=*/true), eps)));
  }
  return out;
}

Tensor arg_op(const NodeRun& n, bool maximum) {
  const Tensor& x = n.input(0);
  const int64_t axis = axis_of(n.int_attribute("axis", 0), x.dim(), n);
  const bool keep = n.int_attribute("keepdims", 1) != 0;
  if (n.int_attribute("select_last_index", 0) == 0) return maximum ? argmax(x, axis, keep) : argmin(x, axis, keep);
  // The last of equal extremes: the first one of the axis reversed, counted from the end.
  const int64_t size = x.size(axis);
  const Tensor reversed = index_select(x, axis, arange(size - 1, -1, -1, TensorOptions(DType::I64, x.device())));
  const Tensor first = maximum ? argmax(reversed, axis, keep) : argmin(reversed, axis, keep);
  return sub(full({}, static_cast<double>(size - 1), TensorOptions(DType::I64, x.device())), first);
}

// GatherElements: normcore's gather, negative indices counted from the end.
Tensor gather_elements(const NodeRun& n) {
  const Tensor& x = n.input(0);
  const int64_t axis = axis_of(n.int_attribute("axis", 0), x.dim(), n);
  Tensor index = n.input(1).to(DType::I64);
  index = where(lt(index, 0), add(index, x.size(axis)), index);
  return gather(x, axis, index);
}

// Trilu: the upper (upper = 1) or lower triangle of the last two dims from diagonal k.
Tensor trilu(const NodeRun& n) {
  const Tensor& x = n.input(0);
  NC_CHECK(x.dim() >= 2, ShapeError, n.where, ": input must have at least 2 dims, got ", describe(x));
  const int64_t k = n.has_input(1) ? static_cast<int64_t>(scalar_input(n, 1)) : 0;
  const int64_t rows = x.size(-2), cols = x.size(-1);
  const Tensor i = arange(rows, TensorOptions(DType::I64, x.device())).reshape({rows, 1});
  const Tensor j = arange(cols, TensorOptions(DType::I64, x.device())).reshape({1, cols});
  const Tensor diagonal = sub(j, i);  // j - i
  const Tensor keep = n.int_attribute("upper", 1) ? ge(diagonal, k) : le(diagonal, k);
  return where(keep, x, zeros({}, TensorOptions(x.dtype(), x.device())));
}

Tensor instance_normalization(const NodeRun& n) {
  const Tensor& x = n.input(0);
  NC_CHECK(x.dim() >= 3, ShapeError, n.where, ": input must be [N, C, ...], got ", describe(x));
  return group_norm(x, x.size(1), n.input(1), n.input(2), n.float_attribute("epsilon", 1e-5f));
}

// DepthToSpace (DCR or CRD) and SpaceToDepth over [N, C, H, W].
Tensor depth_to_space(const NodeRun& n) {
  const Tensor& x = n.input(0);
  check_2d(n, x);
  const int64_t b = n.int_attribute("blocksize", 1), N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  NC_CHECK(b >= 1 && C % (b * b) == 0, ShapeError, n.where, ": channels of ", describe(x), " are not a multiple of ",
           b * b);
  const std::string mode = n.attribute("mode") ? n.attribute("mode")->s() : "DCR";
  NC_CHECK(mode == "DCR" || mode == "CRD", ValueError, n.where, ": mode ", mode, " is not DCR or CRD");
  const Tensor t = mode == "DCR" ? x.reshape({N, b, b, C / (b * b), H, W}).permute({0, 3, 4, 1, 5, 2})
                                 : x.reshape({N, C / (b * b), b, b, H, W}).permute({0, 1, 4, 2, 5, 3});
  return t.reshape({N, C / (b * b), H * b, W * b});
}

Tensor space_to_depth(const NodeRun& n) {
  const Tensor& x = n.input(0);
  check_2d(n, x);
  const int64_t b = n.int_attribute("blocksize", 1), N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  NC_CHECK(b >= 1 && H % b == 0 && W % b == 0, ShapeError, n.where, ": height and width of ", describe(x),
           " are not multiples of ", b);
  return x.reshape({N, C, H / b, b, W / b, b}).permute({0, 3, 5, 1, 2, 4}).reshape({N, C * b * b, H / b, W / b});
}

Tensor tile(const NodeRun& n) {
  const Tensor& x = n.input(0);
  const std::vector<int64_t> repeats = n.int_values(1);
  NC_CHECK(static_cast<int64_t>(repeats.size()) == x.dim(), ShapeError, n.where, ": repeats has ", repeats.size(),
           " values for ", describe(x));
  // [d0, d1, ...] -> [1, d0, 1, d1, ...] expanded to [r0, d0, r1, d1, ...], then merged.
  Shape spread, expanded, out;
  for (int64_t d = 0; d < x.dim(); ++d) {
    spread.insert(spread.end(), {1, x.size(d)});
    expanded.insert(expanded.end(), {repeats[d], x.size(d)});
    out.push_back(repeats[d] * x.size(d));
  }
  return x.reshape(spread).expand(expanded).contiguous().reshape(out);
}

// 1 at the first maximum along dim, 0 elsewhere.
Tensor hardmax(const Tensor& x, int64_t dim) {
  const Tensor hot = one_hot(argmax(x, dim), x.size(dim)).to(x.dtype());  // the class dim last
  std::vector<int64_t> order;
  for (int64_t d = 0; d < x.dim() - 1; ++d) order.push_back(d);
  order.insert(order.begin() + dim, x.dim() - 1);
  return hot.permute(order).contiguous();
}

Tensor where_op(const NodeRun& n) { return where(n.input(0).to(DType::Bool), n.input(1), n.input(2)); }
Tensor reciprocal(const Tensor& x) { return div(full({}, 1.0, TensorOptions(x.dtype(), x.device())), x); }
Tensor identity(const Tensor& x) { return x; }
Tensor relu_op(const Tensor& x) { return relu(x); }
Tensor pow_op(const Tensor& a, const Tensor& b) { return pow(a, b.to(a.dtype())); }
Tensor sum_axes(const Tensor& x, const std::vector<int64_t>& axes, bool keep) { return sum(x, axes, keep); }
Tensor prod_axes(const Tensor& x, const std::vector<int64_t>& axes, bool keep) { return prod(x, axes, keep); }
Tensor sum_square_axes(const Tensor& x, const std::vector<int64_t>& axes, bool keep) {
  return sum(mul(x, x), axes, keep);
}
Tensor l1_axes(const Tensor& x, const std::vector<int64_t>& axes, bool keep) { return sum(abs(x), axes, keep); }
Tensor l2_axes(const Tensor& x, const std::vector<int64_t>& axes, bool keep) {
  return sqrt(sum(mul(x, x), axes, keep)).to(x.dtype());
}
Tensor log_sum_axes(const Tensor& x, const std::vector<int64_t>& axes, bool keep) { return log(sum(x, axes, keep)); }
Tensor log_sum_exp_axes(const Tensor& x, const std::vector<int64_t>& axes, bool keep) {
  const Tensor m = reduce_max(x, axes, /*keep=*/true);
  const Tensor out = add(log(sum(exp(sub(x, m)), axes, true)), m);
  return keep ? out : squeeze_axes(out, axes);
}
Tensor mean_axes(const Tensor& x, const std::vector<int64_t>& axes, bool keep) { return mean(x, axes, keep); }

}  // namespace

const std::map<std::string, OpSpec>& op_table() {
  static const std::map<std::string, OpSpec> table = [] {
    std::map<std::string, OpSpec> t;
    t["Add"] = binary(add);
    t["Sub"] = binary(sub);
    t["Mul"] = binary(mul);
    t["Div"] = binary(div_op);
    t["Pow"] = binary(pow_op);
    t["Equal"] = binary(eq);
    t["Less"] = binary(lt);
    t["LessOrEqual"] = binary(le);
    t["Greater"] = binary(gt);
    t["GreaterOrEqual"] = binary(ge);
    t["MatMul"] = binary(matmul);
    t["Max"] = variadic(maximum);
    t["Min"] = variadic(minimum);
    t["Sum"] = variadic(add);
    t["Mean"] = variadic(add, /*mean=*/true);
    t["Neg"] = unary(neg);
    t["Abs"] = unary(abs);
    t["Sqrt"] = unary(sqrt);
    t["Exp"] = unary(exp);
    t["Log"] = unary(log);
    t["Sin"] = unary(sin);
    t["Cos"] = unary(cos);
    t["Tanh"] = unary(tanh);
    t["Sigmoid"] = unary(sigmoid);
    t["Relu"] = unary(relu_op);
    t["Reciprocal"] = unary(reciprocal);
    t["Identity"] = unary(identity);
    t["Softmax"] = softmax_op(softmax);
    t["LogSoftmax"] = softmax_op(log_softmax);
    t["Hardmax"] = softmax_op(hardmax);
    t["ReduceSum"] = reduce(sum_axes, /*axes_input_from_13=*/true);
    t["ReduceMean"] = reduce(mean_axes, false);
    t["ReduceMax"] = reduce(reduce_max, false);
    t["ReduceMin"] = reduce(reduce_min, false);
    t["ReduceProd"] = reduce(prod_axes, false);
    t["ReduceSumSquare"] = reduce(sum_square_axes, false);
    t["ReduceLogSum"] = reduce(log_sum_axes, false);
    t["ReduceL1"] = reduce(l1_axes, false);
    t["ReduceL2"] = reduce(l2_axes, false);
    t["ReduceLogSumExp"] = reduce(log_sum_exp_axes, false);
    t["Gemm"] = single_output(gemm, {"alpha", "beta", "transA", "transB"});
    t["Reshape"] = single_output(reshape, {"allowzero"});
    t["Transpose"] = single_output(transpose, {"perm"});
    t["Unsqueeze"] = single_output(unsqueeze, {"axes"});
    t["Squeeze"] = single_output(squeeze, {"axes"});
    t["Flatten"] = single_output(flatten, {"axis"});
    t["Shape"] = single_output(shape, {"start", "end"});
    t["Constant"] = single_output(constant, {"value", "value_float", "value_floats", "value_int", "value_ints"});
    t["Cast"] = single_output(cast, {"to"});
    t["Clip"] = single_output(clip, {"min", "max"});
    t["LeakyRelu"] = single_output(leaky_relu, {"alpha"});
    t["Concat"] = single_output(concat, {"axis"});
    t["Gather"] = single_output(gather_op, {"axis"});
    t["Where"] = single_output(where_op);
    t["GatherElements"] = single_output(gather_elements, {"axis"});
    t["Trilu"] = single_output(trilu, {"upper"});
    t["InstanceNormalization"] = single_output(instance_normalization, {"epsilon"});
    t["DepthToSpace"] = single_output(depth_to_space, {"blocksize", "mode"});
    t["SpaceToDepth"] = single_output(space_to_depth, {"blocksize"});
    t["Tile"] = single_output(tile);
    t["Sign"] = unary(sign);
    // Logical ops on bool tensors.
    t["Not"] = single_output([](const NodeRun& n) { return eq(n.input(0), Scalar(false)); });
    t["And"] = single_output([](const NodeRun& n) { return where(n.input(0), n.input(1), n.input(0)); });
    t["Or"] = single_output([](const NodeRun& n) { return where(n.input(0), n.input(0), n.input(1)); });
    t["Xor"] = single_output([](const NodeRun& n) { return ne(n.input(0), n.input(1)); });
    t["Softplus"] = single_output([](const NodeRun& n) { return log(add(exp(n.input(0)), 1.0)); });
    t["Softsign"] = single_output([](const NodeRun& n) { return div(n.input(0), add(abs(n.input(0)), 1.0)); });
    t["PRelu"] = single_output([](const NodeRun& n) {
      const Tensor& x = n.input(0);
      return where(lt(x, 0), mul(x, n.input(1)), x);
    });
    t["ThresholdedRelu"] = single_output(
        [](const NodeRun& n) {
          const Tensor& x = n.input(0);
          return where(gt(x, static_cast<double>(n.float_attribute("alpha", 1.0f))), x, zeros_like(x));
        },
        {"alpha"});
    t["Selu"] = single_output(
        [](const NodeRun& n) {
          const Tensor& x = n.input(0);
          const double alpha = n.float_attribute("alpha", 1.67326319217681884765625f);
          const double gamma = n.float_attribute("gamma", 1.05070102214813232421875f);
          return mul(where(gt(x, 0), x, mul(sub(exp(x), 1.0), alpha)), gamma);
        },
        {"alpha", "gamma"});
    t["HardSwish"] = single_output([](const NodeRun& n) {
      const Tensor& x = n.input(0);
      return mul(x, clamp(add(mul(x, 1.0 / 6.0), 0.5), Scalar(0.0), Scalar(1.0)));
    });
    t["Range"] = single_output(range);
    t["ConstantOfShape"] = single_output(constant_of_shape, {"value"});
    t["Expand"] = single_output(expand_op);
    t["Slice"] = single_output(slice, {"starts", "ends", "axes"});
    t["Split"] = OpSpec{split, {"axis", "split"}};
    t["LayerNormalization"] = OpSpec{layer_normalization, {"axis", "epsilon", "stash_type"}};
    t["ArgMax"] =
        single_output([](const NodeRun& n) { return arg_op(n, true); }, {"axis", "keepdims", "select_last_index"});
    t["ArgMin"] =
        single_output([](const NodeRun& n) { return arg_op(n, false); }, {"axis", "keepdims", "select_last_index"});
    t["Size"] = single_output(
        [](const NodeRun& n) { return full({}, n.input(0).numel(), TensorOptions(DType::I64, n.input(0).device())); });
    t["Elu"] = single_output(
        [](const NodeRun& n) {
          const Tensor& x = n.input(0);
          return where(gt(x, 0), x, mul(sub(exp(x), 1), static_cast<double>(n.float_attribute("alpha", 1.0f))));
        },
        {"alpha"});
    t["HardSigmoid"] = single_output(
        [](const NodeRun& n) {
          const Tensor y = add(mul(n.input(0), static_cast<double>(n.float_attribute("alpha", 0.2f))),
                               static_cast<double>(n.float_attribute("beta", 0.5f)));
          return clamp(y, Scalar(0.0), Scalar(1.0));
        },
        {"alpha", "beta"});
    t["Conv"] = single_output(conv, {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"});
    t["MaxPool"] = single_output(max_pool, {"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads",
                                            "storage_order", "strides"});
    t["AveragePool"] =
        single_output(average_pool, {"auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides"});
    t["GlobalAveragePool"] = single_output([](const NodeRun& n) {
      check_2d(n, n.input(0));
      return adaptive_avg_pool2d(n.input(0), 1);
    });
    t["BatchNormalization"] = single_output(batch_normalization, {"epsilon", "momentum", "training_mode", "spatial"});
    // Inference: the input itself (and a mask of ones when asked for).
    t["Dropout"] = OpSpec{[](const NodeRun& n) {
                            const Tensor& x = n.input(0);
                            NC_CHECK(!n.has_input(2) || scalar_input(n, 2) == 0, ValueError, n.where,
                                     ": training_mode is not supported (inference only)");
                            return Outputs{x, ones(x.shape(), TensorOptions(DType::Bool, x.device()))};
                          },
                          {"ratio", "seed"}};
    add_numeric_ops(t);
    add_loss_ops(t);
    add_indexing_ops(t);
    add_einsum_op(t);
    add_spatial_ops(t);
    return t;
  }();
  return table;
}

const std::vector<std::string>& supported_ops() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& [name, spec] : op_table()) out.push_back(name);
    return out;
  }();
  return names;
}

}  // namespace onnx
}  // namespace normcore
