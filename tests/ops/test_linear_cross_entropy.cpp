// linear_cross_entropy: values and gradients against the composition cross_entropy(matmul)
// on the CPU (f64, f32, with and without padded classes, x of any leading shape), float64
// gradchecks, autocast, argument errors, and the CUDA kernels against the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/internal.h"
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

Tensor targets(const nc::Shape& shape, int64_t classes, uint64_t seed) {
  nc::Generator gen(seed);
  return nc::randint(0, classes, shape, nc::TensorOptions(DType::I64), &gen);
}

struct Outcome {
  Tensor loss, grad_x, grad_weight;
};

// loss, x's and weight's gradients of the fused op (or the composition) on copies of x and
// weight as fresh leaves on device in dtype; with piece_rows > 0 the fused op makes its
// logits that many rows at a time.
Outcome run_loss(bool fused, const Tensor& x0, const Tensor& w0, const Tensor& t0, int64_t classes, nc::Device device,
                 DType dtype, int64_t piece_rows = 0) {
  const Tensor x = x0.to(device, dtype).detach().requires_grad_(), w = w0.to(device, dtype).detach().requires_grad_();
  const Tensor t = t0.to(device);
  Tensor loss;
  if (fused && piece_rows > 0) {
    const int64_t row_bytes = w.size(0) * static_cast<int64_t>(nc::dtype_size(dtype));
    loss = nc::detail::linear_cross_entropy_in_chunks(x, w, t, classes, -100, piece_rows * row_bytes);
  } else if (fused) {
    loss = nc::linear_cross_entropy(x, w, t, classes);
  } else {
    const Tensor logits = nc::matmul(x, w.narrow(0, 0, classes).t());
    loss = nc::cross_entropy(logits.reshape({-1, classes}), t.reshape({-1}));
  }
  loss.backward();
  return {loss, x.grad(), w.grad()};
}

}  // namespace

TEST(LinearCrossEntropy, MatchesCompositionOnCpu) {
  struct Case {
    nc::Shape x;
    int64_t vocab, classes;
  };
  for (const Case& c : {Case{{6, 5}, 7, 7}, Case{{2, 3, 4}, 12, 9}, Case{{1, 8}, 3, 1}, Case{{33, 16}, 300, 257}}) {
    SCOPED_TRACE(nc::shape_str(c.x) + " vocab " + std::to_string(c.vocab) + " classes " + std::to_string(c.classes));
    const Tensor x = random(c.x, 1), w = random({c.vocab, c.x.back()}, 2);
    const Tensor t = targets(nc::Shape(c.x.begin(), c.x.end() - 1), c.classes, 3);
    for (DType dtype : {DType::F64, DType::F32}) {
      const double tol = dtype == DType::F64 ? 1e-12 : 1e-5;
      const Outcome fused = run_loss(true, x, w, t, c.classes, nc::Device::cpu(), dtype);
      const Outcome composed = run_loss(false, x, w, t, c.classes, nc::Device::cpu(), dtype);
      EXPECT_EQ(fused.loss.dtype(), dtype);
      EXPECT_EQ(fused.loss.dim(), 0);
      EXPECT_LT(relative_error(fused.loss, composed.loss), tol);
      EXPECT_LT(relative_error(fused.grad_x, composed.grad_x), tol);
      ASSERT_EQ(fused.grad_weight.shape(), w.shape());
      // The rows past `classes` get exactly zero; the others match.
      const int64_t padded = c.vocab - c.classes;
      if (padded > 0)
        EXPECT_EQ(values(nc::max(nc::abs(fused.grad_weight.narrow(0, c.classes, padded)))), std::vector<double>{0.0});
      EXPECT_LT(relative_error(fused.grad_weight.narrow(0, 0, c.classes), composed.grad_weight.narrow(0, 0, c.classes)),
                tol);
    }
  }
}

