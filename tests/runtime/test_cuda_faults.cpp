// GPU faults: how CUDA failures read (the op in scope, whether the context is lost), and a
// training loop that meets OutOfMemoryError, halves its batch and carries on with nothing
// left behind by the failed attempts. Faults that lose the CUDA context (an illegal
// address) need a process of their own: tests/runtime/cuda_faults.cu.
#include <gtest/gtest.h>

#ifdef NORMCORE_HAS_CUDA

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/op_scope.h"
#include "normcore/cuda.h"
#include "normcore/losses.h"
#include "normcore/nn.h"
#include "normcore/ops.h"
#include "normcore/optim.h"
#include "normcore/random.h"
#include "normcore/tensor.h"
#include "runtime/cuda/check.h"

namespace nc = normcore;
using nc::Device;
using nc::DType;
using nc::Tensor;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// What check() throws for status inside OpScope(op, suffix) (no scope when op is null).
template <class Status>
std::string check_message(Status status, const char* op = nullptr, const char* suffix = nullptr) {
  std::unique_ptr<nc::detail::OpScope> scope;
  if (op != nullptr) scope = std::make_unique<nc::detail::OpScope>(op, suffix);
  try {
    nc::cuda::check(status, "cudaStreamSynchronize(s)", "runtime.cpp", 12);
  } catch (const nc::OutOfMemoryError& e) {
    return std::string("OutOfMemoryError: ") + e.what();
  } catch (const nc::CudaError& e) {
    return std::string("CudaError: ") + e.what();
  }
  return "no error";
}

// Messages are built from the status alone: these run without a GPU.
TEST(CudaFaults, ErrorsNameTheOpInScope) {
  EXPECT_EQ(check_message(cudaSuccess, "add"), "no error");

  const std::string lost = check_message(cudaErrorIllegalAddress, "add");
  EXPECT_TRUE(contains(lost, "CudaError: add: CUDA error cudaErrorIllegalAddress")) << lost;
  EXPECT_TRUE(contains(lost, "`cudaStreamSynchronize(s)` at runtime.cpp:12")) << lost;
  EXPECT_TRUE(contains(lost, "may belong to an earlier op")) << lost;
  EXPECT_TRUE(contains(lost, "NORMCORE_CUDA_LAUNCH_BLOCKING=1")) << lost;
  EXPECT_TRUE(contains(lost, "restart the process")) << lost;

  // Not a fault of a kernel: no word of a lost context.
  const std::string invalid = check_message(cudaErrorInvalidValue, "matmul");
  EXPECT_TRUE(contains(invalid, "CudaError: matmul: CUDA error cudaErrorInvalidValue")) << invalid;
  EXPECT_FALSE(contains(invalid, "restart")) << invalid;

  const std::string oom = check_message(cudaErrorMemoryAllocation, "relu", " backward");
  EXPECT_TRUE(contains(oom, "OutOfMemoryError: relu backward: CUDA error cudaErrorMemoryAllocation")) << oom;
  const std::string cublas_oom = check_message(CUBLAS_STATUS_ALLOC_FAILED, "matmul");
  EXPECT_TRUE(contains(cublas_oom, "OutOfMemoryError: matmul: cuBLAS error CUBLAS_STATUS_ALLOC_FAILED")) << cublas_oom;

  // Outside every scope the message starts with the failure itself.
  const std::string bare = check_message(cudaErrorMisalignedAddress);
  EXPECT_TRUE(contains(bare, "CudaError: CUDA error cudaErrorMisalignedAddress")) << bare;
  EXPECT_TRUE(contains(bare, "restart the process")) << bare;
}

TEST(CudaFaults, TheOutermostOpScopeNamesTheOp) {
  EXPECT_EQ(nc::detail::current_op(), "");
  {
    nc::detail::OpScope outer("add");
    {
      nc::detail::OpScope inner("to");  // add converting an operand
      EXPECT_EQ(nc::detail::current_op(), "add");
    }
    EXPECT_EQ(nc::detail::current_op(), "add");
  }
  EXPECT_EQ(nc::detail::current_op(), "");
  {
    nc::detail::OpScope step("AdamW", ".step");
    EXPECT_EQ(nc::detail::current_op(), "AdamW.step");
  }
  EXPECT_EQ(nc::detail::current_op(), "");
}

