// CUDA graphs (cuda::Graph of include/normcore/cuda.h) and the capture state the rest of
// the CUDA backend consults: whether a device is being captured and the graph's device words
// for random-number offsets. Index kernels in a graph write the device's deferred index-error
// record (runtime/cuda/index_errors.h) as they do outside one; replay and synchronize report it.
//
// One capture per device at a time, registered in `active`. The capture runs on the
// device's current stream in relaxed mode (the caching allocator may cudaMalloc new blocks
// for the private pool); everything that would synchronize or read the device on the host
// checks capturing() first and throws CaptureError instead of invalidating the capture.
#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "base/op_scope.h"
#include "normcore/cuda.h"
#include "normcore/error.h"
#include "runtime/cuda/capture.h"
#include "runtime/cuda/check.h"
#include "runtime/cuda/index_errors.h"
#include "runtime/cuda/runtime.h"

namespace normcore {
namespace cuda {
namespace {

constexpr int kMaxGenerators = 16;  // generators drawn from in one captured step

struct GeneratorUse {
  Generator* gen;
  uint64_t seed;
  uint64_t total = 0;  // counters the recording draws per replay
};

// The per-replay values of the generator words, passed by value to one kernel.
struct GeneratorWords {
  uint64_t value[kMaxGenerators];
};

__global__ void set_words_kernel(uint64_t* words, int count, GeneratorWords values) {
  if (static_cast<int>(threadIdx.x) < count) words[threadIdx.x] = values.value[threadIdx.x];
}

std::atomic<uint64_t> next_pool_id{1};

}  // namespace

struct Graph::Impl {
  int device = -1;
  uint64_t pool = 0;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  size_t nodes = 0;
  uint64_t* words = nullptr;  // device, kMaxGenerators; owned outright (cudaMalloc), not cached
  std::vector<GeneratorUse> generators;

