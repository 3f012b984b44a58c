// The kernels of scaled dot-product attention (contract: kernels/attention.h) over raw
// pointers and AttentionParams, so that a standalone program can test them. f16/bf16 run on
// tensor cores (mma.sync m16n8k16, fp32 accumulate) with head dims padded to 32, 64 or 128;
// f32 on register-tiled SIMT kernels (exact f32 FMA, no TF32), f64 on row-per-warp SIMT
// kernels (those two in flash_simt.cuh). No L x S matrix reaches device memory (online softmax forward,
// recomputed p backward), and every gradient is written once by one block: deterministic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/cuda/pairs.cuh"
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
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

using cuda::exp2_approx;
using cuda::pack2;

// ---------------------------------------------------------------- tensor-core tiles
// A tile of ROWS x HD elements in shared memory has rows of HD + kPad elements: the 16-byte
// pad puts the 8 rows one ldmatrix reads in 8 different bank groups.
constexpr int kPad = 8;

// Rows [0, rows) and columns [0, cols) of a tile from global memory (rows `stride` apart);
// the rest of the ROWS x HD tile is zero, so padded head dims and tail rows add nothing.
// Vectorized: 16-byte cp.async (the caller commits and waits); else plain loads and stores.
template <int ROWS, int HD, int THREADS, class T>
__device__ __forceinline__ void load_tile(T* tile, const T* src, int64_t stride, int rows, int cols, bool vectorized) {
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
                                           const float (&acc)[HD / 8][4], float factor_lo, float factor_hi, int lane) {
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
// 16 query rows a warp: O's 16 x 256 accumulators are 128 registers a thread.
template <>
struct ForwardConfig<256> : ForwardTiles<256, 4, 1, 64, false> {};

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
  const int warp_row = warp * 16 * MT;   // in the tile; block mt of the warp starts at warp_row + 16 mt
  const int row_lo = m0 + warp_row + g;  // accumulators [0], [1] of block mt: row_lo + 16 mt; [2], [3]: + 8
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
    load_tile<BN, HD, THREADS>(v_s, v + n0 * p.v_stride.row, p.v_stride.row, min(BN, p.S - n0), p.Dv, p.vectorized);
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
      load_tile<BN, HD, THREADS>(k_s, k + (n0 + BN) * p.k_stride.row, p.k_stride.row, min(BN, p.S - n0 - BN), p.D,
                                 p.vectorized);
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
__global__ void __launch_bounds__(kDeltaRowsPerBlock* kWarp) delta_kernel(const AttentionParams<T, C> p) {
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
__global__ void __launch_bounds__(Config::kThreads, Config::kMinBlocks)
    tc_backward_kv_kernel(const AttentionParams<T, float> p) {
  constexpr int HD = Config::kHeadDim, MT = Config::kMTiles, BM = Config::kBlockM, BN = Config::kBlockN;
  constexpr int THREADS = Config::kThreads, SP = HD + kPad;
  extern __shared__ __align__(16) unsigned char smem[];
  T* k_s = reinterpret_cast<T*>(smem);
  T* v_s = k_s + BN * SP;
  T* q_s = v_s + BN * SP;                                       // [2][BM][SP]
  T* do_s = q_s + 2 * BM * SP;                                  // [2][BM][SP]
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
    load_tile<BM, HD, THREADS>(q_s + buf * BM * SP, q + m0 * p.q_stride.row, p.q_stride.row, rows, p.D, p.vectorized);
    load_tile<BM, HD, THREADS>(do_s + buf * BM * SP, grad_out + m0 * p.grad_out_stride.row, p.grad_out_stride.row, rows,
                               p.Dv, p.vectorized);
    for (int i = threadIdx.x; i < BM; i += THREADS) {
      lse_s[buf * BM + i] = i < rows ? lse[m0 + i] * kLog2e : INFINITY;
      delta_s[buf * BM + i] = i < rows ? delta[m0 + i] : 0.0f;
    }
  };
  load_tile<BN, HD, THREADS>(k_s, head_rows(p.k, p.k_stride, bh, p.heads, p.group) + n0 * p.k_stride.row,
                             p.k_stride.row, min(BN, p.S - n0), p.D, p.vectorized);
  load_tile<BN, HD, THREADS>(v_s, head_rows(p.v, p.v_stride, bh, p.heads, p.group) + n0 * p.v_stride.row,
                             p.v_stride.row, min(BN, p.S - n0), p.Dv, p.vectorized);
  if (m_begin < m_tiles) stage(m_begin, 0);
  cp_async_commit();

  const float scale_log2 = static_cast<float>(p.scale) * kLog2e;
  const int warp_key = warp * 16 * MT;   // in the tile; block mt of the warp starts at warp_key + 16 mt
  const int key_lo = n0 + warp_key + g;  // accumulators [0], [1] of block mt: key_lo + 16 mt; [2], [3]: + 8
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
    load_tile<BN, HD, THREADS>(k_s + buf * BN * SP, k + n0 * p.k_stride.row, p.k_stride.row, keys, p.D, p.vectorized);
    load_tile<BN, HD, THREADS>(v_s + buf * BN * SP, v + n0 * p.v_stride.row, p.v_stride.row, keys, p.Dv, p.vectorized);
  };
  load_tile<BM, HD, THREADS>(q_s, head_rows(p.q, p.q_stride, bh, p.heads) + m0 * p.q_stride.row, p.q_stride.row, rows,
                             p.D, p.vectorized);
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
    store_rows<HD>(head_rows(p.grad_q, p.grad_q_stride, bh, p.heads), p.grad_q_stride.row, m0 + warp_row + mt * 16, p.L,
                   p.D, dq[mt], scale, scale, lane);
  }
}

}  // namespace flash
}  // namespace cuda
}  // namespace normcore
