// cuDNN's fused flash attention (kernels/cuda/attention/cudnn_attention.h) as graphs of
// cuDNN's graph API: the operation pattern cuDNN's fused attention engines recognize, made
// of matmul, pointwise, reduction and reshape operations over 4-D tensors. Forward:
//   scores = (q @ k^T) * scale, [causal: -inf where key > query], max and sum of exp over
//   keys, stats = max + log(sum) (the contract's lse, natural log, of the scaled scores),
//   out = (exp(scores - max) / sum) @ v.
// Backward, from out, grad_out and the stats (either engine's: the same lse):
//   delta = rowsum(grad_out * out) (f32, in the workspace), p = exp(scores - stats),
//   grad_v = p^T @ grad_out, ds = p * (grad_out @ v^T - delta) * scale,
//   grad_k = ds^T @ q, grad_q = ds @ k,
// with grad_q a matmul output of its own (cuDNN's dP-workspace form, deterministic on
// Hopper) rather than an f32 accumulator that blocks add to. k and v enter transposed
// ([B, H, D, S], strides swapped), as the engines expect. Tensor ids below 100 are the
// variant pack's; virtual tensors (never in memory) count up from 100. Scalars (scale, -inf,
// 1) are by-value tensors whose data pointers point to host floats.
#include "kernels/cuda/attention/cudnn_attention.h"

#ifdef NORMCORE_HAS_CUDNN

#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels/cuda/cudnn_graph.h"
#include "runtime/cuda/capture.h"
#include "runtime/cuda/check.h"
#include "runtime/cuda/runtime.h"

namespace normcore {
namespace cuda {
namespace {

using kernels::AttentionShape;

enum Id : int64_t {
  kQ = 1,
  kK,
  kV,
  kOut,
  kStats,
  kScale,
  kNegInf,
  kOne,
  kGradOut,
  kGradQ,
  kGradK,
  kGradV,
  kDelta,
};
constexpr int64_t kFirstVirtual = 100;
constexpr int64_t kAlignment = 16;       // bytes every tensor's data starts at a multiple of
constexpr size_t kDeltaAlignment = 256;  // where cuDNN's own workspace starts after delta

using Dims = std::array<int64_t, 4>;

Dims contiguous(const Dims& d) { return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1}; }

// ---- the graph ----
// Builds one operation graph; the first refusal makes finish() give nullptr.
class AttentionGraph {
 public:
  AttentionGraph(Descriptors* keep, cudnnDataType_t io) : b_(keep), io_(io) {}

