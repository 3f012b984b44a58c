// The CPU matrix product (kernels/cpu/gemm.h): Eigen's product for the baseline instruction
// set, its cut into pieces for the thread pool, and the choice, made once, of the AVX-512 or
// AVX2 build (gemm_avx512.cpp, gemm_avx2.cpp) when it was compiled in and the processor and
// operating system support it.
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
#if defined(NORMCORE_GEMM_AVX512)
void gemm_avx512(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, GemmOperand<float> b, float* c, int64_t ldc,
                 bool accumulate);
void gemm_avx512(int64_t m, int64_t n, int64_t k, GemmOperand<double> a, GemmOperand<double> b, double* c, int64_t ldc,
                 bool accumulate);
void gemm_rows_avx512(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                      float* c, int64_t ldc, const RowEpilogue& e, const ImageColumns* image);
#endif

namespace {

enum class Isa { Baseline, Avx2, Avx512 };

// The best build the processor and operating system run (libgcc's checks include the
// operating system's saving of the vector registers), unless NORMCORE_CPU_ISA names a lower
// one ("baseline" or "avx2").
Isa isa() {
  static const Isa chosen = [] {
    const char* env = std::getenv("NORMCORE_CPU_ISA");
    const bool cap_baseline = env && std::strcmp(env, "baseline") == 0;
    const bool cap_avx2 = env && std::strcmp(env, "avx2") == 0;
    Isa best = Isa::Baseline;
#if defined(NORMCORE_GEMM_AVX2) || defined(NORMCORE_GEMM_AVX512)
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
#if defined(NORMCORE_GEMM_AVX2)
    if (avx2) best = Isa::Avx2;
#endif
#if defined(NORMCORE_GEMM_AVX512)
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw"))
      best = Isa::Avx512;
#endif
    if (cap_baseline) return Isa::Baseline;
    if (cap_avx2 && best == Isa::Avx512) return Isa::Avx2;
    return best;
  }();
  return chosen;
}

template <class T>
void gemm_any(int64_t m, int64_t n, int64_t k, GemmOperand<T> a, GemmOperand<T> b, T* c, int64_t ldc, bool accumulate) {
  switch (isa()) {
#if defined(NORMCORE_GEMM_AVX512)
    case Isa::Avx512: gemm_avx512(m, n, k, a, b, c, ldc, accumulate); return;
#endif
#if defined(NORMCORE_GEMM_AVX2)
    case Isa::Avx2: gemm_avx2(m, n, k, a, b, c, ldc, accumulate); return;
#endif
    default: gemm_eigen<T>(m, n, k, a, b, c, ldc, accumulate);
  }
}

// Products smaller than this many multiply-adds are one piece.
constexpr int64_t kParallelMacs = int64_t{1} << 18;

template <class T>
void parallel_gemm_any(int64_t m, int64_t n, int64_t k, GemmOperand<T> a, GemmOperand<T> b, T* c, int64_t ldc,
                       bool accumulate, const GemmPieceDone* after) {
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
        if (after) (*after)(start, start + len, 0, n);
      } else {
        const GemmOperand<T> cols{b.data + start * b.col_stride, b.row_stride, b.col_stride};
        gemm_any<T>(m, len, k, a, cols, c + start, ldc, accumulate);
        if (after) (*after)(0, m, start, start + len);
      }
    }
  });
}

}  // namespace

void parallel_gemm(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, GemmOperand<float> b, float* c, int64_t ldc,
                   bool accumulate) {
  parallel_gemm_any<float>(m, n, k, a, b, c, ldc, accumulate, nullptr);
}
void parallel_gemm(int64_t m, int64_t n, int64_t k, GemmOperand<double> a, GemmOperand<double> b, double* c,
                   int64_t ldc, bool accumulate) {
  parallel_gemm_any<double>(m, n, k, a, b, c, ldc, accumulate, nullptr);
}
void parallel_gemm(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, GemmOperand<float> b, float* c, int64_t ldc,
                   bool accumulate, const GemmPieceDone& after) {
  parallel_gemm_any<float>(m, n, k, a, b, c, ldc, accumulate, &after);
}
void parallel_gemm(int64_t m, int64_t n, int64_t k, GemmOperand<double> a, GemmOperand<double> b, double* c,
                   int64_t ldc, bool accumulate, const GemmPieceDone& after) {
  parallel_gemm_any<double>(m, n, k, a, b, c, ldc, accumulate, &after);
}

