// Env and TcpStore (normcore/distributed.h). The wire protocol is in store_protocol.h, the
// job secret and the proofs of the handshake in job_secret.h. The server listens on the
// address it is given (every interface only when asked), accepts connections on a thread of
// its own and serves each on a thread, at most max_connections at once. A connection first
// proves it knows the job secret within stall_timeout and learns that the server knows it
// too; only then are its requests read, each of which must arrive whole within stall_timeout
// once begun and stay within the bounds of keys and values. A connection that breaks a rule
// is closed and counted; the others go on. GET waits on a condition variable. Clients bound
// every wait by the store's timeout with poll().
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>

#include "distributed/job_secret.h"
#include "distributed/store_protocol.h"
#include "normcore/distributed.h"

namespace normcore {
namespace distributed {

namespace {

using Clock = std::chrono::steady_clock;
namespace wire = protocol;

constexpr const char* kBindAllVariable = "NORMCORE_STORE_BIND_ALL";

// The integer in environment variable name, or fallback when unset.
int env_int(const char* name, int fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text, &end, 10);
  NC_CHECK(errno == 0 && *end == '\0' && value >= 0 && value <= 1 << 30, ValueError, "distributed::Env: ", name,
           " must be a non-negative integer, got '", text, "'");
  return static_cast<int>(value);
}

// Environment variable name as a switch: unset, empty or "0" is off, "1" on.
bool env_flag(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0' || std::strcmp(text, "0") == 0) return false;
  NC_CHECK(std::strcmp(text, "1") == 0, ValueError, "TcpStore: ", name, " must be 0 or 1, got '", text, "'");
  return true;
}

std::string errno_text() { return std::strerror(errno); }

// "host:port", with an IPv6 address in brackets.
std::string endpoint(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// The numeric host of a socket address.
std::string numeric_host(const sockaddr* address, socklen_t length) {
  char host[NI_MAXHOST] = "?";
  ::getnameinfo(address, length, host, sizeof host, nullptr, 0, NI_NUMERICHOST);
  return host;
}

int numeric_port(const sockaddr* address) {
  return ntohs(address->sa_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(address)->sin6_port
                                              : reinterpret_cast<const sockaddr_in*>(address)->sin_port);
}

// Sends all of data; false when the peer is gone.
bool send_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t sent = ::send(fd, p, n, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    p += sent;
    n -= static_cast<size_t>(sent);
  }
  return true;
}

// Waits until fd has bytes (or is closed), at most until *deadline when given. Returns "" when
// it has, else "timeout" or what went wrong.
std::string wait_readable(int fd, const Clock::time_point* deadline) {
  for (;;) {
    int wait_ms = -1;
    if (deadline != nullptr) {
      // Past the deadline, bytes already there are still taken.
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now()).count();
      wait_ms = static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
    }
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, wait_ms);
    if (ready > 0) return "";
    if (ready == 0) return "timeout";
    if (errno != EINTR) return errno_text();
  }
}

// Receives exactly n bytes, waiting at most until deadline ("timeout"). Returns "" on
// success, else what went wrong.
std::string recv_all(int fd, void* data, size_t n, const Clock::time_point& deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const std::string error = wait_readable(fd, &deadline);
    if (!error.empty()) return error;
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got == 0) return "the connection was closed";
    if (got < 0) return errno_text();
    p += got;
    n -= static_cast<size_t>(got);
  }
  return "";
}

// Appends what has arrived on fd (at most 64 KiB) to buffer, waiting for it at most until
// *deadline when given, else as long as it takes.
std::string receive_some(int fd, std::string& buffer, const Clock::time_point* deadline) {
  constexpr size_t kChunk = 64 << 10;
  for (;;) {
    const std::string error = wait_readable(fd, deadline);
    if (!error.empty()) return error;
    const size_t had = buffer.size();
    buffer.resize(had + kChunk);
    const ssize_t got = ::recv(fd, buffer.data() + had, kChunk, 0);
    buffer.resize(had + static_cast<size_t>(std::max<ssize_t>(got, 0)));
    if (got > 0) return "";
    if (got == 0) return "the connection was closed";
    if (errno != EINTR) return errno_text();
  }
}

