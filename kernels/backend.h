// What every kernel family shares. A family (elementwise.h, reduce.h, norms.h, ...) is an
// abstract class whose pure virtual functions are its kernels, each with its contract; the
// CPU backend (kernels/cpu/) and the CUDA backend (kernels/cuda/) each implement it once,
// and `kernels::<family>(device)` returns the implementation for a device, so a call from
// core reads `kernels::norms(x.device()).layer_norm_forward(...)`.
//
// Kernels assume valid input (core checks arguments first) and never see tensors of another
// device. Outputs are written (=), never accumulated, unless a kernel says +=. "Expanded"
// means already broadcast to the output's shape (strides may be 0).
#pragma once

#include <type_traits>

#include "base/build.h"
#include "normcore/device.h"
#include "normcore/tensor.h"

// The accessor of a family's CUDA implementation, or nullptr in a build without CUDA (where
// kernels/cuda/ is not compiled).
#ifdef NORMCORE_HAS_CUDA
#define NC_CUDA_KERNELS(accessor) (&::normcore::cuda::accessor)
#else
#define NC_CUDA_KERNELS(accessor) nullptr
#endif

namespace normcore {

// A tensor's elements as T*, and nullptr for an undefined tensor (an optional weight, a
// gradient not asked for).
template <class T>
T* data_as(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}
template <class T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}

namespace kernels {

// The dtype of the statistics a forward kernel saves for its backward (a norm's mean and
// rstd, attention's log-sum-exp): the accumulation type of the backend (the CPU reference
// keeps double; CUDA float, or double for f64 inputs).
inline DType stats_dtype(Device device, DType dtype) {
  return device.is_cpu() || dtype == DType::F64 ? DType::F64 : DType::F32;
}

// The implementation of Family for device's backend.
template <class Family>
const Family& for_device(Device device, const Family& (*cpu)(), std::add_pointer_t<const Family&()> cuda,
                         const char* family) {
  if (device.is_cpu()) return cpu();
  if (cuda == nullptr) detail::throw_no_cuda(family);
  return cuda();
}

}  // namespace kernels
}  // namespace normcore
