// The training loop of normcore/train.h: the step (autocast, backward, clipping, the
// update, as one CUDA graph where it can be), the schedule, progress, evaluation, metrics
// and checkpoints, resumed bit for bit from a checkpoint.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "normcore/autocast.h"
#include "normcore/autograd.h"
#include "normcore/error.h"
#include "normcore/graphed_step.h"
#include "normcore/ops.h"
#include "normcore/train.h"

namespace normcore {
namespace train {

// ---------------------------------------------------------------- optimizers, schedules
namespace {

template <class O, class Options>
OptimizerFactory single(Options options) {
  return [options](nn::Module& model) {
    std::vector<NamedOptimizer> out;
    out.push_back({"", std::make_unique<O>(model.parameters(), options)});
    return out;
  };
}

}  // namespace

OptimizerFactory sgd(optim::SGDOptions options) { return single<optim::SGD>(options); }
OptimizerFactory adam(optim::AdamOptions options) { return single<optim::Adam>(options); }
OptimizerFactory adamw(optim::AdamWOptions options) { return single<optim::AdamW>(options); }

OptimizerFactory adamw_decay_matrices(optim::AdamWOptions options) {
  return [options](nn::Module& model) {
    std::vector<Tensor> matrices, others;
    for (const Tensor& p : model.parameters()) (p.dim() >= 2 ? matrices : others).push_back(p);
    optim::AdamWOptions no_decay = options;
    no_decay.weight_decay = 0.0;
    std::vector<NamedOptimizer> out;
    out.push_back({"decay", std::make_unique<optim::AdamW>(matrices, options)});
    out.push_back({"no_decay", std::make_unique<optim::AdamW>(others, no_decay)});
    return out;
  };
}

ScheduleFactory cosine_schedule(int64_t warmup_steps, double min_lr) {
  return [warmup_steps, min_lr](optim::Optimizer& optimizer, int64_t total_steps) {
    return std::make_unique<optim::CosineLR>(optimizer, std::min(warmup_steps, total_steps - 1), total_steps, min_lr);
  };
}

// ---------------------------------------------------------------- the trainer
namespace {

void check_options(const TrainerOptions& o) {
  NC_CHECK((o.epochs > 0) != (o.steps > 0), ValueError,
           "Trainer: give one of options epochs and steps (> 0), got "
           "epochs ",
           o.epochs, " and steps ", o.steps);
  NC_CHECK(o.clip >= 0 && std::isfinite(o.clip), ValueError, "Trainer: option clip must be >= 0 (0: off), got ",
           o.clip);
  NC_CHECK(o.eval_interval >= 0, ValueError, "Trainer: option eval_interval must be >= 0, got ", o.eval_interval);
  NC_CHECK(o.stop_after >= 0, ValueError, "Trainer: option stop_after must be >= 0, got ", o.stop_after);
  NC_CHECK(o.loss_every >= 1, ValueError, "Trainer: option loss_every must be >= 1, got ", o.loss_every);
  NC_CHECK(o.unit == "samples" || o.unit == "tokens", ValueError,
           "Trainer: option unit must be samples or "
           "tokens, got '",
           o.unit, "'");
  NC_CHECK(o.resume.empty() || o.resume != o.log, ValueError,
           "Trainer: options resume and log name the same "
           "file '",
           o.resume, "'");
}

// The names of a group of optimizers' entries: "<name>.<key>", or "<key>" alone.
nn::NamedTensors named(const std::string& name, const nn::NamedTensors& state) {
  if (name.empty()) return state;
  nn::NamedTensors out;
  for (const auto& [k, v] : state) out.emplace_back(name + "." + k, v);
  return out;
}
nn::NamedTensors part(const std::string& name, const nn::NamedTensors& all) {
  if (name.empty()) return all;
  const std::string prefix = name + ".";
  nn::NamedTensors out;
  for (const auto& [k, v] : all)
    if (k.compare(0, prefix.size(), prefix) == 0) out.emplace_back(k.substr(prefix.size()), v);
  return out;
}

}  // namespace

Trainer::Trainer(std::shared_ptr<nn::Module> model, Loss loss, OptimizerFactory optimizer, TrainerOptions options)
    : Trainer(std::move(model), StepLoss(), std::move(optimizer), std::move(options)) {
  NC_CHECK(loss, ValueError, "Trainer: the loss function is empty");
  loss_ = std::move(loss);
}

Trainer::Trainer(std::shared_ptr<nn::Module> model, StepLoss loss, OptimizerFactory optimizer, TrainerOptions options)
    : model_(std::move(model)), step_loss_(std::move(loss)), optimizer_factory_(std::move(optimizer)),
      options_(std::move(options)), precision_(options_.precision, options_.device),
      gen_(options_.generator ? options_.generator : &default_generator()), log_(std::make_unique<MetricsLog>()) {
  NC_CHECK(model_, ValueError, "Trainer: the model is null");
  NC_CHECK(optimizer_factory_, ValueError, "Trainer: the optimizer factory is empty");
  check_options(options_);
  NC_CHECK(!options_.shard_optimizer || job_.active(), ValueError,
           "Trainer: shard_optimizer needs a data-parallel job (ranks started by a launcher: WORLD_SIZE is unset)");
  graphed_ = use_cuda_graph(options_.cuda_graph, options_.device, options_.detect_anomaly);
  autograd::set_anomaly_enabled(options_.detect_anomaly);
  model_->to(options_.device);
  model_->train();
  seed_ = options_.seed;
}

Trainer::~Trainer() = default;

std::vector<optim::Optimizer*> Trainer::optimizers() const {
  std::vector<optim::Optimizer*> out;
  for (const NamedOptimizer& o : optimizers_) out.push_back(o.optimizer.get());
  return out;
}

Tensor Trainer::train_step(const std::vector<Tensor>& in) {
  Tensor loss;
  {
    autocast::Guard autocast(precision_.dtype(), precision_.autocast());
    if (step_loss_) {
      loss = step_loss_(*model_, in[0], in[1]);
    } else {
      const Tensor outputs = job_.ddp() ? (*job_.ddp())(in[0]) : (*model_)(in[0]);
      loss = loss_(outputs, in[1]);
    }
  }
  for (NamedOptimizer& o : optimizers_) o.optimizer->zero_grad();
  const Tensor norm = precision_.backward_and_step(loss, params_, options_.clip, [&](const Tensor& found_inf) {
    for (size_t i = 0; i < optimizers_.size(); ++i) {
      if (sharded_.empty()) optimizers_[i].optimizer->step_unless(found_inf);
      else sharded_[i]->step_unless(found_inf);
    }
  });
  if (!norm.defined()) return loss;
  // The loss and the gradient norm as one tensor: a graphed step returns one, and the
  // two are read from the device together.
  return cat({loss.detach().to(DType::F32).reshape({1}), norm.detach().to(DType::F32).reshape({1})}, 0);
}

namespace {

// The loss and, with clipping, the gradient norm of train_step's result (one wait for the
// device).
std::pair<double, double> read_step(const Tensor& result) {
  if (result.numel() == 1) return {result.item<double>(), NAN};
  const std::vector<double> values = result.to(Device::cpu()).to_vector<double>();
  return {values[0], values[1]};
}

}  // namespace

void Trainer::prepare(std::shared_ptr<const data::Dataset> data, data::DataLoaderOptions loader_options) {
  NC_CHECK(data, ValueError, "Trainer: the dataset is null");
  NC_CHECK(loss_ || step_loss_, ValueError, "Trainer: the loss function is empty");
  NC_CHECK(!loader_, ValueError, "Trainer: fit or benchmark runs once per Trainer");
  TrainingState resumed;
  resuming_ = !options_.resume.empty();
  if (resuming_) {
    resumed = load_training_state(options_.resume);
    NC_CHECK(resumed.has_rng, IOError, "--resume ", options_.resume, ": the checkpoint has no random-generator state");
    // The checkpoint's seed and generator position: the resumed run draws the batches and
    // dropout masks that an uninterrupted one would.
    model_->load_state_dict(resumed.model_state);
    seed_ = resumed.data_seed;
    gen_->manual_seed(resumed.seed);
    gen_->set_offset(resumed.rng_offset);
  }
  rng_seed_ = gen_->seed();
  distributed::DataParallelOptions ddp_options;
  ddp_options.reduce_dtype = options_.reduce_dtype;
  job_.start(model_, options_.device, *gen_, rng_seed_, options_.timeout_s, ddp_options);
  optimizers_ = optimizer_factory_(*model_);
  NC_CHECK(!optimizers_.empty(), ValueError, "Trainer: the optimizer factory made no optimizer");
  params_ = model_->parameters();
  if (options_.shard_optimizer && job_.group()) {
    for (NamedOptimizer& o : optimizers_)
      sharded_.push_back(std::make_unique<distributed::ShardedOptimizer>(*o.optimizer, *job_.group()));
    gathered_state_.resize(optimizers_.size());
  }

  loader_options.seed = seed_;
  loader_options.device = options_.device;
  loader_options.num_replicas = job_.world_size();
  loader_options.rank = job_.rank();
  loader_ = std::make_unique<data::DataLoader>(std::move(data), loader_options);
  batches_per_epoch_ = loader_->num_batches();
  total_ = options_.epochs > 0 ? options_.epochs * batches_per_epoch_ : options_.steps;
  if (schedule_)
    for (NamedOptimizer& o : optimizers_) schedules_.push_back(schedule_(*o.optimizer, total_));
  step_ = 0;
  if (resuming_) {
    step_ = resumed.step >= 0 ? resumed.step : resumed.epoch * batches_per_epoch_;
    for (size_t i = 0; i < optimizers_.size(); ++i) {
      const nn::NamedTensors state = part(optimizers_[i].name, resumed.optimizer_state);
      if (!state.empty() && sharded_.empty()) optimizers_[i].optimizer->load_state_dict(state);
      if (!state.empty() && !sharded_.empty()) sharded_[i]->load_state_dict(state);
      if (i < schedules_.size()) {
        const nn::NamedTensors schedule = part(optimizers_[i].name, resumed.schedule_state);
        if (!schedule.empty()) schedules_[i]->load_state_dict(schedule);
      }
    }
    precision_.load_state_dict(resumed.scaler_state);
  }
  step_fn_ = std::make_unique<GraphedStep>([this](const std::vector<Tensor>& in) { return train_step(in); }, graphed_);
  loader_->begin_epoch(static_cast<uint64_t>(step_ / batches_per_epoch_), step_ % batches_per_epoch_);
}

Tensor Trainer::advance(StepInfo& info, int64_t& amount) {
  data::Batch batch;
  if (!loader_->next(batch)) {
    loader_->begin_epoch(static_cast<uint64_t>(step_ / batches_per_epoch_));
    loader_->next(batch);
  }
  info.lr = optimizers_[0].optimizer->lr();  // this step's
  const Tensor loss = (*step_fn_)({batch.inputs, batch.targets});
  // A replayed step's collectives are not seen one by one: the watchdog times the step.
  if (job_.group() && step_fn_->captured()) job_.group()->watch("a data-parallel training step (CUDA graph)");
  for (auto& s : schedules_) s->step();  // also after a skipped fp16 step
  amount += (options_.unit == "tokens" ? batch.inputs.numel() : batch.inputs.size(0)) * job_.world_size();
  info.step = step_ + 1;
  info.epoch = step_ / batches_per_epoch_;
  return loss;
}

int64_t Trainer::fit(std::shared_ptr<const data::Dataset> data, data::DataLoaderOptions loader_options) {
  prepare(std::move(data), std::move(loader_options));
  const bool main = job_.is_main(), by_epoch = options_.epochs > 0;
  const int64_t interval = options_.eval_interval > 0 ? options_.eval_interval : batches_per_epoch_;
  log_ = std::make_unique<MetricsLog>(main ? options_.log : std::string(), /*append=*/resuming_);
  if (main)
    for (const auto& hook : start_hooks_) hook(step_);
  const int64_t stop =
      options_.stop_after > 0 ? std::min(total_, options_.stop_after * (by_epoch ? batches_per_epoch_ : 1)) : total_;
  const std::string rate_name = options_.unit + "_per_s";
  while (step_ < stop) {
    const int64_t start = step_, end = std::min(stop, (step_ / interval + 1) * interval);
    std::unique_ptr<Progress> progress;
    if (main && options_.progress) {
      progress = by_epoch ? std::make_unique<Progress>(detail::cat_str("epoch ", step_ / batches_per_epoch_ + 1, "/",
                                                                       options_.epochs),
                                                       end - start, options_.unit)
                          : std::make_unique<Progress>("train", total_, options_.unit, start);
    }
    const auto started = std::chrono::steady_clock::now();
    auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(); };
    double loss_sum = 0;
    int64_t loss_count = 0, amount = 0;
    // A train record: the loss, learning rate and rate given, and the last step read's
    // gradient norm (with clipping) and loss scale (fp16).
    StepInfo last_read;
    const auto train_values = [&](double loss, double lr, double rate) {
      std::vector<std::pair<std::string, double>> values = {{"loss", loss}, {"lr", lr}, {rate_name, rate}};
      if (options_.clip > 0) values.emplace_back("grad_norm", last_read.grad_norm);
      if (precision_.scaler()) values.emplace_back("loss_scale", last_read.loss_scale);
      return values;
    };
    for (; step_ < end; ++step_) {
      StepInfo info;
      const Tensor loss = advance(info, amount);
      // Reading the loss waits for the device: every loss_every steps (counted from the
      // epoch's start, or from the run's), on the rank that prints.
      const int64_t counted = by_epoch ? step_ - start : step_;
      if (main && (counted % options_.loss_every == 0 || step_ + 1 == end)) {
        std::tie(info.loss, info.grad_norm) = read_step(loss);
        if (precision_.scaler()) info.loss_scale = precision_.scaler()->get_scale();
        loss_sum += info.loss;
        ++loss_count;
        const double mean = loss_sum / static_cast<double>(loss_count);
        if (progress) progress->update(by_epoch ? step_ + 1 - start : step_ + 1, amount, mean);
        last_read = info;
        if (!by_epoch)
          log_->log(step_ + 1, "train", train_values(info.loss, info.lr, static_cast<double>(amount) / seconds()));
      }
      for (const auto& hook : step_hooks_) hook(info);
    }
    // Sharded optimizers' state is put together on every rank, for rank 0's checkpoint.
    for (size_t i = 0; i < sharded_.size(); ++i) gathered_state_[i] = sharded_[i]->state_dict();
    if (!main) continue;  // the others go on and wait in the next step's first all-reduce
    if (progress) progress->finish();
    EvalInfo e;
    e.step = step_;
    e.epoch = step_ / batches_per_epoch_;
    e.seconds = seconds();
    e.train_loss = loss_sum / static_cast<double>(std::max<int64_t>(loss_count, 1));
    e.rate = static_cast<double>(amount) / e.seconds;
    if (evaluate_) e.results = evaluate_(*model_);
    const int64_t x = by_epoch ? e.epoch : step_;
    if (by_epoch) log_->log(x, "train", train_values(e.train_loss, optimizers_[0].optimizer->lr(), e.rate));
    if (!e.results.empty()) log_->log(x, options_.eval_phase, e.results);
    if (!options_.plot.empty()) {
      const std::vector<MetricsRecord> records = options_.log.empty() ? log_->records() : read_metrics(options_.log);
      write_curves_svg(options_.plot, records, options_.curves, options_.title, by_epoch ? "epoch" : "step");
    }
    for (const auto& hook : eval_hooks_) hook(e);
    if (!options_.checkpoint.empty()) {
      save(options_.checkpoint);
      for (const auto& hook : checkpoint_hooks_) hook(options_.checkpoint, step_);
    }
  }
  job_.finish();
  return step_;
}

Trainer::Timing Trainer::benchmark(std::shared_ptr<const data::Dataset> data, data::DataLoaderOptions loader_options,
                                   int64_t warmup, int64_t timed) {
  NC_CHECK(warmup >= 0 && timed >= 1, ValueError, "Trainer::benchmark: warmup must be >= 0 and timed >= 1, got ",
           warmup, " and ", timed);
  prepare(std::move(data), std::move(loader_options));
  if (job_.is_main())
    for (const auto& hook : start_hooks_) hook(step_);
  // Between two reads of the loss, which wait for the device.
  Timing t;
  auto run = [&](int64_t count) {
    Tensor last;
    int64_t amount = 0;
    for (int64_t i = 0; i < count; ++i, ++step_) {
      StepInfo info;
      last = advance(info, amount);
    }
    t.amount = amount;
    if (last.defined()) t.loss = read_step(last).first;
  };
  run(warmup);
  distributed::DistributedDataParallel* ddp = job_.ddp();
  const bool time_reductions = ddp && !graphed_ && options_.device.is_cuda();
  if (time_reductions) ddp->time_reductions(true);
  const auto start = std::chrono::steady_clock::now();
  run(timed);
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (time_reductions) {
    const distributed::DistributedDataParallel::ReductionWait wait = ddp->reduction_wait();
    if (wait.backwards > 0) t.reduction_wait_ms = wait.total_ms / static_cast<double>(wait.backwards);
    ddp->time_reductions(false);
  }
  job_.finish();
  return t;
}

TrainingState Trainer::state() const {
  TrainingState s;
  s.model = options_.model_name;
  s.description = options_.description;
  s.options = options_.options;
  s.model_state = model_->state_dict();
  for (size_t i = 0; i < optimizers_.size(); ++i) {
    const optim::StateDict state = sharded_.empty() ? optimizers_[i].optimizer->state_dict() : gathered_state_[i];
    for (auto& entry : named(optimizers_[i].name, state)) s.optimizer_state.push_back(std::move(entry));
    if (i < schedules_.size())
      for (auto& entry : named(optimizers_[i].name, schedules_[i]->state_dict()))
        s.schedule_state.push_back(std::move(entry));
  }
  s.scaler_state = precision_.state_dict();
  s.step = step_;
  s.epoch = step_ / batches_per_epoch_;
  s.batch = step_ % batches_per_epoch_;
  s.seed = rng_seed_;
  s.data_seed = seed_;
  s.rng_offset = gen_->offset();
  s.has_rng = true;
  return s;
}

void Trainer::save(const std::string& path) const { save_training_state(path, state()); }

}  // namespace train
}  // namespace normcore
