// erf, floor, ceil and round: values against the C library's (halves to even for round,
// NaN, infinities and signed zeros kept), integer tensors as copies, erf's float64 gradcheck
// and zero gradients for the rounding ops, and CUDA against the CPU in every floating dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "normcore/normcore.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;

namespace {

const std::vector<double> kValues = {-2.5,     -1.5,      -0.5, -0.0, 0.0,  0.5,    1.5,
                                     2.5,      2.4999,    -3.7, 7.2,  1e10, -1e-30, 0.49999999999999994,
                                     INFINITY, -INFINITY, NAN};

void expect_same(double got, double want, const char* op, double x) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << op << "(" << x << ") = " << got;
  } else {
    EXPECT_EQ(got, want) << op << "(" << x << ")";
    EXPECT_EQ(std::signbit(got), std::signbit(want)) << op << "(" << x << ") keeps the sign of zero";
  }
}

}  // namespace

TEST(Rounding, ValuesInFloat64AndFloat32) {
  const Tensor x = nc::from_vector(kValues, {static_cast<int64_t>(kValues.size())});
  const std::vector<double> f = nc::floor(x).to_vector<double>(), c = nc::ceil(x).to_vector<double>();
  const std::vector<double> r = nc::round(x).to_vector<double>(), e = nc::erf(x).to_vector<double>();
  for (size_t i = 0; i < kValues.size(); ++i) {
    expect_same(f[i], std::floor(kValues[i]), "floor", kValues[i]);
    expect_same(c[i], std::ceil(kValues[i]), "ceil", kValues[i]);
    expect_same(r[i], std::nearbyint(kValues[i]), "round", kValues[i]);
    expect_same(e[i], std::erf(kValues[i]), "erf", kValues[i]);
  }
  EXPECT_EQ(nc::round(nc::from_vector<double>({0.5, 1.5, 2.5, -0.5, -2.5}, {5})).to_vector<double>(),
            (std::vector<double>{0.0, 2.0, 2.0, -0.0, -2.0}));
  const Tensor xf = x.to(DType::F32);
  const std::vector<float> ff = nc::floor(xf).to_vector<float>(), ef = nc::erf(xf).to_vector<float>();
  for (size_t i = 0; i < kValues.size(); ++i) {
    const float v = static_cast<float>(kValues[i]);
    expect_same(ff[i], std::floor(v), "floor", v);
    expect_same(ef[i], std::erf(v), "erf", v);
  }
  EXPECT_EQ(nc::floor(xf).dtype(), DType::F32);
  EXPECT_EQ(nc::round(x.to(DType::BF16)).dtype(), DType::BF16);
}

TEST(Rounding, IntegersAndErrors) {
  const Tensor i = nc::from_vector<int64_t>({-3, 0, 7}, {3});
  for (const Tensor& t : {nc::floor(i), nc::ceil(i), nc::round(i)}) {
    EXPECT_EQ(t.dtype(), DType::I64);
    EXPECT_EQ(t.to_vector<int64_t>(), (std::vector<int64_t>{-3, 0, 7}));
  }
  EXPECT_EQ(nc::erf(i).dtype(), DType::F32);  // as exp: integers compute in f32
  EXPECT_THROW(nc::erf(Tensor()), nc::ValueError);
  EXPECT_THROW(nc::floor(Tensor()), nc::ValueError);
}

TEST(Rounding, Gradients) {
  Tensor x = nc::from_vector<double>({-1.3, -0.2, 0.0, 0.4, 2.2}, {5});
  x.requires_grad_(true);
  EXPECT_TRUE(nc::gradcheck([](const std::vector<Tensor>& in) { return nc::erf(in[0]); }, {x}));
  Tensor y = nc::add(nc::add(nc::floor(x), nc::ceil(x)), nc::round(x));
  nc::sum(y).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), std::vector<double>(5, 0.0));
}

TEST(RoundingCuda, MatchesTheCpuInEveryFloatingDtype) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Tensor x = nc::from_vector(kValues, {static_cast<int64_t>(kValues.size())});
  for (DType dtype : {DType::F64, DType::F32, DType::F16, DType::BF16}) {
    const Tensor on_cpu = x.to(dtype), on_gpu = on_cpu.to(nc::Device::cuda());
    for (auto op : {&nc::floor, &nc::ceil, &nc::round, &nc::erf}) {
      const std::vector<double> want = op(on_cpu).to(DType::F64).to_vector<double>();
      const std::vector<double> got = op(on_gpu).to(nc::Device::cpu(), DType::F64).to_vector<double>();
      for (size_t i = 0; i < want.size(); ++i) {
        if (std::isnan(want[i])) EXPECT_TRUE(std::isnan(got[i]));
        else if (op == &nc::erf) EXPECT_NEAR(got[i], want[i], dtype == DType::F64 ? 1e-15 : 1e-6) << kValues[i];
        else EXPECT_EQ(got[i], want[i]) << nc::dtype_name(dtype) << " " << kValues[i];
      }
    }
  }
}
