// CUDA fused optimizer updates (contracts in kernels/optim.h): one pass over contiguous
// param, grad and state, updated in place on the device's current stream with the element
// math of kernels/scalar/optim.h, which the CPU backend runs too. Param type T, state and
// math type C = compute_t<T>. SGD: each thread moves up to 16 bytes per buffer per load
// when every pointer is aligned for it, else one element. Adam: one launch updates up to
// kMaxListTensors parameters of one dtype, a block per chunk of kChunk elements, then one
// more adds 1 to their step counts. Both read the learning rate (and Adam the counts) from
// device memory, so a CUDA graph replays them with the values of the moment.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cuda/loops.cuh"
#include "kernels/optim.h"
#include "kernels/scalar/optim.h"

namespace normcore {
namespace cuda {
namespace {

constexpr int kOptimThreads = 256;

// Elements per thread: as many of the widest buffer as fit in 16 bytes.
template <class T, class C>
constexpr int pack_width() {
  return static_cast<int>(16 / std::max(sizeof(T), sizeof(C)));
}

// Thread t of the grid-stride loop takes elements [t*Width, t*Width + Width) of each vector;
// the last n % Width elements go one per thread.
// SGD's hyperparameters but the learning rate.
template <class T, class C, int Width>
__global__ void sgd_kernel(T* param, const T* grad, C* buf, int64_t n, const double* lr, kernels::SgdHyper h,
                           const double* skip) {
  if (skip != nullptr && *skip != 0.0) return;
  const SgdParams<C> s = SgdParams<C>::make(*lr, h.momentum, h.dampening, h.weight_decay, h.nesterov, h.first_step);
  const int64_t packs = n / Width;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t k = first; k < packs; k += stride) {
    Vec<T, Width> p = reinterpret_cast<Vec<T, Width>*>(param)[k];
    const Vec<T, Width> g = reinterpret_cast<const Vec<T, Width>*>(grad)[k];
    Vec<C, Width> b;
    if (s.use_momentum && !s.first_step) b = reinterpret_cast<Vec<C, Width>*>(buf)[k];
#pragma unroll
    for (int j = 0; j < Width; ++j) {
      C value = convert<C>(p.v[j]);
      sgd_element<C>(value, convert<C>(g.v[j]), &b.v[j], s);
      p.v[j] = convert<T>(value);
    }
    reinterpret_cast<Vec<T, Width>*>(param)[k] = p;
    if (s.use_momentum) reinterpret_cast<Vec<C, Width>*>(buf)[k] = b;
  }
  for (int64_t i = packs * Width + first; i < n; i += stride) {
    C value = convert<C>(param[i]);
    C b = s.use_momentum && !s.first_step ? buf[i] : C(0);
    sgd_element<C>(value, convert<C>(grad[i]), &b, s);
    param[i] = convert<T>(value);
    if (s.use_momentum) buf[i] = b;
  }
}

constexpr int kMaxListTensors = 32;
constexpr int kChunk = 4096;  // elements per block

// Up to kMaxListTensors parameters of dtype T; block b updates chunk b - first_block[t] of
// the t with first_block[t] <= b < first_block[t + 1].
template <class T, class C>
struct AdamList {
  int count;
  int first_block[kMaxListTensors + 1];
  T* param[kMaxListTensors];
  const T* grad[kMaxListTensors];
  C* exp_avg[kMaxListTensors];
  C* exp_avg_sq[kMaxListTensors];
  int64_t numel[kMaxListTensors];
  const int64_t* step[kMaxListTensors];
};

template <class T, class C>
__global__ void adam_kernel(AdamList<T, C> list, const double* lr, kernels::AdamHyper h, const double* skip) {
  if (skip != nullptr && *skip != 0.0) return;
  const int b = static_cast<int>(blockIdx.x);
  int t = 0;
  while (b >= list.first_block[t + 1]) ++t;
  // The count before this update's increment (the next launch adds it).
  const AdamParams<C> a =
      AdamParams<C>::make(*lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.decoupled, *list.step[t] + 1);
  T* param = list.param[t];
  const T* grad = list.grad[t];
  C* exp_avg = list.exp_avg[t];
  C* exp_avg_sq = list.exp_avg_sq[t];
  const int64_t begin = static_cast<int64_t>(b - list.first_block[t]) * kChunk;
  const int64_t end = list.numel[t] < begin + kChunk ? list.numel[t] : begin + kChunk;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    C value = convert<C>(param[i]);
    C avg = exp_avg[i];
    C avg_sq = exp_avg_sq[i];
    adam_element<C>(value, convert<C>(grad[i]), avg, avg_sq, a);
    param[i] = convert<T>(value);
    exp_avg[i] = avg;
    exp_avg_sq[i] = avg_sq;
  }
}

struct StepList {
  int count;
  int64_t* step[kMaxListTensors];
};

__global__ void increment_steps_kernel(StepList list, const double* skip) {
  if (skip != nullptr && *skip != 0.0) return;
  if (static_cast<int>(threadIdx.x) < list.count) *list.step[threadIdx.x] += 1;
}

// ---------------------------------------------------------------- clip_grad_norm
// Per list of gradients of dtype T: block b sums the squares of chunk b - first_block[t] of
// gradient t in double and writes partials[partial[t] + chunk]. Then one block reduces each
// gradient's partials in order, its norm and the total; then the scaling, which reads the
// factor (0: none) from device memory.
template <class T>
struct GradList {
  int count;
  int first_block[kMaxListTensors + 1];
  T* data[kMaxListTensors];
  int64_t numel[kMaxListTensors];
  int64_t partial[kMaxListTensors];
};

// Finds the gradient and chunk of this block.
template <class List>
__device__ int list_entry(const List& list, int64_t* begin, int64_t* end) {
  const int b = static_cast<int>(blockIdx.x);
  int t = 0;
  while (b >= list.first_block[t + 1]) ++t;
  *begin = static_cast<int64_t>(b - list.first_block[t]) * kChunk;
  *end = list.numel[t] < *begin + kChunk ? list.numel[t] : *begin + kChunk;
  return t;
}

// The sum of v over the block's threads (kOptimThreads), in a fixed order; valid in thread 0.
__device__ double block_sum(double v) {
  __shared__ double shared[kOptimThreads];
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int half = kOptimThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half)
      shared[threadIdx.x] = __dadd_rn(shared[threadIdx.x], shared[threadIdx.x + half]);
    __syncthreads();
  }
  return shared[0];
}

