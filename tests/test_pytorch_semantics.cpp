// Semantics settled against PyTorch 2.x, one row per case, on the CPU and on every CUDA
// device: integer tensors divided by integer scalars that do not fit their dtype, gradients
// at zeros and NaNs, signed zeros, bool subtraction, empty tensors in cat, cross_entropy's
// ignored rows. Each row holds what PyTorch 2.11 computes for the same expression (where
// normcore departs from it on purpose, the row says so and docs/ERRORS.md says why; the wider
// differential suite is test_differential.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "normcore/normcore.h"

namespace nc = normcore;
using nc::Device;
using nc::DType;
using nc::Tensor;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<Device> devices() {
  std::vector<Device> out = {Device::cpu()};
  if (nc::cuda_is_available()) out.push_back(Device::cuda(0));
  return out;
}

Tensor f32(std::vector<float> values, Device device, bool requires_grad = false) {
  Tensor t = nc::from_vector(values, {static_cast<int64_t>(values.size())}, device);
  if (requires_grad) t.requires_grad_();
  return t;
}

// cat(loss, gradient of sum(loss) with respect to the logits) of a cross_entropy call.
Tensor cross_entropy_and_grad(std::vector<float> logits, int64_t classes, std::vector<int64_t> target,
                              nc::nn::Reduction reduction, double smoothing, int64_t ignore_index, Device device) {
  const int64_t rows = static_cast<int64_t>(target.size());
  Tensor x = nc::from_vector(logits, {rows, classes}, device).requires_grad_();
  Tensor loss = nc::nn::cross_entropy(x, nc::from_vector(target, {rows}, device), reduction, smoothing, ignore_index);
  nc::sum(loss).backward();
  return nc::cat({loss.detach().reshape({-1}), x.grad().reshape({-1})}, 0);
}

// x requires grad; returns x.grad() after backward of sum(f(x)).
Tensor grad_of(const std::function<Tensor(const Tensor&)>& f, std::vector<float> values, Device device) {
  Tensor x = f32(values, device, true);
  nc::sum(f(x)).backward();
  return x.grad();
}

struct ValueCase {
  const char* name;
  std::function<Tensor(Device)> compute;
  DType dtype;
  std::vector<double> expected;  // NaN matches NaN; a zero's sign must match
};

