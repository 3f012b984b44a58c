// cuDNN's graph API (kernels/cuda/cudnn_graph.h): the shared building blocks, then a
// convolution direction. Its graph is three tensors (x, w, y with fixed ids), one
// convolution descriptor and one operation; cuDNN's heuristics (mode A, then the fallback
// list) rank engine configurations for it, the rules of ConvEngineRules filter them by their
// notes, and the first that finalizes into an execution plan (or, with a search, the fastest
// of up to kSearchLimit timed ones) is kept.
// A refusal while building the graph or a plan is not an error: it only means the graph API
// does not take this convolution, and the caller uses the convolution API instead.
#ifdef NORMCORE_HAS_CUDNN

#include "kernels/cuda/cudnn_graph.h"

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "runtime/cuda/check.h"
#include "runtime/cuda/runtime.h"

namespace normcore {
namespace cuda {
namespace {

using kernels::Conv2dGeometry;
using kernels::ConvDirection;

constexpr int64_t kX = 1, kW = 2, kY = 3;  // tensor ids
constexpr int64_t kMaxConfigs = 64;        // engine configurations read from one heuristic query
constexpr int kSearchLimit = 8;            // configurations timed by a search

std::shared_ptr<void> own(cudnnBackendDescriptor_t d) {
  return std::shared_ptr<void>(d, [](void* p) {
    if (p != nullptr) NC_CUDA_LOG(cudnnBackendDestroyDescriptor(p));
  });
}

bool graph_dtype(DType dtype, cudnnDataType_t* out) {
  switch (dtype) {
    case DType::F32: *out = CUDNN_DATA_FLOAT; return true;
    case DType::F64: *out = CUDNN_DATA_DOUBLE; return true;
    case DType::F16: *out = CUDNN_DATA_HALF; return true;
    case DType::BF16: *out = CUDNN_DATA_BFLOAT16; return true;
    default: return false;
  }
}

// A [n, c, h, w] tensor laid out NCHW, or NHWC with channels_last.
cudnnBackendDescriptor_t tensor(GraphBuilder& b, int64_t id, const int64_t (&dims)[4], cudnnDataType_t type,
                                int64_t alignment, bool channels_last) {
  const int64_t nchw[4] = {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
  const int64_t nhwc[4] = {dims[1] * dims[2] * dims[3], 1, dims[3] * dims[1], dims[1]};
  const int64_t* strides = channels_last ? nhwc : nchw;
  cudnnBackendDescriptor_t t = b.make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  b.set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  b.set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
  b.set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
  b.set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id);
  b.set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  b.finalize(t);
  return t;
}

// The finalized one-operation graph for direction d, or nullptr.
cudnnBackendDescriptor_t operation_graph(GraphBuilder& b, cudnnHandle_t handle, ConvDirection d,
                                         const Conv2dGeometry& g, DType dtype, int64_t alignment) {
  cudnnDataType_t type;
  if (!graph_dtype(dtype, &type)) return nullptr;
  const int64_t x_dims[4] = {g.n, g.c, g.h, g.w};
  const int64_t w_dims[4] = {g.o, g.c / g.groups, g.kh, g.kw};
  const int64_t y_dims[4] = {g.n, g.o, g.out_h, g.out_w};
  cudnnBackendDescriptor_t x = tensor(b, kX, x_dims, type, alignment, g.channels_last);
  cudnnBackendDescriptor_t w = tensor(b, kW, w_dims, type, alignment, g.channels_last);
  cudnnBackendDescriptor_t y = tensor(b, kY, y_dims, type, alignment, g.channels_last);

  const cudnnDataType_t compute = dtype == DType::F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t spatial = 2;
  const int64_t dilation[2] = {g.dilation_h, g.dilation_w};
  const int64_t stride[2] = {g.stride_h, g.stride_w};
  const int64_t padding[2] = {g.pad_h, g.pad_w};
  cudnnBackendDescriptor_t conv = b.make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  b.set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
  b.set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  b.set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial);
  b.set(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilation);
  b.set(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride);
  b.set(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, padding);
  b.set(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, padding);
  b.finalize(conv);

