// CPU reference of the convolution kernels (contracts in kernels/conv.h): for each sample and
// group, im2col lays the receptive fields out as columns and one Eigen GEMM does the rest.
// f16/bf16 operands are widened to float once and the result rounded once; f32 and f64
// compute in their own type.
#include <algorithm>
#include <memory>
#include <vector>

#include <Eigen/Core>

#include "kernels/conv.h"
#include "kernels/cpu/loops.h"

namespace normcore {
namespace cpu {
namespace {

using kernels::Conv2dGeometry;

template <class C>
using Matrix = Eigen::Matrix<C, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class C>
using Map = Eigen::Map<Matrix<C>>;
template <class C>
using ConstMap = Eigen::Map<const Matrix<C>>;

// A tensor's elements in the compute type C: the tensor's own memory when its type is C,
// else a widened copy held by the view.
template <class T, class C>
class Widened {
 public:
  explicit Widened(const Tensor& t) {
    const T* p = data_as<const T>(t);
    if constexpr (std::is_same_v<T, C>) {
      data_ = p;
    } else {
      copy_.resize(static_cast<size_t>(t.numel()));
      std::transform(p, p + t.numel(), copy_.begin(), [](T v) { return convert<C>(v); });
      data_ = copy_.data();
    }
  }
  const C* data() const { return data_; }

 private:
  std::vector<C> copy_;
  const C* data_ = nullptr;
};

// Output in the compute type C, rounded into the tensor by finish() when its type is not C.
template <class T, class C>
class Narrowed {
 public:
  explicit Narrowed(const Tensor& t) : t_(t) {
    if constexpr (std::is_same_v<T, C>) {
      data_ = data_as<T>(t);
    } else {
      copy_.resize(static_cast<size_t>(t.numel()));
      data_ = copy_.data();
    }
  }
  C* data() { return data_; }
  void finish() {
    if constexpr (!std::is_same_v<T, C>) {
      std::transform(copy_.begin(), copy_.end(), data_as<T>(t_), [](C v) { return convert<T>(v); });
    }
  }

 private:
  const Tensor& t_;
  std::vector<C> copy_;
  C* data_ = nullptr;
};

// Sizes of one group's GEMMs: the weight is [og, k] and the columns [k, hw].
struct GroupDims {
  int64_t cg, og, k, hw;
  explicit GroupDims(const Conv2dGeometry& g)
      : cg(g.c / g.groups), og(g.o / g.groups), k(g.c / g.groups * g.kh * g.kw), hw(g.out_h * g.out_w) {}
};

// The input row of output row oy for kernel row ky (may fall in the padding).
inline int64_t input_row(const Conv2dGeometry& g, int64_t oy, int64_t ky) {
  return oy * g.stride_h - g.pad_h + ky * g.dilation_h;
}
inline int64_t input_col(const Conv2dGeometry& g, int64_t ox, int64_t kx) {
  return ox * g.stride_w - g.pad_w + kx * g.dilation_w;
}

// cols [cg * kh * kw, out_h * out_w] from x's channels of one sample and group (image
// [cg, h, w]); padding gives zeros.
template <class C>
void im2col(const Conv2dGeometry& g, const C* image, int64_t cg, C* cols) {
  for (int64_t c = 0; c < cg; ++c) {
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        C* row = cols + ((c * g.kh + ky) * g.kw + kx) * g.out_h * g.out_w;
        for (int64_t oy = 0; oy < g.out_h; ++oy) {
          const int64_t iy = input_row(g, oy, ky);
          C* out = row + oy * g.out_w;
          if (iy < 0 || iy >= g.h) {
            std::fill(out, out + g.out_w, C(0));
            continue;
          }
          const C* in = image + (c * g.h + iy) * g.w;
          for (int64_t ox = 0; ox < g.out_w; ++ox) {
            const int64_t ix = input_col(g, ox, kx);
            out[ox] = ix >= 0 && ix < g.w ? in[ix] : C(0);
          }
        }
      }
    }
  }
}

// The adjoint of im2col: adds every column entry back into image [cg, h, w].
template <class C>
void col2im_add(const Conv2dGeometry& g, const C* cols, int64_t cg, C* image) {
  for (int64_t c = 0; c < cg; ++c) {
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        const C* row = cols + ((c * g.kh + ky) * g.kw + kx) * g.out_h * g.out_w;
        for (int64_t oy = 0; oy < g.out_h; ++oy) {
          const int64_t iy = input_row(g, oy, ky);
          if (iy < 0 || iy >= g.h) continue;
          C* out = image + (c * g.h + iy) * g.w;
          const C* in = row + oy * g.out_w;
          for (int64_t ox = 0; ox < g.out_w; ++ox) {
            const int64_t ix = input_col(g, ox, kx);
            if (ix >= 0 && ix < g.w) out[ix] += in[ox];
          }
        }
      }
    }
  }
}

