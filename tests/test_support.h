// Helpers shared by the test files.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "normcore/ops.h"
#include "normcore/random.h"
#include "normcore/tensor.h"

namespace normcore_test {

// A fixture with a fresh directory per test (named after the test), removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("normcore_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

// A check that call throws E (or a subclass) with every fragment in its message; for
// tables of bad calls: {{"name", throws<ShapeError>([&] { op(...); }, {"op", "[2, 3]"})}, ...}.
template <class E>
std::function<void()> throws(std::function<void()> call, std::vector<std::string> fragments) {
  return [call = std::move(call), fragments = std::move(fragments)] {
    try {
      call();
      ADD_FAILURE() << "no exception thrown";
    } catch (const E& e) {
      const std::string message = e.what();
      for (const std::string& fragment : fragments) {
        EXPECT_NE(message.find(fragment), std::string::npos) << "'" << fragment << "' not in: " << message;
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "threw an exception of another type: " << e.what();
    }
  };
}

// Every dtype, for tables that cover them all.
inline constexpr normcore::DType kAllDTypes[] = {normcore::DType::F32,  normcore::DType::F64, normcore::DType::F16,
                                                 normcore::DType::BF16, normcore::DType::I32, normcore::DType::I64,
                                                 normcore::DType::U8,   normcore::DType::Bool};

// f64 normal values of a seeded generator, times scale, plus shift.
inline normcore::Tensor random(const normcore::Shape& shape, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  normcore::Generator gen(seed);
  const normcore::Tensor t = normcore::mul(normcore::randn(shape, normcore::DType::F64, &gen), scale);
  return shift == 0.0 ? t : normcore::add(t, shift);
}

// A tensor's values as doubles, from any device and dtype.
inline std::vector<double> values(const normcore::Tensor& t) {
  return t.to(normcore::Device::cpu(), normcore::DType::F64).to_vector<double>();
}

// max |a - e| / (1 + max |e|): one tolerance for a whole tensor (infinity when a NaN is
// involved); the shapes must agree.
inline double relative_error(const normcore::Tensor& actual, const normcore::Tensor& expected) {
  EXPECT_EQ(actual.shape(), expected.shape());
  const std::vector<double> a = values(actual), e = values(expected);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size() && i < e.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - e[i]));
    scale = std::max(scale, std::fabs(e[i]));
  }
  return std::isnan(diff) ? std::numeric_limits<double>::infinity() : diff / (1 + scale);
}

}  // namespace normcore_test
