// CUDA cached_attention (contract: kernels/attention.h): one query row per (batch row, q head)
// attending to a KV cache whose fill lives on the device, for decoding steps replayed by a
// CUDA graph. One block of kDecodeThreads per (b, h). The block writes this step's k and v into the
// caches (the first q head of each kv head does), then walks the visible keys in chunks of
// kChunk: each thread scores keys thread, thread + kDecodeThreads, ... of the chunk (a whole dot
// product per thread, q in shared memory), the chunk's max rescales the running sum and the
// output (the online softmax of flash attention), and warp w adds p_j v[j] for keys
// j = w (mod warps) with its lanes across v's columns. Position p itself is read from k and v,
// not the cache, so no block waits for another's write. Work: (p + 1) (D + Dv) reads a row,
// a few microseconds at GPT-2's sizes; the launch is what the step pays.
#include "kernels/cuda/attention/decode.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/reduction/combine.cuh"
#include "runtime/cuda/index_errors.h"
#include "runtime/cuda/runtime.h"

namespace normcore {
namespace cuda {
namespace {

constexpr int kDecodeThreads = 256;
constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr int kChunk = 1024;        // keys scored at a time (their probabilities in shared memory)
constexpr int kMaxColumns = 256;    // D and Dv at most this (8 columns a lane)
constexpr int kLaneColumns = kMaxColumns / 32;

struct Rows {
  int64_t batch, head, row;  // strides in elements; the last dim's is 1
};

template <class T>
struct CachedParams {
  const T* q;
  const T* k;
  const T* v;
  T* k_cache;
  T* v_cache;
  T* out;
  const int64_t* positions;
  Rows q_stride, k_stride, v_stride, k_cache_stride, v_cache_stride, out_stride;
  int heads, group, S, D, Dv;
  double scale;
  IndexErrorSlot bad_position;
};

template <class T, class C>
__global__ void __launch_bounds__(kDecodeThreads) cached_attention_kernel(CachedParams<T> p) {
  extern __shared__ unsigned char shared_bytes[];
  C* q_row = reinterpret_cast<C*>(shared_bytes);  // [D]
  C* probs = q_row + p.D;                         // [kChunk]
  C* partial = probs + kChunk;                    // [kDecodeWarps][Dv]
  const int b = blockIdx.x / p.heads, h = blockIdx.x % p.heads, kv = h / p.group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t position = p.positions[b];
  const T* k_new = p.k + b * p.k_stride.batch + kv * p.k_stride.head;
  const T* v_new = p.v + b * p.v_stride.batch + kv * p.v_stride.head;
  T* out = p.out + b * p.out_stride.batch + h * p.out_stride.head;
  if (position < 0 || position >= p.S) {
    if (h == 0 && threadIdx.x == 0) p.bad_position.record(position, p.S);
    for (int d = threadIdx.x; d < p.Dv; d += kDecodeThreads) out[d] = convert<T>(C(0));
    return;
  }
  const T* k_cache = p.k_cache + b * p.k_cache_stride.batch + kv * p.k_cache_stride.head;
  const T* v_cache = p.v_cache + b * p.v_cache_stride.batch + kv * p.v_cache_stride.head;
  if (h % p.group == 0) {
    T* k_slot = p.k_cache + b * p.k_cache_stride.batch + kv * p.k_cache_stride.head + position * p.k_cache_stride.row;
    T* v_slot = p.v_cache + b * p.v_cache_stride.batch + kv * p.v_cache_stride.head + position * p.v_cache_stride.row;
    for (int d = threadIdx.x; d < p.D; d += kDecodeThreads) k_slot[d] = k_new[d];
    for (int d = threadIdx.x; d < p.Dv; d += kDecodeThreads) v_slot[d] = v_new[d];
  }
  const T* q = p.q + b * p.q_stride.batch + h * p.q_stride.head;
  for (int d = threadIdx.x; d < p.D; d += kDecodeThreads) q_row[d] = convert<C>(q[d]) * C(p.scale);
  __syncthreads();

  C running_max = -INFINITY, running_sum = 0;
  C acc[kLaneColumns];
  for (int c = 0; c < kLaneColumns; ++c) acc[c] = 0;
  const int64_t keys = position + 1;
  for (int64_t start = 0; start < keys; start += kChunk) {
    const int count = static_cast<int>(keys - start < kChunk ? keys - start : kChunk);
    C chunk_max = -INFINITY;
    for (int j = threadIdx.x; j < count; j += kDecodeThreads) {
      const int64_t key = start + j;
      const T* row = key == position ? k_new : k_cache + key * p.k_cache_stride.row;
      C score = 0;
#pragma unroll 8
      for (int d = 0; d < p.D; ++d) score += q_row[d] * convert<C>(row[d]);
      probs[j] = score;
      chunk_max = max(chunk_max, score);
    }
    chunk_max = team_reduce<kDecodeThreads>(chunk_max, Max{});
    const C new_max = max(running_max, chunk_max);
    const C rescale = exp(running_max - new_max);  // 0 on the first chunk (running_max = -inf)
    C chunk_sum = 0;
    for (int j = threadIdx.x; j < count; j += kDecodeThreads) {
      const C e = exp(probs[j] - new_max);
      probs[j] = e;
      chunk_sum += e;
    }
    chunk_sum = team_reduce<kDecodeThreads>(chunk_sum, Plus{});  // its barriers publish probs
    running_sum = running_sum * rescale + chunk_sum;
    running_max = new_max;
    for (int c = 0; c < kLaneColumns; ++c) acc[c] *= rescale;
    for (int j = warp; j < count; j += kDecodeWarps) {
      const int64_t key = start + j;
      const T* row = key == position ? v_new : v_cache + key * p.v_cache_stride.row;
      const C pj = probs[j];
#pragma unroll
      for (int c = 0; c < kLaneColumns; ++c) {
        const int d = lane + 32 * c;
        if (d < p.Dv) acc[c] += pj * convert<C>(row[d]);
      }
    }
    __syncthreads();  // probs is rewritten by the next chunk
  }
  for (int c = 0; c < kLaneColumns; ++c) {
    const int d = lane + 32 * c;
    if (d < p.Dv) partial[warp * p.Dv + d] = acc[c];
  }
  __syncthreads();
  for (int d = threadIdx.x; d < p.Dv; d += kDecodeThreads) {
    C sum = 0;
    for (int w = 0; w < kDecodeWarps; ++w) sum += partial[w * p.Dv + d];
    out[d] = convert<T>(sum / running_sum);
  }
}

Rows rows_of(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

}  // namespace

void cached_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache,
                      const Tensor& positions, const kernels::AttentionShape& shape, double scale,
                      const Tensor& out) {
  const char* op = "cached_attention";
  NC_CHECK(shape.D <= kMaxColumns && shape.Dv <= kMaxColumns, ValueError, op, ": head dims up to ", kMaxColumns,
           " run on CUDA, got D = ", shape.D, " and Dv = ", shape.Dv);
  const Launcher launch(op, q);
  const int64_t blocks = shape.batch * shape.heads;
  if (blocks == 0) return;
  const IndexErrorSlot bad = index_error_slot(launch.device(), "cached_attention: position ",
                                              " is out of range for a KV cache of ", " positions");
  visit_float(q.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const CachedParams<T> p{data_as<const T>(q),
                            data_as<const T>(k),
                            data_as<const T>(v),
                            data_as<T>(k_cache),
                            data_as<T>(v_cache),
                            data_as<T>(out),
                            data_as<const int64_t>(positions),
                            rows_of(q),
                            rows_of(k),
                            rows_of(v),
                            rows_of(k_cache),
                            rows_of(v_cache),
                            rows_of(out),
                            static_cast<int>(shape.heads),
                            static_cast<int>(shape.heads / shape.kv_heads),
                            static_cast<int>(shape.S),
                            static_cast<int>(shape.D),
                            static_cast<int>(shape.Dv),
                            scale,
                            bad};
    const size_t smem = sizeof(C) * static_cast<size_t>(shape.D + kChunk + kDecodeWarps * shape.Dv);
    launch.allow_shared_memory(cached_attention_kernel<T, C>, smem);
    launch(cached_attention_kernel<T, C>, static_cast<unsigned>(blocks), kDecodeThreads, smem, p);
  });
  if (launch_blocking()) report_index_errors(launch.device(), true);
}

}  // namespace cuda
}  // namespace normcore
