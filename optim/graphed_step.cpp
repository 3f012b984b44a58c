// GraphedStep: warm-up steps run directly, then one capture into a cuda::Graph on static
// input buffers, then replays (normcore/graphed_step.h).
#include "normcore/graphed_step.h"

#include <utility>

#include "normcore/autograd.h"
#include "normcore/cuda.h"
#include "normcore/error.h"

namespace normcore {

struct GraphedStep::GraphHolder {
  cuda::Graph graph;
};

GraphedStep::GraphedStep(Step step, bool enabled, int64_t warmup)
    : step_(std::move(step)), enabled_(enabled), warmup_(warmup) {
  NC_CHECK(step_ != nullptr, ValueError, "GraphedStep: the step function is empty");
  NC_CHECK(warmup >= 1, ValueError,
           "GraphedStep: warmup must be >= 1 (the optimizer state is made by an "
           "uncaptured step), got ",
           warmup);
}

GraphedStep::~GraphedStep() = default;

bool GraphedStep::captured() const { return graph_ && graph_->graph.captured(); }

size_t GraphedStep::graph_nodes() const { return graph_ ? graph_->graph.num_nodes() : 0; }

void GraphedStep::synchronize() {
  if (graph_) graph_->graph.synchronize();
}

bool GraphedStep::matches(const std::vector<Tensor>& inputs) const {
  if (inputs.size() != static_inputs_.size()) return false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& a = inputs[i];
    const Tensor& b = static_inputs_[i];
    if (!a.defined() || a.shape() != b.shape() || a.dtype() != b.dtype() || !(a.device() == b.device())) return false;
  }
  return true;
}

Tensor GraphedStep::operator()(const std::vector<Tensor>& inputs) {
  if (captured()) {
    if (!matches(inputs)) {
      ++direct_;
      return step_(inputs);
    }
    {
      autograd::NoGradGuard no_grad;
      for (size_t i = 0; i < inputs.size(); ++i) static_inputs_[i].copy_(inputs[i]);
    }
    graph_->graph.replay();
    ++replays_;
    return loss_;
  }
  const bool cuda_inputs = !inputs.empty() && inputs[0].defined() && inputs[0].device().is_cuda();
  if (!enabled_ || failed_ || !cuda_inputs || direct_ < warmup_) {
    ++direct_;
    return step_(inputs);
  }
  // Capture on buffers of our own, then replay for this call (a capture runs nothing).
  const int device = inputs[0].device().index;
  {
    autograd::NoGradGuard no_grad;
    static_inputs_.clear();
    for (const Tensor& t : inputs) {
      NC_CHECK(t.defined() && t.device() == inputs[0].device(), DeviceError,
               "GraphedStep: every input must be defined and on ", inputs[0].device());
      static_inputs_.push_back(t.clone());
    }
  }
  graph_ = std::make_unique<GraphHolder>();
  try {
    graph_->graph.capture(device, [&] { loss_ = step_(static_inputs_); });
  } catch (...) {
    failed_ = true;
    loss_ = Tensor();
    graph_.reset();
    static_inputs_.clear();
    throw;
  }
  // What the warm-up steps left cached and the graph did not take would stay reserved for
  // the eager work between replays, which is small: back to the driver.
  cuda::empty_cache();
  graph_->graph.replay();
  ++replays_;
  return loss_;
}

}  // namespace normcore
