// CPU reference of the convolution kernels (contracts in kernels/conv.h): for each sample and
// group, im2col lays the receptive fields out as columns and one GEMM (kernels/cpu/gemm.h)
// does the rest; in f32 where the AVX-512 product runs, stride-1 convolutions with an output
// as large as the input skip the copy: the product reads its panels from the image
// (ImageColumns). f16/bf16 operands are widened to float once and the result rounded once;
// f32 and f64 compute in their own type. Samples run in ranges on the thread pool
// (kernels/cpu/parallel.h). Channels-last f32 convolutions of one group run the direct NHWC
// kernel (kernels/cpu/conv_nhwc.h) where AVX-512 is in use.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/conv.h"
#include "kernels/cpu/conv_nhwc.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"

namespace normcore {
namespace cpu {
namespace {

using kernels::Conv2dGeometry;

// A row-major [rows, cols] matrix at p for gemm, or its transpose.
template <class C>
GemmOperand<C> matrix(const C* p, int64_t cols) {
  return {p, cols, 1};
}
template <class C>
GemmOperand<C> transposed(const C* p, int64_t cols) {
  return {p, 1, cols};
}

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

// The output columns [begin, end) whose input column ox * stride_w - pad_w + kx * dilation_w
// falls inside the image for kernel column kx; the others read padding.
struct ColumnSpan {
  int64_t begin, end, offset;  // input column = ox * stride_w + offset
};
inline ColumnSpan column_span(const Conv2dGeometry& g, int64_t kx) {
  const int64_t offset = kx * g.dilation_w - g.pad_w;
  const int64_t begin = offset >= 0 ? 0 : std::min(g.out_w, (-offset + g.stride_w - 1) / g.stride_w);
  const int64_t last = g.w - 1 - offset;  // ox * stride_w <= last
  const int64_t end = last < 0 ? begin : std::max(begin, std::min(g.out_w, last / g.stride_w + 1));
  return {begin, end, offset};
}

// Channel c's rows of im2col's columns (below), for output rows [oy0, oy1): rows of
// (oy1 - oy0) * out_w columns.
template <class C>
void im2col_channel(const Conv2dGeometry& g, const C* image, int64_t c, C* cols, int64_t oy0, int64_t oy1) {
  for (int64_t ky = 0; ky < g.kh; ++ky) {
    for (int64_t kx = 0; kx < g.kw; ++kx) {
      C* row = cols + ((c * g.kh + ky) * g.kw + kx) * (oy1 - oy0) * g.out_w;
      const ColumnSpan span = column_span(g, kx);
      for (int64_t oy = oy0; oy < oy1; ++oy) {
        const int64_t iy = input_row(g, oy, ky);
        C* out = row + (oy - oy0) * g.out_w;
        if (iy < 0 || iy >= g.h) {
          std::fill(out, out + g.out_w, C(0));
          continue;
        }
        const C* in = image + (c * g.h + iy) * g.w;
        std::fill(out, out + span.begin, C(0));
        if (g.stride_w == 1) {
          std::copy(in + span.begin + span.offset, in + span.end + span.offset, out + span.begin);
        } else {
          for (int64_t ox = span.begin; ox < span.end; ++ox) out[ox] = in[ox * g.stride_w + span.offset];
        }
        std::fill(out + span.end, out + g.out_w, C(0));
      }
    }
  }
}

// cols [cg * kh * kw, (oy1 - oy0) * out_w] from x's channels of one sample and group (image
// [cg, h, w]) for output rows [oy0, oy1) (all of them by default); padding gives zeros.
// Channels in ranges on the thread pool (which runs them on the calling thread inside a
// region of several ranges, as a batch's samples are).
template <class C>
void im2col(const Conv2dGeometry& g, const C* image, int64_t cg, C* cols, int64_t oy0 = 0, int64_t oy1 = -1) {
  if (oy1 < 0) oy1 = g.out_h;
  parallel_for(cg, grain_for(g.kh * g.kw * (oy1 - oy0) * g.out_w), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) im2col_channel(g, image, c, cols, oy0, oy1);
  });
}

// Output rows per piece where im2col's columns are made a piece at a time for the AVX-512
// product: as many as keep a piece's columns within 1 MiB (in L2 between being written and
// read), at least 256 columns' worth; out_h (no pieces) where the whole fits. ResNet-50's
// 7 x 7 stride-2 stem on one core: 3.27-3.30 -> 2.86-2.91 ms; its other strided convolutions
// (columns of at most 3.6 MB) neither gain nor lose.
int64_t column_piece_rows(const Conv2dGeometry& g, int64_t k) {
  const int64_t row_bytes = k * g.out_w * static_cast<int64_t>(sizeof(float));
  const int64_t rows = std::max((int64_t{1} << 20) / std::max<int64_t>(row_bytes, 1), (255 + g.out_w) / g.out_w);
  return std::min(std::max<int64_t>(rows, 1), g.out_h);
}

// The adjoint of im2col: adds every column entry back into image [cg, h, w].
template <class C>
void col2im_add(const Conv2dGeometry& g, const C* cols, int64_t cg, C* image) {
  for (int64_t c = 0; c < cg; ++c) {
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        const C* row = cols + ((c * g.kh + ky) * g.kw + kx) * g.out_h * g.out_w;
        const ColumnSpan span = column_span(g, kx);
        for (int64_t oy = 0; oy < g.out_h; ++oy) {
          const int64_t iy = input_row(g, oy, ky);
          if (iy < 0 || iy >= g.h) continue;
          C* out = image + (c * g.h + iy) * g.w;
          const C* in = row + oy * g.out_w;
          for (int64_t ox = span.begin; ox < span.end; ++ox) out[ox * g.stride_w + span.offset] += in[ox];
        }
      }
    }
  }
}

