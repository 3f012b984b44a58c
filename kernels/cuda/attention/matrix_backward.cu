// The attention backward as matrix products (matrix_backward.h), over whole score matrices
// rather than tiles in registers. For a block of query rows of a few q heads at a time:
//   S = Q K^T and dP = dO V^T           cuBLAS, f16/bf16 operands, f32 results
//   P = exp(scale S - lse), dS = P (dP - delta)   one pass, P and dS rounded to T (0 above
//                                       the diagonal when causal), as the fused kernels round them
//   grad_v = P^T dO, grad_k = scale dS^T Q, grad_q = scale dS K   cuBLAS, f32 accumulation
// The four score-sized matrices take 12 bytes a score; a block holds at most kWorkspaceBytes
// of them, for as many heads as fit (within one k/v head's group under grouped-query
// attention; several, since products of one head's block are too small to fill the GPU
// between launches): whole heads when one fits, else blocks of query rows, whose grad_k and
// grad_v are summed in f32 and rounded once at the end. Causal, a head of 2^22 scores or more is cut
// into at least four row blocks, each multiplying only the keys up to its last row (5/8 of
// the products of the whole square). Every sum runs in cuBLAS's fixed order: the results are deterministic.
#include "kernels/cuda/attention/matrix_backward.h"

#include <algorithm>

#include "runtime/cuda/runtime.h"

