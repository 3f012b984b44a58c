// The autograd engine: per-tensor state, the grad-mode switch, record(), and backward(),
// which runs recorded nodes in reverse topological order (each exactly once, after every
// gradient flowing into it has arrived) and accumulates into leaves.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "autograd/graph.h"
#include "autograd/hook_list.h"
#include "base/op_scope.h"
#include "normcore/autocast.h"
#include "normcore/ops.h"

namespace normcore {

namespace {

thread_local bool grad_enabled = true;
thread_local bool anomaly_enabled = false;
thread_local bool inference_mode = false;
// The callbacks of the backward() running on this thread (null outside one).
thread_local std::vector<std::function<void()>>* backward_callbacks = nullptr;
thread_local uint64_t backward_calls = 0;

AutogradMeta* meta_of(const Tensor& t) { return t.impl().autograd.get(); }

AutogradMeta& ensure_meta(const Tensor& t) {
  auto& m = t.impl().autograd;
  if (!m) m = std::make_shared<AutogradMeta>();
  return *m;
}

// Whether nothing but this handle can reach grad's memory: its only handle, the only
// tensor on its storage, contiguous over all of it, without history.
bool exclusively_owned(const Tensor& grad) {
  return grad.impl_ptr().use_count() == 1 && grad.storage().use_count() == 1 && grad.is_contiguous() &&
         grad.impl().offset == 0 && grad.storage()->nbytes == grad.nbytes() && !grad.impl().autograd;
}

// A leaf's first gradient is taken over where nothing else can see its memory (the usual
// case: a backward kernel's fresh output), else copied, so that changing one gradient in
// place (clipping) never shows in another tensor. Later ones are added out of place.
void accumulate(AutogradMeta& leaf, const Tensor& grad) {
  if (leaf.grad.defined()) leaf.grad = add(leaf.grad, grad);
  else leaf.grad = exclusively_owned(grad) ? grad : grad.clone();
}

// A leaf's ready hooks, on a copy of the list (a hook may remove itself).
void run_ready_hooks(AutogradMeta& leaf) {
  const auto hooks = leaf.ready_hooks;
  for (const auto& hook : hooks) hook.second();
}

// grad after a tensor's gradient hooks, each given the previous one's result (on a copy of
// the list: a hook may remove itself). A replacement must match the gradient it replaces.
Tensor run_grad_hooks(const std::vector<std::pair<int64_t, GradHook>>& registered, Tensor grad) {
  if (registered.empty() || !grad.defined()) return grad;
  const auto hooks = registered;
  for (const auto& hook : hooks) {
    const Tensor replacement = hook.second(grad);
    if (!replacement.defined()) continue;
    NC_CHECK(replacement.shape() == grad.shape(), ShapeError, "register_hook: a hook returned ", describe(replacement),
             " for the gradient ", describe(grad), "; the shapes must match");
    NC_CHECK(replacement.dtype() == grad.dtype(), DTypeError, "register_hook: a hook returned ", describe(replacement),
             " for the gradient ", describe(grad), "; the dtypes must match");
    NC_CHECK(replacement.device() == grad.device(), DeviceError, "register_hook: a hook returned ",
             describe(replacement), " for the gradient ", describe(grad), "; the devices must match");
    grad = replacement.detach();
  }
  return grad;
}

// grad after the hooks registered on output output_nr of node.
Tensor run_node_hooks(const Node& node, int output_nr, Tensor grad) {
  if (node.grad_hooks.empty() || !grad.defined()) return grad;
  std::vector<std::pair<int64_t, GradHook>> hooks;
  for (const NodeHook& h : node.grad_hooks) {
    if (h.output_nr == output_nr) hooks.emplace_back(h.id, h.hook);
  }
  return run_grad_hooks(hooks, std::move(grad));
}

void run_callbacks(std::vector<std::function<void()>>& callbacks) {
  for (size_t i = 0; i < callbacks.size(); ++i) {
    std::function<void()> fn = std::move(callbacks[i]);  // fn may queue more (reallocating)
    fn();
  }
}

// Whether t (floating) holds only finite values. NaN or infinity times zero is NaN, so one
// sum tells; recording is off so that the check records nothing.
bool all_finite(const Tensor& t) {
  if (!t.defined() || !is_floating(t.dtype()) || t.numel() == 0) return true;
  autograd::NoGradGuard no_grad;
  return !std::isnan(sum(mul(t.detach(), 0.0)).item<double>());
}

// "3 of 12 values are NaN or infinite (the first, at flat index 5, is -inf)".
std::string non_finite_summary(const Tensor& t) {
  autograd::NoGradGuard no_grad;
  const std::vector<double> values = t.detach().to(Device::cpu()).to(DType::F64).contiguous().to_vector<double>();
  int64_t count = 0, first = -1;
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isfinite(values[i])) continue;
    if (first < 0) first = static_cast<int64_t>(i);
    ++count;
  }
  std::ostringstream out;
  out << count << " of " << values.size() << " values are NaN or infinite (the first, at flat index " << first
      << ", is " << (first >= 0 ? values[static_cast<size_t>(first)] : 0.0) << ")";
  return out.str();
}

