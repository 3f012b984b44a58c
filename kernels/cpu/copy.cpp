// CPU reference: strided copy with dtype conversion, fill, sequences and random numbers.
#include <cstring>

#include "core/philox.h"
#include "kernels/backend.h"
#include "kernels/cpu/loops.h"

namespace normcore {
namespace cpu {

void copy(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    std::memmove(dst.data_ptr(), src.data_ptr(), dst.nbytes());
    return;
  }
  dispatch(dst.dtype(), [&](auto out_tag) {
    using Out = decltype(out_tag);
    dispatch(src.dtype(), [&](auto in_tag) {
      using In = decltype(in_tag);
      map<Out, In>(dst, [](In v) { return cast<Out>(v); }, src);
    });
  });
}

void fill(const Tensor& dst, Scalar value) {
  dispatch(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T v = value.is_integral() ? cast<T>(value.to_int()) : cast<T>(value.to_double());
    map<T>(dst, [v]() { return v; });
  });
}

void arange(const Tensor& out, double start, double step) {
  dispatch(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(out.data_ptr());
    for (int64_t i = 0, n = out.numel(); i < n; ++i) p[i] = cast<T>(start + static_cast<double>(i) * step);
  });
}

void linspace(const Tensor& out, double start, double end) {
  int64_t n = out.numel();
  double step = (end - start) / static_cast<double>(n - 1);
  dispatch(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(out.data_ptr());
    // Symmetric formula so that both ends are exact.
    for (int64_t i = 0; i < n; ++i)
      p[i] = cast<T>(i < n / 2 ? start + static_cast<double>(i) * step
                               : end - static_cast<double>(n - 1 - i) * step);
  });
}

namespace {

// The largest value below 1 in T, for uniforms that round up to 1 in a narrow type.
template <class T>
T below_one() {
  if constexpr (std::is_same<T, Half>::value) return Half::from_bits(0x3bff);
  if constexpr (std::is_same<T, BFloat16>::value) return BFloat16::from_bits(0x3f7f);
  return T(0);
}

}  // namespace

void random_uniform(const Tensor& out, uint64_t seed, uint64_t offset) {
  dispatch_floating(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(out.data_ptr());
    for (int64_t i = 0, n = out.numel(); i < n; ++i) {
      philox::Words r = philox::generate(seed, offset + static_cast<uint64_t>(i));
      if constexpr (std::is_same<T, double>::value) {
        p[i] = philox::uniform_double(r.w[0], r.w[1]);
      } else if constexpr (std::is_same<T, float>::value) {
        p[i] = philox::uniform_float(r.w[0]);
      } else {
        T v(philox::uniform_float(r.w[0]));
        p[i] = static_cast<float>(v) >= 1.0f ? below_one<T>() : v;
      }
    }
  });
}

void random_normal(const Tensor& out, uint64_t seed, uint64_t offset) {
  dispatch_floating(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(out.data_ptr());
    for (int64_t i = 0, n = out.numel(); i < n; ++i) {
      philox::Words r = philox::generate(seed, offset + static_cast<uint64_t>(i));
      if constexpr (std::is_same<T, double>::value) {
        p[i] = philox::normal_double(r);
      } else {
        p[i] = T(philox::normal_float(r));
      }
    }
  });
}

void random_int(const Tensor& out, uint64_t seed, uint64_t offset, int64_t low, uint64_t range) {
  dispatch(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(out.data_ptr());
    for (int64_t i = 0, n = out.numel(); i < n; ++i) {
      philox::Words r = philox::generate(seed, offset + static_cast<uint64_t>(i));
      p[i] = cast<T>(philox::uniform_int(r, low, range));
    }
  });
}

}  // namespace cpu
}  // namespace normcore
