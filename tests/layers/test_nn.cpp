// Modules: PyTorch's parameter naming and state_dict order, layer values checked by hand,
// in-place conversion, safetensors round trips, a small fit by gradient descent, and the
// error each invalid argument raises (one table row per case). Softmax and the losses are
// test_losses.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "normcore/normcore.h"
#include "tests/layers/nn_support.h"

namespace nc = normcore;
namespace nn = normcore::nn;
using nc::DType;
using nc::Tensor;
using nn_test::expect_near;
using nn_test::f32;
using nn_test::i64;
using nn_test::leaf;
using nn_test::run_error_cases;

namespace {

std::vector<double> values_of(const Tensor& t) {
  return t.to(nc::Device::cpu()).to(DType::F64).contiguous().to_vector<double>();
}

std::vector<std::string> names_of(const nn::NamedTensors& entries) {
  std::vector<std::string> out;
  for (const auto& e : entries) out.push_back(e.first);
  return out;
}

// Sets a module's parameter to values without recording.
void assign(const Tensor& param, const Tensor& values) {
  nc::autograd::NoGradGuard no_grad;
  Tensor(param).copy_(values);
}

// A model with its own parameter, a buffer and children, in the style of a PyTorch nn.Module.
struct Net : nn::Module {
  std::shared_ptr<nn::Linear> fc1;
  std::shared_ptr<nn::Sequential> body;
  std::shared_ptr<nn::Linear> fc2;
  Tensor scale, steps;

  explicit Net(uint64_t seed) {
    nc::Generator gen(seed);
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(4, 8, true, &gen));
    // Registered after a child, but listed before the children's, as in PyTorch.
    scale = register_parameter("scale", nc::ones({3}));
    steps = register_buffer("steps", nc::zeros({1}, DType::I64));
    body = register_module("body", std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
                                       std::make_shared<nn::Linear>(8, 8, true, &gen), std::make_shared<nn::GELU>()}));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(8, 3, false, &gen));
    body->register_buffer("calls", nc::zeros({2}));
  }
  Tensor forward(const Tensor& x) override { return (*fc2)((*body)((*fc1)(x))) * scale; }
};

}  // namespace

TEST(Nn, InvalidArgumentsThrow) {
  auto linear = std::make_shared<nn::Linear>(3, 2);
  auto embedding = std::make_shared<nn::Embedding>(10, 4);
  nn::Module plain;
  run_error_cases({
      {"linear_in_features",
       [&] {
         (*linear)(nc::ones({2, 4}));
       },
       "ShapeError", "in_features = 3"},
      {"linear_dtype",
       [&] {
         (*linear)(nc::ones({2, 3}, DType::F64));
       },
       "DTypeError", "Linear"},
      {"linear_negative", [] { nn::Linear(-1, 2); }, "ValueError", "in_features"},
      {"dropout_negative_p", [] { nn::Dropout(-0.1); }, "ValueError", "p must be in [0, 1]"},
      {"dropout_p_above_1", [] { nn::Dropout(1.5); }, "ValueError", "1.5"},
      {"dropout_integer", [] { nc::dropout(nc::ones({2}, DType::I64), 0.5, true); }, "DTypeError", "dropout"},
      {"embedding_index_range",
       [&] {
         (*embedding)(i64({3, 10}, {2}));
       },
       "IndexError", "index 10"},
      {"embedding_names_size",
       [&] {
         (*embedding)(i64({3, 10}, {2}));
       },
       "IndexError", "10 embeddings"},
      {"embedding_negative", [&] { (*embedding)(i64({-1}, {1})); }, "IndexError", "index -1"},
      {"embedding_float_index", [&] { (*embedding)(f32({1}, {1})); }, "DTypeError", "embedding: index"},
      {"flatten_dims",
       [] {
         nn::Flatten(2, 1)(nc::ones({2, 3, 4}));
       },
       "IndexError", "flatten"},
      {"sequential_index", [] { nn::Sequential()[0]; }, "IndexError", "Sequential"},
      {"base_forward", [&] { plain(nc::ones({1})); }, "Error", "forward"},
      {"duplicate_name",
       [&] {
         plain.register_buffer("a", nc::ones({1}));
         plain.register_parameter("a", nc::ones({1}));
       },
       "ValueError", "\"a\""},
      {"dotted_name", [&] { plain.register_parameter("x.y", nc::ones({1})); }, "ValueError", "x.y"},
      {"integer_parameter", [&] { plain.register_parameter("n", nc::ones({1}, DType::I64)); }, "DTypeError", "\"n\""},
      {"non_leaf_parameter", [&] { plain.register_parameter("p", nc::ones({1}).requires_grad_() * 2.0); }, "ValueError",
       "leaves"},
      {"null_child", [&] { plain.register_module("c", std::shared_ptr<nn::Linear>()); }, "ValueError", "null"},
      {"to_integer_dtype", [&] { linear->to(DType::I64); }, "DTypeError", "floating"},
  });
}