  cudnnBackendDescriptor_t tensor(int64_t id, const Dims& dims, const Dims& strides, cudnnDataType_t type,
                                  bool is_virtual = false, bool by_value = false) {
    cudnnBackendDescriptor_t t = b_.make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    b_.set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    b_.set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    b_.set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    b_.set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id);
    b_.set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &kAlignment);
    b_.set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) b_.set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    b_.finalize(t);
    return t;
  }
  // An intermediate, contiguous unless strides are given.
  cudnnBackendDescriptor_t virtual_tensor(const Dims& dims, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    return tensor(next_virtual_++, dims, contiguous(dims), type, true);
  }
  cudnnBackendDescriptor_t virtual_tensor(const Dims& dims, const Dims& strides, cudnnDataType_t type) {
    return tensor(next_virtual_++, dims, strides, type, true);
  }
  // A float scalar passed by value at each run.
  cudnnBackendDescriptor_t scalar(int64_t id) {
    const Dims one{1, 1, 1, 1};
    return tensor(id, one, one, CUDNN_DATA_FLOAT, false, true);
  }

  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t desc = b_.make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    b_.set(desc, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
    b_.finalize(desc);
    cudnnBackendDescriptor_t op = b_.make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    b_.set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    b_.set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    b_.set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    b_.set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &desc);
    add(op);
  }

  // y = mode(x[, b][, t]); axis for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t t = nullptr,
                 cudnnDataType_t compute = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    cudnnBackendDescriptor_t desc = b_.make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    b_.set(desc, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    b_.set(desc, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &compute);
    if (axis >= 0) b_.set(desc, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    b_.finalize(desc);
    cudnnBackendDescriptor_t op = b_.make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    b_.set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &desc);
    b_.set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b != nullptr) b_.set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    if (t != nullptr) b_.set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    b_.set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    const float one = 1.0f;
    b_.set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    b_.set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    add(op);
  }
  // A new virtual f32 tensor of dims holding mode(x[, b]).
  cudnnBackendDescriptor_t pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                     const Dims& dims) {
    cudnnBackendDescriptor_t y = virtual_tensor(dims);
    pointwise(mode, x, b, y);
    return y;
  }

  // y = reduce(x) over the dims where y is 1.
  void reduction(cudnnReduceTensorOp_t reduce, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t desc = b_.make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    b_.set(desc, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
    b_.set(desc, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce);
    b_.finalize(desc);
    cudnnBackendDescriptor_t op = b_.make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    b_.set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &desc);
    b_.set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    b_.set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    add(op);
  }

  // y: x seen through other dims and strides (a transpose, never a copy).
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = b_.make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    b_.set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    b_.set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    add(op);
  }

  // scores with -inf where the key index passes the query index (top-left causal mask).
  cudnnBackendDescriptor_t causal_mask(cudnnBackendDescriptor_t scores, cudnnBackendDescriptor_t neg_inf,
                                       const Dims& dims) {
    cudnnBackendDescriptor_t row = virtual_tensor(dims, CUDNN_DATA_INT32);
    cudnnBackendDescriptor_t column = virtual_tensor(dims, CUDNN_DATA_INT32);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, row, nullptr, CUDNN_DATA_FLOAT, 2);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, column, nullptr, CUDNN_DATA_FLOAT, 3);
    cudnnBackendDescriptor_t keep = virtual_tensor(dims, CUDNN_DATA_BOOLEAN);
    pointwise(CUDNN_POINTWISE_CMP_GE, row, column, keep, nullptr, CUDNN_DATA_BOOLEAN);
    cudnnBackendDescriptor_t masked = virtual_tensor(dims);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, scores, neg_inf, masked, keep);
    return masked;
  }

  cudnnDataType_t io() const { return io_; }

  // The finalized operation graph, or nullptr when cuDNN refused any part of it.
  cudnnBackendDescriptor_t finish(cudnnHandle_t handle) {
    cudnnBackendDescriptor_t graph = b_.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    b_.set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops_.size()),
           ops_.data());
    b_.set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    b_.finalize(graph);
    return b_.ok() ? graph : nullptr;
  }

 private:
  void add(cudnnBackendDescriptor_t op) {
    b_.finalize(op);
    ops_.push_back(op);
  }

  GraphBuilder b_;
  cudnnDataType_t io_;
  int64_t next_virtual_ = kFirstVirtual;
  std::vector<cudnnBackendDescriptor_t> ops_;
};

// What a plan is made for: the pass, dtype, mask, sizes and the strides of q, k, v, out and,
// backward, grad_out, grad_q, grad_k, grad_v (every pointer is 16-byte aligned,
// kernels::cudnn_attention_refusal and choose see to it).
enum Operand {
  kOperandQ,
  kOperandK,
  kOperandV,
  kOperandOut,
  kOperandGradOut,
  kOperandGradQ,
  kOperandGradK,
  kOperandGradV,
  kOperands
};
struct PlanKey {
  int device;
  DType dtype;
  bool backward, causal;
  std::array<int64_t, 6 + 3 * kOperands> v;  // B, H, L, S, D, Dv, then each operand's strides of dims 0-2
  bool operator<(const PlanKey& o) const {
    return std::tie(device, dtype, backward, causal, v) < std::tie(o.device, o.dtype, o.backward, o.causal, o.v);
  }
};

const int64_t* key_strides(const PlanKey& key, int which) { return key.v.data() + 6 + 3 * which; }

