// matmul with NumPy semantics: 1-D operands gain (and then lose) a dim, batch dims
// broadcast, and each operand reaches the backend as a [batch, rows, cols] view that is
// row- or column-major (transposed views need no copy; broadcast batches use stride 0).
#include <atomic>

#include "autograd/graph.h"
#include "core/internal.h"
#include "kernels/matmul.h"
#include "normcore/autocast.h"
#include "normcore/cuda.h"
#include "normcore/ops.h"

namespace normcore {

using namespace detail;

namespace {

// t [..batch.., rows, cols] broadcast to batch_shape, as a [B, rows, cols] view whose
// matrices have stride(2) == 1 and stride(1) >= cols, or stride(1) == 1 and stride(2) >= rows.
Tensor as_matrix_batch(const Tensor& t, const Shape& batch_shape) {
  int64_t rows = t.size(-2), cols = t.size(-1);
  Shape full_shape = batch_shape;
  full_shape.push_back(rows);
  full_shape.push_back(cols);
  Tensor e = t.expand(full_shape);
  int64_t batch = checked_numel(batch_shape, "matmul");
  // One stride for all batch dims, if the expanded batch dims collapse into one.
  int64_t batch_stride = 0;
  bool batch_ok = true;
  {
    int64_t expected = -1;
    for (int64_t d = static_cast<int64_t>(batch_shape.size()) - 1; d >= 0; --d) {
      if (batch_shape[d] == 1) continue;
      int64_t s = e.stride(d);
      if (expected < 0) {
        batch_stride = s;
        expected = s * batch_shape[d];
      } else if (s != expected && !(s == 0 && batch_stride == 0)) {
        batch_ok = false;
      } else {
        expected = s * batch_shape[d];
      }
    }
  }
  int64_t rs = e.stride(-2), cs = e.stride(-1);
  if (cols == 1) cs = 1;
  if (rows == 1) rs = std::max<int64_t>(cols, 1);
  bool row_major = cs == 1 && rs >= std::max<int64_t>(cols, 1);
  bool col_major = rs == 1 && cs >= std::max<int64_t>(rows, 1);
  if (cols == 1 && rows == 1) row_major = true;
  if (batch_ok && (row_major || col_major))
    return make_view(e, {batch, rows, cols}, {batch_stride, rs, cs}, e.offset());
  return e.contiguous().view({batch, rows, cols});
}

// Whether float32 matmuls may use TF32 (cuda::set_allow_tf32).
std::atomic<bool> g_allow_tf32{false};

}  // namespace

void cuda::set_allow_tf32(bool allow) { g_allow_tf32.store(allow); }

bool cuda::allow_tf32() { return g_allow_tf32.load(); }

Tensor matmul(const Tensor& a_arg, const Tensor& b_arg) {
  const OpScope op("matmul");
  const Tensor a_in = autocast::to_lower(a_arg), b_in = autocast::to_lower(b_arg);
  check_defined(op, "a", a_in);
  check_defined(op, "b", b_in);
  check_same_device(op, "a", a_in, "b", b_in);
  NC_CHECK(a_in.dim() >= 1 && b_in.dim() >= 1, ShapeError, op, ": both operands need at least 1 dim, got shapes ",
           a_in.shape(), " and ", b_in.shape());
  NC_CHECK(a_in.dtype() == b_in.dtype(), DTypeError, op, ": dtypes differ (a is ", describe(a_in), ", b is ",
           describe(b_in), ")");
  NC_CHECK(is_floating(a_in.dtype()), DTypeError, op, ": expects floating tensors, got ", describe(a_in));
  Tensor a = a_in.dim() == 1 ? a_in.unsqueeze(0) : a_in;
  Tensor b = b_in.dim() == 1 ? b_in.unsqueeze(1) : b_in;
  NC_CHECK(a.size(-1) == b.size(-2), ShapeError, op, ": inner sizes differ: ", a_in.shape(), " @ ", b_in.shape(), " (",
           a.size(-1), " vs ", b.size(-2), ")");
  if (a_in.dim() >= 3 && b_in.dim() == 2) {
    // [..., n, k] @ [k, m] (a Linear layer's input and weight) is one GEMM over the folded
    // rows, as in PyTorch: its weight gradient is then one GEMM as well, not a batched one
    // whose per-batch products would be summed afterwards.
    Shape out_shape = a_in.shape();
    out_shape.back() = b_in.size(1);
    const int64_t rows = checked_numel(Shape(a_in.shape().begin(), a_in.shape().end() - 1), op);
    return matmul(a_in.reshape({rows, a_in.size(-1)}), b_in).reshape(out_shape);
  }
  Shape a_batch(a.shape().begin(), a.shape().end() - 2);
  Shape b_batch(b.shape().begin(), b.shape().end() - 2);
  Shape batch = broadcast_shapes(a_batch, b_batch, op);
  int64_t rows = a.size(-2), cols = b.size(-1);

  Shape out_shape = batch;
  out_shape.push_back(rows);
  out_shape.push_back(cols);
  Tensor out = new_tensor(out_shape, a.dtype(), a.device());
  if (out.numel() > 0) {
    autograd::NoGradGuard no_grad;
    int64_t count = checked_numel(batch, op);
    kernels::matmul(out.device())
        .matmul(out.view({count, rows, cols}), as_matrix_batch(a, batch), as_matrix_batch(b, batch));
  }
  autograd::record(op, out, {a, b}, [sa = autograd::saved(a), sb = autograd::saved(b)](const Tensor& g) {
    // grad_a = g @ b^T and grad_b = a^T @ g, summed over the batch dims that broadcast. An
    // operand that is a transposed view (a Linear's weight^T) gets its gradient as the
    // transpose of (b^T @ g^T)^T resp. (g^T @ a)^T: the same products, laid out so that the
    // view's backward hands the parameter a contiguous gradient (no copy when it is kept).
    const Tensor& a = sa.get();
    const Tensor& b = sb.get();
    auto transposed_view = [](const Tensor& t) {
      return t.dim() >= 2 && t.size(-2) > 1 && t.size(-1) > 1 && t.stride(-2) == 1 && t.stride(-1) == t.size(-2);
    };
    Tensor ga = transposed_view(a) ? matmul(b, g.transpose(-1, -2)).transpose(-1, -2) : matmul(g, b.transpose(-1, -2));
    Tensor gb = transposed_view(b) ? matmul(g.transpose(-1, -2), a).transpose(-1, -2) : matmul(a.transpose(-1, -2), g);
    ga = autograd::sum_to(ga, a.shape());
    gb = autograd::sum_to(gb, b.shape());
    return std::vector<Tensor>{ga, gb};
  });
  if (a_in.dim() == 1) out = out.squeeze(-2);
  if (b_in.dim() == 1) out = out.squeeze(-1);
  return out;
}

}  // namespace normcore
