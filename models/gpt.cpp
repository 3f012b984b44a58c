// The GPT language model (normcore/gpt.h): the module, its loss, its checkpoints and
// text generation with the KV cache. Generation samples on the host from the last
// position's logits (256 values a step), so a seed gives the same bytes on every run.
#include "normcore/gpt.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <tuple>
#include <type_traits>

#include "models/checkpoint_text.h"
#include "normcore/autograd.h"
#include "normcore/losses.h"
#include "normcore/ops.h"
#include "normcore/safetensors.h"
#include "normcore/text.h"
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
  if (!head) return x;
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

// ---------------------------------------------------------------- generation
namespace {

// The next token from the last position's logits: the most likely (temperature 0), or a
// draw from softmax(logits / temperature) over the top_k most likely and then the top_p
// nucleus, with u uniform on [0, 1).
int64_t choose(const std::vector<float>& logits, const GenerateOptions& options, double u) {
  const auto most_likely = std::max_element(logits.begin(), logits.end());
  if (options.temperature <= 0) return most_likely - logits.begin();
  float cutoff = -INFINITY;
  if (options.top_k > 0 && options.top_k < static_cast<int64_t>(logits.size())) {
    std::vector<float> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + (options.top_k - 1), sorted.end(), std::greater<float>());
    cutoff = sorted[options.top_k - 1];
  }
  std::vector<double> weights(logits.size(), 0.0);
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] < cutoff) continue;
    weights[i] = std::exp((static_cast<double>(logits[i]) - *most_likely) / options.temperature);
    total += weights[i];
  }
  if (options.top_p < 1) {
    // The most likely first (ties by index, so the cut is the same every time); keep them
    // until their weight reaches top_p of the total, drop the rest.
    std::vector<int64_t> order;
    for (size_t i = 0; i < weights.size(); ++i)
      if (weights[i] > 0) order.push_back(static_cast<int64_t>(i));
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return weights[a] > weights[b]; });
    double kept = 0;
    size_t n = 0;
    while (n < order.size() && (n == 0 || kept < options.top_p * total)) kept += weights[order[n++]];
    for (size_t j = n; j < order.size(); ++j) weights[order[j]] = 0;
    total = kept;
  }
  double target = u * total;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] == 0) continue;
    target -= weights[i];
    if (target < 0) return static_cast<int64_t>(i);
  }
  return most_likely - logits.begin();  // rounding left u * total past the last weight
}

// Logits of the last position of [1, T, V] as floats on the host.
std::vector<float> last_logits(const Tensor& logits) {
  return logits.select(0, 0).select(0, logits.size(1) - 1).to(Device::cpu(), DType::F32).to_vector<float>();
}

}  // namespace

std::vector<int64_t> generate_tokens(GPT& model, const std::vector<int64_t>& prompt, int64_t tokens,
                                     const GenerateOptions& options, const std::function<void(int64_t)>& on_token) {
  const char* op = "generate_tokens";
  NC_CHECK(tokens >= 0, ValueError, op, ": tokens must be >= 0, got ", tokens);
  NC_CHECK(std::isfinite(options.temperature) && options.temperature >= 0, ValueError, op,
           ": temperature must be finite and >= 0, got ", options.temperature);
  NC_CHECK(options.top_k >= 0, ValueError, op, ": top_k must be >= 0, got ", options.top_k);
  NC_CHECK(options.top_p > 0 && options.top_p <= 1, ValueError, op, ": top_p must be in (0, 1], got ", options.top_p);
  NC_CHECK(!prompt.empty(), ValueError, op, ": the prompt is empty (at least one token is needed)");
  for (size_t i = 0; i < prompt.size(); ++i)
    NC_CHECK(prompt[i] >= 0 && prompt[i] < model.config.vocab_size, IndexError, op, ": prompt token ", i, " is ",
             prompt[i], ", outside the model's vocabulary of ", model.config.vocab_size);
  const int64_t context = model.config.context;
  const Device device = model.tok_emb->weight.device();
  std::vector<int64_t> history(prompt);

  const bool was_training = model.is_training();
  model.eval();
  autograd::InferenceModeGuard inference;
  Generator gen(options.seed);
  GPTCache cache = model.make_cache(1);
  // A fresh prefill of the last `context` tokens of history.
  auto prefill = [&]() {
    cache.clear();
    const int64_t n = std::min<int64_t>(context, static_cast<int64_t>(history.size()));
    const std::vector<int64_t> window(history.end() - n, history.end());
    return model.forward(from_vector(window, {1, n}, device), cache);
  };
  Tensor logits = prefill();
  std::vector<int64_t> out;
  for (int64_t i = 0; i < tokens; ++i) {
    const double u = options.temperature > 0 ? rand({1}, DType::F64, &gen).item<double>() : 0.0;
    const int64_t next = choose(last_logits(logits), options, u);
    history.push_back(next);
    out.push_back(next);
    if (on_token) on_token(next);
    if (i + 1 == tokens) break;
    if (cache.length() < context)
      logits = model.forward(from_vector(std::vector<int64_t>{next}, {1, 1}, device), cache);
    else logits = prefill();
  }
  model.train(was_training);
  return out;
}