// Operand `which` ([B, H, rows, width], unit last stride) as its plan's key has it.
cudnnBackendDescriptor_t operand(AttentionGraph& g, int64_t id, const PlanKey& key, int which, int64_t rows,
                                 int64_t width) {
  const int64_t* st = key_strides(key, which);
  return g.tensor(id, {key.v[0], key.v[1], rows, width}, {st[0], st[1], st[2], 1}, g.io());
}

// k or v ([B, H, S, X]) as the engines take it: transposed to [B, H, X, S].
cudnnBackendDescriptor_t transposed(AttentionGraph& g, int64_t id, const PlanKey& key, int which, int64_t width) {
  const int64_t* st = key_strides(key, which);
  const int64_t B = key.v[0], H = key.v[1], S = key.v[3];
  return g.tensor(id, {B, H, width, S}, {st[0], st[1], 1, st[2]}, g.io());
}

cudnnBackendDescriptor_t forward_graph(AttentionGraph& g, cudnnHandle_t handle, const PlanKey& key) {
  const int64_t B = key.v[0], H = key.v[1], L = key.v[2], S = key.v[3], D = key.v[4], Dv = key.v[5];
  const int64_t* qs = key_strides(key, 0);
  const int64_t* vs = key_strides(key, 2);
  const Dims scores_dims{B, H, L, S}, rows{B, H, L, 1};
  cudnnBackendDescriptor_t q = g.tensor(kQ, {B, H, L, D}, {qs[0], qs[1], qs[2], 1}, g.io());
  cudnnBackendDescriptor_t kt = transposed(g, kK, key, 1, D);
  cudnnBackendDescriptor_t v = g.tensor(kV, {B, H, S, Dv}, {vs[0], vs[1], vs[2], 1}, g.io());
  cudnnBackendDescriptor_t out = operand(g, kOut, key, kOperandOut, L, Dv);
  cudnnBackendDescriptor_t stats = g.tensor(kStats, rows, contiguous(rows), CUDNN_DATA_FLOAT);
  cudnnBackendDescriptor_t scale = g.scalar(kScale);

  cudnnBackendDescriptor_t raw = g.virtual_tensor(scores_dims);
  g.matmul(q, kt, raw);
  cudnnBackendDescriptor_t scores = g.pointwise(CUDNN_POINTWISE_MUL, raw, scale, scores_dims);
  if (key.causal) scores = g.causal_mask(scores, g.scalar(kNegInf), scores_dims);
  cudnnBackendDescriptor_t row_max = g.virtual_tensor(rows);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, scores, row_max);
  cudnnBackendDescriptor_t shifted = g.pointwise(CUDNN_POINTWISE_SUB, scores, row_max, scores_dims);
  cudnnBackendDescriptor_t exps = g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, scores_dims);
  cudnnBackendDescriptor_t row_sum = g.virtual_tensor(rows);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, exps, row_sum);
  cudnnBackendDescriptor_t log_sum = g.pointwise(CUDNN_POINTWISE_LOG, row_sum, nullptr, rows);
  g.pointwise(CUDNN_POINTWISE_ADD, row_max, log_sum, stats);
  // The probabilities enter the second product in the io type.
  cudnnBackendDescriptor_t p = g.virtual_tensor(scores_dims, contiguous(scores_dims), g.io());
  g.pointwise(CUDNN_POINTWISE_DIV, exps, row_sum, p);
  g.matmul(p, v, out);
  return g.finish(handle);
}

