// Weights exchanged with PyTorch through safetensors. tests/data/pytorch_mlp.safetensors
// holds the state_dict of a PyTorch nn.Sequential laid out like normcore's "mlp" model,
// an input batch and PyTorch's logits for it (made by tests/data/make_pytorch_mlp.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "normcore/models.h"
#include "normcore/normcore.h"

namespace nc = normcore;

namespace {

const std::string kFile = std::string(NORMCORE_TEST_DATA_DIR) + "/pytorch_mlp.safetensors";

nc::nn::NamedTensors model_entries(const nc::safetensors::File& file) {
  nc::nn::NamedTensors out;
  for (const auto& [name, t] : file.tensors)
    if (name.rfind("io.", 0) != 0) out.emplace_back(name, t);
  return out;
}

}  // namespace

TEST(Interop, PyTorchStateDictLoadsAndReproducesItsLogits) {
  nc::safetensors::File file = nc::safetensors::load(kFile);
  auto model = nc::models::make_classifier("mlp");
  model->load_state_dict(model_entries(file));  // strict: every name must match
  model->eval();
  nc::autograd::NoGradGuard no_grad;
  nc::Tensor logits = (*model)(file.at("io.x"));
  std::vector<float> got = logits.to_vector<float>(), want = file.at("io.logits").to_vector<float>();
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(got.size(), 40u);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 + 1e-5 * std::fabs(want[i])) << i;
}

TEST(Interop, NormcoreStateDictHasPyTorchsNamesAndShapes) {
  nc::safetensors::File file = nc::safetensors::load(kFile);
  nc::nn::NamedTensors theirs = model_entries(file);
  nc::nn::NamedTensors ours = nc::models::make_classifier("mlp")->state_dict();
  ASSERT_EQ(ours.size(), theirs.size());
  for (const auto& [name, t] : ours) {
    auto it = std::find_if(theirs.begin(), theirs.end(), [&](const auto& e) { return e.first == name; });
    ASSERT_NE(it, theirs.end()) << name << " is not in PyTorch's state_dict";
    EXPECT_EQ(it->second.shape(), t.shape()) << name;
    EXPECT_EQ(it->second.dtype(), t.dtype()) << name;
  }
}

TEST(Interop, MisnamedPyTorchEntriesAreReportedByName) {
  nc::safetensors::File file = nc::safetensors::load(kFile);
  nc::nn::NamedTensors entries = model_entries(file);
  const std::string original = entries[0].first;
  entries[0].first = "fc1.weight";
  auto model = nc::models::make_classifier("mlp");
  try {
    model->load_state_dict(entries);
    FAIL() << "expected a ValueError";
  } catch (const nc::ValueError& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("fc1.weight"), std::string::npos) << message;
    EXPECT_NE(message.find(original), std::string::npos) << message;  // now missing
  }
}

// tests/data/pytorch_cnn.safetensors: PyTorch's nn.Sequential of the cnn-bn layers after one
// epoch of training (real BatchNorm running statistics), weights rounded to f16, with 8 test
// images and PyTorch's logits for them in evaluation mode (tests/data/make_pytorch_cnn.py).
TEST(Interop, PyTorchCnnLoadsAndReproducesItsLogits) {
  nc::safetensors::File file = nc::safetensors::load(std::string(NORMCORE_TEST_DATA_DIR) + "/pytorch_cnn.safetensors");
  auto model = nc::models::make_classifier("cnn-bn");
  model->load_state_dict(model_entries(file));  // strict: every name, running statistics included
  model->eval();
  nc::autograd::NoGradGuard no_grad;
  nc::Tensor logits = (*model)(file.at("io.x"));
  std::vector<float> got = logits.to_vector<float>(), want = file.at("io.logits").to_vector<float>();
  ASSERT_EQ(got.size(), 80u);
  ASSERT_EQ(want.size(), 80u);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4 + 1e-4 * std::fabs(want[i])) << i;
  // The running statistics were trained, not the initial zeros and ones.
  EXPECT_GT(nc::max(nc::abs(file.at("1.running_mean").to(nc::DType::F32))).item<double>(), 1e-3);
  EXPECT_EQ(file.at("1.num_batches_tracked").dtype(), nc::DType::I64);
  EXPECT_EQ(file.at("1.num_batches_tracked").dim(), 0);
  // cnn-gn has the same names but for the norms' buffers.
  nc::nn::NamedTensors gn = nc::models::make_classifier("cnn-gn")->state_dict();
  nc::nn::NamedTensors bn = model->state_dict();
  EXPECT_EQ(bn.size() - gn.size(), 3u * 4u);  // running_mean, running_var, num_batches_tracked per norm
}

// tests/data/pytorch_gpt.safetensors: the state_dict of bench/gpt_train_torch.py's GPT (2
// layers, 2 heads, embed 32, context 16, LayerNorm), tokens and PyTorch's logits in eval
// mode (tests/data/make_pytorch_gpt.py). PyTorch's weights load into models::GPT by name and
// give its logits; normcore's state_dict has exactly PyTorch's names and shapes, so a
// normcore checkpoint's model loads into the PyTorch module the same way.
TEST(Interop, PyTorchGptLoadsAndReproducesItsLogits) {
  nc::safetensors::File file = nc::safetensors::load(std::string(NORMCORE_TEST_DATA_DIR) + "/pytorch_gpt.safetensors");
  nc::models::GPTConfig config;
  config.context = 16;
  config.layers = 2;
  config.heads = 2;
  config.embed = 32;
  nc::models::GPT model(config);
  const nc::nn::NamedTensors theirs = model_entries(file);
  const nc::nn::NamedTensors ours = model.state_dict();
  ASSERT_EQ(ours.size(), theirs.size());
  for (const auto& [name, t] : ours) {
    auto it = std::find_if(theirs.begin(), theirs.end(), [&](const auto& e) { return e.first == name; });
    ASSERT_NE(it, theirs.end()) << name << " is not in PyTorch's state_dict";
    EXPECT_EQ(it->second.shape(), t.shape()) << name;
  }
  model.load_state_dict(theirs);  // strict
  model.eval();
  nc::autograd::NoGradGuard no_grad;
  nc::Tensor logits = model(file.at("io.tokens"));
  std::vector<float> got = logits.to_vector<float>(), want = file.at("io.logits").to_vector<float>();
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(got.size(), 2u * 16 * 256);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 + 1e-5 * std::fabs(want[i])) << i;
}
