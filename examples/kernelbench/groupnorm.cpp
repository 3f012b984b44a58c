// KernelBench GroupNorm: group_norm with 8 groups of x [112, 64, 512, 512] (64 channels),
// weight (ones) and bias (zeros) [64] as PyTorch's nn.GroupNorm starts. Checked on the
// first sample against float64 on the CPU.
#include "common.h"

namespace kb = kernelbench;
using kb::Tensor;

int main(int argc, char** argv) {
  const auto make_params = [](const kb::Options& o, kb::nc::Generator&) {
    const kb::nc::TensorOptions on_device(o.dtype, o.device);
    return std::vector<Tensor>{kb::nc::ones({64}, on_device).requires_grad_(),
                               kb::nc::zeros({64}, on_device).requires_grad_()};
  };
  const kb::Model model = [](const Tensor& x, const std::vector<Tensor>& p) {
    return kb::nc::group_norm(x, 8, p[0], p[1]);
  };
  return kb::run(argc, argv,
                 {"kernelbench_groupnorm",
                  "GroupNorm (8 groups, 64 channels) of x [112, 64, 512, 512]",
                  {112, 64, 512, 512},
                  make_params,
                  model,
                  kb::per_sample_check(model, 1)});
}
