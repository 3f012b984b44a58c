// The convolution's epilogue pass on CUDA (kernels/cuda/conv_epilogue.cu).
#pragma once

#include <cstdint>

#include "normcore/tensor.h"

namespace normcore {
namespace cuda {

// y = relu?(y + bias[c] + residual) in place, where element i of the contiguous y has channel
// c = (i / inner) % channels (inner = out_h * out_w for NCHW, 1 for NHWC); bias [channels]
// and residual (y's shape) may be undefined. Nothing runs when there is nothing to add.
void conv_epilogue(const Tensor& y, int64_t channels, int64_t inner, const Tensor& bias, const Tensor& residual,
                   bool relu);

}  // namespace cuda
}  // namespace normcore
