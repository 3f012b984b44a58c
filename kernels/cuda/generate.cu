// CUDA sequences and random numbers (contracts in kernels/generate.h), out contiguous and
// written (=). Random element i comes from philox::generate(seed, offset + i) through the
// transforms in base/philox.h, exactly as on the CPU, so both devices draw the same numbers (up to the
// last bits of the normal transform's log/cos). Sequence arithmetic is double, rounded
// step by step (no fused multiply-add) to give the CPU's values bit for bit.
#include "base/philox.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/sample.h"
#include "kernels/generate.h"
#include "kernels/scalar/dropout.h"

namespace normcore {
namespace cuda {
namespace {

// out[i] = value(i) for every element of contiguous out.
template <class T, class Value>
void generate(const char* op, const Tensor& out, Value value) {
  if (out.numel() == 0) return;
  T* p = data_as<T>(out);
  for_each_index(Launcher(op, out), out.numel(), [=] __device__(int64_t i) { p[i] = value(i); });
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
__device__ __forceinline__ __half largest_below_one<__half>() {
  return __ushort_as_half(0x3BFF);
}
template <>
__device__ __forceinline__ __nv_bfloat16 largest_below_one<__nv_bfloat16>() {
  return __ushort_as_bfloat16(0x3F7F);
}

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

// Dropout's element i: draws its keep bit, stores it and the scaled value.
template <class T>
struct DropoutOp {
  using C = compute_t<T>;
  const T* in;
  T* out;
  bool* keep;
  uint64_t seed, offset;
  const uint64_t* offset_base;  // nullptr, or a CUDA graph's word for this replay
  float threshold;
  C scale;
  __device__ void operator()(int64_t i) const {
    const uint64_t first = offset_base != nullptr ? *offset_base + offset : offset;
    const bool k = dropout_keep(seed, first + static_cast<uint64_t>(i), threshold);
    keep[i] = k;
    out[i] = dropout_apply<T, C>(in[i], k, scale);
  }
};

template <class T>
struct MaskedScaleOp {
  using C = compute_t<T>;
  const T* in;
  T* out;
  const bool* keep;
  C scale;
  __device__ void operator()(int64_t i) const { out[i] = dropout_apply<T, C>(in[i], keep[i], scale); }
};

class CudaGenerate final : public kernels::GenerateKernels {
 public:
  void arange(const Tensor& out, double start, double step) const override {
    visit(out.dtype(), "arange", [&](auto tag) {
      using T = typename decltype(tag)::type;
      generate<T>("arange", out, ArangeOp<T>{start, step});
    });
  }

  void linspace(const Tensor& out, double start, double end) const override {
    const int64_t n = out.numel();
    const double step = n > 1 ? (end - start) / static_cast<double>(n - 1) : 0.0;
    visit(out.dtype(), "linspace", [&](auto tag) {
      using T = typename decltype(tag)::type;
      generate<T>("linspace", out, LinspaceOp<T>{start, end, step, n});
    });
  }

  void random_uniform(const Tensor& out, uint64_t seed, uint64_t offset) const override {
    visit_float(out.dtype(), "random_uniform", [&](auto tag) {
      using T = typename decltype(tag)::type;
      generate<T>("random_uniform", out, UniformOp<T>{seed, offset});
    });
  }

  void random_normal(const Tensor& out, uint64_t seed, uint64_t offset) const override {
    visit_float(out.dtype(), "random_normal", [&](auto tag) {
      using T = typename decltype(tag)::type;
      generate<T>("random_normal", out, NormalOp<T>{seed, offset});
    });
  }

  void random_int(const Tensor& out, uint64_t seed, uint64_t offset, int64_t low, uint64_t range) const override {
    visit(out.dtype(), "random_int", [&](auto tag) {
      using T = typename decltype(tag)::type;
      generate<T>("random_int", out, IntOp<T>{seed, offset, low, range});
    });
  }

  void dropout(const Tensor& x, const Tensor& out, const Tensor& keep, uint64_t seed, uint64_t offset,
               const uint64_t* offset_base, float threshold, double scale) const override {
    if (out.numel() == 0) return;
    visit_float(x.dtype(), "dropout", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      const DropoutOp<T> op{data_as<const T>(x), data_as<T>(out), data_as<bool>(keep),          seed, offset,
                            offset_base,         threshold,       convert<C>(convert<T>(scale))};
      for_each_index(Launcher("dropout", out), out.numel(), op);
    });
  }

  void sample_logits(const Tensor& logits, uint64_t seed, uint64_t offset, const uint64_t* offset_base,
                     double temperature, int64_t top_k, double top_p, const Tensor& out) const override {
    cuda::sample_logits(logits, seed, offset, offset_base, temperature, top_k, top_p, out);
  }

  void masked_scale(const Tensor& x, const Tensor& keep, double scale, const Tensor& out) const override {
    if (out.numel() == 0) return;
    visit_float(x.dtype(), "masked_scale", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      const MaskedScaleOp<T> op{data_as<const T>(x), data_as<T>(out), data_as<const bool>(keep),
                                convert<C>(convert<T>(scale))};
      for_each_index(Launcher("masked_scale", out), out.numel(), op);
    });
  }
};

}  // namespace

const kernels::GenerateKernels& generate_kernels() {
  static const CudaGenerate kernels;
  return kernels;
}

}  // namespace cuda
}  // namespace normcore
