// The row kernels of the fused ops (kernels/fused.h): cross_entropy_rows (a generic form and
// a 16-bit one) and softmax_rows, with the running (max, sum of exp) pairs they share.
// Included by fused.cu alone, inside its anonymous namespace.
#pragma once

// ---------------------------------------------------------------- cross-entropy rows
// One block per row. Each thread keeps a running (max, sum of exp(x - max)) over its
// elements, 16-byte vectors where the row allows, rescaling the sum at most once a vector;
// the block combines them in a fixed order into the row's log-sum-exp; a second pass over
// the row (from L2 when it is still there) writes the gradient over the logits. f32 math
// takes the hardware exponential (__expf, a few ulp), f64 exp.
template <class C>
struct MaxSum {
  C max, sum;
};
template <class C>
__device__ __forceinline__ MaxSum<C> shfl_xor(const MaxSum<C>& a, int mask) {
  return {cuda::shfl_xor(a.max, mask), cuda::shfl_xor(a.sum, mask)};
}
__device__ __forceinline__ float fast_exp(float x) { return __expf(x); }
__device__ __forceinline__ double fast_exp(double x) { return exp(x); }
// The pair of the union of two element sets; a NaN element makes the sum NaN, and a set of
// -inf alone (or none) is (-inf, 0), (-inf, NaN) with a NaN.
template <class C>
__device__ __forceinline__ MaxSum<C> merge_max_sum(const MaxSum<C>& a, const MaxSum<C>& b) {
  const C m = a.max > b.max ? a.max : b.max;
  if (m == -std::numeric_limits<C>::infinity()) return {m, a.sum + b.sum};
  return {m, a.sum * fast_exp(a.max - m) + b.sum * fast_exp(b.max - m)};
}

// r with the elements of x (at first, first + 1, ...) below limit merged in: the vector's max
// (a NaN is left out here and makes the sum NaN), then one rescale of the running sum at most.
template <class C, class T, int V, class Exp>
__device__ __forceinline__ MaxSum<C> merge_vector(const MaxSum<C>& r, const Vec<T, V>& x, int64_t first, int64_t limit,
                                                  const Exp& exp_of) {
  C m = r.max;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const C xk = convert<C>(x.v[k]);
    if (first + k < limit && xk > m) m = xk;
  }
  if (m == -std::numeric_limits<C>::infinity()) {  // nothing but -inf so far, or NaN: that reaches the sum
    C sum = r.sum;
#pragma unroll
    for (int k = 0; k < V; ++k)
      if (first + k < limit && convert<C>(x.v[k]) != convert<C>(x.v[k])) sum = convert<C>(x.v[k]);
    return {m, sum};
  }
  C sum = r.sum * fast_exp(r.max - m);
#pragma unroll
  for (int k = 0; k < V; ++k)
    if (first + k < limit) sum += exp_of(convert<C>(x.v[k]) - m);
  return {m, sum};
}

// Vector v of a row's gradient, scale * (softmax - one-hot at t) over the classes and 0
// past them (0 throughout for a row whose target is not valid), from the logits x.
template <class T, class C, int V>
__device__ __forceinline__ void store_gradient(T* row, int64_t v, Vec<T, V> x, int64_t classes, bool valid, int64_t t,
                                               C lse, C scale) {
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t j = v * V + k;
    const C g = j < classes && valid ? scale * (fast_exp(convert<C>(x.v[k]) - lse) - (j == t ? C(1) : C(0))) : C(0);
    x.v[k] = convert<T>(g);
  }
  store_vec<T, V>(row, v, x);
}

template <class T, class C, int kThreads, int V>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_rows_kernel(T* __restrict__ logits, const int64_t* __restrict__ target, int64_t cols, int64_t classes,
                              int64_t ignore_index, const C* __restrict__ scale_ptr, C* __restrict__ loss,
                              IndexErrorSlot bad) {
  T* row = logits + static_cast<int64_t>(blockIdx.x) * cols;
  const int64_t vectors = cols / V;  // V divides cols
  MaxSum<C> r{-std::numeric_limits<C>::infinity(), C(0)};
  for (int64_t v = threadIdx.x; v < vectors; v += kThreads)
    r = merge_vector(r, load_vec<T, V>(row, v), v * V, classes, [](C a) { return fast_exp(a); });
  r = team_reduce<kThreads>(r, [](const MaxSum<C>& a, const MaxSum<C>& b) { return merge_max_sum(a, b); });
  const C lse = r.max + log(r.sum);
  const int64_t t = target[blockIdx.x];
  const bool ignored = t == ignore_index, valid = !ignored && t >= 0 && t < classes;
  const C scale = scale_ptr != nullptr ? *scale_ptr : C(1);
  if (threadIdx.x == 0) {
    if (!valid && !ignored) bad.record(t, classes);
    loss[blockIdx.x] = valid ? lse - convert<C>(row[t]) : ignored ? C(0) : std::numeric_limits<C>::quiet_NaN();
  }
  __syncthreads();  // row[t] is read before any thread overwrites it
  for (int64_t v = threadIdx.x; v < vectors; v += kThreads)
    store_gradient<T, C, V>(row, v, load_vec<T, V>(row, v), classes, valid, t, lse, scale);
}

