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

  // A Linear layer's product with its bias: out [M, N] contiguous = a [M, K] @ b [K, N] +
  // bias [N] (each row), one floating dtype, bias contiguous, M, N, K >= 1; a and b laid out
  // as for matmul. The bias is added to the product before it is rounded to out's dtype.
  // Returns false, having written nothing, where the back end has no such product for
  // these operands (the caller then adds the bias itself).
  virtual bool matmul_bias(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) const = 0;

 protected:
  ~MatmulKernels() = default;
};

}  // namespace kernels

namespace cpu { const kernels::MatmulKernels& matmul_kernels(); }
namespace cuda { const kernels::MatmulKernels& matmul_kernels(); }

namespace kernels {
inline const MatmulKernels& matmul(Device device) {
  return for_device(device, cpu::matmul_kernels, NC_CUDA_KERNELS(matmul_kernels), "matmul");
}
}  // namespace kernels

}  // namespace normcore
