// Benchmark: the peak memory and the time of safetensors::load on a large checkpoint.
// Writes a file of about MB megabytes (four F32 tensors of different sizes), then loads it
// in fresh processes (this program run again with "load"), so that the writing does not
// count: each prints its peak resident memory (VmHWM, which counts mapped file pages too),
// the load time and PASS or FAIL after checking every element against what was written.
// A cold load first evicts the file from the page cache (posix_fadvise DONTNEED; the save
// flushed it to disk, so its pages are clean), a warm load finds it there. The file is
// removed at the end unless --keep.
//   safetensors_load [--mb MB] [--path FILE] [--reps N] [--device cpu|cuda] [--keep]
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "normcore/normcore.h"

namespace nc = normcore;
namespace st = normcore::safetensors;

namespace {

constexpr int kTensors = 4;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Element i of tensor k; every value is exact in F32 (below 2^24).
float value_at(int k, int64_t i) { return static_cast<float>(k) * 0.5f + static_cast<float>(i % 65536); }

std::string tensor_name(int k) { return "layer" + std::to_string(k) + ".weight"; }

// Rows of 1024 floats, shared 4:3:2:1 among the tensors; the last takes what is left.
std::vector<int64_t> tensor_rows(int64_t mb) {
  const int64_t rows = mb * 256;  // 1 MiB is 256 rows of 1024 floats
  std::vector<int64_t> out;
  int64_t left = rows;
  for (int k = 0; k < kTensors - 1; ++k) {
    out.push_back(rows * (kTensors - k) / 10);
    left -= out.back();
  }
  out.push_back(left);
  return out;
}

// The process's peak resident memory in KiB: VmHWM (this address space only), else ru_maxrss.
long peak_rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.compare(0, 6, "VmHWM:") == 0) return std::atol(line.c_str() + 6);
  struct rusage usage;
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

long current_rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.compare(0, 6, "VmRSS:") == 0) return std::atol(line.c_str() + 6);
  return -1;
}

void evict_from_page_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
#if defined(POSIX_FADV_DONTNEED)
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
#endif
  ::close(fd);
}

// The child: loads path once and reports. Exit status 0 for PASS, 1 for FAIL.
int load_once(const std::string& path, const std::string& device_spec, int64_t mb, bool cold) {
  const nc::Device device(device_spec);
  if (cold) evict_from_page_cache(path);
  const long before_kib = current_rss_kib();
  const double t0 = now();
  st::File file = st::load(path, device);
  if (device.is_cuda()) nc::cuda::synchronize(device.index);
  const double seconds = now() - t0;
  const long peak_kib = peak_rss_kib();

  // Every element, tensor by tensor (after the peak was read).
  const std::vector<int64_t> rows = tensor_rows(mb);
  bool pass = file.tensors.size() == static_cast<size_t>(kTensors);
  int64_t checked = 0;
  for (int k = 0; pass && k < kTensors; ++k) {
    const auto& [name, tensor] = file.tensors[static_cast<size_t>(k)];
    if (name != tensor_name(k) || tensor.dtype() != nc::DType::F32 || tensor.shape() != nc::Shape{rows[k], 1024}) {
      pass = false;
      break;
    }
    const nc::Tensor host = tensor.to(nc::Device::cpu());
    const float* data = host.data<float>();
    for (int64_t i = 0; i < host.numel(); ++i, ++checked) {
      if (data[i] != value_at(k, i)) {
        std::printf("  %s[%lld] is %g, expected %g\n", name.c_str(), static_cast<long long>(i), data[i],
                    value_at(k, i));
        pass = false;
        break;
      }
    }
  }
  const double file_mib = static_cast<double>(std::filesystem::file_size(path)) / (1 << 20);
  std::printf("%s load: %.3f s (%.0f MiB/s), peak RSS %.1f MiB (%.2fx the file; %.1f MiB before the load), "
              "%lld elements checked: %s\n",
              cold ? "cold" : "warm", seconds, file_mib / seconds, peak_kib / 1024.0, peak_kib / 1024.0 / file_mib,
              before_kib / 1024.0, static_cast<long long>(checked), pass ? "PASS" : "FAIL");
  std::printf("{\"bench\":\"safetensors_load\",\"cache\":\"%s\",\"device\":\"%s\",\"file_mib\":%.1f,"
              "\"seconds\":%.4f,\"peak_rss_mib\":%.1f,\"rss_before_mib\":%.1f,\"pass\":%s}\n",
              cold ? "cold" : "warm", device_spec.c_str(), file_mib, seconds, peak_kib / 1024.0,
              before_kib / 1024.0, pass ? "true" : "false");
  std::fflush(stdout);
  return pass ? 0 : 1;
}

