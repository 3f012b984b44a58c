// Learning-rate schedules, gradient clipping (sync and async), optimizers minimizing a
// quadratic end to end, and the optimizers' CUDA kernels against the CPU bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <typeinfo>
#include <vector>

#include "normcore/normcore.h"
#include "normcore/optim.h"
#include "tests/optim/optim_support.h"

namespace nc = normcore;
namespace optim = normcore::optim;
using nc::DType;
using nc::Tensor;

using namespace optim_test;

namespace {

// ---------------------------------------------------------------- schedules

TEST(Schedule, StepLRSequence) {
  Tensor p = param_of(kStart, DType::F32);
  optim::SGD sgd({p}, {1.0});
  optim::StepLR schedule(sgd, 2, 0.5);
  const std::vector<double> expected = {1.0, 1.0, 0.5, 0.5, 0.25, 0.25, 0.125};
  EXPECT_EQ(schedule.base_lr(), 1.0);
  for (size_t s = 0; s < expected.size(); ++s) {
    EXPECT_EQ(schedule.last_step(), static_cast<int64_t>(s));
    EXPECT_DOUBLE_EQ(sgd.lr(), expected[s]) << "step " << s;
    EXPECT_DOUBLE_EQ(schedule.lr_at(static_cast<int64_t>(s)), expected[s]);
    schedule.step();
  }
}

TEST(Schedule, CosineLRSequence) {
  Tensor p = param_of(kStart, DType::F32);
  optim::Adam adam({p}, {1.0});
  optim::CosineLR schedule(adam, 2, 6, 0.1);
  // Warm-up 0, 0.5; cosine from 1 at step 2 to 0.1 at step 6; then 0.1.
  const std::vector<double> expected = {0.0, 0.5, 1.0, 0.8681980515339464, 0.55, 0.23180194846605365, 0.1, 0.1, 0.1};
  for (size_t s = 0; s < expected.size(); ++s) {
    EXPECT_NEAR(adam.lr(), expected[s], 1e-15) << "step " << s;
    schedule.step();
  }
  // Without warm-up the first step runs at the base lr.
  optim::Adam adam2({p}, {0.5});
  optim::CosineLR no_warmup(adam2, 0, 4);
  EXPECT_EQ(adam2.lr(), 0.5);
  for (int s = 0; s < 4; ++s) no_warmup.step();
  EXPECT_NEAR(adam2.lr(), 0.0, 1e-17);
}

TEST(Schedule, StateDictRoundTripAndErrors) {
  Tensor p = param_of(kStart, DType::F32);
  optim::SGD sgd({p}, {2.0});
  optim::StepLR schedule(sgd, 3, 0.1);
  for (int s = 0; s < 4; ++s) schedule.step();
  optim::StateDict state = schedule.state_dict();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "schedule.step");
  EXPECT_EQ(state[0].second.item<int64_t>(), 4);
  EXPECT_EQ(state[1].first, "schedule.base_lr");
  EXPECT_EQ(state[1].second.item<double>(), 2.0);

  optim::SGD sgd2({p}, {2.0});
  sgd2.set_lr(0.2);  // what loading an optimizer's state would leave
  optim::StepLR schedule2(sgd2, 3, 0.1);
  schedule2.load_state_dict(state);
  EXPECT_EQ(schedule2.last_step(), 4);
  EXPECT_EQ(schedule2.base_lr(), 2.0);
  EXPECT_DOUBLE_EQ(sgd2.lr(), 0.2);
  schedule2.step();
  schedule2.step();
  EXPECT_DOUBLE_EQ(sgd2.lr(), 2.0 * 0.01);

