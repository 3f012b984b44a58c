// CUDA indexing kernels (contracts in kernels/index.h): index_select and gather (out =),
// scatter_add (out +=, with atomics, so the order of the additions into one element is
// unspecified), index_add_rows (out +=, deterministic: a stable sort of the indices, then
// fixed-order sums of each row's repeats), check_range. Indices are i64. An index outside
// [0, size) is skipped (index_select and gather write 0 there) and recorded in the device's
// deferred record (runtime/cuda/index_errors.h); no launcher waits for its kernel, and the
// IndexError naming the op, the value and the size comes at the host's next wait.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/loops.cuh"
#include "kernels/index.h"
#include "runtime/cuda/index_errors.h"
#include "runtime/cuda/runtime.h"

namespace normcore {
namespace cuda {
namespace {

// The record's slot for op's indices along dim: "<op>: index V is out of range for dim D of size S".
IndexErrorSlot dim_slot(const Launcher& launch, const char* op, int64_t dim) {
  return index_error_slot(launch.device(), detail::cat_str(op, ": index "),
                          detail::cat_str(" is out of range for dim ", dim, " of size "), "");
}

// With NORMCORE_CUDA_LAUNCH_BLOCKING=1 the launch check has waited for the kernel: the op
// that found the error raises it.
void report_if_blocking(const Launcher& launch) {
  if (launch_blocking()) report_index_errors(launch.device(), true);
}

void check_index_dtype(const char* op, const Tensor& index) {
  NC_CHECK(index.dtype() == DType::I64, DTypeError, op, ": index must be i64, got ", dtype_name(index.dtype()));
}

template <class T>
__global__ void index_select_kernel(T* out, const T* x, const int64_t* index, int64_t numel, int64_t count,
                                    int64_t size, int64_t inner, IndexErrorSlot bad) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < numel; e += stride) {
    const int64_t col = e % inner;
    const int64_t row = e / inner;  // (outer, position in index)
    const int64_t i = index[row % count];
    out[e] = bad.in_range(i, size) ? x[((row / count) * size + i) * inner + col] : T{};
  }
}

constexpr int kMaxIndexDims = 16;

// Shapes for gather/scatter_add: `index` has the index tensor's shape; `target` has the
// row-major strides of the tensor addressed through the index (x for gather, out for
// scatter_add).
struct IndexGeometry {
  int ndim;
  int dim;
  int64_t dim_size;
  int64_t index_sizes[kMaxIndexDims];
  int64_t target_strides[kMaxIndexDims];
};

IndexGeometry make_index_geometry(const char* op, const Tensor& target, int64_t dim, const Tensor& index) {
  NC_CHECK(index.dim() <= kMaxIndexDims, ShapeError, op, ": at most ", kMaxIndexDims, " dims supported, got ",
           index.dim());
  IndexGeometry g{};
  g.ndim = static_cast<int>(index.dim());
  g.dim = static_cast<int>(dim);
  g.dim_size = target.size(dim);
  int64_t stride = 1;
  for (int d = g.ndim - 1; d >= 0; --d) {
    g.index_sizes[d] = index.size(d);
    g.target_strides[d] = stride;
    stride *= target.size(d);
  }
  return g;
}

// Offset in the target of element e of the index tensor, with the dim's coordinate left out.
__device__ __forceinline__ int64_t target_offset(const IndexGeometry& g, int64_t e) {
  int64_t offset = 0;
  for (int d = g.ndim - 1; d >= 0; --d) {
    const int64_t coord = e % g.index_sizes[d];
    e /= g.index_sizes[d];
    if (d != g.dim) offset += coord * g.target_strides[d];
  }
  return offset;
}

template <class T>
__global__ void gather_kernel(T* out, const T* x, const int64_t* index, int64_t numel, IndexGeometry g,
                              IndexErrorSlot bad) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < numel; e += stride) {
    const int64_t i = index[e];
    out[e] = bad.in_range(i, g.dim_size) ? x[target_offset(g, e) + i * g.target_strides[g.dim]] : T{};
  }
}

template <class T>
__device__ __forceinline__ void atomic_add(T* address, T value) {
  if constexpr (std::is_same_v<T, int64_t>) {
    // Two's complement: the unsigned sum has the bits of the signed one.
    atomicAdd(reinterpret_cast<unsigned long long*>(address), static_cast<unsigned long long>(value));
  } else {
    atomicAdd(address, value);
  }
}

template <class T>
__global__ void scatter_add_kernel(T* out, const T* src, const int64_t* index, int64_t numel, IndexGeometry g,
                                   IndexErrorSlot bad) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < numel; e += stride) {
    const int64_t i = index[e];
    if (!bad.in_range(i, g.dim_size)) continue;
    atomic_add(out + target_offset(g, e) + i * g.target_strides[g.dim], src[e]);
  }
}

