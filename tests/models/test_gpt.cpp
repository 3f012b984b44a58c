// The GPT language model and its text data: state_dict layout, shapes and errors, KV-cache
// decoding against the full forward (CPU, and CUDA when present), training, generation,
// checkpoints, the fortunes split and exact resume.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "normcore/normcore.h"
#include "tests/test_support.h"

namespace nc = normcore;
namespace models = normcore::models;
using normcore_test::TempDirTest;
using normcore_test::throws;

namespace {

models::GPTConfig tiny_config(const std::string& norm = "layernorm", bool bias = true) {
  models::GPTConfig c;
  c.context = 8;
  c.layers = 2;
  c.heads = 2;
  c.embed = 16;
  c.norm = norm;
  c.bias = bias;
  return c;
}

std::vector<nc::Device> devices() {
  std::vector<nc::Device> out{nc::Device::cpu()};
  if (nc::cuda_is_available()) out.push_back(nc::Device::cuda());
  return out;
}

nc::Tensor tokens_of(const std::string& text, nc::Device device = nc::Device::cpu()) {
  std::vector<int64_t> ids;
  for (unsigned char c : text) ids.push_back(c);
  return nc::from_vector(ids, {1, static_cast<int64_t>(ids.size())}, device);
}

float max_abs_diff(const nc::Tensor& a, const nc::Tensor& b) {
  return nc::max(nc::abs(nc::sub(a.to(nc::Device::cpu()), b.to(nc::Device::cpu())))).item<float>();
}

// Every parameter equal bit for bit.
void expect_same_state(const nc::nn::Module& a, const nc::nn::Module& b) {
  const auto sa = a.state_dict(), sb = b.state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sb[i].first);
    EXPECT_EQ(sa[i].second.to(nc::Device::cpu()).to_vector<float>(),
              sb[i].second.to(nc::Device::cpu()).to_vector<float>())
        << sa[i].first;
  }
}

const std::string kText =
    "The quick brown fox jumps over the lazy dog.\n%\nPack my box with five dozen liquor jugs.\n%\n";

}  // namespace

// ---------------------------------------------------------------- layout
TEST(GPT, StateDictKeysAndShapes) {
  struct Row {
    const char* norm;
    bool bias;
  };
  for (const Row& row :
       {Row{"layernorm", true}, Row{"layernorm", false}, Row{"rmsnorm", true}, Row{"rmsnorm", false}}) {
    SCOPED_TRACE(std::string(row.norm) + (row.bias ? " with bias" : " without bias"));
    models::GPT model(tiny_config(row.norm, row.bias));
    const bool norm_bias = row.bias && std::string(row.norm) == "layernorm";
    std::vector<std::pair<std::string, nc::Shape>> expected = {{"tok_emb.weight", {256, 16}},
                                                               {"pos_emb.weight", {8, 16}}};
    auto add = [&](const std::string& name, nc::Shape shape, bool present = true) {
      if (present) expected.emplace_back(name, shape);
    };
    for (int i = 0; i < 2; ++i) {
      const std::string b = "blocks." + std::to_string(i) + ".";
      add(b + "norm1.weight", {16});
      add(b + "norm1.bias", {16}, norm_bias);
      add(b + "attn.qkv.weight", {48, 16});
      add(b + "attn.qkv.bias", {48}, row.bias);
      add(b + "attn.proj.weight", {16, 16});
      add(b + "attn.proj.bias", {16}, row.bias);
      add(b + "norm2.weight", {16});
      add(b + "norm2.bias", {16}, norm_bias);
      add(b + "mlp.fc.weight", {64, 16});
      add(b + "mlp.fc.bias", {64}, row.bias);
      add(b + "mlp.proj.weight", {16, 64});
      add(b + "mlp.proj.bias", {16}, row.bias);
    }
    add("norm_f.weight", {16});
    add("norm_f.bias", {16}, norm_bias);
    const auto state = model.state_dict();
    ASSERT_EQ(state.size(), expected.size());
    int64_t count = 0;
    for (size_t i = 0; i < state.size(); ++i) {
      EXPECT_EQ(state[i].first, expected[i].first);
      EXPECT_EQ(state[i].second.shape(), expected[i].second) << state[i].first;
      count += state[i].second.numel();
    }
    EXPECT_EQ(model.parameter_count(), count);
  }
}

