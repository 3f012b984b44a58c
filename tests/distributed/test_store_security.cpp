// The rendezvous store against peers that break its rules, over loopback: a client without
// the job secret (or with another) is refused with an error saying authentication failed; a
// server that cannot prove the secret, or is no store, is refused by its client; lengths over
// the bounds, garbage and silence close that connection only, while a quiet authenticated
// client keeps its; the connection limit holds; a server listens on loopback unless asked for
// every interface. Every case checks that the job's own clients go on.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "distributed/job_secret.h"
#include "distributed/store_protocol.h"
#include "normcore/distributed.h"
#include "tests/test_support.h"

namespace nc = normcore;
namespace nd = normcore::distributed;
namespace wire = normcore::distributed::protocol;
using normcore_test::throws;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kSecret = "the test job's secret, 32 bytes.";

nd::TcpStoreOptions store_options(milliseconds stall = milliseconds(5000), int max_connections = 0,
                                  const std::string& secret = kSecret) {
  nd::TcpStoreOptions options;
  options.timeout = milliseconds(3000);
  options.secret = secret;
  options.stall_timeout = stall;
  options.max_connections = max_connections;
  return options;
}

std::string u32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), sizeof v); }

// A socket to host:port that speaks the store's wire protocol by hand.
class RawClient {
 public:
  explicit RawClient(int port, const char* host = "127.0.0.1") {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, host, &address.sin_addr);
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RawClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool connected() const { return fd_ >= 0; }

  // The status of the server's hello (wire::kReady, kBusy), -1 when there was none.
  int read_hello() {
    char hello[wire::kHelloBytes];
    if (!receive(hello, sizeof hello) || std::memcmp(hello, wire::kMagic, sizeof wire::kMagic) != 0) return -1;
    if (hello[5] == wire::kReady && !receive(nonce_.data(), nonce_.size())) return -1;
    return hello[5];
  }

  // Answers the hello with a proof made from secret: the verdict (wire::kAccepted,
  // kRejected), -1 when the connection closed first.
  int authenticate(const std::string& secret) {
    nd::Nonce mine{};
    const nd::Proof proof = nd::make_proof(secret, nd::Role::Client, nonce_, mine);
    send(std::string(mine.begin(), mine.end()) + std::string(proof.begin(), proof.end()));
    char verdict = 0;
    if (!receive(&verdict, 1)) return -1;
    nd::Proof server_proof;
    if (verdict == wire::kAccepted && !receive(server_proof.data(), server_proof.size())) return -1;
    return verdict;
  }

  void send(const std::string& bytes) { ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL); }

  bool receive(void* data, size_t n) {
    char* p = static_cast<char*>(data);
    while (n > 0) {
      pollfd pfd{fd_, POLLIN, 0};
      if (::poll(&pfd, 1, 5000) <= 0) return false;
      const ssize_t got = ::recv(fd_, p, n, 0);
      if (got <= 0) return false;
      p += got;
      n -= static_cast<size_t>(got);
    }
    return true;
  }

  // How long the server took to close the connection (reading and dropping what it sends),
  // or limit when it is still open then.
  milliseconds time_until_closed(Clock::time_point since, milliseconds limit) {
    for (;;) {
      const auto left = limit - std::chrono::duration_cast<milliseconds>(Clock::now() - since);
      if (left.count() <= 0) return limit;
      pollfd pfd{fd_, POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(left.count())) > 0) {
        char sink[256];
        if (::recv(fd_, sink, sizeof sink, 0) <= 0) {
          return std::chrono::duration_cast<milliseconds>(Clock::now() - since);
        }
      }
    }
  }

 private:
  int fd_ = -1;
  nd::Nonce nonce_{};
};

// A socket listening on a free loopback port, for a false server; port 0 when that failed.
struct Listener {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int port = 0;
  Listener() {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 || ::listen(fd, 4) != 0) return;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
    port = ntohs(address.sin_port);
  }
  ~Listener() { ::close(fd); }
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
};

// The job goes on: a client with the secret sets a key the server reads, and the reverse.
void expect_job_goes_on(nd::TcpStore& server, const std::string& key) {
  nd::TcpStore client("127.0.0.1", server.port(), 2, false, store_options());
  client.set(key, "from the client");
  EXPECT_EQ(server.get(key), "from the client");
  server.set(key + "/reply", "from the server");
  EXPECT_EQ(client.get(key + "/reply"), "from the server");
}

}  // namespace

