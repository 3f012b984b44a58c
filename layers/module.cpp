// Module: registration, dotted-name traversal, train/eval, in-place device and dtype
// conversion, and state_dict save/load. Conversion swaps the data fields of each
// parameter's TensorImpl (never the handle), so all handles to a parameter stay valid.
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "autograd/hook_list.h"
#include "normcore/autograd.h"
#include "normcore/nn.h"
#include "normcore/safetensors.h"

namespace normcore {
namespace nn {

namespace {

using ModuleVisitor = std::function<void(const std::string& prefix, const Module& module)>;

std::string join_names(const std::vector<std::string>& names) {
  std::ostringstream s;
  for (size_t i = 0; i < names.size(); ++i) s << (i ? ", " : "") << '"' << names[i] << '"';
  return s.str();
}

// Replaces t's data with converted's (same shape), keeping t's autograd state.
void replace_data(const Tensor& t, const Tensor& converted) {
  TensorImpl& impl = t.impl();
  const TensorImpl& from = converted.impl();
  impl.storage = from.storage;
  impl.shape = from.shape;
  impl.strides = from.strides;
  impl.offset = from.offset;
  impl.dtype = from.dtype;
}

// t converted in place to device and (when given and t is floating) dtype.
void convert_in_place(const Tensor& t, Device device, std::optional<DType> dtype) {
  DType target = dtype && is_floating(t.dtype()) ? *dtype : t.dtype();
  if (t.device() == device && t.dtype() == target) return;
  autograd::NoGradGuard no_grad;
  replace_data(t, t.detach().to(device, target));
  if (AutogradMeta* meta = t.impl().autograd.get(); meta && meta->grad.defined())
    meta->grad = meta->grad.to(device, target);
}

}  // namespace

Tensor Module::forward(const Tensor&) {
  throw Error("Module::forward: this module has no single-input forward (override forward(const Tensor&) "
              "or call the module's own forward)");
}

// ---------------------------------------------------------------- forward hooks
struct Module::ForwardHooks {
  std::vector<std::pair<int64_t, ForwardHook>> hooks;
};

Tensor Module::operator()(const Tensor& x) {
  Tensor y = forward(x);
  if (forward_hooks_ && !forward_hooks_->hooks.empty()) {
    const auto hooks = forward_hooks_->hooks;  // a hook may remove itself
    for (const auto& hook : hooks) hook.second(*this, x, y);
  }
  return y;
}

bool Module::has_forward_hooks() const { return forward_hooks_ && !forward_hooks_->hooks.empty(); }

HookHandle Module::register_forward_hook(ForwardHook hook) {
  NC_CHECK(hook != nullptr, ValueError, "register_forward_hook: the hook is empty");
  const int64_t id = autograd::next_hook_id();
  if (!forward_hooks_) forward_hooks_ = std::make_shared<ForwardHooks>();
  forward_hooks_->hooks.emplace_back(id, std::move(hook));
  std::weak_ptr<ForwardHooks> registered = forward_hooks_;
  return HookHandle([registered, id] {
    if (auto list = registered.lock()) autograd::erase_hook(list->hooks, id);
  });
}

// ---------------------------------------------------------------- registration
void Module::check_new_name(const char* what, const std::string& name) const {
  NC_CHECK(!name.empty(), ValueError, what, ": the name must not be empty");
  NC_CHECK(name.find('.') == std::string::npos, ValueError, what, ": name \"", name,
           "\" must not contain '.' (dots separate the names of nested modules)");
  auto taken = [&](const auto& entries) {
    for (const auto& e : entries)
      if (e.first == name) return true;
    return false;
  };
  NC_CHECK(!taken(parameters_) && !taken(buffers_) && !taken(children_), ValueError, what, ": name \"", name,
           "\" is already used by a parameter, buffer or child of this module");
}

Tensor Module::register_parameter(const std::string& name, Tensor tensor) {
  const char* op = "register_parameter";
  check_new_name(op, name);
  NC_CHECK(tensor.defined(), ValueError, op, ": parameter \"", name, "\" is an undefined tensor");
  NC_CHECK(is_floating(tensor.dtype()), DTypeError, op, ": parameter \"", name, "\" must be floating, got ",
           describe(tensor));
  NC_CHECK(tensor.is_leaf(), ValueError, op, ": parameter \"", name, "\" was produced by '", tensor.grad_fn_name(),
           "'; parameters must be leaves (pass a detach()ed tensor)");
  tensor.requires_grad_(true);
  parameters_.emplace_back(name, tensor);
  return tensor;
}

Tensor Module::register_buffer(const std::string& name, Tensor tensor) {
  const char* op = "register_buffer";
  check_new_name(op, name);
  NC_CHECK(tensor.defined(), ValueError, op, ": buffer \"", name, "\" is an undefined tensor");
  buffers_.emplace_back(name, tensor);
  return tensor;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  const char* op = "register_module";
  check_new_name(op, name);
  NC_CHECK(module != nullptr, ValueError, op, ": module \"", name, "\" is null");
  NC_CHECK(module.get() != this, ValueError, op, ": a module cannot be its own child (\"", name, "\")");
  children_.emplace_back(name, std::move(module));
}

// ---------------------------------------------------------------- traversal
namespace {

// Calls visit for module and, depth first in registration order, every module under it,
// each once, with its dotted prefix ("" for the root, "body.0." below it).
void visit_modules(const Module& module, const std::string& prefix, std::set<const Module*>& seen,
                   const ModuleVisitor& visit) {
  if (!seen.insert(&module).second) return;
  visit(prefix, module);
  for (const auto& child : module.named_children())
    visit_modules(*child.second, prefix + child.first + ".", seen, visit);
}

}  // namespace

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  std::set<const TensorImpl*> seen_tensors;
  std::set<const Module*> seen_modules;
  visit_modules(*this, "", seen_modules, [&](const std::string& prefix, const Module& m) {
    for (const auto& p : m.parameters_)
      if (seen_tensors.insert(&p.second.impl()).second) out.emplace_back(prefix + p.first, p.second);
  });
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& p : named_parameters()) out.push_back(p.second);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  std::set<const TensorImpl*> seen_tensors;
  std::set<const Module*> seen_modules;
  visit_modules(*this, "", seen_modules, [&](const std::string& prefix, const Module& m) {
    for (const auto& b : m.buffers_)
      if (seen_tensors.insert(&b.second.impl()).second) out.emplace_back(prefix + b.first, b.second);
  });
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  std::set<const Module*> seen;
  for (const auto& c : children_)
    if (seen.insert(c.second.get()).second) out.push_back(c);
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (auto& c : named_children()) out.push_back(c.second);
  return out;
}

