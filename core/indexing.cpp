// Joining, splitting and indexing: cat, stack, split, index_select, gather, scatter_add,
// one_hot, masked_fill, and the range check of the values other ops index with. Index
// tensors may be i32 or i64; the backends get contiguous i64.
#include <cmath>
#include <limits>
#include <numeric>

#include "autograd/graph.h"
#include "core/internal.h"
#include "kernels/index.h"
#include "normcore/ops.h"

namespace normcore {

using namespace detail;

namespace {

Tensor index_as_i64(const char* op, const Tensor& index) {
  NC_CHECK(index.dtype() == DType::I64 || index.dtype() == DType::I32, DTypeError, op,
           ": index must be i32 or i64, got ", describe(index));
  return index.to(DType::I64).contiguous();
}

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  const OpScope op("cat");
  NC_CHECK(!tensors.empty(), ValueError, op, ": expects at least one tensor");
  // 1-D empty tensors are skipped, as PyTorch does, so that cat({empty, x}) is x; they still
  // get a gradient, an empty one.
  std::vector<const Tensor*> parts;
  for (size_t i = 0; i < tensors.size(); ++i) {
    check_defined(op, "tensors", tensors[i]);
    if (!(tensors[i].dim() == 1 && tensors[i].numel() == 0)) parts.push_back(&tensors[i]);
  }
  const Tensor& first = parts.empty() ? tensors[0] : *parts[0];
  NC_CHECK(first.dim() > 0, ShapeError, op, ": zero-dim tensors cannot be concatenated");
  int64_t d = normalize_dim(dim, first.dim(), op);
  int64_t total = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Tensor& t = *parts[i];
    check_same_device(op, "tensors[0]", first, "tensors[i]", t);
    NC_CHECK(t.dtype() == first.dtype(), DTypeError, op, ": tensor ", i, " is ", describe(t), " but tensor 0 is ",
             describe(first));
    NC_CHECK(t.dim() == first.dim(), ShapeError, op, ": tensor ", i, " has shape ", t.shape(),
             " but tensor 0 has shape ", first.shape());
    for (int64_t k = 0; k < t.dim(); ++k)
      NC_CHECK(k == d || t.size(k) == first.size(k), ShapeError, op, ": tensor ", i, " has shape ", t.shape(),
               " but tensor 0 has shape ", first.shape(), " (they may differ only in dim ", d, ")");
    total += t.size(d);
  }
  Shape shape = first.shape();
  shape[d] = total;
  Tensor out = new_tensor(shape, first.dtype(), first.device());
  std::vector<int64_t> sizes;  // per input, -1 for a skipped one
  std::vector<DType> dtypes;
  int64_t at = 0;
  for (const Tensor& t : tensors) {
    const bool skipped = t.dim() == 1 && t.numel() == 0;
    if (!skipped) {
      out.narrow(d, at, t.size(d)).copy_(t);
      at += t.size(d);
    }
    sizes.push_back(skipped ? -1 : t.size(d));
    dtypes.push_back(t.dtype());
  }
  autograd::record(op, out, tensors, [d, sizes, dtypes](const Tensor& g) {
    std::vector<Tensor> grads;
    int64_t offset = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] < 0) {
        grads.push_back(zeros({0}, TensorOptions(dtypes[i], g.device())));
        continue;
      }
      grads.push_back(g.narrow(d, offset, sizes[i]));
      offset += sizes[i];
    }
    return grads;
  });
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  const OpScope op("stack");
  NC_CHECK(!tensors.empty(), ValueError, op, ": expects at least one tensor");
  check_defined(op, "tensors", tensors[0]);
  int64_t d = normalize_dim(dim, tensors[0].dim() + 1, op);
  std::vector<Tensor> expanded;
  for (size_t i = 0; i < tensors.size(); ++i) {
    check_defined(op, "tensors", tensors[i]);
    NC_CHECK(tensors[i].shape() == tensors[0].shape(), ShapeError, op, ": tensor ", i, " has shape ",
             tensors[i].shape(), " but tensor 0 has shape ", tensors[0].shape());
    check_same_device(op, "tensors[0]", tensors[0], "tensors[i]", tensors[i]);
    NC_CHECK(tensors[i].dtype() == tensors[0].dtype(), DTypeError, op, ": tensor ", i, " is ", describe(tensors[i]),
             " but tensor 0 is ", describe(tensors[0]));
    expanded.push_back(tensors[i].unsqueeze(d));
  }
  return cat(expanded, d);
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  const OpScope op("split");
  check_defined(op, "x", x);
  NC_CHECK(x.dim() > 0, ShapeError, op, ": cannot split a 0-dim tensor");
  NC_CHECK(split_size > 0, ValueError, op, ": split_size must be positive, got ", split_size);
  int64_t d = normalize_dim(dim, x.dim(), op);
  std::vector<Tensor> out;
  int64_t size = x.size(d);
  for (int64_t at = 0; at < size; at += split_size) out.push_back(x.narrow(d, at, std::min(split_size, size - at)));
  if (out.empty()) out.push_back(x);
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  const OpScope op("split");
  check_defined(op, "x", x);
  NC_CHECK(x.dim() > 0, ShapeError, op, ": cannot split a 0-dim tensor");
  int64_t d = normalize_dim(dim, x.dim(), op);
  for (int64_t s : sizes) NC_CHECK(s >= 0, ValueError, op, ": negative size in ", sizes);
  int64_t total = 0;
  for (int64_t s : sizes) {
    NC_CHECK(s <= x.size(d) - total, ShapeError, op, ": sizes ", sizes, " sum to more than dim ", dim, "'s size ",
             x.size(d));
    total += s;
  }
  NC_CHECK(total == x.size(d), ShapeError, op, ": sizes ", sizes, " sum to ", total, " but dim ", dim, " has size ",
           x.size(d));
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t s : sizes) {
    out.push_back(x.narrow(d, at, s));
    at += s;
  }
  return out;
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  const OpScope op("index_select");
  check_defined(op, "x", x);
  check_defined(op, "index", index);
  check_same_device(op, "x", x, "index", index);
  NC_CHECK(x.dim() > 0, ShapeError, op, ": x must have at least 1 dim, got ", describe(x));
  NC_CHECK(index.dim() <= 1, ShapeError, op, ": index must be 1-D, got ", describe(index));
  int64_t d = normalize_dim(dim, x.dim(), op);
  Tensor idx = index_as_i64(op, index).reshape({index.numel()});
  Shape shape = x.shape();
  shape[d] = idx.numel();
  Tensor out = new_tensor(shape, x.dtype(), x.device());
  if (out.numel() > 0 || (idx.numel() > 0 && x.size(d) == 0)) {
    NC_CHECK(x.size(d) > 0, IndexError, op, ": cannot select from dim ", dim, " of size 0");
    kernels::index(x.device()).index_select(out, x.contiguous(), d, idx);
  }
  autograd::record(op, out, {x}, [shape = x.shape(), d, indices = autograd::saved(idx)](const Tensor& g) {
    // Scatter each selected slice back, adding where an index repeats. Along dim 0 (an
    // embedding's rows) with one deterministic kernel; elsewhere through scatter_add.
    const Tensor& idx = indices.get();
    if (d == 0 && is_floating(g.dtype())) {
      Tensor grad_x = zeros(shape, TensorOptions(g.dtype(), g.device()));
      const int64_t n = idx.numel(), width = n > 0 ? g.numel() / n : 0;
      if (n > 0 && width > 0) {
        // The forward checked every index against [0, size) (on CUDA, one out of range is
        // recorded for the host's next wait and skipped here).
        kernels::index(g.device())
            .index_add_rows(grad_x.view({shape[0], width}), idx.contiguous(), g.contiguous().view({n, width}));
      }
      return std::vector<Tensor>{grad_x};
    }
    Shape index_shape(g.dim(), 1);
    index_shape[d] = idx.numel();
    Tensor spread = idx.view(index_shape).expand(g.shape());
    return std::vector<Tensor>{scatter_add(zeros(shape, TensorOptions(g.dtype(), g.device())), d, spread, g)};
  });
  return out;
}