template <class T>
void forward(const Conv2dGeometry& g, const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y) {
  using C = compute_t<T>;
  const GroupDims d(g);
  Widened<T, C> xs(x), ws(weight);
  std::unique_ptr<Widened<T, C>> bs(bias.defined() ? new Widened<T, C>(bias) : nullptr);
  Narrowed<T, C> ys(y);
  std::vector<C> cols(static_cast<size_t>(d.k * d.hw));
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      im2col(g, xs.data() + (n * g.c + grp * d.cg) * g.h * g.w, d.cg, cols.data());
      ConstMap<C> w(ws.data() + grp * d.og * d.k, d.og, d.k);
      ConstMap<C> col(cols.data(), d.k, d.hw);
      Map<C> out(ys.data() + (n * g.o + grp * d.og) * d.hw, d.og, d.hw);
      out.noalias() = w * col;
      if (bs) {
        for (int64_t o = 0; o < d.og; ++o) out.row(o).array() += bs->data()[grp * d.og + o];
      }
    }
  }
  ys.finish();
}

template <class T>
void backward_data(const Conv2dGeometry& g, const Tensor& grad_y, const Tensor& weight, const Tensor& grad_x) {
  using C = compute_t<T>;
  const GroupDims d(g);
  Widened<T, C> gys(grad_y), ws(weight);
  Narrowed<T, C> gxs(grad_x);
  std::fill(gxs.data(), gxs.data() + grad_x.numel(), C(0));
  std::vector<C> cols(static_cast<size_t>(d.k * d.hw));
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      ConstMap<C> w(ws.data() + grp * d.og * d.k, d.og, d.k);
      ConstMap<C> gy(gys.data() + (n * g.o + grp * d.og) * d.hw, d.og, d.hw);
      Map<C> col(cols.data(), d.k, d.hw);
      col.noalias() = w.transpose() * gy;
      col2im_add(g, cols.data(), d.cg, gxs.data() + (n * g.c + grp * d.cg) * g.h * g.w);
    }
  }
  gxs.finish();
}

template <class T>
void backward_weight(const Conv2dGeometry& g, const Tensor& grad_y, const Tensor& x, const Tensor& grad_weight) {
  using C = compute_t<T>;
  const GroupDims d(g);
  Widened<T, C> gys(grad_y), xs(x);
  Narrowed<T, C> gws(grad_weight);
  std::fill(gws.data(), gws.data() + grad_weight.numel(), C(0));
  std::vector<C> cols(static_cast<size_t>(d.k * d.hw));
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      im2col(g, xs.data() + (n * g.c + grp * d.cg) * g.h * g.w, d.cg, cols.data());
      ConstMap<C> col(cols.data(), d.k, d.hw);
      ConstMap<C> gy(gys.data() + (n * g.o + grp * d.og) * d.hw, d.og, d.hw);
      Map<C> gw(gws.data() + grp * d.og * d.k, d.og, d.k);
      gw.noalias() += gy * col.transpose();
    }
  }
  gws.finish();
}

class CpuConv final : public kernels::ConvKernels {
 public:
  void conv2d_forward(const Conv2dGeometry& g, const Tensor& x, const Tensor& weight, const Tensor& bias,
                      const Tensor& y) const override {
    visit_float(x.dtype(), "conv2d", [&](auto tag) { forward<typename decltype(tag)::type>(g, x, weight, bias, y); });
  }
  void conv2d_backward_data(const Conv2dGeometry& g, const Tensor& grad_y, const Tensor& weight,
                            const Tensor& grad_x) const override {
    visit_float(grad_y.dtype(), "conv2d backward",
                [&](auto tag) { backward_data<typename decltype(tag)::type>(g, grad_y, weight, grad_x); });
  }
  void conv2d_backward_weight(const Conv2dGeometry& g, const Tensor& grad_y, const Tensor& x,
                              const Tensor& grad_weight) const override {
    visit_float(grad_y.dtype(), "conv2d backward",
                [&](auto tag) { backward_weight<typename decltype(tag)::type>(g, grad_y, x, grad_weight); });
  }
};

}  // namespace

const kernels::ConvKernels& conv_kernels() {
  static const CpuConv kernels;
  return kernels;
}

}  // namespace cpu
}  // namespace normcore
