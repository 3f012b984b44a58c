// Devices: the CPU and CUDA GPUs by index ("cpu", "cuda:0"), and what is available.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  Device() = default;
  Device(DeviceType t, int i = 0) : type(t), index(i) {}
  // Parses "cpu", "cuda", "cuda:N"; throws DeviceError otherwise.
  explicit Device(const std::string& spec);

  static Device cpu() { return Device(DeviceType::CPU, 0); }
  static Device cuda(int index = 0) { return Device(DeviceType::CUDA, index); }

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;

  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

std::ostream& operator<<(std::ostream& os, const Device& d);

// True when normcore was built with CUDA and at least one GPU is visible.
bool cuda_is_available();
// Number of visible GPUs (0 in a CPU-only build).
int cuda_device_count();
// cuda:0 when a GPU is available, otherwise cpu.
Device best_device();

// The threads the CPU backend's kernels run on: the calling thread and num_threads() - 1
// workers of one pool. The default is the environment's NORMCORE_NUM_THREADS when set (a
// whole number from 1 to 4096), else the cores the process may run on. Results do not
// depend on it: work is cut by its size alone and partial sums are added in a fixed order.
// set_num_threads waits for a running parallel kernel and takes effect for the next;
// ValueError outside [1, 4096].
int num_threads();
void set_num_threads(int n);

}  // namespace normcore

#pragma GCC visibility pop
