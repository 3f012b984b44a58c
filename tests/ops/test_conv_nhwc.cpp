// conv2d_fused in NHWC on the CPU, f32, one group: the direct kernel (kernels/cpu/conv_nhwc.h)
// where AVX-512 is in use (the NCHW kernels through copies otherwise: ctest runs these again
// as cpu.conv_nhwc_avx2) against conv2d in f64, at shapes that reach each of its branches:
// output channels past a whole tile (masked lanes), blocks of k that split a tap's channels,
// pixels of two samples in one tile, taps in the padding, strides, dilations, and pieces cut
// by pixels and by channels. The weight given as a plain [O, kh, kw, C] tensor and as a view
// of [kh, kw, C, O] memory (read without a copy) gives the same bits, and so do one and two
// threads, and the weight in panels of 64 output channels (core/conv_panels.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/conv_panels.h"
#include "kernels/cpu/conv_nhwc.h"
#include "normcore/normcore.h"
#include "tests/test_support.h"

namespace nc = normcore;
using nc::DType;
using nc::Size2;
using nc::Tensor;
using normcore_test::relative_error;

namespace {

Tensor random(const nc::Shape& shape, uint64_t seed) {
  nc::Generator gen(seed);
  return nc::randn(shape, DType::F64, &gen);
}

struct Case {
  std::string name;
  nc::Shape x, weight;  // NCHW and [O, C, kh, kw], as conv2d takes them
  Size2 stride, padding, dilation;
  bool bias, residual, relu;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"70 channels: a tile and 6 lanes", {2, 20, 9, 11}, {70, 20, 3, 3}, 1, 1, 1, true, false, true},
      {"300 channels: blocks of k split taps", {1, 300, 5, 7}, {33, 300, 3, 3}, 2, 1, 1, true, true, false},
      {"more channels than pixels, 1x1", {3, 17, 6, 6}, {520, 17, 1, 1}, 1, 0, 1, false, true, true},
      {"dilation 2", {1, 16, 12, 12}, {32, 16, 3, 3}, 1, 2, 2, true, false, false},
      {"pieces of pixels", {1, 64, 28, 28}, {64, 64, 3, 3}, 1, 1, 1, true, true, true},
      {"1x1 stride 2, residual", {2, 32, 8, 8}, {48, 32, 1, 1}, 2, 0, 1, true, true, true},
      {"5x3 kernel, strides (2, 1)", {1, 24, 10, 9}, {40, 24, 5, 3}, Size2(2, 1), Size2(2, 1), 1, true, false, true},
      {"one output channel", {1, 16, 4, 4}, {1, 16, 3, 3}, 1, 1, 1, false, false, false},
      {"padding past the kernel's reach", {2, 16, 3, 3}, {20, 16, 3, 3}, 1, 3, 1, true, true, true},
  };
  return c;
}

struct Operands {
  Tensor want;  // f64, NCHW
  Tensor x, w, b, r;
};

Operands make(const Case& c, uint64_t seed) {
  nc::autograd::NoGradGuard no_grad;
  Operands run;
  const Tensor x = random(c.x, seed), w = random(c.weight, seed + 1);
  const Tensor b = c.bias ? random({c.weight[0]}, seed + 2) : Tensor();
  run.want = nc::conv2d(x, w, b, c.stride, c.padding, c.dilation);
  const Tensor r = c.residual ? random(run.want.shape(), seed + 3) : Tensor();
  if (r.defined()) run.want = nc::add(run.want, r);
  if (c.relu) run.want = nc::relu(run.want);
  run.x = x.permute({0, 2, 3, 1}).contiguous().to(DType::F32);
  run.w = w.permute({0, 2, 3, 1}).contiguous().to(DType::F32);
  run.b = b.defined() ? b.to(DType::F32) : b;
  run.r = r.defined() ? r.permute({0, 2, 3, 1}).contiguous().to(DType::F32) : r;
  return run;
}

Tensor fused(const Case& c, const Operands& run, const Tensor& w) {
  nc::autograd::NoGradGuard no_grad;
  return nc::conv2d_fused(run.x, w, run.b, run.r, c.relu, c.stride, c.padding, c.dilation, 1, nc::ConvLayout::NHWC);
}

class ConvNhwcCpu : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = nc::num_threads(); }
  void TearDown() override { nc::set_num_threads(saved_); }
  int saved_ = 1;
};

}  // namespace

