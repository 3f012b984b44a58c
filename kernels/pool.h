// 2-D pooling over planes: max_pool2d, avg_pool2d, adaptive_avg_pool2d (core/pool.cpp checks
// the arguments, works out the output size and ties these to autograd). Every tensor is
// contiguous and viewed as [planes, H, W] (planes = N * C); x, out and the gradients share
// one floating dtype, max pooling's indices are i64. Outputs and gradients are written (=).
// The window rules below (PyTorch's) are shared by both backends.
#pragma once

#include <cstdint>

#include "base/host_device.h"
#include "kernels/backend.h"
#include "kernels/scalar/math.h"

namespace normcore {
namespace kernels {

// Input [planes, in_h, in_w] -> output [planes, out_h, out_w]. With channels > 0 both are
// channels last instead, [planes / channels, in_h, in_w, channels] -> [planes / channels,
// out_h, out_w, channels]: only max_pool2d_forward without indices on the CPU takes that
// (inference on NHWC activations, core/pool.cpp).
struct Pool2dShape {
  int64_t planes = 0;
  int64_t in_h = 0, in_w = 0;
  int64_t out_h = 0, out_w = 0;
  int64_t channels = 0;
};

// Window (oh, ow) reads rows oh * stride_h - pad_h + i * dilation_h for i < kernel_h (and
// columns likewise); rows and columns outside the input are padding. core guarantees that
// every window starts before the input's end and that the window's extent fits far inside
// int64.
struct Pool2dWindow {
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
};

// Whether v replaces a max window's running maximum best (PyTorch's rule): it is greater, or
// NaN. Ties keep the first element in row-major window order; a later NaN replaces a NaN.
template <class C>
NC_HOST_DEVICE bool max_pool_takes(C v, C best) {
  return v > best || math::is_nan(v);
}

// The first tap i of a dilated window starting at start that lands at or after 0.
NC_HOST_DEVICE int64_t first_tap(int64_t start, int64_t dilation) {
  return start < 0 ? (-start + dilation - 1) / dilation : 0;
}

// The input rows [begin, end) one average-pooling window reads, and its divisor.
struct AvgSpan {
  int64_t begin, end, count;
};

// Along one dim: window o starts at o * stride - pad; with count_include_pad the divisor
// counts the window clipped to the padded input (end at most size + pad, computed before
// clipping to the input), else the input elements in it.
NC_HOST_DEVICE AvgSpan avg_span(int64_t o, int64_t size, int64_t kernel, int64_t stride, int64_t pad,
                                bool count_include_pad) {
  int64_t begin = o * stride - pad;
  int64_t end = begin + kernel < size + pad ? begin + kernel : size + pad;
  const int64_t padded = end - begin;
  begin = begin > 0 ? begin : 0;
  end = end < size ? end : size;
  return {begin, end, count_include_pad ? padded : end - begin};
}

// Adaptive bin o of out bins over size input elements: [floor(o size / out),
// ceil((o + 1) size / out)). Bins cover every element; neighbours may share one.
NC_HOST_DEVICE int64_t adaptive_begin(int64_t o, int64_t out, int64_t size) { return o * size / out; }
NC_HOST_DEVICE int64_t adaptive_end(int64_t o, int64_t out, int64_t size) { return ((o + 1) * size + out - 1) / out; }

class PoolKernels {
 public:
  // out[p, oh, ow] = the maximum of x over window (oh, ow): its input elements in row-major
  // window order, the first one starting the maximum and each later one replacing it when
  // max_pool_takes (so a NaN wins). indices[p, oh, ow] = h * in_w + w of that element; a
  // window of padding only gives -infinity and index -1. indices may be undefined (not
  // written).
  virtual void max_pool2d_forward(const Tensor& x, const Pool2dShape& shape, const Pool2dWindow& window,
                                  const Tensor& out, const Tensor& indices) const = 0;
  // grad_x[p, h, w] = sum of grad_out[p, oh, ow] over the windows whose index is h * in_w + w.
  virtual void max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Pool2dShape& shape,
                                   const Pool2dWindow& window, const Tensor& grad_x) const = 0;
  // out[p, oh, ow] = the sum of x over avg_span(oh) x avg_span(ow) divided by the product
  // of their counts (0 for a window without input elements). window.dilation is 1.
  virtual void avg_pool2d_forward(const Tensor& x, const Pool2dShape& shape, const Pool2dWindow& window,
                                  bool count_include_pad, const Tensor& out) const = 0;
  // grad_x[p, h, w] = sum of grad_out[p, oh, ow] / divisor over the windows reading (h, w).
  virtual void avg_pool2d_backward(const Tensor& grad_out, const Pool2dShape& shape, const Pool2dWindow& window,
                                   bool count_include_pad, const Tensor& grad_x) const = 0;
  // out[p, oh, ow] = the mean of x over adaptive bin oh (rows) x ow (columns).
  virtual void adaptive_avg_pool2d_forward(const Tensor& x, const Pool2dShape& shape, const Tensor& out) const = 0;
  // grad_x[p, h, w] = sum of grad_out[p, oh, ow] / bin size over the bins holding (h, w).
  virtual void adaptive_avg_pool2d_backward(const Tensor& grad_out, const Pool2dShape& shape,
                                            const Tensor& grad_x) const = 0;

 protected:
  ~PoolKernels() = default;
};

}  // namespace kernels

namespace cpu {
const kernels::PoolKernels& pool_kernels();
}
namespace cuda {
const kernels::PoolKernels& pool_kernels();
}

namespace kernels {
inline const PoolKernels& pool(Device device) {
  return for_device(device, cpu::pool_kernels, NC_CUDA_KERNELS(pool_kernels), "pool");
}
}  // namespace kernels

}  // namespace normcore
