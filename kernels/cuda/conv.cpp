// CUDA convolution kernels (contracts in kernels/conv.h) on cuDNN. Per geometry (shapes,
// stride, padding, dilation, groups, dtype, TF32 setting, pointer alignment) a Plan holds,
// per direction, what runs it: first choice an execution plan of cuDNN's graph API
// (kernels/cuda/cudnn_graph.h), else an algorithm of the convolution API
// (cudnnConvolutionForward, BackwardData, BackwardFilter). Either is picked by cuDNN's
// heuristics, or with cuda::cudnn_benchmark() by timing, restricted to deterministic
// algorithms and, for f32 without TF32, to plain FMA math; the first candidate whose
// workspace the caching allocator can give is kept. NORMCORE_CUDNN_API=convolution in the
// environment skips the graph API. One cuDNN handle per device (cudnn_graph.h), bound to
// normcore's current stream on every call. Without cuDNN at build time every kernel throws
// DeviceError.
#include "kernels/conv.h"

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/conv_epilogue.h"
#include "kernels/cuda/cudnn_graph.h"
#include "normcore/cuda.h"
#include "runtime/cuda/check.h"
#include "runtime/cuda/runtime.h"

namespace normcore {
namespace cuda {
namespace {

using kernels::Conv2dGeometry;
using kernels::ConvDirection;

#ifdef NORMCORE_HAS_CUDNN

// ---- descriptors ----
cudnnDataType_t cudnn_dtype(DType dtype) {
  switch (dtype) {
    case DType::F32: return CUDNN_DATA_FLOAT;
    case DType::F64: return CUDNN_DATA_DOUBLE;
    case DType::F16: return CUDNN_DATA_HALF;
    case DType::BF16: return CUDNN_DATA_BFLOAT16;
    default: throw DTypeError(detail::cat_str("conv2d: cuDNN has no convolution for ", dtype_name(dtype)));
  }
}

int to_int(int64_t v, const char* what) {
  NC_CHECK(v <= INT_MAX, ShapeError, "conv2d: ", what, " = ", v, " is beyond cuDNN's 32-bit sizes");
  return static_cast<int>(v);
}

// The geometry, dtype, math setting and data alignment that a plan is made for.
struct PlanKey {
  int device;
  DType dtype;
  bool tf32;
  int64_t alignment;
  int64_t v[17];
  bool operator<(const PlanKey& o) const {
    return std::tie(device, dtype, tf32, alignment) < std::tie(o.device, o.dtype, o.tf32, o.alignment) ||
           (std::tie(device, dtype, tf32, alignment) == std::tie(o.device, o.dtype, o.tf32, o.alignment) &&
            std::lexicographical_compare(v, v + 17, o.v, o.v + 17));
  }
};

PlanKey plan_key(const Conv2dGeometry& g, int device, DType dtype, int64_t alignment) {
  PlanKey k{device, dtype, dtype == DType::F32 && allow_tf32(), alignment, {}};
  const int64_t values[17] = {g.n,
                              g.c,
                              g.h,
                              g.w,
                              g.o,
                              g.kh,
                              g.kw,
                              g.stride_h,
                              g.stride_w,
                              g.pad_h,
                              g.pad_w,
                              g.dilation_h,
                              g.dilation_w,
                              g.groups,
                              g.out_h,
                              g.out_w,
                              g.channels_last ? 1 : 0};
  std::copy(values, values + 17, k.v);
  return k;
}

// One direction's choice: unset until first used.
struct Choice {
  bool chosen = false;
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;
};

struct Plan {
  bool tf32 = false;
  int64_t alignment = 16;
  // Graph API, per direction: tried once; null when it offered nothing.
  bool graph_tried[3] = {false, false, false};
  std::unique_ptr<GraphConv> graph[3];
  // Convolution API.
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnMathType_t requested_math = CUDNN_DEFAULT_MATH;
  Choice choice[3];
  std::string ran[3];  // what runs each direction, for kernels::last_conv_algorithm
  std::mutex mutex;    // guards the choices and the conv descriptor's math type
};

cudnnMathType_t requested_math(DType dtype, bool tf32) {
  if (dtype == DType::F16 || dtype == DType::BF16) return CUDNN_TENSOR_OP_MATH;
  if (dtype == DType::F32 && !tf32) return CUDNN_FMA_MATH;
  return CUDNN_DEFAULT_MATH;
}

Plan& plan_for(const Conv2dGeometry& g, int device, DType dtype, int64_t alignment) {
  static std::mutex mutex;
  static std::map<PlanKey, std::unique_ptr<Plan>> plans;  // kept for the process's lifetime
  const PlanKey key = plan_key(g, device, dtype, alignment);
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<Plan>& slot = plans[key];
  if (slot) return *slot;
  auto plan = std::make_unique<Plan>();
  plan->tf32 = key.tf32;
  plan->alignment = alignment;
  const cudnnDataType_t t = cudnn_dtype(dtype);
  NC_CUDA_CHECK(cudnnCreateTensorDescriptor(&plan->x));
  NC_CUDA_CHECK(cudnnCreateTensorDescriptor(&plan->y));
  NC_CUDA_CHECK(cudnnCreateFilterDescriptor(&plan->w));
  NC_CUDA_CHECK(cudnnCreateConvolutionDescriptor(&plan->conv));
  const cudnnTensorFormat_t format = g.channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  NC_CUDA_CHECK(cudnnSetTensor4dDescriptor(plan->x, format, t, to_int(g.n, "N"), to_int(g.c, "C"), to_int(g.h, "H"),
                                           to_int(g.w, "W")));
  NC_CUDA_CHECK(cudnnSetTensor4dDescriptor(plan->y, format, t, to_int(g.n, "N"), to_int(g.o, "O"),
                                           to_int(g.out_h, "output height"), to_int(g.out_w, "output width")));
  NC_CUDA_CHECK(cudnnSetFilter4dDescriptor(plan->w, t, format, to_int(g.o, "O"), to_int(g.c / g.groups, "C / groups"),
                                           to_int(g.kh, "kh"), to_int(g.kw, "kw")));
  const cudnnDataType_t compute = dtype == DType::F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  NC_CUDA_CHECK(cudnnSetConvolution2dDescriptor(plan->conv, to_int(g.pad_h, "padding"), to_int(g.pad_w, "padding"),
                                                to_int(g.stride_h, "stride"), to_int(g.stride_w, "stride"),
                                                to_int(g.dilation_h, "dilation"), to_int(g.dilation_w, "dilation"),
                                                CUDNN_CROSS_CORRELATION, compute));
  NC_CUDA_CHECK(cudnnSetConvolutionGroupCount(plan->conv, to_int(g.groups, "groups")));
  plan->requested_math = requested_math(dtype, key.tf32);
  NC_CUDA_CHECK(cudnnSetConvolutionMathType(plan->conv, plan->requested_math));
  slot = std::move(plan);
  return *slot;
}

// ---- choosing an algorithm ----
// An algorithm cuDNN offered: usable when it succeeded, is deterministic and keeps to the
// requested math (no TF32 for f32 unless allowed).
struct Candidate {
  int algo;
  cudnnMathType_t math;
  size_t workspace;
};

template <class Perf>
std::vector<Candidate> usable(const Perf* perf, int count, cudnnMathType_t requested) {
  std::vector<Candidate> out;
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].determinism != CUDNN_DETERMINISTIC) continue;
    // f32 without TF32: tensor-op algorithms are out, the others run with FMA math forced.
    // Conversion of f32 operands to f16 is never wanted.
    if (requested == CUDNN_FMA_MATH && perf[i].mathType == CUDNN_TENSOR_OP_MATH) continue;
    if (perf[i].mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;
    const cudnnMathType_t math = requested == CUDNN_FMA_MATH ? CUDNN_FMA_MATH : perf[i].mathType;
    out.push_back({static_cast<int>(perf[i].algo), math, perf[i].memory});
  }
  return out;
}

// The largest workspace among candidates that the allocator gives (for a timed search).
Tensor search_workspace(const std::vector<Candidate>& candidates, int device, size_t* bytes) {
  size_t want = 0;
  for (const Candidate& c : candidates) want = std::max(want, c.workspace);
  while (want > 0) {
    Tensor ws = try_workspace(want, device);
    if (ws.defined()) {
      *bytes = want;
      return ws;
    }
    want /= 2;
  }
  *bytes = 0;
  return Tensor();
}

// The three directions share the choosing logic; each says how to rank (heuristics or a
// timed search) and how to run.
constexpr int kMaxAlgos = 16;

// cuDNN's ranking for direction, best first. search: time them on the given buffers
// (a = x or grad_y, b = weight or x or grad_y, out = the direction's output, which the
// search overwrites).
std::vector<Candidate> rank(ConvDirection d, cudnnHandle_t handle, Plan& p, bool search, const void* a, const void* b,
                            void* out, int device) {
  int count = 0;
  std::vector<Candidate> heuristic;
  switch (d) {
    case ConvDirection::Forward: {
      cudnnConvolutionFwdAlgoPerf_t perf[kMaxAlgos];
      NC_CUDA_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle, p.x, p.w, p.conv, p.y, kMaxAlgos, &count, perf));
      heuristic = usable(perf, count, p.requested_math);
      if (!search) return heuristic;
      size_t bytes = 0;
      Tensor ws = search_workspace(heuristic, device, &bytes);
      NC_CUDA_CHECK(cudnnFindConvolutionForwardAlgorithmEx(handle, p.x, a, p.w, b, p.conv, p.y, out, kMaxAlgos, &count,
                                                           perf, ws.defined() ? ws.data_ptr() : nullptr, bytes));
      return usable(perf, count, p.requested_math);
    }
    case ConvDirection::BackwardData: {
      cudnnConvolutionBwdDataAlgoPerf_t perf[kMaxAlgos];
      NC_CUDA_CHECK(
          cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, p.w, p.y, p.conv, p.x, kMaxAlgos, &count, perf));
      heuristic = usable(perf, count, p.requested_math);
      if (!search) return heuristic;
      size_t bytes = 0;
      Tensor ws = search_workspace(heuristic, device, &bytes);
      NC_CUDA_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(handle, p.w, b, p.y, a, p.conv, p.x, out, kMaxAlgos,
                                                                &count, perf, ws.defined() ? ws.data_ptr() : nullptr,
                                                                bytes));
      return usable(perf, count, p.requested_math);
    }
    case ConvDirection::BackwardFilter: {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[kMaxAlgos];
      NC_CUDA_CHECK(
          cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, p.x, p.y, p.conv, p.w, kMaxAlgos, &count, perf));
      heuristic = usable(perf, count, p.requested_math);
      if (!search) return heuristic;
      size_t bytes = 0;
      Tensor ws = search_workspace(heuristic, device, &bytes);
      NC_CUDA_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(handle, p.x, b, p.y, a, p.conv, p.w, out, kMaxAlgos,
                                                                  &count, perf, ws.defined() ? ws.data_ptr() : nullptr,
                                                                  bytes));
      return usable(perf, count, p.requested_math);
    }
  }
  return {};
}

