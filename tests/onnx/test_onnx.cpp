// The ONNX importer (onnx/model.h) on models built here as ModelProto bytes: a small MLP
// (Gemm, Relu, Softmax, an initializer in raw_data, one in float_data) against the same
// math in normcore's ops; every check before running (bad bytes, an op or attribute it does
// not run, an input nothing defines, initializer data that does not fit its dims, dims that
// overflow, an opset past 17) a typed error naming the file, the node and the field; the
// inputs checked at run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/conv_nhwc.h"
#include "normcore/normcore.h"
#include "onnx/proto.h"
#include "tests/test_support.h"

namespace nc = normcore;
using nc::Tensor;
using normcore_test::throws;

namespace {

void set_value(::onnx::ValueInfoProto* v, const std::string& name, std::vector<int64_t> dims,
               int elem_type = ::onnx::TensorProto::FLOAT) {
  v->set_name(name);
  auto* type = v->mutable_type()->mutable_tensor_type();
  type->set_elem_type(elem_type);
  for (int64_t d : dims) type->mutable_shape()->add_dim()->set_dim_value(d);
}

void set_raw(::onnx::TensorProto* t, const std::string& name, std::vector<int64_t> dims,
             const std::vector<float>& values) {
  t->set_name(name);
  t->set_data_type(::onnx::TensorProto::FLOAT);
  for (int64_t d : dims) t->add_dims(d);
  t->set_raw_data(std::string(reinterpret_cast<const char*>(values.data()), sizeof(float) * values.size()));
}

// x [2, 3] -> Gemm(w [4, 3] transposed, b [4]) -> Relu -> Softmax: y [2, 4].
::onnx::ModelProto mlp(int64_t opset = 13) {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(opset);
  auto* g = m.mutable_graph();
  set_value(g->add_input(), "x", {2, 3});
  set_value(g->add_output(), "y", {2, 4});
  set_raw(g->add_initializer(), "w", {4, 3},
          {0.1f, -0.2f, 0.3f, 0.4f, 0.5f, -0.6f, -0.7f, 0.8f, 0.9f, 1.0f, 1.1f, 1.2f});
  auto* b = g->add_initializer();  // in float_data rather than raw_data
  b->set_name("b");
  b->set_data_type(::onnx::TensorProto::FLOAT);
  b->add_dims(4);
  for (float v : {0.5f, -1.0f, 0.0f, 0.25f}) b->add_float_data(v);
  auto* gemm = g->add_node();
  gemm->set_op_type("Gemm");
  gemm->set_name("fc");
  for (const char* in : {"x", "w", "b"}) gemm->add_input(in);
  gemm->add_output("h");
  auto* trans = gemm->add_attribute();
  trans->set_name("transB");
  trans->set_type(::onnx::AttributeProto::INT);
  trans->set_i(1);
  auto* relu = g->add_node();
  relu->set_op_type("Relu");
  relu->add_input("h");
  relu->add_output("r");
  auto* softmax = g->add_node();
  softmax->set_op_type("Softmax");
  softmax->add_input("r");
  softmax->add_output("y");
  return m;
}

std::string bytes_of(const ::onnx::ModelProto& m) { return m.SerializeAsString(); }

::onnx::NodeProto* add_node(::onnx::GraphProto* g, const char* op, std::vector<const char*> in, const char* out) {
  auto* n = g->add_node();
  n->set_op_type(op);
  for (const char* i : in) n->add_input(i);
  n->add_output(out);
  return n;
}

// x [2, 3, 5, 5] -> Conv(w [4, 3, 3, 3], b [4], pads 1) -> c; r = Neg(s), made after the Conv
// -> Add(c, r) -> Relu -> y. With also_output, c is a graph output too; residual_dims gives
// s's dims ([2, 4, 5, 5], or a broadcast shape). With residual_conv, r is the same Conv of s
// ([2, 3, 5, 5]) instead: two Convs that only the one Add reads (a ResNet block's
// downsample).
::onnx::ModelProto conv_add_relu(bool also_output, std::vector<int64_t> residual_dims, bool residual_conv = false) {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  auto* g = m.mutable_graph();
  set_value(g->add_input(), "x", {2, 3, 5, 5});
  set_value(g->add_input(), "s", residual_dims);
  set_value(g->add_output(), "y", {2, 4, 5, 5});
  if (also_output) set_value(g->add_output(), "c", {2, 4, 5, 5});
  std::vector<float> w(4 * 3 * 3 * 3);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.05f * static_cast<float>(static_cast<int>(i % 11) - 5);
  set_raw(g->add_initializer(), "w", {4, 3, 3, 3}, w);
  set_raw(g->add_initializer(), "b", {4}, {0.1f, -0.2f, 0.3f, -0.4f});
  auto* conv = add_node(g, "Conv", {"x", "w", "b"}, "c");
  auto* pads = conv->add_attribute();
  pads->set_name("pads");
  pads->set_type(::onnx::AttributeProto::INTS);
  for (int i = 0; i < 4; ++i) pads->add_ints(1);
  if (residual_conv) {
    auto* second = add_node(g, "Conv", {"s", "w", "b"}, "r");
    *second->add_attribute() = conv->attribute(0);
  } else {
    add_node(g, "Neg", {"s"}, "r");
  }
  add_node(g, "Add", {"r", "c"}, "a");
  add_node(g, "Relu", {"a"}, "y");
  return m;
}

}  // namespace