// ---------------------------------------------------------------- naming and traversal
TEST(Nn, SequentialNamesChildrenByPosition) {
  nn::Sequential seq({std::make_shared<nn::Linear>(4, 8), std::make_shared<nn::ReLU>()});
  seq.push_back(std::make_shared<nn::Linear>(8, 2));
  EXPECT_EQ(seq.size(), 3u);
  EXPECT_EQ(names_of(seq.named_parameters()), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_EQ(seq.parameters().size(), 4u);
  EXPECT_EQ(seq.parameters()[2].shape(), (nc::Shape{2, 8}));
  EXPECT_NE(std::dynamic_pointer_cast<nn::ReLU>(seq[1]), nullptr);
  EXPECT_EQ(seq.children().size(), 3u);
  EXPECT_EQ(seq.named_children()[2].first, "2");
  // Nested: a Sequential inside a Sequential gets "1.0.weight".
  nn::Sequential outer(
      {std::make_shared<nn::Tanh>(),
       std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{std::make_shared<nn::Linear>(2, 2)})});
  EXPECT_EQ(names_of(outer.named_parameters()), (std::vector<std::string>{"1.0.weight", "1.0.bias"}));
  // An empty Sequential passes its input through.
  Tensor x = f32({1, 2}, {2});
  EXPECT_TRUE(nn::Sequential()(x).is_same(x));
}

TEST(Nn, CustomModuleNamesFollowPyTorch) {
  Net net(1);
  EXPECT_EQ(names_of(net.named_parameters()), (std::vector<std::string>{"scale", "fc1.weight", "fc1.bias",
                                                                        "body.0.weight", "body.0.bias", "fc2.weight"}));
  EXPECT_EQ(names_of(net.named_buffers()), (std::vector<std::string>{"steps", "body.calls"}));
  // Each module's parameters, then its buffers, then its children's entries.
  EXPECT_EQ(names_of(net.state_dict()),
            (std::vector<std::string>{"scale", "steps", "fc1.weight", "fc1.bias", "body.calls", "body.0.weight",
                                      "body.0.bias", "fc2.weight"}));
  std::vector<std::string> children;
  for (const auto& c : net.named_children()) children.push_back(c.first);
  EXPECT_EQ(children, (std::vector<std::string>{"fc1", "body", "fc2"}));
  int64_t count = 0;
  for (const Tensor& p : net.parameters()) {
    EXPECT_TRUE(p.requires_grad());
    count += p.numel();
  }
  EXPECT_EQ(count, 3 + (4 * 8 + 8) + (8 * 8 + 8) + 8 * 3);
  // The module's member handles are the registered tensors themselves.
  EXPECT_TRUE(net.parameters()[1].is_same(net.fc1->weight));
  EXPECT_FALSE(net.fc2->bias.defined());
  Tensor y = net(nc::ones({5, 4}));
  EXPECT_EQ(y.shape(), (nc::Shape{5, 3}));
  EXPECT_TRUE(y.to_vector<float>() == net.forward(nc::ones({5, 4})).to_vector<float>());
}

