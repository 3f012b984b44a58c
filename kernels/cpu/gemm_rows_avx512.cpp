// The f32 product of row-major operands with a fused epilogue, in AVX-512 (kernels/cpu/gemm.h,
// gemm_rows): c [m, n] = a [m, k] @ b [k, n], then per row i + bias[i], + residual, ReLU.
//
// A tile of 8 rows of c by 48 columns (24 registers of 16 floats) takes, per step along k,
// three aligned vector loads from a panel of b and eight broadcasts, one from each of a's 8
// rows as they lie in memory (8 sequential streams that the prefetchers follow), into 24
// fused multiply-adds. Where n would leave a last panel of one vector (a tile of 8 FMAs to 9
// loads, at convolutions' 196 or 49 output pixels a tenth of ResNet-50's time), that vector
// joins the panel before it: 4 vectors, tiles of 6 rows. Blocks of 256 rows of a (256 KiB) and 256 steps of k are taken at a
// time; b's panel for a block (256 x 48 floats, 48 KiB) is copied once into an aligned buffer
// that every row tile of the block reads. a (a convolution's weights) is never copied, where
// Eigen packs both operands on every call and zeroes c first; a tile's
// partial sums go back to c between blocks of k, and the last block applies the epilogue in
// registers before the one store. Each element of c sums its k products in k order in the
// same blocks whatever the tile, piece or thread: the bits do not depend on the thread count.
//
// CMake compiles this file with AVX-512 flags on x86-64 (NORMCORE_GEMM_AVX512); gemm.cpp calls
// it only when the processor has AVX-512.
#if defined(NORMCORE_GEMM_AVX512)
#if !defined(__AVX512F__) || !defined(__FMA__)
#error "gemm_rows_avx512.cpp must be compiled with -mavx512f -mfma"
#endif

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/gemm.h"

namespace normcore {
namespace cpu {
namespace {

constexpr int kRows = 8;      // rows of c a tile holds
constexpr int kVectors = 3;   // 16-float vectors a tile row holds
constexpr int kWideRows = 6;  // rows of a tile of the last panel's 4 vectors (24 accumulators)
constexpr int64_t kKc = 256;  // steps along k a block takes
constexpr int64_t kMc = 256;  // rows of a a block takes (256 x 256 floats: 256 KiB)
constexpr int kWidth = 16 * kVectors;
constexpr int kWideWidth = 16 * (kVectors + 1);

// No std:: templates here: an inline function instantiated in this object (weak, with AVX-512
// code) could be the copy the linker keeps for the baseline code too
// (tests/kernels/check_gemm_isa.sh checks).
inline int64_t smaller(int64_t x, int64_t y) { return x < y ? x : y; }

struct Tile {
  const float* a;  // a[0][k0]
  int64_t lda;
  const float* b;  // the panel of b for the tile's columns and block (aligned, zero-padded)
  int64_t ldb;
  float* c;  // c[i0][j0]
  int64_t ldc;
  int64_t steps;       // along k in this block
  __mmask16 last;      // the lanes of the last vector inside c
  bool first, finish;  // the first block (start from 0) and the last (epilogue, then store)
  const float* bias;   // bias[i] for the tile's rows, or null
  const float* residual;
  int64_t ldr;
  bool relu;
};

template <int R, int V>
void tile(const Tile& t) {
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      const __mmask16 lanes = v == V - 1 ? t.last : __mmask16(0xffff);
      acc[i][v] = t.first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(lanes, t.c + i * t.ldc + 16 * v);
    }
  }
  const float* b = t.b;
  for (int64_t p = 0; p < t.steps; ++p, b += t.ldb) {
    __m512 row[V];
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      row[v] = _mm512_load_ps(b + 16 * v);  // the aligned panel, zeros past n
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512 a = _mm512_set1_ps(t.a[i * t.lda + p]);
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_fmadd_ps(a, row[v], acc[i][v]);
    }
  }
  if (t.finish) {
    const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512 bias = t.bias ? _mm512_set1_ps(t.bias[i]) : zero;
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) {
        const __mmask16 lanes = v == V - 1 ? t.last : __mmask16(0xffff);
        __m512 x = t.bias ? _mm512_add_ps(acc[i][v], bias) : acc[i][v];
        if (t.residual) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(lanes, t.residual + i * t.ldr + 16 * v));
        // max(0, x) gives x when x is NaN (the second operand), as x < 0 ? 0 : x does.
        acc[i][v] = t.relu ? _mm512_max_ps(zero, x) : x;
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      if (v == V - 1) {
        _mm512_mask_storeu_ps(t.c + i * t.ldc + 16 * v, t.last, acc[i][v]);
      } else {
        _mm512_storeu_ps(t.c + i * t.ldc + 16 * v, acc[i][v]);
      }
    }
  }
}

using TileFn = void (*)(const Tile&);

// tile<R, V> for R = 1..kRows rows and V = 1..kVectors vectors, and R = 1..kWideRows rows of
// kVectors + 1.
template <int R>
constexpr TileFn for_vectors(int v) {
  return v == 1 ? tile<R, 1> : v == 2 ? tile<R, 2> : tile<R, 3>;
}
TileFn tile_for(int rows, int vectors) {
  static_assert(kRows == 8 && kVectors == 3 && kWideRows == 6, "the dispatch below lists 8 and 6 row counts");
  if (vectors == kVectors + 1) {
    switch (rows) {
      case 1: return tile<1, 4>;
      case 2: return tile<2, 4>;
      case 3: return tile<3, 4>;
      case 4: return tile<4, 4>;
      case 5: return tile<5, 4>;
      default: return tile<6, 4>;
    }
  }
  switch (rows) {
    case 1: return for_vectors<1>(vectors);
    case 2: return for_vectors<2>(vectors);
    case 3: return for_vectors<3>(vectors);
    case 4: return for_vectors<4>(vectors);
    case 5: return for_vectors<5>(vectors);
    case 6: return for_vectors<6>(vectors);
    case 7: return for_vectors<7>(vectors);
    default: return for_vectors<8>(vectors);
  }
}

