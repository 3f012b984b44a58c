// What the module and loss tests share (test_nn.cpp, test_losses.cpp): tensors from values,
// closeness checks, float64 leaves for gradchecks, and tables of calls that must raise one
// normcore error type (the most derived) with a given text in its message.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "normcore/normcore.h"

namespace nn_test {

namespace nc = normcore;
using nc::DType;
using nc::Tensor;

inline Tensor f32(const std::vector<float>& v, const nc::Shape& shape) { return nc::from_vector(v, shape); }
inline Tensor f64(const std::vector<double>& v, const nc::Shape& shape) { return nc::from_vector(v, shape); }
inline Tensor i64(const std::vector<int64_t>& v, const nc::Shape& shape) { return nc::from_vector(v, shape); }

inline void expect_near(const Tensor& t, const std::vector<double>& expected, double tol) {
  std::vector<double> got = t.to_vector<double>();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], tol) << "element " << i;
}

// A float64 leaf of uniform values in [lo, hi), for gradchecks.
inline Tensor leaf(const nc::Shape& shape, uint64_t seed, double lo = -2.0, double hi = 2.0) {
  nc::Generator gen(seed);
  return (nc::rand(shape, DType::F64, &gen) * (hi - lo) + lo).requires_grad_();
}

struct ErrorCase {
  std::string name;
  std::function<void()> call;
  std::string kind;    // the most derived normcore error type expected
  std::string needle;  // text the message must contain
};

// The most derived normcore error type fn throws ("none" when it does not throw).
inline std::string thrown_kind(const std::function<void()>& fn, std::string* message) {
  try {
    fn();
  } catch (const nc::ShapeError& e) {
    *message = e.what();
    return "ShapeError";
  } catch (const nc::DTypeError& e) {
    *message = e.what();
    return "DTypeError";
  } catch (const nc::DeviceError& e) {
    *message = e.what();
    return "DeviceError";
  } catch (const nc::IndexError& e) {
    *message = e.what();
    return "IndexError";
  } catch (const nc::ValueError& e) {
    *message = e.what();
    return "ValueError";
  } catch (const nc::IOError& e) {
    *message = e.what();
    return "IOError";
  } catch (const nc::Error& e) {
    *message = e.what();
    return "Error";
  }
  return "none";
}

inline void run_error_cases(const std::vector<ErrorCase>& cases) {
  for (const ErrorCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::string message;
    EXPECT_EQ(thrown_kind(c.call, &message), c.kind) << message;
    EXPECT_NE(message.find(c.needle), std::string::npos) << message;
  }
}

}  // namespace nn_test
