// Pooling: max_pool2d, avg_pool2d and adaptive_avg_pool2d against small cases worked out by
// hand from PyTorch's rules (output size with ceil_mode and its last-window rule, padding
// as -infinity for max and PyTorch's divisors for avg, adaptive bins, NaN and ties), values
// and gradients; float64 gradchecks on the CPU; the CUDA kernels against the CPU reference
// in every floating dtype, forward and backward; and the layers.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "normcore/normcore.h"

namespace nc = normcore;
using nc::DType;
using nc::Size2;
using nc::Tensor;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::nan("");

Tensor f64(std::vector<double> values, nc::Shape shape) { return nc::from_vector<double>(values, shape); }

// 1, 2, ..., n as f64 of shape.
Tensor counting(nc::Shape shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return nc::arange(1, n + 1, 1, DType::F64).reshape(shape);
}

std::vector<double> values(const Tensor& t) {
  return t.to(nc::Device::cpu()).to(DType::F64).contiguous().to_vector<double>();
}

// Equal within tol (relative) element by element, NaN matching NaN and infinities exactly.
void expect_values(const Tensor& got, const std::vector<double>& expected, const std::string& what,
                   double tol = 1e-12) {
  const std::vector<double> v = values(got);
  ASSERT_EQ(v.size(), expected.size()) << what;
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isnan(expected[i])) {
      EXPECT_TRUE(std::isnan(v[i])) << what << " at " << i << ": " << v[i];
    } else if (std::isinf(expected[i])) {
      EXPECT_EQ(v[i], expected[i]) << what << " at " << i;
    } else {
      EXPECT_NEAR(v[i], expected[i], tol * (1 + std::fabs(expected[i]))) << what << " at " << i;
    }
  }
}

using PoolOp = std::function<Tensor(const Tensor&)>;

PoolOp max_pool(Size2 kernel, Size2 stride = Size2(), Size2 padding = 0, Size2 dilation = 1, bool ceil_mode = false) {
  return [=](const Tensor& x) { return nc::max_pool2d(x, kernel, stride, padding, dilation, ceil_mode); };
}
PoolOp avg_pool(Size2 kernel, Size2 stride = Size2(), Size2 padding = 0, bool ceil_mode = false,
                bool count_include_pad = true) {
  return [=](const Tensor& x) { return nc::avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad); };
}
PoolOp adaptive(Size2 output_size) {
  return [=](const Tensor& x) { return nc::adaptive_avg_pool2d(x, output_size); };
}

// ---------------------------------------------------------------- values and gradients
// y = op(x) must have out_shape and out; with grad_out given, x.grad() after
// y.backward(grad_out) must be grad_x.
struct ValueCase {
  std::string name;
  Tensor x;
  PoolOp op;
  nc::Shape out_shape;
  std::vector<double> out;
  std::vector<double> grad_out = {};
  std::vector<double> grad_x = {};
};

