// A decoder-only transformer language model (GPT-2's layout: learned positions, pre-norm
// blocks, an output head tied to the token embedding) with GPT-2's sizes as presets,
// incremental decoding with a KV cache, the text it learns from (the Debian fortunes
// corpus), its checkpoints, and a streaming text generator for applications. Tokens are
// i64 ids: bytes (vocab_size 256) for the text functions here, any vocabulary for the model.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "normcore/data.h"
#include "normcore/nn.h"
#include "normcore/random.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {
namespace text {
class BpeTokenizer;
}  // namespace text
namespace models {

struct GPTConfig {
  int64_t vocab_size = 256;
  // The token embedding (and so the tied output head) has vocab_size rounded up to a
  // multiple of this many rows, which the matrix products of the head prefer (GPT-2's 50257
  // becomes 50304 with 128); the padded rows are never looked up, their logits are cut off
  // before the loss and sampling, so they get no gradient.
  int64_t vocab_multiple = 1;
  int64_t context = 256;  // the most positions a sequence may have
  int64_t layers = 6;
  int64_t heads = 6;
  int64_t embed = 384;             // divisible by heads
  double dropout = 0.0;            // on the residual branches and after the embeddings, in training
  std::string norm = "layernorm";  // or "rmsnorm"
  bool bias = true;                // Linear and LayerNorm biases

  // The token embedding's rows: vocab_size rounded up to a multiple of vocab_multiple.
  int64_t padded_vocab_size() const { return (vocab_size + vocab_multiple - 1) / vocab_multiple * vocab_multiple; }
};

// GPT-2's sizes: "gpt2" (124M parameters: 12 layers, 12 heads, width 768), "gpt2-medium"
// (350M: 24, 16, 1024), "gpt2-large" (774M: 36, 20, 1280) and "gpt2-xl" (1.56B: 48, 25, 1600),
// each with context 1024, GPT-2's vocabulary of 50257 tokens padded to 50304 rows
// (vocab_multiple 128), LayerNorm with biases and no dropout. ValueError naming the known
// names for any other.
GPTConfig gpt2_config(const std::string& name);

// The parameters a GPT of this config has (GPT::parameter_count of the built model), or -1
// when the count overflows int64; computed without building it. ValueError for a config
// GPT would refuse.
int64_t parameter_count(const GPTConfig& config);

// Every block's KV cache for incremental decoding (GPT::make_cache, GPT::forward(tokens, cache)).
struct GPTCache {
  std::vector<nn::KVCache> layers;
  // Positions filled so far (the same in every layer).
  int64_t length() const { return layers.empty() ? 0 : layers.front().length; }
  // Forgets every position; the tensors are kept for reuse.
  void clear();
  // Says that the first length positions are filled (after GPT::decode steps, which do not
  // count them: their positions live on the device).
  void set_length(int64_t length);
};

// tokens [B, T] (i64 or i32, values in [0, vocab_size)) -> logits [B, T, vocab_size] (a
// view that leaves out the padded rows' logits when vocab_multiple pads the vocabulary).
// Children and state_dict keys, in order: "tok_emb" [padded V, C], "pos_emb" [context, C],
// "blocks.<i>." (nn::TransformerBlock), "norm_f". The head is tok_emb's weight
// (logits = x @ tok_emb.weight^T): there is no separate head parameter, so the keys are
// those of a PyTorch module that computes F.linear(x, self.tok_emb.weight).
// GPT-2's initialization, drawn from gen: N(0, 0.02) for embeddings and Linear weights,
// N(0, 0.02 / sqrt(2 * layers)) for the projections into the residual stream
// ("attn.proj", "mlp.proj"), zero biases, unit norm weights. Dropout masks come from gen
// too (gen, when given, must outlive the model; the default generator otherwise).
class GPT : public nn::Module {
 public:
  explicit GPT(const GPTConfig& config, Generator* gen = nullptr);
  // T <= context (ShapeError naming the context otherwise).
  Tensor forward(const Tensor& tokens) override;
  // Decoding in eval mode: tokens [B, T] are positions cache.length() onwards; T tokens
  // on an empty cache, then one per call (nn::CausalSelfAttention::forward(x, cache)).
  // Gives what forward() gives for those positions of the whole sequence.
  Tensor forward(const Tensor& tokens, GPTCache& cache);
  // forward(tokens, cache)'s logits of the last position alone, [B, 1, vocab_size]: a prompt's
  // prefill, with the head run on one position instead of T.
  Tensor prefill(const Tensor& tokens, GPTCache& cache);
  // One decoding step whose positions live on the device, so that a CUDA graph of it replays
  // at every position (generate_tokens does so): tokens [B, 1] at positions [B] (i64 on the
  // model's device, each below the context) -> logits [B, 1, vocab_size]. Each row's key and
  // value go into the cache at its position, and it attends to the cache's positions up to
  // it (nn::CausalSelfAttention::forward(x, cache, positions)); a position past the context
  // is an IndexError at the next wait for the device. cache.length() is not advanced (the
  // caller knows how many steps ran: GPTCache::set_length). Eval mode.
  Tensor decode(const Tensor& tokens, const Tensor& positions, GPTCache& cache);
  // The final norm's output [B, T, embed] for tokens [B, T]: what the head turns into the
  // logits (forward(tokens) is hidden_states(tokens) @ tok_emb->weight^T, its first
  // vocab_size columns).
  Tensor hidden_states(const Tensor& tokens);
  // An empty cache for batch sequences of up to context positions, on the model's device.
  GPTCache make_cache(int64_t batch) const;
  int64_t parameter_count() const;

