// Optimizers: SGD/Adam/AdamW trajectories against reference values (PyTorch's update rules
// evaluated in float64, written out below) for every option that changes the math, in f64,
// f32, f16 and bf16; state-dict round trips that resume bit for bit; option and state-dict
// errors. test_schedules_clipping.cpp holds schedules, clipping and the CUDA kernels.
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

// ---------------------------------------------------------------- trajectories

// Gradients of steps 1..3; exact in f16 and bf16.
const std::vector<std::vector<double>> kGrads = {
    {0.5, -0.25, 1.5, 0.125, -2.0},
    {-1.0, 0.75, 0.25, 2.0, 0.5},
    {0.25, 1.25, -0.5, -1.5, 1.0},
};

struct TrajectoryCase {
  std::string name;
  MakeOptimizer make;
  std::vector<std::vector<double>> expected;  // the parameter after steps 1, 2, 3
};

// Reference: PyTorch's SGD and Adam(W) update rules (see normcore/optim.h) evaluated in
// double precision from kStart and kGrads. Options are listed in declaration order:
// SGDOptions{lr, momentum, dampening, weight_decay, nesterov},
// AdamOptions / AdamWOptions{lr, beta1, beta2, eps, weight_decay}.
std::vector<TrajectoryCase> trajectory_cases() {
  return {
      {"sgd_plain",
       make<optim::SGD>(optim::SGDOptions{0.1}),
       {{0.95, -1.975, 0.35, 2.9875, -0.55},
        {1.05, -2.0500000000000003, 0.32499999999999996, 2.7874999999999996, -0.6000000000000001},
        {1.0250000000000001, -2.1750000000000003, 0.37499999999999994, 2.9374999999999996, -0.7000000000000001}}},
      {"sgd_momentum",
       make<optim::SGD>(optim::SGDOptions{0.1, 0.9}),
       {{0.95, -1.975, 0.35, 2.9875, -0.55},
        {1.005, -2.0275000000000003, 0.18999999999999995, 2.7762499999999997, -0.42000000000000004},
        {1.0294999999999999, -2.1997500000000003, 0.09599999999999992, 2.7361249999999995, -0.403}}},
      {"sgd_momentum_dampening",
       make<optim::SGD>(optim::SGDOptions{0.1, 0.9, 0.5}),
       {{0.95, -1.975, 0.35, 2.9875, -0.55},
        {0.955, -1.99, 0.20249999999999996, 2.8762499999999998, -0.395},
        {0.947, -2.066, 0.09474999999999995, 2.8511249999999997, -0.3055}}},
      {"sgd_nesterov",
       make<optim::SGD>(optim::SGDOptions{0.1, 0.9, 0.0, 0.0, true}),
       {{0.905, -1.9525, 0.21499999999999997, 2.97625, -0.37},
        {1.0545, -2.07475, 0.04599999999999993, 2.586125, -0.303},
        {1.05155, -2.354775, 0.01139999999999991, 2.7000125, -0.3877}}},
      {"sgd_weight_decay",
       make<optim::SGD>(optim::SGDOptions{0.1, 0.0, 0.0, 0.1}),
       {{0.94, -1.955, 0.345, 2.9575, -0.5425},
        {1.0306, -2.01045, 0.31655, 2.727925, -0.587075},
        {0.995294, -2.1153455, 0.3633845, 2.85064575, -0.68120425}}},
      {"sgd_momentum_dampening_weight_decay",
       make<optim::SGD>(optim::SGDOptions{0.1, 0.9, 0.25, 0.1}),
       {{0.94, -1.955, 0.345, 2.9575, -0.5425},
        {0.95395, -1.9560875, 0.18416249999999995, 2.74706875, -0.3891812499999999},
        {0.9406003749999999, -2.03614559375, 0.07552753124999992, 2.649577609375, -0.3232755156249999}}},
      {"sgd_nesterov_weight_decay",
       make<optim::SGD>(optim::SGDOptions{0.05, 0.5, 0.0, 0.2, true}),
       {{0.9475, -1.95125, 0.38, 2.945625, -0.58875},
        {0.9995375, -1.97010625, 0.33555, 2.742378125, -0.59054375},
        {0.9715506875, -2.03473903125, 0.35394175, 2.776847140625, -0.64802621875}}},
      {"adam_default_betas",
       make<optim::Adam>(optim::AdamOptions{0.1}),
       {{0.900000002, -1.9000000039999998, 0.40000000066666663, 2.9000000079999992, -0.6500000005},
        {0.9366103542405654, -1.9494189864458513, 0.3216672665693313, 2.821553470208384, -0.6030531837013348},
        {0.9502794203389762, -2.0238283514729174, 0.28412185697584713, 2.811310008430643, -0.5983098382649118}}},
      {"adam_weight_decay",
       make<optim::Adam>(optim::AdamOptions{0.1, 0.9, 0.999, 1e-8, 0.1}),
       {{0.9000000016666666, -1.900000002222222, 0.4000000006451613, 2.9000000023529413, -0.6500000004819277},
        {0.9252635194456061, -1.9160584207825666, 0.3204464373003393, 2.814613568794322, -0.5996965324079688},
        {0.9247305742687093, -1.9758936178110516, 0.2796874614707647, 2.7857619468128485, -0.5900693904646547}}},
      {"adamw_weight_decay",
       make<optim::AdamW>(optim::AdamWOptions{0.1, 0.9, 0.999, 1e-8, 0.1}),
       {{0.890000002, -1.8800000039999998, 0.39500000066666663, 2.870000007999999, -0.6425000004999999},
        {0.9177103542205653, -1.9106189864058514, 0.31271726656266463, 2.7628534701283836, -0.5891281836963347},
        {0.9222023167767704, -1.965922161568859, 0.2720446843035538, 2.724981473649359, -0.5784935564229484}}},
      {"adam_low_betas_large_eps",
       make<optim::Adam>(optim::AdamOptions{0.05, 0.5, 0.9, 1e-3}),
       {{0.9500998003992016, -1.950199203187251, 0.45003331112591605, 2.9503968253968256, -0.7000249875062469},
        {0.9811960655738013, -1.986642494289548, 0.4182625097270957, 2.9031297481582747, -0.6883248706184848},
        {0.9866348491558214, -2.0370670298171922, 0.4182625097270957, 2.9122292055388863, -0.7050061332807442}}},
      {"adamw_default_decay_beta1_0_3",
       make<optim::AdamW>(optim::AdamWOptions{0.1, 0.3}),
       {{0.899000002, -1.8980000039999998, 0.3995000006666667, 2.897000007999999, -0.6492500004999999},
        {0.9807943151008154, -1.9889662457349075, 0.3490127428056846, 2.7835208834855667, -0.6433227060073423},
        {0.9803573934788095, -2.1093089762750115, 0.3712467221029212, 2.8249723400510796, -0.6954463411884495}}},
  };
}

