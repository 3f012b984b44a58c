// The direct NHWC convolution in AVX-512 (kernels/cpu/conv_nhwc.h).
//
// A tile holds 6 output pixels by 64 output channels (24 registers of 16 floats). Per step
// along k = (tap, input channel) it loads the weight's 64 floats for that step (four vectors,
// one contiguous row of [kh, kw, c, o], or of a 64-channel panel where the caller packed the
// weight once: the rows of a tile then follow one another) and broadcasts one input value per
// pixel, read where it lies in x (the pixel's input position for the tap, at the channel), into
// 24 fused multiply-adds: the same balance as the NCHW product's tile (gemm_rows_avx512.cpp),
// with no im2col copy and no per-call packing. A tap that falls in the padding reads zeros. The
// steps are taken in blocks of 256 (a block of the weight, 64 KiB, stays in L2 while every
// pixel tile of the range reads it, and the first tile of a block prefetches the next block);
// a tile's partial sums go to y between blocks, and the last block adds the bias and
// residual and applies the ReLU in registers before the store. While a tile runs it fetches
// the next tile's lines of y and of the residual, one of each a step: at batch 64 these
// tensors are hundreds of MB, and a tile of a 1x1 convolution over 64 channels runs only 64
// steps, too few for the stores and the residual loads at its end to wait on memory unseen.
//
// CMake compiles this file with AVX-512 flags on x86-64 (NORMCORE_GEMM_AVX512); conv.cpp calls
// it only when the processor has AVX-512. No std:: templates here (see gemm_rows_avx512.cpp).
#if defined(NORMCORE_GEMM_AVX512)
#if !defined(__AVX512F__) || !defined(__FMA__)
#error "conv_nhwc_avx512.cpp must be compiled with -mavx512f -mfma"
#endif

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/conv_nhwc.h"

namespace normcore {
namespace cpu {
namespace {

constexpr int kRows = 6;      // output pixels a tile holds
constexpr int kVectors = 4;   // 16-channel vectors a tile holds
constexpr int64_t kKc = 256;  // (tap, channel) steps a block takes

inline int64_t smaller(int64_t x, int64_t y) { return x < y ? x : y; }

// The weight's row for step k at output channel j (a multiple of 64 with panels), and the
// distance from one step's row to the next.
inline int64_t row_stride(const NhwcConv& g) { return g.panels ? 16 * kVectors : g.o; }
inline const float* weight_row(const NhwcConv& g, int64_t k, int64_t j) {
  if (!g.panels) return g.weight + k * g.o + j;
  return g.weight + (j / (16 * kVectors) * g.kh * g.kw * g.c + k) * (16 * kVectors);
}

// Where each of a tile's pixels reads its input: the sample's first element and the input
// position of tap (0, 0).
struct Pixels {
  const float* sample[kRows];
  int64_t iy[kRows], ix[kRows];
};

struct Tile {
  const NhwcConv* g;
  Pixels pixels;
  int64_t k0, k1;  // the block's steps
  int64_t j0;      // the tile's first output channel
  float* y;        // y for the tile's first pixel and channel
  const float* residual;
  // The weight block that comes next (its first row at the tile's channels), prefetched into
  // L2 four lines a step while this tile runs, or null: where few pixel tiles share a block
  // (7 x 7 images at batch 1), the block's first tile would otherwise wait on every row.
  const float* next;
  int64_t next_steps;
  // The next tile's outputs and residual (the same channels, kRows pixels on), or null: their
  // lines are fetched a step at a time while this tile runs, y's for writing.
  float* ahead_y;
  const float* ahead_residual;
  int ahead_rows;      // the next tile's pixels (none past the range, which may be another thread's)
  __mmask16 last;      // the lanes of the last vector inside o
  bool row_runs;       // every pixel's window lies inside the width (runs of kw * c steps)
  bool first, finish;  // the first block (start from 0) and the last (epilogue, then store)
};

template <int R, int V>
void tile(const Tile& t) {
  const NhwcConv& g = *t.g;
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const __mmask16 lanes = v == V - 1 ? t.last : __mmask16(0xffff);
      acc[r][v] = t.first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(lanes, t.y + r * g.o + 16 * v);
    }
  }
  const float* next = t.next;
  int64_t next_steps = t.next_steps;
  const int ahead_lines = t.ahead_y ? t.ahead_rows * V : 0;
  int ahead = 0;  // the next tile's lines fetched so far
  // A run: the steps whose inputs lie one after another in x for every pixel of the tile, one
  // tap's channels, or a whole row of taps' (kw * c) where the tile's windows lie inside the
  // image's width (t.row_runs).
  const int64_t run = t.row_runs ? g.kw * g.c : g.c;
  for (int64_t k = t.k0; k < t.k1;) {
    // One run's steps in this block.
    const int64_t at = k / run, c0 = k % run, c1 = smaller(run, c0 + (t.k1 - k));
    const int64_t dy = (t.row_runs ? at : at / g.kw) * g.dilation_h, dx = t.row_runs ? 0 : at % g.kw * g.dilation_w;
    const float* in[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const int64_t iy = t.pixels.iy[r] + dy, ix = t.pixels.ix[r] + dx;
      in[r] = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w ? t.pixels.sample[r] + (iy * g.w + ix) * g.c : g.zeros;
    }
    const float* w = weight_row(g, k, t.j0);
    for (int64_t ch = c0; ch < c1; ++ch, w += row_stride(g)) {
      if (next) {
#pragma GCC unroll 4
        for (int v = 0; v < 4; ++v) _mm_prefetch(reinterpret_cast<const char*>(next + 16 * v), _MM_HINT_T1);
        next = --next_steps > 0 ? next + row_stride(g) : nullptr;
      }
      if (ahead < ahead_lines) {
        const int64_t at = ahead / V * g.o + 16 * (ahead % V);
        _mm_prefetch(reinterpret_cast<const char*>(t.ahead_y + at), _MM_HINT_ET0);
        if (t.ahead_residual) _mm_prefetch(reinterpret_cast<const char*>(t.ahead_residual + at), _MM_HINT_T0);
        ++ahead;
      }
      __m512 row[V];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) {
        row[v] = v == V - 1 ? _mm512_maskz_loadu_ps(t.last, w + 16 * v) : _mm512_loadu_ps(w + 16 * v);
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 a = _mm512_set1_ps(in[r][ch]);
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(a, row[v], acc[r][v]);
      }
    }
    k += c1 - c0;
  }
  if (t.finish) {
    const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const __mmask16 lanes = v == V - 1 ? t.last : __mmask16(0xffff);
      const __m512 bias = g.bias ? _mm512_maskz_loadu_ps(lanes, g.bias + t.j0 + 16 * v) : zero;
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        __m512 x = g.bias ? _mm512_add_ps(acc[r][v], bias) : acc[r][v];
        if (t.residual) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(lanes, t.residual + r * g.o + 16 * v));
        // max(0, x) gives x when x is NaN (the second operand), as x < 0 ? 0 : x does.
        acc[r][v] = g.relu ? _mm512_max_ps(zero, x) : x;
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      if (v == V - 1) {
        _mm512_mask_storeu_ps(t.y + r * g.o + 16 * v, t.last, acc[r][v]);
      } else {
        _mm512_storeu_ps(t.y + r * g.o + 16 * v, acc[r][v]);
      }
    }
  }
}

