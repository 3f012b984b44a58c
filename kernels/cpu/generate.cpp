// CPU sequences and random numbers (contracts in kernels/generate.h). Random element i comes
// from philox::generate(seed, offset + i) and the transforms in base/philox.h, as on CUDA.
#include "kernels/generate.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "base/philox.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/scalar/dropout.h"

namespace normcore {
namespace cpu {
namespace {

// The largest value below 1 in T, for uniforms that round up to 1 in a 16-bit float.
template <class T>
T below_one() {
  if constexpr (std::is_same<T, Half>::value) return Half::from_bits(0x3bff);
  if constexpr (std::is_same<T, BFloat16>::value) return BFloat16::from_bits(0x3f7f);
  return T(0);
}

// A Philox draw costs tens of element-wise operations: ranges of this many elements.
constexpr int64_t kRandomGrain = 4096;

// out[i] = f(i) for every element of contiguous out, in ranges on the thread pool (element
// i depends on i alone, so the result does not depend on the thread count).
template <class T, class F>
void generate_each(const Tensor& out, F f) {
  T* p = data_as<T>(out);
  parallel_for(out.numel(), kRandomGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) p[i] = f(i);
  });
}

// One row of sample_logits (kernels/generate.h): the draw u over the kept classes' weights,
// in double, summed in index order.
int64_t sample_row(const std::vector<float>& logits, double u, double temperature, int64_t top_k, double top_p) {
  const auto most_likely = std::max_element(logits.begin(), logits.end());
  float cutoff = -INFINITY;
  if (top_k > 0 && top_k < static_cast<int64_t>(logits.size())) {
    std::vector<float> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<float>());
    cutoff = sorted[top_k - 1];
  }
  std::vector<double> weights(logits.size(), 0.0);
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] < cutoff) continue;
    weights[i] = std::exp((static_cast<double>(logits[i]) - *most_likely) / temperature);
    total += weights[i];
  }
  if (top_p < 1) {
    // The most likely first (ties by index, so the cut is the same every time); keep them
    // until their weight reaches top_p of the total, drop the rest.
    std::vector<int64_t> order;
    for (size_t i = 0; i < weights.size(); ++i)
      if (weights[i] > 0) order.push_back(static_cast<int64_t>(i));
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return weights[a] > weights[b]; });
    double kept = 0;
    size_t n = 0;
    while (n < order.size() && (n == 0 || kept < top_p * total)) kept += weights[order[n++]];
    for (size_t j = n; j < order.size(); ++j) weights[order[j]] = 0;
    total = kept;
  }
  double target = u * total;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] == 0) continue;
    target -= weights[i];
    if (target < 0) return static_cast<int64_t>(i);
  }
  return most_likely - logits.begin();  // rounding left u * total past the last weight
}

class CpuGenerate final : public kernels::GenerateKernels {
 public:
  void arange(const Tensor& out, double start, double step) const override {
    visit(out.dtype(), "arange", [&](auto tag) {
      using T = typename decltype(tag)::type;
      generate_each<T>(out, [&](int64_t i) { return convert<T>(start + static_cast<double>(i) * step); });
    });
  }

  void linspace(const Tensor& out, double start, double end) const override {
    const int64_t n = out.numel();
    const double step = (end - start) / static_cast<double>(n - 1);
    visit(out.dtype(), "linspace", [&](auto tag) {
      using T = typename decltype(tag)::type;
      generate_each<T>(out, [&](int64_t i) {
        return convert<T>(i < n / 2 ? start + static_cast<double>(i) * step
                                    : end - static_cast<double>(n - 1 - i) * step);
      });
    });
  }

  void random_uniform(const Tensor& out, uint64_t seed, uint64_t offset) const override {
    visit_float(out.dtype(), "random_uniform", [&](auto tag) {
      using T = typename decltype(tag)::type;
      generate_each<T>(out, [&](int64_t i) {
        const philox::Words r = philox::generate(seed, offset + static_cast<uint64_t>(i));
        if constexpr (std::is_same<T, double>::value) {
          return philox::uniform_double(r.w[0], r.w[1]);
        } else if constexpr (std::is_same<T, float>::value) {
          return philox::uniform_float(r.w[0]);
        } else {
          const T v = convert<T>(philox::uniform_float(r.w[0]));
          return convert<float>(v) >= 1.0f ? below_one<T>() : v;
        }
      });
    });
  }

  void random_normal(const Tensor& out, uint64_t seed, uint64_t offset) const override {
    visit_float(out.dtype(), "random_normal", [&](auto tag) {
      using T = typename decltype(tag)::type;
      generate_each<T>(out, [&](int64_t i) {
        const philox::Words r = philox::generate(seed, offset + static_cast<uint64_t>(i));
        if constexpr (std::is_same<T, double>::value) return philox::normal_double(r);
        else return convert<T>(philox::normal_float(r));
      });
    });
  }

  void random_int(const Tensor& out, uint64_t seed, uint64_t offset, int64_t low, uint64_t range) const override {
    visit(out.dtype(), "random_int", [&](auto tag) {
      using T = typename decltype(tag)::type;
      generate_each<T>(out, [&](int64_t i) {
        return convert<T>(philox::uniform_int(philox::generate(seed, offset + static_cast<uint64_t>(i)), low, range));
      });
    });
  }
  void dropout(const Tensor& x, const Tensor& out, const Tensor& keep, uint64_t seed, uint64_t offset,
               const uint64_t* /*offset_base: CUDA graphs only*/, float threshold, double scale) const override {
    visit_float(x.dtype(), "dropout", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      const T* in = data_as<const T>(x);
      T* result = data_as<T>(out);
      bool* mask = data_as<bool>(keep);
      const C s = convert<C>(convert<T>(scale));
      parallel_for(out.numel(), kRandomGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          mask[i] = dropout_keep(seed, offset + static_cast<uint64_t>(i), threshold);
          result[i] = dropout_apply<T, C>(in[i], mask[i], s);
        }
      });
    });
  }

  void sample_logits(const Tensor& logits, uint64_t seed, uint64_t offset, const uint64_t* /*offset_base*/,
                     double temperature, int64_t top_k, double top_p, const Tensor& out) const override {
    const int64_t rows = out.numel(), classes = rows ? logits.numel() / rows : 0;
    int64_t* chosen = data_as<int64_t>(out);
    visit_float(logits.dtype(), "sample_logits", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* x = data_as<const T>(logits);
      std::vector<float> row(static_cast<size_t>(classes));
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < classes; ++j) row[j] = convert<float>(x[r * classes + j]);
        const philox::Words w = philox::generate(seed, offset + static_cast<uint64_t>(r));
        chosen[r] = sample_row(row, philox::uniform_double(w.w[0], w.w[1]), temperature, top_k, top_p);
      }
    });
  }

  void masked_scale(const Tensor& x, const Tensor& keep, double scale, const Tensor& out) const override {
    visit_float(x.dtype(), "masked_scale", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      const T* in = data_as<const T>(x);
      T* result = data_as<T>(out);
      const bool* mask = data_as<const bool>(keep);
      const C s = convert<C>(convert<T>(scale));
      parallel_for(out.numel(), kLoopGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) result[i] = dropout_apply<T, C>(in[i], mask[i], s);
      });
    });
  }
};

}  // namespace

const kernels::GenerateKernels& generate_kernels() {
  static const CpuGenerate kernels;
  return kernels;
}

}  // namespace cpu
}  // namespace normcore
