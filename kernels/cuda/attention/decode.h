// cached_attention's CUDA kernel (decode.cu), which CudaAttention (attention.cu) runs; the
// contract is kernels/attention.h's.
#pragma once

#include "kernels/attention.h"

namespace normcore {
namespace cuda {

void cached_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache,
                      const Tensor& positions, const kernels::AttentionShape& shape, double scale, const Tensor& out);

}  // namespace cuda
}  // namespace normcore
