// Custom differentiable functions (normcore/function.h): forward and backward written by
// the user, checked by hand-worked values and by gradcheck; several outputs, outputs
// without gradient, inputs that need none, extra arguments, in-place safety of saved
// tensors, and the errors that name the function.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "normcore/function.h"
#include "normcore/normcore.h"

namespace nc = normcore;
using nc::Tensor;
using nc::autograd::FunctionContext;

namespace {

Tensor f64(const std::vector<double>& values, const nc::Shape& shape) { return nc::from_vector(values, shape); }
std::vector<double> values(const Tensor& t) { return t.to(nc::Device::cpu()).contiguous().to_vector<double>(); }

struct Cube {
  static constexpr const char* name = "cube";
  static std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) {
    ctx.save_for_backward({in[0]});
    return {nc::mul(nc::mul(in[0], in[0]), in[0])};
  }
  static std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& grad) {
    const Tensor x = ctx.saved()[0];
    return {nc::mul(grad[0], nc::mul(nc::mul(x, x), 3.0))};
  }
};

// softplus(x) = log(1 + exp(x)) by a plain loop over the data, as a hand-written kernel
// would; its derivative is sigmoid(x), from the saved input.
struct LoopSoftplus {
  static std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) {
    const Tensor x = in[0].contiguous();
    Tensor y = nc::empty_like(x);
    const double* src = x.data<double>();
    double* dst = y.data<double>();
    for (int64_t i = 0; i < x.numel(); ++i) dst[i] = std::log1p(std::exp(src[i]));
    ctx.save_for_backward({x});
    return {y};
  }
  static std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& grad) {
    const Tensor x = ctx.saved()[0];
    const Tensor g = grad[0].contiguous();
    Tensor dx = nc::empty_like(x);
    for (int64_t i = 0; i < x.numel(); ++i) {
      dx.data<double>()[i] = g.data<double>()[i] / (1.0 + std::exp(-x.data<double>()[i]));
    }
    return {dx};
  }
};

// Two outputs: 2x and x * x.
struct TwoOutputs {
  static std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) {
    ctx.save_for_backward({in[0]});
    return {nc::mul(in[0], 2.0), nc::mul(in[0], in[0])};
  }
  static std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& grad) {
    const Tensor x = ctx.saved()[0];
    return {nc::add(nc::mul(grad[0], 2.0), nc::mul(grad[1], nc::mul(x, 2.0)))};
  }
};

// x * s for a scalar s given as an extra argument; a second output, the sign of x as
// integers, has no gradient.
struct ScaleWithSign {
  static std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in, double s) {
    ctx.saved_data["s"] = s;
    return {nc::mul(in[0], s), nc::sign(in[0]).to(nc::DType::I64)};
  }
  static std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& grad) {
    EXPECT_FALSE(grad[1].defined());
    return {nc::mul(grad[0], std::any_cast<double>(ctx.saved_data.at("s")))};
  }
};

TEST(CustomFunction, ValuesAndGradientOfACube) {
  Tensor x = f64({1, -2, 3}, {3}).requires_grad_();
  Tensor y = nc::autograd::Function<Cube>::apply({x})[0];
  EXPECT_EQ(values(y), (std::vector<double>{1, -8, 27}));
  EXPECT_EQ(y.grad_fn_name(), "cube");
  nc::sum(y).backward();
  EXPECT_EQ(values(x.grad()), (std::vector<double>{3, 12, 27}));
}

TEST(CustomFunction, GradcheckOfAFunctionOnRawData) {
  nc::Generator gen(7);
  Tensor x = (nc::rand({4, 5}, nc::DType::F64, &gen) * 6.0 - 3.0).requires_grad_();
  std::string report;
  EXPECT_TRUE(
      nc::gradcheck([](const std::vector<Tensor>& in) { return nc::autograd::Function<LoopSoftplus>::apply(in)[0]; },
                    {x}, {}, &report))
      << report;
  // A wrong backward fails the same check.
  auto wrong_backward = [](FunctionContext&, const std::vector<Tensor>& grad) { return std::vector<Tensor>{grad[0]}; };
  auto softplus_forward = [](FunctionContext& ctx, const std::vector<Tensor>& in) {
    return LoopSoftplus::forward(ctx, in);
  };
  EXPECT_FALSE(nc::gradcheck(
      [&](const std::vector<Tensor>& in) {
        return nc::autograd::apply_function("wrong", in, softplus_forward, wrong_backward)[0];
      },
      {x}, {}, &report));
}

