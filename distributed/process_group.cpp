// ProcessGroup and Work (normcore/distributed.h). The checks every collective makes are
// shared; the work is done by one of two backends:
//   StoreBackend  CPU tensors through the TcpStore: each rank sets its bytes under a key of
//                 the collective's sequence number, reads everyone's, and reduces in rank
//                 order, so every rank computes the same bits. The last rank to finish
//                 reading removes the keys.
//   NcclBackend   CUDA tensors through NCCL (loaded at run time). Rank 0 makes the unique id
//                 and passes it through the store. Collectives are queued on the current
//                 stream, or on the group's own stream after an event for the *_async ones;
//                 each leaves an event that a watchdog thread polls. An NCCL error, a CUDA
//                 error or the timeout aborts the communicator (which ends its kernels) and
//                 is kept: every later call throws it.
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "normcore/autograd.h"
#include "normcore/distributed.h"
#include "normcore/ops.h"

#if NORMCORE_HAS_CUDA
#include <cuda_runtime.h>

#include "distributed/nccl.h"
#include "runtime/cuda/capture.h"
#include "runtime/cuda/runtime.h"
#endif

namespace normcore {
namespace distributed {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

// ---------------------------------------------------------------- Work

struct Work::State {
  virtual ~State() = default;
  virtual void wait() = 0;
  virtual void synchronize() = 0;
  virtual bool completed() const = 0;
};

namespace {

// What a collective on the CPU leaves: it finished before the call returned.
struct Done : Work::State {
  void wait() override {}
  void synchronize() override {}
  bool completed() const override { return true; }
};

enum class Kind { AllReduce, Broadcast, AllGather, ReduceScatter };

// One collective as the backends see it: in is read, out written (the same tensor for
// all_reduce and broadcast).
struct Call {
  Kind kind;
  const char* name;
  Tensor out, in;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
};

}  // namespace

Work::Work(std::shared_ptr<State> state) : state_(std::move(state)) {}
Work::Work(Work&&) noexcept = default;
Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    if (state_) {
      try {
        state_->wait();
      } catch (...) {  // the group's failure is reported by its next call
      }
    }
    state_ = std::move(other.state_);
  }
  return *this;
}
Work::~Work() {
  if (!state_) return;
  try {
    state_->wait();
  } catch (...) {  // see operator=
  }
}
void Work::wait() {
  if (state_) state_->wait();
}
void Work::synchronize() {
  if (state_) state_->synchronize();
}
bool Work::completed() const { return !state_ || state_->completed(); }

// ---------------------------------------------------------------- backends

struct ProcessGroup::Impl {
  std::shared_ptr<TcpStore> store;
  std::string prefix;  // of the group's keys in the store
  int rank, world_size;
  Device device;
  ProcessGroupOptions options;

  Impl(std::shared_ptr<TcpStore> s, std::string p, int r, int w, Device d, ProcessGroupOptions o)
      : store(std::move(s)), prefix(std::move(p)), rank(r), world_size(w), device(d), options(o) {}
  virtual ~Impl() = default;
  virtual std::string backend() const = 0;
  virtual std::shared_ptr<Work::State> run(const Call& call, bool async) = 0;
  // Several all-reduces as one collective; in turn unless a backend can do better.
  virtual std::shared_ptr<Work::State> run_group(const std::vector<Call>& calls, bool async) {
    std::shared_ptr<Work::State> last;
    for (const Call& call : calls) last = run(call, async);
    return last;
  }
  virtual void barrier() = 0;
  virtual void watch(const std::string&) {}

  // "all_reduce (rank 1 of 2)"
  std::string where(const char* name) const { return detail::cat_str(name, " (rank ", rank, " of ", world_size, ")"); }
};

namespace {

class StoreBackend : public ProcessGroup::Impl {
 public:
  using Impl::Impl;
  std::string backend() const override { return "store"; }

  std::shared_ptr<Work::State> run(const Call& call, bool) override {
    autograd::NoGradGuard no_grad;
    const std::vector<std::string> all = exchange(call.name, call.kind == Kind::Broadcast ? call.root : -1, call.in);
    std::vector<Tensor> parts;
    for (const std::string& bytes : all) {
      Tensor t = empty(call.in.shape(), call.in.dtype());
      std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
      parts.push_back(t);
    }
    Tensor out = call.out;
    switch (call.kind) {
      case Kind::AllReduce: out.copy_(reduce(parts, call.op)); break;
      case Kind::Broadcast: out.copy_(parts[0]); break;
      case Kind::AllGather: out.copy_(cat(parts, 0)); break;
      case Kind::ReduceScatter: {
        const int64_t n = out.size(0);
        out.copy_(reduce(parts, call.op).narrow(0, rank * n, n));
        break;
      }
    }
    return std::make_shared<Done>();
  }