TEST(Onnx, RunsAModelAsNormcoresOpsDo) {
  const nc::onnx::Model model = nc::onnx::Model::parse(bytes_of(mlp()), "mlp.onnx");
  ASSERT_EQ(model.inputs().size(), 1u);
  EXPECT_EQ(model.inputs()[0].name, "x");
  EXPECT_EQ(model.inputs()[0].dims, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(model.outputs()[0].name, "y");
  EXPECT_EQ(model.opset(), 13);
  const Tensor x = nc::from_vector<float>({1, 2, 3, -1, 0.5f, 2}, {2, 3});
  const Tensor w =
      nc::from_vector<float>({0.1f, -0.2f, 0.3f, 0.4f, 0.5f, -0.6f, -0.7f, 0.8f, 0.9f, 1.0f, 1.1f, 1.2f}, {4, 3});
  const Tensor b = nc::from_vector<float>({0.5f, -1.0f, 0.0f, 0.25f}, {4});
  const Tensor expected = nc::softmax(nc::relu(nc::add(nc::matmul(x, w.t()), b)), -1);
  const std::vector<Tensor> out = model.run({x});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].shape(), (nc::Shape{2, 4}));
  EXPECT_LT(normcore_test::relative_error(out[0], expected), 1e-6);
  // The opset before 13 flattens from axis 1: the same for 2-D input.
  const Tensor old = nc::onnx::Model::parse(bytes_of(mlp(11)), "mlp11.onnx").run({x})[0];
  EXPECT_LT(normcore_test::relative_error(old, expected), 1e-6);
  // Inputs are checked.
  throws<nc::DTypeError>([&] { model.run({x.to(nc::DType::F64)}); }, {"mlp.onnx", "input 'x'", "f32"})();
  throws<nc::ShapeError>([&] { model.run({nc::zeros({3, 3})}); }, {"mlp.onnx", "input 'x'", "[3, 3]"})();
  throws<nc::ValueError>([&] { model.run({}); }, {"takes 1 inputs, got 0"})();
}

// profile: one entry per op type with its node count and a time, the inputs checked as run's.
TEST(Onnx, ProfileTimesEachOpType) {
  const nc::onnx::Model model = nc::onnx::Model::parse(bytes_of(mlp()), "mlp.onnx");
  const Tensor x = nc::randn({2, 3});
  const std::vector<nc::onnx::Model::OpTime> times = model.profile({x}, 2);
  ASSERT_EQ(times.size(), 3u);
  std::vector<std::string> ops;
  for (const auto& t : times) {
    ops.push_back(t.op);
    EXPECT_EQ(t.nodes, 1) << t.op;
    EXPECT_GE(t.ms, 0.0) << t.op;
  }
  for (size_t i = 1; i < times.size(); ++i) EXPECT_GE(times[i - 1].ms, times[i].ms);  // the slowest first
  std::sort(ops.begin(), ops.end());
  EXPECT_EQ(ops, (std::vector<std::string>{"Gemm", "Relu", "Softmax"}));
  throws<nc::ValueError>([&] { model.profile({x}, 0); }, {"mlp.onnx", "at least 1 run"})();
  throws<nc::ShapeError>([&] { model.profile({nc::zeros({3, 3})}); }, {"mlp.onnx", "input 'x'", "[3, 3]"})();
}

