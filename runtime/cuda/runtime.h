// The CUDA runtime as core and the CUDA kernels use it: device count, the caching device
// allocator, pinned host memory, copies between devices, and per-device context (current
// stream, cuBLAS handle). Functions taking a device index expect a valid one; the public
// functions of the same namespace (include/normcore/cuda.h) validate and throw DeviceError.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "normcore/device.h"

namespace normcore {
namespace cuda {

// Number of usable GPUs; 0 when there is no driver or no GPU (never throws or prints).
int device_count();

// Throws DeviceError "<fn>: device <index> ..." unless 0 <= device < device_count().
void check_device(const char* fn, int device);

// Device memory from the caching allocator (see allocator.cpp). nbytes == 0 gives nullptr.
// device_free takes back a pointer from device_alloc; nbytes is the size asked for.
void* device_alloc(size_t nbytes, int device);
void device_free(void* ptr, size_t nbytes, int device);
// Returns to the driver every cached block that was last used on stream (it must be idle).
void release_stream_blocks(int device, cudaStream_t stream);
// Private pools for CUDA graphs (graph.cpp). Between begin_private_pool and
// end_private_pool every allocation on device comes from pool (> 0) and every block freed
// goes to it, so memory a captured graph uses is never handed to work outside it.
// release_private_pool returns the pool's blocks to the shared cache once the graph is
// gone (its replays finished); blocks still held by tensors go there when freed.
void begin_private_pool(int device, uint64_t pool);
void end_private_pool(int device);
void release_private_pool(int device, uint64_t pool);

// Page-locked host memory (cudaHostAlloc / cudaFreeHost). pinned_free first waits for the
// copies queued on every device, since an asynchronous upload may still be reading it.
void* pinned_alloc(size_t nbytes);
void pinned_free(void* ptr);

// Copies nbytes between host and device or between devices, on the current stream of the
// CUDA side. Complete when it returns if dst is host memory; an upload may still be in
// flight when it returns (from a pageable source CUDA has already staged the bytes).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);

// The stream every kernel and library call for device is queued on. Unless the user set
// one, a non-blocking stream created on first use.
cudaStream_t stream(int device);
// Makes stream current for device; nullptr restores normcore's own stream.
void set_stream(int device, cudaStream_t stream);
// Whether stream is the one normcore created for device (which must never be destroyed).
bool is_own_stream(int device, cudaStream_t stream);

// Throws CaptureError "<op in scope, else what>: <why> ..." when a CUDA graph is being
// captured on device: for work that must not happen inside a capture (host reads of device
// memory, uploads from host memory, stream synchronization).
void check_not_capturing(int device, const char* what, const char* why);

// Blocks the host until the work queued so far on stream, a stream of device, has finished;
// every wait of normcore's for a stream goes through here and is counted (cuda::host_waits).
void wait_for_stream(int device, cudaStream_t stream);

// cuBLAS handle of device, created on first use and bound to stream(device) on each call.
cublasHandle_t cublas_handle(int device);
// cuBLASLt handle of device (for products with epilogues), created on first use; the stream
// is given to each cublasLtMatmul call.
cublasLtHandle_t cublaslt_handle(int device);

// Number of multiprocessors of device (cached).
int multiprocessor_count(int device);
// Bytes of L2 cache of device (50 MiB on the H100 and H200; cached).
int l2_cache_bytes(int device);
// Shared memory one block may opt in to on device, in bytes (cached).
int shared_memory_per_block(int device);
// Blocks a thread-block cluster may hold on device: 8 (the portable size) where clusters
// launch (sm_90 and later), else 0 (cached).
int cluster_blocks(int device);
// major * 10 + minor of device (90 for the H100 and H200; cached).
int compute_capability(int device);

// Makes device current for the guard's lifetime.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_;
  int device_;
};

// Device memory for a launcher's temporaries, returned to the cache when it goes out of
// scope. Stream-ordered reuse makes it safe to free before the kernels using it finish.
class DeviceBuffer {
 public:
  DeviceBuffer(size_t nbytes, int device) : ptr_(device_alloc(nbytes, device)), nbytes_(nbytes), device_(device) {}
  ~DeviceBuffer() { device_free(ptr_, nbytes_, device_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_;
  size_t nbytes_;
  int device_;
};

}  // namespace cuda
}  // namespace normcore