// A listening socket on host:port, or on every interface of host's address family.
int listen_on(const std::string& host, int port, bool bind_all) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int status = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  NC_CHECK(status == 0, DistributedError, "TcpStore: cannot resolve ", host, ": ", gai_strerror(status));
  std::string last = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    sockaddr_storage address{};
    std::memcpy(&address, a->ai_addr, a->ai_addrlen);
    if (bind_all && a->ai_family == AF_INET) {
      reinterpret_cast<sockaddr_in*>(&address)->sin_addr.s_addr = htonl(INADDR_ANY);
    } else if (bind_all && a->ai_family == AF_INET6) {
      reinterpret_cast<sockaddr_in6*>(&address)->sin6_addr = in6addr_any;
    }
    const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) {
      last = errno_text();
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&address), a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      ::freeaddrinfo(found);
      return fd;
    }
    last = errno_text();
    ::close(fd);
  }
  ::freeaddrinfo(found);
  throw DistributedError(detail::cat_str("TcpStore: cannot listen on ", endpoint(host, port), " (", last,
                                         "); the server listens on an address of this machine (MASTER_ADDR), or on "
                                         "every interface with ",
                                         kBindAllVariable, "=1"));
}

}  // namespace

Env Env::from_environment() {
  Env env;
  env.rank = env_int("RANK", 0);
  env.world_size = env_int("WORLD_SIZE", 1);
  env.local_rank = env_int("LOCAL_RANK", 0);
  env.master_port = env_int("MASTER_PORT", 29500);
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') env.master_addr = addr;
  NC_CHECK(env.world_size >= 1, ValueError, "distributed::Env: WORLD_SIZE must be >= 1, got ", env.world_size);
  NC_CHECK(env.rank < env.world_size, ValueError, "distributed::Env: RANK ", env.rank, " must be less than WORLD_SIZE ",
           env.world_size);
  NC_CHECK(env.master_port >= 1 && env.master_port <= 65535, ValueError,
           "distributed::Env: MASTER_PORT must be in 1..65535, got ", env.master_port);
  return env;
}

// ---------------------------------------------------------------- server

// How long the store's process waits at its end for replies it owes (see ~Server).
constexpr std::chrono::seconds kLinger{30};

struct TcpStore::Server {
  struct Connection {
    int fd = -1;  // -1 once closed
    std::string peer;
    std::thread thread;
    bool done = false;  // its thread has finished and may be joined
  };

  int listener = -1;
  std::string address;  // numeric, as bound
  std::string secret;
  size_t max_connections = 0;
  std::chrono::milliseconds stall_timeout{0};
  std::thread acceptor;
  std::mutex mutex;
  std::condition_variable changed;
  wire::Table table;
  std::list<Connection> connections;  // a list: a thread holds its element while others come and go
  bool stopping = false;
  std::multiset<std::string> waiting;  // the keys of gets blocked on an absent key
  int answering = 0;                   // requests applied (gets: whose key came), replies not yet sent
  std::condition_variable owed;        // waiting or answering changed
  int64_t refused = 0;                 // connections closed for breaking a rule
  std::string last_refusal;            // the last of them: its peer and why

  // Whether some request is owed a reply: a set or add applied, or a get whose key has come,
  // its reply not sent yet.
  bool owes_replies() const {
    if (answering > 0) return true;
    for (const std::string& key : waiting)
      if (table.contains(key)) return true;
    return false;
  }

  void refuse(const std::string& peer, const std::string& reason) {
    std::lock_guard<std::mutex> lock(mutex);
    ++refused;
    last_refusal = peer + ": " + reason;
  }

  // For the message of a get that timed out in this process: why other ranks may be missing.
  std::string refusals() {
    std::lock_guard<std::mutex> lock(mutex);
    if (refused == 0) return "";
    return detail::cat_str("; the store closed ", refused, " connection(s) that broke its rules, the last from ",
                           last_refusal);
  }

