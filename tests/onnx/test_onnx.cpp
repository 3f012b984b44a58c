// The ONNX importer (onnx/model.h) on models built here as ModelProto bytes: a small MLP
// (Gemm, Relu, Softmax, an initializer in raw_data, one in float_data) against the same
// math in normcore's ops; every check before running (bad bytes, an op or attribute it does
// not run, an input nothing defines, initializer data that does not fit its dims, dims that
// overflow, an opset past 17) a typed error naming the file, the node and the field; the
// inputs checked at run.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "normcore/normcore.h"
#include "onnx/proto.h"
#include "tests/test_support.h"

namespace nc = normcore;
using nc::Tensor;
using normcore_test::throws;

namespace {

void set_value(::onnx::ValueInfoProto* v, const std::string& name, std::vector<int64_t> dims) {
  v->set_name(name);
  auto* type = v->mutable_type()->mutable_tensor_type();
  type->set_elem_type(::onnx::TensorProto::FLOAT);
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

TEST(Onnx, EveryDefectIsATypedErrorBeforeAnythingRuns) {
  throws<nc::IOError>([] { nc::onnx::Model::parse("not a protobuf \xff\xff\xff", "junk.onnx"); },
                      {"junk.onnx", "not an ONNX model"})();
  throws<nc::IOError>([] { nc::onnx::Model::load("/nonexistent/model.onnx"); }, {"/nonexistent/model.onnx"})();
  {
    ::onnx::ModelProto m = mlp();
    m.mutable_graph()->mutable_node(1)->set_op_type("Celu");
    throws<nc::ValueError>([&] { nc::onnx::Model::parse(bytes_of(m), "m.onnx"); },
                           {"m.onnx", "node #1 (Celu)", "op Celu is not supported"})();
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
