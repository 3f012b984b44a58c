// CUDA batched matrix product through cuBLAS (contract in kernels/matmul.h): out [B, M, N] =
// a [B, M, K] @ b [B, K, N], all one floating dtype, out contiguous and written (=). f16/bf16 accumulate in f32
// (CUBLAS_COMPUTE_32F), f32 in plain f32 or, with cuda::allow_tf32(), on TF32 tensor
// cores (CUBLAS_COMPUTE_32F_FAST_TF32), f64 in f64. Each operand is either
// row-major (stride(2) == 1) or column-major (stride(1) == 1), with any batch stride.
// matmul_epilogue runs through cuBLASLt with its epilogues (bias; bias and GELU keeping the
// GELU's input; the GELU's gradient with the bias gradient), so a Linear's bias and an MLP's
// GELU cost no pass of their own over the output. matmul_accumulate adds a 16-bit product
// into an f32 output (beta = 1).
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

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

// Packs t into a contiguous copy (kept in *packed) when cuBLAS cannot read it in place.
GemmOperand operand(const Tensor& t, Tensor* packed) {
  GemmOperand g;
  if (!as_gemm_operand(t, &g)) {
    *packed = t.contiguous();
    as_gemm_operand(*packed, &g);
  }
  return g;
}

class CudaMatmul final : public kernels::MatmulKernels {
 public:
  void matmul(const Tensor& out, const Tensor& a, const Tensor& b) const override;
  bool matmul_epilogue(Epilogue epilogue, const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias,
                       const Tensor& aux) const override;
  bool matmul_accumulate(const Tensor& out, const Tensor& a, const Tensor& b, bool overwrite) const override;
};

// ---------------------------------------------------------------- cuBLASLt with an epilogue

// The largest power of two up to 256 that divides p's address: what cuBLASLt's heuristic
// is told of each pointer (it assumes 256 unless told).
uint32_t alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

// cuBLASLt descriptors, destroyed with the scope.
struct LtMatmulDesc {
  cublasLtMatmulDesc_t desc = nullptr;
  ~LtMatmulDesc() {
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
  template <class V>
  void set(cublasLtMatmulDescAttributes_t attribute, const V& value) {
    NC_CUDA_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
  }
};
struct LtLayout {
  cublasLtMatrixLayout_t layout = nullptr;
  LtLayout(cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld) {
    NC_CUDA_CHECK(cublasLtMatrixLayoutCreate(&layout, type, rows, cols, ld));
  }
  ~LtLayout() {
    if (layout) cublasLtMatrixLayoutDestroy(layout);
  }
};
struct LtPreference {
  cublasLtMatmulPreference_t preference = nullptr;
  LtPreference() { NC_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&preference)); }
  ~LtPreference() {
    if (preference) cublasLtMatmulPreferenceDestroy(preference);
  }
  template <class V>
  void set(cublasLtMatmulPreferenceAttributes_t attribute, const V& value) {
    NC_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof(value)));
  }
};

// The heuristic's choice per product geometry (it costs tens of microseconds of host time
// a call); found == false records that cuBLASLt offers nothing for it.
struct LtChoice {
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};
using LtKey = std::tuple<int, int, int, int64_t, int64_t, int64_t, int, int, int64_t, int64_t, uint32_t, uint32_t,
                         uint32_t, uint32_t, uint32_t>;

// cuBLASLt's workspace limit: what it recommends on Hopper.
constexpr size_t kLtWorkspaceLimit = size_t{32} << 20;

