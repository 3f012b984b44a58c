// Training as a library: a Trainer that runs the loop for any nn::Module (mixed precision
// with a loss scaler, CUDA-graph steps, data parallelism from the launcher's environment,
// progress, evaluation, metrics, checkpoints that resume bit for bit: on CUDA, a model whose
// ops may sum with atomics, attention's backward on Hopper, needs cuda::set_deterministic(true)
// for that), the pieces it is
// made of (Precision, Progress, DataParallelJob), and the one checkpoint format of every
// model. The model, its optimizer and the data stay the caller's; the Trainer owns the
// loop, the loader and the schedule.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "normcore/data.h"
#include "normcore/device.h"
#include "normcore/distributed.h"
#include "normcore/dtype.h"
#include "normcore/metrics.h"
#include "normcore/nn.h"
#include "normcore/optim.h"
#include "normcore/random.h"
#include "normcore/tensor.h"

#pragma GCC visibility push(default)

namespace normcore {
class GraphedStep;
namespace train {

// ---------------------------------------------------------------- precision
// The arithmetic of a training step: fp32; tf32 (f32 matmuls and convolutions on TF32
// tensor cores on CUDA; the CPU computes in f32 regardless); bf16 and fp16 run the forward
// under autocast (normcore/autocast.h) with f32 parameters, fp16 with a GradScaler.
class Precision {
 public:
  // ValueError naming the option for anything but fp32, tf32, bf16 or fp16.
  explicit Precision(const std::string& name = "fp32", Device device = Device::cpu());
  const std::string& name() const { return name_; }
  bool autocast() const { return autocast_; }
  DType dtype() const { return dtype_; }
  const optim::GradScaler* scaler() const { return scaler_.get(); }

  // backward from loss, then clipping (clip > 0) and the update: step(found_inf) with an
  // undefined tensor, or for fp16 with the scaler's flag, which skips the update on the
  // device when a gradient holds an inf or a NaN. Never waits for the device. Returns the
  // gradients' total 2-norm before clipping (a device scalar; undefined when clip is 0).
  Tensor backward_and_step(const Tensor& loss, const std::vector<Tensor>& params, double clip,
                           const std::function<void(const Tensor& found_inf)>& step);
  // ", loss scale 65536 (3 steps skipped)" for fp16, else "".
  std::string scaler_report() const;
  // The scaler's state (empty without one).
  nn::NamedTensors state_dict() const;
  void load_state_dict(const nn::NamedTensors& state);

 private:
  std::string name_;
  bool autocast_ = false;
  DType dtype_ = DType::BF16;
  std::unique_ptr<optim::GradScaler> scaler_;
};

// "auto", "on" or "off": whether steps replay as CUDA graphs. auto is on for a CUDA device
// unless anomaly detection is on; on throws ValueError naming what prevents it. ValueError
// naming the option for any other value. Data-parallel steps are graphed too: their
// bucketed all-reduces replay with the rest of the step.
bool use_cuda_graph(const std::string& mode, const Device& device, bool anomaly);

// ---------------------------------------------------------------- progress
// A one-line progress bar on a terminal; a line every tenth of the way otherwise. label
// names the run ("epoch 2/12"), done counts up from first to total, and the rate counts
// unit ("samples") per second since construction.
class Progress {
 public:
  Progress(std::string label, int64_t total, std::string unit, int64_t first = 0);
  void update(int64_t done, int64_t amount, double loss);
  void finish();
  double elapsed() const;

