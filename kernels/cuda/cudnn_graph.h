// One direction of a 2-D convolution on cuDNN's graph API (the backend descriptors of
// cudnn_graph.h): a one-operation graph, the engines cuDNN's heuristics rank for it (or, with
// a timed search, the fastest of them), finalized once into an execution plan and run many
// times. kernels/cuda/conv.cpp uses it first and falls back to the convolution API
// (cudnnConvolutionForward and the backward pair) when no engine qualifies.
//
// Why both: on tensor cores (TF32, f16, bf16) with NCHW tensors the graph API reaches
// engines that the convolution API's algorithm list does not (see docs/DESIGN.md), while the
// convolution API covers what the graph engines may not (f64 among them).
#pragma once

#ifdef NORMCORE_HAS_CUDNN

#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/conv.h"

namespace normcore {
namespace cuda {

// What an engine must keep to, beyond supporting the convolution: deterministic results,
// no conversion of inputs to a narrower type, no reduction below f32, no TF32 for f32
// unless `tf32`, and no kernels compiled at run time (embedders may lack NVRTC).
struct ConvEngineRules {
  bool tf32 = false;
};

// Device memory for a workspace of `bytes`, or an undefined tensor when the caching
// allocator cannot give it (or bytes is 0).
Tensor try_workspace(size_t bytes, int device);

// Milliseconds of one call of run on device's current stream: the median of five timed
// calls after two untimed; negative when run returns false (a run that fails). The timed
// searches of both cuDNN APIs are compared on this one measure.
float time_runs(int device, const std::function<bool()>& run);

class GraphConv {
 public:
  // The plan for direction d of g in dtype, or nullptr when cuDNN's graph API offers no
  // engine within the rules (or cannot express the convolution). alignment: the byte
  // alignment every data pointer of later runs has (a power of two, at most 16). With
  // search, the qualifying engines are timed on a, b and out (out is overwritten) and the
  // fastest kept; otherwise the heuristics' first that finalizes. Throws only for failures
  // of the device itself (CudaError) or of allocation.
  static std::unique_ptr<GraphConv> make(cudnnHandle_t handle, kernels::ConvDirection d,
                                         const kernels::Conv2dGeometry& g, DType dtype, ConvEngineRules rules,
                                         int64_t alignment, bool search,
                                         const void* a, const void* b, void* out, int device);
  ~GraphConv();
  GraphConv(const GraphConv&) = delete;
  GraphConv& operator=(const GraphConv&) = delete;

  // Runs the plan: a is x (forward) or grad_y (backward), b the weight (forward, backward
  // data) or x (backward filter), out the direction's output; workspace has workspace() bytes.
  void run(cudnnHandle_t handle, const void* a, const void* b, void* out, void* workspace) const;
  size_t workspace() const { return workspace_; }
  // cuDNN's global index of the engine the plan runs (for reports).
  int64_t engine() const { return engine_; }
  // The timed search's milliseconds for one run of the plan (negative without a search).
  float searched_ms() const { return searched_ms_; }

 private:
  GraphConv() = default;
  kernels::ConvDirection direction_ = kernels::ConvDirection::Forward;
  std::vector<std::shared_ptr<void>> keep_;  // the descriptors the plan was made of
  cudnnBackendDescriptor_t plan_ = nullptr;
  size_t workspace_ = 0;
  int64_t engine_ = -1;
  float searched_ms_ = -1;
};

}  // namespace cuda
}  // namespace normcore

#endif  // NORMCORE_HAS_CUDNN
