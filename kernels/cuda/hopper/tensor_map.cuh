// Tensor maps of attention's operands for the Hopper kernels: a 4-D map per q, k, v (or
// grad_out) over [batch, heads, rows, D] as strided (and a 3-D one over the backward's f32
// grad_q accumulator), made on the host with the driver's
// cuTensorMapEncodeTiled (reached through the runtime, so the library does not link libcuda),
// and the device side's copy of one box of it.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention/flash.cuh"
#include "kernels/cuda/hopper/sm90.cuh"

namespace normcore {
namespace cuda {
namespace hopper {

// Where each map has its row, head and batch coordinates (make_map orders a map's dims by
// stride): coordinate 1 + slot[0] is the row, 1 + slot[1] the head, 1 + slot[2] the batch.
struct MapOrder {
  int8_t slot[3];
};
struct MapOrders {
  MapOrder q, k, v;
};

// The copy of the box at column col, row, head and batch of a map ordered by `order`.
__device__ __forceinline__ void load_box(uint32_t dst, const CUtensorMap* map, const MapOrder& order, uint32_t bar,
                                         int col, int row, int head, int batch) {
  int c[3];
  c[order.slot[0]] = row;
  c[order.slot[1]] = head;
  c[order.slot[2]] = batch;
  sm90::tma_load_4d(dst, map, bar, col, c[0], c[1], c[2]);
}

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t status =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    if (status != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// The 4-D map of a q, k or v [batch, heads, rows, HD] (element strides `s`), read in boxes of
// 64 columns by `box_rows` rows with the 128-byte swizzle. The map's dims after the columns
// go by increasing stride (the driver's layout; a [B, L, 3, H, D] projection's views have
// heads closer than rows), and `order` says where each went.
template <class T>
inline bool make_map(CUtensorMap* map, MapOrder* order, const T* base, const flash::RowStrides& s, int64_t batch,
              int64_t heads, int64_t rows, int HD, int box_rows) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  struct Dim {
    int64_t stride, extent, box;
    int role;  // 0 rows, 1 heads, 2 batch
  };
  Dim dims[3] = {{s.row, rows, box_rows, 0}, {s.head, heads, 1, 1}, {s.batch, batch, 1, 2}};
  std::stable_sort(dims, dims + 3, [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  cuuint64_t extents[4] = {static_cast<cuuint64_t>(HD)};
  cuuint64_t strides[3];
  cuuint32_t box[4] = {64};
  for (int i = 0; i < 3; ++i) {
    extents[i + 1] = static_cast<cuuint64_t>(dims[i].extent);
    strides[i] = static_cast<cuuint64_t>(dims[i].stride) * sizeof(T);
    box[i + 1] = static_cast<cuuint32_t>(dims[i].box);
    order->slot[dims[i].role] = static_cast<int8_t>(i);
  }
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type =
      std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return encode(map, type, 4, const_cast<T*>(base), extents, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The 3-D map of an f32 accumulator [batch_heads, rows, HD] (contiguous), written in boxes
// of 32 columns (128 bytes) by 64 rows with the 128-byte swizzle.
inline bool make_accumulator_map(CUtensorMap* map, float* base, int64_t batch_heads, int64_t rows, int HD) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t extents[3] = {static_cast<cuuint64_t>(HD), static_cast<cuuint64_t>(rows),
                                 static_cast<cuuint64_t>(batch_heads)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(HD) * sizeof(float),
                                 static_cast<cuuint64_t>(rows * HD) * sizeof(float)};
  const cuuint32_t box[3] = {32, 64, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, base, extents, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// A row stride the tensor map takes: positive, in whole 16 bytes, below 2^40 bytes.
inline bool map_stride(int64_t elements) { return elements > 0 && elements % 8 == 0 && elements < (int64_t{1} << 38); }

}  // namespace hopper
}  // namespace cuda
}  // namespace normcore
