// DistributedDataParallel and its bucket assignment (normcore/distributed.h).
//
// The Reducer keeps, per bucket, a flat buffer of its parameters' gradients and the count
// of those not ready yet in this backward. A ready hook on each parameter (autograd.h)
// counts it down; at zero, and once every earlier bucket has been launched, the bucket is
// launched: its gradients are all-reduced (avg) asynchronously where they lie, as one group,
// while backward goes on (those that cannot be, and all of them when the bucket reduces in
// another dtype, are copied into the bucket's flat buffer first). A callback at the end of
// backward launches what is left (buckets holding parameters that got no gradient), makes
// the current stream wait for every reduction and makes each copied grad() a view of its
// average in the flat buffer (no copy back). Nothing here reads the device, so a captured step replays
// all of it.
#include <algorithm>
#include <map>

#if NORMCORE_HAS_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/capture.h"
#include "runtime/cuda/runtime.h"
#endif

#include "autograd/graph.h"
#include "normcore/autograd.h"
#include "normcore/distributed.h"
#include "normcore/ops.h"

namespace normcore {
namespace distributed {

std::vector<std::vector<size_t>> assign_buckets(const std::vector<Tensor>& params, size_t first_bucket_bytes,
                                                size_t bucket_bytes) {
  std::vector<std::vector<size_t>> buckets;
  std::vector<size_t> bytes;        // per bucket
  std::map<DType, size_t> open;     // the bucket each dtype is filling
  std::map<DType, bool> had_first;  // whether the dtype's first bucket was closed
  for (size_t i = params.size(); i-- > 0;) {
    const DType dtype = params[i].dtype();
    const size_t size = params[i].nbytes();
    auto it = open.find(dtype);
    if (it != open.end()) {
      const size_t limit = had_first[dtype] ? bucket_bytes : first_bucket_bytes;
      if (bytes[it->second] + size > limit) {
        had_first[dtype] = true;
        open.erase(it);
        it = open.end();
      }
    }
    if (it == open.end()) {
      it = open.emplace(dtype, buckets.size()).first;
      buckets.emplace_back();
      bytes.push_back(0);
    }
    buckets[it->second].push_back(i);
    bytes[it->second] += size;
  }
  return buckets;
}

struct DistributedDataParallel::Reducer {
  struct Bucket {
    std::vector<size_t> params;
    std::vector<int64_t> offsets;  // of each parameter in flat
    int64_t numel = 0;
    Tensor flat;                 // in the parameters' dtype, made when first needed
    Tensor wire;                 // in reduce_dtype where that differs: what is reduced
    std::vector<char> in_place;  // per parameter: its gradient was reduced where it lies
    size_t pending = 0;
    Work work;
  };

  ProcessGroup& group;
  std::vector<Tensor> params;
  std::vector<std::vector<size_t>> assignment;
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;  // per parameter
  std::vector<char> ready;        // per parameter, in this backward
  std::vector<int64_t> hooks;
  size_t next_launch = 0;
  bool finishing = false;      // the end-of-backward callback is queued
  uint64_t this_backward = 0;  // autograd::backward_count() of the backward being reduced
  bool sync = true;
  bool timing = false;
#if NORMCORE_HAS_CUDA
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> waits;  // around each timed wait
#endif

  Reducer(ProcessGroup& g, std::vector<Tensor> p, const DataParallelOptions& options) : group(g), params(std::move(p)) {
    assignment = assign_buckets(params, options.first_bucket_bytes, options.bucket_bytes);
    bucket_of.resize(params.size());
    ready.assign(params.size(), 0);
    for (size_t k = 0; k < assignment.size(); ++k) {
      Bucket b;
      b.params = assignment[k];
      int64_t numel = 0;
      for (size_t i : b.params) {
        b.offsets.push_back(numel);
        numel += params[i].numel();
        bucket_of[i] = k;
      }
      const DType dtype = params[b.params[0]].dtype();
      b.numel = numel;
      if (options.reduce_dtype && *options.reduce_dtype != dtype && is_floating(dtype)) {
        b.wire = zeros({numel}, TensorOptions(*options.reduce_dtype, group.device()));
        b.flat = zeros({numel}, TensorOptions(dtype, group.device()));
      }
      b.in_place.assign(b.params.size(), 0);
      b.pending = b.params.size();
      buckets.push_back(std::move(b));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      hooks.push_back(autograd::add_grad_ready_hook(params[i], [this, i] { on_ready(i); }));
    }
  }

  ~Reducer() {
    for (size_t i = 0; i < params.size(); ++i) autograd::remove_grad_ready_hook(params[i], hooks[i]);
    forget_waits();
  }

