// Reductions over the rows of a contiguous [outer, inner] matrix; core/reduce.cpp moves the
// reduced dims to the end (copying only when the layout needs it) and records the backward.
#pragma once

#include "kernels/backend.h"

namespace normcore {

enum class ReduceOp {
  Sum,   // out: i64 for integer/bool x, else x's dtype; empty -> 0
  Prod,  // as Sum; empty -> 1
  Mean,  // floating; empty -> NaN
  Var,   // floating; two-pass; divides by inner - arg (arg = correction: 0 or 1); inner - arg <= 0 -> NaN
  Norm,  // floating; arg = p > 0 (inf allowed: max |x|); empty -> 0
  Max,
  Min,  // x's dtype; NaN propagates; inner > 0
  All,
  Any  // out Bool; empty -> true / false
};

namespace kernels {

class ReduceKernels {
 public:
  // x contiguous [outer, inner]; out contiguous [outer] (dtype: see ReduceOp).
  virtual void reduce(ReduceOp op, const Tensor& out, const Tensor& x, double arg) const = 0;
  // x contiguous [outer, inner], inner > 0; values [outer] x's dtype, indices [outer] i64;
  // the first index of the max (min); a NaN wins and its first index is taken.
  virtual void arg_reduce(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& x) const = 0;

 protected:
  ~ReduceKernels() = default;
};

}  // namespace kernels

namespace cpu {
const kernels::ReduceKernels& reduce_kernels();
}
namespace cuda {
const kernels::ReduceKernels& reduce_kernels();
}

namespace kernels {
inline const ReduceKernels& reduce(Device device) {
  return for_device(device, cpu::reduce_kernels, NC_CUDA_KERNELS(reduce_kernels), "reduce");
}
}  // namespace kernels

}  // namespace normcore
