// Tensor: a view (shape, strides in elements, offset) of a reference-counted Storage on
// one device. Copying a Tensor copies the handle; views share the storage; clone() and
// contiguous() (when needed) copy the data. A default-constructed Tensor is undefined.
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "normcore/device.h"
#include "normcore/dtype.h"
#include "normcore/error.h"
#include "normcore/scalar.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {

using Shape = std::vector<int64_t>;

// Raw memory on one device. Freed (or returned to the device's cache) with the last handle.
// version counts the in-place writes to it (copy_, fill_, optimizer steps, ...): a tensor
// saved for backward remembers it, and backward refuses to use one written since.
struct StorageImpl {
  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  bool pinned = false;  // page-locked host memory
  std::atomic<uint64_t> version{0};
  void (*release)(StorageImpl*) = nullptr;
  StorageImpl() = default;
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;
  ~StorageImpl() {
    if (release) release(this);
  }
};
using Storage = std::shared_ptr<StorageImpl>;

// Allocates nbytes on device (pinned: page-locked host memory, for fast transfers).
Storage allocate_storage(size_t nbytes, Device device, bool pinned = false);

struct AutogradMeta;  // defined by the autograd layer

struct TensorImpl {
  Storage storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;
  DType dtype = DType::F32;
  std::shared_ptr<AutogradMeta> autograd;
};

// What a factory makes: dtype (unset: the factory's default) and device.
struct TensorOptions {
  std::optional<DType> dtype;
  Device device;
  bool pinned = false;