std::vector<ValueCase> value_cases() {
  const Tensor row5 = f64({1, 2, 3, 4, 5}, {1, 1, 1, 5});
  const Tensor row4 = f64({1, 2, 3, 4}, {1, 1, 1, 4});
  return {
      // 1..16 in a 4x4 plane.
      {"max 2x2",
       counting({1, 1, 4, 4}),
       max_pool(2),
       {1, 1, 2, 2},
       {6, 8, 14, 16},
       {1, 2, 3, 4},
       {0, 0, 0, 0, 0, 1, 0, 2, 0, 0, 0, 0, 0, 3, 0, 4}},
      // Windows rows {0, 1}, {1, 2, 3}, {3, 4} of a 5x5 plane of 1..25.
      {"max 3x3 stride 2 padding 1",
       counting({1, 1, 5, 5}),
       max_pool(3, 2, 1),
       {1, 1, 3, 3},
       {7, 9, 10, 17, 19, 20, 22, 24, 25}},
      {"max stride not given is kernel_size", counting({1, 1, 4, 6}), max_pool({2, 3}), {1, 1, 2, 2}, {9, 12, 21, 24}},
      // Taps at (0, 0), (0, 2), (2, 0), (2, 2) from each window's corner.
      {"max dilation 2", counting({1, 1, 4, 4}), max_pool(2, 1, 0, 2), {1, 1, 2, 2}, {11, 12, 15, 16}},
      {"max dilation along one dim",
       f64({3, 1, 4, 1, 5, 9, 2}, {1, 1, 1, 7}),
       max_pool({1, 2}, 1, 0, {1, 3}),
       {1, 1, 1, 4},
       {3, 5, 9, 2}},
      // Floor gives 2 windows; ceil_mode adds the partial window {4}.
      {"max ceil_mode adds a partial window",
       row5,
       max_pool({1, 2}, {1, 2}, 0, 1, true),
       {1, 1, 1, 3},
       {2, 4, 5},
       {1, 1, 1},
       {0, 1, 0, 1, 1}},
      {"max without ceil_mode drops it", row5, max_pool({1, 2}, {1, 2}), {1, 1, 1, 2}, {2, 4}},
      // Ceil would give 3 windows, but the third would start at 5, in the right padding.
      {"max ceil_mode never starts a window in the right padding",
       row5,
       max_pool({1, 3}, {1, 3}, {0, 1}, 1, true),
       {1, 1, 1, 2},
       {2, 5}},
      // The padding is -infinity, not 0.
      {"max padding is -inf",
       f64({-5, -3}, {1, 1, 1, 2}),
       max_pool({1, 2}, 1, {0, 1}),
       {1, 1, 1, 3},
       {-5, -3, -3},
       {1, 2, 3},
       {1, 5}},
      // Taps at -1 and 2 of a row of 2: nothing of the input.
      {"max window of padding only",
       f64({1, 2}, {1, 1, 1, 2}),
       max_pool({1, 2}, 1, {0, 1}, {1, 3}),
       {1, 1, 1, 1},
       {-kInf},
       {1},
       {0, 0}},
      // Overlapping windows with the same maximum add their gradients.
      {"max overlapping windows share a maximum",
       f64({1, 5, 2, 3}, {1, 1, 1, 4}),
       max_pool({1, 3}, 1),
       {1, 1, 1, 2},
       {5, 5},
       {1, 10},
       {0, 11, 0, 0}},
      {"max NaN wins", f64({1, kNaN, 3, 2}, {1, 1, 2, 2}), max_pool(2), {1, 1, 1, 1}, {kNaN}, {1}, {0, 1, 0, 0}},
      {"max a later NaN replaces an earlier one (PyTorch)",
       f64({kNaN, 1, kNaN, 0}, {1, 1, 2, 2}),
       max_pool(2),
       {1, 1, 1, 1},
       {kNaN},
       {1},
       {0, 0, 1, 0}},
      {"max ties go to the first", f64({5, 5, 5, 5}, {1, 1, 2, 2}), max_pool(2), {1, 1, 1, 1}, {5}, {1}, {1, 0, 0, 0}},
      {"max of -inf goes to the first",
       f64({-kInf, -kInf, -kInf, -kInf}, {1, 1, 2, 2}),
       max_pool(2),
       {1, 1, 1, 1},
       {-kInf},
       {1},
       {1, 0, 0, 0}},
      {"max [C, H, W]", counting({2, 2, 2}), max_pool(2), {2, 1, 1}, {4, 8}, {1, 2}, {0, 0, 0, 1, 0, 0, 0, 2}},
      {"max 2 x 2 planes", counting({2, 2, 2, 2}), max_pool({2, 1}), {2, 2, 1, 2}, {3, 4, 7, 8, 11, 12, 15, 16}},
      {"max empty batch", nc::zeros({0, 3, 4, 4}, DType::F64), max_pool(2), {0, 3, 2, 2}, {}, {}, {}},
      {"adaptive no channels (max and avg pooling refuse them)",
       nc::zeros({2, 0, 4, 4}, DType::F64),
       adaptive(1),
       {2, 0, 1, 1},
       {},
       {},
       {}},

      {"avg 2x2",
       counting({1, 1, 4, 4}),
       avg_pool(2),
       {1, 1, 2, 2},
       {3.5, 5.5, 11.5, 13.5},
       {4, 8, 12, 16},
       {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}},
      // 1..9 in a 3x3 plane, 3x3 windows with padding 1: every divisor is 9 ...
      {"avg padding, count_include_pad",
       counting({1, 1, 3, 3}),
       avg_pool(3, 1, 1),
       {1, 1, 3, 3},
       {12. / 9, 21. / 9, 16. / 9, 27. / 9, 45. / 9, 33. / 9, 24. / 9, 39. / 9, 28. / 9},
       {9, 0, 0, 0, 0, 0, 0, 0, 0},
       {1, 1, 0, 1, 1, 0, 0, 0, 0}},
      // ... or the number of input elements: 4 in the corners, 6 on the edges.
      {"avg padding, count_include_pad false",
       counting({1, 1, 3, 3}),
       avg_pool(3, 1, 1, false, false),
       {1, 1, 3, 3},
       {3, 3.5, 4, 4.5, 5, 5.5, 6, 6.5, 7},
       {4, 6, 0, 0, 0, 0, 0, 0, 0},
       {2, 2, 1, 2, 2, 1, 0, 0, 0}},
      {"avg overlapping windows",
       row4,
       avg_pool({1, 2}, 1),
       {1, 1, 1, 3},
       {1.5, 2.5, 3.5},
       {1, 2, 3},
       {0.5, 1.5, 2.5, 1.5}},
      // Windows [-1, 2), [1, 4), [3, 6) of a row of 5 with padding 1: all 3 wide in the padded row.
      {"avg ceil_mode and padding", row5, avg_pool({1, 3}, {1, 2}, {0, 1}, true), {1, 1, 1, 3}, {1, 3, 3}},
      {"avg ceil_mode and padding, count_include_pad false",
       row5,
       avg_pool({1, 3}, {1, 2}, {0, 1}, true, false),
       {1, 1, 1, 3},
       {1.5, 3, 4.5}},
      // The last window [3, 6) reaches past the padded row [-1, 5): its divisor is 2, not 3.
      {"avg divisor clipped to the padded input",
       row4,
       avg_pool({1, 3}, {1, 2}, {0, 1}, true),
       {1, 1, 1, 3},
       {1, 3, 2},
       {3, 3, 2},
       {1, 2, 1, 2}},
      {"avg divisor clipped, count_include_pad false",
       row4,
       avg_pool({1, 3}, {1, 2}, {0, 1}, true, false),
       {1, 1, 1, 3},
       {1.5, 3, 4},
       {2, 3, 1},
       {1, 2, 1, 2}},
      {"avg ceil_mode partial window",
       row5,
       avg_pool({1, 2}, {1, 2}, 0, true),
       {1, 1, 1, 3},
       {1.5, 3.5, 5},
       {2, 2, 3},
       {1, 1, 1, 1, 3}},
      {"avg [C, H, W]", counting({2, 2, 2}), avg_pool(2), {2, 1, 1}, {2.5, 6.5}},
      {"avg empty batch", nc::zeros({0, 2, 3, 3}, DType::F64), avg_pool(2), {0, 2, 1, 1}, {}, {}, {}},

      // Bins [0, 2), [1, 4), [3, 5).
      {"adaptive overlapping bins", row5, adaptive({1, 3}), {1, 1, 1, 3}, {1.5, 3, 4.5}, {2, 3, 4}, {1, 2, 1, 3, 2}},
      {"adaptive global mean",
       counting({1, 2, 2, 3}),
       adaptive(1),
       {1, 2, 1, 1},
       {3.5, 9.5},
       {6, 12},
       {1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2}},
      // Rows and columns binned [0, 2), [1, 3) in a 3x3 plane of 1..9.
      {"adaptive 3x3 to 2x2", counting({1, 1, 3, 3}), adaptive(2), {1, 1, 2, 2}, {3, 4, 6, 7}},
      // More bins than elements: [0, 1), [0, 1), [0, 2), [1, 2), [1, 2).
      {"adaptive larger than the input",
       f64({1, 3}, {1, 1, 1, 2}),
       adaptive({1, 5}),
       {1, 1, 1, 5},
       {1, 1, 2, 3, 3},
       {1, 1, 2, 1, 1},
       {3, 3}},
      {"adaptive identity", counting({1, 1, 2, 3}), adaptive({2, 3}), {1, 1, 2, 3}, {1, 2, 3, 4, 5, 6}},
      {"adaptive [C, H, W]", counting({2, 2, 2}), adaptive({1, 2}), {2, 1, 2}, {2, 3, 6, 7}},
      {"adaptive empty batch", nc::zeros({0, 2, 3, 3}, DType::F64), adaptive(2), {0, 2, 2, 2}, {}, {}, {}},
  };
}

