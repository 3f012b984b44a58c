// Running one process per GPU, on one machine or several: where a process stands in the job
// (Env, from the usual environment variables) and the small TCP key-value store the
// processes meet through (TcpStore: rank 0 serves it at MASTER_ADDR:MASTER_PORT, every rank
// connects and proves it knows the job's secret). The NCCL process group, its collectives
// and DistributedDataParallel build on these.
//
// On top of them: ProcessGroup (collectives over NCCL on a GPU, or through the store on the
// CPU) and DistributedDataParallel (gradients averaged over the ranks in buckets, while
// backward runs).
//
// Every failure to meet (a refused or dropped connection, a peer that never sets a key, a
// timeout) throws DistributedError naming the operation, the key and the rank; nothing
// waits forever.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "normcore/error.h"
#include "normcore/nn.h"
#include "normcore/optim.h"
#include "normcore/tensor.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {
namespace distributed {

// Where this process stands in the job. from_environment() reads RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR and MASTER_PORT (what `normcore launch` and torchrun set). Unset:
// a job of one (rank 0 of 1, local rank 0, 127.0.0.1, port 29500). Malformed or
// inconsistent values (rank >= world size, a port outside 1..65535) throw ValueError
// naming the variable.
struct Env {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;

  static Env from_environment();
};

// How a TcpStore listens, whom it lets in, and how long it waits.
struct TcpStoreOptions {
  // The longest a client waits: for the server to come up, and for a reply.
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  // The job's secret: every connection proves it knows it (and the server proves it back)
  // before the store hears a request. Empty: NORMCORE_JOB_SECRET from the environment
  // (`normcore launch` sets it for its ranks); when that is unset too, a secret of this
  // process alone, which its own clients share and every other process lacks. 16 to 4096
  // bytes (ValueError otherwise).
  std::string secret;
  // Server: listen on every interface rather than on host's address alone; also turned on
  // by NORMCORE_STORE_BIND_ALL=1.
  bool bind_all = false;
  // Server: the most connections it holds at once, authenticated or not; one more is
  // refused (and its client retries until timeout). 0: 2 * world_size + 64.
  int max_connections = 0;
  // Server: a connection that has not authenticated within this time, or that leaves a
  // request unfinished this long, is closed. Between requests a client may be silent as
  // long as it likes.
  std::chrono::milliseconds stall_timeout = std::chrono::seconds(10);
};

// A key-value store for rendezvous. The server runs inside the rank-0 process on a thread of
// its own; every rank (rank 0 included) is a client. Values are byte strings.
//   set(k, v)      stores v under k (replacing any value);
//   get(k)         waits until k is set (at most timeout), then returns its value;
//   add(k, delta)  adds to the 64-bit counter under k (0 when unset) and returns the sum;
//   barrier(name)  returns once all world_size ranks have called it with that name (every
//                  rank calls its barriers in the same order; a name may be reused).
// Keys hold at most kMaxKeyBytes and values kMaxValueBytes (ValueError beyond). The server
// closes a connection that fails to authenticate, breaks these bounds or the protocol, or
// stalls (TcpStoreOptions); the other connections go on.
class TcpStore {
 public:
  static constexpr size_t kMaxKeyBytes = 4096;
  // A value takes at most 4 MiB (an NCCL id takes 128 bytes; the CPU process group sends
  // larger tensors in pieces of this size).
  static constexpr size_t kMaxValueBytes = size_t(4) << 20;

  // Server (is_server): listens on host's address and port (0 picks a free port, see
  // port()), or on every interface with bind_all; a host that is not an address of this
  // machine is a DistributedError. Client: connects to host:port, retrying until timeout,
  // and authenticates; a server that does not share the secret is a DistributedError
  // saying authentication failed.
  TcpStore(const std::string& host, int port, int world_size, bool is_server, const TcpStoreOptions& options);
  TcpStore(const std::string& host, int port, int world_size, bool is_server,
           std::chrono::milliseconds timeout = std::chrono::seconds(300));
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::string& value);
  std::string get(const std::string& key);
  int64_t add(const std::string& key, int64_t delta);
  void barrier(const std::string& name);

  // Removes k (nothing when unset).
  void remove(const std::string& key);