// One model run again and from several threads at once, on every device: the same outputs
// (the initializers are uploaded to a device by its first run and shared by the later ones).
TEST(Onnx, RunsRepeatedlyAndFromThreadsOnEveryDevice) {
  const nc::onnx::Model model = nc::onnx::Model::parse(bytes_of(mlp()), "mlp.onnx");
  const Tensor x = nc::from_vector<float>({1, 2, 3, -1, 0.5f, 2}, {2, 3});
  const Tensor expected = model.run({x})[0];
  std::vector<nc::Device> devices{nc::Device::cpu()};
  if (nc::cuda_is_available()) devices.push_back(nc::Device::cuda());
  for (const nc::Device& device : devices) {
    SCOPED_TRACE(device.str());
    std::vector<double> errors(4, 0.0);
    std::vector<std::thread> threads;
    for (size_t t = 0; t < errors.size(); ++t) {
      threads.emplace_back([&, t] {
        for (int r = 0; r < 10; ++r)
          errors[t] = std::max(errors[t], normcore_test::relative_error(model.run({x.to(device)})[0], expected));
      });
    }
    for (std::thread& t : threads) t.join();
    for (double e : errors) EXPECT_LT(e, 1e-6);
  }
}

// A Conv whose output only an Add and a Relu read runs them as its epilogue: the same values
// as the three ops, with the residual made after the Conv, broadcast (the unfused path) or the
// Conv's output also a graph output (no fusion), on every device.
TEST(Onnx, ConvAddReluAsOneEpilogue) {
  std::vector<nc::Device> devices{nc::Device::cpu()};
  if (nc::cuda_is_available()) devices.push_back(nc::Device::cuda());
  nc::Generator gen(3);
  const Tensor x = nc::randn({2, 3, 5, 5}, nc::DType::F32, &gen);
  for (bool also_output : {false, true}) {
    for (const std::vector<int64_t>& dims : {std::vector<int64_t>{2, 4, 5, 5}, std::vector<int64_t>{1, 4, 1, 1}}) {
      const nc::onnx::Model model = nc::onnx::Model::parse(bytes_of(conv_add_relu(also_output, dims)), "conv.onnx");
      const Tensor s = nc::randn(dims, nc::DType::F32, &gen);
      std::vector<float> wv(4 * 3 * 3 * 3);
      for (size_t i = 0; i < wv.size(); ++i) wv[i] = 0.05f * static_cast<float>(static_cast<int>(i % 11) - 5);
      const Tensor c = nc::conv2d(x, nc::from_vector(wv, {4, 3, 3, 3}),
                                  nc::from_vector<float>({0.1f, -0.2f, 0.3f, -0.4f}, {4}), 1, 1);
      const Tensor want = nc::relu(nc::add(nc::neg(s), c));
      for (const nc::Device& device : devices) {
        SCOPED_TRACE(device.str() + (also_output ? ", c an output" : "") + ", residual " + nc::shape_str(dims));
        const std::vector<Tensor> out = model.run({x.to(device), s.to(device)});
        ASSERT_EQ(out.size(), also_output ? 2u : 1u);
        EXPECT_LT(normcore_test::relative_error(out[0], want), 1e-6);
        if (also_output) EXPECT_LT(normcore_test::relative_error(out[1], c), 1e-6);
      }
    }
  }
  const nc::onnx::Model two = nc::onnx::Model::parse(bytes_of(conv_add_relu(false, {2, 3, 5, 5}, true)), "two.onnx");
  const Tensor s = nc::randn({2, 3, 5, 5}, nc::DType::F32, &gen);
  std::vector<float> wv(4 * 3 * 3 * 3);
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = 0.05f * static_cast<float>(static_cast<int>(i % 11) - 5);
  const Tensor w = nc::from_vector(wv, {4, 3, 3, 3}), b = nc::from_vector<float>({0.1f, -0.2f, 0.3f, -0.4f}, {4});
  const Tensor want = nc::relu(nc::add(nc::conv2d(s, w, b, 1, 1), nc::conv2d(x, w, b, 1, 1)));
  for (const nc::Device& device : devices) {
    SCOPED_TRACE(device.str() + ", two Convs into one Add");
    EXPECT_LT(normcore_test::relative_error(two.run({x.to(device), s.to(device)})[0], want), 1e-6);
  }
}