template <class T>
__global__ void sum_squares_kernel(GradList<T> list, double* partials) {
  int64_t begin, end;
  const int t = list_entry(list, &begin, &end);
  const T* x = list.data[t];
  double acc = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = static_cast<double>(convert<compute_t<T>>(x[i]));
    acc = __dadd_rn(acc, __dmul_rn(v, v));
  }
  const double sum = block_sum(acc);
  if (threadIdx.x == 0) partials[list.partial[t] + (begin / kChunk)] = sum;
}

// Every gradient's numel and dtype (0 f32, 1 f16, 2 bf16, 3 f64), in partials' order.
struct ClipTotals {
  int count;
  int64_t numel[kernels::OptimKernels::kMaxClipTensors];
  unsigned char kind[kernels::OptimKernels::kMaxClipTensors];
};

__device__ double round_to_kind(double x, int kind) {
  switch (kind) {
    case 0: return static_cast<double>(static_cast<float>(x));
    case 1: return static_cast<double>(__half2float(__float2half_rn(static_cast<float>(x))));
    case 2: return static_cast<double>(__bfloat162float(__float2bfloat16_rn(static_cast<float>(x))));
    default: return x;
  }
}

// One block: out[0] = total, out[1] = the clip factor or 0.
__global__ void clip_total_kernel(ClipTotals totals, const double* partials, double max_norm, double* out) {
  double sum = 0.0;  // thread 0's
  int64_t first = 0;
  for (int t = 0; t < totals.count; ++t) {
    const int64_t blocks = (totals.numel[t] + kChunk - 1) / kChunk;
    double acc = 0.0;
    for (int64_t k = threadIdx.x; k < blocks; k += blockDim.x) acc = __dadd_rn(acc, partials[first + k]);
    const double squares = block_sum(acc);
    if (threadIdx.x == 0) {
      const double norm = round_to_kind(__dsqrt_rn(squares), totals.kind[t]);
      sum = __dadd_rn(sum, __dmul_rn(norm, norm));
    }
    __syncthreads();  // block_sum's shared memory is reused by the next gradient
    first += blocks;
  }
  if (threadIdx.x == 0) {
    const double total = __dsqrt_rn(sum);
    out[0] = total;
    out[1] = clip_factor(total, max_norm);
  }
}

