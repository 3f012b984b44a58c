// Devices: the CPU and CUDA GPUs by index ("cpu", "cuda:0"), and what is available.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

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

}  // namespace normcore
