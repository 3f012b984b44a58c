// onnx::Model (onnx/model.h): parse, check the whole graph against op_table() before anything
// runs, then run the nodes in the file's order (ONNX requires a topological one; a node whose
// input nothing before it defines is refused at load, which also refuses cycles). A Conv whose
// output only an Add and/or a Relu read runs with them as its epilogue (conv2d_fused), at
// the last one's place, so that its output is read and written once instead of three times.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>

#include "core/conv_panels.h"
#include "kernels/attention.h"
#include "kernels/conv.h"
#include "normcore/cuda.h"
#include "onnx/proto.h"

namespace normcore {
namespace onnx {

struct Model::Impl {
  std::string name;
  ::onnx::GraphProto graph;
  int64_t opset = 0;
  std::vector<ValueInfo> inputs, outputs;
  std::unordered_map<std::string, Tensor> initializers;  // CPU tensors
  // A Conv run together with the Add and/or Relu that alone consume its output (and the
  // Add's), at the position of the last of them, where the Add's other input is defined.
  struct Fusion {
    int conv = -1, add = -1, relu = -1;
    int residual = -1;  // which input of the Add is not the Conv's
  };
  std::vector<Fusion> fusions;
  std::vector<int> role;  // per node: kAsIs, kAbsorbed, or the index of the fusion run there
  static constexpr int kAsIs = -1, kAbsorbed = -2;
  // GELUs written out in element-wise nodes (gelu_pattern.cpp), each run as one gelu at the
  // place of its last node; the others are absorbed.
  std::vector<GeluMatch> gelus;
  std::vector<int> gelu_at;         // per node: the index of the GELU run there, or -1
  std::vector<std::string> wheres;  // per node: how messages name it ("m.onnx: node 'n3' (Conv)")
  // Attention spelled out in nodes (attention_pattern.cpp), and for each input signature
  // whether each runs as scaled_dot_product_attention (decided by the signature's first run,
  // at the match's last node, from the mask's and the scales' values).
  std::vector<AttentionMatch> attentions;
  std::vector<int> attention_of;  // per node: the match it belongs to, or -1
  struct AttentionPlan {
    bool fused = false, causal = false;
    double scale = 1;
  };
  mutable std::mutex attention_mutex;
  mutable std::map<std::string, std::map<int, AttentionPlan>> attention_plans;  // by signature, by match

  // Values that depend on the input shapes only (initializers, Shape's and Size's outputs,
  // and what nodes make of such values alone), and the nodes that make them.
  std::set<std::string> static_values;
  std::vector<char> static_node;

  // A CUDA graph of the graph for one input signature (Model::run with cuda_graph): the first
  // run is eager and keeps the static values (on the device, and on the host those read
  // there); the second captures the other nodes (the static ones do not run again) into a
  // cuda::Graph; later runs copy the inputs into the capture's and replay it. A capture that
  // fails (a node reads a data-dependent value on the host) leaves the signature eager.
  struct GraphPlan {
    enum class State { Recorded, Captured, Eager } state = State::Recorded;
    std::unordered_map<std::string, Tensor> statics, host;
    std::vector<Tensor> inputs, outputs;
    std::unique_ptr<cuda::Graph> graph;
    std::string why_eager;
    std::mutex mutex;  // one run of a plan at a time
  };
  mutable std::mutex plans_mutex;
  mutable std::map<std::string, std::unique_ptr<GraphPlan>> plans;
  GraphPlan* plan_for(const std::string& signature, bool create) const {
    std::lock_guard<std::mutex> lock(plans_mutex);
    auto found = plans.find(signature);
    if (found != plans.end()) return found->second.get();
    if (!create) return nullptr;
    return (plans[signature] = std::make_unique<GraphPlan>()).get();
  }
  // Convolution weights in NHWC ([O, kh, kw, C]) per device, made by the first run that runs
  // the convolution channels-last (outside any CUDA-graph capture: that run is eager). On the
  // CPU the memory is [kh, kw, C, O], as its direct kernel reads it (kernels::NhwcForward),
  // and the tensor a view of it with the [O, kh, kw, C] shape conv2d_fused takes.
  mutable std::mutex nhwc_mutex;
  mutable std::map<std::string, Tensor> nhwc_weights;  // by device and initializer name
  Tensor nhwc_weight(const std::string& name, const Tensor& w, Device device) const {
    std::lock_guard<std::mutex> lock(nhwc_mutex);
    Tensor& slot = nhwc_weights[device.str() + " " + name];
    if (!slot.defined()) {
      slot = device.is_cpu() ? w.permute({2, 3, 1, 0}).contiguous().permute({3, 0, 1, 2})
                             : w.permute({0, 2, 3, 1}).contiguous();
    }
    return slot;
  }
  // On the CPU, the weights in panels instead (core/conv_panels.h), by initializer name.
  mutable std::map<std::string, Tensor> weight_panels;
  Tensor panel_weight(const std::string& name, const Tensor& w) const {
    std::lock_guard<std::mutex> lock(nhwc_mutex);
    Tensor& slot = weight_panels[name];
    if (!slot.defined()) slot = detail::conv_weight_panels(w.permute({0, 2, 3, 1}));
    return slot;
  }
  // The initializers on each device a run has used, uploaded by the first such run.
  using Uploaded = std::unordered_map<std::string, Tensor>;
  mutable std::mutex mutex;
  mutable std::map<std::string, std::shared_ptr<const Uploaded>> uploaded;  // by Device::str()

