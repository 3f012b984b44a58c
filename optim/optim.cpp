// Optimizers (SGD, Adam, AdamW), learning-rate schedules and clip_grad_norm. Options and
// state dicts are checked here; the per-element updates are the backends' sgd_step and
// adam_step (kernels/optim.h), called on each parameter's
// device. Parameters, gradients and state are updated in place.
#include "normcore/optim.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>

#include "base/op_scope.h"
#include "kernels/optim.h"
#include "normcore/autograd.h"
#include "normcore/ops.h"
#include "runtime/cuda/capture.h"

namespace normcore {
namespace optim {

namespace {

constexpr const char* kGroupPrefix = "param_groups.";
constexpr const char* kStatePrefix = "state.";
constexpr const char* kStepName = "step";

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

Tensor f64_scalar(double value) { return full(Shape{}, value, TensorOptions(DType::F64)); }
Tensor i64_scalar(int64_t value) { return full(Shape{}, value, TensorOptions(DType::I64)); }

// Throws ValueError "<owner>: option <option> must be <rule>, got <value>" unless ok.
void require(bool ok, const char* owner, const char* option, const char* rule, double value) {
  NC_CHECK(ok, ValueError, owner, ": option ", option, " must be ", rule, ", got ", value);
}

// The value of a one-element floating entry of a state dict.
double read_double(const char* owner, const std::string& name, const Tensor& t) {
  NC_CHECK(t.numel() == 1, ShapeError, owner, ".load_state_dict: entry '", name, "' must hold one value, got shape ",
           t.shape());
  NC_CHECK(is_floating(t.dtype()), DTypeError, owner, ".load_state_dict: entry '", name, "' must be floating, got ",
           describe(t));
  return t.item<double>();
}

// The value of a one-element integer entry of a state dict.
int64_t read_count(const char* owner, const std::string& name, const Tensor& t) {
  NC_CHECK(t.numel() == 1, ShapeError, owner, ".load_state_dict: entry '", name, "' must hold one value, got shape ",
           t.shape());
  NC_CHECK(t.dtype() == DType::I64 || t.dtype() == DType::I32, DTypeError, owner, ".load_state_dict: entry '", name,
           "' must be an integer count, got ", describe(t));
  const int64_t count = t.item<int64_t>();
  NC_CHECK(count >= 0, ValueError, owner, ".load_state_dict: entry '", name, "' must be >= 0, got ", count);
  return count;
}

// The bool option stored as 0 or 1.
bool read_flag(const char* owner, const std::map<std::string, double>& values, const char* option) {
  const double v = values.at(option);
  NC_CHECK(v == 0.0 || v == 1.0, ValueError, owner, ": option ", option, " must be 0 or 1, got ", v);
  return v == 1.0;
}

}  // namespace

DType state_dtype(DType param_dtype) {
  NC_CHECK(is_floating(param_dtype), DTypeError, "state_dtype: parameters are floating, got ", dtype_name(param_dtype));
  return param_dtype == DType::F16 || param_dtype == DType::BF16 ? DType::F32 : param_dtype;
}

// ---------------------------------------------------------------- Optimizer

Optimizer::Optimizer(const char* name, std::vector<Tensor> params, double lr)
    : name_(name), params_(std::move(params)), lr_(std::make_shared<LearningRate>(LearningRate{lr, {}})),
      state_(params_.size()) {
  NC_CHECK(!params_.empty(), ValueError, name_, ": got an empty parameter list");
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    NC_CHECK(p.defined(), ValueError, name_, ": parameter ", i, " is undefined");
    NC_CHECK(is_floating(p.dtype()), DTypeError, name_, ": parameter ", i, " must be floating, got ", describe(p));
    NC_CHECK(p.is_contiguous(), ValueError, name_, ": parameter ", i, " (", describe(p), ") must be contiguous");
    for (size_t j = 0; j < i; ++j) {
      NC_CHECK(!p.is_same(params_[j]), ValueError, name_, ": parameter ", i, " is the same tensor as parameter ", j);
    }
  }
}

std::unique_ptr<Optimizer> Optimizer::make_like(std::vector<Tensor>) const {
  NC_CHECK(false, ValueError, name_,
           ": cannot be cut into pieces (make_like): its update is not known to go element by element");
  return nullptr;
}

void Optimizer::zero_grad() {
  for (const Tensor& p : params_) p.zero_grad();
}

void Optimizer::set_lr(double lr) {
  require(lr >= 0.0 && std::isfinite(lr), name_, "lr", ">= 0 and finite", lr);
  for (const auto& [device, t] : lr_->tensors) {
    NC_CHECK(!cuda::capturing(device), CaptureError, name_,
             ".set_lr: cannot change the learning rate inside a "
             "CUDA graph capture on ",
             device, " (the graph reads it from device memory: set it between replays)");
  }
  lr_->value = lr;
  autograd::NoGradGuard no_grad;
  for (auto& entry : lr_->tensors) entry.second.fill_(lr);
}

void Optimizer::step_unless(const Tensor& found_inf) {
  if (!found_inf.defined()) {
    step();
    return;
  }
  NC_CHECK(found_inf.numel() == 1 && is_floating(found_inf.dtype()), ValueError, name_,
           ".step_unless: found_inf must be one floating value, got ", describe(found_inf));
  skip_ = found_inf.to(DType::F64);
  try {
    step();
  } catch (...) {
    skip_ = Tensor();
    throw;
  }
  skip_ = Tensor();
}

Tensor Optimizer::skip_on(Device device) const { return skip_.defined() ? skip_.to(device) : Tensor(); }

const Tensor& Optimizer::lr_on(Device device) {
  for (const auto& entry : lr_->tensors) {
    if (entry.first == device) return entry.second;
  }
  NC_CHECK(!cuda::capturing(device), CaptureError, name_, ".step: the first step on ", device,
           " cannot be captured in a CUDA graph; run one step before the capture");
  lr_->tensors.emplace_back(device, full(Shape{}, lr_->value, TensorOptions(DType::F64, device)));
  return lr_->tensors.back().second;
}

std::unique_ptr<Optimizer> Optimizer::sharing_lr(std::unique_ptr<Optimizer> made) const {
  made->lr_ = lr_;
  return made;
}

void Optimizer::check_state_capturable(size_t index) const {
  const Tensor& p = params_[index];
  NC_CHECK(!cuda::capturing(p.device()), CaptureError, name_, ".step: parameter ", index, " (", describe(p),
           ") has no optimizer state yet; its first step cannot be captured in a CUDA graph (run one step "
           "before the capture)");
}

Tensor Optimizer::checked_grad(size_t index) const {
  const Tensor& p = params_[index];
  Tensor g = p.grad();
  NC_CHECK(p.is_contiguous(), ValueError, name_, ": parameter ", index, " (", describe(p), ") must be contiguous");
  NC_CHECK(g.shape() == p.shape(), ShapeError, name_, ": grad of parameter ", index, " is ", describe(g),
           ", the parameter is ", describe(p));
  NC_CHECK(g.dtype() == p.dtype(), DTypeError, name_, ": grad of parameter ", index, " is ", describe(g),
           ", the parameter is ", describe(p));
  NC_CHECK(g.device() == p.device(), DeviceError, name_, ": grad of parameter ", index, " is ", describe(g),
           ", the parameter is ", describe(p));
  return g.is_contiguous() ? g : g.contiguous();
}

StateDict Optimizer::state_dict() const {
  StateDict out;
  out.emplace_back(std::string(kGroupPrefix) + "lr", f64_scalar(lr_->value));
  for (const auto& [name, value] : hyperparameters()) {
    out.emplace_back(kGroupPrefix + name, f64_scalar(value));
  }
  const std::vector<std::string> names = state_names();
  for (size_t i = 0; i < params_.size(); ++i) {
    for (const std::string& name : names) {
      auto it = state_[i].find(name);
      if (it == state_[i].end()) continue;
      out.emplace_back(kStatePrefix + std::to_string(i) + "." + name, it->second.clone());
    }
  }
  return out;
}

void Optimizer::load_state_dict(const StateDict& state) {
  std::set<std::string> hyper_names{"lr"};
  for (const auto& entry : hyperparameters()) hyper_names.insert(entry.first);
  const std::vector<std::string> names = state_names();
  const std::set<std::string> state_name_set(names.begin(), names.end());

  std::map<std::string, double> hyper;
  std::vector<std::map<std::string, Tensor>> loaded(params_.size());
  std::set<std::string> seen;
  for (const auto& [name, t] : state) {
    NC_CHECK(seen.insert(name).second, ValueError, name_, ".load_state_dict: entry '", name, "' appears twice");
    NC_CHECK(t.defined(), ValueError, name_, ".load_state_dict: entry '", name, "' is undefined");
    if (starts_with(name, kGroupPrefix)) {
      const std::string key = name.substr(std::string(kGroupPrefix).size());
      NC_CHECK(hyper_names.count(key), ValueError, name_, ".load_state_dict: unknown hyperparameter '", name, "'");
      hyper[key] = read_double(name_, name, t);
      continue;
    }
    NC_CHECK(starts_with(name, kStatePrefix), ValueError, name_, ".load_state_dict: unknown entry '", name,
             "' (expected param_groups.<name> or state.<index>.<name>)");
    const std::string rest = name.substr(std::string(kStatePrefix).size());
    const size_t dot = rest.find('.');
    const std::string index_text = rest.substr(0, dot);
    const bool well_formed = dot != std::string::npos && !index_text.empty() && index_text.size() < 19 &&
                             index_text.find_first_not_of("0123456789") == std::string::npos;
    NC_CHECK(well_formed, ValueError, name_, ".load_state_dict: malformed entry '", name,
             "' (expected state.<index>.<name>)");
    const size_t index = static_cast<size_t>(std::strtoull(index_text.c_str(), nullptr, 10));
    NC_CHECK(index < params_.size(), ValueError, name_, ".load_state_dict: entry '", name, "' is for parameter ", index,
             " but the optimizer has ", params_.size());
    const std::string key = rest.substr(dot + 1);
    NC_CHECK(state_name_set.count(key), ValueError, name_, ".load_state_dict: unknown state '", name, "'");
    const Tensor& p = params_[index];
    if (key == kStepName) {
      loaded[index][key] = i64_scalar(read_count(name_, name, t));
      continue;
    }
    NC_CHECK(t.shape() == p.shape(), ShapeError, name_, ".load_state_dict: entry '", name, "' has shape ", t.shape(),
             " but parameter ", index, " has shape ", p.shape());
    NC_CHECK(t.dtype() == state_dtype(p.dtype()), DTypeError, name_, ".load_state_dict: entry '", name, "' is ",
             dtype_name(t.dtype()), " but the state of ", describe(p), " is ", dtype_name(state_dtype(p.dtype())));
    loaded[index][key] = t;
  }
  for (const std::string& key : hyper_names) {
    NC_CHECK(hyper.count(key), ValueError, name_, ".load_state_dict: missing entry '", kGroupPrefix, key, "'");
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (loaded[i].empty()) continue;
    for (const std::string& key : names) {
      NC_CHECK(loaded[i].count(key), ValueError, name_, ".load_state_dict: parameter ", i,
               " has some state but no entry '", kStatePrefix, i, ".", key, "'");
    }
  }
  const double lr = hyper.at("lr");
  require(lr >= 0.0 && std::isfinite(lr), name_, "lr", ">= 0 and finite", lr);
  check_hyperparameters(hyper);

  // Everything checked: adopt it, copying buffers to the parameters' devices.
  set_lr(lr);
  set_hyperparameters(hyper);
  for (size_t i = 0; i < params_.size(); ++i) {
    std::map<std::string, Tensor> copies;
    for (const auto& [key, t] : loaded[i]) {
      if (key == kStepName) {
        copies[key] = t.to(params_[i].device());
      } else {
        const Tensor& p = params_[i];
        Tensor copy = empty(p.shape(), TensorOptions(t.dtype(), p.device()));
        copy.copy_(t);
        copies[key] = copy;
      }
    }
    state_[i] = std::move(copies);
  }
}

// ---------------------------------------------------------------- SGD

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : Optimizer("SGD", std::move(params), options.lr), options_(options) {
  std::map<std::string, double> values{{"lr", options.lr}};
  for (const auto& entry : hyperparameters()) values.insert(entry);
  check_hyperparameters(values);
}

std::unique_ptr<Optimizer> SGD::make_like(std::vector<Tensor> params) const {
  return sharing_lr(std::make_unique<SGD>(std::move(params), options()));
}

SGDOptions SGD::options() const {
  SGDOptions o = options_;
  o.lr = lr_->value;
  return o;
}

std::vector<std::pair<std::string, double>> SGD::hyperparameters() const {
  return {{"momentum", options_.momentum},
          {"dampening", options_.dampening},
          {"weight_decay", options_.weight_decay},
          {"nesterov", options_.nesterov ? 1.0 : 0.0}};
}

void SGD::check_hyperparameters(const std::map<std::string, double>& values) const {
  const double lr = values.at("lr"), momentum = values.at("momentum");
  const double dampening = values.at("dampening"), weight_decay = values.at("weight_decay");
  require(lr >= 0.0 && std::isfinite(lr), name_, "lr", ">= 0 and finite", lr);
  require(momentum >= 0.0 && std::isfinite(momentum), name_, "momentum", ">= 0 and finite", momentum);
  require(dampening >= 0.0 && dampening <= 1.0, name_, "dampening", "in [0, 1]", dampening);
  require(weight_decay >= 0.0 && std::isfinite(weight_decay), name_, "weight_decay", ">= 0 and finite", weight_decay);
  if (read_flag(name_, values, "nesterov")) {
    require(momentum > 0.0, name_, "momentum", "> 0 with nesterov", momentum);
    require(dampening == 0.0, name_, "dampening", "0 with nesterov", dampening);
  }
}

void SGD::set_hyperparameters(const std::map<std::string, double>& values) {
  options_.momentum = values.at("momentum");
  options_.dampening = values.at("dampening");
  options_.weight_decay = values.at("weight_decay");
  options_.nesterov = values.at("nesterov") == 1.0;
}

std::vector<std::string> SGD::state_names() const { return {"momentum_buffer"}; }

void SGD::step() {
  detail::OpScope scope(name_, ".step");
  autograd::NoGradGuard no_grad;
  const bool use_momentum = options_.momentum != 0.0;
  // Every gradient is checked and every missing buffer made before the first update, so a
  // failure (a bad gradient, out of memory) leaves all parameters and all state as they were.
  std::vector<Tensor> grads(params_.size()), new_buffers(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    grads[i] = checked_grad(i);
    if (use_momentum && state_[i].count("momentum_buffer") == 0) {
      check_state_capturable(i);
      new_buffers[i] = empty(p.shape(), TensorOptions(state_dtype(p.dtype()), p.device()));
    }
    lr_on(p.device());
  }
  // A skipped first step must not leave an uninitialized momentum buffer behind: decide
  // it on the host then (never inside a capture, which needs the state made already).
  bool any_new = false;
  for (const Tensor& b : new_buffers) any_new = any_new || b.defined();
  if (any_new && skip_.defined() && skip_.item<double>() != 0.0) return;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!grads[i].defined()) continue;
    const Tensor& p = params_[i];
    const bool first_step = new_buffers[i].defined();
    if (first_step) state_[i]["momentum_buffer"] = new_buffers[i];
    Tensor buf = use_momentum ? state_[i]["momentum_buffer"] : Tensor();
    p.bump_version();  // the update writes the parameter in place
    const kernels::SgdHyper hyper{options_.momentum, options_.dampening, options_.weight_decay, options_.nesterov,
                                  first_step};
    kernels::optim(p.device()).sgd_step(p, grads[i], buf, lr_on(p.device()), hyper, skip_on(p.device()));
  }
}