TEST(TcpStoreSecurity, AClientWithoutTheSecretIsRefusedAndTheJobGoesOn) {
  nd::TcpStoreOptions server_options = store_options();
  server_options.timeout = milliseconds(300);
  nd::TcpStore server("127.0.0.1", 0, 2, true, server_options);
  const std::string where = "authentication failed at 127.0.0.1:" + std::to_string(server.port());
  struct Case {
    const char* name;
    std::string secret;  // empty: this process's own (no NORMCORE_JOB_SECRET in the tests)
  };
  for (const Case& c : {Case{"another secret", "another job's secret, 32 bytes.."}, Case{"no secret", ""}}) {
    SCOPED_TRACE(c.name);
    const auto start = Clock::now();
    throws<nc::DistributedError>(
        [&] {
          nd::TcpStore client("127.0.0.1", server.port(), 2, false, store_options(milliseconds(5000), 0, c.secret));
        },
        {where, "job secret"})();
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));  // refused at once, not a hang
  }
  RawClient garbage(server.port());
  ASSERT_EQ(garbage.read_hello(), wire::kReady);
  garbage.send(std::string(wire::kAnswerBytes, 'x'));
  char verdict = 0;
  ASSERT_TRUE(garbage.receive(&verdict, 1));
  EXPECT_EQ(verdict, wire::kRejected);
  EXPECT_LT(garbage.time_until_closed(Clock::now(), milliseconds(2000)), milliseconds(2000));
  expect_job_goes_on(server, "after refusals");
  // Rank 0 waiting for a rank that was refused learns why.
  throws<nc::DistributedError>([&] { server.get("never"); },
                               {"no rank set it within 300 ms", "closed 3 connection(s)", "authentication failed"})();
}