  int port() const;
  // The numeric address a server listens on ("127.0.0.1"; "0.0.0.0" or "::" on every
  // interface); empty for a client.
  std::string listen_address() const;
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  struct Server;
  // A request answered by one byte (set, remove).
  void acknowledged(const char* what, uint8_t command, const std::string& key, const std::string& value);
  // Sends a request after checking the bounds of its key and value.
  void send_request(const char* what, uint8_t command, const std::string& key, const std::string& value);
  std::unique_ptr<Server> server_;
  int socket_ = -1;
  std::string host_;  // as given, for messages
  int port_ = 0;
  int world_size_;
  int64_t barriers_ = 0;  // barriers passed, which tells repeated names apart
  std::chrono::milliseconds timeout_;
};

// The processes of this machine for `normcore launch`.
struct LaunchOptions {
  int nproc = 1;                          // ranks on this machine (usually its GPUs)
  int nnodes = 1;                         // machines in the job, each running one launcher
  int node_rank = 0;                      // this machine's index in [0, nnodes)
  std::string master_addr = "127.0.0.1";  // where rank 0 (node 0) listens
  int master_port = 29500;
  std::chrono::milliseconds grace = std::chrono::seconds(5);  // SIGTERM to SIGKILL
  int max_restarts = 0;                                       // starts of the job again after a failure, at most
};

// Runs command (argv[0] looked up in PATH) as ranks node_rank * nproc ... + nproc - 1 of
// nnodes * nproc, each with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT and NORMCORE_JOB_SECRET set (the launcher's own NORMCORE_JOB_SECRET when it
// has one, else a random one made for the job; a job of several machines needs the same
// one given to every launcher, ValueError otherwise), and forwards each line of their
// stdout and stderr with a "[rank R] " prefix. When a rank fails (a non-zero exit or a
// signal), the others (and what they started) get SIGTERM, then SIGKILL after the grace
// period, and launch returns the failing rank's status (128 + signal for a signal); 0 when
// every rank succeeded. With max_restarts, a failed job is then started again, all of this
// launcher's ranks at once, at most that many times, saying so on stderr, and launch
// returns the last start's status; each start's ranks get NORMCORE_RESTART_COUNT (0 for the
// first), and a training command resumes from its last checkpoint if it is told to (the
// normcore program's --resume auto). With several machines each launcher restarts its own
// ranks: the others' fail to meet them and restart too, if allowed. Bad options throw
// ValueError.
int launch(const std::vector<std::string>& command, const LaunchOptions& options);

// ---------------------------------------------------------------- process groups

enum class ReduceOp { Sum, Avg, Max, Min };
const char* reduce_op_name(ReduceOp op);

struct ProcessGroupOptions {
  // How long a collective (or the start of the group) may take before it is declared
  // failed: the communicator is aborted and DistributedError names the collective and the
  // rank. A dead or stuck peer is found within this time.
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
};

// A collective under way (from an *_async call). wait() makes the current stream of the
// group's device wait for it (the host goes on: later work on that stream sees the result);
// synchronize() blocks the host until it has finished, at most the group's timeout. A Work
// dropped unwaited is waited for by its destructor in the first sense, so the tensors it
// reads and writes are never reused while it runs.
class Work {
 public:
  struct State;
  Work() = default;
  explicit Work(std::shared_ptr<State> state);
  ~Work();
  Work(Work&&) noexcept;
  Work& operator=(Work&&) noexcept;

  void wait();
  void synchronize();
  bool completed() const;

 private:
  std::shared_ptr<State> state_;
};

// The ranks of a job, able to run collectives on tensors of one device. On a CUDA device the
// collectives are NCCL's, queued on the device's current stream (the *_async ones on the
// group's own stream, ordered after what the current stream had queued); NCCL is loaded at
// run time, and a machine without it gets DistributedError here. On the CPU they pass
// through the store (every byte through rank 0; for tests and small CPU jobs, not speed).
//
// Every rank calls the same collectives in the same order with tensors of the same shape and
// dtype. Tensors must be contiguous and on the group's device: anything else throws
// ShapeError / DTypeError / DeviceError naming the collective, the argument and the rank. A
// failed collective (an NCCL error, a peer that died, the timeout) aborts the communicator;
// that collective or the next call throws DistributedError naming the collective and the
// rank, and every later call throws it too. A watchdog thread keeps the time.
class ProcessGroup {
 public:
  // Joins the job env describes: rank 0 serves the store at env.master_addr:master_port,
  // every rank connects. device: cuda:local_rank for a GPU job (NCCL), cpu for the store.
  ProcessGroup(const Env& env, Device device, ProcessGroupOptions options = {});
  // Over an existing store (shared with other uses of it; keys start with "pg/").
  ProcessGroup(std::shared_ptr<TcpStore> store, int rank, int world_size, Device device,
               ProcessGroupOptions options = {});
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int world_size() const;
  Device device() const;
  // "nccl 2.28.6" or "store".
  std::string backend() const;