// ---------------------------------------------------------------- out of memory on a GPU

size_t gpu_free_bytes() {
  size_t free_bytes = 0, total_bytes = 0;
  nc::cuda::mem_get_info(0, &free_bytes, &total_bytes);
  return free_bytes;
}

// Holds all but `keep` bytes of the GPU's free memory in one tensor, so that what follows
// runs out of memory at a size the test chooses.
class Ballast {
 public:
  explicit Ballast(size_t keep) {
    nc::cuda::empty_cache();
    const size_t free_bytes = gpu_free_bytes();
    if (free_bytes > keep) {
      tensor_ = nc::empty({static_cast<int64_t>(free_bytes - keep)}, nc::TensorOptions(DType::U8, Device::cuda()));
    }
  }
  ~Ballast() {
    tensor_ = Tensor();
    nc::cuda::empty_cache();
  }

 private:
  Tensor tensor_;
};

constexpr int64_t kInputs = 256, kHidden = 4096, kClasses = 10;

std::shared_ptr<nc::nn::Sequential> make_mlp() {
  nc::Generator gen(21);
  auto model = std::make_shared<nc::nn::Sequential>();
  model->push_back(std::make_shared<nc::nn::Linear>(kInputs, kHidden, true, &gen));
  model->push_back(std::make_shared<nc::nn::ReLU>());
  model->push_back(std::make_shared<nc::nn::Linear>(kHidden, kHidden, true, &gen));
  model->push_back(std::make_shared<nc::nn::ReLU>());
  model->push_back(std::make_shared<nc::nn::Linear>(kHidden, kClasses, true, &gen));
  model->to(Device::cuda());
  return model;
}

// Samples and the labels a random linear teacher gives them, on the GPU.
struct Data {
  Tensor x, y;
};
Data make_data(int64_t n) {
  nc::Generator gen(5);
  Tensor x = nc::randn({n, kInputs}, Device::cuda(), &gen);
  Tensor teacher = nc::randn({kInputs, kClasses}, Device::cuda(), &gen);
  return {x, nc::argmax(nc::matmul(x, teacher), 1)};
}

// One training step on the first batch samples of data; returns the loss.
float train_step(nc::nn::Module& model, nc::optim::Optimizer& optimizer, const Data& data, int64_t batch) {
  optimizer.zero_grad();
  Tensor loss = nc::cross_entropy(model.forward(data.x.narrow(0, 0, batch)), data.y.narrow(0, 0, batch));
  loss.backward();
  optimizer.step();
  return loss.item<float>();
}

// Entries of the optimizer's state_dict holding per-parameter state.
size_t state_entries(const nc::optim::Optimizer& optimizer) {
  size_t n = 0;
  for (const auto& entry : optimizer.state_dict()) n += entry.first.rfind("state.", 0) == 0;
  return n;
}

nc::optim::AdamWOptions adamw(double lr) {
  nc::optim::AdamWOptions options;
  options.lr = lr;
  return options;
}

std::vector<std::vector<float>> host_parameters(const nc::nn::Module& model) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : model.parameters()) out.push_back(p.to_vector<float>());
  return out;
}

