// What the hook registries share (autograd's gradient and ready hooks, modules' forward
// hooks): one process-wide id counter, and removal of an entry by id from a list of
// (id, hook) pairs, or of entries whose id id_of tells.
#pragma once

#include <algorithm>
#include <cstdint>

namespace normcore {
namespace autograd {

// A new hook id, unique in the process.
int64_t next_hook_id();

template <class List, class IdOf>
void erase_hook(List& list, int64_t id, IdOf id_of) {
  list.erase(std::remove_if(list.begin(), list.end(), [&](const auto& h) { return id_of(h) == id; }), list.end());
}

template <class List>
void erase_hook(List& list, int64_t id) {
  erase_hook(list, id, [](const auto& h) { return h.first; });
}

}  // namespace autograd
}  // namespace normcore
