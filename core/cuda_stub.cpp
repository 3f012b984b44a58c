// The public CUDA runtime API in a CPU-only build: queries report nothing, the rest throws.
#ifndef NORMCORE_HAS_CUDA

#include "core/internal.h"
#include "normcore/cuda.h"
#include "runtime/cuda/capture.h"

namespace normcore {
namespace cuda {

MemoryStats memory_stats(int) { detail::throw_no_cuda("cuda::memory_stats"); }
void reset_peak_memory_stats(int) { detail::throw_no_cuda("cuda::reset_peak_memory_stats"); }
void empty_cache() {}
void mem_get_info(int, size_t*, size_t*) { detail::throw_no_cuda("cuda::mem_get_info"); }
int current_device() { detail::throw_no_cuda("cuda::current_device"); }
void set_device(int) { detail::throw_no_cuda("cuda::set_device"); }
void synchronize(int) { detail::throw_no_cuda("cuda::synchronize"); }
void check_errors(int) { detail::throw_no_cuda("cuda::check_errors"); }
uint64_t host_waits(int) { detail::throw_no_cuda("cuda::host_waits"); }
StreamHandle current_stream(int) { detail::throw_no_cuda("cuda::current_stream"); }
void set_current_stream(int, StreamHandle) { detail::throw_no_cuda("cuda::set_current_stream"); }
StreamHandle create_stream() { detail::throw_no_cuda("cuda::create_stream"); }
void destroy_stream(StreamHandle) { detail::throw_no_cuda("cuda::destroy_stream"); }
StreamGuard::StreamGuard(int, StreamHandle) : device_(0), previous_(nullptr) {
  detail::throw_no_cuda("cuda::StreamGuard");
}
StreamGuard::~StreamGuard() = default;

bool capturing(int) { return false; }
RandomOffset random_offset(Generator& gen, uint64_t n, int) { return {gen.advance(n), nullptr}; }

struct Graph::Impl {};
Graph::Graph() : impl_(new Impl) {}
Graph::~Graph() = default;
void Graph::capture(int, const std::function<void()>&) { detail::throw_no_cuda("cuda::Graph::capture"); }
void Graph::replay() { detail::throw_no_cuda("cuda::Graph::replay"); }
void Graph::synchronize() {}
bool Graph::captured() const { return false; }
size_t Graph::num_nodes() const { return 0; }

}  // namespace cuda
}  // namespace normcore

#endif  // NORMCORE_HAS_CUDA