cudnnBackendDescriptor_t backward_graph(AttentionGraph& g, cudnnHandle_t handle, const PlanKey& key) {
  const int64_t B = key.v[0], H = key.v[1], L = key.v[2], S = key.v[3], D = key.v[4], Dv = key.v[5];
  const int64_t* qs = key_strides(key, 0);
  const int64_t* ks = key_strides(key, 1);
  const Dims scores_dims{B, H, L, S}, rows{B, H, L, 1};
  const Dims transposed_scores{B, H, S, L}, transposed_strides{H * L * S, L * S, 1, S};
  cudnnBackendDescriptor_t q = g.tensor(kQ, {B, H, L, D}, {qs[0], qs[1], qs[2], 1}, g.io());
  cudnnBackendDescriptor_t kt = transposed(g, kK, key, 1, D);
  cudnnBackendDescriptor_t vt = transposed(g, kV, key, 2, Dv);
  cudnnBackendDescriptor_t out = operand(g, kOut, key, kOperandOut, L, Dv);
  cudnnBackendDescriptor_t grad_out = operand(g, kGradOut, key, kOperandGradOut, L, Dv);
  cudnnBackendDescriptor_t stats = g.tensor(kStats, rows, contiguous(rows), CUDNN_DATA_FLOAT);
  cudnnBackendDescriptor_t grad_q = operand(g, kGradQ, key, kOperandGradQ, L, D);
  cudnnBackendDescriptor_t grad_k = operand(g, kGradK, key, kOperandGradK, S, D);
  cudnnBackendDescriptor_t grad_v = operand(g, kGradV, key, kOperandGradV, S, Dv);
  cudnnBackendDescriptor_t delta = g.tensor(kDelta, rows, contiguous(rows), CUDNN_DATA_FLOAT);
  cudnnBackendDescriptor_t scale = g.scalar(kScale);

  // delta = rowsum(grad_out * out), kept in memory (the workspace) for every key tile.
  cudnnBackendDescriptor_t products = g.pointwise(CUDNN_POINTWISE_MUL, grad_out, out, {B, H, L, Dv});
  cudnnBackendDescriptor_t row_dots = g.virtual_tensor(rows);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, products, row_dots);
  g.pointwise(CUDNN_POINTWISE_MUL, row_dots, g.scalar(kOne), delta);

  // p = exp(scale * q k^T [masked] - stats)
  cudnnBackendDescriptor_t raw = g.virtual_tensor(scores_dims);
  g.matmul(q, kt, raw);
  cudnnBackendDescriptor_t scores = g.pointwise(CUDNN_POINTWISE_MUL, raw, scale, scores_dims);
  cudnnBackendDescriptor_t shifted = g.pointwise(CUDNN_POINTWISE_SUB, scores, stats, scores_dims);
  if (key.causal) shifted = g.causal_mask(shifted, g.scalar(kNegInf), scores_dims);
  cudnnBackendDescriptor_t p = g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, scores_dims);

  // grad_v = p^T grad_out
  cudnnBackendDescriptor_t p_t = g.virtual_tensor(transposed_scores, transposed_strides, g.io());
  g.reshape(p, p_t);
  g.matmul(p_t, grad_out, grad_v);

  // ds = p * (grad_out v^T - delta) * scale
  cudnnBackendDescriptor_t dp = g.virtual_tensor(scores_dims);
  g.matmul(grad_out, vt, dp);
  cudnnBackendDescriptor_t centered = g.pointwise(CUDNN_POINTWISE_SUB, dp, delta, scores_dims);
  cudnnBackendDescriptor_t weighted = g.pointwise(CUDNN_POINTWISE_MUL, centered, p, scores_dims);
  cudnnBackendDescriptor_t ds = g.pointwise(CUDNN_POINTWISE_MUL, weighted, scale, scores_dims);

  // grad_k = ds^T q
  cudnnBackendDescriptor_t ds_t = g.virtual_tensor(transposed_scores, transposed_strides, g.io());
  g.reshape(ds, ds_t);
  g.matmul(ds_t, q, grad_k);

  // grad_q = ds k, written by the product itself (no f32 accumulator): the deterministic form.
  cudnnBackendDescriptor_t k = g.virtual_tensor({B, H, S, D}, {ks[0], ks[1], ks[2], 1}, CUDNN_DATA_FLOAT);
  g.reshape(kt, k);
  g.matmul(ds, k, grad_q);
  return g.finish(handle);
}

// ---- plans ----

struct Plan {
  Descriptors keep;
  cudnnBackendDescriptor_t plan = nullptr;
  size_t workspace = 0;                   // cuDNN's
  size_t delta_bytes = 0;                 // backward: delta's f32 rows, ahead of cuDNN's part of the workspace
  bool causal = false, backward = false;  // which by-value scalars the graph has
  std::mutex mutex;                       // one run at a time (the handle is bound to one stream per run)
};