// Logits too large to hold are made in pieces of rows, each used at once for its share of
// both gradients: the values of the op that holds them whole, with ignored targets, padded
// classes, pieces that do not divide the rows, and a scaled incoming gradient.
TEST(LinearCrossEntropy, InPiecesMatchesTheWholeOnCpu) {
  const Tensor x = random({3, 11, 16}, 31), w = random({300, 16}, 32);
  Tensor t = targets({3, 11}, 257, 33);
  t = nc::where(nc::lt(random({3, 11}, 34), nc::Scalar(-0.8)), nc::full({3, 11}, -100, nc::TensorOptions(DType::I64)),
                t);
  for (DType dtype : {DType::F64, DType::F32, DType::BF16}) {
    SCOPED_TRACE(nc::dtype_name(dtype));
    const Outcome whole = run_loss(true, x, w, t, 257, nc::Device::cpu(), dtype);
    for (int64_t piece : {1, 5, 32}) {
      SCOPED_TRACE("pieces of " + std::to_string(piece) + " rows");
      const Outcome pieces = run_loss(true, x, w, t, 257, nc::Device::cpu(), dtype, piece);
      const double tol = dtype == DType::F64 ? 1e-12 : dtype == DType::F32 ? 1e-5 : 1e-2;
      EXPECT_EQ(pieces.loss.dtype(), whole.loss.dtype());
      EXPECT_LT(relative_error(pieces.loss, whole.loss), tol);
      EXPECT_LT(relative_error(pieces.grad_x, whole.grad_x), tol);
      EXPECT_LT(relative_error(pieces.grad_weight, whole.grad_weight), tol);
      EXPECT_EQ(values(nc::max(nc::abs(pieces.grad_weight.narrow(0, 257, 43)))), std::vector<double>{0.0});
    }
  }
  // The incoming gradient scales both; without gradients the loss alone, the same.
  const Tensor xs = x.detach().requires_grad_(), ws = w.detach().requires_grad_();
  const int64_t row_bytes = 300 * 8;
  nc::mul(nc::detail::linear_cross_entropy_in_chunks(xs, ws, t, 257, -100, 4 * row_bytes), nc::Scalar(3.0)).backward();
  const Outcome whole = run_loss(true, x, w, t, 257, nc::Device::cpu(), DType::F64);
  EXPECT_LT(relative_error(xs.grad(), nc::mul(whole.grad_x, nc::Scalar(3.0))), 1e-12);
  EXPECT_LT(relative_error(ws.grad(), nc::mul(whole.grad_weight, nc::Scalar(3.0))), 1e-12);
  nc::autograd::NoGradGuard no_grad;
  EXPECT_LT(relative_error(nc::detail::linear_cross_entropy_in_chunks(x, w, t, 257, -100, 4 * row_bytes), whole.loss),
            1e-12);
}

TEST(LinearCrossEntropy, InPiecesGradcheck) {
  const Tensor t = targets({7}, 5, 36);
  auto f = [&](const std::vector<Tensor>& v) {
    return nc::detail::linear_cross_entropy_in_chunks(v[0], v[1], t, 5, -100, 2 * 6 * 8);
  };
  std::vector<Tensor> p = {random({7, 4}, 37).requires_grad_(), random({6, 4}, 38).requires_grad_()};
  std::string report;
  EXPECT_TRUE(nc::gradcheck(f, p, {}, &report)) << report;
}

TEST(LinearCrossEntropy, KnownValue) {
  // x = [1, 0], weight rows [1, 0], [0, 1], [2, 0] (the last padded away): logits [1, 0].
  const Tensor x = nc::from_vector<double>({1, 0}, {1, 2}).requires_grad_();
  const Tensor w = nc::from_vector<double>({1, 0, 0, 1, 2, 0}, {3, 2}).requires_grad_();
  const Tensor loss = nc::linear_cross_entropy(x, w, nc::from_vector<int64_t>({1}, {1}), 2);
  const double lse = std::log(std::exp(1.0) + 1.0);
  EXPECT_NEAR(loss.item<double>(), lse - 0.0, 1e-12);
  loss.backward();
  const double p0 = std::exp(1.0 - lse), p1 = std::exp(0.0 - lse);
  // d/dlogits = [p0, p1 - 1]; grad_x = that @ W[:2] = [p0, p1 - 1].
  const std::vector<double> gx = values(x.grad()), gw = values(w.grad());
  EXPECT_NEAR(gx[0], p0, 1e-12);
  EXPECT_NEAR(gx[1], p1 - 1, 1e-12);
  EXPECT_EQ(gw, (std::vector<double>{p0, 0, p1 - 1, 0, 0, 0}));
}

