// The caching device allocator: per device, freed blocks stay reserved in a cache and are
// handed out again for later requests of a similar size, so a steady training loop calls
// cudaMalloc only while it warms up. Sizes are rounded up to 512 bytes; a cached block is
// reused when it is at most a quarter larger than the request (blocks are never split).
//
// Reuse is stream-ordered: a block freed while kernels on its stream may still use it is
// handed out again only for work on that same stream, which runs after them. Each block
// remembers the stream current when it was allocated; a tensor used on another stream
// must be synchronized by the user before it is freed (normcore itself queues everything
// for a device on that device's one current stream).
//
// CUDA graphs get private pools (pool > 0; the shared cache is pool 0). While a graph is
// captured on a device, its allocations come from its pool and every block freed goes to
// it, whatever pool it came from: the graph may read or write any of them on each replay,
// so none may serve work outside the graph until the graph is destroyed. A capture takes
// free blocks of the shared cache too (they become the graph's). Nothing is
// returned to the driver during a capture (cudaFree cannot be captured).
#include <algorithm>
#include <cstdio>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>

#include "kernels/cuda/check.h"
#include "kernels/cuda/runtime.h"
#include "normcore/cuda.h"

namespace normcore {
namespace cuda {
namespace {

constexpr size_t kGranularity = 512;

size_t round_up(size_t nbytes) { return (nbytes + kGranularity - 1) / kGranularity * kGranularity; }
// The largest cached block a request of size bytes may take.
size_t max_reuse_size(size_t size) { return size + size / 4; }

struct CachedBlock {
  uint64_t pool;
  cudaStream_t stream;
  size_t size;
  void* ptr;
  bool operator<(const CachedBlock& o) const {
    return std::tie(pool, stream, size, ptr) < std::tie(o.pool, o.stream, o.size, o.ptr);
  }
};

struct LiveBlock {
  size_t size;
  cudaStream_t stream;
  uint64_t pool;
};

struct DevicePool {
  std::mutex mutex;
  std::set<CachedBlock> cached;  // by pool, stream, then size: best fit is a lower_bound
  std::unordered_map<void*, LiveBlock> live;
  uint64_t capture_pool = 0;  // the pool of the graph being captured; 0: none
  MemoryStats stats;
};

// The shared pool's cached blocks: [begin, shared_end(p)).
std::set<CachedBlock>::iterator shared_end(DevicePool& p) {
  return p.cached.lower_bound(CachedBlock{1, nullptr, 0, nullptr});
}

// Never destroyed: tensors freed during static destruction still return their blocks.
DevicePool& pool(int device) {
  static DevicePool* pools = new DevicePool[std::max(device_count(), 1)];
  return pools[device];
}

// Frees the cached blocks of pool in [first, last). Caller holds the pool's mutex.
void release_cached(DevicePool& p, int device, std::set<CachedBlock>::iterator first,
                    std::set<CachedBlock>::iterator last) {
  if (first == last) return;
  DeviceGuard guard(device);
  for (auto it = first; it != last; ++it) {
    NC_CUDA_CHECK(cudaFree(it->ptr));  // waits for work still using the block
    p.stats.reserved -= it->size;
  }
  p.cached.erase(first, last);
}

// cudaMalloc, and on failure once more after freeing the cache. Caller holds the mutex.
void* malloc_with_retry(DevicePool& p, int device, size_t size, size_t requested) {
  DeviceGuard guard(device);
  void* ptr = nullptr;
  cudaError_t status = cudaMalloc(&ptr, size);
  if (status == cudaErrorMemoryAllocation && p.capture_pool == 0) {
    cudaGetLastError();  // not sticky: clear it so the retry and later calls start clean
    release_cached(p, device, p.cached.begin(), shared_end(p));
    status = cudaMalloc(&ptr, size);
  }
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    ++p.stats.num_ooms;
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) cudaGetLastError();
    throw OutOfMemoryError(with_op(detail::cat_str(
        "CUDA out of memory on cuda:", device, ": tried to allocate ", requested, " bytes (",
        requested >> 20, " MiB); the device has ", free_bytes, " bytes free of ", total_bytes,
        ", normcore holds ", p.stats.allocated, " bytes in tensors and no cached blocks")));
  }
  check(status, "cudaMalloc", __FILE__, __LINE__);
  ++p.stats.num_device_mallocs;
  p.stats.reserved += size;
  return ptr;
}

}  // namespace

