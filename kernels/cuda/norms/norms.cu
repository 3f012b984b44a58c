// The CUDA normalization kernels as the norms family (kernels/norms.h). CudaNorms
// (norms.cuh) has its layer and group norm in affine.cu, its batch norm in batch_norm.cu,
// its L1 norm in l1_norm.cu and its Frobenius norm in frobenius_norm.cu.
#include "kernels/cuda/norms/norms.cuh"

namespace normcore {
namespace cuda {

const kernels::NormKernels& norm_kernels() {
  static const CudaNorms kernels;
  return kernels;
}

}  // namespace cuda
}  // namespace normcore