TEST(Nn, SharedTensorsAreListedOnceButSavedUnderEveryName) {
  // Weight tying: one Linear reachable as "a" and "b".
  struct Tied : nn::Module {
    Tied() {
      auto shared = std::make_shared<nn::Linear>(2, 2);
      register_module("a", shared);
      register_module("b", shared);
    }
  } tied;
  EXPECT_EQ(names_of(tied.named_parameters()), (std::vector<std::string>{"a.weight", "a.bias"}));
  EXPECT_EQ(tied.children().size(), 1u);
  EXPECT_EQ(names_of(tied.state_dict()), (std::vector<std::string>{"a.weight", "a.bias", "b.weight", "b.bias"}));
}

TEST(Nn, TrainEvalAndZeroGradAreRecursive) {
  Net net(2);
  EXPECT_TRUE(net.is_training());
  net.eval();
  EXPECT_FALSE(net.is_training());
  EXPECT_FALSE(net.body->is_training());
  EXPECT_FALSE((*net.body)[1]->is_training());
  net.train();
  EXPECT_TRUE((*net.body)[1]->is_training());
  nc::sum(net(nc::ones({2, 4}))).backward();
  for (const Tensor& p : net.parameters()) EXPECT_TRUE(p.grad().defined());
  net.zero_grad();
  for (const Tensor& p : net.parameters()) EXPECT_FALSE(p.grad().defined());
}

// ---------------------------------------------------------------- layers
TEST(Nn, LinearInitIsBoundedAndSeeded) {
  nc::Generator gen_a(42), gen_b(42), gen_c(43);
  nn::Linear a(100, 50, true, &gen_a), b(100, 50, true, &gen_b), c(100, 50, true, &gen_c);
  EXPECT_EQ(a.weight.shape(), (nc::Shape{50, 100}));
  EXPECT_EQ(a.bias.shape(), (nc::Shape{50}));
  for (const Tensor& t : {a.weight, a.bias}) {
    EXPECT_LE(nc::max(nc::abs(t)).item<float>(), 0.1f);
    EXPECT_GT(nc::max(nc::abs(t)).item<float>(), 0.09f);  // fills the range
  }
  EXPECT_NEAR(nc::mean(a.weight).item<float>(), 0.0f, 0.005f);
  EXPECT_TRUE(a.weight.to_vector<float>() == b.weight.to_vector<float>());
  EXPECT_TRUE(a.bias.to_vector<float>() == b.bias.to_vector<float>());
  EXPECT_FALSE(a.weight.to_vector<float>() == c.weight.to_vector<float>());
  // Without a generator: the default one, reproducible through manual_seed.
  nc::manual_seed(7);
  nn::Linear d(3, 2);
  nc::manual_seed(7);
  nn::Linear e(3, 2);
  EXPECT_TRUE(d.weight.to_vector<float>() == e.weight.to_vector<float>());
  EXPECT_EQ(names_of(nn::Linear(3, 2, false).named_parameters()), (std::vector<std::string>{"weight"}));
}

TEST(Nn, LinearForwardByHand) {
  nn::Linear layer(2, 3);
  assign(layer.weight, f32({1, 2, 3, 4, 5, 6}, {3, 2}));
  assign(layer.bias, f32({0.5, -1, 0}, {3}));
  Tensor x = f32({1, 1, 2, -1}, {2, 2});
  // [1, 1] -> [3, 7, 11] + bias; [2, -1] -> [0, 2, 4] + bias.
  Tensor y = layer(x);
  expect_near(y, {3.5, 6, 11, 0.5, 1, 4}, 1e-6);
  EXPECT_EQ(layer(x.reshape({2, 1, 2})).shape(), (nc::Shape{2, 1, 3}));
  expect_near(layer(f32({1, 1}, {2})), {3.5, 6, 11}, 1e-6);
  nc::sum(y).backward();
  expect_near(layer.weight.grad(), {3, 0, 3, 0, 3, 0}, 1e-6);  // column sums of x per output
  expect_near(layer.bias.grad(), {2, 2, 2}, 1e-6);
  nn::Linear no_bias(2, 3, false);
  assign(no_bias.weight, f32({1, 2, 3, 4, 5, 6}, {3, 2}));
  expect_near(no_bias(x), {3, 7, 11, 0, 2, 4}, 1e-6);
}

