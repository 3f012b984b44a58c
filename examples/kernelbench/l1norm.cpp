// KernelBench L1Norm: x / mean(|x|, dim 1) on x [32768, 65535] (l1_norm, eps 1e-12).
// Checked on the first two rows against float64 on the CPU.
#include "common.h"

namespace kb = kernelbench;
using kb::Tensor;

int main(int argc, char** argv) {
  const kb::Model model = [](const Tensor& x, const std::vector<Tensor>&) { return kb::nc::l1_norm(x, 1); };
  return kb::run(argc, argv,
                 {"kernelbench_l1norm",
                  "L1Norm over dim 1 of x [32768, 65535]",
                  {32768, 65535},
                  kb::no_params,
                  model,
                  kb::per_sample_check(model, 2)});
}
