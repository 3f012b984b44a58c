// The cross-entropy row kernels (kernels/fused.h, cross_entropy_rows) on CUDA against the
// CPU's on the same 16-bit logits, bit for bit as input: every row shape the CUDA kernels
// split on (16-byte rows with and without padded classes, in the small and the large block,
// rows that are not whole vectors), targets in every part of a row, the gradient's factor
// given and not, ignored targets, rows with NaN, +inf, nothing but -inf, and a large offset.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/fused.h"
#include "normcore/normcore.h"
#include "tests/test_support.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;

namespace {

struct RowsOutcome {
  std::vector<double> loss;
  std::vector<float> grad;
};

// loss and the gradient the back end's kernel writes over a copy of logits.
RowsOutcome run_rows(const Tensor& logits, const Tensor& target, int64_t classes, double scale, nc::Device device) {
  const Tensor g = logits.to(device).clone();
  const Tensor t = target.to(device);
  const DType stats = nc::kernels::stats_dtype(device, logits.dtype());
  const Tensor loss = nc::empty({target.numel()}, nc::TensorOptions(stats, device));
  const Tensor factor = scale > 0 ? nc::full({}, scale, nc::TensorOptions(stats, device)) : Tensor();
  nc::kernels::fused(device).cross_entropy_rows("cross_entropy", g, t, classes, -100, factor, loss);
  return {normcore_test::values(loss), g.to(nc::Device::cpu(), DType::F32).contiguous().to_vector<float>()};
}

}  // namespace

TEST(CrossEntropyRows, CudaMatchesCpuOnTheSameLogits) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    int64_t cols, classes;
  };
  // GPT-2's padded head (the large block, a tail of padded classes), whole vectors without
  // padding, the small block with padding, and rows that are not whole vectors.
  for (const Case& c : {Case{50304, 50257}, Case{4096, 4096}, Case{1000, 997}, Case{1030, 1030}}) {
    constexpr int64_t kRows = 12;
    const int64_t last = c.classes - 1;
    // Targets: the first class, the last (in a padded vector), the middle, an ignored row,
    // and the rest spread over the row.
    const std::vector<int64_t> t = {0, last, c.classes / 2, -100, 7, last - 9, 3, 11, 1, 2, c.classes / 3, 5};
    Tensor logits = nc::mul(nc::randn({kRows, c.cols}), 3.0);
    logits.narrow(0, 1, 1).copy_(nc::add(logits.narrow(0, 1, 1), 40.0));  // |mean| well past the spread
    std::vector<float> row(static_cast<size_t>(c.cols), -inf);
    logits.narrow(0, 8, 1).copy_(nc::from_vector(row, {1, c.cols}));  // nothing but -inf
    row.assign(static_cast<size_t>(c.cols), 0.25f);
    row[3] = std::nanf("");
    logits.narrow(0, 9, 1).copy_(nc::from_vector(row, {1, c.cols}));  // a NaN
    row[3] = inf;
    logits.narrow(0, 10, 1).copy_(nc::from_vector(row, {1, c.cols}));  // an +inf
    if (c.cols > c.classes) {  // NaN and +inf in padded columns count for nothing
      Tensor padded = logits.narrow(0, 11, 1).narrow(1, c.classes, c.cols - c.classes);
      padded.fill_(std::nan(""));
    }
    const Tensor target = nc::from_vector(t, {kRows});
    for (DType dtype : {DType::BF16, DType::F16}) {
      for (double scale : {0.0, 0.125}) {  // no factor (1), and 1 / 8
        SCOPED_TRACE(std::to_string(c.cols) + " cols, " + std::to_string(c.classes) + " classes, " +
                     nc::dtype_name(dtype) + ", factor " + std::to_string(scale));
        const Tensor x = logits.to(dtype);
        const RowsOutcome cpu = run_rows(x, target, c.classes, scale, nc::Device::cpu());
        const RowsOutcome cuda = run_rows(x, target, c.classes, scale, nc::Device::cuda());
        // One rounding of the 16-bit gradient apart, at most.
        const double ulp = dtype == DType::BF16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
        for (int64_t r = 0; r < kRows; ++r) {
          const double a = cuda.loss[static_cast<size_t>(r)], b = cpu.loss[static_cast<size_t>(r)];
          const bool nan_row = r == 8 || r == 9 || r == 10;
          if (nan_row) {
            ASSERT_TRUE(std::isnan(a) && std::isnan(b)) << "row " << r;
          } else {
            ASSERT_NEAR(a, b, 2e-5 * (1 + std::fabs(b))) << "row " << r;
          }
          for (int64_t j = 0; j < c.cols; ++j) {
            const float ga = cuda.grad[static_cast<size_t>(r * c.cols + j)];
            const float gb = cpu.grad[static_cast<size_t>(r * c.cols + j)];
            if (nan_row && j < c.classes) {
              ASSERT_TRUE(std::isnan(ga) && std::isnan(gb)) << "row " << r << " col " << j;
            } else if (r == 3 || j >= c.classes) {
              ASSERT_EQ(ga, 0.0f) << "row " << r << " col " << j;  // ignored, or a padded class
              ASSERT_EQ(gb, 0.0f) << "row " << r << " col " << j;
            } else {
              ASSERT_NEAR(ga, gb, ulp * std::fabs(gb) + 1e-7) << "row " << r << " col " << j;
            }
          }
        }
      }
    }
  }
}

// A target outside the classes is an IndexError at the host's next wait, from the 16-bit
// kernel as from the others; its row's loss is NaN and its gradient 0, and the device stays
// usable.
TEST(CrossEntropyRows, CudaBadTargetIsAnIndexError) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const nc::Device cuda = nc::Device::cuda();
  const Tensor logits = nc::randn({2, 64}).to(cuda, DType::BF16);
  const Tensor loss = nc::empty({2}, nc::TensorOptions(DType::F32, cuda));
  normcore_test::throws<nc::IndexError>(
      [&] {
        nc::kernels::fused(cuda).cross_entropy_rows(
            "cross_entropy", logits, nc::from_vector<int64_t>({1, 60}, {2}).to(cuda), 50, -100, Tensor(), loss);
        (void)normcore_test::values(loss);
      },
      {"cross_entropy", "target value 60", "50 classes"})();
  const std::vector<double> l = normcore_test::values(loss);
  EXPECT_FALSE(std::isnan(l[0]));
  EXPECT_TRUE(std::isnan(l[1]));
  EXPECT_EQ(normcore_test::values(nc::max(nc::abs(logits.narrow(0, 1, 1).to(DType::F32)))), std::vector<double>{0.0});
}