TEST(OptimTrajectory, MatchesReferenceInEveryDType) {
  for (const TrajectoryCase& c : trajectory_cases()) {
    for (const Tolerance& tol : trajectory_dtypes()) {
      const std::string what = c.name + " " + nc::dtype_name(tol.dtype);
      Tensor p = param_of(kStart, tol.dtype);
      std::unique_ptr<optim::Optimizer> opt = c.make({p});
      for (size_t step = 0; step < kGrads.size(); ++step) {
        p.set_grad(vector_tensor(kGrads[step], tol.dtype));
        opt->step();
        EXPECT_EQ(p.dtype(), tol.dtype);
        expect_close(p.to_vector<double>(), c.expected[step], tol.rtol, tol.atol,
                     what + " step " + std::to_string(step + 1));
      }
    }
  }
}

TEST(OptimTrajectory, FirstStepsByHand) {
  // SGD: 1 - 0.1 * 0.5.
  Tensor p = param_of({1.0}, DType::F32);
  optim::SGD sgd({p}, {0.1});
  p.set_grad(vector_tensor({0.5}, DType::F32));
  sgd.step();
  EXPECT_FLOAT_EQ(p.item<float>(), 0.95f);
  // Adam's first step moves by lr * g / (|g| + eps) = 0.1 * 0.5 / (0.5 + 1e-8).
  Tensor q = param_of({1.0}, DType::F64);
  optim::Adam adam({q}, {0.1});
  q.set_grad(vector_tensor({0.5}, DType::F64));
  adam.step();
  EXPECT_NEAR(q.item<double>(), 1.0 - 0.1 * 0.5 / (0.5 + 1e-8), 1e-15);
}

