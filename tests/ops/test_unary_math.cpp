// The host's own float functions of kernels/scalar/math.h against the C library's in double:
// tanh (a polynomial near 0, exp beyond) within 2 ulp of the exact value at every float
// exponent from 2^-30 to 2^5 and at 200,000 points of [-12, 12], odd, signed zeros kept,
// +-1 far out, NaN through; and the op on the CPU (on contiguous f32 the AVX-512 form where
// the processor has it, else the same scalar function) to the same bounds, GELU's tanh form
// with it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/scalar/math.h"
#include "normcore/normcore.h"

namespace nc = normcore;

namespace {

// |got - exact| in units in the last place of the float nearest exact.
double ulps(float got, double exact) {
  const float near = static_cast<float>(exact);
  const double ulp = std::nextafter(std::fabs(near), std::numeric_limits<float>::infinity()) - std::fabs(near);
  return std::fabs(static_cast<double>(got) - exact) / ulp;
}

// The sweep: every float exponent from 2^-30 to 2^5, 200,000 points of [-12, 12] and the
// scalar form's switch and cut-off.
std::vector<float> tanh_sweep() {
  std::vector<float> xs;
  for (int e = -30; e <= 5; ++e) {
    for (float m : {1.0f, 1.1f, 1.37f, 1.5f, 1.73f, 1.99f}) xs.push_back(std::ldexp(m, e));
  }
  for (int i = 0; i <= 200000; ++i) xs.push_back(-12.0f + 24.0f * static_cast<float>(i) / 200000.0f);
  for (float v : {0.55f, std::nextafter(0.55f, 0.0f), 8.9f, 9.0f, 9.1f, 20.0f, 100.0f}) xs.push_back(v);
  return xs;
}

}  // namespace

TEST(UnaryMath, HostTanhWithinTwoUlp) {
  const std::vector<float> xs = tanh_sweep();
  double worst = 0;
  float worst_at = 0;
  for (float x : xs) {
    for (float v : {x, -x}) {
      const float got = normcore::math::tanh(v);
      const double u = ulps(got, std::tanh(static_cast<double>(v)));
      if (u > worst) worst = u, worst_at = v;
      ASSERT_EQ(got, -normcore::math::tanh(-v)) << "not odd at " << v;
    }
  }
  EXPECT_LE(worst, 2.0) << "worst at " << worst_at;
  EXPECT_EQ(normcore::math::tanh(30.0f), 1.0f);
  EXPECT_EQ(normcore::math::tanh(-std::numeric_limits<float>::infinity()), -1.0f);
  EXPECT_TRUE(std::isnan(normcore::math::tanh(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::signbit(normcore::math::tanh(-0.0f)));
  EXPECT_FALSE(std::signbit(normcore::math::tanh(0.0f)));
}

// The op over a contiguous tensor (the AVX-512 form where the processor has it) and over a
// strided view of it (the scalar form): within 2 ulp, odd, signed zeros, +-1 far out, NaN.
TEST(UnaryMath, TanhOpWithinTwoUlp) {
  std::vector<float> xs = tanh_sweep();
  const size_t half = xs.size();
  for (size_t i = 0; i < half; ++i) xs.push_back(-xs[i]);
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {0.0f, -0.0f, 30.0f, -30.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN()}) xs.push_back(v);
  const nc::Tensor t = nc::from_vector<float>(xs, {static_cast<int64_t>(xs.size())});
  const nc::Tensor strided = nc::stack({t, t}, 1).select(1, 0);  // the same values, stride 2
  ASSERT_FALSE(strided.is_contiguous());
  for (const nc::Tensor& in : {t, strided}) {
    SCOPED_TRACE(in.is_contiguous() ? "contiguous" : "strided");
    const std::vector<float> got = nc::tanh(in).to_vector<float>();
    double worst = 0;
    float worst_at = 0;
    for (size_t i = 0; i + 7 < xs.size(); ++i) {
      const double u = ulps(got[i], std::tanh(static_cast<double>(xs[i])));
      if (u > worst) worst = u, worst_at = xs[i];
      if (i < half) ASSERT_EQ(got[i], -got[i + half]) << "not odd at " << xs[i];
    }
    EXPECT_LE(worst, 2.0) << "worst at " << worst_at;
    const size_t s = xs.size() - 7;
    EXPECT_FALSE(std::signbit(got[s]));
    EXPECT_TRUE(std::signbit(got[s + 1]));
    EXPECT_EQ(got[s + 2], 1.0f);
    EXPECT_EQ(got[s + 3], -1.0f);
    EXPECT_EQ(got[s + 4], 1.0f);
    EXPECT_EQ(got[s + 5], -1.0f);
    EXPECT_TRUE(std::isnan(got[s + 6]));
  }
}

// GELU's tanh form through the op: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) against
// the same in double, contiguous and strided.
TEST(UnaryMath, GeluTanhOpMatchesDouble) {
  std::vector<float> xs;
  for (int i = 0; i <= 100000; ++i) xs.push_back(-10.0f + 20.0f * static_cast<float>(i) / 100000.0f);
  const nc::Tensor t = nc::from_vector<float>(xs, {static_cast<int64_t>(xs.size())});
  const nc::Tensor strided = nc::stack({t, t}, 1).select(1, 0);
  for (const nc::Tensor& in : {t, strided}) {
    SCOPED_TRACE(in.is_contiguous() ? "contiguous" : "strided");
    const std::vector<float> got = nc::gelu(in, true).to_vector<float>();
    for (size_t i = 0; i < xs.size(); ++i) {
      const double x = xs[i];
      const double exact = 0.5 * x * (1 + std::tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
      ASSERT_NEAR(got[i], exact, 4e-7 * (1 + std::fabs(exact))) << "at " << x;
    }
  }
}
