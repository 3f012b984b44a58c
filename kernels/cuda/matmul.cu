// CUDA batched matrix product through cuBLAS (contract in kernels/matmul.h): out [B, M, N] =
// a [B, M, K] @ b [B, K, N], all one floating dtype, out contiguous and written (=). f16/bf16 accumulate in f32
// (CUBLAS_COMPUTE_32F), f32 in plain f32 or, with cuda::allow_tf32(), on TF32 tensor
// cores (CUBLAS_COMPUTE_32F_FAST_TF32), f64 in f64. Each operand is either
// row-major (stride(2) == 1) or column-major (stride(1) == 1), with any batch stride.
#include "kernels/cuda/launch.cuh"
#include "kernels/matmul.h"
#include "normcore/cuda.h"

namespace normcore {
namespace cuda {
namespace {

// An operand as cuBLAS sees it. cuBLAS is column-major, so the row-major product
// out = a @ b is computed as out^T = b^T @ a^T: a row-major matrix read column-major is
// already its transpose (no transpose flag); a column-major one needs the flag.
struct GemmOperand {
  const void* ptr;
  cublasOperation_t op;
  int64_t ld;
  int64_t batch_stride;
};

// Describes t [B, rows, cols] for cuBLAS, or returns false when neither layout fits (rows
// that overlap, as a broadcast inside the matrix makes). A dim of size 1 may carry any
// stride, so there ld is what cuBLAS requires instead.
bool as_gemm_operand(const Tensor& t, GemmOperand* g) {
  const int64_t rows = t.size(1), cols = t.size(2);
  const int64_t row_stride = t.stride(1), col_stride = t.stride(2);
  g->ptr = t.data_ptr();
  g->batch_stride = t.stride(0);
  if (col_stride == 1 && (rows == 1 || row_stride >= cols)) {
    g->op = CUBLAS_OP_N;
    g->ld = rows == 1 ? cols : row_stride;
    return true;
  }
  if (row_stride == 1 && (cols == 1 || col_stride >= rows)) {
    g->op = CUBLAS_OP_T;
    g->ld = cols == 1 ? rows : col_stride;
    return true;
  }
  return false;
}

class CudaMatmul final : public kernels::MatmulKernels {
 public:
  void matmul(const Tensor& out, const Tensor& a, const Tensor& b) const override;
};

void CudaMatmul::matmul(const Tensor& out, const Tensor& a, const Tensor& b) const {
  const int64_t batch = out.size(0), m = out.size(1), n = out.size(2), k = a.size(2);
  if (out.numel() == 0) return;
  const Launcher launch("matmul", out);
  if (k == 0) {
    NC_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, out.nbytes(), launch.stream()));
    return;
  }

  // Any other layout is packed into a contiguous copy first (alive until the call is queued).
  Tensor packed_a = a, packed_b = b;
  GemmOperand ga, gb;
  if (!as_gemm_operand(a, &ga)) {
    packed_a = a.contiguous();
    as_gemm_operand(packed_a, &ga);
  }
  if (!as_gemm_operand(b, &gb)) {
    packed_b = b.contiguous();
    as_gemm_operand(packed_b, &gb);
  }

  cudaDataType_t data_type;
  cublasComputeType_t compute_type;
  switch (out.dtype()) {
    case DType::F32:
      data_type = CUDA_R_32F;
      compute_type = allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      break;
    case DType::F64: data_type = CUDA_R_64F; compute_type = CUBLAS_COMPUTE_64F; break;
    case DType::F16: data_type = CUDA_R_16F; compute_type = CUBLAS_COMPUTE_32F; break;
    case DType::BF16: data_type = CUDA_R_16BF; compute_type = CUBLAS_COMPUTE_32F; break;
    default:
      throw DTypeError(detail::cat_str("matmul: expected a floating dtype, got ", dtype_name(out.dtype())));
  }
  // alpha and beta have the compute type's precision.
  const float alpha_f = 1.0f, beta_f = 0.0f;
  const double alpha_d = 1.0, beta_d = 0.0;
  const bool is_f64 = out.dtype() == DType::F64;
  const void* alpha = is_f64 ? static_cast<const void*>(&alpha_d) : &alpha_f;
  const void* beta = is_f64 ? static_cast<const void*>(&beta_d) : &beta_f;

  // Column-major view: out^T [n, m] = b^T [n, k] @ a^T [k, m], ldc = n.
  NC_CUDA_CHECK(cublasGemmStridedBatchedEx_64(
      cublas_handle(launch.device()), gb.op, ga.op, n, m, k, alpha, gb.ptr, data_type, gb.ld,
      gb.batch_stride, ga.ptr, data_type, ga.ld, ga.batch_stride, beta, out.data_ptr(), data_type, n, m * n,
      batch, compute_type, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

const kernels::MatmulKernels& matmul_kernels() {
  static const CudaMatmul kernels;
  return kernels;
}

}  // namespace cuda
}  // namespace normcore