TEST(GPT, Gpt2Initialization) {
  models::GPTConfig c = tiny_config();
  c.embed = 64;
  c.heads = 4;
  c.layers = 8;
  nc::Generator gen(3);
  models::GPT model(c, &gen);
  auto stddev = [](const nc::Tensor& t) { return std::sqrt(nc::var(t).item<double>()); };
  const double residual = 0.02 / std::sqrt(16.0);
  for (const auto& [name, t] : model.named_parameters()) {
    SCOPED_TRACE(name);
    if (name.find("norm") != std::string::npos) {
      EXPECT_EQ(nc::sum(t).item<double>(), name.find("weight") != std::string::npos ? t.numel() : 0);
    } else if (name.find(".bias") != std::string::npos) {
      EXPECT_EQ(nc::max(nc::abs(t)).item<float>(), 0.0f);
    } else if (name.find(".proj.weight") != std::string::npos) {
      EXPECT_NEAR(stddev(t), residual, 0.1 * residual);
    } else {
      EXPECT_NEAR(stddev(t), 0.02, 0.002);
    }
  }
  // The same seed gives the same weights.
  nc::Generator again(3);
  models::GPT twin(c, &again);
  expect_same_state(model, twin);
}

// GPT-2's sizes, counted as llm.c and Hugging Face count them: 124,475,904 parameters for
// "gpt2" with the embedding padded to 50304 rows (llm.c's figure), 124,439,808 without
// (Hugging Face's), and so on up.
TEST(GPT, Gpt2PresetsHaveGpt2sParameterCounts) {
  const std::map<std::string, int64_t> unpadded = {
      {"gpt2", 124439808}, {"gpt2-medium", 354823168}, {"gpt2-large", 774030080}, {"gpt2-xl", 1557611200}};
  for (const auto& [name, count] : unpadded) {
    SCOPED_TRACE(name);
    models::GPTConfig c = models::gpt2_config(name);
    EXPECT_EQ(c.vocab_size, 50257);
    EXPECT_EQ(c.padded_vocab_size(), 50304);
    EXPECT_EQ(c.context, 1024);
    EXPECT_EQ(models::parameter_count(c), count + 47 * c.embed);  // the 47 padded rows
    c.vocab_multiple = 1;
    EXPECT_EQ(models::parameter_count(c), count);
  }
  EXPECT_EQ(models::parameter_count(models::gpt2_config("gpt2")), 124475904);
  throws<nc::ValueError>([] { models::gpt2_config("gpt3"); }, {"gpt2_config", "'gpt3'", "gpt2-medium"})();
}

// A vocabulary padded to a multiple: the embedding has the padded rows, the logits do not,
// and the padded rows get no gradient.
TEST(GPT, PaddedVocabularyIsNeverInTheLogits) {
  models::GPTConfig c = tiny_config();
  c.vocab_size = 13;
  c.vocab_multiple = 8;
  models::GPT model(c);
  EXPECT_EQ(model.tok_emb->weight.shape(), (nc::Shape{16, 16}));
  EXPECT_EQ(model.parameter_count(), models::parameter_count(c));
  const nc::Tensor tokens = nc::from_vector<int64_t>({1, 12, 0, 5, 7, 3}, {2, 3});
  const nc::Tensor logits = model(tokens);
  EXPECT_EQ(logits.shape(), (nc::Shape{2, 3, 13}));
  models::lm_loss(model, tokens, nc::from_vector<int64_t>({12, 0, 5, 7, 3, 1}, {2, 3})).backward();
  const nc::Tensor grad = model.tok_emb->weight.grad();
  EXPECT_EQ(nc::sum(nc::abs(grad.narrow(0, 13, 3))).item<float>(), 0.0f) << "the padded rows";
  EXPECT_GT(nc::sum(nc::abs(grad.narrow(0, 0, 13))).item<float>(), 0.0f);
  throws<nc::ValueError>(
      [&] {
        c.vocab_multiple = 0;
        models::GPT bad(c);
      },
      {"vocab_multiple", "got 0"})();
}

TEST(GPT, ForwardShapeAndErrors) {
  models::GPT model(tiny_config());
  const nc::Tensor logits = model(nc::zeros({3, 5}, nc::DType::I64));
  EXPECT_EQ(logits.shape(), (nc::Shape{3, 5, 256}));
  const std::vector<std::pair<const char*, std::function<void()>>> cases = {
      {"rank", throws<nc::ShapeError>(
                   [&] {
                     model(nc::zeros({2, 3, 4}, nc::DType::I64));
                   },
                   {"GPT", "[B, T]"})},
      {"too long", throws<nc::ShapeError>(
                       [&] {
                         model(nc::zeros({1, 9}, nc::DType::I64));
                       },
                       {"context of 8"})},
      {"token range", throws<nc::IndexError>(
                          [&] {
                            model(nc::full({1, 2}, 300));
                          },
                          {"300"})},
      {"float tokens", throws<nc::DTypeError>(
                           [&] {
                             model(nc::zeros({1, 2}));
                           },
                           {"i32 or i64"})},
      {"heads", throws<nc::ValueError>([&] { nc::nn::CausalSelfAttention(10, 3); }, {"not divisible"})},
      {"norm", throws<nc::ValueError>([&] { models::GPT(tiny_config("batchnorm")); }, {"rmsnorm"})},
  };
  for (const auto& [name, check] : cases) {
    SCOPED_TRACE(name);
    check();
  }
}

