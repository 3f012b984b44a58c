// Custom differentiable functions (normcore/function.h): the context a forward leaves for
// its backward, and apply_function, which runs the forward without recording and records
// one node of several outputs whose backward calls the user's and checks what it returns.
#include <algorithm>
#include <memory>

#include "autograd/graph.h"
#include "normcore/function.h"

namespace normcore {
namespace autograd {

namespace {

// What the backward's checks and zero gradients need to know of a tensor.
struct Meta {
  bool defined = false;
  Shape shape;
  DType dtype = DType::F32;
  Device device = Device::cpu();
};

Meta meta_of(const Tensor& t) {
  if (!t.defined()) return {};
  return {true, t.shape(), t.dtype(), t.device()};
}

std::string describe_meta(const Meta& m) {
  return m.defined ? detail::cat_str(dtype_name(m.dtype), " ", shape_str(m.shape), " ", m.device.str()) : "undefined";
}

// The gradient backward returned for input i, checked against the input.
void check_gradient(const std::string& name, size_t i, const Tensor& g, const Meta& input) {
  NC_CHECK(g.shape() == input.shape, ShapeError, name, " backward: the gradient of input ", i, " is ", describe(g),
           " but the input is ", describe_meta(input));
  NC_CHECK(g.dtype() == input.dtype, DTypeError, name, " backward: the gradient of input ", i, " is ", describe(g),
           " but the input is ", describe_meta(input));
  NC_CHECK(g.device() == input.device, DeviceError, name, " backward: the gradient of input ", i, " is ", describe(g),
           " but the input is ", describe_meta(input));
}

}  // namespace

FunctionContext::FunctionContext(std::string name, std::vector<bool> needs_input_grad)
    : name_(std::move(name)), needs_input_grad_(std::move(needs_input_grad)) {}

void FunctionContext::save_for_backward(const std::vector<Tensor>& tensors) {
  saved_.clear();
  for (const Tensor& t : tensors) saved_.emplace_back(t.defined() ? t.detach() : t, t.defined() ? t.version() : 0);
}

std::vector<Tensor> FunctionContext::saved() const {
  std::vector<Tensor> out;
  out.reserve(saved_.size());
  // In a backward the current op is "<name> backward", which the error names.
  for (const auto& [tensor, version] : saved_) out.push_back(check_saved(tensor, version));
  return out;
}

void FunctionContext::mark_non_differentiable(const std::vector<Tensor>& outputs) {
  for (const Tensor& t : outputs) {
    if (t.defined()) non_differentiable_.push_back(&t.impl());
  }
}

bool FunctionContext::is_non_differentiable(const Tensor& output) const {
  return output.defined() &&
         std::find(non_differentiable_.begin(), non_differentiable_.end(), &output.impl()) != non_differentiable_.end();
}

bool FunctionContext::needs_input_grad(size_t i) const {
  NC_CHECK(i < needs_input_grad_.size(), IndexError, name_, ": needs_input_grad(", i, ") of ", needs_input_grad_.size(),
           " inputs");
  return needs_input_grad_[i];
}

std::vector<Tensor> apply_function(const std::string& name, const std::vector<Tensor>& inputs,
                                   const FunctionForward& forward, FunctionBackward backward) {
  NC_CHECK(forward != nullptr && backward != nullptr, ValueError, name, ": forward and backward must both be given");
  const bool record = is_grad_enabled() && std::any_of(inputs.begin(), inputs.end(), [](const Tensor& t) {
                        return t.defined() && t.requires_grad();
                      });
  std::vector<bool> needs(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) needs[i] = record && inputs[i].defined() && inputs[i].requires_grad();
  auto ctx = std::make_shared<FunctionContext>(name, needs);

  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;
    outputs = forward(*ctx, inputs);
  }
  NC_CHECK(!outputs.empty(), ValueError, name, ": forward returned no tensor");
  std::vector<bool> differentiable(outputs.size());
  bool any_differentiable = false;
  for (size_t k = 0; k < outputs.size(); ++k) {
    Tensor& out = outputs[k];
    NC_CHECK(out.defined(), ValueError, name, ": forward's output ", k, " is an undefined tensor");
    differentiable[k] = is_floating(out.dtype()) && !ctx->is_non_differentiable(out);
    // A new handle for an output that is an input or has history, so that recording on it
    // changes nothing the caller already holds.
    const bool is_input =
        std::any_of(inputs.begin(), inputs.end(), [&](const Tensor& in) { return in.defined() && in.is_same(out); });
    if (is_input || out.impl().autograd) out = out.detach();
    any_differentiable = any_differentiable || differentiable[k];
  }
  if (!record || !any_differentiable) return outputs;

  auto node = std::make_shared<Node>();
  node->owned_name = name;
  node->name = node->owned_name.c_str();
  node->num_outputs = static_cast<int>(outputs.size());
  std::vector<Meta> input_meta, output_meta;
  for (const Tensor& in : inputs) {
    node->next.push_back(edge_to(in));
    input_meta.push_back(meta_of(in));
  }
  for (const Tensor& out : outputs) output_meta.push_back(meta_of(out));
  MultiBackwardFn backward_all = [ctx, backward = std::move(backward), differentiable, input_meta,
                                  output_meta](const std::vector<Tensor>& grads) {
    std::vector<Tensor> given(grads.size());
    for (size_t k = 0; k < grads.size(); ++k) {
      if (!differentiable[k]) continue;
      given[k] = grads[k];
      if (!given[k].defined() && ctx->materialize_grads()) {
        const Meta& m = output_meta[k];
        given[k] = zeros(m.shape, TensorOptions{m.dtype, m.device});
      }
    }
    std::vector<Tensor> result = backward(*ctx, given);
    NC_CHECK(result.size() == input_meta.size(), ValueError, ctx->name(), " backward: returned ", result.size(),
             " gradients for ", input_meta.size(), " inputs (one per input, undefined where none is needed)");
    for (size_t i = 0; i < result.size(); ++i) {
      if (!ctx->needs_input_grad(i)) {
        result[i] = Tensor();
        continue;
      }
      if (result[i].defined()) check_gradient(ctx->name(), i, result[i], input_meta[i]);
    }
    return result;
  };
  // A node of one output takes its gradient as every built-in op's does.
  if (outputs.size() == 1) node->backward = [backward_all](const Tensor& grad) { return backward_all({grad}); };
  else node->backward_multi = std::move(backward_all);
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!differentiable[k]) continue;
    check_anomaly(node->name, outputs[k], inputs);
    auto& meta = outputs[k].impl().autograd;
    if (!meta) meta = std::make_shared<AutogradMeta>();
    meta->requires_grad = true;
    meta->grad_fn = node;
    meta->output_nr = static_cast<int>(k);
  }
  return outputs;
}

}  // namespace autograd
}  // namespace normcore