  // alpha = 1, beta = 0: outputs are written, not accumulated; double for f64 tensors.
  const double one_d = 1.0, zero_d = 0.0;
  const float one_f = 1.0f, zero_f = 0.0f;
  const cudnnBackendAttributeType_t scalar = dtype == DType::F64 ? CUDNN_TYPE_DOUBLE : CUDNN_TYPE_FLOAT;
  const void* one = dtype == DType::F64 ? static_cast<const void*>(&one_d) : &one_f;
  const void* zero = dtype == DType::F64 ? static_cast<const void*>(&zero_d) : &zero_f;
  cudnnBackendDescriptor_t op = nullptr;
  switch (d) {
    case ConvDirection::Forward:
      op = b.make(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
      b.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
      b.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w);
      b.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
      b.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv);
      b.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, scalar, 1, one);
      b.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, scalar, 1, zero);
      break;
    case ConvDirection::BackwardData:
      op = b.make(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR);
      b.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
      b.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w);
      b.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
      b.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv);
      b.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, scalar, 1, one);
      b.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, scalar, 1, zero);
      break;
    case ConvDirection::BackwardFilter:
      op = b.make(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR);
      b.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
      b.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w);
      b.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
      b.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv);
      b.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, scalar, 1, one);
      b.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA, scalar, 1, zero);
      break;
  }
  b.finalize(op);

  cudnnBackendDescriptor_t graph = b.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  b.set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op);
  b.set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  b.finalize(graph);
  return b.ok() ? graph : nullptr;
}

// Whether config's engine keeps to rules for dtype; its global index in *engine_index.
bool qualifies(cudnnBackendDescriptor_t config, DType dtype, ConvEngineRules rules, int64_t* engine_index,
               Descriptors* keep) {
  EngineNotes notes;
  if (!engine_notes(config, &notes, keep)) return false;
  if (notes.has(CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) || notes.has(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) ||
      notes.has(CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION))
    return false;
  // On f32 data a tensor-core engine computes in TF32.
  if (notes.has(CUDNN_NUMERICAL_NOTE_TENSOR_CORE) && dtype == DType::F32 && !rules.tf32) return false;
  if (notes.has(CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION)) return false;
  *engine_index = notes.index;
  return true;
}

// Runs plan on a, b and out (their tensor ids by direction: a is x or grad_y, b the weight
// or x, out the direction's output).
cudnnStatus_t execute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, ConvDirection d, const void* a,
                      const void* b, void* out, void* workspace) {
  int64_t ids[3] = {kX, kW, kY};
  if (d == ConvDirection::BackwardData) ids[0] = kY, ids[1] = kW, ids[2] = kX;
  if (d == ConvDirection::BackwardFilter) ids[0] = kY, ids[1] = kX, ids[2] = kW;
  void* pointers[3] = {const_cast<void*>(a), const_cast<void*>(b), out};
  return execute_plan(handle, plan, 3, ids, pointers, workspace);
}

float time_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, ConvDirection d, const void* a, const void* b,
                void* out, void* workspace, int device) {
  return time_runs(device, [&] { return execute(handle, plan, d, a, b, out, workspace) == CUDNN_STATUS_SUCCESS; });
}

}  // namespace

cudnnHandle_t cudnn_handle(int device) {
  static std::mutex mutex;
  static std::map<int, cudnnHandle_t> handles;
  cudnnHandle_t handle = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    cudnnHandle_t& slot = handles[device];
    if (slot == nullptr) {
      DeviceGuard guard(device);
      NC_CUDA_CHECK(cudnnCreate(&slot));
    }
    handle = slot;
  }
  NC_CUDA_CHECK(cudnnSetStream(handle, stream(device)));
  return handle;
}

cudnnBackendDescriptor_t GraphBuilder::make(cudnnBackendDescriptorType_t type) {
  cudnnBackendDescriptor_t d = nullptr;
  if (ok()) status_ = cudnnBackendCreateDescriptor(type, &d);
  if (d != nullptr) keep_->push_back(own(d));
  return d;
}

