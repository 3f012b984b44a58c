// Rendezvous for several processes, on the CPU over loopback: Env reads the usual
// environment variables and refuses bad ones; TcpStore serves set/get/add/barrier to
// several clients, waits for keys set later, and turns a timeout, a refused connection and
// a server that went away into DistributedError; NCCL, loaded at run time, is a clear error
// where it is missing or is not NCCL.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "distributed/nccl.h"
#include "normcore/distributed.h"
#include "test_support.h"

namespace nd = normcore::distributed;
using normcore_test::throws;
using std::chrono::milliseconds;

namespace {

// Sets environment variables for the scope, restoring the previous values.
class ScopedEnv {
 public:
  using Values = std::vector<std::pair<std::string, std::string>>;
  explicit ScopedEnv(const Values& values) {
    for (const auto& [name, value] : values) {
      const char* old = std::getenv(name.c_str());
      saved_.push_back({name, old != nullptr, old ? old : ""});
      if (value.empty()) {
        ::unsetenv(name.c_str());
      } else {
        ::setenv(name.c_str(), value.c_str(), 1);
      }
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    for (const Saved& s : saved_) {
      if (s.was_set) {
        ::setenv(s.name.c_str(), s.value.c_str(), 1);
      } else {
        ::unsetenv(s.name.c_str());
      }
    }
  }

 private:
  struct Saved {
    std::string name;
    bool was_set;
    std::string value;
  };
  std::vector<Saved> saved_;
};

void expect_env(const nd::Env& e, int rank, int world_size, int local_rank, const std::string& addr, int port) {
  EXPECT_EQ(e.rank, rank);
  EXPECT_EQ(e.world_size, world_size);
  EXPECT_EQ(e.local_rank, local_rank);
  EXPECT_EQ(e.master_addr, addr);
  EXPECT_EQ(e.master_port, port);
}

TEST(DistributedEnv, ReadsTheVariablesAndRefusesBadOnes) {
  {
    ScopedEnv env(ScopedEnv::Values{{"RANK", ""}, {"WORLD_SIZE", ""}, {"LOCAL_RANK", ""}, {"MASTER_ADDR", ""}, {"MASTER_PORT", ""}});
    expect_env(nd::Env::from_environment(), 0, 1, 0, "127.0.0.1", 29500);
  }
  {
    ScopedEnv env(ScopedEnv::Values{{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node0"},
                   {"MASTER_PORT", "1234"}});
    expect_env(nd::Env::from_environment(), 3, 8, 1, "node0", 1234);
  }
  {
    ScopedEnv env(ScopedEnv::Values{{"RANK", "2"}, {"WORLD_SIZE", "2"}});
    throws<normcore::ValueError>([] { nd::Env::from_environment(); }, {"RANK 2", "WORLD_SIZE 2"})();
  }
  {
    ScopedEnv env(ScopedEnv::Values{{"RANK", "x1"}});
    throws<normcore::ValueError>([] { nd::Env::from_environment(); }, {"RANK", "'x1'"})();
  }
  {
    ScopedEnv env(ScopedEnv::Values{{"RANK", ""}, {"WORLD_SIZE", ""}, {"MASTER_PORT", "70000"}});
    throws<normcore::ValueError>([] { nd::Env::from_environment(); }, {"MASTER_PORT", "70000"})();
  }
}

TEST(TcpStore, ServesSetGetAddAndBarriersToSeveralClients) {
  constexpr int kRanks = 4;
  nd::TcpStore server("127.0.0.1", 0, kRanks, true, milliseconds(10000));
  ASSERT_GT(server.port(), 0);
  std::vector<std::thread> ranks;
  std::atomic<int> past_barrier{0}, failures{0};
  for (int r = 1; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      try {
        nd::TcpStore client("127.0.0.1", server.port(), kRanks, false, milliseconds(10000));
        client.set("rank/" + std::to_string(r), std::string(r, 'x'));
        client.add("count", r);
        // Waits for a key rank 0 sets after a delay.
        if (client.get("go") != "now") ++failures;
        for (int round = 0; round < 3; ++round) {
          client.barrier("step");
          ++past_barrier;
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
        ++failures;
      }
    });
  }
  for (int r = 1; r < kRanks; ++r) EXPECT_EQ(server.get("rank/" + std::to_string(r)), std::string(r, 'x'));
  std::this_thread::sleep_for(milliseconds(100));
  server.set("go", "now");
  for (int round = 0; round < 3; ++round) {
    server.barrier("step");
    // Nobody passes barrier k before every rank has reached it.
    EXPECT_LE(past_barrier.load(), (kRanks - 1) * (round + 1));
  }
  for (std::thread& t : ranks) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(past_barrier.load(), (kRanks - 1) * 3);
  EXPECT_EQ(server.add("count", 0), 1 + 2 + 3);
  const std::string binary("a\0b\xff", 4);
  server.set("binary", binary);
  EXPECT_EQ(server.get("binary"), binary);
  server.set("binary", "");
  EXPECT_EQ(server.get("binary"), "");
}

TEST(TcpStore, TimeoutsRefusalsAndALostServerAreErrors) {
  {
    nd::TcpStore server("127.0.0.1", 0, 1, true, milliseconds(200));
    const auto start = std::chrono::steady_clock::now();
    throws<normcore::DistributedError>([&] { server.get("never"); }, {"TcpStore.get('never')", "within 200 ms"})();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    throws<normcore::DistributedError>([&] { server.set("k", "v"); }, {"lost earlier"})();
  }
  int free_port = 0;
  {
    nd::TcpStore probe("127.0.0.1", 0, 1, true, milliseconds(1000));
    free_port = probe.port();
  }
  throws<normcore::DistributedError>(
      [&] { nd::TcpStore client("127.0.0.1", free_port, 2, false, milliseconds(300)); },
      {"cannot connect to 127.0.0.1:" + std::to_string(free_port), "within 300 ms"})();
  {
    auto server = std::make_unique<nd::TcpStore>("127.0.0.1", 0, 2, true, milliseconds(5000));
    nd::TcpStore client("127.0.0.1", server->port(), 2, false, milliseconds(5000));
    std::thread stop([&] {
      std::this_thread::sleep_for(milliseconds(100));
      server.reset();
    });
    throws<normcore::DistributedError>([&] { client.get("never"); }, {"TcpStore.get('never')", "closed"})();
    stop.join();
  }
  throws<normcore::ValueError>([] { nd::TcpStore s("127.0.0.1", 0, 0, true); }, {"world_size", ">= 1"})();
  throws<normcore::ValueError>([] { nd::TcpStore s("127.0.0.1", 70000, 1, true); }, {"port", "70000"})();
}

TEST(Nccl, AMissingOrWrongLibraryIsAClearError) {
  throws<normcore::DistributedError>([] { nd::nccl::load("/nonexistent/libnccl.so.2"); },
                                     {"NCCL: cannot load /nonexistent/libnccl.so.2", "NORMCORE_NCCL_LIBRARY"})();
  // A library that is there but is not NCCL (zlib, which normcore links).
  throws<normcore::DistributedError>([] { nd::nccl::load("libz.so.1"); }, {"libz.so.1 has no ncclGetVersion"})();
}

}  // namespace