// ---------------------------------------------------------------- Adam, AdamW

Adam::Adam(std::vector<Tensor> params, AdamOptions options) : Adam("Adam", std::move(params), options, false) {}

Adam::Adam(const char* name, std::vector<Tensor> params, AdamOptions options, bool decoupled)
    : Optimizer(name, std::move(params), options.lr), options_(options), decoupled_(decoupled) {
  std::map<std::string, double> values{{"lr", options.lr}};
  for (const auto& entry : hyperparameters()) values.insert(entry);
  check_hyperparameters(values);
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : Adam("AdamW", std::move(params),
           AdamOptions{options.lr, options.beta1, options.beta2, options.eps, options.weight_decay}, true) {}

std::unique_ptr<Optimizer> Adam::make_like(std::vector<Tensor> params) const {
  const AdamOptions o = options();
  if (decoupled_)
    return sharing_lr(
        std::make_unique<AdamW>(std::move(params), AdamWOptions{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay}));
  return sharing_lr(std::make_unique<Adam>(std::move(params), o));
}

AdamOptions Adam::options() const {
  AdamOptions o = options_;
  o.lr = lr_->value;
  return o;
}

std::vector<std::pair<std::string, double>> Adam::hyperparameters() const {
  return {{"beta1", options_.beta1},
          {"beta2", options_.beta2},
          {"eps", options_.eps},
          {"weight_decay", options_.weight_decay},
          {"decoupled", decoupled_ ? 1.0 : 0.0}};
}

void Adam::check_hyperparameters(const std::map<std::string, double>& values) const {
  const double lr = values.at("lr"), beta1 = values.at("beta1"), beta2 = values.at("beta2");
  const double eps = values.at("eps"), weight_decay = values.at("weight_decay");
  require(lr >= 0.0 && std::isfinite(lr), name_, "lr", ">= 0 and finite", lr);
  require(beta1 >= 0.0 && beta1 < 1.0, name_, "beta1", "in [0, 1)", beta1);
  require(beta2 >= 0.0 && beta2 < 1.0, name_, "beta2", "in [0, 1)", beta2);
  require(eps > 0.0 && std::isfinite(eps), name_, "eps", "> 0 and finite", eps);
  require(weight_decay >= 0.0 && std::isfinite(weight_decay), name_, "weight_decay", ">= 0 and finite", weight_decay);
  const bool decoupled = read_flag(name_, values, "decoupled");
  NC_CHECK(decoupled == decoupled_, ValueError, name_, ": the state has decoupled = ", decoupled, " (",
           decoupled ? "AdamW" : "Adam", "), this optimizer has ", decoupled_);
}

void Adam::set_hyperparameters(const std::map<std::string, double>& values) {
  options_.beta1 = values.at("beta1");
  options_.beta2 = values.at("beta2");
  options_.eps = values.at("eps");
  options_.weight_decay = values.at("weight_decay");
}

std::vector<std::string> Adam::state_names() const { return {kStepName, "exp_avg", "exp_avg_sq"}; }

void Adam::step() {
  detail::OpScope scope(name_, ".step");
  autograd::NoGradGuard no_grad;
  // As in SGD::step: checks and allocations first, then the updates.
  std::vector<Tensor> grads(params_.size());
  std::vector<std::map<std::string, Tensor>> new_state(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    grads[i] = checked_grad(i);
    if (state_[i].empty()) {
      check_state_capturable(i);
      const TensorOptions buffer_options(state_dtype(p.dtype()), p.device());
      new_state[i][kStepName] = zeros(Shape{}, TensorOptions(DType::I64, p.device()));
      new_state[i]["exp_avg"] = zeros(p.shape(), buffer_options);
      new_state[i]["exp_avg_sq"] = zeros(p.shape(), buffer_options);
    }
    lr_on(p.device());
  }
  // One multi-tensor update per device.
  std::vector<std::pair<Device, std::vector<kernels::AdamTensors>>> by_device;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!grads[i].defined()) continue;
    const Tensor& p = params_[i];
    std::map<std::string, Tensor>& state = state_[i];
    if (state.empty()) state = std::move(new_state[i]);
    p.bump_version();  // the update writes the parameter in place
    size_t d = 0;
    while (d < by_device.size() && !(by_device[d].first == p.device())) ++d;
    if (d == by_device.size()) by_device.emplace_back(p.device(), std::vector<kernels::AdamTensors>{});
    by_device[d].second.push_back({p, grads[i], state["exp_avg"], state["exp_avg_sq"], state[kStepName]});
  }
  const kernels::AdamHyper hyper{options_.beta1, options_.beta2, options_.eps, options_.weight_decay, decoupled_};
  for (const auto& [device, tensors] : by_device) {
    kernels::optim(device).adam_step(tensors, lr_on(device), hyper, skip_on(device));
  }
}

