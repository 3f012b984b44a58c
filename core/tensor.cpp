// Tensor: storage allocation, geometry, views, copies, conversions and element access.
#include "normcore/tensor.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <numeric>
#include <optional>

#include "autograd/graph.h"
#include "core/host_blocks.h"
#include "core/internal.h"
#include "kernels/elementwise.h"
#include "kernels/scalar/dtype.h"
#include "normcore/ops.h"
#ifdef NORMCORE_HAS_CUDA
#include "runtime/cuda/runtime.h"
#endif

namespace normcore {

// ---------------------------------------------------------------- helpers
namespace detail {

int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t lo = ndim > 0 ? -ndim : -1, hi = ndim > 0 ? ndim - 1 : 0;
  NC_CHECK(dim >= lo && dim <= hi, IndexError, op, ": dim ", dim, " out of range for a tensor of ", ndim,
           " dims (expected ", lo, " to ", hi, ")");
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

std::vector<int64_t> normalize_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    out.resize(ndim);
    std::iota(out.begin(), out.end(), 0);
    return out;
  }
  for (int64_t d : dims) {
    int64_t n = normalize_dim(d, ndim, op);
    NC_CHECK(std::find(out.begin(), out.end(), n) == out.end(), IndexError, op, ": dim ", d,
             " appears more than once in ", dims);
    out.push_back(n);
  }
  if (ndim == 0) out.clear();  // dim 0 / -1 of a 0-dim tensor: nothing to reduce over
  std::sort(out.begin(), out.end());
  return out;
}

Tensor make_view(const Tensor& t, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = t.dtype();
  return Tensor(std::move(impl));
}

