// CPU reference pooling kernels (contracts in kernels/pool.h): plain loops over planes (in
// ranges of planes on the thread pool) and windows, sums in double, one rounding to the
// storage type. The backward passes scatter each output's gradient into the elements its
// window read, the plainest reading of the contract (the CUDA kernels gather instead, so
// the two are written independently).
#include <algorithm>
#include <limits>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/pool.h"

namespace normcore {
namespace cpu {
namespace {

using kernels::AvgSpan;
using kernels::Pool2dShape;
using kernels::Pool2dWindow;

// Gradient scatter into one plane kept in double, then rounded once into grad_x's plane.
template <class T>
class PlaneSums {
 public:
  explicit PlaneSums(int64_t size) : sums_(static_cast<size_t>(size)) {}
  void clear() { std::fill(sums_.begin(), sums_.end(), 0.0); }
  double& operator[](int64_t i) { return sums_[static_cast<size_t>(i)]; }
  void store(T* dst) const {
    for (size_t i = 0; i < sums_.size(); ++i) dst[i] = convert<T>(sums_[i]);
  }

 private:
  std::vector<double> sums_;
};

// The taps [first, end) of a dilated window starting at start that land in [0, size).
struct TapSpan {
  int64_t first, end;
};

TapSpan tap_span(int64_t start, int64_t kernel, int64_t dilation, int64_t size) {
  const int64_t first = kernels::first_tap(start, dilation);
  const int64_t end = start >= size ? 0 : std::min(kernel, (size - start + dilation - 1) / dilation);
  return {first, std::max(first, end)};
}

// Max pooling of channels-last images without indices: per output pixel, the window's taps in
// row-major order, each one a run of channels (contiguous in x and in out), so the loop over
// channels is the vector loop. The same taps in the same order as the planar path: the same
// bits.
void max_pool2d_channels_last(const Tensor& x, const Pool2dShape& s, const Pool2dWindow& w, const Tensor& out) {
  visit_float(x.dtype(), "max_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    const int64_t channels = s.channels, images = s.planes / channels;
    const T* src = data_as<const T>(x);
    T* dst = data_as<T>(out);
    parallel_for(images * s.out_h, grain_for(s.out_w * channels * w.kernel_h * w.kernel_w),
                 [&](int64_t begin, int64_t end) {
                   std::vector<C> best(static_cast<size_t>(channels));
                   for (int64_t row = begin; row < end; ++row) {
                     const int64_t image = row / s.out_h, oh = row % s.out_h;
                     const int64_t h0 = oh * w.stride_h - w.pad_h;
                     const TapSpan rows = tap_span(h0, w.kernel_h, w.dilation_h, s.in_h);
                     for (int64_t ow = 0; ow < s.out_w; ++ow) {
                       const int64_t w0 = ow * w.stride_w - w.pad_w;
                       const TapSpan cols = tap_span(w0, w.kernel_w, w.dilation_w, s.in_w);
                       std::fill(best.begin(), best.end(), -std::numeric_limits<C>::infinity());
                       C* b = best.data();
                       for (int64_t i = rows.first; i < rows.end; ++i) {
                         for (int64_t j = cols.first; j < cols.end; ++j) {
                           const int64_t at = (image * s.in_h + h0 + i * w.dilation_h) * s.in_w + w0 + j * w.dilation_w;
                           const T* in = src + at * channels;
                           for (int64_t c = 0; c < channels; ++c) {
                             const C v = convert<C>(in[c]);
                             b[c] = kernels::max_pool_takes(v, b[c]) ? v : b[c];
                           }
                         }
                       }
                       T* o = dst + (row * s.out_w + ow) * channels;
                       for (int64_t c = 0; c < channels; ++c) o[c] = convert<T>(b[c]);
                     }
                   }
                 });
  });
}

class CpuPool final : public kernels::PoolKernels {
 public:
  void max_pool2d_forward(const Tensor& x, const Pool2dShape& s, const Pool2dWindow& w, const Tensor& out,
                          const Tensor& indices) const override {
    if (s.channels > 0) {
      NC_CHECK(!indices.defined(), DeviceError, "max_pool2d: channels-last pooling keeps no indices");
      max_pool2d_channels_last(x, s, w, out);
      return;
    }
    visit_float(x.dtype(), "max_pool2d", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;  // holds every T exactly, so comparing in it is comparing the Ts
      const T* src = data_as<const T>(x);
      T* dst = data_as<T>(out);
      int64_t* idx = data_or_null<int64_t>(indices);
      std::vector<TapSpan> cols(static_cast<size_t>(s.out_w));
      for (int64_t ow = 0; ow < s.out_w; ++ow) {
        cols[static_cast<size_t>(ow)] = tap_span(ow * w.stride_w - w.pad_w, w.kernel_w, w.dilation_w, s.in_w);
      }
      // The other way round, for the path without indices: per kernel column j, the output
      // columns [begin, end) whose tap j is inside the row (a run, as the windows slide).
      struct Span {
        int64_t begin, end;
      };
      std::vector<Span> tap_columns(static_cast<size_t>(w.kernel_w), Span{s.out_w, s.out_w});
      for (int64_t ow = 0; ow < s.out_w; ++ow) {
        for (int64_t j = cols[static_cast<size_t>(ow)].first; j < cols[static_cast<size_t>(ow)].end; ++j) {
          Span& span = tap_columns[static_cast<size_t>(j)];
          if (span.begin == s.out_w) span.begin = ow;
          span.end = ow + 1;
        }
      }
      parallel_for(s.planes, grain_for(s.in_h * s.in_w + s.out_h * s.out_w), [&](int64_t p_begin, int64_t p_end) {
        std::vector<C> row_best(idx == nullptr ? static_cast<size_t>(s.out_w) : 0);
        for (int64_t p = p_begin; p < p_end; ++p) {
          const T* plane = src + p * s.in_h * s.in_w;
          // Without indices (inference): the same taps in the same order, with no branch on
          // the data, a window row at a time for a whole output row.
          for (int64_t oh = 0; idx == nullptr && oh < s.out_h; ++oh) {
            const int64_t h0 = oh * w.stride_h - w.pad_h;
            const TapSpan rows = tap_span(h0, w.kernel_h, w.dilation_h, s.in_h);
            std::fill(row_best.begin(), row_best.end(), -std::numeric_limits<C>::infinity());
            for (int64_t i = rows.first; i < rows.end; ++i) {
              const T* in = plane + (h0 + i * w.dilation_h) * s.in_w;
              for (int64_t j = 0; j < w.kernel_w; ++j) {  // one tap for the whole row: no chain
                const int64_t offset = j * w.dilation_w - w.pad_w;
                const Span span = tap_columns[static_cast<size_t>(j)];
                C* best = row_best.data();
                for (int64_t ow = span.begin; ow < span.end; ++ow) {
                  const C v = convert<C>(in[ow * w.stride_w + offset]);
                  best[ow] = kernels::max_pool_takes(v, best[ow]) ? v : best[ow];
                }
              }
            }
            T* out_row = dst + (p * s.out_h + oh) * s.out_w;
            for (int64_t ow = 0; ow < s.out_w; ++ow) out_row[ow] = convert<T>(row_best[static_cast<size_t>(ow)]);
          }
          for (int64_t oh = 0; idx != nullptr && oh < s.out_h; ++oh) {
            const int64_t h0 = oh * w.stride_h - w.pad_h;
            const TapSpan rows = tap_span(h0, w.kernel_h, w.dilation_h, s.in_h);
            for (int64_t ow = 0; ow < s.out_w; ++ow) {
              const int64_t w0 = ow * w.stride_w - w.pad_w;
              const TapSpan c = cols[static_cast<size_t>(ow)];
              C best = -std::numeric_limits<C>::infinity();
              int64_t best_at = -1;
              for (int64_t i = rows.first; i < rows.end; ++i) {
                const int64_t row = (h0 + i * w.dilation_h) * s.in_w;
                for (int64_t j = c.first; j < c.end; ++j) {
                  const int64_t at = row + w0 + j * w.dilation_w;
                  const C v = convert<C>(plane[at]);
                  if (best_at < 0 || kernels::max_pool_takes(v, best)) {
                    best = v;
                    best_at = at;
                  }
                }
              }
              const int64_t o = (p * s.out_h + oh) * s.out_w + ow;
              dst[o] = convert<T>(best);
              if (idx != nullptr) idx[o] = best_at;
            }
          }
        }
      });
    });
  }