bool CudaMatmul::matmul_epilogue(Epilogue epilogue, const Tensor& out, const Tensor& a, const Tensor& b,
                                 const Tensor& bias, const Tensor& aux) const {
  cudaDataType_t data_type;
  cublasComputeType_t compute_type;
  switch (out.dtype()) {
    case DType::F32:
      data_type = CUDA_R_32F;
      compute_type = allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      break;
    case DType::F16:
      data_type = CUDA_R_16F;
      compute_type = CUBLAS_COMPUTE_32F;
      break;
    case DType::BF16:
      data_type = CUDA_R_16BF;
      compute_type = CUBLAS_COMPUTE_32F;
      break;
    default: return false;  // f64: cuBLASLt has no epilogues for it
  }
  const int64_t m = out.size(0), n = out.size(1), k = a.size(1);
  const bool gelu = epilogue != Epilogue::Bias;
  if (bias.defined() && alignment(bias.data_ptr()) < 16) return false;
  if (gelu && (n % 8 != 0 || alignment(aux.data_ptr()) < 16)) return false;  // the aux matrix's ld: a multiple of 8
  const cublasLtEpilogue_t lt_epilogue = epilogue == Epilogue::Bias       ? CUBLASLT_EPILOGUE_BIAS
                                         : epilogue == Epilogue::BiasGelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                         : bias.defined()                 ? CUBLASLT_EPILOGUE_DGELU_BGRAD
                                                                          : CUBLASLT_EPILOGUE_DGELU;
  const Launcher launch("matmul", out);
  Tensor packed_a, packed_b;
  const GemmOperand ga = operand(a.unsqueeze(0), &packed_a), gb = operand(b.unsqueeze(0), &packed_b);

  // Column-major, as matmul: out^T [n, m] = op(b^T) [n, k] @ op(a^T) [k, m]; the bias [n]
  // runs along out^T's columns (out's rows), and aux [n, m] has out^T's layout.
  const LtLayout layout_b(data_type, gb.op == CUBLAS_OP_N ? n : k, gb.op == CUBLAS_OP_N ? k : n, gb.ld);
  const LtLayout layout_a(data_type, ga.op == CUBLAS_OP_N ? k : m, ga.op == CUBLAS_OP_N ? m : k, ga.ld);
  const LtLayout layout_out(data_type, n, m, n);
  LtMatmulDesc desc;
  NC_CUDA_CHECK(cublasLtMatmulDescCreate(&desc.desc, compute_type, CUDA_R_32F));
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, gb.op);
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB, ga.op);
  desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue);
  if (bias.defined()) desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.data_ptr());
  if (gelu) {
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux.data_ptr());
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, n);
  }

  const cublasLtHandle_t handle = cublaslt_handle(launch.device());
  const uint32_t align_b = alignment(gb.ptr), align_a = alignment(ga.ptr), align_out = alignment(out.data_ptr()),
                 align_bias = bias.defined() ? alignment(bias.data_ptr()) : 0,
                 align_aux = gelu ? alignment(aux.data_ptr()) : 0;
  const LtKey key{launch.device(),
                  static_cast<int>(out.dtype()) * 2 + (compute_type == CUBLAS_COMPUTE_32F_FAST_TF32),
                  static_cast<int>(lt_epilogue),
                  m,
                  n,
                  k,
                  gb.op,
                  ga.op,
                  gb.ld,
                  ga.ld,
                  align_b,
                  align_a,
                  align_out,
                  align_bias,
                  align_aux};
  static std::mutex choices_mutex;
  static std::map<LtKey, LtChoice> choices;
  LtChoice choice;
  bool known;
  {
    std::lock_guard<std::mutex> lock(choices_mutex);
    auto it = choices.find(key);
    known = it != choices.end();
    if (known) choice = it->second;
  }
  if (!known) {
    LtPreference preference;
    preference.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kLtWorkspaceLimit);
    preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b);
    preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a);
    preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_out);
    preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_out);
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(handle, desc.desc, layout_b.layout, layout_a.layout, layout_out.layout,
                                       layout_out.layout, preference.preference, 1, &result, &count);
    if (status == CUBLAS_STATUS_SUCCESS && count > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
      choice.found = true;
      choice.algo = result.algo;
      choice.workspace = result.workspaceSize;
    } else if (status != CUBLAS_STATUS_NOT_SUPPORTED && status != CUBLAS_STATUS_SUCCESS) {
      NC_CUDA_CHECK(status);
    }
    std::lock_guard<std::mutex> lock(choices_mutex);
    choices.emplace(key, choice);
  }
  if (!choice.found) return false;

  // The workspace comes from the caching allocator, held until the product is queued.
  const Tensor workspace = choice.workspace == 0 ? Tensor()
                                                 : empty({static_cast<int64_t>(choice.workspace)},
                                                         TensorOptions(DType::U8, Device::cuda(launch.device())));
  const float alpha = 1.0f, beta = 0.0f;
  NC_CUDA_CHECK(cublasLtMatmul(handle, desc.desc, &alpha, gb.ptr, layout_b.layout, ga.ptr, layout_a.layout, &beta,
                               out.data_ptr(), layout_out.layout, out.data_ptr(), layout_out.layout, &choice.algo,
                               workspace.defined() ? workspace.data_ptr() : nullptr, choice.workspace,
                               launch.stream()));
  return true;
}

// ---------------------------------------------------------------- plain products