// A plan for key, or nullptr when cuDNN offers no engine that finalizes. The first engine of
// cuDNN's heuristics (mode A, then the fallback list) that finalizes is kept; the backward
// refuses engines cuDNN notes as nondeterministic.
std::unique_ptr<Plan> make_plan(cudnnHandle_t handle, const PlanKey& key) {
  auto plan = std::make_unique<Plan>();
  AttentionGraph g(&plan->keep, key.dtype == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF);
  cudnnBackendDescriptor_t graph = key.backward ? backward_graph(g, handle, key) : forward_graph(g, handle, key);
  if (graph == nullptr) return nullptr;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (cudnnBackendDescriptor_t config : ranked_configs(graph, mode, &plan->keep)) {
      EngineNotes notes;
      if (!engine_notes(config, &notes, &plan->keep)) continue;
      if (key.backward && notes.has(CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)) continue;
      size_t workspace = 0;
      cudnnBackendDescriptor_t finalized = execution_plan(handle, config, &workspace, &plan->keep);
      if (finalized == nullptr) continue;
      plan->plan = finalized;
      plan->workspace = workspace;
      plan->causal = key.causal;
      plan->backward = key.backward;
      if (key.backward) {
        const size_t rows = static_cast<size_t>(key.v[0] * key.v[1] * key.v[2]);
        plan->delta_bytes = (rows * sizeof(float) + kDeltaAlignment - 1) / kDeltaAlignment * kDeltaAlignment;
      }
      return plan;
    }
  }
  return nullptr;
}

struct Slot {
  bool tried = false;
  std::unique_ptr<Plan> plan;  // null when cuDNN offered nothing
};

// key's plan, made on first use (nullptr when cuDNN offers none). Inside a capture a key
// without a plan gets nullptr and stays untried: building may compile and load kernels,
// which a capture must not see.
Plan* plan_for(const PlanKey& key) {
  static std::mutex mutex;
  static std::map<PlanKey, Slot> plans;  // kept for the process's lifetime (a model has few shapes)
  std::lock_guard<std::mutex> lock(mutex);
  Slot& slot = plans[key];
  if (!slot.tried) {
    if (capturing(key.device)) return nullptr;
    DeviceGuard guard(key.device);
    slot.plan = make_plan(cudnn_handle(key.device), key);
    slot.tried = true;
  }
  return slot.plan.get();
}

bool aligned(const std::vector<const Tensor*>& tensors) {
  for (const Tensor* t : tensors) {
    if (reinterpret_cast<uintptr_t>(t->data_ptr()) % kAlignment != 0) return false;
  }
  return true;
}

// The plan for this pass, or nullptr when it runs on the native kernels. operands: q, k, v,
// out and, backward, grad_out, grad_q, grad_k, grad_v (Operand's order).
Plan* choose(cuda::AttentionPass pass, const std::vector<const Tensor*>& operands, const Tensor& lse,
             const AttentionShape& shape, bool causal) {
  const Tensor& q = *operands[kOperandQ];
  kernels::AttentionEngineQuery query;
  query.requested = attention_engine();
  query.pass = pass;
  query.dtype = q.dtype();
  query.shape = shape;
  for (int i = 0; i < 3; ++i) {
    for (int d = 0; d < 3; ++d) query.strides[i][d] = operands[i]->stride(d);
  }
  std::vector<const Tensor*> pointers(operands);
  pointers.push_back(&lse);
  query.aligned = aligned(pointers);
  query.cudnn_version = static_cast<int>(cudnnGetVersion());
  const int device = q.device().index;
  query.compute_capability = compute_capability(device);
  query.deterministic = cuda::deterministic();
#if NORMCORE_HOPPER_KERNELS
  query.hopper_backward =
      query.compute_capability == 90 && kernels::hopper_attention() != kernels::HopperAttention::Off;
#endif
  if (kernels::cudnn_attention_refusal(query) != nullptr) return nullptr;
  PlanKey key{device, q.dtype(), pass == cuda::AttentionPass::Backward, causal, {}};
  const int64_t sizes[6] = {shape.batch, shape.heads, shape.L, shape.S, shape.D, shape.Dv};
  std::copy(sizes, sizes + 6, key.v.begin());
  for (size_t i = 0; i < operands.size(); ++i) {
    for (int d = 0; d < 3; ++d) {
      const int64_t stride = operands[i]->stride(d);
      // The outputs' and grad_out's rows too are moved 16 bytes at a time (as q's, k's, v's
      // in the rules).
      if (stride <= 0 || stride % 8 != 0) return nullptr;
      key.v[6 + 3 * i + d] = stride;
    }
  }
  return plan_for(key);
}

