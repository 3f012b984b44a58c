// A training step run through a CUDA graph once it has warmed up: the step's forward,
// backward, clipping and optimizer update queue as one graph launch instead of hundreds of
// kernel launches and their host work (normcore/cuda.h, cuda::Graph, says what a captured
// step may and may not do).
//
//   GraphedStep step([&](const std::vector<Tensor>& in) {
//     Tensor loss = cross_entropy((*model)(in[0]), in[1]);
//     optimizer.zero_grad();
//     loss.backward();
//     optim::clip_grad_norm_async(optimizer.params(), 1.0);
//     optimizer.step();
//     return loss;
//   });
//   for (Batch b; loader.next(b);) {
//     Tensor loss = step({b.inputs, b.targets});  // valid until the next call
//     schedule.step();                            // between steps, never inside
//   }
//
// The first `warmup` calls run the step directly (they make the optimizer state and fill
// the caches); the next one copies its inputs into buffers of its own, captures the step on
// those and replays it (after the capture the allocator's cached blocks go back to the
// driver, cuda::empty_cache: the graph has its own); later calls with inputs of the same
// shapes, dtypes and device copy them in and replay. Inputs of other shapes (a smaller last batch) run directly. Without
// CUDA inputs, or with enabled false, every call runs directly. A step that cannot be
// captured throws CaptureError from the capturing call, leaving the parameters and the
// optimizer state as they were; the object then runs every later call directly.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "normcore/tensor.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {

class GraphedStep {
 public:
  using Step = std::function<Tensor(const std::vector<Tensor>& inputs)>;

  explicit GraphedStep(Step step, bool enabled = true, int64_t warmup = 2);
  ~GraphedStep();
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;

  // Runs the step on inputs and returns its loss (a replay's is the graph's own tensor,
  // overwritten by the next replay: read it before the next call).
  Tensor operator()(const std::vector<Tensor>& inputs);

  bool captured() const;
  int64_t replays() const { return replays_; }
  int64_t direct_steps() const { return direct_; }
  // Nodes of the captured graph (0 before the capture).
  size_t graph_nodes() const;
  // Waits for the replays queued so far (IndexError for an index out of range in one).
  void synchronize();

 private:
  bool matches(const std::vector<Tensor>& inputs) const;

  Step step_;
  bool enabled_;
  int64_t warmup_;
  bool failed_ = false;
  int64_t replays_ = 0, direct_ = 0;
  std::vector<Tensor> static_inputs_;
  Tensor loss_;
  struct GraphHolder;
  std::unique_ptr<GraphHolder> graph_;
};

}  // namespace normcore

#pragma GCC visibility pop