// The workspace cuDNN asks of algo in direction d (the ranking's figure may be a guess).
size_t workspace_size(ConvDirection d, cudnnHandle_t handle, Plan& p, int algo) {
  size_t bytes = 0;
  switch (d) {
    case ConvDirection::Forward:
      NC_CUDA_CHECK(cudnnGetConvolutionForwardWorkspaceSize(handle, p.x, p.w, p.conv, p.y,
                                                            static_cast<cudnnConvolutionFwdAlgo_t>(algo), &bytes));
      break;
    case ConvDirection::BackwardData:
      NC_CUDA_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
          handle, p.w, p.y, p.conv, p.x, static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), &bytes));
      break;
    case ConvDirection::BackwardFilter:
      NC_CUDA_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
          handle, p.x, p.y, p.conv, p.w, static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), &bytes));
      break;
  }
  return bytes;
}

void run(ConvDirection d, cudnnHandle_t handle, Plan& p, const Choice& c, const void* a, const void* b, void* out,
         void* workspace, DType dtype) {
  // alpha and beta are double for f64 and float otherwise.
  const double one_d = 1.0, zero_d = 0.0;
  const float one_f = 1.0f, zero_f = 0.0f;
  const void* one = dtype == DType::F64 ? static_cast<const void*>(&one_d) : &one_f;
  const void* zero = dtype == DType::F64 ? static_cast<const void*>(&zero_d) : &zero_f;
  NC_CUDA_CHECK(cudnnSetConvolutionMathType(p.conv, c.math));
  switch (d) {
    case ConvDirection::Forward:
      NC_CUDA_CHECK(cudnnConvolutionForward(handle, one, p.x, a, p.w, b, p.conv,
                                            static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), workspace, c.workspace,
                                            zero, p.y, out));
      break;
    case ConvDirection::BackwardData:
      NC_CUDA_CHECK(cudnnConvolutionBackwardData(handle, one, p.w, b, p.y, a, p.conv,
                                                 static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo), workspace,
                                                 c.workspace, zero, p.x, out));
      break;
    case ConvDirection::BackwardFilter:
      NC_CUDA_CHECK(cudnnConvolutionBackwardFilter(handle, one, p.x, b, p.y, a, p.conv,
                                                   static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), workspace,
                                                   c.workspace, zero, p.w, out));
      break;
  }
}

