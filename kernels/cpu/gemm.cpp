// The CPU matrix product (kernels/cpu/gemm.h): Eigen's product for the baseline instruction
// set, its cut into pieces for the thread pool, and the choice, made once, of the AVX2 build (gemm_avx2.cpp) when it was compiled in
// and the processor and operating system support AVX2 and FMA.
#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <Eigen/Core>

#include "kernels/cpu/gemm_eigen.inc"
#include "kernels/cpu/parallel.h"

namespace normcore {
namespace cpu {

#if defined(NORMCORE_GEMM_AVX2)
void gemm_avx2(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, GemmOperand<float> b, float* c, int64_t ldc,
               bool accumulate);
void gemm_avx2(int64_t m, int64_t n, int64_t k, GemmOperand<double> a, GemmOperand<double> b, double* c, int64_t ldc,
               bool accumulate);
#endif

namespace {

bool use_avx2() {
#if defined(NORMCORE_GEMM_AVX2)
  static const bool use = [] {
    const char* isa = std::getenv("NORMCORE_CPU_ISA");
    if (isa && std::strcmp(isa, "baseline") == 0) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return use;
#else
  return false;
#endif
}

template <class T>
void gemm_any(int64_t m, int64_t n, int64_t k, GemmOperand<T> a, GemmOperand<T> b, T* c, int64_t ldc, bool accumulate) {
#if defined(NORMCORE_GEMM_AVX2)
  if (use_avx2()) {
    gemm_avx2(m, n, k, a, b, c, ldc, accumulate);
    return;
  }
#endif
  gemm_eigen<T>(m, n, k, a, b, c, ldc, accumulate);
}

// Products smaller than this many multiply-adds are one piece.
constexpr int64_t kParallelMacs = int64_t{1} << 18;

template <class T>
void parallel_gemm_any(int64_t m, int64_t n, int64_t k, GemmOperand<T> a, GemmOperand<T> b, T* c, int64_t ldc,
                       bool accumulate) {
  const bool split_rows = m >= n;
  const int64_t extent = split_rows ? m : n;
  // At least 128 rows or columns a piece (each piece packs the whole other operand again),
  // and at most about 16 pieces, in multiples of 16.
  const int64_t piece =
      m * n * k < kParallelMacs ? extent : std::max<int64_t>(128, ((extent + 15) / 16 + 15) / 16 * 16);
  parallel_for(range_count(extent, piece), 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t start = p * piece, len = std::min(piece, extent - start);
      if (split_rows) {
        const GemmOperand<T> rows{a.data + start * a.row_stride, a.row_stride, a.col_stride};
        gemm_any<T>(len, n, k, rows, b, c + start * ldc, ldc, accumulate);
      } else {
        const GemmOperand<T> cols{b.data + start * b.col_stride, b.row_stride, b.col_stride};
        gemm_any<T>(m, len, k, a, cols, c + start, ldc, accumulate);
      }
    }
  });
}

}  // namespace

void parallel_gemm(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, GemmOperand<float> b, float* c, int64_t ldc,
                   bool accumulate) {
  parallel_gemm_any<float>(m, n, k, a, b, c, ldc, accumulate);
}
void parallel_gemm(int64_t m, int64_t n, int64_t k, GemmOperand<double> a, GemmOperand<double> b, double* c,
                   int64_t ldc, bool accumulate) {
  parallel_gemm_any<double>(m, n, k, a, b, c, ldc, accumulate);
}

void gemm(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, GemmOperand<float> b, float* c, int64_t ldc,
          bool accumulate) {
  gemm_any<float>(m, n, k, a, b, c, ldc, accumulate);
}
void gemm(int64_t m, int64_t n, int64_t k, GemmOperand<double> a, GemmOperand<double> b, double* c, int64_t ldc,
          bool accumulate) {
  gemm_any<double>(m, n, k, a, b, c, ldc, accumulate);
}

const char* gemm_isa() { return use_avx2() ? "avx2+fma" : "baseline"; }

}  // namespace cpu
}  // namespace normcore