  // t becomes the reduction of every rank's t (Avg: floating dtypes only).
  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum);
  // t becomes root's t.
  void broadcast(const Tensor& t, int root = 0);
  // Each tensor of ts becomes its reduction, as one collective (on NCCL one group of
  // all-reduces, one launch): no copy into a flat buffer. ts: at least one tensor.
  void all_reduce_coalesced(const std::vector<Tensor>& ts, ReduceOp op = ReduceOp::Sum);
  // out [world_size * n, ...] becomes every rank's in [n, ...], in rank order.
  void all_gather(const Tensor& out, const Tensor& in);
  // out [n, ...] becomes this rank's block (rows rank * n ...) of the reduction of every
  // rank's in [world_size * n, ...].
  void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::Sum);
  // Returns once every rank has called it (and, on a GPU, the collectives queued before it
  // have finished on this rank).
  void barrier();

  Work all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::Sum);
  Work all_reduce_coalesced_async(const std::vector<Tensor>& ts, ReduceOp op = ReduceOp::Sum);
  Work broadcast_async(const Tensor& t, int root = 0);
  Work all_gather_async(const Tensor& out, const Tensor& in);
  Work reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::Sum);

  // The collectives a CUDA graph replays are not seen one by one; after a replay, watch(what)
  // makes the watchdog time everything queued on the device's current stream so far as one
  // collective named what: an error or the timeout fails the group as for any collective.
  // Nothing on the store back end (no graphs on the CPU) or inside a capture.
  void watch(const std::string& what);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------- data parallelism

struct DataParallelOptions {
  // Gradients are all-reduced in buckets of about this many bytes, launched as soon as
  // backward has produced every gradient of a bucket. The first bucket (the last
  // parameters, whose gradients come first) is kept small so communication starts early.
  size_t bucket_bytes = 25u << 20;
  size_t first_bucket_bytes = 1u << 20;
  // Floating gradients are averaged in this dtype (converted into a bucket buffer and back):
  // BF16 halves what f32 gradients move, at bf16's precision for the average (PyTorch's
  // bf16_compress_hook; llm.c reduces in bf16). Unset: their own dtype, where they lie.
  std::optional<DType> reduce_dtype;
  // Broadcast rank 0's buffers (BatchNorm's running statistics) before every forward in
  // training mode, so that every rank evaluates and saves the same model.
  bool broadcast_buffers = true;
};

// The buckets of params for DistributedDataParallel: lists of indices into params, in the
// order they are launched. Parameters are taken from last to first (backward produces their
// gradients in about that order), a bucket holds one dtype, and a new bucket starts when the
// next parameter would take it past its limit (first_bucket_bytes for the first, then
// bucket_bytes); a parameter larger than the limit gets a bucket of its own.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<Tensor>& params, size_t first_bucket_bytes,
                                                size_t bucket_bytes);

// Data-parallel training of module on every rank of group (PyTorch's
// DistributedDataParallel). The constructor checks that every rank has the same
// parameters (count, shapes, dtypes), then copies rank 0's parameters and buffers to every
// rank. From then on each backward() through the module averages the gradients over the
// ranks: a hook on each parameter marks its gradient ready, a full bucket's gradients are
// all-reduced where they lie, as one group (async, overlapping the rest of backward; with
// reduce_dtype, or for a gradient that is not contiguous, copied into the bucket's flat
// buffer first, and grad() then becomes a view of that buffer holding the average: the next
// reduction overwrites it, copy it to keep it), buckets are launched in the same order on
// every rank, and when backward ends every grad() holds the average. Parameters that got no
// gradient count as zeros. The optimizer then steps as usual, and every rank holds the same
// parameters. A step through it may be captured in a CUDA graph (GraphedStep): the copies
// and all-reduces replay with the rest; ProcessGroup::watch times a replay.
//
//   distributed::ProcessGroup group(distributed::Env::from_environment(), device);
//   distributed::DistributedDataParallel ddp(model, group);
//   loss = cross_entropy(ddp(x), y); loss.backward(); optimizer.step();
//
// no_sync() accumulates gradients locally (gradient accumulation); the first backward after
// it ends averages the accumulated sum. Every rank must call backward the same number of
// times. Checkpoints: save from rank 0 only (every rank holds the same model).
class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<nn::Module> module, ProcessGroup& group, DataParallelOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // module's forward, after broadcasting the buffers (see DataParallelOptions).
  Tensor operator()(const Tensor& x);
  nn::Module& module() { return *module_; }
  ProcessGroup& group() { return group_; }
  // The buckets in launch order, as indices into the module's parameters that require grad.
  const std::vector<std::vector<size_t>>& buckets() const;

  // While one lives, backward accumulates gradients without communicating.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSync no_sync() { return NoSync(*this); }

  // How long the ends of backward waited for their gradients' reductions: the part of the
  // all-reduces that the rest of backward did not hide. While timing is on, each backward on
  // a GPU (not inside a CUDA graph capture) records two CUDA events around that wait;
  // reduction_wait() waits for them and returns the backwards since timing was turned on or
  // last read (then forgets them).
  struct ReductionWait {
    int64_t backwards = 0;
    double total_ms = 0, max_ms = 0;
  };
  void time_reductions(bool on);
  ReductionWait reduction_wait();

  struct Reducer;

 private:
  std::shared_ptr<nn::Module> module_;
  ProcessGroup& group_;
  DataParallelOptions options_;
  std::unique_ptr<Reducer> reducer_;
};

