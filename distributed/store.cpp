// Env and TcpStore (normcore/distributed.h). The store speaks a small binary protocol over
// TCP, one request and one reply at a time per connection:
//   request: u8 command, u32 key length, key, u32 value length, value
//   SET   -> u8 0                      (value: the bytes)
//   GET   -> u32 length, bytes         (the server waits until the key is set)
//   ADD   -> i64 sum                   (value: the i64 delta)
//   DEL   -> u8 0                      (removes the key)
// Integers are little-endian (every machine normcore builds for). The server is a thread
// that accepts connections and one thread per connection; GET waits on a condition
// variable. Clients bound every wait by the store's timeout with poll().
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "normcore/distributed.h"

namespace normcore {
namespace distributed {

namespace {

enum Command : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kRemove = 4 };

using Clock = std::chrono::steady_clock;

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

std::string errno_text() { return std::strerror(errno); }

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

// Receives exactly n bytes. With a deadline, waits at most until it ("timeout"); without,
// as long as it takes. Returns "" on success, else what went wrong.
std::string recv_all(int fd, void* data, size_t n, const Clock::time_point* deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    if (deadline != nullptr) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now()).count();
      if (left <= 0) return "timeout";
      pollfd pfd{fd, POLLIN, 0};
      const int ready = ::poll(&pfd, 1, static_cast<int>(std::min<long long>(left, 1 << 30)));
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) return "timeout";
      if (ready < 0) return errno_text();
    }
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got == 0) return "the connection was closed";
    if (got < 0) return errno_text();
    p += got;
    n -= static_cast<size_t>(got);
  }
  return "";
}

void put_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }

}  // namespace

Env Env::from_environment() {
  Env env;
  env.rank = env_int("RANK", 0);
  env.world_size = env_int("WORLD_SIZE", 1);
  env.local_rank = env_int("LOCAL_RANK", 0);
  env.master_port = env_int("MASTER_PORT", 29500);
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') env.master_addr = addr;
  NC_CHECK(env.world_size >= 1, ValueError, "distributed::Env: WORLD_SIZE must be >= 1, got ", env.world_size);
  NC_CHECK(env.rank < env.world_size, ValueError, "distributed::Env: RANK ", env.rank,
           " must be less than WORLD_SIZE ", env.world_size);
  NC_CHECK(env.master_port >= 1 && env.master_port <= 65535, ValueError,
           "distributed::Env: MASTER_PORT must be in 1..65535, got ", env.master_port);
  return env;
}

// ---------------------------------------------------------------- server

// How long the store's process waits at its end for replies it owes (see ~Server).
constexpr std::chrono::seconds kLinger{30};

struct TcpStore::Server {
  int listener = -1;
  std::thread acceptor;
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::string, std::string> values;
  std::vector<int> connections;
  std::vector<std::thread> workers;
  bool stopping = false;
  std::multiset<std::string> waiting;  // the keys of gets blocked on an absent key
  int answering = 0;                   // gets whose key came, replies not yet sent
  std::condition_variable owed;        // waiting or answering changed

  // Whether some get is owed a reply: its key has come, its reply is not sent yet.
  bool owes_replies() const {
    if (answering > 0) return true;
    for (const std::string& key : waiting)
      if (values.count(key) > 0) return true;
    return false;
  }

