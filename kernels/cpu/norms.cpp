// CPU reference normalization kernels (contracts in kernels/norms.h). Layer norm is
// group norm with one group per row, one channel per element and no spatial extent, so
// both run one template over [batch, groups, group_channels, spatial]. Statistics are
// two-pass (mean, then squared deviations from it) in double, so a large mean costs no
// accuracy. Backward folds the weight into per-row coefficients:
//   grad_x = rstd * (w_c * dy - mean(w * dy) - xhat * mean(w * dy * xhat)).
// Batch norm takes the same two-pass statistics per channel, over the channel's batch
// planes. RMS norm is layer norm without centering: the same templates with no mean (taken
// as 0, and mean(w * dy) dropped from grad_x). Rows (batch norm: channels) run in ranges on
// the thread pool; parameter gradients sum each range's rows in order and then the ranges in
// order, ranges fixed by the shape, so they are the same at any thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/norms.h"

namespace normcore {
namespace cpu {

namespace {

// The sum over a row of term(x[i]) in double, as eight interleaved partial sums added in a
// fixed order at the end: independent chains the processor (and the compiler's vectors)
// overlap, where one running sum waits on each addition; the same bits every run.
template <class T, class Term>
double row_sum(const T* x, int64_t n, Term term) {
  double part[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) part[j] += term(convert<double>(x[i + j]));
  }
  for (; i < n; ++i) part[i % 8] += term(convert<double>(x[i]));
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

template <class T>
void affine_norm_forward(const Tensor& x_t, const Tensor& weight_t, const Tensor& bias_t, const kernels::GroupLayout& l,
                         double eps, const Tensor& y_t, const Tensor& mean_t, const Tensor& rstd_t) {
  const T* x = data_as<const T>(x_t);
  const T* weight = data_or_null<const T>(weight_t);
  const T* bias = data_or_null<const T>(bias_t);
  T* y = data_as<T>(y_t);
  double* mean_out = data_or_null<double>(mean_t);  // none: RMS norm, no centering
  double* rstd_out = data_as<double>(rstd_t);
  const int64_t row_len = l.row_len();
  parallel_for(l.rows(), grain_for(row_len), [&](int64_t row_begin, int64_t row_end) {
    for (int64_t r = row_begin; r < row_end; ++r) {
      const T* xr = x + r * row_len;
      T* yr = y + r * row_len;
      const double sum = mean_out ? row_sum(xr, row_len, [](double v) { return v; }) : 0.0;
      const double mean = row_len > 0 ? sum / static_cast<double>(row_len) : 0.0;
      const double sq = row_sum(xr, row_len, [mean](double v) { return (v - mean) * (v - mean); });
      double var = row_len > 0 ? sq / static_cast<double>(row_len) : 0.0;
      double rstd = 1.0 / std::sqrt(var + eps);
      if (mean_out) mean_out[r] = mean;
      rstd_out[r] = rstd;
      const int64_t first_channel = (r % l.groups) * l.group_channels;
      if (l.spatial == 1 && weight && bias) {  // layer norm: one loop the compiler vectorizes
        const T* w = weight + first_channel;
        const T* b = bias + first_channel;
        for (int64_t c = 0; c < l.group_channels; ++c)
          yr[c] = convert<T>((convert<double>(xr[c]) - mean) * rstd * convert<double>(w[c]) + convert<double>(b[c]));
        continue;
      }
      for (int64_t c = 0; c < l.group_channels; ++c) {
        double w = weight ? convert<double>(weight[first_channel + c]) : 1.0;
        double b = bias ? convert<double>(bias[first_channel + c]) : 0.0;
        for (int64_t s = 0; s < l.spatial; ++s) {
          int64_t i = c * l.spatial + s;
          yr[i] = convert<T>((convert<double>(xr[i]) - mean) * rstd * w + b);
        }
      }
    }
  });
}

template <class T>
void affine_norm_backward(const Tensor& grad_y_t, const Tensor& x_t, const Tensor& weight_t, const Tensor& mean_t,
                          const Tensor& rstd_t, const kernels::GroupLayout& l, const Tensor& grad_x_t,
                          const Tensor& grad_weight_t, const Tensor& grad_bias_t) {
  const T* grad_y = data_as<const T>(grad_y_t);
  const T* x = data_as<const T>(x_t);
  const T* weight = data_or_null<const T>(weight_t);
  const double* mean_in = data_or_null<const double>(mean_t);  // none: RMS norm
  const double* rstd_in = data_as<const double>(rstd_t);
  const int64_t row_len = l.row_len();
  const int64_t channels = l.groups * l.group_channels;
  // Rows run in ranges (at most 64, fixed by the shape); each range sums the parameter
  // gradients of its rows in row order, grad_weight = sum(dy * xhat) and grad_bias =
  // sum(dy) per channel, and the ranges' sums are added in range order.
  const int64_t grain = std::max(grain_for(row_len), (l.rows() + 63) / 64);
  const int64_t ranges = range_count(l.rows(), grain);
  std::vector<double> range_sums(static_cast<size_t>(2 * channels * std::max<int64_t>(ranges, 1)), 0.0);
  T* grad_x = data_as<T>(grad_x_t);
  parallel_for(l.rows(), grain, [&](int64_t row_begin, int64_t row_end) {
    double* dy_xhat_sum = range_sums.data() + 2 * channels * (row_begin / grain);
    double* dy_sum = dy_xhat_sum + channels;
    // Per-channel sums within one row: sum(dy) and sum(dy * (x - mean)).
    std::vector<double> row_dy(static_cast<size_t>(l.group_channels));
    std::vector<double> row_dy_xc(static_cast<size_t>(l.group_channels));
    for (int64_t r = row_begin; r < row_end; ++r) {
      const T* xr = x + r * row_len;
      const T* dyr = grad_y + r * row_len;
      const double mean = mean_in ? mean_in[r] : 0.0, rstd = rstd_in[r];
      const int64_t first_channel = (r % l.groups) * l.group_channels;
      double sum_g = 0, sum_g_xc = 0;  // sum(w * dy), sum(w * dy * (x - mean)) over the row
      for (int64_t c = 0; c < l.group_channels; ++c) {
        double dy = 0, dy_xc = 0;
        for (int64_t s = 0; s < l.spatial; ++s) {
          int64_t i = c * l.spatial + s;
          double g = convert<double>(dyr[i]);
          dy += g;
          dy_xc += g * (convert<double>(xr[i]) - mean);
        }
        row_dy[c] = dy;
        row_dy_xc[c] = dy_xc;
        double w = weight ? convert<double>(weight[first_channel + c]) : 1.0;
        sum_g += w * dy;
        sum_g_xc += w * dy_xc;
        dy_sum[first_channel + c] += dy;
        dy_xhat_sum[first_channel + c] += dy_xc * rstd;
      }
      const double inv_len = 1.0 / static_cast<double>(row_len);
      const double mean_g = mean_in ? sum_g * inv_len : 0.0;
      const double mean_g_xhat = sum_g_xc * rstd * inv_len;
      T* gxr = grad_x + r * row_len;
      for (int64_t c = 0; c < l.group_channels; ++c) {
        double w = weight ? convert<double>(weight[first_channel + c]) : 1.0;
        for (int64_t s = 0; s < l.spatial; ++s) {
          int64_t i = c * l.spatial + s;
          double xhat = (convert<double>(xr[i]) - mean) * rstd;
          gxr[i] = convert<T>(rstd * (w * convert<double>(dyr[i]) - mean_g - xhat * mean_g_xhat));
        }
      }
    }
  });
  for (int64_t k = 1; k < ranges; ++k) {
    for (int64_t c = 0; c < 2 * channels; ++c) range_sums[c] += range_sums[2 * channels * k + c];
  }
  if (grad_weight_t.defined()) {
    T* gw = data_as<T>(grad_weight_t);
    for (int64_t c = 0; c < channels; ++c) gw[c] = convert<T>(range_sums[c]);
  }
  if (grad_bias_t.defined()) {
    T* gb = data_as<T>(grad_bias_t);
    for (int64_t c = 0; c < channels; ++c) gb[c] = convert<T>(range_sums[channels + c]);
  }
}

// ---------------------------------------------------------------- batch norm
// x [batch, channels, spatial]: channel c's elements are the batch planes
// x[(n * channels + c) * spatial + s].
struct ChannelPlanes {
  int64_t batch, channels, spatial;
  int64_t count() const { return batch * spatial; }
  int64_t at(int64_t n, int64_t c, int64_t s) const { return (n * channels + c) * spatial + s; }
};

template <class T>
void batch_norm_forward_typed(const Tensor& x_t, const Tensor& weight_t, const Tensor& bias_t,
                              const Tensor& running_mean_t, const Tensor& running_var_t, const ChannelPlanes& p,
                              bool training, double momentum, double eps, const Tensor& y_t, const Tensor& mean_t,
                              const Tensor& rstd_t) {
  const T* x = data_as<const T>(x_t);
  const T* weight = data_or_null<const T>(weight_t);
  const T* bias = data_or_null<const T>(bias_t);
  T* running_mean = data_or_null<T>(running_mean_t);
  T* running_var = data_or_null<T>(running_var_t);
  T* y = data_as<T>(y_t);
  double* mean_out = data_or_null<double>(mean_t);  // none: RMS norm, no centering
  double* rstd_out = data_as<double>(rstd_t);
  const double count = static_cast<double>(p.count());
  parallel_for(p.channels, grain_for(p.count()), [&](int64_t c_begin, int64_t c_end) {
    for (int64_t c = c_begin; c < c_end; ++c) {
      double mean, var;
      if (training) {
        double sum = 0;
        for (int64_t n = 0; n < p.batch; ++n)
          for (int64_t s = 0; s < p.spatial; ++s) sum += convert<double>(x[p.at(n, c, s)]);
        mean = count > 0 ? sum / count : 0.0;
        double sq = 0;
        for (int64_t n = 0; n < p.batch; ++n) {
          for (int64_t s = 0; s < p.spatial; ++s) {
            const double d = convert<double>(x[p.at(n, c, s)]) - mean;
            sq += d * d;
          }
        }
        var = count > 0 ? sq / count : 0.0;
        if (running_mean) {
          running_mean[c] = convert<T>((1 - momentum) * convert<double>(running_mean[c]) + momentum * mean);
        }
        if (running_var) {
          running_var[c] = convert<T>((1 - momentum) * convert<double>(running_var[c]) + momentum * sq / (count - 1));
        }
      } else {
        mean = convert<double>(running_mean[c]);
        var = convert<double>(running_var[c]);
      }
      const double rstd = 1.0 / std::sqrt(var + eps);
      mean_out[c] = mean;
      rstd_out[c] = rstd;
      const double w = weight ? convert<double>(weight[c]) : 1.0;
      const double b = bias ? convert<double>(bias[c]) : 0.0;
      for (int64_t n = 0; n < p.batch; ++n) {
        for (int64_t s = 0; s < p.spatial; ++s) {
          const int64_t i = p.at(n, c, s);
          y[i] = convert<T>((convert<double>(x[i]) - mean) * rstd * w + b);
        }
      }
    }
  });
}

template <class T>
void batch_norm_backward_typed(const Tensor& grad_y_t, const Tensor& x_t, const Tensor& weight_t, const Tensor& mean_t,
                               const Tensor& rstd_t, const ChannelPlanes& p, bool training, const Tensor& grad_x_t,
                               const Tensor& grad_weight_t, const Tensor& grad_bias_t) {
  const T* grad_y = data_as<const T>(grad_y_t);
  const T* x = data_as<const T>(x_t);
  const T* weight = data_or_null<const T>(weight_t);
  const double* mean_in = data_or_null<const double>(mean_t);  // none: RMS norm
  const double* rstd_in = data_as<const double>(rstd_t);
  T* grad_x = data_as<T>(grad_x_t);
  T* grad_weight = data_or_null<T>(grad_weight_t);
  T* grad_bias = data_or_null<T>(grad_bias_t);
  const double inv_count = p.count() > 0 ? 1.0 / static_cast<double>(p.count()) : 0.0;
  parallel_for(p.channels, grain_for(p.count()), [&](int64_t c_begin, int64_t c_end) {
    for (int64_t c = c_begin; c < c_end; ++c) {
      const double mean = mean_in[c], rstd = rstd_in[c];
      double sum_dy = 0, sum_dy_xc = 0;  // sum(dy), sum(dy * (x - mean))
      for (int64_t n = 0; n < p.batch; ++n) {
        for (int64_t s = 0; s < p.spatial; ++s) {
          const int64_t i = p.at(n, c, s);
          const double dy = convert<double>(grad_y[i]);
          sum_dy += dy;
          sum_dy_xc += dy * (convert<double>(x[i]) - mean);
        }
      }
      if (grad_weight) grad_weight[c] = convert<T>(sum_dy_xc * rstd);
      if (grad_bias) grad_bias[c] = convert<T>(sum_dy);
      const double scale = (weight ? convert<double>(weight[c]) : 1.0) * rstd;
      // Training: grad_x = scale * (dy - mean(dy) - (x - mean) * rstd^2 * mean(dy * (x - mean))).
      const double mean_dy = training ? sum_dy * inv_count : 0.0;
      const double slope = training ? sum_dy_xc * rstd * rstd * inv_count : 0.0;
      for (int64_t n = 0; n < p.batch; ++n) {
        for (int64_t s = 0; s < p.spatial; ++s) {
          const int64_t i = p.at(n, c, s);
          const double dy = convert<double>(grad_y[i]);
          grad_x[i] = convert<T>(scale * (dy - mean_dy - (convert<double>(x[i]) - mean) * slope));
        }
      }
    }
  });
}

// x / max(norm, eps); d(norm)/dx is 0 where the clamp is active (norm < eps), which also
// makes a zero row's gradient finite.
inline double clamped(double norm, double eps) { return norm < eps ? eps : norm; }

template <class T>
void l1_forward_typed(const Tensor& x_t, int64_t outer, int64_t size, int64_t inner, double eps, const Tensor& y_t,
                      const Tensor& norm_t) {
  const T* x = data_as<const T>(x_t);
  T* y = data_as<T>(y_t);
  double* norm = data_as<double>(norm_t);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < inner; ++j) {
      const int64_t base = o * size * inner + j;
      double sum = 0;
      for (int64_t k = 0; k < size; ++k) sum += std::fabs(convert<double>(x[base + k * inner]));
      double n = size > 0 ? sum / static_cast<double>(size) : 0.0;
      norm[o * inner + j] = n;
      double inv = 1.0 / clamped(n, eps);
      for (int64_t k = 0; k < size; ++k) y[base + k * inner] = convert<T>(convert<double>(x[base + k * inner]) * inv);
    }
  }
}

inline double sign(double v) { return v > 0 ? 1.0 : v < 0 ? -1.0 : 0.0; }

template <class T>
void l1_backward_typed(const Tensor& grad_y_t, const Tensor& x_t, const Tensor& norm_t, int64_t outer, int64_t size,
                       int64_t inner, double eps, const Tensor& grad_x_t) {
  const T* grad_y = data_as<const T>(grad_y_t);
  const T* x = data_as<const T>(x_t);
  const double* norm = data_as<const double>(norm_t);
  T* grad_x = data_as<T>(grad_x_t);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < inner; ++j) {
      const int64_t base = o * size * inner + j;
      const double n = norm[o * inner + j];
      const double d = clamped(n, eps);
      // d(x_k / n)/dx_i = delta_ki / n - x_k * sign(x_i) / (size * n^2)
      double through_norm = 0;
      if (n >= eps) {
        double g_dot_x = 0;
        for (int64_t k = 0; k < size; ++k) {
          g_dot_x += convert<double>(grad_y[base + k * inner]) * convert<double>(x[base + k * inner]);
        }
        through_norm = g_dot_x / (static_cast<double>(size) * n * n);
      }
      for (int64_t k = 0; k < size; ++k) {
        const int64_t i = base + k * inner;
        const double xi = convert<double>(x[i]);
        grad_x[i] = convert<T>(convert<double>(grad_y[i]) / d - sign(xi) * through_norm);
      }
    }
  }
}