TEST(CustomFunction, SeveralOutputsShareOneBackward) {
  Tensor x = f64({1, 2}, {2}).requires_grad_();
  auto out = nc::autograd::Function<TwoOutputs>::apply({x});
  ASSERT_EQ(out.size(), 2u);
  nc::sum(nc::add(out[0], nc::mul(out[1], 3.0))).backward();  // 2 + 6x
  EXPECT_EQ(values(x.grad()), (std::vector<double>{8, 14}));
  // Only the second output used: the first one's gradient comes as zeros.
  x.zero_grad();
  out = nc::autograd::Function<TwoOutputs>::apply({x});
  nc::sum(out[1]).backward();
  EXPECT_EQ(values(x.grad()), (std::vector<double>{2, 4}));
  // gradcheck through both outputs at once.
  nc::Generator gen(3);
  Tensor z = nc::randn({6}, nc::DType::F64, &gen).requires_grad_();
  std::string report;
  EXPECT_TRUE(nc::gradcheck(
      [](const std::vector<Tensor>& in) {
        auto o = nc::autograd::Function<TwoOutputs>::apply(in);
        return nc::mul(o[0], o[1]);
      },
      {z}, {}, &report))
      << report;
}

TEST(CustomFunction, AHookOnOneOutputChangesOnlyItsGradient) {
  Tensor x = f64({1, 2}, {2}).requires_grad_();
  auto out = nc::autograd::Function<TwoOutputs>::apply({x});
  nc::autograd::register_hook(out[1], [](const Tensor& g) { return nc::mul(g, 10.0); });
  nc::sum(nc::add(out[0], out[1])).backward();  // 2 + 10 * 2x
  EXPECT_EQ(values(x.grad()), (std::vector<double>{22, 42}));
}

TEST(CustomFunction, ExtraArgumentsAndAnOutputWithoutGradient) {
  Tensor x = f64({-1, 0.5, 2}, {3}).requires_grad_();
  auto out = nc::autograd::Function<ScaleWithSign>::apply({x}, 2.5);
  EXPECT_EQ(values(out[0]), (std::vector<double>{-2.5, 1.25, 5}));
  EXPECT_EQ(out[1].to_vector<int64_t>(), (std::vector<int64_t>{-1, 1, 1}));
  EXPECT_TRUE(out[0].requires_grad());
  EXPECT_FALSE(out[1].requires_grad());
  nc::sum(out[0]).backward();
  EXPECT_EQ(values(x.grad()), (std::vector<double>{2.5, 2.5, 2.5}));
}

TEST(CustomFunction, MarkedNonDifferentiableAndInputsThatNeedNoGradient) {
  Tensor a = f64({1, 2}, {2}).requires_grad_();
  Tensor b = f64({3, 4}, {2});  // needs no gradient
  std::vector<bool> seen_needs;
  auto forward = [](FunctionContext& ctx, const std::vector<Tensor>& in) {
    Tensor product = nc::mul(in[0], in[1]);
    Tensor mask = nc::gt(product, 4.0).to(nc::DType::F64);
    ctx.mark_non_differentiable({mask});
    ctx.save_for_backward({in[1]});
    return std::vector<Tensor>{product, mask};
  };
  auto backward = [&](FunctionContext& ctx, const std::vector<Tensor>& grad) {
    seen_needs = {ctx.needs_input_grad(0), ctx.needs_input_grad(1)};
    EXPECT_FALSE(grad[1].defined());
    return std::vector<Tensor>{nc::mul(grad[0], ctx.saved()[0]), Tensor()};
  };
  auto out = nc::autograd::apply_function("masked product", {a, b}, forward, backward);
  EXPECT_EQ(values(out[1]), (std::vector<double>{0, 1}));
  EXPECT_FALSE(out[1].requires_grad());
  nc::sum(out[0]).backward();
  EXPECT_EQ(seen_needs, (std::vector<bool>{true, false}));
  EXPECT_EQ(values(a.grad()), (std::vector<double>{3, 4}));
  EXPECT_FALSE(b.grad().defined());
}

TEST(CustomFunction, NothingIsRecordedWithoutAnInputThatRequiresGrad) {
  Tensor x = f64({1, 2}, {2});
  Tensor y = nc::autograd::Function<Cube>::apply({x})[0];
  EXPECT_FALSE(y.requires_grad());
  Tensor w = f64({1, 2}, {2}).requires_grad_();
  nc::autograd::NoGradGuard no_grad;
  EXPECT_FALSE(nc::autograd::Function<Cube>::apply({w})[0].requires_grad());
}

