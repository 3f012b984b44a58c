// nc::linear (the product and its bias in one call): values and gradients against the
// composition matmul + add on the CPU in f64, f32 and the 16-bit dtypes (whose bias joins the
// product before it is rounded), float64 gradchecks, autocast, argument errors, and the
// CUDA path (cuBLASLt's bias epilogue, and the composition where it does not apply)
// against the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "normcore/normcore.h"
#include "tests/test_support.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;
using normcore_test::random;
using normcore_test::relative_error;
using normcore_test::throws;
using normcore_test::values;

namespace {

struct Outcome {
  Tensor y, grad_x, grad_weight, grad_bias;
};

// y and the three gradients (of sum(y * probe)) of nc::linear, or of matmul + add, with x,
// weight and bias as fresh leaves on device in dtype.
Outcome run(bool fused, const Tensor& x0, const Tensor& w0, const Tensor& b0, nc::Device device, DType dtype) {
  const Tensor x = x0.to(device, dtype).detach().requires_grad_();
  const Tensor w = w0.to(device, dtype).detach().requires_grad_();
  const Tensor b = b0.to(device, dtype).detach().requires_grad_();
  const Tensor y = fused ? nc::linear(x, w, b) : nc::add(nc::matmul(x, w.t()), b);
  const Tensor probe = random(y.shape(), 99).to(device, dtype);
  nc::sum(nc::mul(y, probe)).backward();
  return {y, x.grad(), w.grad(), b.grad()};
}

}  // namespace

TEST(Linear, MatchesMatmulPlusBiasOnCpu) {
  for (const nc::Shape& xs : {nc::Shape{6, 5}, nc::Shape{2, 3, 4}, nc::Shape{1, 8}, nc::Shape{33, 16}}) {
    SCOPED_TRACE(nc::shape_str(xs));
    const int64_t out = xs.back() + 3;
    const Tensor x = random(xs, 1), w = random({out, xs.back()}, 2), b = random({out}, 3);
    for (DType dtype : {DType::F64, DType::F32}) {
      const double tol = dtype == DType::F64 ? 1e-13 : 1e-5;
      const Outcome fused = run(true, x, w, b, nc::Device::cpu(), dtype);
      const Outcome composed = run(false, x, w, b, nc::Device::cpu(), dtype);
      EXPECT_EQ(fused.y.dtype(), dtype);
      EXPECT_LT(relative_error(fused.y, composed.y), tol);
      EXPECT_LT(relative_error(fused.grad_x, composed.grad_x), tol);
      EXPECT_LT(relative_error(fused.grad_weight, composed.grad_weight), tol);
      EXPECT_LT(relative_error(fused.grad_bias, composed.grad_bias), tol);
    }
  }
  // Without a bias it is the product; with no rows it is empty.
  const Tensor x = random({3, 4}, 4), w = random({5, 4}, 5);
  EXPECT_EQ(values(nc::linear(x, w)), values(nc::matmul(x, w.t())));
  EXPECT_EQ(nc::linear(random({0, 4}, 6), w, random({5}, 7)).shape(), (nc::Shape{0, 5}));
}

TEST(Linear, SixteenBitBiasJoinsTheProductBeforeRounding) {
  // In bf16 the bias is added to the f32 product and the sum rounded once: exactly the f32
  // result of the rounded operands, rounded.
  const Tensor x = random({7, 24}, 8).to(DType::BF16), w = random({10, 24}, 9).to(DType::BF16);
  const Tensor b = random({10}, 10, 100.0).to(DType::BF16);
  for (DType dtype : {DType::BF16, DType::F16}) {
    const Tensor xd = x.to(dtype), wd = w.to(dtype), bd = b.to(dtype);
    const Tensor expected = nc::add(nc::matmul(xd.to(DType::F32), wd.to(DType::F32).t()), bd.to(DType::F32)).to(dtype);
    EXPECT_EQ(values(nc::linear(xd, wd, bd)), values(expected)) << nc::dtype_name(dtype);
  }
}

TEST(Linear, Gradcheck) {
  auto f = [](const std::vector<Tensor>& v) { return nc::linear(v[0], v[1], v[2]); };
  std::string report;
  EXPECT_TRUE(nc::gradcheck(f,
                            {random({2, 3, 4}, 11).requires_grad_(), random({5, 4}, 12).requires_grad_(),
                             random({5}, 13).requires_grad_()},
                            {}, &report))
      << report;
  // Only the bias needs a gradient; then only x.
  const Tensor x = random({4, 3}, 14), w = random({2, 3}, 15), b = random({2}, 16);
  auto g = [&](const std::vector<Tensor>& v) { return nc::linear(x, w, v[0]); };
  EXPECT_TRUE(nc::gradcheck(g, {random({2}, 17).requires_grad_()}, {}, &report)) << report;
  auto h = [&](const std::vector<Tensor>& v) { return nc::linear(v[0], w, b); };
  EXPECT_TRUE(nc::gradcheck(h, {random({4, 3}, 18).requires_grad_()}, {}, &report)) << report;
}