// index_add_rows: the indices sorted stably (keys) with their source rows (pos), cut into
// chunks of kRunChunk sorted entries. Within a chunk, each run of equal keys is summed in
// order, per column, in C. A run that continues from the previous chunk is stored in
// first_partial[chunk], one that continues into the next chunk (and not from the previous)
// in last_partial[chunk]; every other run holds all of its key's entries and is added to
// out directly. A second kernel adds up the partials of each key that spans chunks, from
// the chunk where it starts, in chunk order. Every sum has one fixed order.
constexpr int64_t kRunChunk = 64;
constexpr int kRunThreads = 128;

struct ChunkRuns {
  int64_t begin, end;
  bool from_previous, into_next;
};

__device__ __forceinline__ ChunkRuns chunk_runs(const uint64_t* keys, int64_t n, int64_t chunk) {
  ChunkRuns r;
  r.begin = chunk * kRunChunk;
  r.end = r.begin + kRunChunk < n ? r.begin + kRunChunk : n;
  r.from_previous = r.begin > 0 && keys[r.begin - 1] == keys[r.begin];
  r.into_next = r.end < n && keys[r.end] == keys[r.end - 1];
  return r;
}

template <class T>
__global__ void __launch_bounds__(kRunThreads)
    index_add_runs_kernel(T* out, const T* src, const uint64_t* keys, const int64_t* pos, int64_t n, int64_t rows,
                          int64_t width, compute_t<T>* first_partial, compute_t<T>* last_partial) {
  using C = compute_t<T>;
  const int64_t chunk = blockIdx.x;
  const int64_t e = static_cast<int64_t>(blockIdx.y) * kRunThreads + threadIdx.x;
  if (e >= width) return;
  const ChunkRuns r = chunk_runs(keys, n, chunk);
  C sum = C(0);
  int64_t run_begin = r.begin;
  for (int64_t j = r.begin; j < r.end; ++j) {
    sum += convert<C>(src[pos[j] * width + e]);
    if (j + 1 < r.end && keys[j + 1] == keys[j]) continue;
    if (run_begin == r.begin && r.from_previous) {
      first_partial[chunk * width + e] = sum;
    } else if (j + 1 == r.end && r.into_next) {
      last_partial[chunk * width + e] = sum;
    } else if (keys[j] < static_cast<uint64_t>(rows)) {  // a key out of range (recorded by the forward) is skipped
      T* o = out + static_cast<int64_t>(keys[j]) * width + e;
      *o = convert<T>(convert<C>(*o) + sum);
    }
    sum = C(0);
    run_begin = j + 1;
  }
}

template <class T>
__global__ void __launch_bounds__(kRunThreads)
    index_add_spans_kernel(T* out, const uint64_t* keys, int64_t n, int64_t rows, int64_t width,
                           const compute_t<T>* first_partial, const compute_t<T>* last_partial) {
  using C = compute_t<T>;
  const int64_t chunk = blockIdx.x;
  const int64_t e = static_cast<int64_t>(blockIdx.y) * kRunThreads + threadIdx.x;
  if (e >= width) return;
  const ChunkRuns r = chunk_runs(keys, n, chunk);
  // Only the chunk where a spanning key starts adds it up.
  if (!r.into_next || (r.from_previous && keys[r.begin] == keys[r.end - 1])) return;
  const uint64_t key = keys[r.end - 1];
  if (key >= static_cast<uint64_t>(rows)) return;  // out of range: skipped
  C sum = last_partial[chunk * width + e];
  for (int64_t c = chunk + 1;; ++c) {
    sum += first_partial[c * width + e];
    // The key goes on past chunk c only when it fills c and continues into the next one.
    const ChunkRuns next = chunk_runs(keys, n, c);
    if (!next.into_next || keys[next.end - 1] != key) break;
  }
  T* o = out + static_cast<int64_t>(key) * width + e;
  *o = convert<T>(convert<C>(*o) + sum);
}

// Values equal to `allowed` (when has_allowed) pass as well as those in [0, size).
__global__ void check_range_kernel(const int64_t* index, int64_t n, int64_t size, bool has_allowed, int64_t allowed,
                                   IndexErrorSlot bad) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const int64_t v = index[e];
    if (!(has_allowed && v == allowed)) bad.in_range(v, size);
  }
}

__global__ void iota_kernel(int64_t* p, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) p[i] = i;
}

// Bits needed for the values 0 .. rows - 1.
int key_bits(int64_t rows) {
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) < rows) ++bits;
  return bits;
}

class CudaIndex final : public kernels::IndexKernels {
 public:
  void index_select(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index) const override {
    const int64_t numel = out.numel();
    if (numel == 0) return;
    check_index_dtype("index_select", index);
    const Launcher launch("index_select", out);
    const int64_t size = x.size(dim), count = index.numel();
    int64_t inner = 1;
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
    const IndexErrorSlot bad = dim_slot(launch, "index_select", dim);
    visit(x.dtype(), "index_select", [&](auto tag) {
      using T = typename decltype(tag)::type;
      launch(index_select_kernel<T>, launch.grid_for(numel), kThreads, 0, data_as<T>(out), data_as<const T>(x),
             data_as<const int64_t>(index), numel, count, size, inner, bad);
    });
    report_if_blocking(launch);
  }