// Anomaly mode's check of a recorded op's result: names the op, and tells apart a value it
// produced from finite inputs and one it passed on from an input.
void check_result(const char* name, const Tensor& out, const std::vector<Tensor>& inputs) {
  if (all_finite(out)) return;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!all_finite(inputs[i])) {
      throw ValueError(detail::cat_str("anomaly mode: '", name, "' received a NaN or infinity in input ", i, " ",
                                       describe(inputs[i]), ": ", non_finite_summary(inputs[i]),
                                       inputs[i].is_leaf() ? " (a leaf tensor)" : ""));
    }
  }
  throw ValueError(detail::cat_str("anomaly mode: '", name,
                                   "' produced a NaN or infinity from finite inputs: its result ", describe(out), ": ",
                                   non_finite_summary(out)));
}

}  // namespace

namespace autograd {

bool is_anomaly_enabled() { return anomaly_enabled; }
void set_anomaly_enabled(bool enabled) { anomaly_enabled = enabled; }

AnomalyModeGuard::AnomalyModeGuard(bool enabled) : previous_(anomaly_enabled) { anomaly_enabled = enabled; }
AnomalyModeGuard::~AnomalyModeGuard() { anomaly_enabled = previous_; }

bool is_grad_enabled() { return grad_enabled; }
void set_grad_enabled(bool enabled) { grad_enabled = enabled; }

NoGradGuard::NoGradGuard() : previous_(grad_enabled) { grad_enabled = false; }
NoGradGuard::~NoGradGuard() { grad_enabled = previous_; }

bool is_inference_mode() { return inference_mode; }

InferenceModeGuard::InferenceModeGuard(bool enabled) : previous_grad_(grad_enabled), previous_mode_(inference_mode) {
  if (!enabled) return;
  grad_enabled = false;
  inference_mode = true;
}
InferenceModeGuard::~InferenceModeGuard() {
  grad_enabled = previous_grad_;
  inference_mode = previous_mode_;
}

int64_t add_grad_ready_hook(const Tensor& leaf, std::function<void()> hook) {
  NC_CHECK(leaf.defined() && leaf.requires_grad() && leaf.is_leaf(), ValueError,
           "add_grad_ready_hook: the tensor must be a leaf that requires grad, got ",
           leaf.defined() ? describe(leaf) : std::string("an undefined tensor"),
           leaf.defined() && !leaf.is_leaf() ? " made by '" + leaf.grad_fn_name() + "'" : std::string());
  NC_CHECK(hook != nullptr, ValueError, "add_grad_ready_hook: the hook is empty");
  const int64_t id = next_hook_id();
  ensure_meta(leaf).ready_hooks.emplace_back(id, std::move(hook));
  return id;
}

void remove_grad_ready_hook(const Tensor& leaf, int64_t id) {
  AutogradMeta* m = leaf.defined() ? meta_of(leaf) : nullptr;
  if (m != nullptr) erase_hook(m->ready_hooks, id);
}

}  // namespace autograd

void HookHandle::remove() {
  if (!remover_) return;
  const std::function<void()> remover = std::move(remover_);
  remover_ = nullptr;
  remover();
}

