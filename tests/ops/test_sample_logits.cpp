// sample_logits (normcore/random.h): draws with the frequencies softmax(logits / T) gives,
// restricted by top_k and top_p as generation documents; a seed repeats its draws; argument
// errors; CUDA choosing what the CPU chooses (random logits, ties only where both keep
// them) in f32 and bf16, and
// inside a CUDA graph drawing anew each replay.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "normcore/normcore.h"
#include "tests/test_support.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;
using normcore_test::throws;

namespace {

// rows copies of the row log(p) (f32).
Tensor repeated_row(const std::vector<float>& p, int64_t rows) {
  std::vector<float> values;
  for (int64_t r = 0; r < rows; ++r)
    for (float v : p) values.push_back(std::log(v));
  return nc::from_vector(values, {rows, static_cast<int64_t>(p.size())});
}

// How often each class was chosen, as fractions.
std::vector<double> frequencies(const Tensor& chosen, int64_t classes) {
  std::vector<double> f(static_cast<size_t>(classes), 0.0);
  const std::vector<int64_t> ids = chosen.to(nc::Device::cpu()).to_vector<int64_t>();
  for (int64_t id : ids) {
    EXPECT_TRUE(id >= 0 && id < classes) << id;
    if (id >= 0 && id < classes) f[id] += 1.0 / static_cast<double>(ids.size());
  }
  return f;
}

std::vector<nc::Device> devices() {
  std::vector<nc::Device> out{nc::Device::cpu()};
  if (nc::cuda_is_available()) out.push_back(nc::Device::cuda());
  return out;
}

}  // namespace

TEST(SampleLogits, FrequenciesFollowTheSoftmaxWithinTopKAndTopP) {
  const std::vector<float> p{0.1f, 0.5f, 0.15f, 0.25f};
  for (const nc::Device& device : devices()) {
    SCOPED_TRACE(device.str());
    const Tensor logits = repeated_row(p, 40000).to(device);
    nc::Generator gen(3);
    // Temperature 1: p itself (standard error of a fraction about 0.0025).
    std::vector<double> f = frequencies(nc::sample_logits(logits, 1.0, 0, 1.0, &gen), 4);
    for (int j = 0; j < 4; ++j) EXPECT_NEAR(f[j], p[j], 0.012) << "class " << j;
    // Temperature 0.5 squares the probabilities before normalizing.
    f = frequencies(nc::sample_logits(logits, 0.5, 0, 1.0, &gen), 4);
    const double squares = 0.01 + 0.25 + 0.0225 + 0.0625;
    for (int j = 0; j < 4; ++j) EXPECT_NEAR(f[j], p[j] * p[j] / squares, 0.012) << "class " << j;
    // top_k 2: classes 1 and 3 alone, in the ratio 0.5 : 0.25.
    f = frequencies(nc::sample_logits(logits, 1.0, 2, 1.0, &gen), 4);
    EXPECT_EQ(f[0] + f[2], 0.0);
    EXPECT_NEAR(f[1], 2.0 / 3.0, 0.012);
    // top_p 0.7: 0.5 + 0.25 reach it, so class 1 and 3 again; top_p 0.5: class 1 alone.
    f = frequencies(nc::sample_logits(logits, 1.0, 0, 0.7, &gen), 4);
    EXPECT_EQ(f[0] + f[2], 0.0);
    EXPECT_NEAR(f[1], 2.0 / 3.0, 0.012);
    f = frequencies(nc::sample_logits(logits, 1.0, 0, 0.5, &gen), 4);
    EXPECT_NEAR(f[1], 1.0, 1e-9);
    // top_k 1 is the first maximum, whatever the draw.
    f = frequencies(nc::sample_logits(logits, 3.0, 1, 1.0, &gen), 4);
    EXPECT_NEAR(f[1], 1.0, 1e-9);
  }
}

TEST(SampleLogits, ASeedRepeatsItsDrawsAndErrorsNameTheArgument) {
  const Tensor logits = nc::randn({50, 300}, DType::F32);
  nc::Generator a(9), b(9);
  EXPECT_EQ(nc::sample_logits(logits, 0.8, 40, 0.9, &a).to_vector<int64_t>(),
            nc::sample_logits(logits, 0.8, 40, 0.9, &b).to_vector<int64_t>());
  EXPECT_EQ(a.offset(), 50u);  // one counter a row
  throws<nc::ValueError>([&] { nc::sample_logits(logits, 0.0); }, {"sample_logits", "temperature", "argmax"})();
  throws<nc::ValueError>([&] { nc::sample_logits(logits, 1.0, -1); }, {"top_k"})();
  throws<nc::ValueError>([&] { nc::sample_logits(logits, 1.0, 0, 0.0); }, {"top_p"})();
  throws<nc::ShapeError>([&] { nc::sample_logits(nc::zeros({3}), 1.0); }, {"[rows, classes]", "[3]"})();
  throws<nc::DTypeError>([&] { nc::sample_logits(nc::zeros({2, 3}, DType::I64), 1.0); }, {"floating"})();
}

TEST(SampleLogitsCuda, ChoosesWhatTheCpuChooses) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(nc::dtype_name(dtype));
    // GPT-2's vocabulary: several chunks of the draw, top_k's radix select over many keys.
    const Tensor logits = nc::mul(nc::randn({64, 50257}, DType::F32), 3.0).to(dtype);
    for (auto [k, p] : {std::pair<int64_t, double>{0, 1.0}, {50, 1.0}, {0, 0.9}, {200, 0.8}}) {
      SCOPED_TRACE("top_k " + std::to_string(k) + " top_p " + std::to_string(p));
      // bf16 logits tie often, and ties at the top_p cut are kept in index order on the CPU,
      // all of them on CUDA (kernels/generate.h): top_p in f32 alone.
      if (dtype == DType::BF16 && p < 1) continue;
      nc::Generator cpu_gen(5), gpu_gen(5);
      const std::vector<int64_t> cpu = nc::sample_logits(logits, 0.9, k, p, &cpu_gen).to_vector<int64_t>();
      const std::vector<int64_t> gpu = nc::sample_logits(logits.to(nc::Device::cuda()), 0.9, k, p, &gpu_gen)
                                           .to(nc::Device::cpu())
                                           .to_vector<int64_t>();
      EXPECT_EQ(gpu, cpu);
    }
  }
}

TEST(SampleLogitsCuda, AGraphReplayDrawsAnew) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Tensor logits = nc::zeros({256, 1000}, nc::TensorOptions(DType::F32, nc::Device::cuda()));
  nc::Generator gen(1), same(1);
  Tensor chosen;
  nc::cuda::Graph graph;
  graph.capture(0, [&] { chosen = nc::sample_logits(logits, 1.0, 0, 1.0, &gen); });
  graph.replay();
  const std::vector<int64_t> first = chosen.to(nc::Device::cpu()).to_vector<int64_t>();
  graph.replay();
  const std::vector<int64_t> second = chosen.to(nc::Device::cpu()).to_vector<int64_t>();
  EXPECT_NE(first, second);
  // The replays drew what two direct calls draw.
  EXPECT_EQ(first, nc::sample_logits(logits, 1.0, 0, 1.0, &same).to(nc::Device::cpu()).to_vector<int64_t>());
  EXPECT_EQ(second, nc::sample_logits(logits, 1.0, 0, 1.0, &same).to(nc::Device::cpu()).to_vector<int64_t>());
}
