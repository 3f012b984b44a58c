// The kernels of scaled dot-product attention (contract: kernels/attention.h) over raw
// pointers and AttentionParams, so that a standalone program can test them. f16/bf16 run on
// tensor cores (mma.sync m16n8k16, fp32 accumulate) with head dims padded to 32, 64 or 128;
// f32 on register-tiled SIMT kernels (exact f32 FMA, no TF32), f64 on row-per-warp SIMT
// kernels. No L x S matrix reaches device memory (online softmax forward,
// recomputed p backward), and every gradient is written once by one block: deterministic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/cuda/reduction/combine.cuh"
#include "kernels/scalar/dtype.h"

namespace normcore {
namespace cuda {
namespace flash {

// ---------------------------------------------------------------- parameters
// Element strides of q, k or v between batches, heads and rows (the head dim has stride 1).
struct RowStrides {
  int64_t batch, head, row;
};

// One attention problem. T is the storage type, C the type of lse and delta (float for
// f32/f16/bf16, double for f64). q has H heads, k and v H / group; out, grad_out and the
// gradients are per q head, with any strides between batches, heads and rows: out, grad_out
// [B, H, L, Dv], grad_q [B, H, L, D], grad_k [B, H, S, D], grad_v [B, H, S, Dv] (with group
// > 1 the caller sums grad_k and grad_v over each group); lse and delta [B, H, L] contiguous. The forward writes out and lse; the
// backward reads them (and grad_out), writes delta and then the gradients.
template <class T, class C>
struct AttentionParams {
  const T* q = nullptr;
  const T* k = nullptr;
  const T* v = nullptr;
  RowStrides q_stride{}, k_stride{}, v_stride{};
  T* out = nullptr;
  RowStrides out_stride{};
  C* lse = nullptr;
  const T* grad_out = nullptr;
  RowStrides grad_out_stride{};
  C* delta = nullptr;
  // Row-per-warp backward (f64): each row's score max and sum of exp(score - max), written by
  // simt_query_rows_kernel<T, true> with delta; p = exp(score - row_max) / row_sum there, not
  // exp(score - lse): lse's rounding is |max| times the precision, large when the softmax
  // saturates.
  C* row_max = nullptr;
  C* row_sum = nullptr;
  T* grad_q = nullptr;
  T* grad_k = nullptr;
  T* grad_v = nullptr;
  RowStrides grad_q_stride{}, grad_k_stride{}, grad_v_stride{};
  // heads: q's; k and v have heads / group (grouped-query attention; group 1: as many).
  int batch = 0, heads = 0, group = 1, L = 0, S = 0, D = 0, Dv = 0;
  double scale = 1;
  bool causal = false;
  // Tensor-core kernels: every row of q, k, v (and out, grad_out) starts 16-byte aligned and
  // D, Dv are multiples of 8, so tiles move as 16-byte cp.async; otherwise element by element.
  bool vectorized = false;
};

// The rows of q's head bh (of batch * heads), or, with group > 1, of the k or v head that q
// head attends with (grouped-query attention: group q heads share each k, v head).
template <class T>
__host__ __device__ __forceinline__ T* head_rows(T* base, const RowStrides& s, int64_t bh, int heads, int group = 1) {
  return base + (bh / heads) * s.batch + (bh % heads) / group * s.head;
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kWarp = 32;

struct Max {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return a > b ? a : b;
  }
};

// ---------------------------------------------------------------- PTX wrappers
__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes from global to shared memory, or 16 zero bytes when !valid (src is not read).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
// 4 bytes from global to shared memory, or 4 zero bytes when !valid (src is not read).
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// c += a b for a 16x16 A (row-major) and a 16x8 B (column-major), fp32 accumulators.
template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// 2^x by the special-function unit (ex2.approx: relative error about 2^-22, -inf gives 0),
// without the range fix-ups exp2f adds outside fast-math builds.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats as one register of two T (x in the low half).
template <class T>
__device__ __forceinline__ uint32_t pack2(float x, float y) {
  uint32_t bits;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 v = __floats2half2_rn(x, y);
    memcpy(&bits, &v, 4);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    memcpy(&bits, &v, 4);
  }
  return bits;
}

// ---------------------------------------------------------------- tensor-core tiles
// A tile of ROWS x HD elements in shared memory has rows of HD + kPad elements: the 16-byte
// pad puts the 8 rows one ldmatrix reads in 8 different bank groups.
constexpr int kPad = 8;

// Rows [0, rows) and columns [0, cols) of a tile from global memory (rows `stride` apart);
// the rest of the ROWS x HD tile is zero, so padded head dims and tail rows add nothing.
// Vectorized: 16-byte cp.async (the caller commits and waits); else plain loads and stores.
template <int ROWS, int HD, int THREADS, class T>
__device__ __forceinline__ void load_tile(T* tile, const T* src, int64_t stride, int rows, int cols,
                                          bool vectorized) {
  constexpr int kStride = HD + kPad;
  if (vectorized) {
    constexpr int kChunks = HD / 8;
#pragma unroll
    for (int idx = threadIdx.x; idx < ROWS * kChunks; idx += THREADS) {
      const int r = idx / kChunks, c = idx % kChunks * 8;
      const bool valid = r < rows && c < cols;
      cp_async_16(smem_address(tile + r * kStride + c), valid ? src + r * stride + c : src, valid);
    }
  } else {
    for (int idx = threadIdx.x; idx < ROWS * HD; idx += THREADS) {
      const int r = idx / HD, c = idx % HD;
      tile[r * kStride + c] = r < rows && c < cols ? src[r * stride + c] : from_float<T>(0.0f);
    }
  }
}

// The ldmatrix operands of mma_16816, from row-major tiles of stride HD + kPad:
// A (16 x 16) at (row0, col0);
template <int HD, class T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* tile, int row0, int col0, int lane) {
  ldmatrix_x4(a, smem_address(tile + (row0 + lane % 16) * (HD + kPad) + col0 + lane / 16 * 8));
}
// B for two n8 tiles, n0..n0+15 x k0..k0+15, from a tile stored [n][k] (b[0], b[1] the first
// n tile, b[2], b[3] the second);
template <int HD, class T>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const T* tile, int n0, int k0, int lane) {
  ldmatrix_x4(b, smem_address(tile + (n0 + lane / 16 * 8 + lane % 8) * (HD + kPad) + k0 + lane / 8 % 2 * 8));
}
// the same from a tile stored [k][n].
template <int HD, class T>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const T* tile, int k0, int n0, int lane) {
  ldmatrix_x4_trans(b, smem_address(tile + (k0 + lane % 16) * (HD + kPad) + n0 + lane / 16 * 8));
}

// The accumulators of two n8 tiles (16 x 16 of fp32) as the A operand of the next product:
// the layout of an m16n8 accumulator is that of half an m16k16 operand.
template <class T>
__device__ __forceinline__ void accumulators_as_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack2<T>(lo[0], lo[1]);
  a[1] = pack2<T>(lo[2], lo[3]);
  a[2] = pack2<T>(hi[0], hi[1]);
  a[3] = pack2<T>(hi[2], hi[3]);
}

// rows x cols of accumulators (a warp's 16 rows x HD columns, row0 its first row) times
// `factor` into a contiguous [.., row_len] output, rows below row_end and columns below cols.
template <int HD, class T>
__device__ __forceinline__ void store_rows(T* dst, int64_t row_len, int row0, int row_end, int cols,
                                           const float (&acc)[HD / 8][4], float factor_lo, float factor_hi,
                                           int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + g + half * 8;
    if (row >= row_end) continue;
    const float factor = half ? factor_hi : factor_lo;
    T* out = dst + row * row_len;
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt) {
      const int c = nt * 8 + 2 * t;
      if (c < cols) out[c] = from_float<T>(acc[nt][2 * half] * factor);
      if (c + 1 < cols) out[c + 1] = from_float<T>(acc[nt][2 * half + 1] * factor);
    }
  }
}

// ---------------------------------------------------------------- tensor-core forward
// One block per (query tile, batch * head); each warp owns M_TILES blocks of 16 query rows.
// Key tiles of BN rows stream through single K and V buffers: V(n) loads while S = Q K(n)^T
// runs, K(n + 1) while softmax and O += P V(n) run. Q's fragments stay in registers or are
// read from shared memory for each key tile (Q_IN_REGISTERS).
template <int HD, int WARPS, int M_TILES, int BN, bool Q_IN_REGISTERS>
struct ForwardTiles {
  static constexpr int kHeadDim = HD, kWarps = WARPS, kMTiles = M_TILES, kBlockN = BN;
  static constexpr int kBlockM = 16 * WARPS * M_TILES;
  static constexpr int kThreads = WARPS * kWarp;
  static constexpr bool kQInRegisters = Q_IN_REGISTERS;
  static constexpr size_t kSharedBytes = size_t{kBlockM + 2 * BN} * (HD + kPad) * 2;
};

