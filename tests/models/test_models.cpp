// The ready-made classifiers: every model name builds, runs forward and backward, names
// its parameters as PyTorch would, and survives a checkpoint round trip.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "normcore/models.h"
#include "normcore/normcore.h"

namespace nc = normcore;

TEST(Models, EveryClassifierTrainsOneStep) {
  for (const std::string& name : nc::models::classifier_names()) {
    SCOPED_TRACE(name);
    nc::Generator gen(3);
    auto model = nc::models::make_classifier(name, &gen);
    nc::Tensor x = nc::randn({4, 1, 28, 28}, {}, &gen);
    nc::Tensor labels = nc::from_vector<int64_t>({0, 3, 9, 3}, {4});
    nc::Tensor logits = (*model)(x);
    ASSERT_EQ(logits.shape(), (nc::Shape{4, 10}));
    for (float v : logits.to_vector<float>()) ASSERT_TRUE(std::isfinite(v));
    nc::cross_entropy(logits, labels).backward();
    for (const auto& [pname, p] : model->named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << pname;
      EXPECT_EQ(p.grad().shape(), p.shape()) << pname;
    }
  }
}

TEST(Models, NormVariantsPlaceTheNormAfterEachHiddenLinear) {
  auto names = [](const std::string& model) {
    std::vector<std::string> out;
    for (const auto& [name, t] : nc::models::make_classifier(model)->state_dict()) out.push_back(name);
    return out;
  };
  EXPECT_EQ(names("mlp"), (std::vector<std::string>{"1.weight", "1.bias", "4.weight", "4.bias", "7.weight", "7.bias"}));
  EXPECT_EQ(names("mlp-layernorm"), (std::vector<std::string>{"1.weight", "1.bias", "2.weight", "2.bias", "5.weight",
                                                              "5.bias", "6.weight", "6.bias", "9.weight", "9.bias"}));
  EXPECT_EQ(names("mlp-l1norm"),
            (std::vector<std::string>{"1.weight", "1.bias", "5.weight", "5.bias", "9.weight", "9.bias"}));
  try {
    nc::models::make_classifier("resnet");
    FAIL() << "expected a ValueError";
  } catch (const nc::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("mlp-groupnorm"), std::string::npos) << e.what();
  }
}

TEST(Models, CheckpointRoundTripKeepsTheOutputs) {
  nc::Generator gen(5);
  auto model = nc::models::make_classifier("mlp-groupnorm", &gen);
  model->eval();
  nc::Tensor x = nc::randn({2, 1, 28, 28}, {}, &gen);
  const std::string path = ::testing::TempDir() + "models_roundtrip.safetensors";
  nc::models::save_checkpoint(path, "mlp-groupnorm", *model, 3, {}, {}, {{"seed", "5"}});
  nc::models::Checkpoint c = nc::models::load_checkpoint(path);
  c.model->eval();
  EXPECT_EQ(c.model_name, "mlp-groupnorm");
  EXPECT_EQ(c.epoch, 3);
  EXPECT_EQ(c.metadata.at("option.seed"), "5");
  nc::autograd::NoGradGuard no_grad;
  EXPECT_EQ((*c.model)(x).to_vector<float>(), (*model)(x).to_vector<float>());
  std::remove(path.c_str());
}

// Checkpoints are files from anywhere: malformed metadata is an IOError naming the field,
// never another exception.
TEST(Models, MalformedCheckpointMetadataIsAnIOError) {
  nc::Generator gen(6);
  auto model = nc::models::make_classifier("mlp", &gen);
  const std::string path = ::testing::TempDir() + "models_malformed.safetensors";
  // A checkpoint of model with some metadata replaced.
  auto save_with = [&](const std::map<std::string, std::string>& changes) {
    nc::models::save_checkpoint(path, "mlp", *model, 2, {}, {}, {});
    nc::safetensors::File file = nc::safetensors::load(path);
    for (const auto& [key, value] : changes) file.metadata[key] = value;
    nc::safetensors::save(path, file.tensors, file.metadata);
  };
  auto expect_io_error = [&](const std::function<void()>& call, const std::string& fragment) {
    try {
      call();
      ADD_FAILURE() << "expected an IOError mentioning " << fragment;
    } catch (const nc::IOError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  for (const std::string epoch : {"12abc", "-1", "", "99999999999999999999999"}) {
    SCOPED_TRACE("data.epoch '" + epoch + "'");
    save_with({{"data.epoch", epoch}});
    expect_io_error([&] { nc::models::load_checkpoint(path); }, "malformed data.epoch");
  }
  const nc::Tensor image = nc::zeros({1, 28, 28});
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"option.mean", "abc"}, {"option.mean", "nan"}, {"option.std", "0.35x"}, {"option.std", "0"}}) {
    SCOPED_TRACE(key + " = '" + value + "'");
    save_with({{key, value}});
    const nc::models::Classifier classifier(path);
    expect_io_error([&] { classifier.predict(image); }, key);
  }
  save_with({});
  EXPECT_EQ(nc::models::load_checkpoint(path).epoch, 2);
  std::remove(path.c_str());
}