TEST_F(ConvNhwcCpu, MatchesConv2dInDoubleAtEveryBranch) {
  uint64_t seed = 500;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Operands run = make(c, seed += 10);
    const Tensor got = fused(c, run, run.w);
    EXPECT_LT(relative_error(got.permute({0, 3, 1, 2}), run.want), 1e-5);
  }
}

TEST_F(ConvNhwcCpu, AWeightLaidOutHwioGivesTheSameBitsAtAnyThreadCount) {
  uint64_t seed = 900;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Operands run = make(c, seed += 10);
    // [kh, kw, C, O] memory, viewed as the [O, kh, kw, C] weight the op takes.
    const Tensor hwio = run.w.permute({1, 2, 3, 0}).contiguous().permute({3, 0, 1, 2});
    if (c.weight[0] > 1) ASSERT_FALSE(hwio.is_contiguous());
    nc::set_num_threads(1);
    const std::vector<float> one = fused(c, run, run.w).to_vector<float>();
    EXPECT_EQ(fused(c, run, hwio).to_vector<float>(), one);
    nc::set_num_threads(2);
    EXPECT_EQ(fused(c, run, run.w).to_vector<float>(), one);
  }
}

TEST_F(ConvNhwcCpu, TheDirectKernelRunsWhereAvx512Does) {
  // The kernel itself on a case of two pieces' worth, where the processor has it.
  if (!nc::cpu::conv_nhwc_in_use()) GTEST_SKIP() << "no AVX-512 here (or NORMCORE_CPU_ISA caps it)";
  const Case c{"direct", {1, 32, 14, 14}, {96, 32, 3, 3}, 1, 1, 1, true, true, true};
  const Operands run = make(c, 7);
  const Tensor hwio = run.w.permute({1, 2, 3, 0}).contiguous();
  Tensor y = nc::empty({1, 14, 14, 96}, nc::TensorOptions(DType::F32));
  const std::vector<float> zeros(3 * 32, 0.0f);  // kw * c
  nc::cpu::NhwcConv g;
  g.x = run.x.data<float>(), g.weight = hwio.data<float>(), g.bias = run.b.data<float>();
  g.residual = run.r.data<float>(), g.y = y.data<float>(), g.zeros = zeros.data();
  g.n = 1, g.h = 14, g.w = 14, g.c = 32, g.o = 96, g.kh = 3, g.kw = 3, g.out_h = 14, g.out_w = 14;
  g.pad_h = 1, g.pad_w = 1, g.relu = true;
  ASSERT_TRUE(nc::cpu::conv_nhwc(g));
  EXPECT_LT(relative_error(y.permute({0, 3, 1, 2}), run.want), 1e-5);
}

TEST_F(ConvNhwcCpu, WeightPanelsGiveTheSameBits) {
  uint64_t seed = 1300;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Operands run = make(c, seed += 10);
    const Tensor panels = nc::detail::conv_weight_panels(run.w);
    const int64_t o = c.weight[0];
    ASSERT_EQ(panels.shape(), (nc::Shape{(o + 63) / 64, c.weight[2], c.weight[3], c.weight[1], 64}));
    // Panel p holds channels 64 p ... as its last dim; zeros past o.
    const Tensor back = panels.permute({0, 4, 1, 2, 3}).reshape({-1, c.weight[2], c.weight[3], c.weight[1]});
    EXPECT_EQ(back.narrow(0, 0, o).contiguous().to_vector<float>(), run.w.to_vector<float>());
    if (back.size(0) > o) EXPECT_EQ(nc::max(nc::abs(back.narrow(0, o, back.size(0) - o))).item<float>(), 0.0f);
    nc::autograd::NoGradGuard no_grad;
    const Tensor got =
        nc::detail::conv2d_nhwc_panels(run.x, run.w, panels, run.b, run.r, c.relu, c.stride, c.padding, c.dilation);
    EXPECT_EQ(got.to_vector<float>(), fused(c, run, run.w).to_vector<float>());
  }
  // Panels of another weight's shape are refused, naming both.
  const Operands run = make(cases().front(), 7);
  const Tensor other = nc::detail::conv_weight_panels(nc::zeros({70, 3, 3, 21}));
  nc::autograd::NoGradGuard no_grad;
  try {
    nc::detail::conv2d_nhwc_panels(run.x, run.w, other, run.b, Tensor(), true, 1, 1, 1);
    if (nc::cpu::conv_nhwc_in_use()) ADD_FAILURE() << "no ShapeError";
  } catch (const nc::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("conv2d_fused"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 3, 3, 21, 64]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[70, 3, 3, 20]"), std::string::npos) << e.what();
  }
}
