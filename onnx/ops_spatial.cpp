// ONNX's Resize and ConvTranspose. Resize (opsets 11 to 17) on normcore's index_select:
// each axis is resampled on its own, its output positions mapped back to input coordinates
// on the host, then nearest neighbours picked or neighbours blended (linear mode, over every
// axis whose size or coordinates change, which is bilinear for NCHW); cubic interpolation
// and tf_crop_and_resize are refused. ConvTranspose (2-D) on conv2d.
#include <array>
#include <cmath>

#include "onnx/proto.h"

namespace normcore {
namespace onnx {

namespace {

using Outputs = std::vector<Tensor>;

std::string string_attribute(const NodeRun& n, const char* name, const char* fallback) {
  return n.attribute(name) ? n.attribute(name)->s() : fallback;
}

// The input coordinate output position x maps to along an axis of in elements resized with
// scale (sizes / in where the sizes input gives the output). Where the output length
// enters, it is in * scale before rounding down, as ONNX defines it.
double source_coordinate(const std::string& mode, double x, double scale, int64_t in) {
  const double out = static_cast<double>(in) * scale;
  if (mode == "half_pixel") return (x + 0.5) / scale - 0.5;
  if (mode == "pytorch_half_pixel") return out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
  if (mode == "align_corners") return out > 1 ? x * static_cast<double>(in - 1) / (out - 1) : 0.0;
  if (mode == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
  return x / scale;  // asymmetric
}

// The index nearest_mode picks for coordinate c, inside [0, in).
int64_t nearest_index(const std::string& mode, double c, int64_t in) {
  double i;
  if (mode == "floor") {
    i = std::floor(c);
  } else if (mode == "ceil") {
    i = std::ceil(c);
  } else {
    const double whole = std::floor(c);
    const double fraction = c - whole;
    if (fraction == 0.5) i = mode == "round_prefer_ceil" ? whole + 1 : whole;
    else i = std::round(c);  // not a tie: rounds to the nearest
  }
  return std::clamp<int64_t>(static_cast<int64_t>(i), 0, in - 1);
}

Tensor resize(const NodeRun& n) {
  const Tensor& x = n.input(0);
  NC_CHECK(n.opset >= 11, ValueError, n.where, ": Resize of opset ", n.opset,
           " is not supported (opsets 11 to 17 are)");
  const std::string mode = string_attribute(n, "mode", "nearest");
  const std::string transform = string_attribute(n, "coordinate_transformation_mode", "half_pixel");
  const std::string nearest_mode = string_attribute(n, "nearest_mode", "round_prefer_floor");
  NC_CHECK(mode == "nearest" || mode == "linear", ValueError, n.where, ": mode '", mode,
           "' is not supported (nearest and linear are)");
  NC_CHECK(transform == "half_pixel" || transform == "pytorch_half_pixel" || transform == "align_corners" ||
               transform == "asymmetric" || transform == "tf_half_pixel_for_nn",
           ValueError, n.where, ": coordinate_transformation_mode '", transform, "' is not supported");
  NC_CHECK(nearest_mode == "round_prefer_floor" || nearest_mode == "round_prefer_ceil" || nearest_mode == "floor" ||
               nearest_mode == "ceil",
           ValueError, n.where, ": nearest_mode '", nearest_mode, "' is not supported");
  NC_CHECK(n.int_attribute("exclude_outside", 0) == 0, ValueError, n.where, ": exclude_outside 1 is not supported");
  NC_CHECK(mode == "nearest" || is_floating(x.dtype()), DTypeError, n.where,
           ": linear mode needs a floating input, got ", describe(x));
  const int64_t rank = x.dim();
  const bool has_scales = n.has_input(2) && n.input(2).numel() > 0;
  const bool has_sizes = n.has_input(3) && n.input(3).numel() > 0;
  NC_CHECK(has_scales != has_sizes, ValueError, n.where, ": exactly one of scales and sizes must be given");
  std::vector<double> scales;
  std::vector<int64_t> sizes;
  if (has_scales) {
    scales = n.host_input(2).to(DType::F64).contiguous().to_vector<double>();
    NC_CHECK(static_cast<int64_t>(scales.size()) == rank, ShapeError, n.where, ": scales has ", scales.size(),
             " values for ", describe(x));
    for (double s : scales) {
      NC_CHECK(s > 0, ValueError, n.where, ": scales must be positive, got ", s);
      sizes.push_back(0);
    }
    for (int64_t d = 0; d < rank; ++d)
      sizes[d] = static_cast<int64_t>(std::floor(static_cast<double>(x.size(d)) * scales[d]));
  } else {
    sizes = n.int_values(3);
    NC_CHECK(static_cast<int64_t>(sizes.size()) == rank, ShapeError, n.where, ": sizes has ", sizes.size(),
             " values for ", describe(x));
    for (int64_t d = 0; d < rank; ++d) {
      NC_CHECK(sizes[d] >= 0, ValueError, n.where, ": sizes must not be negative, got ", sizes[d]);
      scales.push_back(static_cast<double>(sizes[d]) / static_cast<double>(x.size(d)));
    }
  }
  Tensor out = x;
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t in = x.size(d), size = sizes[d];
    NC_CHECK(in > 0 || size == 0, ShapeError, n.where, ": dim ", d, " of ", describe(x), " is empty");
    std::vector<int64_t> lower, upper;
    std::vector<double> weight;  // of upper, linear mode
    bool identity = size == in;
    for (int64_t i = 0; i < size; ++i) {
      const double c = source_coordinate(transform, static_cast<double>(i), scales[d], in);
      if (mode == "nearest") {
        lower.push_back(nearest_index(nearest_mode, c, in));
        identity = identity && lower.back() == i;
      } else {
        const double clamped = std::clamp(c, 0.0, static_cast<double>(in - 1));
        const int64_t below = static_cast<int64_t>(std::floor(clamped));
        lower.push_back(below);
        upper.push_back(std::min(below + 1, in - 1));
        weight.push_back(clamped - static_cast<double>(below));
        identity = identity && below == i && weight.back() == 0;
      }
    }
    if (identity) continue;
    const Tensor picked = index_select(out, d, index_vector(lower, x.device()));
    if (mode == "nearest") {
      out = picked;
      continue;
    }
    Shape along(static_cast<size_t>(rank), 1);
    along[static_cast<size_t>(d)] = size;
    const Tensor w = from_vector(weight, {size}).reshape(along).to(x.device(), x.dtype());
    const Tensor next = index_select(out, d, index_vector(upper, x.device()));
    out = add(picked, mul(sub(next, picked), w));  // (1 - w) lower + w upper
  }
  return out.contiguous();
}

// Two values of an ints attribute (the last two of output_shape when it has the batch and
// channel dims too).
std::array<int64_t, 2> pair_of(const NodeRun& n, const char* name, int64_t fallback) {
  const std::vector<int64_t> v = n.ints_attribute(name);
  if (v.empty()) return {fallback, fallback};
  NC_CHECK(v.size() == 2 || (v.size() == 4 && std::string(name) == "output_shape"), ValueError, n.where,
           ": attribute '", name, "' must have 2 values (2-D), got ", v.size());
  return {v[v.size() - 2], v[v.size() - 1]};
}

// ConvTranspose, 2-D, as the convolution it is the gradient of: the input spread out by
// the stride (stride - 1 zeros between neighbours), padded by dilation (k - 1) less pads
// (cropped where that is negative; output_padding more at the end), then convolved with
// stride 1 by the kernel flipped, its in and out channels swapped within each group.
Tensor conv_transpose(const NodeRun& n) {
  const Tensor &x = n.input(0), &w = n.input(1);
  const int64_t groups = n.int_attribute("group", 1);
  NC_CHECK(x.dim() == 4, ShapeError, n.where, ": 2-D (NCHW) inputs are supported, got ", describe(x));
  NC_CHECK(groups >= 1 && x.size(1) % groups == 0 && w.dim() == 4 && w.size(0) == x.size(1), ShapeError, n.where,
           ": weight must be [C_in, C_out / group, kH, kW] with C_in divisible by group ", groups, ", got ",
           describe(w), " for ", describe(x));
  const std::array<int64_t, 2> stride = pair_of(n, "strides", 1), dilation = pair_of(n, "dilations", 1),
                               extra = pair_of(n, "output_padding", 0), kernel = pair_of(n, "kernel_shape", 0);
  const int64_t k[2] = {w.size(2), w.size(3)};
  NC_CHECK(n.ints_attribute("kernel_shape").empty() || (kernel[0] == k[0] && kernel[1] == k[1]), ShapeError, n.where,
           ": kernel_shape does not match ", describe(w));
  const std::string auto_pad = n.attribute("auto_pad") ? n.attribute("auto_pad")->s() : "NOTSET";
  NC_CHECK(auto_pad == "NOTSET" || auto_pad == "VALID" || auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER",
           ValueError, n.where, ": auto_pad ", auto_pad, " is not supported");
  std::vector<int64_t> pads = n.ints_attribute("pads");
  if (pads.empty() || auto_pad == "VALID") pads.assign(4, 0);
  NC_CHECK(pads.size() == 4, ValueError, n.where, ": attribute 'pads' must have 4 values (2-D), got ", pads.size());
  const bool has_shape = !n.ints_attribute("output_shape").empty();
  const std::array<int64_t, 2> target = pair_of(n, "output_shape", 0);
  Tensor y = x;
  for (int i = 0; i < 2; ++i) {
    const int64_t d = 2 + i, in = x.size(d);
    NC_CHECK(stride[i] >= 1 && dilation[i] >= 1 && extra[i] >= 0, ValueError, n.where,
             ": strides and dilations must be positive and output_padding not negative");
    if (has_shape || auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      // The pads that give the output shape (the input's times the stride for SAME_*), half
      // each side rounded down, the rest at the end for SAME_UPPER, at the start otherwise
      // (so a negative total, an output larger than the natural one, grows it at the end
      // without SAME_UPPER).
      const int64_t want = has_shape ? target[i] : in * stride[i];
      const int64_t total = stride[i] * (in - 1) + extra[i] + (k[i] - 1) * dilation[i] + 1 - want;
      const bool upper = auto_pad == "SAME_UPPER";
      const int64_t half = total >= 0 ? total / 2 : -((1 - total) / 2);  // rounded down: -1 -> -1
      pads[i] = upper ? half : total - half;
      pads[i + 2] = upper ? total - half : half;
    }
    if (stride[i] > 1 && in > 0) {
      Shape gap = y.shape();
      gap.insert(gap.begin() + d + 1, stride[i] - 1);
      Shape merged = y.shape();
      merged[static_cast<size_t>(d)] = in * stride[i];
      y = cat({y.unsqueeze(d + 1), zeros(gap, TensorOptions(y.dtype(), y.device()))}, d + 1)
              .reshape(merged)
              .narrow(d, 0, (in - 1) * stride[i] + 1);
    }
    const int64_t reach = dilation[i] * (k[i] - 1);
    y = pad_dim(y, d, reach - pads[i], reach - pads[i + 2] + extra[i], 0.0);
  }
  const int64_t c_in = w.size(0), c_out = w.size(1) * groups;
  const Tensor flip_h = arange(k[0] - 1, -1, -1, TensorOptions(DType::I64, w.device()));
  const Tensor flip_w = arange(k[1] - 1, -1, -1, TensorOptions(DType::I64, w.device()));
  const Tensor kernel_t = index_select(index_select(w, 2, flip_h), 3, flip_w)
                              .reshape({groups, c_in / groups, w.size(1), k[0], k[1]})
                              .permute({0, 2, 1, 3, 4})
                              .reshape({c_out, c_in / groups, k[0], k[1]});
  return conv2d(y.contiguous(), kernel_t, n.has_input(2) ? n.input(2) : Tensor(), 1, 0, Size2(dilation[0], dilation[1]),
                groups);
}

}  // namespace

void add_spatial_ops(std::map<std::string, OpSpec>& table) {
  table["Resize"] = {[](const NodeRun& n) { return Outputs{resize(n)}; },
                     {"mode", "coordinate_transformation_mode", "nearest_mode", "exclude_outside", "cubic_coeff_a",
                      "extrapolation_value"}};
  table["ConvTranspose"] = {[](const NodeRun& n) { return Outputs{conv_transpose(n)}; },
                            {"auto_pad", "dilations", "group", "kernel_shape", "output_padding", "output_shape", "pads",
                             "strides"}};
}

}  // namespace onnx
}  // namespace normcore
