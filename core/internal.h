// Helpers shared by the core op implementations: shape arithmetic, dim normalization,
// building views, and the call that sends a backend function to the tensor's device.
#pragma once

#include <string>
#include <vector>

#include "core/op_scope.h"
#include "kernels/backend.h"
#include "normcore/tensor.h"

namespace normcore {
namespace detail {

// Row-major strides for shape.
Shape contiguous_strides(const Shape& shape);
// Product of sizes; throws ShapeError (naming op) on a negative size or overflow.
int64_t checked_numel(const Shape& shape, const char* op);
// Maps dim in [-ndim, ndim) to [0, ndim); throws IndexError naming op otherwise.
int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op);
// Sorted, de-duplicated, normalized dims; empty input means all dims.
std::vector<int64_t> normalize_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op);
// A new tensor sharing t's storage with the given geometry.
Tensor make_view(const Tensor& t, Shape shape, Shape strides, int64_t offset);
// A new contiguous tensor.
Tensor new_tensor(const Shape& shape, DType dtype, Device device);

// All tensors defined and on one device; throws DeviceError naming op and both devices.
void check_same_device(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                       const Tensor& b);
void check_defined(const char* op, const char* name, const Tensor& t);
// ValueError unless value converts to dtype without overflow: for i32, i64 and u8 a finite
// value inside the dtype's range (fractions truncate, as C++ converts them).
void check_representable(const char* op, const char* what, Scalar value, DType dtype);

[[noreturn]] void throw_no_cuda(const char* what);

}  // namespace detail
}  // namespace normcore

// Calls backend function fn for device: normcore::cpu::fn or normcore::cuda_kernels::fn.
// A CUDA failure inside names the op in scope, or fn where the caller set none (the
// OpScope temporary lives until the call returns).
#ifdef NORMCORE_HAS_CUDA
#define NC_BACKEND(device, fn, ...)                    \
  ((device).is_cpu() ? ::normcore::cpu::fn(__VA_ARGS__) \
                     : (::normcore::detail::OpScope(#fn), ::normcore::cuda_kernels::fn(__VA_ARGS__)))
#else
#define NC_BACKEND(device, fn, ...) \
  ((device).is_cpu() ? ::normcore::cpu::fn(__VA_ARGS__) : ::normcore::detail::throw_no_cuda(#fn))
#endif
