// Semantics settled against PyTorch 2.x, one row per case, on the CPU and on every CUDA
// device: integer tensors divided by integer scalars that do not fit their dtype, gradients
// at zeros and NaNs, signed zeros, bool subtraction, empty tensors in cat, cross_entropy's
// ignored rows; and what PyTorch refuses: scalars a dtype cannot hold, writes into a
// destination whose elements share memory, groups of one value, empty channels in pooling.
// Each row holds what PyTorch 2.11 computes or raises for the same expression (where normcore
// departs from it on purpose, the row says so and docs/ERRORS.md says why; the wider
// differential suite is test_differential.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <typeinfo>
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
                              nc::Reduction reduction, double smoothing, int64_t ignore_index, Device device) {
  const int64_t rows = static_cast<int64_t>(target.size());
  Tensor x = nc::from_vector(logits, {rows, classes}, device).requires_grad_();
  Tensor loss = nc::cross_entropy(x, nc::from_vector(target, {rows}, device), reduction, smoothing, ignore_index);
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
      {"u8 / 256",
       [](Device d) {
         return nc::from_vector<uint8_t>({3, 1, 200}, {3}, d) / 256;
       },
       DType::F32,
       {0.01171875, 0.00390625, 0.78125}},
      {"u8 / -1",
       [](Device d) {
         return nc::from_vector<uint8_t>({3, 1, 200}, {3}, d) / -1;
       },
       DType::F32,
       {-3, -1, -200}},
      {"256 / u8",
       [](Device d) {
         return 256 / nc::from_vector<uint8_t>({2, 1, 200}, {3}, d);
       },
       DType::F32,
       {128, 256, 1.28}},
      {"i32 / 2^33",
       [](Device d) {
         return nc::from_vector<int32_t>({1, -2, 4}, {3}, d) / (int64_t{1} << 33);
       },
       DType::F32,
       {1.0 / 8589934592.0, -2.0 / 8589934592.0, 4.0 / 8589934592.0}},
      // norm's gradient at zero elements is 0 for every p, not 0 * inf.
      {"grad of norm(x, 0.5) at 0",
       [](Device d) {
         return grad_of([](const Tensor& x) { return nc::norm(x, 0.5); }, {0, 1, -2}, d);
       },
       DType::F32,
       {0, 2.41421356, -1.70710678}},
      {"grad of norm(x, 0.5) of zeros",
       [](Device d) {
         return grad_of([](const Tensor& x) { return nc::norm(x, 0.5); }, {0, 0}, d);
       },
       DType::F32,
       {0, 0}},
      // max/min over all elements send the gradient to the NaNs, shared.
      {"grad of max(x) with NaN",
       [](Device d) {
         return grad_of([](const Tensor& x) { return nc::max(x); }, {1, NAN, 3, NAN}, d);
       },
       DType::F32,
       {0, 0.5, 0, 0.5}},
      {"grad of min(x) with NaN",
       [](Device d) {
         return grad_of([](const Tensor& x) { return nc::min(x); }, {NAN, -1, 3}, d);
       },
       DType::F32,
       {1, 0, 0}},
      {"grad of max(x), ties",
       [](Device d) {
         return grad_of([](const Tensor& x) { return nc::max(x); }, {3, 1, 3}, d);
       },
       DType::F32,
       {0.5, 0, 0.5}},
      // Signed zeros and NaNs in the element-wise ops and their gradients.
      {"neg(0)",
       [](Device d) {
         return nc::neg(f32({0.0f, -0.0f}, d));
       },
       DType::F32,
       {-0.0, 0.0}},
      {"relu(-0), relu(NaN)",
       [](Device d) {
         return nc::relu(f32({-0.0f, NAN, -1}, d));
       },
       DType::F32,
       {-0.0, kNaN, 0}},
      {"sign(NaN), sign(-0)",
       [](Device d) {
         return nc::sign(f32({NAN, -0.0f, -3, 2}, d));
       },
       DType::F32,
       {0, 0, -1, 1}},
      {"grad of relu at NaN and 0",
       [](Device d) {
         return grad_of([](const Tensor& x) { return nc::relu(x); }, {NAN, 0, -0.0f, 2}, d);
       },
       DType::F32,
       {1, 0, 0, 1}},
      {"grad of abs at NaN and 0",
       [](Device d) {
         return grad_of([](const Tensor& x) { return nc::abs(x); }, {NAN, 0, -2}, d);
       },
       DType::F32,
       {0, 0, -1}},
      {"grad of clamp at NaN and the bounds",
       [](Device d) {
         return grad_of([](const Tensor& x) { return nc::clamp(x, -1.0, 1.0); }, {NAN, -1, 1, 2}, d);
       },
       DType::F32,
       {0, 1, 1, 0}},
      {"grads of maximum with NaN and a tie",
       [](Device d) {
         Tensor a = f32({NAN, 1, 2}, d, true), b = f32({1, NAN, 2}, d, true);
         nc::sum(nc::maximum(a, b)).backward();
         return nc::cat({a.grad(), b.grad()}, 0);
       },
       DType::F32,
       {1, 1, 0.5, 1, 1, 0.5}},
      {"grads of minimum with NaN",
       [](Device d) {
         Tensor a = f32({NAN, 1, 2}, d, true), b = f32({1, NAN, 3}, d, true);
         nc::sum(nc::minimum(a, b)).backward();
         return nc::cat({a.grad(), b.grad()}, 0);
       },
       DType::F32,
       {1, 1, 1, 1, 1, 0}},
      // maximum and minimum of bools are or and and.
      {"maximum, minimum of bools",
       [](Device d) {
         Tensor a = nc::from_vector<bool>({true, true, false, false}, {4}, d);
         Tensor b = nc::from_vector<bool>({true, false, true, false}, {4}, d);
         return nc::cat({nc::maximum(a, b), nc::minimum(a, b), nc::maximum(a, true)}, 0);
       },
       DType::Bool,
       {1, 1, 1, 0, 1, 0, 0, 0, 1, 1, 1, 1}},
      // masked_fill broadcasts x and mask together: the result can be larger than x.
      {"masked_fill of [1] with a [3] mask",
       [](Device d) {
         return nc::masked_fill(f32({5}, d), nc::from_vector<bool>({true, false, true}, {3}, d), -1.0);
       },
       DType::F32,
       {-1, 5, -1}},
      // Floating to u8 wraps through int64, on every device.
      {"f32 to u8",
       [](Device d) {
         return f32({-2.7f, 300.5f, 2.9f, -0.5f}, d).to(DType::U8);
       },
       DType::U8,
       {254, 44, 2, 0}},
      {"bf16 to u8",
       [](Device d) {
         return f32({-1.875f, 3.0f}, d).to(DType::BF16).to(DType::U8);
       },
       DType::U8,
       {255, 3}},
      // An empty 1-D tensor skipped by cat still gets its (empty) gradient.
      {"cat of an empty tensor: its gradient",
       [](Device d) {
         Tensor e = f32({}, d, true), y = f32({1, 2}, d, true);
         nc::sum(nc::mul(nc::cat({e, y}, 0), 2)).backward();
         EXPECT_TRUE(e.grad().defined());
         return nc::cat({e.grad().reshape({0}), y.grad()}, 0);
       },
       DType::F32,
       {2, 2}},
      // cross_entropy: an ignored row adds nothing, to the loss or to the gradient. Every
      // target ignored: Mean is 0 / 0 (NaN) with a zero gradient, Sum and None are zeros.
      {"cross_entropy, every target ignored, mean",
       [](Device d) {
         return cross_entropy_and_grad({1, 2, 3, 0, 1, 2}, 3, {-100, -100}, nc::Reduction::Mean, 0, -100, d);
       },
       DType::F32,
       {kNaN, 0, 0, 0, 0, 0, 0}},
      {"cross_entropy, every target ignored, sum",
       [](Device d) {
         return cross_entropy_and_grad({1, 2, 3, 0, 1, 2}, 3, {-100, -100}, nc::Reduction::Sum, 0, -100, d);
       },
       DType::F32,
       {0, 0, 0, 0, 0, 0, 0}},
      {"cross_entropy, every target ignored, none",
       [](Device d) {
         return cross_entropy_and_grad({1, 2, 3, 0, 1, 2}, 3, {-100, -100}, nc::Reduction::None, 0, -100, d);
       },
       DType::F32,
       {0, 0, 0, 0, 0, 0, 0, 0}},
      {"cross_entropy, every target ignored, label smoothing",
       [](Device d) {
         return cross_entropy_and_grad({1, 2, 3, 0, 1, 2}, 3, {-100, -100}, nc::Reduction::Mean, 0.1, -100, d);
       },
       DType::F32,
       {kNaN, 0, 0, 0, 0, 0, 0}},
      {"cross_entropy, every target ignored, ignore_index a class",
       [](Device d) {
         return cross_entropy_and_grad({1, 2, 3, 0, 1, 2}, 3, {2, 2}, nc::Reduction::Mean, 0, 2, d);
       },
       DType::F32,
       {kNaN, 0, 0, 0, 0, 0, 0}},
      // A NaN and an infinity in ignored rows: the loss of the kept row alone, 0 for the
      // ignored ones under None. Their gradient is 0 here; PyTorch's is NaN (docs/ERRORS.md,
      // `cross-entropy-ignored-nonfinite`).
      {"cross_entropy, NaN and inf logits in ignored rows, mean",
       [](Device d) {
         return cross_entropy_and_grad({1, 2, 3, NAN, 0, 1, INFINITY, 1, 0}, 3, {0, 1, 1}, nc::Reduction::Mean, 0, 1,
                                       d);
       },
       DType::F32,
       {2.4076059644443806, -0.9099694268296196, 0.24472847105479764, 0.6652409557748218, 0, 0, 0, 0, 0, 0}},
      {"cross_entropy, NaN and inf logits in ignored rows, sum",
       [](Device d) {
         return cross_entropy_and_grad({1, 2, 3, NAN, 0, 1, INFINITY, 1, 0}, 3, {0, 1, 1}, nc::Reduction::Sum, 0, 1, d);
       },
       DType::F32,
       {2.4076059644443806, -0.9099694268296196, 0.24472847105479764, 0.6652409557748218, 0, 0, 0, 0, 0, 0}},
      {"cross_entropy, NaN and inf logits in ignored rows, none",
       [](Device d) {
         return cross_entropy_and_grad({1, 2, 3, NAN, 0, 1, INFINITY, 1, 0}, 3, {0, 1, 1}, nc::Reduction::None, 0, 1,
                                       d);
       },
       DType::F32,
       {2.4076059644443806, 0, 0, -0.9099694268296196, 0.24472847105479764, 0.6652409557748218, 0, 0, 0, 0, 0, 0}},
      {"cross_entropy, NaN logits in an ignored row, label smoothing",
       [](Device d) {
         return cross_entropy_and_grad({1, 2, 3, NAN, 0, 1}, 3, {0, 1}, nc::Reduction::Mean, 0.2, 1, d);
       },
       DType::F32,
       {2.2076059644443804, -0.7766360934962863, 0.17806180438813096, 0.5985742891081551, 0, 0, 0}},
      // Scalars that fit: u8 to the power 255 wraps its result (not its exponent), an
      // infinity fills f16, fill_ writes one value into an expand() view (PyTorch allows it).
      {"pow(u8, 255)",
       [](Device d) {
         return nc::pow(nc::from_vector<uint8_t>({2, 3}, {2}, d), 255);
       },
       DType::U8,
       {0, 171}},
      {"full(f16, inf)",
       [](Device d) { return nc::full({2}, INFINITY, nc::TensorOptions(DType::F16, d)); },
       DType::F16,
       {INFINITY, INFINITY}},
      {"fill_ of an expand() view",
       [](Device d) {
         Tensor x = nc::zeros({1, 3}, nc::TensorOptions(DType::F32, d)).expand({2, 3});
         x.fill_(2);
         return x;
       },
       DType::F32,
       {2, 2, 2, 2, 2, 2}},
      // One value per group within each sample is fine when the batch holds more than one.
      {"group_norm of [2, 4], 4 groups",
       [](Device d) {
         return nc::group_norm(f32({1, 2, 3, 4, 5, 6, 7, 8}, d).view({2, 4}), 4, Tensor(), Tensor());
       },
       DType::F32,
       {0, 0, 0, 0, 0, 0, 0, 0}},
  };
  return cases;
}

