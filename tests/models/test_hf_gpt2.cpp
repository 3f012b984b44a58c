// Hugging Face GPT-2 checkpoints: save_hf_gpt2 writes GPT2LMHeadModel's names and Conv1D
// layout, load_hf_gpt2 reads them (and GPT2Model's, and 16-bit weights) back into a model
// with the same logits, and every malformed config or tensor is an error naming the file and
// the field; a checkpoint transformers wrote (tests/data/hf_gpt2_tiny) gives transformers'
// logits and greedy tokens. (Against transformers itself, several sizes: bench/gpu_check.sh's
// hfgpt2 section.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "normcore/normcore.h"
#include "tests/test_support.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;
using normcore_test::throws;

namespace {

nc::models::GPTConfig small_config() {
  nc::models::GPTConfig c;
  c.vocab_size = 300;
  c.context = 16;
  c.layers = 2;
  c.heads = 2;
  c.embed = 8;
  return c;
}

double max_difference(const Tensor& a, const Tensor& b) {
  return nc::max(nc::abs(nc::sub(a.to(DType::F64), b.to(DType::F64)))).item<double>();
}

class HfGpt2 : public normcore_test::TempDirTest {
 protected:
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // The saved config.json, edited, written back.
  void edit_config(const std::function<void(nlohmann::json&)>& edit) const {
    nlohmann::json config;
    std::ifstream(path("config.json")) >> config;
    edit(config);
    std::ofstream(path("config.json"), std::ios::trunc) << config.dump();
  }
  // The saved tensors, edited, written back.
  void edit_weights(const std::function<void(nc::safetensors::TensorList&)>& edit) const {
    nc::safetensors::File file = nc::safetensors::load(path("model.safetensors"));
    edit(file.tensors);
    nc::safetensors::save(path("model.safetensors"), file.tensors);
  }
};

TEST_F(HfGpt2, RoundTripKeepsTheLogits) {
  nc::Generator gen(1);
  nc::models::GPT model(small_config(), &gen);
  model.eval();
  nc::models::save_hf_gpt2(model, dir_.string());
  const auto loaded = nc::models::load_hf_gpt2(dir_.string());
  EXPECT_EQ(loaded->config.vocab_size, 300);
  EXPECT_EQ(loaded->config.padded_vocab_size(), 384);
  const Tensor tokens = nc::randint(0, 300, {2, 16}, DType::I64, &gen);
  const Tensor expected = model(tokens), got = (*loaded)(tokens);
  ASSERT_EQ(got.shape(), expected.shape());
  EXPECT_LT(max_difference(got, expected), 1e-5);
}

TEST_F(HfGpt2, WritesTransformersNamesAndConv1dLayout) {
  nc::Generator gen(2);
  nc::models::GPT model(small_config(), &gen);
  nc::models::save_hf_gpt2(model, dir_.string());
  const nc::safetensors::File file = nc::safetensors::load(path("model.safetensors"));
  EXPECT_EQ(file.at("transformer.wte.weight").shape(), (nc::Shape{300, 8}));
  EXPECT_EQ(file.at("transformer.wpe.weight").shape(), (nc::Shape{16, 8}));
  const Tensor c_attn = file.at("transformer.h.1.attn.c_attn.weight");
  EXPECT_EQ(c_attn.shape(), (nc::Shape{8, 24}));
  EXPECT_EQ(max_difference(c_attn, model.blocks[1]->attn->qkv->weight.t()), 0.0);
  EXPECT_EQ(file.at("transformer.h.0.mlp.c_proj.weight").shape(), (nc::Shape{32, 8}));
  EXPECT_EQ(max_difference(file.at("transformer.ln_f.bias"), model.state_dict().back().second), 0.0);
  nlohmann::json config;
  std::ifstream(path("config.json")) >> config;
  EXPECT_EQ(config["model_type"], "gpt2");
  EXPECT_EQ(config["n_embd"], 8);
  EXPECT_EQ(config["n_layer"], 2);
  EXPECT_EQ(config["activation_function"], "gelu_new");
}

TEST_F(HfGpt2, ReadsGpt2ModelNamesAndSixteenBitWeights) {
  nc::Generator gen(3);
  nc::models::GPT model(small_config(), &gen);
  model.eval();
  nc::models::save_hf_gpt2(model, dir_.string());
  const Tensor tokens = nc::randint(0, 300, {1, 9}, DType::I64, &gen);
  const Tensor expected = model(tokens);
  // GPT2Model's names have no "transformer." prefix; weights in bf16.
  edit_weights([](nc::safetensors::TensorList& tensors) {
    for (auto& [name, t] : tensors) {
      name = name.substr(12);
      t = t.to(DType::BF16);
    }
  });
  const Tensor got = (*nc::models::load_hf_gpt2(dir_.string()))(tokens);
  EXPECT_GT(max_difference(got, expected), 0.0);  // the weights were rounded
  EXPECT_LT(max_difference(got, expected), 5e-2);
}

TEST_F(HfGpt2, ErrorsNameTheFileAndTheField) {
  using nc::models::load_hf_gpt2;
  const std::string dir = dir_.string();
  throws<nc::IOError>([&] { load_hf_gpt2(dir); }, {"config.json"})();
  nc::Generator gen(4);
  nc::models::save_hf_gpt2(nc::models::GPT(small_config(), &gen), dir);
  edit_config([](nlohmann::json& c) { c.erase("n_embd"); });
  throws<nc::IOError>([&] { load_hf_gpt2(dir); }, {"config.json", "\"n_embd\""})();
  edit_config([](nlohmann::json& c) { c["n_embd"] = -8; });
  throws<nc::IOError>([&] { load_hf_gpt2(dir); }, {"config.json", "\"n_embd\": -8"})();
  edit_config([](nlohmann::json& c) {
    c["n_embd"] = 8;
    c["activation_function"] = "gelu";
  });
  throws<nc::IOError>([&] { load_hf_gpt2(dir); }, {"config.json", "activation_function", "gelu"})();
  edit_config([](nlohmann::json& c) {
    c["activation_function"] = "gelu_new";
    c["n_layer"] = 3;  // the file holds two
  });
  throws<nc::IOError>([&] { load_hf_gpt2(dir); }, {"model.safetensors", "transformer.h.2.ln_1.weight", "3 layers"})();
  edit_config([](nlohmann::json& c) {
    c["n_layer"] = 2;
    c["model_type"] = "llama";
  });
  throws<nc::IOError>([&] { load_hf_gpt2(dir); }, {"config.json", "model_type", "llama"})();
  edit_config([](nlohmann::json& c) { c["model_type"] = "gpt2"; });
  edit_weights([](nc::safetensors::TensorList& tensors) {
    for (auto& [name, t] : tensors)
      if (name == "transformer.h.1.mlp.c_fc.weight") t = nc::zeros({32, 8});  // Linear's layout, not Conv1D's
  });
  throws<nc::ShapeError>([&] { load_hf_gpt2(dir); },
                         {"model.safetensors", "transformer.h.1.mlp.c_fc.weight", "[8, 32]"})();
  std::ofstream(path("config.json"), std::ios::trunc) << "{\"n_embd\": ";
  throws<nc::IOError>([&] { load_hf_gpt2(dir); }, {"config.json", "not valid JSON"})();
}

// A folder bench/hf_gpt2_reference.py wrote (transformers' save_pretrained and
// reference.safetensors: tokens, transformers' logits for them and its greedy continuation
// from the first row's first 8 tokens) against normcore on `device`: the logits match and
// the greedy continuation is the same. Returns the model loaded.
std::shared_ptr<nc::models::GPT> check_reference(const std::filesystem::path& folder, nc::Device device) {
  SCOPED_TRACE(folder.filename().string() + " on " + device.str());
  nc::autograd::NoGradGuard no_grad;
  const nc::safetensors::File reference = nc::safetensors::load((folder / "reference.safetensors").string());
  const Tensor tokens = reference.at("tokens"), expected = reference.at("logits");
  const std::vector<int64_t> greedy = reference.at("greedy").to_vector<int64_t>();
  const auto model = nc::models::load_hf_gpt2(folder.string(), device);
  const Tensor logits = (*model)(tokens.to(device)).to(nc::Device::cpu(), DType::F64);
  const Tensor want = expected.to(DType::F64);
  const double error = nc::norm(nc::sub(logits, want)).item<double>() / nc::norm(want).item<double>();
  EXPECT_LT(error, 1e-4) << "relative logits error";
  // Greedy decoding: the last position's argmax, appended.
  Tensor sequence = tokens.narrow(0, 0, 1).narrow(1, 0, 8).to(device);
  std::vector<int64_t> ours;
  for (size_t i = 0; i < greedy.size(); ++i) {
    const Tensor last = model->hidden_states(sequence).select(1, sequence.size(1) - 1);
    const Tensor scores = nc::matmul(last, model->tok_emb->weight.narrow(0, 0, model->config.vocab_size).t());
    const Tensor next = nc::max(scores, 1).second.view({1, 1});
    ours.push_back(next.item<int64_t>());
    sequence = nc::cat({sequence, next}, 1);
  }
  EXPECT_EQ(ours, greedy) << "greedy continuation";
  return model;
}

std::vector<nc::Device> every_device() {
  std::vector<nc::Device> devices{nc::Device::cpu()};
  if (nc::cuda_is_available()) devices.push_back(nc::Device::cuda());
  return devices;
}

// tests/data/hf_gpt2_tiny: a GPT2LMHeadModel transformers 5.17 saved (2 layers, width 32,
// the 256 byte values as vocabulary, every parameter drawn at random, LayerNorms and biases
// included; `bench/hf_gpt2_reference.py fixture`), with transformers' logits and greedy
// continuation. normcore reproduces both, and so does the copy save_hf_gpt2 writes of it.
TEST_F(HfGpt2, MatchesTransformersOnItsOwnCheckpoint) {
  const std::filesystem::path folder = std::filesystem::path(NORMCORE_TEST_DATA_DIR) / "hf_gpt2_tiny";
  for (nc::Device device : every_device()) {
    const auto model = check_reference(folder, device);
    if (!device.is_cpu()) continue;
    nc::models::save_hf_gpt2(*model, dir_.string());
    std::filesystem::copy_file(folder / "reference.safetensors", dir_ / "reference.safetensors");
    check_reference(dir_, device);
  }
}

// Against transformers itself: NORMCORE_HF_GPT2_DIR names the folder
// `bench/hf_gpt2_reference.py make` wrote (random GPT2LMHeadModels of three sizes); each
// model matches on the CPU and every GPU, and save_hf_gpt2 writes it back to
// <model>/resaved for the script's check step.
TEST(HfGpt2Reference, MatchesTransformers) {
  const char* root = std::getenv("NORMCORE_HF_GPT2_DIR");
  if (root == nullptr) GTEST_SKIP() << "NORMCORE_HF_GPT2_DIR is not set (bench/gpu_check.sh hfgpt2 sets it)";
  int models = 0;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    if (!std::filesystem::exists(entry.path() / "reference.safetensors")) continue;
    ++models;
    for (nc::Device device : every_device()) {
      const auto model = check_reference(entry.path(), device);
      if (device.is_cpu()) nc::models::save_hf_gpt2(*model, (entry.path() / "resaved").string());
    }
  }
  EXPECT_GT(models, 0) << "no reference.safetensors under " << root;
}

}  // namespace