// The loop a user writes: on OutOfMemoryError, halve the batch and try the step again. The
// failed attempts must leave nothing behind: no memory, no gradient, no optimizer state, no
// half-applied update, so the run ends exactly as one that used the smaller batch from the
// start.
TEST(CudaFaults, TrainingLoopHalvesItsBatchAfterOutOfMemoryAndCarriesOn) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kSamples = 1 << 16, kSteps = 6;
  const Data data = make_data(kSamples);
  // A batch of b needs about 6 * b * kHidden * 4 bytes of activations and gradients (1.5 GB
  // for 16384 samples); 2.5 GB left free makes the first two sizes fail.
  Ballast ballast(size_t{5} << 29);
  std::printf("free memory under the ballast: %zu MiB\n", gpu_free_bytes() >> 20);

  std::vector<std::vector<float>> trained;
  int64_t batch = kSamples;
  std::vector<float> losses;
  {
    auto model = make_mlp();
    nc::optim::AdamW optimizer(model->parameters(), adamw(1e-4));
    const size_t ooms_before = nc::cuda::memory_stats(0).num_ooms;
    const size_t held_before = nc::cuda::memory_stats(0).allocated;
    int failures = 0;
    while (static_cast<int64_t>(losses.size()) < kSteps) {
      try {
        losses.push_back(train_step(*model, optimizer, data, batch));
      } catch (const nc::OutOfMemoryError& e) {
        ++failures;
        std::printf("batch %lld: %s\n", static_cast<long long>(batch), e.what());
        ASSERT_TRUE(losses.empty()) << "ran out of memory after a step of the same size had fitted";
        ASSERT_GT(batch, 1024) << "still out of memory at small batches";
        // The allocator's own message, or cuBLAS failing to get workspace.
        EXPECT_TRUE(contains(e.what(), "CUDA out of memory on cuda:0") || contains(e.what(), "ALLOC_FAILED"))
            << e.what();
        optimizer.zero_grad();
        // Everything the failed step allocated is back in the cache.
        EXPECT_EQ(nc::cuda::memory_stats(0).allocated, held_before) << "after the failure at batch " << batch;
        EXPECT_EQ(state_entries(optimizer), 0u) << "the failed step left optimizer state";
        batch /= 2;
      }
    }
    std::printf("trained %lld steps at batch %lld after %d out-of-memory errors; loss %.4f -> %.4f\n",
                static_cast<long long>(kSteps), static_cast<long long>(batch), failures, losses.front(), losses.back());
    EXPECT_GE(failures, 1);
    EXPECT_GE(nc::cuda::memory_stats(0).num_ooms, ooms_before + 1);
    EXPECT_LT(losses.back(), losses.front());
    trained = host_parameters(*model);
  }

  // The same steps from the same start at the batch the loop settled on.
  auto model = make_mlp();
  nc::optim::AdamW optimizer(model->parameters(), adamw(1e-4));
  for (int64_t step = 0; step < kSteps; ++step) {
    const float loss = train_step(*model, optimizer, data, batch);
    EXPECT_EQ(loss, losses[static_cast<size_t>(step)]) << "step " << step;
  }
  const std::vector<std::vector<float>> reference = host_parameters(*model);
  ASSERT_EQ(reference.size(), trained.size());
  for (size_t i = 0; i < reference.size(); ++i) EXPECT_TRUE(reference[i] == trained[i]) << "parameter " << i;
}

// Optimizer state is made for every parameter before any is updated: running out of memory
// while making it leaves parameters and state untouched, and the step can be retried.
TEST(CudaFaults, OutOfMemoryInTheFirstOptimizerStepChangesNothing) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  // Two parameters of 256 MB: AdamW's state for each needs 512 MB.
  constexpr int64_t kSize = int64_t{1} << 26;
  nc::Generator gen(3);
  std::vector<Tensor> params, copies;
  for (int i = 0; i < 2; ++i) {
    Tensor p = nc::randn({kSize}, Device::cuda(), &gen);
    Tensor g = nc::randn({kSize}, Device::cuda(), &gen);
    Tensor copy = p.clone();
    p.requires_grad_();
    p.set_grad(g);
    copy.requires_grad_();
    copy.set_grad(g.clone());
    params.push_back(p);
    copies.push_back(copy);
  }
  const std::vector<float> first_before = params[0].to_vector<float>();
  nc::optim::AdamW optimizer(params, adamw(0.1));
  {
    Ballast ballast(size_t{600} << 20);  // room for the first parameter's state, not the second's
    EXPECT_THROW(optimizer.step(), nc::OutOfMemoryError);
    EXPECT_EQ(state_entries(optimizer), 0u) << "state was kept for some parameter";
  }
  EXPECT_TRUE(params[0].to_vector<float>() == first_before) << "the first parameter was updated";

  // With memory back, the retried step is the first step of a fresh optimizer.
  optimizer.step();
  nc::optim::AdamW fresh(copies, adamw(0.1));
  fresh.step();
  EXPECT_EQ(state_entries(optimizer), 6u);
  EXPECT_FALSE(params[0].to_vector<float>() == first_before);
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(params[i].to_vector<float>() == copies[i].to_vector<float>()) << i;
}

}  // namespace

#endif  // NORMCORE_HAS_CUDA
