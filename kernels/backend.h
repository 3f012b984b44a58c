// The interface every backend (kernels/cpu, kernels/cuda) implements. Core ops in core/
// validate arguments, allocate outputs and call these; the functions below assume valid
// input and may not be called with tensors of another device. All outputs are written
// (=), never accumulated, unless a function says +=. Tensors here are internal views:
// "expanded" means already broadcast to the output shape (strides may be 0).
#pragma once

#include <cstdint>

#include "normcore/scalar.h"
#include "normcore/tensor.h"

namespace normcore {

enum class UnaryOp {
  Neg, Abs, Sign, Relu,                  // any dtype but bool (Abs/Relu/Sign of u8 as usual)
  Exp, Log, Sqrt, Rsqrt, Sin, Cos, Tanh, Sigmoid, Gelu, GeluTanh,  // floating only
  Clamp,     // floating only: min(max(x, a), b); a = -inf / b = +inf when absent; NaN stays NaN
  PowScalar  // floating only: x ** a
};

enum class BinaryOp {
  Add, Sub, Mul, Div,  // Div on integers: never called (core promotes to float first)
  Maximum, Minimum,    // NaN propagates
  Pow,                 // not Bool; integers: exact, a negative exponent gives 0 (1 and -1 bases: +-1)
  Eq, Ne, Lt, Le, Gt, Ge  // out is Bool
};

enum class ReduceOp {
  Sum,   // out: i64 for integer/bool x, else x's dtype; empty -> 0
  Prod,  // as Sum; empty -> 1
  Mean,  // floating; empty -> NaN
  Var,   // floating; two-pass; divides by inner - arg (arg = correction: 0 or 1); inner - arg <= 0 -> NaN
  Norm,  // floating; arg = p > 0 (inf allowed: max |x|); empty -> 0
  Max, Min,  // x's dtype; NaN propagates; inner > 0
  All, Any   // out Bool; empty -> true / false
};

// The dtype of the statistics the normalization ops save: the accumulation type of the
// backend (the CPU reference keeps double; CUDA float, or double for f64 x).
inline DType norm_stats_dtype(Device device, DType dtype) {
  return device.is_cpu() || dtype == DType::F64 ? DType::F64 : DType::F32;
}

// Each backend namespace (normcore::cpu, normcore::cuda_kernels) defines all of these.
#define NORMCORE_BACKEND_FUNCTIONS                                                          \
  /* dst[i] = convert(src[i]); same shape, src expanded, any dtypes, dst any strides */     \
  void copy(const Tensor& dst, const Tensor& src);                                          \
  /* dst[i] = value converted to dst's dtype; dst any strides */                            \
  void fill(const Tensor& dst, Scalar value);                                               \
  /* out contiguous, same shape and dtype as x; x any strides */                            \
  void unary(UnaryOp op, const Tensor& out, const Tensor& x, double a, double b);           \
  /* a, b same dtype T, expanded to out's shape; out contiguous, dtype T (Bool for        \
     comparisons) */                                                                        \
  void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b);            \
  /* cond Bool, a and b out's dtype, all expanded to out's shape; out contiguous */         \
  void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);      \
  /* x contiguous [outer, inner]; out contiguous [outer] (dtype: see ReduceOp) */           \
  void reduce(ReduceOp op, const Tensor& out, const Tensor& x, double arg);                 \
  /* x contiguous [outer, inner], inner > 0; values [outer] x's dtype, indices [outer] i64; \
     first index of the max (min); a NaN wins and its first index is taken */               \
  void arg_reduce(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& x); \
  /* a [B, M, K], b [B, K, N], out [B, M, N] contiguous, one floating dtype. a and b each   \
     have stride(2) == 1 (row-major) or stride(1) == 1 (column-major, a transposed view),   \
     and any batch stride (0 when broadcast); K may be 0 (out = 0) */                       \
  void matmul(const Tensor& out, const Tensor& a, const Tensor& b);                         \
  /* x contiguous viewed as [outer, size, inner]; index contiguous 1-D i64 of length n;    \
     out contiguous [outer, n, inner]. Throws IndexError for an index outside [-size, size) \
     (negative indices count from the end) */                                               \
  void index_select(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index);  \
  /* x contiguous; index contiguous i64 with x's rank; out contiguous, index's shape;      \
     out[..i..] = x[..index[..i..]..] along dim. Throws IndexError out of [-size, size) */   \
  void gather(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index);        \
  /* out contiguous (+= into it); index contiguous i64; src contiguous, index's shape;      \
     out[..index[..i..]..] += src[..i..] along dim. Throws IndexError out of range (and     \
     then skips the bad elements). dtype not Bool or U8 */                                  \
  void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src); \
  /* out contiguous 1-D: out[i] = start + i * step, computed in double */                  \
  void arange(const Tensor& out, double start, double step);                                \
  /* out contiguous 1-D of n >= 2: start + i*step for i < n/2, end - (n-1-i)*step after,   \
     step = (end - start) / (n - 1) */                                                      \
  void linspace(const Tensor& out, double start, double end);                               \
  /* out contiguous; element i from Philox(seed, counter offset + i): see core/philox.h */  \
  void random_uniform(const Tensor& out, uint64_t seed, uint64_t offset);                   \
  void random_normal(const Tensor& out, uint64_t seed, uint64_t offset);                    \
  void random_int(const Tensor& out, uint64_t seed, uint64_t offset, int64_t low, uint64_t range); \
  /* Optimizer updates, in place, one pass over every buffer. param, grad and the state    \
     buffers are contiguous with one shape; param is floating and grad has its dtype;      \
     state is f32 for f16/bf16 params and the param's dtype otherwise. Math in float       \
     (double for f64), element by element:                                                 \
     sgd_step: g = grad + weight_decay*param; when momentum != 0:                          \
       momentum_buf = first_step ? g : momentum*momentum_buf + (1 - dampening)*g,          \
       g = nesterov ? g + momentum*momentum_buf : momentum_buf;                            \
     param = param - lr*g. momentum_buf is undefined and unused when momentum == 0. */     \
  void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, double lr, \
                double momentum, double dampening, double weight_decay, bool nesterov,     \
                bool first_step);                                                           \
  /* adam_step, step >= 1 (PyTorch's Adam, and AdamW when decoupled):                      \
     decoupled: param = param*(1 - lr*weight_decay), else g = grad + weight_decay*param;   \
     exp_avg = exp_avg + (1 - beta1)*(g - exp_avg)  (PyTorch's lerp form);                 \
     exp_avg_sq = beta2*exp_avg_sq + (1 - beta2)*g*g;                                      \
     denom = sqrt(exp_avg_sq)/sqrt(1 - beta2^step) + eps;                                  \
     param = param - lr/(1 - beta1^step) * exp_avg/denom. Host scalars in double.         \
     Both: every operation rounded on its own (no FMA), in this order, so that all         \
     backends produce the same bits. */                                                    \
  void adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,            \
                 const Tensor& exp_avg_sq, double lr, double beta1, double beta2, double eps, \
                 double weight_decay, bool decoupled, int64_t step);                        \
  /* Normalization ops (core/norms.cpp ties them to autograd). Every tensor contiguous;    \
     x, y, grad_y, grad_x, weight, bias, grad_weight, grad_bias share x's floating dtype;   \
     the saved statistics (mean, rstd, norm) have dtype norm_stats_dtype(device, dtype).   \
     Undefined weight/bias mean none; undefined grad_weight/grad_bias are not computed.    \
     layer_norm: x [rows, row_len]; mean, rstd [rows]; weight, bias [row_len];             \
     y = (x - mean) * rstd * weight + bias, biased variance, rstd = 1 / sqrt(var + eps). */ \
  void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,        \
                          int64_t rows, int64_t row_len, double eps, const Tensor& y,        \
                          const Tensor& mean, const Tensor& rstd);                           \
  void layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,      \
                           const Tensor& mean, const Tensor& rstd, int64_t rows,             \
                           int64_t row_len, const Tensor& grad_x, const Tensor& grad_weight, \
                           const Tensor& grad_bias);                                         \
  /* group_norm: x [batch, channels, spatial], channels = groups * (channels / groups);    \
     mean, rstd [batch * groups]; weight, bias [channels] */                                \
  void group_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,        \
                          int64_t batch, int64_t groups, int64_t channels, int64_t spatial,  \
                          double eps, const Tensor& y, const Tensor& mean, const Tensor& rstd); \
  void group_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,      \
                           const Tensor& mean, const Tensor& rstd, int64_t batch,            \
                           int64_t groups, int64_t channels, int64_t spatial,                \
                           const Tensor& grad_x, const Tensor& grad_weight,                  \
                           const Tensor& grad_bias);                                         \
  /* l1_norm: x [outer, size, inner] -> y = x / max(mean(|x|, dim 1), eps); norm           \
     [outer, inner] holds mean(|x|) before the clamp (0 when size == 0) */                 \
  void l1_norm_forward(const Tensor& x, int64_t outer, int64_t size, int64_t inner,          \
                       double eps, const Tensor& y, const Tensor& norm);                     \
  void l1_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& norm,           \
                        int64_t outer, int64_t size, int64_t inner, double eps,              \
                        const Tensor& grad_x);                                               \
  /* frobenius_norm: y = x / max(sqrt(sum(x * x)), eps) over all elements; norm [] holds   \
     sqrt(sum(x * x)). Backward: the norm's gradient is 0 where the clamp is active */      \
  void frobenius_norm_forward(const Tensor& x, double eps, const Tensor& y, const Tensor& norm); \
  void frobenius_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& norm,    \
                               double eps, const Tensor& grad_x);

namespace cpu {
NORMCORE_BACKEND_FUNCTIONS
}  // namespace cpu

namespace cuda_kernels {
NORMCORE_BACKEND_FUNCTIONS
}  // namespace cuda_kernels

}  // namespace normcore
