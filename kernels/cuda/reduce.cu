// CUDA reductions (contracts in kernels/reduce.h): x contiguous [rows, row_len] -> out
// [rows] (reduce), and values plus first indices of the max/min (arg_reduce). One kernel family serves every op: a thread,
// a group of lanes or a whole block per row depending on row_len, and for a few very long
// rows a two-stage reduction through per-chunk partials. Results are deterministic for a
// given device (a fixed combination order, no floating-point atomics). f16/bf16/f32
// accumulate in float, f64 in double, integers and bool in int64 (Sum, Prod).
#include <limits>

#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/reduction/combine.cuh"
#include "kernels/reduce.h"

namespace normcore {
namespace cuda {
namespace {

// ---------------------------------------------------------------- reduction parts
// A reduction: acc = combine over the row of map(x, row, col), starting from init, then
// store(row, acc). map and store see the row so that a pass can use per-row data (the
// mean, in the variance's second pass) and arg_reduce can keep the column.
template <class InT, class AccT, class Map, class Combine, class Store>
struct Reduction {
  using In = InT;
  using Acc = AccT;
  AccT init;
  Map map;
  Combine combine;
  Store store;
};

template <class In, class Acc, class Map, class Combine, class Store>
Reduction<In, Acc, Map, Combine, Store> make_reduction(Acc init, Map map, Combine combine, Store store) {
  return {init, map, combine, store};
}

template <class C>
__device__ __forceinline__ bool is_nan(C x) {
  return x != x;
}

template <class Acc>
struct MapConvert {
  template <class In>
  __device__ __forceinline__ Acc operator()(In x, int64_t, int64_t) const {
    return convert<Acc>(x);
  }
};

template <class Acc>
struct MapAbs {
  template <class In>
  __device__ __forceinline__ Acc operator()(In x, int64_t, int64_t) const {
    const Acc v = convert<Acc>(x);
    return v < Acc(0) ? -v : v;
  }
};

template <class Acc>
struct MapSquare {
  template <class In>
  __device__ __forceinline__ Acc operator()(In x, int64_t, int64_t) const {
    const Acc v = convert<Acc>(x);
    return v * v;
  }
};

template <class Acc>
struct MapAbsPow {
  Acc p;
  template <class In>
  __device__ __forceinline__ Acc operator()(In x, int64_t, int64_t) const {
    const Acc v = convert<Acc>(x);
    return pow(v < Acc(0) ? -v : v, p);
  }
};

// The variance's second pass sums the deviations from the first pass's mean and their
// squares (Sums<Acc, 2>). The mean carries a rounding error e, which adds n e^2 to the sum of
// squares; the sum of deviations (n e) lets the store take that back out ("corrected
// two-pass", Chan, Golub and LeVeque), which matters when the spread is near the mean's last
// bits.
template <class Acc>
struct MapDeviation {
  const Acc* mean;  // per row, from the first pass
  template <class In>
  __device__ __forceinline__ Sums<Acc, 2> operator()(In x, int64_t row, int64_t) const {
    const Acc d = convert<Acc>(x) - mean[row];
    return {{d, d * d}};
  }
};

struct MapNonZero {
  template <class In>
  __device__ __forceinline__ int operator()(In x, int64_t, int64_t) const {
    return convert<bool>(x) ? 1 : 0;
  }
};

// The second stage of a two-stage reduction reads partial results as they are.
struct MapIdentity {
  template <class Acc>
  __device__ __forceinline__ Acc operator()(Acc x, int64_t, int64_t) const {
    return x;
  }
};

struct Times {
  template <class Acc>
  __device__ __forceinline__ Acc operator()(Acc a, Acc b) const {
    return a * b;
  }
};
struct MaxNan {
  template <class Acc>
  __device__ __forceinline__ Acc operator()(Acc a, Acc b) const {
    return is_nan(a) ? a : (is_nan(b) ? b : (a > b ? a : b));
  }
};
struct MinNan {
  template <class Acc>
  __device__ __forceinline__ Acc operator()(Acc a, Acc b) const {
    return is_nan(a) ? a : (is_nan(b) ? b : (a < b ? a : b));
  }
};
struct LogicalAnd {
  __device__ __forceinline__ int operator()(int a, int b) const { return a & b; }
};
struct LogicalOr {
  __device__ __forceinline__ int operator()(int a, int b) const { return a | b; }
};

template <class Out>
struct StoreConvert {
  Out* out;
  template <class Acc>
  __device__ __forceinline__ void operator()(int64_t row, Acc a) const {
    out[row] = convert<Out>(a);
  }
};

// out = acc / divisor (the mean); also the first pass of the variance, into a float buffer.
template <class Out, class Acc>
struct StoreDivided {
  Out* out;
  Acc divisor;
  __device__ __forceinline__ void operator()(int64_t row, Acc a) const { out[row] = convert<Out>(a / divisor); }
};

// out = (sum of squared deviations, corrected) / divisor, NaN when the divisor
// (row_len - correction) is not positive.
template <class Out, class Acc>
struct StoreVariance {
  Out* out;
  Acc row_len;
  Acc divisor;
  __device__ __forceinline__ void operator()(int64_t row, const Sums<Acc, 2>& a) const {
    const Acc sum = a.v[0], sum_sq = max(a.v[1] - sum * sum / row_len, Acc(0));
    out[row] = convert<Out>(divisor > Acc(0) ? sum_sq / divisor : Acc(NAN));
  }
};

template <class Out, class Acc>
struct StoreSqrt {
  Out* out;
  __device__ __forceinline__ void operator()(int64_t row, Acc a) const { out[row] = convert<Out>(sqrt(a)); }
};

template <class Out, class Acc>
struct StoreRoot {
  Out* out;
  Acc inverse_p;
  __device__ __forceinline__ void operator()(int64_t row, Acc a) const { out[row] = convert<Out>(pow(a, inverse_p)); }
};

template <class Acc>
struct StorePartial {
  Acc* partials;
  __device__ __forceinline__ void operator()(int64_t index, Acc a) const { partials[index] = a; }
};

// arg_reduce: the running best value and its column (ArgBest, combined by ArgCombine).
template <class C>
struct MapArg {
  template <class In>
  __device__ __forceinline__ ArgBest<C> operator()(In x, int64_t, int64_t col) const {
    return {convert<C>(x), col};
  }
};

template <class T, class C>
struct StoreArg {
  T* values;
  int64_t* indices;
  __device__ __forceinline__ void operator()(int64_t row, const ArgBest<C>& a) const {
    values[row] = convert<T>(a.value);
    indices[row] = a.index;
  }
};

// ---------------------------------------------------------------- kernels
// Elements of In in one 16-byte load (partial results wider than that load one at a time).
template <class In>
constexpr int vec_elements() {
  return sizeof(In) >= 16 ? 1 : static_cast<int>(16 / sizeof(In));
}

// Accumulates columns [begin, end) of one row, strided over `lanes` cooperating threads:
// a scalar head up to the first 16-byte boundary, 16-byte vectors, a scalar tail. Each
// vector slot keeps its own accumulator (more loads in flight, shorter sums).
template <class R>
__device__ __forceinline__ typename R::Acc accumulate(const R& r, const typename R::In* row, int64_t begin, int64_t end,
                                                      int64_t row_index, int lane, int lanes) {
  using In = typename R::In;
  using Acc = typename R::Acc;
  constexpr int N = vec_elements<In>();
  using V = Vec<In, N>;
  Acc acc[N];
#pragma unroll
  for (int j = 0; j < N; ++j) acc[j] = r.init;

  const auto address = reinterpret_cast<uintptr_t>(row + begin);
  const int64_t head = static_cast<int64_t>((sizeof(V) - address % sizeof(V)) % sizeof(V) / sizeof(In));
  const int64_t body_begin = min(end, begin + head);
  for (int64_t c = begin + lane; c < body_begin; c += lanes) acc[0] = r.combine(acc[0], r.map(row[c], row_index, c));

  const int64_t vectors = (end - body_begin) / N;
  const V* body = reinterpret_cast<const V*>(row + body_begin);
  for (int64_t v = lane; v < vectors; v += lanes) {
    const V x = body[v];
#pragma unroll
    for (int j = 0; j < N; ++j) acc[j] = r.combine(acc[j], r.map(x.v[j], row_index, body_begin + v * N + j));
  }
  for (int64_t c = body_begin + vectors * N + lane; c < end; c += lanes) {
    acc[0] = r.combine(acc[0], r.map(row[c], row_index, c));
  }
#pragma unroll
  for (int j = 1; j < N; ++j) acc[0] = r.combine(acc[0], acc[j]);
  return acc[0];
}

// G lanes per row (G <= 32), kThreads / G rows per block: for short rows.
template <int G, class R>
__global__ void __launch_bounds__(kThreads)
    reduce_rows_grouped(R r, const typename R::In* x, int64_t rows, int64_t row_len) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / G) + threadIdx.x / G;
  const int lane = threadIdx.x % G;
  typename R::Acc acc = r.init;
  if (row < rows) acc = accumulate(r, x + row * row_len, 0, row_len, row, lane, G);
  acc = warp_reduce<G>(acc, r.combine);  // every lane takes part in the shuffles
  if (row < rows && lane == 0) r.store(row, acc);
}

// One block per (row, chunk of chunk_len columns): for long rows. Stores at index
// row * chunks + chunk, which is the row itself when there is one chunk.
template <int BLOCK, class R>
__global__ void __launch_bounds__(BLOCK)
    reduce_rows_blocked(R r, const typename R::In* x, int64_t row_len, int64_t chunk_len) {
  const int64_t row = blockIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * chunk_len;
  const int64_t end = min(row_len, begin + chunk_len);
  typename R::Acc acc = accumulate(r, x + row * row_len, begin, end, row, threadIdx.x, BLOCK);
  acc = team_reduce<BLOCK>(acc, r.combine);
  if (threadIdx.x == 0) r.store(row * gridDim.y + blockIdx.y, acc);
}

template <int G, class R>
void launch_grouped(const Launcher& launch, const R& r, const typename R::In* x, int64_t rows, int64_t row_len) {
  launch(reduce_rows_grouped<G, R>, static_cast<unsigned>(ceil_div(rows, kThreads / G)), kThreads, 0, r, x, rows,
         row_len);
}

constexpr int kRowBlock = 512;
// Rows at least this long, when there are too few of them to fill the device, are split
// into chunks of at least kSplitMinChunk columns reduced by separate blocks.
constexpr int64_t kSplitRowLen = 32768;
constexpr int64_t kSplitMinChunk = 8192;

// Runs the reduction over x [rows, row_len].
template <class R>
void run_reduction(const Launcher& launch, const R& r, const typename R::In* x, int64_t rows, int64_t row_len) {
  if (rows == 0) return;
  // Short rows: enough lanes per row for about one to four 16-byte loads each.
  const int64_t vectors = ceil_div(row_len, vec_elements<typename R::In>());
  if (vectors <= 2) return launch_grouped<1>(launch, r, x, rows, row_len);
  if (vectors <= 16) return launch_grouped<4>(launch, r, x, rows, row_len);
  if (vectors <= 512) return launch_grouped<32>(launch, r, x, rows, row_len);

  const int64_t sms = launch.multiprocessors();
  int64_t chunks = 1;
  if (rows < 2 * sms && row_len >= kSplitRowLen) {
    chunks = std::min({ceil_div(row_len, kSplitMinChunk), ceil_div(4 * sms, rows), int64_t{65535}});
  }
  const int64_t chunk_len = ceil_div(row_len, chunks);
  chunks = ceil_div(row_len, chunk_len);  // no empty chunk
  if (chunks == 1) {
    launch(reduce_rows_blocked<kRowBlock, R>, static_cast<unsigned>(rows), kRowBlock, 0, r, x, row_len, row_len);
    return;
  }
  using Acc = typename R::Acc;
  const DeviceBuffer partials = launch.buffer(static_cast<size_t>(rows * chunks) * sizeof(Acc));
  const auto stage1 = make_reduction<typename R::In>(r.init, r.map, r.combine, StorePartial<Acc>{partials.as<Acc>()});
  launch(reduce_rows_blocked<kRowBlock, decltype(stage1)>,
         dim3(static_cast<unsigned>(rows), static_cast<unsigned>(chunks)), kRowBlock, 0, stage1, x, row_len, chunk_len);
  const auto stage2 = make_reduction<Acc>(r.init, MapIdentity{}, r.combine, r.store);
  launch_grouped<32>(launch, stage2, partials.as<const Acc>(), rows, chunks);
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Prod: return "prod";
    case ReduceOp::Mean: return "mean";
    case ReduceOp::Var: return "var";
    case ReduceOp::Norm: return "norm";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::All: return "all";
    case ReduceOp::Any: return "any";
  }
  return "reduce";
}