// The tiles of each head dim: the fastest of those timed on an H200 (sm_90) by the kernel lab
// (gpu-run/attn/harness.cu); 32 query rows per warp halve the K and V fragment loads per mma.
template <int HD>
struct ForwardConfig;
template <>
struct ForwardConfig<32> : ForwardTiles<32, 4, 2, 64, false> {};
template <>
struct ForwardConfig<64> : ForwardTiles<64, 4, 2, 64, false> {};
template <>
struct ForwardConfig<128> : ForwardTiles<128, 4, 2, 64, false> {};

// Blocks of a launch over tiles of `block` rows (queries or keys), batch * head outermost.
inline int64_t tile_blocks(int64_t batch_heads, int64_t rows, int block) {
  return batch_heads * ((rows + block - 1) / block);
}

template <class T, class Tiles>
__global__ void __launch_bounds__(Tiles::kThreads) tc_forward_kernel(const AttentionParams<T, float> p) {
  constexpr int HD = Tiles::kHeadDim, MT = Tiles::kMTiles, BM = Tiles::kBlockM, BN = Tiles::kBlockN;
  constexpr int THREADS = Tiles::kThreads, SP = HD + kPad;
  extern __shared__ __align__(16) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem);
  T* k_s = q_s + BM * SP;
  T* v_s = k_s + BN * SP;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;

  const int m_tiles = (p.L + BM - 1) / BM;
  const int64_t bh = blockIdx.x / m_tiles;
  // Longest causal rows first, so the short blocks fill the tail of the grid.
  const int m0 = (m_tiles - 1 - static_cast<int>(blockIdx.x - bh * m_tiles)) * BM;
  const int rows = min(BM, p.L - m0);
  const T* q = head_rows(p.q, p.q_stride, bh, p.heads) + m0 * p.q_stride.row;
  const T* k = head_rows(p.k, p.k_stride, bh, p.heads, p.group);
  const T* v = head_rows(p.v, p.v_stride, bh, p.heads, p.group);
  int n_tiles = (p.S + BN - 1) / BN;
  if (p.causal) n_tiles = min(n_tiles, (m0 + rows - 1) / BN + 1);

  load_tile<BM, HD, THREADS>(q_s, q, p.q_stride.row, rows, p.D, p.vectorized);
  if (n_tiles > 0) load_tile<BN, HD, THREADS>(k_s, k, p.k_stride.row, min(BN, p.S), p.D, p.vectorized);
  cp_async_commit();

  const float scale_log2 = static_cast<float>(p.scale) * kLog2e;
  const int warp_row = warp * 16 * MT;     // in the tile; block mt of the warp starts at warp_row + 16 mt
  const int row_lo = m0 + warp_row + g;    // accumulators [0], [1] of block mt: row_lo + 16 mt; [2], [3]: + 8
  uint32_t q_frag[Tiles::kQInRegisters ? MT : 1][Tiles::kQInRegisters ? HD / 16 : 1][4];
  float o[MT][HD / 8][4] = {};
  float row_max[MT][2], row_sum[MT][2];  // max of the scores times scale_log2; this thread's part of the sum
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.0f;
  }

  for (int n = 0; n < n_tiles; ++n) {
    const int n0 = n * BN;
    cp_async_wait_all();
    __syncthreads();  // K(n) is in; every warp is done with V(n - 1)
    if constexpr (Tiles::kQInRegisters) {
      if (n == 0) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int kc = 0; kc < HD / 16; ++kc) load_a<HD>(q_frag[mt][kc], q_s, warp_row + mt * 16, kc * 16, lane);
      }
    }
    load_tile<BN, HD, THREADS>(v_s, v + n0 * p.v_stride.row, p.v_stride.row, min(BN, p.S - n0), p.Dv,
                               p.vectorized);
    cp_async_commit();

    float s[MT][BN / 8][4] = {};
#pragma unroll
    for (int kc = 0; kc < HD / 16; ++kc) {
      uint32_t a_smem[Tiles::kQInRegisters ? 1 : MT][4];
      if constexpr (!Tiles::kQInRegisters) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) load_a<HD>(a_smem[mt], q_s, warp_row + mt * 16, kc * 16, lane);
      }
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t b[4];
        load_b_nk<HD>(b, k_s, np * 16, kc * 16, lane);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (Tiles::kQInRegisters) {
            mma_16816<T>(s[mt][2 * np], q_frag[mt][kc], b[0], b[1]);
            mma_16816<T>(s[mt][2 * np + 1], q_frag[mt][kc], b[2], b[3]);
          } else {
            mma_16816<T>(s[mt][2 * np], a_smem[mt], b[0], b[1]);
            mma_16816<T>(s[mt][2 * np + 1], a_smem[mt], b[2], b[3]);
          }
        }
      }
    }
    // Scaled scores, -inf past S and (causal) above the diagonal.
    const bool masked = n0 + BN > p.S || (p.causal && n0 + BN - 1 > m0);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[mt][nt][e] * scale_log2;
          if (masked) {
            const int j = n0 + nt * 8 + 2 * t + e % 2, i = row_lo + mt * 16 + e / 2 * 8;
            if (j >= p.S || (p.causal && j > i)) x = -INFINITY;
          }
          s[mt][nt][e] = x;
        }

    cp_async_wait_all();
    __syncthreads();  // V(n) is in; every warp is done with K(n)
    if (n + 1 < n_tiles) {
      load_tile<BN, HD, THREADS>(k_s, k + (n0 + BN) * p.k_stride.row, p.k_stride.row, min(BN, p.S - n0 - BN),
                                 p.D, p.vectorized);
      cp_async_commit();
    }

    // Online softmax: rescale what was summed so far to the new row maximum.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float tile_max = row_max[mt][half];
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt)
          tile_max = fmaxf(tile_max, fmaxf(s[mt][nt][2 * half], s[mt][nt][2 * half + 1]));
        tile_max = warp_reduce<4>(tile_max, Max{});
        const float base = tile_max == -INFINITY ? 0.0f : tile_max;
        const float alpha = exp2_approx(row_max[mt][half] - base);
        row_max[mt][half] = tile_max;
        float sum = 0;
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
          s[mt][nt][2 * half] = exp2_approx(s[mt][nt][2 * half] - base);
          s[mt][nt][2 * half + 1] = exp2_approx(s[mt][nt][2 * half + 1] - base);
          sum += s[mt][nt][2 * half] + s[mt][nt][2 * half + 1];
        }
        row_sum[mt][half] = row_sum[mt][half] * alpha + sum;
#pragma unroll
        for (int dt = 0; dt < HD / 8; ++dt) {
          o[mt][dt][2 * half] *= alpha;
          o[mt][dt][2 * half + 1] *= alpha;
        }
      }

#pragma unroll
    for (int kc = 0; kc < BN / 16; ++kc) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) accumulators_as_a<T>(a[mt], s[mt][2 * kc], s[mt][2 * kc + 1]);
#pragma unroll
      for (int dp = 0; dp < HD / 16; ++dp) {
        uint32_t b[4];
        load_b_kn<HD>(b, v_s, kc * 16, dp * 16, lane);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(o[mt][2 * dp], a[mt], b[0], b[1]);
          mma_16816<T>(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait_all();

#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    float inv[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float sum = warp_reduce<4>(row_sum[mt][half], Plus{});
      inv[half] = sum > 0 ? 1.0f / sum : 0.0f;
      const int row = row_lo + mt * 16 + half * 8;
      if (t == 0 && row < p.L) {
        p.lse[bh * p.L + row] = sum > 0 ? row_max[mt][half] * kLn2 + logf(sum) : -INFINITY;
      }
    }
    store_rows<HD>(head_rows(p.out, p.out_stride, bh, p.heads), p.out_stride.row, row_lo - g + mt * 16, p.L, p.Dv,
                   o[mt], inv[0], inv[1], lane);
  }
}

// ---------------------------------------------------------------- backward: delta
constexpr int kDeltaRowsPerBlock = 8;  // one warp per row