TEST(OptimState, StateDTypeIsF32For16BitParams) {
  EXPECT_EQ(optim::state_dtype(DType::F16), DType::F32);
  EXPECT_EQ(optim::state_dtype(DType::BF16), DType::F32);
  EXPECT_EQ(optim::state_dtype(DType::F32), DType::F32);
  EXPECT_EQ(optim::state_dtype(DType::F64), DType::F64);
  expect_error([] { optim::state_dtype(DType::I32); }, "DTypeError", "state_dtype", "i32");

  Tensor p = param_of(kStart, DType::BF16);
  optim::AdamW adamw({p});
  EXPECT_EQ(adamw.options().weight_decay, 1e-2);
  EXPECT_TRUE(adamw.decoupled());
  p.set_grad(vector_tensor(kGrads[0], DType::BF16));
  adamw.step();
  for (const auto& [name, t] : adamw.state_dict()) {
    if (name == "state.0.exp_avg" || name == "state.0.exp_avg_sq") EXPECT_EQ(t.dtype(), DType::F32) << name;
  }
}

TEST(OptimState, SkipsParamsWithoutGrad) {
  for (const MakeOptimizer& maker :
       {make<optim::SGD>(optim::SGDOptions{0.1, 0.9}), make<optim::Adam>(optim::AdamOptions{0.1})}) {
    Tensor p = param_of(kStart, DType::F32);
    Tensor q = param_of({1.0, 2.0}, DType::F32);
    std::unique_ptr<optim::Optimizer> opt = maker({p, q});
    p.set_grad(vector_tensor(kGrads[0], DType::F32));
    opt->step();
    EXPECT_EQ(q.to_vector<double>(), (std::vector<double>{1.0, 2.0}));
    for (const auto& entry : opt->state_dict()) EXPECT_NE(entry.first.rfind("state.1.", 0), 0u) << entry.first;

    // q's first update is its own first step, whatever p's step count is.
    p.set_grad(vector_tensor(kGrads[1], DType::F32));
    q.set_grad(vector_tensor({0.5, -0.25}, DType::F32));
    opt->step();
    Tensor fresh = param_of({1.0, 2.0}, DType::F32);
    std::unique_ptr<optim::Optimizer> reference = maker({fresh});
    fresh.set_grad(vector_tensor({0.5, -0.25}, DType::F32));
    reference->step();
    EXPECT_EQ(q.to_vector<double>(), fresh.to_vector<double>());
  }
  Tensor p = param_of(kStart, DType::F32);
  Tensor q = param_of({1.0, 2.0}, DType::F32);
  optim::Adam adam({p, q});
  for (int step = 0; step < 3; ++step) {
    p.set_grad(vector_tensor(kGrads[step], DType::F32));
    if (step > 0) q.set_grad(vector_tensor({0.5, -0.25}, DType::F32));
    adam.step();
  }
  for (const auto& [name, t] : adam.state_dict()) {
    if (name == "state.0.step") EXPECT_EQ(t.item<int64_t>(), 3);
    if (name == "state.1.step") EXPECT_EQ(t.item<int64_t>(), 2);
  }
}