  void on_ready(size_t i) {
    if (!sync) return;
    const uint64_t backward = autograd::backward_count();
    if (!finishing || backward != this_backward) {
      // The first gradient of this backward (a backward that threw may have left state).
      if (finishing) reset();
      finishing = true;
      this_backward = backward;
      autograd::queue_backward_callback([this] { finish(); });
    }
    if (ready[i]) return;
    ready[i] = 1;
    if (--buckets[bucket_of[i]].pending == 0) launch_ready();
  }

  // Launches the buckets that are ready, in order: every rank launches them in the same
  // order whatever order its gradients came in.
  void launch_ready() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) launch(buckets[next_launch++]);
  }

  // A gradient that is contiguous and of its parameter's dtype is reduced where it lies (in
  // one group with the bucket's others: no copy); the others are copied into the bucket's
  // buffer first (made then: a model whose gradients all qualify holds no second copy of
  // them), as is every gradient when the bucket reduces in another dtype (the copy converts).
  void launch(Bucket& b) {
    autograd::NoGradGuard no_grad;
    std::vector<Tensor> targets;
    for (size_t j = 0; j < b.params.size(); ++j) {
      const Tensor& p = params[b.params[j]];
      const Tensor grad = p.grad();
      b.in_place[j] = !b.wire.defined() && grad.defined() && grad.is_contiguous() && grad.dtype() == p.dtype();
      if (b.in_place[j]) {
        targets.push_back(grad);
        continue;
      }
      if (!b.flat.defined()) b.flat = zeros({b.numel}, TensorOptions(p.dtype(), group.device()));
      Tensor slot = (b.wire.defined() ? b.wire : b.flat).narrow(0, b.offsets[j], p.numel());
      if (grad.defined()) {
        // (A parameter that got no gradient this time may still hold its last average.)
        if (grad.data_ptr() != slot.data_ptr()) slot.copy_(grad.reshape({-1}));
      } else {
        slot.zero_();
      }
      if (!b.wire.defined()) targets.push_back(slot);
    }
    if (b.wire.defined()) targets.push_back(b.wire);
    b.work = group.all_reduce_coalesced_async(targets, ReduceOp::Avg);
  }

  void finish() {
    finishing = false;
    for (Bucket& b : buckets) b.pending = 0;  // parameters without a gradient count as zeros
    launch_ready();
    autograd::NoGradGuard no_grad;
    const auto timed = begin_wait();
    for (Bucket& b : buckets) {
      b.work.wait();
      if (b.wire.defined()) b.flat.copy_(b.wire);
      for (size_t j = 0; j < b.params.size(); ++j) {
        if (b.in_place[j]) continue;  // its gradient holds the average
        const Tensor& p = params[b.params[j]];
        p.set_grad(b.flat.narrow(0, b.offsets[j], p.numel()).view(p.shape()));
      }
    }
    end_wait(timed);
    reset();
  }

#if NORMCORE_HAS_CUDA
  // An event pair's first event, recorded on the current stream before the waits when this
  // backward is timed (null otherwise).
  cudaEvent_t begin_wait() {
    const Device device = group.device();
    if (!timing || !device.is_cuda() || cuda::capturing(device.index)) return nullptr;
    cuda::DeviceGuard guard(device.index);
    cudaEvent_t before = nullptr;
    NC_CHECK(cudaEventCreate(&before) == cudaSuccess, DistributedError,
             "DistributedDataParallel: cannot create a CUDA event");
    cudaEventRecord(before, cuda::stream(device.index));
    return before;
  }

  void end_wait(cudaEvent_t before) {
    if (before == nullptr) return;
    const Device device = group.device();
    cuda::DeviceGuard guard(device.index);
    cudaEvent_t after = nullptr;
    NC_CHECK(cudaEventCreate(&after) == cudaSuccess, DistributedError,
             "DistributedDataParallel: cannot create a CUDA event");
    cudaEventRecord(after, cuda::stream(device.index));
    waits.emplace_back(before, after);
  }

  ReductionWait read_waits() {
    ReductionWait out;
    for (const auto& [before, after] : waits) {
      float ms = 0;
      NC_CHECK(cudaEventSynchronize(after) == cudaSuccess && cudaEventElapsedTime(&ms, before, after) == cudaSuccess,
               DistributedError, "DistributedDataParallel::reduction_wait: a timed backward failed on ",
               group.device());
      ++out.backwards;
      out.total_ms += ms;
      out.max_ms = std::max(out.max_ms, static_cast<double>(ms));
    }
    forget_waits();
    return out;
  }

