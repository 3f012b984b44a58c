// Seeded random numbers. A Generator is a Philox-4x32-10 key (the seed) and a counter
// offset; element i of a call draws from counter offset + i, so the same seed gives the
// same numbers on the same device, independent of launch configuration or thread count.
#pragma once

#include <cstdint>
#include <mutex>

#include "normcore/tensor.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  void manual_seed(uint64_t seed);
  uint64_t seed() const;
  // Reserves n counters and returns the first.
  uint64_t advance(uint64_t n);
  // The next counter to be used; with the seed, the generator's whole state (checkpoints
  // store it so that a resumed run draws what an uninterrupted one would).
  uint64_t offset() const;
  void set_offset(uint64_t offset);

 private:
  mutable std::mutex mutex_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The generator used when none is passed (seed 0 until manual_seed is called).
Generator& default_generator();
void manual_seed(uint64_t seed);

// Uniform on [0, 1). Floating dtypes only (default f32).
Tensor rand(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);
// Standard normal. Floating dtypes only (default f32).
Tensor randn(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);
// Uniform integers on [low, high) (default dtype i64).
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);

}  // namespace normcore

#pragma GCC visibility pop
