// ONNX's loss ops, NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, on normcore's
// gather, index_select and log_softmax: input [N, C, d1, ...] with class targets
// [N, d1, ...], an optional per-class weight [C], ignore_index, and reduction none, sum or
// mean (mean divides by the total weight of the targets that are not ignored).
#include "onnx/proto.h"

namespace normcore {
namespace onnx {

namespace {

using Outputs = std::vector<Tensor>;

// -input[n, target[n, d...], d...] times weight[target] (1 without weights); a target equal
// to ignore_index adds no loss and no weight, whatever its row holds.
Tensor nll_loss(const NodeRun& n, const Tensor& input, const Tensor& target, const Tensor& weight) {
  const std::string reduction = n.attribute("reduction") ? n.attribute("reduction")->s() : "mean";
  NC_CHECK(reduction == "none" || reduction == "sum" || reduction == "mean", ValueError, n.where, ": reduction '",
           reduction, "' is not none, sum or mean");
  NC_CHECK(is_floating(input.dtype()), DTypeError, n.where, ": input must be floating, got ", describe(input));
  NC_CHECK(target.dtype() == DType::I32 || target.dtype() == DType::I64, DTypeError, n.where,
           ": target must be int32 or int64, got ", describe(target));
  bool fits = input.dim() >= 2 && target.dim() == input.dim() - 1 && target.size(0) == input.size(0);
  for (int64_t d = 1; fits && d < target.dim(); ++d) fits = target.size(d) == input.size(d + 1);
  NC_CHECK(fits, ShapeError, n.where, ": input [N, C, d1, ...] and target [N, d1, ...] do not fit, got ",
           describe(input), " and ", describe(target));
  const int64_t classes = input.size(1);
  const Tensor labels = target.to(DType::I64);
  const auto* ignore = n.attribute("ignore_index");
  const Tensor keep =
      ignore ? ne(labels, Scalar(ignore->i())) : ones(labels.shape(), TensorOptions(DType::Bool, labels.device()));
  const Tensor safe = where(keep, labels, Scalar(int64_t{0}));
  if (safe.numel() > 0) {
    const int64_t lo = min(safe).item<int64_t>(), hi = max(safe).item<int64_t>();
    NC_CHECK(lo >= 0 && hi < classes, IndexError, n.where, ": target holds ", lo < 0 ? lo : hi,
             ", outside the classes [0, ", classes, ")",
             ignore ? detail::cat_str(" and not ignore_index ", ignore->i()) : std::string(" (no ignore_index)"));
  }
  Tensor w;
  if (weight.defined()) {
    NC_CHECK(weight.dim() == 1 && weight.size(0) == classes, ShapeError, n.where, ": weight must be [C] = [", classes,
             "], got ", describe(weight));
    w = index_select(weight.to(input.dtype()), 0, safe.reshape({safe.numel()})).reshape(safe.shape());
  } else {
    w = ones(safe.shape(), TensorOptions(input.dtype(), input.device()));
  }
  w = where(keep, w, Scalar(0.0));
  const Tensor picked = gather(input, 1, safe.unsqueeze(1)).squeeze(1);
  const Tensor loss = where(keep, neg(mul(picked, w)), Scalar(0.0));
  if (reduction == "none") return loss;
  const Tensor total = sum(loss);
  return (reduction == "sum" ? total : div(total, sum(w))).to(input.dtype());
}

Outputs negative_log_likelihood_loss(const NodeRun& n) {
  return {nll_loss(n, n.input(0), n.input(1), n.has_input(2) ? n.input(2) : Tensor())};
}

// The loss of log_softmax(scores) over the classes (dim 1), and those log-probabilities as
// the second output.
Outputs softmax_cross_entropy_loss(const NodeRun& n) {
  const Tensor& scores = n.input(0);
  NC_CHECK(scores.dim() >= 2, ShapeError, n.where, ": scores must be [N, C, d1, ...], got ", describe(scores));
  NC_CHECK(is_floating(scores.dtype()), DTypeError, n.where, ": scores must be floating, got ", describe(scores));
  const Tensor log_prob = log_softmax(scores, 1);
  return {nll_loss(n, log_prob, n.input(1), n.has_input(2) ? n.input(2) : Tensor()), log_prob};
}

}  // namespace

void add_loss_ops(std::map<std::string, OpSpec>& table) {
  table["NegativeLogLikelihoodLoss"] = {negative_log_likelihood_loss, {"reduction", "ignore_index"}};
  table["SoftmaxCrossEntropyLoss"] = {softmax_cross_entropy_loss, {"reduction", "ignore_index"}};
}

}  // namespace onnx
}  // namespace normcore
