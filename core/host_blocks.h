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

}  // namespace detail
}  // namespace normcore
