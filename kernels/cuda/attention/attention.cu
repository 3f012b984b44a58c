// CUDA scaled dot-product attention (contract: kernels/attention.h): each pass first offered
// to cuDNN's fused attention (attention/cudnn_attention.h, under cuda::attention_engine()),
// then, for an f16/bf16 forward on an sm_90 device of a build with Hopper kernels, to
// hopper/attention.h (kernels::hopper_attention()), else run on the kernels of
// attention/flash.cuh. plan_attention picks the path: f16/bf16 on tensor cores, head dims
// padded to 32, 64, 128 or (forward) 256; f32 on the register-tiled SIMT kernels, padded to
// 32, 64 or 128; f64, f32 past 128 and the f16/bf16 backward past 128 (in f32) on the
// row-per-warp SIMT kernels. Forward: one kernel writing out and
// lse. Backward: delta = rowsum(grad_out * out) (f64: the rows' statistics and delta =
// sum_j p_j dp_j, flash.cuh says why), then grad_k and grad_v over key tiles, then grad_q over
// query tiles; every gradient is written (=) once, so results are deterministic (the Hopper
// backward's fast form, without cuda::set_deterministic(true), sums grad_q with atomics).
#include "kernels/attention.h"
#include "kernels/cuda/attention/cudnn_attention.h"
#include "kernels/cuda/attention/decode.h"
#include "kernels/cuda/attention/flash_simt.cuh"
#include "kernels/cuda/attention/matrix_backward.h"
#include "kernels/cuda/loops.cuh"
#if NORMCORE_HOPPER_KERNELS
#include "kernels/cuda/hopper/attention.h"
#endif

