// CUDA-event timing for the GPU benchmarks: the median of a step's times on device 0's
// current stream, after warm-up runs. A CUDA error ends the program with its message.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "normcore/normcore.h"

namespace bench {

inline void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  std::fprintf(stderr, "bench: %s: %s\n", what, cudaGetErrorString(status));
  std::exit(1);
}

inline cudaStream_t stream() { return static_cast<cudaStream_t>(normcore::cuda::current_stream(0)); }

// Median milliseconds of fn over reps runs, after warmup runs.
inline double median_ms(const std::function<void()>& fn, int reps, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) fn();
  normcore::cuda::synchronize(0);
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(start, stream()), "cudaEventRecord");
    fn();
    check(cudaEventRecord(stop, stream()), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace bench