const std::vector<ValueCase>& value_cases() {
  static const std::vector<ValueCase> cases = {
      // An integer tensor and an integer scalar divide in f32, the scalar never wrapped
      // into the tensor's dtype first.
      {"u8 / 256", [](Device d) { return nc::from_vector<uint8_t>({3, 1, 200}, {3}, d) / 256; }, DType::F32,
       {0.01171875, 0.00390625, 0.78125}},
      {"u8 / -1", [](Device d) { return nc::from_vector<uint8_t>({3, 1, 200}, {3}, d) / -1; }, DType::F32,
       {-3, -1, -200}},
      {"256 / u8", [](Device d) { return 256 / nc::from_vector<uint8_t>({2, 1, 200}, {3}, d); }, DType::F32,
       {128, 256, 1.28}},
      {"i32 / 2^33", [](Device d) { return nc::from_vector<int32_t>({1, -2, 4}, {3}, d) / (int64_t{1} << 33); },
       DType::F32, {1.0 / 8589934592.0, -2.0 / 8589934592.0, 4.0 / 8589934592.0}},
      // norm's gradient at zero elements is 0 for every p, not 0 * inf.
      {"grad of norm(x, 0.5) at 0", [](Device d) { return grad_of([](const Tensor& x) { return nc::norm(x, 0.5); }, {0, 1, -2}, d); },
       DType::F32, {0, 2.41421356, -1.70710678}},
      {"grad of norm(x, 0.5) of zeros", [](Device d) { return grad_of([](const Tensor& x) { return nc::norm(x, 0.5); }, {0, 0}, d); },
       DType::F32, {0, 0}},
      // max/min over all elements send the gradient to the NaNs, shared.
      {"grad of max(x) with NaN", [](Device d) { return grad_of([](const Tensor& x) { return nc::max(x); }, {1, NAN, 3, NAN}, d); },
       DType::F32, {0, 0.5, 0, 0.5}},
      {"grad of min(x) with NaN", [](Device d) { return grad_of([](const Tensor& x) { return nc::min(x); }, {NAN, -1, 3}, d); },
       DType::F32, {1, 0, 0}},
      {"grad of max(x), ties", [](Device d) { return grad_of([](const Tensor& x) { return nc::max(x); }, {3, 1, 3}, d); },
       DType::F32, {0.5, 0, 0.5}},
      // Signed zeros and NaNs in the element-wise ops and their gradients.
      {"neg(0)", [](Device d) { return nc::neg(f32({0.0f, -0.0f}, d)); }, DType::F32, {-0.0, 0.0}},
      {"relu(-0), relu(NaN)", [](Device d) { return nc::relu(f32({-0.0f, NAN, -1}, d)); }, DType::F32, {-0.0, kNaN, 0}},
      {"sign(NaN), sign(-0)", [](Device d) { return nc::sign(f32({NAN, -0.0f, -3, 2}, d)); }, DType::F32, {0, 0, -1, 1}},
      {"grad of relu at NaN and 0", [](Device d) { return grad_of([](const Tensor& x) { return nc::relu(x); }, {NAN, 0, -0.0f, 2}, d); },
       DType::F32, {1, 0, 0, 1}},
      {"grad of abs at NaN and 0", [](Device d) { return grad_of([](const Tensor& x) { return nc::abs(x); }, {NAN, 0, -2}, d); },
       DType::F32, {0, 0, -1}},
      {"grad of clamp at NaN and the bounds",
       [](Device d) { return grad_of([](const Tensor& x) { return nc::clamp(x, -1.0, 1.0); }, {NAN, -1, 1, 2}, d); },
       DType::F32, {0, 1, 1, 0}},
      {"grads of maximum with NaN and a tie",
       [](Device d) {
         Tensor a = f32({NAN, 1, 2}, d, true), b = f32({1, NAN, 2}, d, true);
         nc::sum(nc::maximum(a, b)).backward();
         return nc::cat({a.grad(), b.grad()}, 0);
       },
       DType::F32, {1, 1, 0.5, 1, 1, 0.5}},
      {"grads of minimum with NaN",
       [](Device d) {
         Tensor a = f32({NAN, 1, 2}, d, true), b = f32({1, NAN, 3}, d, true);
         nc::sum(nc::minimum(a, b)).backward();
         return nc::cat({a.grad(), b.grad()}, 0);
       },
       DType::F32, {1, 1, 1, 1, 1, 0}},
      // maximum and minimum of bools are or and and.
      {"maximum, minimum of bools",
       [](Device d) {
         Tensor a = nc::from_vector<bool>({true, true, false, false}, {4}, d);
         Tensor b = nc::from_vector<bool>({true, false, true, false}, {4}, d);
         return nc::cat({nc::maximum(a, b), nc::minimum(a, b), nc::maximum(a, true)}, 0);
       },
       DType::Bool, {1, 1, 1, 0, 1, 0, 0, 0, 1, 1, 1, 1}},
      // masked_fill broadcasts x and mask together: the result can be larger than x.
      {"masked_fill of [1] with a [3] mask",
       [](Device d) {
         return nc::masked_fill(f32({5}, d), nc::from_vector<bool>({true, false, true}, {3}, d), -1.0);
       },
       DType::F32, {-1, 5, -1}},
      // Floating to u8 wraps through int64, on every device.
      {"f32 to u8", [](Device d) { return f32({-2.7f, 300.5f, 2.9f, -0.5f}, d).to(DType::U8); }, DType::U8,
       {254, 44, 2, 0}},
      {"bf16 to u8", [](Device d) { return f32({-1.875f, 3.0f}, d).to(DType::BF16).to(DType::U8); }, DType::U8,
       {255, 3}},
      // An empty 1-D tensor skipped by cat still gets its (empty) gradient.
      {"cat of an empty tensor: its gradient",
       [](Device d) {
         Tensor e = f32({}, d, true), y = f32({1, 2}, d, true);
         nc::sum(nc::mul(nc::cat({e, y}, 0), 2)).backward();
         EXPECT_TRUE(e.grad().defined());
         return nc::cat({e.grad().reshape({0}), y.grad()}, 0);
       },
       DType::F32, {2, 2}},
      // cross_entropy: an ignored row adds nothing, to the loss or to the gradient. Every
      // target ignored: Mean is 0 / 0 (NaN) with a zero gradient, Sum and None are zeros.
      {"cross_entropy, every target ignored, mean",
       [](Device d) { return cross_entropy_and_grad({1, 2, 3, 0, 1, 2}, 3, {-100, -100}, nc::nn::Reduction::Mean, 0, -100, d); },
       DType::F32, {kNaN, 0, 0, 0, 0, 0, 0}},
      {"cross_entropy, every target ignored, sum",
       [](Device d) { return cross_entropy_and_grad({1, 2, 3, 0, 1, 2}, 3, {-100, -100}, nc::nn::Reduction::Sum, 0, -100, d); },
       DType::F32, {0, 0, 0, 0, 0, 0, 0}},
      {"cross_entropy, every target ignored, none",
       [](Device d) { return cross_entropy_and_grad({1, 2, 3, 0, 1, 2}, 3, {-100, -100}, nc::nn::Reduction::None, 0, -100, d); },
       DType::F32, {0, 0, 0, 0, 0, 0, 0, 0}},
      {"cross_entropy, every target ignored, label smoothing",
       [](Device d) { return cross_entropy_and_grad({1, 2, 3, 0, 1, 2}, 3, {-100, -100}, nc::nn::Reduction::Mean, 0.1, -100, d); },
       DType::F32, {kNaN, 0, 0, 0, 0, 0, 0}},
      {"cross_entropy, every target ignored, ignore_index a class",
       [](Device d) { return cross_entropy_and_grad({1, 2, 3, 0, 1, 2}, 3, {2, 2}, nc::nn::Reduction::Mean, 0, 2, d); },
       DType::F32, {kNaN, 0, 0, 0, 0, 0, 0}},
      // A NaN and an infinity in ignored rows: the loss of the kept row alone, 0 for the
      // ignored ones under None. Their gradient is 0 here; PyTorch's is NaN (docs/ERRORS.md,
      // `cross-entropy-ignored-nonfinite`).
      {"cross_entropy, NaN and inf logits in ignored rows, mean",
       [](Device d) { return cross_entropy_and_grad({1, 2, 3, NAN, 0, 1, INFINITY, 1, 0}, 3, {0, 1, 1}, nc::nn::Reduction::Mean, 0, 1, d); },
       DType::F32, {2.4076059644443806, -0.9099694268296196, 0.24472847105479764, 0.6652409557748218, 0, 0, 0, 0, 0, 0}},
      {"cross_entropy, NaN and inf logits in ignored rows, sum",
       [](Device d) { return cross_entropy_and_grad({1, 2, 3, NAN, 0, 1, INFINITY, 1, 0}, 3, {0, 1, 1}, nc::nn::Reduction::Sum, 0, 1, d); },
       DType::F32, {2.4076059644443806, -0.9099694268296196, 0.24472847105479764, 0.6652409557748218, 0, 0, 0, 0, 0, 0}},
      {"cross_entropy, NaN and inf logits in ignored rows, none",
       [](Device d) { return cross_entropy_and_grad({1, 2, 3, NAN, 0, 1, INFINITY, 1, 0}, 3, {0, 1, 1}, nc::nn::Reduction::None, 0, 1, d); },
       DType::F32, {2.4076059644443806, 0, 0, -0.9099694268296196, 0.24472847105479764, 0.6652409557748218, 0, 0, 0, 0, 0, 0}},
      {"cross_entropy, NaN logits in an ignored row, label smoothing",
       [](Device d) { return cross_entropy_and_grad({1, 2, 3, NAN, 0, 1}, 3, {0, 1}, nc::nn::Reduction::Mean, 0.2, 1, d); },
       DType::F32, {2.2076059644443804, -0.7766360934962863, 0.17806180438813096, 0.5985742891081551, 0, 0, 0}},
  };
  return cases;
}

