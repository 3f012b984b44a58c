// CUDA normalization kernels: layer norm, group norm, L1 norm and Frobenius norm, forward
// and backward (contracts in kernels/backend.h). Every op is built from three parts:
//   1. a chunked row reduction: a team of threads (one warp for short rows, a block for
//      long ones) reduces one chunk of one row to a partial (Welford statistics or sums);
//   2. a finalize step: one warp per row combines the row's chunk partials in a fixed
//      order and writes the row's statistics or coefficients;
//   3. an element-wise pass that applies them.
// Statistics are Welford per thread and Chan-combined, so the variance stays accurate when
// |mean| >> std. f16/bf16/f32 accumulate in float, f64 in double; the saved statistics are
// in that accumulation type. Parameter gradients are reduced in a fixed order (per-slice
// partials, then one sum per column), so results are deterministic for a given device.
#include "kernels/cuda/loops.cuh"

namespace normcore {
namespace cuda_kernels {
namespace {

constexpr int kBlock = 256;             // threads per block in every kernel here
constexpr int kWarps = kBlock / 32;
constexpr int64_t kWarpRowMax = 1024;   // rows up to this length are reduced by one warp
constexpr int64_t kMinChunk = 4096;     // a block reduces at least this many elements

// ---------------------------------------------------------------- partials
// Count, mean and sum of squared deviations of a set of values.
template <class A>
struct Welford {
  A count, mean, m2;
  __device__ __forceinline__ static Welford identity() { return {A(0), A(0), A(0)}; }
  __device__ __forceinline__ void add(A v) {
    count += A(1);
    const A delta = v - mean;
    mean += delta / count;
    m2 += delta * (v - mean);
  }
  // N values at once: their own two-pass mean and m2, then one Chan step (one division).
  template <int N>
  __device__ __forceinline__ void add_many(const A (&v)[N]) {
    A sum = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) sum += v[j];
    const A local_mean = sum * (A(1) / A(N));
    A local_m2 = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) local_m2 += (v[j] - local_mean) * (v[j] - local_mean);
    const A total = count + A(N);
    const A delta = local_mean - mean;
    const A share = A(N) / total;
    mean += delta * share;
    m2 += local_m2 + delta * delta * count * share;
    count = total;
  }
};

// Chan et al.: the statistics of the union of two sets.
template <class A>
__device__ __forceinline__ Welford<A> combine(const Welford<A>& a, const Welford<A>& b) {
  const A count = a.count + b.count;
  if (count == A(0)) return a;
  const A delta = b.mean - a.mean;
  const A b_share = b.count / count;
  return {count, a.mean + delta * b_share, a.m2 + b.m2 + delta * delta * a.count * b_share};
}

template <class A>
__device__ __forceinline__ Welford<A> shfl_down(const Welford<A>& w, int offset) {
  return {__shfl_down_sync(0xffffffffu, w.count, offset), __shfl_down_sync(0xffffffffu, w.mean, offset),
          __shfl_down_sync(0xffffffffu, w.m2, offset)};
}

// N running sums.
template <class A, int N>
struct Sums {
  A v[N];
  __device__ __forceinline__ static Sums identity() {
    Sums s;
#pragma unroll
    for (int k = 0; k < N; ++k) s.v[k] = A(0);
    return s;
  }
  __device__ __forceinline__ void add(const Sums& o) {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] += o.v[k];
  }
  template <int M>
  __device__ __forceinline__ void add_many(const Sums (&o)[M]) {
#pragma unroll
    for (int j = 0; j < M; ++j) add(o[j]);
  }
};

template <class A, int N>
__device__ __forceinline__ Sums<A, N> combine(Sums<A, N> a, const Sums<A, N>& b) {
  a.add(b);
  return a;
}

template <class A, int N>
__device__ __forceinline__ Sums<A, N> shfl_down(Sums<A, N> s, int offset) {
#pragma unroll
  for (int k = 0; k < N; ++k) s.v[k] = __shfl_down_sync(0xffffffffu, s.v[k], offset);
  return s;
}

// Lane 0 of the warp gets the combination of the 32 lanes' partials, in a fixed order.
template <class R>
__device__ __forceinline__ R warp_combine(R r) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) r = combine(r, shfl_down(r, offset));
  return r;
}

// Thread 0 of the block gets the combination of every thread's partial. Every thread of
// the block must call it.
template <class R>
__device__ __forceinline__ R block_combine(R r) {
  __shared__ R warp_partials[kWarps];
  r = warp_combine(r);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // the buffer may still be read by an earlier call
  if (lane == 0) warp_partials[warp] = r;
  __syncthreads();
  if (warp == 0) {
    r = lane < kWarps ? warp_partials[lane] : R::identity();
    r = warp_combine(r);
  }
  return r;
}

// ---------------------------------------------------------------- 1. chunked reduction
// A problem of `rows` rows of row_len elements, each split into `chunks` chunks of
// chunk_len. A team of kTeam threads (32 or kBlock) reduces one (row, chunk) to
// partials[row * chunks + chunk], accumulating map(row, i) for each element i of the chunk,
// kUnroll elements per thread at a time so that their loads overlap.
template <int kTeam, class R, class Map>
__global__ void chunk_reduce_kernel(int64_t rows, int64_t row_len, int64_t chunk_len, int64_t chunks, Map map,
                                    R* partials) {
  constexpr int kTeams = kBlock / kTeam;
  const int64_t team = static_cast<int64_t>(blockIdx.x) * kTeams + threadIdx.x / kTeam;
  const int lane = threadIdx.x % kTeam;
  R acc = R::identity();
  const bool active = team < rows * chunks;
  if (active) {
    const int64_t row = team / chunks, chunk = team % chunks;
    const int64_t begin = chunk * chunk_len, end = min(begin + chunk_len, row_len);
    // kUnroll loads in flight per thread before any is added (one Chan step for them all).
    constexpr int kUnroll = 8;
    using Value = decltype(map(row, begin));
    int64_t i = begin + lane;
    for (; i + (kUnroll - 1) * kTeam < end; i += kUnroll * kTeam) {
      Value v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = map(row, i + u * kTeam);
      acc.add_many(v);
    }
    for (; i < end; i += kTeam) acc.add(map(row, i));
  }
  if constexpr (kTeam == 32) {
    acc = warp_combine(acc);
  } else {
    acc = block_combine(acc);
  }
  if (active && lane == 0) partials[team] = acc;
}

// How a row reduction is split.
struct ChunkPlan {
  int64_t chunk_len = 0;
  int64_t chunks = 1;
  bool warp_teams = false;
};

ChunkPlan plan_chunks(int64_t rows, int64_t row_len, int device) {
  ChunkPlan plan;
  plan.chunk_len = std::max<int64_t>(row_len, 1);
  if (row_len <= kWarpRowMax) {
    plan.warp_teams = true;
    return plan;
  }
  // Enough blocks to fill the device a few times, none with less than kMinChunk elements.
  const int64_t target_blocks = 4 * static_cast<int64_t>(cuda_runtime::multiprocessor_count(device));
  const int64_t by_size = (row_len + kMinChunk - 1) / kMinChunk;
  plan.chunks = std::max<int64_t>(1, std::min((target_blocks + rows - 1) / rows, by_size));
  plan.chunk_len = (row_len + plan.chunks - 1) / plan.chunks;
  plan.chunks = (row_len + plan.chunk_len - 1) / plan.chunk_len;
  return plan;
}

template <class R, class Map>
void launch_chunk_reduce(const char* op, const ChunkPlan& plan, int64_t rows, int64_t row_len, Map map, R* partials,
                         cudaStream_t stream) {
  const int64_t teams = rows * plan.chunks;
  if (teams == 0) return;
  if (plan.warp_teams) {
    const auto grid = static_cast<unsigned>((teams + kWarps - 1) / kWarps);
    chunk_reduce_kernel<32><<<grid, kBlock, 0, stream>>>(rows, row_len, plan.chunk_len, plan.chunks, map, partials);
  } else {
    chunk_reduce_kernel<kBlock><<<static_cast<unsigned>(teams), kBlock, 0, stream>>>(rows, row_len, plan.chunk_len,
                                                                                      plan.chunks, map, partials);
  }
  NC_CUDA_KERNEL_CHECK(op);
}

// ---------------------------------------------------------------- 2. finalize
// One warp per row: combines partials[row * chunks ...] in a fixed order, then calls
// finish(row, combined) on lane 0.
template <class R, class Finish>
__global__ void finalize_kernel(int64_t rows, int64_t chunks, const R* partials, Finish finish) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // whole warps leave together
  R acc = R::identity();
  for (int64_t k = lane; k < chunks; k += 32) acc = combine(acc, partials[row * chunks + k]);
  acc = warp_combine(acc);
  if (lane == 0) finish(row, acc);
}

template <class R, class Finish>
void launch_finalize(const char* op, int64_t rows, int64_t chunks, const R* partials, Finish finish,
                     cudaStream_t stream) {
  if (rows == 0) return;
  const auto grid = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  finalize_kernel<<<grid, kBlock, 0, stream>>>(rows, chunks, partials, finish);
  NC_CUDA_KERNEL_CHECK(op);
}

// Reduces every row to one R and hands it to finish(row, r).
template <class R, class Map, class Finish>
void reduce_rows(const char* op, int64_t rows, int64_t row_len, Map map, Finish finish, int device,
                 cudaStream_t stream) {
  if (rows == 0) return;
  const ChunkPlan plan = plan_chunks(rows, row_len, device);
  cuda_runtime::DeviceBuffer partials(static_cast<size_t>(rows * plan.chunks) * sizeof(R), device);
  launch_chunk_reduce(op, plan, rows, row_len, map, partials.as<R>(), stream);
  launch_finalize(op, rows, plan.chunks, partials.as<const R>(), finish, stream);
}

// ---------------------------------------------------------------- 3. element-wise
template <class Index, class F>
__global__ void elementwise_kernel(Index numel, F f) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index e = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; e < numel; e += stride) f(e);
}

// Runs f(e) for every e < numel; f takes the index type it is instantiated with.
template <class Index, class F>
void launch_elementwise(const char* op, int64_t numel, F f, int device, cudaStream_t stream) {
  if (numel == 0) return;
  elementwise_kernel<<<grid_for(numel, device, kBlock), kBlock, 0, stream>>>(static_cast<Index>(numel), f);
  NC_CUDA_KERNEL_CHECK(op);
}

// Runs f(e) (e an int64_t) for every e < numel: for the small per-row and per-channel loops.
template <class F>
void for_each_index(const char* op, int64_t numel, F f, int device, cudaStream_t stream) {
  launch_elementwise<int64_t>(op, numel, f, device, stream);
}

// Calls run(Index{}) with uint32_t when every index below numel fits 31 bits, else int64_t.
template <class Run>
void with_index_type(int64_t numel, Run run) {
  if (numel <= std::numeric_limits<int32_t>::max()) run(uint32_t{});
  else run(int64_t{});
}

// ---------------------------------------------------------------- group layout
// Layer norm and group norm share one layout: x [batch, groups * group_channels, spatial]
// has rows = batch * groups of row_len = group_channels * spatial elements. Layer norm is
// groups = 1, spatial = 1 (each column its own channel).
struct GroupLayout {
  int64_t batch, groups, group_channels, spatial;
  int64_t rows() const { return batch * groups; }
  int64_t row_len() const { return group_channels * spatial; }
  int64_t channels() const { return groups * group_channels; }
};

