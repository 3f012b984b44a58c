// Device parsing and printing, and the availability queries.
#include "normcore/device.h"

#include <cstdlib>

#include "normcore/error.h"
#ifdef NORMCORE_HAS_CUDA
#include "runtime/cuda/runtime.h"
#endif

namespace normcore {

Device::Device(const std::string& spec) {
  if (spec == "cpu") {
    *this = Device::cpu();
    return;
  }
  if (spec == "cuda") {
    *this = Device::cuda(0);
    return;
  }
  if (spec.rfind("cuda:", 0) == 0 && spec.size() > 5) {
    const std::string digits = spec.substr(5);
    bool ok = digits.size() <= 4 && digits.find_first_not_of("0123456789") == std::string::npos;
    if (ok) {
      *this = Device::cuda(std::atoi(digits.c_str()));
      return;
    }
  }
  throw DeviceError("Device: cannot parse '" + spec + "' (expected cpu, cuda or cuda:N)");
}

std::string Device::str() const { return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index); }

std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

int cuda_device_count() {
#ifdef NORMCORE_HAS_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

bool cuda_is_available() { return cuda_device_count() > 0; }

Device best_device() { return cuda_is_available() ? Device::cuda(0) : Device::cpu(); }

}  // namespace normcore