void* device_alloc(size_t nbytes, int device) {
  if (nbytes == 0) return nullptr;
  size_t size = round_up(nbytes);
  cudaStream_t s = stream(device);
  DevicePool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  void* ptr = nullptr;
  const uint64_t pool_id = p.capture_pool;
  auto fits = [&](uint64_t from) {
    auto it = p.cached.lower_bound(CachedBlock{from, s, size, nullptr});
    const bool ok = it != p.cached.end() && it->pool == from && it->stream == s && it->size <= max_reuse_size(size);
    return ok ? it : p.cached.end();
  };
  auto it = fits(pool_id);
  // A capture may also take a free block of the shared cache: the work that used it was
  // queued on this stream before the graph's replays can be.
  if (it == p.cached.end() && pool_id != 0) it = fits(0);
  if (it != p.cached.end()) {
    ptr = it->ptr;
    size = it->size;
    p.cached.erase(it);
    ++p.stats.num_cache_hits;
  } else {
    ptr = malloc_with_retry(p, device, size, nbytes);
  }
  p.live.emplace(ptr, LiveBlock{size, s, pool_id});
  ++p.stats.num_allocs;
  p.stats.allocated += size;
  p.stats.peak_allocated = std::max(p.stats.peak_allocated, p.stats.allocated);
  return ptr;
}

void device_free(void* ptr, size_t /*nbytes: the block remembers its rounded size*/, int device) {
  if (ptr == nullptr) return;
  try {
    DevicePool& p = pool(device);
    std::lock_guard<std::mutex> lock(p.mutex);
    auto it = p.live.find(ptr);
    if (it == p.live.end()) {
      std::fprintf(stderr, "normcore: device_free: %p was not allocated on cuda:%d\n", ptr, device);
      return;
    }
    const uint64_t pool_id = p.capture_pool != 0 ? p.capture_pool : it->second.pool;
    p.cached.insert(CachedBlock{pool_id, it->second.stream, it->second.size, ptr});
    p.stats.allocated -= it->second.size;
    p.live.erase(it);
  } catch (const std::exception& e) {
    // Called from storage destructors: report, never throw.
    std::fprintf(stderr, "normcore: device_free: %s\n", e.what());
  }
}

void release_stream_blocks(int device, cudaStream_t s) {
  DevicePool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  auto first = p.cached.lower_bound(CachedBlock{0, s, 0, nullptr});
  auto last = first;
  while (last != p.cached.end() && last->pool == 0 && last->stream == s) ++last;
  release_cached(p, device, first, last);
}

void begin_private_pool(int device, uint64_t pool_id) {
  DevicePool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  p.capture_pool = pool_id;
}

void end_private_pool(int device) {
  DevicePool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  p.capture_pool = 0;
}

void release_private_pool(int device, uint64_t pool_id) {
  DevicePool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  auto first = p.cached.lower_bound(CachedBlock{pool_id, nullptr, 0, nullptr});
  auto last = p.cached.lower_bound(CachedBlock{pool_id + 1, nullptr, 0, nullptr});
  for (auto it = first; it != last; ++it) p.cached.insert(CachedBlock{0, it->stream, it->size, it->ptr});
  p.cached.erase(first, last);
  for (auto& entry : p.live) {
    if (entry.second.pool == pool_id) entry.second.pool = 0;
  }
}


MemoryStats memory_stats(int device) {
  check_device("cuda::memory_stats", device);
  DevicePool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  return p.stats;
}

void reset_peak_memory_stats(int device) {
  check_device("cuda::reset_peak_memory_stats", device);
  DevicePool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  p.stats.peak_allocated = p.stats.allocated;
}

void empty_cache() {
  for (int device = 0; device < device_count(); ++device) {
    DevicePool& p = pool(device);
    std::lock_guard<std::mutex> lock(p.mutex);
    if (p.capture_pool == 0) release_cached(p, device, p.cached.begin(), shared_end(p));
  }
}

}  // namespace cuda
}  // namespace normcore
