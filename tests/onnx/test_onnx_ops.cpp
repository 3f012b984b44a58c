// ONNX ops on one-node models with hand-computed answers: Pad, CumSum, Mod (ops_numeric.cpp),
// the losses (ops_losses.cpp), Resize and ConvTranspose (ops_spatial.cpp); each mode or input
// they do not take is a typed error naming the node, never a quiet wrong answer. ONNX's node
// tests (ctest -L onnx) cover the same ops more widely; these pin the semantics a test names.
#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "normcore/normcore.h"
#include "onnx/proto.h"
#include "tests/test_support.h"

namespace nc = normcore;
using nc::Tensor;
using normcore_test::throws;

namespace {

using Strings = std::vector<std::pair<std::string, std::string>>;
using Ints = std::vector<std::pair<std::string, int64_t>>;

constexpr int kFloat = ::onnx::TensorProto::FLOAT, kInt64 = ::onnx::TensorProto::INT64;

// A model of one node "n": op over the inputs (name, ONNX element type) to output y of
// out_type, with string and int attributes, at opset 13.
::onnx::ModelProto one_node(const std::string& op, const std::vector<std::pair<std::string, int>>& inputs, int out_type,
                            const Strings& strings = {}, const Ints& ints = {}) {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  auto* g = m.mutable_graph();
  auto* node = g->add_node();
  node->set_op_type(op);
  node->set_name("n");
  for (const auto& [name, type] : inputs) {
    auto* v = g->add_input();
    v->set_name(name);
    v->mutable_type()->mutable_tensor_type()->set_elem_type(type);
    node->add_input(name);
  }
  node->add_output("y");
  auto* y = g->add_output();
  y->set_name("y");
  y->mutable_type()->mutable_tensor_type()->set_elem_type(out_type);
  for (const auto& [name, value] : strings) {
    auto* a = node->add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto::STRING);
    a->set_s(value);
  }
  for (const auto& [name, value] : ints) {
    auto* a = node->add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto::INT);
    a->set_i(value);
  }
  return m;
}

void add_ints(::onnx::ModelProto& m, const std::string& name, const std::vector<int64_t>& values) {
  auto* a = m.mutable_graph()->mutable_node(0)->add_attribute();
  a->set_name(name);
  a->set_type(::onnx::AttributeProto::INTS);
  for (int64_t v : values) a->add_ints(v);
}

Tensor run_one(const ::onnx::ModelProto& m, const std::vector<Tensor>& inputs) {
  return nc::onnx::Model::parse(m.SerializeAsString(), "m.onnx").run(inputs)[0];
}

}  // namespace

TEST(OnnxOps, PadCumSumAndMod) {
  const Tensor x = nc::from_vector<float>({1, 2, 3}, {1, 3});
  const Tensor pads = nc::from_vector<int64_t>({0, 2, 0, -1}, {4});  // 2 before dim 1, crop 1 after
  const auto pad = [&](const char* mode) {
    return run_one(one_node("Pad", {{"x", kFloat}, {"pads", kInt64}}, kFloat, {{"mode", mode}}), {x, pads});
  };
  EXPECT_EQ(pad("constant").to_vector<float>(), (std::vector<float>{0, 0, 1, 2}));
  EXPECT_EQ(pad("edge").to_vector<float>(), (std::vector<float>{1, 1, 1, 2}));
  EXPECT_EQ(pad("reflect").to_vector<float>(), (std::vector<float>{1, 2, 1, 2}));  // [1, 2] mirrored about 1
  throws<nc::ValueError>([&] { pad("wrap"); }, {"node 'n' (Pad)", "wrap"})();

  const Tensor v = nc::from_vector<int64_t>({1, 2, 3, 4}, {4}), axis = nc::from_vector<int64_t>({0}, {1});
  const auto cumsum = [&](int64_t exclusive, int64_t reverse) {
    return run_one(one_node("CumSum", {{"x", kInt64}, {"axis", kInt64}}, kInt64, {},
                            {{"exclusive", exclusive}, {"reverse", reverse}}),
                   {v, axis})
        .to_vector<int64_t>();
  };
  EXPECT_EQ(cumsum(0, 0), (std::vector<int64_t>{1, 3, 6, 10}));
  EXPECT_EQ(cumsum(1, 0), (std::vector<int64_t>{0, 1, 3, 6}));
  EXPECT_EQ(cumsum(0, 1), (std::vector<int64_t>{10, 9, 7, 4}));
  EXPECT_EQ(cumsum(1, 1), (std::vector<int64_t>{9, 7, 4, 0}));

  const Tensor a = nc::from_vector<int64_t>({7, -7, 7, -7, 6}, {5}),
               b = nc::from_vector<int64_t>({3, 3, -3, -3, -3}, {5});
  const auto mod = [&](int64_t fmod, const Tensor& p, const Tensor& q, int type) {
    return run_one(one_node("Mod", {{"a", type}, {"b", type}}, type, {}, {{"fmod", fmod}}), {p, q});
  };
  EXPECT_EQ(mod(0, a, b, kInt64).to_vector<int64_t>(), (std::vector<int64_t>{1, 2, -2, -1, 0}));  // b's sign
  EXPECT_EQ(mod(1, a, b, kInt64).to_vector<int64_t>(), (std::vector<int64_t>{1, -1, 1, -1, 0}));  // a's sign
  const Tensor af = a.to(nc::DType::F32), bf = b.to(nc::DType::F32);
  EXPECT_EQ(mod(1, af, bf, kFloat).to_vector<float>(), (std::vector<float>{1, -1, 1, -1, 0}));
  throws<nc::ValueError>([&] { mod(0, af, bf, kFloat); }, {"node 'n' (Mod)", "fmod = 0", "f32"})();
}

