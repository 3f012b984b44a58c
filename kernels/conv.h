// 2-D convolution kernels (normcore/conv.h; core/conv.cpp checks the arguments and records
// the backward). Every tensor contiguous, NCHW (or NHWC where the geometry says so) and of
// one floating dtype; outputs are written (=). The CPU runs im2col and Eigen's GEMM (the reference); CUDA runs cuDNN, with its
// algorithms picked once per geometry and cached. The bias gradient is a plain sum (core).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/backend.h"

namespace normcore {
namespace kernels {

// One convolution's geometry: x [n, c, h, w], weight [o, c / groups, kh, kw],
// y [n, o, out_h, out_w]; with channels_last the same tensors are laid out as x [n, h, w, c],
// weight [o, kh, kw, c / groups] and y [n, out_h, out_w, o] (NHWC, the forward direction only;
// the CPU takes the weight [kh, kw, c, o], see NhwcForward).
struct Conv2dGeometry {
  int64_t n, c, h, w;
  int64_t o, kh, kw;
  int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
  int64_t groups;
  int64_t out_h, out_w;
  bool channels_last = false;
  // With channels_last on the CPU's direct kernel (NhwcForward::WeightHwio): the weight is in
  // panels of 64 output channels, [ceil(o / 64), kh, kw, c, 64] with zeros past o, each
  // tile's rows one after another (core/conv_panels.h makes them once per model).
  bool weight_panels = false;
};

// What the forward direction adds to the convolution before writing y:
// y = relu?(conv(x, weight) + bias + residual), in f32 for f16/bf16 on the CPU.
struct ConvEpilogue {
  Tensor bias;      // [o], or undefined
  Tensor residual;  // y's shape and layout, or undefined
  bool relu = false;
};

// How a device's forward kernel takes NHWC operands: with the weight [o, kh, kw, c / groups]
// (CUDA), with the weight [kh, kw, c, o] (the CPU's direct kernel: f32, one group, AVX-512),
// or not at all (the op converts x, the weight and the residual to NCHW and y back).
enum class NhwcForward { WeightOhwi, WeightHwio, Convert };

enum class ConvDirection { Forward, BackwardData, BackwardFilter };

const char* conv_direction_name(ConvDirection d);

// Which cuDNN algorithm the last CUDA convolution of direction d on this thread ran, as the
// CUDA kernels recorded it ("cuDNN graph engine 12", "cuDNN convolution algorithm 1"), or ""
// before any: for tests and benchmark reports (the CPU kernels record nothing). The kernels
// record a pointer to their plan's description, which lives as long as the process, so a
// call costs no formatting. Defined in core/conv.cpp.
void record_conv_algorithm(ConvDirection d, const std::string* what);
std::string last_conv_algorithm(ConvDirection d);

class ConvKernels {
 public:
  virtual NhwcForward nhwc_forward(const Conv2dGeometry& g, DType dtype) const {
    (void)g, (void)dtype;
    return NhwcForward::WeightOhwi;
  }
  // y = the epilogue applied to conv(x, weight).
  virtual void conv2d_forward(const Conv2dGeometry& g, const Tensor& x, const Tensor& weight, const ConvEpilogue& e,
                              const Tensor& y) const = 0;
  // grad_x = the gradient of sum(grad_y * conv(x, weight)) for x.
  virtual void conv2d_backward_data(const Conv2dGeometry& g, const Tensor& grad_y, const Tensor& weight,
                                    const Tensor& grad_x) const = 0;
  // grad_weight = the gradient of sum(grad_y * conv(x, weight)) for weight.
  virtual void conv2d_backward_weight(const Conv2dGeometry& g, const Tensor& grad_y, const Tensor& x,
                                      const Tensor& grad_weight) const = 0;

 protected:
  ~ConvKernels() = default;
};

}  // namespace kernels

namespace cpu {
const kernels::ConvKernels& conv_kernels();
}
namespace cuda {
const kernels::ConvKernels& conv_kernels();
}

namespace kernels {
inline const ConvKernels& conv(Device device) {
  return for_device(device, cpu::conv_kernels, NC_CUDA_KERNELS(conv_kernels), "conv");
}
}  // namespace kernels

}  // namespace normcore
