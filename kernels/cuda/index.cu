// CUDA indexing kernels (contracts in kernels/index.h): index_select and gather (out =),
// scatter_add (out +=, with atomics, so the order of the additions into one element is
// unspecified), index_add_rows (out +=, deterministic: a stable sort of the indices, then
// fixed-order sums of each row's repeats). Indices are i64. An index outside [0, size) is recorded in a device flag
// and its element skipped; the launcher reads the flag back after the kernel and throws
// IndexError naming the op, the bad value and the dim's size. Inside a CUDA graph capture
// the flag is the graph's, read back after its replays (kernels/cuda/graph.cu).
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/index.h"

namespace normcore {
namespace cuda {
namespace {

using BadIndex = BadIndexFlag;

// False (and the bad value recorded) for an index outside [0, size).
__device__ __forceinline__ bool index_in_range(int64_t index, int64_t size, BadIndex* bad) {
  if (index >= 0 && index < size) return true;
  if (atomicExch(&bad->found, 1u) == 0u) bad->value = index;
  return false;
}

// Device memory for the flag, cleared on the stream, and the check that reads it back; in a
// capture, the graph's flag for this op instead, which the graph reads back.
class BadIndexCheck {
 public:
  BadIndexCheck(const Launcher& launch, const char* op, int64_t dim, int64_t size)
      : captured_(capture_index_flag(launch.device(), op, dim, size)),
        buffer_(captured_ != nullptr ? 0 : sizeof(BadIndex), launch.device()),
        stream_(launch.stream()) {
    if (captured_ == nullptr) NC_CUDA_CHECK(cudaMemsetAsync(buffer_.as<void>(), 0, sizeof(BadIndex), stream_));
  }
  BadIndex* get() const { return captured_ != nullptr ? captured_ : buffer_.as<BadIndex>(); }
  // Waits for the kernel: the error has to be raised by this call (outside a capture).
  void throw_if_found(const char* op, int64_t dim, int64_t size) const {
    if (captured_ != nullptr) return;
    BadIndex host{};
    NC_CUDA_CHECK(cudaMemcpyAsync(&host, get(), sizeof(BadIndex), cudaMemcpyDeviceToHost, stream_));
    NC_CUDA_CHECK(cudaStreamSynchronize(stream_));
    NC_CHECK(host.found == 0, IndexError, op, ": index ", host.value, " is out of range for dim ", dim,
             " of size ", size);
  }

 private:
  BadIndex* captured_;
  cuda::DeviceBuffer buffer_;
  cudaStream_t stream_;
};

void check_index_dtype(const char* op, const Tensor& index) {
  NC_CHECK(index.dtype() == DType::I64, DTypeError, op, ": index must be i64, got ", dtype_name(index.dtype()));
}

template <class T>
__global__ void index_select_kernel(T* out, const T* x, const int64_t* index, int64_t numel, int64_t count,
                                    int64_t size, int64_t inner, BadIndex* bad) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < numel; e += stride) {
    const int64_t col = e % inner;
    const int64_t row = e / inner;  // (outer, position in index)
    const int64_t i = index[row % count];
    if (!index_in_range(i, size, bad)) continue;
    out[e] = x[((row / count) * size + i) * inner + col];
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
                              BadIndex* bad) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < numel; e += stride) {
    const int64_t i = index[e];
    if (!index_in_range(i, g.dim_size, bad)) continue;
    out[e] = x[target_offset(g, e) + i * g.target_strides[g.dim]];
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
                                   BadIndex* bad) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < numel; e += stride) {
    const int64_t i = index[e];
    if (!index_in_range(i, g.dim_size, bad)) continue;
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
    index_add_runs_kernel(T* out, const T* src, const uint64_t* keys, const int64_t* pos, int64_t n, int64_t width,
                          compute_t<T>* first_partial, compute_t<T>* last_partial) {
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
    } else {
      T* o = out + static_cast<int64_t>(keys[j]) * width + e;
      *o = convert<T>(convert<C>(*o) + sum);
    }
    sum = C(0);
    run_begin = j + 1;
  }
}