TEST(Nn, ActivationModulesMatchTheirFormulas) {
  Tensor x = f32({-1, 0, 2}, {3});
  struct Row {
    std::string name;
    std::shared_ptr<nn::Module> module;
    std::vector<double> expected;
  };
  const std::vector<Row> rows = {
      {"relu", std::make_shared<nn::ReLU>(), {0, 0, 2}},
      {"tanh", std::make_shared<nn::Tanh>(), {-0.76159416, 0, 0.96402758}},
      {"sigmoid", std::make_shared<nn::Sigmoid>(), {0.26894142, 0.5, 0.88079708}},
      {"gelu", std::make_shared<nn::GELU>(), {-0.15865525, 0, 1.95449974}},
      {"gelu_tanh", std::make_shared<nn::GELU>(true), {-0.15880801, 0, 1.95459769}},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    expect_near((*r.module)(x), r.expected, 1e-6);
    EXPECT_TRUE(r.module->parameters().empty());
  }
}

TEST(Nn, DropoutTrainsAndEvaluates) {
  nc::Generator gen(3);
  nn::Dropout drop(0.3, &gen);
  Tensor x = nc::ones({20000}).requires_grad_();
  Tensor y = drop(x);
  std::vector<float> v = y.to_vector<float>();
  int64_t zeros = 0;
  for (float e : v) {
    if (e == 0) ++zeros;
    else EXPECT_NEAR(e, 1 / 0.7, 1e-6);
  }
  EXPECT_NEAR(static_cast<double>(zeros) / static_cast<double>(v.size()), 0.3, 0.015);
  // The gradient goes through the same scaled mask.
  nc::sum(y).backward();
  EXPECT_TRUE(x.grad().to_vector<float>() == v);
  // The same seed gives the same mask.
  nc::Generator again(3);
  EXPECT_TRUE(nn::Dropout(0.3, &again)(nc::ones({20000})).to_vector<float>() == v);
  drop.eval();
  EXPECT_TRUE(drop(x).is_same(x));
  EXPECT_TRUE(nc::dropout(x, 0.3, /*training=*/false).is_same(x));
  EXPECT_TRUE(nc::dropout(x, 0.0, /*training=*/true).is_same(x));
  expect_near(nc::dropout(f32({1, -2, 3}, {3}), 1.0, true), {0, 0, 0}, 0);
  // Inside a container, eval() reaches it.
  nn::Sequential seq({std::make_shared<nn::Dropout>(0.5)});
  seq.eval();
  expect_near(seq(f32({1, 2}, {2})), {1, 2}, 0);
}

// The fused dropout kernel draws the mask rand() draws and gives the bits of the composed
// x * (ge(rand(shape, f32), p).to(dtype) * (1 / (1 - p))), forward and backward, in every
// floating dtype, on every device, for non-contiguous input too.
TEST(Nn, DropoutIsTheComposedMaskBitForBit) {
  std::vector<nc::Device> devices{nc::Device::cpu()};
  if (nc::cuda_is_available()) devices.push_back(nc::Device::cuda());
  for (const nc::Device& device : devices) {
    for (DType dtype : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
      SCOPED_TRACE(device.str() + " " + nc::dtype_name(dtype));
      nc::Generator data_gen(5);
      const Tensor base = nc::randn({37, 41}, DType::F32, &data_gen).to(device, dtype);
      Tensor x = base.t();  // a non-contiguous leaf
      x.requires_grad_();
      const Tensor g = nc::randn({41, 37}, DType::F32, &data_gen).to(device, dtype);
      for (double p : {0.1, 0.5, 0.9}) {
        nc::Generator fused_gen(11), composed_gen(11);
        const Tensor y = nc::dropout(x, p, true, &fused_gen);
        const Tensor keep = nc::ge(nc::rand(x.shape(), nc::TensorOptions(DType::F32, device), &composed_gen), p);
        const Tensor mask = nc::mul(keep.to(dtype), 1.0 / (1.0 - p));
        EXPECT_EQ(fused_gen.offset(), composed_gen.offset());
        EXPECT_EQ(values_of(y), values_of(nc::mul(x.detach(), mask))) << "p " << p;
        x.zero_grad();
        y.backward(g);
        EXPECT_EQ(values_of(x.grad()), values_of(nc::mul(g, mask))) << "p " << p;
      }
    }
  }
}

