// What the safetensors tests share (test_safetensors.cpp, test_safetensors_save.cpp): tensors
// from values, a tensor's bytes, a file's layout as text, whole files read and written, a
// directory's entries, an IOError's check, and the fixture with a scratch directory.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "normcore/safetensors.h"
#include "normcore/tensor.h"
#include "tests/test_support.h"

namespace safetensors_test {

namespace nc = normcore;
namespace st = normcore::safetensors;
namespace fs = std::filesystem;

// A CPU tensor holding values, built without conversions so every bit is the one given.
template <class T>
inline nc::Tensor make(std::initializer_list<T> values, const nc::Shape& shape) {
  nc::Tensor t = nc::empty(shape, nc::TensorOptions(nc::dtype_of<T>::value));
  EXPECT_EQ(static_cast<size_t>(t.numel()), values.size());
  if (values.size() > 0) std::memcpy(t.data_ptr(), values.begin(), values.size() * sizeof(T));
  return t;
}

// The tensor's elements in row-major order as raw bytes.
inline std::vector<uint8_t> bytes_of(const nc::Tensor& t) {
  const nc::Tensor host = t.to(nc::Device::cpu()).contiguous();
  const uint8_t* data = static_cast<const uint8_t*>(host.data_ptr());
  return std::vector<uint8_t>(data, data + host.nbytes());
}

template <class T>
inline std::vector<uint8_t> bytes_of(std::initializer_list<T> values) {
  const uint8_t* data = reinterpret_cast<const uint8_t*>(values.begin());
  return std::vector<uint8_t>(data, data + values.size() * sizeof(T));
}

inline const char* file_dtype(nc::DType dtype) {
  switch (dtype) {
    case nc::DType::F32: return "F32";
    case nc::DType::F64: return "F64";
    case nc::DType::F16: return "F16";
    case nc::DType::BF16: return "BF16";
    case nc::DType::I32: return "I32";
    case nc::DType::I64: return "I64";
    case nc::DType::U8: return "U8";
    case nc::DType::Bool: return "BOOL";
  }
  return "?";
}

// "x:F32[2,3] y:BF16[]": names, dtypes and shapes in order.
inline std::string layout(const st::File& file) {
  std::string text;
  for (const auto& [name, tensor] : file.tensors) {
    text += (text.empty() ? "" : " ") + name + ":" + file_dtype(tensor.dtype()) + "[";
    for (int64_t d = 0; d < tensor.dim(); ++d) text += (d ? "," : "") + std::to_string(tensor.size(d));
    text += "]";
  }
  return text;
}

inline std::vector<uint8_t> read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_all(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline std::set<std::string> list_dir(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

// A fresh directory per test, removed afterwards.
class SafetensorsFiles : public normcore_test::TempDirTest {};

// Runs load and checks that it throws IOError naming source and reason.
inline void expect_io_error(const std::function<void()>& load, const std::string& source, const std::string& reason) {
  try {
    load();
    ADD_FAILURE() << "expected IOError";
  } catch (const nc::IOError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(source), std::string::npos) << message;
    EXPECT_NE(message.find(reason), std::string::npos) << message;
  }
}

}  // namespace safetensors_test