TEST(LinearCrossEntropy, Gradcheck) {
  const Tensor t = targets({2, 3}, 5, 4);
  auto f = [&](const std::vector<Tensor>& v) { return nc::linear_cross_entropy(v[0], v[1], t, 5); };
  std::string report;
  EXPECT_TRUE(
      nc::gradcheck(f, {random({2, 3, 4}, 5).requires_grad_(), random({7, 4}, 6).requires_grad_()}, {}, &report))
      << report;
  // Only the weight needs a gradient.
  const Tensor x = random({4, 3}, 7), t2 = targets({4}, 6, 8);
  auto g = [&](const std::vector<Tensor>& v) { return nc::linear_cross_entropy(x, v[0], t2); };
  EXPECT_TRUE(nc::gradcheck(g, {random({6, 3}, 9).requires_grad_()}, {}, &report)) << report;
}

TEST(LinearCrossEntropy, ScalesWithTheIncomingGradient) {
  const Tensor x0 = random({5, 4}, 10), w0 = random({6, 4}, 11), t = targets({5}, 6, 12);
  for (DType dtype : {DType::F64, DType::F32}) {
    const Outcome once = run_loss(true, x0, w0, t, 6, nc::Device::cpu(), dtype);
    const Tensor x = x0.to(dtype).detach().requires_grad_(), w = w0.to(dtype).detach().requires_grad_();
    nc::mul(nc::linear_cross_entropy(x, w, t), 3.0).backward();
    EXPECT_LT(relative_error(x.grad(), nc::mul(once.grad_x, 3.0)), 1e-6);
    EXPECT_LT(relative_error(w.grad(), nc::mul(once.grad_weight, 3.0)), 1e-6);
  }
}

TEST(LinearCrossEntropy, AutocastRunsTheProductInBf16AndTheLossInF32) {
  const Tensor x0 = random({16, 32}, 13), w0 = random({40, 32}, 14, 0.1), t = targets({16}, 37, 15);
  const Outcome reference = run_loss(false, x0, w0, t, 37, nc::Device::cpu(), DType::F64);
  const Tensor x = x0.to(DType::F32).detach().requires_grad_(), w = w0.to(DType::F32).detach().requires_grad_();
  Tensor loss;
  {
    nc::autocast::Guard guard(DType::BF16);
    loss = nc::linear_cross_entropy(x, w, t, 37);
  }
  EXPECT_EQ(loss.dtype(), DType::F32);
  loss.backward();
  EXPECT_EQ(x.grad().dtype(), DType::F32);
  EXPECT_EQ(w.grad().dtype(), DType::F32);
  EXPECT_LT(relative_error(loss, reference.loss), 2e-2);
  EXPECT_LT(relative_error(x.grad(), reference.grad_x), 2e-2);
  EXPECT_LT(relative_error(w.grad(), reference.grad_weight), 2e-2);
}

// In pieces under autocast the f32 weight's gradient is the f32 sum over the pieces as it
// stands: close to the f64 reference, and not rounded to bf16 on the way (some element is
// not a bf16 value); the incoming gradient still scales it.
TEST(LinearCrossEntropy, AutocastInPiecesGivesTheF32WeightItsF32Sum) {
  const Tensor x0 = random({24, 32}, 16), w0 = random({40, 32}, 17, 0.1), t = targets({24}, 37, 18);
  const Outcome reference = run_loss(false, x0, w0, t, 37, nc::Device::cpu(), DType::F64);
  const Tensor x = x0.to(DType::F32).detach().requires_grad_(), w = w0.to(DType::F32).detach().requires_grad_();
  Tensor loss;
  {
    nc::autocast::Guard guard(DType::BF16);
    loss = nc::detail::linear_cross_entropy_in_chunks(x, w, t, 37, -100, 5 * 40 * 2);  // pieces of 5 rows
  }
  nc::mul(loss, nc::Scalar(2.0)).backward();
  ASSERT_EQ(w.grad().dtype(), DType::F32);
  EXPECT_LT(relative_error(w.grad(), nc::mul(reference.grad_weight, nc::Scalar(2.0))), 2e-2);
  EXPECT_LT(relative_error(x.grad(), nc::mul(reference.grad_x, nc::Scalar(2.0))), 2e-2);
  const Tensor rounded = w.grad().to(DType::BF16).to(DType::F32);
  EXPECT_GT(values(nc::max(nc::abs(nc::sub(w.grad(), rounded))))[0], 0.0);
}