// NegativeLogLikelihoodLoss with class weights and an ignored target, every reduction;
// SoftmaxCrossEntropyLoss is the same loss of log_softmax.
TEST(OnnxOps, Losses) {
  const Tensor logp = nc::from_vector<float>({-1, -2, -3, -4, -5, -6}, {2, 3});  // [N = 2, C = 3]
  const Tensor weight = nc::from_vector<float>({1, 2, 4}, {3});
  const Tensor target = nc::from_vector<int64_t>({2, -1}, {2});
  const auto nll = [&](const char* reduction, const Tensor& t) {
    return run_one(one_node("NegativeLogLikelihoodLoss", {{"x", kFloat}, {"t", kInt64}, {"w", kFloat}}, kFloat,
                            {{"reduction", reduction}}, {{"ignore_index", -1}}),
                   {logp, t, weight});
  };
  EXPECT_EQ(nll("none", target).to_vector<float>(), (std::vector<float>{12, 0}));
  EXPECT_EQ(nll("sum", target).item<float>(), 12);
  EXPECT_EQ(nll("mean", target).item<float>(), 3);  // 12 over the weight 4 of the one target kept
  throws<nc::IndexError>(
      [&] {
        nll("sum", nc::from_vector<int64_t>({2, 3}, {2}));
      },
      {"node 'n' (NegativeLogLikelihoodLoss)", "target holds 3", "[0, 3)"})();
  throws<nc::ValueError>([&] { nll("max", target); }, {"reduction 'max'"})();
  throws<nc::ShapeError>(
      [&] {
        nll("sum", nc::from_vector<int64_t>({0, 1, 2}, {3}));
      },
      {"node 'n'", "do not fit", "[2, 3]", "[3]"})();

  const Tensor scores = nc::from_vector<float>({1, 2, 3, 0, 0, 0}, {2, 3});
  const Tensor labels = nc::from_vector<int64_t>({2, 0}, {2});
  const Tensor sce =
      run_one(one_node("SoftmaxCrossEntropyLoss", {{"s", kFloat}, {"t", kInt64}}, kFloat, {{"reduction", "none"}}),
              {scores, labels});
  const Tensor expected = nc::neg(nc::gather(nc::log_softmax(scores, 1), 1, labels.unsqueeze(1)).squeeze(1));
  EXPECT_LT(nc::max(nc::abs(nc::sub(sce, expected))).item<float>(), 1e-6f);
  EXPECT_NEAR(sce.to_vector<float>()[1], std::log(3.0f), 1e-6f);  // uniform scores: log C
}

