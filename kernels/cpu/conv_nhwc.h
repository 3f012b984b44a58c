// The CPU's direct convolution of channels-last (NHWC) f32 tensors, one group, in AVX-512
// (conv_nhwc_avx512.cpp): y [n, out_h, out_w, o] = relu?(conv(x [n, h, w, c], weight
// [kh, kw, c, o]) + bias + residual), with no im2col copy and nothing packed. The output
// channels are the vector lanes and the weight's rows of o floats are read as they lie, so a
// weight laid out [kh, kw, c, o] (made once by whoever keeps it: core/conv.cpp takes it from
// a permuted view as it lies) is all the preparation there is.
#pragma once

#include <cstdint>

namespace normcore {
namespace cpu {

struct NhwcConv {
  const float* x = nullptr;         // [n, h, w, c]
  const float* weight = nullptr;    // [kh, kw, c, o], or with panels [ceil(o / 64), kh, kw, c, 64]
  const float* bias = nullptr;      // [o], or null
  const float* residual = nullptr;  // [n, out_h, out_w, o], or null
  float* y = nullptr;               // [n, out_h, out_w, o]
  const float* zeros = nullptr;     // kw * c zeros: what a tap (or a row of taps) in the padding reads
  int64_t n = 0, h = 0, w = 0, c = 0, o = 0, kh = 0, kw = 0, out_h = 0, out_w = 0;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
  bool relu = false;
  // The weight in panels of 64 output channels, zeros past o: each tile's rows one after
  // another in memory rather than 64 floats at a stride of o (a quarter faster where the
  // weight is read from memory: ResNet-50's last stages at batch 1).
  bool panels = false;
};

// The output pixels [p0, p1) (of n * out_h * out_w, row-major) and channels [o0, o1) of the
// convolution, on the calling thread. Each element sums its kh * kw * c products in the same
// order (tap by tap, channels in order, in blocks of 256) whatever the range, so pieces may
// run on any threads. Only where conv_nhwc_in_use() says so.
void conv_nhwc_avx512(const NhwcConv& g, int64_t p0, int64_t p1, int64_t o0, int64_t o1);

// Whether the AVX-512 build runs (gemm.h's product in use is "avx512").
bool conv_nhwc_in_use();

// The whole convolution on the thread pool, in pieces fixed by the shape (the same bits at
// any thread count); false, having done nothing, where conv_nhwc_in_use() is false.
bool conv_nhwc(const NhwcConv& g);

}  // namespace cpu
}  // namespace normcore
