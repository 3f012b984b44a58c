// What the data-parallel tests share: ranks of a job on threads over the store backend, a
// small f64 MLP, its batches, and the largest difference between two lists of tensors.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "normcore/distributed.h"
#include "normcore/normcore.h"

namespace normcore_test {

namespace nc = normcore;
namespace nd = normcore::distributed;

// Runs fn as ranks 0 .. world - 1 of a job on threads, each with its own store client and
// process group (the store backend), and rethrows the first rank's failure.
// With cuda, rank r works on cuda:r through NCCL.
inline void run_ranks(int world, const std::function<void(nd::ProcessGroup&)>& fn,
                      std::chrono::milliseconds timeout = std::chrono::milliseconds(20000), bool cuda = false) {
  auto server = std::make_shared<nd::TcpStore>("127.0.0.1", 0, world, true, timeout);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto store =
            r == 0 ? server : std::make_shared<nd::TcpStore>("127.0.0.1", server->port(), world, false, timeout);
        nd::ProcessGroup group(store, r, world, cuda ? nc::Device::cuda(r) : nc::Device::cpu(),
                               nd::ProcessGroupOptions{timeout});
        fn(group);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

inline std::vector<double> values_of(const nc::Tensor& t) {
  return t.to(nc::Device::cpu()).to(nc::DType::F64).contiguous().to_vector<double>();
}

inline std::shared_ptr<nc::nn::Sequential> small_mlp(uint64_t seed) {
  nc::Generator gen(seed);
  auto model = std::make_shared<nc::nn::Sequential>(std::vector<std::shared_ptr<nc::nn::Module>>{
      std::make_shared<nc::nn::Linear>(6, 16, true, &gen), std::make_shared<nc::nn::ReLU>(),
      std::make_shared<nc::nn::Linear>(16, 16, true, &gen), std::make_shared<nc::nn::ReLU>(),
      std::make_shared<nc::nn::Linear>(16, 4, true, &gen)});
  model->to(nc::DType::F64);
  return model;
}

// The batch of step s for rank r: 4 rows.
inline std::pair<nc::Tensor, nc::Tensor> shard(int step, int r) {
  nc::Generator gen(1000 + 10 * step + r);
  return {nc::randn({4, 6}, nc::DType::F64, &gen), nc::randn({4, 4}, nc::DType::F64, &gen)};
}

inline double max_difference(const std::vector<nc::Tensor>& a, const std::vector<nc::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const std::vector<double> x = values_of(a[i]), y = values_of(b[i]);
    for (size_t k = 0; k < x.size(); ++k) worst = std::max(worst, std::abs(x[k] - y[k]));
  }
  return worst;
}

}  // namespace normcore_test
