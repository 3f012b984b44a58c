// The deferred index-error record of each device (runtime/cuda/index_errors.h), the messages
// it names, and the public check (cuda::check_errors). A process that ends with a record
// nobody reported prints it to stderr, so that an error is never dropped without a word.
#include "runtime/cuda/index_errors.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "normcore/cuda.h"
#include "normcore/error.h"
#include "runtime/cuda/capture.h"
#include "runtime/cuda/check.h"
#include "runtime/cuda/runtime.h"

namespace normcore {
namespace cuda {
namespace {

struct Site {
  std::string head, middle, tail;
};

struct Record {
  unsigned int* claim = nullptr;              // device memory
  IndexErrorReport* report = nullptr;         // mapped host memory, as the host sees it
  IndexErrorReport* device_report = nullptr;  // the same, as the device sees it
};

// Messages by id, and the record of each device, made on first use.
struct Registry {
  std::mutex mutex;
  std::vector<Site> sites;
  std::map<std::string, int> site_ids;  // by head, middle and tail
  // Per device; set once, under the mutex, and read without it by the hosts' checks.
  std::unique_ptr<std::atomic<Record*>[]> records;
  size_t devices = 0;
};

// Never destroyed: kernels and the exit check may use it to the end.
Registry& registry() {
  static Registry* r = [] {
    auto* made = new Registry;
    made->devices = static_cast<size_t>(std::max(device_count(), 1));
    made->records.reset(new std::atomic<Record*>[made->devices]());
    return made;
  }();
  return *r;
}

unsigned int load_found(const IndexErrorReport* report) { return __atomic_load_n(&report->found, __ATOMIC_ACQUIRE); }

std::string message_of(const Site& site, const IndexErrorReport& report) {
  return detail::cat_str(site.head, report.value, site.middle, report.size, site.tail);
}

// At exit: a record that no host wait reported.
void warn_unreported() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (size_t device = 0; device < r.devices; ++device) {
    const Record* record = r.records[device].load(std::memory_order_acquire);
    if (record == nullptr || load_found(record->report) == 0) continue;
    const IndexErrorReport report = *record->report;
    const bool known = report.site >= 0 && static_cast<size_t>(report.site) < r.sites.size();
    std::fprintf(stderr,
                 "normcore: cuda:%zu found an index out of range that was never reported (nothing waited "
                 "for the device after it): %s\n",
                 device, known ? message_of(r.sites[report.site], report).c_str() : "unknown op");
  }
}

// The device's record, made on first use. Caller locks.
Record& record_locked(Registry& r, int device) {
  if (Record* made = r.records[device].load(std::memory_order_acquire)) return *made;
  static std::once_flag exit_check;
  std::call_once(exit_check, [] { std::atexit(warn_unreported); });
  auto made = std::make_unique<Record>();
  DeviceGuard guard(device);
  NC_CUDA_CHECK(cudaMalloc(&made->claim, sizeof(unsigned int)));
  // Ordered before every later kernel on the device's stream.
  NC_CUDA_CHECK(cudaMemsetAsync(made->claim, 0, sizeof(unsigned int), stream(device)));
  void* host = nullptr;
  NC_CUDA_CHECK(cudaHostAlloc(&host, sizeof(IndexErrorReport), cudaHostAllocMapped | cudaHostAllocPortable));
  made->report = static_cast<IndexErrorReport*>(host);
  *made->report = IndexErrorReport{0u, -1, 0, 0};
  void* mapped = nullptr;
  NC_CUDA_CHECK(cudaHostGetDevicePointer(&mapped, host, 0));
  made->device_report = static_cast<IndexErrorReport*>(mapped);
  Record* kept = made.release();  // never freed
  r.records[device].store(kept, std::memory_order_release);
  return *kept;
}

}  // namespace

IndexErrorSlot index_error_slot(int device, const std::string& head, const std::string& middle,
                                const std::string& tail) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  Site site{head, middle, tail};
  if (capturing(device)) site.tail += " (in a replay of a CUDA graph; the results of that replay are not valid)";
  const std::string key = site.head + '\0' + site.middle + '\0' + site.tail;
  auto it = r.site_ids.find(key);
  if (it == r.site_ids.end()) {
    it = r.site_ids.emplace(key, static_cast<int>(r.sites.size())).first;
    r.sites.push_back(std::move(site));
  }
  Record& record = record_locked(r, device);
  return IndexErrorSlot{record.claim, record.device_report, it->second};
}

void prepare_index_errors(int device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  record_locked(r, device);
}

void report_index_errors(int device, bool waited) {
  Registry& r = registry();
  const Record* record = r.records[device].load(std::memory_order_acquire);
  if (record == nullptr || load_found(record->report) == 0 || capturing(device)) return;
  std::lock_guard<std::mutex> lock(r.mutex);
  cudaStream_t s = stream(device);
  if (!waited) wait_for_stream(device, s);
  if (load_found(record->report) == 0) return;  // another thread reported it meanwhile
  const IndexErrorReport report = *record->report;
  std::string message = report.site >= 0 && static_cast<size_t>(report.site) < r.sites.size()
                            ? message_of(r.sites[report.site], report)
                            : detail::cat_str("an index kernel: index ", report.value, " is out of range");
  // The stream is idle: the clear comes before any kernel queued from now on.
  DeviceGuard guard(device);
  NC_CUDA_CHECK(cudaMemsetAsync(record->claim, 0, sizeof(unsigned int), s));
  __atomic_store_n(&record->report->found, 0u, __ATOMIC_RELEASE);
  throw IndexError(message);
}

// ---------------------------------------------------------------- public API (cuda.h)

void check_errors(int device) {
  if (device < 0) device = current_device();
  check_device("cuda::check_errors", device);
  check_not_capturing(device, "cuda::check_errors",
                      "an index error of the capture's work has no value until the graph is replayed");
  report_index_errors(device, false);
}

}  // namespace cuda
}  // namespace normcore
