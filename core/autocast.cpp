// The per-thread autocast state and the casts the op front ends apply (lists in
// include/normcore/autocast.h).
#include "normcore/autocast.h"

#include "normcore/error.h"

namespace normcore {
namespace autocast {

namespace {

thread_local bool t_enabled = false;
thread_local DType t_dtype = DType::BF16;

// Floating, not f64 (PyTorch leaves f64 alone) and not already target.
bool eligible(const Tensor& t, DType target) {
  return t.defined() && is_floating(t.dtype()) && t.dtype() != DType::F64 && t.dtype() != target;
}

}  // namespace

bool is_enabled() { return t_enabled; }

DType dtype() { return t_dtype; }

Guard::Guard(DType dtype, bool enabled) : previous_enabled_(t_enabled), previous_dtype_(t_dtype) {
  NC_CHECK(dtype == DType::BF16 || dtype == DType::F16, DTypeError,
           "autocast::Guard: the dtype must be bf16 or f16, got ", dtype_name(dtype));
  t_enabled = enabled;
  t_dtype = dtype;
}

Guard::~Guard() {
  t_enabled = previous_enabled_;
  t_dtype = previous_dtype_;
}

Tensor to_lower(const Tensor& t) { return t_enabled && eligible(t, t_dtype) ? t.to(t_dtype) : t; }

Tensor to_float(const Tensor& t) { return t_enabled && eligible(t, DType::F32) ? t.to(DType::F32) : t; }

}  // namespace autocast
}  // namespace normcore
