// Optimizers, schedules and gradient clipping: SGD/Adam/AdamW trajectories against
// reference values (PyTorch's update rules evaluated in float64, written out below) for
// every option that changes the math, in f64, f32, f16 and bf16; state-dict round trips
// that resume bit for bit; option and state-dict errors; the CUDA kernels against the CPU.
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

namespace nc = normcore;
namespace optim = normcore::optim;
using nc::DType;
using nc::Tensor;

namespace {

using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

template <class Opt, class Options>
MakeOptimizer make(Options options) {
  return [options](std::vector<Tensor> params) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<Opt>(std::move(params), options);
  };
}

Tensor vector_tensor(const std::vector<double>& values, DType dtype, nc::Device device = nc::Device::cpu()) {
  return nc::from_vector(values, {static_cast<int64_t>(values.size())}).to(device, dtype);
}

Tensor param_of(const std::vector<double>& values, DType dtype, nc::Device device = nc::Device::cpu()) {
  return vector_tensor(values, dtype, device).requires_grad_();
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LE(std::fabs(got[i] - want[i]), atol + rtol * std::fabs(want[i]))
        << what << " element " << i << ": got " << got[i] << ", want " << want[i];
  }
}

struct Tolerance {
  DType dtype;
  double rtol, atol;
};

const std::vector<Tolerance>& trajectory_dtypes() {
  static const std::vector<Tolerance> dtypes = {
      {DType::F64, 1e-12, 1e-12},
      {DType::F32, 2e-6, 1e-6},
      {DType::F16, 4e-3, 1e-3},   // params round to 11 bits after every step
      {DType::BF16, 3e-2, 1e-2},  // and to 8 bits
  };
  return dtypes;
}

// The name of the normcore::Error subclass e is.
std::string error_kind(const std::exception& e) {
  if (dynamic_cast<const nc::ShapeError*>(&e)) return "ShapeError";
  if (dynamic_cast<const nc::DTypeError*>(&e)) return "DTypeError";
  if (dynamic_cast<const nc::DeviceError*>(&e)) return "DeviceError";
  if (dynamic_cast<const nc::IndexError*>(&e)) return "IndexError";
  if (dynamic_cast<const nc::ValueError*>(&e)) return "ValueError";
  if (dynamic_cast<const nc::Error*>(&e)) return "Error";
  return typeid(e).name();
}

// Runs f and expects it to throw kind with message containing text.
void expect_error(const std::function<void()>& f, const std::string& kind, const std::string& text,
                  const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": no exception, expected " << kind;
  } catch (const std::exception& e) {
    EXPECT_EQ(error_kind(e), kind) << what << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos)
        << what << ": message \"" << e.what() << "\" lacks \"" << text << "\"";
  }
}

// ---------------------------------------------------------------- trajectories

const std::vector<double> kStart = {1.0, -2.0, 0.5, 3.0, -0.75};
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

struct BadStateCase {
  std::string name;
  std::function<void(optim::StateDict&)> mutate;
  std::string kind;
  std::string text;
};

void set_entry(optim::StateDict& state, const std::string& name, const Tensor& t) {
  for (auto& entry : state) {
    if (entry.first == name) {
      entry.second = t;
      return;
    }
  }
  state.emplace_back(name, t);
}

void erase_entry(optim::StateDict& state, const std::string& name) {
  for (size_t i = 0; i < state.size(); ++i) {
    if (state[i].first == name) {
      state.erase(state.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  }
  FAIL() << "no entry " << name;
}

Tensor f64(double v) { return nc::full({}, v, DType::F64); }

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

struct InvalidCase {
  std::string name;
  std::function<void()> construct;
  std::string kind;
  std::string text;
};

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
