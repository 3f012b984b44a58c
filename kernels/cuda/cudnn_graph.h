// cuDNN's graph API on its backend descriptors, without the header-only frontend: the
// building blocks every graph here shares (a handle per device, a builder that makes and
// finalizes descriptors, the engine configurations cuDNN's heuristics rank, their notes, an
// execution plan and its execution), then one direction of a 2-D convolution made of them:
// a one-operation graph, the engines cuDNN's heuristics rank for it (or, with a timed search,
// the fastest of them), finalized once into an execution plan and run many times.
// kernels/cuda/conv.cpp uses it first and falls back to the convolution API
// (cudnnConvolutionForward and the backward pair) when no engine qualifies;
// kernels/cuda/attention/cudnn_attention.cpp builds the fused attention graphs from the
// same blocks.
//
// Why both for convolutions: on tensor cores (TF32, f16, bf16) with NCHW tensors the graph
// API reaches engines that the convolution API's algorithm list does not (see
// docs/DESIGN.md), while the convolution API covers what the graph engines may not (f64
// among them).
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

// ---- building blocks ----

// cuDNN's handle for device, created once, bound to normcore's current stream on every call.
cudnnHandle_t cudnn_handle(int device);

// Descriptors a graph or plan is made of, destroyed with the last owner.
using Descriptors = std::vector<std::shared_ptr<void>>;

// Makes descriptors and sets their attributes, remembering the first refusal (after one,
// every later call does nothing); every descriptor it makes is owned by `keep`.
class GraphBuilder {
 public:
  explicit GraphBuilder(Descriptors* keep) : keep_(keep) {}
  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type);
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
           int64_t count, const void* values);
  void finalize(cudnnBackendDescriptor_t d);
  bool ok() const { return status_ == CUDNN_STATUS_SUCCESS; }
  cudnnStatus_t status() const { return status_; }

 private:
  Descriptors* keep_;
  cudnnStatus_t status_ = CUDNN_STATUS_SUCCESS;
};

// The engine configurations cuDNN's heuristics in `mode` rank for a finalized operation
// graph, best first (owned by keep); none when the query is refused.
std::vector<cudnnBackendDescriptor_t> ranked_configs(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                                                     Descriptors* keep);

// What cuDNN says of a configuration's engine.
struct EngineNotes {
  int64_t index = -1;  // cuDNN's global engine index
  std::vector<cudnnBackendNumericalNote_t> numerical;
  std::vector<cudnnBackendBehaviorNote_t> behavior;
  bool has(cudnnBackendNumericalNote_t note) const;
  bool has(cudnnBackendBehaviorNote_t note) const;
};
// config's engine notes; false when cuDNN does not give them.
bool engine_notes(cudnnBackendDescriptor_t config, EngineNotes* notes, Descriptors* keep);

// A finalized execution plan for config, or nullptr when cuDNN refuses it; *workspace is
// the bytes of device memory each run needs.
cudnnBackendDescriptor_t execution_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t config, size_t* workspace,
                                        Descriptors* keep);

// Runs plan through a variant pack made for this call: count tensors by id and data pointer
// (a by-value scalar's pointer is to host memory), and the workspace.
cudnnStatus_t execute_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, int64_t count, const int64_t* ids,
                           void* const* pointers, void* workspace);

// Device memory for a workspace of `bytes`, or an undefined tensor when the caching
// allocator cannot give it (or bytes is 0).
Tensor try_workspace(size_t bytes, int device);

// ---- a convolution direction ----

// What an engine must keep to, beyond supporting the convolution: deterministic results,
// no conversion of inputs to a narrower type, no reduction below f32, no TF32 for f32
// unless `tf32`, and no kernels compiled at run time (embedders may lack NVRTC).
struct ConvEngineRules {
  bool tf32 = false;
};

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
                                         int64_t alignment, bool search, const void* a, const void* b, void* out,
                                         int device);
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
  Descriptors keep_;  // the descriptors the plan was made of
  cudnnBackendDescriptor_t plan_ = nullptr;
  size_t workspace_ = 0;
  int64_t engine_ = -1;
  float searched_ms_ = -1;
};

}  // namespace cuda
}  // namespace normcore

#endif  // NORMCORE_HAS_CUDNN
