// Host memory for tensors' storage (core/host_blocks.h).
//
// glibc serves a block of more than 32 MiB with mmap and unmaps it when it is freed (smaller
// ones come back into its heap, which it trims beyond a threshold), so every large tensor's
// pages fault in again on first touch: a few microseconds a 4 KiB page on a virtual
// machine. ResNet-50 at batch 64 on two cores spent 80% of its time there (9.6 s a run, 1.9 s
// with glibc's mmap turned off). Freed blocks of kMinBytes or more are therefore kept, by
// size rounded up to a MiB, and handed out again for the same rounded size: a model run
// over and over, or a training step, allocates the same sizes each time.
//
// The cache stays bounded: the kept bytes never pass the most large-block bytes the process
// has had in use at once (so a run repeated holds no more than its peak) nor a quarter of the
// machine's memory, and keeping a block past that first gives back the blocks freed longest
// ago, so sizes no longer asked for leave as new ones come. A request that finds no block of its size
// takes new memory and leaves the kept ones alone: giving them all back there (as this cache
// first did) made one new size in a run fault every other block in again, and a run whose
// sizes repeat but peak differently (ResNet-50 at batch 64 with its stem channels last) paid
// that on every run. An allocation that fails gives the kept blocks back and tries again.
// Built with AddressSanitizer, blocks are not kept, so that a use after free is still caught.
#include "core/host_blocks.h"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>

namespace normcore {
namespace detail {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kMinBytes = 4 * kMiB;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kKeepBlocks = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kKeepBlocks = false;
#else
constexpr bool kKeepBlocks = true;
#endif
#else
constexpr bool kKeepBlocks = true;
#endif

size_t rounded_size(size_t nbytes) {
  if (nbytes >= kMinBytes) return (nbytes + kMiB - 1) / kMiB * kMiB;
  return (nbytes + 63) / 64 * 64;  // aligned_alloc wants a multiple of the alignment
}

class BlockCache {
 public:
  // A kept block of size, or nullptr; either way size counts as in use until keep or freed.
  void* take(size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    in_use_ += size;
    peak_ = in_use_ > peak_ ? in_use_ : peak_;
    auto it = by_size_.find(size);
    if (it == by_size_.end()) return nullptr;
    const uint64_t freed = it->second;
    by_size_.erase(it);
    void* data = by_age_.at(freed).data;
    by_age_.erase(freed);
    kept_ -= size;
    return data;
  }

  // Keeps a block of size that was in use, or returns false (the caller frees it).
  bool keep(void* data, size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    in_use_ -= size;
    const size_t limit = limit_ < peak_ ? limit_ : peak_;
    if (size > limit) return false;
    while (kept_ + size > limit) drop(by_age_.begin());  // the longest kept first
    const uint64_t freed = clock_++;
    by_age_.emplace(freed, Block{data, size});
    by_size_.emplace(size, freed);
    kept_ += size;
    return true;
  }

  // What take(size) counted as in use, when no block came of it.
  void not_in_use(size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    in_use_ -= size;
  }

  void release_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    while (!by_age_.empty()) drop(by_age_.begin());
  }

  size_t kept() {
    std::lock_guard<std::mutex> lock(mutex_);
    return kept_;
  }

  size_t peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_;
  }

  size_t set_limit(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t old = limit_;
    limit_ = bytes;
    while (kept_ > limit_) drop(by_age_.begin());
    return old;
  }

 private:
  struct Block {
    void* data;
    size_t size;
  };
  using Age = std::map<uint64_t, Block>::iterator;

  void drop(Age block) {
    const size_t size = block->second.size;
    for (auto [it, end] = by_size_.equal_range(size); it != end; ++it) {
      if (it->second == block->first) {
        by_size_.erase(it);
        break;
      }
    }
    std::free(block->second.data);
    kept_ -= size;
    by_age_.erase(block);
  }

  static size_t machine_quarter() {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return 1024 * kMiB;
    return static_cast<size_t>(pages) / 4 * static_cast<size_t>(page);
  }

  std::mutex mutex_;
  std::map<uint64_t, Block> by_age_;         // by the order they were freed in
  std::multimap<size_t, uint64_t> by_size_;  // size -> when freed (the key in by_age_)
  uint64_t clock_ = 0;
  size_t kept_ = 0;
  size_t in_use_ = 0, peak_ = 0;  // bytes of large blocks handed out and not given back
  size_t limit_ = machine_quarter();
};

// Never destroyed: tensors may be freed during static destruction.
BlockCache& cache() {
  static BlockCache* instance = new BlockCache;
  return *instance;
}

}  // namespace

void* host_alloc(size_t nbytes) {
  const size_t size = rounded_size(nbytes);
  const bool large = kKeepBlocks && size >= kMinBytes;
  if (large) {
    if (void* data = cache().take(size)) return data;
  }
  void* data = std::aligned_alloc(64, size);
  if (data == nullptr && large) {
    cache().release_all();  // kept blocks of other sizes may be what the system is short of
    data = std::aligned_alloc(64, size);
    if (data == nullptr) cache().not_in_use(size);
  }
  return data;
}

void host_free(void* data, size_t nbytes) {
  if (!data) return;
  const size_t size = rounded_size(nbytes);
  if (kKeepBlocks && size >= kMinBytes && cache().keep(data, size)) return;
  std::free(data);
}

bool host_keeps_blocks() { return kKeepBlocks; }
size_t host_cached_bytes() { return kKeepBlocks ? cache().kept() : 0; }
size_t host_peak_bytes() { return kKeepBlocks ? cache().peak() : 0; }
void host_release_blocks() {
  if (kKeepBlocks) cache().release_all();
}
size_t host_block_limit(size_t bytes) { return kKeepBlocks ? cache().set_limit(bytes) : 0; }

}  // namespace detail
}  // namespace normcore