// delta[row] = dot(grad_out[row], out[row]) over the B * H * L rows (Dv wide) of both.
template <class T, class C>
__global__ void __launch_bounds__(kDeltaRowsPerBlock * kWarp) delta_kernel(const AttentionParams<T, C> p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kDeltaRowsPerBlock + threadIdx.x / kWarp;
  if (row >= int64_t{p.batch} * p.heads * p.L) return;
  const int64_t bh = row / p.L, i = row % p.L;
  const T* grad_out = head_rows(p.grad_out, p.grad_out_stride, bh, p.heads) + i * p.grad_out_stride.row;
  const T* out = head_rows(p.out, p.out_stride, bh, p.heads) + i * p.out_stride.row;
  const int lane = threadIdx.x % kWarp;
  C sum = 0;
  for (int c = lane; c < p.Dv; c += kWarp) sum += convert<C>(grad_out[c]) * convert<C>(out[c]);
  sum = warp_reduce<kWarp>(sum, Plus{});
  if (lane == 0) p.delta[row] = sum;
}

// ---------------------------------------------------------------- tensor-core backward
// grad_k and grad_v: one block per (key tile, batch * head); each warp owns M_TILES blocks of
// 16 keys and their dK, dV accumulators. K and V stay in shared memory; query tiles (Q, dO,
// lse, delta) of BM rows stream through two buffers, the next loading during this one's
// products: S^T = K Q^T, P^T, dP^T = V dO^T, dV += P^T dO, dS^T = P^T (dP^T - delta),
// dK += dS^T Q.
template <int HD, int WARPS, int M_TILES, int BM, int MIN_BLOCKS = 1>
struct BackwardKVTiles {
  static constexpr int kHeadDim = HD, kWarps = WARPS, kMTiles = M_TILES, kBlockM = BM;
  static constexpr int kMinBlocks = MIN_BLOCKS;  // per SM, which caps the registers per thread
  static constexpr int kBlockN = 16 * WARPS * M_TILES;
  static constexpr int kThreads = WARPS * kWarp;
  static constexpr size_t kSharedBytes =
      size_t{2 * kBlockN + 4 * kBlockM} * (HD + kPad) * 2 + 4 * kBlockM * sizeof(float);
};
// Timed as ForwardConfig: 16 keys per warp (dK and dV fill the registers), 64 or 128 queries
// per step.
template <int HD>
struct BackwardKVConfig : BackwardKVTiles<HD, 4, 1, HD == 64 ? 128 : 64> {};

// grad_q: one block per (query tile, batch * head); each warp owns M_TILES blocks of 16 query
// rows. Key tiles of BN rows stream through two K, V buffers: S = Q K^T, P, dP = dO V^T,
// dS = P (dP - delta), dQ += dS K.
template <int HD, int WARPS, int M_TILES, int BN>
struct BackwardQTiles {
  static constexpr int kHeadDim = HD, kWarps = WARPS, kMTiles = M_TILES, kBlockN = BN;
  static constexpr int kBlockM = 16 * WARPS * M_TILES;
  static constexpr int kThreads = WARPS * kWarp;
  static constexpr size_t kSharedBytes = size_t{2 * kBlockM + 4 * BN} * (HD + kPad) * 2;
};
// Timed as ForwardConfig: 32 rows per warp paid off for head dim 128 only.
template <int HD>
struct BackwardQConfig : BackwardQTiles<HD, 4, HD == 128 ? 2 : 1, HD == 128 ? 32 : 64> {};

// acc[mt] += A[mt] B for the warp's M_TILES row blocks: A (16 x K per block) from the rows
// a_row0 + 16 mt of a tile stored [row][k], B (K x N) from a tile stored [n][k] (B_KN false)
// or [k][n] (B_KN true); K, N multiples of 16.
template <class T, int HD, int MT, int K, int N, bool B_KN>
__device__ __forceinline__ void warp_gemm_smem_a(float (&acc)[MT][N / 8][4], const T* a_tile, int a_row0,
                                                 const T* b_tile, int lane) {
#pragma unroll
  for (int kc = 0; kc < K / 16; ++kc) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) load_a<HD>(a[mt], a_tile, a_row0 + mt * 16, kc * 16, lane);
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      uint32_t b[4];
      if constexpr (B_KN) load_b_kn<HD>(b, b_tile, kc * 16, np * 16, lane);
      else load_b_nk<HD>(b, b_tile, np * 16, kc * 16, lane);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816<T>(acc[mt][2 * np], a[mt], b[0], b[1]);
        mma_16816<T>(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// acc[mt] += A[mt] B with A the warp's accumulators x (16 x K per block, as T), B (K x N)
// from a tile stored [k][n].
template <class T, int HD, int MT, int K, int N>
__device__ __forceinline__ void warp_gemm_reg_a(float (&acc)[MT][N / 8][4], const float (&x)[MT][K / 8][4],
                                                const T* b_tile, int lane) {
#pragma unroll
  for (int kc = 0; kc < K / 16; ++kc) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) accumulators_as_a<T>(a[mt], x[mt][2 * kc], x[mt][2 * kc + 1]);
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      uint32_t b[4];
      load_b_kn<HD>(b, b_tile, kc * 16, np * 16, lane);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816<T>(acc[mt][2 * np], a[mt], b[0], b[1]);
        mma_16816<T>(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

template <class T, class Config>
__global__ void __launch_bounds__(Config::kThreads, Config::kMinBlocks) tc_backward_kv_kernel(const AttentionParams<T, float> p) {
  constexpr int HD = Config::kHeadDim, MT = Config::kMTiles, BM = Config::kBlockM, BN = Config::kBlockN;
  constexpr int THREADS = Config::kThreads, SP = HD + kPad;
  extern __shared__ __align__(16) unsigned char smem[];
  T* k_s = reinterpret_cast<T*>(smem);
  T* v_s = k_s + BN * SP;
  T* q_s = v_s + BN * SP;          // [2][BM][SP]
  T* do_s = q_s + 2 * BM * SP;     // [2][BM][SP]
  float* lse_s = reinterpret_cast<float*>(do_s + 2 * BM * SP);  // [2][BM], times log2(e); +inf past L
  float* delta_s = lse_s + 2 * BM;                              // [2][BM]
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;

  const int n_tiles = (p.S + BN - 1) / BN;
  const int64_t bh = blockIdx.x / n_tiles;
  const int n0 = static_cast<int>(blockIdx.x - bh * n_tiles) * BN;  // the first key tiles have the most work
  const T* q = head_rows(p.q, p.q_stride, bh, p.heads);
  const T* grad_out = head_rows(p.grad_out, p.grad_out_stride, bh, p.heads);
  const float* lse = p.lse + bh * p.L;
  const float* delta = p.delta + bh * p.L;
  const int m_tiles = (p.L + BM - 1) / BM;
  const int m_begin = p.causal ? n0 / BM : 0;  // causal: rows i >= n0 only

  auto stage = [&](int m, int buf) {
    const int m0 = m * BM, rows = min(BM, p.L - m0);
    load_tile<BM, HD, THREADS>(q_s + buf * BM * SP, q + m0 * p.q_stride.row, p.q_stride.row, rows, p.D,
                               p.vectorized);
    load_tile<BM, HD, THREADS>(do_s + buf * BM * SP, grad_out + m0 * p.grad_out_stride.row, p.grad_out_stride.row,
                               rows, p.Dv, p.vectorized);
    for (int i = threadIdx.x; i < BM; i += THREADS) {
      lse_s[buf * BM + i] = i < rows ? lse[m0 + i] * kLog2e : INFINITY;
      delta_s[buf * BM + i] = i < rows ? delta[m0 + i] : 0.0f;
    }
  };
  load_tile<BN, HD, THREADS>(k_s, head_rows(p.k, p.k_stride, bh, p.heads, p.group) + n0 * p.k_stride.row, p.k_stride.row,
                             min(BN, p.S - n0), p.D, p.vectorized);
  load_tile<BN, HD, THREADS>(v_s, head_rows(p.v, p.v_stride, bh, p.heads, p.group) + n0 * p.v_stride.row, p.v_stride.row,
                             min(BN, p.S - n0), p.Dv, p.vectorized);
  if (m_begin < m_tiles) stage(m_begin, 0);
  cp_async_commit();

  const float scale_log2 = static_cast<float>(p.scale) * kLog2e;
  const int warp_key = warp * 16 * MT;      // in the tile; block mt of the warp starts at warp_key + 16 mt
  const int key_lo = n0 + warp_key + g;     // accumulators [0], [1] of block mt: key_lo + 16 mt; [2], [3]: + 8
  float dk[MT][HD / 8][4] = {}, dv[MT][HD / 8][4] = {};

  for (int m = m_begin; m < m_tiles; ++m) {
    const int buf = (m - m_begin) & 1, m0 = m * BM;
    cp_async_wait_all();
    __syncthreads();  // tile m is in; every warp is done with tile m - 1
    if (m + 1 < m_tiles) {
      stage(m + 1, buf ^ 1);
      cp_async_commit();
    }
    const T* qb = q_s + buf * BM * SP;
    const T* dob = do_s + buf * BM * SP;
    const float* lse_b = lse_s + buf * BM;
    const float* delta_b = delta_s + buf * BM;

    float s[MT][BM / 8][4] = {};
    warp_gemm_smem_a<T, HD, MT, HD, BM, false>(s, k_s, warp_key, qb, lane);
    const bool masked = p.causal && n0 + BN - 1 > m0;
#pragma unroll
    for (int nt = 0; nt < BM / 8; ++nt) {
      const float2 lse_pair = *reinterpret_cast<const float2*>(lse_b + nt * 8 + 2 * t);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = nt * 8 + 2 * t + e % 2;
          const float x = s[mt][nt][e] * scale_log2 - (e % 2 ? lse_pair.y : lse_pair.x);
          s[mt][nt][e] = masked && key_lo + mt * 16 + e / 2 * 8 > m0 + col ? 0.0f : exp2_approx(x);
        }
    }
    float dp[MT][BM / 8][4] = {};
    warp_gemm_smem_a<T, HD, MT, HD, BM, false>(dp, v_s, warp_key, dob, lane);
    warp_gemm_reg_a<T, HD, MT, BM, HD>(dv, s, dob, lane);
#pragma unroll
    for (int nt = 0; nt < BM / 8; ++nt) {
      const float2 delta_pair = *reinterpret_cast<const float2*>(delta_b + nt * 8 + 2 * t);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] *= dp[mt][nt][e] - (e % 2 ? delta_pair.y : delta_pair.x);
    }
    warp_gemm_reg_a<T, HD, MT, BM, HD>(dk, s, qb, lane);
  }
  cp_async_wait_all();

  const float scale = static_cast<float>(p.scale);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int key0 = n0 + warp_key + mt * 16;
    store_rows<HD>(head_rows(p.grad_k, p.grad_k_stride, bh, p.heads), p.grad_k_stride.row, key0, p.S, p.D, dk[mt],
                   scale, scale, lane);
    store_rows<HD>(head_rows(p.grad_v, p.grad_v_stride, bh, p.heads), p.grad_v_stride.row, key0, p.S, p.Dv, dv[mt],
                   1.0f, 1.0f, lane);
  }
}