TEST(Nn, FlattenShapes) {
  struct Row {
    int64_t start, end;
    nc::Shape expected;
  };
  const std::vector<Row> rows = {
      {1, -1, {2, 60}}, {0, -1, {120}}, {1, 2, {2, 12, 5}}, {-2, -1, {2, 3, 20}}, {2, 2, {2, 3, 4, 5}},
  };
  Tensor x = nc::arange(120, DType::F32).reshape({2, 3, 4, 5});
  for (const Row& r : rows) {
    nn::Flatten flatten(r.start, r.end);
    Tensor y = flatten(x);
    EXPECT_EQ(y.shape(), r.expected) << r.start << ", " << r.end;
    EXPECT_TRUE(y.to_vector<float>() == x.to_vector<float>());
  }
  EXPECT_EQ(nn::Flatten()(nc::ones({7, 2, 2})).shape(), (nc::Shape{7, 4}));
}

TEST(Nn, EmbeddingLooksUpRows) {
  nc::Generator gen(5);
  nn::Embedding table(5, 3, &gen);
  EXPECT_EQ(table.weight.shape(), (nc::Shape{5, 3}));
  std::vector<float> w = table.weight.to_vector<float>();
  Tensor index = i64({0, 4, 4, 2}, {2, 2});
  Tensor y = table(index);
  EXPECT_EQ(y.shape(), (nc::Shape{2, 2, 3}));
  std::vector<float> expected;
  for (int64_t row : {0, 4, 4, 2})
    for (int64_t k = 0; k < 3; ++k) expected.push_back(w[static_cast<size_t>(row * 3 + k)]);
  EXPECT_TRUE(y.to_vector<float>() == expected);
  // i32 indices and a 0-dim index.
  EXPECT_TRUE(table(index.to(DType::I32)).to_vector<float>() == expected);
  EXPECT_EQ(table(i64({1}, {})).shape(), (nc::Shape{3}));
  // Repeated rows accumulate their gradients.
  nc::sum(y).backward();
  expect_near(table.weight.grad(), {1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 2, 2, 2}, 0);
  // N(0, 1) initialisation.
  nn::Embedding big(1000, 16, &gen);
  EXPECT_NEAR(nc::mean(big.weight).item<float>(), 0.0f, 0.03f);
  EXPECT_NEAR(std::sqrt(nc::var(big.weight).item<float>()), 1.0f, 0.03f);
}

// F.embedding's padding_idx: the row is looked up as usual but gets no gradient; a negative
// padding_idx counts from the end.
TEST(Nn, EmbeddingPaddingRowGetsNoGradient) {
  for (int64_t padding_idx : {int64_t{1}, int64_t{-3}}) {
    SCOPED_TRACE(padding_idx);
    Tensor weight = nc::from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2}).requires_grad_();
    Tensor y = nc::embedding(weight, i64({1, 3, 1, 0}, {4}), padding_idx);
    EXPECT_TRUE(y.to_vector<float>() == (std::vector<float>{2, 3, 6, 7, 2, 3, 0, 1}));
    nc::sum(y * 2).backward();
    expect_near(weight.grad(), {2, 2, 0, 0, 0, 0, 2, 2}, 0);
  }
  Tensor weight = nc::zeros({4, 2});
  EXPECT_THROW(nc::embedding(weight, i64({0}, {1}), 4), nc::IndexError);
  EXPECT_THROW(nc::embedding(weight, i64({0}, {1}), -5), nc::IndexError);
  EXPECT_THROW(nc::embedding(nc::zeros({4}), i64({0}, {1})), nc::ShapeError);
}