// The image's columns of one panel (ImageColumns, gemm.h): the lanes of each kernel tap
// (ky, kx) that fall inside the image for the panel's pixels, then the panel's rows, each
// one masked load from the tap's channel at the tap's offset, so that no im2col copy is made
// and the image (read kh * kw times) stays in cache.
class ImagePanel {
 public:
  ImagePanel(const ImageColumns& g, int64_t j0, int64_t width, int vectors) : g_(g), vectors_(vectors) {
    const int64_t first = g.column0 + j0;
    // Each column's pixel, stepping along the rows (one division for the panel).
    int64_t oy[16 * (kVectors + 1)], ox[16 * (kVectors + 1)];
    for (int64_t j = 0, y = first / g.w, x = first % g.w; j < width; ++j) {
      oy[j] = y, ox[j] = x;
      if (++x == g.w) x = 0, ++y;
    }
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        for (int v = 0; v < vectors; ++v) {
          uint32_t bits = 0;
          for (int lane = 0; lane < 16 && 16 * v + lane < width; ++lane) {
            const int64_t iy = oy[16 * v + lane] + ky - g.pad_h, ix = ox[16 * v + lane] + kx - g.pad_w;
            if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) bits |= 1u << lane;
          }
          masks_[ky * g.kw + kx][v] = static_cast<__mmask16>(bits);
        }
      }
    }
    base_ = g.image + first;
  }
  // Rows k0 .. k0 + steps - 1 into the panel (rows of 16 * vectors floats).
  void copy(int64_t k0, int64_t steps, float* panel) const {
    const int64_t taps = g_.kh * g_.kw;
    int64_t ch = k0 / taps, tap = k0 % taps;
    for (int64_t p = 0; p < steps; ++p) {
      const int64_t ky = tap / g_.kw, kx = tap % g_.kw;
      const float* from = base_ + (ch * g_.h + ky - g_.pad_h) * g_.w + kx - g_.pad_w;
      float* to = panel + p * 16 * vectors_;
      for (int v = 0; v < vectors_; ++v)
        _mm512_store_ps(to + 16 * v, _mm512_maskz_loadu_ps(masks_[tap][v], from + 16 * v));
      if (++tap == taps) tap = 0, ++ch;
    }
  }

 private:
  const ImageColumns& g_;
  int vectors_;
  const float* base_;
  __mmask16 masks_[64][kVectors + 1];
};

}  // namespace

void gemm_rows_avx512(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                      float* c, int64_t ldc, const RowEpilogue& e, const ImageColumns* image) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // an empty sum: the epilogue of zeros
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        float x = e.bias ? e.bias[i] : 0.0f;
        if (e.residual) x += e.residual[i * e.ldr + j];
        c[i * ldc + j] = e.relu && x < 0.0f ? 0.0f : x;
      }
    }
    return;
  }
  alignas(64) static thread_local float panel[kKc * kWideWidth];
  for (int64_t r0 = 0; r0 < m; r0 += kMc) {  // rows of a whose block stays in L2
    const int64_t row_end = smaller(m, r0 + kMc);
    for (int64_t k0 = 0; k0 < k; k0 += kKc) {
      const int64_t steps = smaller(kKc, k - k0);
      for (int64_t j0 = 0, width = 0; j0 < n; j0 += width) {
        width = n - j0 > kWidth && n - j0 <= kWidth + 16 ? n - j0 : smaller(kWidth, n - j0);
        const int vectors = static_cast<int>((width + 15) / 16);
        const int tail = static_cast<int>(width - 16 * (vectors - 1));
        const __mmask16 last = static_cast<__mmask16>((1u << tail) - 1u);
        // b's panel copied into aligned rows of 16 * vectors floats (zeros past n), read by
        // every row block.
        if (image) {
          ImagePanel(*image, j0, width, vectors).copy(k0, steps, panel);
        } else {
          for (int64_t p = 0; p < steps; ++p) {
            const float* from = b + (k0 + p) * ldb + j0;
            float* to = panel + p * 16 * vectors;
            for (int v = 0; v < vectors; ++v) {
              const __mmask16 lanes = v == vectors - 1 ? last : __mmask16(0xffff);
              _mm512_store_ps(to + 16 * v, _mm512_maskz_loadu_ps(lanes, from + 16 * v));
            }
          }
        }
        const int tile_rows = vectors > kVectors ? kWideRows : kRows;
        for (int64_t i0 = r0; i0 < row_end; i0 += tile_rows) {
          const int rows = static_cast<int>(smaller(tile_rows, row_end - i0));
          Tile t{a + i0 * lda + k0,
                 lda,
                 panel,
                 16 * vectors,
                 c + i0 * ldc + j0,
                 ldc,
                 steps,
                 last,
                 k0 == 0,
                 k0 + steps == k,
                 e.bias ? e.bias + i0 : nullptr,
                 e.residual ? e.residual + i0 * e.ldr + j0 : nullptr,
                 e.ldr,
                 e.relu};
          tile_for(rows, vectors)(t);
        }
      }
    }
  }
}

}  // namespace cpu
}  // namespace normcore
#endif
