// The Trainer (normcore/train.h) on the CPU: a small model learns, a run stopped and resumed
// from its checkpoint ends with the bits of an uninterrupted one (also from the older
// checkpoint formats), the hooks see the steps, and bad options are typed errors naming
// the option and its value.
#include <gtest/gtest.h>

#include <cmath>

#include <map>
#include <string>
#include <vector>

#include "normcore/models.h"
#include "normcore/normcore.h"
#include "normcore/train.h"
#include "tests/test_support.h"

namespace nc = normcore;
namespace train = normcore::train;
using normcore_test::throws;

namespace {

// Two classes of 8-feature points around +1 and -1 (with noise): a model that learns
// separates them.
std::shared_ptr<const nc::data::TensorDataset> blobs(int64_t n, uint64_t seed) {
  nc::Generator gen(seed);
  const nc::Tensor labels = nc::randint(0, 2, {n}, nc::DType::I64, &gen);
  const nc::Tensor sign = nc::sub(nc::mul(labels.to(nc::DType::F32), 2.0), 1.0);
  const nc::Tensor points = nc::add(nc::randn({n, 8}, {}, &gen), sign.unsqueeze(1));
  return std::make_shared<const nc::data::TensorDataset>(points, labels);
}

// An MLP with dropout, so that a resumed run must also restore the generator.
std::shared_ptr<nc::nn::Module> mlp(nc::Generator* gen) {
  return std::make_shared<nc::nn::Sequential>(std::vector<std::shared_ptr<nc::nn::Module>>{
      std::make_shared<nc::nn::Linear>(8, 16, true, gen), std::make_shared<nc::nn::ReLU>(),
      std::make_shared<nc::nn::Dropout>(0.2, gen), std::make_shared<nc::nn::Linear>(16, 2, true, gen)});
}

nc::Tensor loss_of(const nc::Tensor& logits, const nc::Tensor& labels) { return nc::cross_entropy(logits, labels); }

// Trains a fresh model (seed 11) on blobs with options; returns its state and what the hooks saw.
struct Outcome {
  nc::nn::NamedTensors state;
  std::vector<int64_t> steps, evaluations, checkpoints;
  std::vector<double> losses, eval_losses, grad_norms, loss_scales;
  std::vector<nc::train::MetricsRecord> metrics;
  int64_t saved_step = -1;
  bool graphed = false;
};
Outcome train_blobs(train::TrainerOptions options, const std::string& precision = "fp32") {
  nc::Generator gen(11);
  auto model = mlp(&gen);
  options.generator = &gen;
  options.precision = precision;
  options.progress = false;
  options.loss_every = 1;
  train::Trainer trainer(model, loss_of, train::adamw({0.02, 0.9, 0.999, 1e-8, 0.01}), options);
  trainer.set_schedule(train::cosine_schedule(2, 0.001));
  const auto test = blobs(64, 99);
  trainer.set_evaluate([&](nc::nn::Module& m) -> std::vector<std::pair<std::string, double>> {
    nc::autograd::NoGradGuard no_grad;
    m.eval();
    const double loss =
        loss_of(m(test->inputs().to(options.device)), test->targets().to(options.device)).item<double>();
    m.train();
    return {{"loss", loss}};
  });
  Outcome r;
  r.graphed = trainer.graphed();
  trainer.on_step([&](const train::StepInfo& s) {
    r.steps.push_back(s.step);
    r.losses.push_back(s.loss);
    r.grad_norms.push_back(s.grad_norm);
    r.loss_scales.push_back(s.loss_scale);
  });
  trainer.on_evaluation([&](const train::EvalInfo& e) {
    r.evaluations.push_back(e.step);
    r.eval_losses.push_back(e.results.at(0).second);
  });
  trainer.on_checkpoint([&](const std::string&, int64_t step) { r.checkpoints.push_back(step); });
  nc::data::DataLoaderOptions loader;
  loader.batch_size = 16;
  loader.workers = 0;
  trainer.fit(blobs(80, 5), loader);  // 5 batches an epoch
  r.metrics = trainer.metrics();
  r.saved_step = trainer.state().step;
  r.state = model->state_dict();
  for (auto& [name, t] : r.state) t = t.to(nc::Device::cpu());
  return r;
}

void expect_same_bits(const nc::nn::NamedTensors& a, const nc::nn::NamedTensors& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second.to_vector<float>(), b[i].second.to_vector<float>()) << a[i].first;
  }
}

}  // namespace

