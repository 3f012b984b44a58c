// The host's own float functions of kernels/scalar/math.h against the C library's in double:
// tanh (a polynomial near 0, exp beyond) within 2 ulp of the exact value at every float
// exponent from 2^-30 to 2^5 and at 200,000 points of [-12, 12], odd, signed zeros kept,
// +-1 far out, NaN through; and through the op, the same values on the CPU.
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

}  // namespace

TEST(UnaryMath, HostTanhWithinTwoUlp) {
  std::vector<float> xs;
  for (int e = -30; e <= 5; ++e) {
    for (float m : {1.0f, 1.1f, 1.37f, 1.5f, 1.73f, 1.99f}) xs.push_back(std::ldexp(m, e));
  }
  for (int i = 0; i <= 200000; ++i) xs.push_back(-12.0f + 24.0f * static_cast<float>(i) / 200000.0f);
  for (float v : {0.55f, std::nextafter(0.55f, 0.0f), 8.9f, 9.0f, 9.1f, 20.0f, 100.0f}) xs.push_back(v);
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

  // The op on the CPU computes the same.
  const nc::Tensor t = nc::from_vector<float>({-3.0f, -0.3f, 0.0f, 1e-5f, 0.7f, 5.0f}, {6});
  const std::vector<float> got = nc::tanh(t).to_vector<float>();
  const std::vector<float> in = t.to_vector<float>();
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(got[i], normcore::math::tanh(in[i])) << in[i];
}