// Runs this program again as "load ..." and waits for it; true when it printed PASS.
bool run_child(const char* self, const std::string& path, const std::string& device_spec, int64_t mb, bool cold) {
  std::fflush(stdout);
  const std::string mb_text = std::to_string(mb);
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("fork");
    return false;
  }
  if (pid == 0) {
    ::execl(self, self, "load", path.c_str(), device_spec.c_str(), mb_text.c_str(), cold ? "cold" : "warm",
            static_cast<char*>(nullptr));
    std::perror("exec");
    ::_exit(127);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return false;
  if (!WIFEXITED(status)) std::printf("  the loading process died (status %d)\n", status);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 6 && !std::strcmp(argv[1], "load")) {
    try {
      return load_once(argv[2], argv[3], std::atoll(argv[4]), !std::strcmp(argv[5], "cold"));
    } catch (const std::exception& e) {
      std::printf("load failed: %s\nFAIL\n", e.what());
      return 1;
    }
  }

  int64_t mb = 1024;
  int reps = 3;
  bool keep = false;
  std::string path = (std::filesystem::temp_directory_path() / "normcore_load_bench.safetensors").string();
  std::string device_spec = "cpu";
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--mb") && has_value) mb = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--path") && has_value) path = argv[++i];
    else if (!std::strcmp(argv[i], "--reps") && has_value) reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--device") && has_value) device_spec = argv[++i];
    else if (!std::strcmp(argv[i], "--keep")) keep = true;
    else {
      std::fprintf(stderr, "usage: %s [--mb MB] [--path FILE] [--reps N] [--device cpu|cuda] [--keep]\n", argv[0]);
      return 2;
    }
  }
  if (mb < 1 || reps < 1) {
    std::fprintf(stderr, "safetensors_load: --mb and --reps must be positive\n");
    return 2;
  }

  {
    const std::vector<int64_t> rows = tensor_rows(mb);
    st::TensorList tensors;
    for (int k = 0; k < kTensors; ++k) {
      nc::Tensor t = nc::empty({rows[k], 1024}, nc::TensorOptions(nc::DType::F32));
      float* data = t.data<float>();
      for (int64_t i = 0; i < t.numel(); ++i) data[i] = value_at(k, i);
      tensors.emplace_back(tensor_name(k), std::move(t));
    }
    const double t0 = now();
    st::save(path, tensors);
    std::printf("wrote %s: %.1f MiB, %d F32 tensors, in %.2f s\n", path.c_str(),
                static_cast<double>(std::filesystem::file_size(path)) / (1 << 20), kTensors, now() - t0);
  }

  const std::string self = std::filesystem::exists("/proc/self/exe")
                               ? std::filesystem::read_symlink("/proc/self/exe").string()
                               : std::string(argv[0]);
  bool pass = true;
  for (int rep = 0; rep < reps; ++rep) {
    pass = run_child(self.c_str(), path, device_spec, mb, true) && pass;
    pass = run_child(self.c_str(), path, device_spec, mb, false) && pass;
  }
  if (!keep) std::filesystem::remove(path);
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