  const GPTConfig config;
  std::shared_ptr<nn::Embedding> tok_emb;
  std::shared_ptr<nn::Embedding> pos_emb;
  std::vector<std::shared_ptr<nn::TransformerBlock>> blocks;
  std::shared_ptr<nn::Module> norm_f;

 private:
  // Embeddings of tokens at positions start.. -> blocks (with cache when given) -> the final
  // norm, and with head the logits.
  Tensor run(const Tensor& tokens, int64_t start, GPTCache* cache, bool head = true);
  // x [B, T, embed] -> logits [B, T, vocab_size] (tok_emb's weight as the head).
  Tensor logits_of(const Tensor& x);
  // Whether every norm is a fusable LayerNorm (TransformerBlock::can_fuse_norms and norm_f).
  bool fuses_norms() const;
  Generator* gen_;
};

// Hugging Face GPT-2 checkpoints: dir holds a GPT2LMHeadModel's (or GPT2Model's)
// config.json and model.safetensors, any size, f32/f16/bf16 weights (loaded into f32
// parameters). The model is built only when every tensor the config calls for is in the
// file with its shape; a missing or mis-shaped tensor, a config field GPT cannot honour
// (another activation, LayerNorm epsilon, attention scaling, an untied head, n_inner other
// than 4 * n_embd) or a missing one is IOError or ShapeError naming the file and the field or
// tensor. Fields that do not change the arithmetic (dropout rates, token ids, task
// parameters) are not read. The model comes in eval mode on device, its embedding padded to
// a multiple of 128 rows (zeros, never used).
std::shared_ptr<GPT> load_hf_gpt2(const std::string& dir, Device device = Device::cpu());
// Writes model as such a checkpoint (config.json and model.safetensors with transformer.*
// names, Conv1D [in, out] projections, the vocabulary's rows without the padding), which
// transformers' GPT2LMHeadModel.from_pretrained reads. LayerNorm models with biases only.
void save_hf_gpt2(const GPT& model, const std::string& dir);

// Mean next-token cross entropy of the model on inputs [B, T] against targets [B, T] (i64),
// the head and the loss in one op (linear_cross_entropy: the padded vocabulary rows never
// count, and the logits are never held in f32).
Tensor lm_loss(GPT& model, const Tensor& inputs, const Tensor& targets);

// ---------------------------------------------------------------- text
// Debian's fortunes package installs its corpus here.
inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// The fortune files of path, sorted by name: path itself when it is a file; for a folder,
// the regular files (not symbolic links) whose names have no '.', which leaves out the
// strfile indexes (*.dat) and the *.u8 links of Debian's package. IOError when there is none.
std::vector<std::string> fortune_files(const std::string& path);

// The fortunes of a file's text: runs of lines separated by lines that are exactly "%".
// Each keeps its lines with their '\n'; fortunes of white space only are dropped.
std::vector<std::string> split_fortunes(const std::string& text);

// The corpus as two byte streams. The fortunes of fortune_files(path), in file order and
// then in order within each file, are numbered from 0; every tenth (numbers 9, 19, 29, ...)
// goes to validation, the rest to train. Each stream is its fortunes, each followed by the
// line "%\n", as in the files.
struct TextCorpus {
  std::vector<std::string> files;
  std::string train;
  std::string validation;
  int64_t train_fortunes = 0;
  int64_t validation_fortunes = 0;
};
TextCorpus load_fortunes(const std::string& path = kFortunesDir);

// Windows of context + 1 bytes of a stream: inputs the first context bytes, targets the
// last context, both i64 [B, context] on device.
struct TextBatch {
  Tensor inputs;
  Tensor targets;
};
// batch windows starting at offsets uniform on [0, size - context - 1], drawn from gen
// (one randint of batch values, so a generator's seed and offset fix the batch).
TextBatch random_windows(const std::string& stream, int64_t batch, int64_t context, Generator& gen, Device device);
// count windows at evenly spaced offsets from the first to the last possible one: the same
// windows every time.
TextBatch spaced_windows(const std::string& stream, int64_t count, int64_t context, Device device);

// The mean loss over `windows` spaced_windows of the stream, in batches of batch, in eval
// mode with recording off; the model's training flag is restored.
double evaluate_lm(GPT& model, const std::string& stream, int64_t windows, int64_t batch, Device device);
// The same over count samples of a dataset of windows (input and target i64 [T] with
// T <= context, as data::TextWindows and token shards give), at evenly spaced indices from
// the first to the last: the same samples every time.
double evaluate_lm(GPT& model, const data::Dataset& windows, int64_t count, int64_t batch, Device device);

// ---------------------------------------------------------------- checkpoints
// The checkpoint format of normcore/train.h (model "gpt", its config as "config.layers",
// ..., the step count, the options as "option.<name>"); files of the older "normcore-gpt"
// format load as well.
struct GPTCheckpoint {
  std::shared_ptr<GPT> model;  // rebuilt and loaded on the requested device
  int64_t step = 0;
  nn::NamedTensors optimizer_state;  // prefixes removed; empty when none was saved
  nn::NamedTensors schedule_state;
  std::map<std::string, std::string> metadata;
};
// The config as a checkpoint's description ("layers" -> "6", ...; written as "config.*").
std::map<std::string, std::string> gpt_description(const GPTConfig& config);
// Writes atomically (a temporary file renamed over path).
void save_gpt_checkpoint(const std::string& path, const GPT& model, int64_t step,
                         const nn::NamedTensors& optimizer_state, const nn::NamedTensors& schedule_state,
                         const std::map<std::string, std::string>& options);
// IOError naming what is wrong for a file that is not a GPT checkpoint. The model is built
// with gen (the default generator when null), which its initialization, replaced by the
// saved weights, advances; its dropout draws from gen afterwards.
GPTCheckpoint load_gpt_checkpoint(const std::string& path, Device device = Device::cpu(), Generator* gen = nullptr);

// ---------------------------------------------------------------- generation
struct GenerateOptions {
  double temperature = 0.8;  // 0: greedy (the most likely token)
  int64_t top_k = 0;         // sample among the k most likely tokens (0: all)
  uint64_t seed = 0;         // the same seed gives the same text on a device
  // Then among the fewest most likely tokens whose probabilities (at the temperature, after
  // top_k) add up to at least top_p, in (0, 1]; 1 keeps them all (nucleus sampling). Last,
  // so that {temperature, top_k, seed} still initializes the others.
  double top_p = 1.0;
  // On a GPU, each decoding step as one CUDA graph replay (captured on the second step);
  // false runs every step's kernels one by one. The tokens are the same either way.
  bool cuda_graph = true;
};

// Continues prompt by `tokens` bytes, one KV-cache step per byte, handing each byte to
// on_text as it is chosen (when given), and returns the continuation. An empty prompt
// starts from "%\n", the line before every fortune. The model always conditions on the
// last `context` bytes: a longer prompt is cut to its last context bytes, and once the
// cache is full each new byte re-runs the last context bytes as a fresh prefill (a sliding
// window, exactly what a full forward of that window gives). Runs in eval mode with
// recording off; the model's training flag is restored.
std::string generate_text(GPT& model, const std::string& prompt, int64_t tokens, const GenerateOptions& options,
                          const std::function<void(const std::string&)>& on_text = {});

// The same over token ids of any vocabulary: continues prompt (ids in [0, vocab_size), at
// least one) by `tokens` tokens, handing each to on_token as it is chosen, and returns them.
// generate_text is this over bytes.
std::vector<int64_t> generate_tokens(GPT& model, const std::vector<int64_t>& prompt, int64_t tokens,
                                     const GenerateOptions& options, const std::function<void(int64_t)>& on_token = {});

// Loads a model once and writes text with it: a checkpoint file of `normcore train-lm` (a
// byte-level GPT), or a Hugging Face GPT-2 folder (load_hf_gpt2) with its tokenizer's files
// (text::BpeTokenizer::load) from the folder itself or from tokenizer_dir when given.
class TextGenerator {
 public:
  explicit TextGenerator(const std::string& path, Device device = Device::cpu(), const std::string& tokenizer_dir = "");
  // Continues prompt by `tokens` tokens (bytes for a byte-level model), handing each
  // token's bytes to on_text as it is chosen, and returns the continuation. An empty prompt
  // starts a new fortune (byte models: generate_text) or a new document (<|endoftext|>).
  std::string generate(const std::string& prompt, int64_t tokens, const GenerateOptions& options = {},
                       const std::function<void(const std::string&)>& on_text = {});
  const GPT& model() const { return *model_; }
  // The tokenizer of a model folder; null for a byte-level checkpoint.
  const text::BpeTokenizer* tokenizer() const { return tokenizer_.get(); }
  // The most bytes one token's text can have (1 for a byte-level model): a continuation of
  // n tokens has at most n times this many bytes.
  int64_t max_token_bytes() const { return max_token_bytes_; }

 private:
  std::shared_ptr<GPT> model_;
  std::shared_ptr<const text::BpeTokenizer> tokenizer_;
  int64_t max_token_bytes_ = 1;
};

}  // namespace models
}  // namespace normcore

#pragma GCC visibility pop
