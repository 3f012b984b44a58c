// torchvision's ResNets: parameter counts and state_dict names as torchvision has them,
// output shapes, eval-mode forward, save and load_resnet round trips and their errors. (Against
// torchvision itself: bench/gpu_check.sh's resnet section.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "normcore/models.h"
#include "normcore/normcore.h"
#include "tests/test_support.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;
using normcore_test::throws;

namespace {

int64_t parameters(const nc::nn::Module& model) {
  int64_t count = 0;
  for (const Tensor& p : model.parameters()) count += p.numel();
  return count;
}

TEST(ResNet, TorchvisionsParameterCountsAndNames) {
  // torchvision's figures for 1000 classes.
  const std::map<std::string, int64_t> counts = {
      {"resnet18", 11689512}, {"resnet34", 21797672}, {"resnet50", 25557032}, {"resnet101", 44549160}};
  for (const auto& [name, count] : counts) EXPECT_EQ(parameters(*nc::models::resnet(name)), count) << name;
  const auto model = nc::models::resnet("resnet50", 10);
  std::map<std::string, nc::Shape> state;
  for (const auto& [key, t] : model->state_dict()) state[key] = t.shape();
  EXPECT_EQ(state.at("conv1.weight"), (nc::Shape{64, 3, 7, 7}));
  EXPECT_EQ(state.at("bn1.running_var"), (nc::Shape{64}));
  EXPECT_EQ(state.at("bn1.num_batches_tracked"), (nc::Shape{}));
  EXPECT_EQ(state.at("layer1.0.conv3.weight"), (nc::Shape{256, 64, 1, 1}));
  EXPECT_EQ(state.at("layer2.0.conv2.weight"), (nc::Shape{128, 128, 3, 3}));
  EXPECT_EQ(state.at("layer2.0.downsample.0.weight"), (nc::Shape{512, 256, 1, 1}));
  EXPECT_EQ(state.at("layer4.2.bn3.running_mean"), (nc::Shape{2048}));
  EXPECT_EQ(state.at("fc.weight"), (nc::Shape{10, 2048}));
  EXPECT_EQ(state.count("layer1.1.downsample.0.weight"), 0u);
  EXPECT_EQ(state.size(), 320u);  // torchvision's resnet50 state_dict has 320 entries
}

class ResNetFiles : public normcore_test::TempDirTest {};

TEST_F(ResNetFiles, SavedWeightsLoadBackWithTheSameLogits) {
  nc::Generator gen(1);
  const auto model = nc::models::resnet("resnet18", 7, &gen);
  model->eval();
  const Tensor images = nc::randn({2, 3, 64, 48}, DType::F32, &gen);
  const Tensor expected = (*model)(images);
  EXPECT_EQ(expected.shape(), (nc::Shape{2, 7}));
  const std::string path = (dir_ / "resnet18.safetensors").string();
  model->save(path);
  const auto loaded = nc::models::load_resnet("resnet18", path);
  const Tensor got = (*loaded)(images);
  EXPECT_EQ(nc::max(nc::abs(nc::sub(got, expected))).item<double>(), 0.0);
  // Errors name the file: another ResNet's weights, a file without fc.weight, a bad name.
  throws<nc::Error>([&] { nc::models::load_resnet("resnet34", path); },
                    {"load_resnet", path, "resnet34", "layer1.2"})();
  throws<nc::ValueError>([&] { nc::models::resnet("resnet19"); }, {"resnet19", "resnet18, resnet34"})();
  throws<nc::ShapeError>([&] { (*loaded)(nc::zeros({1, 1, 32, 32})); }, {"ResNet", "[N, 3, H, W]", "[1, 1, 32, 32]"})();
  nc::safetensors::save(path, {{"conv1.weight", nc::zeros({64, 3, 7, 7})}});
  throws<nc::IOError>([&] { nc::models::load_resnet("resnet18", path); }, {"load_resnet", path, "fc.weight"})();
}

// Against torchvision: NORMCORE_RESNET_DIR names the folder bench/resnet_reference.py wrote
// (<name>.safetensors: a torchvision state_dict of random weights with trained-like batch
// statistics; <name>.reference.safetensors: images and torchvision's eval-mode logits).
TEST(ResNetReference, MatchesTorchvision) {
  const char* root = std::getenv("NORMCORE_RESNET_DIR");
  if (root == nullptr) GTEST_SKIP() << "NORMCORE_RESNET_DIR is not set (bench/gpu_check.sh resnet sets it)";
  std::vector<nc::Device> devices{nc::Device::cpu()};
  if (nc::cuda_is_available()) devices.push_back(nc::Device::cuda());
  nc::autograd::NoGradGuard no_grad;
  int checked = 0;
  for (const std::string name : {"resnet18", "resnet34", "resnet50", "resnet101"}) {
    const std::filesystem::path weights = std::filesystem::path(root) / (name + ".safetensors");
    if (!std::filesystem::exists(weights)) continue;
    const nc::safetensors::File reference =
        nc::safetensors::load((std::filesystem::path(root) / (name + ".reference.safetensors")).string());
    for (nc::Device device : devices) {
      SCOPED_TRACE(name + " on " + device.str());
      const auto model = nc::models::load_resnet(name, weights.string(), device);
      const Tensor logits = (*model)(reference.at("images").to(device)).to(nc::Device::cpu(), DType::F64);
      const Tensor want = reference.at("logits").to(DType::F64);
      const double error = nc::norm(nc::sub(logits, want)).item<double>() / nc::norm(want).item<double>();
      EXPECT_LT(error, 1e-4) << "relative logits error";
      for (nc::ConvLayout layout : {nc::ConvLayout::NCHW, nc::ConvLayout::NHWC}) {
        const auto fused = nc::models::fuse_resnet(*model, layout);
        const Tensor fused_logits = (*fused)(reference.at("images").to(device)).to(nc::Device::cpu(), DType::F64);
        EXPECT_LT(nc::norm(nc::sub(fused_logits, want)).item<double>() / nc::norm(want).item<double>(), 1e-4)
            << "relative logits error of fuse_resnet, " << (layout == nc::ConvLayout::NHWC ? "NHWC" : "NCHW");
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 0) << "no ResNet weights under " << root;
}

}  // namespace