class Trainer : public normcore_test::TempDirTest {
 protected:
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
};

TEST_F(Trainer, TheLossFallsAndTheHooksSeeEveryStep) {
  train::TrainerOptions options;
  options.steps = 12;
  options.eval_interval = 5;
  options.checkpoint = path("run.safetensors");
  const Outcome r = train_blobs(options);
  EXPECT_EQ(r.steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(r.evaluations, (std::vector<int64_t>{5, 10, 12}));
  EXPECT_EQ(r.checkpoints, (std::vector<int64_t>{5, 10, 12}));
  ASSERT_EQ(r.eval_losses.size(), 3u);
  // Two classes at +-1 in 8 dimensions are separable: from ln 2 (0.69) to well below.
  EXPECT_GT(r.losses.front(), 0.5);
  EXPECT_LT(r.eval_losses.back(), 0.25);
  EXPECT_LT(r.eval_losses.back(), r.eval_losses.front());
  // The metrics: a train record per loss read (every step here), one per evaluation.
  ASSERT_EQ(r.metrics.size(), 15u);
  EXPECT_EQ(r.metrics[0].phase, "train");
  EXPECT_EQ(r.metrics[0].values.at("loss"), r.losses[0]);
  EXPECT_EQ(r.metrics[5].phase, "eval");
  EXPECT_EQ(r.metrics[5].step, 5);
  EXPECT_EQ(r.metrics[5].values.at("loss"), r.eval_losses[0]);
  EXPECT_EQ(r.saved_step, 12);
  const train::TrainingState saved = train::load_training_state(options.checkpoint);
  EXPECT_EQ(saved.step, 12);
  EXPECT_EQ(saved.epoch, 2);  // 12 steps of 5 batches an epoch: epoch 2, batch 2
  EXPECT_EQ(saved.batch, 2);
  EXPECT_EQ(saved.seed, 11u);  // the generator's
  EXPECT_EQ(saved.data_seed, 0u);
  EXPECT_TRUE(saved.has_rng);
  EXPECT_EQ(saved.metadata.at("format"), train::kCheckpointFormat);
}

// With clipping the records carry the gradients' norm before clipping, and with fp16 the
// loss scale; the same gradients give the same norm in f32 and under fp16's autocast (to
// its rounding), the scale is the scaler's initial one in a run without overflow, and
// without clipping there is no norm to report.
TEST_F(Trainer, RecordsTheGradientNormAndTheLossScale) {
  train::TrainerOptions options;
  options.steps = 4;
  options.clip = 1e-3;  // below the norms: every step clipped, the norm still the one before
  const Outcome f32 = train_blobs(options), f16 = train_blobs(options, "fp16");
  ASSERT_EQ(f32.grad_norms.size(), 4u);
  for (const Outcome* r : {&f32, &f16}) {
    for (size_t i = 0; i < r->grad_norms.size(); ++i) {
      EXPECT_TRUE(std::isfinite(r->grad_norms[i]) && r->grad_norms[i] > 1e-3) << i << ": " << r->grad_norms[i];
      EXPECT_EQ(r->metrics[i].values.at("grad_norm"), r->grad_norms[i]);
    }
  }
  EXPECT_NEAR(f16.grad_norms[0], f32.grad_norms[0], 0.01 * f32.grad_norms[0]);
  EXPECT_TRUE(std::isnan(f32.loss_scales[0]));
  EXPECT_EQ(f32.metrics[0].values.count("loss_scale"), 0u);
  EXPECT_EQ(f16.loss_scales[0], 65536.0);
  EXPECT_EQ(f16.metrics[0].values.at("loss_scale"), 65536.0);
  options.clip = 0;
  const Outcome unclipped = train_blobs(options);
  EXPECT_TRUE(std::isnan(unclipped.grad_norms[0]));
  EXPECT_EQ(unclipped.metrics[0].values.count("grad_norm"), 0u);
}

// Stopped after 6 steps (within the second epoch) and resumed, fp32 and fp16 (the loss
// scaler's state in the checkpoint): the weights are those of a run that never stopped.
TEST_F(Trainer, AResumedRunEndsBitIdentical) {
  for (const std::string precision : {"fp32", "fp16"}) {
    SCOPED_TRACE(precision);
    train::TrainerOptions options;
    options.steps = 12;
    options.eval_interval = 3;
    options.seed = 4;
    options.checkpoint = path("whole.safetensors");
    const Outcome whole = train_blobs(options, precision);
    options.checkpoint = path("part.safetensors");
    options.stop_after = 7;
    const Outcome first = train_blobs(options, precision);
    EXPECT_EQ(first.steps.back(), 7);
    options.stop_after = 0;
    options.resume = options.checkpoint;
    const Outcome second = train_blobs(options, precision);
    EXPECT_EQ(second.steps.front(), 8);
    expect_same_bits(whole.state, second.state);
    EXPECT_EQ(whole.eval_losses.back(), second.eval_losses.back());
  }
}

// On a GPU, each step one CUDA graph in bf16 and fp16 (the scaler's state on the device):
// a run stopped within an epoch and resumed, capturing its graph again, ends with the bits
// of one that never stopped.
TEST_F(Trainer, CudaGraphedMixedPrecisionResumesBitIdentical) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (const std::string precision : {"bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    train::TrainerOptions options;
    options.device = nc::Device::cuda();
    options.cuda_graph = "on";
    options.steps = 12;
    options.eval_interval = 3;
    options.checkpoint = path("whole.safetensors");
    const Outcome whole = train_blobs(options, precision);
    EXPECT_TRUE(whole.graphed);
    EXPECT_LT(whole.eval_losses.back(), 0.3);
    options.checkpoint = path("part.safetensors");
    options.stop_after = 7;
    train_blobs(options, precision);
    options.stop_after = 0;
    options.resume = options.checkpoint;
    const Outcome second = train_blobs(options, precision);
    EXPECT_EQ(second.steps.front(), 8);
    expect_same_bits(whole.state, second.state);
  }
}

// A checkpoint of the classifier's older format (written as `normcore train` wrote it:
// "epoch", the generator among the options, the scaler among the optimizer's entries)
// resumes to the same bits as the run that never stopped.
TEST_F(Trainer, OlderClassifierCheckpointsResume) {
  train::TrainerOptions options;
  options.epochs = 3;
  options.seed = 11;  // the older format had one seed for the generator and the loader
  options.checkpoint = path("whole.safetensors");
  const Outcome whole = train_blobs(options, "fp16");
  options.checkpoint = path("part.safetensors");
  options.stop_after = 1;
  train_blobs(options, "fp16");
  const train::TrainingState s = train::load_training_state(options.checkpoint);
  ASSERT_EQ(s.batch, 0);
  nc::safetensors::TensorList tensors;
  for (const auto& [k, v] : s.model_state) tensors.emplace_back("model." + k, v);
  for (const auto& [k, v] : s.optimizer_state) tensors.emplace_back("optim." + k, v);
  for (const auto& [k, v] : s.scaler_state) tensors.emplace_back("optim.grad_scaler." + k, v);
  for (const auto& [k, v] : s.schedule_state) tensors.emplace_back("schedule." + k, v);
  std::map<std::string, std::string> metadata{{"format", "normcore-classifier"},
                                              {"model", "custom"},
                                              {"epoch", std::to_string(s.epoch)},
                                              {"option.seed", "11"},
                                              {"option.rng.offset", std::to_string(s.rng_offset)}};
  const std::string old = path("old.safetensors");
  nc::safetensors::save(old, tensors, metadata);
  const train::TrainingState read = train::load_training_state(old);
  EXPECT_EQ(read.epoch, 1);
  EXPECT_EQ(read.step, -1);
  EXPECT_EQ(read.scaler_state.size(), s.scaler_state.size());
  EXPECT_FALSE(read.scaler_state.empty());
  options.stop_after = 0;
  options.resume = old;
  options.checkpoint = path("resumed.safetensors");
  const Outcome resumed = train_blobs(options, "fp16");
  EXPECT_EQ(resumed.steps.front(), 6);  // after epoch 1 of 5 batches
  expect_same_bits(whole.state, resumed.state);
}

// A GPT checkpoint of the older "normcore-gpt" format, as `normcore train-lm` wrote it (step
// 20 of a 2-layer model, seed 1): the model loads, and a Trainer resumes from it with every
// optimizer state ("decay.", "no_decay.") and the generator in place.
TEST_F(Trainer, OlderGptCheckpointsLoadAndResume) {
  const std::string old = std::string(NORMCORE_TEST_DATA_DIR) + "/checkpoints/gpt-format-normcore-gpt.safetensors";
  const train::TrainingState s = train::load_training_state(old);
  EXPECT_EQ(s.metadata.at("format"), "normcore-gpt");
  EXPECT_EQ(s.model, "gpt");
  EXPECT_EQ(s.step, 20);
  EXPECT_EQ(s.seed, 1u);
  EXPECT_TRUE(s.has_rng);
  EXPECT_EQ(s.description.at("layers"), "2");
  EXPECT_TRUE(s.scaler_state.empty());
  const nc::models::GPTCheckpoint c = nc::models::load_gpt_checkpoint(old);
  EXPECT_EQ(c.step, 20);
  EXPECT_EQ(c.model->config.embed, 32);
  const nc::nn::NamedTensors loaded = c.model->state_dict();
  ASSERT_EQ(loaded.size(), s.model_state.size());
  for (size_t i = 0; i < loaded.size(); ++i)
    EXPECT_EQ(loaded[i].second.to_vector<float>(), s.model_state[i].second.to_vector<float>()) << loaded[i].first;

  train::TrainerOptions options;
  options.steps = 22;
  options.resume = old;
  options.progress = false;
  nc::Generator gen(0);
  options.generator = &gen;
  auto model = c.model;
  train::Trainer trainer(
      model,
      [&](nc::nn::Module&, const nc::Tensor& x, const nc::Tensor& y) { return nc::models::lm_loss(*model, x, y); },
      train::adamw_decay_matrices({0.003, 0.9, 0.95, 1e-8, 0.1}), options);
  trainer.set_schedule(train::cosine_schedule(5, 1e-4));
  std::vector<int64_t> steps;
  trainer.on_step([&](const train::StepInfo& info) { steps.push_back(info.step); });
  std::string bytes(400, ' ');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>('a' + i % 26);
  nc::data::DataLoaderOptions loader;
  loader.batch_size = 4;
  loader.workers = 0;
  EXPECT_EQ(trainer.fit(std::make_shared<nc::data::TextWindows>(bytes, 32), loader), 22);
  EXPECT_EQ(steps, (std::vector<int64_t>{21, 22}));
  EXPECT_EQ(trainer.seed(), 1u);
  // The schedules and optimizers continue from step 20 (each AdamW counts its own steps).
  for (nc::optim::Optimizer* o : trainer.optimizers()) {
    for (const auto& [name, value] : o->state_dict())
      if (name == "state.0.step") EXPECT_EQ(value.item<double>(), 22.0);
  }
}

TEST_F(Trainer, BadOptionsNameTheOptionAndTheValue) {
  nc::Generator gen(1);
  auto make = [&](std::function<void(train::TrainerOptions&)> change) {
    return [&gen, change] {
      train::TrainerOptions o;
      o.steps = 1;
      change(o);
      train::Trainer(mlp(&gen), loss_of, train::adamw({}), o);
    };
  };
  throws<nc::ValueError>(make([](auto& o) { o.precision = "fp8"; }), {"--precision", "fp8"})();
  throws<nc::ValueError>(make([](auto& o) { o.cuda_graph = "yes"; }), {"--cuda-graph", "yes"})();
  throws<nc::ValueError>(make([](auto& o) { o.cuda_graph = "on"; }), {"--cuda-graph on", "CUDA device"})();
  throws<nc::ValueError>(make([](auto& o) { o.clip = -1; }), {"clip", "-1"})();
  throws<nc::ValueError>(make([](auto& o) { o.epochs = 2; }), {"epochs 2", "steps 1"})();
  throws<nc::ValueError>(make([](auto& o) { o.loss_every = 0; }), {"loss_every", "0"})();
  throws<nc::ValueError>(make([](auto& o) { o.eval_interval = -3; }), {"eval_interval", "-3"})();
  throws<nc::ValueError>(make([](auto& o) { o.unit = "images"; }), {"unit", "images"})();
  const std::string missing = path("missing.safetensors");
  throws<nc::IOError>(
      [&] {
        train::TrainerOptions o;
        o.steps = 1;
        o.resume = missing;
        train::Trainer t(mlp(&gen), loss_of, train::adamw({}), o);
        t.fit(blobs(8, 1), {});
      },
      {missing})();
  const std::string plain = path("plain.safetensors");
  nc::safetensors::save(plain, {{"w", nc::zeros({2})}});
  throws<nc::IOError>([&] { train::load_training_state(plain); }, {"load_training_state", plain, "'format'"})();
}
