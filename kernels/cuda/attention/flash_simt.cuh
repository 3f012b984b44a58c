// The SIMT attention kernels (flash.cuh holds the parameters, the shared helpers and the
// tensor-core kernels): register-tiled f32 kernels of the tensor-core algorithm, and
// row-per-warp f64 kernels for tests and gradchecks. attention.cu picks among them.
#pragma once

#include "kernels/cuda/attention/flash.cuh"

namespace normcore {
namespace cuda {
namespace flash {

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
constexpr int kTiledRows = 64;                             // rows of every tile
constexpr int kTiledThreads = 256;                         // 16 x 16
constexpr int kTiledPad = 4;                               // floats; see tiled_dot_rows
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
    for (int r = 0; r < 4; ++r)
      sv[r] = *reinterpret_cast<const float4*>(scores + (ty + 16 * r) * kTiledScoreStride + j);
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
__global__ void __launch_bounds__(kTiledThreads, kTiledMinBlocks)
    tiled_forward_kernel(const AttentionParams<float, float> p) {
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
  tiled_store<HD>(head_rows(p.out, p.out_stride, bh, p.heads) + m0 * p.out_stride.row, p.out_stride.row, rows, p.Dv, o,
                  1.0f, ty, tx);
}

// grad_k and grad_v of a tile of 64 keys (rows ty + 16 r of the score tiles are keys, columns
// queries), over the query tiles that see them: P^T, dP^T = V dO^T, dS^T = P^T (dP^T - delta),
// dV += P^T dO, dK += dS^T Q.
template <int HD>
__global__ void __launch_bounds__(kTiledThreads, kTiledMinBlocks)
    tiled_backward_kv_kernel(const AttentionParams<float, float> p) {
  constexpr int SP = kTiledStride<HD>;
  extern __shared__ __align__(16) unsigned char smem[];
  float* k_s = reinterpret_cast<float*>(smem);
  float* v_s = k_s + kTiledRows * SP;
  float* q_s = v_s + kTiledRows * SP;
  float* do_s = q_s + kTiledRows * SP;
  float* pt_s = do_s + kTiledRows * SP;  // [64][kTiledScoreStride]
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
  tiled_load<HD>(k_s, head_rows(p.k, p.k_stride, bh, p.heads, p.group) + n0 * p.k_stride.row, p.k_stride.row, keys,
                 p.D);
  tiled_load<HD>(v_s, head_rows(p.v, p.v_stride, bh, p.heads, p.group) + n0 * p.v_stride.row, p.v_stride.row, keys,
                 p.Dv);

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
        const float prob = masked && (i >= p.L || (p.causal && j > i))
                               ? 0.0f
                               : exp2_approx(s[r][c] * scale_log2 - lse_s[col] * kLog2e);
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
__global__ void __launch_bounds__(kTiledThreads, kTiledMinBlocks)
    tiled_backward_q_kernel(const AttentionParams<float, float> p) {
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

// ---------------------------------------------------------------- row-per-warp SIMT kernels (f64; any dtype at head dims past 128)
// f64 runs here: the 64-row tiles of the kernels above would not fit shared memory in f64 at
// HD = 128; so do f32 at head dims past 128, and the f16/bf16 backward there (C = float). One warp per row (a query row forward, for the row statistics and for grad_q, a
// key row for grad_k/grad_v), kSimtRows rows per block; the other side streams through shared
// memory in chunks of 32 rows, one per lane for the dot products, then every lane sums over
// the chunk for its kSimtCols head-dim columns (lane + 32 c). T is the tensors' dtype, C the
// one everything is staged, summed and kept in (T itself for f64 and f32, float for f16/bf16). The
// backward starts with the rows' statistics, which take delta as sum_j p_j dp_j with the
// p_j and dp_j the gradient kernels recompute bit for bit, so that dp_j - delta cancels in
// consistently rounded terms (rowsum(grad_out * out) would not, with a saturated softmax).
constexpr int kSimtRows = 8;
constexpr int kSimtChunk = kWarp;
constexpr int kSimtCols = 8;  // 8 * 32 = 256 columns, the largest head dim
constexpr int kSimtThreads = kSimtRows * kWarp;

// Shared memory of the SIMT kernels: two chunks (rows of width + 1, so that lanes reading
// their own rows hit distinct banks) and kSimtRows rows of each side's own vectors.
template <class C>
constexpr size_t simt_shared_bytes(int D, int Dv) {
  return sizeof(C) * (size_t{kSimtChunk} * (D + 1 + Dv + 1) + size_t{kSimtRows} * (D + Dv) + 3 * kSimtChunk);
}

// rows [row0, row0 + kSimtChunk) of src into tile (rows of width + 1), zero past `rows`.
template <class C, class T>
__device__ __forceinline__ void stage_chunk(C* tile, const T* src, int64_t stride, int row0, int rows, int width) {
  for (int idx = threadIdx.x; idx < kSimtChunk * width; idx += kSimtThreads) {
    const int r = idx / width, c = idx - r * width;
    tile[r * (width + 1) + c] = row0 + r < rows ? static_cast<C>(src[(row0 + r) * stride + c]) : C(0);
  }
}

template <class C>
__device__ __forceinline__ C dot_rows(const C* a, const C* b, int n) {
  C sum = 0;
  for (int c = 0; c < n; ++c) sum += a[c] * b[c];
  return sum;
}

template <class T, class C>
__global__ void __launch_bounds__(kSimtThreads) simt_forward_kernel(const AttentionParams<T, C> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  C* k_s = reinterpret_cast<C*>(smem);     // [32][D + 1]
  C* v_s = k_s + kSimtChunk * (p.D + 1);   // [32][Dv + 1]
  C* q_s = v_s + kSimtChunk * (p.Dv + 1);  // [kSimtRows][D]
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int m_tiles = (p.L + kSimtRows - 1) / kSimtRows;
  const int64_t bh = blockIdx.x / m_tiles;
  const int m0 = (m_tiles - 1 - static_cast<int>(blockIdx.x - bh * m_tiles)) * kSimtRows;
  const int row = m0 + warp;
  const bool row_valid = row < p.L;
  const T* q = head_rows(p.q, p.q_stride, bh, p.heads);
  const T* k = head_rows(p.k, p.k_stride, bh, p.heads, p.group);
  const T* v = head_rows(p.v, p.v_stride, bh, p.heads, p.group);
  C* q_row = q_s + warp * p.D;
  for (int c = lane; c < p.D; c += kWarp) q_row[c] = row_valid ? static_cast<C>(q[row * p.q_stride.row + c]) : C(0);
  const int key_end = p.causal ? min(p.S, min(m0 + kSimtRows, p.L)) : p.S;
  const C scale = static_cast<C>(p.scale);

  C row_max = -INFINITY, row_sum = 0, acc[kSimtCols] = {};
  for (int n0 = 0; n0 < key_end; n0 += kSimtChunk) {
    __syncthreads();  // every warp is done with the previous chunk
    stage_chunk(k_s, k, p.k_stride.row, n0, p.S, p.D);
    stage_chunk(v_s, v, p.v_stride.row, n0, p.S, p.Dv);
    __syncthreads();
    const int j = n0 + lane;
    C score = -INFINITY;
    if (row_valid && j < p.S && !(p.causal && j > row)) score = dot_rows(q_row, k_s + lane * (p.D + 1), p.D) * scale;
    const C new_max = max(row_max, warp_reduce<kWarp>(score, Max{}));
    if (new_max == -INFINITY) continue;  // every key so far masked (uniform over the warp)
    const C alpha = exp(row_max - new_max);
    const C prob = exp(score - new_max);
    row_max = new_max;
    row_sum = row_sum * alpha + warp_reduce<kWarp>(prob, Plus{});
    const int chunk = min(kSimtChunk, p.S - n0);
#pragma unroll
    for (int c = 0; c < kSimtCols; ++c) acc[c] *= alpha;
    for (int jj = 0; jj < chunk; ++jj) {
      const C pj = __shfl_sync(kFullMask, prob, jj);
#pragma unroll
      for (int c = 0; c < kSimtCols; ++c) {
        if (lane + c * kWarp < p.Dv) acc[c] += pj * v_s[jj * (p.Dv + 1) + lane + c * kWarp];
      }
    }
  }
  if (!row_valid) return;
  const C inv = row_sum > 0 ? C(1) / row_sum : C(0);
  T* out = head_rows(p.out, p.out_stride, bh, p.heads) + row * p.out_stride.row;
#pragma unroll
  for (int c = 0; c < kSimtCols; ++c) {
    if (lane + c * kWarp < p.Dv) out[lane + c * kWarp] = static_cast<T>(acc[c] * inv);
  }
  if (lane == 0) p.lse[bh * p.L + row] = row_sum > 0 ? row_max + log(row_sum) : C(-INFINITY);
}

// p(score) of the row-per-warp backward: exp(score - row_max) / row_sum.
template <class C>
__device__ __forceinline__ C simt_prob(C score, C row_max, C row_sum) {
  return exp(score - row_max) / row_sum;
}

template <class T, class C>
__global__ void __launch_bounds__(kSimtThreads) simt_backward_kv_kernel(const AttentionParams<T, C> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  C* q_s = reinterpret_cast<C*>(smem);         // [32][D + 1]
  C* do_s = q_s + kSimtChunk * (p.D + 1);      // [32][Dv + 1]
  C* k_rows = do_s + kSimtChunk * (p.Dv + 1);  // [kSimtRows][D]
  C* v_rows = k_rows + kSimtRows * p.D;        // [kSimtRows][Dv]
  C* max_s = v_rows + kSimtRows * p.Dv;        // [32]
  C* sum_s = max_s + kSimtChunk;               // [32]
  C* delta_s = sum_s + kSimtChunk;             // [32]
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
  C* k_row = k_rows + warp * p.D;
  C* v_row = v_rows + warp * p.Dv;
  for (int c = lane; c < p.D; c += kWarp) k_row[c] = key_valid ? static_cast<C>(k[key * p.k_stride.row + c]) : C(0);
  for (int c = lane; c < p.Dv; c += kWarp) v_row[c] = key_valid ? static_cast<C>(v[key * p.v_stride.row + c]) : C(0);
  const C scale = static_cast<C>(p.scale);

  C grad_k[kSimtCols] = {}, grad_v[kSimtCols] = {};
  for (int m0 = p.causal ? n0 / kSimtChunk * kSimtChunk : 0; m0 < p.L; m0 += kSimtChunk) {
    __syncthreads();
    stage_chunk(q_s, q, p.q_stride.row, m0, p.L, p.D);
    stage_chunk(do_s, grad_out, p.grad_out_stride.row, m0, p.L, p.Dv);
    for (int r = threadIdx.x; r < kSimtChunk; r += kSimtThreads) {
      const bool in = m0 + r < p.L;
      max_s[r] = in ? p.row_max[bh * p.L + m0 + r] : C(0);
      sum_s[r] = in ? p.row_sum[bh * p.L + m0 + r] : C(1);
      delta_s[r] = in ? p.delta[bh * p.L + m0 + r] : C(0);
    }
    __syncthreads();
    const int i = m0 + lane;
    C prob = 0, ds = 0;
    if (key_valid && i < p.L && !(p.causal && key > i)) {
      prob = simt_prob(dot_rows(q_s + lane * (p.D + 1), k_row, p.D) * scale, max_s[lane], sum_s[lane]);
      ds = prob * (dot_rows(do_s + lane * (p.Dv + 1), v_row, p.Dv) - delta_s[lane]);
    }
    const int chunk = min(kSimtChunk, p.L - m0);
    for (int ii = 0; ii < chunk; ++ii) {
      const C pi = __shfl_sync(kFullMask, prob, ii), dsi = __shfl_sync(kFullMask, ds, ii);
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
    if (col < p.D)
      head_rows(p.grad_k, p.grad_k_stride, bh, p.heads)[key * p.grad_k_stride.row + col] =
          static_cast<T>(grad_k[c] * scale);
    if (col < p.Dv)
      head_rows(p.grad_v, p.grad_v_stride, bh, p.heads)[key * p.grad_v_stride.row + col] = static_cast<T>(grad_v[c]);
  }
}

// One warp per query row. ROW_STATS: the row's row_max, row_sum (0 with no key) and delta =
// sum_j p_j dp_j, in two passes over the keys (the statistics, then delta with the final
// ones), before the gradient kernels; else grad_q.
template <class T, class C, bool ROW_STATS>
__global__ void __launch_bounds__(kSimtThreads) simt_query_rows_kernel(const AttentionParams<T, C> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  C* k_s = reinterpret_cast<C*>(smem);        // [32][D + 1]
  C* v_s = k_s + kSimtChunk * (p.D + 1);      // [32][Dv + 1]
  C* q_rows = v_s + kSimtChunk * (p.Dv + 1);  // [kSimtRows][D]
  C* do_rows = q_rows + kSimtRows * p.D;      // [kSimtRows][Dv]
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
  C* q_row = q_rows + warp * p.D;
  C* do_row = do_rows + warp * p.Dv;
  for (int c = lane; c < p.D; c += kWarp) q_row[c] = row_valid ? static_cast<C>(q[row * p.q_stride.row + c]) : C(0);
  const T* grad_out = head_rows(p.grad_out, p.grad_out_stride, bh, p.heads) + row * p.grad_out_stride.row;
  for (int c = lane; c < p.Dv; c += kWarp) do_row[c] = row_valid ? static_cast<C>(grad_out[c]) : C(0);
  const int key_end = p.causal ? min(p.S, min(m0 + kSimtRows, p.L)) : p.S;
  const C scale = static_cast<C>(p.scale);
  // The chunk of keys from n0 staged (v only when wanted); each lane's score, -inf past the
  // keys this row sees.
  auto stage = [&](int n0, bool with_v) {
    __syncthreads();  // every warp is done with the previous chunk
    stage_chunk(k_s, k, p.k_stride.row, n0, p.S, p.D);
    if (with_v) stage_chunk(v_s, v, p.v_stride.row, n0, p.S, p.Dv);
    __syncthreads();
    const int j = n0 + lane;
    return row_valid && j < p.S && !(p.causal && j > row) ? dot_rows(q_row, k_s + lane * (p.D + 1), p.D) * scale
                                                          : C(-INFINITY);
  };
  const auto dp = [&] { return dot_rows(do_row, v_s + lane * (p.Dv + 1), p.Dv); };

  if constexpr (ROW_STATS) {
    C row_max = -INFINITY, row_sum = 0, delta = 0;
    for (int n0 = 0; n0 < key_end; n0 += kSimtChunk) {  // online max and sum
      const C score = stage(n0, false);
      const C new_max = max(row_max, warp_reduce<kWarp>(score, Max{}));
      if (new_max == -INFINITY) continue;  // every key so far masked (uniform over the warp)
      row_sum = row_sum * exp(row_max - new_max) + warp_reduce<kWarp>(exp(score - new_max), Plus{});
      row_max = new_max;
    }
    for (int n0 = 0; n0 < key_end; n0 += kSimtChunk) {
      const C score = stage(n0, true);
      delta += warp_reduce<kWarp>(score == -INFINITY ? C(0) : simt_prob(score, row_max, row_sum) * dp(), Plus{});
    }
    if (!row_valid || lane != 0) return;
    p.row_max[at] = row_max;
    p.row_sum[at] = row_sum;
    p.delta[at] = delta;
  } else {
    const C row_max = row_valid ? p.row_max[at] : C(0);
    const C row_sum = row_valid ? p.row_sum[at] : C(1);
    const C delta = row_valid ? p.delta[at] : C(0);
    C grad_q[kSimtCols] = {};
    for (int n0 = 0; n0 < key_end; n0 += kSimtChunk) {
      const C score = stage(n0, true);
      const C ds = score == -INFINITY ? C(0) : simt_prob(score, row_max, row_sum) * (dp() - delta);
      const int chunk = min(kSimtChunk, p.S - n0);
      for (int jj = 0; jj < chunk; ++jj) {
        const C dsj = __shfl_sync(kFullMask, ds, jj);
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
        head_rows(p.grad_q, p.grad_q_stride, bh, p.heads)[row * p.grad_q_stride.row + lane + c * kWarp] =
            static_cast<T>(grad_q[c] * scale);
    }
  }
}

}  // namespace flash
}  // namespace cuda
}  // namespace normcore
