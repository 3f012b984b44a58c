// Per-device CUDA context (current stream, cuBLAS handle), pinned host memory, copies, and
// the public runtime API of include/normcore/cuda.h. The current stream is one per device
// for the whole process (not per thread): StreamGuard changes it for every thread. The
// per-device state is created on first use and deliberately never destroyed, so tensors
// released during static destruction still find it.
#include "runtime/cuda/runtime.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "normcore/cuda.h"
#include "normcore/error.h"
#include "runtime/cuda/check.h"
#include "runtime/cuda/index_errors.h"

namespace normcore {
namespace cuda {
namespace {

struct DeviceContext {
  std::once_flag stream_created;
  cudaStream_t own_stream = nullptr;
  std::atomic<cudaStream_t> user_stream{nullptr};  // nullptr: own_stream is current
  std::mutex cublas_mutex;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublaslt = nullptr;
  std::atomic<int> sm_count{-1};
  std::atomic<int> shared_memory_optin{-1};
  std::atomic<int> cluster_blocks{-1};
  std::atomic<int> compute_capability{0};
  std::atomic<int> l2_bytes{-1};
  std::atomic<uint64_t> host_waits{0};
};

DeviceContext& context(int device) {
  static DeviceContext* contexts = new DeviceContext[std::max(device_count(), 1)];
  return contexts[device];
}

// Pinned blocks and the uploads that may still be reading them: freeing one waits for those.
struct PinnedBlock {
  size_t nbytes = 0;
  std::vector<cudaEvent_t> pending_reads;
};

struct PinnedRegistry {
  std::mutex mutex;
  std::map<uintptr_t, PinnedBlock> blocks;  // by start address

  // The block containing [ptr, ptr + nbytes), or nullptr (pageable memory). Caller locks.
  PinnedBlock* find(const void* ptr, size_t nbytes) {
    auto address = reinterpret_cast<uintptr_t>(ptr);
    auto it = blocks.upper_bound(address);
    if (it == blocks.begin()) return nullptr;
    --it;
    return address + nbytes <= it->first + it->second.nbytes ? &it->second : nullptr;
  }
};

PinnedRegistry& pinned_registry() {
  static PinnedRegistry* registry = new PinnedRegistry;
  return *registry;
}

// Makes later work on `waiter` wait for the work queued so far on `producer`, a stream of
// producer_device (an event is recorded on a stream of its own device only).
void stream_wait(cudaStream_t waiter, cudaStream_t producer, int producer_device) {
  DeviceGuard guard(producer_device);
  cudaEvent_t event;
  NC_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  NC_CUDA_CHECK(cudaEventRecord(event, producer));
  NC_CUDA_CHECK(cudaStreamWaitEvent(waiter, event, 0));
  NC_CUDA_CHECK(cudaEventDestroy(event));  // released once the wait has been satisfied
}

void upload(void* dst, int device, const void* src, size_t nbytes) {
  DeviceGuard guard(device);
  cudaStream_t s = stream(device);
  NC_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, s));
  PinnedRegistry& registry = pinned_registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  PinnedBlock* block = registry.find(src, nbytes);
  if (block == nullptr) return;  // pageable: CUDA staged the bytes before returning
  auto& reads = block->pending_reads;
  // Drop finished uploads so a buffer reused for many batches keeps a short list.
  reads.erase(std::remove_if(reads.begin(), reads.end(),
                             [](cudaEvent_t e) {
                               if (cudaEventQuery(e) != cudaSuccess) return false;
                               NC_CUDA_LOG(cudaEventDestroy(e));
                               return true;
                             }),
              reads.end());
  cudaGetLastError();  // cudaEventQuery's cudaErrorNotReady is not an error here
  cudaEvent_t event;
  NC_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  NC_CUDA_CHECK(cudaEventRecord(event, s));
  reads.push_back(event);
}

}  // namespace

int device_count() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // no driver or no GPU: report none instead of failing
      n = 0;
    }
    return n;
  }();
  return count;
}

void check_device(const char* fn, int device) {
  int count = device_count();
  NC_CHECK(count > 0, DeviceError, fn, ": no CUDA device is available");
  NC_CHECK(device >= 0 && device < count, DeviceError, fn, ": device index ", device, " is out of range (", count,
           " CUDA device(s) visible)");
}

