// Index errors found on the device, reported later on the host. A kernel that meets an index
// out of range skips that element and records the first such index of the device (which
// message it belongs to, the value, the size it was checked against) without synchronizing;
// the host raises IndexError at the next point where it waits for the device anyway (a copy
// to the host, cuda::synchronize, a graph's replay or synchronize, cuda::check_errors), and
// clears the record. Until then the record keeps the first error: later ones do not replace it.
//
// Memory: one record per device, made on first use and never freed. The claim word is
// device memory (only the device's atomics touch it); the report is mapped, page-locked host
// memory, written by the one thread that took the claim, so the host reads it with no copy.
#pragma once

#include <cstdint>
#include <string>

namespace normcore {
namespace cuda {

struct IndexErrorReport {
  unsigned int found;  // written last, after the rest
  int site;            // index_error_slot's message
  long long value;
  long long size;
};

// What a kernel needs to record into a device's record; passed by value, so a CUDA graph
// captures it (the record's addresses never change).
struct IndexErrorSlot {
  unsigned int* claim;
  IndexErrorReport* report;  // the device's address of the mapped host memory
  int site;

#ifdef __CUDACC__
  __device__ void record(long long value, long long size) const {
    if (atomicExch(claim, 1u) != 0u) return;
    volatile IndexErrorReport* r = report;
    r->site = site;
    r->value = value;
    r->size = size;
    __threadfence_system();
    r->found = 1u;
  }
  // True for an index in [0, size); otherwise records it and returns false.
  __device__ bool in_range(long long index, long long size) const {
    if (index >= 0 && index < size) return true;
    record(index, size);
    return false;
  }
#endif
};

// The message of an error is head + value + middle + size + tail ("embedding: index ", 12,
// " is out of range for ", 10, " embeddings"). Messages are kept once each, for the life of
// the process; inside a CUDA graph capture the tail also says that a replay found it.
IndexErrorSlot index_error_slot(int device, const std::string& head, const std::string& middle,
                                const std::string& tail);

// Makes the device's record (allocations and the claim cleared on its stream); Graph::capture
// calls it before capturing, so that no record is first made inside a capture.
void prepare_index_errors(int device);

// Throws the IndexError recorded on device, if any, and clears the record. waited: the host
// has just waited for the device's current stream; otherwise, when a record is seen, it waits
// first (on the error path only), so that nothing queued before stays behind unreported.
// Does nothing while a capture is under way on device.
void report_index_errors(int device, bool waited);

}  // namespace cuda
}  // namespace normcore
