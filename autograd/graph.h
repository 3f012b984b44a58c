// The recording side of autograd, used by the op implementations in core/: a Node per
// recorded op, edges to the inputs' nodes (or leaves), and record(), which attaches a node
// to an op's result. Backward functions receive the result's gradient and return one
// gradient per input (undefined where an input needs none); the tensors they keep are
// SavedTensors (saved()): detached, or the graph would keep itself alive, and checked, so
// that a gradient never uses values an in-place op wrote after the forward.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "normcore/autograd.h"
#include "normcore/tensor.h"

namespace normcore {

struct Edge {
  std::shared_ptr<Node> node;          // the input was produced by a recorded op
  std::shared_ptr<AutogradMeta> leaf;  // or it is a leaf that requires grad
  int output_nr = 0;                   // which of node's outputs the input is
  bool active() const { return node || leaf; }
};

using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad)>;
// The backward of a node of several outputs (a custom function's): one gradient per
// output, undefined where none flowed.
using MultiBackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grads)>;

// A gradient hook on one output of a node.
struct NodeHook {
  int64_t id = 0;
  int output_nr = 0;
  GradHook hook;
};

struct Node {
  const char* name = "";
  std::vector<Edge> next;  // one per input of the op
  BackwardFn backward;     // empty once released
  // Instead of backward, for a node of num_outputs > 1.
  MultiBackwardFn backward_multi;
  int num_outputs = 1;
  std::string owned_name;  // what name points to when it is not a literal (custom functions)
  bool released = false;
  std::vector<NodeHook> grad_hooks;  // on the gradients of the op's results
  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  // Releases the nodes only this one holds without recursion, so that dropping a chain of
  // a million nodes needs no more stack than dropping one.
  ~Node();
};

namespace autograd {

// True when recording is on and some tensor requires grad.
template <class... T>
bool needs_grad(const T&... tensors) {
  return is_grad_enabled() && ((tensors.defined() && tensors.requires_grad()) || ...);
}

// The edge from a node to its input in: to in's node (and output) when an op made it, to
// its autograd state when it is a leaf that requires grad, inactive otherwise.
Edge edge_to(const Tensor& in);

// Anomaly mode's check of a result just recorded (nothing when anomaly mode is off).
void check_anomaly(const char* name, const Tensor& out, const std::vector<Tensor>& inputs);

// Attaches a node named name to out (which must be a fresh result, not an input) when
// recording is on and some input requires grad.
void record(const char* name, const Tensor& out, const std::vector<Tensor>& inputs, BackwardFn fn);

// A tensor a backward function keeps: the same data without history, and the version of
// its storage when it was saved. get() returns it, and throws Error (naming the op being
// differentiated, the tensor and both versions) when an in-place op has written to the
// storage since: the gradient would silently use the new values.
// t, saved at storage version `version`, while its storage is still at that version;
// otherwise Error naming the current op: the gradient would use values written after the
// forward. SavedTensor and custom functions' saved tensors check through it.
const Tensor& check_saved(const Tensor& t, uint64_t version);

class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t)
      : tensor_(t.defined() ? t.detach() : t), version_(t.defined() ? t.version() : 0) {}
  const Tensor& get() const;
  bool defined() const { return tensor_.defined(); }

 private:
  Tensor tensor_;
  uint64_t version_ = 0;
};

inline SavedTensor saved(const Tensor& t) { return SavedTensor(t); }

// Counts the backward() calls started on this thread: ready hooks that keep state across one
// backward (DistributedDataParallel) tell a new backward from the rest of one that threw.
uint64_t backward_count();

// Sums grad over the dims that broadcasting added or expanded, giving shape.
Tensor sum_to(const Tensor& grad, const Shape& shape);

}  // namespace autograd
}  // namespace normcore
