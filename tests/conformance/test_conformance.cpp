// Conformance: every case in tests/data/conformance must pass on the CPU and (when there is
// one) on the GPU; and the runner must fail, with a reason, a case whose expected output is
// wrong, one with an unknown op, one with a missing tensor, a buffer whose after-value
// differs and a no_grad list that does not fit, rather than skip them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "normcore/conformance.h"
#include "normcore/ops.h"
#include "normcore/safetensors.h"
#include "normcore/tensor.h"

namespace nc = normcore;
namespace st = normcore::safetensors;
namespace fs = std::filesystem;

namespace {

const std::string kCaseDir = NORMCORE_TEST_DATA_DIR "/conformance";

void expect_all_pass(nc::Device device) {
  const std::vector<nc::conformance::CaseResult> results = nc::conformance::run_dir(kCaseDir, device);
  ASSERT_FALSE(results.empty()) << "no cases in " << kCaseDir;
  for (const auto& r : results) {
    EXPECT_TRUE(r.pass) << r.file << " (" << r.op << ", " << r.dtype << ", " << r.device << "): " << r.reason;
    if (r.pass) EXPECT_TRUE(r.reason.empty()) << r.file;
  }
}

// A copy of a case, edited, in a temporary file removed at the end of the test.
class ConformanceBadCase : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ =
        (fs::temp_directory_path() / ("normcore_conformance_" + std::to_string(::getpid()) + "_" +
                                      ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".safetensors"))
            .string();
  }
  void TearDown() override { fs::remove(path_); }

  // Writes a case (layer_norm_rows by default) after edit(tensors, metadata) and runs it on
  // the CPU.
  nc::conformance::CaseResult run_edited(
      const std::function<void(st::TensorList&, std::map<std::string, std::string>&)>& edit,
      const std::string& name = "layer_norm_rows") {
    st::File file = st::load(kCaseDir + "/" + name + ".safetensors");
    edit(file.tensors, file.metadata);
    st::save(path_, file.tensors, file.metadata);
    return nc::conformance::run_case(path_, nc::Device::cpu());
  }

  std::string path_;
};

}  // namespace

TEST(Conformance, AllCasesPassOnCpu) { expect_all_pass(nc::Device::cpu()); }

TEST(Conformance, AllCasesPassOnCuda) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  expect_all_pass(nc::Device::cuda());
}

TEST(Conformance, ReportsEveryComparedTensor) {
  const auto r = nc::conformance::run_case(kCaseDir + "/linear.safetensors", nc::Device::cpu());
  ASSERT_TRUE(r.pass) << r.reason;
  EXPECT_EQ(r.op, "linear");
  EXPECT_EQ(r.dtype, "f32");
  std::vector<std::string> names;
  for (const auto& t : r.tensors) {
    names.push_back(t.name);
    EXPECT_TRUE(t.pass);
    EXPECT_LE(t.worst_rel_to_tol, 1.0);
    EXPECT_GE(t.worst_abs, 0.0);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"out", "grad.x", "grad.weight", "grad.bias"}));
}

TEST_F(ConformanceBadCase, PerturbedOutputFails) {
  const auto r = run_edited([](st::TensorList& tensors, std::map<std::string, std::string>&) {
    for (auto& [name, t] : tensors)
      if (name == "out") t = nc::add(t, nc::full(t.shape(), 0.5, nc::TensorOptions(t.dtype())));
  });
  EXPECT_FALSE(r.pass);
  EXPECT_NE(r.reason.find("out"), std::string::npos) << r.reason;
  ASSERT_FALSE(r.tensors.empty());
  EXPECT_EQ(r.tensors[0].name, "out");
  EXPECT_FALSE(r.tensors[0].pass);
  EXPECT_GT(r.tensors[0].worst_rel_to_tol, 1.0);
  EXPECT_NEAR(r.tensors[0].worst_abs, 0.5, 1e-3);
  for (size_t i = 1; i < r.tensors.size(); ++i) EXPECT_TRUE(r.tensors[i].pass) << r.tensors[i].name;
}

TEST_F(ConformanceBadCase, UnknownOpFails) {
  const auto r = run_edited(
      [](st::TensorList&, std::map<std::string, std::string>& metadata) { metadata["op"] = "rotary_embedding"; });
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.op, "rotary_embedding");
  EXPECT_NE(r.reason.find("unknown op 'rotary_embedding'"), std::string::npos) << r.reason;
}

TEST_F(ConformanceBadCase, MissingTensorFails) {
  const auto r = run_edited([](st::TensorList& tensors, std::map<std::string, std::string>&) {
    tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                                 [](const auto& t) { return t.first == "grad.weight"; }),
                  tensors.end());
  });
  EXPECT_FALSE(r.pass);
  EXPECT_NE(r.reason.find("missing tensor 'grad.weight'"), std::string::npos) << r.reason;
}

TEST_F(ConformanceBadCase, BadAttrsFail) {
  const auto r = run_edited([](st::TensorList&, std::map<std::string, std::string>& metadata) {
    metadata["attrs"] = "{\"normalized_shape\": 16}";
  });
  EXPECT_FALSE(r.pass);
  EXPECT_NE(r.reason.find("normalized_shape"), std::string::npos) << r.reason;
}