cudaStream_t stream(int device) {
  DeviceContext& ctx = context(device);
  cudaStream_t user = ctx.user_stream.load(std::memory_order_acquire);
  if (user != nullptr) return user;
  std::call_once(ctx.stream_created, [&] {
    DeviceGuard guard(device);
    NC_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx.own_stream, cudaStreamNonBlocking));
  });
  return ctx.own_stream;
}

bool is_own_stream(int device, cudaStream_t s) { return s != nullptr && s == context(device).own_stream; }

void set_stream(int device, cudaStream_t s) { context(device).user_stream.store(s, std::memory_order_release); }

cublasHandle_t cublas_handle(int device) {
  DeviceContext& ctx = context(device);
  cudaStream_t s = stream(device);
  std::lock_guard<std::mutex> lock(ctx.cublas_mutex);
  if (ctx.cublas == nullptr) {
    DeviceGuard guard(device);
    NC_CUDA_CHECK(cublasCreate(&ctx.cublas));
  }
  NC_CUDA_CHECK(cublasSetStream(ctx.cublas, s));
  return ctx.cublas;
}

cublasLtHandle_t cublaslt_handle(int device) {
  DeviceContext& ctx = context(device);
  std::lock_guard<std::mutex> lock(ctx.cublas_mutex);
  if (ctx.cublaslt == nullptr) {
    DeviceGuard guard(device);
    NC_CUDA_CHECK(cublasLtCreate(&ctx.cublaslt));
  }
  return ctx.cublaslt;
}

namespace {

// A device attribute, read once into its slot (-1 until then).
int cached_attribute(std::atomic<int>& slot, cudaDeviceAttr attribute, int device) {
  int value = slot.load(std::memory_order_relaxed);
  if (value < 0) {
    NC_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
    slot.store(value, std::memory_order_relaxed);
  }
  return value;
}

}  // namespace

int multiprocessor_count(int device) {
  return cached_attribute(context(device).sm_count, cudaDevAttrMultiProcessorCount, device);
}

int l2_cache_bytes(int device) { return cached_attribute(context(device).l2_bytes, cudaDevAttrL2CacheSize, device); }

int shared_memory_per_block(int device) {
  return cached_attribute(context(device).shared_memory_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
}

int cluster_blocks(int device) {
  DeviceContext& ctx = context(device);
  int blocks = ctx.cluster_blocks.load(std::memory_order_relaxed);
  if (blocks < 0) {
    int launch = 0;
    NC_CUDA_CHECK(cudaDeviceGetAttribute(&launch, cudaDevAttrClusterLaunch, device));
    blocks = launch ? 8 : 0;  // 8: the portable cluster size
    ctx.cluster_blocks.store(blocks, std::memory_order_relaxed);
  }
  return blocks;
}

int compute_capability(int device) {
  DeviceContext& ctx = context(device);
  int found = ctx.compute_capability.load(std::memory_order_relaxed);
  if (found == 0) {
    int major = 0, minor = 0;
    NC_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    NC_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    found = major * 10 + minor;
    ctx.compute_capability.store(found, std::memory_order_relaxed);
  }
  return found;
}

void wait_for_stream(int device, cudaStream_t s) {
  context(device).host_waits.fetch_add(1, std::memory_order_relaxed);
  NC_CUDA_CHECK(cudaStreamSynchronize(s));
}

DeviceGuard::DeviceGuard(int device) : previous_(device), device_(device) {
  NC_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device_) NC_CUDA_CHECK(cudaSetDevice(device_));
}

DeviceGuard::~DeviceGuard() {
  if (previous_ != device_) NC_CUDA_LOG(cudaSetDevice(previous_));
}

void* pinned_alloc(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  void* ptr = nullptr;
  // Portable: usable for transfers with every device, not only the current one.
  NC_CUDA_CHECK(cudaHostAlloc(&ptr, nbytes, cudaHostAllocPortable));
  PinnedRegistry& registry = pinned_registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  registry.blocks[reinterpret_cast<uintptr_t>(ptr)].nbytes = nbytes;
  return ptr;
}