// Element index -> (row, channel), by multiply-and-shift division on the 32-bit path.
template <class Index>
struct ElementPlace {
  IntDivider<Index> spatial, group_channels, channels;
  ElementPlace(const GroupLayout& l)
      : spatial(static_cast<Index>(l.spatial)),
        group_channels(static_cast<Index>(l.group_channels)),
        channels(static_cast<Index>(l.channels())) {}
  // e = ((n * channels + c) * spatial + s): plane = n * channels + c, row = plane / gc.
  __device__ __forceinline__ void locate(Index e, Index& row, Index& channel) const {
    const Index plane = spatial.div(e);
    row = group_channels.div(plane);
    channel = plane - channels.div(plane) * static_cast<Index>(channels.divisor);
  }
};

template <class T, class A>
__device__ __forceinline__ A load(const T* p, int64_t i) {
  return convert<A>(p[i]);
}

// Vector j of V elements (16 bytes) from p.
template <class T, int V>
__device__ __forceinline__ Vec<T, V> load_vec(const T* p, int64_t j) {
  return reinterpret_cast<const Vec<T, V>*>(p)[j];
}

// ---------------------------------------------------------------- 4. pipelined passes
// Rows too long for one block to keep on chip run as one persistent kernel with two kinds
// of work item over chunks of rows: S items reduce a chunk to a partial, and the last S
// item of a row combines the row's partials (in chunk order) into its row info; A items
// apply the row info to a chunk. Blocks take items from an atomic counter in a fixed
// order where a row's A items follow all of its S items and trail the S stream by `lag`
// items, so a chunk read again by its A item is still in L2. An A item waits for its row;
// the S items it waits for were taken before it by blocks that are running and never
// wait themselves, so the scheme cannot deadlock whatever the number of resident blocks.
// Every resident block holds an item, so a chunk read by an S item is read again about
// (lag + resident items) chunks later: small chunks keep that within L2's 50 MB. That
// only works for rows of at most a few MB; longer rows (group norm's 8 MB groups, a whole
// tensor for Frobenius) run the two phases one after the other with large chunks and
// plain loads, which measured faster than any lag on the H100.
constexpr int64_t kPipelineChunkBytes = 16 << 10;      // per input, per item, rows in L2
constexpr int64_t kPipelineL2Bytes = 16 << 20;         // the A stream's lag behind the S stream
constexpr int64_t kPipelineReuseRowBytes = 2 << 20;    // longest row (all inputs) reused from L2
constexpr int64_t kPipelineStreamChunkBytes = 256 << 10;  // per input, per item, longer rows

template <class A, int K>
struct RowInfo {
  A v[K];
};

// A row is a sequence of spans (a whole row, or one plane of a group) and each span is
// cut into `pieces` chunks of chunk_len (the last one shorter), so no chunk straddles spans.
struct PipelineShape {
  int64_t rows, row_len, span, pieces, chunk_len;
  int64_t chunks;  // per row: (row_len / span) * pieces
  int64_t items;   // rows * chunks, of each kind
  int64_t lag;     // S items ahead of the A stream, >= chunks
  bool reuse;      // whether A items expect their chunk in L2 (cache hints on)
};

// Position p in the item order -> whether it is an S item, and its chunk index k.
__device__ __forceinline__ bool decode_item(int64_t p, const PipelineShape& s, int64_t& k) {
  const int64_t n = s.items, d = s.lag;
  if (p < d) {
    k = p;
    return true;
  }
  if (p < 2 * n - d) {
    const int64_t q = p - d;
    k = q % 2 == 0 ? q / 2 : d + q / 2;
    return q % 2 != 0;
  }
  k = p - n;
  return false;
}

template <class A>
__device__ __forceinline__ Welford<A> load_cg(const Welford<A>* p) {
  return {__ldcg(&p->count), __ldcg(&p->mean), __ldcg(&p->m2)};
}
template <class A, int N>
__device__ __forceinline__ Sums<A, N> load_cg(const Sums<A, N>* p) {
  Sums<A, N> s;
#pragma unroll
  for (int k = 0; k < N; ++k) s.v[k] = __ldcg(&p->v[k]);
  return s;
}

constexpr int kUnroll = 4;

// 16-byte loads and stores with cache hints: an apply pass reads x for the last time and
// writes y that is not read again soon, so both are marked evict-first, leaving L2 to the
// chunks the reduce pass has read and the apply pass will read again.
template <class T, int V>
__device__ __forceinline__ Vec<T, V> load_last_use(const T* p, int64_t v) {
  static_assert(sizeof(Vec<T, V>) == 16, "16-byte vectors only");
  const uint4 raw = __ldcs(reinterpret_cast<const uint4*>(p) + v);
  Vec<T, V> out;
  memcpy(&out, &raw, 16);
  return out;
}

// The reduce pass's reads are marked evict-last: the apply pass reads them again.
template <class T, int V>
__device__ __forceinline__ Vec<T, V> load_keep(const T* p, int64_t v) {
  static_assert(sizeof(Vec<T, V>) == 16, "16-byte vectors only");
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  uint4 raw;
  asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(raw.x), "=r"(raw.y), "=r"(raw.z), "=r"(raw.w)
               : "l"(reinterpret_cast<const uint4*>(p) + v), "l"(policy));
  Vec<T, V> out;
  memcpy(&out, &raw, 16);
  return out;
}

template <class T, int V>
__device__ __forceinline__ void store_streaming(T* p, int64_t v, const Vec<T, V>& value) {
  uint4 raw;
  memcpy(&raw, &value, 16);
  __stcs(reinterpret_cast<uint4*>(p) + v, raw);
}

// The block visits elements [g0, g1) of the flat inputs, 16 bytes at a time between a
// scalar head and tail: f(g, in0[g], in1[g]) for each head and tail element, and
// fv(g, in0[g .. g + V), in1[g .. g + V)) for each vector (in1 only when kInputs == 2).
template <int kInputs, int kThreads = kBlock, class T, class F, class FV>
__device__ __forceinline__ void visit_chunk(int64_t g0, int64_t g1, const T* __restrict__ in0,
                                            const T* __restrict__ in1, bool hinted, F&& f, FV&& fv) {
  using A = compute_t<T>;
  constexpr int V = 16 / sizeof(T);
  const int64_t body0 = min(g1, (g0 + V - 1) / V * V);
  const int64_t body1 = max(body0, g1 / V * V);
  auto scalar = [&](int64_t g) { f(g, load<T, A>(in0, g), kInputs == 2 ? load<T, A>(in1, g) : A(0)); };
  for (int64_t g = g0 + threadIdx.x; g < body0; g += kThreads) scalar(g);
  // kUnroll loads in flight per thread before any is used.
  const int64_t v_end = body1 / V;
  for (int64_t first = body0 / V + threadIdx.x; first < v_end; first += kThreads * kUnroll) {
    Vec<T, V> a[kUnroll], b[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = first + u * kThreads;
      if (v < v_end) {
        a[u] = hinted ? load_keep<T, V>(in0, v) : load_vec<T, V>(in0, v);
        if constexpr (kInputs == 2) b[u] = hinted ? load_keep<T, V>(in1, v) : load_vec<T, V>(in1, v);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = first + u * kThreads;
      if (v >= v_end) break;
      A x0[V], x1[V];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        x0[j] = convert<A>(a[u].v[j]);
        x1[j] = kInputs == 2 ? convert<A>(b[u].v[j]) : A(0);
      }
      fv(v * V, x0, x1);
    }
  }
  for (int64_t g = body1 + threadIdx.x; g < g1; g += kThreads) scalar(g);
}

// The same, storing out[g] = f(g, in0[g], in1[g]).
template <int kInputs, int kThreads = kBlock, class T, class F>
__device__ __forceinline__ void apply_chunk(int64_t g0, int64_t g1, const T* __restrict__ in0,
                                            const T* __restrict__ in1, T* __restrict__ out, bool hinted, F&& f) {
  using A = compute_t<T>;
  constexpr int V = 16 / sizeof(T);
  const int64_t body0 = min(g1, (g0 + V - 1) / V * V);
  const int64_t body1 = max(body0, g1 / V * V);
  auto scalar = [&](int64_t g) {
    out[g] = convert<T>(f(g, load<T, A>(in0, g), kInputs == 2 ? load<T, A>(in1, g) : A(0)));
  };
  for (int64_t g = g0 + threadIdx.x; g < body0; g += kThreads) scalar(g);
  const int64_t v_end = body1 / V;
  for (int64_t first = body0 / V + threadIdx.x; first < v_end; first += kThreads * kUnroll) {
    Vec<T, V> a[kUnroll], b[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = first + u * kThreads;
      if (v < v_end) {
        a[u] = hinted ? load_last_use<T, V>(in0, v) : load_vec<T, V>(in0, v);
        if constexpr (kInputs == 2) b[u] = hinted ? load_last_use<T, V>(in1, v) : load_vec<T, V>(in1, v);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = first + u * kThreads;
      if (v >= v_end) break;
      Vec<T, V> r;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        r.v[j] = convert<T>(f(v * V + j, convert<A>(a[u].v[j]), kInputs == 2 ? convert<A>(b[u].v[j]) : A(0)));
      }
      if (hinted) {
        store_streaming<T, V>(out, v, r);
      } else {
        reinterpret_cast<Vec<T, V>*>(out)[v] = r;
      }
    }
  }
  for (int64_t g = body1 + threadIdx.x; g < g1; g += kThreads) scalar(g);
}

// Phase functors, each with a per-item context computed once per chunk:
//   reduce.context(row, begin) -> SCtx;  reduce(ctx, i, v0, v1) -> what R::add takes
//   finish(row, R) -> RowInfo            (also stores what backward needs)
//   apply.context(row, begin, RowInfo) -> ACtx;  apply(ctx, i, v0, v1) -> A
// where i is the element's index within its row.
template <int kInputs, class T, class R, class Info, class Reduce, class Finish, class Apply>
__global__ void __launch_bounds__(kBlock) pipeline_kernel(PipelineShape s, const T* __restrict__ in0,
                                                          const T* __restrict__ in1, T* __restrict__ out,
                                                          R* partials, Info* infos, unsigned long long* counters,
                                                          Reduce reduce, Finish finish, Apply apply) {
  using A = compute_t<T>;
  // counters: [0] the next item, [1 + row] S items done, [1 + rows + row] row ready.
  unsigned long long* next = counters;
  unsigned long long* done = counters + 1;
  unsigned long long* ready = counters + 1 + s.rows;
  __shared__ long long item_slot;
  __shared__ bool last_slot;
  __shared__ Info info_slot;
  if (threadIdx.x == 0) item_slot = static_cast<long long>(atomicAdd(next, 1ull));
  __syncthreads();
  int64_t item = item_slot;
  while (item < 2 * s.items) {
    // Take the next item now; its latency hides behind this one.
    unsigned long long following = 0;
    if (threadIdx.x == 0) following = atomicAdd(next, 1ull);
    int64_t k;
    const bool is_reduce = decode_item(item, s, k);
    const int64_t row = k / s.chunks, chunk = k % s.chunks;
    const int64_t span_begin = (chunk / s.pieces) * s.span;
    const int64_t begin = span_begin + (chunk % s.pieces) * s.chunk_len;
    const int64_t end = min(begin + s.chunk_len, span_begin + s.span);
    const int64_t base = row * s.row_len;
    if (is_reduce) {
      const auto ctx = reduce.context(row, begin);
      R acc = R::identity();
      constexpr int V = 16 / sizeof(T);
      visit_chunk<kInputs>(
          base + begin, base + end, in0, in1, s.reuse, [&](int64_t g, A v0, A v1) { acc.add(reduce(ctx, g - base, v0, v1)); },
          [&](int64_t g, const A (&x0)[V], const A (&x1)[V]) {
            decltype(reduce(ctx, 0, A(0), A(0))) c[V];
#pragma unroll
            for (int j = 0; j < V; ++j) c[j] = reduce(ctx, g - base + j, x0[j], x1[j]);
            acc.add_many(c);
          });
      acc = block_combine(acc);
      if (threadIdx.x == 0) {
        partials[k] = acc;
        __threadfence();
        last_slot = atomicAdd(&done[row], 1ull) == static_cast<unsigned long long>(s.chunks - 1);
      }
      __syncthreads();
      if (last_slot) {
        __threadfence();
        R total = R::identity();
        for (int64_t c = threadIdx.x; c < s.chunks; c += kBlock) total = combine(total, load_cg(&partials[row * s.chunks + c]));
        total = block_combine(total);
        if (threadIdx.x == 0) {
          infos[row] = finish(row, total);
          __threadfence();
          atomicExch(&ready[row], 1ull);
        }
      }
    } else {
      if (threadIdx.x == 0) {
        while (atomicAdd(&ready[row], 0ull) == 0) __nanosleep(100);
        __threadfence();
        Info info;
#pragma unroll
        for (int j = 0; j < static_cast<int>(sizeof(Info::v) / sizeof(A)); ++j) info.v[j] = __ldcg(&infos[row].v[j]);
        info_slot = info;
      }
      __syncthreads();
      const auto ctx = apply.context(row, begin, info_slot);
      apply_chunk<kInputs>(base + begin, base + end, in0, in1, out, s.reuse,
                           [&](int64_t g, A v0, A v1) { return apply(ctx, g - base, v0, v1); });
    }
    if (threadIdx.x == 0) item_slot = static_cast<long long>(following);
    __syncthreads();
    item = item_slot;
  }
}

