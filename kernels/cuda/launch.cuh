// What every CUDA launcher starts with, in one place: the op's device made current, its
// current stream, grid sizes, and the check after each launch. A launcher reads
//   const Launcher launch("layer_norm", x);
//   launch(kernel, grid, block, shared_bytes, args...);
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "kernels/cuda/limits.h"
#include "normcore/tensor.h"
#include "runtime/cuda/check.h"
#include "runtime/cuda/runtime.h"

namespace normcore {
namespace cuda {

constexpr int kThreads = 256;  // threads per block unless a kernel says otherwise

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The kernels of one op on one device. Makes the device current for its lifetime and queues
// every launch on the device's current stream; a failed launch throws CudaError naming the
// op in scope, else op.
class Launcher {
 public:
  Launcher(const char* op, int device) : op_(op), device_(device), guard_(device), stream_(cuda::stream(device)) {}
  Launcher(const char* op, const Tensor& on) : Launcher(op, on.device().index) {}

  const char* op() const { return op_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  int multiprocessors() const { return multiprocessor_count(device_); }
  int shared_memory_per_block() const { return cuda::shared_memory_per_block(device_); }
  DeviceLimits limits() const { return {multiprocessors(), shared_memory_per_block(), cluster_blocks(device_)}; }

  // kernel<<<grid, block, shared_bytes, stream>>>(args...), then the launch check.
  template <class... Params, class... Args>
  void operator()(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, Args&&... args) const {
    kernel<<<grid, block, shared_bytes, stream_>>>(std::forward<Args>(args)...);
    check();
  }

  // The same in thread-block clusters of cluster_size blocks along x (grid a multiple of it).
  template <class... Params, class... Args>
  void clusters(void (*kernel)(Params...), unsigned grid, unsigned block, size_t shared_bytes, unsigned cluster_size,
                Args&&... args) const {
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = cluster_size;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(grid);
    config.blockDim = dim3(block);
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream_;
    config.attrs = &cluster;
    config.numAttrs = 1;
    cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);  // a failure is the launch check's
    check();
  }

  // The launch check, for a kernel launched on stream() by hand.
  void check() const { check_launch(op_); }

  // Blocks for a grid-stride loop over `work` items, one per thread: enough to fill the
  // device several times over, never more than the work needs.
  unsigned grid_for(int64_t work, int threads = kThreads) const {
    const int64_t needed = ceil_div(work, threads);
    const int64_t cap = static_cast<int64_t>(multiprocessors()) * 32;
    return static_cast<unsigned>(std::max<int64_t>(1, std::min(needed, cap)));
  }

  // Blocks for a persistent kernel: as many as fit on the device at once, at most `wanted`
  // (at least one).
  template <class... Params>
  unsigned resident_grid(void (*kernel)(Params...), int threads, size_t shared_bytes, int64_t wanted) const {
    int per_sm = 0;
    NC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, shared_bytes));
    const int64_t resident = static_cast<int64_t>(std::max(per_sm, 1)) * multiprocessors();
    return static_cast<unsigned>(std::max<int64_t>(1, std::min(resident, wanted)));
  }

  // Lets kernel use shared_bytes of dynamic shared memory (above the default 48 KB).
  template <class... Params>
  void allow_shared_memory(void (*kernel)(Params...), size_t shared_bytes) const {
    NC_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes)));
  }

  // Device memory for temporaries, returned to the cache at the end of the caller's scope.
  DeviceBuffer buffer(size_t bytes) const { return DeviceBuffer(bytes, device_); }

 private:
  const char* op_;
  int device_;
  DeviceGuard guard_;
  cudaStream_t stream_;
};

}  // namespace cuda
}  // namespace normcore
