// Loss functions with PyTorch's semantics (torch.nn.functional). Every loss checks its
// arguments and throws a normcore::Error naming the loss; the result is a 0-dim tensor for
// Reduction::Mean and Reduction::Sum, or one loss per element (per sample) for None.
// Mean divides by the number of elements that have a loss (N, or N * d1 * ... for
// per-position class targets). All are differentiable with respect to their float inputs.
#pragma once

#include "normcore/tensor.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {

enum class Reduction { Mean, Sum, None };

// Softmax cross entropy between logits and class indices, fused: one node whose backward
// is (softmax(logits) - q) * grad, with q = (1 - label_smoothing) * onehot(target) +
// label_smoothing / C (PyTorch's smoothing). Shapes: logits [N, C] with target [N];
// logits [C] with a 0-dim target; logits [N, C, d1, ...] with target [N, d1, ...].
// target is i64 with values in [0, C) or ignore_index (IndexError names the first bad value
// otherwise); a target equal to ignore_index adds no loss and no gradient, whatever its row of
// logits holds (NaN and infinities included), and Mean divides by the number of the other
// targets (NaN when there are none, as in PyTorch, with a zero gradient).
// label_smoothing in [0, 1]. f16/bf16 logits are computed in f32.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction = Reduction::Mean,
                     double label_smoothing = 0.0, int64_t ignore_index = -100);

// The mean cross entropy of the logits x @ weight^T over their first `classes` columns:
// cross_entropy(matmul(x, weight.narrow(0, 0, classes).t()), target) with Mean reduction, as
// one op that holds the logits once, in the matrix product's dtype (bf16 or f16 under
// autocast, which casts x and weight as matmul does), and never in f32: a kernel turns them
// in place into the gradient over them and gives each row's loss, and the backward is two
// matrix products. Logits over 256 MiB are made a piece of rows at a time (pieces of at
// most 256 MiB), each piece's gradient used at once for its share of x's gradient and summed
// in f32 into weight's, so they are never held whole: what waits for the backward is the
// two gradients (before the incoming factor), not the logits (a language model's head and
// its loss; weight may have rows past
// `classes`, such as a vocabulary padded for the tensor cores: they get zero gradient).
// x [..., C] and weight [V, C] floating of one dtype; target i64 of x's leading shape, values
// in [0, classes) or ignore_index (IndexError otherwise; on CUDA raised where the host next
// waits for the device, as for cross_entropy: docs/ERRORS.md); a target equal to
// ignore_index adds no loss and no gradient, and the mean is over the others (NaN when there
// are none, with a zero gradient), as in cross_entropy. classes in [1, V], -1 for V. The
// loss is f32 when autocast is on and x is f16/bf16, x's dtype otherwise (as
// cross_entropy's). No label smoothing; no double backward.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& target, int64_t classes = -1,
                            int64_t ignore_index = -100);

// Negative log likelihood: -log_probs[i, target[i]]. Same shapes and target rules as
// cross_entropy (log_probs take the place of logits).
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, Reduction reduction = Reduction::Mean);

// (input - target)^2, element-wise. input and target: same shape, floating.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

// |input - target|, element-wise. input and target: same shape, floating.
Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

// -(t log sigmoid(x) + (1 - t) log(1 - sigmoid(x))), computed without overflow as
// max(x, 0) - x t + log(1 + exp(-|x|)). logits and target: same shape, floating (target
// holds probabilities). One node: grad_logits = (sigmoid(x) - t) * grad, grad_target = -x * grad.
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        Reduction reduction = Reduction::Mean);

// The losses' former names in nn, from before functional ops all lived in namespace normcore.
// They forward to the functions above and go in a later release.
namespace nn {
using Reduction [[deprecated("use normcore::Reduction")]] = normcore::Reduction;
[[deprecated("use normcore::cross_entropy")]] inline Tensor cross_entropy(
    const Tensor& logits, const Tensor& target, normcore::Reduction reduction = normcore::Reduction::Mean,
    double label_smoothing = 0.0, int64_t ignore_index = -100) {
  return normcore::cross_entropy(logits, target, reduction, label_smoothing, ignore_index);
}
[[deprecated("use normcore::linear_cross_entropy")]] inline Tensor linear_cross_entropy(
    const Tensor& x, const Tensor& weight, const Tensor& target, int64_t classes = -1, int64_t ignore_index = -100) {
  return normcore::linear_cross_entropy(x, weight, target, classes, ignore_index);
}
[[deprecated("use normcore::nll_loss")]] inline Tensor nll_loss(
    const Tensor& log_probs, const Tensor& target, normcore::Reduction reduction = normcore::Reduction::Mean) {
  return normcore::nll_loss(log_probs, target, reduction);
}
[[deprecated("use normcore::mse_loss")]] inline Tensor mse_loss(
    const Tensor& input, const Tensor& target, normcore::Reduction reduction = normcore::Reduction::Mean) {
  return normcore::mse_loss(input, target, reduction);
}
[[deprecated("use normcore::l1_loss")]] inline Tensor l1_loss(
    const Tensor& input, const Tensor& target, normcore::Reduction reduction = normcore::Reduction::Mean) {
  return normcore::l1_loss(input, target, reduction);
}
[[deprecated("use normcore::binary_cross_entropy_with_logits")]] inline Tensor binary_cross_entropy_with_logits(
    const Tensor& logits, const Tensor& target, normcore::Reduction reduction = normcore::Reduction::Mean) {
  return normcore::binary_cross_entropy_with_logits(logits, target, reduction);
}
}  // namespace nn

}  // namespace normcore

#pragma GCC visibility pop
