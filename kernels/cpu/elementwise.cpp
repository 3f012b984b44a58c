// CPU element-wise kernels (contracts in kernels/elementwise.h): the shared functors of
// kernels/scalar/elementwise.h run by the strided loop; f32 tanh and tanh-form GELU over
// contiguous tensors in AVX-512 where the processor has it (unary_avx512.h).
#include <cstring>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/unary_avx512.h"
#include "kernels/elementwise.h"
#include "kernels/scalar/elementwise.h"

namespace normcore {
namespace cpu {
namespace {

// tanh or tanh-form GELU of contiguous f32 on the thread pool in AVX-512; false (nothing done)
// for other ops, dtypes or layouts, in builds without it or on processors without it.
bool unary_avx512(UnaryOp op, const Tensor& out, const Tensor& x) {
#if defined(NORMCORE_GEMM_AVX512)
  if (op != UnaryOp::Tanh && op != UnaryOp::GeluTanh) return false;
  if (x.dtype() != DType::F32 || out.dtype() != DType::F32 || !x.is_contiguous() || !out.is_contiguous()) return false;
  static const bool avx512 = std::strcmp(gemm_isa(), "avx512") == 0;
  if (!avx512) return false;
  const float* from = data_as<const float>(x);
  float* to = data_as<float>(out);
  const auto f = op == UnaryOp::Tanh ? tanh_avx512 : gelu_tanh_avx512;
  parallel_for(out.numel(), kLoopGrain, [&](int64_t begin, int64_t end) { f(from + begin, to + begin, end - begin); });
  return true;
#else
  (void)op, (void)out, (void)x;
  return false;
#endif
}

class CpuElementwise final : public kernels::ElementwiseKernels {
 public:
  void copy(const Tensor& dst, const Tensor& src) const override {
    if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
      std::memmove(dst.data_ptr(), src.data_ptr(), dst.nbytes());
      return;
    }
    visit(dst.dtype(), "copy", [&](auto to_tag) {
      using To = typename decltype(to_tag)::type;
      visit(src.dtype(), "copy", [&](auto from_tag) {
        using From = typename decltype(from_tag)::type;
        map<To, From>(dst, ConvertFunctor<To, From>{}, src);
      });
    });
  }

  void fill(const Tensor& dst, Scalar value) const override {
    visit(dst.dtype(), "fill", [&](auto tag) {
      using T = typename decltype(tag)::type;
      map<T>(dst, FillFunctor<T>{scalar_as<T>(value)});
    });
  }

  void unary(UnaryOp op, const Tensor& out, const Tensor& x, double a, double b) const override {
    if (unary_avx512(op, out, x)) return;
    with_unary_functor<HostTypes>(op, x.dtype(), a, b, [&](auto f) {
      using F = decltype(f);
      map<typename F::Out, typename F::In>(out, f, x);
    });
  }

  void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) const override {
    with_binary_functor<HostTypes>(op, a.dtype(), [&](auto f) {
      using F = decltype(f);
      map<typename F::Out, typename F::In, typename F::In>(out, f, a, b);
    });
  }

  void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) const override {
    visit(out.dtype(), "where", [&](auto tag) {
      using T = typename decltype(tag)::type;
      map<T, bool, T, T>(out, WhereFunctor<T>{}, cond, a, b);
    });
  }
};

}  // namespace

const kernels::ElementwiseKernels& elementwise_kernels() {
  static const CpuElementwise kernels;
  return kernels;
}

}  // namespace cpu
}  // namespace normcore