template <class T, class Config>
__global__ void __launch_bounds__(Config::kThreads) tc_backward_q_kernel(const AttentionParams<T, float> p) {
  constexpr int HD = Config::kHeadDim, MT = Config::kMTiles, BM = Config::kBlockM, BN = Config::kBlockN;
  constexpr int THREADS = Config::kThreads, SP = HD + kPad;
  extern __shared__ __align__(16) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem);
  T* do_s = q_s + BM * SP;
  T* k_s = do_s + BM * SP;     // [2][BN][SP]
  T* v_s = k_s + 2 * BN * SP;  // [2][BN][SP]
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;

  const int m_tiles = (p.L + BM - 1) / BM;
  const int64_t bh = blockIdx.x / m_tiles;
  const int m0 = (m_tiles - 1 - static_cast<int>(blockIdx.x - bh * m_tiles)) * BM;
  const int rows = min(BM, p.L - m0);
  const T* k = head_rows(p.k, p.k_stride, bh, p.heads, p.group);
  const T* v = head_rows(p.v, p.v_stride, bh, p.heads, p.group);
  int n_tiles = (p.S + BN - 1) / BN;
  if (p.causal) n_tiles = min(n_tiles, (m0 + rows - 1) / BN + 1);

  auto stage = [&](int n, int buf) {
    const int n0 = n * BN, keys = min(BN, p.S - n0);
    load_tile<BN, HD, THREADS>(k_s + buf * BN * SP, k + n0 * p.k_stride.row, p.k_stride.row, keys, p.D,
                               p.vectorized);
    load_tile<BN, HD, THREADS>(v_s + buf * BN * SP, v + n0 * p.v_stride.row, p.v_stride.row, keys, p.Dv,
                               p.vectorized);
  };
  load_tile<BM, HD, THREADS>(q_s, head_rows(p.q, p.q_stride, bh, p.heads) + m0 * p.q_stride.row, p.q_stride.row,
                             rows, p.D, p.vectorized);
  load_tile<BM, HD, THREADS>(do_s, head_rows(p.grad_out, p.grad_out_stride, bh, p.heads) + m0 * p.grad_out_stride.row,
                             p.grad_out_stride.row, rows, p.Dv, p.vectorized);
  if (n_tiles > 0) stage(0, 0);
  cp_async_commit();

  const float scale_log2 = static_cast<float>(p.scale) * kLog2e;
  const int warp_row = warp * 16 * MT;
  const int row_lo = m0 + warp_row + g;  // accumulators [0], [1] of block mt: row_lo + 16 mt; [2], [3]: + 8
  float lse2[MT][2], delta[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row_lo + mt * 16 + half * 8;
      lse2[mt][half] = row < p.L ? p.lse[bh * p.L + row] * kLog2e : 0.0f;
      delta[mt][half] = row < p.L ? p.delta[bh * p.L + row] : 0.0f;
    }
  float dq[MT][HD / 8][4] = {};

  for (int n = 0; n < n_tiles; ++n) {
    const int buf = n & 1, n0 = n * BN;
    cp_async_wait_all();
    __syncthreads();  // tile n is in; every warp is done with tile n - 1
    if (n + 1 < n_tiles) {
      stage(n + 1, buf ^ 1);
      cp_async_commit();
    }
    const T* kb = k_s + buf * BN * SP;
    const T* vb = v_s + buf * BN * SP;

    float s[MT][BN / 8][4] = {};
    warp_gemm_smem_a<T, HD, MT, HD, BN, false>(s, q_s, warp_row, kb, lane);
    const bool masked = n0 + BN > p.S || (p.causal && n0 + BN - 1 > m0);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = n0 + nt * 8 + 2 * t + e % 2, i = row_lo + mt * 16 + e / 2 * 8;
          const float x = s[mt][nt][e] * scale_log2 - lse2[mt][e / 2];
          s[mt][nt][e] = masked && (j >= p.S || (p.causal && j > i)) ? 0.0f : exp2_approx(x);
        }
    float dp[MT][BN / 8][4] = {};
    warp_gemm_smem_a<T, HD, MT, HD, BN, false>(dp, do_s, warp_row, vb, lane);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] *= dp[mt][nt][e] - delta[mt][e / 2];
    warp_gemm_reg_a<T, HD, MT, BN, HD>(dq, s, kb, lane);
  }
  cp_async_wait_all();

  const float scale = static_cast<float>(p.scale);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    store_rows<HD>(head_rows(p.grad_q, p.grad_q_stride, bh, p.heads), p.grad_q_stride.row, m0 + warp_row + mt * 16,
                   p.L, p.D, dq[mt], scale, scale, lane);
  }
}

// ---------------------------------------------------------------- register-tiled SIMT kernels (f32)
// Exact f32 FMA math laid out like a SIMT GEMM: a block of 16 x 16 threads owns a tile of 64
// rows (queries forward and for grad_q, keys for grad_k/grad_v) and streams the other side
// through shared memory in tiles of 64 rows. Thread (ty, tx) computes the 4 x 4 scores of rows
// ty + 16 r and columns tx + 16 c (so the 16 threads sharing a row are 16 lanes of one warp,
// and the softmax reduces by shuffles), puts them in shared memory, and accumulates rows
// ty + 16 r of the 64 x HD product in registers, HD / 16 columns each (tiled_col). Head dims
// are padded to HD = 32, 64 or 128 with zero columns; the fixed order of every sum keeps the
// results deterministic.
//
// The forward's warps are 2 x 16 threads (ty x tx), so that a row's 16 threads reduce within
// the warp; the backward needs no row reductions and takes 4 x 8, whose warps read half as
// many distinct 16-byte words of shared memory per product step (one wavefront per load).
constexpr int kTiledRows = 64;                           // rows of every tile
constexpr int kTiledThreads = 256;                       // 16 x 16
constexpr int kTiledPad = 4;                             // floats; see tiled_dot_rows
constexpr int kTiledScoreStride = kTiledRows + kTiledPad;  // a 64 x 64 tile of scores
// Two blocks per SM (at most 128 registers a thread): one block's tile loads overlap the
// other's products, as the tiles are not double-buffered.
constexpr int kTiledMinBlocks = 2;

// Row stride of a [64][HD] tile: the 4-float pad makes 8 lanes reading 16 bytes of 8
// consecutive rows hit 8 different groups of 4 banks.
template <int HD>
constexpr int kTiledStride = HD + kTiledPad;