 private:
  std::string label_, unit_;
  int64_t total_;
  int64_t printed_tenths_;  // tenths already reported (plain output)
  bool tty_;
  std::chrono::steady_clock::time_point start_;
};

// ---------------------------------------------------------------- data parallel
// The data-parallel side of a run. A process a launcher started (WORLD_SIZE set) is a rank
// of a job, also when alone: it trains on cuda:LOCAL_RANK or the CPU, joins the process
// group, wraps its model in DistributedDataParallel and draws its own dropout masks; data
// loaders shard each epoch's order by rank. Rank 0 alone prints, evaluates and checkpoints.
class DataParallelJob {
 public:
  DataParallelJob();  // from the environment
  bool active() const { return active_; }
  bool is_main() const { return env_.rank == 0; }
  int rank() const { return active_ ? env_.rank : 0; }
  int world_size() const { return active_ ? env_.world_size : 1; }
  // The device for a --device spec (auto, cpu, cuda[:N]); a rank takes auto, cuda (meaning
  // cuda:LOCAL_RANK) or cpu. ValueError or DeviceError naming the spec otherwise.
  Device device(const std::string& spec) const;
  // Joins the job and wraps model (rank 0's weights on every rank from here on). Ranks other
  // than 0 move gen to a seed of their own at the position every rank shares, so that a
  // checkpoint's generator offset resumes every rank. timeout_s in (0, 86400].
  // ddp_options go to DistributedDataParallel.
  void start(std::shared_ptr<nn::Module> model, Device device, Generator& gen, uint64_t seed, double timeout_s,
             const distributed::DataParallelOptions& ddp_options = {});
  // model's forward, through DistributedDataParallel once started.
  distributed::DistributedDataParallel* ddp() { return ddp_.get(); }
  // The job's process group once started (null outside a data-parallel job).
  distributed::ProcessGroup* group() { return group_.get(); }
  // " (rank 0 of 2 over nccl 2.28.6; rank r on cuda:LOCAL_RANK)", or "" alone; with
  // sharded_optimizer, ", optimizer state sharded" before the ")".
  std::string describe(const Device& device, bool sharded_optimizer = false) const;
  // Half this machine's cores shared among the job's ranks, 1 to 4.
  int auto_workers() const;
  // Keeps every rank until rank 0 has written its last checkpoint.
  void finish();

