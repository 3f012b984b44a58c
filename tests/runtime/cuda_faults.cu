// GPU faults that need a process of their own, caused by kernels of this program (the
// application) on normcore's stream, and what normcore must make of them:
//   normcore_cuda_faults launch-error      a launch that fails (invalid configuration)
//   normcore_cuda_faults illegal-address   a kernel that writes to an address it does not own
//   normcore_cuda_faults illegal-address-blocking   the same with NORMCORE_CUDA_LAUNCH_BLOCKING=1
// Each must surface as a CudaError naming a normcore op, never as an abort; after a launch
// error the GPU keeps working, after an illegal address every later CUDA op throws CudaError
// while the CPU keeps working, and the process exits normally (tensors freed after the
// fault, static destruction). Prints PASS/FAIL lines; exit 0 when all pass, 1 otherwise,
// 77 (ctest's skip) without a GPU.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "normcore/cuda.h"
#include "normcore/device.h"
#include "normcore/error.h"
#include "normcore/ops.h"
#include "normcore/tensor.h"

namespace nc = normcore;
using nc::Device;
using nc::Tensor;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  if (!ok) ++failures;
}

bool contains(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

__global__ void fill_kernel(float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 1.0f;
}

// Writes through a pointer into memory nobody allocated.
__global__ void stray_write_kernel(float* bad) { bad[threadIdx.x] = 1.0f; }

cudaStream_t normcore_stream() { return static_cast<cudaStream_t>(nc::cuda::current_stream(0)); }

// The sum of a + b over the GPU, read back: one op after another, each may throw.
float add_and_read(const Tensor& a, const Tensor& b, const char** stage) {
  *stage = "add";
  Tensor c = nc::add(a, b);
  *stage = "sum";
  Tensor total = nc::sum(c);
  *stage = "item";
  return total.item<float>();
}

void launch_error() {
  Tensor a = nc::ones({1000}, Device::cuda());
  Tensor b = nc::full({1000}, 2.0, nc::TensorOptions(nc::DType::F32, Device::cuda()));
  // 4096 threads per block is over every GPU's limit: the launch fails, unchecked here.
  fill_kernel<<<1, 4096, 0, normcore_stream()>>>(nullptr, 0);
  try {
    Tensor c = nc::add(a, b);
    expect(false, "add after a failed launch throws");
  } catch (const nc::CudaError& e) {
    const std::string message = e.what();
    std::printf("  %s\n", message.c_str());
    // CUDA 13 calls it cudaErrorInvalidValue, earlier versions cudaErrorInvalidConfiguration.
    expect(message.rfind("add: kernel launch failed", 0) == 0 && contains(message, "cudaErrorInvalid"),
           "the CudaError names add and the launch error");
    expect(!contains(message, "restart"), "a launch error does not count as a lost context");
  }
  // The error was read and cleared: the GPU works on.
  const char* stage = "";
  const float total = add_and_read(a, b, &stage);
  expect(total == 3000.0f, "add, sum and item after the launch error give 3000 (got " + std::to_string(total) + ")");
}

void illegal_address(bool blocking) {
  Tensor a = nc::ones({1 << 20}, Device::cuda());
  Tensor b = nc::ones({1 << 20}, Device::cuda());
  nc::cuda::synchronize(0);
  stray_write_kernel<<<1, 32, 0, normcore_stream()>>>(reinterpret_cast<float*>(uintptr_t{0x10}));
  const char* stage = "";
  try {
    add_and_read(a, b, &stage);
    expect(false, "an op after the fault throws");
  } catch (const nc::CudaError& e) {
    const std::string message = e.what();
    std::printf("  thrown by %s: %s\n", stage, message.c_str());
    expect(contains(message, "cudaErrorIllegalAddress"), "the CudaError says illegal address");
    expect(message.rfind(std::string(stage) + ":", 0) == 0, std::string("the message starts with the op, ") + stage);
    expect(contains(message, "restart the process"), "the message says the context is lost");
    if (blocking) expect(std::strcmp(stage, "add") == 0, "with launch blocking, the first op after the fault throws");
  } catch (const std::exception& e) {
    expect(false, std::string("an op after the fault throws CudaError, not: ") + e.what());
  }
  // Every later CUDA op fails the same way, and says so.
  for (int i = 0; i < 2; ++i) {
    try {
      Tensor t = nc::ones({4}, Device::cuda());
      nc::cuda::synchronize(0);
      expect(false, "CUDA work after the fault throws");
    } catch (const nc::CudaError& e) {
      expect(contains(e.what(), "cudaErrorIllegalAddress"),
             std::string("later CUDA work throws CudaError: ") + e.what());
    }
  }
  // The CPU is not affected.
  Tensor x = nc::arange(0, 5, 1, nc::TensorOptions(nc::DType::F32, Device::cpu()));
  expect(nc::sum(x).item<float>() == 10.0f, "CPU ops after the fault still work");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "launch-error" && mode != "illegal-address" && mode != "illegal-address-blocking") {
    std::fprintf(stderr, "usage: %s launch-error|illegal-address|illegal-address-blocking\n", argv[0]);
    return 2;
  }
  // Read at normcore's first launch check, so set before any op.
  if (mode == "illegal-address-blocking") setenv("NORMCORE_CUDA_LAUNCH_BLOCKING", "1", 1);
  if (!nc::cuda_is_available()) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  try {
    if (mode == "launch-error") launch_error();
    else illegal_address(mode == "illegal-address-blocking");
  } catch (const std::exception& e) {
    expect(false, std::string("unexpected exception: ") + e.what());
  }
  std::printf("%s: %d failed\n", mode.c_str(), failures);
  return failures == 0 ? 0 : 1;
}
