// The CPU matrix product built for AVX2 and FMA (kernels/cpu/gemm.h). CMake compiles this
// file with -mavx2 -mfma on x86-64 and defines NORMCORE_GEMM_AVX2 for it; elsewhere it is
// empty. Eigen's namespace is renamed here so that none of its templates, built for AVX2,
// can stand in for the baseline build's in other files (tests/kernels/check_gemm_isa.sh checks that
// this object defines no other weak symbol).
#if defined(NORMCORE_GEMM_AVX2)
#if !defined(__AVX2__) || !defined(__FMA__)
#error "gemm_avx2.cpp must be compiled with -mavx2 -mfma"
#endif

#include <cstdint>

#include "kernels/cpu/gemm.h"

#define Eigen NormcoreEigenAvx2
#include <Eigen/Core>

#include "kernels/cpu/gemm_eigen.inc"

NORMCORE_GEMM_ENTRY_POINTS(gemm_avx2)
#endif