// ---------------------------------------------------------------- sharded optimizer state
// ZeRO stage 1 over an optimizer whose update goes element by element (SGD, Adam, AdamW):
// the parameters, laid end to end, are cut into world_size even pieces; each rank updates
// its piece (an optimizer of the same kind, made by make_like, over views of it) and holds
// the state of that piece alone, then every rank gets the others' pieces. The gradients stay
// whole on every rank (DistributedDataParallel averages them as before, so clipping sees the
// whole norm); what is saved is (world_size - 1) / world_size of the optimizer's state
// (AdamW: two f32 moments a parameter element). Training is the same, bit for bit, as with
// the whole state on every rank: an element's update reads its own gradient and state alone,
// and the updating rank's result is copied to the others.
//
//   distributed::DistributedDataParallel ddp(model, group);
//   optim::AdamW adamw(model->parameters(), options);
//   distributed::ShardedOptimizer sharded(adamw, group);
//   loss = cross_entropy(ddp(x), y); loss.backward(); sharded.step();
//
// The optimizer passed in keeps the hyperparameters (set_lr, schedules) and is never stepped
// itself. step, step_unless and state_dict are collectives: every rank makes them, in the
// same order. A step is not for CUDA-graph capture (it hands the learning rate on from the
// host).
class ShardedOptimizer {
 public:
  // optimizer (kept by reference, it must outlive this) over the same parameters, in the
  // same order, on every rank of group; ValueError otherwise, and for an optimizer that
  // cannot be cut (make_like).
  ShardedOptimizer(optim::Optimizer& optimizer, ProcessGroup& group);
  ~ShardedOptimizer();
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;
  // Parameter elements this rank updates and holds state for.
  int64_t elements() const;
  // The piece's update at the optimizer's current learning rate (its other hyperparameters
  // as they were when this was made, or as load_state_dict set them), then every rank's
  // pieces to every rank, laid end to end: one all_gather per dtype.
  void step();
  // The same with step_unless(found_inf) (GradScaler's skip).
  void step_unless(const Tensor& found_inf);
  // The optimizer's state_dict as one process holding the whole state would give it, on
  // every rank: what a checkpoint keeps, loadable at any world size (1 included).
  optim::StateDict state_dict();
  // Loads a whole state_dict (from state_dict() above, or from an optimizer that held all
  // of it, at any world size), keeping this rank's piece of the state. Not a collective.
  void load_state_dict(const optim::StateDict& state);

 private:
  // Elements [begin, begin + count) of parameter `param` (flattened), and a view of them.
  struct Piece {
    size_t param;
    int64_t begin, count;
    Tensor view;
  };
  // One all_gather of share_parameters: the pieces of one dtype, per rank (indices into
  // pieces_[rank]), each rank's laid end to end and padded to `longest` elements.
  struct Gather {
    DType dtype;
    int64_t longest = 0;
    std::vector<std::vector<size_t>> pieces;  // per rank
  };
  void share_parameters();
  optim::Optimizer& optimizer_;
  ProcessGroup& group_;
  std::vector<std::vector<Piece>> pieces_;  // per rank
  std::vector<Gather> gathers_;             // per dtype, in dtype order; made once
  std::unique_ptr<optim::Optimizer> own_;   // over this rank's views; null when it has none
};

}  // namespace distributed
}  // namespace normcore

#pragma GCC visibility pop