TEST(Pool, ValuesAndGradients) {
  for (const ValueCase& c : value_cases()) {
    SCOPED_TRACE(c.name);
    Tensor x = c.x.clone().requires_grad_();
    Tensor y = c.op(x);
    EXPECT_EQ(y.shape(), c.out_shape);
    EXPECT_EQ(y.dtype(), DType::F64);
    expect_values(y, c.out, "y");
    if (c.grad_x.empty() && y.numel() > 0) continue;
    const Tensor grad_out = c.grad_out.empty() ? nc::zeros(c.out_shape, DType::F64) : f64(c.grad_out, c.out_shape);
    y.backward(grad_out);
    ASSERT_TRUE(x.grad().defined());
    EXPECT_EQ(x.grad().shape(), x.shape());
    expect_values(x.grad(), c.grad_x, "grad_x");
  }
}

// The ops read their input through its strides: a transposed view pools as its values.
TEST(Pool, NonContiguousInput) {
  Tensor base = counting({1, 1, 4, 4});
  Tensor x = base.transpose(2, 3);  // x[h, w] = base[w, h]
  ASSERT_FALSE(x.is_contiguous());
  expect_values(nc::max_pool2d(x, 2), {6, 14, 8, 16}, "max");
  expect_values(nc::avg_pool2d(x, 2), {3.5, 11.5, 5.5, 13.5}, "avg");
  expect_values(nc::adaptive_avg_pool2d(x, {1, 2}), {4.5, 12.5}, "adaptive");
  // The gradient reaches the base through the view.
  Tensor leaf = base.clone().requires_grad_();
  nc::sum(nc::max_pool2d(leaf.transpose(2, 3), 2)).backward();
  expect_values(leaf.grad(), {0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1}, "grad");
}