// ---------------------------------------------------------------- modes and conversion
void Module::train(bool training) {
  training_ = training;
  for (auto& c : children_) c.second->train(training);
}

void Module::zero_grad() {
  for (const Tensor& p : parameters()) p.zero_grad();
}

void Module::to(Device device) {
  for (const auto& p : named_parameters()) convert_in_place(p.second, device, std::nullopt);
  for (const auto& b : named_buffers()) convert_in_place(b.second, device, std::nullopt);
}

void Module::to(DType dtype) {
  NC_CHECK(is_floating(dtype), DTypeError, "Module::to: dtype must be floating, got ", dtype_name(dtype),
           " (only floating parameters and buffers are converted)");
  for (const auto& p : named_parameters()) convert_in_place(p.second, p.second.device(), dtype);
  for (const auto& b : named_buffers()) convert_in_place(b.second, b.second.device(), dtype);
}

// ---------------------------------------------------------------- state
// Every parameter and buffer as PyTorch's state_dict lists them: not de-duplicated, so a
// tensor or module reachable along two paths has a key for each.
void Module::collect_state(const std::string& prefix, bool detached, NamedTensors& out) const {
  for (const auto& p : parameters_) out.emplace_back(prefix + p.first, detached ? p.second.detach() : p.second);
  for (const auto& b : buffers_) out.emplace_back(prefix + b.first, detached ? b.second.detach() : b.second);
  for (const auto& c : children_) c.second->collect_state(prefix + c.first + ".", detached, out);
}

NamedTensors Module::state_dict() const {
  NamedTensors out;
  collect_state("", /*detached=*/true, out);
  return out;
}

void Module::load_state_dict(const NamedTensors& dict, bool strict) {
  const char* op = "load_state_dict";
  std::map<std::string, const Tensor*> given;
  for (const auto& entry : dict) {
    NC_CHECK(entry.second.defined(), ValueError, op, ": entry \"", entry.first, "\" is an undefined tensor");
    NC_CHECK(given.emplace(entry.first, &entry.second).second, ValueError, op, ": key \"", entry.first,
             "\" appears more than once");
  }
  NamedTensors own;
  collect_state("", /*detached=*/false, own);

  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string> known;
  for (const auto& entry : own) {
    known.insert(entry.first);
    auto it = given.find(entry.first);
    if (it == given.end()) missing.push_back(entry.first);
    else if (it->second->shape() != entry.second.shape())
      mismatched.push_back(
          detail::cat_str(entry.first, " (dict ", it->second->shape(), ", module ", entry.second.shape(), ")"));
  }
  for (const auto& entry : dict)
    if (!known.count(entry.first)) unexpected.push_back(entry.first);

  std::string problems;
  auto list = [&problems](const char* what, const std::vector<std::string>& names) {
    if (!names.empty()) problems += detail::cat_str(problems.empty() ? "" : "; ", what, ": ", join_names(names));
  };
  list("mis-shaped keys", mismatched);
  if (strict) {
    list("missing keys", missing);
    list("unexpected keys", unexpected);
  }
  NC_CHECK(mismatched.empty(), ShapeError, op, ": ", problems);
  NC_CHECK(problems.empty(), ValueError, op, ": ", problems,
           " (pass strict = false to load only the keys both sides have)");

  autograd::NoGradGuard no_grad;
  for (const auto& entry : own) {
    auto it = given.find(entry.first);
    if (it != given.end()) Tensor(entry.second).copy_(*it->second);
  }
}

void Module::save(const std::string& path) const { safetensors::save(path, state_dict()); }

void Module::load(const std::string& path, bool strict) { load_state_dict(safetensors::load(path).tensors, strict); }

}  // namespace nn
}  // namespace normcore
