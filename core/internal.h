// Helpers shared by the core op implementations: dim normalization, building views, new
// tensors and the argument checks every front end uses.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/build.h"
#include "base/op_scope.h"
#include "base/shape.h"
#include "normcore/tensor.h"

namespace normcore {
namespace detail {

// Maps dim in [-ndim, ndim) to [0, ndim); throws IndexError naming op otherwise.
int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op);
// Sorted, de-duplicated, normalized dims; empty input means all dims.
std::vector<int64_t> normalize_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op);
// A new tensor sharing t's storage with the given geometry.
Tensor make_view(const Tensor& t, Shape shape, Shape strides, int64_t offset);
// A new contiguous tensor.
Tensor new_tensor(const Shape& shape, DType dtype, Device device);

// All tensors defined and on one device; throws DeviceError naming op and both devices.
void check_same_device(const char* op, const char* name_a, const Tensor& a, const char* name_b, const Tensor& b);
void check_defined(const char* op, const char* name, const Tensor& t);
// ValueError unless value converts to dtype without overflow, by PyTorch's rule: for i32, i64
// and u8 an integer inside the dtype's range (u8 also -255 to -1, which wrap) or a finite
// float inside it (fractions truncate); for f32, f16 and bf16 an infinity, a NaN or a value
// at most the dtype's largest finite one in magnitude. Every op that writes a scalar into a
// tensor checks it (docs/ERRORS.md, "Scalars written into a tensor").
void check_representable(const char* op, const char* what, Scalar value, DType dtype);
// IndexError "<op>: <what> V is out of range for <size> <unit>" unless every value of index
// (i64, contiguous) lies in [0, size) or equals allowed: for values a front end indexes with
// and did not make (embedding indices, class targets). On the CPU it throws here; on CUDA a
// kernel checks them and the error comes at the host's next wait (kernels/index.h), so the
// call never waits for the device.
void check_index_range(const Tensor& index, int64_t size, std::optional<int64_t> allowed, const char* op,
                       const char* what, const char* unit);

// linear_cross_entropy (normcore/losses.h) with its logits made at most chunk_bytes at a
// time (whole rows, at least one); the public op passes kLinearCrossEntropyChunkBytes.
constexpr int64_t kLinearCrossEntropyChunkBytes = int64_t{256} << 20;
Tensor linear_cross_entropy_in_chunks(const Tensor& x, const Tensor& weight, const Tensor& target, int64_t classes,
                                      int64_t ignore_index, int64_t chunk_bytes);

}  // namespace detail
}  // namespace normcore
