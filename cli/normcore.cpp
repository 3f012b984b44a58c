// The normcore command-line program: train, evaluate and use Fashion-MNIST classifiers,
// train a byte-level GPT on the fortunes corpus and write text with it, and check the ops
// against reference cases.
//   normcore train [options]            train, print test accuracy per epoch, save a checkpoint
//   normcore eval --checkpoint F        test accuracy and confusion matrix
//   normcore predict --checkpoint F IMAGE...   label 28x28 PGM/PNG images
//   normcore train-lm [options]         train a GPT, print validation loss, save a checkpoint
//   normcore generate --checkpoint F --prompt TEXT   continue a text, streaming it
//   normcore conformance DIR [--device cpu|cuda|all]   run every case in DIR; exit 0 when all pass
//   normcore tokenize --tokenizer DIR [FILE...]   GPT-2 token ids of text, printed or as a shard
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "normcore/normcore.h"
#include "normcore/conformance.h"
#include "normcore/data.h"
#include "normcore/distributed.h"
#include "normcore/gpt.h"
#include "normcore/models.h"
#include "normcore/optim.h"
#include "normcore/text.h"
#include "cli/tokenize.h"

namespace nc = normcore;

namespace {

const char* kDefaultData = "/usr/share/datasets/fashion-mnist";

// ---------------------------------------------------------------- arguments
struct Args {
  std::string command;
  std::map<std::string, std::string> options;
  std::set<std::string> given;  // the options on the command line (the rest hold their fallbacks)
  std::vector<std::string> positional;
};

struct OptionSpec {
  const char* name;
  const char* fallback;  // nullptr: a flag
  const char* help;
};

const std::vector<OptionSpec> kTrainOptions = {
    {"data", kDefaultData, "folder with the Fashion-MNIST .gz files"},
    {"model", "mlp-layernorm", "mlp, mlp-layernorm, mlp-groupnorm, mlp-l1norm, mlp-frobnorm, cnn-gn or cnn-bn"},
    {"epochs", "12", "passes over the training set"},
    {"batch-size", "128", "samples per step"},
    {"lr", "0.001", "peak learning rate"},
    {"optimizer", "adamw", "sgd (with momentum 0.9), adam or adamw"},
    {"weight-decay", "0.0001", "weight decay"},
    {"label-smoothing", "0.1", "cross-entropy label smoothing"},
    {"warmup", "200", "warm-up steps of the cosine learning-rate schedule"},
    {"clip", "5.0", "clip the gradient norm to this (0: off)"},
    {"seed", "0", "seed of initialization, dropout and shuffling"},
    {"device", "auto", "auto, cpu or cuda[:N]"},
    {"out", "normcore-fashion.safetensors", "checkpoint written after every epoch"},
    {"resume", "", "checkpoint to continue from (its model, seed and state; other options as given)"},
    {"limit", "0", "use only the first N training samples (0: all)"},
    {"workers", "1", "data-loading threads (0: load on the training thread); the batches do not depend on it"},
    {"augment", "off", "on: each training image randomly cropped (28 x 28 of the image padded by 2) and mirrored"},
    {"stop-after", "0", "stop after this many epochs, as if interrupted (0: run all)"},
    {"detect-anomaly", "off", "on: check every op's result and gradient for NaN/Inf, naming the op (slow)"},
    {"precision", "fp32", "fp32, tf32 (f32 on TF32 tensor cores), bf16 or fp16 (autocast; fp16 with loss scaling)"},
    {"cuda-graph", "auto", "on: replay each training step as one CUDA graph; auto: on for CUDA unless "
                           "--detect-anomaly or data-parallel; off"},
    {"nproc", "1", "data-parallel processes on this machine (one per GPU, started through 'normcore launch'); "
                   "--batch-size is per process"},
    {"timeout", "300", "data-parallel: seconds a rank waits for the others (meeting, a collective) before the job "
                       "fails"},
};
const std::vector<OptionSpec> kEvalOptions = {
    {"checkpoint", "normcore-fashion.safetensors", "checkpoint to evaluate"},
    {"data", kDefaultData, "folder with the Fashion-MNIST .gz files"},
    {"device", "auto", "auto, cpu or cuda[:N]"},
};
const std::vector<OptionSpec> kPredictOptions = {
    {"checkpoint", "normcore-fashion.safetensors", "checkpoint to use"},
    {"device", "auto", "auto, cpu or cuda[:N]"},
};
const std::vector<OptionSpec> kTrainLmOptions = {
    {"data", nc::models::kFortunesDir, "fortunes folder (its files without a '.') or one fortune file (bytes); or "
                                       "token shards in llm.c's format, a path or pattern ending in .bin "
                                       "('dir/*_train_*.bin')"},
    {"val-data", "", "with token shards: the validation shards (a path or pattern)"},
    {"vocab", "50257", "with token shards: the vocabulary (GPT-2's by default; every id is checked against it)"},
    {"model", "", "gpt2, gpt2-medium, gpt2-large or gpt2-xl: GPT-2's sizes (the size options given override "
                  "them); empty: the sizes below"},
    {"layers", "6", "transformer blocks"},
    {"heads", "6", "attention heads"},
    {"embed", "384", "embedding width (divisible by heads)"},
    {"context", "256", "tokens of context"},
    {"norm", "layernorm", "layernorm or rmsnorm"},
    {"dropout", "0.1", "dropout on the embeddings and the residual branches (0 with --model unless given)"},
    {"batch-size", "64", "windows per step"},
    {"workers", "1", "data-loading threads (0: load on the training thread); the batches do not depend on it"},
    {"steps", "3000", "optimizer steps"},
    {"lr", "0.001", "peak learning rate"},
    {"min-lr", "0.0001", "learning rate at the end of the cosine schedule"},
    {"warmup", "100", "warm-up steps of the cosine schedule"},
    {"weight-decay", "0.1", "AdamW weight decay of the matrices and embeddings (not biases or norms)"},
    {"clip", "1.0", "clip the gradient norm to this (0: off)"},
    {"eval-interval", "250", "steps between validation losses and checkpoints"},
    {"eval-batches", "8", "validation batches (of batch-size windows, evenly spaced)"},
    {"sample", "300", "bytes of text to print at the end"},
    {"precision", "fp32", "fp32, tf32 (f32 on TF32 tensor cores), bf16 or fp16 (autocast; fp16 with loss scaling)"},
    {"cuda-graph", "auto", "on: replay each training step as one CUDA graph; auto: on for CUDA unless "
                           "data-parallel; off"},
    {"seed", "0", "seed of initialization, batches and dropout"},
    {"device", "auto", "auto, cpu or cuda[:N]"},
    {"out", "normcore-gpt.safetensors", "checkpoint written at every evaluation"},
    {"resume", "", "checkpoint to continue from (its model, seed and state; other options as given)"},
    {"init", "", "initial weights: a train-lm checkpoint's model, or a safetensors file under the model's "
                 "state_dict names (e.g. saved by another trainer); not with --resume"},
    {"hf-out", "", "also write the trained model to this folder as a Hugging Face GPT-2 checkpoint "
                   "(config.json, model.safetensors) at the end"},
    {"shuffle", "on", "on: the training windows in a new random order each epoch; off: in order"},
    {"stop-after", "0", "stop after this many steps, as if interrupted (0: run all)"},
    {"benchmark", "0", "time this many training steps after 3 warm-up steps and print ms/step, tokens/s and peak "
                       "device memory; no evaluation, checkpoint or sample (0: train)"},
    {"nproc", "1", "data-parallel processes on this machine (one per GPU, started through 'normcore launch'); "
                   "--batch-size is per process"},
    {"timeout", "300", "data-parallel: seconds a rank waits for the others (meeting, a collective) before the job "
                       "fails"},
};
const std::vector<OptionSpec> kGenerateOptions = {
    {"checkpoint", "normcore-gpt.safetensors", "GPT checkpoint (from train-lm)"},
    {"model", "", "a Hugging Face GPT-2 folder (config.json, model.safetensors) instead of --checkpoint"},
    {"tokenizer", "", "with --model: GPT-2's tokenizer files (encoder.json and vocab.bpe, vocab.json and "
                      "merges.txt, or tokenizer.json); empty: those in the model's folder"},
    {"prompt", "", "text to continue (empty: start a new fortune; with --model, a new document)"},
    {"tokens", "300", "bytes (tokens with --model) to generate; past the context the model sees the last "
                      "context ones"},
    {"temperature", "0.8", "sampling temperature (0: greedy)"},
    {"top-k", "0", "sample among the k most likely bytes (0: all)"},
    {"seed", "0", "seed of the sampling: the same seed gives the same text"},
    {"device", "auto", "auto, cpu or cuda[:N]"},
};
const std::vector<OptionSpec> kLaunchOptions = {
    {"nproc", "1", "ranks on this machine, usually one per GPU"},
    {"nnodes", "1", "machines in the job, each running one launcher"},
    {"node-rank", "0", "this machine's index among them, 0 to nnodes - 1"},
    {"master-addr", "127.0.0.1", "address of node 0, where rank 0 serves the rendezvous"},
    {"master-port", "29500", "port of the rendezvous on node 0"},
};
const std::vector<OptionSpec> kTokenizeOptions = {
    {"tokenizer", "", "folder of GPT-2's tokenizer files: encoder.json and vocab.bpe, vocab.json and merges.txt, "
                      "or tokenizer.json"},
    {"out", "", "write the ids as an llm.c token shard (.bin) instead of printing them"},
    {"special", nullptr, "\"<|endoftext|>\" in the text is GPT-2's end-of-text token (otherwise it is text)"},
    {"decode", nullptr, "read token ids instead (printed ones, or token shards ending in .bin) and print their text"},
};
const std::vector<OptionSpec> kConformanceOptions = {
    {"device", "all", "cpu, cuda[:N], or all (the CPU, then cuda:0 when there is one)"},
};

void usage(std::ostream& os) {
  os << "usage: normcore <command> [options]\n\n"
        "commands:\n"
        "  train     train a Fashion-MNIST classifier\n"
        "  eval      print a checkpoint's test accuracy and confusion matrix\n"
        "  predict   classify 28x28 PGM or PNG images with a checkpoint\n"
        "  train-lm  train a byte-level GPT on the fortunes corpus\n"
        "  generate  continue a prompt with a GPT checkpoint\n"
        "  conformance  run the reference cases in a folder against every device\n"
        "  tokenize  GPT-2 token ids of text (stdin or files), printed or written as a token shard\n"
        "  launch    run a command as the local ranks of a data-parallel job\n\n"
        "'normcore <command> --help' lists a command's options.\n";
}

void command_usage(std::ostream& os, const std::string& command, const std::vector<OptionSpec>& specs) {
  os << "usage: normcore " << command << " [options]" << (command == "predict" ? " IMAGE..." : command == "conformance" ? " DIR" : command == "tokenize" ? " [FILE...]" : command == "launch" ? " -- COMMAND..." : "") << "\n\noptions:\n";
  for (const OptionSpec& s : specs)
    os << "  --" << std::left << std::setw(18) << s.name << s.help
       << (s.fallback && *s.fallback ? std::string(" (default ") + s.fallback + ")" : "") << "\n";
}

// Parses --name value and --name=value (a flag: --name, or --name=on|off) against specs; throws
// ValueError on anything else.
Args parse(int argc, char** argv, const std::vector<OptionSpec>& specs) {
  Args args;
  args.command = argv[1];
  for (const OptionSpec& s : specs) args.options[s.name] = s.fallback ? s.fallback : "";
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {  // the rest is positional, options included (launch's command)
      for (++i; i < argc; ++i) args.positional.push_back(argv[i]);
      break;
    }
    if (a.rfind("--", 0) != 0) {
      args.positional.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    size_t eq = name.find('=');
    bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (name == "help") {
      args.options["help"] = "1";
      continue;
    }
    const OptionSpec* spec = nullptr;
    for (const OptionSpec& s : specs) spec = name == s.name ? &s : spec;
    NC_CHECK(spec, ValueError, "unknown option --", name, " for '", args.command, "' (see --help)");
    if (!inline_value && spec->fallback == nullptr) {
      value = "on";
    } else if (!inline_value) {
      NC_CHECK(i + 1 < argc, ValueError, "option --", name, " needs a value");
      value = argv[++i];
    }
    args.options[name] = value;
    args.given.insert(name);
  }
  return args;
}

double number(const Args& args, const std::string& name) {
  const std::string& v = args.options.at(name);
  char* end = nullptr;
  double d = std::strtod(v.c_str(), &end);
  NC_CHECK(!v.empty() && end && *end == '\0' && std::isfinite(d), ValueError, "option --", name,
           " expects a number, got '", v, "'");
  return d;
}

// A flag's value: off unless given (--name or --name=on), or given as --name=off.
bool flag(const Args& args, const std::string& name) {
  const std::string& v = args.options.at(name);
  NC_CHECK(v.empty() || v == "on" || v == "off", ValueError, "option --", name, " is on or off, got '", v, "'");
  return v == "on";
}

int64_t integer(const Args& args, const std::string& name, int64_t min) {
  double d = number(args, name);
  NC_CHECK(d == static_cast<double>(static_cast<int64_t>(d)) && d >= static_cast<double>(min), ValueError,
           "option --", name, " expects a whole number >= ", min, ", got '", args.options.at(name), "'");
  return static_cast<int64_t>(d);
}

nc::Device pick_device(const std::string& spec) {
  if (spec == "auto") return nc::best_device();
  nc::Device d(spec);
  NC_CHECK(d.is_cpu() || d.index < nc::cuda_device_count(), DeviceError, "--device ", spec,
           ": no such device (", nc::cuda_device_count(), " CUDA device(s) visible)");
  return d;
}

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
bool use_cuda_graph(const Args& args, const nc::Device& device, bool anomaly, bool data_parallel = false) {
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
std::vector<std::string> g_argv;

// train --nproc N (N > 1): runs this program's command line, without --nproc, as N ranks
// through the launcher (MASTER_PORT from the environment when set).
int launch_self(int nproc) {
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

  // A data loader's options for this rank: its share of each epoch, --workers threads.
  nc::data::DataLoaderOptions loader_options(const Args& args, int64_t batch_size, uint64_t seed,
                                             nc::Device device) const {
    nc::data::DataLoaderOptions options;
    options.batch_size = batch_size;
    options.seed = seed;
    options.device = device;
    options.num_replicas = world_size();
    options.rank = active ? env.rank : 0;
    options.workers = static_cast<int>(integer(args, "workers", 0));
    return options;
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

// ---------------------------------------------------------------- commands
int train(const Args& args) {
  if (const int64_t nproc = integer(args, "nproc", 1); nproc > 1) return launch_self(static_cast<int>(nproc));
  DataParallelJob job;
  const bool main_rank = job.is_main();
  nc::Device device = job.device(args.options.at("device"));
  const int64_t epochs = integer(args, "epochs", 1), batch_size = integer(args, "batch-size", 1);
  uint64_t seed = static_cast<uint64_t>(integer(args, "seed", 0));
  const double lr = number(args, "lr"), weight_decay = number(args, "weight-decay");
  const double smoothing = number(args, "label-smoothing"), clip = number(args, "clip");
  const std::string optimizer_name = args.options.at("optimizer");
  const std::string out = args.options.at("out"), resume = args.options.at("resume");
  std::string model_name = args.options.at("model");
  const std::string anomaly = args.options.at("detect-anomaly");
  NC_CHECK(anomaly == "on" || anomaly == "off", ValueError, "train: --detect-anomaly must be on or off, got '",
           anomaly, "'");
  nc::autograd::set_anomaly_enabled(anomaly == "on");
  Precision precision(args.options.at("precision"), device);

  nc::data::TensorDataset train_set = nc::data::load_fashion_mnist(args.options.at("data"), true);
  const nc::data::TensorDataset test_set = nc::data::load_fashion_mnist(args.options.at("data"), false);
  if (int64_t limit = integer(args, "limit", 0); limit > 0 && limit < train_set.size()) train_set = train_set.head(limit);
  const std::string augment = args.options.at("augment");
  NC_CHECK(augment == "on" || augment == "off", ValueError, "option --augment: must be on or off, got '", augment,
           "'");

  nc::Generator gen(seed);
  std::shared_ptr<nc::nn::Module> model;
  int64_t first_epoch = 0;
  nc::models::Checkpoint checkpoint;
  if (!resume.empty()) {
    checkpoint = nc::models::load_checkpoint(resume, device, &gen);
    model = checkpoint.model;
    model_name = checkpoint.model_name;
    first_epoch = checkpoint.epoch;
    // The run continues with the checkpoint's seed and generator position, so that it draws
    // the dropout masks and batch orders an uninterrupted run would.
    auto saved_seed = checkpoint.metadata.find("option.seed");
    auto offset = checkpoint.metadata.find("option.rng.offset");
    NC_CHECK(saved_seed != checkpoint.metadata.end() && offset != checkpoint.metadata.end(), IOError,
             "--resume ", resume, ": the checkpoint has no random-generator state");
    seed = std::stoull(saved_seed->second);
    gen.manual_seed(seed);
    gen.set_offset(std::stoull(offset->second));
  } else {
    model = nc::models::make_classifier(model_name, &gen);
    model->to(device);
  }
  model->train();
  job.start(args, model, device, gen, seed);

  std::unique_ptr<nc::optim::Optimizer> optimizer;
  if (optimizer_name == "sgd") {
    optimizer = std::make_unique<nc::optim::SGD>(model->parameters(),
                                                 nc::optim::SGDOptions{lr, 0.9, 0.0, weight_decay, true});
  } else if (optimizer_name == "adam") {
    optimizer = std::make_unique<nc::optim::Adam>(model->parameters(),
                                                  nc::optim::AdamOptions{lr, 0.9, 0.999, 1e-8, weight_decay});
  } else if (optimizer_name == "adamw") {
    optimizer = std::make_unique<nc::optim::AdamW>(model->parameters(),
                                                   nc::optim::AdamWOptions{lr, 0.9, 0.999, 1e-8, weight_decay});
  } else {
    throw nc::ValueError("option --optimizer: unknown optimizer '" + optimizer_name + "' (sgd, adam, adamw)");
  }

  nc::data::DataLoaderOptions loader_options = job.loader_options(args, batch_size, seed, device);
  if (augment == "on")
    loader_options.transforms = {nc::data::transforms::random_crop(28, 28, 2),
                                 nc::data::transforms::random_horizontal_flip()};
  loader_options.transforms.push_back(nc::data::transforms::normalize());
  nc::data::DataLoader loader(train_set, loader_options);
  const int64_t steps = epochs * loader.num_batches();
  const int64_t warmup = std::min(integer(args, "warmup", 0), steps - 1);
  nc::optim::CosineLR schedule(*optimizer, warmup, steps, lr * 0.01);
  if (!resume.empty()) {
    precision.take_state(checkpoint.optimizer_state);
    if (!checkpoint.optimizer_state.empty()) optimizer->load_state_dict(checkpoint.optimizer_state);
    if (!checkpoint.schedule_state.empty()) schedule.load_state_dict(checkpoint.schedule_state);
  }

  std::map<std::string, std::string> saved_options;
  for (const auto& [k, v] : args.options)
    if (k != "resume" && k != "help" && k != "stop-after") saved_options[k] = v;
  saved_options["seed"] = std::to_string(seed);
  saved_options["model"] = model_name;
  saved_options["mean"] = std::to_string(nc::data::kFashionMnistMean);
  saved_options["std"] = std::to_string(nc::data::kFashionMnistStd);

  int64_t params = 0;
  for (const nc::Tensor& p : model->parameters()) params += p.numel();
  const bool graphed = use_cuda_graph(args, device, anomaly == "on", job.active);
  nc::GraphedStep train_step(
      [&](const std::vector<nc::Tensor>& in) {
        nc::Tensor loss;
        {
          nc::autocast::Guard autocast(precision.dtype, precision.autocast);
          const nc::Tensor logits = job.ddp ? (*job.ddp)(in[0]) : (*model)(in[0]);
          loss = nc::nn::cross_entropy(logits, in[1], nc::nn::Reduction::Mean, smoothing);
        }
        optimizer->zero_grad();
        precision.backward_and_step(loss, optimizer->params(), clip,
                                    [&](const nc::Tensor& found_inf) { optimizer->step_unless(found_inf); });
        return loss;
      },
      graphed);
  const std::string ranks = job.describe(device);
  if (main_rank) {
    std::printf("normcore train: model %s (%lld parameters) on %s%s in %s%s, %lld training / %lld test images, "
                "%s lr %g, batch %lld%s, %lld epochs%s\n",
                model_name.c_str(), static_cast<long long>(params), device.str().c_str(), ranks.c_str(),
                args.options.at("precision").c_str(), graphed ? " with CUDA graphs" : "",
                static_cast<long long>(train_set.size()), static_cast<long long>(test_set.size()),
                optimizer_name.c_str(), lr, static_cast<long long>(batch_size),
                job.active ? (" per rank (" + std::to_string(batch_size * job.world_size()) + " in all)").c_str() : "",
                static_cast<long long>(epochs),
                first_epoch ? (", resuming after epoch " + std::to_string(first_epoch)).c_str() : "");
  }

  const int64_t stop_after = integer(args, "stop-after", 0);
  const int64_t last_epoch = stop_after > 0 ? std::min(epochs, stop_after) : epochs;
  for (int64_t epoch = first_epoch; epoch < last_epoch; ++epoch) {
    loader.begin_epoch(static_cast<uint64_t>(epoch));
    Progress progress("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(epochs), loader.num_batches(),
                      "samples");
    double loss_sum = 0;
    int64_t loss_count = 0, samples = 0;
    for (nc::data::Batch batch; loader.next(batch);) {
      const nc::Tensor loss = train_step({batch.inputs, batch.targets});
      schedule.step();
      samples += batch.targets.size(0);
      // Reading the loss waits for the device: do it for the progress display only (rank 0's
      // batches in a data-parallel job).
      if (main_rank && (batch.index % 20 == 0 || batch.index + 1 == loader.num_batches())) {
        loss_sum += loss.item<double>();
        ++loss_count;
        progress.update(batch.index + 1, samples * job.world_size(), loss_sum / static_cast<double>(loss_count));
      }
    }
    if (!main_rank) continue;  // the others go on to the next epoch and wait in its first all-reduce
    progress.finish();
    double train_seconds = progress.elapsed();
    nc::models::Evaluation e = nc::models::evaluate(*model, test_set, device);
    std::printf("epoch %lld/%lld: train loss %.4f, test accuracy %.2f%% (%.1f s, %.0f samples/s)%s\n",
                static_cast<long long>(epoch + 1), static_cast<long long>(epochs),
                loss_sum / static_cast<double>(std::max<int64_t>(loss_count, 1)), 100 * e.accuracy, train_seconds,
                static_cast<double>(samples * job.world_size()) / train_seconds, precision.scaler_report().c_str());
    std::fflush(stdout);
    if (!out.empty()) {
      saved_options["rng.offset"] = std::to_string(gen.offset());
      nc::nn::NamedTensors optimizer_state = optimizer->state_dict();
      precision.add_state(optimizer_state);
      nc::models::save_checkpoint(out, model_name, *model, epoch + 1, optimizer_state, schedule.state_dict(),
                                  saved_options);
    }
  }
  job.finish();
  if (!out.empty() && main_rank) std::printf("checkpoint: %s\n", out.c_str());
  return 0;
}

int eval(const Args& args) {
  nc::Device device = pick_device(args.options.at("device"));
  nc::models::Checkpoint c = nc::models::load_checkpoint(args.options.at("checkpoint"), device);
  const nc::data::TensorDataset test = nc::data::load_fashion_mnist(args.options.at("data"), false);
  nc::models::Evaluation e = nc::models::evaluate(*c.model, test, device);
  const auto& names = nc::models::fashion_mnist_classes();
  std::printf("%s: model %s after %lld epochs, test accuracy %.2f%% on %s\n\n", args.options.at("checkpoint").c_str(),
              c.model_name.c_str(), static_cast<long long>(c.epoch), 100 * e.accuracy, device.str().c_str());
  std::printf("confusion matrix (rows: true class, columns: predicted)\n%12s", "");
  for (size_t j = 0; j < names.size(); ++j) std::printf("%6zu", j);
  std::printf("\n");
  for (size_t i = 0; i < names.size(); ++i) {
    std::printf("%2zu %-9.9s", i, names[i].c_str());
    for (size_t j = 0; j < names.size(); ++j) std::printf("%6lld", static_cast<long long>(e.confusion[i][j]));
    std::printf("\n");
  }
  return 0;
}

// ---------------------------------------------------------------- language model
// AdamW over the matrices and embeddings (with weight decay) and, apart, the biases and
// norm weights (without), as GPT-2 trains; one cosine schedule each. Checkpoints hold both
// under "decay." and "no_decay.".
struct LmOptimizer {
  std::unique_ptr<nc::optim::AdamW> decay, no_decay;
  std::unique_ptr<nc::optim::CosineLR> decay_schedule, no_decay_schedule;
  std::vector<nc::Tensor> params;

  LmOptimizer(const nc::nn::Module& model, double lr, double weight_decay, int64_t warmup, int64_t steps,
              double min_lr) {
    std::vector<nc::Tensor> matrices, others;
    for (const nc::Tensor& p : model.parameters()) (p.dim() >= 2 ? matrices : others).push_back(p);
    params = model.parameters();
    decay = std::make_unique<nc::optim::AdamW>(matrices, nc::optim::AdamWOptions{lr, 0.9, 0.95, 1e-8, weight_decay});
    no_decay = std::make_unique<nc::optim::AdamW>(others, nc::optim::AdamWOptions{lr, 0.9, 0.95, 1e-8, 0.0});
    decay_schedule = std::make_unique<nc::optim::CosineLR>(*decay, warmup, steps, min_lr);
    no_decay_schedule = std::make_unique<nc::optim::CosineLR>(*no_decay, warmup, steps, min_lr);
  }
  void step_unless(const nc::Tensor& found_inf) {
    decay->step_unless(found_inf);
    no_decay->step_unless(found_inf);
  }
  void step_schedules() {
    decay_schedule->step();
    no_decay_schedule->step();
  }
  void zero_grad() {
    decay->zero_grad();
    no_decay->zero_grad();
  }
  static nc::nn::NamedTensors join(const nc::nn::NamedTensors& a, const nc::nn::NamedTensors& b) {
    nc::nn::NamedTensors out;
    for (const auto& [k, v] : a) out.emplace_back("decay." + k, v);
    for (const auto& [k, v] : b) out.emplace_back("no_decay." + k, v);
    return out;
  }
  static nc::nn::NamedTensors part(const nc::nn::NamedTensors& all, const std::string& prefix) {
    nc::nn::NamedTensors out;
    for (const auto& [k, v] : all)
      if (k.compare(0, prefix.size(), prefix) == 0) out.emplace_back(k.substr(prefix.size()), v);
    return out;
  }
  nc::nn::NamedTensors state_dict() const { return join(decay->state_dict(), no_decay->state_dict()); }
  nc::nn::NamedTensors schedule_state_dict() const {
    return join(decay_schedule->state_dict(), no_decay_schedule->state_dict());
  }
  void load(const nc::nn::NamedTensors& optimizer_state, const nc::nn::NamedTensors& schedule_state) {
    decay->load_state_dict(part(optimizer_state, "decay."));
    no_decay->load_state_dict(part(optimizer_state, "no_decay."));
    decay_schedule->load_state_dict(part(schedule_state, "decay."));
    no_decay_schedule->load_state_dict(part(schedule_state, "no_decay."));
  }
};

// Whether train-lm's --data names token shards (a path or pattern ending in .bin), not text.
bool token_data(const Args& args) {
  const std::string& data = args.options.at("data");
  return data.size() >= 4 && data.compare(data.size() - 4, 4, ".bin") == 0;
}

// What train-lm learns from and is validated on: windows of the model's context, of the
// fortunes corpus as bytes or of token shards.
struct LmData {
  std::shared_ptr<const nc::data::Dataset> train, validation;
  std::string summary;  // for the start of the run
  std::string unit;     // "bytes" or "tokens"
};

LmData lm_data(const Args& args, const nc::models::GPTConfig& config) {
  LmData data;
  if (!token_data(args)) {
    const nc::models::TextCorpus corpus = nc::models::load_fortunes(args.options.at("data"));
    data.train = std::make_shared<nc::data::TextWindows>(corpus.train, config.context);
    data.validation = std::make_shared<nc::data::TextWindows>(corpus.validation, config.context);
    data.summary = nc::detail::cat_str(corpus.files.size(), " files, ", corpus.train_fortunes, " train fortunes (",
                                       corpus.train.size(), " bytes), ", corpus.validation_fortunes,
                                       " validation fortunes (", corpus.validation.size(), " bytes)");
    data.unit = "bytes";
    return data;
  }
  const std::string& val = args.options.at("val-data");
  NC_CHECK(!val.empty(), ValueError, "--data ", args.options.at("data"),
           " names token shards; --val-data must name the validation shards");
  const std::vector<std::string> train_shards = nc::data::glob_files(args.options.at("data"));
  const std::vector<std::string> val_shards = nc::data::glob_files(val);
  auto train = std::make_shared<nc::data::TokenWindows>(train_shards, config.context, config.vocab_size);
  auto validation = std::make_shared<nc::data::TokenWindows>(val_shards, config.context, config.vocab_size);
  data.summary = nc::detail::cat_str(train_shards.size(), " train shards (", train->size(), " windows), ",
                                     val_shards.size(), " validation shards (", validation->size(),
                                     " windows) of vocabulary ", config.vocab_size);
  data.train = std::move(train);
  data.validation = std::move(validation);
  data.unit = "tokens";
  return data;
}

// The model train-lm builds: GPT-2's sizes with --model (those of the size options given
// override them), else the size options. The vocabulary is the data's: the 256 bytes of the
// fortunes, or --vocab for token shards, padded to a multiple of 128 rows.
nc::models::GPTConfig lm_config(const Args& args) {
  const std::string& preset = args.options.at("model");
  nc::models::GPTConfig config = preset.empty() ? nc::models::GPTConfig() : nc::models::gpt2_config(preset);
  const bool sized = preset.empty();
  auto size = [&](const char* name, int64_t& field) {
    if (sized || args.given.count(name)) field = integer(args, name, 1);
  };
  size("layers", config.layers);
  size("heads", config.heads);
  size("embed", config.embed);
  size("context", config.context);
  if (sized || args.given.count("norm")) config.norm = args.options.at("norm");
  if (sized || args.given.count("dropout")) config.dropout = number(args, "dropout");
  config.vocab_size = token_data(args) ? integer(args, "vocab", 1) : 256;
  config.vocab_multiple = token_data(args) ? 128 : 1;
  return config;
}

int train_lm(const Args& args) {
  if (const int64_t nproc = integer(args, "nproc", 1); nproc > 1) return launch_self(static_cast<int>(nproc));
  DataParallelJob job;
  const bool main_rank = job.is_main();
  nc::Device device = job.device(args.options.at("device"));
  Precision precision(args.options.at("precision"), device);
  const int64_t steps = integer(args, "steps", 1), batch_size = integer(args, "batch-size", 1);
  const int64_t eval_interval = integer(args, "eval-interval", 1), eval_windows = integer(args, "eval-batches", 1) * batch_size;
  const double lr = number(args, "lr"), min_lr = number(args, "min-lr"), clip = number(args, "clip");
  const std::string out = args.options.at("out"), resume = args.options.at("resume");
  uint64_t seed = static_cast<uint64_t>(integer(args, "seed", 0));

  nc::Generator gen(seed);
  std::shared_ptr<nc::models::GPT> model;
  nc::models::GPTCheckpoint checkpoint;
  int64_t first_step = 0;
  if (!resume.empty()) {
    checkpoint = nc::models::load_gpt_checkpoint(resume, device, &gen);
    model = checkpoint.model;
    first_step = checkpoint.step;
    // The checkpoint's seed and generator position: the resumed run draws the batches and
    // dropout masks that an uninterrupted one would.
    auto saved_seed = checkpoint.metadata.find("option.seed");
    auto offset = checkpoint.metadata.find("option.rng.offset");
    NC_CHECK(saved_seed != checkpoint.metadata.end() && offset != checkpoint.metadata.end(), IOError, "--resume ",
             resume, ": the checkpoint has no random-generator state");
    seed = std::stoull(saved_seed->second);
    gen.manual_seed(seed);
    gen.set_offset(std::stoull(offset->second));
  } else {
    model = std::make_shared<nc::models::GPT>(lm_config(args), &gen);
    model->to(device);
    if (const std::string& init = args.options.at("init"); !init.empty()) {
      // A train-lm checkpoint gives its model's weights (without its optimizer state);
      // any other file, the model's state_dict names as they are.
      const nc::safetensors::File file = nc::safetensors::load(init);
      const auto format = file.metadata.find("format");
      const bool checkpoint_file = format != file.metadata.end() && format->second == "normcore-gpt";
      nc::nn::NamedTensors weights;
      for (const auto& [name, t] : file.tensors) {
        if (!checkpoint_file) weights.emplace_back(name, t);
        else if (name.compare(0, 6, "model.") == 0) weights.emplace_back(name.substr(6), t);
      }
      try {  // the file's own errors name it; those of its names and shapes get it here
        model->load_state_dict(weights);
      } catch (const nc::ShapeError& e) {
        throw nc::ShapeError("--init " + init + ": " + e.what());
      } catch (const nc::ValueError& e) {
        throw nc::ValueError("--init " + init + ": " + e.what());
      }
    }
  }
  NC_CHECK(resume.empty() || args.options.at("init").empty(), ValueError,
           "--init and --resume: a resumed run takes its weights from the checkpoint");
  const std::string& shuffle = args.options.at("shuffle");
  NC_CHECK(shuffle == "on" || shuffle == "off", ValueError, "option --shuffle: on or off, got '", shuffle, "'");
  model->train();
  // Each rank draws its own dropout masks.
  job.start(args, model, device, gen, seed);
  const nc::models::GPTConfig& config = model->config;
  const LmData data = lm_data(args, config);
  const int64_t warmup = std::min(integer(args, "warmup", 0), steps - 1);
  LmOptimizer optimizer(*model, lr, number(args, "weight-decay"), warmup, steps, min_lr);
  if (!resume.empty()) {
    precision.take_state(checkpoint.optimizer_state);
    optimizer.load(checkpoint.optimizer_state, checkpoint.schedule_state);
  }

  std::map<std::string, std::string> saved_options;
  for (const auto& [k, v] : args.options)
    if (k != "resume" && k != "help" && k != "stop-after") saved_options[k] = v;
  saved_options["seed"] = std::to_string(seed);

  const bool graphed = use_cuda_graph(args, device, false, job.active);
  nc::GraphedStep train_step(
      [&](const std::vector<nc::Tensor>& in) {
        nc::Tensor loss;
        {
          nc::autocast::Guard autocast(precision.dtype, precision.autocast);
          loss = nc::models::lm_loss(*model, in[0], in[1]);
        }
        optimizer.zero_grad();
        precision.backward_and_step(loss, optimizer.params, clip,
                                    [&](const nc::Tensor& found_inf) { optimizer.step_unless(found_inf); });
        return loss;
      },
      graphed);
  if (main_rank) {
    const std::string& preset = args.options.at("model");
    std::printf("normcore train-lm: GPT%s %lld layers, %lld heads, embed %lld, context %lld, %s, dropout %g "
                "(%lld parameters) on %s%s in %s%s\n",
                preset.empty() ? "" : (" (" + preset + " sizes)").c_str(), static_cast<long long>(config.layers), static_cast<long long>(config.heads),
                static_cast<long long>(config.embed), static_cast<long long>(config.context), config.norm.c_str(),
                config.dropout, static_cast<long long>(model->parameter_count()), device.str().c_str(),
                job.describe(device).c_str(), args.options.at("precision").c_str(),
                graphed ? " with CUDA graphs" : "");
    std::printf("data: %s; batch %lld x %lld %s%s, %lld steps, lr %g%s\n", data.summary.c_str(),
                static_cast<long long>(batch_size), static_cast<long long>(config.context), data.unit.c_str(),
                job.active ? (" per rank (" + std::to_string(batch_size * job.world_size()) + " windows in all)").c_str()
                           : "",
                static_cast<long long>(steps), lr,
                first_step ? (", resuming after step " + std::to_string(first_step)).c_str() : "");
    std::fflush(stdout);
  }

  // Every training window, shuffled each epoch (the same order on every rank, each rank its
  // share); a step is a batch, so step s is batch s % batches of epoch s / batches, which is
  // where a resumed run starts.
  nc::data::DataLoaderOptions loader_options = job.loader_options(args, batch_size, seed, device);
  loader_options.shuffle = shuffle == "on";
  nc::data::DataLoader loader(data.train, loader_options);
  const int64_t epoch_steps = loader.num_batches();
  loader.begin_epoch(static_cast<uint64_t>(first_step / epoch_steps), first_step % epoch_steps);

  auto next_batch = [&](int64_t step) {
    nc::data::Batch batch;
    if (!loader.next(batch)) {
      loader.begin_epoch(static_cast<uint64_t>(step / epoch_steps));
      loader.next(batch);
    }
    return batch;
  };
  if (const int64_t timed = integer(args, "benchmark", 0); timed > 0) {
    // The step alone: 3 untimed steps (the first captures the CUDA graph), then timed ones
    // between two reads of the loss, which wait for the device.
    constexpr int64_t kWarmup = 3;
    double loss = 0;
    auto run = [&](int64_t from, int64_t count) {
      nc::Tensor last;
      for (int64_t step = from; step < from + count; ++step) {
        const nc::data::Batch batch = next_batch(step);
        last = train_step({batch.inputs, batch.targets});
        optimizer.step_schedules();
      }
      loss = last.item<double>();
    };
    run(first_step, kWarmup);
    const auto start = std::chrono::steady_clock::now();
    run(first_step + kWarmup, timed);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double step_tokens = static_cast<double>(batch_size * config.context * job.world_size());
    if (main_rank) {
      std::printf("benchmark: %lld steps, %.2f ms/step, %.0f tokens/s, loss %.4f", static_cast<long long>(timed),
                  1e3 * seconds / static_cast<double>(timed), step_tokens * static_cast<double>(timed) / seconds, loss);
      if (device.is_cuda())
        std::printf(", peak memory %.0f MiB",
                    static_cast<double>(nc::cuda::memory_stats(device.index).peak_allocated) / (1 << 20));
      std::printf("\n");
    }
    job.finish();
    return 0;
  }

  const int64_t stop_after = integer(args, "stop-after", 0);
  const int64_t last_step = stop_after > 0 ? std::min(steps, stop_after) : steps;
  for (int64_t step = first_step; step < last_step;) {
    const int64_t interval_end = std::min(last_step, (step / eval_interval + 1) * eval_interval);
    Progress progress("train", steps, "tokens", step);
    double loss_sum = 0;
    int64_t loss_count = 0, tokens = 0;
    for (; step < interval_end; ++step) {
      const nc::data::Batch batch = next_batch(step);
      const nc::Tensor loss = train_step({batch.inputs, batch.targets});
      optimizer.step_schedules();  // also after a skipped fp16 step
      tokens += batch.inputs.numel() * job.world_size();
      // Reading the loss waits for the device: every tenth step, for the display only (rank 0's
      // windows in a data-parallel job).
      if (main_rank && (step % 10 == 0 || step + 1 == interval_end)) {
        loss_sum += loss.item<double>();
        ++loss_count;
        progress.update(step + 1, tokens, loss_sum / static_cast<double>(loss_count));
      }
    }
    if (!main_rank) continue;  // the others go on and wait in the next step's first all-reduce
    progress.finish();
    const double seconds = progress.elapsed();
    const double validation = nc::models::evaluate_lm(*model, *data.validation, eval_windows, batch_size, device);
    std::printf("step %lld/%lld: train loss %.4f, validation loss %.4f (%.1f s, %.0f tokens/s)%s\n",
                static_cast<long long>(step), static_cast<long long>(steps),
                loss_sum / static_cast<double>(std::max<int64_t>(loss_count, 1)), validation, seconds,
                static_cast<double>(tokens) / seconds, precision.scaler_report().c_str());
    std::fflush(stdout);
    if (!out.empty()) {
      saved_options["rng.offset"] = std::to_string(gen.offset());
      nc::nn::NamedTensors optimizer_state = optimizer.state_dict();
      precision.add_state(optimizer_state);
      nc::models::save_gpt_checkpoint(out, *model, step, optimizer_state, optimizer.schedule_state_dict(),
                                      saved_options);
    }
  }
  job.finish();
  if (!main_rank) return 0;
  if (!out.empty()) std::printf("checkpoint: %s\n", out.c_str());
  if (const std::string& hf = args.options.at("hf-out"); !hf.empty()) {
    nc::models::save_hf_gpt2(*model, hf);
    std::printf("Hugging Face GPT-2 checkpoint: %s\n", hf.c_str());
  }
  const int64_t sample = integer(args, "sample", 0);
  if (last_step == steps && sample > 0 && data.unit == "tokens") {
    std::printf("no sample: the model's tokens are not bytes (train-lm samples byte models only)\n");
  } else if (last_step == steps && sample > 0) {
    std::printf("sample (temperature 0.8, seed %llu):\n", static_cast<unsigned long long>(seed));
    nc::models::GenerateOptions options;
    options.seed = seed;
    std::printf("%s\n", nc::models::generate_text(*model, "", sample, options).c_str());
  }
  return 0;
}

int launch(const Args& args) {
  nc::distributed::LaunchOptions options;
  options.nproc = static_cast<int>(integer(args, "nproc", 1));
  options.nnodes = static_cast<int>(integer(args, "nnodes", 1));
  options.node_rank = static_cast<int>(integer(args, "node-rank", 0));
  options.master_addr = args.options.at("master-addr");
  options.master_port = static_cast<int>(integer(args, "master-port", 1));
  NC_CHECK(!args.positional.empty(), ValueError, "no command to run: normcore launch --nproc N -- <command...>");
  return nc::distributed::launch(args.positional, options);
}

int generate(const Args& args) {
  nc::Device device = pick_device(args.options.at("device"));
  nc::models::GenerateOptions options;
  options.temperature = number(args, "temperature");
  options.top_k = integer(args, "top-k", 0);
  options.seed = static_cast<uint64_t>(integer(args, "seed", 0));
  const int64_t tokens = integer(args, "tokens", 0);
  const std::string& prompt = args.options.at("prompt");
  if (const std::string& dir = args.options.at("model"); !dir.empty()) {
    // A GPT-2 checkpoint of any vocabulary: the prompt through its tokenizer, each new
    // token's bytes written as it is chosen.
    const auto model = nc::models::load_hf_gpt2(dir, device);
    const std::string& files = args.options.at("tokenizer");
    const nc::text::BpeTokenizer tokenizer = nc::text::BpeTokenizer::load(files.empty() ? dir : files);
    NC_CHECK(tokenizer.vocab_size() <= model->config.vocab_size, ValueError, "--tokenizer: its vocabulary of ",
             tokenizer.vocab_size(), " tokens is larger than the model's ", model->config.vocab_size);
    std::vector<int64_t> ids;
    for (int32_t id : tokenizer.encode(prompt)) ids.push_back(id);
    if (ids.empty()) {
      NC_CHECK(tokenizer.end_of_text() >= 0, ValueError, "--prompt: empty, and the tokenizer has no <|endoftext|> "
               "to start a new document with");
      ids.push_back(tokenizer.end_of_text());
    }
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    std::fflush(stdout);
    nc::models::generate_tokens(*model, ids, tokens, options, [&](int64_t id) {
      const std::string piece = tokenizer.decode({static_cast<int32_t>(id)});
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    });
    std::printf("\n");
    return 0;
  }
  nc::models::TextGenerator generator(args.options.at("checkpoint"), device);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
  generator.generate(prompt, tokens, options, [](const std::string& piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  std::printf("\n");
  return 0;
}

int tokenize(const Args& args) {
  return run_tokenize({args.options.at("tokenizer"), args.positional, args.options.at("out"), flag(args, "special"),
                       flag(args, "decode")});
}

int predict(const Args& args) {
  NC_CHECK(!args.positional.empty(), ValueError, "predict: give at least one image file");
  nc::Device device = pick_device(args.options.at("device"));
  nc::models::Classifier classifier(args.options.at("checkpoint"), device);
  for (const std::string& path : args.positional) {
    auto p = classifier.predict(nc::models::read_image(path));
    std::printf("%s: %s (class %lld, %.1f%%)\n", path.c_str(), p.name.c_str(), static_cast<long long>(p.label),
                100 * p.probability);
  }
  return 0;
}

// One line per case and device: verdict, file, op, dtype, device, the worst error of each
// compared tensor (absolute, and as a fraction of its tolerance), then the failure reason.
void print_case(const nc::conformance::CaseResult& r) {
  std::printf("%s %s %s %s %s", r.pass ? "PASS" : "FAIL", std::filesystem::path(r.file).filename().string().c_str(),
              r.op.empty() ? "-" : r.op.c_str(), r.dtype.empty() ? "-" : r.dtype.c_str(), r.device.str().c_str());
  for (size_t i = 0; i < r.tensors.size(); ++i) {
    const auto& t = r.tensors[i];
    std::printf("%s %s %.1e (%.2g tol)", i ? "," : " ", t.name.c_str(), t.worst_abs, t.worst_rel_to_tol);
  }
  if (!r.pass) std::printf(" -- %s", r.reason.c_str());
  std::printf("\n");
}

int conformance(const Args& args) {
  NC_CHECK(args.positional.size() == 1, ValueError, "conformance: give one folder of cases, got ",
           args.positional.size(), " arguments");
  const std::string& spec = args.options.at("device");
  std::vector<nc::Device> devices;
  if (spec == "all") {
    devices.push_back(nc::Device::cpu());
    if (nc::cuda_is_available()) devices.push_back(nc::Device::cuda());
  } else {
    NC_CHECK(spec != "auto", ValueError, "conformance: --device takes cpu, cuda[:N] or all, got 'auto'");
    devices.push_back(pick_device(spec));
  }
  int passed = 0, failed = 0;
  for (const nc::Device& device : devices) {
    for (const auto& r : nc::conformance::run_dir(args.positional[0], device)) {
      print_case(r);
      (r.pass ? passed : failed) += 1;
    }
  }
  NC_CHECK(passed + failed > 0, IOError, "conformance: no .safetensors cases in '", args.positional[0], "'");
  std::printf("%d passed, %d failed\n", passed, failed);
  std::fflush(stdout);
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    usage(argc < 2 ? std::cerr : std::cout);
    return argc < 2 ? 2 : 0;
  }
  std::string command = argv[1];
  const std::vector<OptionSpec>* specs = command == "train"     ? &kTrainOptions
                                         : command == "eval"    ? &kEvalOptions
                                         : command == "predict" ? &kPredictOptions
                                         : command == "train-lm" ? &kTrainLmOptions
                                         : command == "generate" ? &kGenerateOptions
                                         : command == "conformance" ? &kConformanceOptions
                                         : command == "launch" ? &kLaunchOptions
                                         : command == "tokenize" ? &kTokenizeOptions
                                                                : nullptr;
  if (!specs) {
    std::cerr << "normcore: unknown command '" << command << "'\n\n";
    usage(std::cerr);
    return 2;
  }
  g_argv.assign(argv, argv + argc);
  try {
    Args args = parse(argc, argv, *specs);
    if (args.options.count("help")) {
      command_usage(std::cout, command, *specs);
      return 0;
    }
    if (command == "train") return train(args);
    if (command == "eval") return eval(args);
    if (command == "conformance") return conformance(args);
    if (command == "train-lm") return train_lm(args);
    if (command == "generate") return generate(args);
    if (command == "launch") return launch(args);
    if (command == "tokenize") return tokenize(args);
    return predict(args);
  } catch (const nc::ValueError& e) {
    std::cerr << "normcore " << command << ": " << e.what() << "\n";
    return 2;
  } catch (const nc::Error& e) {
    std::cerr << "normcore " << command << ": " << e.what() << "\n";
    return 1;
  }
}