// x [2, 6] -> Reshape(x, shape), shape an int64 graph input: a value of the input data read
// on the host.
::onnx::ModelProto reshape_by_input() {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  auto* g = m.mutable_graph();
  set_value(g->add_input(), "x", {2, 6});
  set_value(g->add_input(), "shape", {2}, ::onnx::TensorProto::INT64);
  set_value(g->add_output(), "y", {-1, -1});
  add_node(g, "Reshape", {"x", "shape"}, "y");
  return m;
}

// n weights scale * (i % modulo - center): small, varied, exact in f32.
std::vector<float> pattern(size_t n, int modulo, int center, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(static_cast<int>(i % modulo) - center);
  return v;
}

// x [2, 16, 6, 6] -> Conv(3x3, pads 1) + Add(x) + Relu -> r; Conv(r, 2x2 to 8, auto_pad
// SAME_UPPER: the odd pad below and right) -> c (an output); GlobalAveragePool(c) -> p (an
// output). On a GPU both convolutions run NHWC.
::onnx::ModelProto channels_last_model() {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  auto* g = m.mutable_graph();
  set_value(g->add_input(), "x", {2, 16, 6, 6});
  set_value(g->add_output(), "c", {2, 8, 6, 6});
  set_value(g->add_output(), "p", {2, 8, 1, 1});
  set_raw(g->add_initializer(), "w1", {16, 16, 3, 3}, pattern(16 * 16 * 9, 13, 6, 0.02f));
  set_raw(g->add_initializer(), "b1", {16}, pattern(16, 5, 2, 0.1f));
  set_raw(g->add_initializer(), "w2", {8, 16, 2, 2}, pattern(8 * 16 * 4, 7, 3, 0.05f));
  auto* conv = add_node(g, "Conv", {"x", "w1", "b1"}, "h");
  auto* pads = conv->add_attribute();
  pads->set_name("pads");
  pads->set_type(::onnx::AttributeProto::INTS);
  for (int i = 0; i < 4; ++i) pads->add_ints(1);
  add_node(g, "Add", {"h", "x"}, "a");
  add_node(g, "Relu", {"a"}, "r");
  auto* same = add_node(g, "Conv", {"r", "w2"}, "c");
  auto* auto_pad = same->add_attribute();
  auto_pad->set_name("auto_pad");
  auto_pad->set_type(::onnx::AttributeProto::STRING);
  auto_pad->set_s("SAME_UPPER");
  add_node(g, "GlobalAveragePool", {"c"}, "p");
  return m;
}

