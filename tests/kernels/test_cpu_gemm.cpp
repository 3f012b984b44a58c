// The CPU matrix product (kernels/cpu/gemm.h) against a double-precision loop, for every
// operand layout, accumulation, and pieces cut for the thread pool; in whichever build the
// processor takes (ctest runs it again as cpu.gemm_baseline with NORMCORE_CPU_ISA=baseline).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/gemm.h"

namespace {

using normcore::cpu::GemmOperand;

template <class T>
struct Matrix {
  std::vector<T> data;
  int64_t rows, cols;
  bool col_major;
  int64_t ld;  // leading dimension, padded past the logical one
  Matrix(int64_t r, int64_t c, bool cm, std::mt19937& rng) : rows(r), cols(c), col_major(cm), ld((cm ? r : c) + 3) {
    std::uniform_real_distribution<double> u(-1, 1);
    data.resize(static_cast<size_t>(ld * (cm ? c : r)));
    for (T& v : data) v = static_cast<T>(u(rng));
  }
  T at(int64_t i, int64_t j) const { return col_major ? data[j * ld + i] : data[i * ld + j]; }
  GemmOperand<T> operand() const { return {data.data(), col_major ? 1 : ld, col_major ? ld : 1}; }
};

template <class T>
void check(int64_t m, int64_t n, int64_t k, bool a_cm, bool b_cm, bool accumulate, bool parallel) {
  std::mt19937 rng(static_cast<unsigned>(m * 131 + n * 17 + k));
  Matrix<T> a(m, k, a_cm, rng), b(k, n, b_cm, rng);
  const int64_t ldc = n + 2;
  std::vector<T> c(static_cast<size_t>(m * ldc), T(0.5));
  if (parallel) normcore::cpu::parallel_gemm(m, n, k, a.operand(), b.operand(), c.data(), ldc, accumulate);
  else normcore::cpu::gemm(m, n, k, a.operand(), b.operand(), c.data(), ldc, accumulate);
  const double tol = std::is_same_v<T, float> ? 1e-5 * static_cast<double>(k) + 1e-5 : 1e-12 * static_cast<double>(k);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want = accumulate ? 0.5 : 0.0;
      for (int64_t p = 0; p < k; ++p) want += static_cast<double>(a.at(i, p)) * static_cast<double>(b.at(p, j));
      ASSERT_NEAR(static_cast<double>(c[i * ldc + j]), want, tol)
          << m << "x" << n << "x" << k << " a_cm " << a_cm << " b_cm " << b_cm << " acc " << accumulate << " at " << i
          << "," << j;
    }
    for (int64_t j = n; j < ldc; ++j) ASSERT_EQ(c[i * ldc + j], T(0.5)) << "wrote past the row";
  }
}

TEST(CpuGemm, MatchesADoubleLoopForEveryLayout) {
  const int64_t shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 9}, {64, 40, 100}, {130, 70, 33}, {5, 300, 260}};
  for (const auto& s : shapes) {
    for (int layout = 0; layout < 4; ++layout) {
      for (bool accumulate : {false, true}) {
        for (bool parallel : {false, true}) {
          check<float>(s[0], s[1], s[2], layout & 1, layout & 2, accumulate, parallel);
          check<double>(s[0], s[1], s[2], layout & 1, layout & 2, accumulate, parallel);
        }
      }
    }
  }
}

TEST(CpuGemm, EmptyInnerDimensionGivesZerosOrLeavesTheSum) {
  std::vector<float> c(6, 2.0f);
  const float dummy = 0;
  normcore::cpu::gemm(2, 3, 0, {&dummy, 0, 1}, {&dummy, 3, 1}, c.data(), 3, true);
  for (float v : c) EXPECT_EQ(v, 2.0f);
  normcore::cpu::gemm(2, 3, 0, {&dummy, 0, 1}, {&dummy, 3, 1}, c.data(), 3, false);
  for (float v : c) EXPECT_EQ(v, 0.0f);
}

// The unpacked AVX-512 product with its epilogue: tails of rows (not a multiple of 8) and of
// columns (not of 16 or 48; a last vector that joins the panel before it, in tiles of 1 to 6
// rows, and the piece before it when the work is cut by columns), k across the 256-step
// blocks and k = 0, padded leading dimensions, each epilogue part; nothing written past n. Where the AVX-512 build is not in
// use it must decline and write nothing.
TEST(CpuGemm, RowOperandProductWithEpilogue) {
  const int64_t shapes[][3] = {{1, 1, 1},      {8, 48, 16},     {9, 49, 7},    {17, 100, 300},
                               {64, 196, 576}, {3, 5, 0},       {13, 33, 513}, {11, 64, 300},
                               {13, 64, 2048}, {70, 100, 4096}, {2, 60, 5},    {4, 61, 9}};
  const bool avx512 = std::string(normcore::cpu::gemm_isa()) == "avx512";
  for (const auto& s : shapes) {
    const int64_t m = s[0], n = s[1], k = s[2], lda = k + 3, ldb = n + 5, ldc = n + 2, ldr = n + 1;
    std::mt19937 rng(static_cast<unsigned>(m * 7 + n * 3 + k));
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> a(static_cast<size_t>(m * lda)), b(static_cast<size_t>(std::max<int64_t>(k, 1) * ldb)),
        bias(static_cast<size_t>(m)), residual(static_cast<size_t>(m * ldr));
    for (auto* v : {&a, &b, &bias, &residual})
      for (float& x : *v) x = u(rng);
    for (int parts = 0; parts < 8; ++parts) {
      normcore::cpu::RowEpilogue e;
      if (parts & 1) e.bias = bias.data();
      if (parts & 2) e.residual = residual.data(), e.ldr = ldr;
      e.relu = (parts & 4) != 0;
      std::vector<float> c(static_cast<size_t>(m * ldc), 7.0f);
      const bool ran = normcore::cpu::parallel_gemm_rows(m, n, k, a.data(), lda, b.data(), ldb, c.data(), ldc, e);
      ASSERT_EQ(ran, avx512);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < ldc; ++j) {
          const float got = c[static_cast<size_t>(i * ldc + j)];
          if (!ran || j >= n) {
            ASSERT_EQ(got, 7.0f) << "wrote where it should not, at " << i << "," << j;
            continue;
          }
          double want = e.bias ? bias[static_cast<size_t>(i)] : 0.0;
          for (int64_t p = 0; p < k; ++p)
            want += static_cast<double>(a[static_cast<size_t>(i * lda + p)]) * b[static_cast<size_t>(p * ldb + j)];
          if (e.residual) want += residual[static_cast<size_t>(i * ldr + j)];
          if (e.relu && want < 0) want = 0;
          ASSERT_NEAR(got, want, 1e-5 * static_cast<double>(k) + 1e-5)
              << m << "x" << n << "x" << k << " epilogue " << parts << " at " << i << "," << j;
        }
      }
    }
  }
}

TEST(CpuGemm, ReportsTheBuildInUse) {
  const char* env = std::getenv("NORMCORE_CPU_ISA");
  const std::string isa = normcore::cpu::gemm_isa();
  if (env && std::strcmp(env, "baseline") == 0) {
    EXPECT_EQ(isa, "baseline");
  } else {
#if defined(__x86_64__) && defined(NORMCORE_GEMM_AVX2) && defined(NORMCORE_GEMM_AVX512)
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
    const bool capped = env && std::strcmp(env, "avx2") == 0;
    EXPECT_EQ(isa, avx512 && !capped ? "avx512" : avx2 ? "avx2+fma" : "baseline");
#else
    EXPECT_EQ(isa, "baseline");
#endif
  }
}

}  // namespace
