// add_layer_norm (a residual add and the LayerNorm after it): values and gradients against
// add then layer_norm on the CPU, a float64 gradcheck, autocast's dtypes, argument errors,
// the CUDA kernel against the CPU (rows it takes and rows it leaves to the composition), and
// the GPT's fused stack against its unfused one.
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
  Tensor sum, out, grad_x, grad_y, grad_weight, grad_bias;
};

// sum, out and the gradients of sum(out * p) + sum(sum * q) (sum also used on its own, as
// the residual stream is), fused or composed, with fresh leaves on device: x in x_dtype,
// y in y_dtype, weight and bias in x_dtype.
Outcome run(bool fused, const Tensor& x0, const Tensor& y0, const Tensor& w0, const Tensor& b0, nc::Device device,
            DType x_dtype, DType y_dtype) {
  const Tensor x = x0.to(device, x_dtype).detach().requires_grad_();
  const Tensor y = y0.to(device, y_dtype).detach().requires_grad_();
  const Tensor w = w0.to(device, x_dtype).detach().requires_grad_();
  const Tensor b = b0.to(device, x_dtype).detach().requires_grad_();
  Tensor sum, out;
  if (fused) {
    std::tie(sum, out) = nc::add_layer_norm(x, y, w, b);
  } else {
    sum = nc::add(x, y);
    out = nc::layer_norm(sum, {sum.size(-1)}, w, b);
  }
  const Tensor p = random(out.shape(), 50).to(device, out.dtype()), q = random(sum.shape(), 51).to(device, sum.dtype());
  nc::add(nc::sum(nc::mul(out, p)).to(DType::F64), nc::sum(nc::mul(sum, q)).to(DType::F64)).backward();
  return {sum, out, x.grad(), y.grad(), w.grad(), b.grad()};
}

// tol for every tensor but y's gradient, which a 16-bit y rounds (where the two sides' f32
// gradients round on either side of a bf16 boundary, one ulp of 2^-8 apart).
void expect_close(const Outcome& a, const Outcome& e, double tol) {
  const bool y16 = a.grad_y.dtype() == DType::BF16 || a.grad_y.dtype() == DType::F16;
  EXPECT_LT(relative_error(a.sum, e.sum), tol);
  EXPECT_LT(relative_error(a.out, e.out), tol);
  EXPECT_LT(relative_error(a.grad_x, e.grad_x), tol);
  EXPECT_LT(relative_error(a.grad_y, e.grad_y), y16 ? std::max(tol, 1e-2) : tol);
  EXPECT_LT(relative_error(a.grad_weight, e.grad_weight), tol);
  EXPECT_LT(relative_error(a.grad_bias, e.grad_bias), tol);
}

}  // namespace

TEST(AddLayerNorm, MatchesAddThenLayerNormOnCpu) {
  for (const nc::Shape& shape : {nc::Shape{3, 8}, nc::Shape{2, 5, 12}, nc::Shape{1, 7}}) {
    SCOPED_TRACE(nc::shape_str(shape));
    const int64_t c = shape.back();
    const Tensor x = random(shape, 1), y = random(shape, 2), w = random({c}, 3), b = random({c}, 4);
    for (DType dtype : {DType::F64, DType::F32}) {
      const Outcome fused = run(true, x, y, w, b, nc::Device::cpu(), dtype, dtype);
      const Outcome composed = run(false, x, y, w, b, nc::Device::cpu(), dtype, dtype);
      EXPECT_EQ(fused.sum.dtype(), dtype);
      EXPECT_EQ(fused.out.dtype(), dtype);
      expect_close(fused, composed, dtype == DType::F64 ? 1e-13 : 1e-5);
    }
  }
  // Without a bias; with no rows.
  const Tensor x = random({4, 6}, 5), y = random({4, 6}, 6), w = random({6}, 7);
  EXPECT_EQ(values(nc::add_layer_norm(x, y, w, Tensor()).second),
            values(nc::layer_norm(nc::add(x, y), {6}, w, Tensor())));
  EXPECT_EQ(nc::add_layer_norm(random({0, 6}, 8), random({0, 6}, 9), w, Tensor()).second.shape(), (nc::Shape{0, 6}));
}