TEST(OnnxOps, ResizeNearestLinearAndRefusals) {
  const Tensor x = nc::from_vector<float>({0, 1, 2, 3}, {1, 1, 2, 2});
  const Tensor scales = nc::from_vector<float>({1, 1, 2, 2}, {4});
  const auto resize = [&](const Strings& strings) {
    return run_one(one_node("Resize", {{"x", kFloat}, {"roi", kFloat}, {"scales", kFloat}}, kFloat, strings),
                   {x, nc::zeros({0}), scales});
  };
  const Tensor nearest = resize({{"mode", "nearest"}});
  ASSERT_EQ(nearest.shape(), (nc::Shape{1, 1, 4, 4}));
  EXPECT_EQ(nearest.to_vector<float>(), (std::vector<float>{0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 2, 2, 3, 3}));
  // align_corners: output corners on input corners, thirds between them.
  const std::vector<float> rows =
      resize({{"mode", "linear"}, {"coordinate_transformation_mode", "align_corners"}}).to_vector<float>();
  const std::vector<float> first_row(rows.begin(), rows.begin() + 4), first_column{rows[0], rows[4], rows[8], rows[12]};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(first_row[static_cast<size_t>(i)], static_cast<float>(i) / 3, 1e-6f);
    EXPECT_NEAR(first_column[static_cast<size_t>(i)], 2.0f * static_cast<float>(i) / 3, 1e-6f);
  }
  throws<nc::ValueError>([&] { resize({{"mode", "cubic"}}); }, {"node 'n' (Resize)", "mode 'cubic'"})();
  throws<nc::ValueError>(
      [&] {
        resize({{"coordinate_transformation_mode", "tf_crop_and_resize"}});
      },
      {"node 'n' (Resize)", "tf_crop_and_resize"})();
}

// ConvTranspose with stride 2 and a 2x2 kernel places a scaled copy of the kernel per input
// element, without overlap; with pads 1 the outer ring goes; against conv2d's input gradient
// (what it is defined as) at stride 2, pads 1 and a 3x3 kernel, two groups.
TEST(OnnxOps, ConvTransposeIsTheConvolutionsInputGradient) {
  const Tensor x = nc::from_vector<float>({1, 2, 3, 4}, {1, 1, 2, 2});
  const Tensor w = nc::from_vector<float>({1, 10, 100, 1000}, {1, 1, 2, 2});
  ::onnx::ModelProto m = one_node("ConvTranspose", {{"x", kFloat}, {"w", kFloat}}, kFloat);
  add_ints(m, "strides", {2, 2});
  const Tensor y = run_one(m, {x, w});
  ASSERT_EQ(y.shape(), (nc::Shape{1, 1, 4, 4}));
  EXPECT_EQ(y.to_vector<float>(),
            (std::vector<float>{1, 10, 2, 20, 100, 1000, 200, 2000, 3, 30, 4, 40, 300, 3000, 400, 4000}));

  const Tensor input = nc::randn({2, 4, 5, 5}), kernel = nc::randn({6, 2, 3, 3});  // 2 groups: [6, 4 / 2, 3, 3]
  Tensor probe = input.clone();
  probe.requires_grad_(true);
  const Tensor out = nc::conv2d(probe, kernel, Tensor(), 2, 1, 1, 2);  // [2, 6, 3, 3]
  const Tensor dy = nc::randn(out.shape());
  nc::sum(nc::mul(out, dy)).backward();
  ::onnx::ModelProto t = one_node("ConvTranspose", {{"x", kFloat}, {"w", kFloat}}, kFloat, {}, {{"group", 2}});
  add_ints(t, "strides", {2, 2});
  add_ints(t, "pads", {1, 1, 1, 1});
  const Tensor dx = run_one(t, {dy, kernel});
  ASSERT_EQ(dx.shape(), input.shape());
  EXPECT_LT(nc::max(nc::abs(nc::sub(dx, probe.grad()))).item<float>(), 1e-4f);
  throws<nc::ShapeError>(
      [&] {
        run_one(t, {nc::zeros({1, 3, 3, 3}), kernel});
      },
      {"node 'n' (ConvTranspose)", "divisible by group 2"})();
}