TEST(CustomFunction, AnInputReturnedAsItIsGetsANewHandle) {
  Tensor x = f64({1, 2}, {2}).requires_grad_();
  auto identity = [](FunctionContext&, const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; };
  auto pass = [](FunctionContext&, const std::vector<Tensor>& grad) {
    return std::vector<Tensor>{nc::mul(grad[0], 2.0)};
  };
  Tensor y = nc::autograd::apply_function("identity", {x}, identity, pass)[0];
  EXPECT_FALSE(y.is_same(x));
  EXPECT_TRUE(x.is_leaf());
  nc::sum(y).backward();
  EXPECT_EQ(values(x.grad()), (std::vector<double>{2, 2}));
}

TEST(CustomFunction, ASavedTensorWrittenInPlaceIsAnError) {
  Tensor x = f64({1, 2}, {2}).requires_grad_();
  Tensor base = f64({5, 6}, {2});
  auto forward = [](FunctionContext& ctx, const std::vector<Tensor>& in) {
    ctx.save_for_backward({in[1]});
    return std::vector<Tensor>{nc::mul(in[0], in[1])};
  };
  auto backward = [](FunctionContext& ctx, const std::vector<Tensor>& grad) {
    return std::vector<Tensor>{nc::mul(grad[0], ctx.saved()[0]), Tensor()};
  };
  Tensor y = nc::autograd::apply_function("scaled", {x, base}, forward, backward)[0];
  base.fill_(0.0);
  try {
    nc::sum(y).backward();
    FAIL() << "the changed saved tensor went unnoticed";
  } catch (const nc::Error& e) {
    EXPECT_NE(std::string(e.what()).find("scaled"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("in place"), std::string::npos) << e.what();
  }
}

TEST(CustomFunction, ErrorsNameTheFunction) {
  Tensor x = f64({1, 2}, {2}).requires_grad_();
  auto cube_forward = [](FunctionContext& ctx, const std::vector<Tensor>& in) { return Cube::forward(ctx, in); };
  auto expect_message = [](const std::function<void()>& fn, const std::string& part) {
    try {
      fn();
      ADD_FAILURE() << "no error";
    } catch (const nc::Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  auto two_grads = [](FunctionContext&, const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0], g[0]}; };
  Tensor y = nc::autograd::apply_function("too many", {x}, cube_forward, two_grads)[0];
  expect_message([&] { nc::sum(y).backward(); }, "too many backward: returned 2 gradients for 1 inputs");
  auto wrong_shape = [](FunctionContext&, const std::vector<Tensor>&) {
    return std::vector<Tensor>{nc::zeros({3}, nc::DType::F64)};
  };
  y = nc::autograd::apply_function("misshapen", {x}, cube_forward, wrong_shape)[0];
  EXPECT_THROW(nc::sum(y).backward(), nc::ShapeError);
  auto nothing = [](FunctionContext&, const std::vector<Tensor>&) { return std::vector<Tensor>{}; };
  expect_message([&] { nc::autograd::apply_function("empty", {x}, nothing, two_grads); },
                 "empty: forward returned no tensor");
  auto undefined = [](FunctionContext&, const std::vector<Tensor>&) { return std::vector<Tensor>{Tensor()}; };
  EXPECT_THROW(nc::autograd::apply_function("undefined", {x}, undefined, two_grads), nc::ValueError);
  EXPECT_THROW(nc::autograd::apply_function("no backward", {x}, cube_forward, nullptr), nc::ValueError);
}

TEST(CustomFunction, OnTheGpu) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  Tensor x = f64({1, -2, 3}, {3}).to(nc::Device::cuda(0)).requires_grad_();
  Tensor y = nc::autograd::Function<Cube>::apply({x})[0];
  EXPECT_EQ(y.device(), nc::Device::cuda(0));
  nc::sum(y).backward();
  EXPECT_EQ(values(x.grad()), (std::vector<double>{3, 12, 27}));
  std::string report;
  EXPECT_TRUE(
      nc::gradcheck([](const std::vector<Tensor>& in) { return nc::autograd::Function<TwoOutputs>::apply(in)[1]; },
                    {f64({0.5, -1.5, 2}, {3}).to(nc::Device::cuda(0)).requires_grad_()}, {}, &report))
      << report;
}

}  // namespace