// ---------------------------------------------------------------- schedules

LRSchedule::LRSchedule(const char* name, Optimizer& optimizer)
    : name_(name), optimizer_(optimizer), base_lr_(optimizer.lr()) {}

void LRSchedule::start() { optimizer_.set_lr(lr_at(0)); }

void LRSchedule::step() {
  ++step_;
  optimizer_.set_lr(lr_at(step_));
}

StateDict LRSchedule::state_dict() const {
  return {{"schedule.step", i64_scalar(step_)}, {"schedule.base_lr", f64_scalar(base_lr_)}};
}

void LRSchedule::load_state_dict(const StateDict& state) {
  std::map<std::string, Tensor> entries;
  for (const auto& [name, t] : state) {
    NC_CHECK(name == "schedule.step" || name == "schedule.base_lr", ValueError, name_,
             ".load_state_dict: unknown entry '", name, "' (expected schedule.step and schedule.base_lr)");
    NC_CHECK(t.defined(), ValueError, name_, ".load_state_dict: entry '", name, "' is undefined");
    NC_CHECK(entries.emplace(name, t).second, ValueError, name_, ".load_state_dict: entry '", name, "' appears twice");
  }
  for (const char* name : {"schedule.step", "schedule.base_lr"}) {
    NC_CHECK(entries.count(name), ValueError, name_, ".load_state_dict: missing entry '", name, "'");
  }
  const int64_t step = read_count(name_, "schedule.step", entries.at("schedule.step"));
  const double base_lr = read_double(name_, "schedule.base_lr", entries.at("schedule.base_lr"));
  require(base_lr >= 0.0 && std::isfinite(base_lr), name_, "base_lr", ">= 0 and finite", base_lr);
  step_ = step;
  base_lr_ = base_lr;
  optimizer_.set_lr(lr_at(step_));
}

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRSchedule("StepLR", optimizer), step_size_(step_size), gamma_(gamma) {
  require(step_size >= 1, name_, "step_size", ">= 1", static_cast<double>(step_size));
  require(gamma >= 0.0 && std::isfinite(gamma), name_, "gamma", ">= 0 and finite", gamma);
  start();
}

