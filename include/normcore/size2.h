// Size2, the (height, width) pairs of the image ops' arguments (normcore/conv.h,
// normcore/pool.h, the layers of normcore/nn.h).
#pragma once

#include <cstdint>

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {

// A (height, width) pair: Size2(3) is 3x3, Size2(3, 1) or {3, 1} is 3 high and 1 wide.
// The default, Size2(), is "not given" (both 0): a pooling stride that is not given is the
// kernel size, as in PyTorch.
struct Size2 {
  int64_t h = 0;
  int64_t w = 0;
  Size2() = default;
  Size2(int64_t both) : h(both), w(both) {}  // NOLINT: implicit, like PyTorch's int-or-pair
  Size2(int64_t h, int64_t w) : h(h), w(w) {}
  bool given() const { return h != 0 || w != 0; }
  bool operator==(const Size2& o) const { return h == o.h && w == o.w; }
  bool operator!=(const Size2& o) const { return !(*this == o); }
};

}  // namespace normcore

#pragma GCC visibility pop