TEST(OptimState, ZeroGradMakesGradsUndefined) {
  Tensor p = param_of(kStart, DType::F32);
  Tensor q = param_of({1.0}, DType::F32);
  optim::SGD sgd({p, q}, {0.1});
  p.set_grad(vector_tensor(kGrads[0], DType::F32));
  q.set_grad(vector_tensor({1.0}, DType::F32));
  sgd.zero_grad();
  EXPECT_FALSE(p.grad().defined());
  EXPECT_FALSE(q.grad().defined());
  sgd.step();  // nothing to do
  EXPECT_EQ(p.to_vector<double>(), kStart);
  EXPECT_EQ(sgd.params().size(), 2u);
  EXPECT_TRUE(sgd.params()[0].is_same(p));
}

TEST(OptimState, NonContiguousGradGivesTheSameUpdate) {
  Tensor grad = nc::from_vector(std::vector<double>{0.5, -1.0, 2.0, 0.25, -0.5, 1.5}, {3, 2}).to(DType::F32);
  Tensor a = nc::ones({2, 3}).requires_grad_();
  Tensor b = nc::ones({2, 3}).requires_grad_();
  optim::Adam adam_a({a}, {0.1});
  optim::Adam adam_b({b}, {0.1});
  a.set_grad(grad.t());
  b.set_grad(grad.t().contiguous());
  ASSERT_FALSE(a.grad().is_contiguous());
  adam_a.step();
  adam_b.step();
  EXPECT_EQ(a.to_vector<double>(), b.to_vector<double>());
}

TEST(OptimState, StepRecordsNoGraph) {
  Tensor p = param_of(kStart, DType::F32);
  optim::SGD sgd({p}, {0.1});
  p.set_grad(vector_tensor(kGrads[0], DType::F32));
  sgd.step();
  EXPECT_TRUE(p.is_leaf());
  EXPECT_TRUE(p.requires_grad());
  EXPECT_TRUE(nc::autograd::is_grad_enabled());
}

TEST(OptimState, LrAndOptionsAccessors) {
  Tensor p = param_of(kStart, DType::F32);
  optim::SGD sgd({p}, {0.1, 0.9, 0.0, 0.01, true});
  EXPECT_EQ(sgd.lr(), 0.1);
  sgd.set_lr(0.05);
  EXPECT_EQ(sgd.lr(), 0.05);
  EXPECT_EQ(sgd.options().lr, 0.05);
  EXPECT_EQ(sgd.options().momentum, 0.9);
  EXPECT_TRUE(sgd.options().nesterov);
  expect_error([&] { sgd.set_lr(-1.0); }, "ValueError", "lr", "negative lr");
  EXPECT_EQ(sgd.lr(), 0.05);

  optim::Adam adam({p}, {0.2, 0.8, 0.99, 1e-6, 0.5});
  EXPECT_EQ(adam.options().beta1, 0.8);
  EXPECT_EQ(adam.options().eps, 1e-6);
  EXPECT_FALSE(adam.decoupled());
}

// ---------------------------------------------------------------- state dicts

