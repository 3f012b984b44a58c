// normcore onnx-test: runs ONNX backend test folders (model.onnx and test_data_set_*/
// input_N.pb, output_N.pb) and says which pass: outputs of the expected dtype and shape, and
// floats within ONNX's backend tolerance (|got - want| <= atol + rtol |want|, 1e-7 and 1e-3
// unless --atol and --rtol say otherwise), the rest exactly, on a first run and a second (which
// follows the plans the first made). A test whose model uses an op or attribute normcore does
// not run fails, naming it.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "normcore/normcore.h"
#include "normcore/onnx.h"

namespace nc = normcore;
namespace fs = std::filesystem;

namespace cli {

namespace {

// The test folders under path: path itself when it holds a model.onnx, else its children that do.
std::vector<fs::path> test_folders(const fs::path& path) {
  if (fs::exists(path / "model.onnx")) return {path};
  NC_CHECK(fs::is_directory(path), IOError, path.string(), ": neither a test folder (model.onnx) nor a folder of them");
  std::vector<fs::path> out;
  for (const auto& entry : fs::directory_iterator(path))
    if (fs::exists(entry.path() / "model.onnx")) out.push_back(entry.path());
  std::sort(out.begin(), out.end());
  return out;
}

// The numbered .pb files prefix_0.pb, prefix_1.pb, ... of a data set folder.
std::vector<nc::Tensor> numbered(const fs::path& folder, const std::string& prefix) {
  std::vector<nc::Tensor> out;
  for (int i = 0;; ++i) {
    const fs::path file = folder / (prefix + "_" + std::to_string(i) + ".pb");
    if (!fs::exists(file)) return out;
    out.push_back(nc::onnx::read_tensor_file(file.string()));
  }
}

// How close a float output must be: |got - want| <= atol + rtol |want| for every element.
struct Tolerance {
  double atol, rtol;
};

// Empty when got matches want, else why not: the first element off, how many are, and the
// largest difference.
std::string mismatch(const nc::Tensor& got, const nc::Tensor& want, size_t index, Tolerance tol) {
  const std::string which = "output " + std::to_string(index);
  if (got.dtype() != want.dtype())
    return which + " is " + nc::dtype_name(got.dtype()) + ", expected " + nc::dtype_name(want.dtype());
  if (got.shape() != want.shape())
    return which + " has shape " + nc::shape_str(got.shape()) + ", expected " + nc::shape_str(want.shape());
  const std::vector<double> g = got.to(nc::Device::cpu(), nc::DType::F64).contiguous().to_vector<double>();
  const std::vector<double> w = want.to(nc::DType::F64).contiguous().to_vector<double>();
  const bool floating = nc::is_floating(want.dtype());
  size_t first = g.size(), off = 0;
  double largest = 0, scale = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double diff = std::fabs(g[i] - w[i]);
    const bool same = floating ? (std::isnan(w[i]) ? std::isnan(g[i])
                                                   : (g[i] == w[i] || diff <= tol.atol + tol.rtol * std::fabs(w[i])))
                               : g[i] == w[i];
    if (std::isfinite(w[i])) scale = std::max(scale, std::fabs(w[i]));
    if (same) continue;
    if (first == g.size()) first = i;
    ++off;
    largest = std::max(largest, std::isnan(diff) ? INFINITY : diff);
  }
  if (off == 0) return "";
  std::ostringstream why;
  why << which << " element " << first << " is " << g[first] << ", expected " << w[first] << " (" << off << " of "
      << g.size() << " elements off; the largest difference " << largest << ", the largest |expected| " << scale << ")";
  return why.str();
}

// Empty when every data set of the test passes on device, else the first reason it does not.
std::string run_test(const fs::path& folder, nc::Device device, Tolerance tol) {
  try {
    const nc::onnx::Model model = nc::onnx::Model::load((folder / "model.onnx").string());
    std::vector<fs::path> sets;
    for (const auto& entry : fs::directory_iterator(folder))
      if (entry.is_directory() && entry.path().filename().string().rfind("test_data_set_", 0) == 0)
        sets.push_back(entry.path());
    std::sort(sets.begin(), sets.end());
    if (sets.empty()) return "no test_data_set_* folder";
    for (const fs::path& set : sets) {
      std::vector<nc::Tensor> inputs = numbered(set, "input");
      for (nc::Tensor& t : inputs) t = t.to(device);
      const std::vector<nc::Tensor> want = numbered(set, "output");
      // Twice: the first run of an input shape makes the plans later ones follow (an attention
      // run fused, onnx/attention_pattern.cpp), so both ways are checked.
      for (const char* which : {"", " (second run)"}) {
        const std::vector<nc::Tensor> got = model.run(inputs);
        if (got.size() != want.size())
          return std::to_string(got.size()) + " outputs, expected " + std::to_string(want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          const std::string why = mismatch(got[i], want[i], i, tol);
          if (!why.empty()) return set.filename().string() + which + ": " + why;
        }
      }
    }
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace

int onnx_test(const Args& args) {
  NC_CHECK(!args.positional.empty(), ValueError, "onnx-test: name at least one test folder (or a folder of them)");
  const std::string device_option = args.options.at("device");
  std::vector<nc::Device> devices;
  if (device_option == "cpu" || device_option == "all") devices.push_back(nc::Device::cpu());
  if (device_option == "all" && nc::cuda_is_available()) devices.push_back(nc::Device::cuda());
  if (device_option != "cpu" && device_option != "all") devices.push_back(pick_device(device_option));
  const int64_t min_passed = integer(args, "min-passed", -1);
  const Tolerance tol{number(args, "atol"), number(args, "rtol")};
  NC_CHECK(tol.atol >= 0 && tol.rtol >= 0, ValueError, "onnx-test: --atol and --rtol must be >= 0");
  int64_t passed = 0, failed = 0;
  for (const std::string& path : args.positional) {
    for (const fs::path& folder : test_folders(path)) {
      for (const nc::Device& device : devices) {
        const std::string why = run_test(folder, device, tol);
        const std::string name = folder.filename().string() + (devices.size() > 1 ? " " + device.str() : "");
        if (why.empty()) {
          ++passed;
          std::cout << "PASS " << name << "\n";
        } else {
          ++failed;
          std::cout << "FAIL " << name << ": " << why << "\n";
        }
      }
    }
  }
  std::cout << passed << " passed, " << failed << " failed\n";
  if (min_passed >= 0) return passed >= min_passed ? 0 : 1;
  return failed == 0 ? 0 : 1;
}

}  // namespace cli