// Shared memory of each kernel: tiles of [64][HD] operands, 64 x 64 score tiles and 64-float
// rows of per-query statistics.
template <int HD>
constexpr size_t tiled_shared_bytes(int operand_tiles, int score_tiles, int stat_rows) {
  return sizeof(float) * (size_t{kTiledRows} * (operand_tiles * kTiledStride<HD> + score_tiles * kTiledScoreStride) +
                          size_t{kTiledRows} * stat_rows);
}
template <int HD>
constexpr size_t tiled_forward_shared_bytes() {
  return tiled_shared_bytes<HD>(3, 1, 0);  // Q, K, V; P
}
template <int HD>
constexpr size_t tiled_backward_kv_shared_bytes() {
  return tiled_shared_bytes<HD>(4, 2, 2);  // K, V, Q, dO; P^T, dS^T; lse, delta
}
template <int HD>
constexpr size_t tiled_backward_q_shared_bytes() {
  return tiled_shared_bytes<HD>(4, 1, 0);  // Q, dO, K, V; dS
}

// The column of a thread's c-th accumulator of a row: groups of 4 consecutive columns
// (2 for HD = 32), the 16 threads of a row side by side, so that a row of the right-hand tile
// is read as one conflict-free run of 16-byte (8-byte) loads.
// Thread (ty, tx) of the backward kernels: 4 x 8 threads a warp (see above).
__device__ __forceinline__ int tiled_backward_ty() { return threadIdx.x / kWarp / 2 * 4 + threadIdx.x % kWarp / 8; }
__device__ __forceinline__ int tiled_backward_tx() { return threadIdx.x / kWarp % 2 * 8 + threadIdx.x % 8; }

template <int HD>
__device__ __forceinline__ int tiled_col(int c, int tx) {
  constexpr int kGroup = HD / 16 < 4 ? HD / 16 : 4;
  return c / kGroup * 16 * kGroup + tx * kGroup + c % kGroup;
}

// Rows [0, rows) and columns [0, cols) of a [64][HD] tile from global memory (rows `stride`
// apart); the rest of the tile is zero, so padded columns and tail rows add nothing. 4-byte
// cp.async (any alignment), so that whole tiles are in flight at once without holding
// registers; the caller waits (cp_async_wait_all) before its __syncthreads.
template <int HD>
__device__ __forceinline__ void tiled_load(float* tile, const float* src, int64_t stride, int rows, int cols) {
#pragma unroll 8
  for (int idx = threadIdx.x; idx < kTiledRows * HD; idx += kTiledThreads) {
    const int r = idx / HD, c = idx % HD;
    const bool valid = r < rows && c < cols;
    cp_async_4(smem_address(tile + r * kTiledStride<HD> + c), valid ? src + r * stride + c : src, valid);
  }
  cp_async_commit();
}

// acc[r][c] += dot(a[ty + 16 r], b[tx + 16 c]) over the HD columns of two [64][HD] tiles.
template <int HD>
__device__ __forceinline__ void tiled_dot_rows(float (&acc)[4][4], const float* a, const float* b, int ty, int tx) {
  constexpr int SP = kTiledStride<HD>;
#pragma unroll 2
  for (int k = 0; k < HD; k += 4) {
    float4 av[4], bv[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) av[r] = *reinterpret_cast<const float4*>(a + (ty + 16 * r) * SP + k);
#pragma unroll
    for (int c = 0; c < 4; ++c) bv[c] = *reinterpret_cast<const float4*>(b + (tx + 16 * c) * SP + k);
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        acc[r][c] = fmaf(av[r].x, bv[c].x, acc[r][c]);
        acc[r][c] = fmaf(av[r].y, bv[c].y, acc[r][c]);
        acc[r][c] = fmaf(av[r].z, bv[c].z, acc[r][c]);
        acc[r][c] = fmaf(av[r].w, bv[c].w, acc[r][c]);
      }
  }
}

// acc[r][c] += sum_j scores[ty + 16 r][j] b[j][tiled_col(c)] over a 64 x 64 score tile and
// the 64 rows of a [64][HD] tile.
template <int HD>
__device__ __forceinline__ void tiled_scores_times(float (&acc)[4][HD / 16], const float* scores, const float* b,
                                                   int ty, int tx) {
  constexpr int SP = kTiledStride<HD>, kCols = HD / 16;
#pragma unroll 2
  for (int j = 0; j < kTiledRows; j += 4) {
    float4 sv[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) sv[r] = *reinterpret_cast<const float4*>(scores + (ty + 16 * r) * kTiledScoreStride + j);
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const float* b_row = b + (j + jj) * SP;
      float bv[kCols];
      if constexpr (kCols == 2) {
        const float2 x = *reinterpret_cast<const float2*>(b_row + tiled_col<HD>(0, tx));
        bv[0] = x.x;
        bv[1] = x.y;
      } else {
#pragma unroll
        for (int g = 0; g < kCols; g += 4) {
          const float4 x = *reinterpret_cast<const float4*>(b_row + tiled_col<HD>(g, tx));
          bv[g] = x.x;
          bv[g + 1] = x.y;
          bv[g + 2] = x.z;
          bv[g + 3] = x.w;
        }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float s = jj == 0 ? sv[r].x : jj == 1 ? sv[r].y : jj == 2 ? sv[r].z : sv[r].w;
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc[r][c] = fmaf(s, bv[c], acc[r][c]);
      }
    }
  }
}

// Rows ty + 16 r below `rows` and columns below `cols` of the accumulators, times `factor`,
// into a contiguous [.., row_len] output starting at dst.
template <int HD>
__device__ __forceinline__ void tiled_store(float* dst, int64_t row_len, int rows, int cols,
                                            const float (&acc)[4][HD / 16], float factor, int ty, int tx) {
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int row = ty + 16 * r;
    if (row >= rows) continue;
#pragma unroll
    for (int c = 0; c < HD / 16; ++c) {
      const int col = tiled_col<HD>(c, tx);
      if (col < cols) dst[row * row_len + col] = acc[r][c] * factor;
    }
  }
}

template <int HD>
__global__ void __launch_bounds__(kTiledThreads, kTiledMinBlocks) tiled_forward_kernel(const AttentionParams<float, float> p) {
  constexpr int SP = kTiledStride<HD>;
  extern __shared__ __align__(16) unsigned char smem[];
  float* q_s = reinterpret_cast<float*>(smem);
  float* k_s = q_s + kTiledRows * SP;
  float* v_s = k_s + kTiledRows * SP;
  float* p_s = v_s + kTiledRows * SP;  // [64][kTiledScoreStride]
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;

  const int m_tiles = (p.L + kTiledRows - 1) / kTiledRows;
  const int64_t bh = blockIdx.x / m_tiles;
  // Longest causal rows first, so the short blocks fill the tail of the grid.
  const int m0 = (m_tiles - 1 - static_cast<int>(blockIdx.x - bh * m_tiles)) * kTiledRows;
  const int rows = min(kTiledRows, p.L - m0);
  const float* k = head_rows(p.k, p.k_stride, bh, p.heads, p.group);
  const float* v = head_rows(p.v, p.v_stride, bh, p.heads, p.group);
  int n_tiles = (p.S + kTiledRows - 1) / kTiledRows;
  if (p.causal) n_tiles = min(n_tiles, (m0 + rows - 1) / kTiledRows + 1);
  tiled_load<HD>(q_s, head_rows(p.q, p.q_stride, bh, p.heads) + m0 * p.q_stride.row, p.q_stride.row, rows, p.D);

  const float scale_log2 = static_cast<float>(p.scale) * kLog2e;
  float o[4][HD / 16] = {};
  float row_max[4], row_sum[4];  // max of the scores times scale_log2; this thread's part of the sum
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    row_max[r] = -INFINITY;
    row_sum[r] = 0.0f;
  }

  for (int n = 0; n < n_tiles; ++n) {
    const int n0 = n * kTiledRows, keys = min(kTiledRows, p.S - n0);
    __syncthreads();  // every thread is done with the previous K, V and P
    tiled_load<HD>(k_s, k + n0 * p.k_stride.row, p.k_stride.row, keys, p.D);
    tiled_load<HD>(v_s, v + n0 * p.v_stride.row, p.v_stride.row, keys, p.Dv);
    cp_async_wait_all();
    __syncthreads();

    float s[4][4] = {};
    tiled_dot_rows<HD>(s, q_s, k_s, ty, tx);
    // Scaled scores, -inf past S and (causal) above the diagonal.
    const bool masked = keys < kTiledRows || (p.causal && n0 + kTiledRows - 1 > m0);
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int i = m0 + ty + 16 * r, j = n0 + tx + 16 * c;
        s[r][c] = masked && (j >= p.S || (p.causal && j > i)) ? -INFINITY : s[r][c] * scale_log2;
      }
    // Online softmax: rescale what was summed so far to the new row maximum.
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      float tile_max = fmaxf(fmaxf(s[r][0], s[r][1]), fmaxf(s[r][2], s[r][3]));
#pragma unroll
      for (int offset = 8; offset > 0; offset /= 2)
        tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, offset));
      const float new_max = fmaxf(row_max[r], tile_max);
      const float base = new_max == -INFINITY ? 0.0f : new_max;  // a row masked so far stays 0
      const float alpha = exp2_approx(row_max[r] - base);
      row_max[r] = new_max;
      row_sum[r] *= alpha;