TEST(OptimState, StateDictNamesAndValues) {
  Tensor p = param_of(kStart, DType::F32);
  Tensor q = param_of({1.0}, DType::F32);
  optim::Adam adam({p, q}, {0.1, 0.8, 0.99, 1e-6, 0.5});
  p.set_grad(vector_tensor(kGrads[0], DType::F32));
  adam.step();
  optim::StateDict state = adam.state_dict();
  std::vector<std::string> names;
  for (const auto& entry : state) names.push_back(entry.first);
  EXPECT_EQ(names, (std::vector<std::string>{"param_groups.lr", "param_groups.beta1", "param_groups.beta2",
                                             "param_groups.eps", "param_groups.weight_decay", "param_groups.decoupled",
                                             "state.0.step", "state.0.exp_avg", "state.0.exp_avg_sq"}));
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(state[i].second.dim(), 0) << names[i];
    EXPECT_EQ(state[i].second.dtype(), DType::F64) << names[i];
  }
  EXPECT_EQ(state[0].second.item<double>(), 0.1);
  EXPECT_EQ(state[1].second.item<double>(), 0.8);
  EXPECT_EQ(state[4].second.item<double>(), 0.5);
  EXPECT_EQ(state[5].second.item<double>(), 0.0);
  EXPECT_EQ(state[6].second.dtype(), DType::I64);
  EXPECT_EQ(state[6].second.item<int64_t>(), 1);
  EXPECT_EQ(state[7].second.shape(), p.shape());

  // Entries are copies: later steps leave them alone.
  std::vector<double> saved_avg = state[7].second.to_vector<double>();
  p.set_grad(vector_tensor(kGrads[1], DType::F32));
  adam.step();
  EXPECT_EQ(state[7].second.to_vector<double>(), saved_avg);

  optim::SGD sgd({p}, {0.1, 0.9, 0.25, 0.01});
  names.clear();
  for (const auto& entry : sgd.state_dict()) names.push_back(entry.first);
  EXPECT_EQ(names, (std::vector<std::string>{"param_groups.lr", "param_groups.momentum", "param_groups.dampening",
                                             "param_groups.weight_decay", "param_groups.nesterov"}));
}

TEST(OptimState, LoadRestoresHyperparameters) {
  Tensor p = param_of(kStart, DType::F32);
  optim::SGD saved({p}, {0.1, 0.9, 0.0, 0.01, true});
  saved.set_lr(0.025);
  Tensor q = param_of(kStart, DType::F32);
  optim::SGD loaded({q}, {0.5});
  loaded.load_state_dict(saved.state_dict());
  EXPECT_EQ(loaded.lr(), 0.025);
  EXPECT_EQ(loaded.options().momentum, 0.9);
  EXPECT_EQ(loaded.options().weight_decay, 0.01);
  EXPECT_TRUE(loaded.options().nesterov);

  optim::AdamW adamw({p}, {0.3, 0.5, 0.75, 1e-4, 0.2});
  optim::AdamW adamw_loaded({q});
  adamw_loaded.load_state_dict(adamw.state_dict());
  EXPECT_EQ(adamw_loaded.lr(), 0.3);
  EXPECT_EQ(adamw_loaded.options().beta1, 0.5);
  EXPECT_EQ(adamw_loaded.options().beta2, 0.75);
  EXPECT_EQ(adamw_loaded.options().eps, 1e-4);
  EXPECT_EQ(adamw_loaded.options().weight_decay, 0.2);
}

struct RoundTripCase {
  std::string name;
  MakeOptimizer make;
  DType dtype;
};