  // The handshake (store_protocol.h): true once the client proved it knows the secret and
  // was sent the server's proof.
  bool authenticate(Connection& c) {
    const Clock::time_point deadline = Clock::now() + stall_timeout;
    Nonce server_nonce;
    random_bytes(server_nonce.data(), server_nonce.size());
    std::string hello(wire::kMagic, sizeof wire::kMagic);
    hello.push_back(static_cast<char>(wire::kVersion));
    hello.push_back(static_cast<char>(wire::kReady));
    hello.append(reinterpret_cast<const char*>(server_nonce.data()), server_nonce.size());
    if (!send_all(c.fd, hello.data(), hello.size())) return false;
    uint8_t answer[wire::kAnswerBytes];
    const std::string error = recv_all(c.fd, answer, sizeof answer, deadline);
    if (!error.empty()) {
      refuse(c.peer, error == "timeout" ? detail::cat_str("did not authenticate within ", stall_timeout.count(), " ms")
                                        : "left before authenticating (" + error + ")");
      return false;
    }
    Nonce client_nonce;
    Proof proof;
    std::memcpy(client_nonce.data(), answer, kNonceBytes);
    std::memcpy(proof.data(), answer + kNonceBytes, kProofBytes);
    if (!same_proof(proof, make_proof(secret, Role::Client, server_nonce, client_nonce))) {
      const char verdict = static_cast<char>(wire::kRejected);
      send_all(c.fd, &verdict, 1);
      refuse(c.peer, "authentication failed (another job secret)");
      return false;
    }
    std::string verdict(1, static_cast<char>(wire::kAccepted));
    const Proof mine = make_proof(secret, Role::Server, server_nonce, client_nonce);
    verdict.append(reinterpret_cast<const char*>(mine.data()), mine.size());
    return send_all(c.fd, verdict.data(), verdict.size());
  }

  // Answers request; false when the connection is gone or the store is stopping.
  bool answer(Connection& c, const wire::Request& request) {
    std::unique_lock<std::mutex> lock(mutex);
    std::optional<std::string> reply = table.apply(request);
    if (request.command != wire::kGet) {
      // Owed from here: the set may end the barrier that lets this process exit, and the
      // server must not close the connection before the setter hears it was done.
      ++answering;
      lock.unlock();
      changed.notify_all();  // a set or add may be what a get waits for
      const bool sent = send_all(c.fd, reply->data(), reply->size());
      lock.lock();
      --answering;
      owed.notify_all();
      return sent;
    }
    if (!reply) {
      const auto waiter = waiting.insert(request.key);
      changed.wait(lock, [&] { return (reply = table.apply(request)).has_value() || stopping; });
      waiting.erase(waiter);
      owed.notify_all();
      if (!reply) return false;  // stopping, the key never came
    }
    ++answering;
    lock.unlock();
    const bool sent = send_all(c.fd, reply->data(), reply->size());
    lock.lock();
    --answering;
    owed.notify_all();
    return sent;
  }

  // Reads the requests of an authenticated connection and answers them until it closes or
  // breaks a rule. Between requests it may be silent as long as it likes; a request begun
  // must arrive whole within stall_timeout.
  void serve_requests(Connection& c) {
    std::string pending;  // bytes received, not yet taken by a request
    for (;;) {
      wire::Request request;
      size_t used = 0;
      Clock::time_point deadline = Clock::now() + stall_timeout;
      try {
        while ((used = wire::parse_request(pending, &request)) == 0) {
          const bool begun = !pending.empty();
          const std::string error = receive_some(c.fd, pending, begun ? &deadline : nullptr);
          if (!error.empty()) {
            if (begun) {
              refuse(c.peer, error == "timeout"
                                 ? detail::cat_str("left a request unfinished for ", stall_timeout.count(), " ms")
                                 : "left in the middle of a request (" + error + ")");
            }
            return;
          }
          if (!begun) deadline = Clock::now() + stall_timeout;
        }
      } catch (const DistributedError& e) {
        refuse(c.peer, e.what());
        return;
      }
      pending.erase(0, used);
      if (!answer(c, request)) return;
    }
  }

  void run(Connection& c) {
    try {
      if (authenticate(c)) serve_requests(c);
    } catch (const std::exception& e) {  // no randomness, no memory: this connection ends
      refuse(c.peer, e.what());
    }
    std::lock_guard<std::mutex> lock(mutex);
    ::close(c.fd);
    c.fd = -1;
    c.done = true;
  }

