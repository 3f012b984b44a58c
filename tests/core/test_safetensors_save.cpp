// safetensors saves to disk: save then load, large tensors, relative paths, atomic
// replacement, also when the writer is killed mid-save, and what a killed save leaves.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "normcore/safetensors.h"
#include "normcore/tensor.h"
#include "tests/core/safetensors_support.h"
#include "tests/test_support.h"

namespace nc = normcore;
namespace st = normcore::safetensors;
namespace fs = std::filesystem;

using namespace safetensors_test;

namespace {

// ---- saving to disk ----

class SafetensorsSave : public SafetensorsFiles {};

TEST_F(SafetensorsSave, SaveThenLoad) {
  const std::string path = (dir_ / "model.safetensors").string();
  const st::TensorList tensors = {{"w", make<double>({1.25, -3}, {1, 2})}, {"n", make<int64_t>({4}, {})}};
  st::save(path, tensors, {{"format", "pt"}});
  EXPECT_EQ(read_all(path), st::save_bytes(tensors, {{"format", "pt"}}));
  const st::File file = st::load(path);
  EXPECT_EQ(layout(file), "w:F64[1,2] n:I64[]");
  EXPECT_EQ(file.metadata.at("format"), "pt");
  EXPECT_EQ(bytes_of(file.at("w")), bytes_of<double>({1.25, -3}));
  EXPECT_EQ(bytes_of(file.at("n")), bytes_of<int64_t>({4}));
  EXPECT_EQ(list_dir(dir_), std::set<std::string>{"model.safetensors"});
}

// Tensors larger than the 16 MiB staging buffer of a load to a GPU, at offsets that are
// not multiples of anything, come out whole on the CPU and on the GPU, and they own their
// memory, so they outlive the file.
TEST_F(SafetensorsSave, LargeTensorsLoadWholeAndOutliveTheFile) {
  const std::string path = (dir_ / "large.safetensors").string();
  const int64_t n = (int64_t{40} << 20) / 4 + 3;  // a little over 40 MiB of F32: three pieces
  nc::Tensor big = nc::empty({n}, nc::TensorOptions(nc::DType::F32));
  float* values = big.data<float>();
  for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(i % 1000003) - 0.25f;
  const st::TensorList tensors = {{"head", make<uint8_t>({1, 2, 3}, {3})},
                                  {"big", big},
                                  {"mask", make<bool>({true, false, true, true, false}, {5})},
                                  {"tail", make<int64_t>({-7, 1099511627776}, {2})}};
  std::vector<nc::Device> devices = {nc::Device::cpu()};
  if (nc::cuda_is_available()) devices.push_back(nc::Device::cuda(0));
  for (const nc::Device device : devices) {
    SCOPED_TRACE(device.str());
    st::save(path, tensors);
    st::File file = st::load(path, device);
    fs::remove(path);
    EXPECT_EQ(file.source, path);
    ASSERT_EQ(layout(file), "head:U8[3] big:F32[" + std::to_string(n) + "] mask:BOOL[5] tail:I64[2]");
    for (const auto& entry : file.tensors) EXPECT_EQ(entry.second.device(), device) << entry.first;
    EXPECT_EQ(bytes_of(file.at("head").to(nc::Device::cpu())), bytes_of<uint8_t>({1, 2, 3}));
    EXPECT_EQ(bytes_of(file.at("mask").to(nc::Device::cpu())), bytes_of<bool>({true, false, true, true, false}));
    EXPECT_EQ(bytes_of(file.at("tail").to(nc::Device::cpu())), bytes_of<int64_t>({-7, 1099511627776}));
    const nc::Tensor loaded_big = file.at("big").to(nc::Device::cpu());
    const float* loaded = loaded_big.data<float>();
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += loaded[i] != static_cast<float>(i % 1000003) - 0.25f;
    EXPECT_EQ(wrong, 0);
    EXPECT_EQ(loaded[n - 1], static_cast<float>((n - 1) % 1000003) - 0.25f);
    EXPECT_TRUE(list_dir(dir_).empty());
  }
}

TEST_F(SafetensorsSave, RelativePath) {
  const fs::path old_dir = fs::current_path();
  fs::current_path(dir_);
  st::save("relative.safetensors", {{"x", make<uint8_t>({9}, {1})}});
  const st::File file = st::load("relative.safetensors");
  fs::current_path(old_dir);
  EXPECT_EQ(bytes_of(file.at("x")), bytes_of<uint8_t>({9}));
  EXPECT_EQ(list_dir(dir_), std::set<std::string>{"relative.safetensors"});
}

TEST_F(SafetensorsSave, ReplacingIsAtomic) {
  const fs::path path = dir_ / "model.safetensors";
  const st::TensorList old_tensors = {{"x", make<float>({1, 2, 3}, {3})}};
  const st::TensorList new_tensors = {{"y", make<int32_t>({4, 5}, {2})}};
  st::save(path.string(), old_tensors);
  const auto old_bytes = read_all(path);

  // A save that fails its checks leaves the old file as it was.
  EXPECT_THROW(st::save(path.string(), {{"y", new_tensors[0].second}, {"y", new_tensors[0].second}}), nc::ValueError);
  EXPECT_EQ(read_all(path), old_bytes);
  EXPECT_EQ(list_dir(dir_), std::set<std::string>{"model.safetensors"});

  // A successful save replaces it whole.
  st::save(path.string(), new_tensors);
  EXPECT_EQ(read_all(path), st::save_bytes(new_tensors));
  EXPECT_EQ(layout(st::load(path.string())), "y:I32[2]");
  EXPECT_EQ(list_dir(dir_), std::set<std::string>{"model.safetensors"});
}

// The rename fails after all the data was written: the temporary file must not remain.
TEST_F(SafetensorsSave, FailedRenameLeavesNothingBehind) {
  const fs::path target = dir_ / "occupied";
  fs::create_directories(target / "inside");
  expect_io_error([&] { st::save(target.string(), {{"x", make<float>({1}, {1})}}); }, target.string(), "cannot rename");
  EXPECT_EQ(list_dir(dir_), std::set<std::string>{"occupied"});
  EXPECT_EQ(list_dir(target), std::set<std::string>{"inside"});
}

// A writer killed (SIGKILL) at any moment of a save leaves the target either as it was or
// as the new file, whole. A child process saves two 8 MB files in turn, forever; the parent
// kills it after a different delay each round and loads what is there.
TEST_F(SafetensorsSave, KilledWriterLeavesTheOldOrTheNewFile) {
  const fs::path path = dir_ / "model.safetensors";
  const int64_t n = int64_t{1} << 21;
  const st::TensorList ones = {{"v", nc::full({n}, 1.0, nc::DType::F32)}};
  const st::TensorList twos = {{"v", nc::full({n}, 2.0, nc::DType::F32)}};
  st::save(path.string(), ones);
  int interrupted = 0;  // rounds that left a temporary file: killed inside a save
  for (int round = 0; round < 12; ++round) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0) << "fork failed";
    if (child == 0) {  // never returns into the test framework
      try {
        for (int i = 0;; ++i) st::save(path.string(), i % 2 ? ones : twos);
      } catch (...) {
        ::_exit(3);
      }
    }
    ::usleep(static_cast<useconds_t>(2000 + 3700 * round));
    ASSERT_EQ(::kill(child, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer failed on its own (status " << status << ")";

    const st::File file = st::load(path.string());
    ASSERT_EQ(layout(file), "v:F32[" + std::to_string(n) + "]") << "round " << round;
    const std::vector<float> v = file.at("v").to_vector<float>();
    const float first = v.front();
    EXPECT_TRUE(first == 1.0f || first == 2.0f) << "round " << round << ": " << first;
    EXPECT_EQ(std::count(v.begin(), v.end(), first), n) << "round " << round << ": a mix of two files";
    // A killed save leaves its temporary file; remove it so the next round starts clean.
    for (const std::string& name : list_dir(dir_)) {
      if (name == "model.safetensors") continue;
      ++interrupted;
      fs::remove(dir_ / name);
    }
  }
  std::printf("  %d of 12 rounds killed the writer inside a save\n", interrupted);
}

// A save removes the temporary files that killed saves of the same target left, once
// their process is gone and they have not been written for 10 minutes; it keeps the rest.
TEST_F(SafetensorsSave, RemovesTheTemporaryFilesOfKilledSaves) {
  const fs::path path = dir_ / "model.safetensors";
  const pid_t dead = ::fork();  // a process id that no longer exists
  ASSERT_GE(dead, 0) << "fork failed";
  if (dead == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  const std::string prefix = ".model.safetensors.tmp.";
  const std::string old_dead = prefix + std::to_string(dead) + ".0";
  const std::string new_dead = prefix + std::to_string(dead) + ".1";
  const std::string old_alive = prefix + std::to_string(::getppid()) + ".0";  // a live process
  const std::string other_target = ".other.safetensors.tmp." + std::to_string(dead) + ".0";
  const std::string not_a_pid = prefix + "x1.0";
  const auto an_hour_ago = fs::file_time_type::clock::now() - std::chrono::hours(1);
  for (const std::string& name : {old_dead, new_dead, old_alive, other_target, not_a_pid}) {
    std::ofstream(dir_ / name) << "partial";
    if (name != new_dead) fs::last_write_time(dir_ / name, an_hour_ago);
  }
  st::save(path.string(), {{"x", make<float>({1}, {1})}});
  EXPECT_EQ(list_dir(dir_), (std::set<std::string>{"model.safetensors", new_dead, old_alive, other_target, not_a_pid}));
}

TEST_F(SafetensorsSave, MissingDirectory) {
  const fs::path path = dir_ / "no" / "such" / "dir.safetensors";
  expect_io_error(
      [&] {
        st::save(path.string(), {{"x", make<float>({1}, {1})}});
      },
      path.string(), "cannot create a temporary file");
  EXPECT_TRUE(list_dir(dir_).empty());
}

}  // namespace
