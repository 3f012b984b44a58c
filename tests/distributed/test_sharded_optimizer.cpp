// ShardedOptimizer (ZeRO stage 1) on the CPU over the store backend: the parameters cut into
// even pieces; training the same, bit for bit, as data parallelism with the whole state on
// every rank (AdamW with weight decay); the optimizer passed in holding no state; the whole
// state_dict put together on every rank, equal to the unsharded one, and loadable at another
// world size; ranks with other parameters refused, optimizers that cannot be cut refused;
// parameters of several dtypes gathered to every rank.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "normcore/distributed.h"
#include "normcore/losses.h"
#include "normcore/normcore.h"
#include "normcore/optim.h"
#include "tests/distributed/ranks.h"
#include "tests/test_support.h"

namespace nc = normcore;
namespace nd = normcore::distributed;
using normcore_test::max_difference;
using normcore_test::run_ranks;
using normcore_test::shard;
using normcore_test::small_mlp;

namespace {

constexpr int kSteps = 4;

std::unique_ptr<nc::optim::Optimizer> adamw(const std::vector<nc::Tensor>& params) {
  nc::optim::AdamWOptions o;
  o.lr = 0.01;
  o.weight_decay = 0.1;
  return std::make_unique<nc::optim::AdamW>(params, o);
}

// kSteps of data-parallel training of small_mlp(1) on world ranks, with the optimizer's state
// sharded or whole; per rank, the parameters and the optimizer's whole state_dict after
// them (put together by the sharded optimizer), the parameter indices the optimizer passed
// in holds state for, and the elements the rank updates.
struct RankResult {
  std::vector<nc::Tensor> params;
  nc::optim::StateDict state;
  std::set<int64_t> indices_with_state;
  int64_t elements = 0;
};

std::vector<RankResult> train(int world, bool sharded) {
  std::vector<RankResult> results(static_cast<size_t>(world));
  run_ranks(world, [&](nd::ProcessGroup& g) {
    auto model = small_mlp(1);
    nd::DistributedDataParallel ddp(model, g);
    auto opt = adamw(model->parameters());
    std::unique_ptr<nd::ShardedOptimizer> shards = sharded ? std::make_unique<nd::ShardedOptimizer>(*opt, g) : nullptr;
    for (int s = 0; s < kSteps; ++s) {
      auto [x, y] = shard(s, g.rank());
      opt->zero_grad();
      nc::mse_loss(ddp(x), y).backward();
      if (shards) shards->step();
      else opt->step();
    }
    RankResult& r = results[static_cast<size_t>(g.rank())];
    r.params = model->parameters();
    for (const auto& [key, value] : opt->state_dict())
      if (key.rfind("state.", 0) == 0) r.indices_with_state.insert(std::stoll(key.substr(6)));
    r.state = shards ? shards->state_dict() : opt->state_dict();
    r.elements = shards ? shards->elements() : 0;
  });
  return results;
}

double state_difference(const nc::optim::StateDict& a, const nc::optim::StateDict& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second.shape(), b[i].second.shape()) << a[i].first;
    if (a[i].second.shape() == b[i].second.shape())
      worst = std::max(worst, max_difference({a[i].second}, {b[i].second}));
  }
  return worst;
}

// An optimizer of the caller's whose update is not known to go element by element.
class Whole final : public nc::optim::Optimizer {
 public:
  explicit Whole(std::vector<nc::Tensor> params) : Optimizer("Whole", std::move(params), 0.1) {}
  void step() override {}

 protected:
  std::vector<std::pair<std::string, double>> hyperparameters() const override { return {}; }
  void check_hyperparameters(const std::map<std::string, double>&) const override {}
  void set_hyperparameters(const std::map<std::string, double>&) override {}
  std::vector<std::string> state_names() const override { return {}; }
};

}  // namespace