// The byte alignment (a power of two, at most 16) that every pointer has.
int64_t alignment_of(const void* a, const void* b, const void* out) {
  const uintptr_t bits =
      reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) | reinterpret_cast<uintptr_t>(out);
  int64_t alignment = 16;
  while (alignment > 1 && (bits % static_cast<uintptr_t>(alignment)) != 0) alignment /= 2;
  return alignment;
}

// Whether the graph API is tried (NORMCORE_CUDNN_API=convolution in the environment: no).
bool graph_api_enabled() {
  static const bool enabled = [] {
    const char* api = std::getenv("NORMCORE_CUDNN_API");
    return api == nullptr || std::strcmp(api, "convolution") != 0;
  }();
  return enabled;
}

// Chooses direction d's convolution-API algorithm for p (false when none is usable); the
// chosen candidate's workspace is left in *workspace.
bool choose_algorithm(ConvDirection d, cudnnHandle_t handle, Plan& p, const Tensor& a, const Tensor& b,
                      const Tensor& out, Tensor* workspace) {
  const int device = out.device().index;
  Choice& choice = p.choice[static_cast<int>(d)];
  const std::vector<Candidate> candidates =
      rank(d, handle, p, cudnn_benchmark(), a.data_ptr(), b.data_ptr(), out.data_ptr(), device);
  for (const Candidate& c : candidates) {
    NC_CUDA_CHECK(cudnnSetConvolutionMathType(p.conv, c.math));
    const size_t bytes = workspace_size(d, handle, p, c.algo);
    *workspace = try_workspace(bytes, device);
    if (bytes > 0 && !workspace->defined()) continue;
    choice = {true, c.algo, c.math, bytes};
    return true;
  }
  return false;
}