  void accept_loop() {
    for (;;) {
      sockaddr_storage peer_address{};
      socklen_t peer_length = sizeof peer_address;
      const int fd = ::accept(listener, reinterpret_cast<sockaddr*>(&peer_address), &peer_length);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));  // until connections end
          continue;
        }
        return;  // the listener was shut down
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      const std::string peer = endpoint(numeric_host(reinterpret_cast<sockaddr*>(&peer_address), peer_length),
                                        numeric_port(reinterpret_cast<sockaddr*>(&peer_address)));
      std::list<Connection> finished;
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (stopping) {
          ::close(fd);
          return;
        }
        for (auto it = connections.begin(); it != connections.end();) {
          auto next = std::next(it);
          if (it->done) finished.splice(finished.end(), connections, it);
          it = next;
        }
        if (connections.size() >= max_connections) {
          const char busy[wire::kHelloBytes] = {wire::kMagic[0],
                                                wire::kMagic[1],
                                                wire::kMagic[2],
                                                wire::kMagic[3],
                                                static_cast<char>(wire::kVersion),
                                                static_cast<char>(wire::kBusy)};
          ::send(fd, busy, sizeof busy, MSG_NOSIGNAL | MSG_DONTWAIT);
          ::close(fd);
          ++refused;
          last_refusal = detail::cat_str(peer, ": over the limit of ", max_connections, " connections");
        } else {
          connections.emplace_back();
          Connection& c = connections.back();
          c.fd = fd;
          c.peer = peer;
          try {
            c.thread = std::thread([this, &c] { run(c); });
          } catch (const std::system_error&) {  // no thread to be had: this connection waits its turn
            ::close(fd);
            connections.pop_back();
          }
        }
      }
      for (Connection& c : finished) c.thread.join();
    }
  }

  // Sends the replies it owes first (for up to kLinger): a rank waiting in the last barrier
  // before this process exits may not have been sent the key that ended it yet, and
  // closing its connection now would cut it off. Gets waiting on keys that never came are
  // cut off at once.
  ~Server() {
    {
      std::unique_lock<std::mutex> lock(mutex);
      owed.wait_for(lock, kLinger, [&] { return !owes_replies(); });
      stopping = true;
      for (Connection& c : connections)
        if (c.fd >= 0) ::shutdown(c.fd, SHUT_RDWR);
    }
    changed.notify_all();
    ::shutdown(listener, SHUT_RDWR);
    if (acceptor.joinable()) acceptor.join();
    for (Connection& c : connections) c.thread.join();
    ::close(listener);
  }
};

// ---------------------------------------------------------------- client

