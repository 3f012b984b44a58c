// The Hopper attention backward's passes over rows (attention_backward.cu): delta before the
// key kernel, the fast form's grad_q after it. Included by attention_backward.cu alone, inside
// its anonymous namespace.
#pragma once

// ---------------------------------------------------------------- row passes
// The passes over rows of HD columns around the key kernel: a thread per 8 columns, rows of
// 16 bytes (the Hopper kernels take 16-byte aligned rows of out and grad_out), grids sized to
// the work with one division per thread.
// delta[row] = dot(grad_out[row], out[row]) in f32 (the row's HD / 8 threads are adjacent
// lanes), and in the fast form (accumulator not null) the row's grad_q accumulator zeroed.
template <class T, int HD>
__global__ void delta_rows(const AttentionParams<T, float> p, float* accumulator) {
  constexpr int kChunks = HD / 8;
  const int64_t rows = int64_t{p.batch} * p.heads * p.L;
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t row = i / kChunks;
  const int chunk = static_cast<int>(i - row * kChunks);
  float sum = 0.0f;
  if (row < rows) {
    const int64_t bh = row / p.L, l = row - bh * p.L;
    const uint4 a = *reinterpret_cast<const uint4*>(flash::head_rows(p.grad_out, p.grad_out_stride, bh, p.heads) +
                                                    l * p.grad_out_stride.row + 8 * chunk);
    const uint4 b = *reinterpret_cast<const uint4*>(flash::head_rows(p.out, p.out_stride, bh, p.heads) +
                                                    l * p.out_stride.row + 8 * chunk);
    const uint32_t av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 x = unpack2<T>(av[j]), y = unpack2<T>(bv[j]);
      sum = fmaf(x.x, y.x, fmaf(x.y, y.y, sum));
    }
    if (accumulator != nullptr) {
      float4* zero = reinterpret_cast<float4*>(accumulator + row * HD + 8 * chunk);
      zero[0] = zero[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
#pragma unroll
  for (int offset = kChunks / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (row < rows && chunk == 0) p.delta[row] = sum;
}

// grad_q = scale * the fast form's accumulator, in grad_q's layout (WIDE: 16-byte stores;
// otherwise four 4-byte ones).
template <class T, int HD, bool WIDE>
__global__ void grad_q_rows(const float* accumulator, const AttentionParams<T, float> p) {
  constexpr int kChunks = HD / 8;
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t row = i / kChunks;
  if (row >= int64_t{p.batch} * p.heads * p.L) return;
  const int chunk = static_cast<int>(i - row * kChunks);
  const int64_t bh = row / p.L;
  const float4* x = reinterpret_cast<const float4*>(accumulator + row * HD + 8 * chunk);
  const float4 a = x[0], b = x[1];
  const float scale = static_cast<float>(p.scale);
  const uint32_t v[4] = {flash::pack2<T>(a.x * scale, a.y * scale), flash::pack2<T>(a.z * scale, a.w * scale),
                         flash::pack2<T>(b.x * scale, b.y * scale), flash::pack2<T>(b.z * scale, b.w * scale)};
  T* out =
      flash::head_rows(p.grad_q, p.grad_q_stride, bh, p.heads) + (row - bh * p.L) * p.grad_q_stride.row + 8 * chunk;
  if constexpr (WIDE) {
    *reinterpret_cast<uint4*>(out) = make_uint4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) reinterpret_cast<uint32_t*>(out)[j] = v[j];
  }
}
