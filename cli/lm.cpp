// The normcore program's train-lm and generate (cli/lm.h).
#include "cli/lm.h"

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
#include <string>
#include <vector>

#include "normcore/normcore.h"
#include "normcore/data.h"
#include "normcore/gpt.h"
#include "normcore/models.h"
#include "normcore/text.h"
#include "cli/training.h"

namespace cli {

namespace {

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

}  // namespace

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
      const bool checkpoint_file = format != file.metadata.end() &&
                                   (format->second == "normcore-checkpoint" || format->second == "normcore-gpt");
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
  const std::string& recompute = args.options.at("recompute");
  NC_CHECK(recompute == "none" || recompute == "gelu", ValueError, "option --recompute: none or gelu, got '",
           recompute, "'");
  for (const auto& block : model->blocks) block->mlp->recompute_gelu = recompute == "gelu";
  const std::string& attention = args.options.at("attention");
  NC_CHECK(attention == "auto" || attention == "native" || attention == "cudnn", ValueError,
           "option --attention: auto, native or cudnn, got '", attention, "'");
  nc::cuda::set_attention_engine(attention == "native"  ? nc::cuda::AttentionEngine::Native
                                 : attention == "cudnn" ? nc::cuda::AttentionEngine::Cudnn
                                                        : nc::cuda::AttentionEngine::Auto);
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
      if (device.is_cuda()) {
        // The allocator's high-water mark of tensors, what it holds from the driver, and the
        // device's memory in use by every process and context (cudaMemGetInfo, as llm.c reports).
        const nc::cuda::MemoryStats stats = nc::cuda::memory_stats(device.index);
        size_t free_bytes = 0, total_bytes = 0;
        nc::cuda::mem_get_info(device.index, &free_bytes, &total_bytes);
        constexpr double kMiB = 1 << 20;
        std::printf(", peak memory %.0f MiB (reserved %.0f MiB, device in use %.0f MiB)",
                    static_cast<double>(stats.peak_allocated) / kMiB, static_cast<double>(stats.reserved) / kMiB,
                    static_cast<double>(total_bytes - free_bytes) / kMiB);
      }
      std::printf("\n");
    }
    job.finish();
    return 0;
  }

  const int64_t stop_after = integer(args, "stop-after", 0);
  const int64_t last_step = stop_after > 0 ? std::min(steps, stop_after) : steps;
  RunMetrics metrics(args, main_rank, !resume.empty(), "normcore train-lm", "step", {"loss", "lr", "tokens_per_s"});
  for (int64_t step = first_step; step < last_step;) {
    const int64_t interval_end = std::min(last_step, (step / eval_interval + 1) * eval_interval);
    Progress progress("train", steps, "tokens", step);
    double loss_sum = 0;
    int64_t loss_count = 0, tokens = 0;
    for (; step < interval_end; ++step) {
      const nc::data::Batch batch = next_batch(step);
      const double lr = optimizer.decay->lr();  // this step's
      const nc::Tensor loss = train_step({batch.inputs, batch.targets});
      optimizer.step_schedules();  // also after a skipped fp16 step
      tokens += batch.inputs.numel() * job.world_size();
      // Reading the loss waits for the device: every tenth step, for the display only (rank 0's
      // windows in a data-parallel job).
      if (main_rank && (step % 10 == 0 || step + 1 == interval_end)) {
        const double value = loss.item<double>();
        loss_sum += value;
        ++loss_count;
        progress.update(step + 1, tokens, loss_sum / static_cast<double>(loss_count));
        metrics.log(step + 1, "train", {{"loss", value}, {"lr", lr},
                                        {"tokens_per_s", static_cast<double>(tokens) / progress.elapsed()}});
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
    metrics.log(step, "validation", {{"loss", validation}});
    metrics.plot();
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

int generate(const Args& args) {
  nc::Device device = pick_device(args.options.at("device"));
  nc::models::GenerateOptions options;
  options.temperature = number(args, "temperature");
  options.top_k = integer(args, "top-k", 0);
  options.top_p = number(args, "top-p");
  options.seed = static_cast<uint64_t>(integer(args, "seed", 0));
  const int64_t tokens = integer(args, "tokens", 0);
  const std::string& prompt = args.options.at("prompt");
  // A Hugging Face GPT-2 folder (any vocabulary, the prompt through its tokenizer) or a
  // byte-level checkpoint; each token's bytes are written as it is chosen.
  const std::string& folder = args.options.at("model");
  NC_CHECK(!folder.empty() || args.options.at("tokenizer").empty(), ValueError,
           "--tokenizer: goes with --model (a byte-level --checkpoint has no tokenizer)");
  NC_CHECK(folder.empty() || std::filesystem::is_directory(folder), IOError, "--model: ", folder,
           " is not a folder (a Hugging Face GPT-2 folder holds config.json and model.safetensors)");
  nc::models::TextGenerator generator(folder.empty() ? args.options.at("checkpoint") : folder, device,
                                      args.options.at("tokenizer"));
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
  generator.generate(prompt, tokens, options, [](const std::string& piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  std::printf("\n");
  return 0;
}

}  // namespace cli
