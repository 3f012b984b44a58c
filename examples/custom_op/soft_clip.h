// The soft clip's CUDA kernels (soft_clip.cu), launched on the stream given: normcore's
// current stream for the device, so that they run in order with normcore's own work.
#pragma once

#include <cstdint>

// y = a * tanh(x / a)
template <class T>
void soft_clip_forward_cuda(const T* x, T* y, int64_t n, double a, void* stream);
// dx = g * (1 - tanh(x / a)^2)
template <class T>
void soft_clip_backward_cuda(const T* x, const T* g, T* dx, int64_t n, double a, void* stream);