using TileFn = void (*)(const Tile&);

template <int R>
constexpr TileFn for_vectors(int v) {
  return v == 1 ? tile<R, 1> : v == 2 ? tile<R, 2> : v == 3 ? tile<R, 3> : tile<R, 4>;
}
TileFn tile_for(int rows, int vectors) {
  static_assert(kRows == 6 && kVectors == 4, "the dispatch below lists 6 row counts and 4 vector counts");
  switch (rows) {
    case 1: return for_vectors<1>(vectors);
    case 2: return for_vectors<2>(vectors);
    case 3: return for_vectors<3>(vectors);
    case 4: return for_vectors<4>(vectors);
    case 5: return for_vectors<5>(vectors);
    default: return for_vectors<6>(vectors);
  }
}

}  // namespace

void conv_nhwc_avx512(const NhwcConv& g, int64_t p0, int64_t p1, int64_t o0, int64_t o1) {
  const int64_t steps = g.kh * g.kw * g.c, plane = g.out_h * g.out_w;
  const bool row_runs = g.kw > 1 && g.dilation_w == 1;  // then per tile, where its windows allow
  for (int64_t k0 = 0; k0 < steps; k0 += kKc) {
    const int64_t k1 = smaller(steps, k0 + kKc);
    for (int64_t j0 = o0; j0 < o1; j0 += 16 * kVectors) {
      const int64_t width = smaller(16 * kVectors, o1 - j0);
      const int vectors = static_cast<int>((width + 15) / 16);
      const int tail = static_cast<int>(width - 16 * (vectors - 1));
      Tile t{};
      t.g = &g;
      t.k0 = k0, t.k1 = k1, t.j0 = j0;
      t.last = static_cast<__mmask16>((1u << tail) - 1u);
      t.first = k0 == 0, t.finish = k1 == steps;
      // The block after this one: the next channels of this block of k, else the first
      // channels of the next block.
      const bool more_channels = j0 + 16 * kVectors < o1;
      const int64_t next_k0 = more_channels ? k0 : k1, next_j0 = more_channels ? j0 + 16 * kVectors : o0;
      const float* next = next_k0 < steps ? weight_row(g, next_k0, next_j0) : nullptr;
      const int64_t next_steps = smaller(kKc, steps - next_k0);
      // The pixel p0 as (sample, oy, ox), stepped along without divisions.
      int64_t sample = p0 / plane, oy = p0 % plane / g.out_w, ox = p0 % g.out_w;
      for (int64_t p = p0; p < p1; p += kRows) {
        t.next = p == p0 ? next : nullptr;
        t.next_steps = next_steps;
        const int rows = static_cast<int>(smaller(kRows, p1 - p));
        t.row_runs = row_runs;
        for (int r = 0; r < rows; ++r) {
          t.pixels.sample[r] = g.x + sample * g.h * g.w * g.c;
          t.pixels.iy[r] = oy * g.stride_h - g.pad_h;
          t.pixels.ix[r] = ox * g.stride_w - g.pad_w;
          t.row_runs = t.row_runs && t.pixels.ix[r] >= 0 && t.pixels.ix[r] + g.kw <= g.w;
          if (++ox == g.out_w) {
            ox = 0;
            if (++oy == g.out_h) oy = 0, ++sample;
          }
        }
        t.y = g.y + p * g.o + j0;
        t.residual = g.residual ? g.residual + p * g.o + j0 : nullptr;
        const bool more = p + kRows < p1;
        t.ahead_rows = static_cast<int>(smaller(kRows, p1 - p - kRows));
        t.ahead_y = more ? t.y + kRows * g.o : nullptr;
        t.ahead_residual = more && t.residual && t.finish ? t.residual + kRows * g.o : nullptr;
        tile_for(rows, vectors)(t);
      }
    }
  }
}

}  // namespace cpu
}  // namespace normcore
#endif
