// KernelBench LayerNorm: layer_norm over the trailing (64, 256, 256) of x [16, 64, 256, 256],
// with weight (ones) and bias (zeros) of that shape, as PyTorch's nn.LayerNorm starts.
// Checked on the first sample against float64 on the CPU.
#include "common.h"

namespace kb = kernelbench;
using kb::Tensor;

namespace {
const std::vector<int64_t> kNormalizedShape = {64, 256, 256};
}  // namespace

int main(int argc, char** argv) {
  const auto make_params = [](const kb::Options& o, kb::nc::Generator&) {
    const kb::nc::TensorOptions on_device(o.dtype, o.device);
    return std::vector<Tensor>{kb::nc::ones(kNormalizedShape, on_device).requires_grad_(),
                               kb::nc::zeros(kNormalizedShape, on_device).requires_grad_()};
  };
  const kb::Model model = [](const Tensor& x, const std::vector<Tensor>& p) {
    return kb::nc::layer_norm(x, kNormalizedShape, p[0], p[1]);
  };
  return kb::run(argc, argv,
                 {"kernelbench_layernorm",
                  "LayerNorm over (64, 256, 256) of x [16, 64, 256, 256]",
                  {16, 64, 256, 256},
                  make_params,
                  model,
                  kb::per_sample_check(model, 1)});
}