TEST(ShardedOptimizer, TrainsAsTheWholeStateAndPutsItTogether) {
  const std::vector<RankResult> whole = train(2, false);
  const std::vector<RankResult> sharded = train(2, true);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    // Bit for bit: the same parameters and the same whole state on every rank.
    EXPECT_EQ(max_difference(sharded[static_cast<size_t>(r)].params, whole[0].params), 0.0);
    EXPECT_EQ(state_difference(sharded[static_cast<size_t>(r)].state, whole[0].state), 0.0);
  }
  // Unsharded, each rank's optimizer holds state for every parameter; sharded, the optimizer
  // passed in holds none, and the 452 elements (weights of 96, 256 and 64, biases of 16, 16
  // and 4) are cut in two halves, the second weight across both.
  EXPECT_EQ(whole[0].indices_with_state, (std::set<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(sharded[0].indices_with_state.empty());
  EXPECT_TRUE(sharded[1].indices_with_state.empty());
  EXPECT_EQ(sharded[0].elements, 226);
  EXPECT_EQ(sharded[1].elements, 226);
  EXPECT_GT(max_difference(small_mlp(1)->parameters(), whole[0].params), 1e-3);  // it trained
}

// N ranks with batch B, the state sharded, train as one process with batch N B (f64: the
// gradients' sums differ in order only).
TEST(ShardedOptimizer, TwoRanksWithBatchBTrainAsOneWithBatch2B) {
  auto reference = small_mlp(1);
  auto plain = adamw(reference->parameters());
  for (int s = 0; s < kSteps; ++s) {
    auto [x0, y0] = shard(s, 0);
    auto [x1, y1] = shard(s, 1);
    plain->zero_grad();
    nc::mse_loss((*reference)(nc::cat({x0, x1})), nc::cat({y0, y1})).backward();
    plain->step();
  }
  const std::vector<RankResult> sharded = train(2, true);
  EXPECT_LT(max_difference(sharded[0].params, reference->parameters()), 1e-12);
  EXPECT_LT(state_difference(sharded[0].state, plain->state_dict()), 1e-12);
}

// A state_dict put together on 3 ranks loads on 2 (each keeping its share) and on 1 (a plain
// optimizer), and training goes on there as it would have with the whole state.
TEST(ShardedOptimizer, StateLoadsAtAnotherWorldSize) {
  const std::vector<RankResult> three = train(3, true);
  EXPECT_EQ(three[0].elements + three[1].elements + three[2].elements, 452);
  EXPECT_EQ(three[2].elements, 150);  // 151, 151 and the rest
  const nc::optim::StateDict& saved = three[0].state;
  // Two more steps, sharded over 2 ranks, from the saved parameters and state.
  auto continue_on = [&](int world) {
    std::vector<RankResult> out(static_cast<size_t>(world));
    run_ranks(world, [&](nd::ProcessGroup& g) {
      auto model = small_mlp(1);
      const std::vector<nc::Tensor> params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i) params[i].detach().copy_(three[0].params[i]);
      nd::DistributedDataParallel ddp(model, g);
      auto opt = adamw(params);
      nd::ShardedOptimizer shards(*opt, g);
      shards.load_state_dict(saved);
      for (int s = kSteps; s < kSteps + 2; ++s) {
        // The same 12 rows a step whatever the world size: rank r of w takes its part.
        std::vector<nc::Tensor> xs, ys;
        for (int k = 0; k < 3; ++k) {
          auto [x, y] = shard(s, k);
          xs.push_back(x), ys.push_back(y);
        }
        const int64_t rows = 12 / world;
        const nc::Tensor x = nc::cat(xs, 0).narrow(0, g.rank() * rows, rows);
        const nc::Tensor y = nc::cat(ys, 0).narrow(0, g.rank() * rows, rows);
        opt->zero_grad();
        nc::mse_loss(ddp(x), y).backward();
        shards.step();
      }
      out[static_cast<size_t>(g.rank())].params = model->parameters();
      out[static_cast<size_t>(g.rank())].state = shards.state_dict();
    });
    return out;
  };
  const std::vector<RankResult> two = continue_on(2), one = continue_on(1);
  EXPECT_LT(max_difference(two[0].params, one[0].params), 1e-12);  // f64; the sums' order differs
  EXPECT_LT(state_difference(two[1].state, one[0].state), 1e-12);
  EXPECT_GT(max_difference(two[0].params, three[0].params), 1e-4);  // it went on training
}

