// What the CUDA normalization kernels share (kernels/norms.h is their contract): the
// family's implementation class, whose methods are defined per op in affine.cu (layer and
// group norm), batch_norm.cu, l1_norm.cu and frobenius_norm.cu; element addressing; and the pipeline
// phases of the two norms that divide by a norm (L1, Frobenius). The plans are plan.h; the
// reductions kernels/cuda/reduction/. Statistics accumulate in A = compute_t<T> (float for
// f16/bf16/f32, double for f64) and are saved in it.
#pragma once

#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/norms/plan.h"
#include "kernels/cuda/reduction/chunked.cuh"
#include "kernels/cuda/reduction/combine.cuh"
#include "kernels/cuda/reduction/pipeline.cuh"
#include "kernels/norms.h"

namespace normcore {
namespace cuda {

class CudaNorms final : public kernels::NormKernels {
 public:
  // affine.cu
  void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t rows, int64_t row_len,
                          double eps, const Tensor& y, const Tensor& mean, const Tensor& rstd) const override;
  void layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                           const Tensor& rstd, int64_t rows, int64_t row_len, const Tensor& grad_x,
                           const Tensor& grad_weight, const Tensor& grad_bias) const override;
  void rms_norm_forward(const Tensor& x, const Tensor& weight, int64_t rows, int64_t row_len, double eps,
                        const Tensor& y, const Tensor& rstd) const override;
  void rms_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& rstd, int64_t rows,
                         int64_t row_len, const Tensor& grad_x, const Tensor& grad_weight) const override;
  void group_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const kernels::GroupLayout& l,
                          double eps, const Tensor& y, const Tensor& mean, const Tensor& rstd) const override;
  void group_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                           const Tensor& rstd, const kernels::GroupLayout& l, const Tensor& grad_x,
                           const Tensor& grad_weight, const Tensor& grad_bias) const override;
  // batch_norm.cu
  void batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                          const Tensor& running_var, const kernels::BatchLayout& l, const kernels::BatchNormMode& mode,
                          const Tensor& y, const Tensor& mean, const Tensor& rstd) const override;
  void batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                           const Tensor& rstd, const kernels::BatchLayout& l, bool training, const Tensor& grad_x,
                           const Tensor& grad_weight, const Tensor& grad_bias) const override;
  // l1_norm.cu
  void l1_norm_forward(const Tensor& x, const kernels::DimLayout& l, double eps, const Tensor& y,
                       const Tensor& norm) const override;
  void l1_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& norm, const kernels::DimLayout& l,
                        double eps, const Tensor& grad_x) const override;
  // frobenius_norm.cu
  void frobenius_norm_forward(const Tensor& x, double eps, const Tensor& y, const Tensor& norm) const override;
  void frobenius_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& norm, double eps,
                               const Tensor& grad_x) const override;
};