#pragma unroll
      for (int c = 0; c < HD / 16; ++c) o[r][c] *= alpha;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float prob = exp2_approx(s[r][c] - base);
        row_sum[r] += prob;
        p_s[(ty + 16 * r) * kTiledScoreStride + tx + 16 * c] = prob;
      }
    }
    __syncthreads();  // P is in
    tiled_scores_times<HD>(o, p_s, v_s, ty, tx);
  }
  cp_async_wait_all();  // Q, when there was no key tile

  float inv[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    float sum = row_sum[r];
#pragma unroll
    for (int offset = 8; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
    inv[r] = sum > 0 ? 1.0f / sum : 0.0f;
    const int row = ty + 16 * r;
    if (tx == 0 && row < rows) p.lse[bh * p.L + m0 + row] = sum > 0 ? row_max[r] * kLn2 + logf(sum) : -INFINITY;
#pragma unroll
    for (int c = 0; c < HD / 16; ++c) o[r][c] *= inv[r];
  }
  tiled_store<HD>(head_rows(p.out, p.out_stride, bh, p.heads) + m0 * p.out_stride.row, p.out_stride.row, rows, p.Dv,
                  o, 1.0f, ty, tx);
}

// grad_k and grad_v of a tile of 64 keys (rows ty + 16 r of the score tiles are keys, columns
// queries), over the query tiles that see them: P^T, dP^T = V dO^T, dS^T = P^T (dP^T - delta),
// dV += P^T dO, dK += dS^T Q.
template <int HD>
__global__ void __launch_bounds__(kTiledThreads, kTiledMinBlocks) tiled_backward_kv_kernel(const AttentionParams<float, float> p) {
  constexpr int SP = kTiledStride<HD>;
  extern __shared__ __align__(16) unsigned char smem[];
  float* k_s = reinterpret_cast<float*>(smem);
  float* v_s = k_s + kTiledRows * SP;
  float* q_s = v_s + kTiledRows * SP;
  float* do_s = q_s + kTiledRows * SP;
  float* pt_s = do_s + kTiledRows * SP;         // [64][kTiledScoreStride]
  float* dst_s = pt_s + kTiledRows * kTiledScoreStride;
  float* lse_s = dst_s + kTiledRows * kTiledScoreStride;  // [64]
  float* delta_s = lse_s + kTiledRows;                    // [64]
  const int tx = tiled_backward_tx(), ty = tiled_backward_ty();

  const int n_tiles = (p.S + kTiledRows - 1) / kTiledRows;
  const int64_t bh = blockIdx.x / n_tiles;
  const int n0 = static_cast<int>(blockIdx.x - bh * n_tiles) * kTiledRows;  // causal: longest first
  const int keys = min(kTiledRows, p.S - n0);
  const float* q = head_rows(p.q, p.q_stride, bh, p.heads);
  const float* grad_out = head_rows(p.grad_out, p.grad_out_stride, bh, p.heads);
  tiled_load<HD>(k_s, head_rows(p.k, p.k_stride, bh, p.heads, p.group) + n0 * p.k_stride.row, p.k_stride.row, keys, p.D);
  tiled_load<HD>(v_s, head_rows(p.v, p.v_stride, bh, p.heads, p.group) + n0 * p.v_stride.row, p.v_stride.row, keys, p.Dv);

  const float scale_log2 = static_cast<float>(p.scale) * kLog2e;
  float dk[4][HD / 16] = {}, dv[4][HD / 16] = {};
  const int m_tiles = (p.L + kTiledRows - 1) / kTiledRows;
  for (int m = p.causal ? n0 / kTiledRows : 0; m < m_tiles; ++m) {
    const int m0 = m * kTiledRows, rows = min(kTiledRows, p.L - m0);
    __syncthreads();  // every thread is done with the previous query tile
    tiled_load<HD>(q_s, q + m0 * p.q_stride.row, p.q_stride.row, rows, p.D);
    tiled_load<HD>(do_s, grad_out + m0 * p.grad_out_stride.row, p.grad_out_stride.row, rows, p.Dv);
    if (threadIdx.x < kTiledRows) {
      const int row = threadIdx.x;
      const int64_t at = bh * p.L + m0 + (row < rows ? row : 0);
      cp_async_4(smem_address(lse_s + row), p.lse + at, row < rows);
      cp_async_4(smem_address(delta_s + row), p.delta + at, row < rows);
    }
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();

    float s[4][4] = {}, dp[4][4] = {};
    tiled_dot_rows<HD>(s, k_s, q_s, ty, tx);
    tiled_dot_rows<HD>(dp, v_s, do_s, ty, tx);
    const bool masked = rows < kTiledRows || (p.causal && n0 + kTiledRows - 1 > m0);
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int col = tx + 16 * c, i = m0 + col, j = n0 + ty + 16 * r;
        const float prob =
            masked && (i >= p.L || (p.causal && j > i)) ? 0.0f : exp2_approx(s[r][c] * scale_log2 - lse_s[col] * kLog2e);
        pt_s[(ty + 16 * r) * kTiledScoreStride + col] = prob;
        dst_s[(ty + 16 * r) * kTiledScoreStride + col] = prob * (dp[r][c] - delta_s[col]);
      }
    __syncthreads();  // P^T and dS^T are in
    tiled_scores_times<HD>(dv, pt_s, do_s, ty, tx);
    tiled_scores_times<HD>(dk, dst_s, q_s, ty, tx);
  }
  cp_async_wait_all();  // K and V, when there was no query tile
  tiled_store<HD>(head_rows(p.grad_k, p.grad_k_stride, bh, p.heads) + n0 * p.grad_k_stride.row, p.grad_k_stride.row,
                  keys, p.D, dk, static_cast<float>(p.scale), ty, tx);
  tiled_store<HD>(head_rows(p.grad_v, p.grad_v_stride, bh, p.heads) + n0 * p.grad_v_stride.row, p.grad_v_stride.row,
                  keys, p.Dv, dv, 1.0f, ty, tx);
}