// Samples a range of the thread pool takes: about 2^20 multiply-adds of work (or one sample).
int64_t sample_grain(const Conv2dGeometry& g) {
  const GroupDims d(g);
  return grain_for(g.groups * d.og * d.k * d.hw, int64_t{1} << 20);
}

// Whether the receptive fields are the image itself (1x1, stride 1, no padding): the columns
// im2col would copy out are the image's [cg, h * w] rows as they lie.
bool columns_are_image(const Conv2dGeometry& g) {
  return g.kh == 1 && g.kw == 1 && g.stride_h == 1 && g.stride_w == 1 && g.pad_h == 0 && g.pad_w == 0;
}

// Whether the AVX-512 product may read the columns from the image itself (ImageColumns,
// gemm.h; it declines where that product is not in use): stride 1, no dilation, an output as
// large as the image, at most 64 taps.
bool product_reads_image(const Conv2dGeometry& g) {
  return g.stride_h == 1 && g.stride_w == 1 && g.dilation_h == 1 && g.dilation_w == 1 && g.out_h == g.h &&
         g.out_w == g.w && g.kh * g.kw <= 64;
}

template <class T>
void forward(const Conv2dGeometry& g, const Tensor& x, const Tensor& weight, const kernels::ConvEpilogue& e,
             const Tensor& y) {
  using C = compute_t<T>;
  const GroupDims d(g);
  Widened<T, C> xs(x), ws(weight);
  std::unique_ptr<Widened<T, C>> bs(e.bias.defined() ? new Widened<T, C>(e.bias) : nullptr);
  std::unique_ptr<Widened<T, C>> rs(e.residual.defined() ? new Widened<T, C>(e.residual) : nullptr);
  Narrowed<T, C> ys(y);
  const bool direct = columns_are_image(g);
  const bool from_image = std::is_same_v<C, float> && !direct && product_reads_image(g);
  parallel_for(g.n, sample_grain(g), [&](int64_t begin, int64_t end) {
    std::unique_ptr<C[]> cols;  // im2col's columns, where they are made
    for (int64_t n = begin; n < end; ++n) {
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const C* image = xs.data() + (n * g.c + grp * d.cg) * g.h * g.w;
        C* out = ys.data() + (n * g.o + grp * d.og) * d.hw;
        const C* bias = bs ? bs->data() + grp * d.og : nullptr;
        const C* residual = rs ? rs->data() + (n * g.o + grp * d.og) * d.hw : nullptr;
        const C* kernel_data = ws.data() + grp * d.og * d.k;
        if constexpr (std::is_same_v<C, float>) {  // in AVX-512, unpacked, with the epilogue in registers
          const RowEpilogue row_epilogue{bias, residual, d.hw, e.relu};
          if (from_image && parallel_gemm_image_rows(d.og, d.k, kernel_data, d.k,
                                                     ImageColumns{image, g.h, g.w, g.kh, g.kw, g.pad_h, g.pad_w, 0},
                                                     out, d.hw, row_epilogue))
            continue;
        }
        if constexpr (std::is_same_v<C, float>) {
          // im2col's columns a piece of output rows at a time, each used while in cache. The
          // pieces are the thread pool's ranges, each thread making its own pieces' columns
          // and product (nested, inline): one region a convolution, where a region for each
          // piece's copy and one for its product cost more in waking the pool than they
          // saved (ResNet-50's 3-channel stem: no faster on two threads than on one).
          const int64_t piece = direct ? g.out_h : column_piece_rows(g, d.k);
          if (piece < g.out_h) {
            std::atomic<bool> done{true};
            parallel_for(range_count(g.out_h, piece), 1, [&](int64_t p0, int64_t p1) {
              std::unique_ptr<C[]> piece_cols(new C[static_cast<size_t>(d.k * piece * g.out_w)]);
              for (int64_t p = p0; p < p1 && done; ++p) {
                const int64_t oy0 = p * piece, oy1 = std::min(g.out_h, oy0 + piece), first = oy0 * g.out_w,
                              n_piece = (oy1 - oy0) * g.out_w;
                im2col(g, image, d.cg, piece_cols.get(), oy0, oy1);
                if (!parallel_gemm_rows(d.og, n_piece, d.k, kernel_data, d.k, piece_cols.get(), n_piece, out + first,
                                        d.hw, RowEpilogue{bias, residual ? residual + first : nullptr, d.hw, e.relu}))
                  done = false;  // no AVX-512 product (known before any output is written)
              }
            });
            if (done) continue;
          }
        }
        if (!direct) {
          if (!cols) cols.reset(new C[static_cast<size_t>(d.k * d.hw)]);  // im2col fills it all
          im2col(g, image, d.cg, cols.get());
        }
        const C* columns_data = direct ? image : cols.get();
        if constexpr (std::is_same_v<C, float>) {
          if (parallel_gemm_rows(d.og, d.hw, d.k, kernel_data, d.k, columns_data, d.hw, out, d.hw,
                                 RowEpilogue{bias, residual, d.hw, e.relu}))
            continue;
        }
        // The epilogue on each piece of the product as it is done: one pass, in cache.
        const GemmPieceDone epilogue = [&](int64_t o_begin, int64_t o_end, int64_t i_begin, int64_t i_end) {
          for (int64_t o = o_begin; o < o_end; ++o) {
            C* row = out + o * d.hw;
            const C* r = residual ? residual + o * d.hw : nullptr;
            const C b = bias ? bias[o] : C(0);
            for (int64_t i = i_begin; i < i_end; ++i) {
              C v = row[i] + b;
              if (r) v += r[i];
              row[i] = e.relu && v < C(0) ? C(0) : v;  // NaN stays
            }
          }
        };
        const GemmOperand<C> columns = matrix<C>(columns_data, d.hw);
        const GemmOperand<C> kernel = matrix(kernel_data, d.k);
        if (bias || residual || e.relu) {
          parallel_gemm(d.og, d.hw, d.k, kernel, columns, out, d.hw, false, epilogue);
        } else {
          parallel_gemm(d.og, d.hw, d.k, kernel, columns, out, d.hw, false);
        }
      }
    }
  });
  ys.finish();
}

