// The importer's inner parts (onnx/model.h is the outer one): ONNX's protobuf classes, the
// conversions of their tensors and types, and the table of ops run() supports.
#pragma once

#include <onnx/onnx_pb.h>

#include <functional>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "normcore/normcore.h"
#include "normcore/onnx.h"

namespace normcore {
namespace onnx {

// An ONNX element type as a DType (DTypeError naming where for one normcore lacks), and back.
DType dtype_of(int elem_type, const std::string& where);
int elem_type_of(DType dtype);
// A TensorProto as a CPU tensor (IOError naming where when its data does not fit its dims).
Tensor from_proto(const ::onnx::TensorProto& t, const std::string& where);

// One node being run: its proto, the model's opset, its inputs (undefined for an omitted
// optional one) and the text messages name it by ("node 'n3' (Conv)").
struct NodeRun {
  const ::onnx::NodeProto& node;
  int64_t opset;
  std::vector<Tensor> inputs;
  std::string where;
  // For a Conv whose only consumer is an Add and/or a Relu (model.cpp fuses them): the Add's
  // other input and whether the Relu follows, for the convolution's epilogue.
  Tensor residual;
  bool relu = false;
  // Host copies of values that depend only on the input shapes (model.cpp keeps them for a
  // CUDA-graph plan, so that a captured run reads no device value on the host), and the
  // names of such values; null outside a plan.
  std::unordered_map<std::string, Tensor>* host_values = nullptr;
  const std::set<std::string>* static_values = nullptr;
  // For a Conv: x, the weight ([O, kh, kw, C]) and the residual are NHWC, and so must the
  // output be (model.cpp decides).
  bool channels_last = false;
  // For a channels-last Conv on the CPU: the weight in panels (core/conv_panels.h), which the
  // convolution reads instead of input 1 (then a view of the initializer, for its shape).
  Tensor weight_panels = Tensor();

  const ::onnx::AttributeProto* attribute(const std::string& name) const;
  int64_t int_attribute(const std::string& name, int64_t fallback) const;
  float float_attribute(const std::string& name, float fallback) const;
  std::vector<int64_t> ints_attribute(const std::string& name) const;
  // Input i, which must be there (ValueError naming it otherwise).
  const Tensor& input(size_t i) const;
  bool has_input(size_t i) const { return i < inputs.size() && inputs[i].defined(); }
  // An int64 input's values on the host (a shape, axes, pads).
  std::vector<int64_t> int_values(size_t i) const;
  // Input i on the host (a CPU tensor; kept in host_values when it depends only on shapes).
  Tensor host_input(size_t i) const;
};

// axis counted from the end when negative, checked against rank (ValueError naming the node).
int64_t axis_of(int64_t axis, int64_t rank, const NodeRun& n);
// The single value of a 0-d or one-element input i, on the host (ShapeError otherwise).
double scalar_input(const NodeRun& n, size_t i);

struct OpSpec {
  std::function<std::vector<Tensor>(const NodeRun&)> run;
  std::vector<std::string> attributes;  // those it reads; any other is refused at load
};
// x with `before` elements of value added at the start of dim and `after` at its end, or
// elements taken off where negative (ops.cpp).
Tensor pad_dim(Tensor x, int64_t dim, int64_t before, int64_t after, double value);
// v as a 1-D i64 tensor on device: the indices a node computed on the host (ops.cpp).
Tensor index_vector(const std::vector<int64_t>& v, Device device);
// An op of one output that f computes, reading the attributes listed (ops.cpp).
OpSpec single_output(Tensor (*f)(const NodeRun&), std::vector<std::string> attributes = {});
// Op type -> how it runs (ops.cpp).
const std::map<std::string, OpSpec>& op_table();
// Adds the rounding, testing, remainder, padding and running-sum ops (ops_numeric.cpp).
void add_numeric_ops(std::map<std::string, OpSpec>& table);
// A GELU written out in element-wise nodes around a Tanh or an Erf (gelu_pattern.cpp): the
// nodes (in graph order), the last of them, whose output is the GELU's, its input x, and
// whether it is the tanh form.
struct GeluMatch {
  std::vector<int> nodes;
  int last = -1;
  std::string x;
  bool tanh = false;
};
std::vector<GeluMatch> find_gelus(const ::onnx::GraphProto& graph,
                                  const std::unordered_map<std::string, Tensor>& initializers, int64_t opset);
// softmax(q k^T * scale + mask) v spelled out in nodes (attention_pattern.cpp): the nodes (in
// graph order; the last makes its output, and runs it when fused), the values q [B, H, L,
// D], k^T [B, H, D, S] and v [B, H, S, Dv], the shape-only scalars the scores are multiplied
// and divided by, and the shape-only additive mask (or none). Whether it runs fused is decided
// at run time, from the values of the scalars and the mask.
struct AttentionMatch {
  std::vector<int> nodes;
  int last = -1;
  std::string q, k_t, v, mask;
  std::vector<std::string> factors, divisors;
};
std::vector<AttentionMatch> find_attention(const ::onnx::GraphProto& graph, const std::set<std::string>& static_values,
                                           int64_t opset);
// Adds OneHot, EyeLike, GatherND, ScatterElements, Scatter, ScatterND, TopK, NonZero and
// Compress (ops_indexing.cpp).
void add_indexing_ops(std::map<std::string, OpSpec>& table);
// Adds Einsum (ops_einsum.cpp).
void add_einsum_op(std::map<std::string, OpSpec>& table);
// Adds NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (ops_losses.cpp).
void add_loss_ops(std::map<std::string, OpSpec>& table);
// Adds Resize and ConvTranspose (ops_spatial.cpp).
void add_spatial_ops(std::map<std::string, OpSpec>& table);

}  // namespace onnx
}  // namespace normcore