double StepLR::lr_at(int64_t s) const { return base_lr_ * std::pow(gamma_, static_cast<double>(s / step_size_)); }

CosineLR::CosineLR(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps, double min_lr)
    : LRSchedule("CosineLR", optimizer), warmup_steps_(warmup_steps), total_steps_(total_steps), min_lr_(min_lr) {
  require(warmup_steps >= 0, name_, "warmup_steps", ">= 0", static_cast<double>(warmup_steps));
  require(total_steps > warmup_steps, name_, "total_steps", "> warmup_steps", static_cast<double>(total_steps));
  require(min_lr >= 0.0 && std::isfinite(min_lr), name_, "min_lr", ">= 0 and finite", min_lr);
  start();
}

double CosineLR::lr_at(int64_t s) const {
  if (s < warmup_steps_) return base_lr_ * static_cast<double>(s) / static_cast<double>(warmup_steps_);
  if (s > total_steps_) return min_lr_;
  const double progress = static_cast<double>(s - warmup_steps_) / static_cast<double>(total_steps_ - warmup_steps_);
  const double pi = 3.14159265358979323846;
  return min_lr_ + (base_lr_ - min_lr_) * 0.5 * (1.0 + std::cos(pi * progress));
}

// ---------------------------------------------------------------- clip_grad_norm

