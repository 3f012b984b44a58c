// scaled_dot_product_attention and packed_self_attention (normcore/attention.h): check the
// arguments, run the attention kernels of the device (kernels/attention.h) on q, k and v as
// they are (any strides but the last dim's) and record one node whose backward is the
// backward kernel, fed the output and the log-sum-exp the forward saved. The packed op hands
// the kernels views: of qkv for q, k, v, of its [B, L, H, D] output, and of one
// [B, L, 3, H, D] gradient for grad_q, grad_k, grad_v. Also the choice of the CUDA engine
// (cuda::set_attention_engine and the rules of kernels::cudnn_attention_refusal).
#include "normcore/attention.h"

#include <atomic>
#include <cmath>

#include "autograd/graph.h"
#include "core/internal.h"
#include "kernels/attention.h"
#include "normcore/autocast.h"
#include "normcore/cuda.h"
#include "normcore/ops.h"

namespace normcore {

using namespace detail;

namespace {

std::atomic<cuda::AttentionEngine> g_attention_engine{cuda::AttentionEngine::Auto};

// Auto's switch to cuDNN: B * H * L * S scores from here on.
constexpr int64_t kAutoCudnnScores = int64_t{1} << 21;

// cuda::last_attention_engine, per pass.
thread_local cuda::AttentionEngine t_attention_engine[2] = {cuda::AttentionEngine::Native,
                                                            cuda::AttentionEngine::Native};

thread_local const char* t_native_kernels[2] = {nullptr, nullptr};
std::atomic<kernels::HopperAttention> g_hopper_attention{kernels::HopperAttention::Pipelined};
std::atomic<bool> g_deterministic{false};

void check_operand(const char* op, const char* name, const Tensor& t, const Tensor& q) {
  check_defined(op, name, t);
  NC_CHECK(t.dim() == 4, ShapeError, op, ": ", name, " must be 4-D [B, H, ", name[0] == 'q' ? "L" : "S", ", ",
           name[0] == 'v' ? "Dv" : "D", "], got ", describe(t));
  NC_CHECK(is_floating(t.dtype()), DTypeError, op, ": ", name, " must be a floating tensor, got ", describe(t));
  if (&t == &q) return;
  NC_CHECK(t.dtype() == q.dtype(), DTypeError, op, ": ", name, " is ", describe(t), " but q is ", describe(q),
           " (they must share a dtype)");
  check_same_device(op, "q", q, name, t);
  NC_CHECK(t.size(0) == q.size(0), ShapeError, op, ": ", name, " must have q's batch dim ", q.size(0), ", got ",
           describe(t), " (q is ", describe(q), ")");
}

// k's and v's head count against q's: the same, or with enable_gqa a divisor of it.
void check_heads(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, bool enable_gqa) {
  NC_CHECK(v.size(1) == k.size(1), ShapeError, op, ": k and v must have the same head count, got k ", describe(k),
           " and v ", describe(v));
  if (enable_gqa) {
    NC_CHECK(k.size(1) >= 1 && q.size(1) % k.size(1) == 0, ShapeError, op,
             ": with enable_gqa, q's head count must be a multiple of k's and v's, got q ", describe(q), " and k ",
             describe(k));
  } else {
    NC_CHECK(k.size(1) == q.size(1), ShapeError, op, ": k and v must have q's head count ", q.size(1), ", got k ",
             describe(k), " (q is ", describe(q),
             "); for fewer k and v heads (grouped-query attention) pass "
             "enable_gqa = true");
  }
}

// t itself when its last dim is contiguous (or of size 1), else a copy that is.
Tensor unit_last_stride(const Tensor& t) {
  if (t.size(-1) <= 1 || t.stride(-1) == 1) return t;
  return t.contiguous();
}

// Head dims within what the backend runs, and a finite scale (1 / sqrt(D) by default).
// q_name and v_name say which arguments hold q and v.
double checked_scale(const char* op, const kernels::AttentionShape& shape, const char* q_name, const Tensor& q,
                     const char* v_name, const Tensor& v, std::optional<double> scale) {
  NC_CHECK(shape.D >= 1, ShapeError, op, ": the head dim D must be at least 1, got ", q_name, " ", describe(q));
  const int64_t max_dim = kernels::attention(q.device()).max_head_dim();
  NC_CHECK(shape.D <= max_dim && shape.Dv <= max_dim, ShapeError, op, ": head dims up to ", max_dim, " run on ",
           q.device(), ", got D = ", shape.D, " (", q_name, " ", describe(q), ") and Dv = ", shape.Dv, " (", v_name,
           " ", describe(v), ")");
  const double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(shape.D));
  NC_CHECK(std::isfinite(s), ValueError, op, ": scale must be finite, got ", s);
  return s;
}

// Part i (q, k, v) of a packed [B, L, 3, H, D] tensor as [B, H, L, D].
Tensor packed_part(const Tensor& qkv, int64_t i) { return qkv.select(2, i).permute({0, 2, 1, 3}); }

}  // namespace