TEST(LinearCrossEntropy, IgnoredTargetsAsCrossEntropy) {
  const Tensor x0 = random({9, 6}, 30), w0 = random({12, 6}, 31);
  Tensor t = targets({9}, 10, 32);
  t.narrow(0, 2, 3).fill_(-100);
  std::vector<nc::Device> devices{nc::Device::cpu()};
  if (nc::cuda_is_available()) devices.push_back(nc::Device::cuda());
  const Outcome reference = run_loss(false, x0, w0, t, 10, nc::Device::cpu(), DType::F64);
  for (nc::Device device : devices) {
    for (DType dtype : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE(device.str() + " " + nc::dtype_name(dtype));
      const double tol = dtype == DType::F64 ? 1e-10 : dtype == DType::F32 ? 1e-5 : 3e-2;
      const Outcome fused = run_loss(true, x0, w0, t, 10, device, dtype);
      EXPECT_LT(relative_error(fused.loss, reference.loss), tol);
      EXPECT_LT(relative_error(fused.grad_x, reference.grad_x), tol);
      EXPECT_LT(relative_error(fused.grad_weight.narrow(0, 0, 10), reference.grad_weight.narrow(0, 0, 10)), tol);
      // The ignored rows' x gets no gradient.
      EXPECT_EQ(values(nc::max(nc::abs(fused.grad_x.narrow(0, 2, 3)))), std::vector<double>{0.0});
    }
    // Every target ignored: a NaN loss and zero gradients, as PyTorch's.
    const Tensor x = x0.to(device).detach().requires_grad_(), w = w0.to(device).detach().requires_grad_();
    const Tensor all = nc::full({9}, -7, nc::TensorOptions(DType::I64, device));
    const Tensor loss = nc::linear_cross_entropy(x, w, all, 10, -7);
    EXPECT_TRUE(std::isnan(loss.item<double>()));
    loss.backward();
    EXPECT_EQ(values(nc::max(nc::abs(x.grad()))), std::vector<double>{0.0});
    EXPECT_EQ(values(nc::max(nc::abs(w.grad()))), std::vector<double>{0.0});
  }
}

TEST(LinearCrossEntropy, NonFiniteLogitsGiveNan) {
  const Tensor x = nc::from_vector<double>({1, 0, 0, 1}, {2, 2});
  const Tensor w = nc::from_vector<double>({std::nan(""), 0, 0, 1}, {2, 2});
  const std::vector<double> loss = values(nc::linear_cross_entropy(x, w, nc::from_vector<int64_t>({1, 1}, {2})));
  EXPECT_TRUE(std::isnan(loss[0]));
}

TEST(LinearCrossEntropy, ErrorsNameOpArgumentAndShapes) {
  const Tensor x = nc::zeros({2, 3}), w = nc::zeros({4, 3}), t = nc::zeros({2}, nc::TensorOptions(DType::I64));
  using nc::linear_cross_entropy;
  throws<nc::ShapeError>(
      [&] {
        linear_cross_entropy(x, nc::zeros({4, 2}), t);
      },
      {"linear_cross_entropy", "weight", "[4, 2]"})();
  throws<nc::ShapeError>([&] { linear_cross_entropy(x, w, nc::zeros({3}, nc::TensorOptions(DType::I64))); },
                         {"linear_cross_entropy", "target", "[2]", "[3]"})();
  throws<nc::DTypeError>([&] { linear_cross_entropy(x, w, nc::zeros({2})); }, {"linear_cross_entropy", "i64"})();
  throws<nc::DTypeError>([&] { linear_cross_entropy(x, w.to(DType::F64), t); },
                         {"linear_cross_entropy", "one dtype", "f64"})();
  throws<nc::ValueError>([&] { linear_cross_entropy(x, w, t, 5); }, {"linear_cross_entropy", "classes", "5"})();
  throws<nc::ValueError>([&] { linear_cross_entropy(x, w, t, 0); }, {"linear_cross_entropy", "classes"})();
  throws<nc::IndexError>(
      [&] {
        linear_cross_entropy(x, w, nc::from_vector<int64_t>({0, 3}, {2}), 3);
      },
      {"linear_cross_entropy", "target value 3", "3 classes"})();
  throws<nc::IndexError>(
      [&] {
        linear_cross_entropy(x, w, nc::from_vector<int64_t>({-1, 0}, {2}));
      },
      {"linear_cross_entropy", "-1"})();
  throws<nc::ValueError>([&] { linear_cross_entropy(Tensor(), w, t); }, {"linear_cross_entropy", "x"})();
}

