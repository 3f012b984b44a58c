// What the optimizer tests share (test_optim.cpp, test_schedules_clipping.cpp): optimizers
// made from options, parameters from values, comparisons with tolerances, error checks by
// kind and text, the trajectories' starting point, and state-dict edits.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <typeinfo>
#include <vector>

#include "normcore/normcore.h"
#include "normcore/optim.h"

namespace optim_test {

namespace nc = normcore;
namespace optim = normcore::optim;
using nc::DType;
using nc::Tensor;

using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

template <class Opt, class Options>
inline MakeOptimizer make(Options options) {
  return [options](std::vector<Tensor> params) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<Opt>(std::move(params), options);
  };
}

inline Tensor vector_tensor(const std::vector<double>& values, DType dtype, nc::Device device = nc::Device::cpu()) {
  return nc::from_vector(values, {static_cast<int64_t>(values.size())}).to(device, dtype);
}

inline Tensor param_of(const std::vector<double>& values, DType dtype, nc::Device device = nc::Device::cpu()) {
  return vector_tensor(values, dtype, device).requires_grad_();
}

inline void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rtol, double atol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LE(std::fabs(got[i] - want[i]), atol + rtol * std::fabs(want[i]))
        << what << " element " << i << ": got " << got[i] << ", want " << want[i];
  }
}

struct Tolerance {
  DType dtype;
  double rtol, atol;
};

inline const std::vector<Tolerance>& trajectory_dtypes() {
  static const std::vector<Tolerance> dtypes = {
      {DType::F64, 1e-12, 1e-12},
      {DType::F32, 2e-6, 1e-6},
      {DType::F16, 4e-3, 1e-3},   // params round to 11 bits after every step
      {DType::BF16, 3e-2, 1e-2},  // and to 8 bits
  };
  return dtypes;
}

// The name of the normcore::Error subclass e is.
inline std::string error_kind(const std::exception& e) {
  if (dynamic_cast<const nc::ShapeError*>(&e)) return "ShapeError";
  if (dynamic_cast<const nc::DTypeError*>(&e)) return "DTypeError";
  if (dynamic_cast<const nc::DeviceError*>(&e)) return "DeviceError";
  if (dynamic_cast<const nc::IndexError*>(&e)) return "IndexError";
  if (dynamic_cast<const nc::ValueError*>(&e)) return "ValueError";
  if (dynamic_cast<const nc::Error*>(&e)) return "Error";
  return typeid(e).name();
}

// Runs f and expects it to throw kind with message containing text.
inline void expect_error(const std::function<void()>& f, const std::string& kind, const std::string& text,
                         const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": no exception, expected " << kind;
  } catch (const std::exception& e) {
    EXPECT_EQ(error_kind(e), kind) << what << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos)
        << what << ": message \"" << e.what() << "\" lacks \"" << text << "\"";
  }
}

inline const std::vector<double> kStart = {1.0, -2.0, 0.5, 3.0, -0.75};

struct BadStateCase {
  std::string name;
  std::function<void(optim::StateDict&)> mutate;
  std::string kind;
  std::string text;
};

inline void set_entry(optim::StateDict& state, const std::string& name, const Tensor& t) {
  for (auto& entry : state) {
    if (entry.first == name) {
      entry.second = t;
      return;
    }
  }
  state.emplace_back(name, t);
}

inline void erase_entry(optim::StateDict& state, const std::string& name) {
  for (size_t i = 0; i < state.size(); ++i) {
    if (state[i].first == name) {
      state.erase(state.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  }
  FAIL() << "no entry " << name;
}

inline Tensor f64(double v) { return nc::full({}, v, DType::F64); }

struct InvalidCase {
  std::string name;
  std::function<void()> construct;
  std::string kind;
  std::string text;
};

}  // namespace optim_test