  const std::vector<BadStateCase> cases = {
      {"unknown", [](optim::StateDict& s) { set_entry(s, "schedule.gamma", f64(0.1)); }, "ValueError",
       "unknown entry 'schedule.gamma'"},
      {"missing", [](optim::StateDict& s) { erase_entry(s, "schedule.base_lr"); }, "ValueError",
       "missing entry 'schedule.base_lr'"},
      {"float_step", [](optim::StateDict& s) { set_entry(s, "schedule.step", f64(2)); }, "DTypeError",
       "must be an integer count"},
      {"negative_step", [](optim::StateDict& s) { set_entry(s, "schedule.step", nc::full({}, -2, DType::I64)); },
       "ValueError", "must be >= 0"},
      {"negative_base_lr", [](optim::StateDict& s) { set_entry(s, "schedule.base_lr", f64(-1)); }, "ValueError",
       "option base_lr"},
      {"duplicate", [](optim::StateDict& s) { s.push_back(s.front()); }, "ValueError", "appears twice"},
  };
  for (const BadStateCase& c : cases) {
    optim::StateDict bad = state;
    c.mutate(bad);
    expect_error([&] { schedule2.load_state_dict(bad); }, c.kind, c.text, c.name);
    EXPECT_EQ(schedule2.last_step(), 6) << c.name;
  }
}

TEST(Schedule, InvalidArgumentsThrow) {
  Tensor p = param_of(kStart, DType::F32);
  optim::SGD sgd({p}, {1.0});
  const std::vector<InvalidCase> cases = {
      {"step_size_zero", [&] { optim::StepLR(sgd, 0); }, "ValueError", "StepLR: option step_size must be >= 1"},
      {"negative_gamma", [&] { optim::StepLR(sgd, 2, -0.5); }, "ValueError", "option gamma"},
      {"negative_warmup", [&] { optim::CosineLR(sgd, -1, 10); }, "ValueError", "option warmup_steps"},
      {"total_not_after_warmup", [&] { optim::CosineLR(sgd, 5, 5); }, "ValueError",
       "option total_steps must be > warmup_steps"},
      {"negative_min_lr", [&] { optim::CosineLR(sgd, 0, 5, -1e-3); }, "ValueError", "option min_lr"},
  };
  for (const InvalidCase& c : cases) expect_error(c.construct, c.kind, c.text, c.name);
  EXPECT_EQ(sgd.lr(), 1.0);  // failed constructions left the lr alone
}

// ---------------------------------------------------------------- clip_grad_norm

TEST(ClipGradNorm, TotalNormAndScaling) {
  struct Case {
    std::string name;
    double max_norm, norm_type, total;
    bool scaled;
  };
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<Case> cases = {
      {"l2_clipped", 6.5, 2.0, 13.0, true},   {"l2_below_max", 20.0, 2.0, 13.0, false},
      {"l2_at_max", 13.0, 2.0, 13.0, false},  {"l1_clipped", 1.0, 1.0, 19.0, true},
      {"linf_clipped", 6.0, inf, 12.0, true}, {"l3", 100.0, 3.0, 12.207054953820636, false},
  };
  for (const Case& c : cases) {
    for (DType dtype : {DType::F32, DType::F64, DType::BF16}) {
      const std::string what = c.name + " " + nc::dtype_name(dtype);
      Tensor a = param_of({0.0, 0.0}, dtype);
      Tensor b = nc::zeros({1, 1}, dtype).requires_grad_();
      Tensor no_grad = param_of({5.0}, dtype);
      a.set_grad(vector_tensor({3.0, -4.0}, dtype));
      b.set_grad(nc::full({1, 1}, 12.0, dtype));
      Tensor grad_a = a.grad();
      const double total = optim::clip_grad_norm({a, b, no_grad}, c.max_norm, c.norm_type);
      const double rtol = dtype == DType::BF16 ? 8e-3 : (dtype == DType::F32 ? 1e-6 : 1e-14);
      EXPECT_NEAR(total, c.total, rtol * c.total) << what;
      const double scale = c.scaled ? c.max_norm / (c.total + 1e-6) : 1.0;
      expect_close(grad_a.to_vector<double>(), {3.0 * scale, -4.0 * scale}, rtol, 0.0, what + " (in place)");
      expect_close(b.grad().to_vector<double>(), {12.0 * scale}, rtol, 0.0, what);
      EXPECT_FALSE(no_grad.grad().defined()) << what;
    }
  }
}