TEST(LinearCrossEntropy, EmptyBatchIsNan) {
  const Tensor x = nc::zeros({0, 3}).requires_grad_(), w = nc::ones({4, 3}).requires_grad_();
  const Tensor loss = nc::linear_cross_entropy(x, w, nc::zeros({0}, nc::TensorOptions(DType::I64)));
  EXPECT_TRUE(std::isnan(loss.item<double>()));
  loss.backward();
  EXPECT_EQ(values(nc::max(nc::abs(w.grad()))), std::vector<double>{0.0});
}

TEST(LinearCrossEntropy, CudaMatchesCpu) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  struct Case {
    nc::Shape x;
    int64_t vocab, classes;
  };
  // Rows of one vector width and not (the scalar kernel, with the small block and the large
  // one), a padded vocabulary, the large block, GPT-2's padded vocabulary of 50304.
  for (const Case& c :
       {Case{{6, 5}, 7, 7}, Case{{3, 5, 16}, 256, 256}, Case{{37, 64}, 1031, 1000}, Case{{40, 32}, 5120, 5003},
        Case{{20, 16}, 4099, 4090}, Case{{24, 32}, 16448, 16400}, Case{{2, 6, 32}, 50304, 50257}}) {
    SCOPED_TRACE(nc::shape_str(c.x) + " vocab " + std::to_string(c.vocab));
    const Tensor x = random(c.x, 20), w = random({c.vocab, c.x.back()}, 21, 0.2);
    const Tensor t = targets(nc::Shape(c.x.begin(), c.x.end() - 1), c.classes, 22);
    const Outcome reference = run_loss(false, x, w, t, c.classes, nc::Device::cpu(), DType::F64);
    for (DType dtype : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE(nc::dtype_name(dtype));
      const double tol = dtype == DType::F64 ? 1e-10 : dtype == DType::F32 ? 1e-4 : 3e-2;
      for (int64_t piece : {0, 7}) {  // the logits whole, and in pieces of 7 rows
        SCOPED_TRACE(piece ? "in pieces" : "whole");
        const Outcome cuda = run_loss(true, x, w, t, c.classes, nc::Device::cuda(), dtype, piece);
        EXPECT_LT(relative_error(cuda.loss, reference.loss), tol);
        EXPECT_LT(relative_error(cuda.grad_x, reference.grad_x), tol);
        EXPECT_LT(relative_error(cuda.grad_weight.narrow(0, 0, c.classes),
                                 reference.grad_weight.narrow(0, 0, c.classes)),
                  tol);
        if (c.vocab > c.classes)
          EXPECT_EQ(values(nc::max(nc::abs(cuda.grad_weight.narrow(0, c.classes, c.vocab - c.classes)))),
                    std::vector<double>{0.0});
      }
    }
  }
  // A bad target is an IndexError on CUDA too, raised where the host reads the loss, and
  // the device stays usable.
  const Tensor x = nc::ones({2, 3}, nc::TensorOptions(DType::F32, nc::Device::cuda()));
  const Tensor w = nc::ones({4, 3}, nc::TensorOptions(DType::F32, nc::Device::cuda()));
  throws<nc::IndexError>(
      [&] {
        nc::linear_cross_entropy(x, w, nc::from_vector<int64_t>({0, 4}, {2}).to(nc::Device::cuda())).item<double>();
      },
      {"linear_cross_entropy", "target value 4", "4 classes"})();
  EXPECT_NEAR(
      nc::linear_cross_entropy(x, w, nc::from_vector<int64_t>({0, 3}, {2}).to(nc::Device::cuda())).item<double>(),
      std::log(4.0), 1e-6);
}