// Plans chunks of about kPipelineChunkBytes per input within spans of `span` elements
// (row_len a multiple of span), and the lag that keeps the A stream within L2's reach.
PipelineShape plan_pipeline(int64_t rows, int64_t row_len, int64_t span, int64_t element_bytes, int inputs) {
  PipelineShape s{};
  s.rows = rows;
  s.row_len = row_len;
  s.span = std::max<int64_t>(span, 1);
  s.reuse = rows > 1 && row_len * element_bytes * inputs <= kPipelineReuseRowBytes;
  const int64_t target =
      std::max<int64_t>(1, (s.reuse ? kPipelineChunkBytes : kPipelineStreamChunkBytes) / element_bytes);
  s.pieces = (s.span + target - 1) / target;
  s.chunk_len = (s.span + s.pieces - 1) / s.pieces;
  s.chunks = std::max<int64_t>(1, row_len / s.span * s.pieces);
  s.items = rows * s.chunks;
  const int64_t chunk_bytes = s.chunk_len * element_bytes * inputs;
  s.lag = s.reuse ? std::min(s.items, std::max(s.chunks, kPipelineL2Bytes / std::max<int64_t>(chunk_bytes, 1)))
                  : s.items;
  return s;
}

template <int kInputs, class T, class R, class Info, class Reduce, class Finish, class Apply>
void run_pipeline(const char* op, const PipelineShape& s, const T* in0, const T* in1, T* out, R* partials,
                  Reduce reduce, Finish finish, Apply apply, int device, cudaStream_t stream) {
  if (s.items == 0) return;
  cuda_runtime::DeviceBuffer infos(static_cast<size_t>(s.rows) * sizeof(Info), device);
  const size_t counter_bytes = static_cast<size_t>(1 + 2 * s.rows) * sizeof(unsigned long long);
  cuda_runtime::DeviceBuffer counters(counter_bytes, device);
  NC_CUDA_CHECK(cudaMemsetAsync(counters.as<void>(), 0, counter_bytes, stream));
  auto kernel = pipeline_kernel<kInputs, T, R, Info, Reduce, Finish, Apply>;
  int per_sm = 0;
  NC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kBlock, 0));
  const int64_t resident = static_cast<int64_t>(std::max(per_sm, 1)) * cuda_runtime::multiprocessor_count(device);
  const auto grid = static_cast<unsigned>(std::min<int64_t>(resident, 2 * s.items));
  kernel<<<grid, kBlock, 0, stream>>>(s, in0, in1, out, partials, infos.as<Info>(),
                                      counters.as<unsigned long long>(), reduce, finish, apply);
  NC_CUDA_KERNEL_CHECK(op);
}

// ---------------------------------------------------------------- element-wise passes
// y = (x - mean) * rstd * weight + bias.
template <class Index, class T, class A>
struct AffineApply {
  ElementPlace<Index> place;
  const T* x;
  const T* weight;
  const T* bias;
  const A* mean;
  const A* rstd;
  T* y;
  __device__ __forceinline__ void operator()(Index e) const {
    Index row, channel;
    place.locate(e, row, channel);
    A v = (load<T, A>(x, e) - mean[row]) * rstd[row];
    if (weight) v *= load<T, A>(weight, channel);
    if (bias) v += load<T, A>(bias, channel);
    y[e] = convert<T>(v);
  }
};

// grad_x = rstd * (w * dy - coef[row].0 - xhat * coef[row].1).
template <class Index, class T, class A>
struct AffineGradInput {
  ElementPlace<Index> place;
  const T* grad_y;
  const T* x;
  const T* weight;
  const A* mean;
  const A* rstd;
  const A* coef;
  T* grad_x;
  __device__ __forceinline__ void operator()(Index e) const {
    Index row, channel;
    place.locate(e, row, channel);
    const A r = rstd[row];
    const A xhat = (load<T, A>(x, e) - mean[row]) * r;
    const A w = weight ? load<T, A>(weight, channel) : A(1);
    grad_x[e] = convert<T>(r * (w * load<T, A>(grad_y, e) - coef[2 * row] - xhat * coef[2 * row + 1]));
  }
};

// ---------------------------------------------------------------- 5. rows kept in registers
// Layer norm (and L1 along the last dim) over rows of up to 16384 elements: a team of
// threads (a warp, or a block of 256 to 1024) holds a whole row in registers, kVecs
// 16-byte vectors per thread, so x is read once forward and x and dy once backward.
// Statistics are two-pass over the registers. Rows must start 16-byte aligned (row_len a
// multiple of the vector width); other rows take the chunked path.
constexpr int kVecs = 4;
constexpr int64_t kRowsMaxLen = 16384;

template <int kTeam>
constexpr int team_block() {
  return kTeam < kBlock ? kBlock : kTeam;
}

// Every thread of the team gets the team's sum of each v[k], combined in a fixed order.
template <int kTeam, int N, class A>
__device__ __forceinline__ Sums<A, N> team_sum(Sums<A, N> s) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
#pragma unroll
    for (int k = 0; k < N; ++k) s.v[k] += __shfl_xor_sync(0xffffffffu, s.v[k], offset);
  }
  if constexpr (kTeam > 32) {
    constexpr int kTeamWarps = kTeam / 32;
    __shared__ A warp_sums[kTeamWarps][N];
    __syncthreads();  // an earlier call may still be reading
    if (threadIdx.x % 32 == 0) {
#pragma unroll
      for (int k = 0; k < N; ++k) warp_sums[threadIdx.x / 32][k] = s.v[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < N; ++k) {
      A total = 0;
      for (int w = 0; w < kTeamWarps; ++w) total += warp_sums[w][k];
      s.v[k] = total;
    }
  }
  return s;
}

// The team's row in registers: vector j = lane + k * kTeam of the row, k < kVecs.
template <class T, int V>
struct RowSlice {
  using A = compute_t<T>;
  A v[kVecs][V];
  __device__ __forceinline__ void load(const T* row, int64_t vecs, int lane, int team_size) {
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t j = lane + static_cast<int64_t>(k) * team_size;
      if (j < vecs) {
        const Vec<T, V> raw = reinterpret_cast<const Vec<T, V>*>(row)[j];
#pragma unroll
        for (int e = 0; e < V; ++e) v[k][e] = convert<A>(raw.v[e]);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) v[k][e] = A(0);
      }
    }
  }
};

template <class T, int kTeam, int V>
__global__ void __launch_bounds__(team_block<kTeam>()) layer_norm_rows_forward(
    int64_t rows, int64_t row_len, const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
    compute_t<T> eps, T* __restrict__ y, compute_t<T>* __restrict__ mean_out, compute_t<T>* __restrict__ rstd_out) {
  using A = compute_t<T>;
  constexpr int kTeams = team_block<kTeam>() / kTeam;
  const int lane = threadIdx.x % kTeam;
  const int64_t vecs = row_len / V;
  const A inv_len = A(1) / static_cast<A>(row_len);
  // Every team runs the same number of iterations, so block-wide syncs inside stay matched.
  // Where a slice is at most 16 values (float32), the next row's loads are issued before
  // this row's reductions; twice the registers for 16-bit rows cost more than they gain.
  constexpr bool kPrefetch = kVecs * V <= 16;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kTeams;
  auto load_row = [&](RowSlice<T, V>& slice, int64_t first) {
    const int64_t row = first + threadIdx.x / kTeam;
    const bool active = row < rows;
    slice.load(x + (active ? row : 0) * row_len, active ? vecs : 0, lane, kTeam);
  };
  RowSlice<T, V> next;
  if constexpr (kPrefetch) load_row(next, static_cast<int64_t>(blockIdx.x) * kTeams);
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kTeams; first < rows; first += stride) {
    const int64_t row = first + threadIdx.x / kTeam;
    const bool active = row < rows;
    RowSlice<T, V> slice;
    if constexpr (kPrefetch) {
      slice = next;
      if (first + stride < rows) load_row(next, first + stride);
    } else {
      load_row(slice, first);
    }
    Sums<A, 1> s{{A(0)}};
#pragma unroll
    for (int k = 0; k < kVecs; ++k)
#pragma unroll
      for (int e = 0; e < V; ++e) s.v[0] += slice.v[k][e];
    const A mean = team_sum<kTeam>(s).v[0] * inv_len;
    Sums<A, 1> sq{{A(0)}};
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      if (lane + static_cast<int64_t>(k) * kTeam < vecs) {
#pragma unroll
        for (int e = 0; e < V; ++e) sq.v[0] += (slice.v[k][e] - mean) * (slice.v[k][e] - mean);
      }
    }
    const A rstd = A(1) / sqrt(team_sum<kTeam>(sq).v[0] * inv_len + eps);
    if (!active) continue;
    if (lane == 0) {
      mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t j = lane + static_cast<int64_t>(k) * kTeam;
      if (j >= vecs) continue;
      Vec<T, V> w, b, out;
      if (weight) w = load_vec<T, V>(weight, j);
      if (bias) b = load_vec<T, V>(bias, j);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        A v = (slice.v[k][e] - mean) * rstd;
        if (weight) v *= convert<A>(w.v[e]);
        if (bias) v += convert<A>(b.v[e]);
        out.v[e] = convert<T>(v);
      }
      reinterpret_cast<Vec<T, V>*>(y + row * row_len)[j] = out;
    }
  }
}