TEST(ClipGradNorm, NoGradsAndErrors) {
  Tensor a = param_of({1.0}, DType::F32);
  EXPECT_EQ(optim::clip_grad_norm({a}, 1.0), 0.0);
  EXPECT_EQ(optim::clip_grad_norm({}, 1.0), 0.0);
  a.set_grad(vector_tensor({2.0}, DType::F32));
  expect_error([&] { optim::clip_grad_norm({a}, 1.0, 0.0); }, "ValueError", "clip_grad_norm: norm_type", "p = 0");
  expect_error([&] { optim::clip_grad_norm({a}, -1.0); }, "ValueError", "clip_grad_norm: max_norm", "max < 0");
  expect_error(
      [&] {
        optim::clip_grad_norm({a, Tensor()}, 1.0);
      },
      "ValueError", "parameter 1 is undefined", "undefined");
  EXPECT_EQ(a.grad().item<double>(), 2.0);
  // Deterministic: the same gradients give the same total, bit for bit.
  nc::Generator gen(3);
  Tensor big = nc::randn({1000}, DType::F32, &gen).requires_grad_();
  Tensor grad = nc::randn({1000}, DType::F32, &gen);
  big.set_grad(grad.clone());
  const double first = optim::clip_grad_norm({big}, 1e9);
  big.set_grad(grad.clone());
  EXPECT_EQ(optim::clip_grad_norm({big}, 1e9), first);
}

// The device-side variant: the same total and the same gradient bits as clip_grad_norm,
// clipped or not, with a NaN gradient, on every device, and the same errors.
TEST(ClipGradNorm, AsyncGivesTheSameBits) {
  std::vector<nc::Device> devices{nc::Device::cpu()};
  if (nc::cuda_is_available()) devices.push_back(nc::Device::cuda());
  for (const nc::Device& device : devices) {
    for (DType dtype : {DType::F32, DType::BF16, DType::F64}) {
      for (double max_norm : {0.5, 1e9}) {
        for (bool with_nan : {false, true}) {
          const std::string what = device.str() + " " + nc::dtype_name(dtype) + " max " + std::to_string(max_norm) +
                                   (with_nan ? " NaN" : "");
          nc::Generator gen(9);
          Tensor grad_a = nc::randn({300}, DType::F32, &gen).to(device, dtype);
          const Tensor grad_b = nc::randn({7, 5}, DType::F32, &gen).to(device, dtype);
          if (with_nan)
            grad_a = nc::where(nc::eq(nc::arange(300, DType::I64).to(device), 17),
                               nc::full({}, NAN, nc::TensorOptions(dtype, device)), grad_a);
          auto make = [&](const Tensor& g) {
            Tensor p = nc::zeros(g.shape(), nc::TensorOptions(dtype, device)).requires_grad_();
            p.set_grad(g.clone());
            return p;
          };
          const std::vector<Tensor> host{make(grad_a), make(grad_b), param_of({1.0}, dtype, device)};
          const std::vector<Tensor> on_device{make(grad_a), make(grad_b), param_of({1.0}, dtype, device)};
          const double total = optim::clip_grad_norm(host, max_norm);
          const Tensor async_total = optim::clip_grad_norm_async(on_device, max_norm);
          EXPECT_EQ(async_total.dim(), 0) << what;
          EXPECT_EQ(async_total.device(), device) << what;
          const double value = async_total.item<double>();
          if (with_nan) EXPECT_TRUE(std::isnan(value) && std::isnan(total)) << what;
          else EXPECT_EQ(value, total) << what;
          for (size_t i = 0; i < 2; ++i) {
            const auto bits = [](const Tensor& t) {
              return nc::ne(t, t).to(DType::F64).to(nc::Device::cpu()).to_vector<double>();
            };
            EXPECT_EQ(bits(host[i].grad()), bits(on_device[i].grad())) << what;
            const Tensor clean_h = nc::where(nc::ne(host[i].grad(), host[i].grad()), 0, host[i].grad());
            const Tensor clean_d = nc::where(nc::ne(on_device[i].grad(), on_device[i].grad()), 0, on_device[i].grad());
            EXPECT_EQ(clean_h.to(nc::Device::cpu()).to(DType::F64).to_vector<double>(),
                      clean_d.to(nc::Device::cpu()).to(DType::F64).to_vector<double>())
                << what << " parameter " << i;
          }
          EXPECT_FALSE(on_device[2].grad().defined()) << what;
        }
      }
    }
  }
  EXPECT_EQ(optim::clip_grad_norm_async({param_of({1.0}, DType::F32)}, 1.0).item<double>(), 0.0);
  expect_error([] { optim::clip_grad_norm_async({param_of({1.0}, DType::F32)}, -1.0); }, "ValueError",
               "clip_grad_norm_async: max_norm", "max < 0");
}