namespace normcore {
namespace cuda {
namespace {

using flash::AttentionParams;

constexpr int64_t kMaxHeadDim = 256;  // flash::kSimtCols * 32, the row kernels' widest

enum class AttentionPath {
  TensorCores,  // f16, bf16: mma.sync kernels for head_dim columns
  TiledSimt,    // f32: 64-row tiles, head_dim columns
  RowSimt,      // one warp per row: f64; f32 past 128; what Matrix does not take
  Matrix,       // f16, bf16 backward past 128: matrix products on cuBLAS (matrix_backward.h)
};

struct AttentionPlan {
  AttentionPath path;
  int head_dim = 0;  // TensorCores, TiledSimt: max(D, Dv) rounded up to 32, 64, 128 or 256
};

// Past head dim 128 the tiled f32 kernels would not fit shared memory and the mma.sync
// backward would hold dK and dV in 256 registers a thread (so would the Hopper backward:
// hopper/attention.h): f32 runs a row per warp, the f16/bf16 backward as matrix products.
AttentionPlan plan_attention(DType dtype, int64_t D, int64_t Dv, AttentionPass pass) {
  if (dtype == DType::F64) return {AttentionPath::RowSimt};
  const int64_t width = std::max(D, Dv);
  const int head_dim = width <= 32 ? 32 : width <= 64 ? 64 : width <= 128 ? 128 : 256;
  if (head_dim == 256 && dtype == DType::F32) return {AttentionPath::RowSimt};
  if (head_dim == 256 && pass == AttentionPass::Backward) return {AttentionPath::Matrix};
  return {dtype == DType::F32 ? AttentionPath::TiledSimt : AttentionPath::TensorCores, head_dim};
}

flash::RowStrides row_strides(const Tensor& t) {
  const Shape& st = t.strides();
  return {st[0], st[1], st[2]};
}

// 16-byte tile rows: every row start a multiple of 8 two-byte elements from an aligned base.
bool rows_aligned(const void* base, const flash::RowStrides& s) {
  return is_aligned(base, 16) && s.batch % 8 == 0 && s.head % 8 == 0 && s.row % 8 == 0;
}

// The parameters common to both directions; C is the stats type.
template <class T, class C>
AttentionParams<T, C> make_params(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, const kernels::AttentionShape& shape, bool causal, double scale) {
  AttentionParams<T, C> p;
  p.q = data_as<const T>(q);
  p.k = data_as<const T>(k);
  p.v = data_as<const T>(v);
  p.q_stride = row_strides(q);
  p.k_stride = row_strides(k);
  p.v_stride = row_strides(v);
  p.out = data_as<T>(out);
  p.out_stride = row_strides(out);
  p.lse = data_as<C>(lse);
  p.batch = static_cast<int>(shape.batch);
  p.heads = static_cast<int>(shape.heads);
  p.group = static_cast<int>(shape.heads / shape.kv_heads);
  p.L = static_cast<int>(shape.L);
  p.S = static_cast<int>(shape.S);
  p.D = static_cast<int>(shape.D);
  p.Dv = static_cast<int>(shape.Dv);
  p.scale = scale;
  p.causal = causal;
  p.vectorized = sizeof(T) == 2 && p.D % 8 == 0 && p.Dv % 8 == 0 && rows_aligned(p.q, p.q_stride) &&
                 rows_aligned(p.k, p.k_stride) && rows_aligned(p.v, p.v_stride) && rows_aligned(p.out, p.out_stride);
  return p;
}

// ---------------------------------------------------------------- tensor cores
template <class T, int HD>
void tc_forward(const Launcher& launch, const AttentionParams<T, float>& p) {
  using Config = flash::ForwardConfig<HD>;
  const int64_t grid = flash::tile_blocks(int64_t{p.batch} * p.heads, p.L, Config::kBlockM);
  if (grid == 0) return;
  const auto kernel = flash::tc_forward_kernel<T, Config>;
  launch.allow_shared_memory(kernel, Config::kSharedBytes);
  launch(kernel, static_cast<unsigned>(grid), Config::kThreads, Config::kSharedBytes, p);
}

template <class T, int HD>
void tc_backward(const Launcher& launch, const AttentionParams<T, float>& p) {
  using KV = flash::BackwardKVConfig<HD>;
  using Q = flash::BackwardQConfig<HD>;
  const int64_t batch_heads = int64_t{p.batch} * p.heads;
  const int64_t kv_grid = flash::tile_blocks(batch_heads, p.S, KV::kBlockN);
  const int64_t q_grid = flash::tile_blocks(batch_heads, p.L, Q::kBlockM);
  if (kv_grid > 0) {
    const auto kernel = flash::tc_backward_kv_kernel<T, KV>;
    launch.allow_shared_memory(kernel, KV::kSharedBytes);
    launch(kernel, static_cast<unsigned>(kv_grid), KV::kThreads, KV::kSharedBytes, p);
  }
  if (q_grid > 0) {
    const auto kernel = flash::tc_backward_q_kernel<T, Q>;
    launch.allow_shared_memory(kernel, Q::kSharedBytes);
    launch(kernel, static_cast<unsigned>(q_grid), Q::kThreads, Q::kSharedBytes, p);
  }
}

// Calls run(std::integral_constant<int, head_dim>{}), for head dims up to LARGEST (128 or
// 256; the plan gives no larger one to a caller).
template <int LARGEST, class Run>
void with_head_dim(int head_dim, Run run) {
  switch (head_dim) {
    case 32: return run(std::integral_constant<int, 32>{});
    case 64: return run(std::integral_constant<int, 64>{});
    case 128: return run(std::integral_constant<int, 128>{});
  }
  if constexpr (LARGEST == 256) return run(std::integral_constant<int, 256>{});
}

// ---------------------------------------------------------------- SIMT
// A tiled kernel (f32) over `rows` rows of one side, 64 per block.
void tiled_run(const Launcher& launch, void (*kernel)(AttentionParams<float, float>), size_t smem, int64_t rows,
               const AttentionParams<float, float>& p) {
  const int64_t grid = flash::tile_blocks(int64_t{p.batch} * p.heads, rows, flash::kTiledRows);
  if (grid == 0) return;
  launch.allow_shared_memory(kernel, smem);
  launch(kernel, static_cast<unsigned>(grid), flash::kTiledThreads, smem, p);
}

// A row-per-warp kernel over `rows` rows of one side (kSimtRows per block).
template <class T, class C>
void simt_run(const Launcher& launch, void (*kernel)(AttentionParams<T, C>), int64_t rows,
              const AttentionParams<T, C>& p) {
  const int64_t grid = flash::tile_blocks(int64_t{p.batch} * p.heads, rows, flash::kSimtRows);
  if (grid == 0) return;
  const size_t smem = flash::simt_shared_bytes<C>(p.D, p.Dv);
  launch.allow_shared_memory(kernel, smem);
  launch(kernel, static_cast<unsigned>(grid), flash::kSimtThreads, smem, p);
}

class CudaAttention final : public kernels::AttentionKernels {
 public:
  int64_t max_head_dim() const override { return kMaxHeadDim; }

  void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const kernels::AttentionShape& shape,
                         bool causal, double scale, const Tensor& out, const Tensor& lse) const override {
    const bool on_cudnn = cudnn_attention_forward(q, k, v, shape, causal, scale, out, lse);
    kernels::record_attention_engine(AttentionPass::Forward,
                                     on_cudnn ? AttentionEngine::Cudnn : AttentionEngine::Native);
    if (on_cudnn) return;
    const char* op = "scaled_dot_product_attention";
    const Launcher launch(op, q);
    const AttentionPlan plan = plan_attention(q.dtype(), shape.D, shape.Dv, AttentionPass::Forward);
    visit_float(q.dtype(), op, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
      const auto p = make_params<T, C>(q, k, v, out, lse, shape, causal, scale);
      if constexpr (is_reduced_float_v<T>) {
#if NORMCORE_HOPPER_KERNELS
        const kernels::HopperAttention hopper_mode = kernels::hopper_attention();
        if (hopper_mode != kernels::HopperAttention::Off &&
            hopper::attention_forward(launch, p, hopper_mode == kernels::HopperAttention::Pipelined)) {
          kernels::record_native_attention_kernels(AttentionPass::Forward, "wgmma");
          return;
        }
#endif
        kernels::record_native_attention_kernels(AttentionPass::Forward, "mma.sync");
        with_head_dim<256>(plan.head_dim, [&](auto hd) { tc_forward<T, decltype(hd)::value>(launch, p); });
      } else {
        kernels::record_native_attention_kernels(AttentionPass::Forward, "simt");
        if (plan.path == AttentionPath::RowSimt) return simt_run(launch, flash::simt_forward_kernel<T, C>, p.L, p);
        if constexpr (std::is_same_v<T, float>) {
          with_head_dim<128>(plan.head_dim, [&](auto hd) {
            constexpr int HD = decltype(hd)::value;
            tiled_run(launch, flash::tiled_forward_kernel<HD>, flash::tiled_forward_shared_bytes<HD>(), p.L, p);
          });
        }
      }
    });
  }