namespace {

// y = GELU(x) written out as PyTorch's exporter writes it: the tanh form with x^3 as
// Mul(Mul(x, x), x) and 0.5 * x as a node of its own, constants as Constant nodes; or the erf
// form, constants as initializers. `cubic` replaces 0.044715 (another value is not GELU).
::onnx::ModelProto gelu_graph(bool tanh_form, float cubic = 0.044715f) {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  auto* g = m.mutable_graph();
  for (auto* v : {g->add_input(), g->add_output()}) {
    v->set_name(v == &g->input(0) ? "x" : "y");
    v->mutable_type()->mutable_tensor_type()->set_elem_type(kFloat);
  }
  const auto constant = [&](const std::string& name, float value, bool as_node) {
    ::onnx::TensorProto t;
    t.set_data_type(kFloat);
    t.add_float_data(value);
    if (!as_node) {
      t.set_name(name);
      *g->add_initializer() = t;
      return;
    }
    auto* node = g->add_node();
    node->set_op_type("Constant");
    node->add_output(name);
    auto* a = node->add_attribute();
    a->set_name("value");
    a->set_type(::onnx::AttributeProto::TENSOR);
    *a->mutable_t() = t;
  };
  const auto node = [&](const char* op, std::vector<std::string> in, const std::string& out) {
    auto* n = g->add_node();
    n->set_op_type(op);
    for (const auto& i : in) n->add_input(i);
    n->add_output(out);
  };
  if (tanh_form) {
    constant("c", cubic, true);
    constant("k", 0.7978845608f, true);
    constant("one", 1.0f, true);
    constant("half", 0.5f, true);
    node("Mul", {"x", "x"}, "x2");
    node("Mul", {"x2", "x"}, "x3");
    node("Mul", {"x3", "c"}, "cx3");
    node("Add", {"x", "cx3"}, "inner");
    node("Mul", {"inner", "k"}, "scaled");
    node("Tanh", {"scaled"}, "t");
    node("Mul", {"x", "half"}, "hx");
    node("Add", {"t", "one"}, "t1");
    node("Mul", {"hx", "t1"}, "y");
  } else {
    constant("root2", 1.41421356f, false);
    constant("one", 1.0f, false);
    constant("half", 0.5f, false);
    node("Div", {"x", "root2"}, "s");
    node("Erf", {"s"}, "e");
    node("Add", {"e", "one"}, "e1");
    node("Mul", {"x", "e1"}, "xe");
    node("Mul", {"xe", "half"}, "y");
  }
  return m;
}

}  // namespace

// Both GELU forms run as one gelu (the profile shows one op) with gelu's values; the same
// nodes with another cubic coefficient are not GELU and run node by node.
TEST(OnnxOps, GeluWrittenOutRunsAsOneOp) {
  const Tensor x = nc::randn({4, 33});
  for (bool tanh_form : {true, false}) {
    const nc::onnx::Model model = nc::onnx::Model::parse(gelu_graph(tanh_form).SerializeAsString(), "gelu.onnx");
    std::map<std::string, int64_t> nodes;  // per op type (the Constant nodes stay)
    for (const auto& t : model.profile({x})) nodes[t.op] = t.nodes;
    nodes.erase("Constant");
    EXPECT_EQ(nodes, (std::map<std::string, int64_t>{{tanh_form ? "Gelu(tanh)" : "Gelu", 1}}));
    const Tensor y = model.run({x})[0];
    EXPECT_LT(nc::max(nc::abs(nc::sub(y, nc::gelu(x, tanh_form)))).item<float>(), 1e-6f);
  }
  const nc::onnx::Model other = nc::onnx::Model::parse(gelu_graph(true, 0.05f).SerializeAsString(), "other.onnx");
  bool has_tanh = false;
  for (const auto& t : other.profile({x})) has_tanh = has_tanh || t.op == "Tanh";
  EXPECT_TRUE(has_tanh) << "a cubic coefficient of 0.05 was taken for GELU";
  const Tensor want =
      nc::mul(nc::mul(x, 0.5),
              nc::add(nc::tanh(nc::mul(nc::add(x, nc::mul(nc::mul(nc::mul(x, x), x), 0.05)), 0.7978845608)), 1.0));
  EXPECT_LT(nc::max(nc::abs(nc::sub(other.run({x})[0], want))).item<float>(), 1e-6f);
}

