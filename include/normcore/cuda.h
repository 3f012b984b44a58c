// The CUDA runtime as normcore exposes it: devices, the per-device current stream, and
// the caching allocator's statistics. Usable in every build: in a CPU-only build the
// queries report no GPU and the rest throw DeviceError.
#pragma once

#include <cstddef>
#include <cstdint>

namespace normcore {
namespace cuda {

struct MemoryStats {
  size_t allocated = 0;       // bytes in blocks handed out to tensors
  size_t reserved = 0;        // bytes obtained from cudaMalloc (allocated + cached)
  size_t peak_allocated = 0;  // high-water mark of allocated since the last reset
  uint64_t num_allocs = 0;    // allocation requests served
  uint64_t num_cache_hits = 0;      // requests served from the cache
  uint64_t num_device_mallocs = 0;  // cudaMalloc calls
  uint64_t num_ooms = 0;            // requests that failed even after freeing the cache
};

MemoryStats memory_stats(int device = 0);
void reset_peak_memory_stats(int device = 0);
// Returns every cached (unused) block to the driver.
void empty_cache();
// (free, total) bytes on the device, as the driver reports them.
void mem_get_info(int device, size_t* free_bytes, size_t* total_bytes);

// How float32 matmuls and convolutions run on CUDA, for the whole process (PyTorch's
// torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32 in one):
// false (the default) computes in float32; true lets cuBLAS and cuDNN use TF32 tensor cores
// (inputs rounded to a 10-bit mantissa, float32 accumulation, relative error about 1e-3,
// several times faster on Ampere and later). CPU ops and other dtypes are not affected.
// Settable in every build.
void set_allow_tf32(bool allow);
bool allow_tf32();

// How cuDNN convolutions pick their algorithms, for the whole process (PyTorch's
// torch.backends.cudnn.benchmark): false (the default) takes cuDNN's heuristic choice; true
// times the candidate algorithms on the first convolution of each geometry (input and
// weight shapes, stride, padding, dilation, groups, dtype, TF32 setting) and keeps the
// fastest. Either way the choice is made once per geometry and cached, and only
// deterministic algorithms are used. Settable in every build.
void set_cudnn_benchmark(bool benchmark);
bool cudnn_benchmark();

int current_device();
void set_device(int device);
// Waits for all work queued on the device's current stream (device < 0: current device).
void synchronize(int device = -1);

// An opaque cudaStream_t. Every kernel and library call for a device runs on its
// current stream; the default is a non-blocking stream normcore creates per device.
using StreamHandle = void*;
StreamHandle current_stream(int device);
void set_current_stream(int device, StreamHandle stream);
StreamHandle create_stream();
void destroy_stream(StreamHandle stream);

// Makes stream current for device for the guard's lifetime.
class StreamGuard {
 public:
  StreamGuard(int device, StreamHandle stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  StreamHandle previous_;
};

}  // namespace cuda
}  // namespace normcore