namespace autograd {

HookHandle register_hook(const Tensor& t, GradHook hook) {
  NC_CHECK(t.defined(), ValueError, "register_hook: the tensor is undefined");
  NC_CHECK(t.requires_grad(), ValueError, "register_hook: ", describe(t),
           " does not require grad, so no gradient will reach it (requires_grad_() on a leaf first)");
  NC_CHECK(hook != nullptr, ValueError, "register_hook: the hook is empty");
  const int64_t id = next_hook_id();
  AutogradMeta& m = *t.impl().autograd;
  if (m.grad_fn) {
    m.grad_fn->grad_hooks.push_back(NodeHook{id, m.output_nr, std::move(hook)});
    std::weak_ptr<Node> node = m.grad_fn;
    return HookHandle([node, id] {
      if (auto n = node.lock()) erase_hook(n->grad_hooks, id, [](const NodeHook& h) { return h.id; });
    });
  }
  m.grad_hooks.emplace_back(id, std::move(hook));
  std::weak_ptr<AutogradMeta> leaf = t.impl().autograd;
  return HookHandle([leaf, id] {
    if (auto l = leaf.lock()) erase_hook(l->grad_hooks, id);
  });
}

int64_t next_hook_id() {
  static std::atomic<int64_t> next{1};
  return next++;
}

uint64_t backward_count() { return backward_calls; }

void queue_backward_callback(std::function<void()> fn) {
  NC_CHECK(backward_callbacks != nullptr, ValueError,
           "queue_backward_callback: no backward() is running on this thread");
  backward_callbacks->push_back(std::move(fn));
}

Edge edge_to(const Tensor& in) {
  Edge e;
  if (!in.defined() || !in.requires_grad()) return e;
  AutogradMeta* m = meta_of(in);
  if (m->grad_fn) {
    e.node = m->grad_fn;
    e.output_nr = m->output_nr;
  } else {
    e.leaf = in.impl().autograd;
  }
  return e;
}

void check_anomaly(const char* name, const Tensor& out, const std::vector<Tensor>& inputs) {
  if (anomaly_enabled) check_result(name, out, inputs);
}

void record(const char* name, const Tensor& out, const std::vector<Tensor>& inputs, BackwardFn fn) {
  if (!grad_enabled) return;
  auto node = std::make_shared<Node>();
  node->name = name;
  bool any = false;
  for (const Tensor& in : inputs) {
    if (in.defined() && in.requires_grad() && in.is_same(out)) return;  // the op returned its input
    node->next.push_back(edge_to(in));
    any = any || node->next.back().active();
  }
  if (!any) return;
  if (anomaly_enabled) check_result(name, out, inputs);
  node->backward = std::move(fn);
  AutogradMeta& m = ensure_meta(out);
  m.requires_grad = true;
  m.grad_fn = std::move(node);
}

const Tensor& check_saved(const Tensor& t, uint64_t version) {
  if (!t.defined()) return t;
  const uint64_t now = t.version();
  if (now != version) {
    std::string op = detail::current_op();
    if (op.empty()) op = "backward";
    throw Error(detail::cat_str(op, ": a tensor saved for the gradient (", describe(t),
                                ") was written in place after the forward: its storage is at version ", now,
                                ", it was saved at version ", version,
                                "; the gradient would use the new values. Write into a clone(), or after backward()"));
  }
  return t;
}

const Tensor& SavedTensor::get() const { return check_saved(tensor_, version_); }

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < grad.dim(); ++d)
    if (d < lead || (shape[d - lead] == 1 && grad.size(d) != 1)) dims.push_back(d);
  if (dims.empty()) return grad.reshape(shape);
  // Leading dims of a contiguous 16-bit gradient (a Linear's bias over [B, T, out] under
  // autocast): one matrix product with a row of ones sums the rows reading the gradient once,
  // in place, with f32 accumulation; the reduction would first copy it transposed, the
  // reduced dims last. Not f32: with TF32 allowed the product would round the gradient.
  const bool leading = static_cast<int64_t>(dims.size()) == dims.back() + 1;  // dims is 0, 1, ..., k - 1
  const DType dtype = grad.dtype();
  if (leading && grad.is_contiguous() && (dtype == DType::BF16 || dtype == DType::F16)) {
    int64_t rows = 1;  // no overflow: a factor of grad's numel
    for (int64_t d : dims) rows *= grad.size(d);
    const int64_t cols = rows == 0 ? 0 : grad.numel() / rows;
    if (rows > 0 && cols > 0) {
      const Tensor ones_row = ones({1, rows}, TensorOptions(dtype, grad.device()));
      return matmul(ones_row, grad.view({rows, cols})).reshape(shape);
    }
  }
  return sum(grad, dims, /*keepdim=*/true).reshape(shape);
}

}  // namespace autograd

// ---------------------------------------------------------------- graph release
Node::~Node() {
  // Take over the edges to nodes that nothing else holds, and theirs, so that each node is
  // destroyed with no children left to destroy recursively.
  std::vector<std::shared_ptr<Node>> orphans;
  for (Edge& e : next) {
    if (e.node) orphans.push_back(std::move(e.node));
  }
  while (!orphans.empty()) {
    std::shared_ptr<Node> n = std::move(orphans.back());
    orphans.pop_back();
    if (n.use_count() != 1) continue;  // still held elsewhere: dropping our handle is enough
    for (Edge& e : n->next) {
      if (e.node) orphans.push_back(std::move(e.node));
    }
  }
}