// ---------------------------------------------------------------- KV cache
TEST(GPT, KVCacheDecodingMatchesFullForward) {
  for (const nc::Device& device : devices()) {
    for (const char* norm : {"layernorm", "rmsnorm"}) {
      SCOPED_TRACE(device.str() + " " + norm);
      nc::Generator gen(11);
      models::GPT model(tiny_config(norm), &gen);
      model.to(device);
      model.eval();
      nc::autograd::NoGradGuard no_grad;
      const nc::Tensor tokens = nc::randint(0, 256, {2, 8}, nc::TensorOptions(nc::DType::I64, device), &gen);
      const nc::Tensor full = model(tokens);
      for (int64_t prefill : {1, 3, 8}) {
        models::GPTCache cache = model.make_cache(2);
        std::vector<nc::Tensor> pieces{model.forward(tokens.narrow(1, 0, prefill), cache)};
        for (int64_t t = prefill; t < 8; ++t) pieces.push_back(model.forward(tokens.narrow(1, t, 1), cache));
        EXPECT_EQ(cache.length(), 8);
        EXPECT_LT(max_abs_diff(nc::cat(pieces, 1), full), 1e-5) << "prefill " << prefill;
      }
    }
  }
}

TEST(GPT, DecodingAtDevicePositionsMatchesTheFullForward) {
  for (const nc::Device& device : devices()) {
    SCOPED_TRACE(device.str());
    nc::Generator gen(12);
    models::GPT model(tiny_config(), &gen);
    model.to(device);
    model.eval();
    nc::autograd::NoGradGuard no_grad;
    const nc::TensorOptions i64(nc::DType::I64, device);
    const nc::Tensor tokens = nc::randint(0, 256, {2, 8}, i64, &gen);
    const nc::Tensor full = model(tokens);
    models::GPTCache cache = model.make_cache(2);
    // The prefill's head on its last position only.
    const nc::Tensor last = model.prefill(tokens.narrow(1, 0, 3), cache);
    ASSERT_EQ(last.shape(), (nc::Shape{2, 1, 256}));
    EXPECT_LT(max_abs_diff(last, full.narrow(1, 2, 1)), 1e-5);
    EXPECT_EQ(cache.length(), 3);
    for (int64_t t = 3; t < 8; ++t) {
      const nc::Tensor positions = nc::full({2}, t, i64);
      const nc::Tensor logits = model.decode(tokens.narrow(1, t, 1), positions, cache);
      EXPECT_LT(max_abs_diff(logits, full.narrow(1, t, 1)), 1e-5) << "position " << t;
    }
    EXPECT_EQ(cache.length(), 3);  // decode leaves the count to its caller
    cache.set_length(8);
    EXPECT_EQ(cache.length(), 8);
    EXPECT_THROW(cache.set_length(9), nc::ValueError);
    EXPECT_THROW(model.decode(tokens.narrow(1, 0, 2), nc::full({2}, 0, i64), cache), nc::ShapeError);
    EXPECT_THROW(model.decode(tokens.narrow(1, 0, 1), nc::full({1}, 0, i64), cache), nc::ShapeError);
    // A position past the context: an IndexError (on a GPU at the next wait).
    EXPECT_THROW(
        {
          model.decode(tokens.narrow(1, 0, 1), nc::full({2}, 8, i64), cache);
          nc::cuda::synchronize();
        },
        nc::IndexError);
  }
}

TEST(GPT, GraphedDecodingGivesTheTokensOfTheDirectOne) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  nc::Generator gen(4);
  models::GPTConfig config = tiny_config();
  config.context = 64;
  models::GPT model(config, &gen);
  model.to(nc::Device::cuda());
  const std::vector<int64_t> prompt{5, 6, 7};
  for (const models::GenerateOptions& options :
       {models::GenerateOptions{0.0, 0, 0}, models::GenerateOptions{0.9, 40, 17, 0.95}}) {
    models::GenerateOptions direct = options, graphed = options;
    direct.cuda_graph = false;
    graphed.cuda_graph = true;
    // 70 tokens: 61 decoding steps, then prefills once the cache is full.
    const std::vector<int64_t> a = models::generate_tokens(model, prompt, 70, direct);
    const std::vector<int64_t> b = models::generate_tokens(model, prompt, 70, graphed);
    EXPECT_EQ(a, b) << "temperature " << options.temperature;
    EXPECT_EQ(a.size(), 70u);
  }
}

