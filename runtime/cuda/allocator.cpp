// The caching device allocator: per device, freed blocks stay reserved in a cache and are
// handed out again for later requests, so a steady training loop calls cudaMalloc only
// while it warms up. Sizes are rounded up to 512 bytes. A request under 1 MiB takes the
// smallest cached block that fits when it is at most a quarter larger; a request of 1 MiB
// or more takes the smallest that fits, cut to its size when at least 1 MiB would be left
// (the rest stays cached). A block freed next to a free neighbour of its cudaMalloc segment
// merges with it: a training step whose largest tensor (a language model's logits) dies
// early then serves the rest of its backward from that memory instead of new cudaMallocs.
// Only whole segments go back to the driver.
//
// Reuse is stream-ordered: a block freed while kernels on its stream may still use it is
// handed out again only for work on that same stream, which runs after them. Each block
// remembers the stream current when its segment was allocated (a segment's blocks share
// it); a tensor used on another stream must be synchronized by the user before it is freed
// (normcore itself queues everything for a device on that device's one current stream).
//
// CUDA graphs get private pools (pool > 0; the shared cache is pool 0). While a graph is
// captured on a device, its allocations come from its pool and every block freed goes to
// it, whatever pool it came from: the graph may read or write any of them on each replay,
// so none may serve work outside the graph until the graph is destroyed. A capture takes
// free blocks of the shared cache too (they become the graph's). Blocks merge only within
// one pool. Nothing is returned to the driver during a capture (cudaFree cannot be captured).
#include <algorithm>
#include <cstdio>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "normcore/cuda.h"
#include "runtime/cuda/check.h"
#include "runtime/cuda/runtime.h"