TEST(Linear, AutocastRunsInBf16WithF32Gradients) {
  const Tensor x0 = random({16, 32}, 19), w0 = random({24, 32}, 20, 0.1), b0 = random({24}, 21);
  const Outcome reference = run(false, x0, w0, b0, nc::Device::cpu(), DType::F64);
  const Tensor x = x0.to(DType::F32).detach().requires_grad_(), w = w0.to(DType::F32).detach().requires_grad_();
  const Tensor b = b0.to(DType::F32).detach().requires_grad_();
  Tensor y;
  {
    nc::autocast::Guard guard(DType::BF16);
    y = nc::linear(x, w, b);
  }
  EXPECT_EQ(y.dtype(), DType::BF16);
  EXPECT_LT(relative_error(y, reference.y), 1e-2);
  nc::sum(nc::mul(y, random(y.shape(), 99).to(DType::BF16))).backward();
  EXPECT_EQ(b.grad().dtype(), DType::F32);
  EXPECT_LT(relative_error(x.grad(), reference.grad_x), 2e-2);
  EXPECT_LT(relative_error(w.grad(), reference.grad_weight), 2e-2);
  EXPECT_LT(relative_error(b.grad(), reference.grad_bias), 2e-2);
}

TEST(Linear, BadArguments) {
  const Tensor x = random({3, 4}, 22).to(DType::F32), w = random({5, 4}, 23).to(DType::F32);
  throws<nc::ShapeError>(
      [&] {
        nc::linear(x, random({5, 3}, 24).to(DType::F32));
      },
      {"linear", "weight [out, in]", "[3, 4]", "[5, 3]"})();
  throws<nc::ShapeError>([&] { nc::linear(x, w, random({4}, 25).to(DType::F32)); },
                         {"linear", "bias must be [out] = [5]", "[4]"})();
  throws<nc::DTypeError>([&] { nc::linear(x, w, random({5}, 26)); }, {"linear", "bias", "f64"})();
  throws<nc::DTypeError>([&] { nc::linear(x, w.to(DType::F64)); }, {"linear", "x", "weight", "f64"})();
  throws<nc::ValueError>([&] { nc::linear(Tensor(), w); }, {"linear", "x"})();
}

TEST(Linear, CudaMatchesCpu) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  // Odd widths (cuBLASLt's alignments below 16 bytes), a GPT-2 block's shapes, one row.
  for (const nc::Shape& xs : {nc::Shape{6, 5}, nc::Shape{3, 7, 64}, nc::Shape{1, 8}, nc::Shape{256, 768}}) {
    SCOPED_TRACE(nc::shape_str(xs));
    const int64_t out = xs.back() == 768 ? 2304 : xs.back() + 3;
    const Tensor x = random(xs, 27), w = random({out, xs.back()}, 28, 0.2), b = random({out}, 29);
    const Outcome reference = run(false, x, w, b, nc::Device::cpu(), DType::F64);
    for (DType dtype : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE(nc::dtype_name(dtype));
      const double tol = dtype == DType::F64 ? 1e-12 : dtype == DType::F32 ? 1e-5 : 3e-2;
      const Outcome cuda = run(true, x, w, b, nc::Device::cuda(), dtype);
      EXPECT_EQ(cuda.y.device(), nc::Device::cuda());
      EXPECT_LT(relative_error(cuda.y, reference.y), tol);
      EXPECT_LT(relative_error(cuda.grad_x, reference.grad_x), tol);
      EXPECT_LT(relative_error(cuda.grad_weight, reference.grad_weight), tol);
      EXPECT_LT(relative_error(cuda.grad_bias, reference.grad_bias), tol);
    }
  }
  // A transposed x and a bias that is a slice starting 2 bytes in (no epilogue: the sum).
  const Tensor xt = random({16, 12}, 30).to(nc::Device::cuda(), DType::BF16).t();
  const Tensor w = random({8, 16}, 31).to(nc::Device::cuda(), DType::BF16);
  const Tensor b = random({9}, 32).to(nc::Device::cuda(), DType::BF16).narrow(0, 1, 8);
  const Tensor expected = nc::add(nc::matmul(xt.to(DType::F32), w.to(DType::F32).t()), b.to(DType::F32));
  EXPECT_LT(relative_error(nc::linear(xt, w, b), expected), 1e-2);
}

