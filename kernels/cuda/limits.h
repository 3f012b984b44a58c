// What kernel plans need to know of a device (plain C++: plans are tested without a GPU).
#pragma once

namespace normcore {
namespace cuda {

struct DeviceLimits {
  int multiprocessors;
  int shared_memory_per_block;  // bytes one block may opt in to
};

}  // namespace cuda
}  // namespace normcore