// Einsum beyond ONNX's node tests: three operands, a size-1 letter broadcast, "..." over
// two batch dims, an implicit output; each against the same product written with matmul and
// sum. A repeated letter (a diagonal) is refused naming the node.
TEST(OnnxOps, EinsumContractsLeftToRight) {
  const auto einsum = [](const std::string& equation, const std::vector<Tensor>& xs) {
    ::onnx::ModelProto m;
    m.set_ir_version(8);
    m.add_opset_import()->set_version(13);
    auto* g = m.mutable_graph();
    auto* node = g->add_node();
    node->set_op_type("Einsum");
    node->set_name("n");
    for (size_t i = 0; i < xs.size(); ++i) {
      auto* v = g->add_input();
      v->set_name("x" + std::to_string(i));
      v->mutable_type()->mutable_tensor_type()->set_elem_type(kFloat);
      node->add_input(v->name());
    }
    node->add_output("y");
    auto* y = g->add_output();
    y->set_name("y");
    y->mutable_type()->mutable_tensor_type()->set_elem_type(kFloat);
    auto* a = node->add_attribute();
    a->set_name("equation");
    a->set_type(::onnx::AttributeProto::STRING);
    a->set_s(equation);
    return run_one(m, xs);
  };
  const auto close = [](const Tensor& got, const Tensor& want) {
    ASSERT_EQ(got.shape(), want.shape());
    EXPECT_LT(nc::max(nc::abs(nc::sub(got, want))).item<float>(), 1e-4f);
  };
  const Tensor a = nc::randn({3, 4}), b = nc::randn({4, 5}), c = nc::randn({5, 2});
  close(einsum("ij,jk,kl->il", {a, b, c}), nc::matmul(nc::matmul(a, b), c));
  close(einsum("ij,jk", {a, b}), nc::matmul(a, b));                       // implicit: "ik"
  close(einsum("ij->", {a}), nc::sum(a));                                 // everything summed
  const Tensor p = nc::randn({2, 1, 3, 4}), q = nc::randn({1, 6, 4, 5});  // batch dims broadcast
  close(einsum("...ij, ...jk -> ...ik", {p, q}), nc::matmul(p, q));
  const Tensor r = nc::randn({2, 3});
  close(einsum("bi,b->ib", {r, nc::from_vector<float>({2, -1}, {2})}),
        nc::mul(r, nc::from_vector<float>({2, -1}, {2, 1})).t().contiguous());
  throws<nc::ValueError>([&] { einsum("ii->i", {nc::randn({3, 3})}); }, {"node 'n' (Einsum)", "repeats"})();
  throws<nc::ShapeError>([&] { einsum("ij,jk->ik", {a, a}); }, {"node 'n' (Einsum)", "letter 'j'", "4", "3"})();
}

namespace {

// y = softmax(MatMul(q * 0.5, kT) / 2 + mask) @ v with q [1, 2, 5, 4], kT [1, 2, 4, 5] and
// v [1, 2, 5, 3] graph inputs and mask [5, 5] an initializer.
::onnx::ModelProto attention_graph(const std::vector<float>& mask) {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  auto* g = m.mutable_graph();
  for (const char* name : {"q", "kT", "v"}) {
    auto* in = g->add_input();
    in->set_name(name);
    in->mutable_type()->mutable_tensor_type()->set_elem_type(kFloat);
  }
  auto* y = g->add_output();
  y->set_name("y");
  y->mutable_type()->mutable_tensor_type()->set_elem_type(kFloat);
  const auto initializer = [&](const std::string& name, const std::vector<int64_t>& dims,
                               const std::vector<float>& values) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(kFloat);
    for (int64_t d : dims) t->add_dims(d);
    for (float v : values) t->add_float_data(v);
  };
  initializer("half", {}, {0.5f});
  initializer("two", {}, {2.0f});
  initializer("mask", {5, 5}, mask);
  const auto node = [&](const char* op, std::vector<std::string> in, const std::string& out) {
    auto* n = g->add_node();
    n->set_op_type(op);
    for (const auto& i : in) n->add_input(i);
    n->add_output(out);
    return n;
  };
  node("Mul", {"q", "half"}, "qs");
  node("MatMul", {"qs", "kT"}, "scores");
  node("Div", {"scores", "two"}, "scaled");
  node("Add", {"scaled", "mask"}, "masked");
  auto* softmax = node("Softmax", {"masked"}, "p");
  auto* axis = softmax->add_attribute();
  axis->set_name("axis");
  axis->set_type(::onnx::AttributeProto::INT);
  axis->set_i(-1);
  node("MatMul", {"p", "v"}, "y");
  return m;
}

}  // namespace