// Every floating dtype on the CPU, the 16-bit ones computing in float: the values here are
// exact in each.
TEST(Pool, EveryFloatingDtype) {
  for (DType dtype : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
    SCOPED_TRACE(nc::dtype_name(dtype));
    Tensor x = counting({1, 1, 4, 4}).to(dtype).requires_grad_();
    Tensor y = nc::max_pool2d(x, 2);
    EXPECT_EQ(y.dtype(), dtype);
    expect_values(y, {6, 8, 14, 16}, "max");
    y.backward(nc::ones_like(y));
    EXPECT_EQ(x.grad().dtype(), dtype);
    expect_values(x.grad(), {0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1}, "max grad");
    expect_values(nc::avg_pool2d(x, 2), {3.5, 5.5, 11.5, 13.5}, "avg");
    expect_values(nc::adaptive_avg_pool2d(x, 1), {8.5}, "adaptive");
  }
}

// Without recording nothing is attached, and the results are the same.
TEST(Pool, NoGradGivesTheSameValues) {
  Tensor x = nc::randn({2, 3, 7, 6}, DType::F64).requires_grad_();
  Tensor with_grad = nc::max_pool2d(x, 3, 2, 1, 1, true);
  Tensor without;
  {
    nc::autograd::NoGradGuard no_grad;
    without = nc::max_pool2d(x, 3, 2, 1, 1, true);
  }
  EXPECT_TRUE(with_grad.requires_grad());
  EXPECT_FALSE(without.requires_grad());
  EXPECT_EQ(values(with_grad), values(without));
}

