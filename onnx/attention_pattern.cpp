// Attention spelled out in nodes, as exporters write it: MatMul(q * s1, k^T * s2), scaled
// (Mul or Div by constants), an additive mask that depends on the shapes alone (PyTorch's
// causal one: Where(Equal(Trilu(Expand(1)), 0), -inf, 0)), Softmax over the last dim, MatMul
// with v. find_attention finds such chains at load (onnx/proto.h); whether one runs as
// normcore's scaled_dot_product_attention is decided per input signature at run time
// (model.cpp), when the scales and the mask have values: the mask must be causal or zero.
#include "onnx/proto.h"

namespace normcore {
namespace onnx {

namespace {

struct Graph {
  const ::onnx::GraphProto& g;
  const std::set<std::string>& statics;
  std::unordered_map<std::string, int> producer;
  std::unordered_map<std::string, std::vector<int>> consumers;
  std::set<std::string> outputs;

  const ::onnx::NodeProto* made_by(const std::string& value, const char* op) const {
    const auto p = producer.find(value);
    if (p == producer.end()) return nullptr;
    const ::onnx::NodeProto& node = g.node(p->second);
    return node.op_type() == op && node.domain().empty() ? &node : nullptr;
  }

  // value with the Mul and Div by shape-only values before it taken off (at most 3), their
  // nodes added to m; the varying value that is left.
  std::string unscaled(std::string value, AttentionMatch& m) const {
    for (int step = 0; step < 3; ++step) {
      const ::onnx::NodeProto* node = made_by(value, "Mul");
      const bool is_div = node == nullptr && (node = made_by(value, "Div")) != nullptr;
      if (node == nullptr || node->input_size() != 2) break;
      const std::string &a = node->input(0), &b = node->input(1);
      std::string factor, other;
      if (statics.count(b) && !statics.count(a)) factor = b, other = a;
      else if (!is_div && statics.count(a) && !statics.count(b)) factor = a, other = b;
      else break;
      (is_div ? m.divisors : m.factors).push_back(factor);
      m.nodes.push_back(producer.at(value));
      value = other;
    }
    return value;
  }

  // Every value the match's nodes make, but the last's, is read by its nodes only.
  bool closed(const AttentionMatch& m) const {
    const std::set<int> inside(m.nodes.begin(), m.nodes.end());
    for (int i : inside) {
      if (i == m.last) continue;
      for (const std::string& out : g.node(i).output()) {
        if (outputs.count(out)) return false;
        const auto found = consumers.find(out);
        if (found == consumers.end()) continue;
        for (int j : found->second)
          if (!inside.count(j)) return false;
      }
    }
    return true;
  }
};

}  // namespace

std::vector<AttentionMatch> find_attention(const ::onnx::GraphProto& g, const std::set<std::string>& static_values,
                                           int64_t opset) {
  std::vector<AttentionMatch> out;
  if (opset < 13) return out;  // Softmax's axis meant a flattening before 13
  Graph graph{g, static_values, {}, {}, {}};
  for (int i = 0; i < g.node_size(); ++i) {
    for (const std::string& o : g.node(i).output()) graph.producer[o] = i;
    for (const std::string& input : g.node(i).input())
      if (!input.empty()) graph.consumers[input].push_back(i);
  }
  for (const auto& o : g.output()) graph.outputs.insert(o.name());
  for (int s = 0; s < g.node_size(); ++s) {
    const ::onnx::NodeProto& softmax = g.node(s);
    if (softmax.op_type() != "Softmax" || !softmax.domain().empty() || softmax.input_size() != 1) continue;
    int64_t axis = -1;
    for (const auto& a : softmax.attribute())
      if (a.name() == "axis") axis = a.i();
    if (axis != -1 && axis != 3) continue;  // the last dim of [B, H, L, S]
    const auto readers = graph.consumers.find(softmax.output(0));
    if (readers == graph.consumers.end() || readers->second.size() != 1) continue;
    const ::onnx::NodeProto& product = g.node(readers->second.front());
    if (product.op_type() != "MatMul" || product.input(0) != softmax.output(0)) continue;
    AttentionMatch m;
    m.last = readers->second.front();
    m.v = product.input(1);
    m.nodes = {s, m.last};
    std::string scores = softmax.input(0);
    if (const ::onnx::NodeProto* add = graph.made_by(scores, "Add")) {
      const std::string &a = add->input(0), &b = add->input(1);
      if (static_values.count(a) != static_values.count(b)) {
        m.mask = static_values.count(a) ? a : b;
        m.nodes.push_back(graph.producer.at(scores));
        scores = static_values.count(a) ? b : a;
      }
    }
    scores = graph.unscaled(scores, m);
    const ::onnx::NodeProto* first = graph.made_by(scores, "MatMul");
    if (first == nullptr) continue;
    m.nodes.push_back(graph.producer.at(scores));
    m.q = graph.unscaled(first->input(0), m);
    m.k_t = graph.unscaled(first->input(1), m);
    if (static_values.count(m.q) || static_values.count(m.k_t) || static_values.count(m.v)) continue;
    std::sort(m.nodes.begin(), m.nodes.end());
    m.nodes.erase(std::unique(m.nodes.begin(), m.nodes.end()), m.nodes.end());
    if (!graph.closed(m)) continue;
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace onnx
}  // namespace normcore