  void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                          const Tensor& lse, const kernels::AttentionShape& shape, bool causal, double scale,
                          const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v) const override {
    const bool on_cudnn =
        cudnn_attention_backward(grad_out, q, k, v, out, lse, shape, causal, scale, grad_q, grad_k, grad_v);
    kernels::record_attention_engine(AttentionPass::Backward,
                                     on_cudnn ? AttentionEngine::Cudnn : AttentionEngine::Native);
    if (on_cudnn) return;
    const char* op = "scaled_dot_product_attention backward";
    const Launcher launch(op, q);
    const AttentionPlan plan = plan_attention(q.dtype(), shape.D, shape.Dv, AttentionPass::Backward);
    visit_float(q.dtype(), op, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
      auto p = make_params<T, C>(q, k, v, out, lse, shape, causal, scale);
      p.grad_out = data_as<const T>(grad_out);
      p.grad_out_stride = row_strides(grad_out);
      p.grad_q = data_as<T>(grad_q);
      p.grad_k = data_as<T>(grad_k);
      p.grad_v = data_as<T>(grad_v);
      p.grad_q_stride = row_strides(grad_q);
      p.grad_k_stride = row_strides(grad_k);
      p.grad_v_stride = row_strides(grad_v);
      p.vectorized = p.vectorized && rows_aligned(p.grad_out, p.grad_out_stride);
      const int64_t rows = shape.batch * shape.heads * shape.L;
      const DeviceBuffer delta = launch.buffer(sizeof(C) * static_cast<size_t>(rows));
      p.delta = delta.as<C>();
      if constexpr (is_reduced_float_v<T>) {
#if NORMCORE_HOPPER_KERNELS
        if (kernels::hopper_attention() != kernels::HopperAttention::Off &&
            hopper::attention_backward(launch, p, cuda::deterministic())) {
          kernels::record_native_attention_kernels(AttentionPass::Backward, "wgmma");
          return;
        }
#endif
      }
      AttentionPath path = plan.path;
      if constexpr (is_reduced_float_v<T>) {
        if (path == AttentionPath::Matrix && !matrix_backward_takes(p)) path = AttentionPath::RowSimt;
      }
      if (rows > 0 && path != AttentionPath::RowSimt) {
        launch(flash::delta_kernel<T, C>, static_cast<unsigned>(ceil_div(rows, flash::kDeltaRowsPerBlock)),
               flash::kDeltaRowsPerBlock * flash::kWarp, 0, p);
      }
      kernels::record_native_attention_kernels(AttentionPass::Backward, path == AttentionPath::TensorCores ? "mma.sync"
                                                                        : path == AttentionPath::Matrix    ? "cublas"
                                                                                                           : "simt");
      if constexpr (is_reduced_float_v<T>) {
        if (path == AttentionPath::Matrix) return matrix_backward(launch, p);
      }
      if (path == AttentionPath::RowSimt) {
        // The rows' statistics and delta (see flash.cuh), then the gradients.
        const DeviceBuffer stats = launch.buffer(2 * sizeof(C) * static_cast<size_t>(rows));
        p.row_max = stats.as<C>();
        p.row_sum = p.row_max + rows;
        simt_run(launch, flash::simt_query_rows_kernel<T, C, true>, p.L, p);
        simt_run(launch, flash::simt_backward_kv_kernel<T, C>, p.S, p);
        simt_run(launch, flash::simt_query_rows_kernel<T, C, false>, p.L, p);
      } else if constexpr (is_reduced_float_v<T>) {
        with_head_dim<128>(plan.head_dim, [&](auto hd) { tc_backward<T, decltype(hd)::value>(launch, p); });
      } else if constexpr (std::is_same_v<T, float>) {
        with_head_dim<128>(plan.head_dim, [&](auto hd) {
          constexpr int HD = decltype(hd)::value;
          tiled_run(launch, flash::tiled_backward_kv_kernel<HD>, flash::tiled_backward_kv_shared_bytes<HD>(), p.S, p);
          tiled_run(launch, flash::tiled_backward_q_kernel<HD>, flash::tiled_backward_q_shared_bytes<HD>(), p.L, p);
        });
      }
    });
  }

  void cached_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& positions, const kernels::AttentionShape& shape, double scale,
                        const Tensor& out) const override {
    cuda::cached_attention(q, k, v, k_cache, v_cache, positions, shape, scale, out);
  }
};

}  // namespace

const kernels::AttentionKernels& attention_kernels() {
  static const CudaAttention kernels;
  return kernels;
}

}  // namespace cuda
}  // namespace normcore