// ---------------------------------------------------------------- state and conversion
TEST(Nn, StateDictRoundTripsThroughSafetensors) {
  Net source(11), target(12);
  assign(source.steps, i64({9}, {1}));
  Tensor x = leaf({3, 4}, 50).detach().to(DType::F32);
  std::vector<float> expected = source(x).to_vector<float>();
  ASSERT_FALSE(target(x).to_vector<float>() == expected);

  std::string path = ::testing::TempDir() + "normcore_nn_state.safetensors";
  source.save(path);
  nc::safetensors::File file = nc::safetensors::load(path);
  EXPECT_EQ(names_of(file.tensors), names_of(source.state_dict()));
  std::vector<Tensor> handles = target.parameters();
  target.load(path);
  EXPECT_TRUE(target(x).to_vector<float>() == expected);
  EXPECT_EQ(target.steps.to_vector<int64_t>(), (std::vector<int64_t>{9}));
  // Loaded in place: the handles taken before see the new values and still require grad.
  EXPECT_TRUE(handles[1].to_vector<float>() == source.fc1->weight.to_vector<float>());
  EXPECT_TRUE(handles[1].requires_grad());

  // state_dict entries are detached views of the live data.
  nn::NamedTensors state = source.state_dict();
  EXPECT_FALSE(state[2].second.requires_grad());
  EXPECT_EQ(state[2].second.data_ptr(), source.fc1->weight.data_ptr());

  // Entries of another dtype are converted on the way in.
  nn::NamedTensors doubled;
  for (const auto& e : state) doubled.emplace_back(e.first, e.second.to(DType::F64) * 2.0);
  target.load_state_dict(doubled);
  EXPECT_EQ(target.fc1->weight.dtype(), DType::F32);
  expect_near(target.fc1->weight, (source.fc1->weight * 2.0).to_vector<double>(), 1e-6);
}

TEST(Nn, StrictLoadNamesTheOffendingKeys) {
  Net net(13);
  nn::NamedTensors good = Net(14).state_dict();
  std::vector<float> before = net.fc1->weight.to_vector<float>();

  nn::NamedTensors missing(good.begin(), good.end() - 1);  // no "fc2.weight"
  nn::NamedTensors unexpected = good;
  unexpected.emplace_back("head.weight", nc::ones({2}));
  nn::NamedTensors misshaped = good;
  misshaped[3].second = nc::ones({7});  // "fc1.bias"
  nn::NamedTensors duplicated = good;
  duplicated.push_back(good[0]);
  run_error_cases({
      {"missing", [&] { net.load_state_dict(missing); }, "ValueError", "missing keys: \"fc2.weight\""},
      {"unexpected", [&] { net.load_state_dict(unexpected); }, "ValueError", "unexpected keys: \"head.weight\""},
      {"misshaped", [&] { net.load_state_dict(misshaped); }, "ShapeError", "fc1.bias"},
      {"misshaped_lenient", [&] { net.load_state_dict(misshaped, false); }, "ShapeError", "[7]"},
      {"duplicated", [&] { net.load_state_dict(duplicated); }, "ValueError", "more than once"},
      {"missing_file", [&] { net.load(::testing::TempDir() + "no_such_file.safetensors"); }, "IOError", "no_such_file"},
  });
  // Nothing was copied by the failed loads.
  EXPECT_TRUE(net.fc1->weight.to_vector<float>() == before);

  // Not strict: the keys both sides have are loaded, the rest ignored.
  net.load_state_dict(missing, /*strict=*/false);
  EXPECT_TRUE(net.fc1->weight.to_vector<float>() == good[2].second.to_vector<float>());
  net.load_state_dict(unexpected, /*strict=*/false);
}

