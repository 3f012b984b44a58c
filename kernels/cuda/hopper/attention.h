// Scaled dot-product attention on Hopper's warpgroup MMA and tensor memory accelerator
// (attention_forward.cu, attention_backward.cu, compiled for sm_90a only;
// kernels/cuda/attention/attention.cu calls them first when the build has them). The contract is kernels/attention.h's.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/attention/flash.cuh"
#include "kernels/cuda/launch.cuh"

namespace normcore {
namespace cuda {
namespace hopper {

// Why p's forward does not run on the Hopper kernels, or nullptr when it does: an sm_90
// device, D == Dv of 64, 128 or 256, 16-byte aligned rows (p.vectorized), sizes that fit the
// tensor maps.
template <class T>
const char* forward_refusal(int compute_capability, const flash::AttentionParams<T, float>& p);

// Runs the forward (out and lse) when forward_refusal is nullptr, pipelined or one product at
// a time (kernels::HopperAttention); false (nothing launched) otherwise.
bool attention_forward(const Launcher& launch, const flash::AttentionParams<__half, float>& p, bool pipelined);
bool attention_forward(const Launcher& launch, const flash::AttentionParams<__nv_bfloat16, float>& p,
                       bool pipelined);

// Runs the backward (delta = rowsum(grad_out * out) into p.delta, B * H * L floats, then the
// gradients) when forward_refusal is nullptr, D is 64 or 128
// and grad_out's strides suit a tensor map and the gradients' rows take 4-byte stores;
// false (nothing launched) otherwise. Not deterministic: grad_q summed with atomic additions
// in f32 (faster); deterministic: every gradient written once.
bool attention_backward(const Launcher& launch, const flash::AttentionParams<__half, float>& p, bool deterministic);
bool attention_backward(const Launcher& launch, const flash::AttentionParams<__nv_bfloat16, float>& p,
                        bool deterministic);

}  // namespace hopper
}  // namespace cuda
}  // namespace normcore