// x [2, 3, 13, 11] -> Conv(3x3 to 16, stride 2, pads 1) + Relu -> r; MaxPool(r, 3x3, stride
// 2, pads 1) -> m; MaxPool(r, 2x2, pads 0 0 1 1: asymmetric, through a padded copy) -> q;
// Conv(m, 1x1 to 8) -> c. Outputs c and q. An image of 3 channels, as a ResNet's stem.
::onnx::ModelProto stem_model() {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  auto* g = m.mutable_graph();
  set_value(g->add_input(), "x", {2, 3, 13, 11});
  set_value(g->add_output(), "c", {2, 8, 4, 3});
  set_value(g->add_output(), "q", {2, 16, 7, 6});
  set_raw(g->add_initializer(), "w1", {16, 3, 3, 3}, pattern(16 * 3 * 9, 11, 5, 0.05f));
  set_raw(g->add_initializer(), "b1", {16}, pattern(16, 5, 2, 0.1f));
  set_raw(g->add_initializer(), "w2", {8, 16, 1, 1}, pattern(8 * 16, 7, 3, 0.05f));
  const auto ints = [](::onnx::NodeProto* node, const char* name, std::vector<int64_t> v) {
    auto* a = node->add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto::INTS);
    for (int64_t i : v) a->add_ints(i);
  };
  auto* conv = add_node(g, "Conv", {"x", "w1", "b1"}, "h");
  ints(conv, "strides", {2, 2});
  ints(conv, "pads", {1, 1, 1, 1});
  add_node(g, "Relu", {"h"}, "r");
  auto* pool = add_node(g, "MaxPool", {"r"}, "m");
  ints(pool, "kernel_shape", {3, 3});
  ints(pool, "strides", {2, 2});
  ints(pool, "pads", {1, 1, 1, 1});
  auto* odd = add_node(g, "MaxPool", {"r"}, "q");
  ints(odd, "kernel_shape", {2, 2});
  ints(odd, "pads", {0, 0, 1, 1});
  add_node(g, "Conv", {"m", "w2"}, "c");
  return m;
}

// On the CPU, where the direct NHWC kernel runs (AVX-512), every convolution runs NHWC, a
// 3-channel image's too, and a MaxPool of an NHWC value pools it channels last; the outputs
// are the NCHW ops' (conv2d, relu, max_pool2d, the asymmetric pads as -1e30 around r), in NCHW.
TEST(Onnx, CpuConvolutionsAndMaxPoolsRunChannelsLast) {
  const nc::onnx::Model model = nc::onnx::Model::parse(bytes_of(stem_model()), "stem.onnx");
  const Tensor x = nc::randn({2, 3, 13, 11});
  const std::vector<Tensor> got = model.run({x});
  const auto initializer = [](nc::Shape shape, int modulo, int center, float scale) {
    return nc::from_vector(pattern(static_cast<size_t>(nc::empty(shape).numel()), modulo, center, scale), shape);
  };
  const Tensor r =
      nc::relu(nc::conv2d(x, initializer({16, 3, 3, 3}, 11, 5, 0.05f), initializer({16}, 5, 2, 0.1f), 2, 1));
  const Tensor c = nc::conv2d(nc::max_pool2d(r, 3, 2, 1), initializer({8, 16, 1, 1}, 7, 3, 0.05f));
  const Tensor padded = nc::cat({r, nc::full({2, 16, 7, 1}, -1e30)}, 3);
  const Tensor q = nc::max_pool2d(nc::cat({padded, nc::full({2, 16, 1, 7}, -1e30)}, 2), 2, 1);
  ASSERT_EQ(got.size(), 2u);
  ASSERT_EQ(got[0].shape(), c.shape());
  ASSERT_EQ(got[1].shape(), q.shape());
  EXPECT_TRUE(got[0].is_contiguous());
  EXPECT_TRUE(got[1].is_contiguous());
  EXPECT_LT(normcore_test::relative_error(got[0], c), 1e-5);
  EXPECT_LT(normcore_test::relative_error(got[1], q), 1e-5);  // the convolutions' sums differ in order
  std::vector<std::string> ops;
  for (const auto& t : model.profile({x})) ops.push_back(t.op);
  std::sort(ops.begin(), ops.end());
  if (nc::cpu::conv_nhwc_in_use()) {
    // The asymmetric MaxPool pools a padded NCHW copy, its output made NHWC for the next node.
    EXPECT_EQ(ops, (std::vector<std::string>{"Conv (NHWC)", "Conv+Relu (NHWC)", "MaxPool (NHWC)"}));
  } else {
    EXPECT_EQ(ops, (std::vector<std::string>{"Conv", "Conv+Relu", "MaxPool"}));
  }
}

