// GELU spelled out in element-wise nodes, as exporters write it, found and run as one
// normcore::gelu (onnx/proto.h, find_gelus). PyTorch's exact GELU exports as
// Div(x, sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5 and its tanh form as x^3 (Mul or Pow),
// Mul 0.044715, Add x, Mul sqrt(2 / pi), Tanh, Add 1, Mul x, Mul 0.5, in one order or another,
// with constants as initializers or Constant nodes. Rather than list the orders, a match is
// any small set of such nodes around one Tanh or Erf whose only varying input is one value x
// and whose intermediate values nothing else reads, and it is taken only when it computes
// GELU: the set is run on 241 points of [-6, 6] in f64 and must agree with the erf form or the
// tanh form within 1e-6 (they differ by up to 5e-4 there).
#include <cmath>
#include <functional>

#include "onnx/proto.h"

namespace normcore {
namespace onnx {

namespace {

bool elementwise(const ::onnx::NodeProto& node) {
  const std::string& op = node.op_type();
  return node.domain().empty() && node.output_size() == 1 &&
         (op == "Mul" || op == "Add" || op == "Sub" || op == "Div" || op == "Pow");
}

// Values known at load that hold one element (initializers, Constant nodes' values, and
// element-wise nodes and Casts of such values), as f64 CPU tensors, by name.
std::unordered_map<std::string, Tensor> scalar_constants(const ::onnx::GraphProto& g,
                                                         const std::unordered_map<std::string, Tensor>& initializers,
                                                         int64_t opset) {
  std::unordered_map<std::string, Tensor> known;
  for (const auto& [name, t] : initializers)
    if (t.numel() == 1) known[name] = t.to(DType::F64);
  for (int i = 0; i < g.node_size(); ++i) {
    const ::onnx::NodeProto& node = g.node(i);
    const bool foldable = node.op_type() == "Constant" || node.op_type() == "Cast" || elementwise(node);
    if (!foldable || !node.domain().empty() || node.output_size() != 1) continue;
    bool inputs_known = true;
    for (const std::string& input : node.input()) inputs_known = inputs_known && known.count(input) > 0;
    if (!inputs_known) continue;
    try {  // a node that does not run here is left to fail, or not, where the model runs it
      NodeRun run{node, opset, {}, "constant folding", Tensor(), false, nullptr, nullptr};
      for (const std::string& input : node.input()) run.inputs.push_back(known.at(input));
      const std::vector<Tensor> out = op_table().at(node.op_type()).run(run);
      if (out.size() == 1 && out[0].defined() && out[0].numel() == 1 && is_floating(out[0].dtype()))
        known[node.output(0)] = out[0].to(Device::cpu(), DType::F64);
    } catch (const Error&) {
    }
  }
  return known;
}

double gelu_erf(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
}

struct Matcher {
  const ::onnx::GraphProto& g;
  int64_t opset;
  std::unordered_map<std::string, Tensor> constants;
  std::unordered_map<std::string, int> producer;
  std::unordered_map<std::string, std::vector<int>> consumers;
  std::set<std::string> outputs;  // the graph's

  // nodes (sorted) compute from x alone: run them on test points and compare with GELU's
  // two forms; 1 for erf, 2 for tanh, 0 for neither.
  int computes_gelu(const std::set<int>& nodes, const std::string& x, int last) const {
    std::vector<double> points;
    for (int i = 0; i <= 240; ++i) points.push_back(-6.0 + 0.05 * i);
    std::unordered_map<std::string, Tensor> values = constants;
    values[x] = from_vector(points, {static_cast<int64_t>(points.size())});
    try {
      for (int i : nodes) {
        const ::onnx::NodeProto& node = g.node(i);
        NodeRun run{node, opset, {}, "GELU pattern", Tensor(), false, nullptr, nullptr};
        for (const std::string& input : node.input()) run.inputs.push_back(values.at(input));
        values[node.output(0)] = op_table().at(node.op_type()).run(run).at(0);
      }
    } catch (const std::exception&) {
      return 0;
    }
    const Tensor& out = values.at(g.node(last).output(0));
    if (out.numel() != static_cast<int64_t>(points.size())) return 0;
    const std::vector<double> got = out.to(DType::F64).contiguous().to_vector<double>();
    bool erf_form = true, tanh_form = true;
    for (size_t i = 0; i < points.size(); ++i) {
      erf_form = erf_form && std::fabs(got[i] - gelu_erf(points[i])) <= 1e-6;
      tanh_form = tanh_form && std::fabs(got[i] - gelu_tanh(points[i])) <= 1e-6;
    }
    return erf_form ? 1 : tanh_form ? 2 : 0;
  }