template <class T>
void backward_data(const Conv2dGeometry& g, const Tensor& grad_y, const Tensor& weight, const Tensor& grad_x) {
  using C = compute_t<T>;
  const GroupDims d(g);
  Widened<T, C> gys(grad_y), ws(weight);
  Narrowed<T, C> gxs(grad_x);
  parallel_for(g.n, sample_grain(g), [&](int64_t begin, int64_t end) {
    std::fill(gxs.data() + begin * g.c * g.h * g.w, gxs.data() + end * g.c * g.h * g.w, C(0));
    std::vector<C> cols(static_cast<size_t>(d.k * d.hw));
    for (int64_t n = begin; n < end; ++n) {
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        // cols [k, hw] = w^T [k, og] @ grad_y [og, hw]
        parallel_gemm(d.k, d.hw, d.og, transposed(ws.data() + grp * d.og * d.k, d.k),
                      matrix(gys.data() + (n * g.o + grp * d.og) * d.hw, d.hw), cols.data(), d.hw, false);
        col2im_add(g, cols.data(), d.cg, gxs.data() + (n * g.c + grp * d.cg) * g.h * g.w);
      }
    }
  });
  gxs.finish();
}

// The weight gradient sums over samples: each range of samples sums its own into a partial
// gradient, and the partials are added in range order (ranges fixed by the shape, so the
// result does not depend on the thread count). At most 16 ranges.
template <class T>
void backward_weight(const Conv2dGeometry& g, const Tensor& grad_y, const Tensor& x, const Tensor& grad_weight) {
  using C = compute_t<T>;
  const GroupDims d(g);
  Widened<T, C> gys(grad_y), xs(x);
  Narrowed<T, C> gws(grad_weight);
  const int64_t size = grad_weight.numel();
  const int64_t grain = std::max(sample_grain(g), (g.n + 15) / 16);
  const int64_t ranges = range_count(g.n, grain);
  std::vector<C> partials(static_cast<size_t>(std::max<int64_t>(ranges - 1, 0) * size));
  parallel_for(g.n, grain, [&](int64_t begin, int64_t end) {
    // The first range sums straight into the gradient.
    C* sum = begin == 0 ? gws.data() : partials.data() + (begin / grain - 1) * size;
    std::fill(sum, sum + size, C(0));
    std::vector<C> cols(static_cast<size_t>(d.k * d.hw));
    for (int64_t n = begin; n < end; ++n) {
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        im2col(g, xs.data() + (n * g.c + grp * d.cg) * g.h * g.w, d.cg, cols.data());
        // grad_w [og, k] += grad_y [og, hw] @ cols^T [hw, k]
        parallel_gemm(d.og, d.k, d.hw, matrix(gys.data() + (n * g.o + grp * d.og) * d.hw, d.hw),
                      transposed<C>(cols.data(), d.hw), sum + grp * d.og * d.k, d.k, true);
      }
    }
  });
  if (g.n == 0) std::fill(gws.data(), gws.data() + size, C(0));
  for (int64_t r = 1; r < ranges; ++r) {
    const C* part = partials.data() + (r - 1) * size;
    for (int64_t i = 0; i < size; ++i) gws.data()[i] += part[i];
  }
  gws.finish();
}