// A channels-last view (NHWC memory seen as NCHW) max-pooled for inference on the CPU stays
// channels last and gives the planar path's bits, in every dtype and with padding, dilation,
// ceil_mode and NaNs; recording a gradient takes the planar path.
TEST(Pool, ChannelsLastViewsPoolChannelsLast) {
  struct Window {
    nc::Size2 kernel, stride, padding, dilation;
    bool ceil_mode;
  };
  const std::vector<Window> windows = {
      {3, 2, 1, 1, false}, {2, 2, 0, 1, false}, {3, 2, 1, 1, true}, {{3, 2}, {1, 2}, {1, 0}, {2, 1}, true}};
  for (DType dtype : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
    SCOPED_TRACE(nc::dtype_name(dtype));
    Tensor nhwc = nc::randn({2, 9, 7, 19}).to(dtype);
    std::vector<float> with_nans = nhwc.to(DType::F32).to_vector<float>();
    with_nans[5] = std::numeric_limits<float>::quiet_NaN();
    with_nans[19 * 8 + 3] = std::numeric_limits<float>::quiet_NaN();
    nhwc = nc::from_vector(with_nans, nhwc.shape()).to(dtype);
    const Tensor view = nhwc.permute({0, 3, 1, 2}), planar = view.contiguous();
    for (const Window& w : windows) {
      nc::autograd::NoGradGuard no_grad;
      const Tensor got = nc::max_pool2d(view, w.kernel, w.stride, w.padding, w.dilation, w.ceil_mode);
      const Tensor want = nc::max_pool2d(planar, w.kernel, w.stride, w.padding, w.dilation, w.ceil_mode);
      EXPECT_EQ(got.shape(), want.shape());
      EXPECT_FALSE(got.is_contiguous());
      EXPECT_TRUE(got.permute({0, 2, 3, 1}).is_contiguous());
      const std::vector<double> a = values(got), b = values(want);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        if (std::isnan(b[i])) EXPECT_TRUE(std::isnan(a[i])) << i;
        else EXPECT_EQ(a[i], b[i]) << i;
      }
    }
  }
  // With a gradient to record, the planar path and its indices.
  Tensor x = nc::randn({1, 5, 5, 4}, DType::F64).permute({0, 3, 1, 2}).requires_grad_();
  Tensor y = nc::max_pool2d(x, 2);
  EXPECT_TRUE(y.is_contiguous());
  nc::sum(y).backward();
  EXPECT_EQ(values(nc::sum(x.grad())), std::vector<double>{16.0});
}

// ---------------------------------------------------------------- gradchecks
struct GradCase {
  std::string name;
  PoolOp op;
  nc::Shape shape;
};

TEST(Pool, Gradcheck) {
  const std::vector<GradCase> cases = {
      {"max 2x2", max_pool(2), {2, 3, 4, 6}},
      {"max 3x3 stride 2 padding 1", max_pool(3, 2, 1), {2, 2, 7, 5}},
      {"max ceil_mode", max_pool(3, 2, 1, 1, true), {1, 2, 6, 6}},
      {"max dilation", max_pool({2, 3}, 1, {1, 1}, {2, 1}), {1, 2, 5, 6}},
      {"max overlapping, [C, H, W]", max_pool({3, 2}, 1), {3, 5, 4}},
      {"avg 2x2", avg_pool(2), {2, 3, 4, 6}},
      {"avg padding", avg_pool(3, 2, 1), {2, 2, 7, 5}},
      {"avg padding, count_include_pad false", avg_pool(3, 2, 1, false, false), {2, 2, 7, 5}},
      {"avg ceil_mode", avg_pool({3, 2}, {2, 2}, {1, 1}, true), {1, 2, 6, 5}},
      {"avg ceil_mode, count_include_pad false", avg_pool({3, 2}, {2, 2}, {1, 1}, true, false), {1, 2, 6, 5}},
      {"avg overlapping, [C, H, W]", avg_pool(3, 1), {2, 5, 5}},
      {"adaptive down", adaptive({3, 4}), {2, 2, 5, 7}},
      {"adaptive up", adaptive({6, 5}), {1, 2, 4, 4}},
      {"adaptive global, [C, H, W]", adaptive(1), {3, 4, 5}},
  };
  for (const GradCase& c : cases) {
    SCOPED_TRACE(c.name);
    nc::Generator gen(7);
    // Normal values are far enough apart that no difference step changes a window's maximum.
    Tensor x = nc::randn(c.shape, DType::F64, &gen).requires_grad_();
    std::string report;
    EXPECT_TRUE(nc::gradcheck([&](const std::vector<Tensor>& in) { return c.op(in[0]); }, {x}, {}, &report)) << report;
  }
}