// grad_x only; the parameter gradients come from the column reduction.
template <class T, int kTeam, int V>
__global__ void __launch_bounds__(team_block<kTeam>()) layer_norm_rows_backward(
    int64_t rows, int64_t row_len, const T* __restrict__ grad_y, const T* __restrict__ x,
    const T* __restrict__ weight, const compute_t<T>* __restrict__ mean_in, const compute_t<T>* __restrict__ rstd_in,
    T* __restrict__ grad_x) {
  using A = compute_t<T>;
  constexpr int kTeams = team_block<kTeam>() / kTeam;
  const int lane = threadIdx.x % kTeam;
  const int64_t vecs = row_len / V;
  const A inv_len = A(1) / static_cast<A>(row_len);
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kTeams; first < rows;
       first += static_cast<int64_t>(gridDim.x) * kTeams) {
    const int64_t row = first + threadIdx.x / kTeam;
    const bool active = row < rows;
    const int64_t offset = (active ? row : 0) * row_len;
    RowSlice<T, V> xs, gs;
    xs.load(x + offset, active ? vecs : 0, lane, kTeam);
    gs.load(grad_y + offset, active ? vecs : 0, lane, kTeam);
    const A mean = active ? mean_in[row] : A(0), rstd = active ? rstd_in[row] : A(0);
    // g = w * dy, kept in gs; sums of g and g * xhat.
    Sums<A, 2> s{{A(0), A(0)}};
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t j = lane + static_cast<int64_t>(k) * kTeam;
      if (j >= vecs) continue;
      Vec<T, V> w;
      if (weight) w = load_vec<T, V>(weight, j);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        if (weight) gs.v[k][e] *= convert<A>(w.v[e]);
        xs.v[k][e] = (xs.v[k][e] - mean) * rstd;
        s.v[0] += gs.v[k][e];
        s.v[1] += gs.v[k][e] * xs.v[k][e];
      }
    }
    s = team_sum<kTeam>(s);
    if (!active) continue;
    const A mean_g = s.v[0] * inv_len, mean_g_xhat = s.v[1] * inv_len;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t j = lane + static_cast<int64_t>(k) * kTeam;
      if (j >= vecs) continue;
      Vec<T, V> out;
#pragma unroll
      for (int e = 0; e < V; ++e) out.v[e] = convert<T>(rstd * (gs.v[k][e] - mean_g - xs.v[k][e] * mean_g_xhat));
      reinterpret_cast<Vec<T, V>*>(grad_x + offset)[j] = out;
    }
  }
}

// Calls launch(team_tag, vec_tag) with the smallest team that holds a row of row_len in
// kVecs vectors per thread; returns false when the row does not fit or is not aligned.
template <class T, class Launch>
bool with_row_team(int64_t row_len, const void* const* pointers, int count, Launch launch) {
  constexpr int V = 16 / sizeof(T);
  if (row_len == 0 || row_len % V != 0 || row_len > kRowsMaxLen) return false;
  for (int i = 0; i < count; ++i) {
    if (pointers[i] && !is_aligned(pointers[i], 16)) return false;
  }
  const int64_t per_thread = static_cast<int64_t>(kVecs) * V;
  if (row_len <= 32 * per_thread) launch(std::integral_constant<int, 32>{}, std::integral_constant<int, V>{});
  else if (row_len <= 256 * per_thread) launch(std::integral_constant<int, 256>{}, std::integral_constant<int, V>{});
  else if (row_len <= 512 * per_thread) launch(std::integral_constant<int, 512>{}, std::integral_constant<int, V>{});
  else if (row_len <= 1024 * per_thread) launch(std::integral_constant<int, 1024>{}, std::integral_constant<int, V>{});
  else return false;
  return true;
}

// Blocks for a persistent loop over rows: as many as can be resident, fewer for few rows.
template <class Kernel>
unsigned row_grid(Kernel kernel, int threads, int64_t rows, int rows_per_block, int device) {
  int per_sm = 0;
  NC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  const int64_t resident = static_cast<int64_t>(std::max(per_sm, 1)) * cuda_runtime::multiprocessor_count(device);
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(resident, (rows + rows_per_block - 1) / rows_per_block)));
}

// ---------------------------------------------------------------- 6. layer norm over long rows
// Rows too long for registers: the row statistics (or the backward sums) come from the
// chunked reduction, then one pass walks columns: each thread takes one vector of V
// columns for a slice of rows, so weight and bias are read once per slice, not once per
// row, and backward folds the parameter gradients into the same pass (per-slice partials,
// summed in slice order afterwards).
template <class T, int V>
__global__ void layer_norm_columns_forward(int64_t rows, int64_t row_len, int64_t rows_per_slice,
                                           const T* __restrict__ x, const T* __restrict__ weight,
                                           const T* __restrict__ bias, const compute_t<T>* __restrict__ mean,
                                           const compute_t<T>* __restrict__ rstd, T* __restrict__ y) {
  using A = compute_t<T>;
  const int64_t vecs = row_len / V;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= vecs) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_slice, r1 = min(r0 + rows_per_slice, rows);
  Vec<T, V> w, b;
  if (weight) w = load_vec<T, V>(weight, j);
  if (bias) b = load_vec<T, V>(bias, j);
  for (int64_t r = r0; r < r1; ++r) {
    const Vec<T, V> in = load_vec<T, V>(x + r * row_len, j);
    const A m = mean[r], s = rstd[r];
    Vec<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      A v = (convert<A>(in.v[e]) - m) * s;
      if (weight) v *= convert<A>(w.v[e]);
      if (bias) v += convert<A>(b.v[e]);
      out.v[e] = convert<T>(v);
    }
    reinterpret_cast<Vec<T, V>*>(y + r * row_len)[j] = out;
  }
}

// coef[row] = {mean(w * dy), mean(w * dy * xhat)}; partials [slices, row_len] of
// sum(dy * xhat) and sum(dy).
template <class T, int V>
__global__ void layer_norm_columns_backward(int64_t rows, int64_t row_len, int64_t rows_per_slice,
                                            const T* __restrict__ grad_y, const T* __restrict__ x,
                                            const T* __restrict__ weight, const compute_t<T>* __restrict__ mean,
                                            const compute_t<T>* __restrict__ rstd,
                                            const compute_t<T>* __restrict__ coef, T* __restrict__ grad_x,
                                            compute_t<T>* __restrict__ partial_w, compute_t<T>* __restrict__ partial_b) {
  using A = compute_t<T>;
  const int64_t vecs = row_len / V;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= vecs) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_slice, r1 = min(r0 + rows_per_slice, rows);
  Vec<T, V> w;
  if (weight) w = load_vec<T, V>(weight, j);
  A sum_w[V], sum_b[V];
#pragma unroll
  for (int e = 0; e < V; ++e) sum_w[e] = sum_b[e] = A(0);
  for (int64_t r = r0; r < r1; ++r) {
    const Vec<T, V> xv = load_vec<T, V>(x + r * row_len, j);
    const Vec<T, V> gv = load_vec<T, V>(grad_y + r * row_len, j);
    const A m = mean[r], s = rstd[r], c0 = coef[2 * r], c1 = coef[2 * r + 1];
    Vec<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const A dy = convert<A>(gv.v[e]);
      const A xhat = (convert<A>(xv.v[e]) - m) * s;
      const A g = weight ? dy * convert<A>(w.v[e]) : dy;
      out.v[e] = convert<T>(s * (g - c0 - xhat * c1));
      sum_w[e] += dy * xhat;
      sum_b[e] += dy;
    }
    reinterpret_cast<Vec<T, V>*>(grad_x + r * row_len)[j] = out;
  }
  const int64_t base = static_cast<int64_t>(blockIdx.y) * row_len + j * V;
#pragma unroll
  for (int e = 0; e < V; ++e) {
    partial_w[base + e] = sum_w[e];
    partial_b[base + e] = sum_b[e];
  }
}

// Grid for a column pass: vector columns across x, slices of rows across y, with enough
// threads in all to fill the device.
struct ColumnGrid {
  dim3 grid;
  int64_t slices, rows_per_slice;
};

ColumnGrid column_grid_for(int64_t rows, int64_t vecs, int device) {
  const int64_t target_threads = 2048 * static_cast<int64_t>(cuda_runtime::multiprocessor_count(device));
  int64_t slices = std::min<int64_t>({std::max<int64_t>(1, (target_threads + vecs - 1) / vecs), std::max<int64_t>(rows, 1), 65535});
  const int64_t rows_per_slice = std::max<int64_t>(1, (rows + slices - 1) / slices);
  slices = std::max<int64_t>(1, (rows + rows_per_slice - 1) / rows_per_slice);
  return {dim3(static_cast<unsigned>((vecs + kBlock - 1) / kBlock), static_cast<unsigned>(slices)), slices,
          rows_per_slice};
}

// Calls launch(vec_tag) with the widest vector every pointer and row_len allow.
template <class T, class Launch>
void with_column_vector(int64_t row_len, const void* const* pointers, int count, Launch launch) {
  constexpr int V = 16 / sizeof(T);
  bool aligned = row_len % V == 0;
  for (int i = 0; i < count; ++i) aligned = aligned && (!pointers[i] || is_aligned(pointers[i], 16));
  if (aligned) launch(std::integral_constant<int, V>{});
  else launch(std::integral_constant<int, 1>{});
}

// ---------------------------------------------------------------- pipeline phases
// Rows (layer norm, L1, Frobenius) or group rows with planes of at least this many
// elements (group norm) take the pipelined kernel; shorter ones the three-kernel path.
constexpr int64_t kPipelineMinRow = 16384;
constexpr int64_t kPipelineMinPlane = 1024;

struct NoContext {};

// x / max(norm, eps); the norm's gradient is 0 where the clamp is active.
template <class A>
__device__ __forceinline__ A clamped(A norm, A eps) {
  return norm < eps ? eps : norm;
}

template <class A>
__device__ __forceinline__ A sign_of(A v) {
  return v > A(0) ? A(1) : v < A(0) ? A(-1) : A(0);
}


// Forward statistics: Welford over x.
template <class A>
struct StatsReduce {
  __device__ NoContext context(int64_t, int64_t) const { return {}; }
  __device__ A operator()(NoContext, int64_t, A x, A) const { return x; }
};

// Stores mean and rstd for backward; the row info is {mean, rstd}.
template <class A>
struct StatsFinish {
  A* mean;
  A* rstd;
  A eps;
  __device__ RowInfo<A, 2> operator()(int64_t row, const Welford<A>& w) const {
    const A var = w.count > A(0) ? w.m2 / w.count : A(0);
    const A r = A(1) / sqrt(var + eps);
    mean[row] = w.mean;
    rstd[row] = r;
    return {{w.mean, r}};
  }
};

// y = (x - mean) * rstd * w + b, the channel per element (spatial == 1) or per chunk.
template <class T, class A>
struct AffineApplyPhase {
  const T* weight;
  const T* bias;
  int64_t groups, group_channels, spatial;
  struct Context {
    A mean, rstd, scale, shift;
    int64_t first_channel;
  };
  __device__ Context context(int64_t row, int64_t begin, const RowInfo<A, 2>& info) const {
    Context c{info.v[0], info.v[1], info.v[1], A(0), (row % groups) * group_channels};
    if (spatial > 1) {
      const int64_t channel = c.first_channel + begin / spatial;
      if (weight) c.scale *= load<T, A>(weight, channel);
      if (bias) c.shift = load<T, A>(bias, channel);
    }
    return c;
  }
  __device__ A operator()(const Context& c, int64_t i, A x, A) const {
    if (spatial > 1) return (x - c.mean) * c.scale + c.shift;
    A v = (x - c.mean) * c.rstd;
    if (weight) v *= load<T, A>(weight, c.first_channel + i);
    if (bias) v += load<T, A>(bias, c.first_channel + i);
    return v;
  }
};

