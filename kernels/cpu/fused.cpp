// CPU reference of the fused kernels (contracts in kernels/fused.h): the GroupNorm + min +
// bias step of gemm_group_norm_min_bias, and the softmax cross-entropy rows of
// linear_cross_entropy (two passes per row in double, rows in parallel). Per row of v = y + linear_bias: two-pass group
// statistics in double, the affine-normalized values' min and first argmin, then
// out[o, b] = min_b + bias[o].
// Backward: the min passes g_b = sum_o grad_out[o, b] to one column a_b, so only its group
// gets a gradient: grad_y = rstd * (w * dz - mean(w * dz) - xhat * mean(w * dz * xhat)).
// One thread, fixed loop order: parameter gradients are deterministic.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/fused.h"

namespace normcore {
namespace cpu {

namespace {

// v[b, c] = y[b, c] + linear_bias[c] in double.
template <class T>
double biased(const T* y, const T* linear_bias, int64_t b, int64_t c, int64_t channels) {
  return convert<double>(y[b * channels + c]) + (linear_bias ? convert<double>(linear_bias[c]) : 0.0);
}

// Whether candidate v at a later index replaces best: a NaN wins, then the smaller value.
inline bool replaces_min(double v, double best) {
  if (std::isnan(best)) return false;
  return std::isnan(v) || v < best;
}

template <class T>
void forward_typed(const Tensor& y_t, const Tensor& linear_bias_t, const Tensor& weight_t, const Tensor& gn_bias_t,
                   const Tensor& bias_t, int64_t rows, int64_t channels, int64_t groups, double eps,
                   const Tensor& out_t, const Tensor& mean_t, const Tensor& rstd_t, const Tensor& argmin_t) {
  const T* y = data_as<const T>(y_t);
  const T* linear_bias = data_or_null<const T>(linear_bias_t);
  const T* weight = data_or_null<const T>(weight_t);
  const T* gn_bias = data_or_null<const T>(gn_bias_t);
  const T* bias = data_as<const T>(bias_t);
  T* out = data_as<T>(out_t);
  double* mean_out = data_as<double>(mean_t);
  double* rstd_out = data_as<double>(rstd_t);
  int64_t* argmin = data_as<int64_t>(argmin_t);
  const int64_t group_len = channels / groups;
  std::vector<double> vr(static_cast<size_t>(channels));  // the row of v, read three times
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t c = 0; c < channels; ++c) vr[c] = biased(y, linear_bias, b, c, channels);
    double best = 0;
    int64_t best_index = -1;
    for (int64_t g = 0; g < groups; ++g) {
      const double* vg = vr.data() + g * group_len;
      double sum = 0;
      for (int64_t i = 0; i < group_len; ++i) sum += vg[i];
      const double mean = sum / static_cast<double>(group_len);
      double sq = 0;
      for (int64_t i = 0; i < group_len; ++i) {
        const double d = vg[i] - mean;
        sq += d * d;
      }
      const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(group_len) + eps);
      mean_out[b * groups + g] = mean;
      rstd_out[b * groups + g] = rstd;
      for (int64_t i = 0; i < group_len; ++i) {
        const int64_t c = g * group_len + i;
        double z = (vg[i] - mean) * rstd;
        if (weight) z *= convert<double>(weight[c]);
        if (gn_bias) z += convert<double>(gn_bias[c]);
        if (best_index < 0 || replaces_min(z, best)) {
          best = z;
          best_index = c;
        }
      }
    }
    argmin[b] = best_index;
    for (int64_t o = 0; o < channels; ++o) out[o * rows + b] = convert<T>(best + convert<double>(bias[o]));
  }
}