// 3 steps, save (through safetensors bytes), 2 more; a new optimizer and schedule loading
// the saved state repeat the last 2 steps from the saved params and must agree bit for bit.
TEST(OptimState, StateDictRoundTripResumesBitForBit) {
  const std::vector<RoundTripCase> cases = {
      {"sgd_nesterov_f32", make<optim::SGD>(optim::SGDOptions{0.1, 0.9, 0.0, 0.01, true}), DType::F32},
      {"sgd_dampening_bf16", make<optim::SGD>(optim::SGDOptions{0.1, 0.9, 0.3}), DType::BF16},
      {"adam_f32", make<optim::Adam>(optim::AdamOptions{0.01, 0.9, 0.999, 1e-8, 0.1}), DType::F32},
      {"adamw_f16", make<optim::AdamW>(optim::AdamWOptions{0.01}), DType::F16},
      {"adamw_f64", make<optim::AdamW>(optim::AdamWOptions{0.01}), DType::F64},
  };
  for (const RoundTripCase& c : cases) {
    SCOPED_TRACE(c.name);
    nc::Generator gen(11);
    const Tensor start_p = nc::randn({3, 5}, c.dtype, &gen);
    const Tensor start_q = nc::randn({4}, c.dtype, &gen);
    std::vector<std::pair<Tensor, Tensor>> grads;
    for (int step = 0; step < 5; ++step) {
      grads.emplace_back(nc::randn({3, 5}, c.dtype, &gen), nc::randn({4}, c.dtype, &gen));
    }
    auto run_step = [&](optim::Optimizer& opt, optim::LRSchedule& schedule, Tensor& p, Tensor& q, int step) {
      p.set_grad(grads[step].first);
      if (step != 1) q.set_grad(grads[step].second);  // q misses one step
      opt.step();
      schedule.step();
      opt.zero_grad();
    };

    Tensor p = start_p.clone().requires_grad_();
    Tensor q = start_q.clone().requires_grad_();
    std::unique_ptr<optim::Optimizer> opt = c.make({p, q});
    optim::CosineLR schedule(*opt, 2, 8, 1e-3);
    for (int step = 0; step < 3; ++step) run_step(*opt, schedule, p, q, step);
    optim::StateDict saved = opt->state_dict();
    for (const auto& entry : schedule.state_dict()) saved.push_back(entry);
    const std::vector<uint8_t> bytes = nc::safetensors::save_bytes(saved);
    nc::safetensors::File file = nc::safetensors::load_bytes(bytes.data(), bytes.size());
    Tensor p_saved = p.detach().clone();
    Tensor q_saved = q.detach().clone();
    for (int step = 3; step < 5; ++step) run_step(*opt, schedule, p, q, step);

    Tensor p2 = p_saved.clone().requires_grad_();
    Tensor q2 = q_saved.clone().requires_grad_();
    std::unique_ptr<optim::Optimizer> opt2 = c.make({p2, q2});
    optim::CosineLR schedule2(*opt2, 2, 8, 1e-3);
    optim::StateDict optimizer_part, schedule_part;
    for (const auto& entry : file.tensors) {
      (entry.first.rfind("schedule.", 0) == 0 ? schedule_part : optimizer_part).push_back(entry);
    }
    opt2->load_state_dict(optimizer_part);
    schedule2.load_state_dict(schedule_part);
    EXPECT_EQ(opt2->lr(), schedule.lr_at(3));
    EXPECT_EQ(schedule2.last_step(), 3);
    for (int step = 3; step < 5; ++step) run_step(*opt2, schedule2, p2, q2, step);

    EXPECT_EQ(p2.to_vector<double>(), p.to_vector<double>());
    EXPECT_EQ(q2.to_vector<double>(), q.to_vector<double>());
    EXPECT_NE(p2.to_vector<double>(), p_saved.to_vector<double>());
    EXPECT_EQ(opt2->lr(), opt->lr());
  }
}