bool same(double got, double expected) {
  if (std::isnan(expected)) return std::isnan(got);
  if (expected == 0) return got == 0 && std::signbit(got) == std::signbit(expected);
  return std::fabs(got - expected) <= 1e-6 * std::fabs(expected) + 1e-12;
}

TEST(PyTorchSemantics, ValuesAndGradientsMatchPyTorch) {
  for (Device device : devices()) {
    for (const ValueCase& c : value_cases()) {
      SCOPED_TRACE(std::string(c.name) + " on " + device.str());
      Tensor got = c.compute(device);
      ASSERT_TRUE(got.defined());
      EXPECT_EQ(got.dtype(), c.dtype);
      const std::vector<double> values = got.to_vector<double>();
      ASSERT_EQ(values.size(), c.expected.size());
      for (size_t i = 0; i < values.size(); ++i) EXPECT_TRUE(same(values[i], c.expected[i])) << i << ": got " << values[i] << ", expected " << c.expected[i];
    }
  }
}

TEST(PyTorchSemantics, SubtractionRefusesBools) {
  for (Device device : devices()) {
    SCOPED_TRACE(device.str());
    const Tensor mask = nc::from_vector<bool>({true, false}, {2}, device);
    const Tensor ints = nc::from_vector<int32_t>({1, 2}, {2}, device);
    const std::vector<std::pair<const char*, std::function<void()>>> calls = {
        {"bool - i32", [&] { nc::sub(mask, ints); }},
        {"i32 - bool", [&] { nc::sub(ints, mask); }},
        {"i32 - true", [&] { nc::sub(ints, true); }},
        {"true - i32", [&] { (void)(true - ints); }},
        {"bool - bool", [&] { nc::sub(mask, mask); }},
    };
    for (const auto& call : calls) {
      try {
        call.second();
        ADD_FAILURE() << call.first << " did not throw";
      } catch (const nc::DTypeError& e) {
        EXPECT_NE(std::string(e.what()).find("sub: subtraction with a bool"), std::string::npos) << e.what();
      }
    }
    EXPECT_EQ(nc::add(ints, true).to_vector<int32_t>(), (std::vector<int32_t>{2, 3})) << "only subtraction refuses";
  }
}

}  // namespace