namespace {

// The defined gradients of params, checked.
std::vector<Tensor> checked_grads(const char* op, const std::vector<Tensor>& params, double max_norm,
                                  double norm_type) {
  NC_CHECK(norm_type > 0.0, ValueError, op, ": norm_type must be > 0 (or infinity), got ", norm_type);
  NC_CHECK(max_norm >= 0.0, ValueError, op, ": max_norm must be >= 0, got ", max_norm);
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    NC_CHECK(params[i].defined(), ValueError, op, ": parameter ", i, " is undefined");
    Tensor g = params[i].grad();
    if (!g.defined()) continue;
    NC_CHECK(is_floating(g.dtype()), DTypeError, op, ": grad of parameter ", i, " must be floating, got ", describe(g));
    grads.push_back(g);
  }
  return grads;
}

// Whether the backend's fused clipping applies: the 2-norm of contiguous gradients on one
// device, not too many of them.
bool fusable(const std::vector<Tensor>& grads, double norm_type) {
  if (norm_type != 2.0 || grads.empty() || grads.size() > kernels::OptimKernels::kMaxClipTensors) return false;
  for (const Tensor& g : grads) {
    if (!(g.device() == grads[0].device()) || !g.is_contiguous()) return false;
  }
  return true;
}

// The fused clipping in place; returns the total as a 0-dim f64 tensor on the device.
Tensor clip_fused(const std::vector<Tensor>& grads, double max_norm) {
  Tensor total = empty(Shape{}, TensorOptions(DType::F64, grads[0].device()));
  for (const Tensor& g : grads) g.bump_version();  // scaled in place
  kernels::optim(grads[0].device()).clip_grad_norm(grads, max_norm, total);
  return total;
}