// ---------------------------------------------------------------- Tensor methods
bool Tensor::requires_grad() const {
  AutogradMeta* m = meta_of(*this);
  return m && m->requires_grad;
}

Tensor& Tensor::requires_grad_(bool requires) {
  NC_CHECK(!requires || is_floating(dtype()), DTypeError,
           "requires_grad_: only floating tensors can require grad, got ", describe(*this));
  AutogradMeta* m = meta_of(*this);
  NC_CHECK(!(m && m->grad_fn), ValueError,
           "requires_grad_: can only be changed on leaf tensors, this one "
           "was produced by '",
           m ? m->grad_fn->name : "", "' (use detach() first)");
  ensure_meta(*this).requires_grad = requires;
  return *this;
}

Tensor Tensor::grad() const {
  AutogradMeta* m = meta_of(*this);
  return m ? m->grad : Tensor();
}

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined()) {
    NC_CHECK(g.shape() == shape(), ShapeError, "set_grad: gradient ", describe(g), " does not match tensor ",
             describe(*this));
    NC_CHECK(g.dtype() == dtype(), DTypeError, "set_grad: gradient ", describe(g), " does not match tensor ",
             describe(*this));
    NC_CHECK(g.device() == device(), DeviceError, "set_grad: gradient ", describe(g), " does not match tensor ",
             describe(*this));
  }
  ensure_meta(*this).grad = g;
}

void Tensor::zero_grad() const {
  if (AutogradMeta* m = meta_of(*this)) m->grad = Tensor();
}

bool Tensor::is_leaf() const {
  AutogradMeta* m = meta_of(*this);
  return !m || !m->grad_fn;
}

std::string Tensor::grad_fn_name() const {
  AutogradMeta* m = meta_of(*this);
  return m && m->grad_fn ? m->grad_fn->name : "";
}

