// Text generation with a GPT's KV cache (normcore/gpt.h): generate_tokens, generate_text and
// TextGenerator. A prompt runs as one prefill whose head covers its last position only;
// each later token is one decoding step at a position held on the device (GPT::decode), on a
// GPU one CUDA graph replay. Greedy choices are made on the device (argmax); sampling draws
// on the host from the last position's logits, so a seed gives the same tokens on every run
// of a device.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "normcore/autograd.h"
#include "normcore/cuda.h"
#include "normcore/gpt.h"
#include "normcore/ops.h"
#include "normcore/text.h"

namespace normcore {
namespace models {

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

namespace {

// The decoding steps of one generate_tokens call: tokens [1, 1] and positions [1] live on
// the model's device, and each step reads them there, so that on a GPU the step (the model,
// greedy choice included, and the position's advance) is one CUDA graph replay captured on
// the second step. A greedy step writes its token into `tokens` on the device and the host
// reads that one id; a sampling step leaves the logits for the host to draw from and the
// host writes the drawn id.
class Decoder {
 public:
  Decoder(GPT& model, GPTCache& cache, const GenerateOptions& options)
      : model_(model), cache_(cache), greedy_(options.temperature <= 0) {
    const Device device = model.tok_emb->weight.device();
    tokens_ = zeros({1, 1}, TensorOptions(DType::I64, device));
    positions_ = zeros({1}, TensorOptions(DType::I64, device));
    graphed_ = options.cuda_graph && device.is_cuda();
  }

  // Continues after `token` at position cache.length(); returns the greedy choice (greedy) or
  // the logits [vocab_size] (sampling), with the cache one position longer.
  int64_t greedy_step(int64_t token) {
    prepare(token);
    run();
    cache_.set_length(cache_.length() + 1);
    return tokens_.item<int64_t>();
  }
  const Tensor& sampling_step(int64_t token) {
    prepare(token);
    run();
    cache_.set_length(cache_.length() + 1);
    return logits_;
  }

 private:
  // The step's inputs on the device: the position whenever the host's count may differ from
  // the device's (the first step, after a prefill), the token when the host chose it.
  void prepare(int64_t token) {
    const int64_t position = cache_.length();
    if (position != device_position_) {
      positions_.copy_(from_vector(std::vector<int64_t>{position}, {1}, Device::cpu()));
      device_position_ = position;
    }
    if (!greedy_ || !chosen_on_device_) tokens_.copy_(from_vector(std::vector<int64_t>{token}, {1, 1}, Device::cpu()));
  }

  void step() {
    const Tensor logits = model_.decode(tokens_, positions_, cache_);
    if (greedy_) tokens_.copy_(argmax(logits.view({1, logits.size(2)})).view({1, 1}));
    else logits_ = logits.view({logits.size(2)});
    positions_.copy_(add(positions_, 1));
  }

  void run() {
    if (graph_.captured()) {
      graph_.replay();
    } else if (graphed_ && steps_ > 0) {
      // The first step ran directly (plans and workspaces made outside the capture); the
      // capture itself runs the step once, as a direct call would.
      graph_.capture(positions_.device().index, [&] { step(); });
      graph_.replay();
    } else {
      step();
    }
    ++steps_;
    ++device_position_;
    chosen_on_device_ = greedy_;
  }

  GPT& model_;
  GPTCache& cache_;
  const bool greedy_;
  bool graphed_ = false;
  Tensor tokens_, positions_, logits_;
  cuda::Graph graph_;
  int64_t steps_ = 0;
  int64_t device_position_ = -1;   // what positions_ holds (-1: not set yet)
  bool chosen_on_device_ = false;  // tokens_ holds the last greedy choice
};

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
    return model.prefill(from_vector(window, {1, n}, device), cache);
  };
  // The greedy choice of a prefill's logits, on the device as the decoding steps make it.
  auto most_likely = [](const Tensor& logits) { return argmax(logits.view({logits.size(2)})).item<int64_t>(); };
  Decoder decoder(model, cache, options);
  Tensor logits = prefill();
  int64_t greedy_next = options.temperature <= 0 ? most_likely(logits) : 0;
  std::vector<int64_t> out;
  for (int64_t i = 0; i < tokens; ++i) {
    int64_t next = greedy_next;
    if (options.temperature > 0) {
      const double u = rand({1}, DType::F64, &gen).item<double>();
      next = choose(last_logits(logits), options, u);
    }
    history.push_back(next);
    out.push_back(next);
    if (on_token) on_token(next);
    if (i + 1 == tokens) break;
    if (cache.length() < context) {
      if (options.temperature <= 0) greedy_next = decoder.greedy_step(next);
      else logits = decoder.sampling_step(next).view({1, 1, -1});
    } else {
      logits = prefill();
      if (options.temperature <= 0) greedy_next = most_likely(logits);
    }
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