namespace {

void check_index_shape(const char* op, const Tensor& x, const Tensor& index, int64_t d, const char* what) {
  NC_CHECK(index.dim() == x.dim(), ShapeError, op, ": index must have as many dims as ", what, " (index is ",
           describe(index), ", ", what, " is ", describe(x), ")");
  for (int64_t k = 0; k < x.dim(); ++k)
    NC_CHECK(k == d || index.size(k) <= x.size(k), ShapeError, op, ": index shape ", index.shape(), " exceeds ", what,
             " shape ", x.shape(), " in dim ", k);
}

}  // namespace

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  const OpScope op("gather");
  check_defined(op, "x", x);
  check_defined(op, "index", index);
  check_same_device(op, "x", x, "index", index);
  NC_CHECK(x.dim() > 0, ShapeError, op, ": x must have at least 1 dim, got ", describe(x));
  int64_t d = normalize_dim(dim, x.dim(), op);
  check_index_shape(op, x, index, d, "x");
  Tensor idx = index_as_i64(op, index);
  Tensor out = new_tensor(idx.shape(), x.dtype(), x.device());
  if (out.numel() > 0) kernels::index(x.device()).gather(out, x.contiguous(), d, idx);
  autograd::record(op, out, {x}, [shape = x.shape(), d, indices = autograd::saved(idx)](const Tensor& g) {
    return std::vector<Tensor>{scatter_add(zeros(shape, TensorOptions(g.dtype(), g.device())), d, indices.get(), g)};
  });
  return out;
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  const OpScope op("scatter_add");
  check_defined(op, "x", x);
  check_defined(op, "index", index);
  check_defined(op, "src", src);
  check_same_device(op, "x", x, "index", index);
  check_same_device(op, "x", x, "src", src);
  NC_CHECK(x.dim() > 0, ShapeError, op, ": x must have at least 1 dim, got ", describe(x));
  NC_CHECK(src.dtype() == x.dtype(), DTypeError, op, ": src is ", describe(src), " but x is ", describe(x),
           " (dtypes must match)");
  NC_CHECK(x.dtype() != DType::Bool && x.dtype() != DType::U8, DTypeError, op,
           ": bool and u8 tensors are not supported (x is ", describe(x), ")");
  int64_t d = normalize_dim(dim, x.dim(), op);
  check_index_shape(op, x, index, d, "x");
  NC_CHECK(src.dim() == index.dim(), ShapeError, op, ": src ", src.shape(), " and index ", index.shape(),
           " must have the same number of dims");
  for (int64_t k = 0; k < src.dim(); ++k)
    NC_CHECK(index.size(k) <= src.size(k), ShapeError, op, ": index shape ", index.shape(), " exceeds src shape ",
             src.shape(), " in dim ", k);
  Tensor idx = index_as_i64(op, index);
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    out = x.clone();
    if (idx.numel() > 0) {
      Tensor piece = src;
      for (int64_t k = 0; k < src.dim(); ++k) piece = piece.narrow(k, 0, idx.size(k));
      kernels::index(x.device()).scatter_add(out, d, idx, piece.contiguous());
    }
  }
  autograd::record(op, out, {x, src}, [src_shape = src.shape(), d, indices = autograd::saved(idx)](const Tensor& g) {
    // x passes straight through; src gets back what it added (zeros beyond index's extent).
    const Tensor& idx = indices.get();
    Tensor taken = gather(g, d, idx);
    Tensor grad_src = zeros(src_shape, TensorOptions(g.dtype(), g.device()));
    Tensor region = grad_src;
    for (int64_t k = 0; k < grad_src.dim(); ++k) region = region.narrow(k, 0, idx.size(k));
    region.copy_(taken);
    return std::vector<Tensor>{g, grad_src};
  });
  return out;
}

