// CPU attention kernels (contracts in kernels/attention.h). f32, f16 and bf16 run blocks of
// query rows as f32 matrix products (forward_blocked, backward_blocked). The f64 kernels and
// cached_attention are the reference: per (batch, q head, query row), with the
// k and v head of that q head, the row of scores in double, its max m and sum l of
// exp(score - m), the probabilities exp(score - m) / l and the weighted sum of v. Backward
// recomputes each row's
// probabilities the same way (not from the saved log-sum-exp m + log l, whose rounding is
// |m| times the precision: large for a saturated softmax) and takes delta as
// sum_j p_j dp_j, so that dp_j - delta cancels in consistently rounded terms; it sums over
// rows and keys in a fixed order on one thread.
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"

namespace normcore {
namespace cpu {

namespace {

// Element (b, h, row, d) of a [B, H, rows, dim] tensor with unit last stride (T const for
// the inputs, T for the outputs).
template <class T>
struct Heads {
  T* data;
  int64_t batch_stride, head_stride, row_stride;
  Heads(const Tensor& t)
      : data(data_as<T>(t)), batch_stride(t.stride(0)), head_stride(t.stride(1)), row_stride(t.stride(2)) {}
  T* row(int64_t b, int64_t h, int64_t i) const { return data + b * batch_stride + h * head_stride + i * row_stride; }
};

template <class T>
double dot(const T* a, const T* b, int64_t n) {
  double sum = 0;
  for (int64_t d = 0; d < n; ++d) sum += convert<double>(a[d]) * convert<double>(b[d]);
  return sum;
}

// The keys query i attends to: [0, keys).
inline int64_t visible_keys(int64_t i, const kernels::AttentionShape& s, bool causal) {
  return causal ? std::min(i + 1, s.S) : s.S;
}

// probs[j] = exp(score_j - m) / l for the first keys keys of k's head kh seen by query qi;
// returns the row's log-sum-exp m + log l (-inf when keys == 0).
template <class T>
double row_probabilities(const T* qi, const Heads<const T>& k, int64_t b, int64_t kh, int64_t keys,
                         const kernels::AttentionShape& s, double scale, std::vector<double>& probs) {
  double max = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < keys; ++j) {
    probs[j] = scale * dot(qi, k.row(b, kh, j), s.D);
    max = std::max(max, probs[j]);
  }
  double sum = 0;
  for (int64_t j = 0; j < keys; ++j) {
    probs[j] = std::exp(probs[j] - max);
    sum += probs[j];
  }
  for (int64_t j = 0; j < keys; ++j) probs[j] /= sum;
  return keys > 0 ? max + std::log(sum) : -std::numeric_limits<double>::infinity();
}

template <class T>
void forward(const Tensor& q_t, const Tensor& k_t, const Tensor& v_t, const kernels::AttentionShape& s, bool causal,
             double scale, const Tensor& out_t, const Tensor& lse_t) {
  const Heads<const T> q(q_t), k(k_t), v(v_t);
  const Heads<T> out(out_t);
  double* lse = data_as<double>(lse_t);
  const int64_t group = s.heads / s.kv_heads;  // q heads per k, v head
  std::vector<double> probs(static_cast<size_t>(s.S)), acc(static_cast<size_t>(s.Dv));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      for (int64_t i = 0; i < s.L; ++i) {
        const int64_t keys = visible_keys(i, s, causal);
        const int64_t row = (b * s.heads + h) * s.L + i;
        lse[row] = row_probabilities(q.row(b, h, i), k, b, h / group, keys, s, scale, probs);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < keys; ++j) {
          const T* vj = v.row(b, h / group, j);
          for (int64_t d = 0; d < s.Dv; ++d) acc[d] += probs[j] * convert<double>(vj[d]);
        }
        for (int64_t d = 0; d < s.Dv; ++d) out.row(b, h, i)[d] = convert<T>(acc[d]);
      }
    }
  }
}

// ---- the blocked f32 kernels (f32, f16 and bf16 tensors) ----
// Per (batch, q head) on the thread pool, kBlockRows query rows at a time: their scores
// with the keys the last of them sees as one f32 matrix product, each row's softmax in f32
// (its max subtracted, its sum and log-sum-exp in double), the other products likewise.
// Each (batch, q head) is one task's alone, so the bits do not depend on the thread count.
constexpr int64_t kBlockRows = 64;

// rows rows of head h of t from row first, as f32 [rows, dim] contiguous.
template <class T>
void load_rows(const Heads<const T>& t, int64_t b, int64_t h, int64_t first, int64_t rows, int64_t dim, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < dim; ++d) out[r * dim + d] = convert<float>(t.row(b, h, first + r)[d]);
}