template <class T>
void frobenius_forward_typed(const Tensor& x_t, double eps, const Tensor& y_t, const Tensor& norm_t) {
  const T* x = data_as<const T>(x_t);
  T* y = data_as<T>(y_t);
  const int64_t numel = x_t.numel();
  double sq = 0;
  for (int64_t i = 0; i < numel; ++i) {
    double v = convert<double>(x[i]);
    sq += v * v;
  }
  double n = std::sqrt(sq);
  *data_as<double>(norm_t) = n;
  double inv = 1.0 / clamped(n, eps);
  for (int64_t i = 0; i < numel; ++i) y[i] = convert<T>(convert<double>(x[i]) * inv);
}

template <class T>
void frobenius_backward_typed(const Tensor& grad_y_t, const Tensor& x_t, const Tensor& norm_t, double eps,
                              const Tensor& grad_x_t) {
  const T* grad_y = data_as<const T>(grad_y_t);
  const T* x = data_as<const T>(x_t);
  T* grad_x = data_as<T>(grad_x_t);
  const int64_t numel = x_t.numel();
  const double n = *data_as<const double>(norm_t);
  const double d = clamped(n, eps);
  // d(x_k / n)/dx_i = delta_ki / n - x_k * x_i / n^3
  double through_norm = 0;
  if (n >= eps) {
    double g_dot_x = 0;
    for (int64_t i = 0; i < numel; ++i) g_dot_x += convert<double>(grad_y[i]) * convert<double>(x[i]);
    through_norm = g_dot_x / (n * n * n);
  }
  for (int64_t i = 0; i < numel; ++i) {
    grad_x[i] = convert<T>(convert<double>(grad_y[i]) / d - convert<double>(x[i]) * through_norm);
  }
}