// Runs plan with the by-value scalars and the workspace; false when the workspace cannot be had.
bool run(Plan& plan, int device, double scale, std::vector<int64_t> ids, std::vector<void*> pointers) {
  Tensor workspace = try_workspace(plan.delta_bytes + plan.workspace, device);
  if (plan.delta_bytes + plan.workspace > 0 && !workspace.defined()) return false;
  char* base = workspace.defined() ? static_cast<char*>(workspace.data_ptr()) : nullptr;
  float scale_value = static_cast<float>(scale);
  // cuDNN before 9.10 masks with the lowest float rather than -inf.
  float neg_inf =
      cudnnGetVersion() < 91000 ? std::numeric_limits<float>::lowest() : -std::numeric_limits<float>::infinity();
  float one = 1.0f;
  ids.push_back(kScale);
  pointers.push_back(&scale_value);
  if (plan.causal) {
    ids.push_back(kNegInf);
    pointers.push_back(&neg_inf);
  }
  if (plan.backward) {
    ids.insert(ids.end(), {kOne, kDelta});
    pointers.insert(pointers.end(), {&one, base});
  }
  std::lock_guard<std::mutex> lock(plan.mutex);
  cudnnHandle_t handle = cudnn_handle(device);
  NC_CUDA_CHECK(execute_plan(handle, plan.plan, static_cast<int64_t>(ids.size()), ids.data(), pointers.data(),
                             base != nullptr ? base + plan.delta_bytes : nullptr));
  return true;
}

void* data(const Tensor& t) { return const_cast<void*>(static_cast<const void*>(t.data_ptr())); }

}  // namespace

bool cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionShape& shape,
                             bool causal, double scale, const Tensor& out, const Tensor& lse) {
  Plan* plan = choose(AttentionPass::Forward, {&q, &k, &v, &out}, lse, shape, causal);
  if (plan == nullptr) return false;
  return run(*plan, q.device().index, scale, {kQ, kK, kV, kOut, kStats},
             {data(q), data(k), data(v), data(out), data(lse)});
}

bool cudnn_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, const AttentionShape& shape, bool causal,
                              double scale, const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v) {
  Plan* plan =
      choose(AttentionPass::Backward, {&q, &k, &v, &out, &grad_out, &grad_q, &grad_k, &grad_v}, lse, shape, causal);
  if (plan == nullptr) return false;
  return run(*plan, q.device().index, scale, {kQ, kK, kV, kOut, kStats, kGradOut, kGradQ, kGradK, kGradV},
             {data(q), data(k), data(v), data(out), data(lse), data(grad_out), data(grad_q), data(grad_k),
              data(grad_v)});
}

}  // namespace cuda
}  // namespace normcore

#else  // no cuDNN at build time: every pass runs on the native kernels

namespace normcore {
namespace cuda {

bool cudnn_attention_forward(const Tensor&, const Tensor&, const Tensor&, const kernels::AttentionShape&, bool, double,
                             const Tensor&, const Tensor&) {
  return false;
}

bool cudnn_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const kernels::AttentionShape&, bool, double, const Tensor&, const Tensor&,
                              const Tensor&) {
  return false;
}

}  // namespace cuda
}  // namespace normcore

#endif  // NORMCORE_HAS_CUDNN