[[noreturn]] void throw_no_algorithm(ConvDirection d, const Conv2dGeometry& g, DType dtype) {
  throw DeviceError(detail::cat_str("conv2d: cuDNN offers no deterministic ", kernels::conv_direction_name(d),
                                    " algorithm for this convolution that fits in memory (x [", g.n, ", ", g.c, ", ",
                                    g.h, ", ", g.w, "], weight [", g.o, ", ", g.c / g.groups, ", ", g.kh, ", ", g.kw,
                                    "], ", dtype_name(dtype), ")"));
}

// Runs direction d: a is x (forward) or grad_y (backward), b the other operand (weight for
// forward and backward data, x for backward filter), out the output.
void convolve(ConvDirection d, const Conv2dGeometry& g, const Tensor& a, const Tensor& b, const Tensor& out) {
  const int device = out.device().index;
  const DType dtype = out.dtype();
  const int i = static_cast<int>(d);
  DeviceGuard guard(device);
  cudnnHandle_t handle = cudnn_handle(device);
  Plan& p = plan_for(g, device, dtype, alignment_of(a.data_ptr(), b.data_ptr(), out.data_ptr()));
  std::lock_guard<std::mutex> lock(p.mutex);
  if (!p.graph_tried[i]) {
    p.graph_tried[i] = true;
    if (graph_api_enabled()) {
      ConvEngineRules rules;
      rules.tf32 = p.tf32;
      p.graph[i] = GraphConv::make(handle, d, g, dtype, rules, p.alignment, cudnn_benchmark(), a.data_ptr(),
                                   b.data_ptr(), out.data_ptr(), device);
    }
    // A timed search also searches the convolution API's algorithms, times its pick the way
    // the graph plans were timed, and keeps the faster API.
    Tensor ws;
    if (p.graph[i] && cudnn_benchmark() && choose_algorithm(d, handle, p, a, b, out, &ws)) {
      const float ms = time_runs(device, [&] {
        run(d, handle, p, p.choice[i], a.data_ptr(), b.data_ptr(), out.data_ptr(),
            ws.defined() ? ws.data_ptr() : nullptr, dtype);
        return true;
      });
      if (ms >= 0 && ms < p.graph[i]->searched_ms()) p.graph[i].reset();
    }
  }
  if (const GraphConv* graph = p.graph[i].get()) {
    Tensor workspace = graph->workspace() > 0
                           ? empty({static_cast<int64_t>(graph->workspace())}, TensorOptions(DType::U8, out.device()))
                           : Tensor();
    graph->run(handle, a.data_ptr(), b.data_ptr(), out.data_ptr(),
               workspace.defined() ? workspace.data_ptr() : nullptr);
    if (p.ran[i].empty()) p.ran[i] = detail::cat_str("cuDNN graph engine ", graph->engine());
    kernels::record_conv_algorithm(d, &p.ran[i]);
    return;
  }
  Choice& choice = p.choice[i];
  Tensor workspace;
  if (!choice.chosen) {
    if (!choose_algorithm(d, handle, p, a, b, out, &workspace)) throw_no_algorithm(d, g, dtype);
  } else if (choice.workspace > 0) {
    workspace = empty({static_cast<int64_t>(choice.workspace)}, TensorOptions(DType::U8, out.device()));
  }
  run(d, handle, p, choice, a.data_ptr(), b.data_ptr(), out.data_ptr(),
      workspace.defined() ? workspace.data_ptr() : nullptr, dtype);
  if (p.ran[i].empty()) p.ran[i] = detail::cat_str("cuDNN convolution algorithm ", choice.algo);
  kernels::record_conv_algorithm(d, &p.ran[i]);
}

