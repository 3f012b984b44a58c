// Element-wise kernels: copy with dtype conversion, fill, unary and binary math, where.
// core/elementwise.cpp and core/tensor.cpp (copy_, fill_) check, broadcast and promote; the
// element math itself is kernels/scalar/elementwise.h, shared by both backends.
#pragma once

#include "kernels/backend.h"
#include "normcore/scalar.h"

namespace normcore {

enum class UnaryOp {
  Neg,
  Abs,
  Sign,
  Relu,  // any dtype but bool (integers wrap: neg/abs of the minimum);
         // sign(NaN) = 0 and relu(NaN) = NaN, as in PyTorch
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Sin,
  Cos,
  Tanh,
  Sigmoid,
  Gelu,
  GeluTanh,   // floating only
  Clamp,      // floating only: min(max(x, a), b); a = -inf / b = +inf when absent; NaN stays NaN
  PowScalar,  // floating only: x ** a
  Erf,
  Floor,
  Ceil,
  Round  // floating only; Round to the nearest integer, halves to even (as torch.round)
};

enum class BinaryOp {
  Add,
  Sub,
  Mul,
  Div,  // integers wrap; Div only for floating dtypes (core promotes first)
  Maximum,
  Minimum,       // NaN propagates
  Pow,           // not Bool; integers: exact, a negative exponent gives 0 (1 and -1 bases: +-1)
  GeluGrad,      // floating only: a * gelu'(b), gelu's backward (gradient a, input b) in one pass
  GeluTanhGrad,  // floating only: the same for the tanh approximation
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge  // out is Bool (keep them last)
};

namespace kernels {

class ElementwiseKernels {
 public:
  // dst[i] = convert(src[i]); same shape, src expanded, any dtypes, dst any strides.
  virtual void copy(const Tensor& dst, const Tensor& src) const = 0;
  // dst[i] = value converted to dst's dtype; dst any strides.
  virtual void fill(const Tensor& dst, Scalar value) const = 0;
  // out contiguous, same shape and dtype as x (not bool); x any strides.
  virtual void unary(UnaryOp op, const Tensor& out, const Tensor& x, double a, double b) const = 0;
  // a, b same dtype T, expanded to out's shape; out contiguous, dtype T (Bool for comparisons).
  virtual void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) const = 0;
  // cond Bool, a and b out's dtype, all expanded to out's shape; out contiguous.
  virtual void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) const = 0;

 protected:
  ~ElementwiseKernels() = default;
};

}  // namespace kernels

namespace cpu {
const kernels::ElementwiseKernels& elementwise_kernels();
}
namespace cuda {
const kernels::ElementwiseKernels& elementwise_kernels();
}

namespace kernels {
inline const ElementwiseKernels& elementwise(Device device) {
  return for_device(device, cpu::elementwise_kernels, NC_CUDA_KERNELS(elementwise_kernels), "elementwise");
}
}  // namespace kernels

}  // namespace normcore