TEST(TcpStoreSecurity, AServerThatCannotProveTheSecretIsRefusedByItsClient) {
  struct Case {
    const char* name;
    std::function<void(int fd)> serve;  // what the false server does with a connection
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {"no proof",
       [](int fd) {
         std::string hello(wire::kMagic, sizeof wire::kMagic);
         hello += std::string{static_cast<char>(wire::kVersion), static_cast<char>(wire::kReady)};
         hello += std::string(nd::kNonceBytes, 'n');
         ::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
         char answer[wire::kAnswerBytes];
         ::recv(fd, answer, sizeof answer, MSG_WAITALL);
         const std::string accepted = std::string(1, wire::kAccepted) + std::string(nd::kProofBytes, 'p');
         ::send(fd, accepted.data(), accepted.size(), MSG_NOSIGNAL);
       },
       {"authentication failed", "did not prove it knows the job secret"}},
      {"not a store",
       [](int fd) {
         const std::string banner = "SSH-2.0-OpenSSH_9.2\r\n";
         ::send(fd, banner.data(), banner.size(), MSG_NOSIGNAL);
       },
       {"is not a normcore store"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Listener listener;
    ASSERT_GT(listener.port, 0);
    const int port = listener.port;
    std::thread fake([&] {
      const int fd = ::accept(listener.fd, nullptr, nullptr);
      c.serve(fd);
      char sink[64];
      ::recv(fd, sink, sizeof sink, 0);  // until the client hangs up
      ::close(fd);
    });
    throws<nc::DistributedError>([&] { nd::TcpStore client("127.0.0.1", port, 2, false, store_options()); },
                                 c.fragments)();
    fake.join();
  }
}

// A reply that comes after its request timed out is not taken for the next request's: the
// client drops the connection, and the next request says it was lost.
TEST(TcpStoreSecurity, ALateReplyIsNotTakenForTheNextOne) {
  const Listener listener;
  ASSERT_GT(listener.port, 0);
  // A store that proves the secret, then acknowledges each request 600 ms late.
  std::thread slow_store([&] {
    const int fd = ::accept(listener.fd, nullptr, nullptr);
    nd::Nonce server_nonce{};
    server_nonce.fill('n');
    std::string hello(wire::kMagic, sizeof wire::kMagic);
    hello += std::string{static_cast<char>(wire::kVersion), static_cast<char>(wire::kReady)};
    hello += std::string(server_nonce.begin(), server_nonce.end());
    ::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
    char answer[wire::kAnswerBytes];
    ::recv(fd, answer, sizeof answer, MSG_WAITALL);
    nd::Nonce client_nonce;
    std::memcpy(client_nonce.data(), answer, client_nonce.size());
    const nd::Proof proof = nd::make_proof(kSecret, nd::Role::Server, server_nonce, client_nonce);
    const std::string accepted = std::string(1, wire::kAccepted) + std::string(proof.begin(), proof.end());
    ::send(fd, accepted.data(), accepted.size(), MSG_NOSIGNAL);
    char request[64];
    while (::recv(fd, request, sizeof request, 0) > 0) {
      std::this_thread::sleep_for(milliseconds(600));
      ::send(fd, "", 1, MSG_NOSIGNAL);  // the acknowledgement, one zero byte
    }
    ::close(fd);
  });
  {
    nd::TcpStoreOptions options = store_options();
    options.timeout = milliseconds(300);
    nd::TcpStore client("127.0.0.1", listener.port, 2, false, options);
    throws<nc::DistributedError>([&] { client.set("first", "1"); }, {"TcpStore.set('first')", "timeout"})();
    std::this_thread::sleep_for(milliseconds(500));  // the late acknowledgement has come
    throws<nc::DistributedError>([&] { client.set("second", "2"); },
                                 {"TcpStore.set", "the connection was lost earlier"})();
  }
  slow_store.join();
}

TEST(TcpStoreSecurity, BadRequestsAndStallsCloseTheirConnectionOnly) {
  constexpr milliseconds kStall(1500);
  nd::TcpStore server("127.0.0.1", 0, 2, true, store_options(kStall));
  // An authenticated client may stay quiet longer than the stall timeout between requests.
  RawClient quiet(server.port());
  ASSERT_EQ(quiet.read_hello(), wire::kReady);
  ASSERT_EQ(quiet.authenticate(kSecret), wire::kAccepted);
  const auto quiet_since = Clock::now();
  const std::string four_gib = u32(0xffffffffu);
  struct Case {
    const char* name;
    bool authenticate;
    std::string bytes;
    bool stalls;  // closed after the stall timeout, not at once
  };
  const std::vector<Case> cases = {
      {"a 4 GiB key", true, std::string(1, wire::kSet) + four_gib, false},
      {"a 4 GiB value", true, std::string(1, wire::kSet) + u32(1) + "k" + four_gib, false},
      {"a value one byte over", true, std::string(1, wire::kSet) + u32(1) + "k" + u32(nd::TcpStore::kMaxValueBytes + 1),
       false},
      {"a key one byte over", true, std::string(1, wire::kGet) + u32(nd::TcpStore::kMaxKeyBytes + 1), false},
      {"an unknown command", true, "\x77 garbage bytes", false},
      {"an add of 3 bytes", true, std::string(1, wire::kAdd) + u32(1) + "k" + u32(3) + "abc", false},
      {"a request without the handshake", false,
       wire::encode_request(wire::kSet, "k", "v") + std::string(wire::kAnswerBytes, 'x'), false},
      {"silence before authenticating", false, "", true},
      {"half an answer", false, std::string(10, 'a'), true},
      {"half a request", true, std::string(1, wire::kSet) + u32(5) + "ke", true},
  };
  // Those closed at once are checked one by one, the stalling ones all together.
  std::vector<std::pair<const Case*, std::unique_ptr<RawClient>>> stalling;
  const auto stalls_since = Clock::now();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto client = std::make_unique<RawClient>(server.port());
    ASSERT_EQ(client->read_hello(), wire::kReady);
    if (c.authenticate) ASSERT_EQ(client->authenticate(kSecret), wire::kAccepted);
    client->send(c.bytes);
    if (c.stalls) {
      stalling.emplace_back(&c, std::move(client));
    } else {
      EXPECT_LT(client->time_until_closed(Clock::now(), kStall / 2), kStall / 2);
    }
  }
  expect_job_goes_on(server, "while they misbehave");
  for (auto& [c, client] : stalling) {
    SCOPED_TRACE(c->name);
    const milliseconds closed_after = client->time_until_closed(stalls_since, 4 * kStall);
    EXPECT_GE(closed_after, kStall - milliseconds(100));
    EXPECT_LT(closed_after, 4 * kStall);
  }
  ASSERT_GT(Clock::now() - quiet_since, kStall);
  quiet.send(wire::encode_request(wire::kGet, "while they misbehave", ""));
  char reply[4 + 15];
  ASSERT_TRUE(quiet.receive(reply, sizeof reply));
  EXPECT_EQ(std::string(reply + 4, 15), "from the client");
  expect_job_goes_on(server, "after they were cut off");
}

TEST(TcpStoreSecurity, ParsingChecksEachLengthBeforeWaitingForItsBytes) {
  wire::Request request;
  const std::string key_claim = std::string(1, wire::kSet) + u32(0xffffffffu);
  throws<nc::DistributedError>([&] { wire::parse_request(key_claim, &request); },
                               {"key of 4294967295 bytes", "at most 4096"})();
  const std::string value_claim = std::string(1, wire::kSet) + u32(1) + "k" + u32(0xffffffffu);
  throws<nc::DistributedError>([&] { wire::parse_request(value_claim, &request); }, {"value of 4294967295 bytes"})();
  const std::string whole = wire::encode_request(wire::kSet, "key", "value");
  for (size_t cut = 0; cut < whole.size(); ++cut) EXPECT_EQ(wire::parse_request(whole.substr(0, cut), &request), 0u);
  EXPECT_EQ(wire::parse_request(whole + "next", &request), whole.size());
  EXPECT_EQ(request.key, "key");
  EXPECT_EQ(request.value, "value");
}

TEST(TcpStoreSecurity, TheConnectionLimitHolds) {
  // The server's own client holds one of the three.
  nd::TcpStore server("127.0.0.1", 0, 2, true, store_options(milliseconds(5000), 3));
  auto first = std::make_unique<RawClient>(server.port());
  RawClient second(server.port());
  ASSERT_EQ(first->read_hello(), wire::kReady);
  ASSERT_EQ(second.read_hello(), wire::kReady);
  RawClient third(server.port());
  EXPECT_EQ(third.read_hello(), wire::kBusy);
  EXPECT_LT(third.time_until_closed(Clock::now(), milliseconds(2000)), milliseconds(2000));
  nd::TcpStoreOptions brief = store_options();
  brief.timeout = milliseconds(300);
  throws<nc::DistributedError>([&] { nd::TcpStore client("127.0.0.1", server.port(), 2, false, brief); },
                               {"cannot connect", "as many connections as it takes"})();
  first.reset();  // a place comes free; the next client (retrying) takes it
  expect_job_goes_on(server, "within the limit");
}

TEST(TcpStoreSecurity, ListensOnLoopbackUnlessAskedForEveryInterface) {
  {
    nd::TcpStore server("127.0.0.1", 0, 1, true, store_options());
    EXPECT_EQ(server.listen_address(), "127.0.0.1");
    // Another address of this machine (all of 127/8 is loopback) finds nobody listening.
    EXPECT_FALSE(RawClient(server.port(), "127.0.0.2").connected());
  }
  {
    nd::TcpStoreOptions options = store_options();
    options.bind_all = true;
    nd::TcpStore server("127.0.0.1", 0, 1, true, options);
    EXPECT_EQ(server.listen_address(), "0.0.0.0");
    RawClient other(server.port(), "127.0.0.2");
    ASSERT_TRUE(other.connected());
    EXPECT_EQ(other.read_hello(), wire::kReady);
  }
  // 192.0.2.1 is a documentation address, none of this machine's.
  throws<nc::DistributedError>([] { nd::TcpStore server("192.0.2.1", 0, 1, true, store_options()); },
                               {"cannot listen on 192.0.2.1:0", "NORMCORE_STORE_BIND_ALL=1"})();
}

TEST(TcpStoreSecurity, KeysValuesAndOptionsOutsideTheirBoundsAreRefused) {
  nd::TcpStore server("127.0.0.1", 0, 1, true, store_options());
  const std::string largest(nd::TcpStore::kMaxValueBytes, 'v');
  server.set("largest", largest);
  EXPECT_EQ(server.get("largest"), largest);
  throws<nc::ValueError>([&] { server.set("k", largest + "v"); }, {"TcpStore.set('k')", "kMaxValueBytes"})();
  throws<nc::ValueError>([&] { server.get(std::string(nd::TcpStore::kMaxKeyBytes + 1, 'k')); },
                         {"TcpStore.get", "4097 bytes", "at most 4096"})();
  EXPECT_EQ(server.get("largest").size(), largest.size());  // the connection is still good
  struct Case {
    const char* name;
    std::function<void(nd::TcpStoreOptions&)> change;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {"short secret", [](nd::TcpStoreOptions& o) { o.secret = "too short"; }, {"9 bytes", "16 to 4096"}},
      {"max_connections", [](nd::TcpStoreOptions& o) { o.max_connections = -1; }, {"max_connections", "-1"}},
      {"stall_timeout", [](nd::TcpStoreOptions& o) { o.stall_timeout = milliseconds(0); }, {"stall_timeout"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    nd::TcpStoreOptions options = store_options();
    c.change(options);
    throws<nc::ValueError>([&] { nd::TcpStore s("127.0.0.1", 0, 1, true, options); }, c.fragments)();
  }
}