void GraphBuilder::set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                       int64_t count, const void* values) {
  if (ok()) status_ = cudnnBackendSetAttribute(d, name, type, count, values);
}

void GraphBuilder::finalize(cudnnBackendDescriptor_t d) {
  if (ok()) status_ = cudnnBackendFinalize(d);
}

std::vector<cudnnBackendDescriptor_t> ranked_configs(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                                                     Descriptors* keep) {
  GraphBuilder b(keep);
  cudnnBackendDescriptor_t heur = b.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  b.set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
  b.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  b.finalize(heur);
  if (!b.ok()) return {};
  int64_t count = 0;
  if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                               nullptr) != CUDNN_STATUS_SUCCESS)
    return {};
  count = std::min(count, kMaxConfigs);
  std::vector<cudnnBackendDescriptor_t> configs;
  for (int64_t i = 0; i < count; ++i) configs.push_back(b.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
  if (!b.ok() || count == 0) return {};
  int64_t got = 0;
  if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                               configs.data()) != CUDNN_STATUS_SUCCESS)
    return {};
  configs.resize(static_cast<size_t>(std::min(got, count)));
  return configs;
}

bool EngineNotes::has(cudnnBackendNumericalNote_t note) const {
  return std::find(numerical.begin(), numerical.end(), note) != numerical.end();
}

bool EngineNotes::has(cudnnBackendBehaviorNote_t note) const {
  return std::find(behavior.begin(), behavior.end(), note) != behavior.end();
}

bool engine_notes(cudnnBackendDescriptor_t config, EngineNotes* notes, Descriptors* keep) {
  GraphBuilder b(keep);
  cudnnBackendDescriptor_t engine = b.make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  if (!b.ok()) return false;
  int64_t n = 0;
  if (cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine) !=
      CUDNN_STATUS_SUCCESS)
    return false;
  cudnnBackendNumericalNote_t numerical[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t numerical_count = 0;
  if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &numerical_count, numerical) != CUDNN_STATUS_SUCCESS)
    return false;
  cudnnBackendBehaviorNote_t behavior[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
  int64_t behavior_count = 0;
  if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                               CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &behavior_count, behavior) != CUDNN_STATUS_SUCCESS)
    return false;
  notes->numerical.assign(numerical, numerical + std::min<int64_t>(numerical_count, CUDNN_NUMERICAL_NOTE_TYPE_COUNT));
  notes->behavior.assign(behavior, behavior + std::min<int64_t>(behavior_count, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT));
  notes->index = -1;
  cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &notes->index);
  return true;
}

cudnnBackendDescriptor_t execution_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t config, size_t* workspace,
                                        Descriptors* keep) {
  GraphBuilder b(keep);
  cudnnBackendDescriptor_t plan = b.make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  b.set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &config);
  b.set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  b.finalize(plan);
  if (!b.ok()) return nullptr;
  int64_t bytes = 0, n = 0;
  if (cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &bytes) !=
          CUDNN_STATUS_SUCCESS ||
      bytes < 0)
    return nullptr;
  *workspace = static_cast<size_t>(bytes);
  return plan;
}

cudnnStatus_t execute_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, int64_t count, const int64_t* ids,
                           void* const* pointers, void* workspace) {
  cudnnBackendDescriptor_t pack = nullptr;
  cudnnStatus_t status = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  const std::shared_ptr<void> owned = own(pack);
  GraphBuilder builder(nullptr);
  builder.set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, count, ids);
  builder.set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, count, pointers);
  builder.set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  builder.finalize(pack);
  if (!builder.ok()) return builder.status();
  return cudnnBackendExecute(handle, plan, pack);
}

Tensor try_workspace(size_t bytes, int device) {
  if (bytes == 0) return Tensor();
  try {
    return empty({static_cast<int64_t>(bytes)}, TensorOptions(DType::U8, Device::cuda(device)));
  } catch (const OutOfMemoryError&) {
    return Tensor();
  }
}