// The total norm_type-norm of grads (not empty) as a 0-dim f64 tensor on the first
// gradient's device: per-tensor norms in the gradients' dtypes, which stay on their device
// until one copy per device.
Tensor total_grad_norm(const std::vector<Tensor>& grads, double norm_type) {
  std::vector<Device> devices;
  std::vector<std::vector<Tensor>> norms_by_device;
  for (const Tensor& g : grads) {
    size_t d = 0;
    while (d < devices.size() && !(devices[d] == g.device())) ++d;
    if (d == devices.size()) {
      devices.push_back(g.device());
      norms_by_device.emplace_back();
    }
    norms_by_device[d].push_back(norm(g, norm_type).to(DType::F64));
  }
  std::vector<Tensor> per_device;
  for (const std::vector<Tensor>& norms : norms_by_device) per_device.push_back(stack(norms).to(devices[0]));
  return norm(cat(per_device), norm_type);
}

}  // namespace

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  const std::vector<Tensor> grads = checked_grads("clip_grad_norm", params, max_norm, norm_type);
  if (grads.empty()) return 0.0;
  autograd::NoGradGuard no_grad;
  if (fusable(grads, norm_type)) return clip_fused(grads, max_norm).item<double>();
  const double total = total_grad_norm(grads, norm_type).item<double>();
  if (total > max_norm) {
    const double scale = max_norm / (total + 1e-6);
    for (const Tensor& g : grads) {
      Tensor target = g;
      target.copy_(mul(g, scale));
    }
  }
  return total;
}

