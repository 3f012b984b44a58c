// CPU matmul (contract in kernels/matmul.h) through the backend's GEMM (kernels/cpu/gemm.h):
// each batch entry takes the operands in place (row- or column-major, any leading
// dimension); f16/bf16 operands are widened to float once, multiplied, and the result
// rounded (matmul_bias adds the bias before that). Large products run in pieces on the
// thread pool (kernels/cpu/parallel.h).
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/matmul.h"

namespace normcore {
namespace cpu {
namespace {

// The geometry of one operand [batch, rows, cols] in elements.
struct Operand {
  int64_t rows, cols, batch_stride, row_stride, col_stride;
  explicit Operand(const Tensor& t)
      : rows(t.size(1)), cols(t.size(2)), batch_stride(t.stride(0)), row_stride(t.stride(1)), col_stride(t.stride(2)) {}
  Operand(int64_t rows, int64_t cols) : rows(rows), cols(cols), batch_stride(rows * cols), row_stride(cols), col_stride(1) {}
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
  parallel_for(batches, grain_for(rows * cols * inner, int64_t{1} << 18), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      parallel_gemm(rows, cols, inner, a.at(pa, i, 0, 0), b.at(pb, i, 0, 0), out + i * rows * cols, cols, false);
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
      for (int64_t j = 0; j < o.cols; ++j) v[k++] = convert<float>(p[b * o.batch_stride + i * o.row_stride + j * o.col_stride]);
  return v;
}

// Adds bias [cols] to each row of out [rows, cols].
template <class T>
void add_rows(T* out, int64_t rows, int64_t cols, const T* bias) {
  parallel_for(rows, grain_for(cols, int64_t{1} << 16), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      for (int64_t j = 0; j < cols; ++j) out[i * cols + j] += bias[j];
  });
}

class CpuMatmul final : public kernels::MatmulKernels {
 public:
  void matmul(const Tensor& out, const Tensor& a, const Tensor& b) const override { product(out, a, b, nullptr); }

  bool matmul_bias(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) const override {
    product(out.view({1, out.size(0), out.size(1)}), a.unsqueeze(0), b.unsqueeze(0), &bias);
    return true;
  }

 private:
  // out = a @ b (+ bias on each row, before a 16-bit result is rounded).
  static void product(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor* bias) {
    visit_float(out.dtype(), "matmul", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const int64_t batches = out.size(0), rows = out.size(1), cols = out.size(2);
      if constexpr (std::is_floating_point_v<T>) {
        multiply<T>(data_as<T>(out), batches, Operand(a), data_as<const T>(a), Operand(b), data_as<const T>(b));
        if (bias) add_rows<T>(data_as<T>(out), batches * rows, cols, data_as<const T>(*bias));
      } else {
        const std::vector<float> fa = widen<T>(a, batches), fb = widen<T>(b, batches);
        std::vector<float> fo(static_cast<size_t>(out.numel()));
        const Operand ca(a.size(1), a.size(2)), cb(b.size(1), b.size(2));  // the widened copies
        multiply<float>(fo.data(), batches, ca, fa.data(), cb, fb.data());
        if (bias) {
          const std::vector<float> fbias = widen<T>(bias->view({1, 1, cols}), 1);
          add_rows<float>(fo.data(), batches * rows, cols, fbias.data());
        }
        T* po = data_as<T>(out);
        for (size_t i = 0; i < fo.size(); ++i) po[i] = convert<T>(fo[i]);
      }
    });
  }
};

}  // namespace

const kernels::MatmulKernels& matmul_kernels() {
  static const CpuMatmul kernels;
  return kernels;
}

}  // namespace cpu
}  // namespace normcore