void CudaMatmul::matmul(const Tensor& out, const Tensor& a, const Tensor& b) const {
  const int64_t batch = out.size(0), m = out.size(1), n = out.size(2), k = a.size(2);
  if (out.numel() == 0) return;
  const Launcher launch("matmul", out);
  if (k == 0) {
    NC_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, out.nbytes(), launch.stream()));
    return;
  }

  // Any other layout is packed into a contiguous copy first (alive until the call is queued).
  Tensor packed_a, packed_b;
  const GemmOperand ga = operand(a, &packed_a), gb = operand(b, &packed_b);

  cudaDataType_t data_type;
  cublasComputeType_t compute_type;
  switch (out.dtype()) {
    case DType::F32:
      data_type = CUDA_R_32F;
      compute_type = allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      break;
    case DType::F64:
      data_type = CUDA_R_64F;
      compute_type = CUBLAS_COMPUTE_64F;
      break;
    case DType::F16:
      data_type = CUDA_R_16F;
      compute_type = CUBLAS_COMPUTE_32F;
      break;
    case DType::BF16:
      data_type = CUDA_R_16BF;
      compute_type = CUBLAS_COMPUTE_32F;
      break;
    default: throw DTypeError(detail::cat_str("matmul: expected a floating dtype, got ", dtype_name(out.dtype())));
  }
  // alpha and beta have the compute type's precision.
  const float alpha_f = 1.0f, beta_f = 0.0f;
  const double alpha_d = 1.0, beta_d = 0.0;
  const bool is_f64 = out.dtype() == DType::F64;
  const void* alpha = is_f64 ? static_cast<const void*>(&alpha_d) : &alpha_f;
  const void* beta = is_f64 ? static_cast<const void*>(&beta_d) : &beta_f;

  // Column-major view: out^T [n, m] = b^T [n, k] @ a^T [k, m], ldc = n.
  NC_CUDA_CHECK(cublasGemmStridedBatchedEx_64(cublas_handle(launch.device()), gb.op, ga.op, n, m, k, alpha, gb.ptr,
                                              data_type, gb.ld, gb.batch_stride, ga.ptr, data_type, ga.ld,
                                              ga.batch_stride, beta, out.data_ptr(), data_type, n, m * n, batch,
                                              compute_type, CUBLAS_GEMM_DEFAULT));
}

// cuBLAS with beta = 1 (0 to overwrite) and an f32 output for 16-bit or f32 operands (f64
// for f64).
bool CudaMatmul::matmul_accumulate(const Tensor& out, const Tensor& a, const Tensor& b, bool overwrite) const {
  const DType operands = a.dtype();
  if (out.dtype() != (operands == DType::F64 ? DType::F64 : DType::F32) || b.dtype() != operands) return false;
  cudaDataType_t data_type;
  cublasComputeType_t compute_type = CUBLAS_COMPUTE_32F;
  switch (operands) {
    case DType::F32:
      data_type = CUDA_R_32F;
      if (allow_tf32()) compute_type = CUBLAS_COMPUTE_32F_FAST_TF32;
      break;
    case DType::F64:
      data_type = CUDA_R_64F;
      compute_type = CUBLAS_COMPUTE_64F;
      break;
    case DType::F16: data_type = CUDA_R_16F; break;
    case DType::BF16: data_type = CUDA_R_16BF; break;
    default: return false;
  }
  const int64_t m = out.size(0), n = out.size(1), k = a.size(1);
  if (out.numel() == 0) return true;
  if (k == 0) {
    if (overwrite) Tensor(out).zero_();
    return true;
  }
  const Launcher launch("matmul", out);
  Tensor packed_a, packed_b;
  const GemmOperand ga = operand(a.unsqueeze(0), &packed_a), gb = operand(b.unsqueeze(0), &packed_b);
  const float one_f = 1.0f, beta_f = overwrite ? 0.0f : 1.0f;
  const double one_d = 1.0, beta_d = overwrite ? 0.0 : 1.0;
  const bool is_f64 = operands == DType::F64;
  const void* one = is_f64 ? static_cast<const void*>(&one_d) : &one_f;
  const void* beta = is_f64 ? static_cast<const void*>(&beta_d) : &beta_f;
  const cudaDataType_t out_type = is_f64 ? CUDA_R_64F : CUDA_R_32F;
  // Column-major view: out^T [n, m] (+)= b^T [n, k] @ a^T [k, m], ldc = n.
  NC_CUDA_CHECK(cublasGemmEx_64(cublas_handle(launch.device()), gb.op, ga.op, n, m, k, one, gb.ptr, data_type, gb.ld,
                                ga.ptr, data_type, ga.ld, beta, out.data_ptr(), out_type, n, compute_type,
                                CUBLAS_GEMM_DEFAULT));
  return true;
}

}  // namespace

const kernels::MatmulKernels& matmul_kernels() {
  static const CudaMatmul kernels;
  return kernels;
}

}  // namespace cuda
}  // namespace normcore