  std::shared_ptr<const Uploaded> initializers_on(Device device) const {
    std::lock_guard<std::mutex> lock(mutex);
    std::shared_ptr<const Uploaded>& slot = uploaded[device.str()];
    if (!slot) {
      auto copies = std::make_shared<Uploaded>();
      for (const auto& [key, t] : initializers) (*copies)[key] = t.to(device);
      slot = std::move(copies);
    }
    return slot;
  }
};

namespace {

std::string node_name(const ::onnx::NodeProto& node, int index) {
  return detail::cat_str("node ", node.name().empty() ? "#" + std::to_string(index) : "'" + node.name() + "'", " (",
                         node.op_type(), ")");
}

// Finds the Conv -> [Add] -> [Relu] chains whose intermediate values nothing else reads.
void plan_fusions(Model::Impl& m) {
  const ::onnx::GraphProto& g = m.graph;
  std::unordered_map<std::string, int> uses, consumer;
  for (int i = 0; i < g.node_size(); ++i)
    for (const std::string& input : g.node(i).input())
      if (!input.empty()) ++uses[input], consumer[input] = i;
  for (const auto& v : g.output()) uses[v.name()] += 2;  // a graph output is never absorbed
  const auto only_consumer = [&](const std::string& value, const char* op) {
    if (uses[value] != 1) return -1;
    const int j = consumer[value];
    return g.node(j).op_type() == op && g.node(j).domain().empty() ? j : -1;
  };
  m.role.assign(static_cast<size_t>(g.node_size()), Model::Impl::kAsIs);
  for (int i = 0; i < g.node_size(); ++i) {
    const ::onnx::NodeProto& node = g.node(i);
    if (node.op_type() != "Conv" || !node.domain().empty() || node.output_size() != 1) continue;
    Model::Impl::Fusion f;
    f.conv = i;
    std::string out = node.output(0);
    f.add = only_consumer(out, "Add");
    if (f.add >= 0 && m.role[static_cast<size_t>(f.add)] != Model::Impl::kAsIs) f.add = -1;  // another Conv's
    if (f.add >= 0) {
      const ::onnx::NodeProto& add = g.node(f.add);
      if (add.input_size() != 2 || add.input(0).empty() || add.input(1).empty() || add.input(0) == add.input(1)) {
        f.add = -1;
      } else {
        f.residual = add.input(0) == out ? 1 : 0;
        out = add.output(0);
      }
    }
    f.relu = only_consumer(out, "Relu");
    if (f.relu >= 0 && m.role[static_cast<size_t>(f.relu)] != Model::Impl::kAsIs) f.relu = -1;
    if (f.add < 0 && f.relu < 0) continue;
    m.role[static_cast<size_t>(i)] = Model::Impl::kAbsorbed;
    if (f.add >= 0) m.role[static_cast<size_t>(f.add)] = Model::Impl::kAbsorbed;
    m.role[static_cast<size_t>(std::max(f.add, f.relu))] = static_cast<int>(m.fusions.size());
    m.fusions.push_back(f);
  }
}

// Finds the GELUs spelled out in nodes that no fusion has taken.
void plan_gelus(Model::Impl& m) {
  m.gelu_at.assign(static_cast<size_t>(m.graph.node_size()), -1);
  for (GeluMatch& match : find_gelus(m.graph, m.initializers, m.opset)) {
    bool free = true;
    for (int n : match.nodes) free = free && m.role[static_cast<size_t>(n)] == Model::Impl::kAsIs;
    if (!free) continue;
    for (int n : match.nodes) m.role[static_cast<size_t>(n)] = Model::Impl::kAbsorbed;
    m.gelu_at[static_cast<size_t>(match.last)] = static_cast<int>(m.gelus.size());
    m.gelus.push_back(std::move(match));
  }
}

// Finds the attention chains no fusion and no GELU has taken.
void plan_attention(Model::Impl& m) {
  m.attention_of.assign(static_cast<size_t>(m.graph.node_size()), -1);
  for (AttentionMatch& match : find_attention(m.graph, m.static_values, m.opset)) {
    bool free = true;
    for (int n : match.nodes)
      free = free && m.role[static_cast<size_t>(n)] == Model::Impl::kAsIs && m.gelu_at[static_cast<size_t>(n)] < 0 &&
             !m.static_node[static_cast<size_t>(n)];
    if (!free) continue;
    for (int n : match.nodes) m.attention_of[static_cast<size_t>(n)] = static_cast<int>(m.attentions.size());
    m.attentions.push_back(std::move(match));
  }
}

// Whether match runs fused with these values (all of q, k^T, v, the mask and the scales
// present, as at its last node): q [B, H, L, D], k^T [B, H, D, S] and v [B, H, S, Dv] of one
// floating dtype (D and Dv within what the device's kernels run: 256 on CUDA), scalar scales, and a mask [.., L, S] of 0
// where key j <= query i and -inf elsewhere (causal) or of zeros alone. Reads the scales and
// the mask on the host; known_now is false when a value is not there yet.
Model::Impl::AttentionPlan plan_for_values(const AttentionMatch& a,
                                           const std::unordered_map<std::string, Tensor>& values, bool& known_now) {
  Model::Impl::AttentionPlan plan;
  known_now = values.count(a.q) && values.count(a.k_t) && values.count(a.v) && (a.mask.empty() || values.count(a.mask));
  for (const auto* names : {&a.factors, &a.divisors})
    for (const std::string& f : *names) known_now = known_now && values.count(f);
  if (!known_now) return plan;
  const Tensor &q = values.at(a.q), &k_t = values.at(a.k_t), &v = values.at(a.v);
  if (q.dim() != 4 || k_t.dim() != 4 || v.dim() != 4 || !is_floating(q.dtype()) || k_t.dtype() != q.dtype() ||
      v.dtype() != q.dtype())
    return plan;
  const int64_t L = q.size(2), S = k_t.size(3);
  if (k_t.size(0) != q.size(0) || v.size(0) != q.size(0) || k_t.size(1) != q.size(1) || v.size(1) != q.size(1) ||
      k_t.size(2) != q.size(3) || v.size(2) != S)
    return plan;
  const int64_t max_dim = kernels::attention(q.device()).max_head_dim();
  if (q.size(3) > max_dim || v.size(3) > max_dim) return plan;
  double scale = 1;
  for (const std::string& f : a.factors) {
    const Tensor& t = values.at(f);
    if (t.numel() != 1) return plan;
    scale *= t.to(Device::cpu(), DType::F64).reshape({}).item<double>();
  }
  for (const std::string& f : a.divisors) {
    const Tensor& t = values.at(f);
    if (t.numel() != 1) return plan;
    scale /= t.to(Device::cpu(), DType::F64).reshape({}).item<double>();
  }
  bool causal = false;
  if (!a.mask.empty()) {
    const Tensor& mask = values.at(a.mask);
    if (mask.dim() < 2 || mask.size(-2) != L || mask.size(-1) != S || mask.numel() != L * S) return plan;
    const std::vector<double> m = mask.to(Device::cpu(), DType::F64).contiguous().to_vector<double>();
    bool zeros = true, triangle = true;
    for (int64_t i = 0; i < L; ++i) {
      for (int64_t j = 0; j < S; ++j) {
        const double x = m[static_cast<size_t>(i * S + j)];
        zeros = zeros && x == 0;
        triangle = triangle && (j <= i ? x == 0 : x == -std::numeric_limits<double>::infinity());
      }
    }
    if (!zeros && !triangle) return plan;
    causal = !zeros;
  }
  plan.fused = true;
  plan.causal = causal;
  plan.scale = scale;
  return plan;
}

// Marks the values and nodes that depend on the input shapes only.
void find_static_values(Model::Impl& m) {
  const ::onnx::GraphProto& g = m.graph;
  for (const auto& [name, t] : m.initializers) m.static_values.insert(name);
  m.static_node.assign(static_cast<size_t>(g.node_size()), 0);
  for (int i = 0; i < g.node_size(); ++i) {
    const ::onnx::NodeProto& node = g.node(i);
    bool is_static = node.op_type() == "Shape" || node.op_type() == "Size";
    if (!is_static) {
      is_static = true;
      for (const std::string& input : node.input())
        is_static = is_static && (input.empty() || m.static_values.count(input));
    }
    if (!is_static) continue;
    m.static_node[static_cast<size_t>(i)] = 1;
    for (const std::string& output : node.output()) m.static_values.insert(output);
  }
}

ValueInfo value_info(const ::onnx::ValueInfoProto& v, const std::string& where) {
  ValueInfo info;
  info.name = v.name();
  const auto& type = v.type();
  NC_CHECK(type.has_tensor_type(), ValueError, where, ": value '", v.name(), "' is not a tensor");
  info.dtype = dtype_of(type.tensor_type().elem_type(), where + ": value '" + v.name() + "'");
  for (const auto& d : type.tensor_type().shape().dim()) info.dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
  return info;
}

}  // namespace

Model Model::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  NC_CHECK(in, IOError, path, ": cannot open");
  std::stringstream bytes;
  bytes << in.rdbuf();
  return parse(bytes.str(), path);
}

Model Model::parse(const std::string& bytes, const std::string& name) {
  auto impl = std::make_shared<Impl>();
  impl->name = name;
  ::onnx::ModelProto proto;
  NC_CHECK(proto.ParseFromString(bytes), IOError, name, ": not an ONNX model (the protobuf does not parse)");
  for (const auto& op : proto.opset_import()) {
    if (op.domain().empty() || op.domain() == "ai.onnx") impl->opset = op.version();
  }
  NC_CHECK(impl->opset >= 1 && impl->opset <= 17, ValueError, name, ": opset ", impl->opset,
           " of the default domain; normcore runs opsets 1 to 17");
  impl->graph = proto.graph();
  const ::onnx::GraphProto& g = impl->graph;
  std::set<std::string> defined;
  for (const auto& t : g.initializer()) {
    const std::string where = name + ": initializer '" + t.name() + "'";
    impl->initializers[t.name()] = from_proto(t, where);
    defined.insert(t.name());
  }
  for (const auto& v : g.input()) {
    if (impl->initializers.count(v.name())) continue;
    impl->inputs.push_back(value_info(v, name + ": input"));
    defined.insert(v.name());
  }
  const auto& table = op_table();
  for (int i = 0; i < g.node_size(); ++i) {
    const ::onnx::NodeProto& node = g.node(i);
    const std::string where = name + ": " + node_name(node, i);
    NC_CHECK(node.domain().empty() || node.domain() == "ai.onnx", ValueError, where, ": domain '", node.domain(),
             "' is not run (only ONNX's default domain)");
    const auto op = table.find(node.op_type());
    NC_CHECK(op != table.end(), ValueError, where, ": op ", node.op_type(), " is not supported");
    for (const auto& a : node.attribute()) {
      const auto& allowed = op->second.attributes;
      NC_CHECK(std::find(allowed.begin(), allowed.end(), a.name()) != allowed.end(), ValueError, where, ": attribute '",
               a.name(), "' of ", node.op_type(), " is not supported");
    }
    for (const std::string& input : node.input()) {
      NC_CHECK(input.empty() || defined.count(input), IOError, where, ": input '", input,
               "' is defined by no graph input, initializer or earlier node (the graph is not in order, or has a "
               "cycle)");
    }
    for (const std::string& output : node.output()) defined.insert(output);
  }
  for (const auto& v : g.output()) {
    NC_CHECK(defined.count(v.name()), IOError, name, ": graph output '", v.name(), "' is defined by no node");
    impl->outputs.push_back(value_info(v, name + ": output"));
  }
  plan_fusions(*impl);
  plan_gelus(*impl);
  // What messages call each node that runs (a fused Conv with what it took in), made once.
  impl->wheres.resize(static_cast<size_t>(g.node_size()));
  for (int i = 0; i < g.node_size(); ++i) {
    const int role = impl->role[static_cast<size_t>(i)];
    const Model::Impl::Fusion* f = role >= 0 ? &impl->fusions[static_cast<size_t>(role)] : nullptr;
    std::string& where = impl->wheres[static_cast<size_t>(i)];
    where = name + ": " + node_name(g.node(f ? f->conv : i), f ? f->conv : i);
    if (f) {
      where += f->add >= 0 && f->relu >= 0 ? " with the Add and Relu after it"
               : f->relu >= 0              ? " with the Relu after it"
                                           : " with the Add after it";
    }
  }
  find_static_values(*impl);
  plan_attention(*impl);
  Model model;
  model.impl_ = std::move(impl);
  return model;
}

const std::vector<ValueInfo>& Model::inputs() const { return impl_->inputs; }
const std::vector<ValueInfo>& Model::outputs() const { return impl_->outputs; }
int64_t Model::opset() const { return impl_->opset; }

namespace {

// Runs m's nodes on values (the initializers and inputs on device, and for a capture the
// plan's static values, whose nodes are skipped); with a plan, static values are kept in it
// (record) or read from it (capture).
// The dtypes and shapes of inputs, naming a graph plan.
std::string signature(const std::vector<Tensor>& inputs) {
  std::string out = inputs.empty() ? "" : inputs.front().device().str();
  for (const Tensor& t : inputs) out += std::string(" ") + dtype_name(t.dtype()) + shape_str(t.shape());
  return out;
}

// Which values a run holds NHWC ([N, H, W, C], from convolutions run channels-last on a GPU,
// where cuDNN's tensor-core kernels read NHWC without transposing) and their NCHW copies,
// made once when a node that takes NCHW reads one.
class ChannelsLast {
 public:
  ChannelsLast(std::unordered_map<std::string, Tensor>& values, Device device) : values_(values), device_(device) {}
  bool is_nhwc(const std::string& name) const { return nhwc_.count(name) > 0; }
  void mark_nhwc(const std::string& name) {
    nhwc_.insert(name);
    nchw_.erase(name);
  }
  // The value in NCHW (a copy of an NHWC one, made once) or NHWC (a copy of a 4-D NCHW one).
  const Tensor& nchw(const std::string& name) {
    if (!is_nhwc(name)) return values_.at(name);
    auto found = nchw_.find(name);
    if (found == nchw_.end()) found = nchw_.emplace(name, values_.at(name).permute({0, 3, 1, 2}).contiguous()).first;
    return found->second;
  }
  Tensor nhwc(const std::string& name) {
    const Tensor& v = values_.at(name);
    return is_nhwc(name) ? v : v.permute({0, 2, 3, 1}).contiguous();
  }
  // Whether the Conv node runs NHWC: on a GPU's tensor cores (f16, bf16, or f32 with TF32
  // allowed: cuDNN's f32 FMA kernels are slower in NHWC, 17.4 -> 21.0 ms for ResNet-50 at batch
  // 64) or on the CPU's direct kernel (f32 with AVX-512: no im2col), 2-D, one group, its weight
  // an initializer, and its input NHWC already or, on a GPU, of 16 channels or more (a 3-channel
  // image stays NCHW there, as the C++ ResNet's stem does; on the CPU the direct kernel takes
  // ResNet-50's stem in 2/3 of the NCHW product's time, and the MaxPool after it stays NHWC).
  bool nhwc_conv(const Model::Impl& m, const ::onnx::NodeProto& node) const {
    if (node.op_type() != "Conv" || node.input_size() < 2) return false;
    const DType dtype = values_.at(node.input(0)).dtype();
    if (device_.is_cpu()) {
      kernels::Conv2dGeometry g{};
      g.groups = 1, g.channels_last = true;
      if (kernels::conv(device_).nhwc_forward(g, dtype) != kernels::NhwcForward::WeightHwio) return false;
    } else if (!(dtype == DType::F16 || dtype == DType::BF16 || (dtype == DType::F32 && cuda::allow_tf32()))) {
      return false;
    }
    if (node.attribute_size() > 0) {
      for (const auto& a : node.attribute())
        if (a.name() == "group" && a.i() != 1) return false;
    }
    if (!m.initializers.count(node.input(1))) return false;
    const Tensor& x = values_.at(node.input(0));
    if (is_nhwc(node.input(0))) return true;
    return x.dim() == 4 && (device_.is_cpu() || x.size(1) >= 16) && m.initializers.at(node.input(1)).dim() == 4;
  }

