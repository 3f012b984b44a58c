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
// One class a row of logits [rows, V] (floating, on any device), drawn as text generation
// does: from softmax(logits / temperature) over the classes whose logit is at least the
// top_k-th largest (all of them when top_k is 0 or at least V), and among those over the
// fewest most likely whose probabilities reach top_p -> i64 [rows]. Row r's draw is the f64
// uniform rand would give counter r of gen (the default generator when null), which
// advances by rows; inside a CUDA graph capture each replay draws anew, as dropout does.
// temperature finite and > 0, top_k >= 0, top_p in (0, 1]. Where the CPU and a GPU may
// choose differently (ties at the top_p cut, rounding at a boundary): kernels/generate.h.
Tensor sample_logits(const Tensor& logits, double temperature, int64_t top_k = 0, double top_p = 1.0,
                     Generator* gen = nullptr);

}  // namespace normcore

#pragma GCC visibility pop