  void forget_waits() {
    for (const auto& [before, after] : waits) {
      cudaEventDestroy(before);
      cudaEventDestroy(after);
    }
    waits.clear();
  }
#else
  void* begin_wait() { return nullptr; }
  void end_wait(void*) {}
  ReductionWait read_waits() { return {}; }
  void forget_waits() {}
#endif

  // Ready for the next backward: launched reductions finished (on the current stream), no
  // gradient counted.
  void reset() {
    for (Bucket& b : buckets) {
      b.work = Work();
      b.pending = b.params.size();
    }
    std::fill(ready.begin(), ready.end(), 0);
    next_launch = 0;
    finishing = false;
  }
};

namespace {

// A fingerprint of the parameters: count, elements, and a hash of every shape and dtype.
std::vector<int64_t> fingerprint(const std::vector<Tensor>& params) {
  int64_t elements = 0;
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the dims and dtypes
  auto mix = [&hash](uint64_t v) {
    hash ^= v;
    hash *= 1099511628211ull;
  };
  for (const Tensor& p : params) {
    elements += p.numel();
    mix(static_cast<uint64_t>(p.dtype()));
    for (int64_t d = 0; d < p.dim(); ++d) mix(static_cast<uint64_t>(p.size(d)));
    mix(~0ull);
  }
  return {static_cast<int64_t>(params.size()), elements, static_cast<int64_t>(hash >> 1)};
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module, ProcessGroup& group,
                                                 DataParallelOptions options)
    : module_(std::move(module)), group_(group), options_(options) {
  const char* op = "DistributedDataParallel";
  NC_CHECK(module_ != nullptr, ValueError, op, ": the module is null");
  NC_CHECK(options.bucket_bytes > 0 && options.first_bucket_bytes > 0, ValueError, op,
           ": bucket sizes must be positive, got bucket_bytes ", options.bucket_bytes, " and first_bucket_bytes ",
           options.first_bucket_bytes);
  NC_CHECK(!options.reduce_dtype || is_floating(*options.reduce_dtype), DTypeError, op, ": reduce_dtype ",
           dtype_name(*options.reduce_dtype), " is not a floating dtype");
  std::vector<Tensor> params;
  for (const Tensor& p : module_->parameters()) {
    NC_CHECK(p.device() == group.device(), DeviceError, op, " (rank ", group.rank(), "): parameter ", describe(p),
             " is on ", p.device(), " but the group's device is ", group.device(), " (move the module first)");
    if (p.requires_grad()) params.push_back(p);
  }
  NC_CHECK(!params.empty(), ValueError, op, ": the module has no parameter that requires grad");

  // Every rank must hold the same model, or the buckets would not match.
  const std::vector<int64_t> mine = fingerprint(params);
  Tensor local = from_vector(mine, {3}).to(group.device());
  Tensor all = empty({3 * static_cast<int64_t>(group.world_size())}, TensorOptions(DType::I64, group.device()));
  group.all_gather(all, local);
  const std::vector<int64_t> every = all.to(Device::cpu()).to_vector<int64_t>();
  for (int r = 0; r < group.world_size(); ++r) {
    NC_CHECK(std::equal(mine.begin(), mine.end(), every.begin() + 3 * r), ValueError, op, " (rank ", group.rank(),
             "): rank ", r, " has another model (", every[3 * r], " parameters, ", every[3 * r + 1],
             " elements) than this rank (", mine[0], " parameters, ", mine[1], " elements), or other shapes or dtypes");
  }

  {
    autograd::NoGradGuard no_grad;
    for (const Tensor& p : module_->parameters()) group.broadcast(p, 0);
    for (const auto& entry : module_->named_buffers()) group.broadcast(entry.second, 0);
  }
  reducer_ = std::make_unique<Reducer>(group, std::move(params), options);
}

DistributedDataParallel::~DistributedDataParallel() = default;

Tensor DistributedDataParallel::operator()(const Tensor& x) {
  if (options_.broadcast_buffers && module_->is_training() && group_.world_size() > 1) {
    autograd::NoGradGuard no_grad;
    for (const auto& entry : module_->named_buffers()) group_.broadcast(entry.second, 0);
  }
  return (*module_)(x);
}

const std::vector<std::vector<size_t>>& DistributedDataParallel::buckets() const { return reducer_->assignment; }

void DistributedDataParallel::time_reductions(bool on) {
  reducer_->timing = on;
  if (!on) reducer_->forget_waits();
}

DistributedDataParallel::ReductionWait DistributedDataParallel::reduction_wait() { return reducer_->read_waits(); }

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.reducer_->sync) {
  ddp.reducer_->sync = false;
}
DistributedDataParallel::NoSync::~NoSync() { ddp_.reducer_->sync = previous_; }

}  // namespace distributed
}  // namespace normcore
