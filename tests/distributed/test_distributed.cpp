// Rendezvous for several processes, on the CPU over loopback: Env reads the usual
// environment variables and refuses bad ones; TcpStore serves set/get/add/barrier to
// several clients, waits for keys set later, and turns a timeout, a refused connection and
// a server that went away into DistributedError; NCCL, loaded at run time, is a clear error
// where it is missing or is not NCCL.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <thread>
#include <vector>

#include "distributed/nccl.h"
#include "normcore/distributed.h"
#include "normcore/losses.h"
#include "normcore/normcore.h"
#include "normcore/optim.h"
#include "tests/distributed/ranks.h"
#include "tests/test_support.h"

namespace nc = normcore;
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
    ScopedEnv env(ScopedEnv::Values{
        {"RANK", ""}, {"WORLD_SIZE", ""}, {"LOCAL_RANK", ""}, {"MASTER_ADDR", ""}, {"MASTER_PORT", ""}});
    expect_env(nd::Env::from_environment(), 0, 1, 0, "127.0.0.1", 29500);
  }
  {
    ScopedEnv env(ScopedEnv::Values{
        {"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "1234"}});
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

// The server's process may destroy its store as soon as its last barrier ends, which the
// last rank to arrive ends with a set: that rank must still hear its set was done, not find
// the connection closed (the server owes the set's reply as it owes a get's).
TEST(TcpStore, TheLastBarrierEndsForTheRankThatEndsIt) {
  for (int round = 0; round < 200; ++round) {
    SCOPED_TRACE(round);
    auto server = std::make_unique<nd::TcpStore>("127.0.0.1", 0, 2, true, milliseconds(10000));
    std::string error;
    std::thread client([&, port = server->port()] {
      try {
        nd::TcpStore store("127.0.0.1", port, 2, false, milliseconds(10000));
        std::this_thread::sleep_for(std::chrono::microseconds(200));  // arrives last: sets done
        store.barrier("end");
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
    server->barrier("end");
    server.reset();
    client.join();
    ASSERT_EQ(error, "");
  }
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
  throws<normcore::DistributedError>([&] { nd::TcpStore client("127.0.0.1", free_port, 2, false, milliseconds(300)); },
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

// The environment's part in the store's security: NORMCORE_JOB_SECRET is the secret a store
// takes when given none, NORMCORE_STORE_BIND_ALL=1 listens on every interface, and the
// launcher hands its ranks a secret through their environment.
TEST(TcpStore, TakesTheSecretAndTheBindingFromTheEnvironment) {
  const std::string secret = "a secret of the environment, 32 b";
  nd::TcpStoreOptions options;
  options.timeout = milliseconds(3000);
  options.secret = secret;
  nd::TcpStore server("127.0.0.1", 0, 2, true, options);
  {
    ScopedEnv env(ScopedEnv::Values{{"NORMCORE_JOB_SECRET", secret}});
    nd::TcpStore client("127.0.0.1", server.port(), 2, false, milliseconds(3000));
    client.set("k", "v");
    EXPECT_EQ(server.get("k"), "v");
  }
  {
    ScopedEnv env(ScopedEnv::Values{{"NORMCORE_JOB_SECRET", ""}});
    throws<normcore::DistributedError>(
        [&] { nd::TcpStore client("127.0.0.1", server.port(), 2, false, milliseconds(3000)); },
        {"authentication failed", "this process has no NORMCORE_JOB_SECRET"})();
  }
  {
    ScopedEnv env(ScopedEnv::Values{{"NORMCORE_JOB_SECRET", "short"}});
    throws<normcore::ValueError>([&] { nd::TcpStore client("127.0.0.1", server.port(), 2, false); },
                                 {"NORMCORE_JOB_SECRET has 5 bytes", "16 to 4096"})();
  }
  {
    ScopedEnv env(ScopedEnv::Values{{"NORMCORE_STORE_BIND_ALL", "1"}});
    nd::TcpStore everywhere("127.0.0.1", 0, 1, true);
    EXPECT_EQ(everywhere.listen_address(), "0.0.0.0");
  }
  {
    ScopedEnv env(ScopedEnv::Values{{"NORMCORE_STORE_BIND_ALL", "yes"}});
    throws<normcore::ValueError>([] { nd::TcpStore s("127.0.0.1", 0, 1, true); },
                                 {"NORMCORE_STORE_BIND_ALL must be 0 or 1", "'yes'"})();
  }
}

class Launch : public normcore_test::TempDirTest {
 protected:
  // The secret each of the ranks of a launch of two found in its environment.
  std::vector<std::string> secrets_of_a_launch(const nd::LaunchOptions& options) {
    const std::string out = (dir_ / "secret.").string();
    EXPECT_EQ(nd::launch({"sh", "-c", "printf %s \"$NORMCORE_JOB_SECRET\" > " + out + "$LOCAL_RANK"}, options), 0);
    std::vector<std::string> secrets;
    for (int r = 0; r < options.nproc; ++r) {
      std::ifstream in(out + std::to_string(r));
      secrets.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    return secrets;
  }
};

TEST_F(Launch, HandsItsRanksAJobSecretThroughTheEnvironment) {
  nd::LaunchOptions options;
  options.nproc = 2;
  ScopedEnv unset(ScopedEnv::Values{{"NORMCORE_JOB_SECRET", ""}});
  const std::vector<std::string> first = secrets_of_a_launch(options);
  EXPECT_EQ(first[0].size(), 64u);  // 32 random bytes in hex
  EXPECT_EQ(first[0], first[1]);
  EXPECT_NE(secrets_of_a_launch(options)[0], first[0]);  // a new one for every job
  options.nnodes = 2;                                    // node 0 of two: the other launcher must have the same secret
  throws<normcore::ValueError>([&] { nd::launch({"true"}, options); },
                               {"a job of 2 machines", "NORMCORE_JOB_SECRET"})();
  const std::string given = "a secret given to every launcher";
  ScopedEnv set(ScopedEnv::Values{{"NORMCORE_JOB_SECRET", given}});
  EXPECT_EQ(secrets_of_a_launch(options), (std::vector<std::string>{given, given}));
}

TEST(Nccl, AMissingOrWrongLibraryIsAClearError) {
  throws<normcore::DistributedError>([] { nd::nccl::load("/nonexistent/libnccl.so.2"); },
                                     {"NCCL: cannot load /nonexistent/libnccl.so.2", "NORMCORE_NCCL_LIBRARY"})();
  // A library that is there but is not NCCL (zlib, which normcore links).
  throws<normcore::DistributedError>([] { nd::nccl::load("libz.so.1"); }, {"libz.so.1 has no ncclGetVersion"})();
}

}  // namespace

// ---------------------------------------------------------------- process groups on the CPU

using normcore_test::max_difference;
using normcore_test::run_ranks;
using normcore_test::shard;
using normcore_test::small_mlp;
namespace {
std::vector<double> values(const nc::Tensor& t) { return normcore_test::values_of(t); }
}  // namespace

TEST(TcpStore, RemovesKeys) {
  nd::TcpStore server("127.0.0.1", 0, 1, true, milliseconds(200));
  server.set("k", "v");
  server.remove("k");
  server.remove("never-set");
  throws<normcore::DistributedError>([&] { server.get("k"); }, {"TcpStore.get('k')"})();
}

TEST(ProcessGroupStore, CollectivesGiveEveryRankTheRightValues) {
  run_ranks(3, [](nd::ProcessGroup& g) {
    constexpr int kWorld = 3;
    const int r = g.rank();
    EXPECT_EQ(g.world_size(), kWorld);
    EXPECT_EQ(g.backend(), "store");
    // Rank r holds [r + 1, 10 (r + 1), -r].
    auto mine = [r] { return nc::from_vector(std::vector<float>{r + 1.f, 10.f * (r + 1), -1.f * r}, {3}); };
    nc::Tensor t = mine();
    g.all_reduce(t);
    EXPECT_EQ(values(t), (std::vector<double>{6, 60, -3}));
    t = mine();
    g.all_reduce(t, nd::ReduceOp::Avg);
    EXPECT_EQ(values(t), (std::vector<double>{2, 20, -1}));
    t = mine();
    g.all_reduce(t, nd::ReduceOp::Max);
    EXPECT_EQ(values(t), (std::vector<double>{3, 30, 0}));
    t = mine();
    g.all_reduce(t, nd::ReduceOp::Min);
    EXPECT_EQ(values(t), (std::vector<double>{1, 10, -2}));
    nc::Tensor i = nc::from_vector(std::vector<int64_t>{int64_t(1) << (40 + r)}, {1});
    g.all_reduce(i);
    EXPECT_EQ(i.to_vector<int64_t>()[0], (int64_t(1) << 40) + (int64_t(1) << 41) + (int64_t(1) << 42));

    t = mine();
    g.broadcast(t, 1);
    EXPECT_EQ(values(t), (std::vector<double>{2, 20, -1}));

    nc::Tensor gathered = nc::zeros({kWorld * 2, 2});
    g.all_gather(gathered, nc::full({2, 2}, r + 0.5));
    for (int k = 0; k < kWorld * 2; ++k) EXPECT_EQ(values(gathered)[2 * k], k / 2 + 0.5);

    // in: rows 0..5 hold row * (r + 1); out gets rows 2r, 2r + 1 of the sum (factor 6).
    nc::Tensor in = nc::mul(nc::arange(0, kWorld * 2, 1, nc::DType::F32).reshape({kWorld * 2, 1}), double(r + 1));
    nc::Tensor out = nc::zeros({2, 1});
    g.reduce_scatter(out, in);
    EXPECT_EQ(values(out), (std::vector<double>{6.0 * 2 * r, 6.0 * (2 * r + 1)}));

    // Several tensors, of two dtypes, as one collective.
    t = mine();
    nc::Tensor d = nc::full({2, 2}, r + 1.0, nc::DType::F64);
    g.all_reduce_coalesced({t, d}, nd::ReduceOp::Avg);
    EXPECT_EQ(values(t), (std::vector<double>{2, 20, -1}));
    EXPECT_EQ(values(d), std::vector<double>(4, 2.0));

    t = mine();
    nd::Work work = g.all_reduce_async(t);
    work.wait();
    EXPECT_TRUE(work.completed());
    EXPECT_EQ(values(t), (std::vector<double>{6, 60, -3}));
    g.barrier();
  });
}

TEST(ProcessGroupStore, ATensorLargerThanAStoreValueGoesInPieces) {
  run_ranks(2, [](nd::ProcessGroup& g) {
    // Two whole pieces and three floats.
    const int64_t n = static_cast<int64_t>(2 * nd::TcpStore::kMaxValueBytes / sizeof(float)) + 3;
    nc::Tensor t = nc::add(nc::arange(0, n, 1, nc::DType::F32), double(g.rank()));
    g.all_reduce(t);
    const std::vector<float> sum = t.to_vector<float>();
    for (int64_t i : {int64_t(0), n / 2, n - 4, n - 1}) EXPECT_EQ(sum[static_cast<size_t>(i)], 2.0f * i + 1) << i;
    nc::Tensor b = nc::full({n}, g.rank() + 0.5);
    g.broadcast(b, 1);
    EXPECT_EQ(b.to_vector<float>()[static_cast<size_t>(n - 1)], 1.5f);
  });
}

TEST(ProcessGroupStore, BadArgumentsAreRefusedWithTheCollectiveAndRank) {
  run_ranks(1, [](nd::ProcessGroup& g) {
    nc::Tensor m = nc::zeros({2, 3});
    throws<nc::ShapeError>([&] { g.all_reduce(m.transpose(0, 1)); }, {"all_reduce (rank 0 of 1)", "contiguous"})();
    throws<nc::DTypeError>([&] { g.all_reduce(nc::zeros({2}, nc::DType::Bool)); }, {"all_reduce", "bool"})();
    throws<nc::DTypeError>([&] { g.all_reduce(nc::zeros({2}, nc::DType::I64), nd::ReduceOp::Avg); },
                           {"all_reduce", "avg", "floating"})();
    throws<nc::ValueError>([&] { g.broadcast(m, 1); }, {"broadcast", "root 1"})();
    throws<nc::ShapeError>([&] { g.all_gather(nc::zeros({3, 3}), m); }, {"all_gather", "[3, 3]", "[2, 3]"})();
    throws<nc::DTypeError>([&] { g.all_gather(nc::zeros({2, 3}, nc::DType::F64), m); }, {"all_gather", "f64", "f32"})();
    throws<nc::ShapeError>([&] { g.reduce_scatter(nc::zeros({1, 3}), m); }, {"reduce_scatter", "[2, 3]"})();
    throws<nc::ValueError>([&] { g.all_reduce(nc::Tensor()); }, {"all_reduce", "undefined"})();
    throws<nc::ValueError>([&] { g.all_reduce_coalesced({}); }, {"all_reduce_coalesced (rank 0 of 1)", "empty"})();
    throws<nc::ShapeError>(
        [&] {
          g.all_reduce_coalesced({m, m.transpose(0, 1)});
        },
        {"all_reduce_coalesced", "ts[1]", "contiguous"})();
  });
  // A GPU group needs a GPU (and a CUDA build).
  auto store = std::make_shared<nd::TcpStore>("127.0.0.1", 0, 1, true, milliseconds(1000));
  if (nc::cuda_device_count() == 0) {
    throws<nc::DeviceError>([&] { nd::ProcessGroup(store, 0, 1, nc::Device::cuda(0)); },
                            {"ProcessGroup (rank 0)", "cuda:0"})();
  }
  throws<nc::ValueError>([&] { nd::ProcessGroup(store, 1, 1, nc::Device::cpu()); }, {"ProcessGroup", "rank 1"})();
}

TEST(ProcessGroupStore, APeerThatNeverComesIsATimeout) {
  auto server = std::make_shared<nd::TcpStore>("127.0.0.1", 0, 2, true, milliseconds(300));
  nd::ProcessGroup g(server, 0, 2, nc::Device::cpu(), nd::ProcessGroupOptions{milliseconds(300)});
  nc::Tensor t = nc::ones({2});
  throws<nc::DistributedError>([&] { g.all_reduce(t); },
                               {"all_reduce (rank 0 of 2) over the store", "rank 1's part", "within 300 ms"})();
}

// ---------------------------------------------------------------- data parallelism

TEST(DataParallel, BucketsFollowBackwardOrderDTypeAndSize) {
  std::vector<nc::Tensor> params = {nc::zeros({100}), nc::zeros({300}), nc::zeros({50}),
                                    nc::zeros({10}, nc::DType::F64), nc::zeros({1000})};
  // From the last: 4000 bytes alone (over the first limit); the f64 one on its own; then the
  // f32 ones together under the later limit.
  EXPECT_EQ(nd::assign_buckets(params, 1000, 2000), (std::vector<std::vector<size_t>>{{4}, {3}, {2, 1, 0}}));
  EXPECT_EQ(nd::assign_buckets(params, 1 << 20, 1 << 20), (std::vector<std::vector<size_t>>{{4, 2, 1, 0}, {3}}));
  EXPECT_EQ(nd::assign_buckets(params, 1, 1), (std::vector<std::vector<size_t>>{{4}, {3}, {2}, {1}, {0}}));
}

TEST(AutogradHooks, ReadyHooksFireOnceWhenTheGradientIsCompleteAndCallbacksAfter) {
  nc::Tensor w = nc::from_vector(std::vector<double>{2.0}, {1}).requires_grad_();
  nc::Tensor x = nc::from_vector(std::vector<double>{3.0}, {1});
  std::vector<std::string> events;
  const int64_t id = nc::autograd::add_grad_ready_hook(w, [&] {
    events.push_back("ready " + std::to_string(w.grad().item<double>()));
    nc::autograd::queue_backward_callback([&] { events.push_back("end"); });
  });
  // w reaches the loss along two paths: d/dw (w x + w^2) = x + 2 w = 7.
  nc::sum(nc::add(nc::mul(w, x), nc::mul(w, w))).backward();
  EXPECT_EQ(events, (std::vector<std::string>{"ready 7.000000", "end"}));
  nc::sum(nc::add(nc::mul(w, x), nc::mul(w, w))).backward();  // accumulates: 14
  EXPECT_EQ(events.back(), "end");
  EXPECT_EQ(events[2], "ready 14.000000");
  nc::autograd::remove_grad_ready_hook(w, id);
  nc::sum(nc::mul(w, x)).backward();
  EXPECT_EQ(events.size(), 4u);
  throws<nc::ValueError>([&] { nc::autograd::queue_backward_callback([] {}); }, {"no backward() is running"})();
  throws<nc::ValueError>([&] { nc::autograd::add_grad_ready_hook(nc::mul(w, x), [] {}); },
                         {"add_grad_ready_hook", "leaf"})();
}

TEST(DataParallel, TwoRanksWithBatchBTrainAsOneWithBatch2B) {
  constexpr int kSteps = 3;
  // One process, batches of 8 (both ranks' rows).
  auto reference = small_mlp(1);
  nc::optim::SGD sgd(reference->parameters(), nc::optim::SGDOptions{0.1, 0.9});
  for (int s = 0; s < kSteps; ++s) {
    auto [x0, y0] = shard(s, 0);
    auto [x1, y1] = shard(s, 1);
    sgd.zero_grad();
    nc::mse_loss((*reference)(nc::cat({x0, x1})), nc::cat({y0, y1})).backward();
    sgd.step();
  }
  std::vector<std::vector<nc::Tensor>> trained(2);
  run_ranks(2, [&](nd::ProcessGroup& g) {
    // Each rank starts from other weights: the wrapper copies rank 0's.
    auto model = small_mlp(g.rank() == 0 ? 1 : 77);
    nd::DistributedDataParallel ddp(model, g, nd::DataParallelOptions{600, 300});
    EXPECT_GE(ddp.buckets().size(), 3u);  // several buckets, launched as gradients come
    nc::optim::SGD opt(model->parameters(), nc::optim::SGDOptions{0.1, 0.9});
    for (int s = 0; s < kSteps; ++s) {
      auto [x, y] = shard(s, g.rank());
      opt.zero_grad();
      nc::mse_loss(ddp(x), y).backward();
      opt.step();
    }
    trained[static_cast<size_t>(g.rank())] = model->parameters();
  });
  EXPECT_EQ(max_difference(trained[0], trained[1]), 0.0);  // every rank holds the same model
  EXPECT_LT(max_difference(trained[0], reference->parameters()), 1e-12);
  EXPECT_GT(max_difference(small_mlp(1)->parameters(), reference->parameters()), 1e-3);  // it trained
}

TEST(DataParallel, NoSyncAccumulatesLocallyAndTheNextBackwardAverages) {
  // Reference: the gradient of (L(a0) + L(b0) + L(a1) + L(b1)) / 2.
  auto reference = small_mlp(5);
  for (int r = 0; r < 2; ++r) {
    for (int micro = 0; micro < 2; ++micro) {
      auto [x, y] = shard(micro, r);
      nc::mul(nc::mse_loss((*reference)(x), y), 0.5).backward();
    }
  }
  std::vector<std::vector<nc::Tensor>> grads(2), local(2);
  run_ranks(2, [&](nd::ProcessGroup& g) {
    auto model = small_mlp(5);
    nd::DistributedDataParallel ddp(model, g);
    {
      auto guard = ddp.no_sync();
      auto [x, y] = shard(0, g.rank());
      nc::mse_loss(ddp(x), y).backward();
    }
    for (const nc::Tensor& p : model->parameters()) local[static_cast<size_t>(g.rank())].push_back(p.grad().clone());
    auto [x, y] = shard(1, g.rank());
    nc::mse_loss(ddp(x), y).backward();
    for (const nc::Tensor& p : model->parameters()) grads[static_cast<size_t>(g.rank())].push_back(p.grad());
  });
  EXPECT_GT(max_difference(local[0], local[1]), 1e-3);  // not averaged under no_sync
  std::vector<nc::Tensor> expected;
  for (const nc::Tensor& p : reference->parameters()) expected.push_back(p.grad());
  EXPECT_LT(max_difference(grads[0], expected), 1e-12);
  EXPECT_EQ(max_difference(grads[0], grads[1]), 0.0);
}

TEST(DataParallel, RanksWithDifferentModelsAreRefused) {
  std::atomic<int> refused{0};
  try {
    run_ranks(2, [&](nd::ProcessGroup& g) {
      auto model = g.rank() == 0 ? small_mlp(1)
                                 : std::make_shared<nc::nn::Sequential>(std::vector<std::shared_ptr<nc::nn::Module>>{
                                       std::make_shared<nc::nn::Linear>(6, 4)});
      try {
        nd::DistributedDataParallel ddp(model, g);
      } catch (const nc::ValueError& e) {
        EXPECT_NE(std::string(e.what()).find("has another model"), std::string::npos) << e.what();
        ++refused;
      }
    });
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  EXPECT_EQ(refused.load(), 2);
}

// ---------------------------------------------------------------- NCCL (GPUs)

namespace {

std::shared_ptr<nc::nn::Sequential> mlp_on(uint64_t seed, nc::Device device) {
  auto model = small_mlp(seed);
  model->to(nc::DType::F32);
  model->to(device);
  return model;
}

}  // namespace

TEST(DistributedCuda, OneRankRunsEveryCollectiveAndTrainsAsPlainTraining) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const nc::Device gpu = nc::Device::cuda(0);
  run_ranks(
      1,
      [&](nd::ProcessGroup& g) {
        EXPECT_EQ(g.backend().rfind("nccl 2.", 0), 0u) << g.backend();
        for (nc::DType dtype : {nc::DType::F32, nc::DType::BF16, nc::DType::F64, nc::DType::I64, nc::DType::F16}) {
          const nc::Tensor original = nc::arange(0, 6, 1, nc::TensorOptions(nc::DType::F32, gpu)).to(dtype);
          for (nd::ReduceOp op : {nd::ReduceOp::Sum, nd::ReduceOp::Max, nd::ReduceOp::Min, nd::ReduceOp::Avg}) {
            if (op == nd::ReduceOp::Avg && !nc::is_floating(dtype)) continue;
            nc::Tensor t = original.clone();
            g.all_reduce(t, op);
            EXPECT_EQ(values(t.to(nc::Device::cpu())), values(original.to(nc::Device::cpu())))
                << nc::dtype_name(dtype) << " " << nd::reduce_op_name(op);
          }
        }
        nc::Tensor t = nc::full({1000}, 3.5, gpu);
        g.broadcast(t, 0);
        EXPECT_EQ(values(t.to(nc::Device::cpu()))[999], 3.5);
        nc::Tensor out = nc::zeros({4, 3}, gpu);
        const nc::Tensor in = nc::mul(nc::ones({4, 3}, gpu), 2.0);
        g.all_gather(out, in);
        EXPECT_EQ(values(out.to(nc::Device::cpu())), std::vector<double>(12, 2.0));
        nc::Tensor scattered = nc::zeros({4, 3}, gpu);
        g.reduce_scatter(scattered, nc::mul(nc::ones({4, 3}, gpu), 5.0), nd::ReduceOp::Sum);
        EXPECT_EQ(values(scattered.to(nc::Device::cpu())), std::vector<double>(12, 5.0));
        nc::Tensor f = nc::full({5}, 2.5, gpu), h = nc::full({3, 3}, -1.0, nc::TensorOptions(nc::DType::BF16, gpu));
        g.all_reduce_coalesced({f, h}, nd::ReduceOp::Avg);
        EXPECT_EQ(values(f.to(nc::Device::cpu())), std::vector<double>(5, 2.5));
        EXPECT_EQ(values(h.to(nc::Device::cpu())), std::vector<double>(9, -1.0));
        nc::Tensor big = nc::full({1 << 20}, 1.25, gpu);
        nd::Work work = g.all_reduce_async(big, nd::ReduceOp::Sum);
        work.synchronize();
        EXPECT_TRUE(work.completed());
        EXPECT_EQ(values(big.to(nc::Device::cpu()))[12345], 1.25);
        g.barrier();
        throws<nc::DeviceError>([&] { g.all_reduce(nc::ones({2})); }, {"all_reduce (rank 0 of 1)", "cpu", "cuda:0"})();

        // Data-parallel training of one rank gives plain training's parameters, bit for bit.
        auto plain = mlp_on(3, gpu), wrapped = mlp_on(3, gpu);
        nd::DistributedDataParallel ddp(wrapped, g, nd::DataParallelOptions{2048, 1024});
        EXPECT_GE(ddp.buckets().size(), 2u);
        nc::optim::Adam a(plain->parameters(), nc::optim::AdamOptions{1e-2});
        nc::optim::Adam b(wrapped->parameters(), nc::optim::AdamOptions{1e-2});
        for (int s = 0; s < 5; ++s) {
          auto [x, y] = shard(s, 0);
          x = x.to(nc::DType::F32).to(gpu);
          y = y.to(nc::DType::F32).to(gpu);
          a.zero_grad();
          nc::mse_loss((*plain)(x), y).backward();
          a.step();
          b.zero_grad();
          nc::mse_loss(ddp(x), y).backward();
          b.step();
        }
        EXPECT_EQ(max_difference(plain->parameters(), wrapped->parameters()), 0.0);
      },
      milliseconds(20000), true);
}

// A small CNN of the cnn-gn kind (convolutions, GroupNorm, pooling), f32, for 4 x 1 x 8 x 8
// inputs.
std::shared_ptr<nc::nn::Sequential> cnn_on(uint64_t seed, nc::Device device) {
  nc::Generator gen(seed);
  auto model = std::make_shared<nc::nn::Sequential>(std::vector<std::shared_ptr<nc::nn::Module>>{
      std::make_shared<nc::nn::Conv2d>(1, 8, 3, 1, 1, 1, 1, false, &gen), std::make_shared<nc::nn::GroupNorm>(4, 8),
      std::make_shared<nc::nn::ReLU>(), std::make_shared<nc::nn::MaxPool2d>(2), std::make_shared<nc::nn::Flatten>(),
      std::make_shared<nc::nn::Linear>(8 * 4 * 4, 4, true, &gen)});
  model->to(device);
  return model;
}

// Needs two GPUs: ranks on cuda:0 and cuda:1 with 4 rows each train as one GPU with 8, for
// the MLP and for a CNN.
void expect_two_gpus_train_as_one(const std::function<std::shared_ptr<nc::nn::Sequential>(uint64_t, nc::Device)>& make,
                                  bool images) {
  const nc::Device gpu = nc::Device::cuda(0);
  // The inputs of shard() as 4 images of 1 x 8 x 8 for the CNN (its first 6 values, padded).
  auto input = [images](const nc::Tensor& x, nc::Device device) {
    nc::Tensor f = x.to(nc::DType::F32);
    if (images) f = nc::cat({f, f, f, f, f, f, f, f, f, f, f}, 1).narrow(1, 0, 64).reshape({-1, 1, 8, 8});
    return f.to(device);
  };
  auto reference = make(1, gpu);
  nc::optim::SGD sgd(reference->parameters(), nc::optim::SGDOptions{0.1, 0.9});
  for (int s = 0; s < 3; ++s) {
    auto [x0, y0] = shard(s, 0);
    auto [x1, y1] = shard(s, 1);
    sgd.zero_grad();
    nc::mse_loss((*reference)(input(nc::cat({x0, x1}), gpu)), nc::cat({y0, y1}).to(nc::DType::F32).to(gpu)).backward();
    sgd.step();
  }
  std::vector<std::vector<nc::Tensor>> trained(2);
  run_ranks(
      2,
      [&](nd::ProcessGroup& g) {
        const nc::Device mine = nc::Device::cuda(g.rank());
        auto model = make(g.rank() == 0 ? 1 : 77, mine);
        nd::DistributedDataParallel ddp(model, g, nd::DataParallelOptions{600, 300});
        nc::optim::SGD opt(model->parameters(), nc::optim::SGDOptions{0.1, 0.9});
        for (int s = 0; s < 3; ++s) {
          auto [x, y] = shard(s, g.rank());
          opt.zero_grad();
          nc::mse_loss(ddp(input(x, mine)), y.to(nc::DType::F32).to(mine)).backward();
          opt.step();
        }
        for (const nc::Tensor& p : model->parameters())
          trained[static_cast<size_t>(g.rank())].push_back(p.to(nc::Device::cpu()));
      },
      milliseconds(60000), true);
  std::vector<nc::Tensor> expected;
  for (const nc::Tensor& p : reference->parameters()) expected.push_back(p.to(nc::Device::cpu()));
  EXPECT_EQ(max_difference(trained[0], trained[1]), 0.0);
  EXPECT_LT(max_difference(trained[0], expected), 1e-5);
  EXPECT_GT(max_difference(expected,
                           [&] {
                             std::vector<nc::Tensor> initial;
                             for (const nc::Tensor& p : make(1, gpu)->parameters())
                               initial.push_back(p.to(nc::Device::cpu()));
                             return initial;
                           }()),
            1e-3);  // it trained
}

TEST(DistributedCuda, TwoGpusWithBatchBTrainAsOneWithBatch2B) {
  if (nc::cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  expect_two_gpus_train_as_one(mlp_on, false);
  expect_two_gpus_train_as_one(cnn_on, true);
}

TEST(DistributedCuda, APeerThatNeverComesIsATimeout) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  auto server = std::make_shared<nd::TcpStore>("127.0.0.1", 0, 2, true, milliseconds(500));
  const auto start = std::chrono::steady_clock::now();
  throws<nc::DistributedError>(
      [&] { nd::ProcessGroup(server, 0, 2, nc::Device::cuda(0), nd::ProcessGroupOptions{milliseconds(500)}); },
      {"within 500 ms"})();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

// Needs two GPUs: rank 1 skips an all-reduce; rank 0's waits until the timeout, then the
// communicator is aborted and the collective named.
TEST(DistributedCuda, ACollectiveAPeerSkipsFailsWithinTheTimeout) {
  if (nc::cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  std::atomic<int> named{0};
  run_ranks(
      2,
      [&](nd::ProcessGroup& g) {
        nc::Tensor t = nc::ones({1024}, nc::Device::cuda(g.rank()));
        g.all_reduce(t);  // both ranks: fine
        g.barrier();
        if (g.rank() == 1) return;
        const auto start = std::chrono::steady_clock::now();
        try {
          g.all_reduce_async(t).synchronize();
          ADD_FAILURE() << "no error from an all_reduce rank 1 never joined";
        } catch (const nc::DistributedError& e) {
          const std::string message = e.what();
          EXPECT_NE(message.find("all_reduce (rank 0 of 2)"), std::string::npos) << message;
          EXPECT_NE(message.find("did not finish within 2000 ms"), std::string::npos) << message;
          ++named;
        }
        EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
        throws<nc::DistributedError>([&] { g.barrier(); }, {"all_reduce (rank 0 of 2)"})();  // the failure stays
      },
      milliseconds(2000), true);
  EXPECT_EQ(named.load(), 1);
}
