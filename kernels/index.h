// Indexing along one dim: index_select, gather, scatter_add (core/indexing.cpp checks shapes
// and ties them to autograd). Indices are i64 in [0, size): a negative one is an error, as
// in PyTorch (a sentinel such as -1 must not select the last row).
#pragma once

#include <cstdint>

#include "kernels/backend.h"

namespace normcore {
namespace kernels {

class IndexKernels {
 public:
  // x contiguous viewed as [outer, size, inner]; index contiguous 1-D i64 of length n;
  // out contiguous [outer, n, inner]. Throws IndexError for an index outside [0, size).
  virtual void index_select(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index) const = 0;
  // x contiguous; index contiguous i64 with x's rank; out contiguous, index's shape;
  // out[..i..] = x[..index[..i..]..] along dim. Throws IndexError out of [0, size).
  virtual void gather(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index) const = 0;
  // out contiguous (+= into it); index contiguous i64; src contiguous, index's shape;
  // out[..index[..i..]..] += src[..i..] along dim. Throws IndexError out of range (the bad
  // elements are skipped). dtype not Bool or U8.
  virtual void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) const = 0;
  // out[index[i], :] += src[i, :] for every i (index_select's backward along dim 0, so an
  // embedding's): out contiguous [rows, width], index contiguous 1-D i64 of length n whose
  // values the caller has checked to lie in [0, rows), src contiguous [n, width], one
  // floating dtype. Deterministic, unlike scatter_add on CUDA: the same inputs give the same
  // bits on a device (the CPU adds the repeats of a row in index order; CUDA sorts the
  // indices stably and sums each row's repeats in a fixed tree, in compute_t<T>).
  virtual void index_add_rows(const Tensor& out, const Tensor& index, const Tensor& src) const = 0;

 protected:
  ~IndexKernels() = default;
};

}  // namespace kernels

namespace cpu { const kernels::IndexKernels& index_kernels(); }
namespace cuda { const kernels::IndexKernels& index_kernels(); }

namespace kernels {
inline const IndexKernels& index(Device device) {
  return for_device(device, cpu::index_kernels, NC_CUDA_KERNELS(index_kernels), "index");
}
}  // namespace kernels

}  // namespace normcore
