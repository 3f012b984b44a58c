// Kernels that make values from element indices alone: sequences (arange, linspace) and
// random numbers. core/factories.cpp checks arguments and sizes. Element i of a random
// tensor depends on (seed, offset + i) only (Philox, base/philox.h), so both backends draw
// the same numbers whatever their thread layout.
#pragma once

#include <cstdint>

#include "kernels/backend.h"

namespace normcore {
namespace kernels {

class GenerateKernels {
 public:
  // out contiguous 1-D: out[i] = start + i * step, computed in double.
  virtual void arange(const Tensor& out, double start, double step) const = 0;
  // out contiguous 1-D of n >= 2: start + i * step for i < n / 2, end - (n - 1 - i) * step
  // after (both ends exact), step = (end - start) / (n - 1).
  virtual void linspace(const Tensor& out, double start, double end) const = 0;
  // out contiguous floating: uniform on [0, 1), standard normal; out any dtype but bool:
  // low + (64 random bits mod range).
  virtual void random_uniform(const Tensor& out, uint64_t seed, uint64_t offset) const = 0;
  virtual void random_normal(const Tensor& out, uint64_t seed, uint64_t offset) const = 0;
  virtual void random_int(const Tensor& out, uint64_t seed, uint64_t offset, int64_t low, uint64_t range) const = 0;
  // Dropout in one pass (element math in kernels/scalar/dropout.h): keep[i] from
  // (seed, offset + i) and threshold = f32(p), out[i] = x[i] * scale or x[i] * 0. x and out
  // contiguous of one floating dtype, keep contiguous bool, all of one shape. offset_base
  // (CUDA only, else nullptr): a device word added to offset when the kernel runs, for
  // kernels replayed by a CUDA graph (runtime/cuda/capture.h).
  virtual void dropout(const Tensor& x, const Tensor& out, const Tensor& keep, uint64_t seed, uint64_t offset,
                       const uint64_t* offset_base, float threshold, double scale) const = 0;
  // out[i] = x[i] * scale where keep[i], x[i] * 0 elsewhere (dropout's backward); the
  // layouts as for dropout.
  virtual void masked_scale(const Tensor& x, const Tensor& keep, double scale, const Tensor& out) const = 0;
  // sample_logits (normcore/ops.h): logits [rows, V] contiguous floating, out [rows] i64;
  // temperature > 0, top_k in [0, V], top_p in (0, 1]. Row r's draw u is rand's f64 uniform
  // of counter offset + r (offset_base as dropout's). Per row, with
  // m its max and w_j = exp((x_j - m) / temperature) in double: the kept classes are those
  // whose logit is at least the top_k-th largest (all when top_k is 0 or V; ties kept), then
  // the fewest of the largest logits whose w reach top_p of the kept total; out is the first
  // class j in index order whose running sum of kept w passes u times their total (the
  // row's first maximum when rounding leaves none). The CPU keeps ties at the top_p cut in
  // index order; CUDA keeps them all, and sums in another order: rows whose draw falls
  // within rounding of a boundary may choose differently between the two.
  virtual void sample_logits(const Tensor& logits, uint64_t seed, uint64_t offset, const uint64_t* offset_base,
                             double temperature, int64_t top_k, double top_p, const Tensor& out) const = 0;

 protected:
  ~GenerateKernels() = default;
};

}  // namespace kernels

namespace cpu {
const kernels::GenerateKernels& generate_kernels();
}
namespace cuda {
const kernels::GenerateKernels& generate_kernels();
}

namespace kernels {
inline const GenerateKernels& generate(Device device) {
  return for_device(device, cpu::generate_kernels, NC_CUDA_KERNELS(generate_kernels), "generate");
}
}  // namespace kernels

}  // namespace normcore
