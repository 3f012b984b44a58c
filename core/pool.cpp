// The pooling ops of normcore/pool.h: max_pool2d, avg_pool2d, adaptive_avg_pool2d. Each
// checks its arguments with PyTorch's rules, works out the output size (PyTorch's formula,
// ceil_mode included), runs the forward kernel of x's device (kernels/pool.h) on x made
// contiguous and viewed as [N * C, H, W], and records one node whose backward is the
// matching backward kernel; max pooling's is fed the argmax indices the forward saved.
// Max pooling at inference on the CPU takes channels-last views as they lie.
#include "kernels/pool.h"
#include "autograd/graph.h"
#include "core/internal.h"
#include "normcore/pool.h"

namespace normcore {

using namespace detail;

namespace {

using kernels::Pool2dShape;
using kernels::Pool2dWindow;

void check_pair(const char* op, const char* name, Size2 v, int64_t min) {
  NC_CHECK(v.h >= min && v.w >= min, ValueError, op, ": ", name, " must be >= ", min, ", got (", v.h, ", ", v.w, ")");
}

// x defined, floating, [N, C, H, W] or [C, H, W] with H and W non-zero. N may be 0; C may be
// 0 only where empty_channels says so (PyTorch's adaptive pooling allows it, max and average
// pooling do not).
void check_input(const char* op, const Tensor& x, bool empty_channels = false) {
  check_defined(op, "x", x);
  NC_CHECK(is_floating(x.dtype()), DTypeError, op, ": x must be a floating tensor, got ", describe(x),
           " (convert with .to(DType::F32))");
  NC_CHECK(x.dim() == 3 || x.dim() == 4, ShapeError, op, ": x must be [N, C, H, W] or [C, H, W], got ", describe(x));
  NC_CHECK(x.size(-2) > 0 && x.size(-1) > 0, ShapeError, op, ": x must have non-zero H and W, got ", describe(x));
  NC_CHECK(empty_channels || x.size(-3) > 0, ShapeError, op,
           ": x must have a non-zero channel count C (only the batch N may be 0), got ", describe(x));
}

// kernel_size, stride (kernel_size when not given), padding and dilation checked and
// packed; padding at most half the kernel, as in PyTorch.
Pool2dWindow checked_window(const char* op, Size2 kernel_size, Size2 stride, Size2 padding, Size2 dilation) {
  check_pair(op, "kernel_size", kernel_size, 1);
  if (stride.given()) check_pair(op, "stride", stride, 1);
  check_pair(op, "padding", padding, 0);
  check_pair(op, "dilation", dilation, 1);
  NC_CHECK(padding.h <= kernel_size.h / 2 && padding.w <= kernel_size.w / 2, ValueError, op, ": padding (", padding.h,
           ", ", padding.w, ") must be at most half of kernel_size (", kernel_size.h, ", ", kernel_size.w, ")");
  // The kernels' index math stays inside int64 when a window spans at most 2^59 elements.
  const __int128 extent_h = static_cast<__int128>(kernel_size.h - 1) * dilation.h + 1;
  const __int128 extent_w = static_cast<__int128>(kernel_size.w - 1) * dilation.w + 1;
  NC_CHECK(extent_h <= kMaxSpan && extent_w <= kMaxSpan, ValueError, op, ": kernel_size (", kernel_size.h, ", ",
           kernel_size.w, ") with dilation (", dilation.h, ", ", dilation.w, ") spans more than 2^59 elements");
  const Size2 step = stride.given() ? stride : kernel_size;
  return {kernel_size.h, kernel_size.w, step.h, step.w, padding.h, padding.w, dilation.h, dilation.w};
}

// PyTorch's pooling_output_shape: floor((size + 2 pad - extent) / stride) + 1, rounded up
// with ceil_mode, but the last window must start inside the input or the left padding.
int64_t pooled_size(int64_t size, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation, bool ceil_mode) {
  const __int128 extent = static_cast<__int128>(kernel - 1) * dilation + 1;
  const __int128 span = static_cast<__int128>(size) + 2 * pad - extent + (ceil_mode ? stride - 1 : 0);
  __int128 out = span / stride - (span % stride != 0 && span < 0 ? 1 : 0) + 1;
  if (ceil_mode && (out - 1) * stride >= static_cast<__int128>(size) + pad) --out;
  return static_cast<int64_t>(out);
}

Pool2dShape pooled_shape(const char* op, const Tensor& x, const Pool2dWindow& w, bool ceil_mode) {
  Pool2dShape s;
  s.planes = x.dim() == 4 ? x.size(0) * x.size(1) : x.size(0);
  s.in_h = x.size(-2);
  s.in_w = x.size(-1);
  s.out_h = pooled_size(s.in_h, w.kernel_h, w.stride_h, w.pad_h, w.dilation_h, ceil_mode);
  s.out_w = pooled_size(s.in_w, w.kernel_w, w.stride_w, w.pad_w, w.dilation_w, ceil_mode);
  NC_CHECK(s.out_h >= 1 && s.out_w >= 1, ShapeError, op, ": the output would be ", s.out_h, " x ", s.out_w, ": x ",
           describe(x), " is too small for kernel_size (", w.kernel_h, ", ", w.kernel_w, "), stride (", w.stride_h,
           ", ", w.stride_w, "), padding (", w.pad_h, ", ", w.pad_w, "), dilation (", w.dilation_h, ", ", w.dilation_w,
           ")");
  return s;
}

// x's shape with H and W replaced by the output's.
Shape output_shape(const Tensor& x, const Pool2dShape& s) {
  Shape shape = x.shape();
  shape[shape.size() - 2] = s.out_h;
  shape[shape.size() - 1] = s.out_w;
  return shape;
}

Tensor contiguous_input(const Tensor& x) {
  autograd::NoGradGuard no_grad;  // the copy is private to this op; its node covers it
  return x.contiguous();
}

// The gradient as a contiguous tensor of dtype.
Tensor grad_as(const Tensor& grad, DType dtype) { return grad.to(dtype).contiguous(); }

}  // namespace

Tensor max_pool2d(const Tensor& x, Size2 kernel_size, Size2 stride, Size2 padding, Size2 dilation, bool ceil_mode) {
  const OpScope op("max_pool2d");
  check_input(op, x);
  const Pool2dWindow window = checked_window(op, kernel_size, stride, padding, dilation);
  const Pool2dShape shape = pooled_shape(op, x, window, ceil_mode);
  const bool grad = autograd::needs_grad(x);
  const Device device = x.device();
  // An NCHW view of channels-last memory (x.permute({0, 2, 3, 1}) contiguous: NHWC
  // activations) pooled for inference on the CPU stays channels last, as PyTorch keeps a
  // channels_last tensor's memory format: the output is the same kind of view, and x is not
  // copied to NCHW first.
  if (!grad && device.is_cpu() && x.dim() == 4 && !x.is_contiguous() && x.permute({0, 2, 3, 1}).is_contiguous()) {
    Pool2dShape nhwc = shape;
    nhwc.channels = x.size(1);
    Tensor out = new_tensor({x.size(0), shape.out_h, shape.out_w, x.size(1)}, x.dtype(), device);
    if (out.numel() > 0) kernels::pool(device).max_pool2d_forward(x.permute({0, 2, 3, 1}), nhwc, window, out, Tensor());
    return out.permute({0, 3, 1, 2});
  }
  Tensor out = new_tensor(output_shape(x, shape), x.dtype(), device);
  // The argmax of each window, kept for the backward only.
  Tensor indices = grad ? new_tensor(out.shape(), DType::I64, device) : Tensor();
  if (out.numel() > 0) kernels::pool(device).max_pool2d_forward(contiguous_input(x), shape, window, out, indices);
  if (!grad) return out;
  autograd::record(op, out, {x}, [indices, shape, window, x_shape = x.shape(), dtype = x.dtype()](const Tensor& g) {
    Tensor grad_x = new_tensor(x_shape, dtype, g.device());
    if (grad_x.numel() > 0) {
      kernels::pool(g.device()).max_pool2d_backward(grad_as(g, dtype), indices, shape, window, grad_x);
    }
    return std::vector<Tensor>{grad_x};
  });
  return out;
}

Tensor avg_pool2d(const Tensor& x, Size2 kernel_size, Size2 stride, Size2 padding, bool ceil_mode,
                  bool count_include_pad) {
  const OpScope op("avg_pool2d");
  check_input(op, x);
  const Pool2dWindow window = checked_window(op, kernel_size, stride, padding, 1);
  const Pool2dShape shape = pooled_shape(op, x, window, ceil_mode);
  const Device device = x.device();
  Tensor out = new_tensor(output_shape(x, shape), x.dtype(), device);
  if (out.numel() > 0) {
    kernels::pool(device).avg_pool2d_forward(contiguous_input(x), shape, window, count_include_pad, out);
  }
  if (!autograd::needs_grad(x)) return out;
  autograd::record(
      op, out, {x}, [shape, window, count_include_pad, x_shape = x.shape(), dtype = x.dtype()](const Tensor& g) {
        Tensor grad_x = new_tensor(x_shape, dtype, g.device());
        if (grad_x.numel() > 0) {
          kernels::pool(g.device()).avg_pool2d_backward(grad_as(g, dtype), shape, window, count_include_pad, grad_x);
        }
        return std::vector<Tensor>{grad_x};
      });
  return out;
}

Tensor adaptive_avg_pool2d(const Tensor& x, Size2 output_size) {
  const OpScope op("adaptive_avg_pool2d");
  check_input(op, x, /*empty_channels=*/true);
  check_pair(op, "output_size", output_size, 1);
  Pool2dShape shape;
  shape.planes = x.dim() == 4 ? x.size(0) * x.size(1) : x.size(0);
  shape.in_h = x.size(-2);
  shape.in_w = x.size(-1);
  shape.out_h = output_size.h;
  shape.out_w = output_size.w;
  checked_numel(output_shape(x, shape), op);
  const Device device = x.device();
  Tensor out = new_tensor(output_shape(x, shape), x.dtype(), device);
  if (out.numel() > 0) kernels::pool(device).adaptive_avg_pool2d_forward(contiguous_input(x), shape, out);
  if (!autograd::needs_grad(x)) return out;
  autograd::record(op, out, {x}, [shape, x_shape = x.shape(), dtype = x.dtype()](const Tensor& g) {
    Tensor grad_x = new_tensor(x_shape, dtype, g.device());
    if (grad_x.numel() > 0) kernels::pool(g.device()).adaptive_avg_pool2d_backward(grad_as(g, dtype), shape, grad_x);
    return std::vector<Tensor>{grad_x};
  });
  return out;
}

}  // namespace normcore
