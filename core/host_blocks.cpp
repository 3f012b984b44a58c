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
// The cache stays bounded by what the process recently freed: a request that finds no block
// of its size gives every kept block back to the system first (so sizes that changed do not
// pile up), and the kept bytes never pass a quarter of the machine's memory. Built with
// AddressSanitizer, blocks are not kept, so that a use after free is still caught.
#include "core/host_blocks.h"

#include <unistd.h>

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
  void* take(size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(size);
    if (it == blocks_.end()) {
      release_all();  // another size: what is kept is not what this process allocates now
      return nullptr;
    }
    void* data = it->second;
    blocks_.erase(it);
    kept_ -= size;
    return data;
  }

  bool keep(void* data, size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (kept_ + size > limit_) return false;
    blocks_.emplace(size, data);
    kept_ += size;
    return true;
  }

  size_t kept() {
    std::lock_guard<std::mutex> lock(mutex_);
    return kept_;
  }

 private:
  void release_all() {
    for (const auto& block : blocks_) std::free(block.second);
    blocks_.clear();
    kept_ = 0;
  }

  static size_t machine_quarter() {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return 1024 * kMiB;
    return static_cast<size_t>(pages) / 4 * static_cast<size_t>(page);
  }

  std::mutex mutex_;
  std::multimap<size_t, void*> blocks_;
  size_t kept_ = 0;
  const size_t limit_ = machine_quarter();
};

// Never destroyed: tensors may be freed during static destruction.
BlockCache& cache() {
  static BlockCache* instance = new BlockCache;
  return *instance;
}

}  // namespace

void* host_alloc(size_t nbytes) {
  const size_t size = rounded_size(nbytes);
  if (kKeepBlocks && size >= kMinBytes) {
    if (void* data = cache().take(size)) return data;
  }
  return std::aligned_alloc(64, size);
}

void host_free(void* data, size_t nbytes) {
  if (!data) return;
  const size_t size = rounded_size(nbytes);
  if (kKeepBlocks && size >= kMinBytes && cache().keep(data, size)) return;
  std::free(data);
}

bool host_keeps_blocks() { return kKeepBlocks; }
size_t host_cached_bytes() { return kKeepBlocks ? cache().kept() : 0; }

}  // namespace detail
}  // namespace normcore