 private:
  distributed::Env env_;
  bool active_;
  std::unique_ptr<distributed::ProcessGroup> group_;
  std::unique_ptr<distributed::DistributedDataParallel> ddp_;
};

// ---------------------------------------------------------------- checkpoints
// One safetensors file for every model: tensors "model.<key>", "optim.<key>" (several
// optimizers: "optim.<name>.<key>"), "schedule.<key>" (the same), "scaler.<key>"; metadata
// "format" = "normcore-checkpoint", "model" (what builds it: a classifier's name, "gpt",
// or the caller's), the model's own description ("config.<field>"), "step" (optimizer
// steps done), "data.epoch" and "data.batch" (where the next batch comes from) and
// "data.seed" (of its order), "rng.seed" and "rng.offset" (the generator), and the run's options as "option.<name>".
struct TrainingState {
  std::string model;                               // "model" metadata
  std::map<std::string, std::string> description;  // the model's "config.*" entries
  nn::NamedTensors model_state;                    // prefix removed
  nn::NamedTensors optimizer_state;                // "optim." removed (named ones keep "<name>.")
  nn::NamedTensors schedule_state;                 // "schedule." removed
  nn::NamedTensors scaler_state;                   // "scaler." removed
  int64_t step = -1;                               // -1: not recorded (an epoch-based older file)
  int64_t epoch = -1, batch = -1;                  // -1: not recorded (a step-based older file)
  uint64_t seed = 0, rng_offset = 0;               // the generator's (rank 0's in a data-parallel job)
  uint64_t data_seed = 0;                          // the loader's order
  bool has_rng = false;
  std::map<std::string, std::string> options;   // "option." removed
  std::map<std::string, std::string> metadata;  // all of it, as read
};

constexpr const char* kCheckpointFormat = "normcore-checkpoint";

// Writes state atomically (a temporary file renamed over path): "step" when >= 0, the data
// position when both are >= 0 (ValueError when neither is), the generator when has_rng.
void save_training_state(const std::string& path, const TrainingState& state);
// Reads a checkpoint of this format or of the older two ("normcore-classifier": "epoch",
// the scaler among the optimizer's entries as "grad_scaler.*"; "normcore-gpt": "step";
// both with the generator as "option.seed" and "option.rng.offset"). IOError naming the
// file and what is missing or malformed for anything else.
TrainingState load_training_state(const std::string& path);

// ---------------------------------------------------------------- the trainer
// An optimizer over a model, or several (each named, its state saved under its name): the
// Trainer builds them once the model is on its device.
struct NamedOptimizer {
  std::string name;  // "" for a single optimizer
  std::unique_ptr<optim::Optimizer> optimizer;
};
using OptimizerFactory = std::function<std::vector<NamedOptimizer>(nn::Module& model)>;
OptimizerFactory sgd(optim::SGDOptions options);
OptimizerFactory adam(optim::AdamOptions options);
OptimizerFactory adamw(optim::AdamWOptions options);
// AdamW with weight decay on the matrices and embeddings ("decay") and without on the
// biases and norm weights ("no_decay"), as GPT-2 trains.
OptimizerFactory adamw_decay_matrices(optim::AdamWOptions options);

// A learning-rate schedule for one optimizer, given the run's total steps.
using ScheduleFactory = std::function<std::unique_ptr<optim::LRSchedule>(optim::Optimizer&, int64_t total_steps)>;
// Linear warm-up (clamped to total_steps - 1), then a half cosine down to min_lr.
ScheduleFactory cosine_schedule(int64_t warmup_steps, double min_lr);

struct TrainerOptions {
  Device device = Device::cpu();               // the model is moved there
  std::string precision = "fp32";              // fp32, tf32, bf16 or fp16
  std::string cuda_graph = "auto";             // auto, on or off
  bool detect_anomaly = false;                 // every op's result checked for NaN/Inf (slow)
  double clip = 0;                             // gradient-norm clipping (0: off)
  int64_t epochs = 0;                          // passes over the data; or
  int64_t steps = 0;                           // optimizer steps (exactly one of the two > 0)
  int64_t eval_interval = 0;                   // steps between evaluations (0: every epoch)
  int64_t stop_after = 0;                      // stop after this many epochs (or steps), as if interrupted
  int64_t loss_every = 20;                     // steps between reads of the loss (each waits for the device)
  uint64_t seed = 0;                           // of the loader's order (a resumed run takes the checkpoint's)
  Generator* generator = nullptr;              // the model's dropout draws (default_generator() when null)
  std::string checkpoint;                      // written at each evaluation (empty: none)
  std::string resume;                          // a checkpoint to continue from
  std::string log, plot;                       // metrics.jsonl, appended on resume; curves.svg
  std::string title = "normcore";              // of the plot
  std::vector<std::string> curves = {"loss"};  // the metrics the plot draws
  std::string unit = "samples";                // samples (batch rows) or tokens (input elements) a second
  std::string eval_phase = "eval";             // the evaluation's phase in the metrics
  bool progress = true;                        // print the progress line
  double timeout_s = 300;                      // data-parallel: how long a rank waits for the others
  bool shard_optimizer = false;  // data-parallel: each rank keeps its share of the optimizers' state (ZeRO stage 1)
  std::optional<DType> reduce_dtype;  // data-parallel: gradients averaged in this dtype (unset: their own)
  std::string model_name = "custom";  // the checkpoint's "model"
  std::map<std::string, std::string> description, options;  // the checkpoint's config.* and option.*
};

// What a hook sees.
struct StepInfo {
  int64_t step = 0;         // optimizer steps done, this one included
  int64_t epoch = 0;        // the epoch of this step (from 0)
  double lr = 0;            // the step's learning rate (the first optimizer's)
  double loss = NAN;        // read from the device on loss_every steps only, NaN otherwise
  double grad_norm = NAN;   // the gradients' 2-norm before clipping: read with the loss when clip > 0
  double loss_scale = NAN;  // fp16's loss scale after the step: read with the loss
};
struct EvalInfo {
  int64_t step = 0, epoch = 0;                          // epoch: epochs completed
  double train_loss = 0;                                // mean of the losses read since the last evaluation
  double seconds = 0;                                   // of training since then
  double rate = 0;                                      // unit a second
  std::vector<std::pair<std::string, double>> results;  // the evaluate function's
};

class Trainer {
 public:
  // The loss of the model's outputs (model(inputs), through DistributedDataParallel in a
  // data-parallel job) against the targets.
  using Loss = std::function<Tensor(const Tensor& outputs, const Tensor& targets)>;
  // Or the loss of a batch computed from the model by the caller.
  using StepLoss = std::function<Tensor(nn::Module& model, const Tensor& inputs, const Tensor& targets)>;
  using Evaluate = std::function<std::vector<std::pair<std::string, double>>(nn::Module& model)>;

  // ValueError naming the option and its value for bad options.
  Trainer(std::shared_ptr<nn::Module> model, Loss loss, OptimizerFactory optimizer, TrainerOptions options);
  Trainer(std::shared_ptr<nn::Module> model, StepLoss loss, OptimizerFactory optimizer, TrainerOptions options);
  ~Trainer();