// scores [rows, keys] = a [rows, D] @ b^T (b [keys, D] row-major).
void product_transposed(const float* a, const float* b, int64_t rows, int64_t keys, int64_t D, float* scores) {
  gemm(rows, keys, D, GemmOperand<float>{a, D, 1}, GemmOperand<float>{b, 1, D}, scores, keys, false);
}

// A row of unscaled scores becomes softmax(scale * scores) over its first visible keys, 0
// past them up to keys; returns the log-sum-exp (-inf when nothing is visible).
double softmax_row(float* row, int64_t visible, int64_t keys, float scale) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < visible; ++j) max = std::max(max, row[j] * scale);
  double sum = 0;
  for (int64_t j = 0; j < visible; ++j) {
    row[j] = std::exp(row[j] * scale - max);
    sum += row[j];
  }
  const float inverse = static_cast<float>(1 / sum);
  for (int64_t j = 0; j < visible; ++j) row[j] *= inverse;
  for (int64_t j = visible; j < keys; ++j) row[j] = 0;
  return visible > 0 ? max + std::log(sum) : -std::numeric_limits<double>::infinity();
}

template <class T>
void forward_blocked(const Tensor& q_t, const Tensor& k_t, const Tensor& v_t, const kernels::AttentionShape& s,
                     bool causal, double scale, const Tensor& out_t, const Tensor& lse_t) {
  const Heads<const T> q(q_t), k(k_t), v(v_t);
  const Heads<T> out(out_t);
  double* lse = data_as<double>(lse_t);
  const int64_t group = s.heads / s.kv_heads;
  parallel_for(s.batch * s.heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(static_cast<size_t>(kBlockRows * s.D)), kf(static_cast<size_t>(s.S * s.D)),
        vf(static_cast<size_t>(s.S * s.Dv)), scores(static_cast<size_t>(kBlockRows * s.S)),
        of(static_cast<size_t>(kBlockRows * s.Dv));
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.heads, h = bh % s.heads;
      load_rows(k, b, h / group, 0, s.S, s.D, kf.data());
      load_rows(v, b, h / group, 0, s.S, s.Dv, vf.data());
      for (int64_t i0 = 0; i0 < s.L; i0 += kBlockRows) {
        const int64_t rows = std::min(kBlockRows, s.L - i0);
        const int64_t keys = visible_keys(i0 + rows - 1, s, causal);  // what the block's last row sees
        load_rows(q, b, h, i0, rows, s.D, qf.data());
        if (keys > 0) product_transposed(qf.data(), kf.data(), rows, keys, s.D, scores.data());
        for (int64_t r = 0; r < rows; ++r)
          lse[(b * s.heads + h) * s.L + i0 + r] =
              softmax_row(scores.data() + r * keys, visible_keys(i0 + r, s, causal), keys, static_cast<float>(scale));
        if (keys > 0) {
          gemm(rows, s.Dv, keys, GemmOperand<float>{scores.data(), keys, 1}, GemmOperand<float>{vf.data(), s.Dv, 1},
               of.data(), s.Dv, false);
        } else {
          std::fill(of.begin(), of.end(), 0.0f);
        }
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t d = 0; d < s.Dv; ++d) out.row(b, h, i0 + r)[d] = convert<T>(of[r * s.Dv + d]);
      }
    }
  });
}

