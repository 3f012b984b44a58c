// The CPU matrix product built for AVX-512 (F, DQ, VL, BW) with FMA (kernels/cpu/gemm.h):
// 16 floats a register, 1.3-1.8x the AVX2 build's speed on the products of a CNN or a
// transformer on one core. CMake compiles this file with those -m flags on x86-64 and defines
// NORMCORE_GEMM_AVX512 for it; elsewhere it is empty. Eigen's namespace is renamed as in
// gemm_avx2.cpp, for the same reason.
#if defined(NORMCORE_GEMM_AVX512)
#if !defined(__AVX512F__) || !defined(__AVX512DQ__) || !defined(__AVX512VL__) || !defined(__AVX512BW__) || \
    !defined(__FMA__)
#error "gemm_avx512.cpp must be compiled with -mavx512f -mavx512dq -mavx512vl -mavx512bw -mfma"
#endif

#include <cstdint>

#include "kernels/cpu/gemm.h"

#define Eigen NormcoreEigenAvx512
#include <Eigen/Core>

#include "kernels/cpu/gemm_eigen.inc"

NORMCORE_GEMM_ENTRY_POINTS(gemm_avx512)
#endif