// On a GPU, convolutions of 16 channels and more run NHWC where tensor cores take them (this
// f32 model: with TF32 allowed), as the profile says, and give the CPU's NCHW values within
// TF32's rounding, eagerly and replayed as a CUDA graph; the outputs come back NCHW. Without
// TF32 they stay NCHW (cuDNN's f32 FMA convolutions are slower in NHWC).
TEST(OnnxCuda, ConvolutionsRunChannelsLastOnTensorCores) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const nc::onnx::Model model = nc::onnx::Model::parse(bytes_of(channels_last_model()), "nhwc.onnx");
  const Tensor x = nc::randn({2, 16, 6, 6});
  const std::vector<Tensor> want = model.run({x});
  const Tensor gx = x.to(nc::Device::cuda());
  const auto ops_on_gpu = [&] {
    std::vector<std::string> ops;
    for (const auto& t : model.profile({gx})) ops.push_back(t.op);
    std::sort(ops.begin(), ops.end());
    return ops;
  };
  EXPECT_EQ(ops_on_gpu(), (std::vector<std::string>{"Conv", "Conv+Add+Relu", "GlobalAveragePool"}));
  nc::cuda::set_allow_tf32(true);
  EXPECT_EQ(ops_on_gpu(), (std::vector<std::string>{"Conv (NHWC)", "Conv+Add+Relu (NHWC)", "GlobalAveragePool"}));
  for (bool graph : {false, true, true, true}) {
    const std::vector<Tensor> got = model.run({gx}, graph);
    ASSERT_EQ(got.size(), 2u);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].shape(), want[i].shape());
      EXPECT_LT(normcore_test::relative_error(got[i].to(nc::Device::cpu()), want[i]), 5e-3) << i << " " << graph;
    }
  }
  EXPECT_EQ(model.cuda_graph_state({gx}), "captured");
  nc::cuda::set_allow_tf32(false);
}

// With cuda_graph, the first run records, the second captures, later ones replay: each with
// the values of an eager run on its own inputs; a graph that reads input data on the host
// stays eager and says why.
TEST(OnnxCuda, CudaGraphsRecordCaptureReplayOrStayEager) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const nc::Device gpu = nc::Device::cuda();
  const nc::onnx::Model model = nc::onnx::Model::parse(bytes_of(conv_add_relu(false, {2, 4, 5, 5})), "conv.onnx");
  nc::Generator gen(5);
  const std::vector<const char*> states = {"recorded", "captured", "captured", "captured"};
  for (const char* state : states) {
    const Tensor x = nc::randn({2, 3, 5, 5}, nc::DType::F32, &gen).to(gpu);
    const Tensor s = nc::randn({2, 4, 5, 5}, nc::DType::F32, &gen).to(gpu);
    const Tensor got = model.run({x, s}, /*cuda_graph=*/true)[0];
    EXPECT_EQ(model.cuda_graph_state({x, s}), state);
    EXPECT_LT(normcore_test::relative_error(got, model.run({x, s})[0]), 1e-6) << state;
  }
  const nc::onnx::Model reshape = nc::onnx::Model::parse(bytes_of(reshape_by_input()), "reshape.onnx");
  const Tensor x = nc::randn({2, 6}, nc::DType::F32, &gen).to(gpu);
  for (const std::vector<int64_t>& dims : {std::vector<int64_t>{3, 4}, std::vector<int64_t>{4, 3}, {6, 2}}) {
    const Tensor shape = nc::from_vector(dims, {2}).to(gpu);
    const Tensor y = reshape.run({x, shape}, true)[0];
    EXPECT_EQ(y.shape(), dims);
  }
  const std::string state = reshape.cuda_graph_state({x, nc::zeros({2}, nc::TensorOptions(nc::DType::I64, gpu))});
  EXPECT_EQ(state.rfind("eager: ", 0), 0u) << state;
}