// ---------------------------------------------------------------- end to end

// Minimizes sum(w * (x - target)^2) with curvatures 1 and 10 through autograd.
double minimize(optim::Optimizer& opt, const Tensor& x, int steps) {
  const Tensor target = nc::from_vector(std::vector<float>{3.0f, -1.0f}, {2});
  const Tensor weight = nc::from_vector(std::vector<float>{1.0f, 10.0f}, {2});
  double loss_value = 0.0;
  for (int step = 0; step < steps; ++step) {
    opt.zero_grad();
    Tensor diff = x - target;
    Tensor loss = nc::sum(weight * diff * diff);
    loss_value = loss.item<double>();
    loss.backward();
    opt.step();
  }
  return loss_value;
}

TEST(Sgd, MinimizesAQuadratic) {
  Tensor x = nc::zeros({2}).requires_grad_();
  optim::SGD sgd({x}, {0.02, 0.9, 0.0, 0.0, true});
  const double final_loss = minimize(sgd, x, 300);
  EXPECT_LT(final_loss, 1e-8);
  expect_close(x.to_vector<double>(), {3.0, -1.0}, 0.0, 1e-4, "sgd minimum");
}

TEST(Adam, MinimizesAQuadratic) {
  for (bool decoupled : {false, true}) {
    Tensor x = nc::zeros({2}).requires_grad_();
    std::unique_ptr<optim::Optimizer> opt =
        decoupled ? std::unique_ptr<optim::Optimizer>(new optim::AdamW({x}, {0.05, 0.9, 0.999, 1e-8, 0.0}))
                  : std::unique_ptr<optim::Optimizer>(new optim::Adam({x}, {0.05}));
    optim::CosineLR schedule(*opt, 10, 600, 1e-4);
    double final_loss = 0.0;
    for (int step = 0; step < 600; ++step) {
      final_loss = minimize(*opt, x, 1);
      schedule.step();
    }
    EXPECT_LT(final_loss, 1e-6) << (decoupled ? "AdamW" : "Adam");
    expect_close(x.to_vector<double>(), {3.0, -1.0}, 0.0, 1e-3, decoupled ? "AdamW minimum" : "Adam minimum");
  }
}

// ---------------------------------------------------------------- CUDA against CPU

