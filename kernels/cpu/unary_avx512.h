// f32 tanh and tanh-form GELU over contiguous arrays in AVX-512 (unary_avx512.cpp says how and
// how exactly): out[i] = f(x[i]) for i < n; out may be x. Defined only in builds with
// NORMCORE_GEMM_AVX512, to be called only on processors with AVX-512 (cpu::gemm_isa()).
#pragma once

#include <cstdint>

namespace normcore {
namespace cpu {

void tanh_avx512(const float* x, float* out, int64_t n);
void gelu_tanh_avx512(const float* x, float* out, int64_t n);

}  // namespace cpu
}  // namespace normcore
