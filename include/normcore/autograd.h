// Reverse-mode automatic differentiation. Differentiable ops record, on their result, a
// node that maps the result's gradient to its inputs' gradients; Tensor::backward() runs
// the nodes in reverse topological order and accumulates (+=) into leaves' grad().
// Backward formulas run with recording off, so there are no gradients of gradients.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "normcore/tensor.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {

struct Node;

// A gradient hook (autograd::register_hook): returns the gradient to use instead, or an
// undefined Tensor to keep the one it was given.
using GradHook = std::function<Tensor(const Tensor& grad)>;

// Per-tensor autograd state, created on first use.
struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;                                       // null for leaves
  std::vector<std::pair<int64_t, std::function<void()>>> ready_hooks;  // see add_grad_ready_hook
  std::vector<std::pair<int64_t, GradHook>> grad_hooks;                // a leaf's; see register_hook
  int output_nr = 0;  // which output of grad_fn this tensor is (custom functions have several)
};

// What registering a hook (autograd::register_hook, Module::register_forward_hook) returns.
// remove() unregisters the hook; calling it again, or after the tensor or module is gone,
// does nothing. Dropping the handle leaves the hook registered.
class HookHandle {
 public:
  HookHandle() = default;
  explicit HookHandle(std::function<void()> remover) : remover_(std::move(remover)) {}
  void remove();
  // Whether remove() has yet to be called on a registered hook.
  bool active() const { return remover_ != nullptr; }

 private:
  std::function<void()> remover_;
};

namespace autograd {

// Whether ops record for backward in this thread (on by default).
bool is_grad_enabled();
void set_grad_enabled(bool enabled);

// Turns recording off in this thread for its lifetime (inference, optimizer updates).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Inference mode (per thread): what an application serving a trained model runs under.
// Ops record nothing for backward, so no node, saved tensor or gradient state is made for
// their results even when their inputs (parameters) require grad, and backward() is a
// ValueError while it is on; set_grad_enabled(true) inside the guard is undone when it
// ends. PyTorch's inference mode also skips version counting and view tracking: here a
// version bump is one relaxed atomic add and views keep no autograd links, so recording off
// is the whole of it. models::Classifier, TextGenerator and the C API run under it.
bool is_inference_mode();

class InferenceModeGuard {
 public:
  explicit InferenceModeGuard(bool enabled = true);
  ~InferenceModeGuard();
  InferenceModeGuard(const InferenceModeGuard&) = delete;
  InferenceModeGuard& operator=(const InferenceModeGuard&) = delete;

 private:
  bool previous_grad_;
  bool previous_mode_;
};

// Anomaly mode (off by default; per thread): every op that records for backward checks its
// result, and backward() every gradient a node returns, for NaN and infinity, and throws
// ValueError naming the op (and whether it produced the value or received it from an
// input). Each check reads the whole tensor and waits for it (a device sync on CUDA): a
// tool for finding where a NaN comes from, not for every training run.
bool is_anomaly_enabled();
void set_anomaly_enabled(bool enabled);

// Sets anomaly mode in this thread for its lifetime.
class AnomalyModeGuard {
 public:
  explicit AnomalyModeGuard(bool enabled = true);
  ~AnomalyModeGuard();
  AnomalyModeGuard(const AnomalyModeGuard&) = delete;
  AnomalyModeGuard& operator=(const AnomalyModeGuard&) = delete;

 private:
  bool previous_;
};

// Runs hook once in every backward() that reaches leaf (a tensor that requires grad and was
// made by no recorded op), on the thread running backward, as soon as leaf's gradient for
// that backward is complete: every path from the root into leaf has been processed and its
// gradient added to leaf.grad() (which stays undefined if none carried one). This is where
// data-parallel training starts reducing a gradient while backward goes on (PyTorch's
// register_post_accumulate_grad_hook). Returns an id for remove_grad_ready_hook. The hook
// must not keep leaf alive (the tensor would own itself): capture an index or a pointer.
// ValueError for a tensor that is not a leaf requiring grad.
int64_t add_grad_ready_hook(const Tensor& leaf, std::function<void()> hook);
void remove_grad_ready_hook(const Tensor& leaf, int64_t id);

// Runs hook on t's gradient in every backward() that reaches t, before the gradient goes on
// (PyTorch's Tensor.register_hook). For a tensor made by a recorded op: the sum of all that
// flows into it, before its op's backward uses it. For a leaf: the sum this backward gives
// it, before it is added to grad() and before its ready hooks. The hook returns a tensor
// of the gradient's shape, dtype and device to use instead, or an undefined Tensor to keep
// it; hooks run in the order registered, each given the previous one's result, with
// recording off. A backward that gives t no gradient runs none. ValueError for a tensor
// that does not require grad; a returned tensor that does not match is a ShapeError,
// DTypeError or DeviceError naming both. Like a ready hook, the hook must not keep t alive.
HookHandle register_hook(const Tensor& t, GradHook hook);

// Queues fn to run when the backward() running on this thread has processed every node and
// run every hook (PyTorch's queue_callback), in the order queued; a callback may queue
// another. ValueError outside a backward.
void queue_backward_callback(std::function<void()> fn);

}  // namespace autograd

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
};

// Compares the gradients backward() computes for fn at inputs with central differences,
// for every input that requires grad. Inputs must be f64 (so that the differences are
// accurate). fn's output is reduced against a fixed random weighting of the same shape, so
// one backward pass checks all outputs. Returns true when every element agrees within
// atol + rtol * |numerical|; otherwise false, with the first disagreement in *report.
bool gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs,
               GradcheckOptions options = {}, std::string* report = nullptr);

}  // namespace normcore

#pragma GCC visibility pop