// Element index -> (row, channel), by multiply-and-shift division on the 32-bit path.
template <class Index>
struct ElementPlace {
  IntDivider<Index> spatial, group_channels, channels;
  ElementPlace(const GroupLayout& l)
      : spatial(static_cast<Index>(l.spatial)), group_channels(static_cast<Index>(l.group_channels)),
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

// ---------------------------------------------------------------- tiles in shared memory
// The kernels that keep a group in shared memory (SharedGroups): each thread owns the tile's
// vectors threadIdx.x + k * kBlock and is the only one to copy, read and write them, so no
// barrier separates the passes. The copies (cp.async) are issued in kLandingStages groups and
// the first pass folds each group in as it lands, overlapping the reads with arithmetic.
constexpr int kLandingStages = 4;

// Vector j of a tile, in one shared-memory load.
template <class T, int V>
__device__ __forceinline__ Vec<T, V> tile_at(const Vec<T, V>* tile, int64_t j) {
  return load_vec<T, V>(reinterpret_cast<const T*>(tile), j);
}

// Waits until at most `pending` (0 to 3) of the thread's copy groups are in flight.
__device__ __forceinline__ void wait_copies(int pending) {
  switch (pending) {
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
  }
}
static_assert(kLandingStages <= 4, "wait_copies waits on up to 3 pending groups");

// The thread's vectors of a tile of n: vector(k) for k < count, landing stage s holding
// k in [first(s), first(s + 1)).
template <int kBlock>
struct Ownership {
  int64_t count;
  __device__ __forceinline__ explicit Ownership(int64_t n) {
    const int64_t mine = n - static_cast<int64_t>(threadIdx.x);
    count = mine > 0 ? (mine + kBlock - 1) / kBlock : 0;
  }
  __device__ __forceinline__ int64_t vector(int64_t k) const { return threadIdx.x + k * kBlock; }
  __device__ __forceinline__ int64_t first(int stage) const { return count * stage / kLandingStages; }
};

// Copies the thread's vectors of src (a group of own's size) into tile, a commit group per
// landing stage; then, stage by stage as each lands, land(j) for its vectors j.
template <int kBlock, class T, int V, class Land>
__device__ __forceinline__ void copy_and_land(const Ownership<kBlock>& own, const T* src, Vec<T, V>* tile,
                                              Land&& land) {
  for (int stage = 0; stage < kLandingStages; ++stage) {
    for (int64_t k = own.first(stage); k < own.first(stage + 1); ++k) {
      const int64_t j = own.vector(k);
      copy_async<sizeof(Vec<T, V>)>(tile + j, src + j * V);
    }
    commit_copies();
  }
  for (int stage = 0; stage < kLandingStages; ++stage) {
    wait_copies(kLandingStages - 1 - stage);
    for (int64_t k = own.first(stage); k < own.first(stage + 1); ++k) land(own.vector(k));
  }
}

// Copies the thread's vectors of two inputs (src0 into tile0, src1 into tile1) as
// copy_and_land does, then land(j) for each vector j as its stage lands.
template <int kBlock, class T, int V, class Land>
__device__ __forceinline__ void copy_pair_and_land(const Ownership<kBlock>& own, const T* src0, Vec<T, V>* tile0,
                                                   const T* src1, Vec<T, V>* tile1, Land&& land) {
  for (int stage = 0; stage < kLandingStages; ++stage) {
    for (int64_t k = own.first(stage); k < own.first(stage + 1); ++k) {
      const int64_t j = own.vector(k);
      copy_async<sizeof(Vec<T, V>)>(tile0 + j, src0 + j * V);
      copy_async<sizeof(Vec<T, V>)>(tile1 + j, src1 + j * V);
    }
    commit_copies();
  }
  for (int stage = 0; stage < kLandingStages; ++stage) {
    wait_copies(kLandingStages - 1 - stage);
    for (int64_t k = own.first(stage); k < own.first(stage + 1); ++k) land(own.vector(k));
  }
}

// A result vector that is not read again soon: 16-byte vectors are written evict-first.
template <class T, int V>
__device__ __forceinline__ void store_result(T* p, int64_t j, const Vec<T, V>& value) {
  if constexpr (sizeof(Vec<T, V>) == 16) {
    store_streaming<T, V>(p, j, value);
  } else {
    store_vec<T, V>(p, j, value);
  }
}

// ---------------------------------------------------------------- thread-block clusters
// The kernels that split a group or row over a cluster's shared memory are built for sm_90
// and later; on older targets their bodies are empty, and the plans take them only where
// the device launches clusters and the kernel's PTX is sm_90's or later.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define NC_CLUSTER_KERNELS 1
#else
#define NC_CLUSTER_KERNELS 0
#endif

// The device's limits for a plan that may take `cluster_kernel`, less clusters where that
// kernel was not built for sm_90 or later (its body is then empty).
template <class... Params>
DeviceLimits cluster_limits(const Launcher& launch, void (*cluster_kernel)(Params...)) {
  DeviceLimits limits = launch.limits();
  if (limits.cluster_blocks > 0) {
    cudaFuncAttributes built{};
    if (cudaFuncGetAttributes(&built, cluster_kernel) != cudaSuccess || built.ptxVersion < 90) {
      cudaGetLastError();  // not sticky
      limits.cluster_blocks = 0;
    }
  }
  return limits;
}

// Block rank's slice of a group (or row) of vecs vectors, `per` vectors a block.
struct ClusterSlice {
  int64_t per, begin, end;
  __device__ __forceinline__ ClusterSlice(int64_t vecs, int64_t blocks, int64_t rank)
      : per((vecs + blocks - 1) / blocks), begin(min(vecs, rank * per)), end(min(vecs, begin + per)) {}
  __device__ __forceinline__ int64_t size() const { return end - begin; }
};

// A phase that needs no per-chunk context.
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

}  // namespace cuda
}  // namespace normcore
