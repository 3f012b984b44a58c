// CPU matmul (contract in kernels/matmul.h) through the backend's GEMM (kernels/cpu/gemm.h):
// each batch entry takes the operands in place (row- or column-major, any leading
// dimension); f16/bf16 operands are widened to float once, multiplied, and the result
// rounded (matmul_epilogue applies its epilogue before that). Large products run in pieces on the
// thread pool (kernels/cpu/parallel.h).
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/matmul.h"
#include "kernels/scalar/elementwise.h"

namespace normcore {
namespace cpu {
namespace {

// The geometry of one operand [batch, rows, cols] in elements.
struct Operand {
  int64_t rows, cols, batch_stride, row_stride, col_stride;
  explicit Operand(const Tensor& t)
      : rows(t.size(1)), cols(t.size(2)), batch_stride(t.stride(0)), row_stride(t.stride(1)), col_stride(t.stride(2)) {}
  Operand(int64_t rows, int64_t cols)
      : rows(rows), cols(cols), batch_stride(rows * cols), row_stride(cols), col_stride(1) {}
  // Matrix `batch` from row `row` and column `col` on, for gemm.
  template <class T>
  GemmOperand<T> at(const T* base, int64_t batch, int64_t row, int64_t col) const {
    return {base + batch * batch_stride + row * row_stride + col * col_stride, row_stride, col_stride};
  }
};

// out [batches, rows, cols] contiguous = a @ b for each batch: batch entries in ranges on
// the thread pool, and a single large product cut into pieces by parallel_gemm.
template <class T>
void multiply(T* out, int64_t batches, const Operand& a, const T* pa, const Operand& b, const T* pb) {
  const int64_t rows = a.rows, cols = b.cols, inner = a.cols;
  // Up to 512 rows with both operands' rows contiguous (an inference's tokens against a
  // weight), f32 runs the unpacked AVX-512 product where there is one: 1.1-2x Eigen's there,
  // level with it beyond (kernels/cpu/gemm.h).
  const bool by_rows = std::is_same_v<T, float> && rows <= 512 && a.col_stride == 1 && b.col_stride == 1;
  parallel_for(batches, grain_for(rows * cols * inner, int64_t{1} << 18), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T* c = out + i * rows * cols;
      if constexpr (std::is_same_v<T, float>) {
        if (by_rows && parallel_gemm_rows(rows, cols, inner, pa + i * a.batch_stride, a.row_stride,
                                          pb + i * b.batch_stride, b.row_stride, c, cols, RowEpilogue{}))
          continue;
      }
      parallel_gemm(rows, cols, inner, a.at(pa, i, 0, 0), b.at(pb, i, 0, 0), c, cols, false);
    }
  });
}

// A 16-bit operand as a contiguous float copy (its batches materialized when broadcast).
template <class T>
std::vector<float> widen(const Tensor& t, int64_t batches) {
  const Operand o(t);
  const T* p = data_as<const T>(t);
  std::vector<float> v(static_cast<size_t>(batches * o.rows * o.cols));
  size_t k = 0;
  for (int64_t b = 0; b < batches; ++b)
    for (int64_t i = 0; i < o.rows; ++i)
      for (int64_t j = 0; j < o.cols; ++j)
        v[k++] = convert<float>(p[b * o.batch_stride + i * o.row_stride + j * o.col_stride]);
  return v;
}

using Epilogue = kernels::MatmulKernels::Epilogue;

// The epilogue over the f32/f64 product p [rows, cols] (kernels/matmul.h), out rounded once.
template <class T, class C>
void finish(Epilogue epilogue, const C* p, int64_t rows, int64_t cols, const T* bias, T* aux, T* out, T* bias_grad) {
  const UnaryFunctor<C, UnaryOp::GeluTanh> gelu{};
  const BinaryFunctor<C, BinaryOp::GeluTanhGrad> gelu_grad;
  parallel_for(rows, grain_for(cols, int64_t{1} << 14), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t k = i * cols + j;
        if (epilogue == Epilogue::Bias) {
          out[k] = convert<T>(p[k] + convert<C>(bias[j]));
        } else if (epilogue == Epilogue::BiasGelu) {
          const C pre = p[k] + convert<C>(bias[j]);
          aux[k] = convert<T>(pre);
          out[k] = convert<T>(gelu(pre));
        } else {
          out[k] = convert<T>(gelu_grad(p[k], convert<C>(aux[k])));
        }
      }
  });
  if (epilogue == Epilogue::DGelu && bias_grad != nullptr) {
    // Column sums in a fixed order (rows in sequence), over the unrounded gradients.
    parallel_for(cols, grain_for(rows, int64_t{1} << 14), [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        C total = 0;
        for (int64_t i = 0; i < rows; ++i) total += gelu_grad(p[i * cols + j], convert<C>(aux[i * cols + j]));
        bias_grad[j] = convert<T>(total);
      }
    });
  }
}

