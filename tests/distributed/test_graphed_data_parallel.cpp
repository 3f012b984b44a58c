// Data-parallel steps captured in CUDA graphs (NCCL on the GPUs there are): a GraphedStep
// over DistributedDataParallel's bucketed all-reduces, gradient clipping and AdamW, whole or
// sharded (ZeRO stage 1), with the learning rate changed before every step, trains exactly
// as the same steps run directly; and what the graphs rely on, checked on the CPU: the
// pieces of a sharded optimizer follow the learning rate set on the one they were cut from,
// and grad() after a data-parallel backward is the average, kept until the next backward;
// gradients averaged in bf16 are the bf16 roundings of the average.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "normcore/cuda.h"
#include "normcore/distributed.h"
#include "normcore/graphed_step.h"
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
using normcore_test::values_of;

namespace {

constexpr int kSteps = 7;  // two warm-up steps, a capture, four replays

double lr_of_step(int s) { return 0.02 / (1.0 + s); }

struct GpuRun {
  std::vector<nc::Tensor> params;  // rank 0's, on the CPU
  std::vector<double> losses;      // rank 0's
  bool captured = false;
};

// kSteps of data-parallel training of small_mlp(1) in f32 on cuda:0 .. cuda:world-1 (4 rows
// a rank, rows of other steps' batches), AdamW with weight decay, clipped at a norm of 0.5, through a GraphedStep
// (graphed) or directly, the optimizer's state whole or sharded, the gradients averaged in
// f32 or (reduce_bf16) in bf16.
GpuRun train_on_gpus(int world, bool graphed, bool sharded, bool reduce_bf16 = false) {
  GpuRun out;
  run_ranks(
      world,
      [&](nd::ProcessGroup& g) {
        const nc::Device gpu = nc::Device::cuda(g.rank());
        auto model = small_mlp(1);
        model->to(nc::DType::F32);
        model->to(gpu);
        nd::DataParallelOptions ddp_options{600, 300};
        if (reduce_bf16) ddp_options.reduce_dtype = nc::DType::BF16;
        nd::DistributedDataParallel ddp(model, g, ddp_options);
        const std::vector<nc::Tensor> params = model->parameters();
        nc::optim::AdamWOptions o;
        o.lr = lr_of_step(0);
        o.weight_decay = 0.1;
        nc::optim::AdamW opt(params, o);
        std::unique_ptr<nd::ShardedOptimizer> shards =
            sharded ? std::make_unique<nd::ShardedOptimizer>(opt, g) : nullptr;
        nc::GraphedStep step(
            [&](const std::vector<nc::Tensor>& in) {
              nc::Tensor loss = nc::mse_loss(ddp(in[0]), in[1]);
              opt.zero_grad();
              loss.backward();
              nc::optim::clip_grad_norm_async(params, 0.5);
              if (shards) shards->step();
              else opt.step();
              return loss;
            },
            graphed);
        std::vector<double> losses;
        for (int s = 0; s < kSteps; ++s) {
          opt.set_lr(lr_of_step(s));  // between steps, as a schedule does
          auto [x, y] = shard(s, g.rank());
          const nc::Tensor loss = step({x.to(nc::DType::F32).to(gpu), y.to(nc::DType::F32).to(gpu)});
          g.watch("a test step");
          losses.push_back(loss.item<double>());
        }
        if (g.rank() != 0) return;
        for (const nc::Tensor& p : params) out.params.push_back(p.to(nc::Device::cpu()));
        out.losses = losses;
        out.captured = step.captured();
      },
      std::chrono::milliseconds(60000), /*cuda=*/true);
  return out;
}

}  // namespace