namespace detail {

void check_index_range(const Tensor& index, int64_t size, std::optional<int64_t> allowed, const char* op,
                       const char* what, const char* unit) {
  if (index.numel() > 0) kernels::index(index.device()).check_range(index, size, allowed, {op, what, unit});
}

}  // namespace detail

Tensor one_hot(const Tensor& index, int64_t num_classes) {
  const OpScope op("one_hot");
  check_defined(op, "index", index);
  NC_CHECK(index.dtype() == DType::I64 || index.dtype() == DType::I32 || index.dtype() == DType::U8, DTypeError, op,
           ": index must be an integer tensor, got ", describe(index));
  Tensor idx = index.to(DType::I64);
  if (idx.numel() == 0) {
    NC_CHECK(num_classes >= 0, ValueError, op, ": num_classes must be given for an empty index (got ", num_classes,
             ")");
  } else {
    int64_t lo = min(idx).item<int64_t>(), hi = max(idx).item<int64_t>();
    NC_CHECK(lo >= 0, IndexError, op, ": class index ", lo, " is negative");
    if (num_classes < 0) {
      NC_CHECK(hi < std::numeric_limits<int64_t>::max(), IndexError, op, ": class index ", hi, " is too large");
      num_classes = hi + 1;
    }
    NC_CHECK(hi < num_classes, IndexError, op, ": class index ", hi, " out of range for ", num_classes, " classes");
  }
  Tensor classes = arange(0, num_classes, 1, TensorOptions(DType::I64, index.device()));
  return eq(idx.unsqueeze(-1), classes).to(DType::I64);
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value) {
  const OpScope op("masked_fill");
  check_defined(op, "x", x);
  check_defined(op, "mask", mask);
  check_same_device(op, "x", x, "mask", mask);
  NC_CHECK(mask.dtype() == DType::Bool, DTypeError, op, ": mask must be bool, got ", describe(mask));
  broadcast_shapes(x.shape(), mask.shape(), op);  // x and mask broadcast together, as in PyTorch
  const double whole = value.to_double();
  NC_CHECK(is_floating(x.dtype()) || value.is_integral() || (std::isfinite(whole) && whole == std::trunc(whole)),
           ValueError, op, ": value ", value, " is not an integer but x is ", describe(x));
  check_representable(op, "value", value, x.dtype());
  return where(mask, full({}, value, TensorOptions(x.dtype(), x.device())), x);
}

}  // namespace normcore