// Backward sums over (x, dy): {w * dy, w * dy * (x - mean), dy, dy * (x - mean)}; the last
// two (per chunk, so per plane) give group norm's parameter gradients.
template <class T, class A, int N>
struct GradReduce {
  const T* weight;
  const A* mean;
  int64_t groups, group_channels, spatial;
  struct Context {
    A mean, w;
    int64_t first_channel;
  };
  __device__ Context context(int64_t row, int64_t begin) const {
    Context c{mean[row], A(1), (row % groups) * group_channels};
    if (spatial > 1 && weight) c.w = load<T, A>(weight, c.first_channel + begin / spatial);
    return c;
  }
  __device__ Sums<A, N> operator()(const Context& c, int64_t i, A x, A dy) const {
    A w = c.w;
    if (spatial == 1 && weight) w = load<T, A>(weight, c.first_channel + i);
    const A xc = x - c.mean;
    Sums<A, N> s;
    s.v[0] = w * dy;
    s.v[1] = w * dy * xc;
    if constexpr (N == 4) {
      s.v[2] = dy;
      s.v[3] = dy * xc;
    }
    return s;
  }
};

// Row info {mean, rstd, mean(w * dy), mean(w * dy * xhat)}.
template <class A, int N>
struct GradFinish {
  const A* mean;
  const A* rstd;
  A inv_len;
  __device__ RowInfo<A, 4> operator()(int64_t row, const Sums<A, N>& s) const {
    const A r = rstd[row];
    return {{mean[row], r, s.v[0] * inv_len, s.v[1] * r * inv_len}};
  }
};

// grad_x = rstd * (w * dy - mean(w * dy) - xhat * mean(w * dy * xhat)).
template <class T, class A>
struct GradApply {
  const T* weight;
  int64_t groups, group_channels, spatial;
  struct Context {
    RowInfo<A, 4> info;
    A w;
    int64_t first_channel;
  };
  __device__ Context context(int64_t row, int64_t begin, const RowInfo<A, 4>& info) const {
    Context c{info, A(1), (row % groups) * group_channels};
    if (spatial > 1 && weight) c.w = load<T, A>(weight, c.first_channel + begin / spatial);
    return c;
  }
  __device__ A operator()(const Context& c, int64_t i, A x, A dy) const {
    A w = c.w;
    if (spatial == 1 && weight) w = load<T, A>(weight, c.first_channel + i);
    const A r = c.info.v[1];
    return r * (w * dy - c.info.v[2] - (x - c.info.v[0]) * r * c.info.v[3]);
  }
};

// L1 and Frobenius: sums of |x| or x * x forward, of x * dy backward.
enum class NormSum { Abs, Square, Product };

template <class A, NormSum kind>
struct NormReduce {
  __device__ NoContext context(int64_t, int64_t) const { return {}; }
  __device__ Sums<A, 1> operator()(NoContext, int64_t, A x, A dy) const {
    if constexpr (kind == NormSum::Abs) return {{abs(x)}};
    if constexpr (kind == NormSum::Square) return {{x * x}};
    return {{x * dy}};
  }
};

// Forward: norm = mean |x| (L1) or sqrt(sum x * x) (Frobenius), stored; info {1 / max(norm, eps)}.
template <class A, bool kL1>
struct NormFinish {
  A* norm;
  A inv_size;
  A eps;
  __device__ RowInfo<A, 1> operator()(int64_t row, const Sums<A, 1>& s) const {
    const A n = kL1 ? s.v[0] * inv_size : sqrt(s.v[0]);
    norm[row] = n;
    return {{A(1) / clamped(n, eps)}};
  }
};

template <class A>
struct NormScale {
  __device__ A context(int64_t, int64_t, const RowInfo<A, 1>& info) const { return info.v[0]; }
  __device__ A operator()(A inv, int64_t, A x, A) const { return x * inv; }
};

// Backward info {max(norm, eps), through}: through = dot(dy, x) / (size * n^2) for L1,
// dot / n^3 for Frobenius, 0 where the clamp is active.
template <class A, bool kL1>
struct NormGradFinish {
  const A* norm;
  A size;
  A eps;
  __device__ RowInfo<A, 2> operator()(int64_t row, const Sums<A, 1>& s) const {
    const A n = norm[row];
    const A through = n >= eps ? (kL1 ? s.v[0] / (size * n * n) : s.v[0] / (n * n * n)) : A(0);
    return {{clamped(n, eps), through}};
  }
};

// grad_x = dy / max(norm, eps) - sign(x) * through (L1) or x * through (Frobenius).
template <class A, bool kL1>
struct NormGradApply {
  __device__ RowInfo<A, 2> context(int64_t, int64_t, const RowInfo<A, 2>& info) const { return info; }
  __device__ A operator()(const RowInfo<A, 2>& c, int64_t, A x, A dy) const {
    return dy / c.v[0] - (kL1 ? sign_of(x) : x) * c.v[1];
  }
};

// ---------------------------------------------------------------- 7. groups in shared memory
// Group norm over groups of 16384 elements or more that fit in one block's shared memory
// (about 227 KB: 58K f32 or 116K bf16 elements): one block of 1024 threads per group reads
// it once into shared memory, takes two-pass statistics there and writes y, so x crosses
// device memory once with no cross-block synchronization.
constexpr int kGroupThreads = 1024;

template <class T>
__global__ void __launch_bounds__(kGroupThreads) group_norm_smem_forward(
    int64_t rows, int64_t row_len, int64_t groups, int64_t group_channels, int64_t spatial, const T* __restrict__ x,
    const T* __restrict__ weight, const T* __restrict__ bias, compute_t<T> eps, T* __restrict__ y,
    compute_t<T>* __restrict__ mean_out, compute_t<T>* __restrict__ rstd_out) {
  using A = compute_t<T>;
  constexpr int V = 16 / sizeof(T);
  extern __shared__ __align__(16) unsigned char group_tile[];
  Vec<T, V>* tile = reinterpret_cast<Vec<T, V>*>(group_tile);
  const int64_t vecs = row_len / V;
  const A inv_len = A(1) / static_cast<A>(row_len);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * row_len;
    Sums<A, 1> sum{{A(0)}};
    for (int64_t j = threadIdx.x; j < vecs; j += kGroupThreads) {
      const Vec<T, V> v = load_last_use<T, V>(xr, j);
      tile[j] = v;
#pragma unroll
      for (int e = 0; e < V; ++e) sum.v[0] += convert<A>(v.v[e]);
    }
    const A mean = team_sum<kGroupThreads>(sum).v[0] * inv_len;
    Sums<A, 1> sq{{A(0)}};
    for (int64_t j = threadIdx.x; j < vecs; j += kGroupThreads) {
      const Vec<T, V> v = tile[j];
#pragma unroll
      for (int e = 0; e < V; ++e) sq.v[0] += (convert<A>(v.v[e]) - mean) * (convert<A>(v.v[e]) - mean);
    }
    const A rstd = A(1) / sqrt(team_sum<kGroupThreads>(sq).v[0] * inv_len + eps);
    if (threadIdx.x == 0) {
      mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
    const int64_t first_channel = (row % groups) * group_channels;
    T* yr = y + row * row_len;
    for (int64_t j = threadIdx.x; j < vecs; j += kGroupThreads) {
      // spatial is a multiple of V, so a vector lies within one channel.
      const int64_t channel = first_channel + j * V / spatial;
      const A scale = weight ? rstd * convert<A>(weight[channel]) : rstd;
      const A shift = bias ? convert<A>(bias[channel]) : A(0);
      const Vec<T, V> v = tile[j];
      Vec<T, V> out;
#pragma unroll
      for (int e = 0; e < V; ++e) out.v[e] = convert<T>((convert<A>(v.v[e]) - mean) * scale + shift);
      store_streaming<T, V>(yr, j, out);
    }
    __syncthreads();  // the next group overwrites the tile
  }
}

// Launches the shared-memory kernel when the group fits and is aligned; false otherwise.
template <class T>
bool group_norm_in_shared_memory(const GroupLayout& l, const T* x, const T* weight, const T* bias,
                                 compute_t<T> eps, T* y, compute_t<T>* mean, compute_t<T>* rstd, const char* op,
                                 int device, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  const int64_t row_len = l.row_len();
  if (l.spatial == 1 || l.spatial % V != 0 || row_len < kPipelineMinRow || !is_aligned(x, 16) ||
      !is_aligned(y, 16)) {
    return false;
  }
  const int max_smem = cuda_runtime::shared_memory_per_block(device);
  // team_sum's own buffer and the driver's reserve take a little of it.
  const int64_t bytes = row_len * static_cast<int64_t>(sizeof(T));
  if (bytes > max_smem - 1024) return false;
  auto kernel = group_norm_smem_forward<T>;
  NC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  int per_sm = 0;
  NC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kGroupThreads, static_cast<size_t>(bytes)));
  if (per_sm == 0) return false;
  const int64_t resident = static_cast<int64_t>(per_sm) * cuda_runtime::multiprocessor_count(device);
  const auto grid = static_cast<unsigned>(std::max<int64_t>(1, std::min(resident, l.rows())));
  kernel<<<grid, kGroupThreads, static_cast<size_t>(bytes), stream>>>(l.rows(), row_len, l.groups, l.group_channels,
                                                                     l.spatial, x, weight, bias, eps, y, mean, rstd);
  NC_CUDA_KERNEL_CHECK(op);
  return true;
}

// ---------------------------------------------------------------- 8. L1 rows read twice
// L1 forward along the last dim for rows of up to kL1RowBytes: one block of 1024 threads
// per SM takes a row at a time, sums |x|, then reads the row again to write x / norm.
// With one row per SM in flight the second read comes from L2 (132 rows of 256 KB fit in
// its 50 MB), so x crosses device memory about once. (The backward, with two inputs per
// row, measured slower this way than in the pipelined kernel and stays there.)
constexpr int kL1RowThreads = 1024;
constexpr int64_t kL1RowBytes = 256 << 10;

template <class T>
__global__ void __launch_bounds__(kL1RowThreads, 1) l1_rows_forward_kernel(int64_t rows, int64_t size,
                                                                            const T* __restrict__ x,
                                                                            T* __restrict__ y,
                                                                            compute_t<T>* __restrict__ norm,
                                                                            compute_t<T> eps) {
  using A = compute_t<T>;
  constexpr int V = 16 / sizeof(T);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t g0 = row * size, g1 = g0 + size;
    Sums<A, 1> acc{{A(0)}};
    visit_chunk<1, kL1RowThreads>(
        g0, g1, x, static_cast<const T*>(nullptr), true, [&](int64_t, A v, A) { acc.v[0] += abs(v); },
        [&](int64_t, const A (&v)[V], const A (&)[V]) {
#pragma unroll
          for (int j = 0; j < V; ++j) acc.v[0] += abs(v[j]);
        });
    const A n = team_sum<kL1RowThreads>(acc).v[0] / static_cast<A>(size);
    if (threadIdx.x == 0) norm[row] = n;
    const A inv = A(1) / clamped(n, eps);
    apply_chunk<1, kL1RowThreads>(g0, g1, x, static_cast<const T*>(nullptr), y, true,
                                  [&](int64_t, A v, A) { return v * inv; });
  }
}

// ---------------------------------------------------------------- affine norm forward
// Long rows, or groups of long planes, take the pipelined kernel.
bool takes_pipeline(const GroupLayout& l) {
  return l.row_len() >= kPipelineMinRow && (l.spatial == 1 || l.spatial >= kPipelineMinPlane);
}

