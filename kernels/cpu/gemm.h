// The CPU backend's matrix product, C = A B or C += A B, for f32 and f64 on strided
// operands. It runs Eigen's product compiled three times: for the x86-64 baseline (SSE2), in
// gemm_avx2.cpp for AVX2 with FMA (about twice the speed) and in gemm_avx512.cpp for AVX-512
// (another 1.3-1.8x), and takes the best the processor has. NORMCORE_CPU_ISA=baseline or
// avx2 in the environment caps the choice. Results may differ in the last bits between the
// builds (FMA rounds once, the vector widths sum in other orders); on one machine they are
// always the same.
#pragma once

#include <cstdint>
#include <functional>

namespace normcore {
namespace cpu {

// A [rows, cols] matrix at data with element strides; one of the two strides is 1.
template <class T>
struct GemmOperand {
  const T* data;
  int64_t row_stride, col_stride;
};

// c [m, n] row-major with row stride ldc: c = a @ b, or c += a @ b when accumulate; a is
// [m, k], b [k, n]. Runs on the calling thread.
void gemm(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, GemmOperand<float> b, float* c, int64_t ldc,
          bool accumulate);
void gemm(int64_t m, int64_t n, int64_t k, GemmOperand<double> a, GemmOperand<double> b, double* c, int64_t ldc,
          bool accumulate);

// gemm cut into pieces of rows of c (or columns, when there are more of them) whose size
// is fixed by m, n and k alone (at least 128, at most about 16 pieces), run on the thread pool (kernels/cpu/parallel.h): the same
// bits at any thread count. Products under 2^18 multiply-adds are one piece.
void parallel_gemm(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, GemmOperand<float> b, float* c, int64_t ldc,
                   bool accumulate);
void parallel_gemm(int64_t m, int64_t n, int64_t k, GemmOperand<double> a, GemmOperand<double> b, double* c,
                   int64_t ldc, bool accumulate);

// parallel_gemm calling after(row_begin, row_end, col_begin, col_end) on each piece of c as
// soon as the piece is done, on the thread that made it, while it is still in cache (a
// convolution's bias, residual and ReLU in one pass instead of three over memory).
using GemmPieceDone = std::function<void(int64_t, int64_t, int64_t, int64_t)>;
void parallel_gemm(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, GemmOperand<float> b, float* c, int64_t ldc,
                   bool accumulate, const GemmPieceDone& after);
void parallel_gemm(int64_t m, int64_t n, int64_t k, GemmOperand<double> a, GemmOperand<double> b, double* c,
                   int64_t ldc, bool accumulate, const GemmPieceDone& after);

// What follows a product in one pass, per row i of c: + bias[i], + residual[i * ldr + j],
// then ReLU (x < 0 ? 0 : x, NaN kept); each optional.
struct RowEpilogue {
  const float* bias = nullptr;
  const float* residual = nullptr;
  int64_t ldr = 0;
  bool relu = false;
};

// c [m, n] = a [m, k] @ b [k, n] then the epilogue, for f32 operands whose rows are
// contiguous (row strides lda and ldb), with nothing packed (gemm_rows_avx512.cpp), on the
// thread pool in pieces of about 2^20 multiply-adds: each element sums in the same order in
// any piece, so the bits do not depend on the thread count. Only where the AVX-512 build is
// in use: otherwise it returns false having done nothing, and the caller runs parallel_gemm
// and its own epilogue.
bool parallel_gemm_rows(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                        float* c, int64_t ldc, const RowEpilogue& epilogue);

// b of a convolution read from its image where the product copies b's panels, in place of
// im2col's columns: b [k, n] with k = (ch * kh + ky) * kw + kx and n = oy * w + ox, for stride
// 1, no dilation and an output as large as the image ("same" padding), b(k, n) =
// image[ch][oy + ky - pad_h][ox + kx - pad_w], 0 outside it. kh * kw at most 64.
struct ImageColumns {
  const float* image = nullptr;  // [channels, h, w]
  int64_t h = 0, w = 0, kh = 0, kw = 0, pad_h = 0, pad_w = 0;
  int64_t column0 = 0;  // the pixel of b's first column (a piece of the product starts further on)
};

// parallel_gemm_rows with b the image's columns (m output channels, n = h * w, k =
// channels * kh * kw), im2col's copy never made; false, having done nothing, where the
// AVX-512 build is not in use.
bool parallel_gemm_image_rows(int64_t m, int64_t k, const float* a, int64_t lda, const ImageColumns& columns, float* c,
                              int64_t ldc, const RowEpilogue& epilogue);

// "avx512", "avx2+fma" or "baseline": the build of the product in use.
const char* gemm_isa();

}  // namespace cpu
}  // namespace normcore