// ---------------------------------------------------------------- CUDA against the CPU
struct CudaCase {
  std::string name;
  PoolOp op;
  nc::Shape shape;
};

// Sizes reach one block and many, odd planes, windows that overlap (several windows
// gathered per element), windows in the padding, ceil_mode's partial windows, dilation,
// [C, H, W] inputs and empty batches.
std::vector<CudaCase> cuda_cases() {
  return {
      {"max 2x2", max_pool(2), {4, 16, 32, 32}},
      {"max 3x3 stride 2 padding 1", max_pool(3, 2, 1), {2, 8, 33, 31}},
      {"max ceil_mode", max_pool(3, 2, 0, 1, true), {3, 5, 14, 17}},
      {"max ceil_mode and padding", max_pool({3, 2}, {2, 3}, {1, 1}, 1, true), {2, 3, 20, 23}},
      {"max dilation", max_pool(3, 1, 1, 2), {2, 4, 19, 21}},
      {"max dilation and stride", max_pool({2, 3}, {3, 2}, {1, 0}, {3, 2}, true), {2, 3, 25, 26}},
      {"max stride 1 overlaps", max_pool(5, 1, 2), {1, 3, 40, 40}},
      {"max window larger than stride, one plane", max_pool(4, 3), {1, 1, 301, 257}},
      {"max [C, H, W]", max_pool(2), {5, 9, 11}},
      {"max many planes", max_pool(2), {64, 512, 4, 4}},
      {"max empty batch", max_pool(2), {0, 3, 8, 8}},
      {"avg 2x2", avg_pool(2), {4, 16, 32, 32}},
      {"avg 3x3 stride 2 padding 1", avg_pool(3, 2, 1), {2, 8, 33, 31}},
      {"avg padding, count_include_pad false", avg_pool(3, 2, 1, false, false), {2, 8, 33, 31}},
      {"avg ceil_mode and padding", avg_pool({3, 2}, {2, 2}, {1, 1}, true), {2, 3, 20, 23}},
      {"avg ceil_mode and padding, count_include_pad false",
       avg_pool({3, 2}, {2, 2}, {1, 1}, true, false),
       {2, 3, 20, 23}},
      {"avg stride 1 overlaps", avg_pool(5, 1, 2), {1, 3, 40, 40}},
      {"avg [C, H, W]", avg_pool(3, 2), {5, 9, 11}},
      {"avg empty batch", avg_pool(2), {0, 3, 8, 8}},
      {"adaptive down", adaptive({3, 4}), {4, 8, 17, 23}},
      {"adaptive up", adaptive({13, 11}), {2, 3, 5, 4}},
      {"adaptive same size", adaptive({7, 9}), {2, 3, 7, 9}},
      {"adaptive global, large planes", adaptive(1), {2, 4, 224, 224}},
      {"adaptive 7x7 of a CNN", adaptive(7), {8, 64, 14, 14}},
      {"adaptive [C, H, W]", adaptive({2, 5}), {5, 9, 11}},
      {"adaptive empty batch", adaptive(2), {0, 3, 8, 8}},
  };
}

// Tolerance for values of magnitude 1: the CPU sums in double and rounds once, the GPU sums
// in float (double for f64) in another order.
double tolerance(DType dtype) {
  switch (dtype) {
    case DType::F64: return 1e-12;
    case DType::F32: return 1e-5;
    case DType::F16: return 4e-3;
    default: return 3e-2;
  }
}

void expect_close(const Tensor& gpu, const Tensor& cpu, double tol, const std::string& what) {
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  ASSERT_TRUE(gpu.device().is_cuda()) << what;
  const std::vector<double> got = values(gpu), expected = values(cpu);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], expected[i], tol * (1 + std::fabs(expected[i]))) << what << " at " << i << " of " << got.size();
  }
}

