// The soft clip's forward and backward on the GPU: one thread per element.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "soft_clip.h"

namespace {

template <class T>
__global__ void forward_kernel(const T* x, T* y, int64_t n, T a) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = a * tanh(x[i] / a);
}

template <class T>
__global__ void backward_kernel(const T* x, const T* g, T* dx, int64_t n, T a) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) {
    const T t = tanh(x[i] / a);
    dx[i] = g[i] * (T(1) - t * t);
  }
}

void check_launch(const char* what) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + 255) / 256); }

}  // namespace

template <class T>
void soft_clip_forward_cuda(const T* x, T* y, int64_t n, double a, void* stream) {
  if (n == 0) return;
  forward_kernel<T><<<blocks_for(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(x, y, n, static_cast<T>(a));
  check_launch("soft_clip forward");
}

template <class T>
void soft_clip_backward_cuda(const T* x, const T* g, T* dx, int64_t n, double a, void* stream) {
  if (n == 0) return;
  backward_kernel<T><<<blocks_for(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(x, g, dx, n, static_cast<T>(a));
  check_launch("soft_clip backward");
}

template void soft_clip_forward_cuda<float>(const float*, float*, int64_t, double, void*);
template void soft_clip_forward_cuda<double>(const double*, double*, int64_t, double, void*);
template void soft_clip_backward_cuda<float>(const float*, const float*, float*, int64_t, double, void*);
template void soft_clip_backward_cuda<double>(const double*, const double*, double*, int64_t, double, void*);
