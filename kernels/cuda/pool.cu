// CUDA pooling kernels (contracts in kernels/pool.h). Storage type T, math type C
// (float for f32/f16/bf16, double for f64). Forward: one thread per output element, its
// window read in row-major order. Backward: one thread per input element gathers the
// gradients of the windows that can read it, in ascending (oh, ow) order, so every result
// is deterministic and no atomics are needed: max pooling adds the windows whose saved
// index is this element, average pooling each covering window's share.
#include "kernels/cuda/loops.cuh"
#include "kernels/pool.h"

namespace normcore {
namespace cuda {
namespace {

using kernels::AvgSpan;
using kernels::Pool2dShape;
using kernels::Pool2dWindow;

// Element e of a contiguous [planes, rows, cols] tensor as (plane, row, col); Index is
// uint32_t when every element index fits, else int64_t.
template <class Index>
struct PlaneAt {
  int64_t plane, row, col;
  __device__ __forceinline__ PlaneAt(Index e, Index rows, Index cols) {
    const Index rest = e / cols;
    col = static_cast<int64_t>(e - rest * cols);
    row = static_cast<int64_t>(rest % rows);
    plane = static_cast<int64_t>(rest / rows);
  }
};

// The windows along one dim whose extent [o * stride - pad, o * stride - pad + extent)
// holds position i: [first, last) clipped to [0, out).
struct Covering {
  int64_t first, last;
};
__device__ __forceinline__ Covering covering(int64_t i, int64_t extent, int64_t stride, int64_t pad, int64_t out) {
  const int64_t at = i + pad;
  const int64_t first = at < extent ? 0 : (at - extent) / stride + 1;
  const int64_t last = at / stride + 1;
  return {first, last < out ? last : out};
}

template <class T, class Index>
__global__ void max_pool2d_forward_kernel(const T* __restrict__ x, Pool2dShape s, Pool2dWindow w, Index count,
                                          T* __restrict__ out, int64_t* __restrict__ indices) {
  using C = compute_t<T>;
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index e = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; e < count; e += stride) {
    const PlaneAt<Index> o(e, static_cast<Index>(s.out_h), static_cast<Index>(s.out_w));
    const T* plane = x + o.plane * s.in_h * s.in_w;
    const int64_t h0 = o.row * w.stride_h - w.pad_h, w0 = o.col * w.stride_w - w.pad_w;
    C best = -std::numeric_limits<C>::infinity();
    int64_t best_at = -1;
    for (int64_t i = kernels::first_tap(h0, w.dilation_h); i < w.kernel_h; ++i) {
      const int64_t h = h0 + i * w.dilation_h;
      if (h >= s.in_h) break;
      for (int64_t j = kernels::first_tap(w0, w.dilation_w); j < w.kernel_w; ++j) {
        const int64_t c = w0 + j * w.dilation_w;
        if (c >= s.in_w) break;
        const C v = convert<C>(plane[h * s.in_w + c]);
        if (best_at < 0 || kernels::max_pool_takes(v, best)) {
          best = v;
          best_at = h * s.in_w + c;
        }
      }
    }
    out[e] = convert<T>(best);
    if (indices != nullptr) indices[e] = best_at;
  }
}

template <class T, class Index>
__global__ void max_pool2d_backward_kernel(const T* __restrict__ grad_out, const int64_t* __restrict__ indices,
                                           Pool2dShape s, Pool2dWindow w, Index count, T* __restrict__ grad_x) {
  using C = compute_t<T>;
  const int64_t extent_h = (w.kernel_h - 1) * w.dilation_h + 1, extent_w = (w.kernel_w - 1) * w.dilation_w + 1;
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index e = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; e < count; e += stride) {
    const PlaneAt<Index> in(e, static_cast<Index>(s.in_h), static_cast<Index>(s.in_w));
    const int64_t self = in.row * s.in_w + in.col;
    const Covering rows = covering(in.row, extent_h, w.stride_h, w.pad_h, s.out_h);
    const Covering cols = covering(in.col, extent_w, w.stride_w, w.pad_w, s.out_w);
    const int64_t plane = in.plane * s.out_h * s.out_w;
    C sum = 0;
    for (int64_t oh = rows.first; oh < rows.last; ++oh) {
      for (int64_t ow = cols.first; ow < cols.last; ++ow) {
        const int64_t o = plane + oh * s.out_w + ow;
        if (indices[o] == self) sum += convert<C>(grad_out[o]);
      }
    }
    grad_x[e] = convert<T>(sum);
  }
}

template <class T, class Index>
__global__ void avg_pool2d_forward_kernel(const T* __restrict__ x, Pool2dShape s, Pool2dWindow w,
                                          bool count_include_pad, Index count, T* __restrict__ out) {
  using C = compute_t<T>;
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index e = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; e < count; e += stride) {
    const PlaneAt<Index> o(e, static_cast<Index>(s.out_h), static_cast<Index>(s.out_w));
    const T* plane = x + o.plane * s.in_h * s.in_w;
    const AvgSpan rows = kernels::avg_span(o.row, s.in_h, w.kernel_h, w.stride_h, w.pad_h, count_include_pad);
    const AvgSpan cols = kernels::avg_span(o.col, s.in_w, w.kernel_w, w.stride_w, w.pad_w, count_include_pad);
    C sum = 0;
    for (int64_t h = rows.begin; h < rows.end; ++h)
      for (int64_t c = cols.begin; c < cols.end; ++c) sum += convert<C>(plane[h * s.in_w + c]);
    const bool empty = rows.begin >= rows.end || cols.begin >= cols.end;
    out[e] = convert<T>(empty ? C(0) : sum / static_cast<C>(rows.count * cols.count));
  }
}

