// Pooling over images, NCHW (PyTorch's F.max_pool2d, F.avg_pool2d and
// F.adaptive_avg_pool2d). Each is one recorded op with its own forward and backward: on the
// GPU normcore's kernels, on the CPU the reference they are tested against. Floating dtypes;
// f16/bf16 accumulate in f32. Inputs are [N, C, H, W] or, without the batch dim, [C, H, W]
// (the output then has no batch dim either).
#pragma once

#include <cstdint>

#include "normcore/size2.h"
#include "normcore/tensor.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {

// The maximum over each window; padding counts as -infinity (padding <= kernel / 2), a NaN
// in a window wins. The gradient goes to the (first) maximum. stride not given: kernel_size.
// ceil_mode rounds the output size up, but a window never starts in the right or bottom
// padding. Output size floor((H + 2 padding - dilation (kernel - 1) - 1) / stride) + 1 (or
// ceil), at least 1. As in PyTorch, ties go to the first element in row-major window order
// and, of several NaNs, to the last; a dilated window that holds padding only gives
// -infinity and no gradient. N may be 0 (an empty result), C, H and W not (PyTorch's rule).
// On the CPU, with no gradient to record, an x whose memory is channels last (an NCHW view of
// an [N, H, W, C] tensor: x.permute({0, 2, 3, 1}) contiguous) is pooled as it lies and the
// result is such a view too (as PyTorch keeps the channels_last memory format); the values are
// the same either way.
Tensor max_pool2d(const Tensor& x, Size2 kernel_size, Size2 stride = Size2(), Size2 padding = 0, Size2 dilation = 1,
                  bool ceil_mode = false);

// The mean over each window. count_include_pad: divide by the window's size clipped to the
// padded input (PyTorch's rule), else by the number of input elements in it. Output size and
// padding as for max_pool2d, with dilation 1.
Tensor avg_pool2d(const Tensor& x, Size2 kernel_size, Size2 stride = Size2(), Size2 padding = 0, bool ceil_mode = false,
                  bool count_include_pad = true);

// The mean over output_size.h x output_size.w bins: bin i of H spans rows floor(i H / h) to
// ceil((i + 1) H / h) - 1 (bins may overlap). output_size >= 1. N and C may be 0, H and W not.
Tensor adaptive_avg_pool2d(const Tensor& x, Size2 output_size);

}  // namespace normcore

#pragma GCC visibility pop