 private:
  std::unordered_map<std::string, Tensor>& values_;
  Device device_;
  std::set<std::string> nhwc_;
  std::unordered_map<std::string, Tensor> nchw_;
};

// With times, each node's time (the device waited for) is added to its op type's entry.
using NodeTimes = std::map<std::string, Model::OpTime>;
std::vector<Tensor> run_nodes(const Model::Impl& m, std::unordered_map<std::string, Tensor>& values, Device device,
                              Model::Impl::GraphPlan* plan, bool capturing, NodeTimes* times = nullptr) {
  const auto& table = op_table();
  ChannelsLast layouts(values, device);
  std::vector<char> made;  // nodes a fused attention made unnecessary in this run
  // The attention plans of the inputs' signature, read once a run when a match is met.
  std::string run_signature;
  std::map<int, Model::Impl::AttentionPlan> run_plans;
  bool run_plans_read = false;
  for (int i = 0; i < m.graph.node_size(); ++i) {
    if (!made.empty() && made[static_cast<size_t>(i)]) continue;
    const auto start = std::chrono::steady_clock::now();
    const int role = m.role[static_cast<size_t>(i)];
    const int gelu = m.gelu_at[static_cast<size_t>(i)];
    if (role == Model::Impl::kAbsorbed && gelu < 0) continue;
    if (capturing && m.static_node[static_cast<size_t>(i)]) continue;
    const ::onnx::NodeProto& node = m.graph.node(i);
    const Model::Impl::Fusion* fusion = role >= 0 ? &m.fusions[static_cast<size_t>(role)] : nullptr;
    const ::onnx::NodeProto& first = fusion ? m.graph.node(fusion->conv) : node;
    const auto record_time = [&](const std::string& op) {
      if (!times) return;
      if (device.is_cuda()) cuda::synchronize(device.index);
      Model::OpTime& entry = (*times)[op];
      entry.op = op;
      entry.nodes += 1;
      entry.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    };
    const int attention = m.attention_of[static_cast<size_t>(i)];
    if (attention >= 0) {
      // The plan for this signature, made by the first run at the match's last node (where
      // every value it reads is there), then kept: a fused match skips its nodes and runs at
      // its last one.
      const AttentionMatch& a = m.attentions[static_cast<size_t>(attention)];
      if (!run_plans_read) {  // the signature's plans, read once a run
        std::vector<Tensor> inputs;
        for (const ValueInfo& info : m.inputs) inputs.push_back(values.at(info.name));
        run_signature = signature(inputs);
        std::lock_guard<std::mutex> lock(m.attention_mutex);
        run_plans = m.attention_plans[run_signature];
        run_plans_read = true;
      }
      auto found = run_plans.find(attention);
      if (found == run_plans.end() && i == a.last) {
        bool complete = false;
        const Model::Impl::AttentionPlan made = plan_for_values(a, values, complete);
        if (complete) {
          std::lock_guard<std::mutex> lock(m.attention_mutex);
          m.attention_plans[run_signature][attention] = made;
        }
      }
      const bool known = found != run_plans.end();
      const Model::Impl::AttentionPlan plan_now = known ? found->second : Model::Impl::AttentionPlan{};
      if (known && plan_now.fused) {
        if (i != a.last) continue;
        const Tensor& k_t = layouts.nchw(a.k_t);
        values[m.graph.node(a.last).output(0)] = scaled_dot_product_attention(
            layouts.nchw(a.q), k_t.transpose(2, 3), layouts.nchw(a.v), plan_now.causal, plan_now.scale);
        record_time(plan_now.causal ? "Attention(causal)" : "Attention");
        continue;
      }
    }
    if (gelu >= 0) {
      const GeluMatch& match = m.gelus[static_cast<size_t>(gelu)];
      Tensor& value = values[node.output(0)] = normcore::gelu(layouts.nchw(match.x), match.tanh);
      if (plan && m.static_node[static_cast<size_t>(i)]) plan->statics[node.output(0)] = value;
      record_time(match.tanh ? "Gelu(tanh)" : "Gelu");
      continue;
    }
    NodeRun run{first, m.opset, {}, m.wheres[static_cast<size_t>(i)], Tensor(), false, nullptr, nullptr};
    // On a GPU a convolution of 16 channels or more (or of an input already NHWC) runs NHWC, and
    // so does a Relu of an NHWC value; the other nodes read NCHW copies (ChannelsLast).
    const std::string residual =
        fusion && fusion->add >= 0 ? m.graph.node(fusion->add).input(fusion->residual) : std::string();
    run.channels_last = !m.static_node[static_cast<size_t>(i)] && layouts.nhwc_conv(m, first) &&
                        (residual.empty() || values.at(residual).dim() == 4);
    const bool nhwc_input = !m.static_node[static_cast<size_t>(i)] && layouts.is_nhwc(first.input(0));
    const bool keeps_layout = first.op_type() == "Relu" && nhwc_input;
    // A CPU MaxPool of an NHWC value pools it channels last (max_pool2d keeps an NCHW view of
    // NHWC memory so): its input goes in as that view, its output comes back as one.
    const bool pools_nhwc = first.op_type() == "MaxPool" && nhwc_input && device.is_cpu() && !fusion;
    for (int k = 0; k < first.input_size(); ++k) {
      const std::string& input = first.input(k);
      if (input.empty()) run.inputs.push_back(Tensor());
      else if (run.channels_last && k == 1 && device.is_cpu()) {
        run.inputs.push_back(values.at(input).permute({0, 2, 3, 1}));
        run.weight_panels = m.panel_weight(input, values.at(input));
      } else if (run.channels_last && k == 1) {
        run.inputs.push_back(m.nhwc_weight(input, values.at(input), device));
      } else if ((run.channels_last && k == 0) || keeps_layout) run.inputs.push_back(layouts.nhwc(input));
      else if (pools_nhwc && k == 0) run.inputs.push_back(layouts.nhwc(input).permute({0, 3, 1, 2}));
      else run.inputs.push_back(layouts.nchw(input));
    }
    if (fusion) {
      if (!residual.empty()) run.residual = run.channels_last ? layouts.nhwc(residual) : layouts.nchw(residual);
      run.relu = fusion->relu >= 0;
    }
    if (plan) run.host_values = &plan->host, run.static_values = &m.static_values;
    std::vector<Tensor> outs = table.at(first.op_type()).run(run);
    for (int o = 0; o < node.output_size(); ++o) {
      if (node.output(o).empty()) continue;
      NC_CHECK(o < static_cast<int>(outs.size()) && outs[o].defined(), ValueError, run.where, ": output ", o,
               " is not computed");
      if (pools_nhwc) outs[o] = outs[o].permute({0, 2, 3, 1}).contiguous();  // a view already, but for odd pads
      Tensor& value = values[node.output(o)] = outs[o].to(device);           // constants and shapes made on the host
      if (run.channels_last || keeps_layout || pools_nhwc) layouts.mark_nhwc(node.output(o));
      if (plan && m.static_node[static_cast<size_t>(i)]) plan->statics[node.output(o)] = value;
    }
    std::string op = first.op_type();
    if (fusion && fusion->add >= 0) op += "+Add";
    if (fusion && fusion->relu >= 0) op += "+Relu";
    record_time(run.channels_last || pools_nhwc ? op + " (NHWC)" : op);
  }
  std::vector<Tensor> out;
  for (const ValueInfo& info : m.outputs) out.push_back(layouts.nchw(info.name));
  return out;
}

// The initializers on device and the inputs checked against the graph's, by name.
std::unordered_map<std::string, Tensor> bound_values(const Model::Impl& m, const std::vector<Tensor>& inputs,
                                                     Device device) {
  NC_CHECK(inputs.size() == m.inputs.size(), ValueError, m.name, ": the graph takes ", m.inputs.size(), " inputs, got ",
           inputs.size());
  std::unordered_map<std::string, Tensor> values = *m.initializers_on(device);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ValueInfo& info = m.inputs[i];
    NC_CHECK(inputs[i].defined(), ValueError, m.name, ": input '", info.name, "' is an undefined tensor");
    NC_CHECK(inputs[i].dtype() == info.dtype, DTypeError, m.name, ": input '", info.name, "' must be ",
             dtype_name(info.dtype), ", got ", describe(inputs[i]));
    bool fits = info.dims.empty() || inputs[i].dim() == static_cast<int64_t>(info.dims.size());
    for (size_t d = 0; fits && d < info.dims.size(); ++d)
      fits = info.dims[d] < 0 || info.dims[d] == inputs[i].size(static_cast<int64_t>(d));
    NC_CHECK(fits, ShapeError, m.name, ": input '", info.name, "' does not fit the graph's dims, got ",
             describe(inputs[i]));
    values[info.name] = inputs[i].to(device);
  }
  return values;
}

}  // namespace