template <class T>
void backward_typed(const Tensor& grad_out_t, const Tensor& y_t, const Tensor& linear_bias_t, const Tensor& weight_t,
                    const Tensor& mean_t, const Tensor& rstd_t, const Tensor& argmin_t, int64_t rows, int64_t channels,
                    int64_t groups, const Tensor& grad_y_t, const Tensor& grad_linear_bias_t,
                    const Tensor& grad_weight_t, const Tensor& grad_gn_bias_t, const Tensor& grad_bias_t) {
  const T* grad_out = data_as<const T>(grad_out_t);
  const T* y = data_as<const T>(y_t);
  const T* linear_bias = data_or_null<const T>(linear_bias_t);
  const T* weight = data_or_null<const T>(weight_t);
  const double* mean_in = data_as<const double>(mean_t);
  const double* rstd_in = data_as<const double>(rstd_t);
  const int64_t* argmin = data_as<const int64_t>(argmin_t);
  const int64_t group_len = channels / groups;

  // g_b = sum over o of grad_out[o, b], o in order; grad_bias[o] = sum over b, b in order.
  std::vector<double> row_grad(static_cast<size_t>(rows), 0.0);
  std::vector<double> bias_sum(static_cast<size_t>(channels), 0.0);
  for (int64_t o = 0; o < channels; ++o) {
    for (int64_t b = 0; b < rows; ++b) {
      const double g = convert<double>(grad_out[o * rows + b]);
      row_grad[b] += g;
      bias_sum[o] += g;
    }
  }
  std::vector<double> weight_sum(static_cast<size_t>(channels), 0.0);
  std::vector<double> gn_bias_sum(static_cast<size_t>(channels), 0.0);
  std::vector<double> linear_bias_sum(static_cast<size_t>(channels), 0.0);  // over b, in order
  T* grad_y = grad_y_t.defined() ? data_as<T>(grad_y_t) : nullptr;
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t a = argmin[b];
    const int64_t g = a / group_len;
    const double mean = mean_in[b * groups + g], rstd = rstd_in[b * groups + g];
    const double xhat_a = (biased(y, linear_bias, b, a, channels) - mean) * rstd;
    const double dz = row_grad[b];
    weight_sum[a] += dz * xhat_a;
    gn_bias_sum[a] += dz;
    T* gyr = grad_y ? grad_y + b * channels : nullptr;
    if (gyr)
      for (int64_t c = 0; c < channels; ++c) gyr[c] = convert<T>(0.0);
    const double w_dz = (weight ? convert<double>(weight[a]) : 1.0) * dz;
    const double mean_w_dz = w_dz / static_cast<double>(group_len);
    const double mean_w_dz_xhat = w_dz * xhat_a / static_cast<double>(group_len);
    for (int64_t c = g * group_len; c < (g + 1) * group_len; ++c) {
      const double xhat = (biased(y, linear_bias, b, c, channels) - mean) * rstd;
      const double value = rstd * ((c == a ? w_dz : 0.0) - mean_w_dz - xhat * mean_w_dz_xhat);
      if (gyr) gyr[c] = convert<T>(value);
      linear_bias_sum[c] += value;
    }
  }
  const auto store = [channels](const Tensor& t, const std::vector<double>& sums) {
    if (!t.defined()) return;
    T* dst = data_as<T>(t);
    for (int64_t c = 0; c < channels; ++c) dst[c] = convert<T>(sums[c]);
  };
  store(grad_linear_bias_t, linear_bias_sum);
  store(grad_weight_t, weight_sum);
  store(grad_gn_bias_t, gn_bias_sum);
  store(grad_bias_t, bias_sum);
}

template <class T>
void cross_entropy_rows_typed(const Tensor& logits_t, const Tensor& target_t, int64_t classes, int64_t ignore_index,
                              double scale, const Tensor& loss_t) {
  T* logits = data_as<T>(logits_t);
  const int64_t* target = data_as<const int64_t>(target_t);
  double* loss = data_as<double>(loss_t);
  const int64_t rows = target_t.numel(), cols = rows ? logits_t.numel() / rows : 0;
  parallel_for(rows, grain_for(3 * cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* row = logits + r * cols;
      if (target[r] == ignore_index) {
        loss[r] = 0;
        std::fill(row, row + cols, convert<T>(0.0));
        continue;
      }
      double max = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < classes; ++j) max = std::max(max, convert<double>(row[j]));
      double sum = 0;
      for (int64_t j = 0; j < classes; ++j) sum += std::exp(convert<double>(row[j]) - max);
      // A row of -inf or +inf logits gives NaN here as in PyTorch's log_softmax.
      const double lse = max + std::log(sum);
      loss[r] = lse - convert<double>(row[target[r]]);
      for (int64_t j = 0; j < classes; ++j)
        row[j] = convert<T>(scale * (std::exp(convert<double>(row[j]) - lse) - (j == target[r] ? 1.0 : 0.0)));
      for (int64_t j = classes; j < cols; ++j) row[j] = convert<T>(0.0);
    }
  });
}