// ---------------------------------------------------------------- 16-bit cross-entropy rows
// f16 and bf16 rows of whole 16-byte vectors (GPT-2's head: 16,384 rows of 50,304 bf16 a
// step) take this form of the kernel above, which is bound there by its instructions, not by
// its bytes (0.29 ms for 2,341 such rows on an H200, this form 0.15 ms). Per element it keeps to an unpack, one fused multiply-add, the hardware exp2 and
// an add (and a pack on the way out): the max of four vectors at a time comes from packed
// pair maxima and rescales the running sum once; the bounds of the classes are tested only
// in the vectors past the last whole one; the block merges its threads' pairs as one max,
// then one sum; the gradient's factor is folded into the exponent (when positive), and the
// one-hot's -factor is written by the thread that owns the target's vector, which also reads
// the target's logit for the loss, so no barrier stands between the passes.
constexpr float kLog2e = 1.4426950408889634f;

// A vector of eight T as four registers of pairs.
__device__ __forceinline__ uint4 load_pairs(const void* row, int v) { return reinterpret_cast<const uint4*>(row)[v]; }

// Elements of vector v at or past `classes` set to -inf, which adds nothing to a sum.
template <class T>
__device__ __forceinline__ uint4 masked_past(uint4 x, int v, int64_t classes) {
  constexpr uint32_t kMinusInf = std::is_same_v<T, __half> ? 0xfc00u : 0xff80u;
  uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t j = int64_t{v} * 8 + 2 * k;
    if (j >= classes) w[k] = (w[k] & 0xffff0000u) | kMinusInf;
    if (j + 1 >= classes) w[k] = (w[k] & 0xffffu) | (kMinusInf << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The running pair (max m, sum s of 2^((x - m) log2 e)) with the elements of N vectors merged.
// The max is over pairs (max2 leaves a NaN out; it makes the sum NaN); while nothing but -inf
// has been seen m is -inf and the exponents are taken from 0, so that a NaN still reaches s.
template <class T, int N>
__device__ __forceinline__ void merge_pairs(float& m, float& s, const uint4 (&x)[N]) {
  uint32_t pm = max2<T>(max2<T>(x[0].x, x[0].y), max2<T>(x[0].z, x[0].w));
#pragma unroll
  for (int n = 1; n < N; ++n) pm = max2<T>(pm, max2<T>(max2<T>(x[n].x, x[n].y), max2<T>(x[n].z, x[n].w)));
  const float2 h = unpack2<T>(pm);
  const float vm = fmaxf(h.x, h.y);
  if (vm > m) {
    s *= exp2_approx((m - vm) * kLog2e);  // 0 from -inf; a NaN sum stays NaN
    m = vm;
  }
  const float base = m == -INFINITY ? 0.0f : m * kLog2e;
  float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const uint32_t w[4] = {x[n].x, x[n].y, x[n].z, x[n].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = unpack2<T>(w[k]);
      part[k] += exp2_approx(fmaf(f.x, kLog2e, -base)) + exp2_approx(fmaf(f.y, kLog2e, -base));
    }
  }
  s += (part[0] + part[1]) + (part[2] + part[3]);
}

// The gradient of vector v: factor * 2^(x log2 e - base) per element (factor 1 when the
// caller folded it into base), 0 past the classes.
template <class T, bool kFolded>
__device__ __forceinline__ uint4 gradient_pairs(uint4 x, int v, int64_t classes, float base, float factor, bool tail) {
  uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = unpack2<T>(w[k]);
    float a = exp2_approx(fmaf(f.x, kLog2e, -base)), b = exp2_approx(fmaf(f.y, kLog2e, -base));
    if (!kFolded) a *= factor, b *= factor;
    if (tail) {
      const int64_t j = int64_t{v} * 8 + 2 * k;
      if (j >= classes) a = 0.0f;
      if (j + 1 >= classes) b = 0.0f;
    }
    w[k] = pack2<T>(a, b);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

template <class T, int kThreads, bool kFolded>
__device__ __forceinline__ void write_gradient(uint4* row, int whole, int vectors, int64_t classes, float base,
                                               float factor) {
  int v = threadIdx.x;
  for (; v + 3 * kThreads < whole; v += 4 * kThreads) {
    uint4 x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = __ldcs(row + v + i * kThreads);  // the last read
#pragma unroll
    for (int i = 0; i < 4; ++i)
      row[v + i * kThreads] = gradient_pairs<T, kFolded>(x[i], v, classes, base, factor, false);
  }
  for (; v < vectors; v += kThreads)
    row[v] = gradient_pairs<T, kFolded>(__ldcs(row + v), v, classes, base, factor, v >= whole);
}

// One row of the kernel below, at row, with target t and loss *loss.
template <class T, int kThreads>
__device__ __forceinline__ void cross_entropy_pairs_row(T* row, int64_t t, float* loss, int vectors, int whole,
                                                        int64_t classes, int64_t ignore_index,
                                                        const float* __restrict__ scale_ptr, IndexErrorSlot bad) {
  float m = -INFINITY, s = 0.0f;
  int v = threadIdx.x;
  for (; v + 3 * kThreads < whole; v += 4 * kThreads) {
    uint4 x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = load_pairs(row, v + i * kThreads);
    merge_pairs<T, 4>(m, s, x);
  }
  for (; v < vectors; v += kThreads) {
    const uint4 x[1] = {v < whole ? load_pairs(row, v) : masked_past<T>(load_pairs(row, v), v, classes)};
    merge_pairs<T, 1>(m, s, x);
  }
  // The block's max, then each thread's sum moved to it (a thread that saw the max, or only
  // -inf beside a max of -inf, keeps its sum as it is), then their sum.
  const float bm = team_reduce<kThreads>(m, Max{});
  s = team_reduce<kThreads>(m == bm ? s : s * exp2_approx((m - bm) * kLog2e), Plus{});
  const float lse = bm + logf(s);
  const bool ignored = t == ignore_index, valid = !ignored && t >= 0 && t < classes;
  const float scale = scale_ptr != nullptr ? *scale_ptr : 1.0f;
  uint4* vecs = reinterpret_cast<uint4*>(row);
  if (!valid) {
    if (threadIdx.x == 0) {
      if (!ignored) bad.record(t, classes);
      *loss = ignored ? 0.0f : NAN;
    }
    for (v = threadIdx.x; v < vectors; v += kThreads) vecs[v] = make_uint4(0u, 0u, 0u, 0u);
    return;
  }
  const bool owner = threadIdx.x == (t / 8) % kThreads;  // writes vector t / 8
  const float xt = owner ? convert<float>(row[t]) : 0.0f;
  if (owner) *loss = lse - xt;
  const bool folded = scale > 0.0f && scale < INFINITY;
  const float base = folded ? lse * kLog2e - log2f(scale) : lse * kLog2e;
  if (folded) write_gradient<T, kThreads, true>(vecs, whole, vectors, classes, base, scale);
  else write_gradient<T, kThreads, false>(vecs, whole, vectors, classes, base, scale);
  if (owner) row[t] = convert<T>(scale * (exp2_approx(fmaf(xt, kLog2e, -lse * kLog2e)) - 1.0f));
}

// One block a row at a time, rows blockIdx.x, blockIdx.x + gridDim.x, ...: the launch keeps
// the rows in flight within part of L2, so that the second pass over each reads L2, not DRAM.
template <class T, int kThreads>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_pairs_kernel(T* __restrict__ logits, const int64_t* __restrict__ target, int64_t rows, int cols,
                               int64_t classes, int64_t ignore_index, const float* __restrict__ scale_ptr,
                               float* __restrict__ loss, IndexErrorSlot bad) {
  const int vectors = cols / 8, whole = static_cast<int>(classes / 8);  // [0, whole) hold classes alone
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    cross_entropy_pairs_row<T, kThreads>(logits + r * cols, target[r], &loss[r], vectors, whole, classes, ignore_index,
                                         scale_ptr, bad);
}

template <class T, class C, int kThreads>
void launch_cross_entropy_rows(const Launcher& launch, const Tensor& logits, const Tensor& target, int64_t rows,
                               int64_t cols, int64_t classes, int64_t ignore_index, const Tensor& scale,
                               const Tensor& loss, IndexErrorSlot bad) {
  constexpr int kVector = 16 / sizeof(T);
  T* data = data_as<T>(logits);
  if constexpr (sizeof(T) == 2) {
    if (cols % kVector == 0 && is_aligned(data, 16) && cols <= std::numeric_limits<int>::max()) {
      // Rows in flight: what 3/5 of L2 holds, at least one block a multiprocessor, at most
      // what fits on one (GPT-2's rows of 100 KB: two blocks a multiprocessor, 27 MB).
      const auto kernel = cross_entropy_pairs_kernel<T, kThreads>;
      const int64_t sms = launch.multiprocessors(), row_bytes = cols * static_cast<int64_t>(sizeof(T));
      const int64_t fit = int64_t{l2_cache_bytes(launch.device())} * 3 / 5 / (row_bytes * sms);
      const int64_t per_sm = std::max<int64_t>(1, fit);
      const unsigned grid = launch.resident_grid(kernel, kThreads, 0, std::min(rows, per_sm * sms));
      launch(kernel, grid, kThreads, 0, data, data_as<const int64_t>(target), rows, static_cast<int>(cols), classes,
             ignore_index, data_or_null<const float>(scale), data_as<float>(loss), bad);
      return;
    }
  }
  auto kernel = cols % kVector == 0 && is_aligned(data, 16) ? cross_entropy_rows_kernel<T, C, kThreads, kVector>
                                                            : cross_entropy_rows_kernel<T, C, kThreads, 1>;
  launch(kernel, static_cast<unsigned>(rows), kThreads, 0, data, data_as<const int64_t>(target), cols, classes,
         ignore_index, data_or_null<const C>(scale), data_as<C>(loss), bad);
}

// ---------------------------------------------------------------- softmax of rows
// One block a row: each thread merges running (max, sum of exp) pairs over its vectors, the
// block merges them (team_reduce), and a second pass writes exp(x - m) (1 / s) or (x - m) - log s.
template <class T, class C, int kThreads, int V>
__global__ void __launch_bounds__(kThreads)
    softmax_rows_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t cols, bool take_log) {
  const T* row = x + static_cast<int64_t>(blockIdx.x) * cols;
  T* o = out + static_cast<int64_t>(blockIdx.x) * cols;
  const int64_t vectors = cols / V;  // V divides cols
  MaxSum<C> r{-std::numeric_limits<C>::infinity(), C(0)};
  int nan = 0;  // a NaN beside nothing but -inf would not reach the sum
  for (int64_t v = threadIdx.x; v < vectors; v += kThreads) {
    const Vec<T, V> in = load_vec<T, V>(row, v);
#pragma unroll
    for (int k = 0; k < V; ++k) nan |= convert<C>(in.v[k]) != convert<C>(in.v[k]);
    r = merge_vector(r, in, v * V, cols, [](C a) { return exp(a); });
  }
  r = team_reduce<kThreads>(r, [](const MaxSum<C>& a, const MaxSum<C>& b) { return merge_max_sum(a, b); });
  nan = team_reduce<kThreads>(nan, [](int a, int b) { return a | b; });
  // A NaN makes the max NaN (as max() does), so every output is NaN.
  const C m = nan ? std::numeric_limits<C>::quiet_NaN() : r.max, log_sum = log(r.sum), inverse = C(1) / r.sum;
  for (int64_t v = threadIdx.x; v < vectors; v += kThreads) {
    Vec<T, V> in = load_vec<T, V>(row, v);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const C shifted = convert<C>(in.v[k]) - m;
      in.v[k] = convert<T>(take_log ? shifted - log_sum : exp(shifted) * inverse);
    }
    store_vec<T, V>(o, v, in);
  }
}

template <class T, class C, int kThreads>
void launch_softmax_rows(const Launcher& launch, const Tensor& x, int64_t rows, int64_t cols, bool take_log,
                         const Tensor& out) {
  constexpr int kVector = 16 / sizeof(T);
  const T* in = data_as<const T>(x);
  T* o = data_as<T>(out);
  auto kernel = cols % kVector == 0 && is_aligned(in, 16) && is_aligned(o, 16)
                    ? softmax_rows_kernel<T, C, kThreads, kVector>
                    : softmax_rows_kernel<T, C, kThreads, 1>;
  launch(kernel, static_cast<unsigned>(rows), kThreads, 0, in, o, cols, take_log);
}
