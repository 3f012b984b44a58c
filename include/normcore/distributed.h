// Running one process per GPU, on one machine or several: where a process stands in the job
// (Env, from the usual environment variables) and the small TCP key-value store the
// processes meet through (TcpStore: rank 0 serves it at MASTER_ADDR:MASTER_PORT, every rank
// connects). The NCCL process group, its collectives and DistributedDataParallel build on
// these.
//
// Every failure to meet (a refused or dropped connection, a peer that never sets a key, a
// timeout) throws DistributedError naming the operation, the key and the rank; nothing
// waits forever.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "normcore/error.h"

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

// A key-value store for rendezvous. The server runs inside the rank-0 process on a thread of
// its own; every rank (rank 0 included) is a client. Values are byte strings.
//   set(k, v)      stores v under k (replacing any value);
//   get(k)         waits until k is set (at most timeout), then returns its value;
//   add(k, delta)  adds to the 64-bit counter under k (0 when unset) and returns the sum;
//   barrier(name)  returns once all world_size ranks have called it with that name (every
//                  rank calls its barriers in the same order; a name may be reused).
class TcpStore {
 public:
  // Server (is_server): listens on port (0 picks a free port, see port()) on every
  // interface. Client: connects to host:port, retrying until timeout.
  TcpStore(const std::string& host, int port, int world_size, bool is_server,
           std::chrono::milliseconds timeout = std::chrono::seconds(300));
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::string& value);
  std::string get(const std::string& key);
  int64_t add(const std::string& key, int64_t delta);
  void barrier(const std::string& name);

  int port() const;
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  struct Server;
  std::unique_ptr<Server> server_;
  int socket_ = -1;
  int port_ = 0;
  int world_size_;
  int64_t barriers_ = 0;  // barriers passed, which tells repeated names apart
  std::chrono::milliseconds timeout_;
};

// The processes of this machine for `normcore launch`.
struct LaunchOptions {
  int nproc = 1;       // ranks on this machine (usually its GPUs)
  int nnodes = 1;      // machines in the job, each running one launcher
  int node_rank = 0;   // this machine's index in [0, nnodes)
  std::string master_addr = "127.0.0.1";  // where rank 0 (node 0) listens
  int master_port = 29500;
  std::chrono::milliseconds grace = std::chrono::seconds(5);  // SIGTERM to SIGKILL
};

// Runs command (argv[0] looked up in PATH) as ranks node_rank * nproc ... + nproc - 1 of
// nnodes * nproc, each with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT set, and forwards each line of their stdout and stderr with a "[rank R] "
// prefix. When a rank fails (a non-zero exit or a signal), the others (and what they
// started) get SIGTERM, then SIGKILL after the grace period, and launch returns the
// failing rank's status (128 + signal for a signal); 0 when every rank succeeded. Bad
// options throw ValueError.
int launch(const std::vector<std::string>& command, const LaunchOptions& options);

}  // namespace distributed
}  // namespace normcore