void gemm(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, GemmOperand<float> b, float* c, int64_t ldc,
          bool accumulate) {
  gemm_any<float>(m, n, k, a, b, c, ldc, accumulate);
}
void gemm(int64_t m, int64_t n, int64_t k, GemmOperand<double> a, GemmOperand<double> b, double* c, int64_t ldc,
          bool accumulate) {
  gemm_any<double>(m, n, k, a, b, c, ldc, accumulate);
}

namespace {

// parallel_gemm_rows, b read from memory or from an image (gemm_rows_avx512.cpp).
bool gemm_rows_pieces(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                      const ImageColumns* image, float* c, int64_t ldc, const RowEpilogue& e) {
#if defined(NORMCORE_GEMM_AVX512)
  if (isa() != Isa::Avx512) return false;
  // Pieces of whole tiles (8 rows, 48 columns): column panels first, about 2^20
  // multiply-adds each; a last piece of one vector's columns or fewer joins the one before it,
  // whose last panel then takes four vectors (gemm_rows_avx512.cpp). Where that leaves one
  // column piece, row blocks of at least 64 rows (each packs all of b's panels: 8 row tiles
  // share the copy), as a convolution's 49 output pixels at 512 channels make.
  constexpr int64_t kTarget = int64_t{1} << 20;
  const int64_t macs_per_column = std::max<int64_t>(1, m * k);
  int64_t cols = std::min(n, std::max<int64_t>(48, (kTarget / macs_per_column + 47) / 48 * 48));
  int64_t col_pieces = range_count(n, std::max<int64_t>(cols, 1));
  if (col_pieces > 1 && n - (col_pieces - 1) * cols <= 16) --col_pieces;
  if (col_pieces == 1) cols = n;
  const int64_t rows =
      col_pieces > 1 ? m : std::min(m, std::max<int64_t>(64, (kTarget / std::max<int64_t>(1, n * k) + 7) / 8 * 8));
  const int64_t row_pieces = range_count(m, std::max<int64_t>(rows, 1));
  parallel_for(col_pieces * row_pieces, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t i0 = p / col_pieces * rows, j0 = p % col_pieces * cols;
      const int64_t width = p % col_pieces == col_pieces - 1 ? n - j0 : cols;
      RowEpilogue piece = e;
      if (piece.bias) piece.bias += i0;
      if (piece.residual) piece.residual += i0 * e.ldr + j0;
      ImageColumns piece_image;
      if (image) {
        piece_image = *image;
        piece_image.column0 += j0;
      }
      gemm_rows_avx512(std::min(rows, m - i0), width, k, a + i0 * lda, lda, image ? nullptr : b + j0, ldb,
                       c + i0 * ldc + j0, ldc, piece, image ? &piece_image : nullptr);
    }
  });
  return true;
#else
  (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)image, (void)c, (void)ldc, (void)e;
  return false;
#endif
}

}  // namespace

bool parallel_gemm_rows(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                        float* c, int64_t ldc, const RowEpilogue& e) {
  return gemm_rows_pieces(m, n, k, a, lda, b, ldb, nullptr, c, ldc, e);
}

bool parallel_gemm_image_rows(int64_t m, int64_t k, const float* a, int64_t lda, const ImageColumns& image, float* c,
                              int64_t ldc, const RowEpilogue& e) {
  return gemm_rows_pieces(m, image.h * image.w, k, a, lda, nullptr, 0, &image, c, ldc, e);
}

const char* gemm_isa() {
  switch (isa()) {
    case Isa::Avx512: return "avx512";
    case Isa::Avx2: return "avx2+fma";
    default: return "baseline";
  }
}

}  // namespace cpu
}  // namespace normcore