template <class T>
void affine_norm_forward(const Tensor& x_t, const Tensor& weight_t, const Tensor& bias_t, const GroupLayout& l,
                         double eps, const Tensor& y_t, const Tensor& mean_t, const Tensor& rstd_t, const char* op) {
  using A = compute_t<T>;
  const int device = x_t.device().index;
  cuda_runtime::DeviceGuard guard(device);
  cudaStream_t stream = cuda_runtime::stream(device);
  const T* x = data_as<const T>(x_t);
  const T* weight = weight_t.defined() ? data_as<const T>(weight_t) : nullptr;
  const T* bias = bias_t.defined() ? data_as<const T>(bias_t) : nullptr;
  T* y = data_as<T>(y_t);
  A* mean = data_as<A>(mean_t);
  A* rstd = data_as<A>(rstd_t);
  const int64_t row_len = l.row_len();
  const A eps_a = static_cast<A>(eps);

  if (l.groups == 1 && l.spatial == 1) {
    const void* pointers[] = {x, weight, bias, y};
    const bool done = with_row_team<T>(row_len, pointers, 4, [&](auto team, auto vec) {
      constexpr int kTeam = decltype(team)::value, V = decltype(vec)::value, threads = team_block<kTeam>();
      auto kernel = layer_norm_rows_forward<T, kTeam, V>;
      const unsigned grid = row_grid(kernel, threads, l.rows(), threads / kTeam, device);
      kernel<<<grid, threads, 0, stream>>>(l.rows(), row_len, x, weight, bias, eps_a, y, mean, rstd);
      NC_CUDA_KERNEL_CHECK(op);
    });
    if (done) return;
  }
  const bool layer_norm = l.groups == 1 && l.spatial == 1;
  if (!layer_norm && l.rows() > 0 &&
      group_norm_in_shared_memory<T>(l, x, weight, bias, eps_a, y, mean, rstd, op, device, stream)) {
    return;
  }
  if (!layer_norm && takes_pipeline(l)) {
    const PipelineShape s = plan_pipeline(l.rows(), row_len, l.spatial == 1 ? row_len : l.spatial, sizeof(T), 1);
    cuda_runtime::DeviceBuffer partials(static_cast<size_t>(s.items) * sizeof(Welford<A>), device);
    run_pipeline<1, T, Welford<A>, RowInfo<A, 2>>(
        op, s, x, static_cast<const T*>(nullptr), y, partials.as<Welford<A>>(), StatsReduce<A>{},
        StatsFinish<A>{mean, rstd, eps_a}, AffineApplyPhase<T, A>{weight, bias, l.groups, l.group_channels, l.spatial},
        device, stream);
    return;
  }
  reduce_rows<Welford<A>>(
      op, l.rows(), row_len, [=] __device__(int64_t row, int64_t i) { return load<T, A>(x, row * row_len + i); },
      [=] __device__(int64_t row, const Welford<A>& w) {
        const A var = w.count > A(0) ? w.m2 / w.count : A(0);
        mean[row] = w.mean;
        rstd[row] = A(1) / sqrt(var + eps_a);
      },
      device, stream);
  if (layer_norm) {
    const void* pointers[] = {x, weight, bias, y};
    with_column_vector<T>(row_len, pointers, 4, [&](auto vec) {
      constexpr int V = decltype(vec)::value;
      const ColumnGrid g = column_grid_for(l.rows(), row_len / V, device);
      if (row_len == 0 || l.rows() == 0) return;
      layer_norm_columns_forward<T, V><<<g.grid, kBlock, 0, stream>>>(l.rows(), row_len, g.rows_per_slice, x, weight,
                                                                      bias, mean, rstd, y);
      NC_CUDA_KERNEL_CHECK(op);
    });
    return;
  }

  with_index_type(x_t.numel(), [&](auto index_tag) {
    using Index = decltype(index_tag);
    launch_elementwise<Index>(op, x_t.numel(),
                              AffineApply<Index, T, A>{ElementPlace<Index>(l), x, weight, bias, mean, rstd, y},
                              device, stream);
  });
}

// ---------------------------------------------------------------- affine norm backward
// grad_x = rstd * (w * dy - mean(w * dy) - xhat * mean(w * dy * xhat)) per row; the two row
// means are the coefficients [rows, 2].
//
// Parameter gradients, two layouts:
// - spatial == 1 (layer norm, group norm on [N, C]): a column reduction over the batch of
//   dy * xhat and dy, in slices of rows, then one fixed-order sum over the slices;
// - spatial > 1: per-plane (sample, channel) sums of dy and dy * (x - mean) give both the
//   row coefficients and the parameter gradients, so x and dy are read once for them.
constexpr int kColumnTile = 32;
constexpr int kColumnRows = kBlock / kColumnTile;

template <class T, class A>
__global__ void column_grads_kernel(const T* grad_y, const T* x, const A* mean, const A* rstd, int64_t batch,
                                    int64_t channels, int64_t groups, int64_t group_channels,
                                    int64_t rows_per_slice, A* partial_weight, A* partial_bias) {
  __shared__ A tile_w[kColumnRows][kColumnTile + 1];
  __shared__ A tile_b[kColumnRows][kColumnTile + 1];
  const int tx = threadIdx.x % kColumnTile, ty = threadIdx.x / kColumnTile;
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kColumnTile + tx;
  const int64_t slice = blockIdx.y;
  const int64_t begin = slice * rows_per_slice, end = min(begin + rows_per_slice, batch);
  A sum_w = 0, sum_b = 0;
  if (column < channels) {
    const int64_t group = column / group_channels;
    for (int64_t n = begin + ty; n < end; n += kColumnRows) {
      const int64_t row = n * groups + group;
      const A dy = load<T, A>(grad_y, n * channels + column);
      sum_w += dy * (load<T, A>(x, n * channels + column) - mean[row]) * rstd[row];
      sum_b += dy;
    }
  }
  tile_w[ty][tx] = sum_w;
  tile_b[ty][tx] = sum_b;
  __syncthreads();
  if (ty == 0 && column < channels) {
    for (int k = 1; k < kColumnRows; ++k) {
      sum_w += tile_w[k][tx];
      sum_b += tile_b[k][tx];
    }
    partial_weight[slice * channels + column] = sum_w;
    partial_bias[slice * channels + column] = sum_b;
  }
}

// out[c] = sum over k < count of partials[k * channels + c], in order of k.
template <class T, class A>
void sum_slices(const char* op, const A* partials, int64_t count, int64_t channels, T* out, int device,
                cudaStream_t stream) {
  for_each_index(op, channels, [=] __device__(int64_t c) {
    A total = 0;
    for (int64_t k = 0; k < count; ++k) total += partials[k * channels + c];
    out[c] = convert<T>(total);
  }, device, stream);
}

