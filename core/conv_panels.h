// Convolution weights in panels of 64 output channels for the CPU's direct NHWC kernel
// (kernels/cpu/conv_nhwc.h): made once per model (the ONNX importer keeps them per
// initializer), then each 64-channel tile's rows lie one after another instead of 64 floats
// at a stride of out_channels, which the kernel reads a quarter faster where the weight comes
// from memory (ResNet-50's last stages at batch 1).
#pragma once

#include "normcore/conv.h"

namespace normcore {
namespace detail {

// weight [O, kh, kw, C] (NHWC's) as [ceil(O / 64), kh, kw, C, 64], zeros past O.
Tensor conv_weight_panels(const Tensor& weight);

// conv2d_fused(x, weight, bias, residual, relu, stride, padding, dilation, 1, NHWC), reading
// the weight from panels = conv_weight_panels(weight) where the CPU's direct kernel runs it
// (weight, whose memory is then not read, still gives the shapes and checks); elsewhere the
// same as conv2d_fused. A ShapeError when panels is not of weight's shape.
Tensor conv2d_nhwc_panels(const Tensor& x, const Tensor& weight, const Tensor& panels, const Tensor& bias,
                          const Tensor& residual, bool relu, Size2 stride, Size2 padding, Size2 dilation);

}  // namespace detail
}  // namespace normcore