std::vector<Model::OpTime> Model::profile(const std::vector<Tensor>& inputs, int runs) const {
  const Impl& m = *impl_;
  NC_CHECK(runs >= 1, ValueError, m.name, ": profile takes at least 1 run, got ", runs);
  const Device device = inputs.empty() ? Device::cpu() : inputs.front().device();
  autograd::NoGradGuard no_grad;
  NodeTimes times;
  for (int r = 0; r < runs; ++r) {
    std::unordered_map<std::string, Tensor> values = bound_values(m, inputs, device);
    if (device.is_cuda()) cuda::synchronize(device.index);
    run_nodes(m, values, device, nullptr, false, &times);
  }
  std::vector<OpTime> out;
  for (auto& [op, t] : times) out.push_back({op, t.nodes / runs, t.ms / runs});
  std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.ms > b.ms; });
  return out;
}

std::vector<Tensor> Model::run(const std::vector<Tensor>& inputs, bool cuda_graph) const {
  const Impl& m = *impl_;
  const Device device = inputs.empty() ? Device::cpu() : inputs.front().device();
  autograd::NoGradGuard no_grad;
  std::unordered_map<std::string, Tensor> values = bound_values(m, inputs, device);
  if (!cuda_graph || !device.is_cuda()) return run_nodes(m, values, device, nullptr, false);

  Impl::GraphPlan& plan = *m.plan_for(signature(inputs), true);
  std::lock_guard<std::mutex> lock(plan.mutex);
  using State = Impl::GraphPlan::State;
  if (plan.state == State::Eager) return run_nodes(m, values, device, nullptr, false);
  if (plan.state == State::Recorded && plan.statics.empty() && plan.inputs.empty()) {
    plan.inputs.resize(inputs.size());  // marks the recording done
    return run_nodes(m, values, device, &plan, false);
  }
  if (plan.state == State::Recorded) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      plan.inputs[i] = empty(inputs[i].shape(), TensorOptions(inputs[i].dtype(), device));
      plan.inputs[i].copy_(inputs[i]);
      values[m.inputs[i].name] = plan.inputs[i];
    }
    for (const auto& [name, t] : plan.statics) values[name] = t;
    auto graph = std::make_unique<cuda::Graph>();
    try {
      graph->capture(device.index, [&] { plan.outputs = run_nodes(m, values, device, &plan, true); });
    } catch (const CaptureError& e) {
      plan.state = State::Eager;
      plan.why_eager = e.what();
      plan.inputs.clear();
      return run_nodes(m, values, device, nullptr, false);
    }
    plan.graph = std::move(graph);
    plan.state = State::Captured;
  } else {
    for (size_t i = 0; i < inputs.size(); ++i) plan.inputs[i].copy_(inputs[i]);
  }
  plan.graph->replay();
  std::vector<Tensor> out;
  for (const Tensor& t : plan.outputs) out.push_back(t.clone());
  return out;
}

