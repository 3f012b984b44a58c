// What core and the optimizers need to know about CUDA graph capture (runtime/cuda/graph.cu);
// a CPU-only build never captures.
#pragma once

#include <cstdint>

#include "normcore/random.h"

namespace normcore {
namespace cuda {

// Whether a CUDA graph is being captured on device.
bool capturing(int device);
inline bool capturing(Device device) { return device.is_cuda() && capturing(device.index); }

// The Philox offset of a kernel that draws n counters from gen on device: outside a
// capture gen.advance(n) and base nullptr; inside one, an offset relative to *base, a
// device word the graph sets to gen.advance(total) before each replay, so every replay
// draws new numbers, the ones an uncaptured run would.
struct RandomOffset {
  uint64_t offset;
  const uint64_t* base;
};
RandomOffset random_offset(Generator& gen, uint64_t n, int device);

}  // namespace cuda
}  // namespace normcore
