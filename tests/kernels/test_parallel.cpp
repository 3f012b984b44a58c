// The CPU thread pool: every range runs once, nested and concurrent regions, errors; and the
// CPU kernels give the same bits at 1, 2, 3 and 4 threads (forward and backward of matmul,
// convolution, the norms, pooling, reductions, element-wise ops and the optimizers).
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/parallel.h"
#include "normcore/normcore.h"

namespace nc = normcore;
using nc::Tensor;

namespace {

// Restores the thread count a test changes.
class Parallel : public ::testing::Test {
 protected:
  void TearDown() override { nc::set_num_threads(saved_); }
  int saved_ = nc::num_threads();
};

TEST_F(Parallel, EveryRangeRunsOnceAtAnyThreadCount) {
  for (int threads : {1, 2, 3, 8}) {
    nc::set_num_threads(threads);
    EXPECT_EQ(nc::num_threads(), threads);
    for (int64_t n : {0, 1, 7, 64, 1000, 4097}) {
      for (int64_t grain : {1, 3, 64, 5000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<int64_t> ranges{0};
        nc::cpu::parallel_for(n, grain, [&](int64_t begin, int64_t end) {
          // Ranges are cut every grain from 0.
          EXPECT_EQ(begin % grain, 0);
          EXPECT_EQ(end, std::min(begin + grain, n));
          for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)]++;
          ranges++;
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << n << " " << grain;
        EXPECT_EQ(ranges.load(), nc::cpu::range_count(n, grain));
      }
    }
  }
}

TEST_F(Parallel, NestedRegionsRunInlineAndCoverEverything) {
  nc::set_num_threads(4);
  std::atomic<int64_t> total{0};
  nc::cpu::parallel_for(16, 1, [&](int64_t, int64_t) {
    nc::cpu::parallel_for(100, 7, [&](int64_t begin, int64_t end) { total += end - begin; });
  });
  EXPECT_EQ(total.load(), 1600);
}

// Idle workers spin a while for the next region, then sleep: regions that come at once, after
// a pause longer than the spin (the workers asleep) and with the thread count changed while
// the workers spin all run every range once, with the workers taking part.
TEST_F(Parallel, RegionsRightAfterEachOtherAndAfterTheWorkersSleep) {
  for (int threads : {2, 3, 2}) {
    nc::set_num_threads(threads);  // stops the spinning workers of the last count
    for (int pause_ms : {0, 0, 5, 0, 20}) {
      std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
      std::vector<std::atomic<int>> hits(64);
      std::atomic<int> workers{0};
      const std::thread::id caller = std::this_thread::get_id();
      nc::cpu::parallel_for(64, 1, [&](int64_t begin, int64_t end) {
        if (std::this_thread::get_id() != caller) workers++;
        std::this_thread::sleep_for(std::chrono::microseconds(300));  // long enough for a worker to join
        for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)]++;
      });
      for (const std::atomic<int>& h : hits) ASSERT_EQ(h.load(), 1) << threads << " " << pause_ms;
      EXPECT_GT(workers.load(), 0) << threads << " " << pause_ms;
    }
  }
}

TEST_F(Parallel, AnErrorInARangeReachesTheCallerAndThePoolGoesOn) {
  nc::set_num_threads(3);
  EXPECT_THROW(nc::cpu::parallel_for(100, 1,
                                     [&](int64_t begin, int64_t) {
                                       if (begin == 57) throw nc::ValueError("range 57");
                                     }),
               nc::ValueError);
  std::atomic<int64_t> total{0};
  nc::cpu::parallel_for(100, 1, [&](int64_t begin, int64_t end) { total += end - begin; });
  EXPECT_EQ(total.load(), 100);
}

TEST_F(Parallel, ThreadCountOutsideItsRangeIsAValueError) {
  EXPECT_THROW(nc::set_num_threads(0), nc::ValueError);
  EXPECT_THROW(nc::set_num_threads(-3), nc::ValueError);
  EXPECT_THROW(nc::set_num_threads(5000), nc::ValueError);
  EXPECT_EQ(nc::num_threads(), saved_);
}