// The kernels round every operation on their own, in one order, so the backends agree
// bit for bit (a fused multiply-add on one side would not, and near-cancelling g + wd*p
// would amplify the difference through m / (sqrt(v) + eps)).
TEST(OptimCuda, KernelsMatchCpuBitForBit) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  struct Config {
    std::string name;
    MakeOptimizer make;
  };
  const std::vector<Config> configs = {
      {"sgd", make<optim::SGD>(optim::SGDOptions{0.1})},
      {"sgd_momentum_dampening_wd", make<optim::SGD>(optim::SGDOptions{0.1, 0.9, 0.25, 0.01})},
      {"sgd_nesterov", make<optim::SGD>(optim::SGDOptions{0.1, 0.9, 0.0, 0.0, true})},
      {"adam_wd", make<optim::Adam>(optim::AdamOptions{0.01, 0.9, 0.999, 1e-8, 0.1})},
      {"adam_beta1_0_3", make<optim::Adam>(optim::AdamOptions{0.01, 0.3, 0.9, 1e-6})},
      {"adamw", make<optim::AdamW>(optim::AdamWOptions{0.01})},
  };
  // Tails of every pack width, one block, many blocks, more than one grid-stride round.
  const std::vector<int64_t> sizes = {1, 3, 4, 5, 8, 1023, 4099, 1 << 17, 2500003};
  const nc::Device gpu = nc::Device::cuda(0);
  for (const Config& config : configs) {
    for (DType dtype : {DType::F64, DType::F32, DType::F16, DType::BF16}) {
      for (int64_t n : sizes) {
        if (n > (1 << 17) && dtype != DType::F32) continue;
        for (bool misaligned : {false, true}) {
          if (misaligned && n > 4099) continue;
          SCOPED_TRACE(config.name + " " + nc::dtype_name(dtype) + " n=" + std::to_string(n) +
                       (misaligned ? " misaligned" : ""));
          nc::Generator gen(static_cast<uint64_t>(n));
          const int64_t skip = misaligned ? 1 : 0;
          Tensor init = nc::randn({n + skip}, dtype, &gen);
          // A one-element offset makes every pointer miss the packed kernel's alignment.
          Tensor cpu_param = init.clone().narrow(0, skip, n).requires_grad_();
          Tensor gpu_param = init.to(gpu).narrow(0, skip, n).requires_grad_();
          std::unique_ptr<optim::Optimizer> cpu_opt = config.make({cpu_param});
          std::unique_ptr<optim::Optimizer> gpu_opt = config.make({gpu_param});
          for (int step = 0; step < 3; ++step) {
            Tensor grad = nc::randn({n + skip}, dtype, &gen).narrow(0, skip, n);
            cpu_param.set_grad(grad);
            gpu_param.set_grad(grad.to(gpu));
            cpu_opt->step();
            gpu_opt->step();
          }
          EXPECT_EQ(gpu_param.to_vector<double>(), cpu_param.to_vector<double>()) << "param";
          optim::StateDict cpu_state = cpu_opt->state_dict();
          optim::StateDict gpu_state = gpu_opt->state_dict();
          ASSERT_EQ(cpu_state.size(), gpu_state.size());
          // Buffers and step counts live on the parameter's device (a CUDA graph replays the
          // update with them); hyperparameters on the host.
          for (size_t i = 0; i < cpu_state.size(); ++i) {
            const std::string& name = cpu_state[i].first;
            const bool on_host = name.rfind("param_groups.", 0) == 0;
            EXPECT_EQ(gpu_state[i].first, name);
            EXPECT_EQ(gpu_state[i].second.device(), on_host ? nc::Device::cpu() : gpu) << name;
            EXPECT_EQ(gpu_state[i].second.to_vector<double>(), cpu_state[i].second.to_vector<double>()) << name;
          }
        }
      }
    }
  }
}

TEST(OptimCuda, ClipGradNormMatchesCpu) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const nc::Device gpu = nc::Device::cuda(0);
  const double inf = std::numeric_limits<double>::infinity();
  for (double norm_type : {1.0, 2.0, inf}) {
    nc::Generator gen(5);
    std::vector<Tensor> cpu_params, gpu_params;
    for (int64_t n : {7, 1000, 65537}) {
      Tensor grad = nc::randn({n}, DType::F32, &gen);
      cpu_params.push_back(nc::zeros({n}).requires_grad_());
      gpu_params.push_back(nc::zeros({n}, gpu).requires_grad_());
      cpu_params.back().set_grad(grad);
      gpu_params.back().set_grad(grad.to(gpu));
    }
    const double cpu_total = optim::clip_grad_norm(cpu_params, 0.5, norm_type);
    const double gpu_total = optim::clip_grad_norm(gpu_params, 0.5, norm_type);
    EXPECT_NEAR(gpu_total, cpu_total, 1e-5 * cpu_total) << norm_type;
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      expect_close(gpu_params[i].grad().to_vector<double>(), cpu_params[i].grad().to_vector<double>(), 1e-5, 1e-7,
                   "clipped grad " + std::to_string(i));
    }
  }
}

}  // namespace
