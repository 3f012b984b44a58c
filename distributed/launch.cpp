// distributed::launch: the local ranks of a job as child processes (normcore/distributed.h).
// Each child's stdout and stderr come through pipes and are forwarded line by line with a
// "[rank R] " prefix; the parent polls the pipes and reaps children as they exit. The first
// failure stops the others: SIGTERM, then SIGKILL after the grace period. Children also get
// SIGTERM when the launcher itself dies (PR_SET_PDEATHSIG). The ranks get the job secret
// through their environment, never their command line, which every user of the machine can
// read. With max_restarts, a failed job is stopped and started again, as a whole, up to that
// many times; the ranks see which start they are in NORMCORE_RESTART_COUNT.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "distributed/job_secret.h"
#include "normcore/distributed.h"

namespace normcore {
namespace distributed {

namespace {

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int out = -1, err = -1;  // read ends, -1 once closed
  std::string out_partial, err_partial;
  bool running = true;
  int status = 0;  // exit code, or 128 + signal
  int signal = 0;  // the signal that ended it, 0 for an exit
};

// "exited with status 3", "was killed by signal 9 (status 137)".
std::string how_it_ended(int status, int signal) {
  if (signal == 0) return "exited with status " + std::to_string(status);
  return "was killed by signal " + std::to_string(signal) + " (status " + std::to_string(status) + ")";
}

// Writes the complete lines of buffer (and, at the end, the rest) to stream with the prefix.
void forward_lines(std::string& buffer, FILE* stream, const std::string& prefix, bool flush_rest) {
  size_t start = 0;
  for (size_t newline; (newline = buffer.find('\n', start)) != std::string::npos; start = newline + 1) {
    std::fprintf(stream, "%s%.*s\n", prefix.c_str(), static_cast<int>(newline - start), buffer.data() + start);
  }
  buffer.erase(0, start);
  if (flush_rest && !buffer.empty()) {
    std::fprintf(stream, "%s%s\n", prefix.c_str(), buffer.c_str());
    buffer.clear();
  }
  std::fflush(stream);
}

// Reads what is available on *fd into buffer; closes it at end of file.
void drain(int* fd, std::string& buffer, FILE* stream, const std::string& prefix) {
  char chunk[4096];
  const ssize_t got = ::read(*fd, chunk, sizeof chunk);
  if (got > 0) {
    buffer.append(chunk, static_cast<size_t>(got));
    forward_lines(buffer, stream, prefix, false);
    return;
  }
  if (got < 0 && (errno == EINTR || errno == EAGAIN)) return;
  forward_lines(buffer, stream, prefix, true);
  ::close(*fd);
  *fd = -1;
}

pid_t spawn(const std::vector<std::string>& command, const std::vector<std::pair<std::string, std::string>>& env,
            int* out, int* err) {
  int out_pipe[2], err_pipe[2];
  NC_CHECK(::pipe(out_pipe) == 0 && ::pipe(err_pipe) == 0, DistributedError, "launch: pipe: ", std::strerror(errno));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  NC_CHECK(pid >= 0, DistributedError, "launch: fork: ", std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);  // its own process group: stopping a rank stops what it started
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);  // the launcher died before prctl
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
    for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
    std::vector<char*> argv;
    for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // as the child does: whichever runs first, the group exists before any kill
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  *out = out_pipe[0];
  *err = err_pipe[0];
  return pid;
}

// How one start of the job ended: 0, or the first failing rank and its status.
struct Ending {
  int status = 0;
  int rank = -1;
  int signal = 0;
};

// Starts this launcher's ranks, forwards their output, stops them all at the first failure.
Ending run_ranks(const std::vector<std::string>& command, const LaunchOptions& options, const std::string& secret,
                 int restart) {
  const int world_size = options.nnodes * options.nproc;
  std::vector<Child> children(static_cast<size_t>(options.nproc));
  for (int i = 0; i < options.nproc; ++i) {
    Child& c = children[static_cast<size_t>(i)];
    c.rank = options.node_rank * options.nproc + i;
    c.pid = spawn(command,
                  {{"RANK", std::to_string(c.rank)},
                   {"LOCAL_RANK", std::to_string(i)},
                   {"WORLD_SIZE", std::to_string(world_size)},
                   {"LOCAL_WORLD_SIZE", std::to_string(options.nproc)},
                   {"MASTER_ADDR", options.master_addr},
                   {"MASTER_PORT", std::to_string(options.master_port)},
                   {"NORMCORE_RESTART_COUNT", std::to_string(restart)},
                   {kJobSecretVariable, secret}},
                  &c.out, &c.err);
  }

  Ending ending;
  bool stopping = false;
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  auto all_exited = std::chrono::steady_clock::time_point::max();
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Child*, bool>> owners;  // (child, is stderr)
    for (Child& c : children) {
      if (c.out >= 0) {
        fds.push_back({c.out, POLLIN, 0});
        owners.push_back({&c, false});
      }
      if (c.err >= 0) {
        fds.push_back({c.err, POLLIN, 0});
        owners.push_back({&c, true});
      }
    }
    bool any_running = false;
    for (const Child& c : children) any_running = any_running || c.running;
    if (!any_running) {
      // Output still buffered in the pipes comes within a moment; a process a rank left
      // behind that keeps a pipe open does not hold the launcher.
      if (all_exited == std::chrono::steady_clock::time_point::max()) all_exited = std::chrono::steady_clock::now();
      if (fds.empty() || std::chrono::steady_clock::now() - all_exited > std::chrono::seconds(1)) break;
    }
    if (!fds.empty() && ::poll(fds.data(), fds.size(), 100) > 0) {
      for (size_t k = 0; k < fds.size(); ++k) {
        if (fds[k].revents == 0) continue;
        Child& c = *owners[k].first;
        const std::string prefix = "[rank " + std::to_string(c.rank) + "] ";
        if (owners[k].second) {
          drain(&c.err, c.err_partial, stderr, prefix);
        } else {
          drain(&c.out, c.out_partial, stdout, prefix);
        }
      }
    } else if (fds.empty()) {
      ::usleep(20000);
    }
    for (Child& c : children) {
      if (!c.running) continue;
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.running = false;
      c.signal = WIFEXITED(status) ? 0 : WTERMSIG(status);
      c.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + c.signal;
      if (c.status != 0 && !stopping) {
        ending = {c.status, c.rank, c.signal};
        stopping = true;
        std::fprintf(stderr, "normcore launch: rank %d %s; stopping the other ranks\n", c.rank,
                     how_it_ended(c.status, c.signal).c_str());
        std::fflush(stderr);
        for (Child& other : children) {
          if (other.running) ::kill(-other.pid, SIGTERM);
        }
        stop_deadline = std::chrono::steady_clock::now() + options.grace;
      }
    }
    if (stopping && std::chrono::steady_clock::now() > stop_deadline) {
      for (Child& other : children) {
        if (other.running) ::kill(-other.pid, SIGKILL);
      }
      stop_deadline = std::chrono::steady_clock::time_point::max();
    }
  }
  for (Child& c : children) {
    const std::string prefix = "[rank " + std::to_string(c.rank) + "] ";
    forward_lines(c.out_partial, stdout, prefix, true);
    forward_lines(c.err_partial, stderr, prefix, true);
    if (c.out >= 0) ::close(c.out);
    if (c.err >= 0) ::close(c.err);
  }
  return ending;
}

}  // namespace