// A no_grad buffer updated in place is compared with its after-value.
TEST_F(ConformanceBadCase, BufferAfterValueIsCompared) {
  const auto good = run_edited([](st::TensorList&, std::map<std::string, std::string>&) {}, "batch_norm_train");
  ASSERT_TRUE(good.pass) << good.reason;
  std::vector<std::string> names;
  for (const auto& t : good.tensors) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"after.running_mean", "after.running_var", "grad.bias", "grad.weight",
                                             "grad.x", "out"}));
  const auto r = run_edited(
      [](st::TensorList& tensors, std::map<std::string, std::string>&) {
        for (auto& t : tensors)
          if (t.first == "after.running_var") t.second = nc::add(t.second, 0.25);
      },
      "batch_norm_train");
  EXPECT_FALSE(r.pass);
  EXPECT_NE(r.reason.find("after.running_var"), std::string::npos) << r.reason;
}

// Without an after-value, a no_grad buffer must come out unchanged: running statistics in
// evaluation mode. A case claiming an update that does not happen fails.
TEST_F(ConformanceBadCase, BufferWithoutAfterValueMustStayUnchanged) {
  const auto good = run_edited([](st::TensorList&, std::map<std::string, std::string>&) {}, "batch_norm_eval");
  ASSERT_TRUE(good.pass) << good.reason;
  EXPECT_EQ(good.tensors.size(), 6u);
  const auto r = run_edited(
      [](st::TensorList&, std::map<std::string, std::string>& metadata) {
        metadata["attrs"] = "{\"training\": true, \"momentum\": 0.1, \"eps\": 1e-05}";
      },
      "batch_norm_eval");
  EXPECT_FALSE(r.pass);
  EXPECT_NE(r.reason.find("after.running_mean"), std::string::npos) << r.reason;
}

// An input listed in no_grad takes no gradient: a grad.<input> for it is refused, and a
// buffer missing from no_grad needs one.
TEST_F(ConformanceBadCase, NoGradIsEnforced) {
  auto r = run_edited(
      [](st::TensorList& tensors, std::map<std::string, std::string>&) {
        nc::Tensor mean;
        for (auto& t : tensors)
          if (t.first == "running_mean") mean = t.second;
        tensors.emplace_back("grad.running_mean", nc::zeros_like(mean));
      },
      "batch_norm_eval");
  EXPECT_FALSE(r.pass);
  EXPECT_NE(r.reason.find("'grad.running_mean'"), std::string::npos) << r.reason;
  r = run_edited([](st::TensorList&,
                    std::map<std::string, std::string>& metadata) { metadata["no_grad"] = "[\"running_var\"]"; },
                 "batch_norm_eval");
  EXPECT_FALSE(r.pass);
  EXPECT_NE(r.reason.find("missing tensor 'grad.running_mean'"), std::string::npos) << r.reason;
  r = run_edited([](st::TensorList&,
                    std::map<std::string, std::string>& metadata) { metadata["no_grad"] = "[\"gamma\"]"; },
                 "batch_norm_eval");
  EXPECT_FALSE(r.pass);
  EXPECT_NE(r.reason.find("not an input"), std::string::npos) << r.reason;
}

// An integer input outside no_grad is refused: it cannot take a gradient.
TEST_F(ConformanceBadCase, IntegerInputNeedsNoGrad) {
  const auto r = run_edited([](st::TensorList& tensors, std::map<std::string, std::string>&) {
    for (auto& t : tensors)
      if (t.first == "weight") t.second = t.second.to(nc::DType::I64);
  });
  EXPECT_FALSE(r.pass);
  EXPECT_NE(r.reason.find("input 'weight' is i64"), std::string::npos) << r.reason;
}

// ignore_index reaches the op: naming a class that the case's targets hold, while its
// expected tensors counted every target, makes the case fail on its values.
TEST_F(ConformanceBadCase, CrossEntropyIgnoreIndexReachesTheOp) {
  const auto good = run_edited([](st::TensorList&, std::map<std::string, std::string>&) {}, "cross_entropy_mean");
  ASSERT_TRUE(good.pass) << good.reason;
  int64_t first_target = -1;
  const auto r = run_edited(
      [&](st::TensorList& tensors, std::map<std::string, std::string>& metadata) {
        for (auto& [name, t] : tensors)
          if (name == "target") first_target = t.reshape({-1}).select(0, 0).item<int64_t>();
        metadata["attrs"] =
            "{\"reduction\": \"mean\", \"label_smoothing\": 0.0, \"ignore_index\": " + std::to_string(first_target) +
            "}";
      },
      "cross_entropy_mean");
  EXPECT_FALSE(r.pass);
  ASSERT_FALSE(r.tensors.empty()) << r.reason;
  EXPECT_FALSE(r.tensors[0].pass);
}

// An op the runner does not know fails as unknown, never passes.
TEST(Conformance, UnknownOpsFail) {
  for (const std::string op : {"rope", "flash_attention"}) {
    st::File file = st::load(kCaseDir + "/layer_norm_rows.safetensors");
    file.metadata["op"] = op;
    const std::string path = (fs::temp_directory_path() / ("normcore_unknown_" + op + ".safetensors")).string();
    st::save(path, file.tensors, file.metadata);
    const auto r = nc::conformance::run_case(path, nc::Device::cpu());
    fs::remove(path);
    EXPECT_FALSE(r.pass) << op;
    EXPECT_NE(r.reason.find("unknown op '" + op + "'"), std::string::npos) << r.reason;
  }
}

TEST(Conformance, MissingFileFailsWithReason) {
  const auto r = nc::conformance::run_case(kCaseDir + "/no_such_case.safetensors", nc::Device::cpu());
  EXPECT_FALSE(r.pass);
  EXPECT_FALSE(r.reason.empty());
}

TEST(Conformance, MissingDirectoryThrows) {
  EXPECT_THROW(nc::conformance::run_dir(kCaseDir + "/no_such_dir", nc::Device::cpu()), nc::IOError);
}
