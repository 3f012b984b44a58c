// linear_cross_entropy (normcore/losses.h): a language model's head and its loss as one
// recorded op. One matrix product makes the logits [N, V] in the compute dtype; one kernel
// (kernels/fused.h, cross_entropy_rows) gives each row's loss and overwrites the logits with
// the gradient over them; backward is the two matrix products of that gradient with weight
// and x. The composition cross_entropy(matmul(...)) would hold the logits in the compute
// dtype, again in f32, their log-softmax and the gradient in f32, and pass over them about
// ten times. When the logits would take more than kLinearCrossEntropyChunkBytes, they are
// made a piece of rows at a time and each piece's gradient is used at once (in_chunks), so
// they are never held whole: GPT-2's 1.5 GiB at 16 x 1024 tokens becomes 7 pieces of at
// most 256 MiB.
#include <tuple>
#include <utility>

#include "autograd/graph.h"
#include "core/internal.h"
#include "kernels/backend.h"
#include "kernels/fused.h"
#include "kernels/matmul.h"
#include "normcore/autocast.h"
#include "normcore/losses.h"
#include "normcore/ops.h"

namespace normcore {

using namespace detail;

namespace {

bool is_half(DType d) { return d == DType::F16 || d == DType::BF16; }

// t * s for a 0-dim s, in f32 for f16 (whose range the factor and the products may leave),
// in t's dtype otherwise.
Tensor scaled(const Tensor& t, const Tensor& s) {
  if (t.dtype() == DType::F16) return mul(t.to(DType::F32), s.to(DType::F32)).to(DType::F16);
  return mul(t, s.to(t.dtype()));
}

// The number of targets that count towards the mean (not ignore_index) and its inverse (0
// when there are none), counted on the device in dtype.
std::pair<Tensor, Tensor> counted_targets(const Tensor& target, int64_t ignore_index, DType dtype) {
  const Tensor count = sum(ne(target, Scalar(ignore_index)).to(dtype));
  return {count, div(ones_like(count), maximum(count, Scalar(1.0)))};
}

// The logits in `chunks` pieces of rows, each made, turned into its gradient, and used at
// once for its share of both input gradients: grad_x's rows, and grad_weight summed over the
// pieces in f32 (f64 for f64) before one rounding. What is kept for the backward is the two
// gradients before the upstream factor, not the logits. Where autocast lowered an f32
// weight (master, what the caller passed), the f32 sum is master's gradient as it stands:
// never rounded to 16 bits and widened again.
Tensor in_chunks(const char* op, const Tensor& x, const Tensor& weight, const Tensor& master, const Tensor& target,
                 int64_t classes, int64_t ignore_index, int64_t chunks, DType loss_dtype, bool rows_scaled) {
  const Device device = x.device();
  const int64_t rows = x.size(0), width = x.size(1), vocab = weight.size(0);
  const int64_t piece = (rows + chunks - 1) / chunks;
  const DType sum_dtype = x.dtype() == DType::F64 ? DType::F64 : DType::F32;
  const Tensor& w = master.dtype() == sum_dtype && master.dtype() != weight.dtype() ? master : weight;
  const bool record = autograd::needs_grad(x, w);
  const bool want_x = record && x.requires_grad(), want_weight = record && w.requires_grad();
  Tensor loss, inverse_count, grad_x, grad_weight;
  {
    autograd::NoGradGuard no_grad;
    const DType stats = kernels::stats_dtype(device, x.dtype());
    Tensor count;
    std::tie(count, inverse_count) = counted_targets(target, ignore_index, stats);
    const Tensor row_loss = new_tensor({rows}, stats, device);
    Tensor weight_sum = want_weight ? new_tensor({vocab, width}, sum_dtype, device) : Tensor();
    if (want_x) grad_x = new_tensor({rows, width}, x.dtype(), device);
    const kernels::MatmulKernels& products = kernels::matmul(device);
    for (int64_t first = 0; first < rows; first += piece) {
      const int64_t n = std::min(piece, rows - first);
      const Tensor xs = x.narrow(0, first, n);
      const Tensor g = matmul(xs, weight.t()).contiguous();
      kernels::fused(device).cross_entropy_rows(op, g, target.narrow(0, first, n), classes, ignore_index,
                                                rows_scaled ? inverse_count : Tensor(), row_loss.narrow(0, first, n));
      if (want_x) grad_x.narrow(0, first, n).copy_(matmul(g, weight));
      if (want_weight && !products.matmul_accumulate(weight_sum, g.t(), xs, first == 0))
        weight_sum = first == 0 ? matmul(g.t(), xs).to(sum_dtype) : add(weight_sum, matmul(g.t(), xs).to(sum_dtype));
    }
    loss = div(sum(row_loss), count).to(loss_dtype);
    if (want_weight) grad_weight = weight_sum.to(w.dtype());
  }
  if (!record) return loss;
  autograd::record(op, loss, {x, w}, [grad_x, grad_weight, inverse_count, rows_scaled](const Tensor& grad) {
    const Tensor s = rows_scaled ? grad : mul(grad.to(inverse_count.dtype()), inverse_count);
    return std::vector<Tensor>{grad_x.defined() ? scaled(grad_x, s) : Tensor(),
                               grad_weight.defined() ? scaled(grad_weight, s) : Tensor()};
  });
  return loss;
}

}  // namespace

Tensor linear_cross_entropy(const Tensor& x_arg, const Tensor& weight_arg, const Tensor& target_arg, int64_t classes,
                            int64_t ignore_index) {
  return detail::linear_cross_entropy_in_chunks(x_arg, weight_arg, target_arg, classes, ignore_index,
                                                kLinearCrossEntropyChunkBytes);
}

namespace detail {

Tensor linear_cross_entropy_in_chunks(const Tensor& x_arg, const Tensor& weight_arg, const Tensor& target_arg,
                                      int64_t classes, int64_t ignore_index, int64_t chunk_bytes) {
  const OpScope op("linear_cross_entropy");
  check_defined(op, "x", x_arg);
  check_defined(op, "weight", weight_arg);
  check_defined(op, "target", target_arg);
  const Tensor x_in = autocast::to_lower(x_arg), weight = autocast::to_lower(weight_arg);
  check_same_device(op, "x", x_in, "weight", weight);
  check_same_device(op, "x", x_in, "target", target_arg);
  NC_CHECK(is_floating(x_in.dtype()) && x_in.dtype() == weight.dtype(), DTypeError, op,
           ": x and weight must be floating of one dtype, got x ", describe(x_in), " and weight ", describe(weight));
  NC_CHECK(target_arg.dtype() == DType::I64, DTypeError, op, ": target must hold i64 class indices, got ",
           describe(target_arg));
  NC_CHECK(x_in.dim() >= 1 && weight.dim() == 2 && weight.size(1) == x_in.size(-1), ShapeError, op,
           ": x must be [..., C] and weight [V, C], got x ", describe(x_in), " and weight ", describe(weight));
  const Shape leading(x_in.shape().begin(), x_in.shape().end() - 1);
  NC_CHECK(target_arg.shape() == leading, ShapeError, op, ": target must have x's leading shape ", shape_str(leading),
           ", got ", describe(target_arg));
  const int64_t vocab = weight.size(0), width = weight.size(1);
  if (classes == -1) classes = vocab;
  NC_CHECK(classes >= 1 && classes <= vocab, ValueError, op, ": classes must be in [1, ", vocab,
           "] (weight's rows) or -1, got ", classes);
  const int64_t rows = checked_numel(leading, op);
  const Tensor x = x_in.reshape({rows, width});
  const Tensor target = target_arg.reshape({rows}).contiguous();
  const Device device = x.device();
  const DType loss_dtype = autocast::is_enabled() && is_half(x.dtype()) ? DType::F32 : x.dtype();
  // The mean is over the rows whose target is not ignore_index, counted on the device (NaN
  // when there are none, with a zero gradient, as in PyTorch). The gradient rows carry its
  // 1 / count unless they are f16, where p / count would fall below the smallest normal for
  // large counts; then backward applies it.
  const bool rows_scaled = x.dtype() != DType::F16;
  const int64_t row_bytes = std::max<int64_t>(1, vocab * static_cast<int64_t>(dtype_size(x.dtype())));
  const int64_t most_rows = std::max<int64_t>(1, chunk_bytes / row_bytes);
  if (rows > most_rows)
    return in_chunks(op, x, weight, weight_arg, target, classes, ignore_index, (rows + most_rows - 1) / most_rows,
                     loss_dtype, rows_scaled);
  Tensor grad_logits, loss, inverse_count;
  {
    autograd::NoGradGuard no_grad;
    grad_logits = matmul(x, weight.t()).contiguous();
    const DType stats = kernels::stats_dtype(device, x.dtype());
    Tensor count;
    std::tie(count, inverse_count) = counted_targets(target, ignore_index, stats);
    const Tensor row_loss = new_tensor({rows}, stats, device);
    kernels::fused(device).cross_entropy_rows(op, grad_logits, target, classes, ignore_index,
                                              rows_scaled ? inverse_count : Tensor(), row_loss);
    loss = div(sum(row_loss), count).to(loss_dtype);
  }
  if (!autograd::needs_grad(x, weight)) return loss;
  autograd::record(op, loss, {x, weight},
                   [gs = autograd::saved(grad_logits), xs = autograd::saved(x), ws = autograd::saved(weight),
                    want_x = x.requires_grad(), want_weight = weight.requires_grad(), inverse_count,
                    rows_scaled](const Tensor& grad) {
                     const Tensor& g = gs.get();
                     const Tensor s = rows_scaled ? grad : mul(grad.to(inverse_count.dtype()), inverse_count);
                     Tensor grad_x = want_x ? scaled(matmul(g, ws.get()), s) : Tensor();
                     Tensor grad_weight = want_weight ? scaled(matmul(g.t(), xs.get()), s) : Tensor();
                     return std::vector<Tensor>{grad_x, grad_weight};
                   });
  return loss;
}

}  // namespace detail
}  // namespace normcore
