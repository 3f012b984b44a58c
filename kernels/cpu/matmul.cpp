// CPU reference matmul through Eigen: each batch entry maps the operands in place
// (row- or column-major, any leading dimension); f16/bf16 go through float matrices.
#include <Eigen/Core>

#include "kernels/backend.h"
#include "kernels/cpu/loops.h"

namespace normcore {
namespace cpu {

namespace {

template <class T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ColMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;

// Calls f(map) with an Eigen map of matrix `batch` of t ([B, rows, cols], see backend.h).
template <class T, class F>
void with_matrix(const Tensor& t, const T* base, int64_t batch, F&& f) {
  int64_t rows = t.size(1), cols = t.size(2);
  const T* p = base + batch * t.stride(0);
  if (t.stride(2) == 1) {
    Eigen::Map<const RowMajor<T>, 0, Eigen::OuterStride<>> m(p, rows, cols, Eigen::OuterStride<>(t.stride(1)));
    f(m);
  } else {
    Eigen::Map<const ColMajor<T>, 0, Eigen::OuterStride<>> m(p, rows, cols, Eigen::OuterStride<>(t.stride(2)));
    f(m);
  }
}

template <class T>
void matmul_native(const Tensor& out, const Tensor& a, const Tensor& b) {
  const T* pa = static_cast<const T*>(a.data_ptr());
  const T* pb = static_cast<const T*>(b.data_ptr());
  T* po = static_cast<T*>(out.data_ptr());
  int64_t rows = out.size(1), cols = out.size(2);
  for (int64_t i = 0; i < out.size(0); ++i) {
    Eigen::Map<RowMajor<T>> o(po + i * rows * cols, rows, cols);
    with_matrix<T>(a, pa, i, [&](const auto& ma) {
      with_matrix<T>(b, pb, i, [&](const auto& mb) { o.noalias() = ma * mb; });
    });
  }
}

// 16-bit floats: convert each operand to float once, multiply, round the result.
template <class T>
void matmul_via_float(const Tensor& out, const Tensor& a, const Tensor& b) {
  auto widen = [](const Tensor& t) {
    Tensor f = empty(t.shape(), TensorOptions(DType::F32));
    copy(f, t);
    return f;
  };
  Tensor fa = widen(a), fb = widen(b);
  Tensor fo = empty(out.shape(), TensorOptions(DType::F32));
  matmul_native<float>(fo, fa, fb);
  copy(out, fo);
}

}  // namespace

void matmul(const Tensor& out, const Tensor& a, const Tensor& b) {
  switch (out.dtype()) {
    case DType::F32: matmul_native<float>(out, a, b); return;
    case DType::F64: matmul_native<double>(out, a, b); return;
    case DType::F16: matmul_via_float<Half>(out, a, b); return;
    case DType::BF16: matmul_via_float<BFloat16>(out, a, b); return;
    default: throw DTypeError(std::string("matmul: unsupported dtype ") + dtype_name(out.dtype()));
  }
}

}  // namespace cpu
}  // namespace normcore
