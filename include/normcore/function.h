// Differentiable functions defined outside normcore, with their own forward and backward
// (PyTorch's torch.autograd.Function). The forward is any code: normcore ops, a loop over
// data_ptr() on the CPU, or a CUDA kernel launched on cuda::current_stream(device); it runs
// with recording off. The backward maps the gradients of the outputs to gradients of the
// inputs, and is itself any code. gradcheck() checks the pair like a built-in op.
//
//   struct Cube {
//     static std::vector<Tensor> forward(autograd::FunctionContext& ctx, const std::vector<Tensor>& in) {
//       ctx.save_for_backward({in[0]});
//       return {mul(mul(in[0], in[0]), in[0])};
//     }
//     static std::vector<Tensor> backward(autograd::FunctionContext& ctx, const std::vector<Tensor>& grad) {
//       const Tensor x = ctx.saved()[0];
//       return {mul(grad[0], mul(mul(x, x), 3.0))};
//     }
//   };
//   Tensor y = autograd::Function<Cube>::apply({x})[0];
#pragma once

#include <any>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "normcore/autograd.h"
#include "normcore/tensor.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {
namespace autograd {

// What a function's forward leaves for its backward: one per call, given to both.
class FunctionContext {
 public:
  FunctionContext(std::string name, std::vector<bool> needs_input_grad);

  // Tensors the backward will read (inputs or outputs), kept without their history. As
  // with built-in ops, writing into one's storage in place after the forward makes saved()
  // throw Error naming the function and the tensor, instead of a wrong gradient.
  void save_for_backward(const std::vector<Tensor>& tensors);
  std::vector<Tensor> saved() const;

  // Outputs that carry no gradient (indices, masks, counts): they do not require grad,
  // and the backward receives an undefined gradient for them. Integer and bool outputs
  // are never differentiable.
  void mark_non_differentiable(const std::vector<Tensor>& outputs);
  bool is_non_differentiable(const Tensor& output) const;

  // Whether input i requires grad, so that the backward may skip the others (their
  // gradients may be undefined Tensors).
  bool needs_input_grad(size_t i) const;

  // By default an output no gradient reached is given to the backward as zeros of its
  // shape; false gives it undefined instead (and the backward must cope).
  void set_materialize_grads(bool materialize) { materialize_grads_ = materialize; }
  bool materialize_grads() const { return materialize_grads_; }

  const std::string& name() const { return name_; }

  // Anything else the backward needs (sizes, flags, scalars), by name.
  std::map<std::string, std::any> saved_data;

 private:
  std::string name_;
  std::vector<bool> needs_input_grad_;
  std::vector<std::pair<Tensor, uint64_t>> saved_;  // detached tensor, storage version when saved
  std::vector<const void*> non_differentiable_;     // the TensorImpls marked
  bool materialize_grads_ = true;
};

using FunctionForward = std::function<std::vector<Tensor>(FunctionContext& ctx, const std::vector<Tensor>& inputs)>;
using FunctionBackward =
    std::function<std::vector<Tensor>(FunctionContext& ctx, const std::vector<Tensor>& grad_outputs)>;

// Runs forward on inputs with recording off and, when recording is on and an input requires
// grad, records one node for all of its differentiable outputs: backward gets one gradient
// per output and returns one per input (undefined where an input needs none), each of the
// input's shape, dtype and device. Undefined inputs are allowed (optional tensors). Outputs
// must be defined; one that is an input, or has history, is returned as a new handle on
// the same data. Errors name the function: ValueError for an empty forward result, an
// undefined output or a backward returning the wrong number of gradients; ShapeError,
// DTypeError, DeviceError for a gradient that does not match its input.
std::vector<Tensor> apply_function(const std::string& name, const std::vector<Tensor>& inputs,
                                   const FunctionForward& forward, FunctionBackward backward);

// The same with static Op::forward(ctx, inputs, args...) and Op::backward(ctx, grads); the
// node is named Op::name when Op has one, else "custom function". Extra arguments (not
// tensors) go to forward.
template <class Op>
struct Function {
  template <class... Args>
  static std::vector<Tensor> apply(const std::vector<Tensor>& inputs, Args&&... args) {
    return apply_function(
        name(), inputs,
        [&](FunctionContext& ctx, const std::vector<Tensor>& in) { return Op::forward(ctx, in, args...); },
        [](FunctionContext& ctx, const std::vector<Tensor>& grads) { return Op::backward(ctx, grads); });
  }

 private:
  template <class T>
  static auto name_of(int) -> decltype(std::string(T::name)) {
    return std::string(T::name);
  }
  template <class T>
  static std::string name_of(long) {
    return "custom function";
  }
  static std::string name() { return name_of<Op>(0); }
};

}  // namespace autograd
}  // namespace normcore

#pragma GCC visibility pop