  void barrier() override { store->barrier(prefix + "barrier"); }

 private:
  uint64_t sequence_ = 0;

  // Every rank's bytes of t in rank order (only root's when root >= 0). A value in the store
  // holds at most TcpStore::kMaxValueBytes, so a larger tensor goes in pieces of that size;
  // every rank knows how many from t's size.
  std::vector<std::string> exchange(const char* name, int root, const Tensor& t) {
    const std::string key = prefix + std::to_string(sequence_++) + "/";
    const size_t bytes = t.nbytes(), piece_bytes = TcpStore::kMaxValueBytes;
    const size_t pieces = std::max<size_t>(1, (bytes + piece_bytes - 1) / piece_bytes);
    auto piece_key = [&](int r, size_t piece) { return key + std::to_string(r) + "/" + std::to_string(piece); };
    std::vector<int> senders;
    for (int r = 0; r < world_size; ++r)
      if (root < 0 || r == root) senders.push_back(r);
    if (root < 0 || root == rank) {
      const char* data = static_cast<const char*>(t.data_ptr());
      for (size_t piece = 0; piece < pieces; ++piece) {
        const size_t start = piece * piece_bytes;
        store->set(piece_key(rank, piece), std::string(data + start, std::min(piece_bytes, bytes - start)));
      }
    }
    std::vector<std::string> all;
    for (int r : senders) {
      std::string& whole = all.emplace_back();
      whole.reserve(bytes);
      for (size_t piece = 0; piece < pieces; ++piece) {
        try {
          whole += store->get(piece_key(r, piece));
        } catch (const DistributedError& e) {
          // Which collective, and whose part never came: the rank died, hangs, or skipped it.
          throw DistributedError(detail::cat_str(
              name, " (rank ", rank, " of ", world_size, ") over the store: rank ", r, "'s part did not come within ",
              store->timeout().count(), " ms (that rank died, hangs, or did not make this collective): ", e.what()));
        }
      }
    }
    if (store->add(key + "read", 1) == world_size) {
      for (int r : senders)
        for (size_t piece = 0; piece < pieces; ++piece) store->remove(piece_key(r, piece));
      store->remove(key + "read");
    }
    return all;
  }

  Tensor reduce(const std::vector<Tensor>& parts, ReduceOp op) const {
    Tensor acc = parts[0];
    for (size_t r = 1; r < parts.size(); ++r) {
      acc = op == ReduceOp::Max   ? maximum(acc, parts[r])
            : op == ReduceOp::Min ? minimum(acc, parts[r])
                                  : add(acc, parts[r]);
    }
    return op == ReduceOp::Avg ? div(acc, Scalar(static_cast<double>(world_size))) : acc;
  }
};

#if NORMCORE_HAS_CUDA

nccl::DataType nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return nccl::kFloat32;
    case DType::F64: return nccl::kFloat64;
    case DType::F16: return nccl::kFloat16;
    case DType::BF16: return nccl::kBfloat16;
    case DType::I32: return nccl::kInt32;
    case DType::I64: return nccl::kInt64;
    case DType::U8:
    case DType::Bool: return nccl::kUint8;
  }
  return nccl::kUint8;
}

nccl::RedOp nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return nccl::kSum;
    case ReduceOp::Avg: return nccl::kAvg;
    case ReduceOp::Max: return nccl::kMax;
    case ReduceOp::Min: return nccl::kMin;
  }
  return nccl::kSum;
}

