// The f16/bf16 attention backward as matrix products on cuBLAS, for head dims past 128, where
// the fused kernels would hold dK and dV in more registers than a thread has (attention.cu
// runs it there; matrix_backward.cu says how). The contract is kernels/attention.h's, with
// p.delta holding rowsum(grad_out * out) and p.lse the forward's log-sum-exp.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/attention/flash.cuh"
#include "kernels/cuda/launch.cuh"

namespace normcore {
namespace cuda {

// Whether matrix_backward runs p: keys and queries to attend (L, S > 0) and every operand's
// rows at least as far apart as they are wide (cuBLAS's leading dimensions), as they are but
// for rows broadcast with stride 0.
template <class T>
bool matrix_backward_takes(const flash::AttentionParams<T, float>& p);

// grad_q, grad_k and grad_v of p; matrix_backward_takes(p) must hold.
void matrix_backward(const Launcher& launch, const flash::AttentionParams<__half, float>& p);
void matrix_backward(const Launcher& launch, const flash::AttentionParams<__nv_bfloat16, float>& p);

}  // namespace cuda
}  // namespace normcore