TEST(Onnx, EveryDefectIsATypedErrorBeforeAnythingRuns) {
  throws<nc::IOError>([] { nc::onnx::Model::parse("not a protobuf \xff\xff\xff", "junk.onnx"); },
                      {"junk.onnx", "not an ONNX model"})();
  throws<nc::IOError>([] { nc::onnx::Model::load("/nonexistent/model.onnx"); }, {"/nonexistent/model.onnx"})();
  {
    ::onnx::ModelProto m = mlp();
    m.mutable_graph()->mutable_node(1)->set_op_type("TfIdfVectorizer");
    throws<nc::ValueError>([&] { nc::onnx::Model::parse(bytes_of(m), "m.onnx"); },
                           {"m.onnx", "node #1 (TfIdfVectorizer)", "op TfIdfVectorizer is not supported"})();
  }
  {
    ::onnx::ModelProto m = mlp();
    auto* a = m.mutable_graph()->mutable_node(0)->add_attribute();
    a->set_name("gamma");
    a->set_type(::onnx::AttributeProto::FLOAT);
    throws<nc::ValueError>([&] { nc::onnx::Model::parse(bytes_of(m), "m.onnx"); },
                           {"node 'fc' (Gemm)", "attribute 'gamma'"})();
  }
  {
    // The nodes out of order (as a cycle would be): Relu reads h before Gemm writes it.
    ::onnx::ModelProto m = mlp();
    m.mutable_graph()->mutable_node()->SwapElements(0, 1);
    throws<nc::IOError>([&] { nc::onnx::Model::parse(bytes_of(m), "m.onnx"); },
                        {"node #0 (Relu)", "input 'h'", "cycle"})();
  }
  {
    ::onnx::ModelProto m = mlp();
    m.mutable_graph()->mutable_initializer(0)->mutable_raw_data()->resize(40);
    throws<nc::IOError>([&] { nc::onnx::Model::parse(bytes_of(m), "m.onnx"); },
                        {"initializer 'w'", "raw_data holds 40 bytes", "[4, 3]"})();
  }
  {
    ::onnx::ModelProto m = mlp();
    auto* w = m.mutable_graph()->mutable_initializer(0);
    w->clear_dims();
    for (int i = 0; i < 3; ++i) w->add_dims(int64_t{1} << 40);
    throws<nc::IOError>([&] { nc::onnx::Model::parse(bytes_of(m), "m.onnx"); }, {"initializer 'w'", "overflow"})();
  }
  {
    ::onnx::ModelProto m = mlp();
    m.mutable_graph()->mutable_initializer(1)->add_float_data(9);
    throws<nc::IOError>([&] { nc::onnx::Model::parse(bytes_of(m), "m.onnx"); },
                        {"initializer 'b'", "float_data holds 5 values", "call for 4"})();
  }
  {
    ::onnx::ModelProto m = mlp(18);
    throws<nc::ValueError>([&] { nc::onnx::Model::parse(bytes_of(m), "m.onnx"); }, {"opset 18", "1 to 17"})();
  }
  {
    ::onnx::ModelProto m = mlp();
    m.mutable_graph()->mutable_output(0)->set_name("nowhere");
    throws<nc::IOError>([&] { nc::onnx::Model::parse(bytes_of(m), "m.onnx"); },
                        {"graph output 'nowhere'", "defined by no node"})();
  }
}

class OnnxFiles : public normcore_test::TempDirTest {};

TEST_F(OnnxFiles, ReadsTensorFiles) {
  ::onnx::TensorProto t;
  set_raw(&t, "t", {2, 2}, {1, 2, 3, 4});
  const std::string path = (dir_ / "t.pb").string();
  {
    std::ofstream out(path, std::ios::binary);
    out << t.SerializeAsString();
  }
  const Tensor read = nc::onnx::read_tensor_file(path);
  EXPECT_EQ(read.shape(), (nc::Shape{2, 2}));
  EXPECT_EQ(read.to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
  t.set_data_type(::onnx::TensorProto::STRING);
  {
    std::ofstream out(path, std::ios::binary);
    out << t.SerializeAsString();
  }
  throws<nc::DTypeError>([&] { nc::onnx::read_tensor_file(path); }, {"t.pb", "STRING"})();
}
