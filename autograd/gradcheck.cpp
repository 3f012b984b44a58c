// gradcheck: backward()'s gradients against central differences, in float64.
#include <cmath>
#include <sstream>

#include "normcore/autograd.h"
#include "normcore/ops.h"
#include "normcore/random.h"

namespace normcore {

namespace {

// sum(fn(xs) * weight) as a double, without recording.
double weighted_output(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& xs,
                       const Tensor& weight) {
  autograd::NoGradGuard no_grad;
  Tensor out = fn(xs);
  return sum(mul(out.to(DType::F64), weight)).item<double>();
}

}  // namespace

bool gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs,
               GradcheckOptions options, std::string* report) {
  const char* op = "gradcheck";
  NC_CHECK(options.eps > 0, ValueError, op, ": eps must be positive, got ", options.eps);
  std::vector<Tensor> xs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) {
      xs.push_back(inputs[i]);
      continue;
    }
    NC_CHECK(!inputs[i].requires_grad() || inputs[i].dtype() == DType::F64, DTypeError, op, ": input ", i, " is ",
             describe(inputs[i]), "; inputs that require grad must be f64");
    Tensor x = inputs[i].detach().clone();
    if (inputs[i].requires_grad()) x.requires_grad_();
    xs.push_back(x);
  }

  Tensor out = fn(xs);
  NC_CHECK(out.defined() && out.requires_grad(), ValueError, op,
           ": the function's output does not depend on any input that requires grad");
  Generator gen(0x6772616463686bULL);
  Tensor weight = randn(out.shape(), TensorOptions(DType::F64, out.device()), &gen);
  sum(mul(out.to(DType::F64), weight)).backward();

  for (size_t i = 0; i < xs.size(); ++i) {
    if (!xs[i].defined() || !xs[i].requires_grad()) continue;
    Tensor analytical_t = xs[i].grad();
    std::vector<double> analytical =
        analytical_t.defined() ? analytical_t.to_vector<double>() : std::vector<double>(xs[i].numel(), 0.0);
    std::vector<double> values = xs[i].to_vector<double>();
    for (size_t j = 0; j < values.size(); ++j) {
      auto at = [&](double delta) {
        std::vector<double> v = values;
        v[j] += delta;
        std::vector<Tensor> probe = xs;
        probe[i] = from_vector(v, xs[i].shape(), xs[i].device());
        return weighted_output(fn, probe, weight);
      };
      double numerical = (at(options.eps) - at(-options.eps)) / (2 * options.eps);
      double err = std::fabs(analytical[j] - numerical);
      if (!(err <= options.atol + options.rtol * std::fabs(numerical))) {
        if (report) {
          std::ostringstream s;
          s << "gradcheck: input " << i << " " << describe(xs[i]) << ", element " << j << ": backward gives "
            << analytical[j] << ", central differences give " << numerical << " (difference " << err << ")";
          *report = s.str();
        }
        return false;
      }
    }
  }
  if (report) report->clear();
  return true;
}

}  // namespace normcore