TEST(AddLayerNorm, Gradcheck) {
  auto f = [](const std::vector<Tensor>& v) {
    const auto [sum, out] = nc::add_layer_norm(v[0], v[1], v[2], v[3]);
    return nc::add(nc::mul(out, 2.0), nc::mul(sum, sum));
  };
  std::string report;
  EXPECT_TRUE(nc::gradcheck(f,
                            {random({2, 3, 5}, 10).requires_grad_(), random({2, 3, 5}, 11).requires_grad_(),
                             random({5}, 12).requires_grad_(), random({5}, 13).requires_grad_()},
                            {}, &report))
      << report;
}

TEST(AddLayerNorm, AutocastGivesTheNormedRowsInBf16) {
  const Tensor x0 = random({6, 16}, 14), y0 = random({6, 16}, 15), w0 = random({16}, 16), b0 = random({16}, 17);
  const Tensor x = x0.to(DType::F32).detach().requires_grad_(), y = y0.to(DType::BF16).detach().requires_grad_();
  const Tensor w = w0.to(DType::F32).detach().requires_grad_();
  Tensor sum, out;
  {
    nc::autocast::Guard guard(DType::BF16);
    std::tie(sum, out) = nc::add_layer_norm(x, y, w, b0.to(DType::F32));
  }
  EXPECT_EQ(sum.dtype(), DType::F32);
  EXPECT_EQ(out.dtype(), DType::BF16);
  const Tensor expected_sum = nc::add(x.detach(), y.detach().to(DType::F32));
  EXPECT_EQ(values(sum), values(expected_sum));
  EXPECT_EQ(values(out), values(nc::layer_norm(expected_sum, {16}, w.detach(), b0.to(DType::F32)).to(DType::BF16)));
  nc::sum(out.to(DType::F32)).backward();
  EXPECT_EQ(x.grad().dtype(), DType::F32);
  EXPECT_EQ(y.grad().dtype(), DType::BF16);
  EXPECT_EQ(w.grad().dtype(), DType::F32);
}

TEST(AddLayerNorm, BadArguments) {
  const Tensor x = random({3, 4}, 18), w = random({4}, 19);
  throws<nc::ShapeError>(
      [&] {
        nc::add_layer_norm(x, random({3, 5}, 20), w, Tensor());
      },
      {"add_layer_norm", "one shape", "[3, 4]", "[3, 5]"})();
  throws<nc::ShapeError>([&] { nc::add_layer_norm(x, x, random({5}, 21), Tensor()); },
                         {"add_layer_norm", "weight", "[5]"})();
  throws<nc::ValueError>([&] { nc::add_layer_norm(x, x, Tensor(), Tensor()); }, {"add_layer_norm", "weight"})();
  throws<nc::DTypeError>(
      [&] {
        nc::add_layer_norm(x, nc::ones({3, 4}, nc::TensorOptions(DType::I64)), w, Tensor());
      },
      {"add_layer_norm", "floating", "i64"})();
  throws<nc::ValueError>([&] { nc::add_layer_norm(x, x, w, Tensor(), 0.0); }, {"add_layer_norm", "eps"})();
}