TEST(GPT, KVCacheRefusesWhatItCannotDo) {
  models::GPT model(tiny_config());
  nc::nn::CausalSelfAttention& attn = *model.blocks[0]->attn;
  const nc::Tensor x = nc::zeros({1, 3, 16});
  const std::vector<std::pair<const char*, std::function<void()>>> cases = {
      {"training", throws<nc::Error>(
                       [&] {
                         nc::nn::KVCache cache = attn.make_cache(1, 8);
                         attn.forward(x, cache);
                       },
                       {"eval mode"})},
      {"multi-token step", throws<nc::ValueError>(
                               [&] {
                                 model.eval();
                                 nc::nn::KVCache cache = attn.make_cache(1, 8);
                                 attn.forward(x, cache);
                                 attn.forward(x, cache);
                               },
                               {"one token per step", "holding 3"})},
      {"overflow", throws<nc::ValueError>(
                       [&] {
                         model.eval();
                         nc::nn::KVCache cache = attn.make_cache(1, 3);
                         attn.forward(x, cache);
                         attn.forward(nc::zeros({1, 1, 16}), cache);
                       },
                       {"holds 3 positions", "do not fit"})},
      {"batch", throws<nc::ShapeError>(
                    [&] {
                      model.eval();
                      nc::nn::KVCache cache = attn.make_cache(2, 8);
                      attn.forward(x, cache);
                    },
                    {"KV cache must be [1, 2, 8, 8]"})},
      {"past the context", throws<nc::ShapeError>(
                               [&] {
                                 model.eval();
                                 models::GPTCache cache = model.make_cache(1);
                                 model.forward(nc::zeros({1, 8}, nc::DType::I64), cache);
                                 model.forward(nc::zeros({1, 1}, nc::DType::I64), cache);
                               },
                               {"9 positions exceed the model's context of 8"})},
  };
  for (const auto& [name, check] : cases) {
    SCOPED_TRACE(name);
    check();
  }
}

// ---------------------------------------------------------------- training and generation
TEST(GPT, TrainingReducesTheLoss) {
  models::GPTConfig c = tiny_config();
  c.context = 16;
  nc::Generator gen(5);
  models::GPT model(c, &gen);
  nc::optim::AdamW optimizer(model.parameters(), nc::optim::AdamWOptions{3e-3, 0.9, 0.95, 1e-8, 0.1});
  std::string text;
  for (int i = 0; i < 20; ++i) text += kText;
  const double before = models::evaluate_lm(model, text, 16, 8, nc::Device::cpu());
  EXPECT_NEAR(before, std::log(256.0), 0.2);  // small initial weights: close to uniform
  for (int step = 0; step < 60; ++step) {
    const models::TextBatch batch = models::random_windows(text, 8, c.context, gen, nc::Device::cpu());
    nc::Tensor loss = models::lm_loss(model, batch.inputs, batch.targets);
    optimizer.zero_grad();
    loss.backward();
    nc::optim::clip_grad_norm(optimizer.params(), 1.0);
    optimizer.step();
  }
  const double after = models::evaluate_lm(model, text, 16, 8, nc::Device::cpu());
  EXPECT_TRUE(model.is_training());
  EXPECT_LT(after, 0.6 * before) << "before " << before << " after " << after;
}

TEST(GPT, GreedyGenerationIsTheArgmaxOfTheFullForward) {
  for (const nc::Device& device : devices()) {
    SCOPED_TRACE(device.str());
    nc::Generator gen(2);
    models::GPT model(tiny_config(), &gen);
    model.to(device);
    // 5 prompt bytes and 12 new ones: past the context of 8, so the window slides.
    std::string streamed;
    const std::string text =
        models::generate_text(model, "hello", 12, {0.0, 0, 0}, [&](const std::string& piece) { streamed += piece; });
    EXPECT_EQ(text.size(), 12u);
    EXPECT_EQ(streamed, text);
    EXPECT_TRUE(model.is_training());
    model.eval();
    nc::autograd::NoGradGuard no_grad;
    std::string history = "hello", expected;
    for (int i = 0; i < 12; ++i) {
      const std::string window = history.substr(history.size() > 8 ? history.size() - 8 : 0);
      const nc::Tensor logits = model(tokens_of(window, device));
      const auto next = static_cast<char>(nc::argmax(logits.select(0, 0).select(0, -1)).item<int64_t>());
      expected += next;
      history += next;
    }
    EXPECT_EQ(text, expected);
  }
}