template <class T>
void affine_norm_backward(const Tensor& grad_y_t, const Tensor& x_t, const Tensor& weight_t, const Tensor& mean_t,
                          const Tensor& rstd_t, const GroupLayout& l, const Tensor& grad_x_t,
                          const Tensor& grad_weight_t, const Tensor& grad_bias_t, const char* op) {
  using A = compute_t<T>;
  const int device = x_t.device().index;
  cuda_runtime::DeviceGuard guard(device);
  cudaStream_t stream = cuda_runtime::stream(device);
  const T* grad_y = data_as<const T>(grad_y_t);
  const T* x = data_as<const T>(x_t);
  const T* weight = weight_t.defined() ? data_as<const T>(weight_t) : nullptr;
  const A* mean = data_as<const A>(mean_t);
  const A* rstd = data_as<const A>(rstd_t);
  const int64_t rows = l.rows(), row_len = l.row_len(), channels = l.channels();
  const int64_t batch = l.batch, groups = l.groups, group_channels = l.group_channels, spatial = l.spatial;
  const A inv_len = row_len > 0 ? A(1) / static_cast<A>(row_len) : A(0);

  // coefficients[row] = {mean(w * dy), mean(w * dy * xhat)}
  cuda_runtime::DeviceBuffer coefficients(static_cast<size_t>(std::max<int64_t>(rows, 1)) * 2 * sizeof(A), device);
  A* coef = coefficients.as<A>();

  T* grad_x = grad_x_t.defined() ? data_as<T>(grad_x_t) : nullptr;
  bool grad_x_done = false;
  if (grad_x && groups == 1 && spatial == 1) {
    // Layer-norm rows that fit in registers: grad_x in one pass over x and dy.
    const void* pointers[] = {grad_y, x, weight, grad_x};
    grad_x_done = with_row_team<T>(row_len, pointers, 4, [&](auto team, auto vec) {
      constexpr int kTeam = decltype(team)::value, V = decltype(vec)::value, threads = team_block<kTeam>();
      auto kernel = layer_norm_rows_backward<T, kTeam, V>;
      const unsigned grid = row_grid(kernel, threads, rows, threads / kTeam, device);
      kernel<<<grid, threads, 0, stream>>>(rows, row_len, grad_y, x, weight, mean, rstd, grad_x);
      NC_CUDA_KERNEL_CHECK(op);
    });
  }
  const bool layer_norm = groups == 1 && spatial == 1;
  const bool pipelined = !grad_x_done && grad_x && !layer_norm && takes_pipeline(l);
  if (pipelined && spatial == 1) {
    const PipelineShape s = plan_pipeline(rows, row_len, row_len, sizeof(T), 2);
    cuda_runtime::DeviceBuffer partials(static_cast<size_t>(s.items) * sizeof(Sums<A, 2>), device);
    run_pipeline<2, T, Sums<A, 2>, RowInfo<A, 4>>(
        op, s, x, grad_y, grad_x, partials.as<Sums<A, 2>>(),
        GradReduce<T, A, 2>{weight, mean, groups, group_channels, spatial}, GradFinish<A, 2>{mean, rstd, inv_len},
        GradApply<T, A>{weight, groups, group_channels, spatial}, device, stream);
  } else if (pipelined) {
    // Chunks lie within one plane, so the partials' plain sums are per (sample, channel).
    const PipelineShape s = plan_pipeline(rows, row_len, spatial, sizeof(T), 2);
    cuda_runtime::DeviceBuffer partial_buffer(static_cast<size_t>(s.items) * sizeof(Sums<A, 4>), device);
    const Sums<A, 4>* partials = partial_buffer.as<const Sums<A, 4>>();
    run_pipeline<2, T, Sums<A, 4>, RowInfo<A, 4>>(
        op, s, x, grad_y, grad_x, partial_buffer.as<Sums<A, 4>>(),
        GradReduce<T, A, 4>{weight, mean, groups, group_channels, spatial}, GradFinish<A, 4>{mean, rstd, inv_len},
        GradApply<T, A>{weight, groups, group_channels, spatial}, device, stream);
    T* grad_weight = grad_weight_t.defined() ? data_as<T>(grad_weight_t) : nullptr;
    T* grad_bias = grad_bias_t.defined() ? data_as<T>(grad_bias_t) : nullptr;
    if (grad_weight || grad_bias) {
      const int64_t chunks = s.chunks, pieces = s.pieces;
      for_each_index(op, channels, [=] __device__(int64_t c) {
        const int64_t group = c / group_channels, first = (c % group_channels) * pieces;
        A sum_w = 0, sum_b = 0;
        for (int64_t n = 0; n < batch; ++n) {
          const int64_t row = n * groups + group;
          A plane_w = 0;
          for (int64_t p = 0; p < pieces; ++p) {
            const Sums<A, 4>& part = partials[row * chunks + first + p];
            plane_w += part.v[3];
            sum_b += part.v[2];
          }
          sum_w += plane_w * rstd[row];
        }
        if (grad_weight) grad_weight[c] = convert<T>(sum_w);
        if (grad_bias) grad_bias[c] = convert<T>(sum_b);
      }, device, stream);
    }
    return;
  }
  if (spatial == 1) {
    if (!pipelined && !grad_x_done) reduce_rows<Sums<A, 2>>(
        op, rows, row_len,
        [=] __device__(int64_t row, int64_t i) {
          const int64_t e = row * row_len + i;
          const A w = weight ? load<T, A>(weight, (row % groups) * group_channels + i) : A(1);
          const A g = w * load<T, A>(grad_y, e);
          return Sums<A, 2>{{g, g * (load<T, A>(x, e) - mean[row])}};
        },
        [=] __device__(int64_t row, const Sums<A, 2>& s) {
          coef[2 * row] = s.v[0] * inv_len;
          coef[2 * row + 1] = s.v[1] * rstd[row] * inv_len;
        },
        device, stream);
    if (layer_norm && grad_x && !grad_x_done) {
      // grad_x and the parameter gradients in one column pass.
      const void* pointers[] = {grad_y, x, weight, grad_x};
      with_column_vector<T>(row_len, pointers, 4, [&](auto vec) {
        constexpr int V = decltype(vec)::value;
        const ColumnGrid g = column_grid_for(rows, row_len / V, device);
        const size_t partial_bytes = static_cast<size_t>(g.slices * row_len) * sizeof(A);
        cuda_runtime::DeviceBuffer partial_w(partial_bytes, device), partial_b(partial_bytes, device);
        if (rows == 0) {
          NC_CUDA_CHECK(cudaMemsetAsync(partial_w.as<void>(), 0, partial_bytes, stream));
          NC_CUDA_CHECK(cudaMemsetAsync(partial_b.as<void>(), 0, partial_bytes, stream));
        } else if (row_len > 0) {
          layer_norm_columns_backward<T, V><<<g.grid, kBlock, 0, stream>>>(
              rows, row_len, g.rows_per_slice, grad_y, x, weight, mean, rstd, coef, grad_x, partial_w.as<A>(),
              partial_b.as<A>());
          NC_CUDA_KERNEL_CHECK(op);
        }
        if (grad_weight_t.defined()) {
          sum_slices(op, partial_w.as<const A>(), g.slices, row_len, data_as<T>(grad_weight_t), device, stream);
        }
        if (grad_bias_t.defined()) {
          sum_slices(op, partial_b.as<const A>(), g.slices, row_len, data_as<T>(grad_bias_t), device, stream);
        }
      });
      return;
    }
    if (grad_weight_t.defined() || grad_bias_t.defined()) {
      const int64_t column_tiles = (channels + kColumnTile - 1) / kColumnTile;
      const int64_t target_blocks = 4 * static_cast<int64_t>(cuda_runtime::multiprocessor_count(device));
      int64_t slices = std::max<int64_t>(1, std::min<int64_t>((target_blocks + column_tiles - 1) / column_tiles,
                                                              (batch + kColumnRows - 1) / kColumnRows));
      slices = std::min<int64_t>(slices, 65535);
      const int64_t rows_per_slice = std::max<int64_t>(1, (batch + slices - 1) / slices);
      slices = std::max<int64_t>(1, (batch + rows_per_slice - 1) / rows_per_slice);
      cuda_runtime::DeviceBuffer partial_w(static_cast<size_t>(slices * channels) * sizeof(A), device);
      cuda_runtime::DeviceBuffer partial_b(static_cast<size_t>(slices * channels) * sizeof(A), device);
      if (channels > 0) {
        const dim3 grid(static_cast<unsigned>(column_tiles), static_cast<unsigned>(slices));
        column_grads_kernel<T, A><<<grid, kBlock, 0, stream>>>(grad_y, x, mean, rstd, batch, channels, groups,
                                                               group_channels, rows_per_slice, partial_w.as<A>(),
                                                               partial_b.as<A>());
        NC_CUDA_KERNEL_CHECK(op);
      }
      if (grad_weight_t.defined()) {
        sum_slices(op, partial_w.as<const A>(), slices, channels, data_as<T>(grad_weight_t), device, stream);
      }
      if (grad_bias_t.defined()) {
        sum_slices(op, partial_b.as<const A>(), slices, channels, data_as<T>(grad_bias_t), device, stream);
      }
    }
  } else {
    // plane_sums[plane] = {sum(dy), sum(dy * (x - mean))} over the plane's spatial extent.
    const int64_t planes = batch * channels;
    cuda_runtime::DeviceBuffer plane_buffer(static_cast<size_t>(std::max<int64_t>(planes, 1)) * sizeof(Sums<A, 2>),
                                            device);
    Sums<A, 2>* plane_sums = plane_buffer.as<Sums<A, 2>>();
    reduce_rows<Sums<A, 2>>(
        op, planes, spatial,
        [=] __device__(int64_t plane, int64_t s) {
          const int64_t e = plane * spatial + s;
          const A dy = load<T, A>(grad_y, e);
          return Sums<A, 2>{{dy, dy * (load<T, A>(x, e) - mean[plane / group_channels])}};
        },
        [=] __device__(int64_t plane, const Sums<A, 2>& s) { plane_sums[plane] = s; }, device, stream);
    for_each_index(op, rows, [=] __device__(int64_t row) {
      const int64_t first_channel = (row % groups) * group_channels;
      A sum_g = 0, sum_g_xc = 0;
      for (int64_t c = 0; c < group_channels; ++c) {
        const A w = weight ? load<T, A>(weight, first_channel + c) : A(1);
        const Sums<A, 2>& s = plane_sums[row * group_channels + c];
        sum_g += w * s.v[0];
        sum_g_xc += w * s.v[1];
      }
      coef[2 * row] = sum_g * inv_len;
      coef[2 * row + 1] = sum_g_xc * rstd[row] * inv_len;
    }, device, stream);
    T* grad_weight = grad_weight_t.defined() ? data_as<T>(grad_weight_t) : nullptr;
    T* grad_bias = grad_bias_t.defined() ? data_as<T>(grad_bias_t) : nullptr;
    if (grad_weight || grad_bias) {
      for_each_index(op, channels, [=] __device__(int64_t c) {
        const int64_t group = c / group_channels;
        A sum_w = 0, sum_b = 0;
        for (int64_t n = 0; n < batch; ++n) {
          const Sums<A, 2>& s = plane_sums[n * channels + c];
          sum_w += s.v[1] * rstd[n * groups + group];
          sum_b += s.v[0];
        }
        if (grad_weight) grad_weight[c] = convert<T>(sum_w);
        if (grad_bias) grad_bias[c] = convert<T>(sum_b);
      }, device, stream);
    }
  }

  if (!grad_x || pipelined || grad_x_done) return;
  with_index_type(x_t.numel(), [&](auto index_tag) {
    using Index = decltype(index_tag);
    launch_elementwise<Index>(
        op, x_t.numel(),
        AffineGradInput<Index, T, A>{ElementPlace<Index>(l), grad_y, x, weight, mean, rstd, coef, grad_x}, device,
        stream);
  });
}

// ---------------------------------------------------------------- L1 and Frobenius
// L1 norm with inner > 1: one thread per (outer, inner) column walks the normalized dim;
// neighbouring threads read neighbouring addresses.
template <class T, class A>
__global__ void l1_columns_forward_kernel(const T* x, int64_t outer, int64_t size, int64_t inner, A eps, T* y,
                                          A* norm) {
  const int64_t column = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= outer * inner) return;
  const int64_t o = column / inner, j = column % inner;
  const int64_t base = o * size * inner + j;
  A sum = 0;
  for (int64_t k = 0; k < size; ++k) sum += abs(load<T, A>(x, base + k * inner));
  const A n = size > 0 ? sum / static_cast<A>(size) : A(0);
  norm[column] = n;
  const A inv = A(1) / clamped(n, eps);
  for (int64_t k = 0; k < size; ++k) y[base + k * inner] = convert<T>(load<T, A>(x, base + k * inner) * inv);
}

template <class T, class A>
__global__ void l1_columns_backward_kernel(const T* grad_y, const T* x, const A* norm, int64_t outer, int64_t size,
                                           int64_t inner, A eps, T* grad_x) {
  const int64_t column = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= outer * inner) return;
  const int64_t o = column / inner, j = column % inner;
  const int64_t base = o * size * inner + j;
  const A n = norm[column], d = clamped(n, eps);
  A through = 0;
  if (n >= eps) {
    A dot = 0;
    for (int64_t k = 0; k < size; ++k) dot += load<T, A>(grad_y, base + k * inner) * load<T, A>(x, base + k * inner);
    through = dot / (static_cast<A>(size) * n * n);
  }
  for (int64_t k = 0; k < size; ++k) {
    const int64_t i = base + k * inner;
    grad_x[i] = convert<T>(load<T, A>(grad_y, i) / d - sign_of(load<T, A>(x, i)) * through);
  }
}

// y = x / max(norm[row], eps) for rows of row_len.
template <class Index, class T, class A>
struct RowScale {
  IntDivider<Index> row_of;
  const T* x;
  const A* norm;
  A eps;
  T* y;
  __device__ __forceinline__ void operator()(Index e) const {
    y[e] = convert<T>(load<T, A>(x, e) / clamped(norm[row_of.div(e)], eps));
  }
};

// grad_x = dy / max(norm, eps) - sign(x) * through[row].
template <class Index, class T, class A>
struct L1GradInput {
  IntDivider<Index> row_of;
  const T* grad_y;
  const T* x;
  const A* norm;
  const A* through;
  A eps;
  T* grad_x;
  __device__ __forceinline__ void operator()(Index e) const {
    const Index row = row_of.div(e);
    grad_x[e] = convert<T>(load<T, A>(grad_y, e) / clamped(norm[row], eps) - sign_of(load<T, A>(x, e)) * through[row]);
  }
};

unsigned column_grid(int64_t columns) { return static_cast<unsigned>((columns + kBlock - 1) / kBlock); }

template <class T>
void l1_forward(const Tensor& x_t, int64_t outer, int64_t size, int64_t inner, double eps, const Tensor& y_t,
                const Tensor& norm_t) {
  using A = compute_t<T>;
  const char* op = "l1_norm";
  const int device = x_t.device().index;
  cuda_runtime::DeviceGuard guard(device);
  cudaStream_t stream = cuda_runtime::stream(device);
  const T* x = data_as<const T>(x_t);
  T* y = data_as<T>(y_t);
  A* norm = data_as<A>(norm_t);
  const A eps_a = static_cast<A>(eps);
  if (inner > 1) {
    if (outer * inner == 0) return;
    l1_columns_forward_kernel<T, A><<<column_grid(outer * inner), kBlock, 0, stream>>>(x, outer, size, inner, eps_a,
                                                                                       y, norm);
    NC_CUDA_KERNEL_CHECK(op);
    return;
  }
  const A inv_size = size > 0 ? A(1) / static_cast<A>(size) : A(0);
  if (size >= kPipelineMinRow && size * static_cast<int64_t>(sizeof(T)) <= kL1RowBytes) {
    const auto grid = static_cast<unsigned>(
        std::max<int64_t>(1, std::min<int64_t>(outer, cuda_runtime::multiprocessor_count(device))));
    l1_rows_forward_kernel<T><<<grid, kL1RowThreads, 0, stream>>>(outer, size, x, y, norm, eps_a);
    NC_CUDA_KERNEL_CHECK(op);
    return;
  }
  if (size >= kPipelineMinRow) {
    const PipelineShape s = plan_pipeline(outer, size, size, sizeof(T), 1);
    cuda_runtime::DeviceBuffer partials(static_cast<size_t>(s.items) * sizeof(Sums<A, 1>), device);
    run_pipeline<1, T, Sums<A, 1>, RowInfo<A, 1>>(op, s, x, static_cast<const T*>(nullptr), y,
                                                 partials.as<Sums<A, 1>>(), NormReduce<A, NormSum::Abs>{},
                                                 NormFinish<A, true>{norm, inv_size, eps_a}, NormScale<A>{}, device,
                                                 stream);
    return;
  }
  reduce_rows<Sums<A, 1>>(
      op, outer, size, [=] __device__(int64_t row, int64_t i) { return Sums<A, 1>{{abs(load<T, A>(x, row * size + i))}}; },
      [=] __device__(int64_t row, const Sums<A, 1>& s) { norm[row] = s.v[0] * inv_size; }, device, stream);
  with_index_type(x_t.numel(), [&](auto index_tag) {
    using Index = decltype(index_tag);
    launch_elementwise<Index>(
        op, x_t.numel(), RowScale<Index, T, A>{IntDivider<Index>(static_cast<Index>(size)), x, norm, eps_a, y},
        device, stream);
  });
}