bool same(double got, double expected) {
  if (std::isnan(expected)) return std::isnan(got);
  if (std::isinf(expected)) return got == expected;
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
      for (size_t i = 0; i < values.size(); ++i)
        EXPECT_TRUE(same(values[i], c.expected[i])) << i << ": got " << values[i] << ", expected " << c.expected[i];
    }
  }
}

TEST(PyTorchSemantics, SubtractionRefusesBools) {
  for (Device device : devices()) {
    SCOPED_TRACE(device.str());
    const Tensor mask = nc::from_vector<bool>({true, false}, {2}, device);
    const Tensor ints = nc::from_vector<int32_t>({1, 2}, {2}, device);
    const std::vector<std::pair<const char*, std::function<void()>>> calls = {
        {"bool - i32", [&] { nc::sub(mask, ints); }},  {"i32 - bool", [&] { nc::sub(ints, mask); }},
        {"i32 - true", [&] { nc::sub(ints, true); }},  {"true - i32", [&] { (void)(true - ints); }},
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

// What PyTorch refuses, each refused with a typed error naming the op and the argument.
struct Refusal {
  const char* name;
  std::function<void(Device)> call;
  const std::type_info& type;
  std::vector<std::string> fragments;  // all in the message
};

const std::vector<Refusal>& refusals() {
  using nc::TensorOptions;
  static const std::vector<Refusal> rows = {
      // A scalar written into a tensor must fit its dtype ("value cannot be converted to
      // type c10::Half without overflow"); where's scalar too, though PyTorch writes an
      // infinity there for floating dtypes (`where-scalar-overflow`).
      {"full(f16, 1e6)",
       [](Device d) { nc::full({2}, 1e6, TensorOptions(DType::F16, d)); },
       typeid(nc::ValueError),
       {"full: value 1e+06 cannot be converted to f16 without overflow", "65504"}},
      {"full(f16, 65519)",
       [](Device d) { nc::full({2}, 65519.0, TensorOptions(DType::F16, d)); },
       typeid(nc::ValueError),
       {"full: value 65519", "f16"}},
      {"full(bf16, 1e39)",
       [](Device d) { nc::full({2}, 1e39, TensorOptions(DType::BF16, d)); },
       typeid(nc::ValueError),
       {"full: value 1e+39", "bf16"}},
      {"full(f32, 1e39)",
       [](Device d) { nc::full({2}, 1e39, TensorOptions(DType::F32, d)); },
       typeid(nc::ValueError),
       {"full: value 1e+39", "f32"}},
      {"fill_(f16, 1e6)",
       [](Device d) { nc::zeros({2}, TensorOptions(DType::F16, d)).fill_(1e6); },
       typeid(nc::ValueError),
       {"fill_: value 1e+06", "f16"}},
      {"fill_(f16, -1e6)",
       [](Device d) { nc::zeros({2}, TensorOptions(DType::F16, d)).fill_(-1e6); },
       typeid(nc::ValueError),
       {"fill_: value -1e+06", "f16"}},
      {"masked_fill(f16, 1e6)",
       [](Device d) {
         nc::masked_fill(nc::zeros({2}, TensorOptions(DType::F16, d)), nc::from_vector<bool>({true, false}, {2}, d),
                         1e6);
       },
       typeid(nc::ValueError),
       {"masked_fill: value 1e+06", "f16"}},
      {"masked_fill(bf16, 1e39)",
       [](Device d) {
         nc::masked_fill(nc::zeros({2}, TensorOptions(DType::BF16, d)), nc::from_vector<bool>({true, false}, {2}, d),
                         1e39);
       },
       typeid(nc::ValueError),
       {"masked_fill: value 1e+39", "bf16"}},
      {"where(f16, 1e6)",
       [](Device d) {
         nc::where(nc::from_vector<bool>({true, false}, {2}, d), nc::zeros({2}, TensorOptions(DType::F16, d)), 1e6);
       },
       typeid(nc::ValueError),
       {"where: scalar 1e+06", "f16"}},
      {"where(i32, 2^40)",
       [](Device d) {
         nc::where(nc::from_vector<bool>({true, false}, {2}, d), nc::zeros({2}, TensorOptions(DType::I32, d)),
                   int64_t{1} << 40);
       },
       typeid(nc::ValueError),
       {"where: scalar 1099511627776", "i32"}},
      {"clamp(f16, max = 1e6)",
       [](Device d) { nc::clamp(nc::zeros({2}, TensorOptions(DType::F16, d)), std::nullopt, 1e6); },
       typeid(nc::ValueError),
       {"clamp: max 1e+06", "f16"}},
      {"clamp(f16, min = -1e6)",
       [](Device d) { nc::clamp(nc::zeros({2}, TensorOptions(DType::F16, d)), -1e6, std::nullopt); },
       typeid(nc::ValueError),
       {"clamp: min -1e+06", "f16"}},
      {"clamp(u8, max = 300)",
       [](Device d) { nc::clamp(nc::zeros({2}, TensorOptions(DType::U8, d)), std::nullopt, 300); },
       typeid(nc::ValueError),
       {"clamp: max 300", "u8"}},
      // An exponent the result's dtype cannot hold is refused, not wrapped (u8 ** 256 is not
      // u8 ** 0).
      {"pow(u8, 256)",
       [](Device d) {
         nc::pow(nc::from_vector<uint8_t>({2, 3}, {2}, d), 256);
       },
       typeid(nc::ValueError),
       {"pow: exponent 256 cannot be converted to u8"}},
      {"pow(i32, 2^32)",
       [](Device d) {
         nc::pow(nc::from_vector<int32_t>({2, 1}, {2}, d), int64_t{1} << 32);
       },
       typeid(nc::ValueError),
       {"pow: exponent 4294967296 cannot be converted to i32"}},
      {"pow(i32, 2^31)",
       [](Device d) {
         nc::pow(nc::from_vector<int32_t>({2, 1}, {2}, d), int64_t{1} << 31);
       },
       typeid(nc::ValueError),
       {"pow: exponent 2147483648", "i32"}},
      {"pow(f16, 1e6)",
       [](Device d) { nc::pow(nc::ones({2}, TensorOptions(DType::F16, d)), 1e6); },
       typeid(nc::ValueError),
       {"pow: exponent 1e+06", "f16"}},
      {"pow(u8, -1)",
       [](Device d) {
         nc::pow(nc::from_vector<uint8_t>({2, 3}, {2}, d), -1);
       },
       typeid(nc::ValueError),
       {"pow: integer tensor", "negative integer power -1"}},
      // copy_ into elements that share memory would keep whichever write came last.
      {"copy_ into an expand() view",
       [](Device d) {
         nc::zeros({1, 3}, TensorOptions(DType::F32, d))
             .expand({2, 3})
             .copy_(nc::ones({2, 3}, TensorOptions(DType::F32, d)));
       },
       typeid(nc::ValueError),
       {"copy_: the destination f32 [2, 3]", "share memory along dim 0", "clone()"}},
      {"copy_ of a row into an expand() view",
       [](Device d) {
         nc::zeros({3, 1}, TensorOptions(DType::F32, d))
             .expand({3, 4})
             .copy_(nc::ones({1, 4}, TensorOptions(DType::F32, d)));
       },
       typeid(nc::ValueError),
       {"copy_", "share memory along dim 1"}},
      // ... and copy_ from a view of the destination's own elements, laid out otherwise, would
      // read elements it has already written.
      {"copy_ of a tensor into its transpose",
       [](Device d) {
         Tensor y = nc::arange(4, nc::TensorOptions(DType::F32, d)).view({2, 2});
         y.t().copy_(y);
       },
       typeid(nc::ValueError),
       {"copy_: the destination f32 [2, 2]", "share some of their elements", "clone() of src"}},
      {"copy_ of a shifted slice",
       [](Device d) {
         Tensor x = nc::arange(6, nc::TensorOptions(DType::F32, d));
         x.slice(0, 1, 6).copy_(x.slice(0, 0, 5));
       },
       typeid(nc::ValueError),
       {"copy_", "share some of their elements"}},
      // One value per group (or channel) in the whole batch normalizes to 0 whatever it is.
      {"group_norm of [1, 4], 4 groups",
       [](Device d) {
         nc::group_norm(f32({1, 2, 3, 4}, d).view({1, 4}), 4, Tensor(), Tensor());
       },
       typeid(nc::ValueError),
       {"group_norm: expected more than 1 value per group", "[1, 4]", "4 groups"}},
      {"group_norm of [1, 4, 1], 4 groups",
       [](Device d) {
         nc::group_norm(f32({1, 2, 3, 4}, d).view({1, 4, 1}), 4, Tensor(), Tensor());
       },
       typeid(nc::ValueError),
       {"group_norm: expected more than 1 value per group", "[1, 4, 1]"}},
      {"batch_norm training on [1, 3]",
       [](Device d) {
         nc::batch_norm(f32({1, 2, 3}, d).view({1, 3}), Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5);
       },
       typeid(nc::ValueError),
       {"batch_norm: expected more than 1 value per channel", "[1, 3]"}},
      {"batch_norm with eps = 0",
       [](Device d) {
         nc::batch_norm(f32({1, 2, 3, 4}, d).view({2, 2}), Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 0.0);
       },
       typeid(nc::ValueError),
       {"batch_norm", "eps"}},
      // Pooling: only the batch may be empty.
      {"max_pool2d of C = 0",
       [](Device d) {
         nc::max_pool2d(nc::zeros({2, 0, 4, 4}, TensorOptions(DType::F32, d)), 2);
       },
       typeid(nc::ShapeError),
       {"max_pool2d: x must have a non-zero channel count", "[2, 0, 4, 4]"}},
      {"max_pool2d of [0, 4, 4]",
       [](Device d) {
         nc::max_pool2d(nc::zeros({0, 4, 4}, TensorOptions(DType::F32, d)), 2);
       },
       typeid(nc::ShapeError),
       {"max_pool2d: x must have a non-zero channel count", "[0, 4, 4]"}},
      {"avg_pool2d of C = 0",
       [](Device d) {
         nc::avg_pool2d(nc::zeros({2, 0, 4, 4}, TensorOptions(DType::F32, d)), 2);
       },
       typeid(nc::ShapeError),
       {"avg_pool2d: x must have a non-zero channel count"}},
  };
  return rows;
}

TEST(PyTorchSemantics, RefusesWhatPyTorchRefuses) {
  for (Device device : devices()) {
    for (const Refusal& row : refusals()) {
      SCOPED_TRACE(std::string(row.name) + " on " + device.str());
      try {
        row.call(device);
        ADD_FAILURE() << "no error";
      } catch (const nc::Error& e) {
        EXPECT_EQ(std::string(typeid(e).name()), std::string(row.type.name())) << e.what();
        for (const std::string& fragment : row.fragments)
          EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
              << "'" << fragment << "' not in: " << e.what();
      }
    }
    // What PyTorch accepts beside them: a copy onto the same elements, between interleaved
    // views of one tensor, empty batches, and empty channels in adaptive pooling.
    Tensor x = nc::arange(6, nc::TensorOptions(DType::F32, device));
    x.copy_(x);
    x.slice(0, 0, 6, 2).copy_(x.slice(0, 1, 6, 2));
    EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{1, 1, 3, 3, 5, 5}));
    EXPECT_EQ(nc::max_pool2d(nc::zeros({0, 3, 4, 4}, nc::TensorOptions(DType::F32, device)), 2).shape(),
              (nc::Shape{0, 3, 2, 2}));
    EXPECT_EQ(nc::adaptive_avg_pool2d(nc::zeros({2, 0, 4, 4}, nc::TensorOptions(DType::F32, device)), 1).shape(),
              (nc::Shape{2, 0, 1, 1}));
  }
}

}  // namespace