class CpuNorms final : public kernels::NormKernels {
 public:
  void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t rows, int64_t row_len,
                          double eps, const Tensor& y, const Tensor& mean, const Tensor& rstd) const override {
    visit_float(x.dtype(), "layer_norm", [&](auto tag) {
      affine_norm_forward<typename decltype(tag)::type>(x, weight, bias, kernels::layer_layout(rows, row_len), eps, y,
                                                        mean, rstd);
    });
  }

  void layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                           const Tensor& rstd, int64_t rows, int64_t row_len, const Tensor& grad_x,
                           const Tensor& grad_weight, const Tensor& grad_bias) const override {
    visit_float(x.dtype(), "layer_norm backward", [&](auto tag) {
      affine_norm_backward<typename decltype(tag)::type>(
          grad_y, x, weight, mean, rstd, kernels::layer_layout(rows, row_len), grad_x, grad_weight, grad_bias);
    });
  }

  void rms_norm_forward(const Tensor& x, const Tensor& weight, int64_t rows, int64_t row_len, double eps,
                        const Tensor& y, const Tensor& rstd) const override {
    visit_float(x.dtype(), "rms_norm", [&](auto tag) {
      affine_norm_forward<typename decltype(tag)::type>(x, weight, Tensor(), kernels::layer_layout(rows, row_len), eps,
                                                        y, Tensor(), rstd);
    });
  }

  void rms_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& rstd, int64_t rows,
                         int64_t row_len, const Tensor& grad_x, const Tensor& grad_weight) const override {
    visit_float(x.dtype(), "rms_norm backward", [&](auto tag) {
      affine_norm_backward<typename decltype(tag)::type>(
          grad_y, x, weight, Tensor(), rstd, kernels::layer_layout(rows, row_len), grad_x, grad_weight, Tensor());
    });
  }

  void group_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const kernels::GroupLayout& l,
                          double eps, const Tensor& y, const Tensor& mean, const Tensor& rstd) const override {
    visit_float(x.dtype(), "group_norm", [&](auto tag) {
      affine_norm_forward<typename decltype(tag)::type>(x, weight, bias, l, eps, y, mean, rstd);
    });
  }

  void group_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                           const Tensor& rstd, const kernels::GroupLayout& l, const Tensor& grad_x,
                           const Tensor& grad_weight, const Tensor& grad_bias) const override {
    visit_float(x.dtype(), "group_norm backward", [&](auto tag) {
      affine_norm_backward<typename decltype(tag)::type>(grad_y, x, weight, mean, rstd, l, grad_x, grad_weight,
                                                         grad_bias);
    });
  }

  void batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                          const Tensor& running_var, const kernels::BatchLayout& l, const kernels::BatchNormMode& mode,
                          const Tensor& y, const Tensor& mean, const Tensor& rstd) const override {
    visit_float(x.dtype(), "batch_norm", [&](auto tag) {
      batch_norm_forward_typed<typename decltype(tag)::type>(x, weight, bias, running_mean, running_var,
                                                             {l.batch, l.channels, l.spatial}, mode.training,
                                                             mode.momentum, mode.eps, y, mean, rstd);
    });
  }

  void batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                           const Tensor& rstd, const kernels::BatchLayout& l, bool training, const Tensor& grad_x,
                           const Tensor& grad_weight, const Tensor& grad_bias) const override {
    visit_float(x.dtype(), "batch_norm backward", [&](auto tag) {
      batch_norm_backward_typed<typename decltype(tag)::type>(
          grad_y, x, weight, mean, rstd, {l.batch, l.channels, l.spatial}, training, grad_x, grad_weight, grad_bias);
    });
  }

  void l1_norm_forward(const Tensor& x, const kernels::DimLayout& l, double eps, const Tensor& y,
                       const Tensor& norm) const override {
    visit_float(x.dtype(), "l1_norm", [&](auto tag) {
      l1_forward_typed<typename decltype(tag)::type>(x, l.outer, l.size, l.inner, eps, y, norm);
    });
  }

  void l1_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& norm, const kernels::DimLayout& l,
                        double eps, const Tensor& grad_x) const override {
    visit_float(x.dtype(), "l1_norm backward", [&](auto tag) {
      l1_backward_typed<typename decltype(tag)::type>(grad_y, x, norm, l.outer, l.size, l.inner, eps, grad_x);
    });
  }

  void frobenius_norm_forward(const Tensor& x, double eps, const Tensor& y, const Tensor& norm) const override {
    visit_float(x.dtype(), "frobenius_norm",
                [&](auto tag) { frobenius_forward_typed<typename decltype(tag)::type>(x, eps, y, norm); });
  }

  void frobenius_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& norm, double eps,
                               const Tensor& grad_x) const override {
    visit_float(x.dtype(), "frobenius_norm backward", [&](auto tag) {
      frobenius_backward_typed<typename decltype(tag)::type>(grad_y, x, norm, eps, grad_x);
    });
  }
};

}  // namespace

const kernels::NormKernels& norm_kernels() {
  static const CpuNorms kernels;
  return kernels;
}

}  // namespace cpu
}  // namespace normcore