namespace {

enum class Handshake { Accepted, Busy, Closed };

// The client's side of the handshake on a connected socket. Busy or Closed (with *why) may
// be retried; a peer that is not a store, or a failed authentication either way, throws.
Handshake handshake(int fd, const std::string& where, const std::string& secret, const std::string& hint,
                    Clock::time_point deadline, std::string* why) {
  char hello[wire::kHelloBytes];
  *why = recv_all(fd, hello, sizeof hello, deadline);
  if (!why->empty()) return Handshake::Closed;
  NC_CHECK(std::memcmp(hello, wire::kMagic, sizeof wire::kMagic) == 0, DistributedError, "TcpStore: ", where,
           " is not a normcore store (its first bytes are not the store's hello)");
  NC_CHECK(static_cast<uint8_t>(hello[4]) == wire::kVersion, DistributedError, "TcpStore: the store at ", where,
           " speaks protocol version ", static_cast<int>(static_cast<uint8_t>(hello[4])), ", this build ",
           static_cast<int>(wire::kVersion), " (every rank runs the same normcore)");
  if (static_cast<uint8_t>(hello[5]) == wire::kBusy) {
    *why = "the store holds as many connections as it takes (TcpStoreOptions::max_connections)";
    return Handshake::Busy;
  }
  Nonce server_nonce, client_nonce;
  *why = recv_all(fd, server_nonce.data(), server_nonce.size(), deadline);
  if (!why->empty()) return Handshake::Closed;
  random_bytes(client_nonce.data(), client_nonce.size());
  const Proof proof = make_proof(secret, Role::Client, server_nonce, client_nonce);
  std::string answer(reinterpret_cast<const char*>(client_nonce.data()), client_nonce.size());
  answer.append(reinterpret_cast<const char*>(proof.data()), proof.size());
  char verdict = 0;
  if (!send_all(fd, answer.data(), answer.size()) || !recv_all(fd, &verdict, 1, deadline).empty()) {
    *why = "the connection was closed during the handshake";
    return Handshake::Closed;
  }
  NC_CHECK(static_cast<uint8_t>(verdict) == wire::kAccepted, DistributedError, "TcpStore: authentication failed at ",
           where, ": the store's job secret is not this process's (", hint, ")");
  Proof server_proof;
  const std::string error = recv_all(fd, server_proof.data(), server_proof.size(), deadline);
  NC_CHECK(error.empty() && same_proof(server_proof, make_proof(secret, Role::Server, server_nonce, client_nonce)),
           DistributedError, "TcpStore: authentication failed at ", where,
           ": the server did not prove it knows the job secret (another program on that port, or another job's "
           "store; ",
           hint, ")");
  return Handshake::Accepted;
}

// A connected, authenticated socket to host:port, retrying refused connections and a busy
// or closing server until deadline.
int connect_until(const std::string& host, int port, const std::string& secret, const std::string& hint,
                  std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int status = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  NC_CHECK(status == 0, DistributedError, "TcpStore: cannot resolve ", host, ": ", gai_strerror(status));
  const std::unique_ptr<addrinfo, void (*)(addrinfo*)> owned(found, ::freeaddrinfo);
  const std::string where = endpoint(host, port);
  std::string last = "no address";
  for (;;) {
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        last = errno_text();
        ::close(fd);
        continue;
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      try {
        std::string why;
        if (handshake(fd, where, secret, hint, deadline, &why) == Handshake::Accepted) return fd;
        if (why != "timeout" || last == "no address") last = why;  // a reason, not the clock running out
      } catch (...) {
        ::close(fd);
        throw;
      }
      ::close(fd);
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  throw DistributedError(detail::cat_str("TcpStore: cannot connect to ", where, " within ", timeout.count(), " ms (",
                                         last, "); is rank 0 running and MASTER_ADDR/MASTER_PORT right?"));
}

TcpStoreOptions with_timeout(std::chrono::milliseconds timeout) {
  TcpStoreOptions options;
  options.timeout = timeout;
  return options;
}

}  // namespace

TcpStore::TcpStore(const std::string& host, int port, int world_size, bool is_server, std::chrono::milliseconds timeout)
    : TcpStore(host, port, world_size, is_server, with_timeout(timeout)) {}

TcpStore::TcpStore(const std::string& host, int port, int world_size, bool is_server, const TcpStoreOptions& options)
    : host_(host), port_(port), world_size_(world_size), timeout_(options.timeout) {
  NC_CHECK(world_size >= 1, ValueError, "TcpStore: world_size must be >= 1, got ", world_size);
  NC_CHECK(port >= 0 && port <= 65535, ValueError, "TcpStore: port must be in 0..65535, got ", port);
  NC_CHECK(options.timeout.count() > 0, ValueError, "TcpStore: timeout must be positive, got ", options.timeout.count(),
           " ms");
  NC_CHECK(options.max_connections >= 0, ValueError, "TcpStore: max_connections must be >= 0, got ",
           options.max_connections);
  NC_CHECK(options.stall_timeout.count() > 0, ValueError, "TcpStore: stall_timeout must be positive, got ",
           options.stall_timeout.count(), " ms");
  const std::string secret = resolve_job_secret(options.secret, "TcpStore");
  const std::string hint =
      options.secret.empty() && !job_secret_in_environment()
          ? "this process has no NORMCORE_JOB_SECRET; every rank needs the same one, which `normcore launch` sets"
          : "every rank needs the same job secret: NORMCORE_JOB_SECRET, which `normcore launch` sets, or "
            "TcpStoreOptions::secret";
  std::string connect_host = host;
  if (is_server) {
    const bool bind_all = options.bind_all || env_flag(kBindAllVariable);
    server_ = std::make_unique<Server>();
    server_->secret = secret;
    server_->max_connections = options.max_connections > 0 ? static_cast<size_t>(options.max_connections)
                                                           : 2 * static_cast<size_t>(world_size) + 64;
    server_->stall_timeout = options.stall_timeout;
    server_->listener = listen_on(host, port, bind_all);
    sockaddr_storage address{};
    socklen_t length = sizeof address;
    ::getsockname(server_->listener, reinterpret_cast<sockaddr*>(&address), &length);
    server_->address = numeric_host(reinterpret_cast<sockaddr*>(&address), length);
    port_ = numeric_port(reinterpret_cast<sockaddr*>(&address));
    connect_host = !bind_all ? server_->address : address.ss_family == AF_INET6 ? "::1" : "127.0.0.1";
    Server* server = server_.get();
    server_->acceptor = std::thread([server] { server->accept_loop(); });
  }
  socket_ = connect_until(connect_host, port_, secret, hint, timeout_);
}

TcpStore::~TcpStore() {
  if (socket_ >= 0) ::close(socket_);
  server_.reset();
}

int TcpStore::port() const { return port_; }

std::string TcpStore::listen_address() const { return server_ ? server_->address : ""; }

namespace {

// "TcpStore.get('k') at host:port"
std::string operation(const char* what, const std::string& key, const std::string& host, int port) {
  return detail::cat_str("TcpStore.", what, "('", key, "') at ", endpoint(host, port));
}

// A request that failed on its way out or back leaves the connection out of step: half of it
// may have been sent, or its reply may still come and would be read as the next request's.
// The connection is closed, so that later requests fail plainly.
[[noreturn]] void drop_connection(int& socket, const std::string& message) {
  if (socket >= 0) ::close(socket);
  socket = -1;
  throw DistributedError(message);
}

}  // namespace

void TcpStore::set(const std::string& key, const std::string& value) { acknowledged("set", wire::kSet, key, value); }

void TcpStore::remove(const std::string& key) { acknowledged("remove", wire::kRemove, key, ""); }

void TcpStore::send_request(const char* what, uint8_t command, const std::string& key, const std::string& value) {
  NC_CHECK(key.size() <= kMaxKeyBytes, ValueError, "TcpStore.", what, ": the key has ", key.size(),
           " bytes; the store takes keys of at most ", kMaxKeyBytes);
  NC_CHECK(value.size() <= kMaxValueBytes, ValueError, "TcpStore.", what, "('", key, "'): the value has ", value.size(),
           " bytes; the store takes values of at most ", kMaxValueBytes, " (TcpStore::kMaxValueBytes)");
  NC_CHECK(socket_ >= 0, DistributedError, "TcpStore.", what, ": the connection was lost earlier");
  const std::string message = wire::encode_request(command, key, value);
  if (!send_all(socket_, message.data(), message.size()))
    drop_connection(socket_, operation(what, key, host_, port_) + ": the store is gone");
}

void TcpStore::acknowledged(const char* what, uint8_t command, const std::string& key, const std::string& value) {
  send_request(what, command, key, value);
  const Clock::time_point deadline = Clock::now() + timeout_;
  char ack = 0;
  const std::string error = recv_all(socket_, &ack, 1, deadline);
  if (!error.empty()) drop_connection(socket_, operation(what, key, host_, port_) + ": " + error);
}

std::string TcpStore::get(const std::string& key) {
  send_request("get", wire::kGet, key, "");
  const Clock::time_point deadline = Clock::now() + timeout_;
  uint32_t length = 0;
  std::string error = recv_all(socket_, &length, 4, deadline);
  std::string value;
  if (error.empty() && length > kMaxValueBytes) error = detail::cat_str("the store sent a value of ", length, " bytes");
  if (error.empty()) {
    value.resize(length);
    error = recv_all(socket_, value.data(), length, deadline);
  }
  if (!error.empty()) {
    drop_connection(socket_, operation("get", key, host_, port_) + ": " +
                                 (error == "timeout" ? detail::cat_str("no rank set it within ", timeout_.count(),
                                                                       " ms", server_ ? server_->refusals() : "")
                                                     : error));
  }
  return value;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  send_request("add", wire::kAdd, key, std::string(reinterpret_cast<const char*>(&delta), sizeof delta));
  const Clock::time_point deadline = Clock::now() + timeout_;
  int64_t sum = 0;
  const std::string error = recv_all(socket_, &sum, sizeof sum, deadline);
  if (!error.empty()) drop_connection(socket_, operation("add", key, host_, port_) + ": " + error);
  return sum;
}

void TcpStore::barrier(const std::string& name) {
  const std::string key = "barrier/" + name + "/" + std::to_string(barriers_++);
  // The last to arrive ends it and asks no more: the server's process may be gone once the
  // others have their replies (it waits for replies owed, not for requests yet to come).
  if (add(key, 1) == world_size_) {
    set(key + "/done", "1");
    return;
  }
  get(key + "/done");
}

}  // namespace distributed
}  // namespace normcore