// grad_q of a tile of 64 queries over the key tiles they see: dS = P (dO V^T - delta),
// dQ += dS K.
template <int HD>
__global__ void __launch_bounds__(kTiledThreads, kTiledMinBlocks) tiled_backward_q_kernel(const AttentionParams<float, float> p) {
  constexpr int SP = kTiledStride<HD>;
  extern __shared__ __align__(16) unsigned char smem[];
  float* q_s = reinterpret_cast<float*>(smem);
  float* do_s = q_s + kTiledRows * SP;
  float* k_s = do_s + kTiledRows * SP;
  float* v_s = k_s + kTiledRows * SP;
  float* ds_s = v_s + kTiledRows * SP;  // [64][kTiledScoreStride]
  const int tx = tiled_backward_tx(), ty = tiled_backward_ty();

  const int m_tiles = (p.L + kTiledRows - 1) / kTiledRows;
  const int64_t bh = blockIdx.x / m_tiles;
  const int m0 = (m_tiles - 1 - static_cast<int>(blockIdx.x - bh * m_tiles)) * kTiledRows;
  const int rows = min(kTiledRows, p.L - m0);
  const float* k = head_rows(p.k, p.k_stride, bh, p.heads, p.group);
  const float* v = head_rows(p.v, p.v_stride, bh, p.heads, p.group);
  int n_tiles = (p.S + kTiledRows - 1) / kTiledRows;
  if (p.causal) n_tiles = min(n_tiles, (m0 + rows - 1) / kTiledRows + 1);
  tiled_load<HD>(q_s, head_rows(p.q, p.q_stride, bh, p.heads) + m0 * p.q_stride.row, p.q_stride.row, rows, p.D);
  tiled_load<HD>(do_s, head_rows(p.grad_out, p.grad_out_stride, bh, p.heads) + m0 * p.grad_out_stride.row,
                 p.grad_out_stride.row, rows, p.Dv);

  const float scale_log2 = static_cast<float>(p.scale) * kLog2e;
  float lse2[4], delta[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int row = ty + 16 * r;
    lse2[r] = row < rows ? p.lse[bh * p.L + m0 + row] * kLog2e : 0.0f;
    delta[r] = row < rows ? p.delta[bh * p.L + m0 + row] : 0.0f;
  }
  float dq[4][HD / 16] = {};

  for (int n = 0; n < n_tiles; ++n) {
    const int n0 = n * kTiledRows, keys = min(kTiledRows, p.S - n0);
    __syncthreads();  // every thread is done with the previous K, V and dS
    tiled_load<HD>(k_s, k + n0 * p.k_stride.row, p.k_stride.row, keys, p.D);
    tiled_load<HD>(v_s, v + n0 * p.v_stride.row, p.v_stride.row, keys, p.Dv);
    cp_async_wait_all();
    __syncthreads();

    float s[4][4] = {}, dp[4][4] = {};
    tiled_dot_rows<HD>(s, q_s, k_s, ty, tx);
    tiled_dot_rows<HD>(dp, do_s, v_s, ty, tx);
    const bool masked = keys < kTiledRows || (p.causal && n0 + kTiledRows - 1 > m0);
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int i = m0 + ty + 16 * r, j = n0 + tx + 16 * c;
        const float prob =
            masked && (j >= p.S || (p.causal && j > i)) ? 0.0f : exp2_approx(s[r][c] * scale_log2 - lse2[r]);
        ds_s[(ty + 16 * r) * kTiledScoreStride + tx + 16 * c] = prob * (dp[r][c] - delta[r]);
      }
    __syncthreads();  // dS is in
    tiled_scores_times<HD>(dq, ds_s, k_s, ty, tx);
  }
  cp_async_wait_all();  // Q and dO, when there was no key tile
  tiled_store<HD>(head_rows(p.grad_q, p.grad_q_stride, bh, p.heads) + m0 * p.grad_q_stride.row, p.grad_q_stride.row,
                  rows, p.D, dq, static_cast<float>(p.scale), ty, tx);
}

// ---------------------------------------------------------------- row-per-warp SIMT kernels (f64)
// f64 runs here: the 64-row tiles of the kernels above would not fit shared memory in f64 at
// HD = 128. One warp per row (a query row forward, for the row statistics and for grad_q, a
// key row for grad_k/grad_v), kSimtRows rows per block; the other side streams through shared
// memory in chunks of 32 rows, one per lane for the dot products, then every lane sums over
// the chunk for its kSimtCols head-dim columns (lane + 32 c). T accumulates in T. The
// backward starts with the rows' statistics, which take delta as sum_j p_j dp_j with the
// p_j and dp_j the gradient kernels recompute bit for bit, so that dp_j - delta cancels in
// consistently rounded terms (rowsum(grad_out * out) would not, with a saturated softmax).
constexpr int kSimtRows = 8;
constexpr int kSimtChunk = kWarp;
constexpr int kSimtCols = 4;  // 4 * 32 = 128 columns, the largest head dim
constexpr int kSimtThreads = kSimtRows * kWarp;

// Shared memory of the SIMT kernels: two chunks (rows of width + 1, so that lanes reading
// their own rows hit distinct banks) and kSimtRows rows of each side's own vectors.
template <class T>
constexpr size_t simt_shared_bytes(int D, int Dv) {
  return sizeof(T) * (size_t{kSimtChunk} * (D + 1 + Dv + 1) + size_t{kSimtRows} * (D + Dv) + 3 * kSimtChunk);
}

// rows [row0, row0 + kSimtChunk) of src into tile (rows of width + 1), zero past `rows`.
template <class T>
__device__ __forceinline__ void stage_chunk(T* tile, const T* src, int64_t stride, int row0, int rows, int width) {
  for (int idx = threadIdx.x; idx < kSimtChunk * width; idx += kSimtThreads) {
    const int r = idx / width, c = idx - r * width;
    tile[r * (width + 1) + c] = row0 + r < rows ? src[(row0 + r) * stride + c] : T(0);
  }
}

template <class T>
__device__ __forceinline__ T dot_rows(const T* a, const T* b, int n) {
  T sum = 0;
  for (int c = 0; c < n; ++c) sum += a[c] * b[c];
  return sum;
}

template <class T>
__global__ void __launch_bounds__(kSimtThreads) simt_forward_kernel(const AttentionParams<T, T> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* k_s = reinterpret_cast<T*>(smem);                  // [32][D + 1]
  T* v_s = k_s + kSimtChunk * (p.D + 1);                // [32][Dv + 1]
  T* q_s = v_s + kSimtChunk * (p.Dv + 1);               // [kSimtRows][D]
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int m_tiles = (p.L + kSimtRows - 1) / kSimtRows;
  const int64_t bh = blockIdx.x / m_tiles;
  const int m0 = (m_tiles - 1 - static_cast<int>(blockIdx.x - bh * m_tiles)) * kSimtRows;
  const int row = m0 + warp;
  const bool row_valid = row < p.L;
  const T* q = head_rows(p.q, p.q_stride, bh, p.heads);
  const T* k = head_rows(p.k, p.k_stride, bh, p.heads, p.group);
  const T* v = head_rows(p.v, p.v_stride, bh, p.heads, p.group);
  T* q_row = q_s + warp * p.D;
  for (int c = lane; c < p.D; c += kWarp) q_row[c] = row_valid ? q[row * p.q_stride.row + c] : T(0);
  const int key_end = p.causal ? min(p.S, min(m0 + kSimtRows, p.L)) : p.S;
  const T scale = static_cast<T>(p.scale);

  T row_max = -INFINITY, row_sum = 0, acc[kSimtCols] = {};
  for (int n0 = 0; n0 < key_end; n0 += kSimtChunk) {
    __syncthreads();  // every warp is done with the previous chunk
    stage_chunk(k_s, k, p.k_stride.row, n0, p.S, p.D);
    stage_chunk(v_s, v, p.v_stride.row, n0, p.S, p.Dv);
    __syncthreads();
    const int j = n0 + lane;
    T score = -INFINITY;
    if (row_valid && j < p.S && !(p.causal && j > row)) score = dot_rows(q_row, k_s + lane * (p.D + 1), p.D) * scale;
    const T new_max = max(row_max, warp_reduce<kWarp>(score, Max{}));
    if (new_max == -INFINITY) continue;  // every key so far masked (uniform over the warp)
    const T alpha = exp(row_max - new_max);
    const T prob = exp(score - new_max);
    row_max = new_max;
    row_sum = row_sum * alpha + warp_reduce<kWarp>(prob, Plus{});
    const int chunk = min(kSimtChunk, p.S - n0);
#pragma unroll
    for (int c = 0; c < kSimtCols; ++c) acc[c] *= alpha;
    for (int jj = 0; jj < chunk; ++jj) {
      const T pj = __shfl_sync(kFullMask, prob, jj);
#pragma unroll
      for (int c = 0; c < kSimtCols; ++c) {
        if (lane + c * kWarp < p.Dv) acc[c] += pj * v_s[jj * (p.Dv + 1) + lane + c * kWarp];
      }
    }
  }
  if (!row_valid) return;
  const T inv = row_sum > 0 ? T(1) / row_sum : T(0);
  T* out = head_rows(p.out, p.out_stride, bh, p.heads) + row * p.out_stride.row;
#pragma unroll
  for (int c = 0; c < kSimtCols; ++c) {
    if (lane + c * kWarp < p.Dv) out[lane + c * kWarp] = acc[c] * inv;
  }
  if (lane == 0) p.lse[bh * p.L + row] = row_sum > 0 ? row_max + log(row_sum) : T(-INFINITY);
}

// p(score) of the row-per-warp backward: exp(score - row_max) / row_sum.
template <class T>
__device__ __forceinline__ T simt_prob(T score, T row_max, T row_sum) {
  return exp(score - row_max) / row_sum;
}