// One rank: the ranks of these tests are threads of one process, and a capture's end frees
// the allocator's cached blocks (cudaFree), which waits for the other GPU's work too, so a
// second rank's thread would wait there for the first's replayed all-reduce, which waits
// for it. Ranks in processes of their own (normcore launch) are checked by
// bench/gpu_check.sh's gpt2dp section: graphed, direct and sharded checkpoints compared.
TEST(DistributedCuda, GraphedDataParallelStepsTrainAsDirectSteps) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  std::vector<nc::Tensor> initial;
  for (const nc::Tensor& p : small_mlp(1)->parameters()) initial.push_back(p.to(nc::DType::F32));
  for (bool sharded : {false, true}) {
    SCOPED_TRACE(sharded ? "sharded" : "whole state");
    const GpuRun direct = train_on_gpus(1, false, sharded), graphed = train_on_gpus(1, true, sharded);
    EXPECT_FALSE(direct.captured);
    EXPECT_TRUE(graphed.captured);
    EXPECT_EQ(graphed.losses, direct.losses);
    EXPECT_EQ(max_difference(graphed.params, direct.params), 0.0);
    EXPECT_GT(max_difference(direct.params, initial), 1e-3);  // it trained
  }
  // Averaged in bf16: graphed as direct too, and not the f32 averages' training.
  const GpuRun direct = train_on_gpus(1, false, false, true), graphed = train_on_gpus(1, true, false, true);
  EXPECT_TRUE(graphed.captured);
  EXPECT_EQ(graphed.losses, direct.losses);
  EXPECT_EQ(max_difference(graphed.params, direct.params), 0.0);
  EXPECT_GT(max_difference(direct.params, train_on_gpus(1, false, false).params), 0.0);
}

// The pieces a sharded optimizer updates are made by make_like and share the learning rate
// with the optimizer they were cut from, either way round.
TEST(ShardedOptimizer, PiecesShareTheLearningRate) {
  auto model = small_mlp(1);
  nc::optim::AdamW whole(model->parameters(), nc::optim::AdamWOptions{0.01});
  std::unique_ptr<nc::optim::Optimizer> piece = whole.make_like({model->parameters()[0]});
  whole.set_lr(0.25);
  EXPECT_EQ(piece->lr(), 0.25);
  piece->set_lr(0.125);
  EXPECT_EQ(whole.lr(), 0.125);
  nc::optim::SGD sgd(model->parameters(), nc::optim::SGDOptions{0.1});
  std::unique_ptr<nc::optim::Optimizer> sgd_piece = sgd.make_like({model->parameters()[1]});
  sgd.set_lr(0.5);
  EXPECT_EQ(sgd_piece->lr(), 0.5);
  // And the update uses it: SGD without momentum moves by -lr * grad.
  const nc::Tensor p = model->parameters()[1];
  const std::vector<double> before = normcore_test::values_of(p);
  p.set_grad(nc::ones_like(p));
  sgd_piece->step();
  const std::vector<double> after = normcore_test::values_of(p);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(after[i], before[i] - 0.5);
}

// Two sharded ranks whose learning rate changes every step (set on the optimizer passed in,
// never through the ShardedOptimizer) train as two ranks with the whole state.
TEST(ShardedOptimizer, FollowsALearningRateSetBetweenSteps) {
  std::vector<std::vector<std::vector<nc::Tensor>>> params(2, std::vector<std::vector<nc::Tensor>>(2));
  for (int sharded = 0; sharded < 2; ++sharded) {
    run_ranks(2, [&](nd::ProcessGroup& g) {
      auto model = small_mlp(1);
      nd::DistributedDataParallel ddp(model, g);
      nc::optim::SGD opt(model->parameters(), nc::optim::SGDOptions{0.1, 0.9});
      std::unique_ptr<nd::ShardedOptimizer> shards = sharded ? std::make_unique<nd::ShardedOptimizer>(opt, g) : nullptr;
      for (int s = 0; s < 4; ++s) {
        opt.set_lr(lr_of_step(s));
        auto [x, y] = shard(s, g.rank());
        opt.zero_grad();
        nc::mse_loss(ddp(x), y).backward();
        if (shards) shards->step();
        else opt.step();
      }
      params[static_cast<size_t>(sharded)][static_cast<size_t>(g.rank())] = model->parameters();
    });
  }
  EXPECT_EQ(max_difference(params[1][0], params[0][0]), 0.0);
  EXPECT_EQ(max_difference(params[1][1], params[0][0]), 0.0);
}

// After a data-parallel backward grad() holds the average (a view of the bucket's buffer, no
// copy back); a parameter that gets no gradient in the next backward, with no zero_grad in
// between, keeps that average, as it did when the averages were copied back.
TEST(DataParallel, GradientsAreTheAveragesAndStayUntilTheNextBackward) {
  std::vector<std::vector<nc::Tensor>> first(2), second(2);
  run_ranks(2, [&](nd::ProcessGroup& g) {
    auto model = small_mlp(1);
    nd::DistributedDataParallel ddp(model, g, nd::DataParallelOptions{600, 300});
    auto [x, y] = shard(0, g.rank());
    nc::mse_loss(ddp(x), y).backward();
    for (const nc::Tensor& p : model->parameters()) first[static_cast<size_t>(g.rank())].push_back(p.grad().clone());
    // A backward reaching the last layer alone: the first layers get no gradient.
    const std::vector<nc::Tensor> params = model->parameters();
    nc::Tensor last_only = nc::sum(nc::mul(params.back(), params.back()));
    last_only.backward();
    for (const nc::Tensor& p : params) second[static_cast<size_t>(g.rank())].push_back(p.grad().clone());
  });
  EXPECT_EQ(max_difference(first[0], first[1]), 0.0);
  EXPECT_EQ(max_difference(second[0], second[1]), 0.0);
  // The first layers kept the first averages; the last bias got 2 * bias added.
  for (size_t i = 0; i + 1 < first[0].size(); ++i) EXPECT_EQ(max_difference({second[0][i]}, {first[0][i]}), 0.0) << i;
  EXPECT_GT(max_difference({second[0].back()}, {first[0].back()}), 0.0);
}

