// conv2d (normcore/conv.h): checks every argument, runs the forward kernel of x's device
// (kernels/conv.h: im2col + GEMM on the CPU, cuDNN on CUDA) and records one node whose
// backward runs the data and weight kernels for the inputs that need them; the bias
// gradient is grad_y summed over N, H and W. conv2d_fused, for inference, runs the same
// forward kernel with its epilogue (residual, ReLU) and in either layout, and records nothing.
#include "normcore/conv.h"

#include <atomic>
#include <string>

#include "autograd/graph.h"
#include "core/conv_panels.h"
#include "core/internal.h"
#include "kernels/conv.h"
#include "normcore/autocast.h"
#include "normcore/cuda.h"
#include "normcore/ops.h"

namespace normcore {

using namespace detail;

namespace {

// Whether cuDNN times its algorithms (cuda::set_cudnn_benchmark).
std::atomic<bool> g_cudnn_benchmark{false};

// kernels::last_conv_algorithm, per direction.
thread_local const std::string* t_conv_algorithm[3] = {nullptr, nullptr, nullptr};

void check_pair(const char* op, const char* name, Size2 v, int64_t min) {
  NC_CHECK(v.h >= min && v.w >= min, ValueError, op, ": ", name, " must be >= ", min, ", got (", v.h, ", ", v.w, ")");
}

// One output extent; < 1 is an error naming the input and the hyper-parameters.
int64_t output_extent(const char* op, const char* dim, int64_t in, int64_t kernel, int64_t stride, int64_t pad,
                      int64_t dilation, const Tensor& x, const Tensor& weight) {
  const int64_t span = dilation * (kernel - 1) + 1;
  const int64_t out = in + 2 * pad >= span ? (in + 2 * pad - span) / stride + 1 : 0;
  NC_CHECK(out >= 1, ShapeError, op, ": the ", dim, " of the padded input (", in, " + 2 * ", pad,
           ") is smaller than the dilated kernel (", span, "): x is ", describe(x), ", weight is ", describe(weight));
  return out;
}

}  // namespace

const char* kernels::conv_direction_name(ConvDirection d) {
  switch (d) {
    case ConvDirection::Forward: return "forward";
    case ConvDirection::BackwardData: return "backward data";
    case ConvDirection::BackwardFilter: return "backward filter";
  }
  return "";
}

void kernels::record_conv_algorithm(ConvDirection d, const std::string* what) {
  t_conv_algorithm[static_cast<int>(d)] = what;
}

std::string kernels::last_conv_algorithm(ConvDirection d) {
  const std::string* what = t_conv_algorithm[static_cast<int>(d)];
  return what != nullptr ? *what : std::string();
}

void cuda::set_cudnn_benchmark(bool benchmark) { g_cudnn_benchmark.store(benchmark); }

bool cuda::cudnn_benchmark() { return g_cudnn_benchmark.load(); }

namespace {

// Checks the arguments of a convolution (x batched or not, in layout) and returns its
// geometry, the batch dim added to an unbatched x in *x4.
kernels::Conv2dGeometry checked_geometry(const char* op, const Tensor& x_in, const Tensor& weight, const Tensor& bias,
                                         Size2 stride, Size2 padding, Size2 dilation, int64_t groups, ConvLayout layout,
                                         Tensor* x4) {
  const bool nhwc = layout == ConvLayout::NHWC;
  check_defined(op, "x", x_in);
  check_defined(op, "weight", weight);
  NC_CHECK(is_floating(x_in.dtype()), DTypeError, op, ": x must be a floating tensor, got ", describe(x_in),
           " (convert with .to(DType::F32))");
  NC_CHECK(x_in.dim() == 3 || x_in.dim() == 4, ShapeError, op, ": x must be ",
           nhwc ? "[N, H, W, C] or [H, W, C]" : "[N, C, H, W] or [C, H, W]", ", got ", describe(x_in));
  NC_CHECK(weight.dim() == 4, ShapeError, op, ": weight must be ",
           nhwc ? "[out_channels, kh, kw, in_channels / groups]" : "[out_channels, in_channels / groups, kh, kw]",
           ", got ", describe(weight));
  NC_CHECK(weight.dtype() == x_in.dtype(), DTypeError, op, ": weight is ", describe(weight), " but x is ",
           describe(x_in), " (they must share a dtype)");
  check_same_device(op, "x", x_in, "weight", weight);
  check_pair(op, "stride", stride, 1);
  check_pair(op, "padding", padding, 0);
  check_pair(op, "dilation", dilation, 1);
  NC_CHECK(groups >= 1, ValueError, op, ": groups must be >= 1, got ", groups);

  const Tensor x = x_in.dim() == 4 ? x_in : x_in.unsqueeze(0);
  *x4 = x;
  kernels::Conv2dGeometry g{};
  g.channels_last = nhwc;
  g.n = x.size(0);
  g.c = x.size(nhwc ? 3 : 1), g.h = x.size(nhwc ? 1 : 2), g.w = x.size(nhwc ? 2 : 3);
  g.o = weight.size(0), g.kh = weight.size(nhwc ? 1 : 2), g.kw = weight.size(nhwc ? 2 : 3);
  const int64_t weight_channels = weight.size(nhwc ? 3 : 1);
  g.stride_h = stride.h, g.stride_w = stride.w, g.pad_h = padding.h, g.pad_w = padding.w;
  g.dilation_h = dilation.h, g.dilation_w = dilation.w, g.groups = groups;
  NC_CHECK(g.c % groups == 0 && g.o % groups == 0, ShapeError, op, ": in_channels (", g.c, ", from x ", describe(x_in),
           ") and out_channels (", g.o, ", from weight ", describe(weight), ") must be divisible by groups = ", groups);
  NC_CHECK(weight_channels * groups == g.c, ShapeError, op, ": weight ", describe(weight),
           " must have in_channels / groups = ", g.c / groups, " in dim ", nhwc ? 3 : 1, " (x is ", describe(x_in),
           ", groups ", groups, ")");
  NC_CHECK(g.o >= 1 && g.kh >= 1 && g.kw >= 1, ShapeError, op, ": weight must have non-zero sizes, got ",
           describe(weight));
  NC_CHECK(g.c >= 1, ShapeError, op, ": x must have at least one channel, got ", describe(x_in));
  if (bias.defined()) {
    NC_CHECK(bias.dim() == 1 && bias.size(0) == g.o, ShapeError, op, ": bias must be [", g.o,
             "] (out_channels from weight ", describe(weight), "), got ", describe(bias));
    NC_CHECK(bias.dtype() == x_in.dtype(), DTypeError, op, ": bias is ", describe(bias), " but x is ", describe(x_in),
             " (they must share a dtype)");
    check_same_device(op, "x", x_in, "bias", bias);
  }
  g.out_h = output_extent(op, "height", g.h, g.kh, g.stride_h, g.pad_h, g.dilation_h, x_in, weight);
  g.out_w = output_extent(op, "width", g.w, g.kw, g.stride_w, g.pad_w, g.dilation_w, x_in, weight);
  return g;
}

}  // namespace

Tensor conv2d(const Tensor& x_arg, const Tensor& weight_arg, const Tensor& bias_arg, Size2 stride, Size2 padding,
              Size2 dilation, int64_t groups) {
  const OpScope op("conv2d");
  const Tensor x_in = autocast::to_lower(x_arg), weight = autocast::to_lower(weight_arg);
  const Tensor bias = autocast::to_lower(bias_arg);
  Tensor x;
  const kernels::Conv2dGeometry g =
      checked_geometry(op, x_in, weight, bias, stride, padding, dilation, groups, ConvLayout::NCHW, &x);
  const bool batched = x_in.dim() == 4;

  Tensor xc, wc, bc;
  {
    autograd::NoGradGuard no_grad;  // the copies are private to this op; its node covers them
    xc = x.contiguous();
    wc = weight.contiguous();
    bc = bias.defined() ? bias.contiguous() : bias;
  }
  const Device device = x.device();
  Tensor y = new_tensor({g.n, g.o, g.out_h, g.out_w}, x.dtype(), device);
  if (g.n > 0) kernels::conv(device).conv2d_forward(g, xc, wc, kernels::ConvEpilogue{bc, Tensor(), false}, y);
  if (!batched) y = y.squeeze(0);
  if (!autograd::needs_grad(x_in, weight, bias)) return y;

  const bool need_x = x_in.requires_grad(), need_w = weight.requires_grad();
  const bool has_bias = bias.defined() && bias.requires_grad();
  autograd::record(op, y, {x_in, weight, bias},
                   [xs = need_w ? autograd::saved(xc) : autograd::saved(Tensor()),
                    ws = need_x ? autograd::saved(wc) : autograd::saved(Tensor()), g, batched, need_x, need_w,
                    has_bias](const Tensor& grad) {
                     const Tensor& x = xs.get();
                     const Tensor& w = ws.get();
                     const DType dtype = need_w ? x.dtype() : w.dtype();
                     Tensor gy = grad.to(dtype).contiguous();
                     if (!batched) gy = gy.unsqueeze(0);
                     const Device device = gy.device();
                     Tensor grad_x, grad_w, grad_b;
                     if (need_x) {
                       grad_x = new_tensor({g.n, g.c, g.h, g.w}, dtype, device);
                       if (g.n > 0) kernels::conv(device).conv2d_backward_data(g, gy, w, grad_x);
                       if (!batched) grad_x = grad_x.squeeze(0);
                     }
                     if (need_w) {
                       grad_w = new_tensor({g.o, g.c / g.groups, g.kh, g.kw}, dtype, device);
                       if (g.n > 0) {
                         kernels::conv(device).conv2d_backward_weight(g, gy, x, grad_w);
                       } else {
                         grad_w.zero_();
                       }
                     }
                     if (has_bias) grad_b = sum(gy, {0, 2, 3});
                     return std::vector<Tensor>{grad_x, grad_w, grad_b};
                   });
  return y;
}

namespace {

// conv2d_fused, reading the weight from panels (conv_weight_panels(weight)) where the CPU's
// direct kernel runs it.
Tensor conv2d_fused_impl(const Tensor& x_arg, const Tensor& weight_arg, const Tensor* panels, const Tensor& bias_arg,
                         const Tensor& residual_arg, bool relu, Size2 stride, Size2 padding, Size2 dilation,
                         int64_t groups, ConvLayout layout) {
  const OpScope op("conv2d_fused");
  const Tensor x_in = autocast::to_lower(x_arg), weight = autocast::to_lower(weight_arg);
  const Tensor bias = autocast::to_lower(bias_arg), residual = autocast::to_lower(residual_arg);
  Tensor x;
  kernels::Conv2dGeometry g = checked_geometry(op, x_in, weight, bias, stride, padding, dilation, groups, layout, &x);
  const bool batched = x_in.dim() == 4;
  const Shape y_shape =
      layout == ConvLayout::NHWC ? Shape{g.n, g.out_h, g.out_w, g.o} : Shape{g.n, g.o, g.out_h, g.out_w};
  Tensor r;
  if (residual.defined()) {
    r = batched ? residual : residual.unsqueeze(0);
    NC_CHECK(r.shape() == y_shape, ShapeError, op, ": residual must have the output's shape ", shape_str(y_shape),
             ", got ", describe(residual), " (x ", describe(x_in), ", weight ", describe(weight), ")");
    NC_CHECK(r.dtype() == x_in.dtype(), DTypeError, op, ": residual is ", describe(residual), " but x is ",
             describe(x_in), " (they must share a dtype)");
    check_same_device(op, "x", x_in, "residual", residual);
  }
  NC_CHECK(!autograd::needs_grad(x_in, weight, bias, residual), ValueError, op,
           ": has no backward (it is for inference); train with conv2d, add and relu, or run it ",
           "under NoGradGuard or InferenceModeGuard");
  const Device device = x.device();
  // NHWC operands as the device's kernel takes them (kernels::NhwcForward): the weight
  // [kh, kw, c, o] for the CPU's direct kernel (no copy where it lies so in memory: a permuted
  // view of such a tensor), or everything converted to NCHW and the result back.
  const kernels::NhwcForward how =
      g.channels_last ? kernels::conv(device).nhwc_forward(g, x.dtype()) : kernels::NhwcForward::WeightOhwi;
  const bool convert = how == kernels::NhwcForward::Convert;
  const auto nchw = [&](const Tensor& t) { return t.defined() ? t.permute({0, 3, 1, 2}).contiguous() : t; };
  const Tensor xc = convert ? nchw(x) : x.contiguous();
  g.weight_panels = panels != nullptr && how == kernels::NhwcForward::WeightHwio;
  if (g.weight_panels) {
    const Shape want{(g.o + 63) / 64, g.kh, g.kw, g.c, 64};
    NC_CHECK(panels->shape() == want && panels->dtype() == x.dtype() && panels->device() == device &&
                 panels->is_contiguous(),
             ShapeError, op, ": weight panels must be conv_weight_panels(weight), [", (g.o + 63) / 64, ", ", g.kh, ", ",
             g.kw, ", ", g.c, ", 64] contiguous, got ", describe(*panels), " for weight ", describe(weight));
  }
  const Tensor wc = g.weight_panels                           ? *panels
                    : convert                                 ? nchw(weight)
                    : how == kernels::NhwcForward::WeightHwio ? weight.permute({1, 2, 3, 0}).contiguous()
                                                              : weight.contiguous();
  const Tensor rc = convert ? nchw(r) : (r.defined() ? r.contiguous() : r);
  const Tensor bc = bias.defined() ? bias.contiguous() : bias;
  if (convert) g.channels_last = false;
  Tensor y = new_tensor(convert ? Shape{g.n, g.o, g.out_h, g.out_w} : y_shape, x.dtype(), device);
  if (g.n > 0) kernels::conv(device).conv2d_forward(g, xc, wc, kernels::ConvEpilogue{bc, rc, relu}, y);
  if (convert) y = y.permute({0, 2, 3, 1}).contiguous();
  return batched ? y : y.squeeze(0);
}

}  // namespace

Tensor conv2d_fused(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& residual, bool relu,
                    Size2 stride, Size2 padding, Size2 dilation, int64_t groups, ConvLayout layout) {
  return conv2d_fused_impl(x, weight, nullptr, bias, residual, relu, stride, padding, dilation, groups, layout);
}

Tensor detail::conv_weight_panels(const Tensor& weight) {
  const OpScope op("conv_weight_panels");
  check_defined(op, "weight", weight);
  NC_CHECK(weight.dim() == 4, ShapeError, op, ": weight must be [out_channels, kh, kw, in_channels], got ",
           describe(weight));
  autograd::NoGradGuard no_grad;
  const int64_t o = weight.size(0), panels = (o + 63) / 64;
  Tensor padded = weight;
  if (panels * 64 != o) {
    padded = cat({weight, zeros({panels * 64 - o, weight.size(1), weight.size(2), weight.size(3)},
                                TensorOptions(weight.dtype(), weight.device()))},
                 0);
  }
  return padded.reshape({panels, 64, weight.size(1), weight.size(2), weight.size(3)})
      .permute({0, 2, 3, 4, 1})
      .contiguous();
}

Tensor detail::conv2d_nhwc_panels(const Tensor& x, const Tensor& weight, const Tensor& panels, const Tensor& bias,
                                  const Tensor& residual, bool relu, Size2 stride, Size2 padding, Size2 dilation) {
  return conv2d_fused_impl(x, weight, &panels, bias, residual, relu, stride, padding, dilation, 1, ConvLayout::NHWC);
}

}  // namespace normcore