Tensor clip_grad_norm_async(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  const std::vector<Tensor> grads = checked_grads("clip_grad_norm_async", params, max_norm, norm_type);
  if (grads.empty()) return full(Shape{}, 0.0, TensorOptions(DType::F64));
  autograd::NoGradGuard no_grad;
  if (fusable(grads, norm_type)) return clip_fused(grads, max_norm);
  const Tensor total = total_grad_norm(grads, norm_type);
  // The factor clip_grad_norm would use, or 1 (also for a NaN total): x * 1 is x, so the
  // gradients get the same bits as there.
  const Tensor one = full(Shape{}, 1.0, TensorOptions(DType::F64, total.device()));
  const Tensor factor =
      where(gt(total, max_norm),
            div(full(Shape{}, max_norm, TensorOptions(DType::F64, total.device())), add(total, 1e-6)), one);
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor g = params[i].grad();
    if (!g.defined()) continue;
    params[i].set_grad(mul(g, factor.to(g.device())));
  }
  return total;
}

// ---------------------------------------------------------------- GradScaler

GradScaler::GradScaler(GradScalerOptions options) : options_(options), init_scale_(options.init_scale) {
  const char* name = "GradScaler";
  require(options.init_scale > 0.0 && std::isfinite(options.init_scale), name, "init_scale", "> 0 and finite",
          options.init_scale);
  require(options.growth_factor > 1.0 && std::isfinite(options.growth_factor), name, "growth_factor", "> 1 and finite",
          options.growth_factor);
  require(options.backoff_factor > 0.0 && options.backoff_factor < 1.0, name, "backoff_factor", "in (0, 1)",
          options.backoff_factor);
  require(options.growth_interval >= 1, name, "growth_interval", ">= 1", static_cast<double>(options.growth_interval));
}

void GradScaler::place_state(Device device) {
  if (scale_.defined() && scale_.device() == device) return;
  autograd::NoGradGuard no_grad;
  const TensorOptions options(DType::F64, device);
  if (scale_.defined()) {  // moves with the gradients
    scale_ = scale_.to(device);
    tracker_ = tracker_.to(device);
    skipped_ = skipped_.to(device);
    return;
  }
  NC_CHECK(!cuda::capturing(device), CaptureError, "GradScaler: its first use on ", device,
           " cannot be captured in a CUDA graph; run one step before the capture");
  scale_ = full(Shape{}, init_scale_, options);
  tracker_ = full(Shape{}, static_cast<double>(init_tracker_), options);
  skipped_ = zeros(Shape{}, options);
}

Tensor GradScaler::scale(const Tensor& loss) {
  NC_CHECK(loss.defined(), ValueError, "GradScaler::scale: the loss is an undefined tensor");
  NC_CHECK(is_floating(loss.dtype()), DTypeError, "GradScaler::scale: the loss must be floating, got ", describe(loss));
  place_state(loss.device());
  // The scale in the loss's floating category (a 0-dim f64 would promote a 0-dim loss).
  Tensor factor;
  {
    autograd::NoGradGuard no_grad;
    factor = scale_.to(loss.dtype() == DType::F64 ? DType::F64 : DType::F32);
  }
  return mul(loss, factor);
}