  void gather(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index) const override {
    const int64_t numel = out.numel();
    if (numel == 0) return;
    check_index_dtype("gather", index);
    const Launcher launch("gather", out);
    const IndexGeometry g = make_index_geometry("gather", x, dim, index);
    const IndexErrorSlot bad = dim_slot(launch, "gather", dim);
    visit(x.dtype(), "gather", [&](auto tag) {
      using T = typename decltype(tag)::type;
      launch(gather_kernel<T>, launch.grid_for(numel), kThreads, 0, data_as<T>(out), data_as<const T>(x),
             data_as<const int64_t>(index), numel, g, bad);
    });
    report_if_blocking(launch);
  }

  void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) const override {
    const int64_t numel = index.numel();
    if (numel == 0) return;
    check_index_dtype("scatter_add", index);
    const Launcher launch("scatter_add", out);
    const IndexGeometry g = make_index_geometry("scatter_add", out, dim, index);
    const IndexErrorSlot bad = dim_slot(launch, "scatter_add", dim);
    visit(out.dtype(), "scatter_add", [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, uint8_t>) {
        throw DTypeError(detail::cat_str("scatter_add: dtype ", dtype_name(out.dtype()), " is not supported"));
      } else {
        launch(scatter_add_kernel<T>, launch.grid_for(numel), kThreads, 0, data_as<T>(out), data_as<const T>(src),
               data_as<const int64_t>(index), numel, g, bad);
      }
    });
    report_if_blocking(launch);
  }

  void check_range(const Tensor& index, int64_t size, std::optional<int64_t> allowed,
                   const kernels::RangeMessage& message) const override {
    const int64_t n = index.numel();
    if (n == 0) return;
    check_index_dtype(message.op, index);
    const Launcher launch(message.op, index);
    const IndexErrorSlot bad = index_error_slot(launch.device(), detail::cat_str(message.op, ": ", message.what, " "),
                                                " is out of range for ", detail::cat_str(" ", message.unit));
    launch(check_range_kernel, launch.grid_for(n), kThreads, 0, data_as<const int64_t>(index), n, size,
           allowed.has_value(), allowed.value_or(0), bad);
    report_if_blocking(launch);
  }

  void index_add_rows(const Tensor& out, const Tensor& index, const Tensor& src) const override {
    const int64_t n = index.numel(), width = out.size(1);
    if (n == 0 || width == 0) return;
    check_index_dtype("index_add_rows", index);
    const Launcher launch("index_add_rows", out);
    const int device = launch.device();
    cudaStream_t s = launch.stream();
    // Stable radix sort of (index, position); the indices are non-negative, so their i64
    // bits order as unsigned values.
    DeviceBuffer positions(n * sizeof(int64_t), device), sorted_keys(n * sizeof(uint64_t), device),
        sorted_positions(n * sizeof(int64_t), device);
    launch(iota_kernel, launch.grid_for(n), kThreads, 0, positions.as<int64_t>(), n);
    const auto* keys_in = reinterpret_cast<const uint64_t*>(index.data_ptr());
    const int bits = key_bits(out.size(0));
    size_t temp_bytes = 0;
    NC_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, sorted_keys.as<uint64_t>(),
                                                  positions.as<int64_t>(), sorted_positions.as<int64_t>(), n, 0, bits,
                                                  s));
    DeviceBuffer temp(std::max<size_t>(temp_bytes, 1), device);
    NC_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys_in, sorted_keys.as<uint64_t>(),
                                                  positions.as<int64_t>(), sorted_positions.as<int64_t>(), n, 0, bits,
                                                  s));
    const int64_t chunks = ceil_div(n, kRunChunk);
    const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(ceil_div(width, int64_t{kRunThreads})));
    visit_float(out.dtype(), "index_add_rows", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      DeviceBuffer first_partial(chunks * width * sizeof(C), device), last_partial(chunks * width * sizeof(C), device);
      launch(index_add_runs_kernel<T>, grid, kRunThreads, 0, data_as<T>(out), data_as<const T>(src),
             static_cast<const uint64_t*>(sorted_keys.as<uint64_t>()),
             static_cast<const int64_t*>(sorted_positions.as<int64_t>()), n, out.size(0), width, first_partial.as<C>(),
             last_partial.as<C>());
      launch(index_add_spans_kernel<T>, grid, kRunThreads, 0, data_as<T>(out),
             static_cast<const uint64_t*>(sorted_keys.as<uint64_t>()), n, out.size(0), width,
             static_cast<const C*>(first_partial.as<C>()), static_cast<const C*>(last_partial.as<C>()));
    });
  }
};

}  // namespace

const kernels::IndexKernels& index_kernels() {
  static const CudaIndex kernels;
  return kernels;
}

}  // namespace cuda
}  // namespace normcore
