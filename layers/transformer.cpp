// The decoder-only transformer's layers: causal self-attention (with a KV cache for
// decoding), the GELU MLP and the pre-norm block. They compose Linear, the norms, attention
// and dropout; q, k and v are views of one fused projection, so the attention reads them in
// place (packed_self_attention in training: its backward writes the projection's gradient
// as one tensor, its output is already in the order the output projection reads).
#include <cmath>

#include "normcore/attention.h"
#include "normcore/autograd.h"
#include "normcore/nn.h"
#include "normcore/norms.h"
#include "normcore/ops.h"

namespace normcore {
namespace nn {

namespace {

int64_t checked_head_dim(int64_t embed_dim, int64_t heads) {
  NC_CHECK(embed_dim > 0 && heads > 0, ValueError, "CausalSelfAttention: embed_dim and heads must be positive, got ",
           embed_dim, " and ", heads);
  NC_CHECK(embed_dim % heads == 0, ValueError, "CausalSelfAttention: embed_dim ", embed_dim,
           " is not divisible by heads ", heads);
  return embed_dim / heads;
}

double checked_dropout(const char* layer, double p) {
  NC_CHECK(p >= 0 && p <= 1, ValueError, layer, ": dropout must be in [0, 1], got ", p);
  return p;
}

void check_sequence(const char* layer, const Tensor& x, int64_t embed_dim) {
  NC_CHECK(x.defined(), ValueError, layer, ": input is an undefined tensor");
  NC_CHECK(x.dim() == 3 && x.size(2) == embed_dim, ShapeError, layer, ": input must be [B, T, ", embed_dim, "], got ",
           describe(x));
}

std::shared_ptr<Module> make_norm(const std::string& norm, int64_t embed_dim, bool bias) {
  if (norm == "layernorm") return std::make_shared<LayerNorm>(std::vector<int64_t>{embed_dim}, 1e-5, true, bias);
  if (norm == "rmsnorm") return std::make_shared<RMSNorm>(std::vector<int64_t>{embed_dim}, 1e-6);
  throw ValueError("TransformerBlock: norm must be 'layernorm' or 'rmsnorm', got '" + norm + "'");
}

}  // namespace

// ---------------------------------------------------------------- attention
CausalSelfAttention::CausalSelfAttention(int64_t embed_dim, int64_t heads, bool bias, double dropout, Generator* gen)
    : embed_dim(embed_dim), heads(heads), head_dim(checked_head_dim(embed_dim, heads)),
      dropout(checked_dropout("CausalSelfAttention", dropout)), gen_(gen) {
  qkv = register_module("qkv", std::make_shared<Linear>(embed_dim, 3 * embed_dim, bias, gen));
  proj = register_module("proj", std::make_shared<Linear>(embed_dim, embed_dim, bias, gen));
}

std::vector<Tensor> CausalSelfAttention::project(const Tensor& x) {
  const int64_t batch = x.size(0), tokens = x.size(1);
  // [B, T, 3C] seen as [B, T, 3, H, D]; each of q, k, v is one slice of dim 2, put in
  // attention's [B, H, T, D] order by a permute: views, not copies.
  const Tensor fused = (*qkv)(x).view({batch, tokens, 3, heads, head_dim});
  std::vector<Tensor> out;
  for (int64_t i = 0; i < 3; ++i) out.push_back(fused.select(2, i).permute({0, 2, 1, 3}));
  return out;
}

Tensor CausalSelfAttention::output(const Tensor& y) {
  const Tensor merged = y.permute({0, 2, 1, 3}).reshape({y.size(0), y.size(2), embed_dim});
  return normcore::dropout((*proj)(merged), dropout, is_training(), gen_);
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  check_sequence("CausalSelfAttention", x, embed_dim);
  const int64_t batch = x.size(0), tokens = x.size(1);
  // The fused projection read in place as [B, T, 3, H, D]; the output comes as [B, T, H, D],
  // already the projection's [B, T, C].
  const Tensor y = packed_self_attention((*qkv)(x).view({batch, tokens, 3, heads, head_dim}), /*is_causal=*/true);
  return normcore::dropout((*proj)(y.view({batch, tokens, embed_dim})), dropout, is_training(), gen_);
}

KVCache CausalSelfAttention::make_cache(int64_t batch, int64_t max_len) const {
  NC_CHECK(batch > 0 && max_len > 0, ValueError,
           "CausalSelfAttention::make_cache: batch and max_len must be "
           "positive, got ",
           batch, " and ", max_len);
  const TensorOptions options(qkv->weight.dtype(), qkv->weight.device());
  KVCache cache;
  cache.k = zeros({batch, heads, max_len, head_dim}, options);
  cache.v = zeros({batch, heads, max_len, head_dim}, options);
  return cache;
}

Tensor CausalSelfAttention::forward(const Tensor& x, KVCache& cache) {
  const char* op = "CausalSelfAttention";
  check_sequence(op, x, embed_dim);
  NC_CHECK(!is_training(), Error, op, ": decoding with a KV cache runs in eval mode (call eval() first)");
  NC_CHECK(cache.k.defined() && cache.v.defined(), ValueError, op,
           ": the KV cache has no tensors (make it with make_cache)");
  const int64_t batch = x.size(0), tokens = x.size(1), position = cache.length;
  const Shape expected{batch, heads, cache.max_len(), head_dim};
  NC_CHECK(cache.k.shape() == expected && cache.v.shape() == expected, ShapeError, op, ": the KV cache must be ",
           shape_str(expected), " for input ", describe(x), ", got k ", describe(cache.k), " and v ",
           describe(cache.v));
  NC_CHECK(position == 0 || tokens == 1, ValueError, op, ": a KV cache holding ", position,
           " positions takes one token per step, got ", tokens, " (input ", describe(x), ")");
  NC_CHECK(position + tokens <= cache.max_len(), ValueError, op, ": the KV cache holds ", cache.max_len(),
           " positions; ", position, " are filled and ", tokens, " more do not fit");
  autograd::NoGradGuard no_grad;
  const std::vector<Tensor> qkv_views = project(x);
  cache.k.narrow(2, position, tokens).copy_(qkv_views[1]);
  cache.v.narrow(2, position, tokens).copy_(qkv_views[2]);
  const Tensor keys = cache.k.narrow(2, 0, position + tokens);
  const Tensor values = cache.v.narrow(2, 0, position + tokens);
  // The prefill is an ordinary causal pass. Afterwards the single query is the newest
  // position and sees every cached key; the top-left causal mask would hide all but the
  // first from it, so the step runs unmasked.
  const Tensor y = scaled_dot_product_attention(qkv_views[0], keys, values, /*is_causal=*/position == 0);
  cache.length = position + tokens;
  return output(y);
}

Tensor CausalSelfAttention::forward(const Tensor& x, KVCache& cache, const Tensor& positions) {
  const char* op = "CausalSelfAttention";
  check_sequence(op, x, embed_dim);
  NC_CHECK(!is_training(), Error, op, ": decoding with a KV cache runs in eval mode (call eval() first)");
  NC_CHECK(x.size(1) == 1, ShapeError, op, ": a decoding step at device positions takes one token, got ", describe(x));
  autograd::NoGradGuard no_grad;
  const std::vector<Tensor> qkv_views = project(x);
  return output(cached_attention(qkv_views[0], qkv_views[1], qkv_views[2], cache.k, cache.v, positions));
}

// ---------------------------------------------------------------- MLP
MLP::MLP(int64_t embed_dim, bool bias, double dropout, Generator* gen)
    : dropout(checked_dropout("MLP", dropout)), gen_(gen) {
  fc = register_module("fc", std::make_shared<Linear>(embed_dim, 4 * embed_dim, bias, gen));
  proj = register_module("proj", std::make_shared<Linear>(4 * embed_dim, embed_dim, bias, gen));
}

Tensor MLP::forward(const Tensor& x) {
  const bool one_op = recompute_gelu && fc->bias.defined() && proj->bias.defined() && !fc->has_forward_hooks() &&
                      !proj->has_forward_hooks();
  const Tensor y = one_op
                       ? normcore::gelu_mlp(x, fc->weight, fc->bias, proj->weight, proj->bias, /*recompute_gelu=*/true)
                       : (*proj)(gelu((*fc)(x), /*approximate=*/true));
  return normcore::dropout(y, dropout, is_training(), gen_);
}

// ---------------------------------------------------------------- block
TransformerBlock::TransformerBlock(int64_t embed_dim, int64_t heads, const std::string& norm, bool bias, double dropout,
                                   Generator* gen) {
  norm1 = register_module("norm1", make_norm(norm, embed_dim, bias));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(embed_dim, heads, bias, dropout, gen));
  norm2 = register_module("norm2", make_norm(norm, embed_dim, bias));
  mlp = register_module("mlp", std::make_shared<MLP>(embed_dim, bias, dropout, gen));
}

namespace {

// m as a LayerNorm that add_layer_norm can stand in for: over the last dim, with a weight,
// no forward hook to run; else null.
const LayerNorm* fusable_layer_norm(const Module* m) {
  const auto* norm = dynamic_cast<const LayerNorm*>(m);
  return norm && norm->normalized_shape.size() == 1 && norm->weight.defined() && !norm->has_forward_hooks() ? norm
                                                                                                            : nullptr;
}

}  // namespace

bool TransformerBlock::can_fuse_norms() const {
  return !has_forward_hooks() && fusable_layer_norm(norm1.get()) && fusable_layer_norm(norm2.get());
}

Tensor TransformerBlock::forward(const Tensor& x) {
  const Tensor a = (*attn)((*norm1)(x));
  if (const LayerNorm* n2 = fusable_layer_norm(norm2.get())) {
    const auto [h, normed] = add_layer_norm(x, a, n2->weight, n2->bias, n2->eps);
    return add(h, (*mlp)(normed));
  }
  const Tensor h = add(x, a);
  return add(h, (*mlp)((*norm2)(h)));
}

std::pair<Tensor, Tensor> TransformerBlock::forward_normed(const Tensor& x, const Tensor& normed,
                                                           const LayerNorm& next) {
  NC_CHECK(can_fuse_norms(), ValueError,
           "TransformerBlock::forward_normed: the block's norms are not LayerNorms "
           "over the last dim with weights, or a forward hook is registered (check can_fuse_norms())");
  const auto& n2 = static_cast<const LayerNorm&>(*norm2);
  const auto [h, normed2] = add_layer_norm(x, (*attn)(normed), n2.weight, n2.bias, n2.eps);
  return add_layer_norm(h, (*mlp)(normed2), next.weight, next.bias, next.eps);
}

Tensor TransformerBlock::forward(const Tensor& x, KVCache& cache) {
  const Tensor h = add(x, attn->forward((*norm1)(x), cache));
  return add(h, (*mlp)((*norm2)(h)));
}

Tensor TransformerBlock::forward(const Tensor& x, KVCache& cache, const Tensor& positions) {
  const Tensor h = add(x, attn->forward((*norm1)(x), cache, positions));
  return add(h, (*mlp)((*norm2)(h)));
}

}  // namespace nn
}  // namespace normcore