void cuda::set_deterministic(bool deterministic) { g_deterministic.store(deterministic); }

bool cuda::deterministic() { return g_deterministic.load(); }

void cuda::set_attention_engine(AttentionEngine engine) { g_attention_engine.store(engine); }

cuda::AttentionEngine cuda::attention_engine() { return g_attention_engine.load(); }

cuda::AttentionEngine cuda::last_attention_engine(AttentionPass pass) {
  return t_attention_engine[pass == AttentionPass::Backward ? 1 : 0];
}

const char* cuda::attention_engine_name(AttentionEngine engine) {
  switch (engine) {
    case AttentionEngine::Auto: return "auto";
    case AttentionEngine::Native: return "native";
    case AttentionEngine::Cudnn: return "cudnn";
  }
  return "?";
}

void kernels::record_attention_engine(cuda::AttentionPass pass, cuda::AttentionEngine engine) {
  t_attention_engine[pass == cuda::AttentionPass::Backward ? 1 : 0] = engine;
}

void kernels::record_native_attention_kernels(cuda::AttentionPass pass, const char* kernels) {
  t_native_kernels[pass == cuda::AttentionPass::Backward ? 1 : 0] = kernels;
}

const char* kernels::last_native_attention_kernels(cuda::AttentionPass pass) {
  return t_native_kernels[pass == cuda::AttentionPass::Backward ? 1 : 0];
}

void kernels::set_hopper_attention(HopperAttention mode) { g_hopper_attention.store(mode); }
kernels::HopperAttention kernels::hopper_attention() { return g_hopper_attention.load(); }

const char* kernels::cudnn_attention_refusal(const AttentionEngineQuery& q) {
  using cuda::AttentionEngine;
  const AttentionShape& s = q.shape;
  if (q.requested == AttentionEngine::Native) return "the native engine is selected";
  if (q.cudnn_version == 0) return "normcore was built without cuDNN";
  // 9.10.0 and 9.10.1 have known faults in their f16/bf16 attention.
  if (q.cudnn_version >= 91000 && q.cudnn_version < 91002)
    return "cuDNN 9.10.0 and 9.10.1's fused attention is not used";
  if (q.compute_capability < 80) return "cuDNN's fused attention needs Ampere or later";
  if (q.dtype != DType::F16 && q.dtype != DType::BF16) return "cuDNN's fused attention takes f16 and bf16";
  if (s.kv_heads != s.heads) return "grouped-query attention runs on the native kernels";
  if (s.D % 8 != 0 || s.Dv % 8 != 0 || s.D > 256 || s.Dv > 256)
    return "cuDNN's fused attention takes head dims that are multiples of 8 up to 256";
  if (s.batch == 0 || s.heads == 0 || s.L == 0 || s.S == 0) return "nothing to compute";
  if (!q.aligned) return "a data pointer is not 16-byte aligned";
  for (const auto& strides : q.strides) {
    for (int64_t stride : strides) {
      // Rows are read 16 bytes at a time (2-byte elements).
      if (stride <= 0 || stride % 8 != 0) return "a stride of q, k or v is not a positive multiple of 16 bytes";
    }
  }
  if (q.pass == cuda::AttentionPass::Backward) {
    // cuDNN documents the dP-workspace backward as deterministic on Hopper; elsewhere it
    // needs other engine settings, and normcore's backward is deterministic everywhere.
    if (q.compute_capability / 10 != 9) return "cuDNN's deterministic backward is used on Hopper alone";
    if (s.L == 1 && s.S == 1) return "cuDNN's backward does not take L = S = 1";
    // Earlier versions need a padding mask for such lengths (cuDNN's frontend adds one).
    if (q.cudnn_version < 91600 && s.S % 128 != 0) return "before cuDNN 9.16 the backward needs S a multiple of 128";
  }
  // Auto, backward at head dims 64: the Hopper kernels' fast form (grad_q summed with
  // atomics) was faster than cuDNN's deterministic backward in every such case of
  // bench/attention (docs/PERFORMANCE.md); under set_deterministic(true) cuDNN's is the faster.
  if (q.requested == AttentionEngine::Auto && q.pass == cuda::AttentionPass::Backward && q.hopper_backward &&
      !q.deterministic && s.D == 64 && s.Dv == 64)
    return "Auto: the Hopper kernels' backward is faster at head dim 64";
  // Auto: below about 2^21 scores (B * H * L * S) a call is a few microseconds either way
  // and cuDNN's host work per run (a variant pack, the plan lookup) makes it the slower
  // engine; above, it was the faster one in every case bench/attention times
  // (docs/PERFORMANCE.md).
  if (q.requested == AttentionEngine::Auto && s.batch * s.heads * s.L * s.S < kAutoCudnnScores)
    return "Auto: the native kernels are faster on so few scores";
  return nullptr;
}

