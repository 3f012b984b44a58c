// What the normcore program's training commands (train, train-lm) share: the --precision
// of a step, the progress line, whether steps replay as CUDA graphs, and the data-parallel
// side of a run (its own launch with --nproc, joining the job, sharding the data).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "normcore/normcore.h"
#include "normcore/distributed.h"
#include "normcore/optim.h"
#include "cli/args.h"

namespace cli {

namespace nc = normcore;

// --precision: the arithmetic of a training step. tf32 lets f32 matmuls and convolutions use
// TF32 tensor cores (CUDA; the CPU computes in f32 regardless); bf16 and fp16 run the step's
// forward under autocast (normcore/autocast.h) with f32 parameters, fp16 with a GradScaler.
struct Precision {
  bool autocast = false;
  nc::DType dtype = nc::DType::BF16;
  std::unique_ptr<nc::optim::GradScaler> scaler;  // fp16 only

  Precision(const std::string& name, const nc::Device& device) {
    NC_CHECK(name == "fp32" || name == "tf32" || name == "bf16" || name == "fp16", ValueError,
             "option --precision must be fp32, tf32, bf16 or fp16, got '", name, "'");
    if (device.is_cuda()) nc::cuda::set_allow_tf32(name == "tf32");
    autocast = name == "bf16" || name == "fp16";
    if (name == "fp16") {
      dtype = nc::DType::F16;
      scaler = std::make_unique<nc::optim::GradScaler>();
    }
  }

  // backward from loss, then clipping and the update: step(found_inf) with an undefined
  // tensor, or for fp16 with the scaler's flag, which skips the update on the device when
  // a gradient holds an inf or a NaN. Never waits for the device.
  template <class Step>
  void backward_and_step(const nc::Tensor& loss, const std::vector<nc::Tensor>& params, double clip,
                         Step&& step) {
    if (!scaler) {
      loss.backward();
      if (clip > 0) nc::optim::clip_grad_norm_async(params, clip);
      step(nc::Tensor());
      return;
    }
    scaler->scale(loss).backward();
    scaler->unscale_async(params);
    if (clip > 0) nc::optim::clip_grad_norm_async(params, clip);
    step(scaler->found_inf());
    scaler->update();
  }

  // ", loss scale 65536 (3 steps skipped)" for fp16, else "".
  std::string scaler_report() const {
    if (!scaler) return "";
    char text[96];
    std::snprintf(text, sizeof text, ", loss scale %g (%lld steps skipped)", scaler->get_scale(),
                  static_cast<long long>(scaler->skipped_steps()));
    return text;
  }

  // The scaler's state as extra optimizer-state entries ("grad_scaler.<name>").
  void add_state(nc::nn::NamedTensors& state) const {
    if (!scaler) return;
    for (const auto& [k, v] : scaler->state_dict()) state.emplace_back("grad_scaler." + k, v);
  }
  // Takes the "grad_scaler." entries out of a checkpoint's optimizer state; loads them into
  // the scaler when there is one.
  void take_state(nc::nn::NamedTensors& state) const {
    const std::string prefix = "grad_scaler.";
    nc::nn::NamedTensors mine, rest;
    for (auto& [k, v] : state) {
      if (k.compare(0, prefix.size(), prefix) == 0) mine.emplace_back(k.substr(prefix.size()), v);
      else rest.emplace_back(k, v);
    }
    state = std::move(rest);
    if (scaler && !mine.empty()) scaler->load_state_dict(mine);
  }
};

// ---------------------------------------------------------------- progress
// A one-line progress bar on a terminal; a line every tenth of the way otherwise. label
// names the run ("epoch 2/12"), done counts up from first to total, and the rate counts
// unit ("samples") per second since construction.
class Progress {
 public:
  Progress(std::string label, int64_t total, const char* unit, int64_t first = 0)
      : label_(std::move(label)), unit_(unit), total_(std::max<int64_t>(total, 1)), printed_tenths_(first * 10 / total_),
        tty_(isatty(STDOUT_FILENO)), start_(std::chrono::steady_clock::now()) {}

