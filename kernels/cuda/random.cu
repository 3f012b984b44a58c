// Sequences (arange, linspace) and random tensors, out contiguous and written (=).
// Random element i comes from philox::generate(seed, offset + i) through the transforms in
// core/philox.h, exactly as on the CPU, so both devices draw the same numbers (up to the
// last bits of the normal transform's log/cos). Sequence arithmetic is double, rounded
// step by step (no fused multiply-add) to give the CPU's values bit for bit.
#include "core/philox.h"
#include "kernels/cuda/loops.cuh"

namespace normcore {
namespace cuda_kernels {
namespace {

// out[i] = f(i) for i < n.
template <class T, class F>
__global__ void generate_kernel(T* out, int64_t n, F f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = f(i);
}

template <class T, class F>
void generate(const char* op, const Tensor& out, F f) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const int device = out.device().index;
  cuda_runtime::DeviceGuard guard(device);
  generate_kernel<<<grid_for(n, device), kThreads, 0, cuda_runtime::stream(device)>>>(data_as<T>(out), n, f);
  NC_CUDA_KERNEL_CHECK(op);
}

template <class T>
struct ArangeOp {
  double start, step;
  __device__ T operator()(int64_t i) const {
    return convert<T>(__dadd_rn(start, __dmul_rn(static_cast<double>(i), step)));
  }
};

// Symmetric around the middle, so both ends are exact.
template <class T>
struct LinspaceOp {
  double start, end, step;
  int64_t n;
  __device__ T operator()(int64_t i) const {
    if (n == 1) return convert<T>(start);
    if (i < n / 2) return convert<T>(__dadd_rn(start, __dmul_rn(static_cast<double>(i), step)));
    return convert<T>(__dsub_rn(end, __dmul_rn(static_cast<double>(n - 1 - i), step)));
  }
};

// The largest value below 1 in T, for a 16-bit float uniform that rounded up to 1.
template <class T>
__device__ __forceinline__ T largest_below_one();
template <>
__device__ __forceinline__ __half largest_below_one<__half>() { return __ushort_as_half(0x3BFF); }
template <>
__device__ __forceinline__ __nv_bfloat16 largest_below_one<__nv_bfloat16>() { return __ushort_as_bfloat16(0x3F7F); }

template <class T>
struct UniformOp {
  uint64_t seed, offset;
  __device__ T operator()(int64_t i) const {
    const philox::Words r = philox::generate(seed, offset + static_cast<uint64_t>(i));
    if constexpr (std::is_same_v<T, double>) {
      return philox::uniform_double(r.w[0], r.w[1]);
    } else if constexpr (std::is_same_v<T, float>) {
      return philox::uniform_float(r.w[0]);
    } else {
      const T v = convert<T>(philox::uniform_float(r.w[0]));
      return static_cast<float>(v) == 1.0f ? largest_below_one<T>() : v;
    }
  }
};

template <class T>
struct NormalOp {
  uint64_t seed, offset;
  __device__ T operator()(int64_t i) const {
    const philox::Words r = philox::generate(seed, offset + static_cast<uint64_t>(i));
    if constexpr (std::is_same_v<T, double>) return philox::normal_double(r);
    else return convert<T>(philox::normal_float(r));
  }
};

template <class T>
struct IntOp {
  uint64_t seed, offset;
  int64_t low;
  uint64_t range;
  __device__ T operator()(int64_t i) const {
    return convert<T>(philox::uniform_int(philox::generate(seed, offset + static_cast<uint64_t>(i)), low, range));
  }
};

}  // namespace

void arange(const Tensor& out, double start, double step) {
  dispatch_all(out.dtype(), "arange", [&](auto tag) {
    using T = typename decltype(tag)::type;
    generate<T>("arange", out, ArangeOp<T>{start, step});
  });
}

void linspace(const Tensor& out, double start, double end) {
  const int64_t n = out.numel();
  const double step = n > 1 ? (end - start) / static_cast<double>(n - 1) : 0.0;
  dispatch_all(out.dtype(), "linspace", [&](auto tag) {
    using T = typename decltype(tag)::type;
    generate<T>("linspace", out, LinspaceOp<T>{start, end, step, n});
  });
}

void random_uniform(const Tensor& out, uint64_t seed, uint64_t offset) {
  dispatch_floating(out.dtype(), "random_uniform", [&](auto tag) {
    using T = typename decltype(tag)::type;
    generate<T>("random_uniform", out, UniformOp<T>{seed, offset});
  });
}

void random_normal(const Tensor& out, uint64_t seed, uint64_t offset) {
  dispatch_floating(out.dtype(), "random_normal", [&](auto tag) {
    using T = typename decltype(tag)::type;
    generate<T>("random_normal", out, NormalOp<T>{seed, offset});
  });
}

void random_int(const Tensor& out, uint64_t seed, uint64_t offset, int64_t low, uint64_t range) {
  dispatch_all(out.dtype(), "random_int", [&](auto tag) {
    using T = typename decltype(tag)::type;
    generate<T>("random_int", out, IntOp<T>{seed, offset, low, range});
  });
}

}  // namespace cuda_kernels
}  // namespace normcore