class CudaReduce final : public kernels::ReduceKernels {
 public:
  void reduce(ReduceOp op, const Tensor& out, const Tensor& x, double arg) const override;
  void arg_reduce(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& x) const override;
};

// f16, bf16 and f32 accumulate in float, f64 in double (compute_t), integers and bool in
// int64 (Sum, Prod).
void CudaReduce::reduce(ReduceOp op, const Tensor& out, const Tensor& x, double arg) const {
  const int64_t rows = out.numel();
  if (rows == 0) return;
  const int64_t row_len = x.numel() / rows;
  const char* name = reduce_op_name(op);
  const Launcher launch(name, out);

  auto run = [&](const auto& r) {
    using In = typename std::decay_t<decltype(r)>::In;
    run_reduction(launch, r, data_as<const In>(x), rows, row_len);
  };

  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Prod:
      return visit(x.dtype(), name, [&](auto tag) {
        using T = typename decltype(tag)::type;
        using Acc = std::conditional_t<is_floating_v<T>, compute_t<T>, int64_t>;
        using Out = std::conditional_t<is_floating_v<T>, T, int64_t>;
        StoreConvert<Out> store{data_as<Out>(out)};
        if (op == ReduceOp::Sum) run(make_reduction<T>(Acc(0), MapConvert<Acc>{}, Plus{}, store));
        else run(make_reduction<T>(Acc(1), MapConvert<Acc>{}, Times{}, store));
      });
    case ReduceOp::Mean:
      return visit_float(x.dtype(), name, [&](auto tag) {
        using T = typename decltype(tag)::type;
        using Acc = compute_t<T>;
        StoreDivided<T, Acc> store{data_as<T>(out), static_cast<Acc>(row_len)};
        run(make_reduction<T>(Acc(0), MapConvert<Acc>{}, Plus{}, store));
      });
    case ReduceOp::Var:
      return visit_float(x.dtype(), name, [&](auto tag) {
        // Two passes: the row means first, then the deviations from them, which stays
        // accurate when |mean| >> std (a one-pass sum of squares would cancel).
        using T = typename decltype(tag)::type;
        using Acc = compute_t<T>;
        const DeviceBuffer means = launch.buffer(static_cast<size_t>(rows) * sizeof(Acc));
        StoreDivided<Acc, Acc> store_mean{means.as<Acc>(), static_cast<Acc>(row_len)};
        run(make_reduction<T>(Acc(0), MapConvert<Acc>{}, Plus{}, store_mean));
        StoreVariance<T, Acc> store{data_as<T>(out), static_cast<Acc>(row_len),
                                    static_cast<Acc>(row_len - static_cast<int64_t>(arg))};
        run(make_reduction<T>(Sums<Acc, 2>::identity(), MapDeviation<Acc>{means.as<const Acc>()}, Merge{}, store));
      });
    case ReduceOp::Norm:
      return visit_float(x.dtype(), name, [&](auto tag) {
        using T = typename decltype(tag)::type;
        using Acc = compute_t<T>;
        T* out_ptr = data_as<T>(out);
        if (std::isinf(arg)) run(make_reduction<T>(Acc(0), MapAbs<Acc>{}, MaxNan{}, StoreConvert<T>{out_ptr}));
        else if (arg == 1.0) run(make_reduction<T>(Acc(0), MapAbs<Acc>{}, Plus{}, StoreConvert<T>{out_ptr}));
        else if (arg == 2.0) run(make_reduction<T>(Acc(0), MapSquare<Acc>{}, Plus{}, StoreSqrt<T, Acc>{out_ptr}));
        else {
          run(make_reduction<T>(Acc(0), MapAbsPow<Acc>{static_cast<Acc>(arg)}, Plus{},
                                StoreRoot<T, Acc>{out_ptr, static_cast<Acc>(1.0 / arg)}));
        }
      });
    case ReduceOp::Max:
    case ReduceOp::Min:
      return visit(x.dtype(), name, [&](auto tag) {
        using T = typename decltype(tag)::type;
        using C = compute_t<T>;
        StoreConvert<T> store{data_as<T>(out)};
        if (op == ReduceOp::Max) run(make_reduction<T>(lowest_value<C>(), MapConvert<C>{}, MaxNan{}, store));
        else run(make_reduction<T>(highest_value<C>(), MapConvert<C>{}, MinNan{}, store));
      });
    case ReduceOp::All:
    case ReduceOp::Any:
      return visit(x.dtype(), name, [&](auto tag) {
        using T = typename decltype(tag)::type;
        StoreConvert<bool> store{data_as<bool>(out)};
        if (op == ReduceOp::All) run(make_reduction<T>(1, MapNonZero{}, LogicalAnd{}, store));
        else run(make_reduction<T>(0, MapNonZero{}, LogicalOr{}, store));
      });
  }
  throw ValueError(detail::cat_str("reduce: unknown op ", static_cast<int>(op)));
}

void CudaReduce::arg_reduce(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& x) const {
  const int64_t rows = values.numel();
  if (rows == 0) return;
  const int64_t row_len = x.numel() / rows;
  const char* name = is_max ? "argmax" : "argmin";
  const Launcher launch(name, values);
  visit(x.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    const T* x_ptr = data_as<const T>(x);
    StoreArg<T, C> store{data_as<T>(values), data_as<int64_t>(indices)};
    if (is_max) {
      run_reduction(launch, make_reduction<T>(no_candidate<C, true>(), MapArg<C>{}, ArgCombine<C, true>{}, store),
                    x_ptr, rows, row_len);
    } else {
      run_reduction(launch, make_reduction<T>(no_candidate<C, false>(), MapArg<C>{}, ArgCombine<C, false>{}, store),
                    x_ptr, rows, row_len);
    }
  });
}

}  // namespace

const kernels::ReduceKernels& reduce_kernels() {
  static const CudaReduce kernels;
  return kernels;
}

}  // namespace cuda
}  // namespace normcore