void pinned_free(void* ptr) {
  if (ptr == nullptr) return;
  PinnedRegistry& registry = pinned_registry();
  {
    std::lock_guard<std::mutex> lock(registry.mutex);
    auto it = registry.blocks.find(reinterpret_cast<uintptr_t>(ptr));
    if (it != registry.blocks.end()) {
      for (cudaEvent_t e : it->second.pending_reads) {
        NC_CUDA_LOG(cudaEventSynchronize(e));
        NC_CUDA_LOG(cudaEventDestroy(e));
      }
      registry.blocks.erase(it);
    }
  }
  NC_CUDA_LOG(cudaFreeHost(ptr));
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (nbytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, nbytes);
    return;
  }
  if (src_device.is_cpu()) {
    check_not_capturing(dst_device.index, "copy",
                        "copying host memory to the device would replay the bytes that address holds "
                        "then; fill a device tensor before the capture and update it in place");
    upload(dst, dst_device.index, src, nbytes);
    return;
  }
  if (dst_device.is_cpu()) {
    check_not_capturing(src_device.index, "copy",
                        "it reads device memory on the host (item(), to(cpu), a data-dependent shape), "
                        "which has no value until the graph is replayed");
    DeviceGuard guard(src_device.index);
    cudaStream_t s = stream(src_device.index);
    NC_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, s));
    wait_for_stream(src_device.index, s);
    // The host waited anyway: an index error of the work before is raised here.
    report_index_errors(src_device.index, true);
    return;
  }
  if (dst_device.index == src_device.index) {
    DeviceGuard guard(dst_device.index);
    NC_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, stream(dst_device.index)));
    return;
  }
  // Peer copy on the source's stream, ordered after the work queued on both streams so far
  // and before any later work on the destination's stream.
  DeviceGuard guard(src_device.index);
  cudaStream_t src_stream = stream(src_device.index);
  cudaStream_t dst_stream = stream(dst_device.index);
  stream_wait(src_stream, dst_stream, dst_device.index);
  NC_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, nbytes, src_stream));
  stream_wait(dst_stream, src_stream, src_device.index);
}

// ---------------------------------------------------------------- public API (cuda.h)

void mem_get_info(int device, size_t* free_bytes, size_t* total_bytes) {
  check_device("cuda::mem_get_info", device);
  DeviceGuard guard(device);
  NC_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

int current_device() {
  NC_CHECK(device_count() > 0, DeviceError, "cuda::current_device: no CUDA device is available");
  int device = 0;
  NC_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

void set_device(int device) {
  check_device("cuda::set_device", device);
  NC_CUDA_CHECK(cudaSetDevice(device));
}

void synchronize(int device) {
  if (device < 0) device = current_device();
  check_device("cuda::synchronize", device);
  check_not_capturing(device, "cuda::synchronize", "it waits for the device, which runs nothing during a capture");
  wait_for_stream(device, cuda::stream(device));
  report_index_errors(device, true);
}

uint64_t host_waits(int device) {
  if (device < 0) device = current_device();
  check_device("cuda::host_waits", device);
  return context(device).host_waits.load(std::memory_order_relaxed);
}

StreamHandle current_stream(int device) {
  check_device("cuda::current_stream", device);
  return cuda::stream(device);
}

void set_current_stream(int device, StreamHandle handle) {
  check_device("cuda::set_current_stream", device);
  auto s = static_cast<cudaStream_t>(handle);
  if (s != nullptr) {
    int owner = -1;
    NC_CUDA_CHECK(cudaStreamGetDevice(s, &owner));
    NC_CHECK(owner == device, DeviceError, "cuda::set_current_stream: the stream belongs to device ", owner,
             ", not device ", device);
  }
  set_stream(device, s);
}

StreamHandle create_stream() {
  NC_CHECK(device_count() > 0, DeviceError, "cuda::create_stream: no CUDA device is available");
  cudaStream_t s = nullptr;
  NC_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void destroy_stream(StreamHandle handle) {
  auto s = static_cast<cudaStream_t>(handle);
  if (s == nullptr) return;
  int device = -1;
  NC_CUDA_CHECK(cudaStreamGetDevice(s, &device));
  check_device("cuda::destroy_stream", device);
  NC_CHECK(!is_own_stream(device, s), ValueError,
           "cuda::destroy_stream: cannot destroy normcore's own stream of device ", device);
  // Stop using it first, so no new work lands on it while it drains.
  if (cuda::stream(device) == s) set_stream(device, nullptr);
  DeviceGuard guard(device);
  wait_for_stream(device, s);
  release_stream_blocks(device, s);
  NC_CUDA_CHECK(cudaStreamDestroy(s));
}

StreamGuard::StreamGuard(int device, StreamHandle stream) : device_(device), previous_(current_stream(device)) {
  set_current_stream(device, stream);
}

StreamGuard::~StreamGuard() { set_stream(device_, static_cast<cudaStream_t>(previous_)); }

}  // namespace cuda
}  // namespace normcore
