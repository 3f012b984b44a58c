// CUDA sample_logits (contract: kernels/generate.h): one block of kSampleThreads per row, the row
// read from global memory (L2) once a pass. The row's first maximum; the top_k cut as the
// top_k-th largest logit by a radix select over order-preserving 32-bit keys (four 8-bit
// digits, integer histograms in shared memory); the kept weights' total; the top_p cut as
// the largest key whose kept mass from the top reaches top_p of that total (a bisection over
// keys, one pass each, at most 32); then the draw: chunks of kSampleThreads classes in index order,
// a block-wide inclusive sum of their kept weights, the first class whose running sum passes
// u times the total. Every sum runs in a fixed order, so a row's choice is the same on every
// run; one block per row, and the draw from the generator's counters (as dropout's), so a
// decoding step samples inside its CUDA graph.
#include <cstdint>
#include <limits>

#include "base/philox.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/reduction/combine.cuh"
#include "kernels/cuda/sample.h"

namespace normcore {
namespace cuda {
namespace {

constexpr int kSampleThreads = 1024;
constexpr int kSampleWarps = kSampleThreads / 32;

// Larger floats have larger keys (negative ones bit-flipped, positive ones with the sign set).
__device__ __forceinline__ uint32_t order_key(float x) {
  const uint32_t bits = __float_as_uint(x);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// The larger value, the smaller index on a tie.
struct Best {
  float value;
  long long index;
};
__device__ __forceinline__ Best better(Best a, Best b) {
  return (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
}
struct Better {
  __device__ __forceinline__ Best operator()(Best a, Best b) const { return better(a, b); }
};
__device__ __forceinline__ Best shfl_xor(Best v, int mask) {
  return {cuda::shfl_xor<float>(v.value, mask), cuda::shfl_xor<long long>(v.index, mask)};
}

template <class T>
__global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(const T* __restrict__ logits, int64_t classes, uint64_t seed, uint64_t offset,
                  const uint64_t* __restrict__ offset_base, double temperature, int64_t top_k, double top_p,
                  int64_t* __restrict__ out) {
  __shared__ unsigned int counts[256];
  __shared__ double sums[kSampleWarps];
  __shared__ unsigned int digit;
  __shared__ long long left;
  const T* x = logits + static_cast<int64_t>(blockIdx.x) * classes;
  const auto value = [&](int64_t j) { return convert<float>(x[j]); };

  Best best{-std::numeric_limits<float>::infinity(), std::numeric_limits<long long>::max()};
  for (int64_t j = threadIdx.x; j < classes; j += kSampleThreads) best = better(best, Best{value(j), j});
  best = team_reduce<kSampleThreads>(best, Better{});
  const double max = best.value;

  uint32_t cutoff = 0;  // classes whose key is at least this are kept
  if (top_k > 0 && top_k < classes) {
    uint32_t prefix = 0, mask = 0;
    long long remaining = top_k;  // rank of the wanted key among those matching prefix, from the top
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += kSampleThreads) counts[i] = 0;
      __syncthreads();
      for (int64_t j = threadIdx.x; j < classes; j += kSampleThreads) {
        const uint32_t key = order_key(value(j));
        if ((key & mask) == prefix) atomicAdd(&counts[(key >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        long long above = 0;
        int d = 255;
        for (; d > 0 && above + counts[d] < remaining; --d) above += counts[d];
        digit = static_cast<unsigned int>(d);
        left = remaining - above;
      }
      __syncthreads();
      prefix |= digit << shift;
      mask |= 255u << shift;
      remaining = left;
      __syncthreads();  // digit and left are read before the next digit's thread 0 writes them
    }
    cutoff = prefix;
  }
  const auto weight = [&](int64_t j, uint32_t from) {
    const float v = value(j);
    return order_key(v) >= from ? exp((static_cast<double>(v) - max) / temperature) : 0.0;
  };
  const auto mass = [&](uint32_t from) {
    double s = 0;
    for (int64_t j = threadIdx.x; j < classes; j += kSampleThreads) s += weight(j, from);
    return team_reduce<kSampleThreads>(s, Plus{});
  };
  double total = mass(cutoff);
  uint32_t from = cutoff;
  if (top_p < 1) {
    // The largest key whose mass from the top reaches top_p of the total (the cutoff's does).
    const double need = top_p * total;
    uint32_t lo = cutoff, hi = order_key(best.value);
    while (lo < hi) {
      const uint32_t mid = lo + (hi - lo) / 2 + 1;
      if (mass(mid) >= need) lo = mid;
      else hi = mid - 1;
    }
    from = lo;
    total = mass(from);
  }

  // rand's f64 uniform of this row's counter.
  const uint64_t first = offset_base != nullptr ? *offset_base + offset : offset;
  const philox::Words r = philox::generate(seed, first + blockIdx.x);
  const double target = philox::uniform_double(r.w[0], r.w[1]) * total;
  double before = 0;  // kept weight of the chunks so far
  long long chosen = std::numeric_limits<long long>::max();
  for (int64_t base = 0; base < classes && chosen == std::numeric_limits<long long>::max(); base += kSampleThreads) {
    const int64_t j = base + threadIdx.x;
    const double w = j < classes ? weight(j, from) : 0.0;
    // Inclusive sum of the chunk's weights up to this thread: within the warp, then the
    // earlier warps' totals.
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    double running = w;
    for (int o = 1; o < 32; o *= 2) {
      const double up = __shfl_up_sync(0xffffffffu, running, o);
      if (lane >= o) running += up;
    }
    __syncthreads();
    if (lane == 31) sums[warp] = running;
    __syncthreads();
    double chunk = 0;
    for (int k = 0; k < kSampleWarps; ++k) {
      if (k < warp) running += sums[k];
      chunk += sums[k];
    }
    const bool passes = w > 0 && before + running > target;
    chosen = team_reduce<kSampleThreads>(passes ? j : std::numeric_limits<long long>::max(), Min{});
    before += chunk;
  }
  const long long fallback = best.index == std::numeric_limits<long long>::max() ? 0 : best.index;  // all NaN: 0
  if (threadIdx.x == 0) out[blockIdx.x] = chosen == std::numeric_limits<long long>::max() ? fallback : chosen;
}

}  // namespace

void sample_logits(const Tensor& logits, uint64_t seed, uint64_t offset, const uint64_t* offset_base,
                   double temperature, int64_t top_k, double top_p, const Tensor& out) {
  const int64_t rows = out.numel();
  if (rows == 0) return;
  const int64_t classes = logits.numel() / rows;
  const Launcher launch("sample_logits", logits);
  visit_float(logits.dtype(), "sample_logits", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(sample_kernel<T>, static_cast<unsigned>(rows), kSampleThreads, 0, data_as<const T>(logits), classes, seed,
           offset, offset_base, temperature, top_k, top_p, data_as<int64_t>(out));
  });
}

}  // namespace cuda
}  // namespace normcore
