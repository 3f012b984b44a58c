// Attention: PyTorch's F.scaled_dot_product_attention, one recorded op with its own fused
// kernels (the CUDA ones never write the L x S score matrix to device memory; they keep
// each query row's log-sum-exp for backward). Floating dtypes; f16/bf16 compute in f32.
#pragma once

#include <optional>

#include "normcore/tensor.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {

// softmax(q @ k^T * scale + mask) @ v for q [B, H, L, D], k [B, H, S, D], v [B, H, S, Dv]
// -> [B, H, L, Dv]. scale defaults to 1 / sqrt(D). is_causal masks key j for query i when
// j > i (PyTorch's top-left alignment; with L > S every query keeps key 0). enable_gqa
// (grouped-query and multi-query attention, PyTorch's enable_gqa=True): k and v may have
// Hkv heads, a divisor of H, and q head h attends with their head h / (H / Hkv). q, k and v
// may be views with any strides (the last dim is made contiguous when it is not); they share
// a floating dtype and a device. D and Dv are at most 256 on CUDA. Gradients flow to q, k, v.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal = false,
                                    std::optional<double> scale = std::nullopt, bool enable_gqa = false);

// Self-attention on one packed projection: qkv [B, L, 3, H, D] holds q, k and v along dim 2
// (a Linear of width 3 * H * D seen as such), and the result is [B, L, H, D], the layout the
// output projection reads as [B, L, H * D]. The values and gradients are those of
// scaled_dot_product_attention(q, k, v, is_causal, scale).transpose(1, 2) with
// q = qkv.select(2, 0).transpose(1, 2) (k, v likewise), but the kernels write the output in
// this order and the gradient as one [B, L, 3, H, D] tensor: no transposing copies and no
// zero-filled gradient per view. qkv floating, any strides but the last dim's; D at most
// 256 on CUDA.
Tensor packed_self_attention(const Tensor& qkv, bool is_causal = false, std::optional<double> scale = std::nullopt);

// One step of incremental decoding over a KV cache whose fill lives on the device, so that a
// CUDA graph of the step replays at every position (FlashAttention's attention with a KV
// cache): for each batch row b with p = positions[b], writes k[b] and v[b] into k_cache and
// v_cache at position p, then q[b] attends to the cache's positions 0..p. q [B, H, 1, D],
// k [B, Hkv, 1, D], v [B, Hkv, 1, Dv] (Hkv a divisor of H, as with enable_gqa), any strides
// but the last dim's; k_cache [B, Hkv, S, D] and v_cache [B, Hkv, S, Dv] contiguous, of q's
// dtype; positions i64 [B] on q's device -> [B, H, 1, Dv], scale 1 / sqrt(D) by default. The
// positions are read by the kernel, not the host: one outside [0, S) writes nothing and gives
// zeros for its row, and is an IndexError, at once on the CPU and at the next wait for the
// device on a GPU. Inference only: an Error when q, k or v would need a gradient.
Tensor cached_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& positions, std::optional<double> scale = std::nullopt);

}  // namespace normcore

#pragma GCC visibility pop