// The NHWC forward: x [n, h, w, c], weight [kh, kw, c, o], y [n, out_h, out_w, o].
void forward_nhwc(const Conv2dGeometry& g, const Tensor& x, const Tensor& weight, const kernels::ConvEpilogue& e,
                  const Tensor& y) {
  const std::vector<float> zeros(static_cast<size_t>(g.kw * g.c), 0.0f);
  NhwcConv a;
  a.x = data_as<const float>(x), a.weight = data_as<const float>(weight), a.y = data_as<float>(y);
  a.bias = e.bias.defined() ? data_as<const float>(e.bias) : nullptr;
  a.residual = e.residual.defined() ? data_as<const float>(e.residual) : nullptr;
  a.zeros = zeros.data();
  a.n = g.n, a.h = g.h, a.w = g.w, a.c = g.c, a.o = g.o, a.kh = g.kh, a.kw = g.kw, a.out_h = g.out_h, a.out_w = g.out_w;
  a.stride_h = g.stride_h, a.stride_w = g.stride_w, a.pad_h = g.pad_h, a.pad_w = g.pad_w;
  a.dilation_h = g.dilation_h, a.dilation_w = g.dilation_w, a.relu = e.relu, a.panels = g.weight_panels;
  NC_CHECK(conv_nhwc(a), DeviceError,
           "conv2d: the CPU's NHWC kernel needs AVX-512 (the op converts to NCHW without it)");
}