template <class T, class Index>
__global__ void avg_pool2d_backward_kernel(const T* __restrict__ grad_out, Pool2dShape s, Pool2dWindow w,
                                           bool count_include_pad, Index count, T* __restrict__ grad_x) {
  using C = compute_t<T>;
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index e = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; e < count; e += stride) {
    const PlaneAt<Index> in(e, static_cast<Index>(s.in_h), static_cast<Index>(s.in_w));
    // Without dilation a window's extent is its kernel, and every covering window reads
    // this element.
    const Covering rows = covering(in.row, w.kernel_h, w.stride_h, w.pad_h, s.out_h);
    const Covering cols = covering(in.col, w.kernel_w, w.stride_w, w.pad_w, s.out_w);
    const T* plane = grad_out + in.plane * s.out_h * s.out_w;
    C sum = 0;
    for (int64_t oh = rows.first; oh < rows.last; ++oh) {
      const int64_t row_count = kernels::avg_span(oh, s.in_h, w.kernel_h, w.stride_h, w.pad_h, count_include_pad).count;
      for (int64_t ow = cols.first; ow < cols.last; ++ow) {
        const int64_t col_count =
            kernels::avg_span(ow, s.in_w, w.kernel_w, w.stride_w, w.pad_w, count_include_pad).count;
        sum += convert<C>(plane[oh * s.out_w + ow]) / static_cast<C>(row_count * col_count);
      }
    }
    grad_x[e] = convert<T>(sum);
  }
}

template <class T, class Index>
__global__ void adaptive_avg_pool2d_forward_kernel(const T* __restrict__ x, Pool2dShape s, Index count,
                                                   T* __restrict__ out) {
  using C = compute_t<T>;
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index e = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; e < count; e += stride) {
    const PlaneAt<Index> o(e, static_cast<Index>(s.out_h), static_cast<Index>(s.out_w));
    const T* plane = x + o.plane * s.in_h * s.in_w;
    const int64_t h0 = kernels::adaptive_begin(o.row, s.out_h, s.in_h);
    const int64_t h1 = kernels::adaptive_end(o.row, s.out_h, s.in_h);
    const int64_t w0 = kernels::adaptive_begin(o.col, s.out_w, s.in_w);
    const int64_t w1 = kernels::adaptive_end(o.col, s.out_w, s.in_w);
    C sum = 0;
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t c = w0; c < w1; ++c) sum += convert<C>(plane[h * s.in_w + c]);
    out[e] = convert<T>(sum / static_cast<C>((h1 - h0) * (w1 - w0)));
  }
}

template <class T, class Index>
__global__ void adaptive_avg_pool2d_backward_kernel(const T* __restrict__ grad_out, Pool2dShape s, Index count,
                                                    T* __restrict__ grad_x) {
  using C = compute_t<T>;
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index e = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; e < count; e += stride) {
    const PlaneAt<Index> in(e, static_cast<Index>(s.in_h), static_cast<Index>(s.in_w));
    // The bins holding row h are [floor(h out / in), ceil((h + 1) out / in)): the bin
    // formula with the roles of the two sizes swapped.
    const int64_t oh0 = kernels::adaptive_begin(in.row, s.in_h, s.out_h);
    const int64_t oh1 = kernels::adaptive_end(in.row, s.in_h, s.out_h);
    const int64_t ow0 = kernels::adaptive_begin(in.col, s.in_w, s.out_w);
    const int64_t ow1 = kernels::adaptive_end(in.col, s.in_w, s.out_w);
    const T* plane = grad_out + in.plane * s.out_h * s.out_w;
    C sum = 0;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      const int64_t bin_h = kernels::adaptive_end(oh, s.out_h, s.in_h) - kernels::adaptive_begin(oh, s.out_h, s.in_h);
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t bin_w = kernels::adaptive_end(ow, s.out_w, s.in_w) - kernels::adaptive_begin(ow, s.out_w, s.in_w);
        sum += convert<C>(plane[oh * s.out_w + ow]) / static_cast<C>(bin_h * bin_w);
      }
    }
    grad_x[e] = convert<T>(sum);
  }
}

