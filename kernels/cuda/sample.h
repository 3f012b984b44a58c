// sample_logits's CUDA kernel (sample.cu), which CudaGenerate (generate.cu) runs; the
// contract is kernels/generate.h's.
#pragma once

#include "kernels/generate.h"

namespace normcore {
namespace cuda {

void sample_logits(const Tensor& logits, uint64_t seed, uint64_t offset, const uint64_t* offset_base,
                   double temperature, int64_t top_k, double top_p, const Tensor& out);

}  // namespace cuda
}  // namespace normcore