void run_cuda_case(const CudaCase& c, DType dtype) {
  SCOPED_TRACE(c.name + " " + nc::dtype_name(dtype));
  nc::Generator gen(3);
  const Tensor x = nc::randn(c.shape, DType::F64, &gen).to(dtype);
  Tensor cpu_x = x.clone().requires_grad_();
  Tensor gpu_x = x.to(nc::Device::cuda()).requires_grad_();
  Tensor cpu_y = c.op(cpu_x), gpu_y = c.op(gpu_x);
  EXPECT_EQ(gpu_y.dtype(), dtype);
  // A maximum is one of the inputs: the two devices agree exactly.
  const bool is_max = c.name.rfind("max", 0) == 0;
  expect_close(gpu_y, cpu_y, is_max ? 0.0 : tolerance(dtype), "y");
  const Tensor grad = nc::randn(cpu_y.shape(), DType::F64, &gen).to(dtype);
  cpu_y.backward(grad);
  gpu_y.backward(grad.to(nc::Device::cuda()));
  ASSERT_TRUE(gpu_x.grad().defined());
  EXPECT_EQ(gpu_x.grad().dtype(), dtype);
  // Overlapping windows add several gradients per element, in another order on each device.
  expect_close(gpu_x.grad(), cpu_x.grad(), 4 * tolerance(dtype), "grad_x");
}

TEST(PoolCuda, MatchesCpuForwardAndBackward) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (const CudaCase& c : cuda_cases()) {
    for (DType dtype : {DType::F64, DType::F32, DType::F16, DType::BF16}) run_cuda_case(c, dtype);
  }
}

// The hand-worked cases, on the GPU: NaN, ties, -inf padding, windows of padding only,
// ceil_mode's rules and the avg divisors give the same values and gradients.
TEST(PoolCuda, HandWorkedCases) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (const ValueCase& c : value_cases()) {
    for (DType dtype : {DType::F64, DType::F32}) {
      SCOPED_TRACE(c.name + " " + nc::dtype_name(dtype));
      Tensor x = c.x.to(dtype).to(nc::Device::cuda()).requires_grad_();
      Tensor y = c.op(x);
      EXPECT_TRUE(y.device().is_cuda());
      EXPECT_EQ(y.shape(), c.out_shape);
      expect_values(y, c.out, "y", 1e-6);
      if (c.grad_x.empty() && y.numel() > 0) continue;
      const Tensor grad_out = c.grad_out.empty() ? nc::zeros(c.out_shape, DType::F64) : f64(c.grad_out, c.out_shape);
      y.backward(grad_out.to(dtype).to(nc::Device::cuda()));
      ASSERT_TRUE(x.grad().defined());
      expect_values(x.grad(), c.grad_x, "grad_x", 1e-6);
    }
  }
}

// The gradients are gathered in a fixed order: two runs give the same bits.
TEST(PoolCuda, BackwardIsDeterministic) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  nc::Generator gen(5);
  // Few distinct values, so that many windows share a maximum.
  const Tensor x = nc::randint(0, 5, {4, 8, 37, 41}, DType::F32, &gen).to(nc::Device::cuda());
  const Tensor grad = nc::randn({4, 8, 37, 41}, DType::F32, &gen).to(nc::Device::cuda());
  const std::vector<PoolOp> ops = {max_pool(5, 1, 2), avg_pool(5, 1, 2, false, false), adaptive({29, 31})};
  for (size_t k = 0; k < ops.size(); ++k) {
    SCOPED_TRACE(k);
    std::vector<std::vector<double>> runs;
    for (int run = 0; run < 2; ++run) {
      Tensor leaf = x.clone().requires_grad_();
      Tensor y = ops[k](leaf);
      y.backward(grad.narrow(2, 0, y.size(2)).narrow(3, 0, y.size(3)).contiguous());
      runs.push_back(values(leaf.grad()));
    }
    EXPECT_EQ(runs[0], runs[1]);
  }
}

