// The status check for CUDA, cuBLAS (and cuDNN) calls, and the launch check that follows
// every kernel launch. A failure throws CudaError naming the expression, the status and
// file:line; an out-of-memory status throws OutOfMemoryError so callers can tell it apart.
// Destructors use NC_CUDA_LOG instead, which reports to stderr and never throws.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#ifdef NORMCORE_HAS_CUDNN
#include <cudnn.h>
#endif

#include <cstdio>
#include <string>

#include "normcore/error.h"

namespace normcore {
namespace cuda_detail {

inline std::string failure_message(const char* kind, const char* name, const char* text,
                                   const char* expr, const char* file, int line) {
  return detail::cat_str(kind, " error ", name, " (", text, ") in `", expr, "` at ", file, ":", line);
}

// Overloads picked by the status type; each returns an empty string on success.
inline std::string status_message(cudaError_t status, const char* expr, const char* file, int line) {
  if (status == cudaSuccess) return {};
  return failure_message("CUDA", cudaGetErrorName(status), cudaGetErrorString(status), expr, file, line);
}
inline std::string status_message(cublasStatus_t status, const char* expr, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return {};
  return failure_message("cuBLAS", cublasGetStatusName(status), cublasGetStatusString(status), expr,
                         file, line);
}
#ifdef NORMCORE_HAS_CUDNN
inline std::string status_message(cudnnStatus_t status, const char* expr, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) return {};
  return failure_message("cuDNN", cudnnGetErrorString(status), "see cudnnGetLastErrorString", expr,
                         file, line);
}
#endif

inline bool is_out_of_memory(cudaError_t status) { return status == cudaErrorMemoryAllocation; }
inline bool is_out_of_memory(cublasStatus_t status) { return status == CUBLAS_STATUS_ALLOC_FAILED; }
#ifdef NORMCORE_HAS_CUDNN
inline bool is_out_of_memory(cudnnStatus_t status) { return status == CUDNN_STATUS_ALLOC_FAILED; }
#endif

template <class Status>
void check(Status status, const char* expr, const char* file, int line) {
  std::string message = status_message(status, expr, file, line);
  if (message.empty()) return;
  if (is_out_of_memory(status)) {
    // A failed allocation is not sticky; clear it so later calls do not report it again.
    cudaGetLastError();
    throw OutOfMemoryError(message);
  }
  throw CudaError(message);
}

template <class Status>
void log_failure(Status status, const char* expr, const char* file, int line) noexcept {
  try {
    std::string message = status_message(status, expr, file, line);
    if (!message.empty()) std::fprintf(stderr, "normcore: %s\n", message.c_str());
  } catch (...) {
    std::fprintf(stderr, "normcore: a CUDA call failed in `%s` at %s:%d\n", expr, file, line);
  }
}

inline void check_launch(const char* op, const char* file, int line) {
  cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) return;
  throw CudaError(detail::cat_str(op, ": kernel launch failed: ", cudaGetErrorName(status), " (",
                                  cudaGetErrorString(status), ") at ", file, ":", line));
}

}  // namespace cuda_detail
}  // namespace normcore

// Throws CudaError (OutOfMemoryError for allocation failures) when expr does not succeed.
#define NC_CUDA_CHECK(expr) ::normcore::cuda_detail::check((expr), #expr, __FILE__, __LINE__)
// For destructors and other no-throw paths: reports a failure to stderr.
#define NC_CUDA_LOG(expr) ::normcore::cuda_detail::log_failure((expr), #expr, __FILE__, __LINE__)
// After every kernel launch: turns a launch error into CudaError naming the op.
#define NC_CUDA_KERNEL_CHECK(op_name) ::normcore::cuda_detail::check_launch((op_name), __FILE__, __LINE__)