Tensor scaled_dot_product_attention(const Tensor& q_arg, const Tensor& k_arg, const Tensor& v_arg, bool is_causal,
                                    std::optional<double> scale, bool enable_gqa) {
  const OpScope op("scaled_dot_product_attention");
  const Tensor q = autocast::to_lower(q_arg), k = autocast::to_lower(k_arg), v = autocast::to_lower(v_arg);
  check_operand(op, "q", q, q);
  check_operand(op, "k", k, q);
  check_operand(op, "v", v, q);
  check_heads(op, q, k, v, enable_gqa);
  kernels::AttentionShape shape{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
  shape.kv_heads = k.size(1);
  NC_CHECK(k.size(3) == shape.D, ShapeError, op, ": q and k must share the head dim D, got q ", describe(q), " and k ",
           describe(k));
  NC_CHECK(v.size(2) == shape.S, ShapeError, op, ": k and v must share the key count S, got k ", describe(k), " and v ",
           describe(v));
  const kernels::AttentionKernels& kernels = kernels::attention(q.device());
  const double s = checked_scale(op, shape, "q", q, "v", v, scale);

  Tensor qs, ks, vs;
  {
    autograd::NoGradGuard no_grad;  // the copies are private to this op; its node covers them
    qs = unit_last_stride(q);
    ks = unit_last_stride(k);
    vs = unit_last_stride(v);
  }
  Tensor out = new_tensor({shape.batch, shape.heads, shape.L, shape.Dv}, q.dtype(), q.device());
  Tensor lse = new_tensor({shape.batch, shape.heads, shape.L}, kernels::stats_dtype(q.device(), q.dtype()), q.device());
  kernels.attention_forward(qs, ks, vs, shape, is_causal, s, out, lse);
  if (!autograd::needs_grad(q, k, v)) return out;
  autograd::record(op, out, {q, k, v},
                   [qs = autograd::saved(qs), ks = autograd::saved(ks), vs = autograd::saved(vs),
                    os = autograd::saved(out), lse, shape, is_causal, s](const Tensor& grad) {
                     const Tensor& q = qs.get();
                     const Tensor& k = ks.get();
                     const Tensor& v = vs.get();
                     // grad_k and grad_v per q head, summed over each group of q heads
                     // that share a k, v head (as FlashAttention does).
                     const int64_t group = shape.heads / shape.kv_heads;
                     Tensor grad_q = new_tensor(q.shape(), q.dtype(), q.device());
                     Tensor grad_k = new_tensor({shape.batch, shape.heads, shape.S, shape.D}, k.dtype(), k.device());
                     Tensor grad_v = new_tensor({shape.batch, shape.heads, shape.S, shape.Dv}, v.dtype(), v.device());
                     kernels::attention(q.device())
                         .attention_backward(grad.to(q.dtype()).contiguous(), q, k, v, os.get(), lse, shape, is_causal,
                                             s, grad_q, grad_k, grad_v);
                     if (group > 1) {
                       grad_k = sum(grad_k.view({shape.batch, shape.kv_heads, group, shape.S, shape.D}), {2});
                       grad_v = sum(grad_v.view({shape.batch, shape.kv_heads, group, shape.S, shape.Dv}), {2});
                     }
                     return std::vector<Tensor>{grad_q, grad_k, grad_v};
                   });
  return out;
}

Tensor packed_self_attention(const Tensor& qkv_arg, bool is_causal, std::optional<double> scale) {
  const OpScope op("packed_self_attention");
  check_defined(op, "qkv", qkv_arg);
  const Tensor qkv_in = autocast::to_lower(qkv_arg);
  NC_CHECK(qkv_in.dim() == 5 && qkv_in.size(2) == 3, ShapeError, op, ": qkv must be [B, L, 3, H, D], got ",
           describe(qkv_in));
  NC_CHECK(is_floating(qkv_in.dtype()), DTypeError, op, ": qkv must be a floating tensor, got ", describe(qkv_in));
  const int64_t batch = qkv_in.size(0), len = qkv_in.size(1), heads = qkv_in.size(3), dim = qkv_in.size(4);
  const kernels::AttentionShape shape{batch, heads, len, len, dim, dim};
  const double s = checked_scale(op, shape, "qkv", qkv_in, "qkv", qkv_in, scale);
  const Device device = qkv_in.device();
  Tensor qkv, out, lse;
  {
    autograd::NoGradGuard no_grad;  // the views and the copy are private to this op
    qkv = unit_last_stride(qkv_in);
    out = new_tensor({batch, len, heads, dim}, qkv.dtype(), device);
    lse = new_tensor({batch, heads, len}, kernels::stats_dtype(device, qkv.dtype()), device);
    kernels::attention(device).attention_forward(packed_part(qkv, 0), packed_part(qkv, 1), packed_part(qkv, 2), shape,
                                                 is_causal, s, out.permute({0, 2, 1, 3}), lse);
  }
  if (!autograd::needs_grad(qkv_in)) return out;
  autograd::record(
      op, out, {qkv_in},
      [qs = autograd::saved(qkv), os = autograd::saved(out), lse, shape, is_causal, s](const Tensor& grad) {
        const Tensor& qkv = qs.get();
        const Tensor g = unit_last_stride(grad.to(qkv.dtype()));
        Tensor grad_qkv = new_tensor(qkv.shape(), qkv.dtype(), qkv.device());
        kernels::attention(qkv.device())
            .attention_backward(g.permute({0, 2, 1, 3}), packed_part(qkv, 0), packed_part(qkv, 1), packed_part(qkv, 2),
                                os.get().permute({0, 2, 1, 3}), lse, shape, is_causal, s, packed_part(grad_qkv, 0),
                                packed_part(grad_qkv, 1), packed_part(grad_qkv, 2));
        return std::vector<Tensor>{grad_qkv};
      });
  return out;
}

Tensor cached_attention(const Tensor& q_arg, const Tensor& k_arg, const Tensor& v_arg, const Tensor& k_cache,
                        const Tensor& v_cache, const Tensor& positions, std::optional<double> scale) {
  const OpScope op("cached_attention");
  const Tensor q = autocast::to_lower(q_arg), k = autocast::to_lower(k_arg), v = autocast::to_lower(v_arg);
  check_operand(op, "q", q, q);
  check_operand(op, "k", k, q);
  check_operand(op, "v", v, q);
  check_operand(op, "k_cache", k_cache, q);
  check_operand(op, "v_cache", v_cache, q);
  check_heads(op, q, k, v, /*enable_gqa=*/true);
  NC_CHECK(q.size(2) == 1 && k.size(2) == 1 && v.size(2) == 1, ShapeError, op,
           ": q, k and v hold one position each ([B, H, 1, D]), got q ", describe(q), ", k ", describe(k), " and v ",
           describe(v));
  kernels::AttentionShape shape{q.size(0), q.size(1), 1, k_cache.size(2), q.size(3), v.size(3)};
  shape.kv_heads = k.size(1);
  const Shape k_expected{shape.batch, shape.kv_heads, shape.S, shape.D};
  const Shape v_expected{shape.batch, shape.kv_heads, shape.S, shape.Dv};
  NC_CHECK(k.size(3) == shape.D && k_cache.shape() == k_expected && v_cache.shape() == v_expected, ShapeError, op,
           ": the caches must be k_cache ", shape_str(k_expected), " and v_cache ", shape_str(v_expected), " for q ",
           describe(q), ", k ", describe(k), " and v ", describe(v), ", got k_cache ", describe(k_cache),
           " and v_cache ", describe(v_cache));
  NC_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), ValueError, op,
           ": the caches are written in place and must be contiguous, got k_cache ", describe(k_cache), " and v_cache ",
           describe(v_cache));
  check_defined(op, "positions", positions);
  NC_CHECK(positions.dtype() == DType::I64 && positions.dim() == 1 && positions.size(0) == shape.batch, ShapeError, op,
           ": positions must be i64 [", shape.batch, "] (one per batch row), got ", describe(positions));
  check_same_device(op, "q", q, "positions", positions);
  NC_CHECK(!autograd::needs_grad(q, k, v), ValueError, op,
           ": decoding has no gradient; run it with gradients off (autograd::NoGradGuard), got q ", describe(q));
  NC_CHECK(shape.S >= 1, ShapeError, op, ": the caches hold no position, got k_cache ", describe(k_cache));
  const double s = checked_scale(op, shape, "q", q, "v", v, scale);
  const Tensor qs = unit_last_stride(q), ks = unit_last_stride(k), vs = unit_last_stride(v);
  Tensor out = new_tensor({shape.batch, shape.heads, 1, shape.Dv}, q.dtype(), q.device());
  k_cache.bump_version();
  v_cache.bump_version();
  kernels::attention(q.device()).cached_attention(qs, ks, vs, k_cache, v_cache, positions.contiguous(), shape, s, out);
  return out;
}

}  // namespace normcore