namespace normcore {
namespace cuda {
namespace {

using flash::AttentionParams;

constexpr size_t kWorkspaceBytes = size_t{512} << 20;
constexpr int kRowThreads = 256;

template <class T>
constexpr cudaDataType_t data_type() {
  return std::is_same_v<T, __half> ? CUDA_R_16F : CUDA_R_16BF;
}

// A matrix operand of a strided batch of products, row-major in memory: rows ld apart,
// matrices stride apart; transposed: the product reads its transpose.
struct Operand {
  const void* ptr;
  cudaDataType_t type;
  int64_t ld, stride;
  bool transposed = false;
};

// c[M x N] = alpha op(a) op(b) + beta c for `batch` matrices, row-major (c's rows ldc apart,
// matrices stride_c apart). cuBLAS is column-major: a row-major matrix read column-major is
// its transpose, so c^T = op(b)^T op(a)^T is computed.
void product(const Launcher& launch, int64_t M, int64_t N, int64_t K, float alpha, const Operand& a, const Operand& b,
             float beta, void* c, cudaDataType_t c_type, int64_t ldc, int64_t stride_c, int64_t batch) {
  NC_CUDA_CHECK(cublasGemmStridedBatchedEx_64(cublas_handle(launch.device()), b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N,
                                              a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, b.ptr, b.type,
                                              b.ld, b.stride, a.ptr, a.type, a.ld, a.stride, &beta, c, c_type, ldc,
                                              stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// The matrices of a block: `heads` heads (q heads bh0, bh0 + 1, ...) of `rows` query rows
// from l0, each row `keys` scores wide (contiguous, a head's rows x keys after another's).
struct Block {
  int64_t bh0;
  int heads, l0, rows, keys;
};

// P and dS from S and dP, a block of the rows per block (grid-stride over heads x rows).
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    probabilities_kernel(const float* scores, const float* dp, T* prob, T* ds, const float* lse, const float* delta,
                         Block blk, int L, float scale_log2, bool causal) {
  const int64_t count = int64_t{blk.heads} * blk.rows;
  for (int64_t hr = blockIdx.x; hr < count; hr += gridDim.x) {
    const int64_t head = hr / blk.rows;
    const int i = blk.l0 + static_cast<int>(hr - head * blk.rows);
    const int64_t stat = (blk.bh0 + head) * L + i;
    const float lse2 = lse[stat] * flash::kLog2e, row_delta = delta[stat];
    const int visible = causal ? min(blk.keys, i + 1) : blk.keys;
    const int64_t at = hr * blk.keys;
    for (int j = threadIdx.x; j < blk.keys; j += kRowThreads) {
      const float pr = j < visible ? exp2f(fmaf(scores[at + j], scale_log2, -lse2)) : 0.0f;
      prob[at + j] = static_cast<T>(pr);
      ds[at + j] = static_cast<T>(pr * (dp[at + j] - row_delta));
    }
  }
}

// The `heads` heads of dst (T, rows ld apart, heads head_stride apart) from src's, `rows`
// rows of `width` f32 a head (contiguous).
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    round_rows_kernel(const float* src, T* dst, int64_t ld, int64_t head_stride, int heads, int rows, int width) {
  for (int64_t hr = blockIdx.x; hr < int64_t{heads} * rows; hr += gridDim.x) {
    const int64_t head = hr / rows, r = hr - head * rows;
    T* row = dst + head * head_stride + r * ld;
    for (int c = threadIdx.x; c < width; c += kRowThreads) row[c] = static_cast<T>(src[hr * width + c]);
  }
}

unsigned row_grid(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, 65535)); }

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

template <class T>
void run(const Launcher& launch, const AttentionParams<T, float>& p) {
  const int64_t L = p.L, S = p.S, per_row = 12 * S;
  const int group = p.group;
  const int64_t budget = static_cast<int64_t>(kWorkspaceBytes);
  int64_t rows = std::clamp<int64_t>(budget / per_row, 1, L);
  // Causal row blocks pay where a head's square is large; on small ones the launches would
  // cost more than the masked half of the products.
  if (p.causal && L * S >= (int64_t{1} << 22)) rows = std::min(rows, round_up((L + 3) / 4, 64));
  const bool blocked = rows < L;
  // Heads a block: as many as fit, in chunks of equal size.
  const int64_t heads_max = group > 1 ? group : p.heads;
  int64_t chunk = std::clamp<int64_t>(budget / (per_row * rows), 1, heads_max);
  const int64_t pieces = (heads_max + chunk - 1) / chunk;
  chunk = (heads_max + pieces - 1) / pieces;
  const int64_t elems = round_up(chunk * rows * S, 64);  // of each matrix; 16-byte aligned offsets
  const size_t sum_bytes = blocked ? 4 * static_cast<size_t>(chunk * S) * (p.D + p.Dv) : 0;
  const DeviceBuffer work = launch.buffer(12 * static_cast<size_t>(elems) + sum_bytes);
  float* scores = work.as<float>();
  float* dp = scores + elems;
  T* prob = reinterpret_cast<T*>(dp + elems);
  T* ds = prob + elems;
  float* sum_k = reinterpret_cast<float*>(ds + elems);  // blocked: grad_k's and grad_v's f32 sums
  float* sum_v = sum_k + chunk * S * p.D;
  const cudaDataType_t t_type = data_type<T>();
  const float scale = static_cast<float>(p.scale);
  const auto& qs = p.q_stride;
  const auto& ks = p.k_stride;
  const auto& vs = p.v_stride;
  const auto& dos = p.grad_out_stride;
  const auto& gqs = p.grad_q_stride;
  const auto& gks = p.grad_k_stride;
  const auto& gvs = p.grad_v_stride;

  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h0 = 0; h0 < p.heads;) {
      // Within one k/v head's group the k and v operands repeat (stride 0).
      const int64_t n =
          group > 1 ? std::min<int64_t>(chunk, group - h0 % group) : std::min<int64_t>(chunk, p.heads - h0);
      const int64_t kv = h0 / group, kv_stride = group > 1 ? 0 : 1;
      const T* k = p.k + b * ks.batch + kv * ks.head;
      const T* v = p.v + b * vs.batch + kv * vs.head;
      const Operand k_op{k, t_type, ks.row, kv_stride * ks.head}, v_op{v, t_type, vs.row, kv_stride * vs.head};
      T* grad_k = p.grad_k + b * gks.batch + h0 * gks.head;
      T* grad_v = p.grad_v + b * gvs.batch + h0 * gvs.head;
      if (blocked) NC_CUDA_CHECK(cudaMemsetAsync(sum_k, 0, sum_bytes, launch.stream()));
      for (int64_t l0 = 0; l0 < L; l0 += rows) {
        const Block blk{b * p.heads + h0, static_cast<int>(n), static_cast<int>(l0),
                        static_cast<int>(std::min(rows, L - l0)),
                        static_cast<int>(blocked && p.causal ? std::min(S, l0 + std::min(rows, L - l0)) : S)};
        const int64_t m = blk.rows, keys = blk.keys, square = m * keys;
        const Operand q{p.q + b * qs.batch + h0 * qs.head + l0 * qs.row, t_type, qs.row, qs.head};
        const Operand grad_out{p.grad_out + b * dos.batch + h0 * dos.head + l0 * dos.row, t_type, dos.row, dos.head};
        product(launch, m, keys, p.D, 1.0f, q, {k_op.ptr, t_type, k_op.ld, k_op.stride, true}, 0.0f, scores, CUDA_R_32F,
                keys, square, n);
        product(launch, m, keys, p.Dv, 1.0f, grad_out, {v_op.ptr, t_type, v_op.ld, v_op.stride, true}, 0.0f, dp,
                CUDA_R_32F, keys, square, n);
        launch(probabilities_kernel<T>, row_grid(n * m), kRowThreads, 0, scores, dp, prob, ds, p.lse, p.delta, blk, p.L,
               scale * flash::kLog2e, p.causal);
        const Operand prob_t{prob, t_type, keys, square, true}, ds_t{ds, t_type, keys, square, true};
        if (blocked) {  // sums over the row blocks in f32
          product(launch, keys, p.Dv, m, 1.0f, prob_t, grad_out, 1.0f, sum_v, CUDA_R_32F, p.Dv, S * p.Dv, n);
          product(launch, keys, p.D, m, scale, ds_t, q, 1.0f, sum_k, CUDA_R_32F, p.D, S * p.D, n);
        } else {
          product(launch, keys, p.Dv, m, 1.0f, prob_t, grad_out, 0.0f, grad_v, t_type, gvs.row, gvs.head, n);
          product(launch, keys, p.D, m, scale, ds_t, q, 0.0f, grad_k, t_type, gks.row, gks.head, n);
        }
        T* grad_q = p.grad_q + b * gqs.batch + h0 * gqs.head + l0 * gqs.row;
        product(launch, m, p.D, keys, scale, {ds, t_type, keys, square}, k_op, 0.0f, grad_q, t_type, gqs.row, gqs.head,
                n);
      }
      if (blocked) {
        const int heads = static_cast<int>(n);
        launch(round_rows_kernel<T>, row_grid(n * S), kRowThreads, 0, sum_k, grad_k, gks.row, gks.head, heads, p.S,
               p.D);
        launch(round_rows_kernel<T>, row_grid(n * S), kRowThreads, 0, sum_v, grad_v, gvs.row, gvs.head, heads, p.S,
               p.Dv);
      }
      h0 += n;
    }
  }
}

}  // namespace

template <class T>
bool matrix_backward_takes(const AttentionParams<T, float>& p) {
  if (p.L <= 0 || p.S <= 0 || p.batch <= 0 || p.heads <= 0) return false;
  const int64_t widths[] = {p.D, p.D, p.Dv, p.Dv, p.D, p.D, p.Dv};
  const int64_t lds[] = {p.q_stride.row,      p.k_stride.row,      p.v_stride.row,     p.grad_out_stride.row,
                         p.grad_q_stride.row, p.grad_k_stride.row, p.grad_v_stride.row};
  for (int i = 0; i < 7; ++i) {
    if (lds[i] < widths[i]) return false;
  }
  return true;
}
template bool matrix_backward_takes(const AttentionParams<__half, float>&);
template bool matrix_backward_takes(const AttentionParams<__nv_bfloat16, float>&);

void matrix_backward(const Launcher& launch, const AttentionParams<__half, float>& p) { run(launch, p); }
void matrix_backward(const Launcher& launch, const AttentionParams<__nv_bfloat16, float>& p) { run(launch, p); }

}  // namespace cuda
}  // namespace normcore
