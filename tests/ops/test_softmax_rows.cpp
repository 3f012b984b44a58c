// softmax and log_softmax along the last dim of a contiguous tensor, where the back ends'
// row kernels (kernels/fused.h, softmax_rows) run, against the composition of max, sub, exp
// and sum that any other dim takes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "normcore/normcore.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;

// Along the last dim of a contiguous tensor the back end's row kernel runs (one pass for the
// max and the sum, one for the output); along another dim the composition of max, sub, exp
// and sum. Both on the same rows, on every device and floating dtype: equal within rounding,
// NaN rows (a NaN, an +inf, nothing but -inf) NaN throughout in both, CUDA within rounding of
// the CPU. Rows of 300 (the vector loads' tail) and 2000 (the wider block).
TEST(SoftmaxRows, MatchTheCompositionOnEveryDevice) {
  std::vector<nc::Device> devices{nc::Device::cpu()};
  if (nc::cuda_is_available()) devices.push_back(nc::Device::cuda());
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t cols : {int64_t{300}, int64_t{2000}}) {
    Tensor x = nc::mul(nc::randn({6, cols}), 4.0);
    std::vector<float> special(static_cast<size_t>(cols), -inf);
    x.narrow(0, 3, 1).copy_(nc::from_vector(special, {1, cols}));  // nothing but -inf
    special.assign(static_cast<size_t>(cols), 0.5f);
    special[7] = std::nanf("");
    x.narrow(0, 4, 1).copy_(nc::from_vector(special, {1, cols}));
    special[7] = inf;
    x.narrow(0, 5, 1).copy_(nc::from_vector(special, {1, cols}));
    for (DType dtype : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
      for (bool take_log : {false, true}) {
        const auto f = [&](const Tensor& t, int64_t d) { return take_log ? nc::log_softmax(t, d) : nc::softmax(t, d); };
        std::vector<float> cpu;
        for (const nc::Device& device : devices) {
          const Tensor in = x.to(device, dtype);
          const Tensor rows = f(in, -1);                                       // the row kernel
          const Tensor composed = f(in.t().contiguous(), 0).t().contiguous();  // the composition
          ASSERT_EQ(rows.dtype(), dtype);
          const std::vector<float> a = rows.to(nc::Device::cpu(), DType::F32).contiguous().to_vector<float>();
          const std::vector<float> b = composed.to(nc::Device::cpu(), DType::F32).contiguous().to_vector<float>();
          const double tol = dtype == DType::F16 ? 2e-3 : dtype == DType::BF16 ? 1e-2 : 1e-5;
          for (size_t i = 0; i < a.size(); ++i) {
            const bool nan_row = i >= static_cast<size_t>(3 * cols);
            if (nan_row) {
              ASSERT_TRUE(std::isnan(a[i]) && std::isnan(b[i])) << device.str() << " at " << i;
              continue;
            }
            ASSERT_NEAR(a[i], b[i], tol * (1 + std::fabs(b[i]))) << device.str() << " log " << take_log << " at " << i;
            if (!cpu.empty()) ASSERT_NEAR(a[i], cpu[i], tol * (1 + std::fabs(cpu[i]))) << "CUDA against the CPU";
          }
          if (device.is_cpu()) cpu = a;
        }
      }
    }
  }
}