TEST(GPT, SamplingIsDeterministicForASeed) {
  nc::Generator gen(4);
  models::GPT model(tiny_config(), &gen);
  const models::GenerateOptions options{1.0, 0, 17};
  const std::string a = models::generate_text(model, "", 20, options);
  EXPECT_EQ(a, models::generate_text(model, "", 20, options));
  EXPECT_NE(a, models::generate_text(model, "", 20, {1.0, 0, 18}));
  // top_k 1 is greedy.
  EXPECT_EQ(models::generate_text(model, "ab", 10, {1.0, 1, 5}), models::generate_text(model, "ab", 10, {0.0, 0, 0}));
  EXPECT_EQ(models::generate_text(model, "ab", 0, options), "");
  throws<nc::ValueError>([&] { models::generate_text(model, "a", 3, {-1.0, 0, 0}); }, {"temperature"})();
}

TEST(GPT, TopPSamplesFromTheNucleus) {
  nc::Generator gen(5);
  models::GPT model(tiny_config(), &gen);
  // top_p 1 is no cut; a top_p below every probability keeps the most likely alone: greedy.
  EXPECT_EQ(models::generate_text(model, "ab", 12, {1.0, 0, 3, 1.0}),
            models::generate_text(model, "ab", 12, {1.0, 0, 3}));
  EXPECT_EQ(models::generate_text(model, "ab", 12, {2.0, 0, 3, 1e-9}),
            models::generate_text(model, "ab", 12, {0.0, 0, 0}));
  // At top_p 0.5 every byte drawn is in its step's nucleus: the fewest most likely bytes of
  // softmax(logits / T) that reach 0.5, recomputed from a full forward of the history.
  const double temperature = 1.5, top_p = 0.5;
  const std::string prompt = "The quick";
  const std::string text = models::generate_text(model, prompt, 20, {temperature, 0, 11, top_p});
  model.eval();
  nc::autograd::NoGradGuard no_grad;
  std::string history = prompt;
  int64_t outside_greedy = 0;
  for (char c : text) {
    const std::string window = history.size() > 8 ? history.substr(history.size() - 8) : history;
    std::vector<int64_t> ids;
    for (unsigned char b : window) ids.push_back(b);
    const nc::Tensor logits = model(nc::from_vector<int64_t>(ids, {1, static_cast<int64_t>(ids.size())}));
    const std::vector<double> l =
        nc::div(logits.select(0, 0).select(0, -1), temperature).to(nc::DType::F64).to_vector<double>();
    std::vector<double> p(l.size());
    const double top = *std::max_element(l.begin(), l.end());
    double total = 0;
    for (size_t i = 0; i < l.size(); ++i) total += (p[i] = std::exp(l[i] - top));
    std::vector<size_t> order(p.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
    double kept = 0;
    std::vector<bool> nucleus(p.size(), false);
    for (size_t n = 0; n < order.size() && (n == 0 || kept < top_p * total); ++n) {
      nucleus[order[n]] = true;
      kept += p[order[n]];
    }
    const auto byte = static_cast<unsigned char>(c);
    EXPECT_TRUE(nucleus[byte]) << "byte " << int(byte) << " after '" << history << "'";
    if (byte != order[0]) ++outside_greedy;
    history += c;
  }
  EXPECT_GT(outside_greedy, 0);  // it did sample, not only take the most likely
  for (double bad : {0.0, -0.5, 1.5, std::nan("")})
    throws<nc::ValueError>([&] { models::generate_text(model, "a", 3, {1.0, 0, 0, bad}); }, {"top_p", "(0, 1]"})();
}

TEST(GPT, TokenGenerationOverALargerVocabulary) {
  models::GPTConfig c = tiny_config();
  c.vocab_size = 1000;
  c.vocab_multiple = 128;
  nc::Generator gen(6);
  models::GPT model(c, &gen);
  std::vector<int64_t> streamed;
  const std::vector<int64_t> ids =
      models::generate_tokens(model, {999, 3, 512}, 10, {0.0, 0, 0}, [&](int64_t id) { streamed.push_back(id); });
  EXPECT_EQ(ids.size(), 10u);
  EXPECT_EQ(streamed, ids);
  model.eval();
  nc::autograd::NoGradGuard no_grad;
  std::vector<int64_t> history{999, 3, 512};
  for (int64_t id : ids) {
    const std::vector<int64_t> window(history.size() > 8 ? history.end() - 8 : history.begin(), history.end());
    const nc::Tensor logits = model(nc::from_vector<int64_t>(window, {1, static_cast<int64_t>(window.size())}));
    ASSERT_EQ(logits.size(2), 1000);  // the padded rows are never scores
    EXPECT_EQ(id, nc::argmax(logits.select(0, 0).select(0, -1)).item<int64_t>());
    history.push_back(id);
  }
  throws<nc::IndexError>([&] { models::generate_tokens(model, {5, 1000}, 1, {}); }, {"generate_tokens", "1000"})();
  throws<nc::ValueError>([&] { models::generate_tokens(model, {}, 1, {}); }, {"generate_tokens", "empty"})();
}

// ---------------------------------------------------------------- checkpoints
class GPTCheckpoint : public TempDirTest {};

TEST_F(GPTCheckpoint, RoundTrip) {
  models::GPTConfig c = tiny_config("rmsnorm", false);
  c.dropout = 0.25;
  nc::Generator gen(9);
  models::GPT model(c, &gen);
  const std::string path = (dir_ / "gpt.safetensors").string();
  models::save_gpt_checkpoint(path, model, 42, {}, {}, {{"lr", "0.001"}});
  models::GPTCheckpoint loaded = models::load_gpt_checkpoint(path);
  EXPECT_EQ(loaded.step, 42);
  EXPECT_EQ(loaded.metadata.at("option.lr"), "0.001");
  EXPECT_EQ(loaded.model->config.norm, "rmsnorm");
  EXPECT_FALSE(loaded.model->config.bias);
  EXPECT_EQ(loaded.model->config.dropout, 0.25);
  EXPECT_EQ(loaded.model->config.context, 8);
  expect_same_state(model, *loaded.model);
  EXPECT_TRUE(loaded.optimizer_state.empty());

  models::TextGenerator generator(path);
  EXPECT_EQ(generator.generate("abc", 6, {0.0, 0, 0}), models::generate_text(model, "abc", 6, {0.0, 0, 0}));

  const std::string other = (dir_ / "other.safetensors").string();
  nc::safetensors::save(other, {{"w", nc::zeros({2})}}, {});
  throws<nc::IOError>([&] { models::load_gpt_checkpoint(other); }, {"not a normcore GPT checkpoint", "format"})();
}

// The vocabulary's padding is in the checkpoint; one written before it existed loads
// without padding.
TEST_F(GPTCheckpoint, VocabularyPaddingRoundTripsAndOldFilesHaveNone) {
  models::GPTConfig c = tiny_config();
  c.vocab_size = 13;
  c.vocab_multiple = 8;
  const models::GPT model(c);
  const std::string path = (dir_ / "padded.safetensors").string();
  models::save_gpt_checkpoint(path, model, 1, {}, {}, {});
  const models::GPTCheckpoint loaded = models::load_gpt_checkpoint(path);
  EXPECT_EQ(loaded.model->config.vocab_multiple, 8);
  expect_same_state(model, *loaded.model);

  const models::GPT plain(tiny_config());
  models::save_gpt_checkpoint(path, plain, 1, {}, {}, {});
  nc::safetensors::File file = nc::safetensors::load(path);
  file.metadata.erase("config.vocab_multiple");
  nc::safetensors::save(path, file.tensors, file.metadata);
  EXPECT_EQ(models::load_gpt_checkpoint(path).model->config.vocab_multiple, 1);
}

TEST_F(GPTCheckpoint, EveryNormAndBiasLayoutLoads) {
  for (const char* norm : {"layernorm", "rmsnorm"}) {
    for (bool bias : {true, false}) {
      SCOPED_TRACE(std::string(norm) + (bias ? " with" : " without") + " bias");
      const models::GPT model(tiny_config(norm, bias));
      const std::string path = (dir_ / "layout.safetensors").string();
      models::save_gpt_checkpoint(path, model, 1, {}, {}, {});
      expect_same_state(model, *models::load_gpt_checkpoint(path).model);
    }
  }
}

// A config in a checkpoint is read like the rest of the file: what is wrong with it is an
// IOError naming the file and the field, found before the model is built (a config that
// claims more than the file holds allocates nothing).
TEST_F(GPTCheckpoint, ABadConfigIsAnIOErrorNamingTheFileAndTheField) {
  const std::string good = (dir_ / "good.safetensors").string();
  models::save_gpt_checkpoint(good, models::GPT(tiny_config()), 1, {}, {}, {});
  const nc::safetensors::File file = nc::safetensors::load(good);
  struct Case {
    const char* field;
    const char* value;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {"config.heads", "3", {"config.embed 16 is not divisible by config.heads 3"}},
      {"config.dropout", "1.5", {"config.dropout must be in [0, 1), got 1.5"}},
      {"config.dropout", "nan", {"config.dropout must be in [0, 1)"}},
      {"config.norm", "batchnorm", {"config.norm must be 'layernorm' or 'rmsnorm', got 'batchnorm'"}},
      {"config.bias", "yes", {"malformed config.bias 'yes'"}},
      {"config.layers", "3", {"config.layers 3", "but its model tensors hold"}},
      {"config.embed", "4000000000", {"config.embed 4000000000", "more than 2^63 parameters"}},
      {"config.context", "9", {"config.context 9", "parameters, but"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.field) + " " + c.value);
    std::map<std::string, std::string> metadata = file.metadata;
    metadata[c.field] = c.value;
    const std::string bad = (dir_ / "bad.safetensors").string();
    nc::safetensors::save(bad, file.tensors, metadata);
    std::vector<std::string> fragments = c.fragments;
    fragments.push_back("load_gpt_checkpoint: " + bad);
    throws<nc::IOError>([&] { models::load_gpt_checkpoint(bad); }, fragments)();
  }
}

// The same steps straight through, or interrupted by a checkpoint and resumed, give the
// same parameters bit for bit (dropout on, so the generator's position matters).
TEST_F(GPTCheckpoint, ExactResume) {
  models::GPTConfig c = tiny_config();
  c.dropout = 0.1;
  std::string text;
  for (int i = 0; i < 10; ++i) text += kText;
  const std::string path = (dir_ / "resume.safetensors").string();
  // One generator draws the initialization, the batches and the dropout masks, as in train-lm.
  struct Run {
    nc::Generator gen{1};
    std::shared_ptr<models::GPT> model;
    std::unique_ptr<nc::optim::AdamW> optimizer;
    std::unique_ptr<nc::optim::CosineLR> schedule;
    void start(std::shared_ptr<models::GPT> m) {
      model = std::move(m);
      optimizer =
          std::make_unique<nc::optim::AdamW>(model->parameters(), nc::optim::AdamWOptions{1e-2, 0.9, 0.95, 1e-8, 0.1});
      schedule = std::make_unique<nc::optim::CosineLR>(*optimizer, 2, 6, 1e-3);
    }
    void steps(const std::string& text, int n) {
      for (int i = 0; i < n; ++i) {
        const models::TextBatch batch = models::random_windows(text, 4, model->config.context, gen, nc::Device::cpu());
        nc::Tensor loss = models::lm_loss(*model, batch.inputs, batch.targets);
        optimizer->zero_grad();
        loss.backward();
        nc::optim::clip_grad_norm(optimizer->params(), 1.0);
        optimizer->step();
        schedule->step();
      }
    }
  };
  Run straight;
  straight.start(std::make_shared<models::GPT>(c, &straight.gen));
  straight.steps(text, 6);

  Run first;
  first.start(std::make_shared<models::GPT>(c, &first.gen));
  first.steps(text, 3);
  models::save_gpt_checkpoint(path, *first.model, 3, first.optimizer->state_dict(), first.schedule->state_dict(),
                              {{"rng.offset", std::to_string(first.gen.offset())}});

  Run resumed;
  models::GPTCheckpoint saved = models::load_gpt_checkpoint(path, nc::Device::cpu(), &resumed.gen);
  resumed.gen.set_offset(std::stoull(saved.metadata.at("option.rng.offset")));
  resumed.start(saved.model);
  resumed.optimizer->load_state_dict(saved.optimizer_state);
  resumed.schedule->load_state_dict(saved.schedule_state);
  EXPECT_EQ(saved.step, 3);
  EXPECT_EQ(resumed.schedule->last_step(), 3);
  resumed.steps(text, 3);
  expect_same_state(*straight.model, *resumed.model);
  EXPECT_EQ(resumed.gen.offset(), straight.gen.offset());
  // Without restoring the generator the run differs: the check above can fail.
  Run careless;
  careless.start(models::load_gpt_checkpoint(path, nc::Device::cpu(), &careless.gen).model);
  careless.steps(text, 3);
  EXPECT_NE(careless.model->state_dict()[0].second.to_vector<float>(),
            straight.model->state_dict()[0].second.to_vector<float>());
}

// ---------------------------------------------------------------- text
TEST(Text, SplitFortunes) {
  const std::vector<std::string> fortunes = models::split_fortunes("one\ntwo\n%\n\n%\nthree\n%\n  \n%\nfour");
  EXPECT_EQ(fortunes, (std::vector<std::string>{"one\ntwo\n", "three\n", "four\n"}));
  EXPECT_TRUE(models::split_fortunes("%\n%\n").empty());
  // A line that merely starts with '%' belongs to the fortune.
  EXPECT_EQ(models::split_fortunes("100%\n%%\n"), (std::vector<std::string>{"100%\n%%\n"}));
}

class TextCorpus : public TempDirTest {};

TEST_F(TextCorpus, SplitIsFixedAndDisjoint) {
  // Two fortune files of 13 and 12 fortunes, plus what the reader must skip: an index, a
  // ".u8" link and a subfolder.
  auto write = [&](const std::string& name, int first, int count) {
    std::ofstream out(dir_ / name);
    for (int i = first; i < first + count; ++i) out << "fortune number " << i << "\nsecond line\n%\n";
  };
  write("b-file", 13, 12);
  write("a-file", 0, 13);
  write("a-file.dat", 100, 5);
  std::filesystem::create_symlink(dir_ / "a-file", dir_ / "a-file.u8");
  std::filesystem::create_symlink(dir_ / "b-file", dir_ / "linked");
  std::filesystem::create_directories(dir_ / "sub");
  const std::vector<std::string> files = models::fortune_files(dir_.string());
  EXPECT_EQ(files, (std::vector<std::string>{(dir_ / "a-file").string(), (dir_ / "b-file").string()}));

  const models::TextCorpus corpus = models::load_fortunes(dir_.string());
  EXPECT_EQ(corpus.train_fortunes, 23);
  EXPECT_EQ(corpus.validation_fortunes, 2);
  // Fortunes 9 and 19 in file order (a-file's 0-12, then b-file's 13-24).
  EXPECT_EQ(corpus.validation, "fortune number 9\nsecond line\n%\nfortune number 19\nsecond line\n%\n");
  const std::vector<std::string> train_fortunes = models::split_fortunes(corpus.train);
  const std::set<std::string> train(train_fortunes.begin(), train_fortunes.end());
  EXPECT_EQ(train.size(), 23u);
  for (const std::string& f : models::split_fortunes(corpus.validation)) EXPECT_EQ(train.count(f), 0u) << f;

  const models::TextCorpus again = models::load_fortunes(dir_.string());
  EXPECT_EQ(again.train, corpus.train);
  EXPECT_EQ(again.validation, corpus.validation);
  // A single file is read on its own.
  EXPECT_EQ(models::load_fortunes((dir_ / "a-file").string()).validation_fortunes, 1);
  throws<nc::IOError>([&] { models::load_fortunes((dir_ / "missing").string()); }, {"does not exist"})();
  throws<nc::IOError>([&] { models::fortune_files((dir_ / "sub").string()); }, {"no fortune files"})();
}

TEST(Text, DebianFortunes) {
  if (!std::filesystem::exists(models::kFortunesDir)) GTEST_SKIP() << "no " << models::kFortunesDir;
  const models::TextCorpus corpus = models::load_fortunes();
  for (const std::string& f : corpus.files)
    EXPECT_EQ(std::filesystem::path(f).filename().string().find('.'), std::string::npos);
  const int64_t total = corpus.train_fortunes + corpus.validation_fortunes;
  EXPECT_GT(total, 10000);
  EXPECT_EQ(corpus.validation_fortunes, total / 10);
  EXPECT_EQ(static_cast<int64_t>(models::split_fortunes(corpus.validation).size()), corpus.validation_fortunes);
}

TEST(Text, Windows) {
  const std::string stream = "0123456789abcdef";
  nc::Generator a(7), b(7);
  const models::TextBatch x = models::random_windows(stream, 5, 4, a, nc::Device::cpu());
  const models::TextBatch y = models::random_windows(stream, 5, 4, b, nc::Device::cpu());
  EXPECT_EQ(x.inputs.shape(), (nc::Shape{5, 4}));
  EXPECT_EQ(x.inputs.to_vector<int64_t>(), y.inputs.to_vector<int64_t>());
  EXPECT_EQ(a.offset(), b.offset());
  const std::vector<int64_t> in = x.inputs.to_vector<int64_t>(), target = x.targets.to_vector<int64_t>();
  for (size_t row = 0; row < 5; ++row) {
    const size_t start = stream.find(static_cast<char>(in[row * 4]));
    for (size_t t = 0; t < 4; ++t) {
      EXPECT_EQ(in[row * 4 + t], stream[start + t]);
      EXPECT_EQ(target[row * 4 + t], stream[start + t + 1]);
    }
  }
  const models::TextBatch spaced = models::spaced_windows(stream, 3, 4, nc::Device::cpu());
  EXPECT_EQ(spaced.inputs.select(0, 0).to_vector<int64_t>(), (std::vector<int64_t>{'0', '1', '2', '3'}));
  EXPECT_EQ(spaced.targets.select(0, 2).to_vector<int64_t>(), (std::vector<int64_t>{'c', 'd', 'e', 'f'}));
  throws<nc::ValueError>([&] { models::random_windows("abc", 1, 3, a, nc::Device::cpu()); }, {"no window of 4"})();
}