// The backward of the same blocks: P again from the scores, dP = dO v^T, delta_i =
// sum_j P_ij dP_ij (in double), dS = scale * P * (dP - delta); grad_q = dS k for the block,
// and grad_k += dS^T q, grad_v += P^T dO summed over the blocks in order (f32), written once.
template <class T>
void backward_blocked(const Tensor& grad_out_t, const Tensor& q_t, const Tensor& k_t, const Tensor& v_t,
                      const kernels::AttentionShape& s, bool causal, double scale, const Tensor& grad_q_t,
                      const Tensor& grad_k_t, const Tensor& grad_v_t) {
  const Heads<const T> q(q_t), k(k_t), v(v_t), grad_out(grad_out_t);
  const Heads<T> grad_q(grad_q_t), grad_k(grad_k_t), grad_v(grad_v_t);
  const int64_t group = s.heads / s.kv_heads;
  const float scale_f = static_cast<float>(scale);
  parallel_for(s.batch * s.heads, 1, [&](int64_t begin, int64_t end) {
    const auto buffer = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n)); };
    std::vector<float> qf = buffer(kBlockRows * s.D), dof = buffer(kBlockRows * s.Dv), kf = buffer(s.S * s.D),
                       vf = buffer(s.S * s.Dv), p = buffer(kBlockRows * s.S), dp = buffer(kBlockRows * s.S),
                       gq = buffer(kBlockRows * s.D), gk = buffer(s.S * s.D), gv = buffer(s.S * s.Dv);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.heads, h = bh % s.heads;
      load_rows(k, b, h / group, 0, s.S, s.D, kf.data());
      load_rows(v, b, h / group, 0, s.S, s.Dv, vf.data());
      std::fill(gk.begin(), gk.end(), 0.0f);
      std::fill(gv.begin(), gv.end(), 0.0f);
      for (int64_t i0 = 0; i0 < s.L; i0 += kBlockRows) {
        const int64_t rows = std::min(kBlockRows, s.L - i0);
        const int64_t keys = visible_keys(i0 + rows - 1, s, causal);
        load_rows(q, b, h, i0, rows, s.D, qf.data());
        load_rows(grad_out, b, h, i0, rows, s.Dv, dof.data());
        if (keys == 0) {
          std::fill(gq.begin(), gq.end(), 0.0f);
        } else {
          product_transposed(qf.data(), kf.data(), rows, keys, s.D, p.data());
          product_transposed(dof.data(), vf.data(), rows, keys, s.Dv, dp.data());
          for (int64_t r = 0; r < rows; ++r) {
            float* pr = p.data() + r * keys;
            float* dpr = dp.data() + r * keys;
            softmax_row(pr, visible_keys(i0 + r, s, causal), keys, scale_f);
            double delta = 0;
            for (int64_t j = 0; j < keys; ++j) delta += static_cast<double>(pr[j]) * dpr[j];
            const float delta_f = static_cast<float>(delta);
            for (int64_t j = 0; j < keys; ++j) dpr[j] = scale_f * pr[j] * (dpr[j] - delta_f);  // dS
          }
          // grad_q = dS k; grad_k += dS^T q; grad_v += P^T dO.
          gemm(rows, s.D, keys, GemmOperand<float>{dp.data(), keys, 1}, GemmOperand<float>{kf.data(), s.D, 1},
               gq.data(), s.D, false);
          gemm(keys, s.D, rows, GemmOperand<float>{dp.data(), 1, keys}, GemmOperand<float>{qf.data(), s.D, 1},
               gk.data(), s.D, true);
          gemm(keys, s.Dv, rows, GemmOperand<float>{p.data(), 1, keys}, GemmOperand<float>{dof.data(), s.Dv, 1},
               gv.data(), s.Dv, true);
        }
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t d = 0; d < s.D; ++d) grad_q.row(b, h, i0 + r)[d] = convert<T>(gq[r * s.D + d]);
      }
      for (int64_t j = 0; j < s.S; ++j) {
        for (int64_t d = 0; d < s.D; ++d) grad_k.row(b, h, j)[d] = convert<T>(gk[j * s.D + d]);
        for (int64_t d = 0; d < s.Dv; ++d) grad_v.row(b, h, j)[d] = convert<T>(gv[j * s.Dv + d]);
      }
    }
  });
}

template <class T>
void backward(const Tensor& grad_out_t, const Tensor& q_t, const Tensor& k_t, const Tensor& v_t,
              const kernels::AttentionShape& s, bool causal, double scale, const Tensor& grad_q_t,
              const Tensor& grad_k_t, const Tensor& grad_v_t) {
  const Heads<const T> q(q_t), k(k_t), v(v_t), grad_out(grad_out_t);
  const Heads<T> grad_q(grad_q_t), grad_k(grad_k_t), grad_v(grad_v_t);
  const int64_t group = s.heads / s.kv_heads;  // q heads per k, v head
  // Accumulated in double per (batch, q head), written once at the end.
  std::vector<double> gq(static_cast<size_t>(s.L * s.D)), gk(static_cast<size_t>(s.S * s.D)),
      gv(static_cast<size_t>(s.S * s.Dv));
  std::vector<double> probs(static_cast<size_t>(s.S)), dp(static_cast<size_t>(s.S));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      std::fill(gq.begin(), gq.end(), 0.0);
      std::fill(gk.begin(), gk.end(), 0.0);
      std::fill(gv.begin(), gv.end(), 0.0);
      for (int64_t i = 0; i < s.L; ++i) {
        const int64_t keys = visible_keys(i, s, causal);
        const T* qi = q.row(b, h, i);
        const T* doi = grad_out.row(b, h, i);
        row_probabilities(qi, k, b, h / group, keys, s, scale, probs);
        double delta = 0;
        for (int64_t j = 0; j < keys; ++j) {
          dp[j] = dot(doi, v.row(b, h / group, j), s.Dv);
          delta += probs[j] * dp[j];
        }
        for (int64_t j = 0; j < keys; ++j) {
          const T* kj = k.row(b, h / group, j);
          const double ds = probs[j] * (dp[j] - delta);
          for (int64_t d = 0; d < s.Dv; ++d) gv[j * s.Dv + d] += probs[j] * convert<double>(doi[d]);
          for (int64_t d = 0; d < s.D; ++d) {
            gq[i * s.D + d] += scale * ds * convert<double>(kj[d]);
            gk[j * s.D + d] += scale * ds * convert<double>(qi[d]);
          }
        }
      }
      for (int64_t i = 0; i < s.L; ++i)
        for (int64_t d = 0; d < s.D; ++d) grad_q.row(b, h, i)[d] = convert<T>(gq[i * s.D + d]);
      for (int64_t j = 0; j < s.S; ++j) {
        for (int64_t d = 0; d < s.D; ++d) grad_k.row(b, h, j)[d] = convert<T>(gk[j * s.D + d]);
        for (int64_t d = 0; d < s.Dv; ++d) grad_v.row(b, h, j)[d] = convert<T>(gv[j * s.Dv + d]);
      }
    }
  }
}