// ---------------------------------------------------------------- layers
TEST(PoolLayers, HyperParametersAndDefaults) {
  nc::nn::MaxPool2d max_layer(3);
  EXPECT_EQ(max_layer.kernel_size, Size2(3, 3));
  EXPECT_EQ(max_layer.stride, Size2(3, 3));  // stride not given: kernel_size
  EXPECT_EQ(max_layer.padding, Size2(0, 0));
  EXPECT_EQ(max_layer.dilation, Size2(1, 1));
  EXPECT_FALSE(max_layer.ceil_mode);
  nc::nn::MaxPool2d max_full({3, 2}, {2, 1}, {1, 1}, {2, 1}, true);
  EXPECT_EQ(max_full.kernel_size, Size2(3, 2));
  EXPECT_EQ(max_full.stride, Size2(2, 1));
  EXPECT_EQ(max_full.padding, Size2(1, 1));
  EXPECT_EQ(max_full.dilation, Size2(2, 1));
  EXPECT_TRUE(max_full.ceil_mode);

  nc::nn::AvgPool2d avg_layer({2, 4}, Size2(), 1, true, false);
  EXPECT_EQ(avg_layer.kernel_size, Size2(2, 4));
  EXPECT_EQ(avg_layer.stride, Size2(2, 4));
  EXPECT_EQ(avg_layer.padding, Size2(1, 1));
  EXPECT_TRUE(avg_layer.ceil_mode);
  EXPECT_FALSE(avg_layer.count_include_pad);

  nc::nn::AdaptiveAvgPool2d adaptive_layer({1, 3});
  EXPECT_EQ(adaptive_layer.output_size, Size2(1, 3));

  // No parameters, no buffers: nothing in the state_dict.
  EXPECT_TRUE(max_layer.parameters().empty());
  EXPECT_TRUE(avg_layer.state_dict().empty());
  EXPECT_TRUE(adaptive_layer.state_dict().empty());
}

// Each layer's forward is its functional op with the layer's hyper-parameters.
TEST(PoolLayers, ForwardIsTheFunctionalOp) {
  nc::Generator gen(9);
  const Tensor x = nc::randn({2, 3, 9, 8}, DType::F32, &gen);
  nc::nn::MaxPool2d max_layer(3, 2, 1, 1, true);
  EXPECT_EQ(values(max_layer(x)), values(nc::max_pool2d(x, 3, 2, 1, 1, true)));
  nc::nn::AvgPool2d avg_layer(3, 2, 1, true, false);
  EXPECT_EQ(values(avg_layer(x)), values(nc::avg_pool2d(x, 3, 2, 1, true, false)));
  nc::nn::AdaptiveAvgPool2d adaptive_layer({2, 3});
  EXPECT_EQ(values(adaptive_layer(x)), values(nc::adaptive_avg_pool2d(x, {2, 3})));
  expect_values(nc::nn::MaxPool2d(2)(counting({1, 1, 4, 4})), {6, 8, 14, 16}, "MaxPool2d(2)");
  expect_values(nc::nn::AvgPool2d(2)(counting({1, 1, 4, 4})), {3.5, 5.5, 11.5, 13.5}, "AvgPool2d(2)");
  expect_values(nc::nn::AdaptiveAvgPool2d(1)(counting({1, 1, 4, 4})), {8.5}, "AdaptiveAvgPool2d(1)");
}

// In a Sequential, the gradient reaches the input through each pooling layer.
TEST(PoolLayers, GradientsFlowThroughASequential) {
  auto model = std::make_shared<nc::nn::Sequential>(std::vector<std::shared_ptr<nc::nn::Module>>{
      std::make_shared<nc::nn::MaxPool2d>(2), std::make_shared<nc::nn::AvgPool2d>(2),
      std::make_shared<nc::nn::AdaptiveAvgPool2d>(1)});
  Tensor x = counting({1, 1, 8, 8}).requires_grad_();
  Tensor y = (*model)(x);
  EXPECT_EQ(y.shape(), (nc::Shape{1, 1, 1, 1}));
  // The 2x2 maxima of 1..64 are the odd rows' odd columns: their mean is 37.
  expect_values(y, {37}, "y");
  y.backward(nc::ones_like(y));
  // Each of the 16 maxima gets 1/16 of the gradient; every other element none.
  std::vector<double> expected(64, 0.0);
  for (int h = 1; h < 8; h += 2)
    for (int w = 1; w < 8; w += 2) expected[h * 8 + w] = 1.0 / 16;
  expect_values(x.grad(), expected, "grad_x");
}

}  // namespace