TEST(Nn, ToDTypeConvertsInPlace) {
  Net net(15);
  std::vector<Tensor> params = net.parameters();
  std::vector<float> weight = net.fc1->weight.to_vector<float>();
  nc::sum(net(nc::ones({2, 4}))).backward();

  net.to(DType::F64);
  for (const Tensor& p : params) {
    EXPECT_EQ(p.dtype(), DType::F64);
    EXPECT_TRUE(p.requires_grad());
    EXPECT_TRUE(p.is_leaf());
    EXPECT_EQ(p.grad().dtype(), DType::F64);  // the accumulated gradient came along
  }
  EXPECT_EQ(net.steps.dtype(), DType::I64);  // integer buffers keep their dtype
  std::vector<double> widened = params[1].to_vector<double>();
  for (size_t i = 0; i < weight.size(); ++i) EXPECT_EQ(widened[i], static_cast<double>(weight[i]));

  // Training keeps working through the old handles.
  net.zero_grad();
  Tensor y = net(nc::ones({2, 4}, DType::F64));
  EXPECT_EQ(y.dtype(), DType::F64);
  nc::sum(y).backward();
  EXPECT_EQ(params[1].grad().dtype(), DType::F64);

  // Same device: nothing moves.
  void* data = params[1].data_ptr();
  net.to(nc::Device::cpu());
  EXPECT_EQ(params[1].data_ptr(), data);
}

// ---------------------------------------------------------------- end to end
TEST(Nn, FitsALineWithGradientDescent) {
  nc::Generator gen(21);
  nn::Linear model(1, 1, true, &gen);
  Tensor x = nc::linspace(-1, 1, 32).reshape({32, 1});
  Tensor y = x * 2.0 + 1.0;
  const double lr = 0.5;
  double first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    Tensor loss = nc::mse_loss(model(x), y);
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
    model.zero_grad();
    loss.backward();
    nc::autograd::NoGradGuard no_grad;
    for (Tensor& p : model.parameters()) p.copy_(p - p.grad() * lr);
  }
  EXPECT_GT(first, 0.1);
  EXPECT_LT(last, 1e-6);
  EXPECT_NEAR(model.weight.item<float>(), 2.0f, 1e-3f);
  EXPECT_NEAR(model.bias.item<float>(), 1.0f, 1e-3f);
}

TEST(Nn, ClassifierLearnsWithCrossEntropy) {
  // Two separable blobs; a Linear-ReLU-Linear net gets them all right.
  nc::Generator gen(22);
  Tensor x =
      nc::cat({nc::randn({32, 2}, DType::F32, &gen) * 0.3 + 1.0, nc::randn({32, 2}, DType::F32, &gen) * 0.3 - 1.0}, 0);
  Tensor labels = nc::cat({nc::zeros({32}, DType::I64), nc::ones({32}, DType::I64)}, 0);
  nn::Sequential model({std::make_shared<nn::Linear>(2, 16, true, &gen), std::make_shared<nn::ReLU>(),
                        std::make_shared<nn::Linear>(16, 2, true, &gen)});
  for (int step = 0; step < 100; ++step) {
    Tensor loss = nc::cross_entropy(model(x), labels, nc::Reduction::Mean, 0.05);
    model.zero_grad();
    loss.backward();
    nc::autograd::NoGradGuard no_grad;
    for (Tensor& p : model.parameters()) p.copy_(p - p.grad() * 0.5);
  }
  Tensor predicted = nc::argmax(model(x), 1);
  EXPECT_EQ(nc::sum(nc::eq(predicted, labels)).item<int64_t>(), 64);
}

TEST(Nn, CudaForwardMatchesCpu) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  Net net(30);
  Tensor x = leaf({5, 4}, 60).detach().to(DType::F32);
  std::vector<float> expected = net(x).to_vector<float>();
  std::vector<Tensor> params = net.parameters();
  net.to(nc::Device::cuda());
  EXPECT_TRUE(params[0].device().is_cuda());
  EXPECT_TRUE(net.steps.device().is_cuda());
  Tensor y = net(x.to(nc::Device::cuda()));
  expect_near(y.to(nc::Device::cpu()), std::vector<double>(expected.begin(), expected.end()), 1e-5);
  nc::sum(y).backward();
  EXPECT_TRUE(params[1].grad().device().is_cuda());
}