// cached_attention: every position checked first (nothing is written for a bad one), then
// each row's k and v stored at its position and the query attending to cache positions 0..p
// as forward() does.
template <class T>
void cached(const Tensor& q_t, const Tensor& k_t, const Tensor& v_t, const Tensor& k_cache_t, const Tensor& v_cache_t,
            const Tensor& positions_t, const kernels::AttentionShape& s, double scale, const Tensor& out_t) {
  const int64_t* positions = data_as<const int64_t>(positions_t);
  for (int64_t b = 0; b < s.batch; ++b)
    NC_CHECK(positions[b] >= 0 && positions[b] < s.S, IndexError, "cached_attention: position ", positions[b],
             " of batch row ", b, " is out of range for a KV cache of ", s.S, " positions");
  const Heads<const T> q(q_t), k(k_t), v(v_t);
  const Heads<T> k_cache(k_cache_t), v_cache(v_cache_t), out(out_t);
  const Heads<const T> keys(k_cache_t), values(v_cache_t);
  const int64_t group = s.heads / s.kv_heads;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.kv_heads; ++h) {
      std::copy(k.row(b, h, 0), k.row(b, h, 0) + s.D, k_cache.row(b, h, positions[b]));
      std::copy(v.row(b, h, 0), v.row(b, h, 0) + s.Dv, v_cache.row(b, h, positions[b]));
    }
  }
  std::vector<double> probs(static_cast<size_t>(s.S)), acc(static_cast<size_t>(s.Dv));
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t visible = positions[b] + 1;
    for (int64_t h = 0; h < s.heads; ++h) {
      row_probabilities(q.row(b, h, 0), keys, b, h / group, visible, s, scale, probs);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < visible; ++j) {
        const T* vj = values.row(b, h / group, j);
        for (int64_t d = 0; d < s.Dv; ++d) acc[d] += probs[j] * convert<double>(vj[d]);
      }
      for (int64_t d = 0; d < s.Dv; ++d) out.row(b, h, 0)[d] = convert<T>(acc[d]);
    }
  }
}

class CpuAttention final : public kernels::AttentionKernels {
 public:
  int64_t max_head_dim() const override { return std::numeric_limits<int64_t>::max(); }

  void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const kernels::AttentionShape& shape,
                         bool causal, double scale, const Tensor& out, const Tensor& lse) const override {
    visit_float(q.dtype(), "scaled_dot_product_attention", [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_same_v<T, double>) forward<T>(q, k, v, shape, causal, scale, out, lse);
      else forward_blocked<T>(q, k, v, shape, causal, scale, out, lse);
    });
  }

  // out and lse are not read: the rows are recomputed (see the top of the file).
  void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor&,
                          const Tensor&, const kernels::AttentionShape& shape, bool causal, double scale,
                          const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v) const override {
    visit_float(q.dtype(), "scaled_dot_product_attention backward", [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_same_v<T, double>)
        backward<T>(grad_out, q, k, v, shape, causal, scale, grad_q, grad_k, grad_v);
      else backward_blocked<T>(grad_out, q, k, v, shape, causal, scale, grad_q, grad_k, grad_v);
    });
  }

  void cached_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& positions, const kernels::AttentionShape& shape, double scale,
                        const Tensor& out) const override {
    visit_float(q.dtype(), "cached_attention", [&](auto tag) {
      cached<typename decltype(tag)::type>(q, k, v, k_cache, v_cache, positions, shape, scale, out);
    });
  }
};

}  // namespace

const kernels::AttentionKernels& attention_kernels() {
  static const CpuAttention kernels;
  return kernels;
}

}  // namespace cpu
}  // namespace normcore