int launch(const std::vector<std::string>& command, const LaunchOptions& options) {
  NC_CHECK(!command.empty(), ValueError, "launch: no command to run (normcore launch --nproc N -- <command...>)");
  NC_CHECK(options.nproc >= 1, ValueError, "launch: nproc must be >= 1, got ", options.nproc);
  NC_CHECK(options.nnodes >= 1, ValueError, "launch: nnodes must be >= 1, got ", options.nnodes);
  NC_CHECK(options.node_rank >= 0 && options.node_rank < options.nnodes, ValueError, "launch: node_rank ",
           options.node_rank, " must be in [0, ", options.nnodes, ")");
  NC_CHECK(options.master_port >= 1 && options.master_port <= 65535, ValueError,
           "launch: master_port must be in 1..65535, got ", options.master_port);
  NC_CHECK(options.nnodes == 1 || job_secret_in_environment(), ValueError, "launch: a job of ", options.nnodes,
           " machines needs the same ", kJobSecretVariable,
           " in every launcher's environment (make one with: "
           "openssl rand -hex 32)");
  NC_CHECK(options.max_restarts >= 0, ValueError, "launch: max_restarts must be >= 0, got ", options.max_restarts);
  // The launcher's own secret (checked as a store would), else one for this job alone.
  const std::string secret = job_secret_in_environment() ? resolve_job_secret("", "launch") : make_job_secret();
  for (int restart = 0;; ++restart) {
    const Ending ending = run_ranks(command, options, secret, restart);
    if (ending.status == 0 || restart == options.max_restarts) return ending.status;
    std::fprintf(stderr, "normcore launch: restarting the job (restart %d of %d) after rank %d %s\n", restart + 1,
                 options.max_restarts, ending.rank, how_it_ended(ending.status, ending.signal).c_str());
    std::fflush(stderr);
  }
}

}  // namespace distributed
}  // namespace normcore