std::string cuda_text(cudaError_t e) { return detail::cat_str(cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"); }

class NcclBackend;

// An NCCL collective under way: the event recorded after it on the stream it ran on.
struct Pending : Work::State {
  NcclBackend* group;
  std::string name;
  cudaEvent_t done = nullptr;
  std::vector<Tensor> keep;  // alive until the collective has finished
  void wait() override;
  void synchronize() override;
  bool completed() const override { return cudaEventQuery(done) != cudaErrorNotReady; }
  ~Pending() override;
};

class NcclBackend : public ProcessGroup::Impl {
 public:
  NcclBackend(std::shared_ptr<TcpStore> s, std::string p, int r, int w, Device d, ProcessGroupOptions o)
      : Impl(std::move(s), std::move(p), r, w, d, o), api_(nccl::api()) {
    cuda::DeviceGuard guard(device.index);
    nccl::UniqueId id{};
    const std::string key = prefix + "nccl-id";
    if (rank == 0) {
      check_nccl("ncclGetUniqueId", api_.GetUniqueId(&id));
      store->set(key, std::string(id.internal, sizeof id.internal));
    } else {
      const std::string bytes = store->get(key);
      NC_CHECK(bytes.size() == sizeof id.internal, DistributedError, where("ProcessGroup"),
               ": the NCCL id from rank 0 has ", bytes.size(), " bytes, not ", sizeof id.internal);
      std::memcpy(id.internal, bytes.data(), bytes.size());
    }
    // Every rank is alive right before the communicator is made (its initialization waits
    // for all of them, without a timeout of its own).
    store->barrier(prefix + "nccl-init");
    check_nccl("ncclCommInitRank", api_.CommInitRank(&comm_, world_size, id, rank));
    NC_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) == cudaSuccess, DistributedError,
             where("ProcessGroup"), ": cannot create its stream");
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclBackend() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    watchdog_.join();
    cuda::DeviceGuard guard(device.index);
    if (failure_.empty()) {
      cudaStreamSynchronize(stream_);
      api_.CommDestroy(comm_);
    }
    for (const InFlight& f : in_flight_) cudaEventDestroy(f.event);
    for (cudaEvent_t e : spare_) cudaEventDestroy(e);
    cudaStreamDestroy(stream_);
  }

  std::string backend() const override {
    return detail::cat_str("nccl ", api_.version / 10000, ".", api_.version / 100 % 100, ".", api_.version % 100);
  }

  std::shared_ptr<Work::State> run(const Call& call, bool async) override { return run_group({call}, async); }

  // One NCCL call, or several in one NCCL group (one launch; the tensors need not be
  // adjacent in memory).
  std::shared_ptr<Work::State> run_group(const std::vector<Call>& calls, bool async) override {
    check_failure();
    cuda::DeviceGuard guard(device.index);
    const cudaStream_t current = cuda::stream(device.index);
    const bool captured = cuda::capturing(device.index);
    cudaStream_t s = current;
    if (async) {
      // The group's stream starts where the current one is.
      cudaEvent_t ready = event();
      cudaEventRecord(ready, current);
      cudaStreamWaitEvent(stream_, ready, 0);
      release(ready);
      s = stream_;
    }
    const Call& first = calls.front();
    nccl::Result result = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);  // NCCL calls on one communicator, one at a time
      NC_CHECK(failure_.empty(), DistributedError, failure_);
      const bool grouped = calls.size() > 1;
      if (grouped) result = api_.GroupStart();
      const bool started = result == 0;
      for (size_t i = 0; i < calls.size() && result == 0; ++i) result = queue(calls[i], s);
      if (grouped && started) {
        const nccl::Result ended = api_.GroupEnd();
        if (result == 0) result = ended;
      }
    }
    if (result != 0) {
      fail(first.name, detail::cat_str("NCCL error ", result, ": ", api_.GetErrorString(result)));
      check_failure();
    }
    auto pending = std::make_shared<Pending>();
    pending->group = this;
    pending->name = first.name;
    pending->done = event();
    for (const Call& call : calls) {
      pending->keep.push_back(call.in);
      pending->keep.push_back(call.out);
    }
    cudaEventRecord(pending->done, s);
    if (!captured) track(first.name, s);
    for (const Call& call : calls) call.out.bump_version();  // written through its pointer
    return pending;
  }

  // Queues call's NCCL operation on s (the communicator's lock held).
  nccl::Result queue(const Call& call, cudaStream_t s) {
    const nccl::DataType type = nccl_type(call.in.dtype());
    const auto count = static_cast<size_t>(call.in.numel());
    switch (call.kind) {
      case Kind::AllReduce:
        return api_.AllReduce(call.in.data_ptr(), call.out.data_ptr(), count, type, nccl_op(call.op), comm_, s);
      case Kind::Broadcast:
        return api_.Broadcast(call.in.data_ptr(), call.out.data_ptr(), count, type, call.root, comm_, s);
      case Kind::AllGather: return api_.AllGather(call.in.data_ptr(), call.out.data_ptr(), count, type, comm_, s);
      case Kind::ReduceScatter:
        return api_.ReduceScatter(call.in.data_ptr(), call.out.data_ptr(), static_cast<size_t>(call.out.numel()), type,
                                  nccl_op(call.op), comm_, s);
    }
    return 0;
  }

  void watch(const std::string& what) override {
    check_failure();
    cuda::DeviceGuard guard(device.index);
    if (!cuda::capturing(device.index)) track(what, cuda::stream(device.index));
  }

  void barrier() override {
    Tensor token = zeros({1}, TensorOptions(DType::I32, device));
    std::shared_ptr<Work::State> work = run(Call{Kind::AllReduce, "barrier", token, token}, false);
    work->synchronize();
  }

  // Throws the failure, once there is one.
  void check_failure() {
    std::lock_guard<std::mutex> lock(mutex_);
    NC_CHECK(failure_.empty(), DistributedError, failure_);
  }

  cudaEvent_t event() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!spare_.empty()) {
      cudaEvent_t e = spare_.back();
      spare_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    NC_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess, DistributedError,
             "ProcessGroup: cannot create a CUDA event");
    return e;
  }
  void release(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(mutex_);
    spare_.push_back(e);
  }

  std::chrono::milliseconds timeout() const { return options.timeout; }

 private:
  struct InFlight {
    std::string name;
    cudaEvent_t event;
    std::chrono::steady_clock::time_point start;
  };

  const nccl::Api& api_;
  nccl::Comm comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<InFlight> in_flight_;  // in the order queued
  std::vector<cudaEvent_t> spare_;
  std::string failure_;
  bool stopping_ = false;
  std::thread watchdog_;

  void check_nccl(const char* what, nccl::Result r) {
    NC_CHECK(r == 0, DistributedError, where("ProcessGroup"), ": ", what, " failed with NCCL error ", r, ": ",
             api_.GetErrorString(r));
  }

  // The watchdog's record of a collective: an event after it on s.
  void track(const std::string& name, cudaStream_t s) {
    cudaEvent_t e = event();
    cudaEventRecord(e, s);
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.push_back({name, e, std::chrono::steady_clock::now()});
  }

 public:
  // Keeps the first failure, aborts the communicator (its kernels end) and says so on
  // stderr at once: the thread that will throw it may be waiting elsewhere.
  void fail(const std::string& name, const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.empty()) return;
    failure_ = detail::cat_str(where(name.c_str()), ": ", why, "; the communicator was aborted");
    std::fprintf(stderr, "normcore: distributed: %s\n", failure_.c_str());
    std::fflush(stderr);
    api_.CommAbort(comm_);
  }

 private:
  void watch() {
    cudaSetDevice(device.index);
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      wake_.wait_for(lock, std::chrono::milliseconds(20));
      if (!failure_.empty()) continue;
      std::string name, why;
      while (!in_flight_.empty()) {
        InFlight& f = in_flight_.front();
        const cudaError_t state = cudaEventQuery(f.event);
        if (state == cudaSuccess) {
          spare_.push_back(f.event);
          in_flight_.pop_front();
          continue;
        }
        if (state != cudaErrorNotReady) {
          name = f.name;
          why = "CUDA error " + cuda_text(state);
        } else if (std::chrono::steady_clock::now() - f.start > options.timeout) {
          name = f.name;
          why = detail::cat_str("did not finish within ", options.timeout.count(),
                                " ms (a peer died, is stuck, or calls other collectives)");
        }
        break;
      }
      if (why.empty()) {
        nccl::Result async_error = 0;
        api_.CommGetAsyncError(comm_, &async_error);
        // 7 is ncclInProgress: not an error.
        if (async_error != 0 && async_error != 7) {
          name = in_flight_.empty() ? "a collective" : in_flight_.front().name;
          why = detail::cat_str("NCCL error ", async_error, ": ", api_.GetErrorString(async_error));
        }
      }
      if (!why.empty()) {
        lock.unlock();
        fail(name, why);
        lock.lock();
      }
    }
  }
};

