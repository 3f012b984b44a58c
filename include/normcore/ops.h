// Tensor operations. Every op checks its arguments (shapes, dtypes, devices) and throws a
// normcore::Error naming the op; all tensor arguments must be on one device. Binary ops
// broadcast like NumPy and promote dtypes like PyTorch. Results are new tensors.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "normcore/tensor.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {

// ---- element-wise unary: [*] -> [*] ----
// Float-only ops (exp, log, ...) take floating dtypes; integer inputs are promoted to f32.
Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor sign(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
// The error function; integer tensors give f32 (as exp and the other float-only ops).
Tensor erf(const Tensor& x);
// Rounding to an integer value, in x's dtype: down, up, and to the nearest with halves to even
// (torch.round). Integer tensors come back as copies. Gradients are zero.
Tensor floor(const Tensor& x);
Tensor ceil(const Tensor& x);
Tensor round(const Tensor& x);
// Exact GELU, x * Phi(x); approximate = true uses the tanh form.
Tensor gelu(const Tensor& x, bool approximate = false);
// Either bound may be absent; both NaN-free; min <= max when both are given.
Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max);
Tensor pow(const Tensor& x, Scalar exponent);

// ---- element-wise binary with broadcasting: [a], [b] -> broadcast([a], [b]) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
// True division: integer inputs give f32.
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
// Comparisons give bool.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
// cond (bool) ? a : b, all three broadcast together.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

// Scalar forms: the scalar takes part in promotion as PyTorch's "wrapped number" does
// (i32 tensor + 2.5 gives f32; f16 tensor + 2.5 stays f16). An integer scalar wraps into
// a narrower integer dtype (u8 + 256 is u8 + 0, as in PyTorch), except in div, which
// computes in f32 (u8 / 256 is 0.0039...), and in maximum and minimum, which refuse a
// scalar their dtype cannot hold (ValueError). sub refuses a bool scalar.
Tensor add(const Tensor& a, Scalar b);
Tensor sub(const Tensor& a, Scalar b);
Tensor mul(const Tensor& a, Scalar b);
Tensor div(const Tensor& a, Scalar b);
Tensor maximum(const Tensor& a, Scalar b);
Tensor minimum(const Tensor& a, Scalar b);
Tensor eq(const Tensor& a, Scalar b);
Tensor ne(const Tensor& a, Scalar b);
Tensor lt(const Tensor& a, Scalar b);
Tensor le(const Tensor& a, Scalar b);
Tensor gt(const Tensor& a, Scalar b);
Tensor ge(const Tensor& a, Scalar b);
Tensor where(const Tensor& cond, const Tensor& a, Scalar b);
Tensor where(const Tensor& cond, Scalar a, const Tensor& b);

Tensor operator-(const Tensor& x);
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, Scalar b);
Tensor operator-(const Tensor& a, Scalar b);
Tensor operator*(const Tensor& a, Scalar b);
Tensor operator/(const Tensor& a, Scalar b);
Tensor operator+(Scalar a, const Tensor& b);
Tensor operator-(Scalar a, const Tensor& b);
Tensor operator*(Scalar a, const Tensor& b);
Tensor operator/(Scalar a, const Tensor& b);

// The dtype of op(a, b) for the binary ops above (before comparisons turn it into bool).
DType result_type(const Tensor& a, const Tensor& b);
DType result_type(const Tensor& a, Scalar b);
// Shape both broadcast to; throws ShapeError naming op when they do not.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op = "broadcast_shapes");

// ---- reductions over dims (empty dims: all dims); [*] -> [*] less dims (kept as 1 with keepdim) ----
// Integer and bool sums give i64; f16/bf16 accumulate in f32.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Floating dtypes only.
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Two-pass variance (accurate when |mean| >> std); unbiased divides by n - 1.
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, bool unbiased = true, bool keepdim = false);
Tensor prod(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// p-norm (p > 0, or infinity) over dims; floating dtypes only.
Tensor norm(const Tensor& x, double p = 2.0, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Bool results: whether all / any element is non-zero.
Tensor all(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor any(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Largest / smallest element (all dims); NaN propagates.
Tensor max(const Tensor& x);
Tensor min(const Tensor& x);
// Values and (first) indices (i64) along one dim; NaN counts as the largest and smallest.
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false);
// Index of the first maximum along dim; over the flattened tensor without dim.
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x);
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);

// ---- normalized exponentials along one dim: [*] -> [*] ----
// Floating dtypes; the row maximum is subtracted first, so large inputs do not overflow.
// f16/bf16 compute in f32 and round the result. Each records a single backward node.
Tensor softmax(const Tensor& x, int64_t dim);
// log(softmax(x, dim)) computed as (x - max) - log(sum(exp(x - max))).
Tensor log_softmax(const Tensor& x, int64_t dim);

// ---- linear algebra ----
// NumPy matmul: 1-D operands are promoted and the added dim removed; batch dims broadcast.
// [.., n, k] @ [.., k, m] -> [.., n, m]. Floating dtypes; f16/bf16 accumulate in f32.
Tensor matmul(const Tensor& a, const Tensor& b);

// ---- joining, splitting, indexing ----
// Same dtype and device; shapes equal except along dim.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
// New dim at position dim; all shapes equal.
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Views of pieces of split_size (the last may be smaller).
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
// Views of pieces with the given sizes (summing to x.size(dim)).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
// out[.., i, ..] = x[.., index[i], ..] along dim; index 1-D i32/i64.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// out[i][j][k] = x[i][index[i][j][k]][k] (dim = 1); index has x's rank, sizes <= x's off dim.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// Returns a copy of x with out[i][index[i][j][k]][k] += src[i][j][k] (dim = 1).
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
// [*] integer classes in [0, num_classes) -> [*, num_classes] i64 (num_classes < 0: max + 1).
Tensor one_hot(const Tensor& index, int64_t num_classes = -1);
// x with value where mask (bool) is true; x and mask broadcast together (the result has
// their broadcast shape, as in PyTorch).
Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value);

}  // namespace normcore

#pragma GCC visibility pop
