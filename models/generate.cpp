// Text generation with a GPT's KV cache (normcore/gpt.h): generate_tokens, generate_text and
// TextGenerator. A prompt runs as one prefill whose head covers its last position only;
// each later token is one decoding step at a position held on the device (GPT::decode), on a
// GPU one CUDA graph replay. The choice (argmax, or sample_logits with the call's seed) is
// made on the model's device, so a seed gives the same tokens on every run of a device and
// the host reads one id a token.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "normcore/autograd.h"
#include "normcore/cuda.h"
#include "normcore/gpt.h"
#include "normcore/ops.h"
#include "normcore/random.h"
#include "normcore/text.h"

namespace normcore {
namespace models {

// ---------------------------------------------------------------- generation
namespace {

// The next token of each row of logits [rows, 1, V] on their device: the most likely
// (temperature 0) or a draw (sample_logits), i64 [rows].
Tensor choose(const Tensor& logits, const GenerateOptions& options, Generator& gen) {
  const Tensor rows = logits.reshape({logits.size(0), logits.size(2)});
  if (options.temperature <= 0) return argmax(rows, 1);
  return sample_logits(rows, options.temperature, options.top_k, options.top_p, &gen);
}

// The decoding steps of one generate_tokens call: tokens [1, 1] and positions [1] live on
// the model's device, and each step reads them there and writes its choice into tokens, so
// that on a GPU the whole step (the model, the choice, the position's advance) is one CUDA
// graph replay, captured on the second step; the host reads the one chosen id.
class Decoder {
 public:
  Decoder(GPT& model, GPTCache& cache, const GenerateOptions& options, Generator& gen)
      : model_(model), cache_(cache), options_(options), gen_(gen) {
    const Device device = model.tok_emb->weight.device();
    tokens_ = zeros({1, 1}, TensorOptions(DType::I64, device));
    positions_ = zeros({1}, TensorOptions(DType::I64, device));
    graphed_ = options.cuda_graph && device.is_cuda();
  }

  // The token after `token`, which goes at position cache.length(); the cache grows by one.
  int64_t next(int64_t token) {
    const int64_t position = cache_.length();
    if (position != device_position_) {
      positions_.copy_(from_vector(std::vector<int64_t>{position}, {1}, Device::cpu()));
      device_position_ = position;
    }
    if (token != device_token_) tokens_.copy_(from_vector(std::vector<int64_t>{token}, {1, 1}, Device::cpu()));
    if (graph_.captured()) {
      graph_.replay();
    } else if (graphed_ && steps_ > 0) {
      // The first step ran directly (plans and workspaces made outside the capture); the
      // capture runs nothing, so the step is replayed right after it.
      graph_.capture(positions_.device().index, [&] { step(); });
      graph_.replay();
    } else {
      step();
    }
    ++steps_;
    ++device_position_;
    cache_.set_length(position + 1);
    device_token_ = tokens_.item<int64_t>();
    return device_token_;
  }

 private:
  void step() {
    tokens_.copy_(choose(model_.decode(tokens_, positions_, cache_), options_, gen_).view({1, 1}));
    positions_.copy_(add(positions_, 1));
  }

  GPT& model_;
  GPTCache& cache_;
  const GenerateOptions options_;
  Generator& gen_;
  bool graphed_ = false;
  Tensor tokens_, positions_;
  cuda::Graph graph_;
  int64_t steps_ = 0;
  int64_t device_position_ = -1;  // what positions_ holds (-1: not set yet)
  int64_t device_token_ = -1;     // what tokens_ holds
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
  // A fresh prefill of the last `context` tokens of history, and its choice.
  auto prefill = [&]() {
    cache.clear();
    const int64_t n = std::min<int64_t>(context, static_cast<int64_t>(history.size()));
    const std::vector<int64_t> window(history.end() - n, history.end());
    return choose(model.prefill(from_vector(window, {1, n}, device), cache), options, gen).item<int64_t>();
  };
  Decoder decoder(model, cache, options, gen);
  int64_t next = prefill();
  std::vector<int64_t> out;
  for (int64_t i = 0; i < tokens; ++i) {
    history.push_back(next);
    out.push_back(next);
    if (on_token) on_token(next);
    if (i + 1 == tokens) break;
    next = cache.length() < context ? decoder.next(next) : prefill();
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
