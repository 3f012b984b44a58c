// What kernel plans need to know of a device (plain C++: plans are tested without a GPU).
#pragma once

namespace normcore {
namespace cuda {

struct DeviceLimits {
  int multiprocessors;
  int shared_memory_per_block;  // bytes one block may opt in to
  int cluster_blocks = 0;       // blocks a thread-block cluster may hold; 0: no clusters
};

}  // namespace cuda
}  // namespace normcore