  void serve(int fd) {
    for (;;) {
      uint8_t command = 0;
      uint32_t key_len = 0, value_len = 0;
      if (!recv_all(fd, &command, 1, nullptr).empty() || !recv_all(fd, &key_len, 4, nullptr).empty()) return;
      std::string key(key_len, '\0');
      if (!recv_all(fd, key.data(), key_len, nullptr).empty() || !recv_all(fd, &value_len, 4, nullptr).empty()) return;
      std::string value(value_len, '\0');
      if (!recv_all(fd, value.data(), value_len, nullptr).empty()) return;
      std::string reply;
      if (command == kSet) {
        {
          std::lock_guard<std::mutex> lock(mutex);
          values[key] = value;
        }
        changed.notify_all();
        reply.push_back('\0');
      } else if (command == kGet) {
        std::unique_lock<std::mutex> lock(mutex);
        const auto waiter = waiting.insert(key);
        changed.wait(lock, [&] { return stopping || values.count(key) > 0; });
        waiting.erase(waiter);
        owed.notify_all();
        if (values.count(key) == 0) return;  // stopping, the key never came
        const std::string& v = values[key];
        put_u32(reply, static_cast<uint32_t>(v.size()));
        reply += v;
        ++answering;
        lock.unlock();
        const bool sent = send_all(fd, reply.data(), reply.size());
        lock.lock();
        --answering;
        owed.notify_all();
        if (!sent) return;
        continue;
      } else if (command == kAdd && value.size() == sizeof(int64_t)) {
        int64_t delta = 0, sum = 0;
        std::memcpy(&delta, value.data(), sizeof delta);
        {
          std::lock_guard<std::mutex> lock(mutex);
          std::string& stored = values[key];
          if (stored.size() == sizeof(int64_t)) std::memcpy(&sum, stored.data(), sizeof sum);
          sum += delta;
          stored.assign(reinterpret_cast<const char*>(&sum), sizeof sum);
        }
        changed.notify_all();
        reply.assign(reinterpret_cast<const char*>(&sum), sizeof sum);
      } else if (command == kRemove) {
        {
          std::lock_guard<std::mutex> lock(mutex);
          values.erase(key);
        }
        reply.push_back('\0');
      } else {
        return;  // a malformed request: drop the connection
      }
      if (!send_all(fd, reply.data(), reply.size())) return;
    }
  }