void Pending::wait() {
  group->check_failure();
  cudaStreamWaitEvent(cuda::stream(group->device.index), done, 0);
}

void Pending::synchronize() {
  const auto deadline = std::chrono::steady_clock::now() + group->timeout() + std::chrono::seconds(5);
  for (;;) {
    group->check_failure();
    const cudaError_t state = cudaEventQuery(done);
    if (state == cudaSuccess) break;
    if (state != cudaErrorNotReady) {
      group->fail(name, "CUDA error " + cuda_text(state));
      group->check_failure();
    }
    if (std::chrono::steady_clock::now() > deadline) {
      group->fail(name, detail::cat_str("did not finish within ", group->timeout().count(), " ms"));
      group->check_failure();
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  group->check_failure();
}

Pending::~Pending() {
  if (done != nullptr) group->release(done);
}

#endif  // NORMCORE_HAS_CUDA

std::unique_ptr<ProcessGroup::Impl> make_backend(std::shared_ptr<TcpStore> store, std::string prefix, int rank,
                                                 int world_size, Device device, ProcessGroupOptions options) {
  NC_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, ValueError, "ProcessGroup: rank ", rank,
           " must be in [0, world_size ", world_size, ")");
  NC_CHECK(options.timeout.count() > 0, ValueError, "ProcessGroup: timeout must be positive, got ",
           options.timeout.count(), " ms");
  NC_CHECK(store != nullptr, ValueError, "ProcessGroup: the store is null");
  if (device.is_cpu()) {
    return std::make_unique<StoreBackend>(std::move(store), std::move(prefix), rank, world_size, device, options);
  }
#if NORMCORE_HAS_CUDA
  NC_CHECK(device.index < cuda::device_count(), DeviceError, "ProcessGroup (rank ", rank, "): device ", device,
           " does not exist (", cuda::device_count(), " GPUs visible)");
  return std::make_unique<NcclBackend>(std::move(store), std::move(prefix), rank, world_size, device, options);
#else
  throw DeviceError(detail::cat_str("ProcessGroup (rank ", rank, "): device ", device,
                                    " needs a build with the CUDA backend (this one is CPU-only)"));
#endif
}

}  // namespace