Tensor new_tensor(const Shape& shape, DType dtype, Device device) {
  int64_t n = checked_numel(shape, "empty");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = allocate_storage(static_cast<size_t>(n) * dtype_size(dtype), device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

void check_representable(const char* op, const char* what, Scalar value, DType dtype) {
  if (dtype == DType::Bool || dtype == DType::F64) return;
  // PyTorch's rule (c10's overflows): f32, f16 and bf16 take infinities, NaN and values up to
  // their largest finite one in magnitude; integer dtypes take an integer inside their range
  // (u8 also -255 to -1, which wrap: -1 is 255) or a finite float inside it (a fraction
  // truncates).
  bool fits = true;
  const char* limit = "";
  if (is_floating(dtype)) {
    const double largest = dtype == DType::F32   ? 3.4028234663852886e38
                           : dtype == DType::F16 ? 65504.0
                                                 : 3.3895313892515355e38;
    const double v = value.to_double();
    fits = !std::isfinite(v) || std::fabs(v) <= largest;
    limit = dtype == DType::F32   ? " (its largest finite value is 3.40282e+38)"
            : dtype == DType::F16 ? " (its largest finite value is 65504)"
                                  : " (its largest finite value is 3.38953e+38)";
  } else if (value.is_integral()) {
    const int64_t v = value.to_int();
    if (dtype == DType::I32) fits = v >= INT32_MIN && v <= INT32_MAX;
    if (dtype == DType::U8) fits = v >= -255 && v <= 255;
  } else {
    const double v = value.to_double();
    if (dtype == DType::I64) fits = v >= -0x1p63 && v < 0x1p63;  // false for NaN
    if (dtype == DType::I32) fits = v >= -2147483648.0 && v <= 2147483647.0;
    if (dtype == DType::U8) fits = v >= 0.0 && v <= 255.0;
  }
  NC_CHECK(fits, ValueError, op, ": ", what, " ", value, " cannot be converted to ", dtype_name(dtype),
           " without overflow", limit);
}

void check_defined(const char* op, const char* name, const Tensor& t) {
  NC_CHECK(t.defined(), ValueError, op, ": argument '", name, "' is an undefined tensor");
}

void check_same_device(const char* op, const char* name_a, const Tensor& a, const char* name_b, const Tensor& b) {
  NC_CHECK(a.device() == b.device(), DeviceError, op, ": '", name_a, "' is on ", a.device(), " but '", name_b,
           "' is on ", b.device(), " (move them to one device with .to())");
}

}  // namespace detail

using namespace detail;

// ---------------------------------------------------------------- storage
namespace {

void release_cpu(StorageImpl* s) { host_free(s->data, s->nbytes); }

#ifdef NORMCORE_HAS_CUDA
void release_cuda(StorageImpl* s) { cuda::device_free(s->data, s->nbytes, s->device.index); }
void release_pinned(StorageImpl* s) { cuda::pinned_free(s->data); }
#endif

}  // namespace

Storage allocate_storage(size_t nbytes, Device device, bool pinned) {
  auto s = std::make_shared<StorageImpl>();
  s->nbytes = nbytes;
  s->device = device;
  if (device.is_cpu()) {
    if (pinned) {
#ifdef NORMCORE_HAS_CUDA
      NC_CHECK(cuda_device_count() > 0, DeviceError, "pin_memory: no CUDA device is available");
      if (nbytes) s->data = cuda::pinned_alloc(nbytes);
      s->pinned = true;
      s->release = release_pinned;
      return s;
#else
      throw_no_cuda("pin_memory");
#endif
    }
    if (nbytes) {
      s->data = host_alloc(nbytes);
      NC_CHECK(s->data != nullptr, OutOfMemoryError, "allocate: cannot allocate ", nbytes, " bytes of host memory");
    }
    s->release = release_cpu;
    return s;
  }
#ifdef NORMCORE_HAS_CUDA
  int count = cuda_device_count();
  NC_CHECK(device.index >= 0 && device.index < count, DeviceError, "allocate: ", device, " does not exist (", count,
           " CUDA device(s) visible)");
  if (nbytes) s->data = cuda::device_alloc(nbytes, device.index);
  s->release = release_cuda;
  return s;
#else
  throw_no_cuda("allocate");
#endif
}

// ---------------------------------------------------------------- geometry
int64_t Tensor::size(int64_t d) const { return shape()[normalize_dim(d, dim(), "Tensor::size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[normalize_dim(d, dim(), "Tensor::stride")]; }

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape()) n *= s;
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (shape()[i] == 1) continue;
    if (shape()[i] == 0) return true;
    if (strides()[i] != expected) return false;
    expected *= shape()[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  auto* base = static_cast<char*>(impl().storage->data);
  if (!base) return nullptr;
  return base + offset() * static_cast<int64_t>(element_size());
}

std::string shape_str(const Shape& shape) { return cat_str(shape); }

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return cat_str(dtype_name(t.dtype()), " ", t.shape(), " ", t.device());
}

// ---------------------------------------------------------------- views
namespace {

// Resolves one -1 in shape against numel; checks the element count.
Shape infer_shape(const Shape& shape, int64_t numel, const char* op) {
  Shape out = shape;
  int64_t known = 1, infer_at = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      NC_CHECK(infer_at < 0, ShapeError, op, ": only one size may be -1 in ", shape);
      infer_at = static_cast<int64_t>(i);
    } else {
      NC_CHECK(out[i] >= 0, ShapeError, op, ": invalid size ", out[i], " in ", shape);
      NC_CHECK(out[i] == 0 || known <= std::numeric_limits<int64_t>::max() / out[i], ShapeError, op, ": shape ", shape,
               " is invalid for a tensor of ", numel, " elements");
      known *= out[i];
    }
  }
  if (infer_at >= 0) {
    NC_CHECK(known != 0 && numel % known == 0, ShapeError, op, ": shape ", shape, " is invalid for a tensor of ", numel,
             " elements");
    out[infer_at] = numel / known;
  } else {
    NC_CHECK(known == numel, ShapeError, op, ": shape ", shape, " is invalid for a tensor of ", numel, " elements");
  }
  return out;
}

// Strides that let (old_shape, old_strides) be seen as new_shape without a copy, if any.
std::optional<Shape> view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& new_shape) {
  Shape new_strides(new_shape.size());
  int64_t numel = 1;
  for (int64_t s : old_shape) numel *= s;
  if (numel == 0 || old_shape.empty()) return contiguous_strides(new_shape);
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(old_shape.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= old_shape[tensor_d];
    // A chunk of dims that are mutually contiguous ends here.
    if (tensor_d == 0 ||
        (old_shape[tensor_d - 1] != 1 && old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        new_strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return new_strides;
}

}  // namespace

namespace {

// A view with new geometry over the same elements in the same order (view, reshape,
// squeeze, unsqueeze): its gradient is the output gradient reshaped back.
Tensor reshaped_view(const Tensor& x, const Shape& shape, const Shape& strides, const char* name) {
  Tensor out = make_view(x, shape, strides, x.offset());
  autograd::record(name, out, {x},
                   [in_shape = x.shape()](const Tensor& g) { return std::vector<Tensor>{g.reshape(in_shape)}; });
  return out;
}

// A view of a region of x (narrow, slice, select): its gradient is zeros of x's shape with
// the output gradient written into the region that region(zeros) selects.
template <class Region>
void record_region(const char* name, const Tensor& x, const Tensor& out, Region region) {
  if (!autograd::needs_grad(x)) return;
  autograd::record(name, out, {x},
                   [region, shape = x.shape(), dtype = x.dtype(), device = x.device()](const Tensor& g) {
                     Tensor z = zeros(shape, TensorOptions(dtype, device));
                     region(z).copy_(g);
                     return std::vector<Tensor>{z};
                   });
}

}  // namespace

Tensor Tensor::view(const Shape& new_shape) const {
  const OpScope op("view");
  Shape shape2 = infer_shape(new_shape, numel(), op);
  auto strides2 = view_strides(shape(), strides(), shape2);
  NC_CHECK(strides2.has_value(), ShapeError, op, ": cannot view a tensor of shape ", shape(), " and strides ",
           strides(), " as ", shape2, " without a copy (use reshape)");
  return reshaped_view(*this, shape2, *strides2, op);
}

Tensor Tensor::reshape(const Shape& new_shape) const {
  const OpScope op("reshape");
  Shape shape2 = infer_shape(new_shape, numel(), op);
  auto strides2 = view_strides(shape(), strides(), shape2);
  if (strides2) return reshaped_view(*this, shape2, *strides2, op);
  return clone().view(shape2);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  const OpScope op("flatten");
  if (dim() == 0) return reshape({1});
  int64_t s = normalize_dim(start_dim, dim(), op);
  int64_t e = normalize_dim(end_dim, dim(), op);
  NC_CHECK(s <= e, IndexError, op, ": start_dim ", start_dim, " comes after end_dim ", end_dim);
  Shape out(shape().begin(), shape().begin() + s);
  int64_t n = 1;
  for (int64_t i = s; i <= e; ++i) n *= shape()[i];
  out.push_back(n);
  out.insert(out.end(), shape().begin() + e + 1, shape().end());
  return reshape(out);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  const OpScope op("permute");
  NC_CHECK(static_cast<int64_t>(dims.size()) == dim(), ShapeError, op, ": got ", dims.size(), " dims ", dims,
           " for a tensor of ", dim(), " dims");
  Shape s(dim()), st(dim());
  std::vector<bool> seen(dim(), false);
  for (int64_t i = 0; i < dim(); ++i) {
    int64_t d = normalize_dim(dims[i], dim(), op);
    NC_CHECK(!seen[d], IndexError, op, ": dim ", dims[i], " repeated in ", dims);
    seen[d] = true;
    s[i] = shape()[d];
    st[i] = strides()[d];
  }
  Tensor out = make_view(*this, s, st, offset());
  if (autograd::needs_grad(*this)) {
    std::vector<int64_t> inverse(dim());
    for (int64_t i = 0; i < dim(); ++i) inverse[normalize_dim(dims[i], dim(), op)] = i;
    autograd::record(op, out, {*this}, [inverse](const Tensor& g) { return std::vector<Tensor>{g.permute(inverse)}; });
  }
  return out;
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  const OpScope op("transpose");
  if (dim() == 0) {
    normalize_dim(dim0, 0, op);  // a 0-dim tensor accepts dims 0 and -1 only
    normalize_dim(dim1, 0, op);
    return *this;
  }
  int64_t a = normalize_dim(dim0, dim(), op), b = normalize_dim(dim1, dim(), op);
  Shape s = shape(), st = strides();
  std::swap(s[a], s[b]);
  std::swap(st[a], st[b]);
  Tensor out = make_view(*this, s, st, offset());
  autograd::record(op, out, {*this}, [a, b](const Tensor& g) { return std::vector<Tensor>{g.transpose(a, b)}; });
  return out;
}

Tensor Tensor::t() const {
  NC_CHECK(dim() <= 2, ShapeError, "t: expects a tensor of at most 2 dims, got shape ", shape());
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  const OpScope op("narrow");
  NC_CHECK(dim() > 0, IndexError, op, ": cannot narrow a 0-dim tensor");
  int64_t n = normalize_dim(d, dim(), op);
  int64_t size = shape()[n];
  if (start < 0 && start >= -size) start += size;
  NC_CHECK(start >= 0 && length >= 0 && start <= size && length <= size - start, IndexError, op, ": start ", start,
           " and length ", length, " out of range for dim ", d, " of size ", size, " (shape ", shape(), ")");
  Shape s = shape();
  s[n] = length;
  Tensor out = make_view(*this, s, strides(), offset() + start * strides()[n]);
  record_region(op, *this, out, [n, start, length](const Tensor& z) { return z.narrow(n, start, length); });
  return out;
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  const OpScope op("slice");
  NC_CHECK(dim() > 0, IndexError, op, ": cannot slice a 0-dim tensor");
  NC_CHECK(step > 0, ValueError, op, ": step must be positive, got ", step);
  int64_t n = normalize_dim(d, dim(), op);
  int64_t size = shape()[n];
  auto clamp_index = [size](int64_t i) {
    if (i < 0) i += size;
    return std::min(std::max<int64_t>(i, 0), size);
  };
  start = clamp_index(start);
  end = std::max(clamp_index(end), start);
  Shape s = shape(), st = strides();
  s[n] = (end - start) / step + ((end - start) % step != 0);
  if (s[n] > 1) st[n] *= step;  // step < size here, so the stride stays inside the tensor's span
  Tensor out = make_view(*this, s, st, offset() + start * strides()[n]);
  record_region(op, *this, out, [n, start, end, step](const Tensor& z) { return z.slice(n, start, end, step); });
  return out;
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  const OpScope op("select");
  NC_CHECK(dim() > 0, IndexError, op, ": cannot select from a 0-dim tensor");
  int64_t n = normalize_dim(d, dim(), op);
  int64_t size = shape()[n];
  NC_CHECK(index >= -size && index < size, IndexError, op, ": index ", index, " out of range for dim ", d, " of size ",
           size);
  if (index < 0) index += size;
  Shape s = shape(), st = strides();
  int64_t off = offset() + index * st[n];
  s.erase(s.begin() + n);
  st.erase(st.begin() + n);
  Tensor out = make_view(*this, s, st, off);
  record_region(op, *this, out, [n, index](const Tensor& z) { return z.select(n, index); });
  return out;
}

Tensor Tensor::squeeze() const {
  Shape s, st;
  for (int64_t i = 0; i < dim(); ++i)
    if (shape()[i] != 1) {
      s.push_back(shape()[i]);
      st.push_back(strides()[i]);
    }
  return reshaped_view(*this, s, st, "squeeze");
}

Tensor Tensor::squeeze(int64_t d) const {
  const OpScope op("squeeze");
  if (dim() == 0) {
    normalize_dim(d, 0, op);
    return *this;
  }
  int64_t n = normalize_dim(d, dim(), op);
  if (shape()[n] != 1) return *this;
  Shape s = shape(), st = strides();
  s.erase(s.begin() + n);
  st.erase(st.begin() + n);
  return reshaped_view(*this, s, st, op);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  const OpScope op("unsqueeze");
  int64_t n = normalize_dim(d, dim() + 1, op);
  Shape s = shape(), st = strides();
  int64_t stride = n < dim() ? shape()[n] * strides()[n] : 1;
  s.insert(s.begin() + n, 1);
  st.insert(st.begin() + n, stride);
  return reshaped_view(*this, s, st, op);
}

Tensor Tensor::expand(const Shape& target) const {
  const OpScope op("expand");
  NC_CHECK(static_cast<int64_t>(target.size()) >= dim(), ShapeError, op, ": cannot expand shape ", shape(), " to ",
           target, " (fewer dims)");
  size_t lead = target.size() - shape().size();
  Shape s(target.size()), st(target.size());
  for (size_t i = 0; i < target.size(); ++i) {
    if (i < lead) {
      NC_CHECK(target[i] >= 0, ShapeError, op, ": size -1 not allowed in new leading dim of ", target);
      s[i] = target[i];
      st[i] = 0;
      continue;
    }
    int64_t have = shape()[i - lead];
    int64_t want = target[i] == -1 ? have : target[i];
    if (have == want) {
      s[i] = have;
      st[i] = strides()[i - lead];
    } else {
      NC_CHECK(have == 1 && want >= 0, ShapeError, op, ": cannot expand shape ", shape(), " to ", target, " (dim ", i,
               " has size ", have, ")");
      s[i] = want;
      st[i] = 0;
    }
  }
  checked_numel(s, op);
  Tensor out = make_view(*this, s, st, offset());
  autograd::record(op, out, {*this},
                   [shape = shape()](const Tensor& g) { return std::vector<Tensor>{autograd::sum_to(g, shape)}; });
  return out;
}

// ---------------------------------------------------------------- copies
namespace {

// Copies contiguous src bytes between devices (the dtypes already agree).
void transfer(const Tensor& dst, const Tensor& src) {
#ifdef NORMCORE_HAS_CUDA
  cuda::copy_bytes(dst.data_ptr(), dst.device(), src.data_ptr(), src.device(), src.nbytes());
#else
  (void)dst;
  (void)src;
  throw_no_cuda("copy_");
#endif
}

}  // namespace

namespace {

// Whether t's elements are distinct and fill numel() consecutive slots of its storage, in some
// order of its dims (a contiguous tensor or a permutation of one).
bool is_dense(const Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims of more than one element
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  return true;
}

// PyTorch's check (assert_no_partial_overlap): dst and src of one storage, both dense, whose
// element ranges meet without being the same elements in the same order; the copy would
// read elements it has already written. Other layouts are not checked, as in PyTorch.
bool overlaps_partially(const Tensor& dst, const Tensor& src) {
  if (dst.storage() != src.storage() || dst.numel() == 0 || src.numel() == 0) return false;
  if (!is_dense(dst) || !is_dense(src)) return false;
  // In elements: views of one storage share its dtype.
  const int64_t dst_begin = dst.offset(), dst_end = dst_begin + dst.numel();
  const int64_t src_begin = src.offset(), src_end = src_begin + src.numel();
  if (dst_begin == src_begin && dst_end == src_end) return dst.strides() != src.strides() || dst.shape() != src.shape();
  return dst_begin < src_end && src_begin < dst_end;
}

}  // namespace

Tensor& Tensor::copy_(const Tensor& src) {
  const OpScope op("copy_");
  check_defined(op, "src", src);
  NC_CHECK(broadcast_shapes(shape(), src.shape(), op) == shape(), ShapeError, op, ": src of shape ", src.shape(),
           " does not broadcast to the destination's shape ", shape());
  // A destination whose elements share memory (an expand() view: stride 0 along a dim of
  // more than one element) would keep whichever write came last; PyTorch refuses it too.
  // fill_ may write into one: every element gets the same value.
  for (int64_t d = 0; d < dim(); ++d) {
    NC_CHECK(size(d) <= 1 || stride(d) != 0, ValueError, op, ": the destination ", describe(*this), " (strides ",
             strides(), ") has elements that share memory along dim ", d,
             " (an expand() view); copy into a clone() of it instead");
  }
  NC_CHECK(!overlaps_partially(*this, src), ValueError, op, ": the destination ", describe(*this), " (strides ",
           strides(), ") and src ", describe(src), " (strides ", src.strides(),
           ") share some of their elements (views of one tensor); copy from a clone() of src instead");
  NC_CHECK(!(autograd::is_grad_enabled() && requires_grad()), ValueError, op, ": cannot write in place into ",
           describe(*this), ", which requires grad (write under autograd::NoGradGuard, or into detach())");
  autograd::NoGradGuard no_grad;  // copy_ itself records nothing
  Tensor source = src.expand(shape());
  if (numel() == 0) return *this;
  bump_version();
  if (device() == source.device()) {
    kernels::elementwise(device()).copy(*this, source);
    return *this;
  }
  // Across devices: convert on the source side, move contiguous bytes, scatter on arrival.
  Tensor packed = source.to(dtype()).contiguous();
  if (is_contiguous()) {
    transfer(*this, packed);
  } else {
    Tensor staged = new_tensor(shape(), dtype(), device());
    transfer(staged, packed);
    kernels::elementwise(device()).copy(*this, staged);
  }
  return *this;
}

Tensor& Tensor::fill_(Scalar value) {
  const OpScope op("fill_");
  NC_CHECK(!(autograd::is_grad_enabled() && requires_grad()), ValueError, op, ": cannot write in place into ",
           describe(*this), ", which requires grad (write under autograd::NoGradGuard, or into detach())");
  check_representable(op, "value", value, dtype());
  if (numel() == 0) return *this;
  bump_version();
  kernels::elementwise(device()).fill(*this, value);
  return *this;
}

Tensor Tensor::clone() const {
  const OpScope op("clone");
  Tensor out = new_tensor(shape(), dtype(), device());
  out.copy_(*this);
  autograd::record(op, out, {*this}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return out;
}

Tensor Tensor::detach() const { return make_view(*this, shape(), strides(), offset()); }

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::to(Device d) const { return to(d, dtype()); }
Tensor Tensor::to(DType t) const { return to(device(), t); }

Tensor Tensor::to(Device d, DType t) const {
  if (d == device() && t == dtype()) return *this;  // most calls, from ops' conversions
  const OpScope op("to");
  Tensor out = new_tensor(shape(), t, d);
  out.copy_(*this);
  if (autograd::needs_grad(*this) && is_floating(t)) {
    autograd::record(op, out, {*this}, [device = device(), dtype = dtype()](const Tensor& g) {
      return std::vector<Tensor>{g.to(device, dtype)};
    });
  }
  return out;
}

Tensor Tensor::pin_memory() const {
  NC_CHECK(device().is_cpu(), DeviceError, "pin_memory: tensor is on ", device(), ", expected cpu");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = allocate_storage(nbytes(), Device::cpu(), /*pinned=*/true);
  impl->shape = shape();
  impl->strides = contiguous_strides(shape());
  impl->dtype = dtype();
  Tensor out(std::move(impl));
  out.copy_(*this);
  return out;
}

// ---------------------------------------------------------------- element access
namespace {

// Calls f(const T* data) with the contiguous CPU copy of t, T matching t's dtype.
template <class F>
void with_host_data(const Tensor& t, const char* op, F&& f) {
  Tensor host = t.to(Device::cpu()).contiguous();
  visit_dtype<HostTypes>(host.dtype(), op,
                         [&](auto tag) { f(static_cast<const typename decltype(tag)::type*>(host.data_ptr())); });
}

}  // namespace

Scalar Tensor::item() const {
  const OpScope op("item");
  NC_CHECK(numel() == 1, ShapeError, op, ": expects a tensor with one element, got shape ", shape());
  Scalar result;
  with_host_data(*this, op, [&](const auto* p) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(p)>>;
    if constexpr (std::is_same<T, bool>::value) {
      result = Scalar(static_cast<bool>(p[0]));
    } else if constexpr (std::is_integral<T>::value) {
      result = Scalar(static_cast<int64_t>(p[0]));
    } else {
      result = Scalar(convert<double>(p[0]));
    }
  });
  return result;
}

template <class T>
T Tensor::item() const {
  return scalar_as<T>(item());
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  const OpScope op("to_vector");
  std::vector<T> out;
  out.reserve(static_cast<size_t>(numel()));
  with_host_data(*this, op, [&](const auto* p) {
    for (int64_t i = 0, n = numel(); i < n; ++i) out.push_back(convert<T>(p[i]));
  });
  return out;
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  const OpScope op("from_vector");
  int64_t n = checked_numel(shape, op);
  NC_CHECK(n == static_cast<int64_t>(values.size()), ShapeError, op, ": ", values.size(), " values do not fill shape ",
           shape, " (", n, " elements)");
  Tensor host = new_tensor(shape, dtype_of<T>::value, Device::cpu());
  T* p = static_cast<T*>(host.data_ptr());
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return host.to(device);
}

#define NC_INSTANTIATE_ELEMENT_ACCESS(T)                \
  template T Tensor::item<T>() const;                   \
  template std::vector<T> Tensor::to_vector<T>() const; \
  template Tensor from_vector<T>(const std::vector<T>&, const Shape&, Device);
NC_INSTANTIATE_ELEMENT_ACCESS(float)
NC_INSTANTIATE_ELEMENT_ACCESS(double)
NC_INSTANTIATE_ELEMENT_ACCESS(Half)
NC_INSTANTIATE_ELEMENT_ACCESS(BFloat16)
NC_INSTANTIATE_ELEMENT_ACCESS(int32_t)
NC_INSTANTIATE_ELEMENT_ACCESS(int64_t)
NC_INSTANTIATE_ELEMENT_ACCESS(uint8_t)
NC_INSTANTIATE_ELEMENT_ACCESS(bool)
#undef NC_INSTANTIATE_ELEMENT_ACCESS

}  // namespace normcore
