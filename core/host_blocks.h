// Host memory for tensors' storage, with large blocks kept for reuse (core/host_blocks.cpp).
#pragma once

#include <cstddef>

namespace normcore {
namespace detail {

// 64-byte aligned memory for nbytes (> 0), or nullptr when there is none.
void* host_alloc(size_t nbytes);
// Gives back what host_alloc(nbytes) returned.
void host_free(void* data, size_t nbytes);
// Whether freed large blocks are kept (not under AddressSanitizer), and their bytes now.
bool host_keeps_blocks();
size_t host_cached_bytes();
// The most bytes of large blocks the process has had in use at once (what may be kept).
size_t host_peak_bytes();
// Gives every kept block back to the system.
void host_release_blocks();
// Sets the most bytes kept (giving back the blocks freed longest ago to get under it) and
// returns the limit before; 0 where blocks are not kept.
size_t host_block_limit(size_t bytes);

}  // namespace detail
}  // namespace normcore