void GradScaler::unscale_async(const std::vector<Tensor>& params) {
  NC_CHECK(!unscaled_, ValueError,
           "GradScaler::unscale: already called for this step (call update() after the optimizer step)");
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    NC_CHECK(params[i].defined(), ValueError, "GradScaler::unscale: parameter ", i, " is undefined");
    const Tensor g = params[i].grad();
    if (!g.defined()) continue;
    NC_CHECK(is_floating(g.dtype()), DTypeError, "GradScaler::unscale: grad of parameter ", i,
             " must be floating, got ", describe(g));
    grads.push_back(g);
  }
  place_state(grads.empty() ? (scale_.defined() ? scale_.device() : Device::cpu()) : grads[0].device());
  const Device device = scale_.device();
  const Tensor inverse = div(ones(Shape{}, TensorOptions(DType::F64, device)), scale_);
  // Per tensor, the sum of its unscaled gradient: finite exactly when every element is
  // (an inf or a NaN carries through the sum); s - s is 0 for a finite s, NaN otherwise.
  std::vector<Tensor> sums;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor g = params[i].grad();
    if (!g.defined()) continue;
    const Tensor unscaled = mul(g, inverse.to(g.device()));
    params[i].set_grad(unscaled);
    sums.push_back(sum(unscaled).to(DType::F32).to(device));
  }
  if (sums.empty()) {
    found_ = zeros(Shape{}, TensorOptions(DType::F64, device));
  } else {
    const Tensor s = stack(sums);
    found_ = any(ne(sub(s, s), 0.0)).to(DType::F64);
  }
  unscaled_ = true;
}

bool GradScaler::unscale(const std::vector<Tensor>& params) {
  unscale_async(params);
  return found_.item<double>() == 0.0;
}

const Tensor& GradScaler::found_inf() const {
  NC_CHECK(unscaled_, ValueError, "GradScaler::found_inf: unscale() has not been called for this step");
  return found_;
}

void GradScaler::step(Optimizer& optimizer) {
  NC_CHECK(unscaled_, ValueError, "GradScaler::step: unscale() has not been called for this step");
  optimizer.step_unless(found_);
}

void GradScaler::update() {
  NC_CHECK(unscaled_, ValueError, "GradScaler::update: unscale() has not been called since the last update");
  autograd::NoGradGuard no_grad;
  const Tensor found = gt(found_, 0.5);
  const Tensor tracker = where(found, 0.0, add(tracker_, 1.0));
  const Tensor grow = eq(tracker, static_cast<double>(options_.growth_interval));
  const Tensor grown = mul(scale_, options_.growth_factor);
  // An f64 scale cannot overflow in any realistic run; stay finite regardless.
  const Tensor next =
      where(found, mul(scale_, options_.backoff_factor),
            where(grow, where(lt(grown, std::numeric_limits<double>::infinity()), grown, scale_), scale_));
  // In place: a captured step keeps updating the same tensors.
  scale_.copy_(next);
  tracker_.copy_(where(grow, 0.0, tracker));
  skipped_.copy_(add(skipped_, found_));
  unscaled_ = false;
}

double GradScaler::get_scale() const { return scale_.defined() ? scale_.item<double>() : init_scale_; }

int64_t GradScaler::growth_tracker() const {
  return tracker_.defined() ? static_cast<int64_t>(tracker_.item<double>()) : init_tracker_;
}

int64_t GradScaler::skipped_steps() const {
  return skipped_.defined() ? static_cast<int64_t>(skipped_.item<double>()) : 0;
}

StateDict GradScaler::state_dict() const {
  return {{"scale", f64_scalar(get_scale())}, {"growth_tracker", i64_scalar(growth_tracker())}};
}

void GradScaler::load_state_dict(const StateDict& state) {
  const char* name = "GradScaler";
  std::map<std::string, Tensor> entries;
  for (const auto& [key, t] : state) {
    NC_CHECK(key == "scale" || key == "growth_tracker", ValueError, name, ".load_state_dict: unknown entry '", key,
             "' (expected scale and growth_tracker)");
    NC_CHECK(t.defined(), ValueError, name, ".load_state_dict: entry '", key, "' is undefined");
    NC_CHECK(entries.emplace(key, t).second, ValueError, name, ".load_state_dict: entry '", key, "' appears twice");
  }
  for (const char* key : {"scale", "growth_tracker"}) {
    NC_CHECK(entries.count(key), ValueError, name, ".load_state_dict: missing entry '", key, "'");
  }
  const double scale = read_double(name, "scale", entries.at("scale"));
  require(scale > 0.0 && std::isfinite(scale), name, "scale", "> 0 and finite", scale);
  const int64_t tracker = read_count(name, "growth_tracker", entries.at("growth_tracker"));
  require(tracker < options_.growth_interval, name, "growth_tracker", "< growth_interval",
          static_cast<double>(tracker));
  init_scale_ = scale;
  init_tracker_ = tracker;
  if (scale_.defined()) {
    autograd::NoGradGuard no_grad;
    scale_.fill_(scale);
    tracker_.fill_(static_cast<double>(tracker));
  }
  unscaled_ = false;
}

}  // namespace optim
}  // namespace normcore