class CpuConv final : public kernels::ConvKernels {
 public:
  kernels::NhwcForward nhwc_forward(const Conv2dGeometry& g, DType dtype) const override {
    return dtype == DType::F32 && g.groups == 1 && conv_nhwc_in_use() ? kernels::NhwcForward::WeightHwio
                                                                      : kernels::NhwcForward::Convert;
  }
  void conv2d_forward(const Conv2dGeometry& g, const Tensor& x, const Tensor& weight, const kernels::ConvEpilogue& e,
                      const Tensor& y) const override {
    if (g.channels_last) {
      NC_CHECK(nhwc_forward(g, x.dtype()) == kernels::NhwcForward::WeightHwio, DeviceError,
               "conv2d: the CPU kernels take NHWC tensors only in f32, one group, with AVX-512 (the op converts ",
               "the others to NCHW), got ", x.dtype(), " and ", g.groups, " groups");
      forward_nhwc(g, x, weight, e, y);
      return;
    }
    visit_float(x.dtype(), "conv2d", [&](auto tag) { forward<typename decltype(tag)::type>(g, x, weight, e, y); });
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

bool conv_nhwc_in_use() { return std::strcmp(gemm_isa(), "avx512") == 0; }

bool conv_nhwc(const NhwcConv& g) {
#if defined(NORMCORE_GEMM_AVX512)
  if (!conv_nhwc_in_use()) return false;
  // Pieces fixed by the shape alone, at least one per 2^20 multiply-adds up to 16 (so that
  // threads share the work evenly). Where there are more output channels than pixels (the
  // weight is the larger operand: small images at batch 1), pieces of whole 64-channel tiles,
  // each reading its part of the weight alone; else pieces of whole 6-pixel tiles by at most
  // 256 channels, their partial sums (in y between the blocks of k) within 256 KiB.
  const int64_t pixels = g.n * g.out_h * g.out_w, steps = g.kh * g.kw * g.c;
  const int64_t tiles = range_count(pixels, 6);
  const int64_t pieces = std::max<int64_t>(1, std::min<int64_t>(16, pixels * g.o * steps >> 20));
  int64_t channels = std::min<int64_t>(g.o, 256), per_piece = tiles * 6;
  if (g.o >= pixels) {
    channels = std::min(g.o, range_count(range_count(g.o, pieces), 64) * 64);
  } else {
    const int64_t wanted = std::min(tiles, std::max(range_count(pixels * channels, int64_t{1} << 16),
                                                    range_count(pieces, range_count(g.o, channels))));
    per_piece = range_count(tiles, wanted) * 6;
  }
  const int64_t channel_pieces = range_count(g.o, channels), pixel_pieces = range_count(pixels, per_piece);
  parallel_for(channel_pieces * pixel_pieces, 1, [&](int64_t begin, int64_t end) {
    for (int64_t piece = begin; piece < end; ++piece) {
      const int64_t p0 = piece / channel_pieces * per_piece, o0 = piece % channel_pieces * channels;
      conv_nhwc_avx512(g, p0, std::min(pixels, p0 + per_piece), o0, std::min(g.o, o0 + channels));
    }
  });
  return true;
#else
  (void)g;
  return false;
#endif
}

const kernels::ConvKernels& conv_kernels() {
  static const CpuConv kernels;
  return kernels;
}

}  // namespace cpu
}  // namespace normcore