  void update(int64_t done, int64_t amount, double loss) {
    double seconds = elapsed();
    double rate = seconds > 0 ? static_cast<double>(amount) / seconds : 0;
    if (tty_) {
      const int width = 30;
      int filled = static_cast<int>(width * done / total_);
      std::printf("\r%s [%s%s] %lld/%lld loss %.4f %.0f %s/s ", label_.c_str(), std::string(filled, '=').c_str(),
                  std::string(width - filled, ' ').c_str(), static_cast<long long>(done),
                  static_cast<long long>(total_), loss, rate, unit_);
      std::fflush(stdout);
    } else if (done == total_ || done * 10 / total_ > printed_tenths_) {
      printed_tenths_ = done * 10 / total_;
      std::printf("%s step %lld/%lld loss %.4f %.0f %s/s\n", label_.c_str(), static_cast<long long>(done),
                  static_cast<long long>(total_), loss, rate, unit_);
      std::fflush(stdout);
    }
  }
  void finish() {
    if (tty_) std::printf("\n");
  }
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::string label_;
  const char* unit_;
  int64_t total_;
  int64_t printed_tenths_;  // tenths already reported (plain output)
  bool tty_;
  std::chrono::steady_clock::time_point start_;
};

// --cuda-graph: whether the training steps run through a GraphedStep (normcore/graphed_step.h).
inline bool use_cuda_graph(const Args& args, const nc::Device& device, bool anomaly, bool data_parallel = false) {
  const std::string& value = args.options.at("cuda-graph");
  NC_CHECK(value == "auto" || value == "on" || value == "off", ValueError,
           "option --cuda-graph must be auto, on or off, got '", value, "'");
  if (value == "off") return false;
  const char* why = !device.is_cuda() ? "CUDA graphs need a CUDA device"
                    : anomaly          ? "--detect-anomaly reads every result on the host"
                    : data_parallel    ? "data-parallel steps are not captured yet"
                                       : nullptr;
  NC_CHECK(value == "auto" || why == nullptr, ValueError, "option --cuda-graph on: ", why,
           " (use --cuda-graph off or auto)");
  return why == nullptr;
}

// The command line as given, for train --nproc, which runs itself again under the launcher.
inline std::vector<std::string> g_argv;  // main() sets it

// train --nproc N (N > 1): runs this program's command line, without --nproc, as N ranks
// through the launcher (MASTER_PORT from the environment when set).
inline int launch_self(int nproc) {
  NC_CHECK(std::getenv("WORLD_SIZE") == nullptr, ValueError,
           "option --nproc ", nproc, ": this process is already a rank of a job (WORLD_SIZE is set)");
  std::vector<std::string> command{std::filesystem::read_symlink("/proc/self/exe").string()};
  for (size_t i = 1; i < g_argv.size(); ++i) {
    if (g_argv[i] == "--nproc") {
      ++i;
    } else if (g_argv[i].rfind("--nproc=", 0) != 0) {
      command.push_back(g_argv[i]);
    }
  }
  nc::distributed::LaunchOptions options;
  options.nproc = nproc;
  options.master_port = nc::distributed::Env::from_environment().master_port;
  return nc::distributed::launch(command, options);
}

// The data-parallel side of train and train-lm. A process a launcher started (WORLD_SIZE
// set) is a rank of a job, also when alone: it trains on cuda:LOCAL_RANK (--device auto or
// cuda) or the CPU, joins the process group, wraps its model in DistributedDataParallel and
// draws its own dropout masks; the data loaders shard each epoch's order by rank. Rank 0
// alone prints, evaluates and writes checkpoints.
struct DataParallelJob {
  nc::distributed::Env env = nc::distributed::Env::from_environment();
  bool active = std::getenv("WORLD_SIZE") != nullptr;
  std::unique_ptr<nc::distributed::ProcessGroup> group;
  std::unique_ptr<nc::distributed::DistributedDataParallel> ddp;

  bool is_main() const { return env.rank == 0; }
  int world_size() const { return active ? env.world_size : 1; }

  // A data loader's options for this rank: its share of each epoch, --workers threads
  // (auto: from the cores with per-sample transforms, which the caller says it has; one
  // otherwise, where a worker gathers a batch faster than a step uses it).
  nc::data::DataLoaderOptions loader_options(const Args& args, int64_t batch_size, uint64_t seed, nc::Device device,
                                             bool sample_transforms = false) const {
    nc::data::DataLoaderOptions options;
    options.batch_size = batch_size;
    options.seed = seed;
    options.device = device;
    options.num_replicas = world_size();
    options.rank = active ? env.rank : 0;
    const std::string& workers = args.options.at("workers");
    const bool whole = !workers.empty() && workers.find_first_not_of("0123456789") == std::string::npos;
    NC_CHECK(workers == "auto" || (whole && workers.size() <= 4), ValueError,
             "option --workers expects auto or a whole number from 0 to 9999, got '", workers, "'");
    options.workers = workers != "auto" ? std::stoi(workers) : sample_transforms ? auto_workers() : 1;
    return options;
  }