// ---------------------------------------------------------------- ProcessGroup

ProcessGroup::ProcessGroup(const Env& env, Device device, ProcessGroupOptions options) {
  auto store =
      std::make_shared<TcpStore>(env.master_addr, env.master_port, env.world_size, env.rank == 0, options.timeout);
  impl_ = make_backend(std::move(store), "pg/", env.rank, env.world_size, device, options);
}

ProcessGroup::ProcessGroup(std::shared_ptr<TcpStore> store, int rank, int world_size, Device device,
                           ProcessGroupOptions options)
    : impl_(make_backend(std::move(store), "pg/", rank, world_size, device, options)) {}

ProcessGroup::~ProcessGroup() = default;

int ProcessGroup::rank() const { return impl_->rank; }
int ProcessGroup::world_size() const { return impl_->world_size; }
Device ProcessGroup::device() const { return impl_->device; }
std::string ProcessGroup::backend() const { return impl_->backend(); }

namespace {

// Checks a collective's tensor: defined, contiguous, on the group's device, of a dtype the
// collective takes.
void check_tensor(const ProcessGroup::Impl& g, const char* name, const char* arg, const Tensor& t, bool reduces,
                  ReduceOp op) {
  NC_CHECK(t.defined(), ValueError, g.where(name), ": '", arg, "' is an undefined tensor");
  NC_CHECK(t.device() == g.device, DeviceError, g.where(name), ": '", arg, "' ", describe(t), " is on ", t.device(),
           " but the group's device is ", g.device);
  NC_CHECK(t.is_contiguous(), ShapeError, g.where(name), ": '", arg, "' ", describe(t),
           " must be contiguous (call .contiguous() and copy the result back)");
  if (reduces) {
    NC_CHECK(t.dtype() != DType::Bool, DTypeError, g.where(name), ": '", arg, "' ", describe(t),
             " is bool, which has no ", reduce_op_name(op), " (use u8)");
    NC_CHECK(op != ReduceOp::Avg || is_floating(t.dtype()), DTypeError, g.where(name), ": '", arg, "' ", describe(t),
             ": avg needs a floating dtype (sum integers and divide)");
  }
}

Work run(ProcessGroup::Impl& g, const Call& call, bool async) { return Work(g.run(call, async)); }

Call all_reduce_call(ProcessGroup::Impl& g, const Tensor& t, ReduceOp op) {
  check_tensor(g, "all_reduce", "t", t, true, op);
  return Call{Kind::AllReduce, "all_reduce", t, t, op, 0};
}

Call broadcast_call(ProcessGroup::Impl& g, const Tensor& t, int root) {
  check_tensor(g, "broadcast", "t", t, false, ReduceOp::Sum);
  NC_CHECK(root >= 0 && root < g.world_size, ValueError, g.where("broadcast"), ": root ", root,
           " must be in [0, world_size ", g.world_size, ")");
  return Call{Kind::Broadcast, "broadcast", t, t, ReduceOp::Sum, root};
}

// big [world_size * n, ...] against small [n, ...], one dtype.
void check_blocks(const ProcessGroup::Impl& g, const char* name, const char* big_name, const Tensor& big,
                  const char* small_name, const Tensor& small) {
  NC_CHECK(big.dtype() == small.dtype(), DTypeError, g.where(name), ": '", big_name, "' is ", dtype_name(big.dtype()),
           " but '", small_name, "' is ", dtype_name(small.dtype()));
  bool fits = big.dim() == small.dim() && big.dim() >= 1 && big.size(0) == g.world_size * small.size(0);
  for (int64_t d = 1; fits && d < big.dim(); ++d) fits = big.size(d) == small.size(d);
  NC_CHECK(fits, ShapeError, g.where(name), ": '", big_name, "' has shape ", big.shape(), " but '", small_name,
           "' has shape ", small.shape(), "; '", big_name, "' must be '", small_name, "' with dim 0 times world_size ",
           g.world_size);
}

Call all_gather_call(ProcessGroup::Impl& g, const Tensor& out, const Tensor& in) {
  check_tensor(g, "all_gather", "out", out, false, ReduceOp::Sum);
  check_tensor(g, "all_gather", "in", in, false, ReduceOp::Sum);
  check_blocks(g, "all_gather", "out", out, "in", in);
  return Call{Kind::AllGather, "all_gather", out, in, ReduceOp::Sum, 0};
}

Call reduce_scatter_call(ProcessGroup::Impl& g, const Tensor& out, const Tensor& in, ReduceOp op) {
  check_tensor(g, "reduce_scatter", "out", out, true, op);
  check_tensor(g, "reduce_scatter", "in", in, true, op);
  check_blocks(g, "reduce_scatter", "in", in, "out", out);
  return Call{Kind::ReduceScatter, "reduce_scatter", out, in, op, 0};
}

}  // namespace