  TensorOptions() = default;
  TensorOptions(DType d) : dtype(d) {}
  TensorOptions(Device dev) : device(dev) {}
  TensorOptions(DType d, Device dev) : dtype(d), device(dev) {}
  TensorOptions& with_pinned(bool p = true) {
    pinned = p;
    return *this;
  }
  DType dtype_or(DType fallback) const { return dtype ? *dtype : fallback; }
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t offset() const { return impl().offset; }
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  // Size of dim d; negative d counts from the end.
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t numel() const;
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device; }
  size_t element_size() const { return dtype_size(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  bool is_contiguous() const;
  bool is_pinned() const { return impl().storage->pinned; }
  const Storage& storage() const { return impl().storage; }
  // Address of the first element (storage base + offset).
  void* data_ptr() const;
  // Typed pointer to the first element; throws DTypeError when T does not match.
  template <class T>
  T* data() const {
    NC_CHECK(dtype_of<T>::value == dtype(), DTypeError, "Tensor::data: asked for ", dtype_name(dtype_of<T>::value),
             " but the tensor holds ", dtype_name(dtype()));
    return static_cast<T*>(data_ptr());
  }

  // ---- views (no copy) ----
  // New shape with the same number of elements; one size may be -1. view() requires
  // strides compatible with the new shape; reshape() copies when they are not.
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  // Transpose of a matrix (dim <= 2).
  Tensor t() const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  // Elements start, start+step, ... < end along dim (Python slicing, clamped; step > 0).
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  // Removes dim, taking index along it.
  Tensor select(int64_t dim, int64_t index) const;
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  // Broadcasts size-1 dims (and new leading dims) to shape with stride 0; -1 keeps a size.
  Tensor expand(const Shape& shape) const;

  // ---- copies and conversions ----
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  Tensor to(Device device, DType dtype) const;
  // Page-locked host copy (for asynchronous host-to-GPU transfers).
  Tensor pin_memory() const;
  // Copies src into this tensor, broadcasting src and converting its dtype and device.
  Tensor& copy_(const Tensor& src);
  Tensor& fill_(Scalar value);
  Tensor& zero_() { return fill_(0); }
  // How many in-place writes the storage has had (shared by every view of it). normcore's
  // in-place ops bump it; code that writes through data_ptr() itself calls bump_version(),
  // so that backward does not use values it changed (autograd.h).
  uint64_t version() const { return impl().storage->version.load(std::memory_order_relaxed); }
  void bump_version() const { impl().storage->version.fetch_add(1, std::memory_order_relaxed); }

  // Value of a one-element tensor.
  Scalar item() const;
  // As T, one of the element types of dtype_of (the instantiations below the class).
  template <class T>
  T item() const;
  // All elements in row-major order, converted to T (one of the element types of dtype_of).
  template <class T>
  std::vector<T> to_vector() const;

  // ---- autograd (see normcore/autograd.h) ----
  // Whether gradients flow to (leaf) or through (recorded result) this tensor.
  bool requires_grad() const;
  // Marks a leaf as one whose gradient backward() accumulates. Floating dtypes only.
  Tensor& requires_grad_(bool requires = true);
  // The accumulated gradient of a leaf (undefined until a backward pass reaches it).
  Tensor grad() const;
  void set_grad(const Tensor& grad) const;
  // Forgets the accumulated gradient (grad() becomes undefined).
  void zero_grad() const;
  // True for tensors not produced by a recorded op.
  bool is_leaf() const;
  // The name of the op that produced this tensor ("" for leaves).
  std::string grad_fn_name() const;
  // The same data without the autograd history.
  Tensor detach() const;
  // Back-propagates from this tensor, accumulating into the grad() of every leaf that
  // requires it. grad defaults to 1 for one-element tensors and is required otherwise.
  // The graph's saved tensors are freed unless retain_graph is true.
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;

  TensorImpl& impl() const {
    NC_CHECK(impl_ != nullptr, Error, "Tensor: use of an undefined tensor");
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  // True when both handles refer to the same TensorImpl.
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// A tensor holding a copy of values, with the given shape (numel must match). The visibility
// pragma does not reach instantiations of a free function template, hence the attribute.
template <class T>
__attribute__((visibility("default"))) Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                                                          Device device = Device::cpu());

// The element types item, to_vector and from_vector exist for, instantiated in the library.
#define NC_DECLARE_ELEMENT_ACCESS(T)                           \
  extern template T Tensor::item<T>() const;                   \
  extern template std::vector<T> Tensor::to_vector<T>() const; \
  extern template Tensor from_vector<T>(const std::vector<T>&, const Shape&, Device);
NC_DECLARE_ELEMENT_ACCESS(float)
NC_DECLARE_ELEMENT_ACCESS(double)
NC_DECLARE_ELEMENT_ACCESS(Half)
NC_DECLARE_ELEMENT_ACCESS(BFloat16)
NC_DECLARE_ELEMENT_ACCESS(int32_t)
NC_DECLARE_ELEMENT_ACCESS(int64_t)
NC_DECLARE_ELEMENT_ACCESS(uint8_t)
NC_DECLARE_ELEMENT_ACCESS(bool)
#undef NC_DECLARE_ELEMENT_ACCESS

// ---- factories ----
// Default dtype f32 unless the factory says otherwise.
Tensor empty(const Shape& shape, TensorOptions options = {});
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
// Default dtype from the value: i64 for integers, bool for bool, f32 for floats.
Tensor full(const Shape& shape, Scalar value, TensorOptions options = {});
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
// [start, end) in steps; default dtype i64 when all three are integers, else f32.
Tensor arange(Scalar end, TensorOptions options = {});
Tensor arange(Scalar start, Scalar end, Scalar step = 1, TensorOptions options = {});
// steps evenly spaced values from start to end inclusive.
Tensor linspace(double start, double end, int64_t steps, TensorOptions options = {});
// Identity matrix n x m (m = n when negative).
Tensor eye(int64_t n, int64_t m = -1, TensorOptions options = {});

std::ostream& operator<<(std::ostream& os, const Tensor& t);
std::string shape_str(const Shape& shape);
// "f32 [2, 3] cuda:0": used in error messages.
std::string describe(const Tensor& t);

}  // namespace normcore

#pragma GCC visibility pop