  // Half this machine's cores shared among the job's ranks, 1 to 4.
  int auto_workers() const {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    return std::clamp(cores / 2 / std::max(world_size(), 1), 1, 4);
  }

  // --device for this process; a given GPU index would put every rank on one GPU.
  nc::Device device(const std::string& spec) const {
    if (!active) return pick_device(spec);
    if (spec == "cpu") return nc::Device::cpu();
    NC_CHECK(spec == "auto" || spec == "cuda", ValueError, "--device ", spec,
             ": a data-parallel rank takes --device auto, cuda (meaning cuda:LOCAL_RANK) or cpu");
    if (spec == "auto" && !nc::cuda_is_available()) return nc::Device::cpu();
    NC_CHECK(env.local_rank < nc::cuda_device_count(), DeviceError, "--device ", spec, ": local rank ",
             env.local_rank, " needs cuda:", env.local_rank, " but ", nc::cuda_device_count(),
             " CUDA device(s) are visible");
    return nc::Device::cuda(env.local_rank);
  }

  // Joins the job and wraps model (rank 0's weights on every rank from here on). Ranks other
  // than 0 move gen to a seed of their own at the position every rank shares (they draw the
  // same amounts), so that a checkpoint's generator offset resumes every rank.
  void start(const Args& args, std::shared_ptr<nc::nn::Module> model, nc::Device device, nc::Generator& gen,
             uint64_t seed) {
    if (!active) return;
    if (env.rank > 0) {
      const uint64_t offset = gen.offset();
      gen.manual_seed(seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(env.rank));
      gen.set_offset(offset);
    }
    const double timeout = number(args, "timeout");
    NC_CHECK(timeout > 0 && timeout <= 86400, ValueError, "option --timeout must be in (0, 86400] seconds, got ",
             timeout);
    nc::distributed::ProcessGroupOptions options;
    options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000));
    group = std::make_unique<nc::distributed::ProcessGroup>(env, device, options);
    ddp = std::make_unique<nc::distributed::DistributedDataParallel>(std::move(model), *group);
  }

  // " (rank 0 of 2 over nccl 2.28.6; rank r on cuda:LOCAL_RANK)", or "" alone.
  std::string describe(const nc::Device& device) const {
    if (!active) return "";
    return " (rank 0 of " + std::to_string(env.world_size) + " over " + group->backend() +
           (device.is_cuda() ? "; rank r on cuda:LOCAL_RANK)" : ")");
  }

  // Keeps every rank until rank 0 has written its last checkpoint.
  void finish() {
    if (group) group->barrier();
  }
};

// --log and --plot of a training command, on the rank that prints: each record appended to
// the log as it comes, the curves redrawn from the whole log (a resumed run's earlier records
// included) when plot() is called.
class RunMetrics {
 public:
  RunMetrics(const Args& args, bool main_rank, bool resuming, std::string title, std::string x_label,
             std::vector<std::string> curves)
      : plot_path_(main_rank ? args.options.at("plot") : std::string()), title_(std::move(title)),
        x_label_(std::move(x_label)), curves_(std::move(curves)),
        log_(main_rank ? args.options.at("log") : std::string(), /*append=*/resuming) {}
  void log(int64_t step, const std::string& phase, const std::vector<std::pair<std::string, double>>& values) {
    if (!log_.path().empty() || !plot_path_.empty()) log_.log(step, phase, values);
  }
  void plot() const {
    if (plot_path_.empty()) return;
    const std::vector<nc::train::MetricsRecord> records =
        log_.path().empty() ? log_.records() : nc::train::read_metrics(log_.path());
    nc::train::write_curves_svg(plot_path_, records, curves_, title_, x_label_);
  }

 private:
  std::string plot_path_, title_, x_label_;
  std::vector<std::string> curves_;
  nc::train::MetricsLog log_;
};

}  // namespace cli