template <class T>
void l1_backward(const Tensor& grad_y_t, const Tensor& x_t, const Tensor& norm_t, int64_t outer, int64_t size,
                 int64_t inner, double eps, const Tensor& grad_x_t) {
  using A = compute_t<T>;
  const char* op = "l1_norm backward";
  const int device = x_t.device().index;
  cuda_runtime::DeviceGuard guard(device);
  cudaStream_t stream = cuda_runtime::stream(device);
  const T* grad_y = data_as<const T>(grad_y_t);
  const T* x = data_as<const T>(x_t);
  const A* norm = data_as<const A>(norm_t);
  T* grad_x = data_as<T>(grad_x_t);
  const A eps_a = static_cast<A>(eps);
  if (inner > 1) {
    if (outer * inner == 0) return;
    l1_columns_backward_kernel<T, A><<<column_grid(outer * inner), kBlock, 0, stream>>>(grad_y, x, norm, outer, size,
                                                                                        inner, eps_a, grad_x);
    NC_CUDA_KERNEL_CHECK(op);
    return;
  }
  if (size >= kPipelineMinRow) {
    const PipelineShape s = plan_pipeline(outer, size, size, sizeof(T), 2);
    cuda_runtime::DeviceBuffer partials(static_cast<size_t>(s.items) * sizeof(Sums<A, 1>), device);
    run_pipeline<2, T, Sums<A, 1>, RowInfo<A, 2>>(op, s, x, grad_y, grad_x, partials.as<Sums<A, 1>>(),
                                                 NormReduce<A, NormSum::Product>{},
                                                 NormGradFinish<A, true>{norm, static_cast<A>(size), eps_a},
                                                 NormGradApply<A, true>{}, device, stream);
    return;
  }
  // through[row] = dot(dy, x) / (size * n^2), 0 where the clamp is active.
  cuda_runtime::DeviceBuffer through_buffer(static_cast<size_t>(std::max<int64_t>(outer, 1)) * sizeof(A), device);
  A* through = through_buffer.as<A>();
  const A size_a = static_cast<A>(size);
  reduce_rows<Sums<A, 1>>(
      op, outer, size,
      [=] __device__(int64_t row, int64_t i) {
        const int64_t e = row * size + i;
        return Sums<A, 1>{{load<T, A>(grad_y, e) * load<T, A>(x, e)}};
      },
      [=] __device__(int64_t row, const Sums<A, 1>& s) {
        const A n = norm[row];
        through[row] = n >= eps_a ? s.v[0] / (size_a * n * n) : A(0);
      },
      device, stream);
  with_index_type(x_t.numel(), [&](auto index_tag) {
    using Index = decltype(index_tag);
    launch_elementwise<Index>(op, x_t.numel(),
                              L1GradInput<Index, T, A>{IntDivider<Index>(static_cast<Index>(size)), grad_y, x, norm,
                                                       through, eps_a, grad_x},
                              device, stream);
  });
}

template <class T>
void frobenius_forward(const Tensor& x_t, double eps, const Tensor& y_t, const Tensor& norm_t) {
  using A = compute_t<T>;
  const char* op = "frobenius_norm";
  const int device = x_t.device().index;
  cuda_runtime::DeviceGuard guard(device);
  cudaStream_t stream = cuda_runtime::stream(device);
  const T* x = data_as<const T>(x_t);
  T* y = data_as<T>(y_t);
  A* norm = data_as<A>(norm_t);
  const A eps_a = static_cast<A>(eps);
  const int64_t numel = x_t.numel();
  if (numel >= kPipelineMinRow) {
    const PipelineShape s = plan_pipeline(1, numel, numel, sizeof(T), 1);
    cuda_runtime::DeviceBuffer partials(static_cast<size_t>(s.items) * sizeof(Sums<A, 1>), device);
    run_pipeline<1, T, Sums<A, 1>, RowInfo<A, 1>>(op, s, x, static_cast<const T*>(nullptr), y,
                                                 partials.as<Sums<A, 1>>(), NormReduce<A, NormSum::Square>{},
                                                 NormFinish<A, false>{norm, A(0), eps_a}, NormScale<A>{}, device,
                                                 stream);
    return;
  }
  reduce_rows<Sums<A, 1>>(
      op, 1, x_t.numel(),
      [=] __device__(int64_t, int64_t i) {
        const A v = load<T, A>(x, i);
        return Sums<A, 1>{{v * v}};
      },
      [=] __device__(int64_t, const Sums<A, 1>& s) { *norm = sqrt(s.v[0]); }, device, stream);
  for_each_index(op, x_t.numel(), [=] __device__(int64_t e) {
    y[e] = convert<T>(load<T, A>(x, e) * (A(1) / clamped(*norm, eps_a)));
  }, device, stream);
}

template <class T>
void frobenius_backward(const Tensor& grad_y_t, const Tensor& x_t, const Tensor& norm_t, double eps,
                        const Tensor& grad_x_t) {
  using A = compute_t<T>;
  const char* op = "frobenius_norm backward";
  const int device = x_t.device().index;
  cuda_runtime::DeviceGuard guard(device);
  cudaStream_t stream = cuda_runtime::stream(device);
  const T* grad_y = data_as<const T>(grad_y_t);
  const T* x = data_as<const T>(x_t);
  const A* norm = data_as<const A>(norm_t);
  T* grad_x = data_as<T>(grad_x_t);
  const A eps_a = static_cast<A>(eps);
  const int64_t numel = x_t.numel();
  if (numel >= kPipelineMinRow) {
    const PipelineShape s = plan_pipeline(1, numel, numel, sizeof(T), 2);
    cuda_runtime::DeviceBuffer partials(static_cast<size_t>(s.items) * sizeof(Sums<A, 1>), device);
    run_pipeline<2, T, Sums<A, 1>, RowInfo<A, 2>>(op, s, x, grad_y, grad_x, partials.as<Sums<A, 1>>(),
                                                 NormReduce<A, NormSum::Product>{},
                                                 NormGradFinish<A, false>{norm, A(1), eps_a},
                                                 NormGradApply<A, false>{}, device, stream);
    return;
  }
  // through = dot(dy, x) / n^3, 0 where the clamp is active.
  cuda_runtime::DeviceBuffer through_buffer(sizeof(A), device);
  A* through = through_buffer.as<A>();
  reduce_rows<Sums<A, 1>>(
      op, 1, x_t.numel(),
      [=] __device__(int64_t, int64_t i) { return Sums<A, 1>{{load<T, A>(grad_y, i) * load<T, A>(x, i)}}; },
      [=] __device__(int64_t, const Sums<A, 1>& s) {
        const A n = *norm;
        *through = n >= eps_a ? s.v[0] / (n * n * n) : A(0);
      },
      device, stream);
  for_each_index(op, x_t.numel(), [=] __device__(int64_t e) {
    grad_x[e] = convert<T>(load<T, A>(grad_y, e) / clamped(*norm, eps_a) - load<T, A>(x, e) * *through);
  }, device, stream);
}

GroupLayout layer_layout(int64_t rows, int64_t row_len) { return {rows, 1, row_len, 1}; }
GroupLayout group_layout(int64_t batch, int64_t groups, int64_t channels, int64_t spatial) {
  return {batch, groups, groups > 0 ? channels / groups : 0, spatial};
}

}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t rows, int64_t row_len,
                        double eps, const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  dispatch_floating(x.dtype(), "layer_norm", [&](auto tag) {
    affine_norm_forward<typename decltype(tag)::type>(x, weight, bias, layer_layout(rows, row_len), eps, y, mean,
                                                      rstd, "layer_norm");
  });
}

void layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, int64_t rows, int64_t row_len, const Tensor& grad_x,
                         const Tensor& grad_weight, const Tensor& grad_bias) {
  dispatch_floating(x.dtype(), "layer_norm backward", [&](auto tag) {
    affine_norm_backward<typename decltype(tag)::type>(grad_y, x, weight, mean, rstd, layer_layout(rows, row_len),
                                                       grad_x, grad_weight, grad_bias, "layer_norm backward");
  });
}

void group_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t batch, int64_t groups,
                        int64_t channels, int64_t spatial, double eps, const Tensor& y, const Tensor& mean,
                        const Tensor& rstd) {
  dispatch_floating(x.dtype(), "group_norm", [&](auto tag) {
    affine_norm_forward<typename decltype(tag)::type>(x, weight, bias, group_layout(batch, groups, channels, spatial),
                                                      eps, y, mean, rstd, "group_norm");
  });
}

void group_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, int64_t batch, int64_t groups, int64_t channels, int64_t spatial,
                         const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias) {
  dispatch_floating(x.dtype(), "group_norm backward", [&](auto tag) {
    affine_norm_backward<typename decltype(tag)::type>(grad_y, x, weight, mean, rstd,
                                                       group_layout(batch, groups, channels, spatial), grad_x,
                                                       grad_weight, grad_bias, "group_norm backward");
  });
}

void l1_norm_forward(const Tensor& x, int64_t outer, int64_t size, int64_t inner, double eps, const Tensor& y,
                     const Tensor& norm) {
  dispatch_floating(x.dtype(), "l1_norm", [&](auto tag) {
    l1_forward<typename decltype(tag)::type>(x, outer, size, inner, eps, y, norm);
  });
}

void l1_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& norm, int64_t outer, int64_t size,
                      int64_t inner, double eps, const Tensor& grad_x) {
  dispatch_floating(x.dtype(), "l1_norm backward", [&](auto tag) {
    l1_backward<typename decltype(tag)::type>(grad_y, x, norm, outer, size, inner, eps, grad_x);
  });
}

void frobenius_norm_forward(const Tensor& x, double eps, const Tensor& y, const Tensor& norm) {
  dispatch_floating(x.dtype(), "frobenius_norm", [&](auto tag) {
    frobenius_forward<typename decltype(tag)::type>(x, eps, y, norm);
  });
}

void frobenius_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& norm, double eps,
                             const Tensor& grad_x) {
  dispatch_floating(x.dtype(), "frobenius_norm backward", [&](auto tag) {
    frobenius_backward<typename decltype(tag)::type>(grad_y, x, norm, eps, grad_x);
  });
}

}  // namespace cuda_kernels
}  // namespace normcore
