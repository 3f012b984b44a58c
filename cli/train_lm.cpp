// The normcore program's train-lm: a GPT on the fortunes corpus (bytes) or on token shards,
// trained by the Trainer of normcore/train.h (AdamW with and without weight decay, a cosine
// schedule each), validated and checkpointed every --eval-interval steps, sampled at the end.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/training.h"
#include "normcore/cuda.h"
#include "normcore/data.h"
#include "normcore/gpt.h"
#include "normcore/safetensors.h"
#include "normcore/text.h"
#include "normcore/train.h"

namespace cli {

namespace {

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
  data.summary =
      nc::detail::cat_str(train_shards.size(), " train shards (", train->size(), " windows), ", val_shards.size(),
                          " validation shards (", validation->size(), " windows) of vocabulary ", config.vocab_size);
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

// --init: a train-lm checkpoint gives its model's weights (without its optimizer state);
// any other file, the model's state_dict names as they are.
void load_init(nc::models::GPT& model, const std::string& init) {
  const nc::safetensors::File file = nc::safetensors::load(init);
  const auto format = file.metadata.find("format");
  const bool checkpoint = format != file.metadata.end() &&
                          (format->second == nc::train::kCheckpointFormat || format->second == "normcore-gpt");
  nc::nn::NamedTensors weights;
  for (const auto& [name, t] : file.tensors) {
    if (!checkpoint) weights.emplace_back(name, t);
    else if (name.compare(0, 6, "model.") == 0) weights.emplace_back(name.substr(6), t);
  }
  try {  // the file's own errors name it; those of its names and shapes get it here
    model.load_state_dict(weights);
  } catch (const nc::ShapeError& e) {
    throw nc::ShapeError("--init " + init + ": " + e.what());
  } catch (const nc::ValueError& e) {
    throw nc::ValueError("--init " + init + ": " + e.what());
  }
}

// --benchmark's line: ms/step, tokens/s, the loss and, on a GPU, the memory: the
// allocator's high-water mark of tensors, what it holds from the driver, and the device's
// memory in use by every process and context (cudaMemGetInfo, as llm.c reports); in a
// data-parallel job whose steps are not graphed, how long backward's end waited for the
// gradients' all-reduces.
void print_benchmark(const nc::train::Trainer::Timing& t, int64_t steps, const nc::Device& device) {
  std::printf("benchmark: %lld steps, %.2f ms/step, %.0f tokens/s, loss %.4f", static_cast<long long>(steps),
              1e3 * t.seconds / static_cast<double>(steps), static_cast<double>(t.amount) / t.seconds, t.loss);
  if (device.is_cuda()) {
    const nc::cuda::MemoryStats stats = nc::cuda::memory_stats(device.index);
    size_t free_bytes = 0, total_bytes = 0;
    nc::cuda::mem_get_info(device.index, &free_bytes, &total_bytes);
    constexpr double kMiB = 1 << 20;
    std::printf(", peak memory %.0f MiB (reserved %.0f MiB, device in use %.0f MiB)",
                static_cast<double>(stats.peak_allocated) / kMiB, static_cast<double>(stats.reserved) / kMiB,
                static_cast<double>(total_bytes - free_bytes) / kMiB);
  }
  if (!std::isnan(t.reduction_wait_ms))
    std::printf(", the end of backward waited %.2f ms/step for the all-reduces", t.reduction_wait_ms);
  std::printf("\n");
}

}  // namespace

int train_lm(const Args& args) {
  if (const int64_t nproc = integer(args, "nproc", 1); nproc > 1)
    return launch_self(static_cast<int>(nproc), static_cast<int>(integer(args, "max-restarts", 0)));
  const nc::Device device = nc::train::DataParallelJob().device(args.options.at("device"));
  nc::train::TrainerOptions options = trainer_options(args, device);
  const nc::train::Precision checked(options.precision, device);  // bad values fail before the model is built
  options.steps = integer(args, "steps", 1);
  options.eval_interval = integer(args, "eval-interval", 1);
  const int64_t batch_size = integer(args, "batch-size", 1),
                eval_windows = integer(args, "eval-batches", 1) * batch_size;
  const double lr = number(args, "lr"), min_lr = number(args, "min-lr");

  nc::Generator gen(options.seed);
  std::shared_ptr<nc::models::GPT> model;
  int64_t first_step = 0;
  if (!options.resume.empty()) {
    nc::models::GPTCheckpoint checkpoint = nc::models::load_gpt_checkpoint(options.resume, device, &gen);
    model = checkpoint.model;
    first_step = checkpoint.step;
  } else {
    model = std::make_shared<nc::models::GPT>(lm_config(args), &gen);
    if (const std::string& init = args.options.at("init"); !init.empty()) load_init(*model, init);
  }
  NC_CHECK(options.resume.empty() || args.options.at("init").empty(), ValueError,
           "--init and --resume: a resumed run takes its weights from the checkpoint");
  const std::string& shuffle = args.options.at("shuffle");
  NC_CHECK(shuffle == "on" || shuffle == "off", ValueError, "option --shuffle: on or off, got '", shuffle, "'");
  const std::string& recompute = args.options.at("recompute");
  NC_CHECK(recompute == "none" || recompute == "gelu", ValueError, "option --recompute: none or gelu, got '", recompute,
           "'");
  for (const auto& block : model->blocks) block->mlp->recompute_gelu = recompute == "gelu";
  const std::string& attention = args.options.at("attention");
  NC_CHECK(attention == "auto" || attention == "native" || attention == "cudnn", ValueError,
           "option --attention: auto, native or cudnn, got '", attention, "'");
  nc::cuda::set_attention_engine(attention == "native"  ? nc::cuda::AttentionEngine::Native
                                 : attention == "cudnn" ? nc::cuda::AttentionEngine::Cudnn
                                                        : nc::cuda::AttentionEngine::Auto);
  const std::string& deterministic = args.options.at("deterministic");
  NC_CHECK(deterministic == "on" || deterministic == "off", ValueError, "option --deterministic: on or off, got '",
           deterministic, "'");
  nc::cuda::set_deterministic(deterministic == "on");
  const nc::models::GPTConfig& config = model->config;
  const LmData data = lm_data(args, config);

  options.generator = &gen;
  options.model_name = "gpt";
  options.description = nc::models::gpt_description(config);
  options.title = "normcore train-lm";
  options.curves = {"loss", "lr", "tokens_per_s"};
  options.eval_phase = "validation";
  options.unit = "tokens";
  options.loss_every = 10;
  nc::train::Trainer trainer(
      model,
      [&model](nc::nn::Module&, const nc::Tensor& inputs, const nc::Tensor& targets) {
        return nc::models::lm_loss(*model, inputs, targets);
      },
      nc::train::adamw_decay_matrices(nc::optim::AdamWOptions{lr, 0.9, 0.95, 1e-8, number(args, "weight-decay")}),
      options);
  trainer.set_schedule(nc::train::cosine_schedule(integer(args, "warmup", 0), min_lr));
  trainer.set_evaluate([&](nc::nn::Module&) -> std::vector<std::pair<std::string, double>> {
    return {{"loss", nc::models::evaluate_lm(*model, *data.validation, eval_windows, batch_size, device)}};
  });
  const nc::train::DataParallelJob& job = trainer.job();
  // Two ranks on cuDNN's attention backward (Auto's pick under --deterministic on, on Hopper)
  // made no progress on two H200s (docs/DESIGN.md, data parallelism); such a job keeps
  // attention on normcore's kernels unless --attention cudnn asks for cuDNN.
  if (attention == "auto" && deterministic == "on" && job.world_size() > 1) {
    nc::cuda::set_attention_engine(nc::cuda::AttentionEngine::Native);
    if (job.rank() == 0)
      std::printf("normcore train-lm: --deterministic on with data parallelism: attention on normcore's kernels "
                  "(--attention native; cuDNN's attention backward hung two ranks)\n");
  }
  trainer.on_start([&](int64_t) {
    const std::string& preset = args.options.at("model");
    std::printf("normcore train-lm: GPT%s %lld layers, %lld heads, embed %lld, context %lld, %s, dropout %g "
                "(%lld parameters) on %s%s in %s%s\n",
                preset.empty() ? "" : (" (" + preset + " sizes)").c_str(), static_cast<long long>(config.layers),
                static_cast<long long>(config.heads), static_cast<long long>(config.embed),
                static_cast<long long>(config.context), config.norm.c_str(), config.dropout,
                static_cast<long long>(model->parameter_count()), device.str().c_str(),
                job.describe(device, options.shard_optimizer).c_str(), options.precision.c_str(),
                trainer.graphed() ? " with CUDA graphs" : "");
    std::printf("data: %s; batch %lld x %lld %s%s, %lld steps, lr %g%s\n", data.summary.c_str(),
                static_cast<long long>(batch_size), static_cast<long long>(config.context), data.unit.c_str(),
                job.active()
                    ? (" per rank (" + std::to_string(batch_size * job.world_size()) + " windows in all)").c_str()
                    : "",
                static_cast<long long>(options.steps), lr,
                first_step ? (", resuming after step " + std::to_string(first_step)).c_str() : "");
    std::fflush(stdout);
  });
  trainer.on_evaluation([&](const nc::train::EvalInfo& e) {
    std::printf("step %lld/%lld: train loss %.4f, validation loss %.4f (%.1f s, %.0f tokens/s)%s\n",
                static_cast<long long>(e.step), static_cast<long long>(options.steps), e.train_loss,
                e.results.at(0).second, e.seconds, e.rate, trainer.precision().scaler_report().c_str());
    std::fflush(stdout);
  });

  // Every training window, shuffled each epoch (the same order on every rank, each rank its
  // share); a step is a batch, so a resumed run starts at its step's batch.
  nc::data::DataLoaderOptions loader;
  loader.batch_size = batch_size;
  loader.shuffle = shuffle == "on";
  loader.workers = loader_workers(args, job, false);
  if (const int64_t timed = integer(args, "benchmark", 0); timed > 0) {
    const nc::train::Trainer::Timing t = trainer.benchmark(data.train, loader, 3, timed);
    if (trainer.is_main()) print_benchmark(t, timed, device);
    return 0;
  }
  const int64_t last_step = trainer.fit(data.train, loader);
  if (!trainer.is_main()) return 0;
  if (!options.checkpoint.empty()) std::printf("checkpoint: %s\n", options.checkpoint.c_str());
  if (const std::string& hf = args.options.at("hf-out"); !hf.empty()) {
    nc::models::save_hf_gpt2(*model, hf);
    std::printf("Hugging Face GPT-2 checkpoint: %s\n", hf.c_str());
  }
  const int64_t sample = integer(args, "sample", 0);
  if (last_step == options.steps && sample > 0 && data.unit == "tokens") {
    std::printf("no sample: the model's tokens are not bytes (train-lm samples byte models only)\n");
  } else if (last_step == options.steps && sample > 0) {
    std::printf("sample (temperature 0.8, seed %llu):\n", static_cast<unsigned long long>(trainer.seed()));
    nc::models::GenerateOptions generate;
    generate.seed = trainer.seed();
    std::printf("%s\n", nc::models::generate_text(*model, "", sample, generate).c_str());
  }
  return 0;
}

}  // namespace cli