void ProcessGroup::all_reduce(const Tensor& t, ReduceOp op) { run(*impl_, all_reduce_call(*impl_, t, op), false); }
void ProcessGroup::broadcast(const Tensor& t, int root) { run(*impl_, broadcast_call(*impl_, t, root), false); }
void ProcessGroup::all_gather(const Tensor& out, const Tensor& in) {
  run(*impl_, all_gather_call(*impl_, out, in), false);
}
void ProcessGroup::reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) {
  run(*impl_, reduce_scatter_call(*impl_, out, in, op), false);
}
void ProcessGroup::all_reduce_coalesced(const std::vector<Tensor>& ts, ReduceOp op) {
  all_reduce_coalesced_async(ts, op).wait();
}
void ProcessGroup::barrier() { impl_->barrier(); }
void ProcessGroup::watch(const std::string& what) { impl_->watch(what); }

Work ProcessGroup::all_reduce_async(const Tensor& t, ReduceOp op) {
  return run(*impl_, all_reduce_call(*impl_, t, op), true);
}
Work ProcessGroup::all_reduce_coalesced_async(const std::vector<Tensor>& ts, ReduceOp op) {
  NC_CHECK(!ts.empty(), ValueError, impl_->where("all_reduce_coalesced"), ": 'ts' is empty");
  std::vector<Call> calls;
  for (size_t i = 0; i < ts.size(); ++i) {
    const std::string arg = detail::cat_str("ts[", i, "]");
    check_tensor(*impl_, "all_reduce_coalesced", arg.c_str(), ts[i], true, op);
    calls.push_back(Call{Kind::AllReduce, "all_reduce_coalesced", ts[i], ts[i], op, 0});
  }
  return Work(impl_->run_group(calls, true));
}
Work ProcessGroup::broadcast_async(const Tensor& t, int root) {
  return run(*impl_, broadcast_call(*impl_, t, root), true);
}
Work ProcessGroup::all_gather_async(const Tensor& out, const Tensor& in) {
  return run(*impl_, all_gather_call(*impl_, out, in), true);
}
Work ProcessGroup::reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) {
  return run(*impl_, reduce_scatter_call(*impl_, out, in, op), true);
}

}  // namespace distributed
}  // namespace normcore