  void destroy_recording() {
    if (exec != nullptr) NC_CUDA_LOG(cudaGraphExecDestroy(exec));
    if (graph != nullptr) NC_CUDA_LOG(cudaGraphDestroy(graph));
    exec = nullptr;
    graph = nullptr;
    nodes = 0;
  }
};

namespace {

std::atomic<Graph::Impl*>* active_captures() {
  static auto* active = new std::atomic<Graph::Impl*>[std::max(device_count(), 1)]();
  return active;
}

Graph::Impl* active_capture(int device) {
  if (device < 0 || device >= device_count()) return nullptr;
  return active_captures()[device].load(std::memory_order_acquire);
}

}  // namespace

bool capturing(int device) { return active_capture(device) != nullptr; }

void check_not_capturing(int device, const char* what, const char* why) {
  if (!capturing(device)) return;
  std::string op = detail::current_op();
  if (op.empty()) op = what;
  throw CaptureError(detail::cat_str(op, ": cannot run inside a CUDA graph capture on cuda:", device, ": ", why));
}

RandomOffset random_offset(Generator& gen, uint64_t n, int device) {
  Graph::Impl* impl = active_capture(device);
  if (impl == nullptr) return {gen.advance(n), nullptr};
  auto it = std::find_if(impl->generators.begin(), impl->generators.end(),
                         [&](const GeneratorUse& use) { return use.gen == &gen; });
  if (it == impl->generators.end()) {
    NC_CHECK(impl->generators.size() < static_cast<size_t>(kMaxGenerators), CaptureError, detail::current_op(),
             ": a captured CUDA graph draws from at most ", kMaxGenerators, " generators");
    impl->generators.push_back({&gen, gen.seed()});
    it = impl->generators.end() - 1;
  }
  const uint64_t relative = it->total;
  it->total += n;
  return {relative, impl->words + (it - impl->generators.begin())};
}

// ---------------------------------------------------------------- Graph

Graph::Graph() : impl_(new Impl) {}

Graph::~Graph() {
  Impl& g = *impl_;
  if (g.device < 0) return;
  try {
    DeviceGuard guard(g.device);
    NC_CUDA_LOG(cudaStreamSynchronize(stream(g.device)));
    g.destroy_recording();
    release_private_pool(g.device, g.pool);
    NC_CUDA_LOG(cudaFree(g.words));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "normcore: ~Graph: %s\n", e.what());
  }
}

void Graph::capture(int device, const std::function<void()>& fn) {
  check_device("cuda::Graph::capture", device);
  Impl& g = *impl_;
  NC_CHECK(g.device < 0 || g.device == device, DeviceError,
           "cuda::Graph::capture: the graph belongs to cuda:", g.device, ", not cuda:", device);
  NC_CHECK(!capturing(device), CaptureError,
           "cuda::Graph::capture: a graph is already being captured on cuda:", device);
  DeviceGuard guard(device);
  cudaStream_t s = stream(device);
  if (g.device < 0) {
    g.device = device;
    g.pool = next_pool_id.fetch_add(1);
    NC_CUDA_CHECK(cudaMalloc(&g.words, kMaxGenerators * sizeof(uint64_t)));
  } else {
    wait_for_stream(device, s);  // earlier replays finish before the recording goes
    g.destroy_recording();
  }
  g.generators.clear();
  prepare_index_errors(device);  // the record the captured kernels will write exists before

  begin_private_pool(device, g.pool);
  active_captures()[device].store(&g, std::memory_order_release);
  auto finish = [&] {
    active_captures()[device].store(nullptr, std::memory_order_release);
    end_private_pool(device);
  };
  NC_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  try {
    fn();
  } catch (...) {
    cudaGraph_t abandoned = nullptr;
    cudaStreamEndCapture(s, &abandoned);
    if (abandoned != nullptr) cudaGraphDestroy(abandoned);
    cudaGetLastError();  // an invalidated capture is not an error of the caller's next call
    finish();
    g.generators.clear();
    throw;
  }
  finish();
  const cudaError_t ended = cudaStreamEndCapture(s, &g.graph);
  if (ended != cudaSuccess) {
    cudaGetLastError();
    if (g.graph != nullptr) cudaGraphDestroy(g.graph);
    g.graph = nullptr;
    throw CaptureError(detail::cat_str("cuda::Graph::capture: the capture on cuda:", device,
                                       " failed: ", cudaGetErrorName(ended), " (", cudaGetErrorString(ended),
                                       "); a call in the captured function is not allowed in a CUDA graph"));
  }
  NC_CUDA_CHECK(cudaGraphGetNodes(g.graph, nullptr, &g.nodes));
  NC_CUDA_CHECK(cudaGraphInstantiate(&g.exec, g.graph, 0));
}

void Graph::replay() {
  Impl& g = *impl_;
  NC_CHECK(g.exec != nullptr, CaptureError, "cuda::Graph::replay: nothing has been captured");
  DeviceGuard guard(g.device);
  cudaStream_t s = stream(g.device);
  report_index_errors(g.device, false);  // from an earlier replay or other work, if it has one
  if (!g.generators.empty()) {
    GeneratorWords values{};
    for (size_t i = 0; i < g.generators.size(); ++i) {
      GeneratorUse& use = g.generators[i];
      NC_CHECK(use.gen->seed() == use.seed, CaptureError,
               "cuda::Graph::replay: a generator the graph draws from was reseeded since the capture (seed ", use.seed,
               ", now ", use.gen->seed(), "); capture again");
      values.value[i] = use.gen->advance(use.total);
    }
    set_words_kernel<<<1, kMaxGenerators, 0, s>>>(g.words, static_cast<int>(g.generators.size()), values);
    check_launch("cuda::Graph::replay");
  }
  NC_CUDA_CHECK(cudaGraphLaunch(g.exec, s));
}

void Graph::synchronize() {
  Impl& g = *impl_;
  if (g.device < 0) return;
  DeviceGuard guard(g.device);
  wait_for_stream(g.device, stream(g.device));
  report_index_errors(g.device, true);
}

bool Graph::captured() const { return impl_->exec != nullptr; }

size_t Graph::num_nodes() const { return impl_->nodes; }

}  // namespace cuda
}  // namespace normcore