template <class T>
__global__ void __launch_bounds__(kSimtThreads) simt_backward_kv_kernel(const AttentionParams<T, T> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem);                  // [32][D + 1]
  T* do_s = q_s + kSimtChunk * (p.D + 1);               // [32][Dv + 1]
  T* k_rows = do_s + kSimtChunk * (p.Dv + 1);           // [kSimtRows][D]
  T* v_rows = k_rows + kSimtRows * p.D;                 // [kSimtRows][Dv]
  T* max_s = v_rows + kSimtRows * p.Dv;                 // [32]
  T* sum_s = max_s + kSimtChunk;                        // [32]
  T* delta_s = sum_s + kSimtChunk;                      // [32]
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int n_tiles = (p.S + kSimtRows - 1) / kSimtRows;
  const int64_t bh = blockIdx.x / n_tiles;
  const int n0 = static_cast<int>(blockIdx.x - bh * n_tiles) * kSimtRows;
  const int key = n0 + warp;
  const bool key_valid = key < p.S;
  const T* q = head_rows(p.q, p.q_stride, bh, p.heads);
  const T* k = head_rows(p.k, p.k_stride, bh, p.heads, p.group);
  const T* v = head_rows(p.v, p.v_stride, bh, p.heads, p.group);
  const T* grad_out = head_rows(p.grad_out, p.grad_out_stride, bh, p.heads);
  T* k_row = k_rows + warp * p.D;
  T* v_row = v_rows + warp * p.Dv;
  for (int c = lane; c < p.D; c += kWarp) k_row[c] = key_valid ? k[key * p.k_stride.row + c] : T(0);
  for (int c = lane; c < p.Dv; c += kWarp) v_row[c] = key_valid ? v[key * p.v_stride.row + c] : T(0);
  const T scale = static_cast<T>(p.scale);

  T grad_k[kSimtCols] = {}, grad_v[kSimtCols] = {};
  for (int m0 = p.causal ? n0 / kSimtChunk * kSimtChunk : 0; m0 < p.L; m0 += kSimtChunk) {
    __syncthreads();
    stage_chunk(q_s, q, p.q_stride.row, m0, p.L, p.D);
    stage_chunk(do_s, grad_out, p.grad_out_stride.row, m0, p.L, p.Dv);
    for (int r = threadIdx.x; r < kSimtChunk; r += kSimtThreads) {
      const bool in = m0 + r < p.L;
      max_s[r] = in ? p.row_max[bh * p.L + m0 + r] : T(0);
      sum_s[r] = in ? p.row_sum[bh * p.L + m0 + r] : T(1);
      delta_s[r] = in ? p.delta[bh * p.L + m0 + r] : T(0);
    }
    __syncthreads();
    const int i = m0 + lane;
    T prob = 0, ds = 0;
    if (key_valid && i < p.L && !(p.causal && key > i)) {
      prob = simt_prob(dot_rows(q_s + lane * (p.D + 1), k_row, p.D) * scale, max_s[lane], sum_s[lane]);
      ds = prob * (dot_rows(do_s + lane * (p.Dv + 1), v_row, p.Dv) - delta_s[lane]);
    }
    const int chunk = min(kSimtChunk, p.L - m0);
    for (int ii = 0; ii < chunk; ++ii) {
      const T pi = __shfl_sync(kFullMask, prob, ii), dsi = __shfl_sync(kFullMask, ds, ii);
#pragma unroll
      for (int c = 0; c < kSimtCols; ++c) {
        const int col = lane + c * kWarp;
        if (col < p.Dv) grad_v[c] += pi * do_s[ii * (p.Dv + 1) + col];
        if (col < p.D) grad_k[c] += dsi * q_s[ii * (p.D + 1) + col];
      }
    }
  }
  if (!key_valid) return;
#pragma unroll
  for (int c = 0; c < kSimtCols; ++c) {
    const int col = lane + c * kWarp;
    if (col < p.D) head_rows(p.grad_k, p.grad_k_stride, bh, p.heads)[key * p.grad_k_stride.row + col] = grad_k[c] * scale;
    if (col < p.Dv) head_rows(p.grad_v, p.grad_v_stride, bh, p.heads)[key * p.grad_v_stride.row + col] = grad_v[c];
  }
}

// One warp per query row. ROW_STATS: the row's row_max, row_sum (0 with no key) and delta =
// sum_j p_j dp_j, in two passes over the keys (the statistics, then delta with the final
// ones), before the gradient kernels; else grad_q.
template <class T, bool ROW_STATS>
__global__ void __launch_bounds__(kSimtThreads) simt_query_rows_kernel(const AttentionParams<T, T> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* k_s = reinterpret_cast<T*>(smem);                  // [32][D + 1]
  T* v_s = k_s + kSimtChunk * (p.D + 1);                // [32][Dv + 1]
  T* q_rows = v_s + kSimtChunk * (p.Dv + 1);            // [kSimtRows][D]
  T* do_rows = q_rows + kSimtRows * p.D;                // [kSimtRows][Dv]
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int m_tiles = (p.L + kSimtRows - 1) / kSimtRows;
  const int64_t bh = blockIdx.x / m_tiles;
  const int m0 = (m_tiles - 1 - static_cast<int>(blockIdx.x - bh * m_tiles)) * kSimtRows;
  const int row = m0 + warp;
  const bool row_valid = row < p.L;
  const int64_t at = bh * p.L + row;
  const T* q = head_rows(p.q, p.q_stride, bh, p.heads);
  const T* k = head_rows(p.k, p.k_stride, bh, p.heads, p.group);
  const T* v = head_rows(p.v, p.v_stride, bh, p.heads, p.group);
  T* q_row = q_rows + warp * p.D;
  T* do_row = do_rows + warp * p.Dv;
  for (int c = lane; c < p.D; c += kWarp) q_row[c] = row_valid ? q[row * p.q_stride.row + c] : T(0);
  const T* grad_out = head_rows(p.grad_out, p.grad_out_stride, bh, p.heads) + row * p.grad_out_stride.row;
  for (int c = lane; c < p.Dv; c += kWarp) do_row[c] = row_valid ? grad_out[c] : T(0);
  const int key_end = p.causal ? min(p.S, min(m0 + kSimtRows, p.L)) : p.S;
  const T scale = static_cast<T>(p.scale);
  // The chunk of keys from n0 staged (v only when wanted); each lane's score, -inf past the
  // keys this row sees.
  auto stage = [&](int n0, bool with_v) {
    __syncthreads();  // every warp is done with the previous chunk
    stage_chunk(k_s, k, p.k_stride.row, n0, p.S, p.D);
    if (with_v) stage_chunk(v_s, v, p.v_stride.row, n0, p.S, p.Dv);
    __syncthreads();
    const int j = n0 + lane;
    return row_valid && j < p.S && !(p.causal && j > row) ? dot_rows(q_row, k_s + lane * (p.D + 1), p.D) * scale
                                                            : T(-INFINITY);
  };
  const auto dp = [&] { return dot_rows(do_row, v_s + lane * (p.Dv + 1), p.Dv); };

  if constexpr (ROW_STATS) {
    T row_max = -INFINITY, row_sum = 0, delta = 0;
    for (int n0 = 0; n0 < key_end; n0 += kSimtChunk) {  // online max and sum
      const T score = stage(n0, false);
      const T new_max = max(row_max, warp_reduce<kWarp>(score, Max{}));
      if (new_max == -INFINITY) continue;  // every key so far masked (uniform over the warp)
      row_sum = row_sum * exp(row_max - new_max) + warp_reduce<kWarp>(exp(score - new_max), Plus{});
      row_max = new_max;
    }
    for (int n0 = 0; n0 < key_end; n0 += kSimtChunk) {
      const T score = stage(n0, true);
      delta += warp_reduce<kWarp>(score == -INFINITY ? T(0) : simt_prob(score, row_max, row_sum) * dp(), Plus{});
    }
    if (!row_valid || lane != 0) return;
    p.row_max[at] = row_max;
    p.row_sum[at] = row_sum;
    p.delta[at] = delta;
  } else {
    const T row_max = row_valid ? p.row_max[at] : T(0);
    const T row_sum = row_valid ? p.row_sum[at] : T(1);
    const T delta = row_valid ? p.delta[at] : T(0);
    T grad_q[kSimtCols] = {};
    for (int n0 = 0; n0 < key_end; n0 += kSimtChunk) {
      const T score = stage(n0, true);
      const T ds = score == -INFINITY ? T(0) : simt_prob(score, row_max, row_sum) * (dp() - delta);
      const int chunk = min(kSimtChunk, p.S - n0);
      for (int jj = 0; jj < chunk; ++jj) {
        const T dsj = __shfl_sync(kFullMask, ds, jj);
#pragma unroll
        for (int c = 0; c < kSimtCols; ++c) {
          if (lane + c * kWarp < p.D) grad_q[c] += dsj * k_s[jj * (p.D + 1) + lane + c * kWarp];
        }
      }
    }
    if (!row_valid) return;
#pragma unroll
    for (int c = 0; c < kSimtCols; ++c) {
      if (lane + c * kWarp < p.D)
        head_rows(p.grad_q, p.grad_q_stride, bh, p.heads)[row * p.grad_q_stride.row + lane + c * kWarp] = grad_q[c] * scale;
    }
  }
}

}  // namespace flash
}  // namespace cuda
}  // namespace normcore