TEST(OptimState, BadStateDictsThrowAndChangeNothing) {
  const std::vector<BadStateCase> cases = {
      {"missing_hyperparameter", [](optim::StateDict& s) { erase_entry(s, "param_groups.beta2"); }, "ValueError",
       "missing entry 'param_groups.beta2'"},
      {"unknown_hyperparameter", [](optim::StateDict& s) { set_entry(s, "param_groups.momentum", f64(0.9)); },
       "ValueError", "unknown hyperparameter 'param_groups.momentum'"},
      {"unknown_entry", [](optim::StateDict& s) { set_entry(s, "weights.0", f64(1)); }, "ValueError",
       "unknown entry 'weights.0'"},
      {"unknown_state", [](optim::StateDict& s) { set_entry(s, "state.0.momentum_buffer", nc::zeros({5})); },
       "ValueError", "unknown state 'state.0.momentum_buffer'"},
      {"index_out_of_range", [](optim::StateDict& s) { set_entry(s, "state.2.exp_avg", nc::zeros({5})); }, "ValueError",
       "is for parameter 2 but the optimizer has 2"},
      {"malformed_index", [](optim::StateDict& s) { set_entry(s, "state.x.exp_avg", nc::zeros({5})); }, "ValueError",
       "malformed entry 'state.x.exp_avg'"},
      {"missing_dot", [](optim::StateDict& s) { set_entry(s, "state.0", nc::zeros({5})); }, "ValueError",
       "malformed entry 'state.0'"},
      {"wrong_shape", [](optim::StateDict& s) { set_entry(s, "state.0.exp_avg", nc::zeros({4})); }, "ShapeError",
       "entry 'state.0.exp_avg' has shape [4] but parameter 0 has shape [5]"},
      {"wrong_dtype", [](optim::StateDict& s) { set_entry(s, "state.0.exp_avg_sq", nc::zeros({5}, DType::F64)); },
       "DTypeError", "entry 'state.0.exp_avg_sq' is f64"},
      {"partial_state", [](optim::StateDict& s) { erase_entry(s, "state.0.exp_avg_sq"); }, "ValueError",
       "no entry 'state.0.exp_avg_sq'"},
      {"step_not_integer", [](optim::StateDict& s) { set_entry(s, "state.0.step", f64(1)); }, "DTypeError",
       "'state.0.step' must be an integer count"},
      {"negative_step", [](optim::StateDict& s) { set_entry(s, "state.0.step", nc::full({}, -1, DType::I64)); },
       "ValueError", "'state.0.step' must be >= 0"},
      {"hyperparameter_not_scalar",
       [](optim::StateDict& s) { set_entry(s, "param_groups.eps", nc::zeros({2}, DType::F64)); }, "ShapeError",
       "'param_groups.eps' must hold one value"},
      {"hyperparameter_integer", [](optim::StateDict& s) { set_entry(s, "param_groups.eps", nc::full({}, 1)); },
       "DTypeError", "'param_groups.eps' must be floating"},
      {"bad_beta", [](optim::StateDict& s) { set_entry(s, "param_groups.beta1", f64(1.0)); }, "ValueError",
       "option beta1 must be in [0, 1)"},
      {"negative_lr", [](optim::StateDict& s) { set_entry(s, "param_groups.lr", f64(-0.5)); }, "ValueError",
       "option lr must be >= 0"},
      {"adamw_state_into_adam", [](optim::StateDict& s) { set_entry(s, "param_groups.decoupled", f64(1)); },
       "ValueError", "decoupled = 1 (AdamW)"},
      {"flag_not_bool", [](optim::StateDict& s) { set_entry(s, "param_groups.decoupled", f64(0.5)); }, "ValueError",
       "option decoupled must be 0 or 1"},
      {"duplicate", [](optim::StateDict& s) { s.push_back(s.front()); }, "ValueError", "appears twice"},
      {"undefined", [](optim::StateDict& s) { set_entry(s, "state.0.exp_avg", Tensor()); }, "ValueError",
       "'state.0.exp_avg' is undefined"},
  };
  Tensor p = param_of(kStart, DType::F32);
  Tensor q = param_of({1.0}, DType::F32);
  optim::Adam adam({p, q}, {0.1});
  p.set_grad(vector_tensor(kGrads[0], DType::F32));
  adam.step();
  const optim::StateDict good = adam.state_dict();
  for (const BadStateCase& c : cases) {
    optim::StateDict bad = good;
    c.mutate(bad);
    expect_error([&] { adam.load_state_dict(bad); }, c.kind, c.text, c.name);
    // Nothing changed: the state is the one from before.
    optim::StateDict now = adam.state_dict();
    ASSERT_EQ(now.size(), good.size()) << c.name;
    for (size_t i = 0; i < now.size(); ++i) {
      EXPECT_EQ(now[i].first, good[i].first) << c.name;
      EXPECT_EQ(now[i].second.to_vector<double>(), good[i].second.to_vector<double>()) << c.name;
    }
  }
  adam.load_state_dict(good);  // the unmodified dict loads
}