class CudaPool final : public kernels::PoolKernels {
 public:
  void max_pool2d_forward(const Tensor& x, const Pool2dShape& s, const Pool2dWindow& w, const Tensor& out,
                          const Tensor& indices) const override {
    NC_CHECK(s.channels == 0, DeviceError, "max_pool2d: the CUDA kernels pool NCHW planes only (core copies others)");
    const int64_t count = out.numel();
    if (count == 0) return;
    const Launcher launch("max_pool2d", out);
    visit_float(x.dtype(), launch.op(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      with_index_type(count, [&](auto index_tag) {
        using Index = decltype(index_tag);
        launch(max_pool2d_forward_kernel<T, Index>, launch.grid_for(count), kThreads, 0, data_as<const T>(x), s, w,
               static_cast<Index>(count), data_as<T>(out), data_or_null<int64_t>(indices));
      });
    });
  }

  void max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Pool2dShape& s, const Pool2dWindow& w,
                           const Tensor& grad_x) const override {
    const int64_t count = grad_x.numel();
    if (count == 0) return;
    const Launcher launch("max_pool2d backward", grad_x);
    visit_float(grad_x.dtype(), launch.op(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      with_index_type(count, [&](auto index_tag) {
        using Index = decltype(index_tag);
        launch(max_pool2d_backward_kernel<T, Index>, launch.grid_for(count), kThreads, 0, data_as<const T>(grad_out),
               data_as<const int64_t>(indices), s, w, static_cast<Index>(count), data_as<T>(grad_x));
      });
    });
  }

  void avg_pool2d_forward(const Tensor& x, const Pool2dShape& s, const Pool2dWindow& w, bool count_include_pad,
                          const Tensor& out) const override {
    const int64_t count = out.numel();
    if (count == 0) return;
    const Launcher launch("avg_pool2d", out);
    visit_float(x.dtype(), launch.op(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      with_index_type(count, [&](auto index_tag) {
        using Index = decltype(index_tag);
        launch(avg_pool2d_forward_kernel<T, Index>, launch.grid_for(count), kThreads, 0, data_as<const T>(x), s, w,
               count_include_pad, static_cast<Index>(count), data_as<T>(out));
      });
    });
  }

  void avg_pool2d_backward(const Tensor& grad_out, const Pool2dShape& s, const Pool2dWindow& w, bool count_include_pad,
                           const Tensor& grad_x) const override {
    const int64_t count = grad_x.numel();
    if (count == 0) return;
    const Launcher launch("avg_pool2d backward", grad_x);
    visit_float(grad_x.dtype(), launch.op(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      with_index_type(count, [&](auto index_tag) {
        using Index = decltype(index_tag);
        launch(avg_pool2d_backward_kernel<T, Index>, launch.grid_for(count), kThreads, 0, data_as<const T>(grad_out), s,
               w, count_include_pad, static_cast<Index>(count), data_as<T>(grad_x));
      });
    });
  }

  void adaptive_avg_pool2d_forward(const Tensor& x, const Pool2dShape& s, const Tensor& out) const override {
    const int64_t count = out.numel();
    if (count == 0) return;
    const Launcher launch("adaptive_avg_pool2d", out);
    visit_float(x.dtype(), launch.op(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      with_index_type(count, [&](auto index_tag) {
        using Index = decltype(index_tag);
        launch(adaptive_avg_pool2d_forward_kernel<T, Index>, launch.grid_for(count), kThreads, 0, data_as<const T>(x),
               s, static_cast<Index>(count), data_as<T>(out));
      });
    });
  }

  void adaptive_avg_pool2d_backward(const Tensor& grad_out, const Pool2dShape& s, const Tensor& grad_x) const override {
    const int64_t count = grad_x.numel();
    if (count == 0) return;
    const Launcher launch("adaptive_avg_pool2d backward", grad_x);
    visit_float(grad_x.dtype(), launch.op(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      with_index_type(count, [&](auto index_tag) {
        using Index = decltype(index_tag);
        launch(adaptive_avg_pool2d_backward_kernel<T, Index>, launch.grid_for(count), kThreads, 0,
               data_as<const T>(grad_out), s, static_cast<Index>(count), data_as<T>(grad_x));
      });
    });
  }
};

}  // namespace

const kernels::PoolKernels& pool_kernels() {
  static const CudaPool kernels;
  return kernels;
}

}  // namespace cuda
}  // namespace normcore