TEST_F(Parallel, RegionsFromManyApplicationThreadsAtOnce) {
  nc::set_num_threads(2);
  std::vector<int64_t> sums(6, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 50; ++k) {
        std::atomic<int64_t> sum{0};
        nc::cpu::parallel_for(1000, 10, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) sum += i;
        });
        sums[static_cast<size_t>(t)] += sum.load();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int64_t s : sums) EXPECT_EQ(s, 50 * 999 * 1000 / 2);
}

// Everything one training step of a small conv net and a transformer-ish MLP computes,
// flattened: outputs, input and parameter gradients, and the parameters after Adam and SGD.
std::vector<std::vector<float>> kernel_results() {
  nc::Generator gen(11);
  std::vector<std::vector<float>> out;
  auto keep = [&](const Tensor& t) { out.push_back(t.to(nc::DType::F32).contiguous().to_vector<float>()); };

  // Convolution, batch norm, ReLU, max pooling, group norm, average pooling.
  Tensor x = nc::randn({16, 8, 20, 20}, {}, &gen).requires_grad_();
  Tensor w = (nc::randn({24, 8, 3, 3}, {}, &gen) * 0.2).requires_grad_();
  Tensor b = nc::randn({24}, {}, &gen).requires_grad_();
  Tensor gamma = nc::rand({24}, {}, &gen).requires_grad_();
  Tensor beta = nc::randn({24}, {}, &gen).requires_grad_();
  Tensor y = nc::conv2d(x, w, b, 1, 1);
  y = nc::batch_norm(y, Tensor(), Tensor(), gamma, beta, true);
  y = nc::relu(nc::max_pool2d(y, 2));
  y = nc::group_norm(y, 6, gamma, beta);
  y = nc::avg_pool2d(y, 2);
  keep(y);
  nc::sum(y * y).backward();
  for (const Tensor& t : {x, w, b, gamma, beta}) keep(t.grad());

  // Matmuls cut by rows and by columns, layer norm with many rows, RMS norm, dropout,
  // reductions.
  Tensor a = nc::randn({300, 200}, {}, &gen).requires_grad_();
  Tensor m1 = nc::randn({200, 700}, {}, &gen).requires_grad_();
  Tensor m2 = nc::randn({700, 90}, {}, &gen).requires_grad_();
  Tensor lw = nc::rand({700}, {}, &gen).requires_grad_();
  Tensor lb = nc::randn({700}, {}, &gen).requires_grad_();
  Tensor h = nc::layer_norm(nc::matmul(a, m1), {700}, lw, lb);
  h = nc::rms_norm(nc::gelu(h), {700}, lw);
  h = nc::dropout(h, 0.3, true, &gen);  // masks drawn in ranges; backward scales by them
  Tensor z = nc::matmul(h, m2);
  keep(z);
  keep(nc::sum(z, {1}));
  keep(nc::mean(z, {0}));
  keep(nc::var(z, {1}));
  keep(nc::max(z, 1).second.to(nc::DType::F32));
  nc::cross_entropy(z, nc::randint(0, 90, {300}, {}, &gen)).backward();
  for (const Tensor& t : {a, m1, m2, lw, lb}) keep(t.grad());

  // Optimizer steps on every parameter.
  nc::optim::Adam adam({x, w, b, gamma, beta});
  adam.step();
  nc::optim::SGDOptions sgd_options;
  sgd_options.lr = 0.1;
  sgd_options.momentum = 0.9;
  nc::optim::SGD sgd({a, m1, m2, lw, lb}, sgd_options);
  sgd.step();
  for (const Tensor& t : {x, w, b, gamma, beta, a, m1, m2, lw, lb}) keep(t.detach());
  return out;
}

TEST_F(Parallel, CpuKernelsGiveTheSameBitsAtAnyThreadCount) {
  nc::set_num_threads(1);
  const auto expected = kernel_results();
  ASSERT_GT(expected.size(), 20u);
  for (int threads : {2, 3, 4}) {
    nc::set_num_threads(threads);
    const auto got = kernel_results();
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected[i]) << "result " << i << " at " << threads;
  }
}

}  // namespace
