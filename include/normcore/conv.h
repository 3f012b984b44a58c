// Convolution over images, NCHW (PyTorch's F.conv2d): one recorded op with its own forward
// and backward, on cuDNN on the GPU, the CPU holding the reference it is tested against.
// Floating dtypes; f16/bf16 accumulate in f32. Inputs are [N, C, H, W] or, without the batch
// dim, [C, H, W] (the output then has no batch dim either). Pooling is in normcore/pool.h,
// which this header still includes for programs that found it here.
#pragma once

#include <cstdint>

#include "normcore/pool.h"
#include "normcore/size2.h"
#include "normcore/tensor.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {

// y[n, o] = bias[o] + sum over the channels c of o's group and the kernel window of
// x[n, c, i * stride + ki * dilation - padding, ...] * weight[o, c, ki, kj], zero padding.
// x [N, C, H, W], weight [O, C / groups, kh, kw], bias [O] (optional: undefined) ->
// [N, O, Ho, Wo] with Ho = (H + 2 padding - dilation (kh - 1) - 1) / stride + 1. C and O
// divisible by groups; stride and dilation >= 1, padding >= 0. x, weight and bias share a
// floating dtype and a device. On CUDA the TF32 setting (cuda::set_allow_tf32) applies to f32.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), Size2 stride = 1, Size2 padding = 0,
              Size2 dilation = 1, int64_t groups = 1);

// How a convolution's tensors are laid out: NCHW (x [N, C, H, W], weight [O, C / groups, kh,
// kw]) or NHWC, channels last (x [N, H, W, C], weight [O, kh, kw, C / groups], output
// [N, Ho, Wo, O]): cuDNN's tensor-core convolutions read NHWC without transposing it.
enum class ConvLayout { NCHW, NHWC };

// For inference: relu?(conv2d(x, weight, bias) + residual), the bias, the residual (the
// output's shape, or undefined) and the ReLU applied in one pass over the convolution's output
// on CUDA (three passes fewer than conv2d, add and relu). A BatchNorm in eval mode after a
// convolution folds into its weight and bias (nn::fold_batch_norm). Records no backward: an
// input that requires grad with grad mode on is a ValueError. NHWC runs on CUDA as it is; on
// the CPU, f32 with one group runs a direct NHWC kernel where the processor has AVX-512 (its
// weight read [kh, kw, C / groups, O] as it lies in memory when the weight is a permuted view
// of such a tensor, else copied so per call), and the rest through NCHW copies.
Tensor conv2d_fused(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& residual, bool relu,
                    Size2 stride = 1, Size2 padding = 0, Size2 dilation = 1, int64_t groups = 1,
                    ConvLayout layout = ConvLayout::NCHW);

}  // namespace normcore

#pragma GCC visibility pop