class CudaConv final : public kernels::ConvKernels {
 public:
  void conv2d_forward(const Conv2dGeometry& g, const Tensor& x, const Tensor& weight, const kernels::ConvEpilogue& e,
                      const Tensor& y) const override {
    NC_CHECK(!g.weight_panels, DeviceError, "conv2d: weight panels are the CPU's direct kernel's layout");
    convolve(ConvDirection::Forward, g, x, weight, y);
    conv_epilogue(y, g.o, g.channels_last ? 1 : g.out_h * g.out_w, e.bias, e.residual, e.relu);
  }
  void conv2d_backward_data(const Conv2dGeometry& g, const Tensor& grad_y, const Tensor& weight,
                            const Tensor& grad_x) const override {
    convolve(ConvDirection::BackwardData, g, grad_y, weight, grad_x);
  }
  void conv2d_backward_weight(const Conv2dGeometry& g, const Tensor& grad_y, const Tensor& x,
                              const Tensor& grad_weight) const override {
    convolve(ConvDirection::BackwardFilter, g, grad_y, x, grad_weight);
  }
};

#else  // no cuDNN at build time

[[noreturn]] void throw_no_cudnn() {
  throw DeviceError(
      "conv2d: normcore was built without cuDNN (not found at build time), so convolutions cannot run on CUDA; "
      "rebuild with cuDNN installed (libcudnn9-dev-cuda-13 or cuDNN in the CUDA toolkit) or use Device::cpu()");
}

class CudaConv final : public kernels::ConvKernels {
 public:
  void conv2d_forward(const Conv2dGeometry&, const Tensor&, const Tensor&, const kernels::ConvEpilogue&,
                      const Tensor&) const override {
    throw_no_cudnn();
  }
  void conv2d_backward_data(const Conv2dGeometry&, const Tensor&, const Tensor&, const Tensor&) const override {
    throw_no_cudnn();
  }
  void conv2d_backward_weight(const Conv2dGeometry&, const Tensor&, const Tensor&, const Tensor&) const override {
    throw_no_cudnn();
  }
};

#endif

}  // namespace

const kernels::ConvKernels& conv_kernels() {
  static const CudaConv kernels;
  return kernels;
}

}  // namespace cuda
}  // namespace normcore
