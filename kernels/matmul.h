// Batched matrix products (core/linalg.cpp shapes the operands: NumPy's matmul semantics,
// broadcast batches, transposed views without copies).
#pragma once

#include "kernels/backend.h"

namespace normcore {
namespace kernels {

class MatmulKernels {
 public:
  // a [B, M, K], b [B, K, N], out [B, M, N] contiguous, one floating dtype. a and b each
  // have stride(2) == 1 (row-major) or stride(1) == 1 (column-major, a transposed view), and
  // any batch stride (0 when broadcast); K may be 0 (out = 0). f32 on CUDA uses TF32 only
  // when cuda::allow_tf32().
  virtual void matmul(const Tensor& out, const Tensor& a, const Tensor& b) const = 0;

  // A 2-D product with an epilogue: out [M, N] contiguous = a [M, K] @ b [K, N] (laid out as
  // for matmul), one floating dtype, M, N, K >= 1, every vector and matrix below contiguous
  // of out's dtype; all arithmetic in f32 (f64 for f64) and out rounded once.
  //   Bias:     out = a @ b + bias [N] (each row): a Linear's product.
  //   BiasGelu: aux [M, N] = a @ b + bias, out = gelu_tanh(aux): an MLP's first Linear and
  //             its GELU (tanh form), aux kept for the gradient.
  //   DGelu:    out = (a @ b) * gelu_tanh'(aux), aux [M, N] from BiasGelu: the GELU's input
  //             gradient straight from the product that makes its output gradient; a defined
  //             bias [N] receives the column sums of out (that Linear's bias gradient).
  // Returns false, having written nothing, where the back end has no such product for these
  // operands (the caller then composes it).
  enum class Epilogue { Bias, BiasGelu, DGelu };
  virtual bool matmul_epilogue(Epilogue epilogue, const Tensor& out, const Tensor& a, const Tensor& b,
                               const Tensor& bias, const Tensor& aux) const = 0;

  // out [M, N] += a [M, K] @ b [K, N] (laid out as for matmul), or out = a @ b when
  // overwrite (out's contents then unread), out contiguous f32 for f32, f16 and bf16
  // operands (f64 for f64): a sum of products over pieces of K kept unrounded between them.
  // Returns false, having written nothing, for other operands.
  virtual bool matmul_accumulate(const Tensor& out, const Tensor& a, const Tensor& b, bool overwrite) const = 0;

 protected:
  ~MatmulKernels() = default;
};

}  // namespace kernels

namespace cpu {
const kernels::MatmulKernels& matmul_kernels();
}
namespace cuda {
const kernels::MatmulKernels& matmul_kernels();
}

namespace kernels {
inline const MatmulKernels& matmul(Device device) {
  return for_device(device, cpu::matmul_kernels, NC_CUDA_KERNELS(matmul_kernels), "matmul");
}
}  // namespace kernels

}  // namespace normcore