  void max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Pool2dShape& s, const Pool2dWindow&,
                           const Tensor& grad_x) const override {
    visit_float(grad_x.dtype(), "max_pool2d backward", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* g = data_as<const T>(grad_out);
      const int64_t* idx = data_as<const int64_t>(indices);
      T* dst = data_as<T>(grad_x);
      const int64_t out_plane = s.out_h * s.out_w;
      parallel_for(s.planes, grain_for(s.in_h * s.in_w + s.out_h * s.out_w), [&](int64_t p_begin, int64_t p_end) {
        PlaneSums<T> sums(s.in_h * s.in_w);
        for (int64_t p = p_begin; p < p_end; ++p) {
          sums.clear();
          for (int64_t o = p * out_plane; o < (p + 1) * out_plane; ++o) {
            if (idx[o] >= 0) sums[idx[o]] += convert<double>(g[o]);
          }
          sums.store(dst + p * s.in_h * s.in_w);
        }
      });
    });
  }

  void avg_pool2d_forward(const Tensor& x, const Pool2dShape& s, const Pool2dWindow& w, bool count_include_pad,
                          const Tensor& out) const override {
    visit_float(x.dtype(), "avg_pool2d", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* src = data_as<const T>(x);
      T* dst = data_as<T>(out);
      parallel_for(s.planes, grain_for(s.in_h * s.in_w + s.out_h * s.out_w), [&](int64_t p_begin, int64_t p_end) {
        for (int64_t p = p_begin; p < p_end; ++p) {
          const T* plane = src + p * s.in_h * s.in_w;
          for (int64_t oh = 0; oh < s.out_h; ++oh) {
            const AvgSpan rows = kernels::avg_span(oh, s.in_h, w.kernel_h, w.stride_h, w.pad_h, count_include_pad);
            for (int64_t ow = 0; ow < s.out_w; ++ow) {
              const AvgSpan cols = kernels::avg_span(ow, s.in_w, w.kernel_w, w.stride_w, w.pad_w, count_include_pad);
              double sum = 0;
              for (int64_t h = rows.begin; h < rows.end; ++h)
                for (int64_t c = cols.begin; c < cols.end; ++c) sum += convert<double>(plane[h * s.in_w + c]);
              const bool empty = rows.begin >= rows.end || cols.begin >= cols.end;
              dst[(p * s.out_h + oh) * s.out_w + ow] =
                  convert<T>(empty ? 0.0 : sum / static_cast<double>(rows.count * cols.count));
            }
          }
        }
      });
    });
  }

  void avg_pool2d_backward(const Tensor& grad_out, const Pool2dShape& s, const Pool2dWindow& w, bool count_include_pad,
                           const Tensor& grad_x) const override {
    visit_float(grad_x.dtype(), "avg_pool2d backward", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* g = data_as<const T>(grad_out);
      T* dst = data_as<T>(grad_x);
      parallel_for(s.planes, grain_for(s.in_h * s.in_w + s.out_h * s.out_w), [&](int64_t p_begin, int64_t p_end) {
        PlaneSums<T> sums(s.in_h * s.in_w);
        for (int64_t p = p_begin; p < p_end; ++p) {
          sums.clear();
          for (int64_t oh = 0; oh < s.out_h; ++oh) {
            const AvgSpan rows = kernels::avg_span(oh, s.in_h, w.kernel_h, w.stride_h, w.pad_h, count_include_pad);
            for (int64_t ow = 0; ow < s.out_w; ++ow) {
              const AvgSpan cols = kernels::avg_span(ow, s.in_w, w.kernel_w, w.stride_w, w.pad_w, count_include_pad);
              if (rows.begin >= rows.end || cols.begin >= cols.end) continue;
              const double share =
                  convert<double>(g[(p * s.out_h + oh) * s.out_w + ow]) / static_cast<double>(rows.count * cols.count);
              for (int64_t h = rows.begin; h < rows.end; ++h)
                for (int64_t c = cols.begin; c < cols.end; ++c) sums[h * s.in_w + c] += share;
            }
          }
          sums.store(dst + p * s.in_h * s.in_w);
        }
      });
    });
  }

  void adaptive_avg_pool2d_forward(const Tensor& x, const Pool2dShape& s, const Tensor& out) const override {
    visit_float(x.dtype(), "adaptive_avg_pool2d", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* src = data_as<const T>(x);
      T* dst = data_as<T>(out);
      parallel_for(s.planes, grain_for(s.in_h * s.in_w + s.out_h * s.out_w), [&](int64_t p_begin, int64_t p_end) {
        for (int64_t p = p_begin; p < p_end; ++p) {
          const T* plane = src + p * s.in_h * s.in_w;
          for (int64_t oh = 0; oh < s.out_h; ++oh) {
            const int64_t h0 = kernels::adaptive_begin(oh, s.out_h, s.in_h);
            const int64_t h1 = kernels::adaptive_end(oh, s.out_h, s.in_h);
            for (int64_t ow = 0; ow < s.out_w; ++ow) {
              const int64_t w0 = kernels::adaptive_begin(ow, s.out_w, s.in_w);
              const int64_t w1 = kernels::adaptive_end(ow, s.out_w, s.in_w);
              double sum = 0;
              for (int64_t h = h0; h < h1; ++h)
                for (int64_t c = w0; c < w1; ++c) sum += convert<double>(plane[h * s.in_w + c]);
              dst[(p * s.out_h + oh) * s.out_w + ow] = convert<T>(sum / static_cast<double>((h1 - h0) * (w1 - w0)));
            }
          }
        }
      });
    });
  }

  void adaptive_avg_pool2d_backward(const Tensor& grad_out, const Pool2dShape& s, const Tensor& grad_x) const override {
    visit_float(grad_x.dtype(), "adaptive_avg_pool2d backward", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* g = data_as<const T>(grad_out);
      T* dst = data_as<T>(grad_x);
      parallel_for(s.planes, grain_for(s.in_h * s.in_w + s.out_h * s.out_w), [&](int64_t p_begin, int64_t p_end) {
        PlaneSums<T> sums(s.in_h * s.in_w);
        for (int64_t p = p_begin; p < p_end; ++p) {
          sums.clear();
          for (int64_t oh = 0; oh < s.out_h; ++oh) {
            const int64_t h0 = kernels::adaptive_begin(oh, s.out_h, s.in_h);
            const int64_t h1 = kernels::adaptive_end(oh, s.out_h, s.in_h);
            for (int64_t ow = 0; ow < s.out_w; ++ow) {
              const int64_t w0 = kernels::adaptive_begin(ow, s.out_w, s.in_w);
              const int64_t w1 = kernels::adaptive_end(ow, s.out_w, s.in_w);
              const double share =
                  convert<double>(g[(p * s.out_h + oh) * s.out_w + ow]) / static_cast<double>((h1 - h0) * (w1 - w0));
              for (int64_t h = h0; h < h1; ++h)
                for (int64_t c = w0; c < w1; ++c) sums[h * s.in_w + c] += share;
            }
          }
          sums.store(dst + p * s.in_h * s.in_w);
        }
      });
    });
  }
};

}  // namespace

const kernels::PoolKernels& pool_kernels() {
  static const CpuPool kernels;
  return kernels;
}

}  // namespace cpu
}  // namespace normcore