TEST(ShardedOptimizer, BadStateAndOptimizersThatCannotBeCutAreRefused) {
  run_ranks(1, [](nd::ProcessGroup& g) {
    auto model = small_mlp(1);
    auto opt = adamw(model->parameters());
    nd::ShardedOptimizer shards(*opt, g);
    nc::optim::StateDict state = shards.state_dict();
    state.emplace_back("state.9.exp_avg", nc::zeros({3}));
    normcore_test::throws<nc::ValueError>([&] { shards.load_state_dict(state); },
                                          {"ShardedOptimizer.load_state_dict", "state.9.exp_avg", "6 parameters"})();
    state.back() = {"state.0.exp_avg", nc::zeros({3})};
    normcore_test::throws<nc::ShapeError>([&] { shards.load_state_dict(state); },
                                          {"ShardedOptimizer.load_state_dict", "state.0.exp_avg", "[16, 6]"})();
    Whole whole(model->parameters());
    normcore_test::throws<nc::ValueError>([&] { nd::ShardedOptimizer cut(whole, g); }, {"Whole", "cannot be cut"})();
  });
}

TEST(ShardedOptimizer, RanksWithOtherParametersAreRefused) {
  EXPECT_THROW(run_ranks(2,
                         [](nd::ProcessGroup& g) {
                           auto model = small_mlp(1);
                           std::vector<nc::Tensor> params = model->parameters();
                           if (g.rank() == 1) params.pop_back();
                           auto opt = adamw(params);
                           nd::ShardedOptimizer shards(*opt, g);
                         }),
               nc::ValueError);
}

// On a GPU over NCCL (one rank: the collectives run, the piece is everything): the sharded
// step gives the plain step's parameters bit for bit, and the state put together is the
// plain optimizer's.
TEST(ShardedOptimizer, OneRankOnCudaStepsAsThePlainOptimizer) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const nc::Device gpu = nc::Device::cuda(0);
  run_ranks(
      1,
      [&](nd::ProcessGroup& g) {
        auto plain = small_mlp(1), sharded = small_mlp(1);
        plain->to(gpu);
        sharded->to(gpu);
        auto a = adamw(plain->parameters()), b = adamw(sharded->parameters());
        nd::ShardedOptimizer shards(*b, g);
        EXPECT_EQ(shards.elements(), 452);
        for (int s = 0; s < kSteps; ++s) {
          auto [x, y] = shard(s, 0);
          x = x.to(gpu), y = y.to(gpu);
          a->zero_grad();
          nc::mse_loss((*plain)(x), y).backward();
          a->step();
          b->zero_grad();
          nc::mse_loss((*sharded)(x), y).backward();
          shards.step();
        }
        EXPECT_EQ(max_difference(plain->parameters(), sharded->parameters()), 0.0);
        EXPECT_EQ(state_difference(shards.state_dict(), a->state_dict()), 0.0);
      },
      std::chrono::milliseconds(60000), /*cuda=*/true);
}

// Parameters of two dtypes cut over three ranks so that each dtype lives on some ranks only
// (f32 on rank 0, f64 on ranks 1 and 2): the all-gather of each dtype pads the ranks without
// it, and every rank ends with the plain optimizer's parameters.
TEST(ShardedOptimizer, DTypesOnSomeRanksOnlyAreGatheredToAll) {
  auto make = [] {
    nc::Generator gen(5);
    std::vector<nc::Tensor> params = {nc::randn({10}, nc::DType::F32, &gen), nc::randn({4, 5}, nc::DType::F64, &gen)};
    for (nc::Tensor& p : params) p.requires_grad_(true);
    return params;
  };
  auto set_grads = [](const std::vector<nc::Tensor>& params) {
    for (const nc::Tensor& p : params) p.set_grad(nc::mul(nc::ones_like(p), 0.5));
  };
  const std::vector<nc::Tensor> expected = make();
  nc::optim::SGD plain(expected, nc::optim::SGDOptions{0.1, 0.9});
  for (int s = 0; s < 2; ++s) {
    set_grads(expected);
    plain.step();
  }
  std::vector<std::vector<nc::Tensor>> got(3);
  run_ranks(3, [&](nd::ProcessGroup& g) {
    const std::vector<nc::Tensor> params = make();
    nc::optim::SGD opt(params, nc::optim::SGDOptions{0.1, 0.9});
    nd::ShardedOptimizer shards(opt, g);
    EXPECT_EQ(shards.elements(), 10);
    for (int s = 0; s < 2; ++s) {
      set_grads(params);
      shards.step();
    }
    got[static_cast<size_t>(g.rank())] = params;
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(max_difference(got[static_cast<size_t>(r)], expected), 0.0) << "rank " << r;
}
