// The GPT language model (normcore/gpt.h): the module, its loss and its checkpoints
// (generation with the KV cache: generate.cpp).
#include "normcore/gpt.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <tuple>
#include <type_traits>

#include "models/checkpoint_text.h"
#include "normcore/autograd.h"
#include "normcore/losses.h"
#include "normcore/ops.h"
#include "normcore/safetensors.h"
#include "normcore/train.h"

namespace normcore {
namespace models {

namespace {

// What is wrong with c, naming its fields with prefix ("config." in a checkpoint); empty
// when nothing is.
std::string config_problem(const GPTConfig& c, const std::string& prefix) {
  const std::pair<const char*, int64_t> sizes[] = {{"vocab_size", c.vocab_size},
                                                   {"context", c.context},
                                                   {"layers", c.layers},
                                                   {"heads", c.heads},
                                                   {"embed", c.embed}};
  for (const auto& [name, value] : sizes)
    if (value <= 0) return detail::cat_str(prefix, name, " must be positive, got ", value);
  if (c.vocab_multiple < 1 || c.vocab_multiple > (int64_t{1} << 20))
    return detail::cat_str(prefix, "vocab_multiple must be in [1, 2^20], got ", c.vocab_multiple);
  if (c.vocab_size > (int64_t{1} << 40))
    return detail::cat_str(prefix, "vocab_size must be at most 2^40, got ", c.vocab_size);
  if (c.embed % c.heads != 0)
    return detail::cat_str(prefix, "embed ", c.embed, " is not divisible by ", prefix, "heads ", c.heads);
  if (!(c.dropout >= 0 && c.dropout < 1)) return detail::cat_str(prefix, "dropout must be in [0, 1), got ", c.dropout);
  if (c.norm != "layernorm" && c.norm != "rmsnorm")
    return detail::cat_str(prefix, "norm must be 'layernorm' or 'rmsnorm', got '", c.norm, "'");
  return "";
}

GPTConfig checked(const GPTConfig& c) {
  const std::string problem = config_problem(c, "");
  NC_CHECK(problem.empty(), ValueError, "GPT: ", problem);
  return c;
}

// parameter_count of a config config_problem passed.
int64_t count_parameters(const GPTConfig& c) {
  bool overflow = false;
  auto product = [&overflow](std::initializer_list<int64_t> factors) {
    int64_t p = 1;
    for (int64_t f : factors) overflow = __builtin_mul_overflow(p, f, &p) || overflow;
    return p;
  };
  const int64_t norm_vectors = c.norm == "layernorm" && c.bias ? 2 : 1;  // weight (and bias)
  const int64_t terms[] = {
      product({c.padded_vocab_size(), c.embed}),     // tok_emb
      product({c.context, c.embed}),                 // pos_emb
      product({c.layers, 12, c.embed, c.embed}),     // qkv 3 C^2, proj C^2, fc 4 C^2, proj 4 C^2
      product({c.layers, c.bias ? 9 : 0, c.embed}),  // their biases
      product({c.layers, 2 * norm_vectors, c.embed}),
      product({norm_vectors, c.embed}),  // norm_f
  };
  int64_t count = 0;
  for (int64_t term : terms) overflow = __builtin_add_overflow(count, term, &count) || overflow;
  return overflow ? -1 : count;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// GPT-2's initialization over the parameters in state_dict order (see gpt.h).
void init_gpt2(nn::Module& model, int64_t layers, Generator* gen) {
  autograd::NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(layers));
  for (auto& [name, p] : model.named_parameters()) {
    if (name.find("norm") != std::string::npos) continue;  // norms keep ones and zeros
    if (ends_with(name, ".bias")) {
      p.zero_();
      continue;
    }
    const bool residual = ends_with(name, "attn.proj.weight") || ends_with(name, "mlp.proj.weight");
    p.copy_(mul(randn(p.shape(), TensorOptions(p.dtype(), p.device()), gen), residual ? residual_std : 0.02));
  }
}

}  // namespace

GPTConfig gpt2_config(const std::string& name) {
  struct Size {
    const char* name;
    int64_t layers, heads, embed;
  };
  static const Size sizes[] = {
      {"gpt2", 12, 12, 768}, {"gpt2-medium", 24, 16, 1024}, {"gpt2-large", 36, 20, 1280}, {"gpt2-xl", 48, 25, 1600}};
  for (const Size& size : sizes) {
    if (name != size.name) continue;
    GPTConfig c;
    c.vocab_size = 50257;
    c.vocab_multiple = 128;
    c.context = 1024;
    c.layers = size.layers;
    c.heads = size.heads;
    c.embed = size.embed;
    return c;
  }
  throw ValueError(
      detail::cat_str("gpt2_config: unknown model '", name, "' (gpt2, gpt2-medium, gpt2-large or gpt2-xl)"));
}

int64_t parameter_count(const GPTConfig& config) { return count_parameters(checked(config)); }

// ---------------------------------------------------------------- model
void GPTCache::clear() {
  for (nn::KVCache& layer : layers) layer.length = 0;
}

GPT::GPT(const GPTConfig& config, Generator* gen) : config(checked(config)), gen_(gen) {
  tok_emb = register_module("tok_emb", std::make_shared<nn::Embedding>(config.padded_vocab_size(), config.embed, gen));
  pos_emb = register_module("pos_emb", std::make_shared<nn::Embedding>(config.context, config.embed, gen));
  auto stack = register_module("blocks", std::make_shared<nn::Sequential>());
  for (int64_t i = 0; i < config.layers; ++i) {
    blocks.push_back(std::make_shared<nn::TransformerBlock>(config.embed, config.heads, config.norm, config.bias,
                                                            config.dropout, gen));
    stack->push_back(blocks.back());
  }
  if (config.norm == "layernorm")
    norm_f = register_module("norm_f", std::make_shared<nn::LayerNorm>(std::vector<int64_t>{config.embed}, 1e-5, true,
                                                                       config.bias));
  else norm_f = register_module("norm_f", std::make_shared<nn::RMSNorm>(std::vector<int64_t>{config.embed}, 1e-6));
  init_gpt2(*this, config.layers, gen);
}

Tensor GPT::run(const Tensor& tokens, int64_t start, GPTCache* cache, bool head) {
  const char* op = "GPT";
  NC_CHECK(tokens.defined(), ValueError, op, ": tokens is an undefined tensor");
  NC_CHECK(tokens.dim() == 2 && tokens.size(1) >= 1, ShapeError, op, ": tokens must be [B, T] with T >= 1, got ",
           describe(tokens));
  NC_CHECK(start + tokens.size(1) <= config.context, ShapeError, op, ": ", start + tokens.size(1),
           " positions exceed the model's context of ", config.context, " (tokens ", describe(tokens),
           start ? " after " + std::to_string(start) + " cached" : std::string(), ")");
  const Device device = tok_emb->weight.device();
  const Tensor positions = arange(start, start + tokens.size(1), 1, TensorOptions(DType::I64, device));
  // [B, T, C] + [T, C]
  Tensor x = dropout(add((*tok_emb)(tokens), (*pos_emb)(positions)), config.dropout, is_training(), gen_);
  if (!cache && fuses_norms()) {
    // Each residual add and the LayerNorm after it (the next block's norm1, or norm_f) in
    // one pass: add_layer_norm.
    Tensor normed = (*blocks[0]->norm1)(x);
    for (size_t i = 0; i < blocks.size(); ++i) {
      const nn::Module& next = i + 1 < blocks.size() ? *blocks[i + 1]->norm1 : *norm_f;
      std::tie(x, normed) = blocks[i]->forward_normed(x, normed, static_cast<const nn::LayerNorm&>(next));
    }
    x = normed;
  } else {
    for (size_t i = 0; i < blocks.size(); ++i) x = cache ? blocks[i]->forward(x, cache->layers[i]) : (*blocks[i])(x);
    x = (*norm_f)(x);
  }
  return head ? logits_of(x) : x;
}

Tensor GPT::logits_of(const Tensor& x) {
  const Tensor logits = matmul(x, tok_emb->weight.t());
  // The padded rows' logits are left out: never sampled, never in a softmax.
  return config.padded_vocab_size() == config.vocab_size ? logits : logits.narrow(2, 0, config.vocab_size);
}

bool GPT::fuses_norms() const {
  const auto* final_norm = dynamic_cast<const nn::LayerNorm*>(norm_f.get());
  if (blocks.empty() || !final_norm || final_norm->normalized_shape.size() != 1 || !final_norm->weight.defined() ||
      final_norm->has_forward_hooks())
    return false;
  for (const auto& block : blocks)
    if (!block->can_fuse_norms()) return false;
  return true;
}

Tensor GPT::forward(const Tensor& tokens) { return run(tokens, 0, nullptr); }

Tensor GPT::hidden_states(const Tensor& tokens) { return run(tokens, 0, nullptr, /*head=*/false); }

Tensor GPT::forward(const Tensor& tokens, GPTCache& cache) {
  NC_CHECK(cache.layers.size() == blocks.size(), ValueError, "GPT: the cache has ", cache.layers.size(),
           " layers, the model ", blocks.size(), " (make it with make_cache)");
  return run(tokens, cache.length(), &cache);
}

Tensor GPT::prefill(const Tensor& tokens, GPTCache& cache) {
  NC_CHECK(cache.layers.size() == blocks.size(), ValueError, "GPT: the cache has ", cache.layers.size(),
           " layers, the model ", blocks.size(), " (make it with make_cache)");
  const Tensor x = run(tokens, cache.length(), &cache, /*head=*/false);
  return logits_of(x.narrow(1, x.size(1) - 1, 1));
}

Tensor GPT::decode(const Tensor& tokens, const Tensor& positions, GPTCache& cache) {
  const char* op = "GPT::decode";
  NC_CHECK(cache.layers.size() == blocks.size(), ValueError, op, ": the cache has ", cache.layers.size(),
           " layers, the model ", blocks.size(), " (make it with make_cache)");
  NC_CHECK(tokens.defined() && tokens.dim() == 2 && tokens.size(1) == 1, ShapeError, op,
           ": tokens must be [B, 1] (one token a row), got ", describe(tokens));
  NC_CHECK(positions.defined() && positions.dtype() == DType::I64 && positions.dim() == 1 &&
               positions.size(0) == tokens.size(0),
           ShapeError, op, ": positions must be i64 [", tokens.size(0), "] (one a row), got ", describe(positions));
  const int64_t batch = tokens.size(0);
  // Both lookups and cached_attention check the positions on the device.
  Tensor x = add((*tok_emb)(tokens), (*pos_emb)(positions.view({batch, 1})));
  for (size_t i = 0; i < blocks.size(); ++i) x = blocks[i]->forward(x, cache.layers[i], positions);
  return logits_of((*norm_f)(x));
}

void GPTCache::set_length(int64_t length) {
  for (nn::KVCache& layer : layers) {
    NC_CHECK(length >= 0 && length <= layer.max_len(), ValueError, "GPTCache::set_length: ", length,
             " positions do not fit a cache of ", layer.max_len());
    layer.length = length;
  }
}

GPTCache GPT::make_cache(int64_t batch) const {
  GPTCache cache;
  for (const auto& block : blocks) cache.layers.push_back(block->attn->make_cache(batch, config.context));
  return cache;
}

int64_t GPT::parameter_count() const {
  int64_t count = 0;
  for (const Tensor& p : parameters()) count += p.numel();
  return count;
}

Tensor lm_loss(GPT& model, const Tensor& inputs, const Tensor& targets) {
  const Tensor hidden = model.hidden_states(inputs);
  NC_CHECK(targets.defined() && targets.shape() == inputs.shape(), ShapeError,
           "lm_loss: targets must have the "
           "inputs' shape ",
           describe(inputs), ", got ", targets.defined() ? describe(targets) : "undefined");
  return linear_cross_entropy(hidden, model.tok_emb->weight, targets, model.config.vocab_size);
}

// ---------------------------------------------------------------- checkpoints
std::map<std::string, std::string> gpt_description(const GPTConfig& c) {
  return {{"vocab_size", std::to_string(c.vocab_size)},
          {"vocab_multiple", std::to_string(c.vocab_multiple)},
          {"context", std::to_string(c.context)},
          {"layers", std::to_string(c.layers)},
          {"heads", std::to_string(c.heads)},
          {"embed", std::to_string(c.embed)},
          {"dropout", detail::cat_str(c.dropout)},
          {"norm", c.norm},
          {"bias", c.bias ? "1" : "0"}};
}

void save_gpt_checkpoint(const std::string& path, const GPT& model, int64_t step,
                         const nn::NamedTensors& optimizer_state, const nn::NamedTensors& schedule_state,
                         const std::map<std::string, std::string>& options) {
  train::TrainingState state;
  state.model = "gpt";
  state.description = gpt_description(model.config);
  state.model_state = model.state_dict();
  state.optimizer_state = optimizer_state;
  state.schedule_state = schedule_state;
  state.step = step;
  state.options = options;
  train::save_training_state(path, state);
}

GPTCheckpoint load_gpt_checkpoint(const std::string& path, Device device, Generator* gen) {
  train::TrainingState state;
  try {
    state = train::load_training_state(path);
  } catch (const IOError& e) {
    throw IOError(std::string("load_gpt_checkpoint: not a normcore GPT checkpoint: ") + e.what());
  }
  NC_CHECK(state.model == "gpt", IOError, "load_gpt_checkpoint: ", path,
           " is not a normcore GPT checkpoint (it "
           "holds model '",
           state.model, "')");
  NC_CHECK(state.step >= 0, IOError, "load_gpt_checkpoint: ", path, " has no step count");
  auto meta = [&](const std::string& key) -> const std::string& {
    auto it = state.metadata.find(key);
    NC_CHECK(it != state.metadata.end(), IOError, "load_gpt_checkpoint: ", path,
             " is not a normcore GPT checkpoint (its metadata has no '", key, "')");
    return it->second;
  };
  auto whole = [&](const std::string& key, int64_t min) {
    int64_t value = 0;
    NC_CHECK(parse_whole(meta(key), &value) && value >= min, IOError, "load_gpt_checkpoint: ", path,
             " has a malformed ", key, " '", meta(key), "'");
    return value;
  };
  GPTConfig c;
  c.vocab_size = whole("config.vocab_size", 1);
  // Older checkpoints have no padding.
  c.vocab_multiple = state.metadata.count("config.vocab_multiple") ? whole("config.vocab_multiple", 1) : 1;
  c.context = whole("config.context", 1);
  c.layers = whole("config.layers", 1);
  c.heads = whole("config.heads", 1);
  c.embed = whole("config.embed", 1);
  NC_CHECK(parse_whole(meta("config.dropout"), &c.dropout), IOError, "load_gpt_checkpoint: ", path,
           " has a malformed config.dropout '", meta("config.dropout"), "'");
  c.norm = meta("config.norm");
  NC_CHECK(meta("config.bias") == "0" || meta("config.bias") == "1", IOError, "load_gpt_checkpoint: ", path,
           " has a malformed config.bias '", meta("config.bias"), "' (0 or 1)");
  c.bias = meta("config.bias") == "1";
  const std::string problem = config_problem(c, "config.");
  NC_CHECK(problem.empty(), IOError, "load_gpt_checkpoint: ", path, " has a bad config: ", problem);
  // The model is built only when the file holds every value its config calls for, so a
  // config cannot make the loader allocate more than the file's own size warrants.
  const nn::NamedTensors& weights = state.model_state;
  int64_t values = 0;
  for (const auto& [name, t] : weights) values += t.numel();
  const int64_t expected = count_parameters(c);
  NC_CHECK(expected == values, IOError, "load_gpt_checkpoint: ", path, " has a config (config.layers ", c.layers,
           ", config.embed ", c.embed, ", config.context ", c.context, ", config.vocab_size ", c.vocab_size,
           ") that calls for ", expected < 0 ? std::string("more than 2^63") : std::to_string(expected),
           " parameters, but its model tensors hold ", values, " values");
  GPTCheckpoint out;
  out.step = state.step;
  // Building draws an initialization from gen that the saved weights replace (a caller
  // restoring a generator's state does so after loading, as train-lm does).
  out.model = std::make_shared<GPT>(c, gen);
  out.model->load_state_dict(weights);
  out.model->to(device);
  out.optimizer_state = std::move(state.optimizer_state);
  out.schedule_state = std::move(state.schedule_state);
  out.metadata = std::move(state.metadata);
  return out;
}

}  // namespace models
}  // namespace normcore
