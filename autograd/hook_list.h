// What the hook registries share (autograd's gradient and ready hooks, modules' forward
// hooks): one process-wide id counter, and removal of an entry by id from a list of
// (id, hook) pairs.
#pragma once

#include <algorithm>
#include <cstdint>

namespace normcore {
namespace autograd {

// A new hook id, unique in the process.
int64_t next_hook_id();

template <class List>
void erase_hook(List& list, int64_t id) {
  list.erase(std::remove_if(list.begin(), list.end(), [id](const auto& h) { return h.first == id; }), list.end());
}

}  // namespace autograd
}  // namespace normcore
