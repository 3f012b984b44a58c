// Indexing along one dim: index_select, gather, scatter_add (core/indexing.cpp checks shapes
// and ties them to autograd), and the range check of class targets and embedding indices.
// Indices are i64 in [0, size): a negative one is an error, as in PyTorch (a sentinel such as
// -1 must not select the last row). An index out of range is an IndexError naming the op,
// the value and the size: the CPU throws it before writing anything; CUDA skips the element
// (index_select and gather write 0 there), records the error in the device's deferred record
// and returns without waiting; the host raises it at its next wait for the device
// (runtime/cuda/index_errors.h).
#pragma once

#include <cstdint>
#include <optional>

#include "kernels/backend.h"

namespace normcore {
namespace kernels {

// How check_range words its error: "<op>: <what> V is out of range for N <unit>"
// ("cross_entropy: target value 7 is out of range for 5 classes").
struct RangeMessage {
  const char* op;
  const char* what;
  const char* unit;
};

class IndexKernels {
 public:
  // x contiguous viewed as [outer, size, inner]; index contiguous 1-D i64 of length n;
  // out contiguous [outer, n, inner]. An index outside [0, size) is an IndexError
  // "index_select: index V is out of range for dim D of size S" (the header's rule).
  virtual void index_select(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index) const = 0;
  // x contiguous; index contiguous i64 with x's rank; out contiguous, index's shape;
  // out[..i..] = x[..index[..i..]..] along dim. IndexError out of [0, size), as above.
  virtual void gather(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index) const = 0;
  // out contiguous (+= into it); index contiguous i64; src contiguous, index's shape;
  // out[..index[..i..]..] += src[..i..] along dim. IndexError out of range, as above (on
  // CUDA the good elements are added and the bad ones skipped). dtype not Bool or U8.
  virtual void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) const = 0;
  // out[index[i], :] += src[i, :] for every i (index_select's backward along dim 0, so an
  // embedding's): out contiguous [rows, width], index contiguous 1-D i64 of length n, src
  // contiguous [n, width], one floating dtype. The forward checked the values: the CPU
  // throws for one outside [0, rows), CUDA skips it (the forward recorded the error).
  // Deterministic, unlike scatter_add on CUDA: the same inputs give the same
  // bits on a device (the CPU adds the repeats of a row in index order; CUDA sorts the
  // indices stably and sums each row's repeats in a fixed tree, in compute_t<T>).
  virtual void index_add_rows(const Tensor& out, const Tensor& index, const Tensor& src) const = 0;
  // The range check a front end runs before it indexes with values it did not make
  // (embedding indices, class targets): every value of index (contiguous i64) must lie in
  // [0, size) or equal `allowed` when given (cross_entropy's ignore_index). The error names
  // the op's own terms (message); the CPU names the first bad value, CUDA one of them.
  virtual void check_range(const Tensor& index, int64_t size, std::optional<int64_t> allowed,
                           const RangeMessage& message) const = 0;

 protected:
  ~IndexKernels() = default;
};

}  // namespace kernels

namespace cpu {
const kernels::IndexKernels& index_kernels();
}
namespace cuda {
const kernels::IndexKernels& index_kernels();
}

namespace kernels {
inline const IndexKernels& index(Device device) {
  return for_device(device, cpu::index_kernels, NC_CUDA_KERNELS(index_kernels), "index");
}
}  // namespace kernels

}  // namespace normcore
