// What the bad-call tables of test_errors.cpp, test_layer_errors.cpp and
// test_training_errors.cpp share: a row (the call, the normcore::Error subtype it must throw
// and the substrings its message must contain, following error.h's contract "<op>:
// <argument> <what is wrong>"), the table runner, and the small builders the rows use.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "normcore/models.h"
#include "normcore/normcore.h"

namespace errors_test {

namespace nc = normcore;
using nc::DType;
using nc::Tensor;

struct BadCall {
  std::string what;
  std::function<void()> call;
  std::function<void(const std::function<void()>&)> expect_type;
  std::vector<std::string> substrings;
};

template <class E>
inline BadCall bad(std::string what, std::function<void()> call, std::vector<std::string> substrings) {
  return BadCall{std::move(what), std::move(call), [](const std::function<void()>& f) { EXPECT_THROW(f(), E); },
                 std::move(substrings)};
}

// Runs call and checks that it throws a normcore::Error whose message holds every substring.
inline void expect_message_contains(const std::function<void()>& call, const std::vector<std::string>& substrings) {
  try {
    call();
    ADD_FAILURE() << "no exception thrown";
  } catch (const nc::Error& e) {
    const std::string message = e.what();
    for (const std::string& s : substrings)
      EXPECT_NE(message.find(s), std::string::npos) << "message \"" << message << "\" lacks \"" << s << "\"";
  }
}

inline void run_table(const std::vector<BadCall>& table) {
  for (const BadCall& c : table) {
    SCOPED_TRACE(c.what);
    c.expect_type(c.call);
    expect_message_contains(c.call, c.substrings);
  }
}

inline Tensor i64(std::vector<int64_t> v, nc::Shape shape) { return nc::from_vector<int64_t>(v, shape); }
inline Tensor flags(std::vector<bool> v, nc::Shape shape) { return nc::from_vector<bool>(v, shape); }

// A zero f32 leaf that requires grad.
inline Tensor leaf(nc::Shape shape) {
  Tensor t = nc::zeros(shape);
  t.requires_grad_();
  return t;
}

inline Tensor f64_scalar(double v) { return nc::full({}, v, DType::F64); }
inline Tensor i64_scalar(int64_t v) { return nc::full({}, v, DType::I64); }

// The state_dict of an optimizer over one [2] parameter after one step (so it has state).
inline nc::optim::StateDict sgd_state() {
  nc::optim::SGD sgd({leaf({2})}, {/*lr=*/0.1, /*momentum=*/0.9});
  sgd.params()[0].set_grad(nc::ones({2}));
  sgd.step();
  return sgd.state_dict();
}
inline nc::optim::StateDict adam_state() {
  nc::optim::Adam adam({leaf({2})});
  adam.params()[0].set_grad(nc::ones({2}));
  adam.step();
  return adam.state_dict();
}
// state with entry name set to t (appended when absent), or without it.
inline nc::optim::StateDict with_entry(nc::optim::StateDict state, const std::string& name, Tensor t) {
  for (auto& entry : state) {
    if (entry.first == name) {
      entry.second = t;
      return state;
    }
  }
  state.emplace_back(name, t);
  return state;
}
inline nc::optim::StateDict without_entry(const nc::optim::StateDict& state, const std::string& name) {
  nc::optim::StateDict out;
  for (const auto& entry : state)
    if (entry.first != name) out.push_back(entry);
  return out;
}

// A dataset of n blank 2x2 images with the given dtypes and label count.
inline nc::data::TensorDataset images(int64_t n, DType image_dtype = DType::U8, int64_t labels = -1,
                                      DType label_dtype = DType::I64) {
  return {nc::zeros({n, 2, 2}, image_dtype), nc::zeros({labels < 0 ? n : labels}, label_dtype)};
}
inline nc::data::DataLoaderOptions loader_options(int64_t batch_size = 2) {
  nc::data::DataLoaderOptions options;
  options.batch_size = batch_size;
  return options;
}

// A directory for the rows that read or write files, removed with its contents.
class ScratchDir {
 public:
  ScratchDir() : path_(std::filesystem::temp_directory_path() / ("normcore_errors_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  std::string path(const std::string& name = "") const { return (path_ / name).string(); }
  // Writes bytes to name and returns its path.
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }

 private:
  std::filesystem::path path_;
};

}  // namespace errors_test