  // Adds to nodes the element-wise nodes value is made by, back to x and constants; false
  // when another varying value feeds them or they run deeper than 8.
  bool cone(const std::string& value, const std::string& x, int depth, std::set<int>& nodes) const {
    if (value == x || constants.count(value)) return true;
    const auto p = producer.find(value);
    if (p == producer.end() || depth > 8 || !elementwise(g.node(p->second))) return false;
    nodes.insert(p->second);
    for (const std::string& input : g.node(p->second).input())
      if (!cone(input, x, depth + 1, nodes)) return false;
    return true;
  }

  // nodes' values, but for last's, are read by nodes inside only, and none is a graph output.
  bool closed(const std::set<int>& nodes, int last) const {
    for (int i : nodes) {
      if (i == last) continue;
      const std::string& out = g.node(i).output(0);
      if (outputs.count(out)) return false;
      const auto found = consumers.find(out);
      if (found == consumers.end()) return false;
      for (int j : found->second)
        if (!nodes.count(j)) return false;
    }
    return true;
  }

  // The GELU around center (a Tanh or an Erf), if there is one: the chain of single readers
  // after it, up to 4 nodes; x is the first varying input a chain node takes from outside,
  // or the varying input of the node that made it from x and constants (x * 0.5).
  bool match(int center, GeluMatch& found) const {
    const ::onnx::NodeProto& c = g.node(center);
    if (c.input_size() != 1 || c.output_size() != 1) return false;
    std::set<int> chain{center};
    std::vector<std::pair<std::string, int>> xs;  // candidate x and the side node it comes with (-1)
    std::string value = c.output(0);
    for (int step = 0; step < 4; ++step) {
      const auto readers = consumers.find(value);
      if (outputs.count(value) || readers == consumers.end() || readers->second.size() != 1) return false;
      const int q = readers->second.front();
      const ::onnx::NodeProto& node = g.node(q);
      if (!elementwise(node) || node.input_size() != 2 || node.op_type() == "Pow") return false;
      chain.insert(q);
      const std::string& other = node.input(0) == value ? node.input(1) : node.input(0);
      if (xs.empty() && !constants.count(other)) {
        xs.push_back({other, -1});
        const auto p = producer.find(other);
        if (p != producer.end() && elementwise(g.node(p->second))) {
          std::string varying;
          int count = 0;
          for (const std::string& input : g.node(p->second).input())
            if (!constants.count(input)) varying = input, ++count;
          if (count == 1) xs.push_back({varying, p->second});
        }
      }
      value = node.output(0);
      for (const auto& [x, side] : xs) {
        std::set<int> nodes = chain;
        if (side >= 0) nodes.insert(side);
        if (!cone(c.input(0), x, 0, nodes) || nodes.count(producer.count(x) ? producer.at(x) : -1) || !closed(nodes, q))
          continue;
        const int form = computes_gelu(nodes, x, q);
        if (form == 0) continue;
        found.nodes.assign(nodes.begin(), nodes.end());
        found.last = q;
        found.x = x;
        found.tanh = form == 2;
        return true;
      }
    }
    return false;
  }
};

}  // namespace

std::vector<GeluMatch> find_gelus(const ::onnx::GraphProto& g,
                                  const std::unordered_map<std::string, Tensor>& initializers, int64_t opset) {
  Matcher m{g, opset, scalar_constants(g, initializers, opset), {}, {}, {}};
  for (int i = 0; i < g.node_size(); ++i) {
    for (const std::string& output : g.node(i).output()) m.producer[output] = i;
    for (const std::string& input : g.node(i).input())
      if (!input.empty()) m.consumers[input].push_back(i);
  }
  for (const auto& o : g.output()) m.outputs.insert(o.name());
  std::vector<GeluMatch> out;
  std::set<int> taken;
  for (int i = 0; i < g.node_size(); ++i) {
    const ::onnx::NodeProto& node = g.node(i);
    if (!node.domain().empty() || (node.op_type() != "Tanh" && node.op_type() != "Erf")) continue;
    GeluMatch found;
    if (!m.match(i, found)) continue;
    bool overlaps = false;
    for (int n : found.nodes) overlaps = overlaps || taken.count(n) > 0;
    if (overlaps) continue;
    taken.insert(found.nodes.begin(), found.nodes.end());
    out.push_back(found);
  }
  return out;
}

}  // namespace onnx
}  // namespace normcore