template <class T>
void softmax_rows_typed(const Tensor& x_t, int64_t rows, int64_t cols, bool take_log, const Tensor& out_t) {
  using C = compute_t<T>;
  const T* x = data_as<const T>(x_t);
  T* out = data_as<T>(out_t);
  parallel_for(rows, grain_for(4 * cols), [&](int64_t begin, int64_t end) {
    std::vector<C> e(take_log ? 0 : static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      const T* row = x + r * cols;
      T* o = out + r * cols;
      // Eight running maxima and sums (no chain of dependent adds), combined in a fixed order.
      constexpr int kLanes = 8;
      C lane_max[kLanes], lane_sum[kLanes];
      bool nan = false;
      for (int l = 0; l < kLanes; ++l) lane_max[l] = -std::numeric_limits<C>::infinity(), lane_sum[l] = 0;
      for (int64_t j = 0; j < cols; ++j) {
        const C v = convert<C>(row[j]);
        nan = nan || v != v;
        lane_max[j % kLanes] = v > lane_max[j % kLanes] ? v : lane_max[j % kLanes];
      }
      C m = nan ? std::numeric_limits<C>::quiet_NaN() : lane_max[0];  // a NaN makes the max NaN
      for (int l = 1; l < kLanes; ++l) m = lane_max[l] > m ? lane_max[l] : m;
      for (int64_t j = 0; j < cols; ++j) {
        const C x_j = std::exp(convert<C>(row[j]) - m);
        if (!take_log) e[static_cast<size_t>(j)] = x_j;
        lane_sum[j % kLanes] += x_j;
      }
      C sum = lane_sum[0];
      for (int l = 1; l < kLanes; ++l) sum += lane_sum[l];
      if (take_log) {
        const C log_sum = std::log(sum);
        for (int64_t j = 0; j < cols; ++j) o[j] = convert<T>((convert<C>(row[j]) - m) - log_sum);
      } else {
        const C inverse = C(1) / sum;
        for (int64_t j = 0; j < cols; ++j) o[j] = convert<T>(e[static_cast<size_t>(j)] * inverse);
      }
    }
  });
}

class CpuFused final : public kernels::FusedKernels {
 public:
  bool softmax_rows(const Tensor& x, int64_t rows, int64_t cols, bool take_log, const Tensor& out) const override {
    visit_float(x.dtype(), take_log ? "log_softmax" : "softmax",
                [&](auto tag) { softmax_rows_typed<typename decltype(tag)::type>(x, rows, cols, take_log, out); });
    return true;
  }

  void cross_entropy_rows(const char* op, const Tensor& logits, const Tensor& target, int64_t classes,
                          int64_t ignore_index, const Tensor& scale, const Tensor& loss) const override {
    const int64_t* t = data_as<const int64_t>(target);
    for (int64_t r = 0; r < target.numel(); ++r)
      NC_CHECK(t[r] == ignore_index || (t[r] >= 0 && t[r] < classes), IndexError, op, ": target value ", t[r],
               " is out of range for ", classes, " classes");
    const double factor = scale.defined() ? *data_as<const double>(scale) : 1.0;
    visit_float(logits.dtype(), op, [&](auto tag) {
      cross_entropy_rows_typed<typename decltype(tag)::type>(logits, target, classes, ignore_index, factor, loss);
    });
  }

  void group_norm_min_bias_forward(const Tensor& y, const Tensor& linear_bias, const Tensor& weight,
                                   const Tensor& gn_bias, const Tensor& bias, const kernels::GroupLayout& l, double eps,
                                   const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& argmin) const override {
    visit_float(y.dtype(), "gemm_group_norm_min_bias", [&](auto tag) {
      forward_typed<typename decltype(tag)::type>(y, linear_bias, weight, gn_bias, bias, l.batch, l.channels(),
                                                  l.groups, eps, out, mean, rstd, argmin);
    });
  }

  void group_norm_min_bias_backward(const Tensor& grad_out, const Tensor& y, const Tensor& linear_bias,
                                    const Tensor& weight, const Tensor& mean, const Tensor& rstd, const Tensor& argmin,
                                    const kernels::GroupLayout& l, const Tensor& grad_y, const Tensor& grad_linear_bias,
                                    const Tensor& grad_weight, const Tensor& grad_gn_bias,
                                    const Tensor& grad_bias) const override {
    visit_float(y.dtype(), "gemm_group_norm_min_bias backward", [&](auto tag) {
      backward_typed<typename decltype(tag)::type>(grad_out, y, linear_bias, weight, mean, rstd, argmin, l.batch,
                                                   l.channels(), l.groups, grad_y, grad_linear_bias, grad_weight,
                                                   grad_gn_bias, grad_bias);
    });
  }

  // The composition add + layer_norm is the CPU's form (and the reference of the CUDA kernel).
  bool add_layer_norm_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, double,
                              const Tensor&, const Tensor&, const Tensor&, const Tensor&) const override {
    return false;
  }
};

}  // namespace

const kernels::FusedKernels& fused_kernels() {
  static const CpuFused kernels;
  return kernels;
}

}  // namespace cpu
}  // namespace normcore