  void set_schedule(ScheduleFactory schedule) { schedule_ = std::move(schedule); }
  void set_evaluate(Evaluate evaluate) { evaluate_ = std::move(evaluate); }
  // Before the first step, on the rank that prints, with the step the run starts from.
  void on_start(std::function<void(int64_t step)> hook) { start_hooks_.push_back(std::move(hook)); }
  void on_step(std::function<void(const StepInfo&)> hook) { step_hooks_.push_back(std::move(hook)); }
  void on_evaluation(std::function<void(const EvalInfo&)> hook) { eval_hooks_.push_back(std::move(hook)); }
  void on_checkpoint(std::function<void(const std::string& path, int64_t step)> hook) {
    checkpoint_hooks_.push_back(std::move(hook));
  }

  // Trains on data in batches of loader.batch_size (its seed, device and sharding are the
  // Trainer's), from the resumed position when options.resume is set, to the end or
  // stop_after. Returns the optimizer steps done in all.
  int64_t fit(std::shared_ptr<const data::Dataset> data, data::DataLoaderOptions loader);

  // Times `timed` steps after `warmup` untimed ones (the first captures the CUDA graph): no
  // evaluation, checkpoint or hook but on_start. amount: samples or tokens of the timed steps.
  // reduction_wait_ms: in a data-parallel job on GPUs with steps not graphed, the mean time
  // a timed step's end of backward waited for its gradients' all-reduces
  // (DistributedDataParallel::reduction_wait); NAN otherwise.
  struct Timing {
    double seconds = 0, loss = NAN, reduction_wait_ms = NAN;
    int64_t amount = 0;
  };
  Timing benchmark(std::shared_ptr<const data::Dataset> data, data::DataLoaderOptions loader, int64_t warmup,
                   int64_t timed);

  nn::Module& model() { return *model_; }
  const TrainerOptions& options() const { return options_; }
  const Precision& precision() const { return precision_; }
  DataParallelJob& job() { return job_; }
  bool graphed() const { return graphed_; }
  bool is_main() const { return job_.is_main(); }
  uint64_t seed() const { return seed_; }  // the loader's (the checkpoint's when resumed)
  int64_t step() const { return step_; }
  // What fit measured so far, on the rank that prints (empty on the others): the train
  // records (each loss read in a run of steps; each epoch's mean in a run of epochs) and
  // the evaluations, as written to options.log.
  const std::vector<MetricsRecord>& metrics() const { return log_->records(); }
  std::vector<optim::Optimizer*> optimizers() const;
  // The run's state as a checkpoint holds it, and written to path (as at each evaluation).
  // With shard_optimizer, the optimizers' state is as it was put together at the last
  // evaluation (every rank takes part in that; rank 0 alone evaluates and saves).
  TrainingState state() const;
  void save(const std::string& path) const;

 private:
  Tensor train_step(const std::vector<Tensor>& batch);
  void prepare(std::shared_ptr<const data::Dataset> data, data::DataLoaderOptions loader);
  // The next batch through one step and the schedules; info gets the step, epoch and lr.
  Tensor advance(StepInfo& info, int64_t& amount);

  std::shared_ptr<nn::Module> model_;
  Loss loss_;
  StepLoss step_loss_;
  OptimizerFactory optimizer_factory_;
  TrainerOptions options_;
  ScheduleFactory schedule_;
  Evaluate evaluate_;
  std::vector<std::function<void(int64_t)>> start_hooks_;
  std::vector<std::function<void(const StepInfo&)>> step_hooks_;
  std::vector<std::function<void(const EvalInfo&)>> eval_hooks_;
  std::vector<std::function<void(const std::string&, int64_t)>> checkpoint_hooks_;
  Precision precision_;
  DataParallelJob job_;
  Generator* gen_;
  std::vector<NamedOptimizer> optimizers_;
  // With shard_optimizer in a data-parallel job: one per optimizer, and their whole state as
  // put together at the last evaluation.
  std::vector<std::unique_ptr<distributed::ShardedOptimizer>> sharded_;
  std::vector<optim::StateDict> gathered_state_;
  std::vector<std::unique_ptr<optim::LRSchedule>> schedules_;
  std::vector<Tensor> params_;
  std::unique_ptr<MetricsLog> log_;
  std::unique_ptr<data::DataLoader> loader_;
  std::unique_ptr<GraphedStep> step_fn_;
  bool graphed_ = false, resuming_ = false;
  uint64_t seed_ = 0, rng_seed_ = 0;  // the loader's; the generator's before data-parallel ranks split it
  int64_t step_ = 0, total_ = 0, batches_per_epoch_ = 1;
};

}  // namespace train
}  // namespace normcore

#pragma GCC visibility pop