// ---------------------------------------------------------------- gelu_mlp
namespace {

struct MlpOutcome {
  Tensor y, grad_x, grad_w1, grad_b1, grad_w2, grad_b2;
};

// y and the gradients (of sum(y * probe)) of gelu_mlp (with recompute_gelu when recompute),
// or of linear, gelu, linear, with fresh leaves on device in dtype. p holds x, w1, b1, w2, b2.
MlpOutcome run_mlp(bool fused, const std::vector<Tensor>& p, nc::Device device, DType dtype, bool recompute = false) {
  std::vector<Tensor> v;
  for (const Tensor& t : p) v.push_back(t.to(device, dtype).detach().requires_grad_());
  const Tensor y = fused ? nc::gelu_mlp(v[0], v[1], v[2], v[3], v[4], recompute)
                         : nc::linear(nc::gelu(nc::linear(v[0], v[1], v[2]), true), v[3], v[4]);
  nc::sum(nc::mul(y, random(y.shape(), 98).to(device, dtype))).backward();
  return {y, v[0].grad(), v[1].grad(), v[2].grad(), v[3].grad(), v[4].grad()};
}

std::vector<Tensor> mlp_inputs(const nc::Shape& x_shape, int64_t hidden, int64_t out, uint64_t seed) {
  const int64_t in = x_shape.back();
  return {random(x_shape, seed), random({hidden, in}, seed + 1, 0.3), random({hidden}, seed + 2),
          random({out, hidden}, seed + 3, 0.3), random({out}, seed + 4)};
}

void expect_mlp_close(const MlpOutcome& a, const MlpOutcome& e, double tol) {
  EXPECT_LT(relative_error(a.y, e.y), tol);
  EXPECT_LT(relative_error(a.grad_x, e.grad_x), tol);
  EXPECT_LT(relative_error(a.grad_w1, e.grad_w1), tol);
  EXPECT_LT(relative_error(a.grad_b1, e.grad_b1), tol);
  EXPECT_LT(relative_error(a.grad_w2, e.grad_w2), tol);
  EXPECT_LT(relative_error(a.grad_b2, e.grad_b2), tol);
}

}  // namespace

TEST(GeluMlp, MatchesTheCompositionOnCpu) {
  for (const nc::Shape& xs : {nc::Shape{6, 5}, nc::Shape{2, 3, 8}, nc::Shape{1, 4}}) {
    SCOPED_TRACE(nc::shape_str(xs));
    const std::vector<Tensor> p = mlp_inputs(xs, 4 * xs.back(), xs.back(), 40);
    for (bool recompute : {false, true}) {
      SCOPED_TRACE(recompute ? "recompute_gelu" : "keep the GELU's output");
      for (DType dtype : {DType::F64, DType::F32}) {
        const MlpOutcome fused = run_mlp(true, p, nc::Device::cpu(), dtype, recompute);
        EXPECT_EQ(fused.y.dtype(), dtype);
        expect_mlp_close(fused, run_mlp(false, p, nc::Device::cpu(), dtype), dtype == DType::F64 ? 1e-13 : 1e-5);
      }
      // bf16: one rounding fewer (the GELU reads the f32 pre-activation, its gradient the f32
      // product) than the composition.
      const MlpOutcome reference = run_mlp(false, p, nc::Device::cpu(), DType::F64);
      expect_mlp_close(run_mlp(true, p, nc::Device::cpu(), DType::BF16, recompute), reference, 3e-2);
    }
  }
}

// Recomputing, gelu_mlp makes the GELU's output again from the same pre-activation and takes
// the GELU's input gradient from the product's epilogue: in f64 and f32 the composition's
// values and gradients bit for bit; in bf16 the same output, and gradients that skip the
// composition's rounding of the product (within bf16's rounding of it, and of the f64
// reference's).
TEST(GeluMlp, RecomputeGivesTheCompositionsGradients) {
  const std::vector<Tensor> p = mlp_inputs({3, 5, 8}, 32, 8, 45);
  const MlpOutcome reference = run_mlp(false, p, nc::Device::cpu(), DType::F64);
  for (DType dtype : {DType::F64, DType::F32, DType::BF16}) {
    SCOPED_TRACE(nc::dtype_name(dtype));
    const MlpOutcome kept = run_mlp(false, p, nc::Device::cpu(), dtype);
    const MlpOutcome again = run_mlp(true, p, nc::Device::cpu(), dtype, /*recompute=*/true);
    EXPECT_EQ(values(again.y), values(kept.y));
    EXPECT_EQ(values(again.grad_w2), values(kept.grad_w2));
    EXPECT_EQ(values(again.grad_b2), values(kept.grad_b2));
    if (dtype == DType::BF16) {
      EXPECT_LT(relative_error(again.grad_x, kept.grad_x), 1e-2);
      EXPECT_LT(relative_error(again.grad_w1, kept.grad_w1), 1e-2);
      EXPECT_LT(relative_error(again.grad_b1, kept.grad_b1), 1e-2);
      expect_mlp_close(again, reference, 3e-2);
      continue;
    }
    EXPECT_EQ(values(again.grad_x), values(kept.grad_x));
    EXPECT_EQ(values(again.grad_w1), values(kept.grad_w1));
    EXPECT_EQ(values(again.grad_b1), values(kept.grad_b1));
  }
}

