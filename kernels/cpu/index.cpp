// CPU reference indexing kernels (contracts in kernels/index.h): index_select, gather,
// scatter_add, check_range. Out-of-range indices throw IndexError before anything is written.
#include <cstring>
#include <vector>

#include "base/shape.h"
#include "kernels/cpu/loops.h"
#include "kernels/index.h"

namespace normcore {
namespace cpu {

namespace {

// Every index, validated against [0, size).
std::vector<int64_t> checked_indices(const char* op, const Tensor& index, int64_t size, int64_t dim) {
  const int64_t* p = static_cast<const int64_t*>(index.data_ptr());
  std::vector<int64_t> out(p, p + index.numel());
  for (int64_t i : out) {
    NC_CHECK(i >= 0 && i < size, IndexError, op, ": index ", i, " is out of range for dim ", dim, " of size ", size);
  }
  return out;
}

// Calls f(index_pos, x_pos) for every element of index (contiguous), where x_pos is the
// element of contiguous x at the same coordinates except idx[index_pos] along dim.
template <class F>
void for_each_indexed(const Tensor& x, const Tensor& index, int64_t dim, const std::vector<int64_t>& idx, F&& f) {
  Shape x_strides = detail::contiguous_strides(x.shape());
  int64_t nd = index.dim();
  std::vector<int64_t> coord(nd, 0);
  int64_t base = 0;  // x offset of coord without the dim term
  for (int64_t pos = 0, n = index.numel(); pos < n; ++pos) {
    f(pos, base + idx[pos] * x_strides[dim]);
    for (int64_t d = nd - 1; d >= 0; --d) {
      if (++coord[d] < index.size(d)) {
        if (d != dim) base += x_strides[d];
        break;
      }
      if (d != dim) base -= x_strides[d] * (index.size(d) - 1);
      coord[d] = 0;
    }
  }
}

class CpuIndex final : public kernels::IndexKernels {
 public:
  void index_select(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index) const override {
    const int64_t size = x.size(dim);
    const std::vector<int64_t> idx = checked_indices("index_select", index, size, dim);
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
    const size_t row_bytes = static_cast<size_t>(inner) * x.element_size();
    const char* src = static_cast<const char*>(x.data_ptr());
    char* dst = static_cast<char*>(out.data_ptr());
    const int64_t n = static_cast<int64_t>(idx.size());
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(dst + (o * n + i) * row_bytes, src + (o * size + idx[i]) * row_bytes, row_bytes);
  }

  void gather(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index) const override {
    const std::vector<int64_t> idx = checked_indices("gather", index, x.size(dim), dim);
    visit(x.dtype(), "gather", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* src = data_as<const T>(x);
      T* dst = data_as<T>(out);
      for_each_indexed(x, index, dim, idx, [&](int64_t pos, int64_t x_pos) { dst[pos] = src[x_pos]; });
    });
  }

  void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) const override {
    const std::vector<int64_t> idx = checked_indices("scatter_add", index, out.size(dim), dim);
    visit(out.dtype(), "scatter_add", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using A = compute_t<T>;
      const T* s = data_as<const T>(src);
      T* dst = data_as<T>(out);
      for_each_indexed(out, index, dim, idx, [&](int64_t pos, int64_t x_pos) {
        dst[x_pos] = convert<T>(convert<A>(dst[x_pos]) + convert<A>(s[pos]));
      });
    });
  }

  void check_range(const Tensor& index, int64_t size, std::optional<int64_t> allowed,
                   const kernels::RangeMessage& message) const override {
    const int64_t* p = static_cast<const int64_t*>(index.data_ptr());
    for (int64_t i = 0, n = index.numel(); i < n; ++i) {
      const int64_t v = p[i];
      NC_CHECK((v >= 0 && v < size) || (allowed && v == *allowed), IndexError, message.op, ": ", message.what, " ", v,
               " is out of range for ", size, " ", message.unit);
    }
  }

  void index_add_rows(const Tensor& out, const Tensor& index, const Tensor& src) const override {
    const std::vector<int64_t> idx = checked_indices("index_add_rows", index, out.size(0), 0);
    const int64_t width = out.size(1);
    visit_float(out.dtype(), "index_add_rows", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using A = compute_t<T>;
      const T* s = data_as<const T>(src);
      T* dst = data_as<T>(out);
      for (size_t i = 0; i < idx.size(); ++i) {
        T* row = dst + idx[i] * width;
        const T* from = s + static_cast<int64_t>(i) * width;
        for (int64_t e = 0; e < width; ++e) row[e] = convert<T>(convert<A>(row[e]) + convert<A>(from[e]));
      }
    });
  }
};

}  // namespace

const kernels::IndexKernels& index_kernels() {
  static const CpuIndex kernels;
  return kernels;
}

}  // namespace cpu
}  // namespace normcore