// Attention spelled out in nodes runs as one scaled_dot_product_attention when its mask is
// causal (is_causal) or zero, with the scale its Mul and Div make; another mask runs node by
// node. The values are the composition's either way, on every device.
TEST(OnnxOps, AttentionWrittenOutRunsAsOneOp) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> causal(25), zero(25, 0.0f), other(25, 0.0f);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 5; ++j) causal[static_cast<size_t>(i * 5 + j)] = j <= i ? 0.0f : -inf;
  other[3] = -inf;  // not a triangle
  const Tensor q = nc::randn({1, 2, 5, 4}), k_t = nc::randn({1, 2, 4, 5}), v = nc::randn({1, 2, 5, 3});
  std::vector<nc::Device> devices{nc::Device::cpu()};
  if (nc::cuda_is_available()) devices.push_back(nc::Device::cuda());
  for (const auto& [mask, op] : std::vector<std::pair<std::vector<float>, std::string>>{
           {causal, "Attention(causal)"}, {zero, "Attention"}, {other, "Softmax"}}) {
    const nc::onnx::Model model = nc::onnx::Model::parse(attention_graph(mask).SerializeAsString(), "attn.onnx");
    const Tensor scores = nc::add(nc::div(nc::matmul(nc::mul(q, 0.5), k_t), 2.0), nc::from_vector(mask, {5, 5}));
    const Tensor want = nc::matmul(nc::softmax(scores, -1), v);
    for (const nc::Device& device : devices) {
      const std::vector<Tensor> inputs{q.to(device), k_t.to(device), v.to(device)};
      const Tensor first = model.run(inputs)[0].to(nc::Device::cpu());  // node by node; makes the plan
      EXPECT_LT(nc::max(nc::abs(nc::sub(first, want))).item<float>(), 1e-5f);
      std::set<std::string> ops;
      for (const auto& t : model.profile(inputs)) ops.insert(t.op);
      EXPECT_TRUE(ops.count(op)) << op << " on " << device.str();
      for (int run = 0; run < 2; ++run) {  // the plan kept
        const Tensor got = model.run(inputs)[0].to(nc::Device::cpu());
        EXPECT_LT(nc::max(nc::abs(nc::sub(got, want))).item<float>(), 1e-5f) << op << " on " << device.str();
      }
    }
  }
}

// Slice with steps: forward by 2, backward by 1 and 2, ends past either side (ONNX's clamping:
// [0, size] forward, [-1, size - 1] backward), an empty result.
TEST(OnnxOps, SliceWithSteps) {
  const Tensor x = nc::from_vector<float>({0, 1, 2, 3, 4, 5, 6}, {7});
  const auto slice = [&](int64_t start, int64_t end, int64_t step) {
    const auto one = [](int64_t v) { return nc::from_vector<int64_t>({v}, {1}); };
    return run_one(one_node("Slice",
                            {{"x", kFloat}, {"starts", kInt64}, {"ends", kInt64}, {"axes", kInt64}, {"steps", kInt64}},
                            kFloat),
                   {x, one(start), one(end), one(0), one(step)})
        .to_vector<float>();
  };
  EXPECT_EQ(slice(1, 6, 2), (std::vector<float>{1, 3, 5}));
  EXPECT_EQ(slice(-1, std::numeric_limits<int64_t>::min(), -1), (std::vector<float>{6, 5, 4, 3, 2, 1, 0}));
  EXPECT_EQ(slice(100, 0, -2), (std::vector<float>{6, 4, 2}));
  EXPECT_EQ(slice(0, 100, 3), (std::vector<float>{0, 3, 6}));
  EXPECT_TRUE(slice(2, 2, 1).empty());
  EXPECT_TRUE(slice(1, 5, -1).empty());
  throws<nc::ValueError>([&] { slice(0, 3, 0); }, {"node 'n' (Slice)", "step of 0"})();
}