template <class T>
__global__ void __launch_bounds__(kRunThreads)
    index_add_spans_kernel(T* out, const uint64_t* keys, int64_t n, int64_t width, const compute_t<T>* first_partial,
                           const compute_t<T>* last_partial) {
  using C = compute_t<T>;
  const int64_t chunk = blockIdx.x;
  const int64_t e = static_cast<int64_t>(blockIdx.y) * kRunThreads + threadIdx.x;
  if (e >= width) return;
  const ChunkRuns r = chunk_runs(keys, n, chunk);
  // Only the chunk where a spanning key starts adds it up.
  if (!r.into_next || (r.from_previous && keys[r.begin] == keys[r.end - 1])) return;
  const uint64_t key = keys[r.end - 1];
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
    const BadIndexCheck check(launch, "index_select", dim, size);
    visit(x.dtype(), "index_select", [&](auto tag) {
      using T = typename decltype(tag)::type;
      launch(index_select_kernel<T>, launch.grid_for(numel), kThreads, 0, data_as<T>(out), data_as<const T>(x),
             data_as<const int64_t>(index), numel, count, size, inner, check.get());
    });
    check.throw_if_found("index_select", dim, size);
  }

  void gather(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index) const override {
    const int64_t numel = out.numel();
    if (numel == 0) return;
    check_index_dtype("gather", index);
    const Launcher launch("gather", out);
    const IndexGeometry g = make_index_geometry("gather", x, dim, index);
    const BadIndexCheck check(launch, "gather", dim, g.dim_size);
    visit(x.dtype(), "gather", [&](auto tag) {
      using T = typename decltype(tag)::type;
      launch(gather_kernel<T>, launch.grid_for(numel), kThreads, 0, data_as<T>(out), data_as<const T>(x),
             data_as<const int64_t>(index), numel, g, check.get());
    });
    check.throw_if_found("gather", dim, g.dim_size);
  }

  void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) const override {
    const int64_t numel = index.numel();
    if (numel == 0) return;
    check_index_dtype("scatter_add", index);
    const Launcher launch("scatter_add", out);
    const IndexGeometry g = make_index_geometry("scatter_add", out, dim, index);
    const BadIndexCheck check(launch, "scatter_add", dim, g.dim_size);
    visit(out.dtype(), "scatter_add", [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, uint8_t>) {
        throw DTypeError(detail::cat_str("scatter_add: dtype ", dtype_name(out.dtype()), " is not supported"));
      } else {
        launch(scatter_add_kernel<T>, launch.grid_for(numel), kThreads, 0, data_as<T>(out), data_as<const T>(src),
               data_as<const int64_t>(index), numel, g, check.get());
      }
    });
    check.throw_if_found("scatter_add", dim, g.dim_size);
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
                                                  positions.as<int64_t>(), sorted_positions.as<int64_t>(), n, 0,
                                                  bits, s));
    DeviceBuffer temp(std::max<size_t>(temp_bytes, 1), device);
    NC_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys_in, sorted_keys.as<uint64_t>(),
                                                  positions.as<int64_t>(), sorted_positions.as<int64_t>(), n, 0,
                                                  bits, s));
    const int64_t chunks = ceil_div(n, kRunChunk);
    const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(ceil_div(width, int64_t{kRunThreads})));
    visit_float(out.dtype(), "index_add_rows", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      DeviceBuffer first_partial(chunks * width * sizeof(C), device), last_partial(chunks * width * sizeof(C), device);
      launch(index_add_runs_kernel<T>, grid, kRunThreads, 0, data_as<T>(out), data_as<const T>(src),
             static_cast<const uint64_t*>(sorted_keys.as<uint64_t>()),
             static_cast<const int64_t*>(sorted_positions.as<int64_t>()), n, width, first_partial.as<C>(),
             last_partial.as<C>());
      launch(index_add_spans_kernel<T>, grid, kRunThreads, 0, data_as<T>(out),
             static_cast<const uint64_t*>(sorted_keys.as<uint64_t>()), n, width,
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