std::string Model::cuda_graph_state(const std::vector<Tensor>& inputs) const {
  const Impl::GraphPlan* plan = impl_->plan_for(signature(inputs), false);
  if (plan == nullptr) return "not run";
  switch (plan->state) {
    case Impl::GraphPlan::State::Recorded: return "recorded";
    case Impl::GraphPlan::State::Captured: return "captured";
    case Impl::GraphPlan::State::Eager: return "eager: " + plan->why_eager;
  }
  return "";
}

// ---------------------------------------------------------------- NodeRun
const ::onnx::AttributeProto* NodeRun::attribute(const std::string& name) const {
  for (const auto& a : node.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

int64_t NodeRun::int_attribute(const std::string& name, int64_t fallback) const {
  const auto* a = attribute(name);
  return a ? a->i() : fallback;
}

float NodeRun::float_attribute(const std::string& name, float fallback) const {
  const auto* a = attribute(name);
  return a ? a->f() : fallback;
}

std::vector<int64_t> NodeRun::ints_attribute(const std::string& name) const {
  const auto* a = attribute(name);
  return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : std::vector<int64_t>{};
}

const Tensor& NodeRun::input(size_t i) const {
  NC_CHECK(has_input(i), ValueError, where, ": input ", i, " is missing");
  return inputs[i];
}

std::vector<int64_t> NodeRun::int_values(size_t i) const {
  return host_input(i).to(DType::I64).contiguous().to_vector<int64_t>();
}

Tensor NodeRun::host_input(size_t i) const {
  const Tensor& t = input(i);
  const std::string& name = node.input(static_cast<int>(i));
  const bool keep = host_values != nullptr && static_values != nullptr && static_values->count(name) > 0;
  if (keep) {
    const auto found = host_values->find(name);
    if (found != host_values->end()) return found->second;
  }
  Tensor host = t.to(Device::cpu());
  if (keep) (*host_values)[name] = host;
  return host;
}

}  // namespace onnx
}  // namespace normcore