TEST(AddLayerNorm, CudaMatchesCpu) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  // Widths the kernel takes (multiples of 4 up to 2048, each register count) and ones it
  // leaves to the composition (6, 2052); rows with a large mean.
  for (int64_t c : {int64_t{4}, int64_t{12}, int64_t{768}, int64_t{1000}, int64_t{2048}, int64_t{6}, int64_t{2052}}) {
    SCOPED_TRACE("C = " + std::to_string(c));
    const nc::Shape shape{5, 3, c};
    const Tensor x = random(shape, 22, 1.0, 300.0), y = random(shape, 23), w = random({c}, 24), b = random({c}, 25);
    struct Dtypes {
      DType x, y;
      double tol;
    };
    // f32: the rows' mean of 300 leaves about 2e-5 of the CPU's and the GPU's f32 sums apart.
    for (const Dtypes& d : {Dtypes{DType::F64, DType::F64, 1e-12}, Dtypes{DType::F32, DType::F32, 1e-4},
                            Dtypes{DType::F32, DType::BF16, 1e-4}, Dtypes{DType::BF16, DType::BF16, 2e-2}}) {
      SCOPED_TRACE(std::string(nc::dtype_name(d.x)) + " + " + nc::dtype_name(d.y));
      // The CPU's add then layer_norm in the same dtypes is the reference.
      const Outcome expected = run(false, x, y, w, b, nc::Device::cpu(), d.x, d.y);
      const Outcome cuda = run(true, x, y, w, b, nc::Device::cuda(), d.x, d.y);
      EXPECT_EQ(cuda.sum.device(), nc::Device::cuda());
      EXPECT_EQ(cuda.out.dtype(), expected.out.dtype());
      expect_close(cuda, expected, d.tol);
    }
  }
  // Under autocast the bf16 rows equal the f32 LayerNorm of the f32 sum, rounded once.
  const Tensor x = random({64, 768}, 26).to(nc::Device::cuda(), DType::F32);
  const Tensor y = random({64, 768}, 27).to(nc::Device::cuda(), DType::BF16);
  const Tensor w = random({768}, 28).to(nc::Device::cuda(), DType::F32);
  const Tensor b = random({768}, 29).to(nc::Device::cuda(), DType::F32);
  nc::autocast::Guard guard(DType::BF16);
  const auto [sum, out] = nc::add_layer_norm(x, y, w, b);
  EXPECT_EQ(out.dtype(), DType::BF16);
  EXPECT_EQ(values(sum), values(nc::add(x, y.to(DType::F32))));
  const Tensor expected = nc::layer_norm(nc::add(x, y.to(DType::F32)), {768}, w, b).to(DType::BF16);
  // One bf16 ulp at most where the two f32 computations round differently.
  EXPECT_LT(relative_error(out, expected), 1e-2);
}

TEST(AddLayerNorm, GptStackMatchesTheUnfusedOne) {
  std::vector<nc::Device> devices{nc::Device::cpu()};
  if (nc::cuda_is_available()) devices.push_back(nc::Device::cuda());
  for (nc::Device device : devices) {
    SCOPED_TRACE(device.str());
    nc::models::GPTConfig config;
    config.vocab_size = 50;
    config.context = 16;
    config.embed = 32;
    config.heads = 4;
    config.layers = 3;
    config.dropout = 0.0;
    nc::Generator gen(30);
    nc::models::GPT model(config, &gen);
    model.to(device);
    nc::Generator data(31);
    const Tensor tokens = nc::randint(0, 50, {2, 16}, nc::TensorOptions(DType::I64), &data).to(device);
    auto loss_and_grads = [&] {
      model.zero_grad();
      const Tensor loss = nc::sum(nc::mul(model.forward(tokens), 0.01));
      loss.backward();
      std::vector<Tensor> grads{loss.detach()};
      for (const Tensor& p : model.parameters()) grads.push_back(p.grad().clone());
      return grads;
    };
    const std::vector<Tensor> fused = loss_and_grads();
    // A forward hook on the final norm makes the model call every norm on its own.
    auto handle = model.norm_f->register_forward_hook([](nc::nn::Module&, const Tensor&, const Tensor&) {});
    const std::vector<Tensor> unfused = loss_and_grads();
    handle.remove();
    ASSERT_EQ(fused.size(), unfused.size());
    for (size_t i = 0; i < fused.size(); ++i) EXPECT_LT(relative_error(fused[i], unfused[i]), 1e-4) << i;
  }
}