float time_runs(int device, const std::function<bool()>& run) {
  check_not_capturing(device, "conv2d",
                      "cudnn_benchmark times a new convolution geometry on the device; run one uncaptured "
                      "step first");
  constexpr int kWarm = 2, kTimed = 5;
  for (int i = 0; i < kWarm; ++i)
    if (!run()) return -1;
  cudaEvent_t events[kTimed + 1];
  for (cudaEvent_t& e : events) NC_CUDA_CHECK(cudaEventCreate(&e));
  bool ran = true;
  NC_CUDA_CHECK(cudaEventRecord(events[0], stream(device)));
  for (int i = 0; i < kTimed && ran; ++i) {
    ran = run();
    NC_CUDA_CHECK(cudaEventRecord(events[i + 1], stream(device)));
  }
  wait_for_stream(device, stream(device));
  std::vector<float> ms(kTimed);
  for (int i = 0; i < kTimed && ran; ++i) NC_CUDA_CHECK(cudaEventElapsedTime(&ms[i], events[i], events[i + 1]));
  for (cudaEvent_t& e : events) NC_CUDA_LOG(cudaEventDestroy(e));
  if (!ran) return -1;
  std::sort(ms.begin(), ms.end());
  return ms[kTimed / 2];
}

std::unique_ptr<GraphConv> GraphConv::make(cudnnHandle_t handle, ConvDirection d, const Conv2dGeometry& g, DType dtype,
                                           ConvEngineRules rules, int64_t alignment, bool search, const void* a,
                                           const void* b, void* out, int device) {
  std::unique_ptr<GraphConv> conv(new GraphConv());
  conv->direction_ = d;
  GraphBuilder builder(&conv->keep_);
  cudnnBackendDescriptor_t graph = operation_graph(builder, handle, d, g, dtype, alignment);
  if (graph == nullptr) return nullptr;

  struct Found {
    cudnnBackendDescriptor_t plan;
    size_t workspace;
    int64_t engine;
  };
  std::vector<Found> found;
  const size_t wanted = search ? kSearchLimit : 1;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (cudnnBackendDescriptor_t config : ranked_configs(graph, mode, &conv->keep_)) {
      if (found.size() >= wanted) break;
      int64_t engine = -1;
      if (!qualifies(config, dtype, rules, &engine, &conv->keep_)) continue;
      // The same engine may come from both lists.
      if (std::any_of(found.begin(), found.end(), [&](const Found& f) { return f.engine == engine && engine >= 0; }))
        continue;
      size_t workspace = 0;
      cudnnBackendDescriptor_t plan = execution_plan(handle, config, &workspace, &conv->keep_);
      if (plan != nullptr) found.push_back({plan, workspace, engine});
    }
    if (!found.empty()) break;
  }

  // The first (heuristics) or the fastest (search) whose workspace the allocator gives.
  const Found* best = nullptr;
  float best_ms = 0;
  for (const Found& f : found) {
    Tensor workspace = try_workspace(f.workspace, device);
    if (f.workspace > 0 && !workspace.defined()) continue;
    if (!search) {
      best = &f;
      break;
    }
    const float ms =
        time_plan(handle, f.plan, d, a, b, out, workspace.defined() ? workspace.data_ptr() : nullptr, device);
    if (ms >= 0 && (best == nullptr || ms < best_ms)) best = &f, best_ms = ms;
  }
  if (best == nullptr) return nullptr;
  // Only the chosen plan stays; the others' descriptors go now.
  for (const Found& f : found) {
    if (&f == best) continue;
    conv->keep_.erase(std::remove_if(conv->keep_.begin(), conv->keep_.end(),
                                     [&](const std::shared_ptr<void>& p) { return p.get() == f.plan; }),
                      conv->keep_.end());
  }
  conv->plan_ = best->plan;
  conv->workspace_ = best->workspace;
  conv->engine_ = best->engine;
  conv->searched_ms_ = search ? best_ms : -1;
  return conv;
}

GraphConv::~GraphConv() = default;

void GraphConv::run(cudnnHandle_t handle, const void* a, const void* b, void* out, void* workspace) const {
  NC_CUDA_CHECK(execute(handle, plan_, direction_, a, b, out, workspace));
}

}  // namespace cuda
}  // namespace normcore

#endif  // NORMCORE_HAS_CUDNN