  void accept_loop() {
    for (;;) {
      const int fd = ::accept(listener, nullptr, nullptr);
      if (fd < 0) {
        if (errno == EINTR) continue;
        return;  // the listener was shut down
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      std::lock_guard<std::mutex> lock(mutex);
      if (stopping) {
        ::close(fd);
        return;
      }
      connections.push_back(fd);
      workers.emplace_back([this, fd] { serve(fd); });
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
      for (int fd : connections) ::shutdown(fd, SHUT_RDWR);
    }
    changed.notify_all();
    ::shutdown(listener, SHUT_RDWR);
    if (acceptor.joinable()) acceptor.join();
    for (std::thread& t : workers) t.join();
    for (int fd : connections) ::close(fd);
    ::close(listener);
  }
};

// ---------------------------------------------------------------- client

namespace {

// A connected socket to host:port, retrying refused connections until deadline.
int connect_until(const std::string& host, int port, Clock::time_point deadline, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int status = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  NC_CHECK(status == 0, DistributedError, "TcpStore: cannot resolve ", host, ": ", gai_strerror(status));
  std::string last = "no address";
  for (;;) {
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        ::freeaddrinfo(found);
        return fd;
      }
      last = errno_text();
      ::close(fd);
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::freeaddrinfo(found);
  throw DistributedError(detail::cat_str("TcpStore: cannot connect to ", host, ":", port, " within ", timeout.count(),
                                         " ms (", last, "); is rank 0 running and MASTER_ADDR/MASTER_PORT right?"));
}

}  // namespace

TcpStore::TcpStore(const std::string& host, int port, int world_size, bool is_server,
                   std::chrono::milliseconds timeout)
    : port_(port), world_size_(world_size), timeout_(timeout) {
  NC_CHECK(world_size >= 1, ValueError, "TcpStore: world_size must be >= 1, got ", world_size);
  NC_CHECK(port >= 0 && port <= 65535, ValueError, "TcpStore: port must be in 0..65535, got ", port);
  NC_CHECK(timeout.count() > 0, ValueError, "TcpStore: timeout must be positive, got ", timeout.count(), " ms");
  if (is_server) {
    server_ = std::make_unique<Server>();
    server_->listener = ::socket(AF_INET, SOCK_STREAM, 0);
    NC_CHECK(server_->listener >= 0, DistributedError, "TcpStore: socket: ", errno_text());
    const int one = 1;
    ::setsockopt(server_->listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    address.sin_port = htons(static_cast<uint16_t>(port));
    NC_CHECK(::bind(server_->listener, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0,
             DistributedError, "TcpStore: cannot listen on port ", port, ": ", errno_text());
    NC_CHECK(::listen(server_->listener, 128) == 0, DistributedError, "TcpStore: listen: ", errno_text());
    socklen_t length = sizeof address;
    ::getsockname(server_->listener, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    Server* server = server_.get();
    server_->acceptor = std::thread([server] { server->accept_loop(); });
  }
  socket_ = connect_until(is_server ? "127.0.0.1" : host, port_, Clock::now() + timeout_, timeout_);
}

TcpStore::~TcpStore() {
  if (socket_ >= 0) ::close(socket_);
  server_.reset();
}

int TcpStore::port() const { return port_; }

namespace {

std::string request(uint8_t command, const std::string& key, const std::string& value) {
  std::string out(1, static_cast<char>(command));
  put_u32(out, static_cast<uint32_t>(key.size()));
  out += key;
  put_u32(out, static_cast<uint32_t>(value.size()));
  out += value;
  return out;
}

}  // namespace

void TcpStore::set(const std::string& key, const std::string& value) { acknowledged("set", kSet, key, value); }

void TcpStore::remove(const std::string& key) { acknowledged("remove", kRemove, key, ""); }

void TcpStore::acknowledged(const char* what, uint8_t command, const std::string& key, const std::string& value) {
  NC_CHECK(socket_ >= 0, DistributedError, "TcpStore.", what, ": the connection was lost earlier");
  const std::string message = request(command, key, value);
  NC_CHECK(send_all(socket_, message.data(), message.size()), DistributedError, "TcpStore.", what, "('", key,
           "'): the store at port ", port_, " is gone");
  const Clock::time_point deadline = Clock::now() + timeout_;
  char ack = 0;
  const std::string error = recv_all(socket_, &ack, 1, &deadline);
  NC_CHECK(error.empty(), DistributedError, "TcpStore.", what, "('", key, "'): ", error);
}

std::string TcpStore::get(const std::string& key) {
  NC_CHECK(socket_ >= 0, DistributedError, "TcpStore.get: the connection was lost earlier");
  const std::string message = request(kGet, key, "");
  NC_CHECK(send_all(socket_, message.data(), message.size()), DistributedError, "TcpStore.get('", key,
           "'): the store at port ", port_, " is gone");
  const Clock::time_point deadline = Clock::now() + timeout_;
  uint32_t length = 0;
  std::string error = recv_all(socket_, &length, 4, &deadline);
  std::string value;
  if (error.empty()) {
    value.resize(length);
    error = recv_all(socket_, value.data(), length, &deadline);
  }
  if (!error.empty()) {
    // The reply may still come: this connection can no longer be trusted.
    ::close(socket_);
    socket_ = -1;
    throw DistributedError(detail::cat_str("TcpStore.get('", key, "'): ",
                                           error == "timeout" ? "no rank set it within " + std::to_string(timeout_.count()) + " ms"
                                                              : error));
  }
  return value;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  NC_CHECK(socket_ >= 0, DistributedError, "TcpStore.add: the connection was lost earlier");
  const std::string message =
      request(kAdd, key, std::string(reinterpret_cast<const char*>(&delta), sizeof delta));
  NC_CHECK(send_all(socket_, message.data(), message.size()), DistributedError, "TcpStore.add('", key,
           "'): the store at port ", port_, " is gone");
  const Clock::time_point deadline = Clock::now() + timeout_;
  int64_t sum = 0;
  const std::string error = recv_all(socket_, &sum, sizeof sum, &deadline);
  NC_CHECK(error.empty(), DistributedError, "TcpStore.add('", key, "'): ", error);
  return sum;
}

void TcpStore::barrier(const std::string& name) {
  const std::string key = "barrier/" + name + "/" + std::to_string(barriers_++);
  if (add(key, 1) == world_size_) set(key + "/done", "1");
  get(key + "/done");
}

}  // namespace distributed
}  // namespace normcore