void Tensor::backward(const Tensor& grad_in, bool retain_graph) const {
  const char* op = "backward";
  NC_CHECK(!inference_mode, ValueError, op, ": called on ", describe(*this),
           " inside an inference-mode guard (autograd::InferenceModeGuard), which records nothing to run");
  NC_CHECK(requires_grad(), ValueError, op, ": tensor ", describe(*this),
           " does not require grad (no input of the ops that made it requires grad)");
  Tensor grad = grad_in;
  if (!grad.defined()) {
    NC_CHECK(numel() == 1, ShapeError, op, ": grad must be given for a tensor of shape ", shape(),
             " (it is implied only for one-element tensors)");
    grad = ones_like(*this);
  } else {
    NC_CHECK(grad.shape() == shape(), ShapeError, op, ": grad has shape ", grad.shape(), " but the tensor has shape ",
             shape());
    NC_CHECK(grad.device() == device(), DeviceError, op, ": 'tensor' is on ", device(), " but 'grad' is on ",
             grad.device(), " (move them to one device with .to())");
    grad = grad.detach().to(dtype());
  }
  autograd::NoGradGuard no_grad;
  // The backward formulas compute in the dtypes the forward recorded, whatever the caller's
  // autocast state.
  autocast::Guard no_autocast(autocast::dtype(), false);
  AutogradMeta* root_meta = meta_of(*this);
  ++backward_calls;
  std::vector<std::function<void()>> callbacks;
  std::vector<std::function<void()>>* outer_callbacks = backward_callbacks;
  backward_callbacks = &callbacks;
  struct Restore {
    std::vector<std::function<void()>>* outer;
    ~Restore() { backward_callbacks = outer; }
  } restore{outer_callbacks};
  if (!root_meta->grad_fn) {
    accumulate(*root_meta, run_grad_hooks(root_meta->grad_hooks, grad));
    run_ready_hooks(*root_meta);
    run_callbacks(callbacks);
    return;
  }

  // Count, for every node reachable from the root, the edges that lead into it, and for
  // every leaf with hooks, the edges into it (its gradient hooks see the sum of them).
  std::unordered_map<Node*, int> dependencies;
  struct LeafEdges {
    int remaining = 0;
    bool summed = false;  // it has gradient hooks: its gradients are summed, then hooked
  };
  std::unordered_map<AutogradMeta*, LeafEdges> leaf_edges;
  std::vector<Node*> stack{root_meta->grad_fn.get()};
  std::unordered_set<Node*> seen{stack.back()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next) {
      if (e.leaf && (!e.leaf->ready_hooks.empty() || !e.leaf->grad_hooks.empty())) {
        LeafEdges& counted = leaf_edges[e.leaf.get()];
        ++counted.remaining;
        counted.summed = !e.leaf->grad_hooks.empty();
      }
      if (!e.node) continue;
      ++dependencies[e.node.get()];
      if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }

  // The gradients waiting for each node: of its one output, or (pending_multi) of each of
  // the outputs of a node with several.
  std::unordered_map<Node*, Tensor> pending;
  std::unordered_map<Node*, std::vector<Tensor>> pending_multi;
  std::unordered_map<AutogradMeta*, Tensor> leaf_pending;  // the sums for leaves with gradient hooks
  auto add_pending = [&](Node* node, int output_nr, const Tensor& g) {
    Tensor* slot = nullptr;
    if (node->num_outputs > 1) {
      std::vector<Tensor>& slots = pending_multi[node];
      slots.resize(static_cast<size_t>(node->num_outputs));
      slot = &slots[static_cast<size_t>(output_nr)];
    } else {
      slot = &pending[node];
    }
    *slot = slot->defined() ? add(*slot, g) : g;
  };
  add_pending(root_meta->grad_fn.get(), root_meta->output_nr, grad);
  std::vector<std::shared_ptr<Node>> ready{root_meta->grad_fn};
  while (!ready.empty()) {
    std::shared_ptr<Node> node = std::move(ready.back());
    ready.pop_back();
    detail::OpScope scope(node->name, " backward");  // names the op in a CUDA failure
    Tensor g;
    std::vector<Tensor> gs;
    if (node->num_outputs > 1) {
      gs = std::move(pending_multi[node.get()]);
      pending_multi.erase(node.get());
      gs.resize(static_cast<size_t>(node->num_outputs));
    } else {
      g = std::move(pending[node.get()]);
      pending.erase(node.get());
    }
    NC_CHECK(!node->released, Error, op, ": the graph through '", node->name,
             "' was already freed by an earlier backward; pass retain_graph=true to that call to "
             "run backward through it again");
    std::vector<Tensor> grads;
    bool any_grad = g.defined();
    for (size_t k = 0; k < gs.size(); ++k) {
      gs[k] = run_node_hooks(*node, static_cast<int>(k), std::move(gs[k]));
      any_grad = any_grad || gs[k].defined();
    }
    if (any_grad) {
      if (node->num_outputs > 1) {
        grads = node->backward_multi(gs);
      } else {
        g = run_node_hooks(*node, 0, std::move(g));
        grads = node->backward(g);
      }
      NC_CHECK(grads.size() == node->next.size(), Error, op, ": '", node->name, "' returned ", grads.size(),
               " gradients for ", node->next.size(), " inputs");
      if (anomaly_enabled) {
        for (size_t i = 0; i < grads.size(); ++i) {
          NC_CHECK(all_finite(grads[i]), ValueError, "anomaly mode: the backward of '", node->name,
                   "' produced a NaN or infinity in the gradient of input ", i, " ", describe(grads[i]), ": ",
                   non_finite_summary(grads[i]),
                   (all_finite(g) ? " from a finite incoming gradient"
                                  : " (its incoming gradient was already non-finite)"));
        }
      }
    }
    if (!retain_graph) {
      node->backward = nullptr;
      node->backward_multi = nullptr;
      node->released = true;
    }
    for (size_t i = 0; i < node->next.size(); ++i) {
      const Edge& e = node->next[i];
      const Tensor* gi = i < grads.size() && grads[i].defined() ? &grads[i] : nullptr;
      if (e.leaf) {
        auto counted = leaf_edges.find(e.leaf.get());
        if (counted == leaf_edges.end() || !counted->second.summed) {
          if (gi) accumulate(*e.leaf, *gi);
          if (counted != leaf_edges.end() && --counted->second.remaining == 0) run_ready_hooks(*e.leaf);
          continue;
        }
        Tensor& sum = leaf_pending[e.leaf.get()];
        if (gi) sum = sum.defined() ? add(sum, *gi) : *gi;
        if (--counted->second.remaining == 0) {
          const Tensor total = run_grad_hooks(e.leaf->grad_hooks, std::move(sum));
          leaf_pending.erase(e.leaf.get());
          if (total.defined()) accumulate(*e.leaf, total);
          run_ready_hooks(*e.leaf);
        }
      } else if (e.node) {
        if (gi) add_pending(e.node.get(), e.output_nr, *gi);
        if (--dependencies[e.node.get()] == 0) ready.push_back(e.node);
      }
    }
  }
  run_callbacks(callbacks);
}

}  // namespace normcore
