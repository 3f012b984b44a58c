// cuDNN's fused flash attention, the second engine of the CUDA attention kernels
// (kernels/attention.h's contract, lse included): forward and backward graphs of cuDNN's
// graph API on its backend descriptors (kernels/cuda/cudnn_graph.h), built once per shape,
// strides, dtype, mask and pass into an execution plan and run many times.
// kernels/cuda/attention/attention.cu tries it first and runs its own kernels when it
// declines.
#pragma once

#include "kernels/attention.h"

namespace normcore {
namespace cuda {

// Each runs its pass on cuDNN and returns true, or returns false having done nothing: the
// engine settings or kernels::cudnn_attention_refusal rule cuDNN out, cuDNN offers no engine
// for the graph (remembered), the workspace cannot be had, or a CUDA graph is being
// captured and the pass has no plan yet (building one is not captured work). Arguments as
// AttentionKernels' (already checked).
bool cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const kernels::AttentionShape& shape,
                             bool causal, double scale, const Tensor& out, const Tensor& lse);
bool cudnn_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, const kernels::AttentionShape& shape, bool causal,
                              double scale, const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v);

}  // namespace cuda
}  // namespace normcore
