// tanh and the tanh form of GELU on contiguous f32 in AVX-512 (kernels/cpu/unary_avx512.h),
// the functions of kernels/scalar/math.h sixteen lanes at a time: a GPT-2's GELUs took 12% of
// its one-thread CPU forward element by element (the scalar tanh calls expf and branches).
// tanh(x): x + x^3 P(x^2) below |x| = 0.55 (the scalar form's polynomial), else
// 1 - 2 / (e^(2|x|) + 1) with x's sign, e^y as 2^n e^r (n = round(y log2 e), r = y - n ln 2 in
// two parts, e^r by Cephes' degree-7 form, 2^n by scalef, which saturates to inf past the
// float range, where the formula gives 1). +-0 keeps its sign, NaN stays NaN. Within 2 ulp of
// the exact value, as the scalar one (tests/ops/test_unary_math.cpp); the bits may differ
// from the scalar form's.
//
// CMake compiles this file with AVX-512 flags on x86-64 (NORMCORE_GEMM_AVX512); elementwise.cpp
// calls it only when the processor has AVX-512 (cpu::gemm_isa()).
#if defined(NORMCORE_GEMM_AVX512)
#if !defined(__AVX512F__) || !defined(__FMA__)
#error "unary_avx512.cpp must be compiled with -mavx512f -mfma"
#endif

#include "kernels/cpu/unary_avx512.h"

#include <immintrin.h>

namespace normcore {
namespace cpu {
namespace {

// e^y for y >= 0 (overflowing to inf past the float range).
__m512 exp_lanes(__m512 y) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(y, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), y);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 e = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(e, n);
}

__m512 tanh_lanes(__m512 x) {
  const __m512 a = _mm512_abs_ps(x);
  const __m512 one = _mm512_set1_ps(1.0f);
  // Near 0.
  const __m512 z = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(-0.00661022783111f);
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(0.0213093886644f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-0.0539094288275f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(0.13333113729f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-0.33333332008f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(x, z), p, x);
  // Beyond: 1 - 2 / (e^(2|x|) + 1), x's sign put back (NaN stays NaN through the sum).
  const __m512 e = exp_lanes(_mm512_add_ps(a, a));
  const __m512 large = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
  const __m512 sign =
      _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(static_cast<int>(0x80000000u))));
  const __m512 signed_large =
      _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(large), _mm512_castps_si512(sign)));
  // Ordered compares are false for NaN, which takes the large form; +-0 is x itself.
  const __mmask16 near = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.55f), _CMP_LT_OQ);
  const __mmask16 zero = _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_EQ_OQ);
  return _mm512_mask_mov_ps(_mm512_mask_mov_ps(signed_large, near, small), zero, x);
}

// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), in the scalar form's order.
__m512 gelu_tanh_lanes(__m512 x) {
  const __m512 cube = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), x), x), x);
  const __m512 inner = _mm512_mul_ps(_mm512_set1_ps(0.79788456080286535588f), _mm512_add_ps(x, cube));
  const __m512 half_x = _mm512_mul_ps(_mm512_set1_ps(0.5f), x);
  return _mm512_mul_ps(half_x, _mm512_add_ps(_mm512_set1_ps(1.0f), tanh_lanes(inner)));
}

template <__m512 (*F)(__m512)>
void apply(const float* x, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, F(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 lanes = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(out + i, lanes, F(_mm512_maskz_loadu_ps(lanes, x + i)));
  }
}

}  // namespace

void tanh_avx512(const float* x, float* out, int64_t n) { apply<tanh_lanes>(x, out, n); }
void gelu_tanh_avx512(const float* x, float* out, int64_t n) { apply<gelu_tanh_lanes>(x, out, n); }

}  // namespace cpu
}  // namespace normcore
#endif
