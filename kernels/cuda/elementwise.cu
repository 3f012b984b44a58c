// CUDA element-wise kernels (contracts in kernels/elementwise.h): the shared functors of
// kernels/scalar/elementwise.h run by the element-wise launcher (loops.cuh), plus a tiled
// transpose for copies between layouts and the driver's memcpy/memset where they apply.
#include <cstring>

#include "kernels/cuda/loops.cuh"
#include "kernels/elementwise.h"
#include "kernels/scalar/elementwise.h"

namespace normcore {
namespace cuda {
namespace {

// Copies where dst is contiguous along one dim (i) and src along another (j): a
// transpose, as contiguous() of a permuted view makes. Element by element, one of the two
// sides would be read or written with a large stride; staging 32 x 32 tiles through
// shared memory keeps both coalesced. Other dims are batches (blockIdx.z).
constexpr int kTile = 32;
constexpr int kTileRows = 8;

template <class To, class From>
__global__ void __launch_bounds__(kTile* kTileRows)
    transpose_copy_kernel(To* dst, const From* src, int64_t size_i, int64_t size_j, int64_t dst_stride_j,
                          int64_t src_stride_i, int64_t batches, OffsetCalculator<2, int64_t> batch) {
  // [kTile][kTile + 1]: the padding puts a tile column in distinct banks.
  __shared__ __align__(16) unsigned char storage[kTile * (kTile + 1) * sizeof(From)];
  From* tile = reinterpret_cast<From*>(storage);
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kTile, j0 = static_cast<int64_t>(blockIdx.y) * kTile;
  for (int64_t b = blockIdx.z; b < batches; b += gridDim.z) {
    int64_t offsets[2];
    batch.get(b, offsets);
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {  // consecutive threads: consecutive j
      const int64_t i = i0 + k, j = j0 + threadIdx.x;
      if (i < size_i && j < size_j) tile[k * (kTile + 1) + threadIdx.x] = src[offsets[1] + i * src_stride_i + j];
    }
    __syncthreads();
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {  // consecutive threads: consecutive i
      const int64_t i = i0 + threadIdx.x, j = j0 + k;
      if (i < size_i && j < size_j) {
        dst[offsets[0] + j * dst_stride_j + i] = convert<To>(tile[threadIdx.x * (kTile + 1) + k]);
      }
    }
    __syncthreads();
  }
}

// Runs the tiled transpose when the layout is one; false otherwise.
template <class To, class From>
bool try_transpose_copy(const Tensor& dst, const Tensor& src) {
  const Geometry<2> g(dst.shape(), {&dst.strides(), &src.strides()});
  if (g.ndim() < 2 || g.ndim() > kMaxDims || g.strides[0][0] != 1 || g.strides[0][1] == 1) return false;
  int j = 1;
  while (j < g.ndim() && g.strides[j][1] != 1) ++j;
  if (j == g.ndim()) return false;
  const int64_t tiles_i = (g.sizes[0] + kTile - 1) / kTile, tiles_j = (g.sizes[j] + kTile - 1) / kTile;
  if (tiles_j > 65535) return false;  // grid.y limit

  Geometry<2> batch = g;
  for (int d : {j, 0}) {
    batch.sizes.erase(batch.sizes.begin() + d);
    batch.strides.erase(batch.strides.begin() + d);
  }
  int64_t batches = 1;
  for (int64_t size : batch.sizes) batches *= size;
  const OffsetCalculator<2, int64_t> calc(batch, 0, batch.ndim());

  const Launcher launch("copy", dst);
  const dim3 grid(static_cast<unsigned>(tiles_i), static_cast<unsigned>(tiles_j),
                  static_cast<unsigned>(std::min<int64_t>(batches, 65535)));
  launch(transpose_copy_kernel<To, From>, grid, dim3(kTile, kTileRows), 0, data_as<To>(dst), data_as<const From>(src),
         g.sizes[0], g.sizes[j], g.strides[j][0], g.strides[0][1], batches, calc);
  return true;
}

class CudaElementwise final : public kernels::ElementwiseKernels {
 public:
  void copy(const Tensor& dst, const Tensor& src) const override {
    if (dst.numel() == 0) return;
    if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
      const Launcher launch("copy", dst);
      NC_CUDA_CHECK(
          cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice, launch.stream()));
      return;
    }
    visit(dst.dtype(), "copy", [&](auto to_tag) {
      using To = typename decltype(to_tag)::type;
      visit(src.dtype(), "copy", [&](auto from_tag) {
        using From = typename decltype(from_tag)::type;
        if (!try_transpose_copy<To, From>(dst, src))
          elementwise<To, From>("copy", ConvertFunctor<To, From>{}, dst, src);
      });
    });
  }

  void fill(const Tensor& dst, Scalar value) const override {
    if (dst.numel() == 0) return;
    visit(dst.dtype(), "fill", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T v = scalar_as<T>(value);
      const unsigned char zero[sizeof(T)] = {};
      if (dst.is_contiguous() && std::memcmp(&v, zero, sizeof(T)) == 0) {
        // All-zero bits (not -0.0): the driver's memset beats a kernel.
        const Launcher launch("fill", dst);
        NC_CUDA_CHECK(cudaMemsetAsync(dst.data_ptr(), 0, dst.nbytes(), launch.stream()));
        return;
      }
      elementwise<T>("fill", FillFunctor<T>{v}, dst);
    });
  }

  void unary(UnaryOp op, const Tensor& out, const Tensor& x, double a, double b) const override {
    if (out.numel() == 0) return;
    with_unary_functor<DeviceTypes>(op, x.dtype(), a, b, [&](auto f) {
      using F = decltype(f);
      elementwise<typename F::Out, typename F::In>("unary", f, out, x);
    });
  }

  void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) const override {
    if (out.numel() == 0) return;
    with_binary_functor<DeviceTypes>(op, a.dtype(), [&](auto f) {
      using F = decltype(f);
      elementwise<typename F::Out, typename F::In, typename F::In>("binary", f, out, a, b);
    });
  }

  void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) const override {
    if (out.numel() == 0) return;
    visit(out.dtype(), "where", [&](auto tag) {
      using T = typename decltype(tag)::type;
      elementwise<T, bool, T, T>("where", WhereFunctor<T>{}, out, cond, a, b);
    });
  }
};

}  // namespace

const kernels::ElementwiseKernels& elementwise_kernels() {
  static const CudaElementwise kernels;
  return kernels;
}

}  // namespace cuda
}  // namespace normcore
