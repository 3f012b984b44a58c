// The status check for CUDA, cuBLAS (and cuDNN) calls, and the launch check that follows
// every kernel launch (kernels/cuda/launch.cuh runs it). A failure throws CudaError naming
// the op being run (base/op_scope.h), the expression, the status and file:line; an
// out-of-memory status throws OutOfMemoryError so callers can tell it apart. Destructors use NC_CUDA_LOG instead, which reports to stderr
// and never throws.
//
// A fault inside a running kernel (an illegal address, a device-side trap) is reported by
// CUDA at whatever call comes next, and from then on every CUDA call of the process fails
// the same way. The message says so; NORMCORE_CUDA_LAUNCH_BLOCKING=1 in the environment
// makes every launch check wait for its kernel, so the fault is reported by the op that
// launched it (slow: for debugging).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#ifdef NORMCORE_HAS_CUDNN
#include <cudnn.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/op_scope.h"
#include "normcore/error.h"

namespace normcore {
namespace cuda {

inline std::string failure_message(const char* kind, const char* name, const char* text, const char* expr,
                                   const char* file, int line) {
  return detail::cat_str(kind, " error ", name, " (", text, ") in `", expr, "` at ", file, ":", line);
}

// Overloads picked by the status type; each returns an empty string on success.
inline std::string status_message(cudaError_t status, const char* expr, const char* file, int line) {
  if (status == cudaSuccess) return {};
  return failure_message("CUDA", cudaGetErrorName(status), cudaGetErrorString(status), expr, file, line);
}
inline std::string status_message(cublasStatus_t status, const char* expr, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return {};
  return failure_message("cuBLAS", cublasGetStatusName(status), cublasGetStatusString(status), expr, file, line);
}
#ifdef NORMCORE_HAS_CUDNN
inline std::string status_message(cudnnStatus_t status, const char* expr, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) return {};
  return failure_message("cuDNN", cudnnGetErrorString(status), "see cudnnGetLastErrorString", expr, file, line);
}
#endif

// Faults after which the process's CUDA context is lost (the CUDA documentation's list of
// errors that leave "the process in an inconsistent state").
inline bool is_context_lost(cudaError_t status) {
  switch (status) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorECCUncorrectable:
    case cudaErrorContained: return true;
    default: return false;
  }
}
inline bool is_context_lost(cublasStatus_t) { return false; }
#ifdef NORMCORE_HAS_CUDNN
inline bool is_context_lost(cudnnStatus_t) { return false; }
#endif

// NORMCORE_CUDA_LAUNCH_BLOCKING=1: every launch check waits for its kernel (read once).
inline bool launch_blocking() {
  static const bool on = [] {
    const char* value = std::getenv("NORMCORE_CUDA_LAUNCH_BLOCKING");
    return value != nullptr && std::strcmp(value, "1") == 0;
  }();
  return on;
}

inline std::string context_lost_note(bool waited_for_kernel) {
  std::string note = "; the GPU stopped a kernel";
  if (waited_for_kernel) {
    note += " of this op (found when it finished, NORMCORE_CUDA_LAUNCH_BLOCKING=1)";
  } else {
    note += ". CUDA reports such a fault at the next call, so the kernel may belong to an earlier op "
            "or to the application; NORMCORE_CUDA_LAUNCH_BLOCKING=1 reports it at the op that "
            "launched it";
  }
  return note + ". The process's CUDA context is lost: every later CUDA call fails; restart the "
                "process to use the GPU again";
}

// "<op>: <message>" inside an OpScope, else message.
inline std::string with_op(const std::string& message) {
  std::string op = detail::current_op();
  return op.empty() ? message : op + ": " + message;
}

inline bool is_out_of_memory(cudaError_t status) { return status == cudaErrorMemoryAllocation; }
inline bool is_out_of_memory(cublasStatus_t status) { return status == CUBLAS_STATUS_ALLOC_FAILED; }
#ifdef NORMCORE_HAS_CUDNN
inline bool is_out_of_memory(cudnnStatus_t status) { return status == CUDNN_STATUS_ALLOC_FAILED; }
#endif

template <class Status>
void check(Status status, const char* expr, const char* file, int line) {
  std::string message = status_message(status, expr, file, line);
  if (message.empty()) return;
  message = with_op(message);
  if (is_out_of_memory(status)) {
    // A failed allocation is not sticky; clear it so later calls do not report it again.
    cudaGetLastError();
    throw OutOfMemoryError(message);
  }
  if (is_context_lost(status)) message += context_lost_note(false);
  throw CudaError(message);
}

template <class Status>
void log_failure(Status status, const char* expr, const char* file, int line) noexcept {
  try {
    std::string message = status_message(status, expr, file, line);
    if (!message.empty()) std::fprintf(stderr, "normcore: %s\n", with_op(message).c_str());
  } catch (...) {
    std::fprintf(stderr, "normcore: a CUDA call failed in `%s` at %s:%d\n", expr, file, line);
  }
}

// Called right after a launch. The message leads with the op in scope, else with kernel_op,
// the kernel's work ("copy").
// A launch error that is not a fault (a bad configuration, no kernel image for the GPU) is
// cleared by reading it, so later ops run; note that CUDA keeps such errors per thread
// until read, so one left unread by the application's own launch surfaces here too.
inline void check_launch(const char* kernel_op) {
  cudaError_t status = cudaGetLastError();
  bool waited = false;
  if (status == cudaSuccess && launch_blocking()) {
    status = cudaDeviceSynchronize();
    waited = true;
  }
  if (status == cudaSuccess) return;
  std::string op = detail::current_op();
  if (op.empty()) op = kernel_op;
  const char* what = waited                    ? "its kernel failed"
                     : is_context_lost(status) ? "launching a kernel found an earlier fault"
                                               : "kernel launch failed";
  std::string message =
      detail::cat_str(op, ": ", what, ": ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
  if (is_context_lost(status)) message += context_lost_note(waited);
  throw CudaError(message);
}

}  // namespace cuda
}  // namespace normcore

// Throws CudaError (OutOfMemoryError for allocation failures) when expr does not succeed.
#define NC_CUDA_CHECK(expr) ::normcore::cuda::check((expr), #expr, __FILE__, __LINE__)
// For destructors and other no-throw paths: reports a failure to stderr.
#define NC_CUDA_LOG(expr) ::normcore::cuda::log_failure((expr), #expr, __FILE__, __LINE__)
