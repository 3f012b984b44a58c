// The CUDA runtime as normcore exposes it: devices, the per-device current stream, and
// the caching allocator's statistics. Usable in every build: in a CPU-only build the
// queries report no GPU and the rest throw DeviceError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {
namespace cuda {

struct MemoryStats {
  size_t allocated = 0;             // bytes in blocks handed out to tensors
  size_t reserved = 0;              // bytes obtained from cudaMalloc (allocated + cached)
  size_t peak_allocated = 0;        // high-water mark of allocated since the last reset
  uint64_t num_allocs = 0;          // allocation requests served
  uint64_t num_cache_hits = 0;      // requests served from the cache
  uint64_t num_device_mallocs = 0;  // cudaMalloc calls
  uint64_t num_ooms = 0;            // requests that failed even after freeing the cache
  // Cached bytes in parts of cudaMalloc segments (a large cached block is cut for a smaller
  // request, and merges back when its neighbours are freed): empty_cache returns only whole
  // segments, so after it reserved == allocated + split_cached.
  size_t split_cached = 0;
};

MemoryStats memory_stats(int device = 0);
void reset_peak_memory_stats(int device = 0);
// Returns every cached (unused) block to the driver.
void empty_cache();
// (free, total) bytes on the device, as the driver reports them.
void mem_get_info(int device, size_t* free_bytes, size_t* total_bytes);

// How float32 matmuls and convolutions run on CUDA, for the whole process (PyTorch's
// torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32 in one):
// false (the default) computes in float32; true lets cuBLAS and cuDNN use TF32 tensor cores
// (inputs rounded to a 10-bit mantissa, float32 accumulation, relative error about 1e-3,
// several times faster on Ampere and later). CPU ops and other dtypes are not affected.
// Settable in every build.
void set_allow_tf32(bool allow);
bool allow_tf32();

// How cuDNN convolutions pick their algorithms, for the whole process (PyTorch's
// torch.backends.cudnn.benchmark): false (the default) takes cuDNN's heuristic choice; true
// times the candidate algorithms on the first convolution of each geometry (input and
// weight shapes, stride, padding, dilation, groups, dtype, TF32 setting) and keeps the
// fastest. Either way the choice is made once per geometry and cached, and only
// deterministic algorithms are used. Settable in every build.
void set_cudnn_benchmark(bool benchmark);
bool cudnn_benchmark();

// Whether CUDA ops must give the same bits on every run of the same inputs, for the whole
// process (PyTorch's torch.use_deterministic_algorithms). false (the default) lets an op sum
// with atomic additions where that is faster; their order varies from run to run, so its
// results may differ in the last bits between runs (and two replays of one CUDA graph may
// differ alike). Today one op does: scaled_dot_product_attention's backward on Hopper's
// native kernels (f16/bf16, head dims 64 and 128), whose grad_q is summed in f32 over blocks
// of 128 keys in any order (grad_k and grad_v are written once). true takes the
// deterministic form of every op (that backward on two kernels that each write their
// gradients once: forward+backward 1.1-1.25x the time at bench/attention's shapes). CPU
// ops are deterministic either way. Settable in every build.
void set_deterministic(bool deterministic);
bool deterministic();

// Which engine runs scaled_dot_product_attention on CUDA, for the whole process (the
// counterpart of PyTorch's sdpa_kernel back ends). Settable in every build.
// - Native: normcore's own fused kernels, for every floating dtype, head dims up to 256 and
//   grouped-query attention (past 128 the f16/bf16 backward runs as matrix products on
//   cuBLAS, holding 12 bytes a score of up to 512 MiB of heads at a time). The forward is deterministic: the same inputs give the same
//   bits, every run; so is the backward, except on Hopper's kernels without
//   set_deterministic(true) (above).
// - Cudnn: cuDNN's fused flash attention (a graph of its graph API), for f16 and bf16 with
//   head dims D and Dv multiples of 8 up to 256, Hkv == H (no grouped-query attention), q, k
//   and v with 16-byte aligned rows (the views of one packed qkv projection qualify), on
//   Ampere or later. The forward is deterministic. The backward is built in the form cuDNN
//   documents as deterministic on Hopper (dQ written once from a dP workspace, no atomic
//   accumulation; the workspace grows with B * H * L * S) and runs on cuDNN on Hopper alone;
//   before cuDNN 9.16 it also needs S a multiple of 128.
// - Auto (the default): cuDNN where it can run the pass and B * H * L * S is at least 2^21
//   (there it was the faster engine in every case of bench/attention: forward 1.3x to 3.0x,
//   forward+backward 1.3x to 2.3x; below, cuDNN's per-call host work made it slower), else
//   Native; but for the backward at head dim 64 on an H100/H200, Native's Hopper kernels
//   (faster there) unless set_deterministic(true). cuDNN's backward holds a workspace of 2 * B * H * L * S bytes while it runs
//   (1 GiB at B = 8, H = 16, L = S = 2048); when the allocator cannot give it, Native runs.
// Whatever cuDNN cannot run (another dtype or head dim, grouped-query attention, a build
// without cuDNN, no engine offered for the graph, a workspace the allocator cannot give)
// runs on Native without a word; so does a
// pass whose shape has no plan yet inside a CUDA graph capture (plans are built on the
// first uncaptured call of a shape, dtype, layout and mask, and may compile kernels with
// NVRTC: up to a second). Both engines keep the same log-sum-exp of each query row, so a
// forward on one and a backward on the other are exact partners.
enum class AttentionEngine { Auto, Native, Cudnn };
enum class AttentionPass { Forward, Backward };

void set_attention_engine(AttentionEngine engine);
AttentionEngine attention_engine();
// The engine (Native or Cudnn) that ran the last CUDA attention pass of this kind on the
// calling thread; Native before any.
AttentionEngine last_attention_engine(AttentionPass pass = AttentionPass::Forward);
// "auto", "native", "cudnn".
const char* attention_engine_name(AttentionEngine engine);

int current_device();
void set_device(int device);
// Waits for all work queued on the device's current stream (device < 0: current device),
// then raises the index error that work recorded, if any (check_errors).
void synchronize(int device = -1);

// Index errors found on the GPU. Kernels that meet an index out of range (embedding,
// cross_entropy and nll_loss targets, index_select, gather, scatter_add) do not stop the
// host to say so: they skip the element and record the first bad index of the device, and
// IndexError ("embedding: index 12 is out of range for 10 embeddings") is raised at the next
// point where the host waits for the device anyway: item(), to(cpu) or any copy to the host,
// synchronize(), Graph::replay and Graph::synchronize. The record is then cleared, so the
// error is raised once and later work runs as usual; the results of the work that found it
// are not valid. Until it is raised the record keeps the first error. check_errors raises it
// where nothing else would: it waits for the device only when there is an error to report,
// so it costs a read of host memory per call and suits a training loop's every step.
// (PyTorch's device-side asserts, but recoverable.) A CaptureError inside a capture.
void check_errors(int device = -1);

// How many times normcore has made the host wait for the device (device < 0: current
// device): copies to the host, synchronize(), graph captures and synchronize, reported
// index errors. A training step that needs no value on the host adds none.
uint64_t host_waits(int device = -1);

// An opaque cudaStream_t. Every kernel and library call for a device runs on its
// current stream; the default is a non-blocking stream normcore creates per device.
using StreamHandle = void*;
StreamHandle current_stream(int device);
void set_current_stream(int device, StreamHandle stream);
StreamHandle create_stream();
void destroy_stream(StreamHandle stream);

// Makes stream current for device for the guard's lifetime.
class StreamGuard {
 public:
  StreamGuard(int device, StreamHandle stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  StreamHandle previous_;
};

// A CUDA graph of normcore work on one device (PyTorch's torch.cuda.CUDAGraph). capture()
// runs a function on the host once while recording, instead of running, the kernels and
// copies it queues on the device's current stream; replay() queues the whole recording
// with one launch, on the current stream, ordered with the work around it.
//
//   Tensor x = zeros(...), y = ...;             // static inputs, on the device
//   for (int i = 0; i < 3; ++i) train_step(x, y);  // warm-up: optimizer state, caches
//   cuda::Graph graph;
//   Tensor loss;
//   graph.capture(0, [&] { loss = train_step(x, y); });
//   for (const Batch& b : batches) {
//     x.copy_(b.inputs); y.copy_(b.targets);
//     graph.replay();                           // loss, the grads and the params update
//   }
//
// A replay reads and writes the memory the capture used: tensors made during the capture
// (loss above, new grads) come from a pool private to the graph and hold each replay's
// results; inputs must be overwritten in place. Work the capture cannot record throws
// CaptureError and ends the capture: reading device values on the host (item(), to(cpu),
// a data-dependent shape), copying host memory to the device, cuda::synchronize, an
// optimizer's first step or a learning-rate change (call set_lr or a schedule's step()
// between replays; optimizers read the learning rate and step counts from device memory).
// Random numbers (dropout) advance their generator on each replay as uncaptured runs do;
// generators used in the capture must outlive the graph and keep their seed. An index out
// of range in a replay is raised as IndexError, once, by a later replay(), synchronize() or
// any other wait for the device (check_errors above); replays after it are valid again.
// During a capture no other thread may queue work for the device.
class Graph {
 public:
  Graph();
  ~Graph();  // waits for its replays
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Records fn's work on device; a second capture replaces the first. If fn throws, the
  // capture is abandoned (nothing recorded) and the exception propagates.
  void capture(int device, const std::function<void()>& fn);
  // Queues the recording (CaptureError unless captured). First raises the IndexError of an
  // index out of range that earlier work (a replay or not) has recorded by then.
  void replay();
  // Waits for the replays queued so far, then raises any recorded IndexError.
  void synchronize();
  bool captured() const;
  // Kernels, copies and other nodes in the recording (0 before capture).
  size_t num_nodes() const;

  struct Impl;  // opaque

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace cuda
}  // namespace normcore

#pragma GCC visibility pop