class CpuMatmul final : public kernels::MatmulKernels {
 public:
  void matmul(const Tensor& out, const Tensor& a, const Tensor& b) const override {
    visit_float(out.dtype(), "matmul", [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_floating_point_v<T>) {
        multiply<T>(data_as<T>(out), out.size(0), Operand(a), data_as<const T>(a), Operand(b), data_as<const T>(b));
      } else {
        const std::vector<float> fo = widened_product<T>(out, a, b);
        T* po = data_as<T>(out);
        for (size_t i = 0; i < fo.size(); ++i) po[i] = convert<T>(fo[i]);
      }
    });
  }

  bool matmul_epilogue(Epilogue epilogue, const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias,
                       const Tensor& aux) const override {
    const int64_t rows = out.size(0), cols = out.size(1);
    visit_float(out.dtype(), "matmul", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
      const std::vector<C> p = unrounded_product<T>(out, a, b);
      T* bias_grad = epilogue == Epilogue::DGelu ? data_or_null<T>(bias) : nullptr;
      finish<T, C>(epilogue, p.data(), rows, cols, epilogue == Epilogue::DGelu ? nullptr : data_or_null<const T>(bias),
                   data_or_null<T>(aux), data_as<T>(out), bias_grad);
    });
    return true;
  }

  bool matmul_accumulate(const Tensor& out, const Tensor& a, const Tensor& b, bool overwrite) const override {
    if (out.dtype() != (a.dtype() == DType::F64 ? DType::F64 : DType::F32) || b.dtype() != a.dtype()) return false;
    visit_float(a.dtype(), "matmul", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
      const std::vector<C> p = unrounded_product<T>(out, a, b);
      C* o = data_as<C>(out);
      for (size_t k = 0; k < p.size(); ++k) o[k] = overwrite ? p[k] : o[k] + p[k];
    });
    return true;
  }

 private:
  // The 2-D product a @ b of T operands before rounding (f64 for f64, f32 else), out's
  // [rows, cols] its shape.
  template <class T, class C = std::conditional_t<std::is_same_v<T, double>, double, float>>
  static std::vector<C> unrounded_product(const Tensor& out, const Tensor& a, const Tensor& b) {
    const int64_t rows = out.size(0), cols = out.size(1);
    if constexpr (std::is_floating_point_v<T>) {
      std::vector<C> p(static_cast<size_t>(rows * cols));
      multiply<T>(p.data(), 1, Operand(a.unsqueeze(0)), data_as<const T>(a), Operand(b.unsqueeze(0)),
                  data_as<const T>(b));
      return p;
    } else {
      return widened_product<T>(out.view({1, rows, cols}), a.unsqueeze(0), b.unsqueeze(0));
    }
  }

  // A 16-bit product in f32: the operands widened once, multiplied.
  template <class T>
  static std::vector<float> widened_product(const Tensor& out, const Tensor& a, const Tensor& b) {
    const int64_t batches = out.size(0);
    const std::vector<float> fa = widen<T>(a, batches), fb = widen<T>(b, batches);
    std::vector<float> fo(static_cast<size_t>(out.numel()));
    const Operand ca(a.size(1), a.size(2)), cb(b.size(1), b.size(2));  // the widened copies
    multiply<float>(fo.data(), batches, ca, fa.data(), cb, fb.data());
    return fo;
  }
};

}  // namespace

const kernels::MatmulKernels& matmul_kernels() {
  static const CpuMatmul kernels;
  return kernels;
}

}  // namespace cpu
}  // namespace normcore
