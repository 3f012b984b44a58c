// Pooling layers: each holds its hyper-parameters, checked when the layer is made, and calls
// the functional op of normcore/pool.h, which checks the input and records the backward.
#include "normcore/pool.h"
#include "normcore/nn.h"

namespace normcore {
namespace nn {

namespace {

Size2 checked_pair(const char* layer, const char* name, Size2 v, int64_t min) {
  NC_CHECK(v.h >= min && v.w >= min, ValueError, layer, ": ", name, " must be >= ", min, ", got (", v.h, ", ", v.w,
           ")");
  return v;
}

// stride, or kernel_size when stride is not given.
Size2 checked_stride(const char* layer, Size2 stride, Size2 kernel_size) {
  return stride.given() ? checked_pair(layer, "stride", stride, 1) : kernel_size;
}

// padding at most half of kernel_size, as the functional ops require.
Size2 checked_padding(const char* layer, Size2 padding, Size2 kernel_size) {
  checked_pair(layer, "padding", padding, 0);
  NC_CHECK(padding.h <= kernel_size.h / 2 && padding.w <= kernel_size.w / 2, ValueError, layer, ": padding (",
           padding.h, ", ", padding.w, ") must be at most half of kernel_size (", kernel_size.h, ", ", kernel_size.w,
           ")");
  return padding;
}

}  // namespace

MaxPool2d::MaxPool2d(Size2 kernel_size_, Size2 stride_, Size2 padding_, Size2 dilation_, bool ceil_mode_)
    : kernel_size(checked_pair("MaxPool2d", "kernel_size", kernel_size_, 1)),
      stride(checked_stride("MaxPool2d", stride_, kernel_size_)),
      padding(checked_padding("MaxPool2d", padding_, kernel_size_)),
      dilation(checked_pair("MaxPool2d", "dilation", dilation_, 1)), ceil_mode(ceil_mode_) {}

Tensor MaxPool2d::forward(const Tensor& x) {
  NC_CHECK(x.defined(), ValueError, "MaxPool2d: input is an undefined tensor");
  return max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode);
}

AvgPool2d::AvgPool2d(Size2 kernel_size_, Size2 stride_, Size2 padding_, bool ceil_mode_, bool count_include_pad_)
    : kernel_size(checked_pair("AvgPool2d", "kernel_size", kernel_size_, 1)),
      stride(checked_stride("AvgPool2d", stride_, kernel_size_)),
      padding(checked_padding("AvgPool2d", padding_, kernel_size_)), ceil_mode(ceil_mode_),
      count_include_pad(count_include_pad_) {}

Tensor AvgPool2d::forward(const Tensor& x) {
  NC_CHECK(x.defined(), ValueError, "AvgPool2d: input is an undefined tensor");
  return avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad);
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Size2 output_size_)
    : output_size(checked_pair("AdaptiveAvgPool2d", "output_size", output_size_, 1)) {}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) {
  NC_CHECK(x.defined(), ValueError, "AdaptiveAvgPool2d: input is an undefined tensor");
  return adaptive_avg_pool2d(x, output_size);
}

}  // namespace nn
}  // namespace normcore