namespace normcore {
namespace cuda {
namespace {

constexpr size_t kGranularity = 512;
constexpr size_t kMinSplit = size_t{1} << 20;  // the least request, and the least rest, of a cut

size_t round_up(size_t nbytes) { return (nbytes + kGranularity - 1) / kGranularity * kGranularity; }
// The largest cached block a request of size bytes takes whole.
size_t max_reuse_size(size_t size) { return size + size / 4; }

struct CachedBlock {
  uint64_t pool;
  cudaStream_t stream;
  size_t size;
  char* ptr;
  bool operator<(const CachedBlock& o) const {
    return std::tie(pool, stream, size, ptr) < std::tie(o.pool, o.stream, o.size, o.ptr);
  }
};

// Every block, live or cached, by address: a segment's blocks are neighbours.
struct Block {
  size_t size;
  char* segment;  // the cudaMalloc'd pointer the block lies in
  size_t segment_size;
  cudaStream_t stream;
  uint64_t pool;
  bool free;
};

struct DevicePool {
  std::mutex mutex;
  std::set<CachedBlock> cached;  // the free blocks by pool, stream, then size: best fit is a lower_bound
  std::map<char*, Block> blocks;
  uint64_t capture_pool = 0;  // the pool of the graph being captured; 0: none
  MemoryStats stats;
};

CachedBlock key(char* ptr, const Block& b) { return CachedBlock{b.pool, b.stream, b.size, ptr}; }

bool whole_segment(char* ptr, const Block& b) { return ptr == b.segment && b.size == b.segment_size; }

// The shared pool's cached blocks: [begin, shared_end(p)).
std::set<CachedBlock>::iterator shared_end(DevicePool& p) {
  return p.cached.lower_bound(CachedBlock{1, nullptr, 0, nullptr});
}

// Never destroyed: tensors freed during static destruction still return their blocks.
DevicePool& pool(int device) {
  static DevicePool* pools = new DevicePool[std::max(device_count(), 1)];
  return pools[device];
}

// Counts a block into or out of stats.split_cached when it is a part of its segment.
void count_split(DevicePool& p, char* ptr, const Block& b, bool add) {
  if (whole_segment(ptr, b)) return;
  if (add) p.stats.split_cached += b.size;
  else p.stats.split_cached -= b.size;
}

void uncache(DevicePool& p, std::map<char*, Block>::iterator it) {
  p.cached.erase(key(it->first, it->second));
  count_split(p, it->first, it->second, false);
  it->second.free = false;
}

// Puts the block at it (free now, not cached) into the cache, merged with the cached
// neighbours of its segment and pool. Caller holds the mutex.
void cache_block(DevicePool& p, std::map<char*, Block>::iterator it) {
  auto mergeable = [&](std::map<char*, Block>::iterator other) {
    return other->second.free && other->second.segment == it->second.segment && other->second.pool == it->second.pool;
  };
  if (auto next = std::next(it); next != p.blocks.end() && mergeable(next)) {
    uncache(p, next);
    it->second.size += next->second.size;
    p.blocks.erase(next);
  }
  if (it != p.blocks.begin()) {
    if (auto prev = std::prev(it); mergeable(prev)) {
      uncache(p, prev);
      prev->second.size += it->second.size;
      p.blocks.erase(it);
      it = prev;
    }
  }
  it->second.free = true;
  p.cached.insert(key(it->first, it->second));
  count_split(p, it->first, it->second, true);
}

// Frees the whole-segment cached blocks among [first, last) of the cache. Caller holds the
// pool's mutex.
void release_cached(DevicePool& p, int device, std::set<CachedBlock>::iterator first,
                    std::set<CachedBlock>::iterator last) {
  if (first == last) return;
  DeviceGuard guard(device);
  for (auto it = first; it != last;) {
    auto block = p.blocks.find(it->ptr);
    if (!whole_segment(it->ptr, block->second)) {
      ++it;
      continue;
    }
    NC_CUDA_CHECK(cudaFree(it->ptr));  // waits for work still using the block
    p.stats.reserved -= it->size;
    p.blocks.erase(block);
    it = p.cached.erase(it);
  }
}

// cudaMalloc, and on failure once more after freeing the cache. Caller holds the mutex.
char* malloc_with_retry(DevicePool& p, int device, size_t size, size_t requested) {
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
    throw OutOfMemoryError(
        with_op(detail::cat_str("CUDA out of memory on cuda:", device, ": tried to allocate ", requested, " bytes (",
                                requested >> 20, " MiB); the device has ", free_bytes, " bytes free of ", total_bytes,
                                ", normcore holds ", p.stats.allocated, " bytes in tensors and ", p.stats.split_cached,
                                " bytes cached in parts of segments (the driver takes back only whole ones)")));
  }
  check(status, "cudaMalloc", __FILE__, __LINE__);
  ++p.stats.num_device_mallocs;
  p.stats.reserved += size;
  return static_cast<char*>(ptr);
}

}  // namespace

void* device_alloc(size_t nbytes, int device) {
  if (nbytes == 0) return nullptr;
  const size_t size = round_up(nbytes);
  cudaStream_t s = stream(device);
  DevicePool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  const uint64_t pool_id = p.capture_pool;
  // The best cached block of pool `from`: the smallest that fits, for a small request only
  // when it is at most a quarter larger.
  auto fits = [&](uint64_t from) {
    auto it = p.cached.lower_bound(CachedBlock{from, s, size, nullptr});
    if (it == p.cached.end() || it->pool != from || it->stream != s) return p.cached.end();
    return it->size <= max_reuse_size(size) || size >= kMinSplit ? it : p.cached.end();
  };
  auto it = fits(pool_id);
  // A capture may also take a free block of the shared cache: the work that used it was
  // queued on this stream before the graph's replays can be.
  if (it == p.cached.end() && pool_id != 0) it = fits(0);
  std::map<char*, Block>::iterator block;
  if (it != p.cached.end()) {
    block = p.blocks.find(it->ptr);
    uncache(p, block);
    if (size >= kMinSplit ? block->second.size - size >= kMinSplit : block->second.size > max_reuse_size(size)) {
      // The front is the request's; the rest stays cached, in the graph's pool when a capture
      // cuts a block of the shared one (the segment is then the graph's to merge and reuse
      // whole, and the shared cache keeps only segments it can return).
      Block rest = block->second;
      rest.size = block->second.size - size;
      rest.pool = pool_id;
      block->second.size = size;
      auto rest_it = p.blocks.emplace(block->first + size, rest).first;
      rest_it->second.free = false;
      cache_block(p, rest_it);
    }
    ++p.stats.num_cache_hits;
  } else {
    char* ptr = malloc_with_retry(p, device, size, nbytes);
    block = p.blocks.emplace(ptr, Block{size, ptr, size, s, pool_id, false}).first;
  }
  block->second.free = false;
  block->second.pool = pool_id;
  ++p.stats.num_allocs;
  p.stats.allocated += block->second.size;
  p.stats.peak_allocated = std::max(p.stats.peak_allocated, p.stats.allocated);
  return block->first;
}

void device_free(void* ptr, size_t /*nbytes: the block remembers its rounded size*/, int device) {
  if (ptr == nullptr) return;
  try {
    DevicePool& p = pool(device);
    std::lock_guard<std::mutex> lock(p.mutex);
    auto it = p.blocks.find(static_cast<char*>(ptr));
    if (it == p.blocks.end() || it->second.free) {
      std::fprintf(stderr, "normcore: device_free: %p was not allocated on cuda:%d\n", ptr, device);
      return;
    }
    if (p.capture_pool != 0) it->second.pool = p.capture_pool;
    p.stats.allocated -= it->second.size;
    cache_block(p, it);
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
  // Its live blocks join the shared pool (they are freed there); its cached ones too,
  // merged with the shared pool's free neighbours.
  std::vector<char*> freed;
  for (auto& [ptr, block] : p.blocks) {
    if (block.pool != pool_id) continue;
    if (block.free) {
      p.cached.erase(key(ptr, block));
      count_split(p, ptr, block, false);
      block.free = false;  // out of the cache until cache_block below
      freed.push_back(ptr);
    }
    block.pool = 0;
  }
  for (char* ptr : freed) cache_block(p, p.blocks.find(ptr));
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