// reduce_dtype BF16: each rank's f64 gradients go into a bf16 buffer, the average is taken
// there and comes back as f64: the same on every rank, every value a bf16 one, within bf16's
// rounding of the f64 average. A dtype that is not floating is refused.
TEST(DataParallel, GradientsAveragedInBf16AreRoundingsOfTheAverage) {
  std::vector<std::vector<nc::Tensor>> exact(2), rounded(2);
  for (bool bf16 : {false, true}) {
    run_ranks(2, [&](nd::ProcessGroup& g) {
      auto model = small_mlp(1);
      nd::DataParallelOptions options{600, 300};
      if (bf16) options.reduce_dtype = nc::DType::BF16;
      nd::DistributedDataParallel ddp(model, g, options);
      auto [x, y] = shard(0, g.rank());
      nc::mse_loss(ddp(x), y).backward();
      for (const nc::Tensor& p : model->parameters())
        (bf16 ? rounded : exact)[static_cast<size_t>(g.rank())].push_back(p.grad().clone());
    });
  }
  EXPECT_EQ(max_difference(rounded[0], rounded[1]), 0.0);
  for (size_t i = 0; i < exact[0].size(); ++i) {
    const nc::Tensor r = rounded[0][i];
    EXPECT_EQ(r.dtype(), nc::DType::F64);
    EXPECT_EQ(max_difference({r}, {r.to(nc::DType::BF16).to(nc::DType::F64)}), 0.0) << i;
    const std::vector<double> want = values_of(exact[0][i]), got = values_of(r);
    double largest = 0;
    for (double v : want) largest = std::max(largest, std::abs(v));
    for (size_t k = 0; k < want.size(); ++k) EXPECT_LE(std::abs(got[k] - want[k]), 0x1p-5 * largest) << i << " " << k;
  }
  EXPECT_GT(max_difference(rounded[0], exact[0]), 0.0);

  run_ranks(1, [](nd::ProcessGroup& g) {
    nd::DataParallelOptions options;
    options.reduce_dtype = nc::DType::I32;
    try {
      nd::DistributedDataParallel ddp(small_mlp(1), g, options);
      ADD_FAILURE() << "an integer reduce_dtype was taken";
    } catch (const nc::DTypeError& e) {
      EXPECT_NE(std::string(e.what()).find("reduce_dtype i32"), std::string::npos) << e.what();
    }
  });
}

// Gradients are reduced where they lie; a parameter that got none this backward (after
// zero_grad) is reduced from the bucket's buffer, made then, and reads zeros on every rank.
TEST(DataParallel, ParametersWithoutAGradientGetZerosBesideTheOthersAverages) {
  std::vector<std::vector<nc::Tensor>> grads(2);
  run_ranks(2, [&](nd::ProcessGroup& g) {
    auto model = small_mlp(1);
    nd::DistributedDataParallel ddp(model, g, nd::DataParallelOptions{600, 300});
    const std::vector<nc::Tensor> params = model->parameters();
    nc::sum(nc::mul(params.back(), double(g.rank() + 1))).backward();  // the last bias alone
    for (const nc::Tensor& p : params) grads[static_cast<size_t>(g.rank())].push_back(p.grad().clone());
  });
  EXPECT_EQ(max_difference(grads[0], grads[1]), 0.0);
  for (size_t i = 0; i + 1 < grads[0].size(); ++i) {
    EXPECT_EQ(values_of(grads[0][i]), std::vector<double>(static_cast<size_t>(grads[0][i].numel()), 0.0)) << i;
  }
  EXPECT_EQ(values_of(grads[0].back()), std::vector<double>(4, 1.5));  // (1 + 2) / 2
}