// ---------------------------------------------------------------- options

TEST(OptimOptions, InvalidOptionsThrow) {
  Tensor p = param_of(kStart, DType::F32);
  Tensor q = param_of({1.0, 2.0}, DType::F32);
  const std::vector<InvalidCase> cases = {
      {"sgd_negative_lr", [&] { optim::SGD({p}, {-0.1}); }, "ValueError", "SGD: option lr must be >= 0"},
      {"sgd_nan_lr", [&] { optim::SGD({p}, {std::nan("")}); }, "ValueError", "option lr"},
      {"sgd_negative_momentum",
       [&] {
         optim::SGD({p}, {0.1, -0.5});
       },
       "ValueError", "option momentum"},
      {"sgd_dampening_above_one",
       [&] {
         optim::SGD({p}, {0.1, 0.9, 1.5});
       },
       "ValueError", "option dampening"},
      {"sgd_negative_weight_decay",
       [&] {
         optim::SGD({p}, {0.1, 0.0, 0.0, -1.0});
       },
       "ValueError", "option weight_decay"},
      {"sgd_nesterov_without_momentum",
       [&] {
         optim::SGD({p}, {0.1, 0.0, 0.0, 0.0, true});
       },
       "ValueError", "option momentum must be > 0 with nesterov"},
      {"sgd_nesterov_with_dampening",
       [&] {
         optim::SGD({p}, {0.1, 0.9, 0.1, 0.0, true});
       },
       "ValueError", "option dampening must be 0 with nesterov"},
      {"adam_negative_lr", [&] { optim::Adam({p}, {-1.0}); }, "ValueError", "Adam: option lr"},
      {"adam_beta1_one",
       [&] {
         optim::Adam({p}, {1e-3, 1.0});
       },
       "ValueError", "option beta1 must be in [0, 1)"},
      {"adam_negative_beta1",
       [&] {
         optim::Adam({p}, {1e-3, -0.1});
       },
       "ValueError", "option beta1"},
      {"adam_beta2_one",
       [&] {
         optim::Adam({p}, {1e-3, 0.9, 1.0});
       },
       "ValueError", "option beta2"},
      {"adam_zero_eps",
       [&] {
         optim::Adam({p}, {1e-3, 0.9, 0.999, 0.0});
       },
       "ValueError", "option eps must be > 0"},
      {"adam_negative_weight_decay",
       [&] {
         optim::Adam({p}, {1e-3, 0.9, 0.999, 1e-8, -0.1});
       },
       "ValueError", "option weight_decay"},
      {"adamw_negative_weight_decay",
       [&] {
         optim::AdamW({p}, {1e-3, 0.9, 0.999, 1e-8, -0.1});
       },
       "ValueError", "AdamW: option weight_decay"},
      {"empty_params", [&] { optim::SGD({}, {0.1}); }, "ValueError", "empty parameter list"},
      {"undefined_param",
       [&] {
         optim::Adam({p, Tensor()});
       },
       "ValueError", "parameter 1 is undefined"},
      {"duplicate_param",
       [&] {
         optim::Adam({p, q, p});
       },
       "ValueError", "parameter 2 is the same tensor as parameter 0"},
      {"integer_param", [&] { optim::SGD({nc::zeros({3}, DType::I64)}, {0.1}); }, "DTypeError",
       "parameter 0 must be floating"},
      {"non_contiguous_param",
       [&] {
         optim::SGD({nc::zeros({3, 2}).t()}, {0.1});
       },
       "ValueError", "must be contiguous"},
  };
  for (const InvalidCase& c : cases) expect_error(c.construct, c.kind, c.text, c.name);
}

}  // namespace