std::string generate_text(GPT& model, const std::string& prompt, int64_t tokens, const GenerateOptions& options,
                          const std::function<void(const std::string&)>& on_text) {
  NC_CHECK(model.config.vocab_size <= 256, ValueError, "generate_text: the model's vocabulary has ",
           model.config.vocab_size, " tokens; text generation writes bytes (at most 256)");
  NC_CHECK(tokens >= 0, ValueError, "generate_text: tokens must be >= 0, got ", tokens);
  std::vector<int64_t> bytes;
  for (unsigned char c : prompt.empty() ? std::string("%\n") : prompt) bytes.push_back(c);
  std::string text;
  generate_tokens(model, bytes, tokens, options, [&](int64_t next) {
    const std::string piece(1, static_cast<char>(next));
    text += piece;
    if (on_text) on_text(piece);
  });
  return text;
}

TextGenerator::TextGenerator(const std::string& path, Device device, const std::string& tokenizer_dir) {
  if (!std::filesystem::is_directory(path)) {
    NC_CHECK(tokenizer_dir.empty(), ValueError, "TextGenerator: ", path,
             " is a byte-level checkpoint, which takes "
             "no tokenizer (got tokenizer folder ",
             tokenizer_dir, ")");
    model_ = load_gpt_checkpoint(path, device).model;
  } else {
    model_ = load_hf_gpt2(path, device);
    tokenizer_ = std::make_shared<const text::BpeTokenizer>(
        text::BpeTokenizer::load(tokenizer_dir.empty() ? path : tokenizer_dir));
    NC_CHECK(tokenizer_->vocab_size() <= model_->config.vocab_size, ValueError, "TextGenerator: the tokenizer of ",
             tokenizer_dir.empty() ? path : tokenizer_dir, " has ", tokenizer_->vocab_size(),
             " tokens, more than the model's vocabulary of ", model_->config.vocab_size);
    max_token_bytes_ = 1;
    for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id)
      max_token_bytes_ = std::max<int64_t>(max_token_bytes_, static_cast<int64_t>(tokenizer_->decode({id}).size()));
  }
  model_->eval();
}

std::string TextGenerator::generate(const std::string& prompt, int64_t tokens, const GenerateOptions& options,
                                    const std::function<void(const std::string&)>& on_text) {
  if (!tokenizer_) return generate_text(*model_, prompt, tokens, options, on_text);
  std::vector<int64_t> ids;
  for (int32_t id : tokenizer_->encode(prompt)) ids.push_back(id);
  if (ids.empty()) {
    NC_CHECK(tokenizer_->end_of_text() >= 0, ValueError,
             "TextGenerator::generate: the prompt is empty and the "
             "tokenizer has no <|endoftext|> to start a new document with");
    ids.push_back(tokenizer_->end_of_text());
  }
  std::string text;
  generate_tokens(*model_, ids, tokens, options, [&](int64_t id) {
    const std::string piece = tokenizer_->decode({static_cast<int32_t>(id)});
    text += piece;
    if (on_text) on_text(piece);
  });
  return text;
}

}  // namespace models
}  // namespace normcore