template <class T>
__global__ void clip_scale_kernel(GradList<T> list, const double* out) {
  const double factor = out[1];
  if (factor == 0.0) return;
  int64_t begin, end;
  const int t = list_entry(list, &begin, &end);
  using C = compute_t<T>;
  const C f = static_cast<C>(factor);
  T* x = list.data[t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) x[i] = convert<T>(math::mul_rn(convert<C>(x[i]), f));
}

// Enough blocks to cover the work, at most a few waves' worth (the loops stride the rest).
unsigned blocks_for(const Launcher& launch, int64_t work) {
  const int64_t cap = static_cast<int64_t>(launch.multiprocessors()) * 16;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(ceil_div(work, kOptimThreads), cap)));
}

class CudaOptim final : public kernels::OptimKernels {
 public:
  void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const Tensor& lr,
                const kernels::SgdHyper& h, const Tensor& skip) const override {
    const int64_t n = param.numel();
    if (n == 0) return;
    const double* lr_ptr = data_as<const double>(lr);
    const double* skip_ptr = skip.defined() ? data_as<const double>(skip) : nullptr;
    visit_float(param.dtype(), "sgd_step", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      constexpr int kWidth = pack_width<T, C>();
      T* p = data_as<T>(param);
      const T* g = data_as<const T>(grad);
      C* buf = h.momentum != 0.0 ? data_as<C>(momentum_buf) : nullptr;
      const bool aligned = is_aligned(p, sizeof(T) * kWidth) && is_aligned(g, sizeof(T) * kWidth) &&
                           (buf == nullptr || is_aligned(buf, sizeof(C) * kWidth));
      const Launcher launch("sgd_step", param);
      if (aligned) {
        launch(sgd_kernel<T, C, kWidth>, blocks_for(launch, n / kWidth + 1), kOptimThreads, 0, p, g, buf, n, lr_ptr, h,
               skip_ptr);
      } else {
        launch(sgd_kernel<T, C, 1>, blocks_for(launch, n), kOptimThreads, 0, p, g, buf, n, lr_ptr, h, skip_ptr);
      }
    });
  }

  void adam_step(const std::vector<kernels::AdamTensors>& tensors, const Tensor& lr, const kernels::AdamHyper& h,
                 const Tensor& skip) const override {
    if (tensors.empty()) return;
    const Launcher launch("adam_step", lr);
    const double* lr_ptr = data_as<const double>(lr);
    const double* skip_ptr = skip.defined() ? data_as<const double>(skip) : nullptr;
    // Per dtype, lists of at most kMaxListTensors non-empty parameters.
    for (DType dtype : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
      visit_float(dtype, "adam_step", [&](auto tag) {
        using T = typename decltype(tag)::type;
        using C = compute_t<T>;
        AdamList<T, C> list{};
        auto flush = [&] {
          if (list.count == 0) return;
          launch(adam_kernel<T, C>, static_cast<unsigned>(list.first_block[list.count]), kOptimThreads, 0, list, lr_ptr,
                 h, skip_ptr);
          list = AdamList<T, C>{};
        };
        for (const kernels::AdamTensors& t : tensors) {
          const int64_t n = t.param.numel();
          if (t.param.dtype() != dtype || n == 0) continue;
          const int64_t blocks = ceil_div(n, kChunk);
          NC_CHECK(blocks < (int64_t{1} << 30), ValueError, "adam_step: a parameter of ", n, " elements is too large");
          if (list.count == kMaxListTensors || list.first_block[list.count] + blocks >= (int64_t{1} << 30)) flush();
          const int k = list.count++;
          list.param[k] = data_as<T>(t.param);
          list.grad[k] = data_as<const T>(t.grad);
          list.exp_avg[k] = data_as<C>(t.exp_avg);
          list.exp_avg_sq[k] = data_as<C>(t.exp_avg_sq);
          list.numel[k] = n;
          list.step[k] = data_as<const int64_t>(t.step);
          list.first_block[k + 1] = list.first_block[k] + static_cast<int>(blocks);
        }
        flush();
      });
    }
    StepList steps{};
    for (const kernels::AdamTensors& t : tensors) {
      steps.step[steps.count++] = data_as<int64_t>(t.step);
      if (steps.count == kMaxListTensors) {
        launch(increment_steps_kernel, 1, kMaxListTensors, 0, steps, skip_ptr);
        steps = StepList{};
      }
    }
    if (steps.count > 0) launch(increment_steps_kernel, 1, kMaxListTensors, 0, steps, skip_ptr);
  }

  void clip_grad_norm(const std::vector<Tensor>& grads, double max_norm, const Tensor& total) const override {
    NC_CHECK(grads.size() <= kMaxClipTensors, ValueError, "clip_grad_norm: at most ", kMaxClipTensors,
             " gradients per fused call, got ", grads.size());
    const Launcher launch("clip_grad_norm", total);
    ClipTotals totals{};
    std::vector<int64_t> partial(grads.size());
    int64_t blocks = 0;
    for (size_t i = 0; i < grads.size(); ++i) {
      const DType dtype = grads[i].dtype();
      totals.numel[i] = grads[i].numel();
      totals.kind[i] = dtype == DType::F32 ? 0 : dtype == DType::F16 ? 1 : dtype == DType::BF16 ? 2 : 3;
      partial[i] = blocks;
      blocks += ceil_div(grads[i].numel(), kChunk);
    }
    totals.count = static_cast<int>(grads.size());
    DeviceBuffer partials(std::max<int64_t>(blocks, 1) * sizeof(double), launch.device());
    DeviceBuffer out(2 * sizeof(double), launch.device());
    // The sums of squares, then (after the totals) the scaling, per dtype in lists.
    auto for_lists = [&](auto&& run) {
      for (DType dtype : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
        visit_float(dtype, "clip_grad_norm", [&](auto tag) {
          using T = typename decltype(tag)::type;
          GradList<T> list{};
          for (size_t i = 0; i < grads.size(); ++i) {
            const int64_t n = grads[i].numel();
            if (grads[i].dtype() != dtype || n == 0) continue;
            if (list.count == kMaxListTensors) {
              run(list);
              list = GradList<T>{};
            }
            const int k = list.count++;
            list.data[k] = static_cast<T*>(grads[i].data_ptr());
            list.numel[k] = n;
            list.partial[k] = partial[i];
            list.first_block[k + 1] = list.first_block[k] + static_cast<int>(ceil_div(n, kChunk));
          }
          if (list.count > 0) run(list);
        });
      }
    };
    for_lists([&](const auto& list) {
      launch(sum_squares_kernel<std::remove_pointer_t<std::decay_t<decltype(list.data[0])>>>,
             static_cast<unsigned>(list.first_block[list.count]), kOptimThreads, 0, list, partials.as<double>());
    });
    launch(clip_total_kernel, 1, kOptimThreads, 0, totals, partials.as<const double>(), max_norm, out.as<double>());
    NC_CUDA_CHECK(
        cudaMemcpyAsync(total.data_ptr(), out.as<double>(), sizeof(double), cudaMemcpyDeviceToDevice, launch.stream()));
    for_lists([&](const auto& list) {
      launch(clip_scale_kernel<std::remove_pointer_t<std::decay_t<decltype(list.data[0])>>>,
             static_cast<unsigned>(list.first_block[list.count]), kOptimThreads, 0, list, out.as<const double>());
    });
  }
};

}  // namespace

const kernels::OptimKernels& optim_kernels() {
  static const CudaOptim kernels;
  return kernels;
}

}  // namespace cuda
}  // namespace normcore
