// The attention kernels: scaled dot-product attention, forward and backward (core/attention.cpp
// checks arguments, makes the strides fit and ties them to autograd).
//
// Layout: q [B, H, L, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv]; H a multiple of Hkv, q head h
// attending with k and v head h / (H / Hkv) (grouped-query attention; Hkv = H without it).
// out, grad_out, grad_q, grad_k, grad_v per q head: out and grad_out [B, H, L, Dv], grad_q
// [B, H, L, D], grad_k [B, H, S, D], grad_v [B, H, S, Dv] (the caller sums grad_k and grad_v
// over each group of H / Hkv q heads). All of these have any strides on the first three
// dims and stride 1 on the last (views of a [B, L, 3, H, D] projection, an output laid out
// [B, L, H, Dv]); the outputs do not overlap each other or the inputs. Every tensor shares
// q's floating dtype but lse [B, H, L], contiguous, of stats_dtype (kernels/backend.h).
// f16/bf16 compute in f32.
//
// scores[i, j] = scale * dot(q[i], k[j]), with j > i masked (-inf) when causal (the top-left
// alignment of PyTorch's is_causal; with L > S every row keeps j = 0);
// lse[i] = log(sum_j exp(scores[i, j])), p[i, j] = exp(scores[i, j] - lse[i]);
// out[i] = sum_j p[i, j] v[j]. S == 0 gives out = 0 and lse = -inf.
// Backward, with dp[i, j] = dot(grad_out[i], v[j]) and delta[i] = sum_j p[i, j] dp[i, j]
// (dot(grad_out[i], out[i]) in exact arithmetic, which the f32, f16 and bf16 CUDA kernels use
// with p from lse; the CPU and f64 kernels recompute p from the row's max and sum and sum
// delta so, which keeps a saturated softmax's gradient as exact as PyTorch's):
// ds = p * (dp - delta); grad_q = scale * ds k, grad_k = scale * ds^T q, grad_v = p^T grad_out.
// Every output is written (=); sums run in a fixed order, so results are deterministic.
// On CUDA, f16 and bf16 passes may run on cuDNN's fused attention instead
// (kernels/cuda/attention/cudnn_attention.h) under the same contract, lse included; which
// engine runs is cudnn_attention_refusal's answer below.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "normcore/cuda.h"

namespace normcore {
namespace kernels {

struct AttentionShape {
  int64_t batch, heads, L, S, D, Dv;
  int64_t kv_heads = heads;  // k's and v's heads, a divisor of heads
};

class AttentionKernels {
 public:
  // The head dims (D, Dv) this backend runs, at most (core refuses larger ones with an error).
  virtual int64_t max_head_dim() const = 0;
  virtual void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionShape& shape,
                                 bool causal, double scale, const Tensor& out, const Tensor& lse) const = 0;
  virtual void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, const AttentionShape& shape, bool causal,
                                  double scale, const Tensor& grad_q, const Tensor& grad_k,
                                  const Tensor& grad_v) const = 0;
  // One step of incremental decoding (cached_attention): q [B, H, 1, D], k [B, Hkv, 1, D],
  // v [B, Hkv, 1, Dv] with any strides but the last dim's; k_cache [B, Hkv, S, D], v_cache
  // [B, Hkv, S, Dv] contiguous; positions [B] i64 contiguous; out [B, H, 1, Dv] contiguous
  // (shape.L == 1). For row b with p = positions[b] in [0, S): k and v are written into the
  // caches at position p, and q attends to cache positions 0..p (position p read from k and v
  // themselves, so q heads sharing a kv head do not wait on the write). A p outside [0, S)
  // writes nothing and gives out = 0 for the row: on the CPU an IndexError, on CUDA recorded
  // in the device's index-error record (runtime/cuda/index_errors.h), raised at the host's
  // next wait.
  virtual void cached_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache,
                                const Tensor& v_cache, const Tensor& positions, const AttentionShape& shape,
                                double scale, const Tensor& out) const = 0;

 protected:
  ~AttentionKernels() = default;
};

// ---- which engine runs a CUDA pass (cuda::set_attention_engine) ----

// What decides between cuDNN's fused attention and the native kernels for one pass.
struct AttentionEngineQuery {
  cuda::AttentionEngine requested = cuda::AttentionEngine::Auto;
  cuda::AttentionPass pass = cuda::AttentionPass::Forward;
  DType dtype = DType::F32;
  AttentionShape shape{0, 0, 0, 0, 0, 0};
  int64_t strides[3][3] = {};  // q's, k's and v's strides of dims 0, 1, 2 (elements; dim 3's is 1)
  bool aligned = false;        // every data pointer of the pass 16-byte aligned
  int cudnn_version = 0;       // cudnnGetVersion() (9.14.0 is 91400); 0: no cuDNN in the build
  int compute_capability = 0;  // major * 10 + minor
  bool deterministic = false;  // cuda::deterministic()
  // The Hopper kernels can take the backward: the build has them, the device is sm_90 and
  // kernels::hopper_attention() is not Off.
  bool hopper_backward = false;
};

// nullptr when the pass may run on cuDNN (it still falls back when cuDNN offers no engine),
// else why it runs on the native kernels. Pure: the rules of cuda.h's AttentionEngine.
const char* cudnn_attention_refusal(const AttentionEngineQuery& query);

// Which engine ran the last CUDA pass on this thread (cuda::last_attention_engine); the
// CUDA kernels record it. Defined in core/attention.cpp.
void record_attention_engine(cuda::AttentionPass pass, cuda::AttentionEngine engine);

// Which of the native CUDA kernels ran the last native pass on this thread: "wgmma" (the
// Hopper kernels, kernels/cuda/hopper/), "mma.sync" (the tensor-core kernels of flash.cuh),
// "cublas" (the f16/bf16 backward past head dim 128, kernels/cuda/attention/matrix_backward.h)
// or "simt" (f32, f64); nullptr before any. For benchmarks and tests; core/attention.cpp.
void record_native_attention_kernels(cuda::AttentionPass pass, const char* kernels);
const char* last_native_attention_kernels(cuda::AttentionPass pass);
// Whether a pass that may run on the Hopper kernels does, and in which form: Pipelined (the
// default: a tile's softmax runs while the previous tile's P V is on the tensor cores),
// Serial (one product at a time), Off (the mma.sync kernels); process-wide, for benchmarks
// and tests that set the forms side by side.
enum class HopperAttention { Off, Serial, Pipelined };
void set_hopper_attention(HopperAttention mode);
HopperAttention hopper_attention();

}  // namespace kernels

namespace cpu {
const kernels::AttentionKernels& attention_kernels();
}
namespace cuda {
const kernels::AttentionKernels& attention_kernels();
}

namespace kernels {
inline const AttentionKernels& attention(Device device) {
  return for_device(device, cpu::attention_kernels, NC_CUDA_KERNELS(attention_kernels), "attention");
}
}  // namespace kernels

}  // namespace normcore