// nn::MLP with recompute_gelu runs gelu_mlp: the same output and parameter gradients as the
// layers one by one.
TEST(GeluMlp, MlpModuleRecomputes) {
  nc::Generator gen(7);
  nc::nn::MLP mlp(8, /*bias=*/true, 0.0, &gen);
  const Tensor x = random({2, 3, 8}, 46).to(DType::F32);
  auto run = [&](bool recompute) {
    mlp.recompute_gelu = recompute;
    mlp.zero_grad();
    const Tensor y = mlp(x);
    nc::sum(nc::mul(y, y)).backward();
    return std::vector<std::vector<double>>{values(y), values(mlp.fc->weight.grad()), values(mlp.fc->bias.grad()),
                                            values(mlp.proj->weight.grad())};
  };
  const auto kept = run(false), again = run(true);
  ASSERT_EQ(kept.size(), again.size());
  for (size_t i = 0; i < kept.size(); ++i) {
    ASSERT_EQ(kept[i].size(), again[i].size());
    for (size_t j = 0; j < kept[i].size(); ++j) EXPECT_NEAR(again[i][j], kept[i][j], 1e-5 * (1 + std::abs(kept[i][j])));
  }
}

TEST(GeluMlp, GradcheckAndErrors) {
  std::vector<Tensor> p = mlp_inputs({2, 3, 4}, 6, 5, 50);
  for (Tensor& t : p) t.requires_grad_();
  for (bool recompute : {false, true}) {
    auto f = [recompute](const std::vector<Tensor>& v) {
      return nc::gelu_mlp(v[0], v[1], v[2], v[3], v[4], recompute);
    };
    std::string report;
    EXPECT_TRUE(nc::gradcheck(f, p, {}, &report)) << report;
  }
  const std::vector<Tensor> q = mlp_inputs({3, 4}, 8, 4, 60);
  throws<nc::ShapeError>([&] { nc::gelu_mlp(q[0], q[1], q[2], q[1], q[4]); },
                         {"gelu_mlp", "proj_weight [out, hidden]", "[8, 4]"})();
  throws<nc::DTypeError>([&] { nc::gelu_mlp(q[0], q[1], q[2].to(DType::F32), q[3], q[4]); },
                         {"gelu_mlp", "fc_bias", "f32"})();
  // Without biases it is the composition.
  const Tensor y = nc::gelu_mlp(q[0], q[1], Tensor(), q[3], Tensor());
  EXPECT_EQ(values(y), values(nc::linear(nc::gelu(nc::linear(q[0], q[1]), true), q[3])));
}

TEST(GeluMlp, CudaMatchesCpu) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  // Hidden widths the epilogues take (multiples of 8) and one they leave to the composition
  // (20); a GPT-2 block's widths.
  struct Case {
    nc::Shape x;
    int64_t hidden, out;
  };
  for (const Case& c :
       {Case{{6, 5}, 24, 5}, Case{{3, 7, 16}, 64, 16}, Case{{4, 5}, 20, 5}, Case{{128, 768}, 3072, 768}}) {
    SCOPED_TRACE(nc::shape_str(c.x) + " hidden " + std::to_string(c.hidden));
    const std::vector<Tensor> p = mlp_inputs(c.x, c.hidden, c.out, 70);
    const MlpOutcome reference = run_mlp(false, p, nc::Device::cpu(), DType::F64);
    for (DType dtype : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE(nc::dtype_name(dtype));
      const double tol = dtype == DType::F64 ? 1e-12 : dtype == DType::F32 ? 1e-4 : 3e-2;
      expect_mlp_close(run_mlp(true, p, nc::Device::cuda(), dtype), reference, tol);
      expect_mlp_close(run_mlp(true, p, nc::Device::cuda(), dtype, /*recompute=*/true), reference, tol);
    }
  }
}
